//! `cargo xtask bench-trace`: trace against bpftrace's `printf` on the host, side
//! by side in one run (BCC's trace-bpfcc cannot run on this host's locked-down
//! kernel). Three cases, each a format with two arguments:
//!
//! - a hot uprobe: tests/progs/workload.rs `funcs N` (tk_alpha N times, among 6N
//!   calls), every call printed;
//! - the same with a predicate that passes 1 call in 1000 (evaluated in the kernel
//!   by both tools);
//! - a hot tracepoint: `read N FILE` (N pread64 syscalls), sys_enter_pread64's fd
//!   and count printed.
//!
//! Per case: the workload's added cost per traced call (against an untraced run),
//! the events delivered per second of work, the exec-to-tracing time, and the
//! lines each tool printed: a tool that printed other than the events made (lost
//! records) is marked, so a fast wrong answer cannot win. Runs are interleaved
//! (each round runs every tool once); the median of the rounds is shown.
//!
//! `--only TEXT` runs the host cases whose name holds TEXT, `--rounds N` N rounds
//! of them (a small difference needs more than 5 to show). `--bpf-stats` also
//! shows each tool's BPF program alone: run time per run from the kernel's
//! statistics (kernel.bpf_stats_enabled, on for the host half, read from the
//! tool's program descriptors in /proc/PID/fdinfo). The statistics cost every
//! run some tens of ns themselves (measured in that column: an empty program),
//! so the added cost per hit is only comparable within such a run.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{
    announce_start, done_list, matches, median, num_cpus, run_guest_half, wait_clean, BpfStats,
    GuestResults, Line, Tracer, Workload, MARK,
};
use crate::{deps, guest};

const ROUNDS: usize = 5;
/// tk_alpha calls per uprobe run (`funcs N` makes 6N calls in all).
const UPROBE_N: u64 = 200_000;
/// tk_alpha calls per run of the 1-in-1000 predicate case: longer runs, as the
/// tools differ there by a few percent, less than short runs vary.
const FILTER_N: u64 = 1_000_000;
/// pread64 calls per tracepoint run.
const TP_N: u64 = 500_000;
const LIMIT: Duration = Duration::from_secs(60);
const TOOLS: &[&str] = &["untraced", "trace", "bpftrace"];

#[derive(Clone, Copy)]
enum Case {
    Uprobe,
    UprobeFilter,
    Tracepoint,
    /// vfs_read, in the guest (the host cannot trace kernel functions).
    Kernel,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Uprobe => "uprobe, every call printed",
            Case::UprobeFilter => "uprobe, predicate passing 1 in 1000",
            Case::Tracepoint => "tracepoint sys_enter_pread64",
            Case::Kernel => "kernel function vfs_read",
        }
    }

    fn workload_args(self, n: u64, file: &Path) -> Vec<String> {
        match self {
            Case::Uprobe | Case::UprobeFilter => vec!["funcs".into(), n.to_string()],
            Case::Tracepoint | Case::Kernel => {
                vec!["read".into(), n.to_string(), file.display().to_string()]
            }
        }
    }

    /// Calls the workload makes in all (its ns_per_call is per these), for `n`.
    fn calls(self, n: u64) -> u64 {
        match self {
            Case::Uprobe | Case::UprobeFilter => 6 * n,
            _ => n,
        }
    }

    /// Lines the tool must print (every hit, or 1 in 1000).
    fn events(self, n: u64) -> u64 {
        match self {
            Case::UprobeFilter => n / 1000,
            _ => n,
        }
    }

    fn command(self, tool: &str, trace: &Path, workload: &Path, pid: u32) -> Command {
        let w = workload.display();
        if tool == "empty" {
            // The floor of --bpf-stats: a program that does nothing, at the
            // same probe (only the workload calls tk_alpha).
            let probe = match self {
                Case::Tracepoint => "tracepoint:syscalls:sys_enter_pread64".to_string(),
                Case::Kernel => "kprobe:vfs_read".to_string(),
                _ => format!("uprobe:{w}:tk_alpha"),
            };
            let mut c = Command::new("bpftrace");
            c.arg("-e")
                .arg(format!("BEGIN {{ printf(\"READY\\n\"); }} {probe} {{ }}"));
            return c;
        }
        if tool == "trace" || tool == "bcc" {
            let spec = match self {
                Case::Uprobe => format!("{w}:tk_alpha \"%d %d\", arg1, arg2"),
                Case::UprobeFilter => {
                    format!("{w}:tk_alpha (arg1 % 1000 == 0) \"%d %d\", arg1, arg2")
                }
                Case::Tracepoint => {
                    "t:syscalls:sys_enter_pread64 \"%d %d\", args->fd, args->count".into()
                }
                Case::Kernel => "p::vfs_read \"%d %d\", arg3, arg4".into(),
            };
            let mut c = Command::new(if tool == "bcc" {
                Path::new("trace-bpfcc")
            } else {
                trace
            });
            c.args(["-p", &pid.to_string(), &spec]);
            return c;
        }
        let probe = match self {
            Case::Uprobe => format!("uprobe:{w}:tk_alpha /pid == {pid}/"),
            Case::UprobeFilter => {
                format!("uprobe:{w}:tk_alpha /pid == {pid} && arg0 % 1000 == 0/")
            }
            Case::Tracepoint => format!("tracepoint:syscalls:sys_enter_pread64 /pid == {pid}/"),
            Case::Kernel => format!("kprobe:vfs_read /pid == {pid}/"),
        };
        let args = match self {
            Case::Tracepoint => "args->fd, args->count",
            Case::Kernel => "arg2, arg3",
            _ => "arg0, arg1",
        };
        let mut c = Command::new("bpftrace");
        c.arg("-e").arg(format!(
            "BEGIN {{ printf(\"READY\\n\"); }} {probe} {{ printf(\"%d %d\\n\", {args}); }}"
        ));
        c
    }
}

/// One run: the workload's ns per call, and for a tool its ready time and the
/// event lines it printed.
fn run_once(
    case: Case,
    n: u64,
    tool: &str,
    trace: &Path,
    workload: &Path,
    file: &Path,
    limit: Duration,
) -> Result<Value> {
    let w = Workload::start(workload, &case.workload_args(n, file))?;
    if tool == "untraced" {
        return Ok(json!({ "ns_per_call": w.run()? }));
    }
    let mut cmd = case.command(tool, trace, workload, w.pid());
    // BCC's tools are Python: unbuffered, their header is seen when printed.
    cmd.env("PYTHONUNBUFFERED", "1").stdin(Stdio::null());
    // stdout is counted as it comes (the tools print to a pipe, as to a
    // terminal or a file); the first line says tracing has started.
    let mut others = 0;
    let mut t = Tracer::start(
        cmd,
        |l| l == "READY" || l.starts_with("PID "),
        limit,
        move |l| {
            if l.split(' ').count() == 2 || l.ends_with(|c: char| c.is_ascii_digit()) {
                Line::Record
            } else if others < 5 {
                // Searched for a lost-records report below.
                others += 1;
                Line::Keep
            } else {
                Line::Skip
            }
        },
    )?;
    let ready_ms = t.ready.as_secs_f64() * 1e3;
    let stats = watch_busiest(t.pid());
    let ns = w.run()?;
    let bpf_ns = stats.finish();
    // trace ends by itself when -p's process exits; the others are stopped.
    // BCC's trace takes a SIGINT that lands in its Python print callback as an
    // exception ctypes ignores, and polls on: press Ctrl-C again, as its users
    // do, every 2 s until it exits.
    let again = (tool != "trace").then_some(Duration::from_secs(2));
    if again.is_some() {
        t.interrupt();
    }
    if !t.wait_within(limit, again)? {
        // Its start-up was measured all the same.
        return Ok(json!({
            "ready_ms": ready_ms,
            "error": format!("{tool} did not exit within {limit:?} of SIGINT"),
        }));
    }
    let out = t.finish();
    let lost: String = out
        .stderr
        .iter()
        .chain(out.kept.iter().map(|(_, l)| l))
        .map(String::as_str)
        .filter(|l| l.to_ascii_lowercase().contains("lost"))
        .collect::<Vec<_>>()
        .join("; ");
    Ok(json!({
        "ns_per_call": ns, "ready_ms": ready_ms, "events": out.records, "lost": lost,
        "bpf_ns_per_run": bpf_ns,
    }))
}

/// Samples the run time per run of `pid`'s busiest BPF program while the work
/// runs (the tool may detach as soon as the work ends); `finish` gives the last
/// sample, if the statistics are on ([`BpfStats`]).
fn watch_busiest(pid: u32) -> StatsWatch {
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = thread::spawn(move || {
        let mut last = None;
        loop {
            if let Some(s) = busiest_prog(pid) {
                last = Some(s);
            }
            if stopped.recv_timeout(Duration::from_millis(10)).is_ok() {
                return last;
            }
        }
    });
    StatsWatch { stop, thread }
}

struct StatsWatch {
    stop: mpsc::Sender<()>,
    thread: thread::JoinHandle<Option<f64>>,
}

impl StatsWatch {
    fn finish(self) -> Option<f64> {
        let _ = self.stop.send(());
        self.thread.join().ok().flatten()
    }
}

/// run_time_ns / run_cnt of the BPF program `pid` holds that ran most (its
/// probe's, not a BEGIN's), from /proc/PID/fdinfo; None when none ran or the
/// statistics are off (run_time_ns stays 0).
fn busiest_prog(pid: u32) -> Option<f64> {
    let mut best: Option<(u64, u64)> = None;
    for e in fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()?.flatten() {
        let Ok(text) = fs::read_to_string(e.path()) else {
            continue;
        };
        let field = |k: &str| -> Option<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
        };
        if field("prog_id:").is_none() {
            continue;
        }
        let (Some(ns), Some(cnt)) = (field("run_time_ns:"), field("run_cnt:")) else {
            continue;
        };
        if ns > 0 && best.is_none_or(|(_, c)| cnt > c) {
            best = Some((ns, cnt));
        }
    }
    best.map(|(ns, cnt)| ns as f64 / cnt as f64)
}

/// Host half: the host's cases, then (unless `--no-guest`) the guest's, then
/// the tables.
pub fn host(root: &Path, args: &[String]) -> Result<()> {
    deps::ensure(&[deps::BUILD, deps::GUEST, deps::BENCH].concat())?;
    crate::build::build_release(&["--bin", "trace", "--example", "workload"])?;
    let trace = root.join("target/release/trace");
    let workload = root.join("target/release/examples/workload");
    let out_dir = root.join("target/bench");
    fs::create_dir_all(&out_dir)?;
    let file = out_dir.join("trace-bench-data");
    fs::write(&file, [b'x'; 4096])?;
    let bpftrace = Command::new("bpftrace")
        .arg("--version")
        .output()
        .context("running bpftrace (package bpftrace)")?;
    let bpftrace = String::from_utf8_lossy(&bpftrace.stdout).trim().to_string();

    let only = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| args.get(i + 1).context("--only needs a case name's part"))
        .transpose()?;
    let mut host = Setup {
        cases: Box::leak(
            HOST.cases
                .iter()
                .copied()
                .filter(|c| only.is_none_or(|o| c.name().contains(o.as_str())))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        ),
        ..HOST
    };
    if let Some(i) = args.iter().position(|a| a == "--rounds") {
        host.rounds = args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0)
            .context("--rounds needs a number of rounds")?;
    }
    let bpf_stats = args.iter().any(|a| a == "--bpf-stats");
    if bpf_stats {
        host.tools = &["untraced", "trace", "bpftrace", "empty"];
    }
    let mut results = Vec::new();
    if !args.iter().any(|a| a == "--no-host") {
        let _stats = bpf_stats.then(BpfStats::enable).transpose()?;
        rounds(&host, &trace, &workload, &file, &[], |v| results.push(v));
    }
    // The host's numbers are kept even if the guest half is interrupted.
    fs::write(
        out_dir.join("trace-host.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    let mut guest_results = Vec::new();
    let mut guest_failure = None;
    let mut kernel_name = String::new();
    if !args.iter().any(|a| a == "--no-guest") {
        match guest_part(root, &trace, &workload, &out_dir) {
            Ok((name, r)) => {
                kernel_name = name;
                guest_results = r.results;
                guest_failure = r.failure;
            }
            Err(e) => guest_failure = Some(format!("{e:#}")),
        }
    }
    let raw = json!({
        "results": results, "guest": guest_results, "guest_kernel": kernel_name,
        "guest_failure": guest_failure, "bpftrace": bpftrace, "cpus": num_cpus(),
    });
    let path = out_dir.join("trace.json");
    fs::write(&path, serde_json::to_string_pretty(&raw)?)?;
    if !results.is_empty() {
        report(
            &raw["results"],
            &host,
            &format!("on the host ({} CPUs)", raw["cpus"]),
            &bpftrace,
        );
    }
    if !guest_results.is_empty() {
        report(
            &raw["guest"],
            &GUEST,
            &format!("in the guest {kernel_name} (qemu TCG: emulated time, only ratios count)"),
            &bpftrace,
        );
    }
    if let Some(f) = raw["guest_failure"].as_str() {
        println!("the guest did not finish: {f}");
    }
    println!("raw numbers: {}", path.display());
    Ok(())
}

/// Where a half runs: its cases, events per run, rounds, tools and limit.
struct Setup {
    cases: &'static [Case],
    n: fn(Case) -> u64,
    rounds: usize,
    tools: &'static [&'static str],
    limit: Duration,
}

const HOST: Setup = Setup {
    cases: &[Case::Uprobe, Case::UprobeFilter, Case::Tracepoint],
    n: |c| match c {
        Case::Tracepoint => TP_N,
        Case::UprobeFilter => FILTER_N,
        _ => UPROBE_N,
    },
    rounds: ROUNDS,
    tools: TOOLS,
    limit: LIMIT,
};

/// The guest: BCC compiles its C at every start (minutes under TCG) and, with
/// 20,000 events, had not finished printing them 600 s after SIGINT: fewer rounds
/// of fewer events.
const GUEST: Setup = Setup {
    cases: &[Case::Kernel, Case::Tracepoint],
    n: |_| 2_000,
    rounds: 2,
    tools: &["untraced", "trace", "bpftrace", "bcc"],
    limit: Duration::from_secs(600),
};

/// Every round of every case and tool, skipping those `done` lists; each result
/// goes to `emit`.
fn rounds(
    setup: &Setup,
    trace: &Path,
    workload: &Path,
    file: &Path,
    done: &[Value],
    mut emit: impl FnMut(Value),
) {
    for round in 0..setup.rounds {
        for &case in setup.cases {
            for &tool in setup.tools {
                let key = json!({"case": case.name(), "tool": tool, "round": round});
                if done.iter().any(|d| matches(d, &key)) {
                    continue;
                }
                eprintln!("bench-trace: round {round}: {}: {tool}", case.name());
                let n = (setup.n)(case);
                let mut v = run_once(case, n, tool, trace, workload, file, setup.limit)
                    .unwrap_or_else(|e| json!({ "error": format!("{e:#}") }));
                for (k, x) in key.as_object().expect("object") {
                    v[k] = x.clone();
                }
                emit(v);
            }
        }
    }
}

/// Boots the 6.12 guest running the guest half: (kernel, results).
fn guest_part(
    root: &Path,
    trace: &Path,
    workload: &Path,
    out_dir: &Path,
) -> Result<(String, GuestResults)> {
    let kernel = guest::fetch(&guest::KERNELS[0])?;
    let name = format!("{} ({})", kernel.label, kernel.version);
    // BCC compiles against the running kernel's headers; the guest sees ours over 9p.
    deps::ensure(&[format!("linux-headers-{}", kernel.version).as_str()])?;
    let done_file = out_dir.join("trace-done.json");
    let _ = root;
    let results = run_guest_half(
        &kernel,
        "trace",
        &[trace, workload],
        &done_file,
        &[],
        Duration::from_secs(60 * 60),
    )?;
    Ok((name, results))
}

/// Guest half: prints a `BENCH {json}` line per measurement.
pub fn guest(args: &[String]) -> Result<()> {
    let usage = "usage: bench-trace-guest TRACE WORKLOAD [--done FILE]";
    let (Some(trace), Some(workload)) = (args.first(), args.get(1)) else {
        bail!(usage);
    };
    let done = done_list(args).context(usage)?;
    let file = Path::new("/tmp/bench-trace-file");
    fs::write(file, [b'x'; 4096])?;
    rounds(
        &GUEST,
        Path::new(trace),
        Path::new(workload),
        file,
        &done,
        |v| {
            let key = json!({"case": v["case"], "tool": v["tool"], "round": v["round"]});
            announce_start(&key);
            println!("{MARK}{v}");
            let _ = wait_clean();
        },
    );
    Ok(())
}

fn report(results: &Value, setup: &Setup, place: &str, bpftrace: &str) {
    let results = results.as_array().cloned().unwrap_or_default();
    println!(
        "\ntrace (tracekit, release) vs {bpftrace}{} {place}, median of {} \
         interleaved rounds; a format with two arguments per event:",
        if setup.tools.contains(&"bcc") {
            " and BCC trace-bpfcc"
        } else {
            ""
        },
        setup.rounds
    );
    let mut b = Builder::default();
    let stats = results.iter().any(|r| r["bpf_ns_per_run"].is_f64());
    let mut head = vec![
        "case",
        "tool",
        "ns per hit (added)",
        "events/s delivered",
        "lines (expected)",
        "exec to tracing",
        "ratio (cost, start)",
    ];
    if stats {
        head.push("BPF ns per run (bpf_stats)");
        head.push("ratio (BPF, above empty)");
    }
    b.push_record(head);
    let mut errors = Vec::new();
    let mut rounds_won = Vec::new();
    for &case in setup.cases {
        let n = (setup.n)(case);
        // Probe hits: calls of the traced function or syscall.
        let hits = case.calls(n) / case.calls(1);
        let of = |tool: &str, k: &str| -> Vec<f64> {
            results
                .iter()
                .filter(|r| r["case"] == case.name() && r["tool"] == tool)
                .filter_map(|r| r[k].as_f64())
                .collect()
        };
        let base = of("untraced", "ns_per_call");
        if base.is_empty() {
            errors.push(format!("{}: no untraced run", case.name()));
            continue;
        }
        let base = median(base);
        // Added cost per probe hit: the workload's extra time over all its calls,
        // spread over the traced function's calls.
        let cost = |tool: &str| -> Option<f64> {
            let v = of(tool, "ns_per_call");
            (!v.is_empty()).then(|| (median(v) - base) * case.calls(n) as f64 / hits as f64)
        };
        let ready = |tool: &str| {
            let v = of(tool, "ready_ms");
            (!v.is_empty()).then(|| median(v))
        };
        let (tc, tr) = (cost("trace"), ready("trace"));
        for &tool in setup.tools.iter().filter(|&&t| t != "untraced") {
            for r in results
                .iter()
                .filter(|r| r["case"] == case.name() && r["tool"] == tool)
            {
                if let Some(e) = r["error"].as_str() {
                    errors.push(format!("{} {tool} round {}: {e}", case.name(), r["round"]));
                }
                if let Some(l) = r["lost"].as_str().filter(|l| !l.is_empty()) {
                    errors.push(format!("{} {tool} round {}: {l}", case.name(), r["round"]));
                }
            }
            let events = of(tool, "events");
            let expected = if tool == "empty" { 0 } else { case.events(n) };
            let short = events.iter().filter(|&&e| e as u64 != expected).count();
            let c = cost(tool);
            // Lines printed per second of the traced run's work, per run.
            let rate: Vec<f64> = results
                .iter()
                .filter(|r| r["case"] == case.name() && r["tool"] == tool)
                .filter_map(|r| {
                    let ns = r["ns_per_call"].as_f64()?;
                    Some(r["events"].as_f64()? / (ns * case.calls(n) as f64 / 1e9))
                })
                .collect();
            let rate = (!rate.is_empty()).then(|| median(rate));
            let ratio = match (tool, c, tc, ready(tool), tr) {
                ("bpftrace" | "bcc", Some(c), Some(tc), Some(r), Some(tr)) => {
                    format!("{}, {:.1}x", times(c / tc), r / tr)
                }
                _ => "-".into(),
            };
            if matches!(tool, "bpftrace" | "bcc") {
                // Rounds where trace's run cost less than this tool's: robust
                // to a slow round, which moves both.
                let round_ns = |t: &str| -> Vec<(u64, f64)> {
                    results
                        .iter()
                        .filter(|r| r["case"] == case.name() && r["tool"] == t)
                        .filter_map(|r| Some((r["round"].as_u64()?, r["ns_per_call"].as_f64()?)))
                        .collect()
                };
                let peer = round_ns(tool);
                let pairs: Vec<bool> = round_ns("trace")
                    .iter()
                    .filter_map(|(k, t)| peer.iter().find(|(j, _)| j == k).map(|(_, p)| t < p))
                    .collect();
                rounds_won.push(format!(
                    "{}: trace cost less than {tool} in {} of {} rounds",
                    case.name(),
                    pairs.iter().filter(|&&w| w).count(),
                    pairs.len()
                ));
            }
            let bpf = |tool: &str| {
                let v = of(tool, "bpf_ns_per_run");
                (!v.is_empty()).then(|| median(v))
            };
            // Each program's own time: what it reads above the empty program's.
            let bpf_ratio = match (tool, bpf(tool), bpf("trace"), bpf("empty")) {
                ("bpftrace" | "bcc", Some(p), Some(t), Some(e)) if t > e => {
                    times((p - e) / (t - e))
                }
                _ => "-".into(),
            };
            let mut row = vec![
                case.name().to_string(),
                tool.to_string(),
                c.map_or("-".into(), |c| format!("{c:.0}")),
                rate.map_or("-".into(), |r| format!("{:.0}", r)),
                format!(
                    "{} ({}){}",
                    if events.is_empty() {
                        0
                    } else {
                        median(events.clone()) as u64
                    },
                    expected,
                    if short > 0 {
                        format!(", {short} of {} runs short", events.len())
                    } else {
                        String::new()
                    }
                ),
                ready(tool).map_or("-".into(), |r| format!("{r:.0} ms")),
                ratio,
            ];
            if stats {
                row.push(bpf(tool).map_or("-".into(), |p| format!("{p:.1}")));
                row.push(bpf_ratio);
            }
            b.push_record(row);
        }
    }
    println!("{}", b.build().with(Style::markdown()));
    println!(
        "A ratio above 1 means trace is cheaper per hit / faster to start. Events/s: \
         lines printed per second of the traced work (median); lines: median printed; \
         runs short lost records (reported by the tool, listed below)."
    );
    for w in rounds_won {
        println!("{w}");
    }
    for e in errors {
        println!("note: {e}");
    }
}

/// A ratio: two decimals near 1, where one would hide a small difference.
fn times(r: f64) -> String {
    if r < 2.0 {
        format!("{r:.2}x")
    } else {
        format!("{r:.1}x")
    }
}
