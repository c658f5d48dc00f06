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

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tabled::builder::Builder;
use tabled::settings::Style;

use crate::bench_common::{median, num_cpus, Workload};
use crate::deps;

const ROUNDS: usize = 5;
/// tk_alpha calls per uprobe run (`funcs N` makes 6N calls in all).
const UPROBE_N: u64 = 200_000;
/// pread64 calls per tracepoint run.
const TP_N: u64 = 500_000;
const LIMIT: Duration = Duration::from_secs(60);
const TOOLS: &[&str] = &["untraced", "trace", "bpftrace"];

#[derive(Clone, Copy)]
enum Case {
    Uprobe,
    UprobeFilter,
    Tracepoint,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Uprobe => "uprobe, every call printed",
            Case::UprobeFilter => "uprobe, predicate passing 1 in 1000",
            Case::Tracepoint => "tracepoint sys_enter_pread64",
        }
    }

    fn workload_args(self, file: &Path) -> Vec<String> {
        match self {
            Case::Uprobe | Case::UprobeFilter => vec!["funcs".into(), UPROBE_N.to_string()],
            Case::Tracepoint => vec!["read".into(), TP_N.to_string(), file.display().to_string()],
        }
    }

    /// Calls the workload makes in all (its ns_per_call is per these).
    fn calls(self) -> u64 {
        match self {
            Case::Uprobe | Case::UprobeFilter => 6 * UPROBE_N,
            Case::Tracepoint => TP_N,
        }
    }

    /// Probe hits (calls of the traced function or syscall).
    fn hits(self) -> u64 {
        match self {
            Case::Uprobe | Case::UprobeFilter => UPROBE_N,
            Case::Tracepoint => TP_N,
        }
    }

    /// Lines the tool must print.
    fn events(self) -> u64 {
        match self {
            Case::UprobeFilter => UPROBE_N / 1000,
            _ => self.hits(),
        }
    }

    fn command(self, tool: &str, trace: &Path, workload: &Path, pid: u32) -> Command {
        let w = workload.display();
        if tool == "trace" {
            let spec = match self {
                Case::Uprobe => format!("{w}:tk_alpha \"%d %d\", arg1, arg2"),
                Case::UprobeFilter => {
                    format!("{w}:tk_alpha (arg1 % 1000 == 0) \"%d %d\", arg1, arg2")
                }
                Case::Tracepoint => {
                    "t:syscalls:sys_enter_pread64 \"%d %d\", args->fd, args->count".into()
                }
            };
            let mut c = Command::new(trace);
            c.args(["-p", &pid.to_string(), &spec]);
            return c;
        }
        let probe = match self {
            Case::Uprobe => format!("uprobe:{w}:tk_alpha /pid == {pid}/"),
            Case::UprobeFilter => {
                format!("uprobe:{w}:tk_alpha /pid == {pid} && arg0 % 1000 == 0/")
            }
            Case::Tracepoint => format!("tracepoint:syscalls:sys_enter_pread64 /pid == {pid}/"),
        };
        let args = match self {
            Case::Tracepoint => "args->fd, args->count",
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
fn run_once(case: Case, tool: &str, trace: &Path, workload: &Path, file: &Path) -> Result<Value> {
    let w = Workload::start(workload, &case.workload_args(file))?;
    if tool == "untraced" {
        return Ok(json!({ "ns_per_call": w.run()? }));
    }
    let start = Instant::now();
    let mut child = case
        .command(tool, trace, workload, w.pid())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {tool}"))?;
    // stdout is counted here as it comes (the tools print to a pipe, as to a
    // terminal or a file); the first line says tracing has started.
    let (ready_tx, ready_rx) = mpsc::channel();
    let out = child.stdout.take().expect("piped");
    let counter = thread::spawn(move || {
        let mut events = 0u64;
        let mut other = Vec::new();
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if l == "READY" || l.starts_with("PID ") {
                let _ = ready_tx.send(());
            } else if l.split(' ').count() == 2 || l.ends_with(|c: char| c.is_ascii_digit()) {
                events += 1;
            } else if other.len() < 5 {
                other.push(l);
            }
        }
        (events, other)
    });
    let err = child.stderr.take().expect("piped");
    let stderr = thread::spawn(move || {
        let mut s = String::new();
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            s.push_str(&l);
            s.push('\n');
        }
        s
    });
    if ready_rx.recv_timeout(LIMIT).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "{tool} was not tracing within {LIMIT:?}: {}",
            stderr.join().unwrap_or_default()
        );
    }
    let ready_ms = start.elapsed().as_secs_f64() * 1e3;
    let ns = w.run()?;
    // trace ends by itself when -p's process exits; bpftrace is stopped.
    if tool == "bpftrace" {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    }
    let stop = Instant::now();
    while child.try_wait()?.is_none() {
        if stop.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{tool} did not exit within {LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
    let (events, other) = counter.join().expect("counter thread");
    let err = stderr.join().unwrap_or_default();
    let lost: String = err
        .lines()
        .chain(other.iter().map(String::as_str))
        .filter(|l| l.contains("ost"))
        .collect::<Vec<_>>()
        .join("; ");
    Ok(json!({
        "ns_per_call": ns, "ready_ms": ready_ms, "events": events, "lost": lost,
    }))
}

pub fn host(root: &Path) -> Result<()> {
    deps::ensure(&[deps::BUILD, deps::BENCH].concat())?;
    crate::build_release(&["--bin", "trace", "--example", "workload"])?;
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

    let cases = [Case::Uprobe, Case::UprobeFilter, Case::Tracepoint];
    let mut results = Vec::new();
    for round in 0..ROUNDS {
        for case in cases {
            for &tool in TOOLS {
                eprintln!("bench-trace: round {round}: {}: {tool}", case.name());
                let mut v = run_once(case, tool, &trace, &workload, &file)
                    .unwrap_or_else(|e| json!({ "error": format!("{e:#}") }));
                v["case"] = json!(case.name());
                v["tool"] = json!(tool);
                v["round"] = json!(round);
                results.push(v);
            }
        }
    }
    let raw = json!({ "results": results, "bpftrace": bpftrace, "cpus": num_cpus() });
    let path = out_dir.join("trace.json");
    fs::write(&path, serde_json::to_string_pretty(&raw)?)?;
    report(&raw, &cases);
    println!("raw numbers: {}", path.display());
    Ok(())
}

fn report(raw: &Value, cases: &[Case]) {
    let results = raw["results"].as_array().cloned().unwrap_or_default();
    println!(
        "\ntrace (tracekit, release) vs {} on the host ({} CPUs), median of {ROUNDS} \
         interleaved rounds; a format with two arguments per event:",
        raw["bpftrace"].as_str().unwrap_or("bpftrace"),
        raw["cpus"]
    );
    let mut b = Builder::default();
    b.push_record([
        "case",
        "tool",
        "ns per hit (added)",
        "events/s delivered",
        "lines (expected)",
        "exec to tracing",
        "ratio (cost, start)",
    ]);
    let mut errors = Vec::new();
    for &case in cases {
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
            (!v.is_empty()).then(|| (median(v) - base) * case.calls() as f64 / case.hits() as f64)
        };
        let ready = |tool: &str| {
            let v = of(tool, "ready_ms");
            (!v.is_empty()).then(|| median(v))
        };
        let (tc, tr) = (cost("trace"), ready("trace"));
        for tool in ["trace", "bpftrace"] {
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
            let short = events
                .iter()
                .filter(|&&e| e as u64 != case.events())
                .count();
            let c = cost(tool);
            // Lines printed per second of the traced run's work, per run.
            let rate: Vec<f64> = results
                .iter()
                .filter(|r| r["case"] == case.name() && r["tool"] == tool)
                .filter_map(|r| {
                    let ns = r["ns_per_call"].as_f64()?;
                    Some(r["events"].as_f64()? / (ns * case.calls() as f64 / 1e9))
                })
                .collect();
            let rate = (!rate.is_empty()).then(|| median(rate));
            let ratio = match (tool, c, tc, ready(tool), tr) {
                ("bpftrace", Some(c), Some(tc), Some(r), Some(tr)) => {
                    format!("{:.1}x, {:.1}x", c / tc, r / tr)
                }
                _ => "-".into(),
            };
            b.push_record([
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
                    case.events(),
                    if short > 0 {
                        format!(", {short} of {} runs short", events.len())
                    } else {
                        String::new()
                    }
                ),
                ready(tool).map_or("-".into(), |r| format!("{r:.0} ms")),
                ratio,
            ]);
        }
    }
    println!("{}", b.build().with(Style::markdown()));
    println!(
        "A ratio above 1 means trace is cheaper per hit / faster to start. Events/s: \
         lines printed per second of the traced work (median); lines: median printed; \
         runs short lost records (reported by the tool, listed below)."
    );
    for e in errors {
        println!("note: {e}");
    }
}
