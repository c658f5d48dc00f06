//! What the kernel holds, read directly: BPF links and maps, tracefs and its
//! uprobe events, kernel symbols, probed code bytes and PID namespaces; and the
//! locks that keep tests from changing how `task:task_rename` attaches under
//! each other, or from timing each other's use of the kernel's event_mutex.

use std::path::Path;
use std::process::Command;

/// A lock across test processes (nextest runs each test in its own), on a file
/// in the temp directory; released when dropped.
pub struct FileLock {
    _file: std::fs::File,
}

fn file_lock(name: &str, exclusive: bool) -> FileLock {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::env::temp_dir().join(name))
        .expect("lock file");
    let how = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on an open descriptor.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), how) }, 0, "flock");
    FileLock { _file: f }
}

/// A lock on how `task:task_rename` attaches: a test that adds a tracefs event
/// of that name in another group (which makes the name ambiguous, so the
/// tracepoint goes on a perf event, not a raw link) holds it exclusively, tests
/// that expect a raw link hold it shared.
pub fn rename_event_lock(exclusive: bool) -> FileLock {
    file_lock("tracekit-test-task-rename.lock", exclusive)
}

/// A turn alone with the kernel's `event_mutex`, which every tracefs event,
/// tracepoint perf event and single uprobe takes to be made or removed (a
/// perf-event uprobe holds it ~100 ms while it detaches). Tests that hold it
/// for seconds (hundreds of single uprobes, every tracepoint) and tests that
/// bound a time that includes taking it (a prompt exit, a guardian's cleanup)
/// take turns, so that no bound measures another test's work.
pub fn event_mutex_turn() -> FileLock {
    file_lock("tracekit-test-event-mutex.lock", true)
}

/// Every symbol name in /proc/kallsyms.
pub fn kernel_symbols() -> std::collections::HashSet<String> {
    std::fs::read_to_string("/proc/kallsyms")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

/// How many bytes of `bin`'s executable mappings in process `pid` differ from the
/// file (uprobes plant an int3 at each probed instruction).
pub fn code_bytes_changed(pid: u32, bin: &Path) -> usize {
    use std::io::{Read, Seek, SeekFrom};
    let file = std::fs::read(bin).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let name = bin.to_str().unwrap();
    let mut changed = 0;
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || f[5] != name || !f[1].contains('x') {
            continue;
        }
        let (start, end) = f[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let off = usize::from_str_radix(f[2], 16).unwrap();
        let mut buf = vec![0u8; (end - start) as usize];
        mem.seek(SeekFrom::Start(start)).unwrap();
        mem.read_exact(&mut buf).unwrap();
        let want = &file[off..file.len().min(off + buf.len())];
        changed += want.iter().zip(&buf).filter(|(a, b)| a != b).count();
    }
    changed
}

/// The ids of the BPF links process `pid` holds (from its fdinfo).
pub fn bpf_link_ids_of(pid: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        if let Some(id) = info
            .lines()
            .find_map(|l| l.strip_prefix("link_id:"))
            .and_then(|v| v.trim().parse().ok())
        {
            ids.push(id);
        }
    }
    ids
}

/// The BPF maps process `pid` holds: (name as the kernel keeps it, at most 15
/// bytes; max_entries).
pub fn bpf_maps_of(pid: u32) -> Vec<(String, u32)> {
    let mut maps = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        let Some(id) = info
            .lines()
            .find_map(|l| l.strip_prefix("map_id:"))
            .and_then(|v| v.trim().parse().ok())
        else {
            continue;
        };
        // SAFETY: plain bpf(2) wrappers on a zeroed info struct of the size
        // given; the fd is closed at once.
        unsafe {
            let fd = libbpf_sys::bpf_map_get_fd_by_id(id);
            if fd < 0 {
                continue;
            }
            let mut info: libbpf_sys::bpf_map_info = std::mem::zeroed();
            let mut len = std::mem::size_of_val(&info) as u32;
            let ok = libbpf_sys::bpf_map_get_info_by_fd(fd, &mut info, &mut len) == 0;
            libc::close(fd);
            if ok {
                let name = std::ffi::CStr::from_ptr(info.name.as_ptr());
                maps.push((name.to_string_lossy().into_owned(), info.max_entries));
            }
        }
    }
    maps.sort();
    maps
}

/// Asserts that none of these BPF links (a tool's, taken while it ran) is left.
pub fn assert_links_gone(links: Vec<u32>) {
    let left: Vec<u32> = links
        .into_iter()
        .filter(|id| bpf_link_exists(*id))
        .collect();
    assert!(left.is_empty(), "links left: {left:?}");
}

/// Whether a BPF link with this id still exists.
pub fn bpf_link_exists(id: u32) -> bool {
    // SAFETY: plain bpf(2) wrapper; a returned fd is closed at once.
    unsafe {
        let fd = libbpf_sys::bpf_link_get_fd_by_id(id);
        if fd >= 0 {
            libc::close(fd);
        }
        fd >= 0
    }
}

/// tracefs, at /sys/kernel/tracing: mounted there first, as the tools would,
/// where it is not (a fresh boot may not have it, and a test that reads it may
/// come before any tool has run, or after tools that mounted it only in their
/// own mount namespace).
pub fn tracefs() -> &'static Path {
    static MOUNT: std::sync::Once = std::sync::Once::new();
    let dir = Path::new("/sys/kernel/tracing");
    MOUNT.call_once(|| {
        if !dir.join("events").is_dir() {
            let st = Command::new("mount")
                .args(["-t", "tracefs", "nodev"])
                .arg(dir)
                .status()
                .expect("mount");
            assert!(st.success(), "mount -t tracefs nodev {}", dir.display());
        }
    });
    dir
}

/// tracefs' uprobe_events: the uprobe events defined now, as one consistent
/// snapshot (another test may add or remove a line while it is read).
pub fn uprobe_events() -> String {
    common::tracefs::read_list(&tracefs().join("uprobe_events")).unwrap()
}

/// Writes one command line to uprobe_events (an event to add, or `-:` one to
/// remove), as another tool or an earlier run would have.
pub fn uprobe_events_command(line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(tracefs().join("uprobe_events"))
        .unwrap();
    std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("{line}: {e}"));
}

/// The PID namespace of process `pid`, by its inode (as tracekit names its
/// tracefs uprobe groups `tracekit_<namespace>_<pid>`).
pub fn pid_namespace_of(pid: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .unwrap()
        .ino()
}
