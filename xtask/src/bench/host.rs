//! `cargo xtask bench`: funccount against bpftrace on the host, side by side in one
//! run. Measures exec-to-ready time, peak RSS, and the per-event cost on a hot
//! tracepoint (getppid) and a hot uprobe (a tight loop of calls), each as the median
//! of several runs; and what tracing one syscall event costs every other syscall
//! (getppid calls while sys_enter_openat is traced: funccount's raw sys_enter link
//! runs its program for every syscall, the kernel's perf event checks a bitmap).
//! Every traced run checks that the tool counted exactly the events the workload
//! made, so a fast wrong answer cannot win. Then, once each,
//! the time from SIGINT to exit with 360 syscall tracepoints and with 1,000 single
//! uprobes in a running process (whose code must be restored afterwards).
//! Each tool runs in its own process group with a bounded stop ([`Peer`]): a
//! tool that fails, counts wrong or will not exit gets its failure in its
//! cells of the table, and the bench goes on.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{
    bpftrace_version, lines_of, many_functions, median, num_cpus, wait_for, wait_long, Peer,
    Workload, STOP_LIMIT,
};

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
    /// getppid calls while another syscall event is traced: none is counted.
    UntracedSyscall,
}

impl Scenario {
    fn workload_args(self) -> Vec<String> {
        match self {
            Scenario::Tracepoint | Scenario::UntracedSyscall => {
                vec!["getppid".into(), TP_CALLS.to_string()]
            }
            Scenario::Uprobe => vec!["funcs".into(), UPROBE_N.to_string()],
        }
    }

    fn events(self) -> u64 {
        match self {
            Scenario::Tracepoint => TP_CALLS,
            Scenario::Uprobe => 6 * UPROBE_N,
            Scenario::UntracedSyscall => 0,
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
                Scenario::UntracedSyscall => c.arg("t:syscalls:sys_enter_openat"),
            };
            c
        }
        Tool::Bpftrace => {
            let probe = match sc {
                Scenario::Tracepoint => "tracepoint:syscalls:sys_enter_getppid".to_string(),
                Scenario::Uprobe => format!("uprobe:{}:tk_*", workload.display()),
                Scenario::UntracedSyscall => "tracepoint:syscalls:sys_enter_openat".to_string(),
            };
            let mut c = Command::new("bpftrace");
            c.arg("-e").arg(format!(
                "BEGIN {{ printf(\"READY\\n\"); }} {probe} /pid == {pid}/ {{ @[probe] = count(); }}"
            ));
            c
        }
    };
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    // Killed with its group on any error below (Peer's drop).
    let mut peer = Peer::spawn(cmd, name(tool))?;
    let lines = lines_of(&mut peer.child);
    match tool {
        Tool::Funccount => wait_for(&lines, |l| l.starts_with("Tracing "), "funccount")?,
        Tool::Bpftrace => wait_for(&lines, |l| l == "READY", "bpftrace")?,
    };
    let ready_ms = start.elapsed().as_secs_f64() * 1e3;
    // Read before the work too: funccount -p exits when the workload does, and
    // may be gone (no /proc entry, read as 0) by the time the work returns.
    let before = peak_rss_kib(peer.id());
    let ns = w.run()?;
    let rss = peak_rss_kib(peer.id()).max(before);
    peer.stop(STOP_LIMIT)?;
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

/// A table cell: a number, or why the tool has none.
type Cell = std::result::Result<f64, String>;

/// A cell as the table prints it: a failure in a few words, its whole text
/// under the table.
fn cell_text(c: &Cell) -> String {
    match c {
        Ok(v) if v.abs() < 10.0 => format!("{v:.3}"),
        Ok(v) => format!("{v:.1}"),
        Err(e) => format!("failed: {e}"),
    }
}

/// The ratio column: "-" where either tool failed.
fn ratio_text(f: &Cell, b: &Cell, digits: usize) -> String {
    match (f, b) {
        (Ok(f), Ok(b)) => format!("{:.digits$}x", b / f),
        _ => "-".into(),
    }
}

fn name(t: Tool) -> &'static str {
    match t {
        Tool::Funccount => "funccount",
        Tool::Bpftrace => "bpftrace",
    }
}

pub fn host(root: &Path) -> Result<()> {
    crate::build::build_release(&["--bin", "funccount", "--example", "workload"])?;
    let funccount = root.join("target/release/funccount");
    let workload = root.join("target/release/examples/workload");
    let bpftrace_version = bpftrace_version()?;

    let mut rows: Vec<(String, Cell, Cell)> = Vec::new();
    let mut raw = Vec::new();
    for sc in [
        Scenario::Tracepoint,
        Scenario::Uprobe,
        Scenario::UntracedSyscall,
    ] {
        let label = match sc {
            Scenario::Tracepoint => "tracepoint syscalls:sys_enter_getppid",
            Scenario::Uprobe => "uprobe on 3 functions (tk_*)",
            Scenario::UntracedSyscall => "getppid while tracing syscalls:sys_enter_openat",
        };
        let mut base = Vec::new();
        for _ in 0..REPEATS {
            base.push(Workload::start(&workload, &sc.workload_args())?.run()?);
        }
        let base = median(base);
        let mut per_tool: Vec<[Cell; 3]> = Vec::new();
        for tool in [Tool::Funccount, Tool::Bpftrace] {
            let mut runs = Vec::new();
            let mut failed = None;
            for _ in 0..REPEATS {
                match traced_run(tool, sc, &funccount, &workload) {
                    Ok(r) => runs.push(r),
                    // A tool that failed once is not run again: its row says why.
                    Err(e) => {
                        eprintln!("xtask: bench: {label}: {}: {e:#}", name(tool));
                        failed = Some(format!("{e:#}"));
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                raw.push(serde_json::json!({
                    "scenario": label, "tool": name(tool), "error": e,
                }));
                per_tool.push([Err(e.clone()), Err(e.clone()), Err(e)]);
                continue;
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
            per_tool.push([Ok(ready), Ok(rss), Ok(ns - base)]);
        }
        let [f, b] = [per_tool[0].clone(), per_tool[1].clone()];
        let [f0, f1, f2] = f;
        let [b0, b1, b2] = b;
        rows.push((format!("{label}: exec to ready (ms)"), f0, b0));
        rows.push((format!("{label}: peak RSS (MiB)"), f1, b1));
        let per = match sc {
            Scenario::UntracedSyscall => "untraced syscall",
            _ => "event",
        };
        rows.push((
            format!("{label}: overhead per {per} (ns; untraced call {base:.1} ns)"),
            f2,
            b2,
        ));
    }

    let detach = detach_rows(&funccount, root)?;
    for (m, f, b, note) in &detach {
        rows.push((format!("{m} (s){note}"), f.clone(), b.clone()));
    }
    let json = |c: &Cell| match c {
        Ok(v) => serde_json::json!(v),
        Err(e) => serde_json::json!({ "error": e }),
    };
    raw.push(serde_json::json!({ "detach_seconds": detach.iter().map(|(m, f, b, _)| serde_json::json!({"scenario": m, "funccount": json(f), "bpftrace": json(b)})).collect::<Vec<_>>() }));

    let mut table = Builder::default();
    table.push_record([
        "metric (median of 5; detach: one run)",
        "funccount",
        "bpftrace",
        "bpftrace / funccount",
    ]);
    for (m, f, b) in &rows {
        table.push_record([m.clone(), cell_text(f), cell_text(b), ratio_text(f, b, 2)]);
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

/// Functions in the uprobe detach scenario.
const DETACH_UPROBES: usize = 1000;

/// Starts `cmd`, waits until it is tracing (`ready` line), lets it trace for a
/// second, sends SIGINT and returns the seconds until it exited.
fn detach_time(mut cmd: Command, ready: impl Fn(&str) -> bool, what: &str) -> Cell {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    detach_time_within(cmd, ready, what, DETACH_LIMIT).map_err(|e| {
        eprintln!("xtask: detach: {what}: {e:#}");
        format!("{e:#}")
    })
}

/// How long a tool may take from SIGINT to exit in the detach rows, where
/// detaching is what is timed: far over any time measured, as 1,000 single
/// uprobes detach one by one.
const DETACH_LIMIT: Duration = Duration::from_secs(600);

fn detach_time_within(
    cmd: Command,
    ready: impl Fn(&str) -> bool,
    what: &str,
    limit: Duration,
) -> Result<f64> {
    eprintln!(
        "xtask: detach: {what} {:?}",
        cmd.get_args().collect::<Vec<_>>()
    );
    let mut peer = Peer::spawn(cmd, what)?;
    let lines = lines_of(&mut peer.child);
    // bpftrace attaches 1,000 single uprobes one by one, each waiting for the
    // kernel's event_mutex.
    let seen = std::cell::RefCell::new(Vec::new());
    let ready_logged = |l: &str| {
        seen.borrow_mut().push(l.to_string());
        ready(l)
    };
    if let Err(e) = wait_long(&lines, ready_logged, what, Duration::from_secs(900)) {
        return Err(e.context(format!("{what} said: {}", seen.borrow().join(" | "))));
    }
    std::thread::sleep(Duration::from_secs(1));
    let start = Instant::now();
    let st = peer.stop(limit)?;
    let secs = start.elapsed().as_secs_f64();
    eprintln!("xtask: detach: {what}: {secs:.3} s");
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(secs)
}

fn funccount_ready(l: &str) -> bool {
    l.starts_with("Tracing ")
}

fn bpftrace_ready(l: &str) -> bool {
    l == "READY"
}

fn bpftrace(probe: &str) -> Command {
    let mut c = Command::new("bpftrace");
    // bpftrace 0.17 refuses more than 512 probes (and programs) unless told.
    c.env("BPFTRACE_MAX_PROBES", "100000")
        .env("BPFTRACE_MAX_BPF_PROGS", "100000")
        .arg("-e")
        .arg(format!(
            "BEGIN {{ printf(\"READY\\n\"); }} {probe} {{ @[probe] = count(); }}"
        ));
    c
}

/// Seconds from SIGINT to exit (detaching, and the tools' final output): 360
/// syscall tracepoints, and 1,000 user functions without uprobe_multi (single
/// uprobes) in a running process, whose code is checked to be restored.
fn detach_rows(funccount: &Path, root: &Path) -> Result<Vec<(String, Cell, Cell, String)>> {
    let mut rows = Vec::new();
    let tps = "t:syscalls:sys_enter_*";
    let f = detach_time(
        {
            let mut c = Command::new(funccount);
            c.arg(tps);
            c
        },
        funccount_ready,
        "funccount",
    );
    let b = detach_time(
        bpftrace("tracepoint:syscalls:sys_enter_*"),
        bpftrace_ready,
        "bpftrace",
    );
    rows.push((
        "detach 't:syscalls:sys_enter_*' (360 tracepoints)".to_string(),
        f,
        b,
        String::new(),
    ));

    let bin = many_functions(&root.join("target/bench/detach"), DETACH_UPROBES)?;
    // It waits for its stdin to close, calling none of them.
    let mut target = Command::new(&bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    let pid = target.id().to_string();
    let spec = format!("{}:fn_*", bin.display());
    let single = |perf: bool| {
        let mut c = Command::new(funccount);
        if perf {
            c.env("TRACEKIT_PERF_UPROBES", "1");
        }
        c.args(["--attach-mode", "single", "-p", &pid, &spec]);
        c
    };
    let f = detach_time(single(false), funccount_ready, "funccount");
    let b = detach_time(
        bpftrace(&format!("uprobe:{}:fn_* /pid == {pid}/", bin.display())),
        bpftrace_ready,
        "bpftrace",
    );
    let old = detach_time(single(true), funccount_ready, "funccount");
    let changed = code_changed(target.id(), &bin)?;
    drop(target.stdin.take());
    target.wait()?;
    if changed != 0 {
        bail!("{changed} bytes of the traced program's code differ from its file after detaching");
    }
    rows.push((
        format!("detach {DETACH_UPROBES} single uprobes (-p)"),
        f,
        b,
        format!(
            "; funccount's per-function perf uprobes (TRACEKIT_PERF_UPROBES=1): {}",
            match old {
                Ok(s) => format!("{s:.1} s"),
                Err(e) => format!("failed: {e}"),
            }
        ),
    ));
    Ok(rows)
}

/// Bytes of `bin`'s executable mappings in process `pid` that differ from the file.
fn code_changed(pid: u32, bin: &Path) -> Result<usize> {
    use std::io::{Read, Seek, SeekFrom};
    let file = fs::read(bin)?;
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut mem = fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut changed = 0;
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || Path::new(f[5]) != bin || !f[1].contains('x') {
            continue;
        }
        let (a, b) = f[0].split_once('-').context("maps line")?;
        let (a, b) = (u64::from_str_radix(a, 16)?, u64::from_str_radix(b, 16)?);
        let off = usize::from_str_radix(f[2], 16)?;
        let mut buf = vec![0u8; (b - a) as usize];
        mem.seek(SeekFrom::Start(a))?;
        mem.read_exact(&mut buf)?;
        changed += file[off..].iter().zip(&buf).filter(|(x, y)| x != y).count();
    }
    Ok(changed)
}

/// `cargo xtask bench-detach`: only the detach rows of `bench`.
pub fn detach(root: &Path) -> Result<()> {
    crate::build::build_release(&["--bin", "funccount"])?;
    let funccount = root.join("target/release/funccount");
    let rows = detach_rows(&funccount, root)?;
    let mut table = Builder::default();
    table.push_record([
        "seconds from SIGINT to exit (one run)",
        "funccount",
        "bpftrace",
        "bpftrace / funccount",
    ]);
    for (m, f, b, note) in &rows {
        table.push_record([
            format!("{m}{note}"),
            cell_text(f),
            cell_text(b),
            ratio_text(f, b, 0),
        ]);
    }
    println!("{}", table.build().with(Style::markdown()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_ignores_sigint_gets_its_failure_in_its_row() {
        // A fake bpftrace: ready, then deaf to SIGINT.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "trap '' INT; echo READY; sleep 1000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let start = Instant::now();
        let cell: Cell =
            detach_time_within(cmd, bpftrace_ready, "fake", Duration::from_millis(500))
                .map_err(|e| format!("{e:#}"));
        // 1 s traced, 0.5 s of grace, then killed: well under a minute.
        assert!(start.elapsed() < Duration::from_secs(10));
        assert_eq!(
            cell,
            Err("fake did not exit within 0.5 s of SIGINT: killed".to_string())
        );
        assert_eq!(
            cell_text(&cell),
            "failed: fake did not exit within 0.5 s of SIGINT: killed"
        );
        assert_eq!(ratio_text(&Ok(2.0), &cell, 2), "-");
        assert_eq!(ratio_text(&Ok(2.0), &Ok(3.0), 2), "1.50x");
    }
}
