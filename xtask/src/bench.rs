//! `cargo xtask bench`: funccount against bpftrace on the host, side by side in one
//! run. Measures exec-to-ready time, peak RSS, and the per-event cost on a hot
//! tracepoint (getppid) and a hot uprobe (a tight loop of calls), each as the median
//! of several runs. Every traced run checks that the tool counted exactly the
//! events the workload made, so a fast wrong answer cannot win.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tabled::builder::Builder;
use tabled::settings::Style;

use crate::bench_common::{lines_of, median, num_cpus, wait_for, Workload};

const REPEATS: usize = 5;
const TP_CALLS: u64 = 2_000_000;
/// `funcs N` makes 6N calls (tk_alpha N, tk_beta 2N, tk_gamma 3N).
const UPROBE_N: u64 = 100_000;

#[derive(Clone, Copy, PartialEq)]
enum Tool {
    Funccount,
    Bpftrace,
}

#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    Tracepoint,
    Uprobe,
}

impl Scenario {
    fn workload_args(self) -> Vec<String> {
        match self {
            Scenario::Tracepoint => vec!["getppid".into(), TP_CALLS.to_string()],
            Scenario::Uprobe => vec!["funcs".into(), UPROBE_N.to_string()],
        }
    }

    fn events(self) -> u64 {
        match self {
            Scenario::Tracepoint => TP_CALLS,
            Scenario::Uprobe => 6 * UPROBE_N,
        }
    }
}

struct Run {
    ready_ms: f64,
    rss_kib: u64,
    ns_per_call: f64,
}

fn peak_rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn traced_run(tool: Tool, sc: Scenario, funccount: &Path, workload: &Path) -> Result<Run> {
    let w = Workload::start(workload, &sc.workload_args())?;
    let pid = w.pid();
    let mut cmd = match tool {
        Tool::Funccount => {
            let mut c = Command::new(funccount);
            c.arg("-p").arg(pid.to_string());
            match sc {
                Scenario::Tracepoint => c.arg("t:syscalls:sys_enter_getppid"),
                Scenario::Uprobe => c.arg(format!("{}:tk_*", workload.display())),
            };
            c
        }
        Tool::Bpftrace => {
            let probe = match sc {
                Scenario::Tracepoint => "tracepoint:syscalls:sys_enter_getppid".to_string(),
                Scenario::Uprobe => format!("uprobe:{}:tk_*", workload.display()),
            };
            let mut c = Command::new("bpftrace");
            c.arg("-e").arg(format!(
                "BEGIN {{ printf(\"READY\\n\"); }} {probe} /pid == {pid}/ {{ @[probe] = count(); }}"
            ));
            c
        }
    };
    let start = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let lines = lines_of(&mut child);
    match tool {
        Tool::Funccount => wait_for(&lines, |l| l.starts_with("Tracing "), "funccount")?,
        Tool::Bpftrace => wait_for(&lines, |l| l == "READY", "bpftrace")?,
    };
    let ready_ms = start.elapsed().as_secs_f64() * 1e3;
    let ns = w.run()?;
    let rss = peak_rss_kib(child.id());
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    child.wait()?;
    // Both tools print one count per probe; their sum must be the events made.
    let mut total = 0u64;
    while let Ok(l) = lines.recv_timeout(Duration::from_millis(300)) {
        let l = l.trim();
        let count = match tool {
            Tool::Funccount if l.starts_with("syscalls:") || l.starts_with("tk_") => {
                l.rsplit(' ').next()
            }
            Tool::Bpftrace if l.starts_with("@[") => l.rsplit(' ').next(),
            _ => None,
        };
        total += count.and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
    }
    if total != sc.events() {
        bail!(
            "{} counted {total} events, the workload made {}",
            name(tool),
            sc.events()
        );
    }
    Ok(Run {
        ready_ms,
        rss_kib: rss,
        ns_per_call: ns,
    })
}

fn name(t: Tool) -> &'static str {
    match t {
        Tool::Funccount => "funccount",
        Tool::Bpftrace => "bpftrace",
    }
}

pub fn host(root: &Path) -> Result<()> {
    crate::build_release(&["--bin", "funccount", "--example", "workload"])?;
    let funccount = root.join("target/release/funccount");
    let workload = root.join("target/release/examples/workload");
    let bpftrace_version = Command::new("bpftrace")
        .arg("--version")
        .output()
        .context("running bpftrace (package bpftrace)")?;
    let bpftrace_version = String::from_utf8_lossy(&bpftrace_version.stdout)
        .trim()
        .to_string();

    let mut rows: Vec<(String, f64, f64)> = Vec::new();
    let mut raw = Vec::new();
    for sc in [Scenario::Tracepoint, Scenario::Uprobe] {
        let label = match sc {
            Scenario::Tracepoint => "tracepoint syscalls:sys_enter_getppid",
            Scenario::Uprobe => "uprobe on 3 functions (tk_*)",
        };
        let mut base = Vec::new();
        for _ in 0..REPEATS {
            base.push(Workload::start(&workload, &sc.workload_args())?.run()?);
        }
        let base = median(base);
        let mut per_tool = Vec::new();
        for tool in [Tool::Funccount, Tool::Bpftrace] {
            let mut runs = Vec::new();
            for _ in 0..REPEATS {
                runs.push(traced_run(tool, sc, &funccount, &workload)?);
            }
            let ready = median(runs.iter().map(|r| r.ready_ms).collect());
            let rss = median(runs.iter().map(|r| r.rss_kib as f64).collect()) / 1024.0;
            let ns = median(runs.iter().map(|r| r.ns_per_call).collect());
            raw.push(serde_json::json!({
                "scenario": label, "tool": name(tool),
                "ready_ms": runs.iter().map(|r| r.ready_ms).collect::<Vec<_>>(),
                "rss_kib": runs.iter().map(|r| r.rss_kib).collect::<Vec<_>>(),
                "ns_per_call": runs.iter().map(|r| r.ns_per_call).collect::<Vec<_>>(),
                "baseline_ns_per_call": base,
            }));
            per_tool.push((ready, rss, ns - base));
        }
        let (f, b) = (per_tool[0], per_tool[1]);
        rows.push((format!("{label}: exec to ready (ms)"), f.0, b.0));
        rows.push((format!("{label}: peak RSS (MiB)"), f.1, b.1));
        rows.push((
            format!("{label}: overhead per event (ns; untraced call {base:.1} ns)"),
            f.2,
            b.2,
        ));
    }

    let mut table = Builder::default();
    table.push_record([
        "metric (median of 5)",
        "funccount",
        "bpftrace",
        "bpftrace / funccount",
    ]);
    for (m, f, b) in &rows {
        table.push_record([
            m.clone(),
            format!("{f:.1}"),
            format!("{b:.1}"),
            format!("{:.2}x", b / f),
        ]);
    }
    println!(
        "\nfunccount (tracekit, release) vs {bpftrace_version}, on this host ({} CPUs):",
        num_cpus()
    );
    println!("{}", table.build().with(Style::markdown()));
    println!("A ratio above 1 means funccount is better (faster, smaller, cheaper).");
    let out = root.join("target/bench/host.json");
    fs::create_dir_all(out.parent().expect("dir"))?;
    fs::write(&out, serde_json::to_string_pretty(&raw)?)?;
    println!("raw numbers: {}", out.display());
    Ok(())
}
