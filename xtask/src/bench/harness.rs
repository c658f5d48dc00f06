//! What the benchmarks share: the test workload and a child's output lines (host
//! and guest); [`Tracer`], a tracing tool run as a child (ready line, its stdout
//! counted or kept as it comes, SIGINT, stderr); attach/detach timing of a tool;
//! the kernel's BPF run-time statistics switch; the many-functions C program;
//! medians; and the guest driver that collects a guest half's `BENCH {json}`
//! lines across kernel crashes.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::guest;

/// Prefix of the lines a guest half prints for its host half.
pub const MARK: &str = "BENCH ";

/// Lines of a child's stdout and stderr (whichever were piped), as they come.
pub fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        thread::spawn(move || {
            for l in BufReader::with_capacity(1 << 20, out)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(l);
            }
        });
    }
    if let Some(err) = child.stderr.take() {
        thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
    }
    rx
}

pub fn wait_for(
    rx: &mpsc::Receiver<String>,
    pred: impl Fn(&str) -> bool,
    what: &str,
) -> Result<String> {
    wait_long(rx, pred, what, Duration::from_secs(120))
}

/// [`wait_for`] with a limit of its own.
pub fn wait_long(
    rx: &mpsc::Receiver<String>,
    pred: impl Fn(&str) -> bool,
    what: &str,
    limit: Duration,
) -> Result<String> {
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if pred(&l) => return Ok(l),
            Ok(_) => {}
            Err(_) => bail!("timed out waiting for {what}"),
        }
    }
}

/// tests/progs/workload.rs started with `--time`, waiting for its signal.
pub struct Workload {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Workload {
    pub fn start(bin: &Path, args: &[String]) -> Result<Workload> {
        let mut child = Command::new(bin)
            .args(args)
            .arg("--time")
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let lines = lines_of(&mut child);
        wait_for(&lines, |l| l == "ready", "the workload")?;
        Ok(Workload { child, lines })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs the work and returns its ns per call.
    pub fn run(mut self) -> Result<f64> {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGUSR1) };
        let l = wait_for(&self.lines, |l| l.starts_with("ns_per_call "), "the timing")?;
        self.child.wait()?;
        Ok(l["ns_per_call ".len()..].parse()?)
    }
}

impl Drop for Workload {
    /// A workload a failed run never started is not left waiting for its signal.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How long a tool may take to exit after SIGINT before its process group is
/// killed ([`Peer::stop`]): every tool here exits within seconds, but a peer
/// once ignored SIGINT (bpftrace 0.17), and the bench waited for ever.
pub const STOP_LIMIT: Duration = Duration::from_secs(30);

/// A tool run as a child in its own process group, so that a peer that will
/// not stop is killed with whatever it started; killed so if dropped still
/// running (a run that failed half-way leaves nothing tracing).
pub struct Peer {
    pub child: Child,
    what: String,
}

impl Peer {
    /// Spawns `cmd` (its stdio as the caller set it) in a process group of its
    /// own, with SIGINT and SIGQUIT at their defaults: a bench started in the
    /// background of a shell without job control inherits them ignored, and a
    /// peer that keeps the defaults would not stop at [`Peer::stop`]'s SIGINT.
    pub fn spawn(mut cmd: Command, what: &str) -> Result<Peer> {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: signal(2) is async-signal-safe; nothing else runs between
        // fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                Ok(())
            });
        }
        let child = cmd
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        Ok(Peer {
            child,
            what: what.to_string(),
        })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// SIGINT, as Ctrl-C sends, then up to `limit` for the exit; past it, the
    /// process group is killed (SIGKILL) and the error says so, for the
    /// peer's row.
    pub fn stop(&mut self, limit: Duration) -> Result<ExitStatus> {
        // SAFETY: plain kill(2) on our child, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            if start.elapsed() > limit {
                self.kill();
                bail!(
                    "{} did not exit within {} s of SIGINT: killed",
                    self.what,
                    limit.as_secs_f64()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL to the process group, then reaps the child.
    fn kill(&mut self) {
        // SAFETY: kill(2) of the group our unreaped child leads (spawn).
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// What a [`Tracer`]'s stdout line after its ready line is (its classifier's
/// answer).
pub enum Line {
    /// An event record: counted.
    Record,
    /// A report of this many records lost: added up.
    Lost(u64),
    /// Kept, with the time it was read.
    Keep,
    /// Neither counted nor kept.
    Skip,
}

/// A tracing tool run as a child: [`Tracer::start`] returns once it printed its
/// ready line; its stdout is then read as it comes, each line classified on the
/// reading thread (counting there keeps the pipe drained as fast as the tool
/// writes, as a terminal or a file would); its stderr is kept. It is stopped with
/// SIGINT, as a user stops it with Ctrl-C, and killed if dropped still running.
pub struct Tracer {
    child: Child,
    /// Exec to ready: from just before the spawn until the starting thread got
    /// the ready line from the reader.
    pub ready: Duration,
    reader: Option<thread::JoinHandle<Output>>,
    stderr: Option<thread::JoinHandle<Vec<String>>>,
}

/// What a tracer printed.
#[derive(Default)]
pub struct Output {
    /// Stdout lines classified [`Line::Record`].
    pub records: u64,
    /// The sum of [`Line::Lost`] counts.
    pub lost: u64,
    /// Stdout lines classified [`Line::Keep`], with the time each was read.
    pub kept: Vec<(Instant, String)>,
    /// Every stderr line.
    pub stderr: Vec<String>,
}

/// A [`Tracer`] that printed no ready line within its limit (and was killed):
/// an error a bench may report as a result of the run rather than a failure.
#[derive(Debug)]
pub struct NotReady(String);

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotReady {}

impl Tracer {
    /// Starts `cmd` with stdout and stderr piped (anything else, such as stdin or
    /// the environment, is the caller's) and waits up to `limit` for a stdout
    /// line `ready` accepts. Lines before it are not classified. A tool that
    /// exits or is not ready in time ([`NotReady`]) is an error with the tail of
    /// its stderr.
    pub fn start(
        cmd: Command,
        ready: impl Fn(&str) -> bool + Send + Sync + 'static,
        limit: Duration,
        classify: impl FnMut(&str) -> Line + Send + 'static,
    ) -> Result<Tracer> {
        Self::start_on(cmd, ready, false, limit, classify)
    }

    /// [`Tracer::start`] for a tool whose ready line comes on stderr: a JSON
    /// run writes its status lines there, and records only on stdout.
    pub fn start_ready_on_stderr(
        cmd: Command,
        ready: impl Fn(&str) -> bool + Send + Sync + 'static,
        limit: Duration,
        classify: impl FnMut(&str) -> Line + Send + 'static,
    ) -> Result<Tracer> {
        Self::start_on(cmd, ready, true, limit, classify)
    }

    fn start_on(
        mut cmd: Command,
        ready: impl Fn(&str) -> bool + Send + Sync + 'static,
        on_stderr: bool,
        limit: Duration,
        mut classify: impl FnMut(&str) -> Line + Send + 'static,
    ) -> Result<Tracer> {
        let what = Path::new(cmd.get_program())
            .file_name()
            .unwrap_or(cmd.get_program())
            .to_string_lossy()
            .into_owned();
        let start = Instant::now();
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        // Dropped when stdout closes: a tool that exits before it is ready is
        // seen at once, not at the limit.
        let (ready_tx, ready_rx) = mpsc::channel();
        let ready = std::sync::Arc::new(ready);
        let (ready_err, ready_err_tx) = (ready.clone(), ready_tx.clone());
        let reader = thread::spawn(move || {
            let mut o = Output::default();
            let mut started = on_stderr;
            for l in BufReader::with_capacity(1 << 20, out)
                .lines()
                .map_while(Result::ok)
            {
                if !started {
                    started = ready(&l);
                    if started {
                        let _ = ready_tx.send(());
                    }
                    continue;
                }
                match classify(&l) {
                    Line::Record => o.records += 1,
                    Line::Lost(n) => o.lost += n,
                    // Timed only when kept: a clock read per counted line
                    // would slow the reader of a busy tool.
                    Line::Keep => o.kept.push((Instant::now(), l)),
                    Line::Skip => {}
                }
            }
            o
        });
        let stderr = thread::spawn(move || {
            let mut lines = Vec::new();
            let mut tx = on_stderr.then_some(ready_err_tx);
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.as_ref().is_some_and(|_| ready_err(&l)) {
                    let _ = tx.take().map(|t| t.send(()));
                }
                lines.push(l);
            }
            lines
        });
        let mut t = Tracer {
            child,
            ready: Duration::ZERO,
            reader: Some(reader),
            stderr: Some(stderr),
        };
        if let Err(e) = ready_rx.recv_timeout(limit) {
            let _ = t.child.kill();
            let _ = t.child.wait();
            let err = t.stderr.take().map(|h| h.join().unwrap_or_default());
            let err = err.unwrap_or_default();
            let tail = err[err.len().saturating_sub(10)..].join("\n");
            match e {
                mpsc::RecvTimeoutError::Timeout => {
                    return Err(
                        NotReady(format!("{what} was not ready within {limit:?}: {tail}")).into(),
                    )
                }
                mpsc::RecvTimeoutError::Disconnected => {
                    bail!("{what} exited before it was ready: {tail}")
                }
            }
        }
        t.ready = start.elapsed();
        Ok(t)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One SIGINT, as Ctrl-C sends.
    pub fn interrupt(&self) {
        // SAFETY: plain kill(2) on our child, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
    }

    /// Waits for the exit, blocking: the exit time is exact, not a poll's.
    pub fn wait(&mut self) -> Result<ExitStatus> {
        Ok(self.child.wait()?)
    }

    /// Waits for the exit up to `limit` (polling every 10 ms), sending SIGINT
    /// again every `again` if given; past `limit` kills it and returns false.
    pub fn wait_within(&mut self, limit: Duration, again: Option<Duration>) -> Result<bool> {
        let stop = Instant::now();
        let mut signalled = stop;
        while self.child.try_wait()?.is_none() {
            if again.is_some_and(|a| signalled.elapsed() > a) {
                self.interrupt();
                signalled = Instant::now();
            }
            if stop.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Ok(false);
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(true)
    }

    /// Everything it printed; call once it has exited (its pipes are then
    /// closed, and every line has been read).
    pub fn finish(mut self) -> Output {
        let mut o = self
            .reader
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        o.stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        o
    }
}

impl Drop for Tracer {
    /// A tracer a failed run left behind does not go on tracing.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// kernel.bpf_stats_enabled on while this lives (the value before is restored):
/// the kernel then times each BPF program's runs (`run_time_ns` in the fdinfo
/// of a program's descriptor).
pub struct BpfStats(String);

impl BpfStats {
    const SYSCTL: &'static str = "/proc/sys/kernel/bpf_stats_enabled";

    pub fn enable() -> Result<BpfStats> {
        let old = fs::read_to_string(Self::SYSCTL).context(Self::SYSCTL)?;
        fs::write(Self::SYSCTL, "1").context(Self::SYSCTL)?;
        Ok(BpfStats(old.trim().to_string()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(Self::SYSCTL, &self.0);
    }
}

/// A C program with `n` functions `fn_00000`... (a few instructions each, so
/// thousands share page offsets), built in `dir`. It prints "ready", then calls
/// every function once per line of stdin and prints "done", and exits at the
/// end of its input: a target that stays put until its stdin closes.
pub fn many_functions(dir: &Path, n: usize) -> Result<PathBuf> {
    let mut src = String::from("#include <stdio.h>\n");
    for i in 0..n {
        src.push_str(&format!(
            "__attribute__((noinline, used)) int fn_{i:05}(int x) {{ __asm__ volatile(\"\"); return x + {i}; }}\n"
        ));
    }
    src.push_str("int (*const fns[])(int) = {");
    for i in 0..n {
        src.push_str(&format!("fn_{i:05},"));
    }
    src.push_str(
        "};\nint main(void) { char b[8]; volatile int s = 0; printf(\"ready\\n\"); fflush(stdout);\n\
         while (fgets(b, sizeof b, stdin)) { for (unsigned i = 0; i < sizeof fns / sizeof *fns; i++) s += fns[i](i);\n\
         printf(\"done\\n\"); fflush(stdout); }\n return 0; }\n",
    );
    fs::create_dir_all(dir)?;
    let c = dir.join("many.c");
    fs::write(&c, src)?;
    let out = dir.join("many");
    let st = Command::new("cc")
        .args(["-g", "-O1", "-o"])
        .arg(&out)
        .arg(&c)
        .status()
        .context("running cc (package gcc)")?;
    if !st.success() {
        bail!("compiling {}", c.display());
    }
    Ok(out)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn num_cpus() -> usize {
    thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The `PREFIX*` or `*INFIX*` glob whose match count is closest to `n` (in ratio).
pub fn closest_glob(names: &[&str], n: usize) -> String {
    let mut cands: Vec<(String, usize)> = Vec::new();
    for len in 1..=4 {
        let mut prefixes: Vec<&str> = names.iter().filter_map(|s| s.get(..len)).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        for p in prefixes {
            if p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                let count = names.iter().filter(|s| s.starts_with(p)).count();
                cands.push((format!("{p}*"), count));
            }
        }
    }
    for infix in ["_", "e", "s", "t", "re", "in", "de", "er", "lo"] {
        let count = names.iter().filter(|s| s.contains(infix)).count();
        cands.push((format!("*{infix}*"), count));
    }
    let score = |c: usize| ((c.max(1) as f64) / n as f64).ln().abs();
    cands
        .into_iter()
        .min_by(|a, b| score(a.1).total_cmp(&score(b.1)))
        .map(|c| c.0)
        .expect("candidates")
}

/// The traceable kernel functions (guest), sorted, without duplicates.
pub fn traceable_functions() -> Result<Vec<String>> {
    let aff = fs::read_to_string("/sys/kernel/tracing/available_filter_functions")?;
    let mut names: Vec<String> = aff
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    names.sort_unstable();
    names.dedup();
    Ok(names)
}

/// Starts a tracing tool (ours, bpftrace or BCC's) with stdin closed, and its
/// stdout and stderr lines coming on the channel as [`lines_of`] reads them:
/// how the attach and per-call measurements start the tool they time.
pub fn spawn_tool(mut cmd: Command, what: &str) -> Result<(Child, mpsc::Receiver<String>)> {
    let mut child = cmd
        // BCC's tools are Python: unbuffered, their `Tracing` line is seen when printed.
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let lines = lines_of(&mut child);
    Ok((child, lines))
}

/// `bpftrace --version`'s line, for the reports of the benches that compare
/// with it.
pub fn bpftrace_version() -> Result<String> {
    let out = Command::new("bpftrace")
        .arg("--version")
        .output()
        .context("running bpftrace (package bpftrace)")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// One attach/detach measurement; `None` = over the limit.
pub struct Measured {
    /// N of the tool's "Tracing N functions" line, if it prints one.
    pub functions: Option<u64>,
    pub attach: Option<Duration>,
    pub detach: Option<Duration>,
}

/// Attach = exec until the tool prints its `Tracing ...` line (or `READY`, which a
/// bpftrace program prints from BEGIN); detach = SIGINT until it exits. Each phase
/// is bounded by `limit`; a tool that exits before it is ready is an error with
/// its last lines.
pub fn attach_detach(cmd: Command, what: &str, limit: Duration) -> Result<Measured> {
    let start = Instant::now();
    let (mut child, rx) = spawn_tool(cmd, what)?;
    let ready = |l: &str| l.starts_with("Tracing ") || l == "READY";
    let mut functions = None;
    let mut seen = Vec::new();
    let attach = loop {
        match rx.recv_timeout(limit.saturating_sub(start.elapsed())) {
            Ok(l) => {
                if let Some(rest) = l.strip_prefix("Tracing ") {
                    functions = rest.split(' ').next().and_then(|n| n.parse().ok());
                }
                if ready(&l) {
                    break Some(start.elapsed());
                }
                seen.push(l);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => break None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = child.wait();
                let tail: Vec<&String> = seen.iter().rev().take(2).collect();
                bail!("failed: {tail:?}");
            }
        }
    };
    let Some(attach) = attach else {
        let _ = child.kill();
        let _ = child.wait();
        return Ok(Measured {
            functions,
            attach: None,
            detach: None,
        });
    };
    // Let it run briefly, as a user would, then stop it.
    thread::sleep(Duration::from_secs(1));
    let stop = Instant::now();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let detach = loop {
        if child.try_wait()?.is_some() {
            break Some(stop.elapsed());
        }
        if stop.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    Ok(Measured {
        functions,
        attach: Some(attach),
        detach,
    })
}

/// Attach/detach runs that finish quickly are noisy under emulation: those are
/// repeated (median of [`REPS`]); one run of a slow tool is enough to show it is
/// slow. Also returns a note when the kernel was slow to release the functions.
pub const REPS: usize = 3;
pub const QUICK: Duration = Duration::from_secs(30);

pub fn measure_repeated(
    cmd: impl Fn() -> Command,
    what: &str,
    limit: Duration,
) -> Result<(Vec<Measured>, Option<String>)> {
    let mut runs = Vec::new();
    let started = Instant::now();
    loop {
        let m = attach_detach(cmd(), what, limit)?;
        let complete = m.attach.is_some() && m.detach.is_some();
        runs.push(m);
        if let Err(left) = wait_clean() {
            return Ok((runs, Some(left)));
        }
        if !complete || runs.len() >= REPS || started.elapsed() > QUICK * runs.len() as u32 {
            return Ok((runs, None));
        }
    }
}

/// The JSON of [`measure_repeated`]'s runs: medians (`null` = over the limit) and
/// every run.
pub fn attach_json(runs: &[Measured]) -> Value {
    let attach: Vec<f64> = runs
        .iter()
        .filter_map(|m| m.attach)
        .map(|d| d.as_secs_f64())
        .collect();
    let detach: Vec<f64> = runs
        .iter()
        .filter_map(|m| m.detach)
        .map(|d| d.as_secs_f64())
        .collect();
    // A run over the limit leaves its phase unmeasured: report "> limit".
    let complete = runs
        .iter()
        .all(|m| m.attach.is_some() && m.detach.is_some());
    serde_json::json!({
        "functions": runs.first().and_then(|m| m.functions),
        "attach_s": runs.iter().all(|m| m.attach.is_some()).then(|| median(attach.clone())),
        "detach_s": complete.then(|| median(detach.clone())),
        "attach_runs_s": attach, "detach_runs_s": detach,
    })
}

/// Waits until no ftrace-attached function is left, so runs do not overlap; says
/// how many are left if that takes over five minutes.
pub fn wait_clean() -> std::result::Result<(), String> {
    let end = Instant::now() + Duration::from_secs(300);
    loop {
        let left = fs::read_to_string("/sys/kernel/tracing/enabled_functions")
            .map(|s| s.lines().count())
            .unwrap_or(0);
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(format!("{left} functions still traced 300 s after the run"));
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// `obj` with the fields of `key` and `extra` merged in.
fn with(key: &Value, extra: Value) -> Value {
    let mut v = key.clone();
    if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    v
}

/// Whether `v` has every field of `key` with the same value.
pub fn matches(v: &Value, key: &Value) -> bool {
    key.as_object()
        .is_some_and(|k| k.iter().all(|(f, x)| &v[f] == x))
}

/// Guest half: the `BENCH` line that says measurement `key` starts (so the host
/// knows what a crash interrupted).
pub fn announce_start(key: &Value) {
    println!("{MARK}{}", with(key, serde_json::json!({"start": true})));
}

/// Guest half: the measurements a `--done FILE` argument lists (done in an earlier
/// boot of this run).
pub fn done_list(args: &[String]) -> Result<Vec<Value>> {
    match args.iter().position(|a| a == "--done") {
        Some(i) => {
            let path = args.get(i + 1).context("--done needs a FILE")?;
            Ok(serde_json::from_str(
                &fs::read_to_string(path).with_context(|| path.clone())?,
            )?)
        }
        None => Ok(Vec::new()),
    }
}

/// Prints `LABEL: TOOL PLACE: TEXT` for each of `rows` with a `field` string (an
/// `error` or a `note`), PLACE being `place` of the row: the lines under each
/// bench's tables.
pub fn print_flagged<'a>(
    rows: impl IntoIterator<Item = &'a Value>,
    field: &str,
    label: &str,
    place: impl Fn(&Value) -> String,
) {
    for r in rows.into_iter().filter(|r| r[field].is_string()) {
        println!(
            "{label}: {} {}: {}",
            r["tool"].as_str().unwrap_or(""),
            place(r),
            r[field].as_str().unwrap_or("")
        );
    }
}

/// What the guest runs of one benchmark produced.
pub struct GuestResults {
    /// The guest half's result lines; a measurement the guest died in has a `note`
    /// line (and an `error` line once it did so twice).
    pub results: Vec<Value>,
    /// Why the last boot did not finish, if it did not.
    pub failure: Option<String>,
}

/// Runs the guest half of bench `name` in `kernel` under [`guest_runs`]: a script
/// running `xtask bench-NAME-guest PATHS --done DONE_FILE FLAGS`, as each bench
/// with a guest half starts it.
pub fn run_guest_half(
    kernel: &guest::Kernel,
    name: &str,
    paths: &[&Path],
    done_file: &Path,
    flags: &[&str],
    timeout: Duration,
) -> Result<GuestResults> {
    let mut cmd = format!(
        "'{}' bench-{name}-guest",
        std::env::current_exe()?.display()
    );
    for p in paths {
        cmd.push_str(&format!(" '{}'", p.display()));
    }
    cmd.push_str(&format!(" --done '{}'", done_file.display()));
    for f in flags.iter().filter(|f| !f.is_empty()) {
        cmd.push_str(&format!(" {f}"));
    }
    let script = guest::write_script(&format!("bench-{name}.sh"), &cmd)?;
    guest_runs(kernel, &script, done_file, timeout)
}

/// Boots `kernel` running `script` (a guest half that prints `BENCH {json}` lines:
/// a `start` line with a measurement's key fields before it, its result with the
/// same fields after, and skips what `done_file` lists). If the guest kernel
/// crashes or the guest stops inside a measurement, that is a result in itself:
/// it is noted, a fresh guest is booted with the finished measurements in
/// `done_file`, the interrupted one is retried once, and the rest go on instead
/// of the table being lost.
pub fn guest_runs(
    kernel: &guest::Kernel,
    script: &Path,
    done_file: &Path,
    timeout: Duration,
) -> Result<GuestResults> {
    let mut results: Vec<Value> = Vec::new();
    let mut crashed: Vec<Value> = Vec::new();
    let mut failure = None;
    fs::write(done_file, "[]")?;
    for boot in 1..=6 {
        let verdict = guest::boot(kernel, script, timeout, guest::Tcg::Multi)?;
        let mut started: Option<Value> = None;
        for v in verdict
            .lines
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l.split_once(MARK)?.1).ok())
        {
            if v["start"].as_bool() == Some(true) {
                let mut key = v.clone();
                if let Some(m) = key.as_object_mut() {
                    m.remove("start");
                }
                started = Some(key);
            } else {
                if started.as_ref().is_some_and(|k| matches(&v, k)) {
                    started = None;
                }
                results.push(v);
            }
        }
        if verdict.passed {
            failure = None;
            break;
        }
        failure = Some(verdict.summary.clone());
        let Some(key) = started else {
            break;
        };
        let twice = crashed.contains(&key);
        let (note, error) = match &verdict.splat {
            Some(splat) => (
                format!(
                    "the guest kernel crashed during this run (boot {boot}): {}",
                    splat.trim()
                ),
                "crashed the guest kernel twice",
            ),
            None => (
                format!(
                    "the guest stopped during this run (boot {boot}): {}",
                    verdict.summary
                ),
                "the guest stopped during it twice",
            ),
        };
        results.push(with(&key, serde_json::json!({ "note": note })));
        if twice {
            results.push(with(&key, serde_json::json!({ "error": error })));
        }
        crashed.push(key);
        let done: Vec<&Value> = results.iter().filter(|r| r["note"].is_null()).collect();
        fs::write(done_file, serde_json::to_string(&done)?)?;
    }
    if results.iter().all(|r| r["note"].is_string()) {
        bail!(
            "the benchmark guest failed: {}",
            failure.unwrap_or_default()
        );
    }
    Ok(GuestResults { results, failure })
}

/// User plus system CPU time of process `pid`, in ns.
pub fn cpu_ns(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces): utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    f.iter().sum::<u64>() * 1_000_000_000 / clock_ticks_per_sec()
}

/// The unit of /proc's CPU times (USER_HZ).
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64
}

/// Lost records as the tools report them: tracekit's "lost N events: ...",
/// trace's "Possibly lost N samples", bpftrace's "Lost N events".
pub fn reported_lost(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter_map(|l| {
            if let Some(n) = l.strip_prefix("Possibly lost ") {
                return n.strip_suffix(" samples")?.parse().ok();
            }
            let rest = l.split_once("lost ").or_else(|| l.split_once("Lost "))?.1;
            let (num, tail) = rest.split_once(' ')?;
            (tail.starts_with("event: ") || tail.starts_with("events: ") || tail == "events")
                .then(|| num.parse::<u64>().ok())?
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_ignores_sigint_is_killed_with_its_group() {
        // A fake peer: a shell that ignores SIGINT and waits on a sleep it
        // started (which a non-interactive shell's background job ignores too).
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "trap '' INT; sleep 1000 & echo $!; wait"])
            .stdout(Stdio::piped());
        let mut peer = Peer::spawn(cmd, "fake-peer").unwrap();
        let lines = lines_of(&mut peer.child);
        let sleep: u32 = wait_for(&lines, |_| true, "the sleep's pid")
            .unwrap()
            .parse()
            .unwrap();
        let start = Instant::now();
        let err = peer.stop(Duration::from_millis(500)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "fake-peer did not exit within 0.5 s of SIGINT: killed"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(peer.child.try_wait().unwrap().is_some());
        // The sleep went with the group (reparented, then reaped by init).
        let gone = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rsplit(')').next().unwrap().trim_start().starts_with('Z')
            })
        };
        let end = Instant::now() + Duration::from_secs(5);
        while !gone(sleep) && Instant::now() < end {
            thread::sleep(Duration::from_millis(10));
        }
        assert!(gone(sleep), "the peer's sleep {sleep} outlived it");
    }

    #[test]
    fn a_peer_that_stops_gives_its_status() {
        let mut cmd = Command::new("sleep");
        cmd.arg("1000");
        let mut peer = Peer::spawn(cmd, "sleep").unwrap();
        let st = peer.stop(Duration::from_secs(5)).unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGINT)
        );
    }
}
