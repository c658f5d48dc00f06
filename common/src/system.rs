//! Preconditions checked before tracing: privileges, target process, kernel abilities.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Fails unless the process may load BPF programs and open perf events.
pub fn require_root() -> Result<()> {
    let caps = effective_caps();
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    bail!("tracing needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN); run it with sudo")
}

/// The process's effective capabilities (none if they cannot be read), from
/// one capget(2) rather than parsing /proc/self/status.
fn effective_caps() -> u64 {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    /// _LINUX_CAPABILITY_VERSION_3: 64-bit sets, in two halves.
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: header and data are what capget(2) reads and writes for version 3.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if r != 0 {
        return 0;
    }
    u64::from(data[0].effective) | u64::from(data[1].effective) << 32
}

/// Fails with a clear message when `pid` names no running process.
pub fn check_pid(pid: u32) -> Result<()> {
    thread_group(pid).map(|_| ())
}

/// Whether process `pid` has exited: it is gone, or a zombie not yet reaped
/// (which uprobes refuse with ESRCH).
pub fn exited(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// The process (thread group id) that `pid` belongs to: `pid` itself for a
/// process, its leader for a thread id. Fails when there is no such task.
pub fn thread_group(pid: u32) -> Result<u32> {
    let status = match fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) if pid != 0 => s,
        _ => bail!("no process with PID {pid}"),
    };
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok());
    match tgid {
        // A zombie that already released its threads still reports itself.
        Some(0) | None => Ok(pid),
        Some(t) => Ok(t),
    }
}

/// A pid namespace, identified as `bpf_get_ns_current_pid_tgid` expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidNs {
    pub dev: u64,
    pub ino: u64,
}

/// PROC_PID_INIT_INO: the inode number of the initial pid namespace, the one
/// that sees every process.
pub const INIT_PIDNS_INO: u64 = 0xEFFF_FFFC;

/// Our pid namespace; `None` where /proc cannot tell.
pub fn pidns() -> Option<PidNs> {
    static NS: std::sync::OnceLock<Option<PidNs>> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        let md = fs::metadata("/proc/self/ns/pid").ok()?;
        Some(PidNs {
            dev: md.dev(),
            ino: md.ino(),
        })
    })
}

/// Our pid namespace when it is not the initial one (we run in a container), in
/// which case PIDs given by the user must be matched in that namespace.
pub fn own_pidns() -> Option<PidNs> {
    pidns().filter(|ns| ns.ino != INIT_PIDNS_INO)
}

/// Fails when this kernel cannot trace kernel functions, saying why and what still works.
pub fn require_kernel_functions(tracefs: &Path) -> Result<()> {
    let has_kprobes = Path::new("/sys/bus/event_source/devices/kprobe").exists()
        || tracefs.join("kprobe_events").exists();
    let aff = tracefs.join("available_filter_functions");
    let aff_denied = fs::File::open(&aff)
        .err()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
    if has_kprobes && !aff_denied {
        return Ok(());
    }
    let mut why = Vec::new();
    if !has_kprobes {
        why.push("it was built without kprobes (CONFIG_KPROBES is not set)".to_string());
    }
    if aff_denied {
        why.push(match lockdown() {
            Some(mode) => {
                format!("kernel lockdown ({mode}) forbids reading the traceable function list")
            }
            None => "reading the traceable function list is not permitted (EPERM)".to_string(),
        });
    } else if let Some(mode) = lockdown().filter(|m| m != "none") {
        why.push(format!("kernel lockdown is '{mode}'"));
    }
    Err(NoKernelFunctions(why.join(" and ")).into())
}

/// This kernel cannot trace kernel functions, and why. Its message names what
/// still works; a tool without patterns (vfsreadlat) says what it needs instead.
#[derive(Debug)]
pub struct NoKernelFunctions(pub String);

impl std::fmt::Display for NoKernelFunctions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kernel functions cannot be traced here: {}; tracepoints (t:CATEGORY:EVENT), \
             user functions (LIBRARY:FUNCTION) and USDT probes (u:LIBRARY:PROBE) still work",
            self.0
        )
    }
}

impl std::error::Error for NoKernelFunctions {}

/// The active lockdown mode, reading securityfs (mounting it if needed).
fn lockdown() -> Option<String> {
    let file = Path::new("/sys/kernel/security/lockdown");
    if !file.exists() {
        let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
        let (src, dir) = (c("securityfs"), c("/sys/kernel/security"));
        // SAFETY: valid NUL-terminated strings; failure is tolerated.
        unsafe {
            libc::mount(
                src.as_ptr(),
                dir.as_ptr(),
                src.as_ptr(),
                0,
                std::ptr::null(),
            );
        }
    }
    let s = fs::read_to_string(file).ok()?;
    let start = s.find('[')? + 1;
    let end = s[start..].find(']')? + start;
    Some(s[start..end].to_string())
}

/// Raises the open-file soft limit to the hard limit (tools call it at start:
/// single probes hold two descriptors each). Returns the soft limit in force.
pub fn raise_fd_soft_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return u64::MAX;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: valid in-pointer; failure leaves the limit unchanged.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    lim.rlim_cur
}

/// How many file descriptors this process has open.
pub fn open_fds() -> usize {
    fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

/// Whether `e` comes from running out of file descriptors (EMFILE), which
/// libbpf's errors carry only in their text.
pub fn out_of_fds(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EMFILE))
            || c.to_string()
                .contains(&format!("(os error {})", libc::EMFILE))
    })
}

/// What to do about [`out_of_fds`]: the limit, and how to raise it.
pub fn fd_limit_hint() -> String {
    let limit = raise_fd_soft_limit();
    format!("the open-file limit is {limit}: raise it with `ulimit -n 1024` (or `prlimit --nofile=1024`)")
}

/// Fails, before anything is attached, when `probes` more descriptors (plus
/// `reserve` for what the run opens later, such as symbol files) would not fit
/// under the open-file limit, saying how many are needed and how to get them.
pub fn check_fd_limit(probes: usize, reserve: usize) -> Result<()> {
    /// Room under the limit beyond which the descriptors already open are not
    /// counted (a directory listing): a tool has a few dozen open before
    /// attaching, not thousands.
    const HEADROOM: u64 = 4096;
    let limit = raise_fd_soft_limit();
    if (probes + reserve) as u64 + HEADROOM <= limit {
        return Ok(());
    }
    let need = open_fds() + probes + reserve;
    if need as u64 <= limit {
        return Ok(());
    }
    bail!(
        "this run needs {need} file descriptors ({probes} for its probes), over the \
         open-file limit of {limit}: raise it with `ulimit -n {need}` (or `prlimit \
         --nofile={need}`), or trace fewer probes"
    )
}

/// Whether `path` is the root or inside of a file system with this magic number
/// (statfs(2)'s f_type, linux/magic.h).
pub fn is_mounted_at(path: &Path, magic: i64) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and st is a valid statfs for the call.
    unsafe { libc::statfs(path.as_ptr(), &mut st) == 0 && st.f_type as i64 == magic }
}

/// Where a file system of type `fstype` is mounted (its first line in
/// /proc/self/mounts).
pub fn mount_point(fstype: &str) -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, ty) = (f.next()?, f.next()?, f.next()?);
        (ty == fstype).then(|| PathBuf::from(unescape_mount(dir)))
    })
}

/// /proc/mounts escapes space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape_mount(r"/a\040b"), "/a b");
        assert_eq!(unescape_mount("/plain"), "/plain");
    }
}
