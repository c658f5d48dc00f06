//! `cargo xtask bench-ab OLD NEW [--rounds N]`: two funccount (or two trace)
//! binaries side by side in one 6.12 guest boot, for a start-up change too small
//! for `bench-attach --startup` to tell from its run-to-run spread. Each round
//! runs both on `--version`, a tracepoint, a syscall event, `tcp_*` (function
//! table cached) and `vfs_read`, with 0.5 s traced (trace: a tracepoint, a
//! syscall event, a kernel function's entry and its return, each to its first
//! event, `-M 1`, which a thread of the benchmark calling getppid every
//! millisecond brings at once), the order of the two rotating round by round;
//! what it reports per row is each binary's median and the median of the
//! rounds' differences (exec to exit, the traced time subtracted), with the
//! number of rounds in which NEW was faster.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{median, MARK};
use crate::{deps, guest};

/// (row, arguments, seconds traced).
type Row = (&'static str, &'static [&'static str], f64);

/// funccount's rows.
const ROWS: &[Row] = &[
    ("--version", &["--version"], 0.0),
    (
        "t:task:task_rename",
        &["-d", "0.5", "t:task:task_rename"],
        0.5,
    ),
    (
        "t:syscalls:sys_enter_openat",
        &["-d", "0.5", "t:syscalls:sys_enter_openat"],
        0.5,
    ),
    ("'tcp_*' (cached)", &["-d", "0.5", "tcp_*"], 0.5),
    ("vfs_read", &["-d", "0.5", "vfs_read"], 0.5),
];
/// trace's rows: each ends at its first event (the benchmark's getppid thread).
const TRACE_ROWS: &[Row] = &[
    ("--version", &["--version"], 0.0),
    (
        "t:sched:sched_switch",
        &["-M", "1", "t:sched:sched_switch"],
        0.0,
    ),
    (
        "t:syscalls:sys_enter_getppid",
        &["-M", "1", "t:syscalls:sys_enter_getppid"],
        0.0,
    ),
    ("__x64_sys_getppid", &["-M", "1", "__x64_sys_getppid"], 0.0),
    (
        "r::__x64_sys_getppid",
        &["-M", "1", "r::__x64_sys_getppid"],
        0.0,
    ),
];

/// The rows for the binary at `path`: trace's when it is named trace.
fn rows_for(path: &str) -> &'static [Row] {
    match Path::new(path).file_name().and_then(|n| n.to_str()) {
        Some(n) if n.starts_with("trace") => TRACE_ROWS,
        _ => ROWS,
    }
}

const CACHE: &str = "/tmp/tracekit-ab-cache";
/// Between runs: the emulator's host threads settle.
const GAP: Duration = Duration::from_millis(200);

/// Host half: copies the two binaries (a build may replace them meanwhile),
/// boots the guest running the guest half, prints the comparison.
pub fn host(root: &Path, args: &[String]) -> Result<()> {
    let usage =
        "usage: cargo xtask bench-ab OLD NEW [--rounds N] (two funccount or two trace binaries)";
    let (mut bins, mut rounds) = (Vec::new(), 15usize);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--rounds" {
            rounds = it.next().and_then(|n| n.parse().ok()).context(usage)?;
        } else {
            bins.push(a.clone());
        }
    }
    let [old, new] = bins.as_slice() else {
        bail!("{usage}");
    };
    let tool = if std::ptr::eq(rows_for(old), TRACE_ROWS) {
        "trace"
    } else {
        "funccount"
    };
    deps::ensure(deps::GUEST)?;
    let dir = root.join("target/bench/ab");
    fs::create_dir_all(&dir)?;
    for (from, to) in [(old, "old"), (new, "new")] {
        fs::copy(from, dir.join(to)).with_context(|| format!("copying {from}"))?;
    }
    let kernel = guest::fetch(&guest::KERNELS[0])?;
    let script = guest::write_script(
        "bench-ab.sh",
        &format!(
            "'{}' bench-ab-guest {tool} '{}' '{}' {rounds}",
            std::env::current_exe()?.display(),
            dir.join("old").display(),
            dir.join("new").display(),
        ),
    )?;
    // trace's function rows patch getppid while the benchmark calls it from
    // another vCPU: with a host thread per vCPU, that is guest::Tcg's "Oops:
    // int3" (seen here in the second round).
    let tcg = match tool {
        "trace" => guest::Tcg::Single,
        _ => guest::Tcg::Multi,
    };
    let verdict = guest::boot(&kernel, &script, Duration::from_secs(3600), tcg)?;
    let runs: Vec<Value> = verdict
        .lines
        .iter()
        .filter_map(|l| serde_json::from_str(l.split_once(MARK)?.1).ok())
        .collect();
    if !verdict.passed {
        bail!(
            "the guest did not finish: {} ({} runs measured)",
            verdict.summary,
            runs.len()
        );
    }
    println!(
        "\nSide by side in one {} guest boot (TCG), {rounds} rounds, the order rotating: exec \
         to exit in ms, traced time subtracted. old = {old}, new = {new}.",
        kernel.version
    );
    let mut t = Builder::default();
    t.push_record([
        "row",
        "old (median)",
        "new (median)",
        "new - old (median of rounds)",
        "mean",
        "rounds new faster",
    ]);
    for (row, _, _) in rows_for(old) {
        let of = |variant: &str, round: u64| {
            runs.iter()
                .find(|r| r["row"] == *row && r["variant"] == variant && r["round"] == round)
                .and_then(|r| r["ms"].as_f64())
        };
        let pairs: Vec<(f64, f64)> = (0..rounds as u64)
            .filter_map(|r| Some((of("old", r)?, of("new", r)?)))
            .collect();
        if pairs.is_empty() {
            continue;
        }
        let diffs: Vec<f64> = pairs.iter().map(|(o, n)| n - o).collect();
        t.push_record([
            row.to_string(),
            format!("{:.1}", median(pairs.iter().map(|p| p.0).collect())),
            format!("{:.1}", median(pairs.iter().map(|p| p.1).collect())),
            format!("{:+.1}", median(diffs.clone())),
            format!("{:+.1}", diffs.iter().sum::<f64>() / diffs.len() as f64),
            format!(
                "{}/{}",
                diffs.iter().filter(|d| **d < 0.0).count(),
                diffs.len()
            ),
        ]);
    }
    println!("{}", t.build().with(Style::markdown()));
    Ok(())
}

/// Guest half (`bench-ab-guest TOOL OLD NEW ROUNDS`): one `BENCH` line per run.
pub fn guest(args: &[String]) -> Result<()> {
    let [tool, old, new, rounds] = args else {
        bail!("usage: bench-ab-guest funccount|trace OLD NEW ROUNDS");
    };
    let rounds: u64 = rounds.parse().context("ROUNDS")?;
    let variants = [("old", old.as_str()), ("new", new.as_str())];
    let _ = fs::remove_dir_all(CACHE);
    let rows = if tool == "trace" { TRACE_ROWS } else { ROWS };
    if tool == "trace" {
        // The event each trace row waits for, every millisecond.
        std::thread::spawn(|| loop {
            // SAFETY: getppid has no preconditions.
            unsafe { libc::getppid() };
            std::thread::sleep(Duration::from_millis(1));
        });
    }
    // Fills the caches (the function table; the task-status offset, which a
    // syscall event run would otherwise find in the kernel's BTF in whichever
    // binary ran first); each binary's first runs page it in.
    for (_, bin) in variants {
        for (_, args, _) in rows {
            run(bin, args)?;
        }
    }
    for round in 0..rounds {
        let mut order = variants;
        order.rotate_left(round as usize % 2);
        for (row, args, traced) in rows {
            for (variant, bin) in order {
                let s = run(bin, args)?;
                let line = serde_json::json!({
                    "row": row, "variant": variant, "round": round,
                    "ms": (s - traced) * 1000.0,
                });
                println!("{MARK}{line}");
                std::thread::sleep(GAP);
            }
        }
    }
    Ok(())
}

/// Exec to exit of `bin args`, in seconds, timed as `bench-attach --startup`
/// times its runs.
fn run(bin: &str, args: &[&str]) -> Result<f64> {
    let mut cmd = Command::new(bin);
    cmd.args(args).env("TRACEKIT_CACHE_DIR", CACHE);
    let (s, _) = super::startup::run(cmd, 0.0).with_context(|| format!("{bin} {args:?}"))?;
    Ok(s)
}
