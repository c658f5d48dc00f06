//! `cargo xtask bench-attach`: attach and detach time for N kernel functions, inside
//! one 6.12 guest run: tracekit (kprobe_multi), tracekit (single kprobes), bpftrace
//! and BCC's funccount-bpfcc with the same wildcard. For each N the wildcard whose
//! match count is closest to N is used by every tool.
//!
//! Attach = exec until the tool says it is tracing; detach = SIGINT until it exits.
//! Times are emulated (TCG) and only comparable within one run. The guest half runs
//! this same xtask binary (`bench-attach-guest`) and prints one `BENCH {json}` line
//! per measurement; the host half collects them into a table and target/bench/.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tabled::builder::Builder;
use tabled::settings::Style;

use crate::{deps, guest};

const MARK: &str = "BENCH ";
const TARGETS: &[usize] = &[10, 100, 1000, 10000];
/// Per phase (attach or detach); a slower tool is reported as "> limit".
const LIMIT: Duration = Duration::from_secs(240);
const TOOLS: &[&str] = &["tracekit-multi", "tracekit-single", "bpftrace", "bcc"];
/// Measurements whose run takes under [`QUICK`] are repeated this many times.
const REPS: usize = 3;
const QUICK: Duration = Duration::from_secs(30);

/// Host half: boots the 6.12 guest running the guest half, then prints the table.
pub fn host(root: &Path) -> Result<()> {
    deps::ensure(&[deps::BUILD, deps::GUEST, deps::BENCH].concat())?;
    crate::build_release(&["--bin", "funccount"])?;
    let spec = &guest::KERNELS[0];
    let kernel = guest::fetch(spec)?;
    // BCC compiles against the running kernel's headers; the guest sees ours over 9p.
    let headers = format!("linux-headers-{}", kernel.version);
    let bcc_note = match deps::ensure(&[headers.as_str()]) {
        Ok(()) => None,
        Err(e) => Some(format!("BCC not run: {e:#}")),
    };
    let xtask = std::env::current_exe()?;
    let done_file = root.join("target/bench/attach-done.json");
    fs::create_dir_all(done_file.parent().expect("dir"))?;
    let script = guest::write_script(
        "bench-attach.sh",
        &format!(
            "'{}' bench-attach-guest '{}' --done '{}' {}",
            xtask.display(),
            root.join("target/release/funccount").display(),
            done_file.display(),
            if bcc_note.is_some() { "--no-bcc" } else { "" }
        ),
    )?;
    // Mass ftrace patching can crash an emulated guest kernel (seen once in ~10
    // runs of the 42k-function row, an int3 oops in text_poke_bp). Such a crash
    // is a result in itself: note it, boot a fresh guest, retry that measurement
    // once, and go on with the rest instead of losing the table.
    let mut results: Vec<serde_json::Value> = Vec::new();
    let mut crashed: Vec<(String, String)> = Vec::new();
    let mut failure = None;
    fs::write(&done_file, "[]")?;
    for boot in 1..=6 {
        let verdict = guest::boot(&kernel, &script, Duration::from_secs(6 * 3600))?;
        let mut started: Option<(String, String)> = None;
        for v in verdict
            .lines
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.split_once(MARK)?.1).ok())
        {
            let key = (
                v["pattern"].as_str().unwrap_or("").to_string(),
                v["tool"].as_str().unwrap_or("").to_string(),
            );
            if v["start"].as_bool() == Some(true) {
                started = Some(key);
            } else {
                if started.as_ref() == Some(&key) {
                    started = None;
                }
                results.push(v);
            }
        }
        if verdict.passed {
            failure = None;
            break;
        }
        let (Some(splat), Some((pattern, tool))) = (verdict.splat.as_ref(), started) else {
            failure = Some(verdict.summary.clone());
            break;
        };
        let twice = crashed.contains(&(pattern.clone(), tool.clone()));
        results.push(serde_json::json!({
            "pattern": pattern, "tool": tool,
            "note": format!("the guest kernel crashed during this run (boot {boot}): {}", splat.trim()),
        }));
        if twice {
            results.push(serde_json::json!({
                "pattern": pattern, "tool": tool,
                "error": "crashed the guest kernel twice",
            }));
        }
        crashed.push((pattern, tool));
        let done: Vec<&serde_json::Value> =
            results.iter().filter(|r| r["note"].is_null()).collect();
        fs::write(&done_file, serde_json::to_string(&done)?)?;
        failure = Some(verdict.summary.clone());
    }
    if results.iter().all(|r| r["note"].is_string()) {
        bail!(
            "the benchmark guest failed: {}",
            failure.unwrap_or_default()
        );
    }
    let out = root.join("target/bench/attach.json");
    fs::create_dir_all(out.parent().expect("dir"))?;
    fs::write(&out, serde_json::to_string_pretty(&results)?)?;

    let cell = |v: &serde_json::Value, key: &str| -> String {
        if v["error"].is_string() {
            return "failed (below)".to_string();
        }
        match v[key].as_f64() {
            Some(s) => format!("{s:.2}"),
            None => format!("> {}", LIMIT.as_secs()),
        }
    };
    println!(
        "\nAttach and detach times in one benchmark run ({} {}, qemu TCG: emulated time, only \
         comparable within this table). Runs under {}s are the median of {REPS}. Ratios are \
         against tracekit-multi; above 1 = slower than it.",
        kernel.label,
        kernel.version,
        QUICK.as_secs()
    );
    for (phase, key) in [
        ("attach (s, exec to tracing)", "attach_s"),
        ("detach (s, SIGINT to exit)", "detach_s"),
    ] {
        let mut t = Builder::default();
        let mut header = vec!["pattern".to_string(), "functions".to_string()];
        header.extend(TOOLS.iter().map(|t| t.to_string()));
        header.extend(TOOLS[1..].iter().map(|t| format!("{t} / multi")));
        t.push_record(header);
        let patterns: Vec<String> = {
            let mut p: Vec<String> = results
                .iter()
                .filter_map(|r| r["pattern"].as_str().map(str::to_string))
                .collect();
            p.dedup();
            p
        };
        for pat in patterns {
            let of = |tool: &str| {
                results.iter().find(|r| {
                    r["pattern"] == pat.as_str() && r["tool"] == tool && r["note"].is_null()
                })
            };
            let multi = of("tracekit-multi");
            let n = multi
                .and_then(|m| m["functions"].as_u64())
                .map(|n| n.to_string())
                .unwrap_or_default();
            let mut row = vec![format!("'{pat}'"), n];
            for tool in TOOLS {
                row.push(
                    of(tool)
                        .map(|v| cell(v, key))
                        .unwrap_or_else(|| "not run".into()),
                );
            }
            let base = multi.and_then(|m| m[key].as_f64());
            for tool in &TOOLS[1..] {
                let r = match (of(tool).and_then(|v| v[key].as_f64()), base) {
                    (Some(v), Some(b)) if b > 0.0 => format!("{:.1}x", v / b),
                    (None, Some(b)) if of(tool).is_some_and(|v| v["error"].is_null()) => {
                        format!("> {:.0}x", LIMIT.as_secs_f64() / b)
                    }
                    _ => "-".into(),
                };
                row.push(r);
            }
            t.push_record(row);
        }
        println!("\n{phase}:\n{}", t.build().with(Style::markdown()));
    }
    for r in results.iter().filter(|r| r["error"].is_string()) {
        println!(
            "failed: {} on '{}': {}",
            r["tool"].as_str().unwrap_or(""),
            r["pattern"].as_str().unwrap_or(""),
            r["error"].as_str().unwrap_or("")
        );
    }
    for r in results.iter().filter(|r| r["note"].is_string()) {
        println!(
            "note: {} on '{}': {}",
            r["tool"].as_str().unwrap_or(""),
            r["pattern"].as_str().unwrap_or(""),
            r["note"].as_str().unwrap_or("")
        );
    }
    if let Some(n) = bcc_note {
        println!("{n}");
    }
    if let Some(f) = failure {
        println!("the guest did not finish: {f} (rows after the last measurement are missing)");
    }
    println!("raw numbers: {}", out.display());
    Ok(())
}

/// Guest half: measures every tool for every pattern and prints BENCH lines: a
/// `start` line before each measurement (so the host knows what a crash interrupted)
/// and its result after. Measurements listed in the `--done` file are skipped.
pub fn guest(args: &[String]) -> Result<()> {
    let usage = "usage: bench-attach-guest FUNCCOUNT [--done FILE] [--no-bcc]";
    let funccount = args.first().context(usage)?;
    let bcc = !args.iter().any(|a| a == "--no-bcc");
    let done: Vec<serde_json::Value> = match args.iter().position(|a| a == "--done") {
        Some(i) => {
            let path = args.get(i + 1).context(usage)?;
            serde_json::from_str(&fs::read_to_string(path).with_context(|| path.clone())?)?
        }
        None => Vec::new(),
    };
    let aff = fs::read_to_string("/sys/kernel/tracing/available_filter_functions")?;
    let mut names: Vec<&str> = aff
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut patterns: Vec<String> = TARGETS.iter().map(|&n| closest_glob(&names, n)).collect();
    patterns.push("*".into());
    for pattern in &patterns {
        for &tool in TOOLS {
            if (tool == "bcc" && !bcc)
                || done
                    .iter()
                    .any(|d| d["pattern"] == pattern.as_str() && d["tool"] == tool)
            {
                continue;
            }
            eprintln!("bench: {tool} on '{pattern}'...");
            println!(
                "{MARK}{}",
                serde_json::json!({"pattern": pattern, "tool": tool, "start": true})
            );
            let mut note = None;
            let line = match measure_repeated(tool, funccount, pattern) {
                Ok((runs, left)) => {
                    note = left;
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
                        "pattern": pattern, "tool": tool,
                        "functions": runs[0].functions,
                        "attach_s": runs.iter().all(|m| m.attach.is_some()).then(|| median(&attach)),
                        "detach_s": complete.then(|| median(&detach)),
                        "attach_runs_s": attach, "detach_runs_s": detach,
                    })
                }
                Err(e) => {
                    serde_json::json!({"pattern": pattern, "tool": tool, "error": format!("{e:#}")})
                }
            };
            println!("{MARK}{line}");
            if let Some(note) = note {
                println!(
                    "{MARK}{}",
                    serde_json::json!({"pattern": pattern, "tool": tool, "note": note})
                );
            }
        }
    }
    Ok(())
}

/// Runs that finish quickly are noisy under emulation: repeat those (median of
/// [`REPS`]); one run of a slow tool is enough to show it is slow.
/// Also returns a note when the kernel was slow to release the functions afterwards.
fn measure_repeated(
    tool: &str,
    funccount: &str,
    pattern: &str,
) -> Result<(Vec<Measured>, Option<String>)> {
    let mut runs = Vec::new();
    let started = Instant::now();
    loop {
        let m = measure(tool, funccount, pattern)?;
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

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The `PREFIX*` or `*INFIX*` glob whose match count is closest to `n` (in ratio).
fn closest_glob(names: &[&str], n: usize) -> String {
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

struct Measured {
    functions: Option<u64>,
    attach: Option<Duration>,
    detach: Option<Duration>,
}

fn measure(tool: &str, funccount: &str, pattern: &str) -> Result<Measured> {
    let mut cmd = match tool {
        "tracekit-multi" | "tracekit-single" => {
            let mut c = Command::new(funccount);
            c.args([
                "--attach-mode",
                if tool == "tracekit-multi" {
                    "multi"
                } else {
                    "single"
                },
                pattern,
            ]);
            c
        }
        "bpftrace" => {
            let mut c = Command::new("bpftrace");
            // `@ = count()` (no probe key) keeps wildcards eligible for kprobe_multi.
            c.arg("-e")
                .arg(format!(
                    "BEGIN {{ printf(\"READY\\n\"); }} kprobe:{pattern} {{ @ = count(); }}"
                ))
                .env("BPFTRACE_MAX_PROBES", "1000000");
            c
        }
        "bcc" => {
            let mut c = Command::new("funccount-bpfcc");
            c.arg(pattern).env("BCC_PROBE_LIMIT", "1000000");
            c
        }
        _ => unreachable!(),
    };
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {tool}"))?;
    let (tx, rx) = mpsc::channel::<String>();
    for pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        thread::spawn(move || {
            for l in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
    }
    drop(tx);
    let ready = |l: &str| l.starts_with("Tracing ") || l == "READY";
    let mut functions = None;
    let mut seen = Vec::new();
    let attach = loop {
        match rx.recv_timeout(LIMIT.saturating_sub(start.elapsed())) {
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
        if stop.elapsed() > LIMIT {
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

/// Waits until no ftrace-attached function is left, so runs do not overlap; says
/// how many are left if that takes over five minutes.
fn wait_clean() -> std::result::Result<(), String> {
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
