//! `cargo xtask bench-stacks`, second part: user stacks of code built without
//! frame pointers (tests/progs/nofp.c, `gcc -O2 -fomit-frame-pointer`: main ->
//! tk_c1 .. tk_c6 -> tk_leaf, each link with garbage in rbp), one uprobe event per
//! chain on tk_leaf, keyed by the user stack, side by side in one run:
//!
//! - `stackcount -U --user-stacks fp -p PID BIN:tk_leaf`: the kernel's
//!   frame-pointer walk (cut after a frame or two here);
//! - `stackcount -U --user-stacks dwarf -p PID BIN:tk_leaf`: the in-kernel walk
//!   by the binaries' unwind tables; counting stays in the kernel;
//! - `perf record --call-graph dwarf -e probe_nofp:tk_leaf -p PID` (the event made
//!   by `perf probe -x BIN tk_leaf`, deleted after): a copy of the registers and
//!   8 KiB of stack per event into perf.data, unwound later by `perf report`;
//! - `bpftrace -e 'uprobe:BIN:tk_leaf /pid == PID/ { @[ustack] = count(); }'`
//!   (bpftrace's ustack walks frame pointers);
//!
//! and an untraced run. `nofp chain N` waits for a line on stdin once the tracer
//! is ready; its wall time is from that line to its exit (reaped). Per tracer:
//! the extra ns per event over the untraced run ((t - t0) / N); the tracer's CPU
//! from its ready line to its exit (its user + system time at exit, from the
//! rusage of its reaping, minus /proc/PID/stat at ready: start-up is left out,
//! the drain, symbolization and perf's build-id pass at exit are in) per event;
//! bytes moved to user space per event (perf: perf.data size / samples written;
//! stackcount and bpftrace: what they read at the end, distinct stacks x (one
//! count-map entry + one stack-map value), / N); the frames of the stack each
//! gives (stackcount and bpftrace: their most counted stack; perf: `perf script`
//! of its first sample). `perf report --stdio` on the file is timed on its own
//! (wall and CPU): the unwinding perf defers to it. Two more measures isolate
//! the stack walk from the uprobe itself (tk_leaf starts with a %rip-relative
//! load, single-stepped out of line at every hit: microseconds in a VM):
//! `funccount -p PID BIN:tk_leaf` (the same uprobe, no stack) gives the probe's
//! own cost, subtracted in "over the uprobe alone"; and the kernel's run time of
//! each tool's per-event BPF programs (kernel.bpf_stats_enabled, read through
//! their fds duplicated with pidfd_getfd, as stackcount -p exits with the
//! traced process). Each traced case runs [`ROUNDS`] times, interleaved; the
//! median run by wall time is shown.
//!
//! Then the start-up cost of the tables: `stackcount -U --user-stacks dwarf|fp -p
//! PID t:syscalls:sys_enter_getppid` on a running `python3 -c 'import time;
//! time.sleep(30)'`: exec to its `Tracing` line and its peak RSS (VmHWM) while it
//! runs, median of [`STARTUP_REPS`].
//!
//! Every tool runs in a process group of its own, stopped with SIGINT and killed
//! past [`STOP_LIMIT`] ([`Peer`]); `perf report`/`perf script` are bounded too.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{
    bpftrace_version, cpu_ns, lines_of, median, wait_for, wait_long, BpfStats, Peer, STOP_LIMIT,
};

/// Chains per run: a few seconds under perf.
const CHAINS: u64 = 200_000;
/// How long `perf report` may take.
const REPORT_LIMIT: Duration = Duration::from_secs(300);
const STARTUP_REPS: usize = 3;
/// Interleaved rounds of the traced runs (each tool's median is shown).
const ROUNDS: usize = 3;
/// stackcount's user stack map: 8-byte hash key, 1,024-byte value (depth,
/// first, 127 addresses); its count map: 48-byte key, 8-byte count.
const STACKCOUNT_BYTES_PER_STACK: u64 = 8 + 1024 + 48 + 8;
/// bpftrace's stack map value (127 addresses) and its `@` entry (stack id and
/// pid key, 8-byte count), roughly.
const BPFTRACE_BYTES_PER_STACK: u64 = 127 * 8 + 16 + 8;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// funccount on the same uprobe: the probe's own cost, no stack.
    Uprobe,
    Fp,
    Dwarf,
    Perf,
    Bpftrace,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Uprobe => "funccount (the uprobe alone, no stack)",
            Kind::Fp => "stackcount --user-stacks fp",
            Kind::Dwarf => "stackcount --user-stacks dwarf",
            Kind::Perf => "perf record --call-graph dwarf",
            Kind::Bpftrace => "bpftrace @[ustack]",
        }
    }
}

/// One traced (or untraced) run.
#[derive(Default)]
struct Run {
    wall: f64,
    /// Tracer CPU from ready to exit, ns.
    cpu_ns: u64,
    /// Kernel-measured run time of the tool's BPF programs that ran for the
    /// events (none for perf), ns in all.
    bpf_ns: Option<u64>,
    bytes: u64,
    depth: usize,
    /// Events the tool says it counted or wrote.
    events: u64,
    note: String,
}

/// nofp `chain N`, waiting for its line on stdin.
struct Chain {
    child: std::process::Child,
}

impl Chain {
    fn start(bin: &Path) -> Result<Chain> {
        let mut child = Command::new(bin)
            .args(["chain", &CHAINS.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let lines = lines_of(&mut child);
        wait_for(&lines, |l| l == "ready", "nofp")?;
        Ok(Chain { child })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs the chains: seconds from the go line to the exit.
    fn run(mut self) -> Result<f64> {
        let start = Instant::now();
        let mut stdin = self.child.stdin.take().context("nofp's stdin")?;
        stdin.write_all(b"go\n")?;
        drop(stdin);
        let st = self.child.wait()?;
        let wall = start.elapsed().as_secs_f64();
        if !st.success() {
            bail!("nofp chain: {st}");
        }
        Ok(wall)
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The BPF programs of a tool, duplicated into this process (pidfd_getfd) so
/// their run-time statistics can be read after the tool has exited (stackcount
/// and funccount -p exit with the traced process).
pub(super) struct Progs(Vec<i32>);

impl Progs {
    pub(super) fn grab(pid: u32) -> Progs {
        let mut fds = Vec::new();
        // SAFETY: plain syscalls; the fds returned are ours to close (Drop).
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
        if pidfd < 0 {
            return Progs(fds);
        }
        if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) {
            for e in dir.flatten() {
                let prog = fs::read_link(e.path())
                    .is_ok_and(|t| t.to_string_lossy() == "anon_inode:bpf-prog");
                let Ok(n) = e.file_name().to_string_lossy().parse::<libc::c_int>() else {
                    continue;
                };
                if prog {
                    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, n, 0) };
                    if fd >= 0 {
                        fds.push(fd as i32);
                    }
                }
            }
        }
        unsafe { libc::close(pidfd as i32) };
        Progs(fds)
    }

    /// (run_time_ns, run_cnt) of each program.
    pub(super) fn stats(&self) -> Vec<(u64, u64)> {
        self.0
            .iter()
            .map(|fd| {
                let info =
                    fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
                let get = |k: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(k))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .unwrap_or(0)
                };
                (get("run_time_ns:"), get("run_cnt:"))
            })
            .collect()
    }
}

impl Drop for Progs {
    fn drop(&mut self) {
        for &fd in &self.0 {
            // SAFETY: fds this process got from pidfd_getfd.
            unsafe { libc::close(fd) };
        }
    }
}

/// Run time of the programs that ran at least once per event between `a`
/// and `b` (the tool's per-event programs, not its bookkeeping ones).
fn bpf_delta(a: &[(u64, u64)], b: &[(u64, u64)]) -> Option<u64> {
    let per_event: Vec<u64> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| y.1 - x.1 >= CHAINS)
        .map(|(x, y)| y.0 - x.0)
        .collect();
    (!per_event.is_empty()).then(|| per_event.iter().sum())
}

/// User plus system time of the children reaped so far, ns.
pub(super) fn children_cpu_ns() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1_000;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Runs `cmd` to its end within `limit` (killed with its group past it):
/// (wall s, CPU ns, its stdout).
pub(super) fn run_bounded(
    mut cmd: Command,
    what: &str,
    limit: Duration,
) -> Result<(f64, u64, String)> {
    let dir = std::env::temp_dir();
    let out_path = dir.join(format!("tk-bench-unwind-{}.out", std::process::id()));
    cmd.stdin(Stdio::null())
        .stdout(fs::File::create(&out_path)?)
        .stderr(Stdio::null());
    let cpu0 = children_cpu_ns();
    let start = Instant::now();
    let mut peer = Peer::spawn(cmd, what)?;
    loop {
        if let Some(st) = peer.child.try_wait()? {
            let wall = start.elapsed().as_secs_f64();
            let out = fs::read_to_string(&out_path).unwrap_or_default();
            let _ = fs::remove_file(&out_path);
            if !st.success() {
                bail!("{what}: {st}");
            }
            return Ok((wall, children_cpu_ns() - cpu0, out));
        }
        if start.elapsed() > limit {
            drop(peer);
            let _ = fs::remove_file(&out_path);
            bail!("{what} took over {} s: killed", limit.as_secs());
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// stackcount's stacks, frames leaf first, with their counts.
fn stackcount_stacks(lines: &[String]) -> Vec<(Vec<String>, u64)> {
    let mut stacks = Vec::new();
    let mut frames = Vec::new();
    for l in lines {
        if l.starts_with("    ") {
            if let Ok(n) = l.trim().parse::<u64>() {
                stacks.push((std::mem::take(&mut frames), n));
                continue;
            }
        }
        if let Some(f) = l.strip_prefix("  ") {
            frames.push(f.trim().to_string());
        } else {
            frames.clear();
        }
    }
    stacks
}

/// bpftrace's `@[ustack]` entries: frames and count.
fn bpftrace_stacks(lines: &[String]) -> Vec<(Vec<String>, u64)> {
    let mut stacks = Vec::new();
    let mut frames: Option<Vec<String>> = None;
    for l in lines {
        if l.starts_with("@[") {
            frames = Some(Vec::new());
        } else if let Some(rest) = l.strip_prefix("]: ") {
            if let (Some(f), Ok(n)) = (frames.take(), rest.trim().parse()) {
                stacks.push((f, n));
            }
        } else if let Some(f) = frames.as_mut() {
            if !l.trim().is_empty() {
                f.push(l.trim().to_string());
            }
        }
    }
    stacks
}

/// (frames of the most counted stack, events in all, distinct stacks).
fn summarize(stacks: &[(Vec<String>, u64)]) -> (usize, u64, u64) {
    let depth = stacks.iter().max_by_key(|s| s.1).map_or(0, |s| s.0.len());
    (depth, stacks.iter().map(|s| s.1).sum(), stacks.len() as u64)
}

/// A tool attached to `chain` (ready at `ready`, or after its perf events are
/// open when `ready` is None), the chains run, then stopped.
fn traced(
    kind: Kind,
    cmd: Command,
    ready: Option<&'static str>,
    chain: Chain,
) -> Result<(Run, Vec<String>)> {
    let mut cmd = cmd;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut peer = Peer::spawn(cmd, kind.label())?;
    let lines = lines_of(&mut peer.child);
    match ready {
        Some(r) => {
            let mut before = Vec::new();
            let end = Instant::now() + Duration::from_secs(120);
            loop {
                let left = end.saturating_duration_since(Instant::now());
                match lines.recv_timeout(left) {
                    Ok(l) if l.starts_with(r) => break,
                    Ok(l) => before.push(l),
                    Err(_) => bail!("not ready: {:?}", before),
                }
            }
        }
        None => wait_perf_open(peer.id())?,
    }
    let cpu0 = cpu_ns(peer.id());
    let progs = Progs::grab(peer.id());
    let bpf0 = progs.stats();
    let wall = chain.run()?;
    let bpf_ns = bpf_delta(&bpf0, &progs.stats());
    let reaped0 = children_cpu_ns();
    peer.stop(STOP_LIMIT)?;
    let total = children_cpu_ns() - reaped0;
    let mut after = Vec::new();
    while let Ok(l) = lines.recv_timeout(Duration::from_millis(500)) {
        after.push(l);
    }
    Ok((
        Run {
            wall,
            cpu_ns: total.saturating_sub(cpu0),
            bpf_ns,
            ..Run::default()
        },
        after,
    ))
}

/// Waits until perf record has opened its perf events (a `[perf_event]` fd),
/// then half a second for it to enable them.
pub(super) fn wait_perf_open(pid: u32) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let open = fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.filter_map(|e| fs::read_link(e.ok()?.path()).ok())
                    .any(|l| l.to_string_lossy().contains("perf_event"))
            })
            .unwrap_or(false);
        if open {
            thread::sleep(Duration::from_millis(500));
            return Ok(());
        }
        if Instant::now() > end {
            bail!("perf record opened no perf event within 60 s");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn stackcount_run(stackcount: &Path, bin: &Path, walk: &str) -> Result<Run> {
    let chain = Chain::start(bin)?;
    let mut c = Command::new(stackcount);
    c.args(["-U", "--user-stacks", walk, "-p", &chain.pid().to_string()])
        .arg(format!("{}:tk_leaf", bin.display()));
    let kind = if walk == "fp" { Kind::Fp } else { Kind::Dwarf };
    let (mut run, out) = traced(kind, c, Some("Tracing "), chain)?;
    let stacks = stackcount_stacks(&out);
    let (depth, events, distinct) = summarize(&stacks);
    run.depth = depth;
    run.events = events;
    run.bytes = distinct * STACKCOUNT_BYTES_PER_STACK;
    run.note = format!("{distinct} stacks; counted {events}");
    if let Some(l) = out.iter().find(|l| l.contains("lost") || l.contains("cut")) {
        run.note.push_str(&format!("; {l}"));
    }
    Ok(run)
}

fn funccount_run(funccount: &Path, bin: &Path) -> Result<Run> {
    let chain = Chain::start(bin)?;
    let mut c = Command::new(funccount);
    c.args(["-p", &chain.pid().to_string()])
        .arg(format!("{}:tk_leaf", bin.display()));
    let (mut run, out) = traced(Kind::Uprobe, c, Some("Tracing "), chain)?;
    run.events = out
        .iter()
        .filter_map(|l| l.trim().strip_prefix("tk_leaf")?.trim().parse::<u64>().ok())
        .sum();
    run.note = format!("counted {}", run.events);
    Ok(run)
}

fn bpftrace_run(bin: &Path) -> Result<Run> {
    let chain = Chain::start(bin)?;
    let mut c = Command::new("bpftrace");
    c.arg("-e").arg(format!(
        "BEGIN {{ printf(\"READY\\n\"); }} uprobe:{}:tk_leaf /pid == {}/ {{ @[ustack] = count(); }}",
        bin.display(),
        chain.pid()
    ));
    let (mut run, out) = traced(Kind::Bpftrace, c, Some("READY"), chain)?;
    let stacks = bpftrace_stacks(&out);
    let (depth, events, distinct) = summarize(&stacks);
    run.depth = depth;
    run.events = events;
    run.bytes = distinct * BPFTRACE_BYTES_PER_STACK;
    run.note = format!("{distinct} stacks; counted {events}");
    Ok(run)
}

/// The `perf probe` event on tk_leaf, deleted when dropped.
struct PerfProbe;

impl PerfProbe {
    const EVENT: &'static str = "probe_nofp:tk_leaf";

    fn add(bin: &Path) -> Result<PerfProbe> {
        // One left by an interrupted run would make the add fail.
        let _ = Command::new("perf")
            .args(["probe", "-q", "-d", Self::EVENT])
            .stderr(Stdio::null())
            .status();
        let out = Command::new("perf")
            .args(["probe", "-x"])
            .arg(bin)
            .arg("tk_leaf")
            .output()
            .context("running perf (package linux-perf)")?;
        if !out.status.success() {
            bail!(
                "perf probe -x {} tk_leaf: {}",
                bin.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(PerfProbe)
    }
}

impl Drop for PerfProbe {
    fn drop(&mut self) {
        let _ = Command::new("perf")
            .args(["probe", "-q", "-d", Self::EVENT])
            .stderr(Stdio::null())
            .status();
    }
}

/// perf record's run, and `perf report`'s (wall s, CPU ns) on its file.
fn perf_run(bin: &Path, dir: &Path) -> Result<(Run, Result<(f64, u64)>)> {
    let _probe = PerfProbe::add(bin)?;
    let data = dir.join("perf.data");
    let chain = Chain::start(bin)?;
    let mut c = Command::new("perf");
    c.args([
        "record",
        "--call-graph",
        "dwarf",
        "-e",
        PerfProbe::EVENT,
        "-p",
    ])
    .arg(chain.pid().to_string())
    .arg("-o")
    .arg(&data);
    let (mut run, out) = traced(Kind::Perf, c, None, chain)?;
    // "[ perf record: Captured and wrote 1045.424 MB perf.data (129383 samples) ]"
    let samples = out
        .iter()
        .find_map(|l| {
            let (_, rest) = l.split_once(" (")?;
            rest.strip_suffix(" samples) ]")?.parse::<u64>().ok()
        })
        .with_context(|| format!("perf record wrote no sample count: {out:?}"))?;
    let size = fs::metadata(&data)?.len();
    run.events = samples;
    run.bytes = size * CHAINS / samples.max(1);
    let lost: Vec<&str> = out
        .iter()
        .filter(|l| l.contains("lost"))
        .map(|l| l.trim())
        .collect();
    run.note = format!(
        "{samples} samples in {:.0} MB{}{}",
        size as f64 / 1e6,
        if lost.is_empty() { "" } else { "; " },
        lost.join(" ")
    );
    // Depth: the first sample of `perf script`, read then killed.
    run.depth = perf_script_depth(&data)?;
    let mut rep = Command::new("perf");
    rep.args(["report", "--stdio", "-i"]).arg(&data);
    let report = run_bounded(rep, "perf report", REPORT_LIMIT).map(|(w, c, _)| (w, c));
    let _ = fs::remove_file(&data);
    Ok((run, report))
}

fn perf_script_depth(data: &Path) -> Result<usize> {
    let mut c = Command::new("perf");
    c.args(["script", "-i"])
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // Killed with its group when dropped, after its first sample.
    let mut peer = Peer::spawn(c, "perf script")?;
    let lines = lines_of(&mut peer.child);
    wait_long(
        &lines,
        |l| l.contains(PerfProbe::EVENT),
        "perf script's first sample",
        Duration::from_secs(120),
    )?;
    let mut depth = 0;
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(60)) {
        if l.trim().is_empty() {
            break;
        }
        depth += 1;
    }
    Ok(depth)
}

/// Exec to `Tracing` (ms) and peak RSS (KiB) of stackcount `walk` on a python3.
fn startup_run(stackcount: &Path, walk: &str) -> Result<(f64, u64)> {
    let mut py = Command::new("/usr/bin/python3");
    py.args(["-c", "import time; time.sleep(30)"])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let py = Peer::spawn(py, "python3")?;
    // Past its start-up: its code is mapped.
    thread::sleep(Duration::from_millis(500));
    let mut c = Command::new(stackcount);
    c.args(["-U", "--user-stacks", walk, "-p", &py.id().to_string()])
        .arg("t:syscalls:sys_enter_getppid")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut peer = Peer::spawn(c, "stackcount")?;
    let lines = lines_of(&mut peer.child);
    wait_for(
        &lines,
        |l| l.starts_with("Tracing "),
        "stackcount on python3",
    )?;
    let ready = start.elapsed().as_secs_f64() * 1e3;
    thread::sleep(Duration::from_millis(300));
    let rss = fs::read_to_string(format!("/proc/{}/status", peer.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0);
    peer.stop(STOP_LIMIT)?;
    drop(py);
    Ok((ready, rss))
}

fn build_nofp(root: &Path, dir: &Path) -> Result<PathBuf> {
    let out = dir.join("nofp");
    let st = Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-o"])
        .arg(&out)
        .arg(root.join("tests/progs/nofp.c"))
        .args(["-lpthread", "-ldl"])
        .status()
        .context("running gcc")?;
    if !st.success() {
        bail!("gcc nofp.c failed");
    }
    Ok(out)
}

pub(super) fn fmt_err(e: &anyhow::Error) -> String {
    format!("failed: {}", format!("{e:#}").replace('\n', " "))
}

pub fn run(root: &Path, stackcount: &Path, funccount: &Path) -> Result<()> {
    let dir = root.join("target/bench/unwind");
    fs::create_dir_all(&dir)?;
    let bin = build_nofp(root, &dir)?;
    let n = CHAINS as f64;
    let _stats = BpfStats::enable()?;

    // Interleaved rounds; a tool that fails is not run again.
    let kinds = [
        Kind::Uprobe,
        Kind::Fp,
        Kind::Dwarf,
        Kind::Perf,
        Kind::Bpftrace,
    ];
    let mut untraced = Vec::new();
    let mut runs: Vec<Vec<Run>> = kinds.iter().map(|_| Vec::new()).collect();
    let mut errors: Vec<Option<anyhow::Error>> = kinds.iter().map(|_| None).collect();
    let mut reports = Vec::new();
    let mut report_err = None;
    for _ in 0..ROUNDS {
        untraced.push(Chain::start(&bin)?.run()?);
        for (i, &k) in kinds.iter().enumerate() {
            if errors[i].is_some() {
                continue;
            }
            let r = match k {
                Kind::Uprobe => funccount_run(funccount, &bin),
                Kind::Fp => stackcount_run(stackcount, &bin, "fp"),
                Kind::Dwarf => stackcount_run(stackcount, &bin, "dwarf"),
                Kind::Perf => perf_run(&bin, &dir).map(|(r, rep)| {
                    match rep {
                        Ok(x) => reports.push(x),
                        Err(e) => report_err = Some(e),
                    }
                    r
                }),
                Kind::Bpftrace => bpftrace_run(&bin),
            };
            match r {
                Ok(r) => runs[i].push(r),
                Err(e) => errors[i] = Some(e),
            }
        }
    }
    let t0 = median(untraced);
    // Each tool's median run by wall time.
    let rows: Vec<(Kind, Result<Run, String>)> = kinds
        .iter()
        .zip(runs.iter_mut().zip(&errors))
        .map(|(&k, (r, e))| {
            if let Some(e) = e {
                return (k, Err(fmt_err(e)));
            }
            r.sort_by(|a, b| a.wall.total_cmp(&b.wall));
            let mid = r.len() / 2;
            (k, Ok(r.swap_remove(mid)))
        })
        .collect();
    let get = |k: Kind| {
        rows.iter()
            .find(|r| r.0 == k)
            .and_then(|r| r.1.as_ref().ok())
    };
    let extra = |r: &Run| (r.wall - t0) * 1e9 / n;
    let probe = get(Kind::Uprobe).map(extra);
    let over_probe = |r: &Run| probe.map(|p| extra(r) - p);
    let cpu = |r: &Run| r.cpu_ns as f64 / n;

    let mut t = Builder::default();
    t.push_record([
        "tracer (uprobe on tk_leaf, N = 200,000)",
        "workload wall (s)",
        "extra ns / event",
        "over the uprobe alone",
        "BPF ns / event",
        "tracer CPU (s)",
        "tracer CPU ns / event",
        "bytes to user space / event",
        "frames",
        "notes",
    ]);
    let dash = || "-".to_string();
    t.push_record([
        "untraced".to_string(),
        format!("{t0:.3}"),
        dash(),
        dash(),
        dash(),
        dash(),
        dash(),
        dash(),
        dash(),
        format!("median of {ROUNDS}"),
    ]);
    for (k, r) in &rows {
        match r {
            Ok(r) => t.push_record([
                k.label().to_string(),
                format!("{:.3}", r.wall),
                format!("{:.0}", extra(r)),
                over_probe(r).map_or_else(dash, |v| format!("{v:.0}")),
                r.bpf_ns
                    .map_or_else(dash, |b| format!("{:.0}", b as f64 / n)),
                format!("{:.3}", r.cpu_ns as f64 / 1e9),
                format!("{:.0}", cpu(r)),
                if *k == Kind::Uprobe {
                    dash()
                } else {
                    format!("{:.3}", r.bytes as f64 / n)
                },
                if *k == Kind::Uprobe {
                    dash()
                } else {
                    r.depth.to_string()
                },
                r.note.clone(),
            ]),
            Err(e) => {
                let mut rec = vec![k.label().to_string()];
                rec.extend(vec![dash(); 8]);
                rec.push(e.clone());
                t.push_record(rec);
            }
        }
    }
    let report = match (report_err, reports.is_empty()) {
        (Some(e), _) => Some(Err(fmt_err(&e))),
        (None, false) => {
            reports.sort_by(|a, b| a.0.total_cmp(&b.0));
            Some(Ok(reports[reports.len() / 2]))
        }
        (None, true) => None,
    };
    if let Some(rep) = &report {
        let mut rec = vec!["  + perf report --stdio (on that file)".to_string()];
        match rep {
            Ok((wall, c)) => rec.extend([
                dash(),
                dash(),
                dash(),
                dash(),
                format!("{:.3} (wall {wall:.2} s)", *c as f64 / 1e9),
                format!("{:.0}", *c as f64 / n),
                dash(),
                dash(),
                "the unwinding perf record defers".into(),
            ]),
            Err(e) => {
                rec.extend(vec![dash(); 8]);
                rec.push(e.clone());
            }
        }
        t.push_record(rec);
    }
    println!(
        "\nUser stacks without frame pointers: nofp `chain {CHAINS}` (gcc -O2 \
         -fomit-frame-pointer), one uprobe event per chain, median of {ROUNDS} \
         interleaved rounds ({}; release build, this host):",
        bpftrace_version().unwrap_or_default()
    );
    println!("{}", t.build().with(Style::markdown()));
    println!(
        "extra ns / event = (wall - untraced wall) / N; over the uprobe alone = that minus \
         funccount's (the trap and single-step of the uprobe itself, which no tool \
         avoids). BPF ns / event = the kernel's run_time_ns (kernel.bpf_stats_enabled) of \
         the tool's programs that ran once per event / N (perf runs none). Tracer CPU = its \
         user + system time from its ready line to its exit (rusage at reaping minus \
         /proc/PID/stat at ready). Bytes to user space: perf = perf.data size / samples \
         written (lost samples not counted as moved); stackcount = distinct stacks x \
         {STACKCOUNT_BYTES_PER_STACK} B (stack-map value 1,024 B + key, count-map entry \
         56 B) read once at the end / N; bpftrace = distinct stacks x \
         {BPFTRACE_BYTES_PER_STACK} B (127-address stack-map value + @ entry, roughly) / N. \
         Frames: the most counted stack's (perf: its first sample in perf script, inlined \
         frames included). tk_leaf's first instruction is a %rip-relative load, which \
         the kernel cannot emulate: each hit is also single-stepped out of line, a \
         trap that can cost microseconds in a VM and then dominates every wall time \
         (see the uprobe-alone row); BPF ns / event is the tools' own in-kernel cost \
         without it."
    );

    // Ratios.
    let mut ratios = Builder::default();
    ratios.push_record(["ratio", "value", "goal"]);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".to_string(),
    };
    let (fp, dw, pf) = (get(Kind::Fp), get(Kind::Dwarf), get(Kind::Perf));
    let report_ns = match &report {
        Some(Ok((_, c))) => Some(*c as f64 / n),
        _ => None,
    };
    let bpf = |r: &Run| r.bpf_ns.map(|b| b as f64 / n);
    for (what, a, b, goal) in [
        (
            "extra ns / event: dwarf / fp",
            dw.map(extra),
            fp.map(extra),
            "<= 3x",
        ),
        (
            "extra ns / event over the uprobe alone: dwarf / fp",
            dw.and_then(over_probe),
            fp.and_then(over_probe),
            "<= 3x",
        ),
        (
            "BPF ns / event: dwarf / fp",
            dw.and_then(bpf),
            fp.and_then(bpf),
            "<= 3x",
        ),
        (
            "extra ns / event: perf / dwarf",
            pf.map(extra),
            dw.map(extra),
            ">= 3x",
        ),
        (
            "extra ns / event over the uprobe alone: perf / dwarf",
            pf.and_then(over_probe),
            dw.and_then(over_probe),
            ">= 3x",
        ),
        (
            "over the uprobe alone + tracer CPU, ns / event: perf / dwarf",
            pf.and_then(|r| Some(over_probe(r)? + cpu(r))),
            dw.and_then(|r| Some(over_probe(r)? + cpu(r))),
            ">= 3x",
        ),
        (
            "the same with perf report's CPU: perf / dwarf",
            pf.and_then(|r| Some(over_probe(r)? + cpu(r) + report_ns?)),
            dw.and_then(|r| Some(over_probe(r)? + cpu(r))),
            ">= 3x",
        ),
        (
            "bytes to user space / event: perf / dwarf",
            pf.map(|r| r.bytes as f64),
            dw.map(|r| r.bytes as f64),
            ">= 10x",
        ),
    ] {
        ratios.push_record([what.to_string(), ratio(a, b), goal.to_string()]);
    }
    println!("{}", ratios.build().with(Style::markdown()));
    drop(_stats);

    // Start-up of the tables on python3.
    let mut s = Builder::default();
    s.push_record([
        "stackcount -U -p PYTHON3 t:syscalls:sys_enter_getppid",
        "exec to Tracing (ms)",
        "peak RSS (MiB)",
    ]);
    let mut startup = Vec::new();
    for walk in ["fp", "dwarf"] {
        let mut ready = Vec::new();
        let mut rss = Vec::new();
        let mut err = None;
        for _ in 0..STARTUP_REPS {
            match startup_run(stackcount, walk) {
                Ok((r, m)) => {
                    ready.push(r);
                    rss.push(m as f64);
                }
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let row = match err {
            None => {
                let (r, m) = (median(ready), median(rss));
                startup.push((r, m));
                [
                    format!("--user-stacks {walk}"),
                    format!("{r:.0}"),
                    format!("{:.1}", m / 1024.0),
                ]
            }
            Some(e) => [format!("--user-stacks {walk}"), fmt_err(&e), "-".into()],
        };
        s.push_record(row);
    }
    if let [(fr, fm), (dr, dm)] = startup[..] {
        s.push_record([
            "dwarf / fp".to_string(),
            format!("{:.1}x (+{:.0} ms)", dr / fr, dr - fr),
            format!("{:.1}x", dm / fm),
        ]);
    }
    println!("\nStart-up of the unwind tables on a running python3 (median of {STARTUP_REPS}):");
    println!("{}", s.build().with(Style::markdown()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        s.lines().map(str::to_string).collect()
    }

    #[test]
    fn stackcount_and_bpftrace_stacks_are_read_with_their_depth() {
        let sc =
            lines("Detaching...\n  tk_leaf\n  tk_c6\n  main\n    200000\n\n  tk_leaf\n    3\n");
        assert_eq!(summarize(&stackcount_stacks(&sc)), (3, 200003, 2));
        let bt = lines("\n\n@[\n    tk_leaf+0\n    tk_c6+28\n]: 200000\n");
        assert_eq!(summarize(&bpftrace_stacks(&bt)), (2, 200000, 1));
    }

    #[test]
    fn only_programs_that_ran_per_event_count() {
        let a = [(100, 0), (5, 1)];
        let b = [(100 + 9_000, CHAINS), (50, 7)];
        assert_eq!(bpf_delta(&a, &b), Some(9_000));
        assert_eq!(bpf_delta(&a[1..], &b[1..]), None);
    }
}
