//! stackcount --pprof, read back by the real consumer, `go tool pprof`
//! (package golang-go): stacks of a uprobe with their exact counts, labels
//! and the binary's build ID; inlined calls as lines of one location; a CPU
//! profile's cpu values; a file per interval; an unwritable path refused
//! before tracing.

use std::path::Path;
use std::process::Command;

use crate::util::http::*;
use crate::util::pprof::*;
use crate::util::*;

const T: std::time::Duration = std::time::Duration::from_secs(120);

/// The GNU build ID of `bin`, as `readelf -n` prints it.
fn build_id(bin: &Path) -> String {
    let out = Command::new("readelf").arg("-n").arg(bin).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build ID in {}:\n{text}", bin.display()))
        .to_string()
}

/// The profile's duration in ms, from `-top`'s `Duration: 999.87ms, ...` or
/// `Duration: 1.01s, ...`.
fn duration_ms(top: &str) -> f64 {
    let d = top
        .lines()
        .find_map(|l| l.strip_prefix("Duration: "))
        .and_then(|l| l.split(',').next())
        .unwrap_or_else(|| panic!("no duration:\n{top}"));
    match d.strip_suffix("ms") {
        Some(ms) => ms.parse().unwrap(),
        None => d.trim_end_matches('s').parse::<f64>().unwrap() * 1000.0,
    }
}

/// `stackcount -U --pprof F -p PID [extra] BIN:tk_leaf` over tests/progs/twopaths.c:
/// the scratch directory, the binary, the profile, the PID, the tool's output.
/// `BIN` in an `extra` argument is the binary's path (another pattern of it).
fn leaf_profile(extra: &[&str]) -> (Scratch, std::path::PathBuf, std::path::PathBuf, u32, Output) {
    let dir = Scratch::new();
    let bin = build_c(&dir, "twopaths");
    let file = dir.0.join("leaf.pb.gz");
    let spec = format!("{}:tk_leaf", bin.display());
    let p = CProg::start(&bin);
    let pid = p.pid;
    let pid_arg = pid.to_string();
    let extra: Vec<String> = extra
        .iter()
        .map(|a| a.replace("BIN", bin.to_str().unwrap()))
        .collect();
    let mut args = vec!["-U", "--pprof", file.to_str().unwrap(), "-p", &pid_arg];
    args.extend(extra.iter().map(String::as_str));
    args.push(&spec);
    let mut t = spawn(&tool("stackcount"), &args);
    t.wait_line(
        |l| l.starts_with("Tracing"),
        std::time::Duration::from_secs(60),
    );
    let out = t.finish_after(p, std::time::Duration::from_secs(120));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    (dir, bin, file, pid, out)
}

#[test]
fn pprof_profile_of_a_uprobe_reads_back_in_go_tool_pprof() {
    // tk_leaf is called 300 times through tk_path_a and 700 through tk_path_b:
    // go tool pprof must show exactly those two stacks with those counts.
    let (_dir, bin, file, pid, out) = leaf_profile(&[]);
    let pid = pid.to_string();
    // The text output is as without --pprof.
    let printed = parse_stacks(&out.stdout);
    assert_eq!(printed.len(), 2, "{}", out.stdout);

    let text = go_pprof(&["-traces"], &file);
    let mut stacks = traces(&text);
    stacks.sort_by_key(|t| t.count);
    assert_eq!(stacks.len(), 2, "{text}");
    for (t, (count, via)) in stacks.iter().zip([(300, "tk_path_a"), (700, "tk_path_b")]) {
        assert_eq!(t.count, count, "{text}");
        assert_eq!(t.frames[..3], ["tk_leaf", via, "main"], "{text}");
        assert_eq!(
            t.frames.last().map(String::as_str),
            Some("_start"),
            "{text}"
        );
        let labels: Vec<(&str, &str)> = t
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            [("comm", "twopaths"), ("pid", pid.as_str())],
            "{text}"
        );
    }

    let top = go_pprof(&["-top"], &file);
    assert_contains(&top, "Type: samples");
    assert_contains(&top, "Total samples = 1000");
    assert!(
        top.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["1000", "100%", "100%", "1000", "100%", "tk_leaf"]),
        "{top}"
    );

    // The binary's mapping, with its build ID; every mapping says its
    // functions are named ([FN]).
    let raw = go_pprof(&["-raw"], &file);
    let mappings = raw.split("\nMappings\n").nth(1).expect("mappings");
    let id = build_id(&bin);
    let mine = mappings
        .lines()
        .find(|l| l.contains(&format!(" {} ", bin.display())))
        .unwrap_or_else(|| panic!("no mapping of {}:\n{raw}", bin.display()));
    assert!(mine.contains(&format!(" {id} ")), "want {id}:\n{raw}");
    assert!(mappings.lines().all(|l| l.contains("[FN]")), "{raw}");
    // Built with -g: its frames have source files and lines ([FL][LN]).
    assert!(mine.ends_with("[FN][FL][LN]"), "{raw}");

    // Each frame at the line of the call it made (the leaf at its probe, the
    // entry's line): where the return address is, less one.
    let text = go_pprof(&["-traces", "-lines"], &file);
    let mut stacks = traces(&text);
    stacks.sort_by_key(|t| t.count);
    let at = |func: &str, text: &str, nth: usize| {
        format!("{func} {}:{}", twopaths(), line_of(text, nth))
    };
    let leaf = at("tk_leaf", "return x * 3 + 1;", 0);
    assert_eq!(
        stacks[0].frames[..3],
        [
            leaf.clone(),
            at("tk_path_a", "long r = tk_leaf(x);", 0),
            at("main", "sink += tk_path_a(i);", 0)
        ],
        "{text}"
    );
    // Debian's libc, by the DWARF of its debug file (libc6-dbg).
    assert!(
        stacks[0]
            .frames
            .iter()
            .any(|f| f.starts_with("__libc_start_main ") && f.contains("csu/libc-start.c:")),
        "{text}"
    );
    // Without --inline, tk_path_b's line is that of its call of tk_inlined.
    assert_eq!(
        stacks[1].frames[..3],
        [
            leaf,
            at("tk_path_b", "long r = tk_inlined(x);", 0),
            at("main", "sink += tk_path_b(i);", 0)
        ],
        "{text}"
    );
}

/// tests/progs/twopaths.c, as its DWARF names it.
fn twopaths() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/progs/twopaths.c")
        .display()
        .to_string()
}

/// The line number of the `nth` line of tests/progs/twopaths.c holding `text`.
fn line_of(text: &str, nth: usize) -> usize {
    let src = std::fs::read_to_string(twopaths()).unwrap();
    let mut lines = src.lines().enumerate().filter(|(_, l)| l.contains(text));
    lines
        .nth(nth)
        .unwrap_or_else(|| panic!("no {text:?} in twopaths.c"))
        .0
        + 1
}

#[test]
fn pprof_inlined_calls_are_lines_of_one_location() {
    // With --inline, tk_path_b's call of tk_leaf is in tk_inlined, inlined
    // there: one location of two lines, innermost first, which go tool pprof
    // shows as "tk_inlined (inline)" above tk_path_b.
    let (_dir, _bin, file, _pid, out) = leaf_profile(&["--inline"]);
    assert_contains(&out.stdout, "  tk_inlined (inlined)\n  tk_path_b\n");
    let text = go_pprof(&["-traces"], &file);
    let b = traces(&text)
        .into_iter()
        .find(|t| t.count == 700)
        .unwrap_or_else(|| panic!("no stack of 700:\n{text}"));
    assert_eq!(
        b.frames[..4],
        ["tk_leaf", "tk_inlined (inline)", "tk_path_b", "main"],
        "{text}"
    );
    // Each line at its own place: tk_inlined's call of tk_leaf, and
    // tk_path_b's of tk_inlined.
    let raw = go_pprof(&["-raw"], &file);
    let inner = format!(
        " tk_inlined {}:{} s=0",
        twopaths(),
        line_of("long r = tk_leaf(x);", 1)
    );
    let outer = format!(
        "tk_path_b {}:{} s=0",
        twopaths(),
        line_of("long r = tk_inlined(x);", 0)
    );
    assert!(
        raw.lines()
            .zip(raw.lines().skip(1))
            .any(|(a, b)| a.ends_with(&inner) && b.trim() == outer),
        "want {inner:?} then {outer:?}:\n{raw}"
    );
    assert_contains(&raw, "[FN][FL][LN][IN]");
}

#[test]
fn pprof_cpu_profile_counts_nanoseconds_of_each_sample() {
    // 2 s of CPU at 99 Hz: the cpu sample type is the count times the period,
    // 10101010 ns, sample by sample.
    let dir = Scratch::new();
    let bin = crate::sampling::build_sampled(&dir);
    let file = dir.0.join("cpu.pb.gz");
    let out = trace_cprog(
        &tool("stackcount"),
        &bin,
        &["burn", "2000"],
        &["--pprof", file.to_str().unwrap(), "profile:hz:99"],
        |l| l.starts_with("Tracing"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let raw = go_pprof(&["-raw"], &file);
    assert_starts_with(&raw, "PeriodType: cpu nanoseconds\nPeriod: 10101010\n");
    let samples = raw
        .split("\nSamples:\nsamples/count cpu/nanoseconds\n")
        .nth(1)
        .and_then(|s| s.split("\nLocations\n").next())
        .unwrap_or_else(|| panic!("no samples of two types:\n{raw}"));
    let (mut count, mut cpu) = (0u64, 0u64);
    for line in samples.lines().filter(|l| l.contains(": ")) {
        let values: Vec<u64> = line
            .split(':')
            .next()
            .unwrap()
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(values.len(), 2, "{line}");
        assert_eq!(values[1], values[0] * 10_101_010, "{line}");
        count += values[0];
        cpu += values[1];
    }
    assert!((178..=218).contains(&count), "{count} samples:\n{raw}");
    assert_eq!(cpu, count * 10_101_010);
    // The same samples as printed.
    let printed: u64 = parse_stacks(&out.stdout).iter().map(|s| s.1).sum();
    assert_eq!(printed, count, "{}", out.stdout);
    // tk_burn is where the CPU went (at least 95% of it, as the text test).
    let top = go_pprof(&["-top", "-sample_index=cpu"], &file);
    assert_contains(&top, "Type: cpu");
    let burn = top
        .lines()
        .find(|l| l.trim_end().ends_with(" tk_burn"))
        .unwrap_or_else(|| panic!("no tk_burn:\n{top}"));
    let cum: f64 = burn
        .split_whitespace()
        .nth(4)
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap();
    assert!(cum >= 95.0, "{top}");
}

#[test]
fn pprof_writes_one_file_per_interval() {
    // -i 1 -D 3: out.1.pb.gz, out.2.pb.gz, out.3.pb.gz, each a profile of
    // about one second; no out.pb.gz.
    let dir = Scratch::new();
    let file = dir.0.join("out.pb.gz");
    let out = run(
        &tool("stackcount"),
        &[
            "-K",
            "-i",
            "1",
            "-D",
            "3",
            "--pprof",
            file.to_str().unwrap(),
            "t:sched:sched_switch",
        ],
        std::time::Duration::from_secs(60),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let mut names: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["out.1.pb.gz", "out.2.pb.gz", "out.3.pb.gz"]);
    for n in &names {
        let top = go_pprof(&["-top"], &dir.0.join(n));
        assert_contains(&top, "File: [kernel.kallsyms]");
        assert_contains(&top, "schedule");
        let ms = duration_ms(&top);
        assert!((900.0..=1100.0).contains(&ms), "{n}: {ms} ms\n{top}");
    }
}

#[test]
fn pprof_to_an_unwritable_path_fails_before_tracing() {
    let dir = Scratch::new();
    let file = dir.0.join("no/such/dir/x.pb.gz");
    fails_with(
        &tool("stackcount"),
        &[
            "-D",
            "30",
            "--pprof",
            file.to_str().unwrap(),
            "t:sched:sched_switch",
        ],
        &format!(
            "cannot create {} for --pprof: No such file or directory (os error 2); give a \
             path in a writable directory",
            file.display()
        ),
    );
    // With -i, the first interval's file is the one tried.
    let file = dir.0.join("no/such/dir/x.pb.gz");
    fails_with(
        &tool("stackcount"),
        &[
            "-i",
            "1",
            "--pprof",
            file.to_str().unwrap(),
            "t:sched:sched_switch",
        ],
        &format!(
            "cannot create {} for --pprof: No such file or directory (os error 2); give a \
             path in a writable directory",
            dir.0.join("no/such/dir/x.1.pb.gz").display()
        ),
    );
}

#[test]
fn the_profile_endpoint_answers_go_tool_pprof_with_the_window_s_stacks() {
    // `go tool pprof http://.../debug/pprof/profile?seconds=4`, as Pyroscope's
    // and Parca's scrapers ask: the 1,000 calls made inside the window, as
    // exactly the two stacks of 300 and 700.
    let dir = Scratch::new();
    let bin = build_c(&dir, "twopaths");
    let spec = format!("{}:tk_leaf", bin.display());
    let mut p = CProg::start(&bin);
    let pid = p.pid.to_string();
    let s = Served::start(
        "stackcount",
        &["-U", "-p", &pid, "--listen", "127.0.0.1:0", &spec],
    );
    let url = format!("http://{}/debug/pprof/profile?seconds=4", s.local());
    let fetch = Command::new("go")
        .args(["tool", "pprof", "-traces", &url])
        .env("PPROF_TMPDIR", &dir.0)
        .env("HOME", &dir.0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running go tool pprof (package golang-go)");
    // The window opens as the request arrives; the calls come well inside it.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    p.go();
    let fetched = fetch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&fetched.stdout).into_owned();
    assert!(
        fetched.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    let mut stacks = traces(&text);
    stacks.sort_by_key(|t| t.count);
    assert_eq!(stacks.len(), 2, "{text}");
    for (t, (count, via)) in stacks.iter().zip([(300, "tk_path_a"), (700, "tk_path_b")]) {
        assert_eq!(t.count, count, "{text}");
        assert_eq!(t.frames[..3], ["tk_leaf", via, "main"], "{text}");
    }
    // twopaths exited after its calls, and the run ended with it (-p): the
    // window open then was answered with what was counted until the end.
    let out = s.run.finish(std::time::Duration::from_secs(60));
    assert!(p.wait().success());
    assert_eq!(out.code(), 0, "{}", out.stderr);
}

/// `tool -p PID --listen 127.0.0.1:0 t:syscalls:sys_enter_getrandom` over a
/// workload that makes 3 getrandom() calls when told, and exits when told again.
fn getrandom_served(tool: &str) -> (Workload, Served) {
    let w = Workload::start(&prog("random"), &["getrandom", "3", "8", "--hold"]);
    let pid = w.pid.to_string();
    let s = Served::start(
        tool,
        &[
            "-p",
            &pid,
            "--listen",
            "127.0.0.1:0",
            "t:syscalls:sys_enter_getrandom",
        ],
    );
    (w, s)
}

#[test]
fn bad_or_too_many_profile_requests_are_refused_and_tracing_goes_on() {
    let (w, s) = getrandom_served("stackcount");
    for q in ["-1", "0", "301", "99999", "abc", "1.5", "", "4294967297"] {
        let (status, body) = s.get(&format!("/debug/pprof/profile?seconds={q}"));
        assert_eq!(status, 400, "seconds={q}: {body}");
    }
    let (status, _) = s.post("/debug/pprof/profile");
    assert_eq!(status, 405);
    // Four windows at once; a fifth is refused, and the loop keeps answering.
    let addr = s.local();
    let open: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                write!(
                    c,
                    "GET /debug/pprof/profile?seconds=3 HTTP/1.1\r\nHost: localhost\r\n\r\n"
                )
                .unwrap();
                let mut all = Vec::new();
                c.read_to_end(&mut all).unwrap();
                String::from_utf8_lossy(&all[..12]).into_owned()
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(s.get("/debug/pprof/profile?seconds=1").0, 503);
    let t = std::time::Instant::now();
    assert_eq!(s.get("/metrics").0, 200);
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    // The workload's three calls, counted while the windows were open.
    w.go();
    for o in open {
        assert_eq!(o.join().unwrap(), "HTTP/1.1 200");
    }
    let out = s.stop(std::time::Duration::from_secs(60));
    w.go();
    assert!(w.wait().success());
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let stacks = parse_stacks(&out.stdout);
    assert_eq!(stacks.iter().map(|s| s.1).sum::<u64>(), 3, "{}", out.stdout);
}

#[test]
fn tools_without_stacks_have_no_profile_endpoint() {
    let (w, s) = getrandom_served("funccount");
    assert_eq!(s.get("/debug/pprof/profile?seconds=1").0, 404);
    w.go();
    s.stop(std::time::Duration::from_secs(60));
    w.go();
    assert!(w.wait().success());
}

#[test]
fn pprof_samples_of_a_run_of_several_probes_are_labelled_with_their_probe() {
    // tk_leaf (300 through tk_path_a, 700 through tk_path_b) and tk_path_a
    // (300) in one run: three stacks, each labelled with the probe that took
    // it, whether the uprobes are one uprobe_multi link or single uprobes in
    // tracefs groups (whose cookie names the group, not the function).
    for mode in ["multi", "single"] {
        let (_dir, _bin, file, _pid, out) = leaf_profile(&["--attach-mode", mode, "BIN:tk_path_a"]);
        // Text output is as without --pprof: the same three stacks.
        assert_eq!(parse_stacks(&out.stdout).len(), 3, "{mode}: {}", out.stdout);
        let text = go_pprof(&["-traces"], &file);
        let want = probe_stacks(&[
            ("tk_leaf", 300, "tk_path_a"),
            ("tk_leaf", 700, "tk_path_b"),
            ("tk_path_a", 300, "main"),
        ]);
        assert_eq!(by_probe(&text, 1), want, "{mode}: {text}");
    }
}

#[test]
fn pprof_samples_of_tracepoints_are_labelled_with_their_tracepoint() {
    // 345 renames: each fires task:task_rename and enters prctl. The
    // tracepoint is a raw link with a cookie, or (before 6.10, forced the
    // second time) a perf event, which carries one; the syscall event goes
    // through the raw sys_enter link, whose probe is looked up by number.
    let _lock = rename_event_lock(false);
    for (env, mechanisms) in [
        (
            "TRACEKIT_NO_RAW_TP_COOKIE=0",
            "tracepoints: 1 as raw tracepoint links, 1 syscall events through 1 raw sys_enter/sys_exit link, 0 as perf events",
        ),
        (
            "TRACEKIT_NO_RAW_TP_COOKIE=1",
            "tracepoints: 0 as raw tracepoint links, 1 syscall events through 1 raw sys_enter/sys_exit link, 1 as perf events",
        ),
    ] {
        let dir = Scratch::new();
        let file = dir.0.join("tp.pb.gz");
        let w = Workload::start(&prog("workload"), &["rename", "345"]);
        let tool = tool("stackcount");
        let args = [
            "--debug",
            "-K",
            "--pprof",
            file.to_str().unwrap(),
            "t:task:task_rename",
            "t:syscalls:sys_enter_prctl",
        ];
        let out = trace_workload_via(&["env", env, tool.to_str().unwrap()], w, &args, T);
        assert_eq!(tracepoint_mechanisms(&out.stderr), mechanisms, "{env}");
        let text = go_pprof(&["-tags"], &file);
        // " probe: Total 690.0", then "   345.0 (50.00%): NAME" per value.
        let probes: Vec<(f64, &str)> = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("probe:"))
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .filter_map(|l| {
                let (n, name) = l.trim().split_once(' ')?;
                Some((n.parse().ok()?, name.rsplit_once("): ")?.1))
            })
            .collect();
        assert_eq!(
            probes,
            [
                (345.0, "syscalls:sys_enter_prctl"),
                (345.0, "task:task_rename")
            ],
            "{env}: {text}"
        );
    }
}
