//! The start-up rows of `cargo xtask bench-attach`: what tracing costs a user
//! from exec to exit with one second traced (`-d 1`; that second subtracted),
//! for a wildcard (`tcp_*`), one function named exactly (`vfs_read`) and a
//! tracepoint, by tracekit's funccount (with no cached function table, as after a
//! boot or a module load, and with one), bpftrace and BCC's funccount-bpfcc, in
//! the same guest run. tracekit's `timing:` line (TRACEKIT_TIMING=1) says where
//! its time went, from one more run after the measured ones (which run as users
//! do, without it). `funccount --version` and `bpftrace --version` give the cost
//! of exec alone.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{announce_start, matches, median, print_flagged, wait_clean, MARK, QUICK};

/// (row, funccount's patterns (split at spaces), bpftrace's probe, BCC's pattern).
const ROWS: &[(&str, &str, &str, &str)] = &[
    ("'tcp_*'", "tcp_*", "kprobe:tcp_*", "tcp_*"),
    ("vfs_read", "vfs_read", "kprobe:vfs_read", "vfs_read"),
    (
        "t:sched:sched_switch",
        "t:sched:sched_switch",
        "tracepoint:sched:sched_switch",
        "t:sched:sched_switch",
    ),
];
/// The host's rows: the tracepoint, and user functions in three binaries, whose
/// links (one per binary) each wait out an RCU grace period as they close.
const HOST_ROWS: &[(&str, &str, &str, &str)] = &[
    ROWS[2],
    (
        "c:getpid bash:main z:inflate",
        "c:getpid /usr/bin/bash:main z:inflate",
        "uprobe:libc:getpid,uprobe:/usr/bin/bash:main,uprobe:libz:inflate",
        "",
    ),
];
pub const TOOLS: &[&str] = &[
    "tracekit (no cache)",
    "tracekit (cached)",
    "bpftrace",
    "bcc",
];
const LIMIT: Duration = Duration::from_secs(240);
/// Measured rounds, after one unmeasured round (each binary's first exec pages
/// it in; BCC, slow anyway, has none): start-ups vary more under emulation
/// than the tools' other measurements. With 5 rounds, two runs of the same
/// code put the tracepoint row at 1.8x and 2.6x of `--version`; 9 rounds add
/// about a minute to a guest run.
const ROUNDS: usize = 9;
/// Where the benchmark keeps tracekit's cache, so it can empty it.
const CACHE: &str = "/tmp/tracekit-bench-cache";

/// Guest half: one `BENCH` line per (row, tool), skipping what `done` lists.
pub fn guest(funccount: &str, bcc: bool, done: &[Value]) -> Result<()> {
    measure(funccount, ROWS, bcc, done, true, |line| {
        println!("{MARK}{line}")
    })
}

/// The host's rows (`cargo xtask bench-startup`): real hardware,
/// where the guest's emulator adds the translation of every instruction a run
/// executes for the first time (with ASLR, in every run: QEMU 7.2 does not
/// share translations between address-space layouts), tracekit against
/// bpftrace (BCC cannot compile for the host kernel: no headers).
pub fn host(root: &std::path::Path) -> Result<()> {
    let funccount = root.join("target/release/funccount");
    let mut results = Vec::new();
    measure(
        funccount.to_str().context("path not UTF-8")?,
        HOST_ROWS,
        false,
        &[],
        false,
        |line| results.push(line),
    )?;
    println!("\nOn the host (real hardware):");
    table(&results);
    Ok(())
}

/// Measures `rows` (and `--version`) for each tool, handing each result line to
/// `out` (and, in the guest, announcing each row first). The tools take turns, a round at a time (the emulator shares the host
/// with other work, whose load drifts); a tool slower than [`QUICK`] runs once.
fn measure(
    funccount: &str,
    rows: &[(&str, &str, &str, &str)],
    bcc: bool,
    done: &[Value],
    guest: bool,
    mut out: impl FnMut(Value),
) -> Result<()> {
    let mut all: Vec<(&str, &str, &str, &str)> = vec![("--version", "", "", "")];
    all.extend_from_slice(rows);
    // The kernel function table does not matter to a tracepoint or a user
    // function (patterns with a ':'): no run without it.
    let no_table = rows.iter().all(|r| r.1.contains(':'));
    for (row, pattern, bpftrace, bcc_pattern) in all {
        let version = row == "--version";
        let tools: Vec<&str> = TOOLS
            .iter()
            .copied()
            .filter(|&tool| {
                let key = serde_json::json!({"startup": row, "tool": tool});
                !((version && !matches!(tool, "tracekit (cached)" | "bpftrace"))
                    || (tool == "bcc" && !bcc)
                    || (tool == "tracekit (no cache)" && no_table)
                    || done.iter().any(|d| matches(d, &key)))
            })
            .collect();
        if tools.is_empty() {
            continue;
        }
        eprintln!("bench: start-up on {row}...");
        if guest {
            announce_start(&serde_json::json!({ "startup": row }));
        }
        // `timed`: with the timing: line, which costs the run its formatting and
        // a read of /proc/self/stat (4-5 ms under emulation): only in one
        // unmeasured run after the rounds, not in the runs measured.
        let cmd = |tool: &str, timed: bool| -> Command {
            match tool {
                "bpftrace" if version => {
                    let mut c = Command::new("bpftrace");
                    c.arg("--version");
                    c
                }
                _ if version => {
                    let mut c = Command::new(funccount);
                    c.arg("--version");
                    c
                }
                "bpftrace" => {
                    let mut c = Command::new("bpftrace");
                    c.arg("-e").arg(format!(
                        "{bpftrace} {{ @ = count(); }} interval:s:1 {{ exit(); }}"
                    ));
                    c
                }
                "bcc" => {
                    let mut c = Command::new("funccount-bpfcc");
                    c.args(["-d", "1", bcc_pattern]);
                    c
                }
                _ => {
                    if tool == "tracekit (no cache)" {
                        let _ = fs::remove_dir_all(CACHE);
                    }
                    let mut c = Command::new(funccount);
                    c.args(["-d", "1"])
                        .args(pattern.split(' '))
                        .env("TRACEKIT_CACHE_DIR", CACHE);
                    if timed {
                        c.env("TRACEKIT_TIMING", "1");
                    }
                    c
                }
            }
        };
        // A cached run's cache is filled first, as the first wildcard run after a
        // boot would (the no-cache runs empty it); a function named exactly reads
        // no table, so its row's fill is a wildcard.
        let fill_cache = |tool: &str| {
            if tool != "tracekit (cached)" || version || pattern.contains(':') {
                return;
            }
            let fill = if pattern.contains('*') {
                pattern.to_string()
            } else {
                format!("{pattern}*")
            };
            let _ = Command::new(funccount)
                .args(["-d", "0.01", &fill])
                .env("TRACEKIT_CACHE_DIR", CACHE)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        let traced = if version { 0.0 } else { 1.0 };
        let mut runs: Vec<Vec<f64>> = vec![Vec::new(); tools.len()];
        let mut timing: Vec<Option<String>> = vec![None; tools.len()];
        let mut error: Vec<Option<String>> = vec![None; tools.len()];
        for round in 0..=ROUNDS {
            for (i, &tool) in tools.iter().enumerate() {
                let slow = runs[i].first().is_some_and(|&s| s > QUICK.as_secs_f64());
                let warm_up = round == 0;
                if error[i].is_some() || slow || (warm_up && tool == "bcc") {
                    continue;
                }
                fill_cache(tool);
                match run(cmd(tool, false), traced) {
                    Ok(_) if warm_up => {}
                    Ok((s, _)) => runs[i].push(s),
                    Err(e) => error[i] = Some(format!("{e:#}")),
                }
                wait_clean().map_err(anyhow::Error::msg)?;
            }
        }
        // Where tracekit's time went, from one more (unmeasured) run.
        for (i, &tool) in tools.iter().enumerate() {
            if tool.starts_with("tracekit") && !version && error[i].is_none() {
                fill_cache(tool);
                timing[i] = run(cmd(tool, true), traced).ok().and_then(|(_, t)| t);
                wait_clean().map_err(anyhow::Error::msg)?;
            }
        }
        for (i, &tool) in tools.iter().enumerate() {
            let mut line = match &error[i] {
                Some(e) => serde_json::json!({"error": e}),
                None => serde_json::json!({
                    "overhead_s": median(runs[i].clone()),
                    "runs_s": runs[i],
                    "timing": timing[i],
                }),
            };
            line["startup"] = row.into();
            line["tool"] = tool.into();
            out(line);
        }
    }
    Ok(())
}

/// Exec to exit of `cmd`, less the `traced` seconds, and its `timing:` line
/// (also `cargo xtask bench-ab`'s timer).
pub fn run(mut cmd: Command, traced: f64) -> Result<(f64, Option<String>)> {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    // The exit is waited for, not polled (a 5 ms poll added 0-5 ms to every
    // run); a watchdog kills a run past LIMIT.
    let (done, watch) = std::sync::mpsc::channel::<()>();
    let pid = child.id() as libc::pid_t;
    let watchdog = std::thread::spawn(move || {
        let expired = watch.recv_timeout(LIMIT).is_err();
        if expired {
            // SAFETY: plain kill(2) of our child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        expired
    });
    let status = child.wait()?;
    let total = start.elapsed().as_secs_f64();
    let _ = done.send(());
    if watchdog.join().unwrap_or(false) {
        bail!("over {} s", LIMIT.as_secs());
    }
    let err = reader.join().unwrap_or_default();
    if !status.success() {
        let tail: Vec<&str> = err.lines().rev().take(2).collect();
        bail!("{status}: {tail:?}");
    }
    let timing = err
        .lines()
        .find(|l| l.starts_with("timing:"))
        .map(str::to_string);
    Ok((total - traced, timing))
}

/// Seconds, to the tenth of a millisecond below 0.1 s (the host's runs take
/// a few milliseconds).
fn secs(v: f64) -> String {
    if v < 0.1 {
        format!("{v:.4}")
    } else {
        format!("{v:.3}")
    }
}

/// Host half: the start-up table, with ratios against tracekit with its cache.
pub fn table(results: &[Value]) {
    let rows: Vec<&Value> = results
        .iter()
        .filter(|r| r["startup"].is_string())
        .collect();
    if rows.is_empty() {
        return;
    }
    let get = |row: &str, tool: &str| {
        rows.iter()
            .find(|r| r["startup"] == row && r["tool"] == tool && r["overhead_s"].is_number())
            .and_then(|r| r["overhead_s"].as_f64())
    };
    let exec = get("--version", "tracekit (cached)");
    let bpftrace_exec = get("--version", "bpftrace");
    println!(
        "\nStart-up: exec to exit with 1 s traced (-d 1), that second subtracted, in seconds \
         (median of {ROUNDS} rounds after one unmeasured, the tools taking turns; one run of a tool over {} s). `funccount --version` takes {}, `bpftrace --version` {}. Ratios are against \
         tracekit with its function table cached; above 1 = slower than it.",
        QUICK.as_secs(),
        exec.map_or("-".into(), |e| format!("{} s", secs(e))),
        bpftrace_exec.map_or("-".into(), |e| format!("{} s", secs(e)))
    );
    let mut t = Builder::default();
    let mut header = vec!["probe".to_string()];
    header.extend(TOOLS.iter().map(|t| t.to_string()));
    header.extend(
        ["tracekit (no cache)", "bpftrace", "bcc"]
            .iter()
            .map(|t| format!("{t} / cached")),
    );
    header.push("cached / its --version".to_string());
    t.push_record(header);
    for (row, ..) in ROWS
        .iter()
        .chain(&HOST_ROWS[1..])
        .filter(|r| rows.iter().any(|x| x["startup"] == r.0))
    {
        let mut r = vec![row.to_string()];
        for tool in TOOLS {
            r.push(get(row, tool).map_or("-".into(), secs));
        }
        let base = get(row, "tracekit (cached)");
        for tool in ["tracekit (no cache)", "bpftrace", "bcc"] {
            r.push(match (get(row, tool), base) {
                (Some(v), Some(b)) if b > 0.0 => format!("{:.1}x", v / b),
                _ => "-".into(),
            });
        }
        r.push(match (base, exec) {
            (Some(b), Some(e)) if e > 0.0 => format!("{:.1}x", b / e),
            _ => "-".into(),
        });
        t.push_record(r);
    }
    println!("{}", t.build().with(Style::markdown()));
    println!("\ntracekit's phases (its timing: line, from one more run after the measured ones):");
    for r in &rows {
        if let Some(timing) = r["timing"].as_str() {
            println!(
                "  {} {}: {}",
                r["startup"].as_str().unwrap_or(""),
                r["tool"].as_str().unwrap_or(""),
                timing.trim_start_matches("timing: ")
            );
        }
    }
    print_flagged(rows.iter().copied(), "error", "failed", |r| {
        format!("on {}", r["startup"].as_str().unwrap_or(""))
    });
}
