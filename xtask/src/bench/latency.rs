//! `cargo xtask bench-latency`: funclatency against bpftrace's entry/return idiom
//! and BCC's funclatency-bpfcc, side by side in one run:
//!
//! 1. per-call overhead on hot user functions, on the host: tests/progs/workload.rs
//!    `funcs N` (6N calls of tk_alpha/tk_beta/tk_gamma) untraced and traced by
//!    funclatency with each user mechanism (auto, uprobe.session, uprobe_multi
//!    pair, single pairs), bpftrace's uprobe/uretprobe idiom and BCC;
//! 2. per-call overhead on a hot kernel function in the 6.12 guest: `read N FILE`
//!    (N pread(2) calls = N vfs_read calls), untraced and traced by funclatency
//!    (auto = fentry/fexit, session, multi, single), bpftrace's kprobe/kretprobe
//!    idiom and BCC;
//! 3. attach and detach time, in the same guest run, for the wildcard of about
//!    1000 kernel functions: funclatency, funccount (the reference the issue sets),
//!    bpftrace's kprobe+kretprobe and BCC.
//!
//! Every traced run checks that the tool timed exactly the calls the workload made
//! (funclatency's and BCC's `count: N`, the total of bpftrace's histogram), so a
//! fast wrong answer cannot win. Runs are interleaved round-robin (each round runs
//! every tool once) so that drift in the machine's load is shared. Guest times
//! are emulated (TCG): only ratios within the run count.
//!
//! The guest half is this xtask binary (`bench-latency-guest`), printing
//! `BENCH {json}` lines; harness::guest_runs survives guest crashes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{
    announce_start, attach_json, bpftrace_version, closest_glob, done_list, matches,
    measure_repeated, median, num_cpus, print_flagged, run_guest_half, traceable_functions,
    wait_clean, GuestResults, Line, NotReady, Tracer, Workload, MARK, QUICK, REPS,
};
use crate::{deps, guest};

/// Host rounds (median of 7); `funcs N` makes 6N calls.
const HOST_ROUNDS: usize = 7;
const USER_N: u64 = 300_000;
/// Guest rounds (median of 5) of `read N`. Emulation under a loaded host is noisy:
/// long runs and several rounds average it out.
const GUEST_ROUNDS: usize = 5;
const READS: u64 = 200_000;
/// How long a tool may take to get ready (host, guest), and to exit after SIGINT.
const HOST_LIMIT: Duration = Duration::from_secs(60);
const GUEST_LIMIT: Duration = Duration::from_secs(600);
/// A tool slower than this to get ready in the guest (BCC, compiling its C) runs
/// [`SLOW_ROUNDS`] rounds only.
const SLOW_START: Duration = Duration::from_secs(60);
const SLOW_ROUNDS: usize = 3;
/// The wildcard's target size, and the limit per phase of its attach/detach.
const WILDCARD: usize = 1000;
const ATTACH_LIMIT: Duration = Duration::from_secs(300);
/// Bound on one guest boot (a hang costs at most this, the table is kept).
const GUEST_TIMEOUT: Duration = Duration::from_secs(50 * 60);

const USER_TOOLS: &[&str] = &[
    "untraced",
    "funclatency-auto",
    "funclatency-session",
    "funclatency-multi",
    "funclatency-single",
    "bpftrace",
    "bcc",
];
const KERNEL_TOOLS: &[&str] = USER_TOOLS;
const ATTACH_TOOLS: &[&str] = &["funclatency", "funccount", "bpftrace", "bcc"];

/// What a traced run times.
enum Target<'a> {
    /// tk_* in the workload binary.
    User(&'a Path),
    /// vfs_read.
    Kernel,
}

impl Target<'_> {
    fn part(&self) -> &'static str {
        match self {
            Target::User(_) => "user",
            Target::Kernel => "vfs_read",
        }
    }

    /// The funclatency / BCC pattern.
    fn pattern(&self) -> String {
        match self {
            Target::User(bin) => format!("{}:tk_*", bin.display()),
            Target::Kernel => "vfs_read".into(),
        }
    }

    /// bpftrace's entry and return probes.
    fn bpftrace_probes(&self) -> (String, String) {
        match self {
            Target::User(bin) => (
                format!("uprobe:{}:tk_*", bin.display()),
                format!("uretprobe:{}:tk_*", bin.display()),
            ),
            Target::Kernel => ("kprobe:vfs_read".into(), "kretprobe:vfs_read".into()),
        }
    }

    fn workload_args(&self, file: &Path) -> Vec<String> {
        match self {
            Target::User(_) => vec!["funcs".into(), USER_N.to_string()],
            Target::Kernel => vec!["read".into(), READS.to_string(), file.display().to_string()],
        }
    }

    fn calls(&self) -> u64 {
        match self {
            Target::User(_) => 6 * USER_N,
            Target::Kernel => READS,
        }
    }
}

/// bpftrace's usual latency idiom (it records the innermost of nested calls only),
/// filtered to the workload's process as the other tools are with `-p`.
fn bpftrace_program(entry: &str, ret: &str, pid: Option<u32>) -> String {
    let filter = pid.map(|p| format!("/pid == {p}/ ")).unwrap_or_default();
    format!(
        "BEGIN {{ printf(\"READY\\n\"); }} {entry} {filter}{{ @s[tid] = nsecs; }} \
         {ret} /@s[tid]/ {{ @h = hist(nsecs - @s[tid]); delete(@s[tid]); }}"
    )
}

/// The tracer's command line for a per-call run on process `pid`.
fn tracer(tool: &str, funclatency: &Path, target: &Target, pid: u32) -> Command {
    match tool {
        "bpftrace" => {
            let (entry, ret) = target.bpftrace_probes();
            let mut c = Command::new("bpftrace");
            c.arg("-e").arg(bpftrace_program(&entry, &ret, Some(pid)));
            c
        }
        "bcc" => {
            let mut c = Command::new("funclatency-bpfcc");
            c.args(["-p", &pid.to_string(), &target.pattern()]);
            c
        }
        _ => {
            let mode = tool
                .strip_prefix("funclatency-")
                .expect("a funclatency mode");
            let mut c = Command::new(funclatency);
            c.arg("-D");
            if mode != "auto" {
                c.args(["--attach-mode", mode]);
            }
            c.args(["-p", &pid.to_string(), &target.pattern()]);
            c
        }
    }
}

/// One per-call run: the workload's ns per call (untraced or under `tool`) as
/// JSON fields, or an error. `over_limit` when the tool was not ready in time.
fn per_call_run(
    tool: &str,
    funclatency: &Path,
    workload: &Path,
    target: &Target,
    file: &Path,
    limit: Duration,
) -> Result<Value> {
    let w = Workload::start(workload, &target.workload_args(file))?;
    if tool == "untraced" {
        return Ok(json!({ "ns_per_call": w.run()? }));
    }
    let mut cmd = tracer(tool, funclatency, target, w.pid());
    // BCC's tools are Python: unbuffered, their `Tracing` line is seen when printed.
    cmd.env("PYTHONUNBUFFERED", "1").stdin(Stdio::null());
    let ready = |l: &str| l.starts_with("Tracing ") || l == "READY";
    let mut t = match Tracer::start(cmd, ready, limit, |_| Line::Keep) {
        Ok(t) => t,
        Err(e) if e.is::<NotReady>() => {
            return Ok(json!({
                "over_limit": true,
                "error": format!("{tool} was not tracing within {}s", limit.as_secs()),
            }));
        }
        Err(e) => {
            let lines: Vec<String> = format!("{e:#}").lines().map(String::from).collect();
            bail!("{tool} exited before tracing: {}", why(&lines))
        }
    };
    let ready_s = t.ready.as_secs_f64();
    let ns = w.run()?;
    t.interrupt();
    if !t.wait_within(limit, None)? {
        bail!("{tool} did not exit within {}s of SIGINT", limit.as_secs());
    }
    // The count is on stdout, funclatency's attach mode (-D) on stderr.
    let out = t.finish();
    let seen: Vec<String> = out
        .kept
        .into_iter()
        .map(|(_, l)| l)
        .chain(out.stderr)
        .collect();
    let (count, mechanism) = parse_output(tool, &seen);
    let Some(count) = count else {
        bail!("{tool} printed no count: {}", why(&seen));
    };
    if count != target.calls() {
        // A fast wrong answer must not win: this disqualifies the tool.
        return Ok(json!({
            "wrong_count": true,
            "error": format!("{tool} timed {count} calls, the workload made {}", target.calls()),
        }));
    }
    Ok(json!({
        "ns_per_call": ns, "ready_s": ready_s, "count": count, "mechanism": mechanism,
    }))
}

/// The calls a tool timed (funclatency's and BCC's `count: N`, the total of
/// bpftrace's histogram) and funclatency's `-D` attach mode.
fn parse_output(tool: &str, lines: &[String]) -> (Option<u64>, Option<String>) {
    let mut count = None;
    let mut mechanism = None;
    for l in lines {
        let l = l.trim();
        if tool == "bpftrace" {
            if l.starts_with('[') {
                let n = l
                    .split('|')
                    .next()
                    .and_then(|s| s.split_whitespace().last())
                    .and_then(|n| n.parse::<u64>().ok());
                *count.get_or_insert(0) += n.unwrap_or(0);
            }
        } else if l.starts_with("avg = ") {
            let n = l
                .rsplit_once("count: ")
                .and_then(|(_, n)| n.trim().parse::<u64>().ok());
            *count.get_or_insert(0) += n.unwrap_or(0);
        } else if let Some(m) = l.strip_prefix("attach mode: ") {
            let m = m.split_once(": ").map_or(m, |(_, v)| v);
            mechanism = Some(m.split(" (").next().unwrap_or(m).to_string());
        }
    }
    (count, mechanism)
}

/// A tool's failure in a line: its first telling output line.
fn why(lines: &[String]) -> String {
    let telling = lines.iter().find(|l| {
        let l = l.to_lowercase();
        ["unable", "error", "cannot", "failed", "exception"]
            .iter()
            .any(|w| l.contains(w))
    });
    telling
        .or(lines.last())
        .map(|l| l.trim().to_string())
        .unwrap_or_else(|| "no output".into())
}

/// Whether earlier results (`seen`) say not to run `tool` in `part` again: it
/// timed the wrong number of calls, went over the limit, failed twice (one
/// failure, such as a hang at exit on a loaded machine, may be passing), or is so
/// slow to start that [`SLOW_ROUNDS`] show it.
fn skip(seen: &[Value], part: &str, tool: &str) -> bool {
    let runs: Vec<&Value> = seen
        .iter()
        .filter(|v| v["part"] == part && v["tool"] == tool && v["note"].is_null())
        .collect();
    let flag = |v: &&&Value, k: &str| v[k].as_bool() == Some(true);
    let measured = runs.iter().filter(|v| v["ns_per_call"].is_number()).count();
    let failed = runs.iter().filter(|v| v["error"].is_string()).count();
    let slow = runs.iter().any(|v| {
        v["ready_s"]
            .as_f64()
            .is_some_and(|s| s > SLOW_START.as_secs_f64())
    });
    runs.iter()
        .any(|v| flag(&v, "wrong_count") || flag(&v, "over_limit"))
        || failed >= 2
        || (slow && measured >= SLOW_ROUNDS)
}

/// Runs the per-call rounds of one part, printing each result as a BENCH line
/// (guest) or collecting it (host).
#[allow(clippy::too_many_arguments)]
fn per_call_rounds(
    target: &Target,
    tools: &[&str],
    rounds: usize,
    funclatency: &Path,
    workload: &Path,
    file: &Path,
    limit: Duration,
    done: &[Value],
    guest: bool,
    mut emit: impl FnMut(Value),
) {
    let mut seen: Vec<Value> = done.to_vec();
    for round in 0..rounds {
        for &tool in tools {
            let key = json!({"part": target.part(), "tool": tool, "round": round});
            if done.iter().any(|d| matches(d, &key)) || skip(&seen, target.part(), tool) {
                continue;
            }
            eprintln!("bench: {} round {round}: {tool}", target.part());
            if guest {
                announce_start(&key);
            }
            let mut v = match per_call_run(tool, funclatency, workload, target, file, limit) {
                Ok(v) => v,
                Err(e) => json!({ "error": format!("{e:#}") }),
            };
            for (k, x) in key.as_object().expect("object") {
                v[k] = x.clone();
            }
            seen.push(v.clone());
            emit(v);
        }
    }
}

/// Host half: the user-function part here, then the guest's parts, then tables.
pub fn host(root: &Path, args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "--report") {
        return report_again(root);
    }
    let run_host = !args.iter().any(|a| a == "--no-host");
    let run_guest = !args.iter().any(|a| a == "--no-guest");
    deps::ensure(&[deps::BUILD, deps::GUEST, deps::BENCH].concat())?;
    crate::build::build_release(&[
        "--bin",
        "funclatency",
        "--bin",
        "funccount",
        "--example",
        "workload",
    ])?;
    let funclatency = root.join("target/release/funclatency");
    let workload = root.join("target/release/examples/workload");
    let bpftrace = bpftrace_version()?;
    let out_dir = root.join("target/bench");
    fs::create_dir_all(&out_dir)?;

    let mut host_results = Vec::new();
    if run_host {
        per_call_rounds(
            &Target::User(&workload),
            USER_TOOLS,
            HOST_ROUNDS,
            &funclatency,
            &workload,
            Path::new(""),
            HOST_LIMIT,
            &[],
            false,
            |v| host_results.push(v),
        );
    }

    let mut guest_results = Vec::new();
    let mut guest_failure = None;
    let mut kernel_name = String::new();
    let mut bcc_note = None;
    if run_guest {
        // A guest that cannot boot, crashes or hangs keeps what it measured and
        // what the host did.
        match guest_part(root, &funclatency, &workload, &out_dir) {
            Ok((name, note, GuestResults { results, failure })) => {
                kernel_name = name;
                bcc_note = note;
                guest_results = results;
                guest_failure = failure;
            }
            Err(e) => guest_failure = Some(format!("{e:#}")),
        }
    }

    let raw = json!({
        "host": host_results, "guest": guest_results, "guest_kernel": kernel_name,
        "host_kernel": kernel_release(), "cpus": num_cpus(),
        "bpftrace": bpftrace, "user_calls": 6 * USER_N, "guest_reads": READS,
        "bcc_note": bcc_note, "guest_failure": guest_failure,
    });
    let out = out_dir.join("latency.json");
    fs::write(&out, serde_json::to_string_pretty(&raw)?)?;
    report(&raw);
    println!("raw numbers: {}", out.display());
    Ok(())
}

/// Boots the 6.12 guest running the guest half: (kernel, why BCC was not run,
/// results).
fn guest_part(
    root: &Path,
    funclatency: &Path,
    workload: &Path,
    out_dir: &Path,
) -> Result<(String, Option<String>, GuestResults)> {
    let kernel = guest::fetch(&guest::KERNELS[0])?;
    let name = format!("{} ({})", kernel.label, kernel.version);
    // BCC compiles against the running kernel's headers; the guest sees ours over 9p.
    let headers = format!("linux-headers-{}", kernel.version);
    let bcc_note = deps::ensure(&[headers.as_str()])
        .err()
        .map(|e| format!("BCC not run in the guest: {e:#}"));
    let done_file = out_dir.join("latency-done.json");
    let results = run_guest_half(
        &kernel,
        "latency",
        &[
            funclatency,
            &root.join("target/release/funccount"),
            workload,
        ],
        &done_file,
        &[if bcc_note.is_some() { "--no-bcc" } else { "" }],
        GUEST_TIMEOUT,
    )?;
    Ok((name, bcc_note, results))
}

/// `bench-latency --report`: the tables again from target/bench/latency.json.
fn report_again(root: &Path) -> Result<()> {
    let path = root.join("target/bench/latency.json");
    let raw: Value = serde_json::from_str(
        &fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    report(&raw);
    Ok(())
}

/// Prints the tables of one run (its raw JSON).
fn report(raw: &Value) {
    let list = |k: &str| raw[k].as_array().cloned().unwrap_or_default();
    let (host_results, guest_results) = (list("host"), list("guest"));
    let text = |k: &str| raw[k].as_str().unwrap_or("").to_string();
    let mut errors: Vec<String> = Vec::new();
    if !host_results.is_empty() {
        println!(
            "\nPer-call overhead on hot user functions (host, Linux {}, {} CPUs; {} calls of \
             tk_alpha/tk_beta/tk_gamma per run, {HOST_ROUNDS} interleaved rounds), \
             funclatency (tracekit, release) vs {} vs BCC:",
            raw["host_kernel"]
                .as_str()
                .map_or_else(kernel_release, str::to_string),
            raw["cpus"].as_u64().unwrap_or(num_cpus() as u64),
            raw["user_calls"],
            text("bpftrace"),
        );
        println!(
            "{}",
            per_call_table(&host_results, "user", &mut errors, HOST_LIMIT)
        );
    }
    if !guest_results.is_empty() {
        println!(
            "\nPer-call overhead on vfs_read (guest {}, qemu TCG: emulated time, only ratios \
             within this run count; {} pread(2) calls per run, {GUEST_ROUNDS} interleaved \
             rounds; a tool over {}s to start runs {SLOW_ROUNDS} rounds):",
            text("guest_kernel"),
            raw["guest_reads"],
            SLOW_START.as_secs()
        );
        println!(
            "{}",
            per_call_table(&guest_results, "vfs_read", &mut errors, GUEST_LIMIT)
        );
        println!(
            "\nAttach and detach of a wildcard of ~{WILDCARD} kernel functions (same guest run; \
             attach = exec until tracing, detach = SIGINT until exit; runs under {}s are the \
             median of {REPS}; entry and return probes for all but funccount, which counts \
             calls with entry probes only and is the reference for attach time):",
            QUICK.as_secs()
        );
        println!("{}", attach_table(&guest_results, &mut errors));
    }
    println!("A ratio above 1 means funclatency (auto) is cheaper or faster.");
    for e in &errors {
        println!("failed: {e}");
    }
    print_flagged(&guest_results, "note", "note", |r| {
        format!("({})", r["part"].as_str().unwrap_or(""))
    });
    if let Some(n) = raw["bcc_note"].as_str() {
        println!("{n}");
    }
    if let Some(f) = raw["guest_failure"].as_str() {
        println!("the guest did not finish: {f} (rows after the last measurement are missing)");
    }
}

fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// How a row's tool is labelled, with the mechanism it attached with.
fn label(tool: &str, part: &str, mechanism: Option<&str>) -> (String, String) {
    let user = part == "user";
    let (name, mech) = match tool {
        "untraced" => ("untraced".to_string(), "-".to_string()),
        "bpftrace" => (
            "bpftrace".into(),
            if user {
                "uprobe + uretprobe, one pair per function"
            } else {
                "kprobe + kretprobe"
            }
            .into(),
        ),
        "bcc" => (
            "BCC funclatency-bpfcc".into(),
            if user {
                "uprobe + uretprobe (perf events)"
            } else {
                "kprobe + kretprobe (perf events)"
            }
            .into(),
        ),
        _ => {
            let mode = tool.trim_start_matches("funclatency-");
            let name = if mode == "auto" {
                "funclatency".to_string()
            } else {
                format!("funclatency --attach-mode {mode}")
            };
            (name, mechanism.unwrap_or("?").to_string())
        }
    };
    (name, mech)
}

/// The per-call table of one part: ns per call, the cost added over untraced, and
/// that cost against funclatency's (auto), each as median / minimum over the
/// rounds (the host and its emulator are shared, so noise only adds time: the
/// minimum is the least disturbed run).
fn per_call_table(
    results: &[Value],
    part: &str,
    errors: &mut Vec<String>,
    limit: Duration,
) -> String {
    let of = |tool: &str| -> Vec<&Value> {
        results
            .iter()
            .filter(|r| r["part"] == part && r["tool"] == tool && r["note"].is_null())
            .collect()
    };
    // (median, min) of a tool's ns per call over its measured runs; none for a
    // tool that timed a wrong number of calls.
    let ns_of = |tool: &str| -> Option<(f64, f64)> {
        let ns: Vec<f64> = of(tool)
            .iter()
            .filter_map(|r| r["ns_per_call"].as_f64())
            .collect();
        let min = ns.iter().copied().reduce(f64::min)?;
        of(tool)
            .iter()
            .all(|r| r["wrong_count"].is_null())
            .then(|| (median(ns), min))
    };
    let base = ns_of("untraced");
    let added = |tool: &str| {
        let (t, b) = (ns_of(tool)?, base?);
        Some((t.0 - b.0, t.1 - b.1))
    };
    let reference = added("funclatency-auto");
    let pair = |(a, b): (f64, f64), unit: &str, digits: usize| {
        format!("{a:.digits$}{unit} / {b:.digits$}{unit}")
    };
    let mut t = Builder::default();
    t.push_record([
        "tracer",
        "mechanism",
        "runs",
        "ns per call (median / min)",
        "added ns per call",
        "added / funclatency's",
    ]);
    for &tool in USER_TOOLS {
        let rows = of(tool);
        let mechanism = rows.iter().find_map(|r| r["mechanism"].as_str());
        let (name, mech) = label(tool, part, mechanism);
        let measured = rows.iter().filter(|r| r["ns_per_call"].is_number()).count();
        let failures: Vec<&str> = rows.iter().filter_map(|r| r["error"].as_str()).collect();
        let mut runs = measured.to_string();
        if measured > 0 && !failures.is_empty() {
            runs.push_str(&format!(" (+{} failed)", failures.len()));
            for e in &failures {
                errors.push(format!("{name} ({part}), one run: {e}"));
            }
        }
        let cells: [String; 3] = if rows.is_empty() {
            ["not run".into(), String::new(), String::new()]
        } else if let Some(e) = rows
            .iter()
            .find(|r| r["wrong_count"].as_bool() == Some(true))
            .and_then(|r| r["error"].as_str())
        {
            errors.push(format!("{name} ({part}): {e}"));
            ["wrong count (below)".into(), String::new(), String::new()]
        } else if let Some(e) = failures.first().filter(|_| measured == 0) {
            if e.contains("Unable to find kernel headers") {
                [
                    "cannot run: no kernel headers for this kernel".into(),
                    String::new(),
                    String::new(),
                ]
            } else {
                errors.push(format!("{name} ({part}): {e}"));
                ["fails (below)".into(), String::new(), String::new()]
            }
        } else if rows.iter().any(|r| r["over_limit"].as_bool() == Some(true)) {
            [
                format!("not ready in {}s", limit.as_secs()),
                String::new(),
                String::new(),
            ]
        } else {
            let ns = ns_of(tool).map_or("-".into(), |n| pair(n, "", 1));
            match (tool, added(tool), reference) {
                ("untraced", _, _) => [ns, "-".into(), "-".into()],
                (_, Some(a), Some(r)) if r.0 > 0.0 && r.1 > 0.0 => {
                    [ns, pair(a, "", 1), pair((a.0 / r.0, a.1 / r.1), "x", 2)]
                }
                (_, Some(a), _) => [ns, pair(a, "", 1), "-".into()],
                _ => [ns, "-".into(), "-".into()],
            }
        };
        let mut row = vec![name, mech, runs];
        row.extend(cells);
        t.push_record(row);
    }
    t.build().with(Style::markdown()).to_string()
}

/// The attach table: seconds per phase and against funclatency's.
fn attach_table(results: &[Value], errors: &mut Vec<String>) -> String {
    let of = |tool: &str| {
        results
            .iter()
            .find(|r| r["part"] == "attach" && r["tool"] == tool && r["note"].is_null())
    };
    let reference = of("funclatency");
    let mut t = Builder::default();
    t.push_record([
        "tracer",
        "pattern",
        "functions",
        "attach (s)",
        "detach (s)",
        "attach / funclatency's",
        "detach / funclatency's",
    ]);
    for &tool in ATTACH_TOOLS {
        let name = match tool {
            "funclatency" => "funclatency (kprobe.session, one link)",
            "funccount" => "funccount (kprobe_multi, entries only)",
            "bpftrace" => "bpftrace kprobe + kretprobe",
            _ => "BCC funclatency-bpfcc (kprobes + kretprobes)",
        };
        let Some(v) = of(tool) else {
            t.push_record([name, "", "", "not run", "", "", ""]);
            continue;
        };
        let pattern = format!("'{}'", v["pattern"].as_str().unwrap_or(""));
        let n = v["functions"]
            .as_u64()
            .or_else(|| reference.and_then(|r| r["functions"].as_u64()))
            .map(|n| n.to_string())
            .unwrap_or_default();
        if let Some(e) = v["error"].as_str() {
            errors.push(format!("{name} on {pattern}: {e}"));
            t.push_record([name, &pattern, &n, "fails (below)", "", "", ""]);
            continue;
        }
        let mut row = vec![name.to_string(), pattern, n];
        for key in ["attach_s", "detach_s"] {
            row.push(match v[key].as_f64() {
                Some(s) => format!("{s:.2}"),
                None if key == "detach_s" && v["attach_s"].is_null() => "-".into(),
                None => format!("> {}", ATTACH_LIMIT.as_secs()),
            });
        }
        for key in ["attach_s", "detach_s"] {
            let base = reference.and_then(|r| r[key].as_f64());
            row.push(match (v[key].as_f64(), base) {
                (Some(s), Some(b)) if b > 0.0 => format!("{:.1}x", s / b),
                (None, Some(b)) if key == "attach_s" || v["attach_s"].is_number() => {
                    format!("> {:.0}x", ATTACH_LIMIT.as_secs_f64() / b)
                }
                _ => "-".into(),
            });
        }
        t.push_record(row);
    }
    t.build().with(Style::markdown()).to_string()
}

/// Guest half: `bench-latency-guest FUNCLATENCY FUNCCOUNT WORKLOAD [--done FILE]
/// [--no-bcc]`: the vfs_read rounds, then the wildcard's attach and detach.
pub fn guest(args: &[String]) -> Result<()> {
    let usage =
        "usage: bench-latency-guest FUNCLATENCY FUNCCOUNT WORKLOAD [--done FILE] [--no-bcc]";
    let [funclatency, funccount, workload] = [0, 1, 2].map(|i| args.get(i).map(PathBuf::from));
    let (Some(funclatency), Some(funccount), Some(workload)) = (funclatency, funccount, workload)
    else {
        bail!(usage);
    };
    let bcc = !args.iter().any(|a| a == "--no-bcc");
    let done = done_list(args).context(usage)?;
    let file = PathBuf::from("/tmp/bench-latency-file");
    fs::write(&file, [0u8; 4096])?;
    let tools: Vec<&str> = KERNEL_TOOLS
        .iter()
        .copied()
        .filter(|&t| bcc || t != "bcc")
        .collect();
    per_call_rounds(
        &Target::Kernel,
        &tools,
        GUEST_ROUNDS,
        &funclatency,
        &workload,
        &file,
        GUEST_LIMIT,
        &done,
        true,
        |v| {
            println!("{MARK}{v}");
            let _ = wait_clean();
        },
    );

    let names = traceable_functions()?;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let pattern = closest_glob(&names, WILDCARD);
    for &tool in ATTACH_TOOLS {
        let key = json!({"part": "attach", "tool": tool, "pattern": pattern});
        if (tool == "bcc" && !bcc) || done.iter().any(|d| matches(d, &key)) {
            continue;
        }
        eprintln!("bench: attach: {tool} on '{pattern}'");
        announce_start(&key);
        let command = || match tool {
            "funclatency" | "funccount" => {
                let mut c = Command::new(if tool == "funccount" {
                    &funccount
                } else {
                    &funclatency
                });
                c.arg(&pattern);
                c
            }
            "bpftrace" => {
                let mut c = Command::new("bpftrace");
                c.arg("-e")
                    .arg(bpftrace_program(
                        &format!("kprobe:{pattern}"),
                        &format!("kretprobe:{pattern}"),
                        None,
                    ))
                    .env("BPFTRACE_MAX_PROBES", "1000000");
                c
            }
            _ => {
                let mut c = Command::new("funclatency-bpfcc");
                c.arg(&pattern).env("BCC_PROBE_LIMIT", "1000000");
                c
            }
        };
        let mut v = match measure_repeated(command, tool, ATTACH_LIMIT) {
            Ok((runs, left)) => {
                let mut v = attach_json(&runs);
                if let Some(left) = left {
                    v["cleanup"] = left.into();
                }
                v
            }
            Err(e) => json!({ "error": format!("{e:#}") }),
        };
        for (k, x) in key.as_object().expect("object") {
            v[k] = x.clone();
        }
        println!("{MARK}{v}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_mechanism() {
        let lines: Vec<String> = [
            "attach mode: user functions: uprobe.session (3 functions)",
            "Tracing 3 functions for \"x\"... Hit Ctrl-C to end.",
            "avg = 416 nsecs, total: 249894083 nsecs, count: 600000",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            parse_output("funclatency-auto", &lines),
            (Some(600000), Some("uprobe.session".into()))
        );
        let bt: Vec<String> = [
            "@h: ",
            "[2K, 4K)           19828 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|",
            "[4K, 8K)             172 |                                                    |",
            "@s[12]: 5",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(parse_output("bpftrace", &bt), (Some(20000), None));
        assert_eq!(parse_output("bcc", &[]), (None, None));
    }

    #[test]
    fn one_failure_is_not_fatal_a_wrong_count_is() {
        let ok = json!({"part": "p", "tool": "t", "ns_per_call": 1.0, "ready_s": 1.0});
        let hang = json!({"part": "p", "tool": "t", "error": "hung"});
        let wrong = json!({"part": "p", "tool": "t", "error": "x", "wrong_count": true});
        let slow = json!({"part": "p", "tool": "t", "ns_per_call": 1.0, "ready_s": 99.0});
        assert!(!skip(&[ok.clone(), hang.clone()], "p", "t"));
        assert!(skip(&[hang.clone(), ok.clone(), hang], "p", "t"));
        assert!(skip(&[ok.clone(), wrong], "p", "t"));
        assert!(!skip(&[slow.clone(), slow.clone()], "p", "t"));
        assert!(skip(&[slow.clone(), slow.clone(), slow], "p", "t"));
        assert!(!skip(&[ok], "p", "other"));
    }
}
