//! `cargo xtask bench-attach`: attach and detach time for N kernel functions, inside
//! one 6.12 guest run: tracekit (kprobe_multi), tracekit (single kprobes), bpftrace
//! and BCC's funccount-bpfcc with the same wildcard. For each N the wildcard whose
//! match count is closest to N is used by every tool.
//!
//! Attach = exec until the tool says it is tracing; detach = SIGINT until it exits.
//! Times are emulated (TCG) and only comparable within one run. The guest half runs
//! this same xtask binary (`bench-attach-guest`) and prints one `BENCH {json}` line
//! per measurement; the host half collects them into a table and target/bench/.
//!
//! It begins with the start-up rows ([`super::startup`]): exec to exit with
//! one second traced, against bpftrace and BCC. `--startup` runs only those.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{
    announce_start, attach_json, closest_glob, done_list, measure_repeated, print_flagged,
    run_guest_half, traceable_functions, GuestResults, MARK, QUICK, REPS,
};
use crate::{deps, guest};

const TARGETS: &[usize] = &[10, 100, 1000, 10000];
/// Per phase (attach or detach); a slower tool is reported as "> limit".
const LIMIT: Duration = Duration::from_secs(240);
const TOOLS: &[&str] = &["tracekit-multi", "tracekit-single", "bpftrace", "bcc"];

/// Host half: boots the 6.12 guest running the guest half, then prints the table.
pub fn host(root: &Path, args: &[String]) -> Result<()> {
    let startup_only = args.iter().any(|a| a == "--startup");
    deps::ensure(&[deps::BUILD, deps::GUEST, deps::BENCH].concat())?;
    crate::build::build_release(&["--bin", "funccount"])?;
    let spec = &guest::KERNELS[0];
    let kernel = guest::fetch(spec)?;
    // BCC compiles against the running kernel's headers; the guest sees ours over 9p.
    let headers = format!("linux-headers-{}", kernel.version);
    let bcc_note = match deps::ensure(&[headers.as_str()]) {
        Ok(()) => None,
        Err(e) => Some(format!("BCC not run: {e:#}")),
    };
    let done_file = root.join("target/bench/attach-done.json");
    fs::create_dir_all(done_file.parent().expect("dir"))?;
    // Mass ftrace patching can crash an emulated guest kernel (seen once in ~10
    // runs of the 42k-function row, an int3 oops in text_poke_bp): guest_runs notes
    // it, boots a fresh guest and retries that measurement once.
    let GuestResults { results, failure } = run_guest_half(
        &kernel,
        "attach",
        &[&root.join("target/release/funccount")],
        &done_file,
        &[
            if bcc_note.is_some() { "--no-bcc" } else { "" },
            if startup_only { "--startup-only" } else { "" },
        ],
        Duration::from_secs(6 * 3600),
    )?;
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
    let phases = if startup_only {
        &[][..]
    } else {
        &[
            ("attach (s, exec to tracing)", "attach_s"),
            ("detach (s, SIGINT to exit)", "detach_s"),
        ][..]
    };
    for &(phase, key) in phases {
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
    super::startup::table(&results);
    let on_pattern = |r: &Value| format!("on '{}'", r["pattern"].as_str().unwrap_or(""));
    let with_pattern = results.iter().filter(|r| r["pattern"].is_string());
    print_flagged(with_pattern, "error", "failed", on_pattern);
    print_flagged(&results, "note", "note", on_pattern);
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
    let usage = "usage: bench-attach-guest FUNCCOUNT [--done FILE] [--no-bcc] [--startup-only]";
    let funccount = args.first().context(usage)?;
    let bcc = !args.iter().any(|a| a == "--no-bcc");
    let done = done_list(args).context(usage)?;
    super::startup::guest(funccount, bcc, &done)?;
    if args.iter().any(|a| a == "--startup-only") {
        return Ok(());
    }
    let names = traceable_functions()?;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
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
            let key = serde_json::json!({"pattern": pattern, "tool": tool});
            announce_start(&key);
            let mut note = None;
            let what = format!("{tool} on '{pattern}'");
            let line = match measure_repeated(|| command(tool, funccount, pattern), &what, LIMIT) {
                Ok((runs, left)) => {
                    note = left;
                    let mut v = attach_json(&runs);
                    v["pattern"] = pattern.as_str().into();
                    v["tool"] = tool.into();
                    v
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

/// The command line of `tool` attaching to `pattern`.
fn command(tool: &str, funccount: &str, pattern: &str) -> Command {
    match tool {
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
    }
}
