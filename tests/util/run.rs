//! Processes: locating the tools and test programs, starting them with their
//! output collected as it comes, driving the `workload` protocol (`ready`, then
//! SIGUSR1), and waiting for exits within a bound.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::{build_userfuncs, Scratch};

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

pub fn kill(pid: u32, sig: i32) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid as i32, sig) };
}

/// A workload started from a private copy of `bin` in `dir` (uprobes on the copy
/// see this test's process only, so the tool needs no -p), and the spec of the
/// copy's `func` (`COPY:func`).
pub fn private_workload(
    dir: &Scratch,
    bin: &Path,
    args: &[&str],
    func: &str,
) -> (Workload, String) {
    let copy = dir.copy(bin);
    let w = Workload::start(&copy, args);
    (w, format!("{}:{func}", copy.display()))
}

/// The workload test program, started and waiting for SIGUSR1.
pub struct Workload {
    child: Reaped,
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
        Workload {
            child: Reaped(child),
            pid,
        }
    }

    /// Tells it to do its work (or, with --hold after the work, to exit).
    pub fn go(&self) {
        kill(self.pid, libc::SIGUSR1);
    }

    pub fn wait(self) -> ExitStatus {
        self.child.wait()
    }
}

/// A test program a tool traces, told to go once the tool is attached: one
/// [`Running::finish_after`] for the workload (SIGUSR1) and C programs (stdin).
pub trait Traced {
    fn go(&mut self);
    fn wait(self) -> ExitStatus;
}

impl Traced for Workload {
    fn go(&mut self) {
        Workload::go(self)
    }

    fn wait(self) -> ExitStatus {
        Workload::wait(self)
    }
}

/// A child killed and reaped on drop, so that a failing test leaves no test
/// program running: what [`Workload`] and [`CProg`] hold.
pub struct Reaped(pub Child);

impl Reaped {
    pub fn wait(mut self) -> ExitStatus {
        self.0.wait().unwrap()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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

    /// Lets `w` run (the tool attached), and returns the tool's output once both
    /// have exited with success: how a run with -p ends, with its process.
    pub fn finish_after(self, mut w: impl Traced, timeout: Duration) -> Output {
        w.go();
        let out = self.finish(timeout);
        assert!(w.wait().success(), "the traced program failed");
        assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
        out
    }

    /// Lets `w` run to its exit (the tool attached), then stops the tool with
    /// `sig` and returns its output, asserting both succeeded: a run without -p.
    pub fn stop_after(self, mut w: impl Traced, sig: i32, timeout: Duration) -> Output {
        w.go();
        assert!(w.wait().success(), "the traced program failed");
        self.signal(sig);
        let out = self.finish(timeout);
        assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
        out
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
    trace_workload_until(cmd, w, args, |l| l.starts_with("Tracing"), timeout)
}

/// Runs a tool to completion.
pub fn run(bin: &Path, args: &[&str], timeout: Duration) -> Output {
    spawn(bin, args).finish(timeout)
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

/// Runs `tool args` (words for sh) under `ulimit -n 40`, which sets the hard
/// limit too, and asserts that it fails before attaching with exactly the
/// message saying how many descriptors it needs; returns that number. For each
/// tool that needs a descriptor per probe.
pub fn refused_for_want_of_descriptors(tool: &Path, args: &str) -> usize {
    let name = tool.file_name().unwrap().to_str().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n 40 && exec {} {args}", tool.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let need: usize = stderr
        .strip_prefix(&format!("{name}: error: this run needs "))
        .and_then(|r| r.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    let probes = stderr
        .split(" file descriptors (")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(
        stderr,
        format!(
            "{name}: error: this run needs {need} file descriptors ({probes} for its probes), \
             over the open-file limit of 40: raise it with `ulimit -n {need}` (or `prlimit \
             --nofile={need}`), or trace fewer probes\n"
        )
    );
    need
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
    t.finish_after(w, timeout)
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
