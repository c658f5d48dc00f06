//! Helpers for the integration tests: locating built binaries, running a tool with
//! its output streamed, and driving the `workload` test program.
#![allow(dead_code)]

pub mod http;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A lock on how `task:task_rename` attaches, across test processes (nextest runs
/// each test in its own): a test that adds a tracefs event of that name in
/// another group (which makes the name ambiguous, so the tracepoint goes on a
/// perf event, not a raw link) holds it exclusively, tests that expect a raw
/// link hold it shared. Released when dropped.
pub struct RenameEventLock(std::fs::File);

pub fn rename_event_lock(exclusive: bool) -> RenameEventLock {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::env::temp_dir().join("tracekit-test-task-rename.lock"))
        .expect("lock file");
    let how = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on an open descriptor.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), how) }, 0, "flock");
    RenameEventLock(f)
}

/// target/<profile>/, found from this test executable (target/<profile>/deps/x).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// A tool binary of this package: the one cargo built for these tests, or the one
/// in `TRACEKIT_TOOL_DIR` (`cargo xtask test` runs the host tests again against
/// the static release tools, the binaries users get).
pub fn tool(name: &str) -> PathBuf {
    let dir = std::env::var_os("TRACEKIT_TOOL_DIR").map_or_else(target_dir, PathBuf::from);
    let p = dir.join(name);
    assert!(p.exists(), "{} is not built", p.display());
    p
}

/// A test program from tests/progs (built by `cargo test` as an example).
pub fn prog(name: &str) -> PathBuf {
    let p = target_dir().join("examples").join(name);
    assert!(
        p.exists(),
        "{} is not built (cargo test builds examples)",
        p.display()
    );
    p
}

/// A private directory removed on drop, for files no other test touches.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tracekit-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// A private copy of `bin`: uprobes on it see only the processes of this test.
    pub fn copy(&self, bin: &Path) -> PathBuf {
        let dst = self.0.join(bin.file_name().unwrap());
        std::fs::copy(bin, &dst).unwrap();
        dst
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A cgroup v2 made for one test under the cgroup2 mount (`name` relative to
/// it, parents first), removed on drop once its processes are gone.
pub struct Cgroup {
    /// Its path below the cgroup2 mount, as `--cgroup` takes it.
    pub rel: String,
    pub path: PathBuf,
}

/// Where the cgroup v2 file system is mounted.
pub fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .expect("no cgroup2 mount")
}

impl Cgroup {
    pub fn new(name: &str) -> Cgroup {
        let mount = cgroup2_mount();
        let rel = format!("tracekit-test-{}/{name}", std::process::id());
        let path = mount.join(&rel);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Cgroup { rel, path }
    }

    /// Moves process `pid` into this cgroup.
    pub fn adopt(&self, pid: u32) {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // A just-reaped process can take a moment to leave the cgroup.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.path).is_ok() {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        if let Some(parent) = self.path.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

pub fn kill(pid: u32, sig: i32) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid as i32, sig) };
}

/// The workload test program, started and waiting for SIGUSR1.
pub struct Workload {
    child: Child,
    pub pid: u32,
}

impl Workload {
    pub fn start(bin: &Path, args: &[&str]) -> Workload {
        // A just-copied binary can be ETXTBSY while another test thread's forked
        // child still holds the copy's write descriptor (until its exec).
        let mut tries = 0;
        let mut child = loop {
            match Command::new(bin).args(args).stdout(Stdio::piped()).spawn() {
                Ok(c) => break c,
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                    tries += 1;
                    thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("spawn {}: {e}", bin.display()),
            }
        };
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "workload did not start");
        let pid = child.id();
        Workload { child, pid }
    }

    /// Tells it to do its work (or, with --hold after the work, to exit).
    pub fn go(&self) {
        kill(self.pid, libc::SIGUSR1);
    }

    pub fn wait(mut self) -> ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running tool whose stdout lines and stderr are collected as they come.
pub struct Running {
    child: Child,
    lines: Receiver<String>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }
}

pub fn spawn(bin: &Path, args: &[&str]) -> Running {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    spawn_cmd(cmd)
}

/// [`spawn`] for a prepared command (a shell that sets limits, say).
pub fn spawn_cmd(mut cmd: Command) -> Running {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let (tx, lines) = channel();
    let tx_err = tx.clone();
    let stdout = Arc::new(Mutex::new(String::new()));
    let stderr = Arc::new(Mutex::new(String::new()));
    let out = child.stdout.take().unwrap();
    let buf = stdout.clone();
    thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            buf.lock().unwrap().push_str(&format!("{line}\n"));
            let _ = tx.send(line);
        }
    });
    // stderr lines go to the same channel: JSON mode prints status lines there.
    let err = child.stderr.take().unwrap();
    let ebuf = stderr.clone();
    let etx = tx_err;
    thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            ebuf.lock().unwrap().push_str(&format!("{line}\n"));
            let _ = etx.send(line);
        }
    });
    Running {
        child,
        lines,
        stdout,
        stderr,
    }
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stdout or stderr line satisfying `pred`; panics with all output on timeout.
    pub fn wait_line(&mut self, pred: impl Fn(&str) -> bool, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            match self
                .lines
                .recv_timeout(end.saturating_duration_since(Instant::now()))
            {
                Ok(l) if pred(&l) => return l,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    let _ = self.child.kill();
                    thread::sleep(Duration::from_millis(100));
                    panic!(
                        "no expected line within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                        self.stdout.lock().unwrap(),
                        self.stderr.lock().unwrap()
                    );
                }
            }
        }
    }

    /// Waits until the tool is attached (its "Tracing ..." status line).
    pub fn wait_ready(&mut self) {
        // "Tracing N functions for ..." or, as BCC's examples print, "Tracing...".
        self.wait_line(|l| l.starts_with("Tracing"), Duration::from_secs(60));
    }

    pub fn signal(&self, sig: i32) {
        kill(self.pid(), sig);
    }

    /// Waits for exit (killing it after `timeout`, which fails the test).
    pub fn finish(mut self, timeout: Duration) -> Output {
        let Some(status) = wait_within(&mut self.child, timeout) else {
            panic!(
                "tool did not exit within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                self.stdout.lock().unwrap(),
                self.stderr.lock().unwrap()
            );
        };
        // Let the reader threads drain the pipes.
        while self.lines.recv_timeout(Duration::from_millis(500)).is_ok() {}
        thread::sleep(Duration::from_millis(50));
        let stdout = self.stdout.lock().unwrap().clone();
        let stderr = self.stderr.lock().unwrap().clone();
        Output {
            status,
            stdout,
            stderr,
        }
    }
}

/// Runs `tool -p PID args` on workload `w`: waits until the tool has attached, lets
/// the workload run, and returns the tool's output once both have exited with
/// success (with -p the tool ends by itself when the traced process exits).
pub fn trace_workload(tool: &Path, w: Workload, args: &[&str], timeout: Duration) -> Output {
    trace_workload_via(&[tool.to_str().unwrap()], w, args, timeout)
}

/// [`trace_workload`] with the tool started by a command prefix (`cmd[0]` runs
/// `cmd[1..]`, the last of which is the tool), e.g. [`without_debug_files`].
pub fn trace_workload_via(cmd: &[&str], w: Workload, args: &[&str], timeout: Duration) -> Output {
    let pid = w.pid.to_string();
    let mut all: Vec<&str> = cmd[1..].to_vec();
    all.extend(["-p", pid.as_str()]);
    all.extend_from_slice(args);
    let mut t = spawn(Path::new(cmd[0]), &all);
    t.wait_ready();
    w.go();
    let out = t.finish(timeout);
    assert!(w.wait().success(), "the workload failed");
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    out
}

/// Runs a tool to completion.
pub fn run(bin: &Path, args: &[&str], timeout: Duration) -> Output {
    spawn(bin, args).finish(timeout)
}

/// The rows (name, count) of the last funccount table in `stdout`.
pub fn last_table(stdout: &str) -> Vec<(String, u64)> {
    let lines: Vec<&str> = stdout.lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.starts_with("FUNC ") && l.trim_end().ends_with("COUNT"))
        .unwrap_or_else(|| panic!("no summary table in:\n{stdout}"));
    lines[start + 1..]
        .iter()
        .take_while(|l| !l.is_empty() && !l.starts_with("Detaching"))
        .map(|l| {
            let (name, count) = l.rsplit_once(' ').expect("row");
            (
                name.trim().to_string(),
                count.trim().parse().expect("count"),
            )
        })
        .collect()
}

pub fn rows(expected: &[(&str, u64)]) -> Vec<(String, u64)> {
    expected.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// The type (`BPF_LINK_TYPE_*`) of every BPF link in the system. Only the type is
/// asked for, which every kernel fills (fuller queries fail on older kernels).
pub fn bpf_link_types() -> Vec<u32> {
    use libbpf_sys as sys;
    let mut types = Vec::new();
    let mut id = 0u32;
    // SAFETY: plain bpf(2) wrappers with valid out-pointers; fds are closed here.
    unsafe {
        while sys::bpf_link_get_next_id(id, &mut id) == 0 {
            let fd = sys::bpf_link_get_fd_by_id(id);
            if fd < 0 {
                continue; // gone meanwhile
            }
            let mut info: sys::bpf_link_info = std::mem::zeroed();
            let mut len = std::mem::size_of_val(&info.type_) as u32 + 8; // type, id, prog_id
            if sys::bpf_link_get_info_by_fd(fd, &mut info, &mut len) == 0 {
                types.push(info.type_);
            }
            libc::close(fd);
        }
    }
    types
}

/// Stacks of a stackcount text summary: (frames leaf first, count).
pub fn parse_stacks(stdout: &str) -> Vec<(Vec<String>, u64)> {
    let mut out = Vec::new();
    let mut frames = Vec::new();
    for line in stdout.lines() {
        if let Some(f) = line.strip_prefix("  ").filter(|f| !f.starts_with("  ")) {
            frames.push(f.to_string());
        } else if let Some(c) = line
            .strip_prefix("    ")
            .and_then(|c| c.parse::<u64>().ok())
        {
            out.push((std::mem::take(&mut frames), c));
        }
    }
    out
}

/// The `--debug` line saying how tracepoints were attached.
pub fn tracepoint_mechanisms(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("tracepoints: "))
        .unwrap_or_else(|| panic!("no tracepoints line in:\n{stderr}"))
}

/// The kernel stack of `stackcount --debug -K t:task:task_rename` over the
/// workload's `rename N`, asserted: the tracepoint on a raw link, and one stack
/// (counted per command name, which the workload changes: -p keys stacks per
/// process, as -P) beginning where the tracepoint fired, `count` times in all.
pub fn rename_stack(out: &Output, count: u64) -> Vec<String> {
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        "tracepoints: 1 as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 0 as perf events"
    );
    let stacks = parse_stacks(&out.stdout);
    let frames = stacks.first().expect("a stack").0.clone();
    assert!(stacks.iter().all(|(f, _)| *f == frames), "{}", out.stdout);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    assert_eq!(total, count, "{}", out.stdout);
    assert_eq!(frames[0], "__set_task_comm", "{frames:?}");
    frames
}

/// Asserts that `tool args` exits 1 with exactly `tool: error: message` on stderr.
pub fn fails_with(tool_bin: &Path, args: &[&str], message: &str) {
    let name = tool_bin.file_name().unwrap().to_str().unwrap().to_string();
    let out = run(tool_bin, args, Duration::from_secs(300));
    assert_eq!(
        out.code(),
        1,
        "stdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    assert_eq!(out.stderr, format!("{name}: error: {message}\n"));
    assert_eq!(out.stdout, "");
}

/// Every symbol name in /proc/kallsyms.
pub fn kernel_symbols() -> std::collections::HashSet<String> {
    std::fs::read_to_string("/proc/kallsyms")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

/// A command prefix that runs `tool` as on a machine without debug packages: in a
/// private mount namespace with an empty tmpfs over /usr/lib/debug (libc6-dbg and
/// every other debug file hidden). For [`trace_workload_via`] and [`spawn`].
pub fn without_debug_files(tool: &Path) -> Vec<String> {
    with_empty_dir("/usr/lib/debug", tool)
}

/// A command prefix that runs `tool` as on a kernel without BTF: an empty tmpfs
/// over /sys/kernel/btf, as [`without_debug_files`].
pub fn without_kernel_btf(tool: &Path) -> Vec<String> {
    with_empty_dir("/sys/kernel/btf", tool)
}

/// A command prefix that runs `tool` in a private mount namespace with an empty
/// tmpfs over `dir`.
fn with_empty_dir(dir: &str, tool: &Path) -> Vec<String> {
    [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        &format!("mount -t tmpfs none {dir} && exec \"$0\" \"$@\""),
        tool.to_str().unwrap(),
    ]
    .map(str::to_string)
    .to_vec()
}

/// Compiles tests/progs/userfuncs.c with gcc and `flags` (no -g unless given) into
/// `dir` as `name`: a C binary built at test time, as distributions build them.
pub fn build_userfuncs(dir: &Scratch, name: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/userfuncs.c");
    let out = dir.0.join(name);
    let st = Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .args(flags)
        .status()
        .expect("gcc");
    assert!(st.success(), "gcc failed");
    out
}

/// A copy of `bin` without .symtab or debug sections (`objcopy --strip-all`), as
/// distributions ship binaries: only .dynsym is left.
pub fn stripped_copy(dir: &Scratch, bin: &Path, name: &str) -> PathBuf {
    let out = dir.0.join(name);
    let st = Command::new("objcopy")
        .arg("--strip-all")
        .arg(bin)
        .arg(&out)
        .status()
        .expect("objcopy");
    assert!(st.success(), "objcopy failed");
    out
}

/// Compiles the C test program `tests/progs/NAME.c` with the system compiler
/// (`cc -g -O1`) into `dir`.
pub fn build_c(dir: &Scratch, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/progs")
        .join(format!("{name}.c"));
    let out = dir.0.join(name);
    let st = Command::new("cc")
        .args(["-g", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("running cc (package gcc)");
    assert!(st.success(), "cc {} failed", src.display());
    out
}

/// A C test program started with a piped stdin, past its "ready" line; `go`
/// writes the line it waits for.
pub struct CProg {
    child: Child,
    pub pid: u32,
}

impl CProg {
    pub fn start(bin: &Path) -> CProg {
        let mut child = Command::new(bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{} did not start", bin.display());
        let pid = child.id();
        CProg { child, pid }
    }

    pub fn go(&mut self) {
        use std::io::Write;
        let mut stdin = self.child.stdin.take().expect("go once");
        stdin.write_all(b"go\n").unwrap();
    }

    pub fn wait(mut self) -> ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for CProg {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a C program with `n` functions `fn_0000`.. (a few instructions each, so
/// thousands share page offsets) and compiles it. It prints "ready", then calls
/// every function once per line read from stdin, and exits at end of input.
pub fn build_many_functions(dir: &Scratch, n: usize) -> PathBuf {
    let mut src = String::from("#include <stdio.h>\n");
    for i in 0..n {
        src.push_str(&format!(
            "__attribute__((noinline, used)) int fn_{i:04}(int x) {{ __asm__ volatile(\"\"); return x + {i}; }}\n"
        ));
    }
    src.push_str("int (*const fns[])(int) = {");
    for i in 0..n {
        src.push_str(&format!("fn_{i:04},"));
    }
    src.push_str(
        "};\nint main(void) { char b[8]; volatile int s = 0; printf(\"ready\\n\"); fflush(stdout);\n\
         while (fgets(b, sizeof b, stdin)) for (unsigned i = 0; i < sizeof fns / sizeof *fns; i++) s += fns[i](i);\n\
         return 0; }\n",
    );
    let c = dir.0.join("many.c");
    std::fs::write(&c, src).unwrap();
    let out = dir.0.join("many");
    let st = Command::new("cc")
        .args(["-g", "-O1", "-o"])
        .arg(&out)
        .arg(&c)
        .status()
        .expect("running cc (package gcc)");
    assert!(st.success());
    out
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

/// Whether `line` says a per-event tool is ready: BCC's examples print their
/// column header (`TIME(s) ...`), JSON runs a `Tracing ...` line on stderr.
pub fn header_or_tracing(line: &str) -> bool {
    line.starts_with("TIME") || line.starts_with("Tracing")
}

/// [`trace_workload_via`] for tools whose start line is a column header: waits
/// for a line satisfying `ready`, lets the workload run, and returns the tool's
/// output once both have exited with success.
pub fn trace_workload_until(
    cmd: &[&str],
    w: Workload,
    args: &[&str],
    ready: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Output {
    let pid = w.pid.to_string();
    let mut all: Vec<&str> = cmd[1..].to_vec();
    all.extend(["-p", pid.as_str()]);
    all.extend_from_slice(args);
    let mut t = spawn(Path::new(cmd[0]), &all);
    t.wait_line(ready, Duration::from_secs(60));
    w.go();
    let out = t.finish(timeout);
    assert!(w.wait().success(), "the workload failed");
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    out
}

/// A loop device over a fresh file of `mib` MiB (`losetup`), detached on drop.
pub struct LoopDev {
    pub dev: String,
    /// The backing file.
    pub file: PathBuf,
    _dir: Scratch,
}

impl LoopDev {
    pub fn new(mib: u64) -> LoopDev {
        Self::with_flags(mib, &[])
    }

    /// With `losetup` flags, e.g. `--direct-io=on`.
    pub fn with_flags(mib: u64, flags: &[&str]) -> LoopDev {
        let dir = Scratch::new();
        let file = dir.0.join("disk.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .args(flags)
            .arg(&file)
            .output()
            .expect("losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
        LoopDev {
            dev,
            file,
            _dir: dir,
        }
    }

    /// `loopN`, as `-d` takes it.
    pub fn name(&self) -> &str {
        self.dev.trim_start_matches("/dev/")
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// The numbers in stderr warnings `... lost N events: ...` (per report), summed.
pub fn lost_reported(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split_once(": lost ")?.1;
            let (n, tail) = rest.split_once(' ')?;
            (tail.starts_with("event: ") || tail.starts_with("events: "))
                .then(|| n.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

/// Waits until process `pid` is stopped (state T in /proc/PID/stat); panics
/// after `timeout`.
pub fn wait_stopped(pid: u32, timeout: Duration) {
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| r.starts_with(" T")))
    };
    let end = Instant::now() + timeout;
    while !stopped() {
        assert!(Instant::now() < end, "process {pid} did not stop");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `tool args` (without -p) while two copies of userfuncs, built as
/// `a_name` and `b_name`, call uf_target `a_calls` and `b_calls` times; the tool
/// is stopped with SIGINT once both are done. `args` may name `{a}` and `{b}`,
/// the two binaries' paths.
pub fn trace_two_copies(
    tool: &Path,
    (a_name, a_calls): (&str, u64),
    (b_name, b_calls): (&str, u64),
    args: &[&str],
) -> Output {
    let dir = Scratch::new();
    let a = build_userfuncs(&dir, a_name, &[]);
    let b = build_userfuncs(&dir, b_name, &[]);
    let (an, bn) = (a_calls.to_string(), b_calls.to_string());
    let wa = Workload::start(&a, &["plain", &an]);
    let wb = Workload::start(&b, &["plain", &bn]);
    let args: Vec<String> = args
        .iter()
        .map(|s| {
            s.replace("{a}", &a.display().to_string())
                .replace("{b}", &b.display().to_string())
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut t = spawn(tool, &args);
    t.wait_ready();
    wa.go();
    wb.go();
    assert!(
        wa.wait().success() && wb.wait().success(),
        "a workload failed"
    );
    t.signal(libc::SIGINT);
    let out = t.finish(Duration::from_secs(60));
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    out
}

/// Runs `tool args` with stdout to a pipe whose reader takes the first line and
/// goes away (`... | head -1`), and returns how it exited, within `timeout`
/// (killed and failing past it) with its stderr: the tool must notice with no
/// more output of its own to write.
pub fn exit_after_head_1(tool: &Path, args: &[&str], timeout: Duration) -> (i32, String) {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty(), "no first line");
    // The reader is dropped: the pipe has no reader left.
    let Some(status) = wait_within(&mut child, timeout) else {
        panic!(
            "{} did not exit within {timeout:?} of its reader going",
            tool.display()
        );
    };
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    (status.code().unwrap_or(-1), err)
}

/// The exit status of `child` within `timeout`; past it, the child is killed
/// and reaped, and None returned (for the caller's failure message).
fn wait_within(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(20));
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

/// The first child of process `pid` (what `unshare -f` runs, say).
pub fn child_of(pid: u32, timeout: Duration) -> u32 {
    let end = Instant::now() + timeout;
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(c) = children.split_whitespace().next() {
            return c.parse().unwrap();
        }
        assert!(Instant::now() < end, "process {pid} started no child");
        thread::sleep(Duration::from_millis(10));
    }
}
