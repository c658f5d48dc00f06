//! `cargo xtask bench-profile [--rounds N] [--seconds S]`: the cost of an on-CPU
//! profile of every CPU, at 99 Hz and 999 Hz side by side in one run:
//!
//! - `stackcount -f profile:hz:N` (user stacks by unwind tables, the default) and
//!   `stackcount -f --user-stacks fp profile:hz:N`: counted in the kernel by
//!   kernel and user stack, read once at the end;
//! - `perf record -F N -g -a -o FILE` (frame-pointer call graphs, every sample
//!   written to perf.data), and `perf report --stdio` on that file as a row of
//!   its own;
//! - `bpftrace -e 'profile:hz:N { @[kstack, ustack] = count(); }'`;
//!
//! and no tracer. The workload is tests/progs/spin.c (`gcc -O2
//! -fno-omit-frame-pointer`): one thread per CPU counting chunks of work for
//! [`SECONDS`] of wall time, started idle before the tracer and let go once the
//! tracer is ready. Per run: the workload's throughput (chunks per second over
//! both threads) and its loss against the untraced runs; the tracer's CPU time
//! (user + system, threads included) from its ready point to its exit (rusage
//! at its reaping minus /proc/PID/stat at ready: the drain, symbolization and
//! output at exit are in, its start-up is not; the start-up is in the "with
//! start-up" column); the kernel's run time of its BPF programs
//! (kernel.bpf_stats_enabled; perf runs none: its in-kernel sampling cost shows
//! only in the throughput); the samples it took (stackcount and bpftrace: the sum
//! of their counts; perf: its "Captured and wrote" line) and perf.data's size.
//! The sampling programs run in the interrupt on the workload's CPUs, so their
//! cost is in the throughput loss; the tracer's CPU is what its process adds.
//!
//! Each case runs [`ROUNDS`] times, interleaved (an untraced run first in each
//! round); medians are shown. Every tracer runs in a process group of its own,
//! is stopped with SIGINT and killed past [`STOP_LIMIT`] ([`Peer`]); `perf
//! report` is bounded too. A tracer that fails gets `failed: ...` in its row and
//! is not run again.

use std::fs;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{
    bpftrace_version, clock_ticks_per_sec, cpu_ns, lines_of, median, num_cpus, wait_for, BpfStats,
    Peer, STOP_LIMIT,
};
use super::unwind::{children_cpu_ns, fmt_err, run_bounded, wait_perf_open, Progs};

/// Default wall time of each workload run.
const SECONDS: f64 = 10.0;
/// Default interleaved rounds.
const ROUNDS: usize = 3;
const RATES: [u32; 2] = [99, 999];
/// How long `perf report` may take.
const REPORT_LIMIT: Duration = Duration::from_secs(300);
/// Time given to a tracer after its ready point before the workload starts
/// (perf record has opened its events then, not necessarily enabled them).
const SETTLE: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Stackcount,
    StackcountFp,
    Perf,
    Bpftrace,
}

impl Kind {
    const ALL: [Kind; 4] = [
        Kind::Stackcount,
        Kind::StackcountFp,
        Kind::Perf,
        Kind::Bpftrace,
    ];

    fn label(self) -> &'static str {
        match self {
            Kind::Stackcount => "stackcount -f profile:hz:N",
            Kind::StackcountFp => "stackcount -f --user-stacks fp profile:hz:N",
            Kind::Perf => "perf record -F N -g -a",
            Kind::Bpftrace => "bpftrace @[kstack, ustack] = count()",
        }
    }
}

/// One workload run (traced or not).
#[derive(Default, Clone)]
struct Run {
    /// Chunks of work per second, both threads.
    rate: f64,
    /// Tracer CPU from ready to exit, of that after SIGINT, and over its
    /// whole life, ns.
    cpu_ns: u64,
    exit_ns: u64,
    total_ns: u64,
    /// Run time of the tracer's BPF programs during the workload, ns.
    bpf_ns: Option<u64>,
    samples: u64,
    /// Frames of the most counted stack of the workload (user + kernel).
    frames: Option<usize>,
    /// perf.data's size.
    bytes: Option<u64>,
    /// `perf report --stdio`'s (wall s, CPU ns), perf only.
    report: Option<std::result::Result<(f64, u64), String>>,
    note: String,
}

/// tests/progs/spin.c `spin CPUS SECONDS`, its threads idle until [`Spin::run`].
struct Spin {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Spin {
    fn start(bin: &Path, secs: f64) -> Result<Spin> {
        let mut child = Command::new(bin)
            .arg(num_cpus().to_string())
            .arg(secs.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let lines = lines_of(&mut child);
        wait_for(&lines, |l| l == "ready", "spin")?;
        Ok(Spin { child, lines })
    }

    /// Lets the threads go; chunks per second of the time the hypervisor let
    /// the CPUs run, once they stopped (reaped).
    fn run(mut self) -> Result<f64> {
        let mut stdin = self.child.stdin.take().context("spin's stdin")?;
        let stolen0 = stolen_secs();
        stdin.write_all(b"go\n")?;
        drop(stdin);
        let field = |name: &str| -> Result<f64> {
            let l = wait_for(&self.lines, |l| l.starts_with(name), "spin's result")?;
            Ok(l[name.len()..].trim().parse()?)
        };
        let (iters, secs) = (field("iterations ")?, field("seconds ")?);
        let stolen = stolen_secs() - stolen0;
        let st = self.child.wait()?;
        if !st.success() {
            bail!("spin: {st}");
        }
        // Time stolen from the CPUs (other guests on the host) is no tracer's:
        // left in, it spread the untraced runs over more than the losses.
        Ok(iters / (secs - stolen / num_cpus() as f64))
    }
}

/// CPU time the hypervisor has taken from this machine's CPUs since boot, s
/// (/proc/stat's steal column; 0 on bare metal).
fn stolen_secs() -> f64 {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let steal = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    steal / clock_ticks_per_sec() as f64
}

impl Drop for Spin {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads `r` line by line on a thread of its own; with `ready`, says on `tx` when
/// a line starts with it.
fn collect(
    r: impl std::io::Read + Send + 'static,
    ready: Option<(&'static str, mpsc::Sender<()>)>,
) -> thread::JoinHandle<Vec<String>> {
    thread::spawn(move || {
        let mut ready = ready;
        let mut lines = Vec::new();
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if ready.as_ref().is_some_and(|(p, _)| l.starts_with(p)) {
                let _ = ready.take().map(|(_, tx)| tx.send(()));
            }
            lines.push(l);
        }
        lines
    })
}

/// `cmd` run around one spin run: ready at a stdout line starting with `ready`,
/// or (None) once it has opened its perf events; then [`SETTLE`], the workload,
/// and SIGINT. Returns the run (rate and CPU) and the tool's stdout and stderr.
fn traced(
    kind: Kind,
    mut cmd: Command,
    ready: Option<&'static str>,
    spin: Spin,
) -> Result<(Run, Vec<String>, Vec<String>)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut peer = Peer::spawn(cmd, kind.label())?;
    let (tx, rx) = mpsc::channel();
    let out = collect(
        peer.child.stdout.take().context("stdout")?,
        ready.map(|r| (r, tx)),
    );
    let err = collect(peer.child.stderr.take().context("stderr")?, None);
    match ready {
        Some(r) => {
            if rx.recv_timeout(Duration::from_secs(120)).is_err() {
                drop(peer);
                let err = err.join().unwrap_or_default();
                bail!(
                    "no {r:?} line: {}",
                    err[err.len().saturating_sub(3)..].join(" ")
                );
            }
        }
        None => {
            if let Err(e) = wait_perf_open(peer.id()) {
                drop(peer);
                let err = err.join().unwrap_or_default();
                bail!("{e}: {}", err[err.len().saturating_sub(3)..].join(" "));
            }
        }
    }
    thread::sleep(SETTLE);
    if let Ok(Some(st)) = peer.child.try_wait() {
        let err = err.join().unwrap_or_default();
        bail!(
            "exited ({st}): {}",
            err[err.len().saturating_sub(3)..].join(" ")
        );
    }
    let progs = Progs::grab(peer.id());
    let bpf0 = progs.stats();
    let cpu0 = cpu_ns(peer.id());
    let rate = spin.run()?;
    let bpf1 = progs.stats();
    let bpf_ns: u64 = bpf0.iter().zip(&bpf1).map(|(a, b)| b.0 - a.0).sum();
    let cpu1 = cpu_ns(peer.id());
    let reaped0 = children_cpu_ns();
    peer.stop(STOP_LIMIT)?;
    let total_ns = children_cpu_ns() - reaped0;
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    Ok((
        Run {
            rate,
            cpu_ns: total_ns.saturating_sub(cpu0),
            exit_ns: total_ns.saturating_sub(cpu1),
            total_ns,
            bpf_ns: (!bpf1.is_empty()).then_some(bpf_ns),
            ..Run::default()
        },
        out,
        err,
    ))
}

/// Keeps a tool's output in `dir` (the last round's), for a look after the run.
fn keep(dir: &Path, name: &str, out: &[String], err: &[String]) {
    let text = format!("{}\n--- stderr:\n{}\n", out.join("\n"), err.join("\n"));
    let _ = fs::write(dir.join(format!("{name}.txt")), text);
}

/// The lines of `err` that report losses or cut stacks, joined.
fn losses(err: &[String]) -> String {
    err.iter()
        .filter(|l| l.contains("lost") || l.contains("cut") || l.contains("dropped"))
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join("; ")
}

/// (sum of the counts, frames of the most counted stack of `comm`) of folded lines.
fn folded_samples(out: &[String], comm: &str) -> (u64, Option<usize>) {
    let mut sum = 0;
    let mut top: Option<(u64, usize)> = None;
    for l in out {
        let Some((stack, n)) = l.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else {
            continue;
        };
        sum += n;
        let mut parts = stack.split(';');
        if parts.next() == Some(comm) && top.is_none_or(|t| n > t.0) {
            top = Some((n, parts.count()));
        }
    }
    (sum, top.map(|t| t.1))
}

/// (sum of the counts, the most counted stack's frames) of bpftrace's
/// `@[kstack, ustack]` entries (in a profile of the busy workload, the top one
/// is the workload's).
fn bpftrace_samples(out: &[String]) -> (u64, Option<Vec<String>>) {
    let mut sum = 0;
    let mut top: Option<(u64, Vec<String>)> = None;
    let mut frames: Vec<String> = Vec::new();
    for l in out {
        let t = l.trim();
        if t.starts_with("@[") {
            frames.clear();
        } else if let Some(n) = t.strip_prefix("]: ") {
            let Ok(n) = n.trim().parse::<u64>() else {
                continue;
            };
            sum += n;
            if top.as_ref().is_none_or(|t| n > t.0) {
                top = Some((n, frames.clone()));
            }
        } else if !t.is_empty() && t != "," {
            frames.push(t.to_string());
        }
    }
    (sum, top.map(|t| t.1))
}

fn stackcount_run(
    stackcount: &Path,
    spin: &Path,
    dir: &Path,
    secs: f64,
    hz: u32,
    fp: bool,
) -> Result<Run> {
    let w = Spin::start(spin, secs)?;
    let mut c = Command::new(stackcount);
    c.arg("-f");
    if fp {
        c.args(["--user-stacks", "fp"]);
    }
    c.arg(format!("profile:hz:{hz}"));
    let kind = if fp {
        Kind::StackcountFp
    } else {
        Kind::Stackcount
    };
    let (mut run, out, err) = traced(kind, c, None, w)?;
    let name = if fp { "stackcount-fp" } else { "stackcount" };
    keep(dir, &format!("{name}-{hz}"), &out, &err);
    (run.samples, run.frames) = folded_samples(&out, "spin");
    run.note = format!("{} stacks", out.len());
    let lost = losses(&err);
    if !lost.is_empty() {
        run.note.push_str(&format!("; {lost}"));
    }
    Ok(run)
}

fn bpftrace_run(spin: &Path, dir: &Path, secs: f64, hz: u32) -> Result<Run> {
    let w = Spin::start(spin, secs)?;
    let mut c = Command::new("bpftrace");
    c.arg("-e").arg(format!(
        "BEGIN {{ printf(\"READY\\n\"); }} profile:hz:{hz} {{ @[kstack, ustack] = count(); }}"
    ));
    // Room for as many distinct stacks as stackcount keeps (its default is 4096).
    c.env("BPFTRACE_MAP_KEYS_MAX", "16384");
    let (mut run, out, err) = traced(Kind::Bpftrace, c, Some("READY"), w)?;
    keep(dir, &format!("bpftrace-{hz}"), &out, &err);
    let top;
    (run.samples, top) = bpftrace_samples(&out);
    run.frames = top.as_ref().map(Vec::len);
    run.note = format!(
        "{} stacks",
        out.iter().filter(|l| l.starts_with("@[")).count()
    );
    // It resolves user addresses when it prints, after the workload exited.
    if top.is_some_and(|f| f.iter().any(|f| f.starts_with("0x"))) {
        run.note
            .push_str("; user frames printed as addresses (spin had exited)");
    }
    let collisions = err.iter().filter(|l| l.contains("stack id -17")).count();
    if collisions > 0 {
        run.note.push_str(&format!(
            "; {collisions} stacks dropped (stack id collisions)"
        ));
    }
    let lost = losses(&err);
    if !lost.is_empty() {
        run.note.push_str(&format!("; {lost}"));
    }
    Ok(run)
}

fn perf_run(spin: &Path, dir: &Path, secs: f64, hz: u32) -> Result<Run> {
    let data = dir.join(format!("perf-{hz}.data"));
    let _ = fs::remove_file(&data);
    let w = Spin::start(spin, secs)?;
    let mut c = Command::new("perf");
    c.args(["record", "-F", &hz.to_string(), "-g", "-a", "-o"])
        .arg(&data);
    let (mut run, out, err) = traced(Kind::Perf, c, None, w)?;
    keep(dir, &format!("perf-record-{hz}"), &out, &err);
    // "[ perf record: Captured and wrote 3.012 MB perf.data (19914 samples) ]"
    run.samples = err
        .iter()
        .find_map(|l| {
            let (_, rest) = l.split_once(" (")?;
            rest.strip_suffix(" samples) ]")?.parse::<u64>().ok()
        })
        .with_context(|| format!("perf record wrote no sample count: {err:?}"))?;
    let size = fs::metadata(&data)?.len();
    run.bytes = Some(size);
    run.note = format!("perf.data {:.1} MB", size as f64 / 1e6);
    let lost = losses(&err);
    if !lost.is_empty() {
        run.note.push_str(&format!("; {lost}"));
    }
    let mut rep = Command::new("perf");
    rep.args(["report", "--stdio", "-i"]).arg(&data);
    run.report = Some(
        run_bounded(rep, "perf report", REPORT_LIMIT)
            .map(|(w, c, _)| (w, c))
            .map_err(|e| fmt_err(&e)),
    );
    let _ = fs::remove_file(&data);
    Ok(run)
}

fn build_spin(root: &Path, dir: &Path) -> Result<PathBuf> {
    let out = dir.join("spin");
    let st = Command::new("gcc")
        .args(["-O2", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&out)
        .arg(root.join("tests/progs/spin.c"))
        .status()
        .context("running gcc")?;
    if !st.success() {
        bail!("gcc spin.c failed");
    }
    Ok(out)
}

/// `--NAME VALUE` of `args`, parsed, or `default`.
fn flag<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T> {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} needs a number")),
        None => Ok(default),
    }
}

/// Medians of a case's runs, field by field.
fn medians(runs: &[Run]) -> Run {
    let med = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let med_opt = |f: &dyn Fn(&Run) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    let reports: Vec<(f64, u64)> = runs.iter().filter_map(|r| r.report.clone()?.ok()).collect();
    let report_err = runs.iter().find_map(|r| r.report.clone()?.err());
    Run {
        rate: med(&|r| r.rate),
        cpu_ns: med(&|r| r.cpu_ns as f64) as u64,
        exit_ns: med(&|r| r.exit_ns as f64) as u64,
        total_ns: med(&|r| r.total_ns as f64) as u64,
        bpf_ns: med_opt(&|r| r.bpf_ns.map(|b| b as f64)).map(|b| b as u64),
        samples: med(&|r| r.samples as f64) as u64,
        frames: med_opt(&|r| r.frames.map(|f| f as f64)).map(|f| f as usize),
        bytes: med_opt(&|r| r.bytes.map(|b| b as f64)).map(|b| b as u64),
        report: match (report_err, reports.is_empty()) {
            (Some(e), _) => Some(Err(e)),
            (None, false) => Some(Ok((
                median(reports.iter().map(|r| r.0).collect()),
                median(reports.iter().map(|r| r.1 as f64).collect()) as u64,
            ))),
            (None, true) => None,
        },
        // The median run's (by rate) note.
        note: {
            let mut by_rate: Vec<&Run> = runs.iter().collect();
            by_rate.sort_by(|a, b| a.rate.total_cmp(&b.rate));
            by_rate[by_rate.len() / 2].note.clone()
        },
    }
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let rounds: usize = flag(args, "--rounds", ROUNDS)?.max(1);
    let secs: f64 = flag(args, "--seconds", SECONDS)?;
    crate::build::build_release(&["--bin", "stackcount"])?;
    let stackcount = root.join("target/release/stackcount");
    let dir = root.join("target/bench/profile");
    fs::create_dir_all(&dir)?;
    let spin = build_spin(root, &dir)?;
    let _stats = BpfStats::enable()?;
    let cpus = num_cpus();

    let mut untraced = Vec::new();
    // runs[hz index][kind index]
    let mut runs: Vec<Vec<Vec<Run>>> = RATES
        .iter()
        .map(|_| Kind::ALL.iter().map(|_| Vec::new()).collect())
        .collect();
    let mut errors: Vec<Vec<Option<String>>> = RATES
        .iter()
        .map(|_| Kind::ALL.iter().map(|_| None).collect())
        .collect();
    let started = Instant::now();
    for round in 1..=rounds {
        eprintln!(
            "bench-profile: round {round} of {rounds} ({:.0} s so far)",
            started.elapsed().as_secs_f64()
        );
        untraced.push(Spin::start(&spin, secs)?.run()?);
        for (h, &hz) in RATES.iter().enumerate() {
            for (k, &kind) in Kind::ALL.iter().enumerate() {
                if errors[h][k].is_some() {
                    continue;
                }
                let r = match kind {
                    Kind::Stackcount => stackcount_run(&stackcount, &spin, &dir, secs, hz, false),
                    Kind::StackcountFp => stackcount_run(&stackcount, &spin, &dir, secs, hz, true),
                    Kind::Perf => perf_run(&spin, &dir, secs, hz),
                    Kind::Bpftrace => bpftrace_run(&spin, &dir, secs, hz),
                };
                match r {
                    Ok(r) => runs[h][k].push(r),
                    Err(e) => {
                        eprintln!(
                            "bench-profile: {} at {hz} Hz: {}",
                            kind.label(),
                            fmt_err(&e)
                        );
                        errors[h][k] = Some(fmt_err(&e));
                    }
                }
            }
        }
    }
    drop(_stats);
    let base = median(untraced.clone());
    let loss = |r: &Run| (base - r.rate) / base * 100.0;
    let dash = || "-".to_string();
    let secs_of = |ns: u64| format!("{:.3}", ns as f64 / 1e9);

    let mut t = Builder::default();
    t.push_record([
        "tracer",
        "Hz",
        "samples",
        "tracer CPU, ready to exit (s)",
        "of which after SIGINT (s)",
        "with start-up (s)",
        "BPF run time (s)",
        "workload (M chunks/s)",
        "throughput loss",
        "frames",
        "notes",
    ]);
    t.push_record([
        "no tracer".to_string(),
        dash(),
        dash(),
        dash(),
        dash(),
        dash(),
        dash(),
        format!("{:.3}", base / 1e6),
        dash(),
        dash(),
        format!(
            "runs {}",
            untraced
                .iter()
                .map(|r| format!("{:.3}", r / 1e6))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ]);
    // (hz, kind) -> medians
    let mut med: Vec<(u32, Kind, Run)> = Vec::new();
    for (h, &hz) in RATES.iter().enumerate() {
        for (k, &kind) in Kind::ALL.iter().enumerate() {
            if let Some(e) = &errors[h][k] {
                let mut rec = vec![kind.label().to_string(), hz.to_string()];
                rec.extend(vec![dash(); 8]);
                rec.push(e.clone());
                t.push_record(rec);
                continue;
            }
            if runs[h][k].is_empty() {
                continue;
            }
            let m = medians(&runs[h][k]);
            let per_run: Vec<String> = runs[h][k]
                .iter()
                .map(|r| format!("{:.1}", loss(r)))
                .collect();
            t.push_record([
                kind.label().to_string(),
                hz.to_string(),
                m.samples.to_string(),
                secs_of(m.cpu_ns),
                secs_of(m.exit_ns),
                secs_of(m.total_ns),
                m.bpf_ns.map_or_else(dash, secs_of),
                format!("{:.3}", m.rate / 1e6),
                format!("{:.2}%", loss(&m)),
                m.frames.map_or_else(dash, |f| f.to_string()),
                format!("loss per run {}%; {}", per_run.join(", "), m.note),
            ]);
            if let Some(rep) = &m.report {
                let mut rec = vec!["  + perf report --stdio".to_string(), hz.to_string()];
                match rep {
                    Ok((wall, c)) => rec.extend([
                        dash(),
                        secs_of(*c),
                        dash(),
                        dash(),
                        dash(),
                        dash(),
                        dash(),
                        dash(),
                        format!("wall {wall:.2} s, after the run"),
                    ]),
                    Err(e) => {
                        rec.extend(vec![dash(); 8]);
                        rec.push(e.clone());
                    }
                }
                t.push_record(rec);
            }
            med.push((hz, kind, m));
        }
    }
    println!(
        "\nOn-CPU profile of all {cpus} CPUs: spin ({cpus} threads counting chunks of work \
         for {secs} s of wall time), median of {rounds} interleaved rounds ({}; {}; \
         release build, this host):",
        bpftrace_version().unwrap_or_default(),
        perf_version()
    );
    println!("{}", t.build().with(Style::markdown()));
    println!(
        "samples: what the tool counted or wrote over its whole run (about {cpus} CPUs x Hz x \
         ({secs} s + {:.1} s settle + stop)). Tracer CPU: user + system time of the \
         tracer (its threads and children) from its ready point to its exit (rusage at \
         reaping minus /proc/PID/stat at ready), its start-up left out; \"with start-up\" \
         has it. BPF run time: kernel.bpf_stats_enabled's run_time_ns of the tool's \
         programs during the workload (perf runs none; every tool's in-kernel sampling \
         cost shows in the throughput). Throughput loss: chunks/s (per second of \
         the time the hypervisor left the CPUs: /proc/stat's steal taken out) against \
         the untraced median. Frames: the workload's most counted stack (stackcount: user + kernel \
         frames of its folded line; bpftrace: its most counted entry).",
        SETTLE.as_secs_f64()
    );

    let (lo, hi) = untraced
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    if hi > lo * 1.05 {
        println!(
            "WARNING: the untraced runs differ by {:.0}%: other work shared the CPUs \
             during the run (see each row's losses per run); rerun on a quiet machine.",
            (hi / lo - 1.0) * 100.0
        );
    }

    let get = |hz: u32, k: Kind| med.iter().find(|m| m.0 == hz && m.1 == k).map(|m| &m.2);
    let mut ratios = Builder::default();
    ratios.push_record(["Hz", "ratio", "value", "goal"]);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".to_string(),
    };
    for &hz in &RATES {
        let cpu = |k: Kind| get(hz, k).map(|r| r.cpu_ns as f64);
        // What the tool takes from the CPUs: its process, and its programs in
        // the sampling interrupt (perf runs none; its in-kernel cost is not
        // measured, so it has no such row).
        let with_bpf = |k: Kind| get(hz, k).and_then(|r| Some((r.cpu_ns + r.bpf_ns?) as f64));
        let perf_all = get(hz, Kind::Perf).and_then(|r| match &r.report {
            Some(Ok((_, c))) => Some((r.cpu_ns + c) as f64),
            _ => None,
        });
        for (what, a, b, goal) in [
            (
                "tracer CPU: stackcount / perf record",
                cpu(Kind::Stackcount),
                cpu(Kind::Perf),
                "< 1",
            ),
            (
                "tracer CPU: stackcount / (perf record + perf report)",
                cpu(Kind::Stackcount),
                perf_all,
                "< 1",
            ),
            (
                "tracer CPU: stackcount / bpftrace",
                cpu(Kind::Stackcount),
                cpu(Kind::Bpftrace),
                "< 1",
            ),
            (
                "tracer CPU + BPF run time: stackcount / bpftrace",
                with_bpf(Kind::Stackcount),
                with_bpf(Kind::Bpftrace),
                "< 1",
            ),
            (
                "tracer CPU: stackcount fp / perf record",
                cpu(Kind::StackcountFp),
                cpu(Kind::Perf),
                "< 1",
            ),
            (
                "tracer CPU: stackcount fp / bpftrace",
                cpu(Kind::StackcountFp),
                cpu(Kind::Bpftrace),
                "< 1",
            ),
        ] {
            ratios.push_record([hz.to_string(), what.to_string(), ratio(a, b), goal.into()]);
        }
        let losses: Vec<String> = Kind::ALL
            .iter()
            .filter_map(|&k| {
                let r = get(hz, k)?;
                Some(format!(
                    "{} {:.2}%",
                    match k {
                        Kind::Stackcount => "stackcount",
                        Kind::StackcountFp => "stackcount fp",
                        Kind::Perf => "perf",
                        Kind::Bpftrace => "bpftrace",
                    },
                    loss(r)
                ))
            })
            .collect();
        ratios.push_record([
            hz.to_string(),
            "throughput loss".into(),
            losses.join(", "),
            "stackcount lowest".into(),
        ]);
    }
    println!("{}", ratios.build().with(Style::markdown()));
    Ok(())
}

fn perf_version() -> String {
    Command::new("perf")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        s.lines().map(str::to_string).collect()
    }

    #[test]
    fn folded_and_bpftrace_counts_are_summed() {
        let f = lines("spin;start_thread;tk_worker;tk_spin;tk_chunk 90\nswapper/0;cpu_idle 3\nspin;tk_chunk 5\n");
        assert_eq!(folded_samples(&f, "spin"), (98, Some(4)));
        let b = lines(
            "\n\n@[\n    asm_sysvec_apic_timer_interrupt+26\n, \n    tk_chunk+20\n    tk_round+9\n]: 70\n@[\n, \n    idle+3\n]: 4\n",
        );
        let (n, top) = bpftrace_samples(&b);
        assert_eq!((n, top.map(|f| f.len())), (74, Some(3)));
    }
}
