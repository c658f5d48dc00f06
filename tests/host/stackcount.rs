//! stackcount on the host kernel: user stacks of a program with known call paths,
//! folded output, flame graph SVG, a process that exits before the summary, and
//! kernel stacks at a tracepoint. Kernel-function stacks: tests/guest/stackcount.rs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::util::*;

const T: Duration = Duration::from_secs(60);
const N: u64 = 1000;
const M: u64 = 400;

fn stackcount() -> PathBuf {
    tool("stackcount")
}

/// Runs stackcount `args` + `BIN:tk_target` on a private copy of the stacks program
/// (calls N via tk_a, M via tk_b/tk_c), stopping it with SIGINT after the calls.
fn run_on_target(extra: &[&str]) -> (Output, PathBuf, Scratch) {
    run_on_target_then(extra, |_, _| {})
}

/// [`run_on_target`], calling `attached(dir, bin)` once stackcount is attached,
/// before the calls.
fn run_on_target_then(
    extra: &[&str],
    attached: impl FnOnce(&Scratch, &Path),
) -> (Output, PathBuf, Scratch) {
    let dir = Scratch::new();
    let bin = dir.copy(&prog("stacks"));
    let w = Workload::start(&bin, &[&N.to_string(), &M.to_string(), "--hold"]);
    let spec = format!("{}:tk_target", bin.display());
    let mut args: Vec<&str> = extra.to_vec();
    args.push(&spec);
    let mut t = spawn(&stackcount(), &args);
    if extra.contains(&"-f") {
        // No status line in folded mode: give attaching time to finish.
        std::thread::sleep(Duration::from_secs(2));
    } else {
        t.wait_ready();
    }
    attached(&dir, &bin);
    w.go();
    std::thread::sleep(Duration::from_millis(300));
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    w.go();
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    (out, bin, dir)
}

/// The frames below `main`: glibc's start code, whatever this libc calls it
/// (with --inline, also its call_init, inlined into __libc_start_main).
fn libc_start(frames: &[String]) -> Vec<String> {
    let i = frames.iter().position(|f| f == "main").expect("main frame");
    let rest = frames[i + 1..].to_vec();
    assert!(
        rest.iter()
            .all(|f| f.starts_with("__libc_start") || f == "_start" || f == "call_init (inlined)"),
        "frames below main are not libc start code: {rest:?}"
    );
    rest
}

/// Asserts that `stdout` holds exactly the stacks program's two stacks (as
/// --inline shows them, with `inline`), below whatever this libc calls its start.
fn assert_the_two_stacks(stdout: &str, inline: bool) {
    let stacks = parse_stacks(stdout);
    assert_eq!(stacks.len(), 2, "{stdout}");
    let libc = libc_start(&stacks[0].0);
    assert_eq!(stacks, expected_stacks(&libc, inline), "{stdout}");
}

/// The two stacks of the stacks program; `inline`: with `--inline`, which shows
/// the call inlined into tk_c.
fn expected_stacks(libc: &[String], inline: bool) -> Vec<(Vec<String>, u64)> {
    let with = |v: &[&str]| -> Vec<String> {
        v.iter()
            .map(|s| s.to_string())
            .chain(libc.iter().cloned())
            .collect()
    };
    vec![
        (
            with(if inline {
                &[
                    "tk_target",
                    "stacks::via_helper (inlined)",
                    "tk_c",
                    "tk_b",
                    "main",
                ]
            } else {
                &["tk_target", "tk_c", "tk_b", "main"]
            }),
            M,
        ),
        (with(&["tk_target", "tk_a", "main"]), N),
    ]
}

#[test]
fn user_stacks_with_exact_counts_and_names() {
    let (out, _bin, _dir) = run_on_target(&[]);
    assert_the_two_stacks(&out.stdout, false);
    // BCC's banner says "functions" even for one.
    assert!(out.stdout.starts_with("Tracing 1 functions for \""));
    assert!(out.stdout.ends_with("Detaching...\n"));
}

#[test]
fn inlined_frames_on_request() {
    let (out, _bin, _dir) = run_on_target(&["--inline"]);
    assert_the_two_stacks(&out.stdout, true);
}

#[test]
fn folded_output_is_exact() {
    let (out, _bin, _dir) = run_on_target(&["-f"]);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    // Outermost first, led by the process name even without -P (BCC leaves that
    // field empty, which gives flame graphs an empty root frame).
    let libc: Vec<String> = lines[0]
        .strip_prefix("stacks;")
        .unwrap_or_else(|| panic!("no process name first: {}", out.stdout))
        .split(';')
        .take_while(|f| *f != "main")
        .map(str::to_string)
        .collect();
    let outer = libc.iter().rev().cloned().collect::<Vec<_>>();
    libc_start(&[vec!["main".to_string()], outer.clone()].concat());
    let prefix: String = libc.iter().map(|f| format!(";{f}")).collect();
    assert_eq!(
        lines,
        vec![
            format!("stacks{prefix};main;tk_b;tk_c;tk_target {M}"),
            format!("stacks{prefix};main;tk_a;tk_target {N}"),
        ]
    );
}

#[test]
fn svg_flame_graph_has_both_paths() {
    let dir = Scratch::new();
    let svg = dir.0.join("out.svg");
    let (out, _bin, _d) = run_on_target(&["--svg", svg.to_str().unwrap()]);
    assert_eq!(parse_stacks(&out.stdout).len(), 2);
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(
        text.starts_with("<?xml") && text.contains("<svg"),
        "not an SVG"
    );
    // inferno writes counts with thousands separators.
    let n = |v: u64| {
        let s = v.to_string();
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    };
    for frame in [
        format!("<title>tk_a ({} events", n(N)),
        format!("<title>tk_b ({} events", n(M)),
        format!("<title>tk_c ({} events", n(M)),
        format!("<title>main ({} events", n(N + M)),
        format!("<title>stacks ({} events", n(N + M)),
    ] {
        assert!(text.contains(&frame), "SVG lacks {frame:?}");
    }
    assert!(!text.contains("<title> ("), "empty root frame in the SVG");
    assert!(
        !text.contains("via_helper"),
        "inlined frames are off by default"
    );
}

#[test]
fn names_survive_the_process_exiting_first() {
    // With -p, stackcount ends when the process exits, and prints after that.
    let w = Workload::start(&prog("stacks"), &[&N.to_string(), &M.to_string()]);
    let spec = format!("{}:tk_target", prog("stacks").display());
    let out = trace_workload(&stackcount(), w, &[&spec], T);
    assert_the_two_stacks(&out.stdout, false);
}

#[test]
fn offsets_and_addresses() {
    let (out, _bin, _dir) = run_on_target(&["-s", "-v", "-P"]);
    let frames: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .collect();
    assert!(!frames.is_empty());
    for f in frames {
        // "  ADDR SYMBOL+0xOFF" (inlined frames carry no offset)
        let mut parts = f.trim_start().splitn(2, ' ');
        let addr = parts.next().unwrap();
        let sym = parts.next().unwrap().trim_start();
        assert!(u64::from_str_radix(addr, 16).is_ok(), "{f}");
        assert!(sym.contains("+0x") || sym.ends_with("(inlined)"), "{f}");
    }
    // -P: "comm [pid]" above each count.
    assert_eq!(
        out.stdout.matches("    stacks [").count(),
        2,
        "{}",
        out.stdout
    );
}

/// stackcount `args` with `env` (`VAR=value`) on `workload WARGS`.
fn stacks_with_env(env: &str, wargs: &[&str], args: &[&str]) -> Output {
    let tool = stackcount();
    let w = Workload::start(&prog("workload"), wargs);
    trace_workload_via(&["env", env, tool.to_str().unwrap()], w, args, T)
}

#[test]
fn kernel_stacks_at_syscall_events() {
    // Syscall events, entry and exit, are served by one raw link each on the
    // kernel's sys_enter and sys_exit tracepoints, with kernel reads (the
    // number at the exit read from the registers) and without (remembered from
    // the entry). Each of the 333 calls is counted once at each, and the
    // stacks begin where the tracepoint fired, not in the BPF program or the
    // kernel's perf code.
    let getppid = ["--debug", "-K", "-r", "t:syscalls:sys_e(nter|xit)_getppid"];
    for env in ["TRACEKIT_NO_KERNEL_READS=0", "TRACEKIT_NO_KERNEL_READS=1"] {
        let out = stacks_with_env(env, &["getppid", "333"], &getppid);
        assert_eq!(
            tracepoint_mechanisms(&out.stderr),
            "tracepoints: 0 as raw tracepoint links, 2 syscall events through 2 raw sys_enter/sys_exit links, 0 as perf events",
            "{env}"
        );
        let stacks = parse_stacks(&out.stdout);
        assert_eq!(stacks.len(), 2, "{env}: {}", out.stdout);
        let names = kernel_symbols();
        for (frames, count) in &stacks {
            assert_eq!(*count, 333, "{env}: {frames:?}");
            // Every frame is a real kernel symbol, and the syscall entry path is there.
            for f in frames {
                assert!(names.contains(f), "{f} is not a kernel symbol");
            }
            assert!(frames.iter().any(|f| f == "do_syscall_64"), "{frames:?}");
        }
        // The functions that fire sys_enter and sys_exit (kernel/entry/common.c).
        let mut first: Vec<&str> = stacks.iter().map(|(f, _)| f[0].as_str()).collect();
        first.sort();
        assert_eq!(first, ["syscall_exit_work", "syscall_trace_enter"], "{env}");
    }
    // Perf events on request: counted as exactly.
    let out = stacks_with_env("TRACEKIT_PERF_SYSCALLS=1", &["getppid", "333"], &getppid);
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        "tracepoints: 0 as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 2 as perf events",
    );
    let counts: Vec<u64> = parse_stacks(&out.stdout).iter().map(|s| s.1).collect();
    assert_eq!(counts, [333, 333], "{}", out.stdout);
}

#[test]
fn kernel_stacks_at_a_raw_tracepoint_begin_where_it_fired() {
    // A tracepoint is a raw link, with a cookie or (before 6.10, forced here
    // the second time) without: stackcount's program serves every tracepoint
    // alike. Its kernel stack, taken inside the BPF program that
    // bpf_trace_run2 runs, is shown from the function that fired the
    // tracepoint, as a perf event's is.
    // A raw link is expected: raw_tracepoint_counted_exactly, which runs in this
    // binary too, must not add its event named task_rename meanwhile.
    let _lock = rename_event_lock(false);
    for env in ["TRACEKIT_NO_RAW_TP_COOKIE=0", "TRACEKIT_NO_RAW_TP_COOKIE=1"] {
        let args = ["--debug", "-K", "t:task:task_rename"];
        let out = stacks_with_env(env, &["rename", "345"], &args);
        let frames = rename_stack(&out, 345);
        assert!(frames.iter().any(|f| f == "do_syscall_64"), "{frames:?}");
    }
}

#[test]
fn json_output_parses() {
    let (out, _bin, _dir) = run_on_target(&["--json"]);
    let last: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["final"], true);
    let stacks = last["stacks"].as_array().unwrap();
    let counts: Vec<u64> = stacks
        .iter()
        .map(|s| s["count"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, vec![M, N]);
    assert_eq!(stacks[1]["user"][1]["symbol"], "tk_a");
    assert_eq!(last["lost"]["user_stacks"], 0);
    // Without -v and -s, no address or offset (stacks are merged on names).
    let frame = stacks[1]["user"][1].as_object().unwrap();
    assert!(
        !frame.contains_key("addr") && !frame.contains_key("offset"),
        "{frame:?}"
    );
    // With them, real ones.
    let (out, _bin, _dir) = run_on_target(&["--json", "-v", "-s"]);
    let last: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    let stacks = last["stacks"].as_array().unwrap();
    let frame = &stacks[1]["user"][1];
    assert_eq!(frame["symbol"], "tk_a");
    assert!(frame["addr"].as_str().unwrap() != "0x0", "{frame}");
    assert!(frame["offset"].as_u64().unwrap() > 0, "{frame}");
}

#[test]
fn kernel_and_user_only_exclude_each_other() {
    let out = run(&stackcount(), &["-K", "-U", "t:sched:sched_switch"], T);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert_contains(&out.stderr, "cannot be used with");
}

/// Compiles tests/progs/leaf.c with the system gcc into `dir`.
pub(crate) fn build_leaf(dir: &Scratch) -> PathBuf {
    gcc(
        dir,
        "leaf",
        "leaf",
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    )
}

#[test]
fn caller_of_a_frameless_leaf_at_its_entry() {
    // At tk_leaf's entry its caller's return address is only at the stack
    // pointer: a frame-pointer walk alone folds the stack to main;tk_leaf.
    let dir = Scratch::new();
    let bin = build_leaf(&dir);
    let w = Workload::start(&bin, &["500"]);
    let spec = format!("{}:tk_leaf", bin.display());
    let out = trace_workload(&stackcount(), w, &["-U", &spec], T);
    let stacks = parse_stacks(&out.stdout);
    assert_eq!(stacks.len(), 1, "{}", out.stdout);
    let (frames, count) = &stacks[0];
    assert_eq!(*count, 500);
    let libc = libc_start(frames);
    let mut want: Vec<String> = ["tk_leaf", "via_one", "main"].map(String::from).to_vec();
    want.extend(libc);
    assert_eq!(frames, &want, "{}", out.stdout);
}

#[test]
fn delimiter_in_every_stack() {
    // BCC prints `--` in every entry with -d, even when one side is empty (here
    // the kernel side: user probes have no kernel stack), and `-` when folded.
    let (out, _bin, _dir) = run_on_target(&["-d"]);
    let entries = out
        .stdout
        .split("\n\n")
        .filter(|e| e.contains("  tk_target\n"));
    let mut n = 0;
    for e in entries {
        assert!(e.starts_with("    --\n  tk_target\n"), "{e:?}");
        n += 1;
    }
    assert_eq!(n, 2, "{}", out.stdout);
    let (out, _bin, _dir) = run_on_target(&["-f", "-d"]);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    for l in lines {
        assert!(
            l.starts_with("stacks;") && l.contains(";tk_target;- "),
            "{l}"
        );
    }
}

#[test]
fn bad_flags_fail_before_tracing() {
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let last: u32 = possible.trim().rsplit('-').next().unwrap().parse().unwrap();
    let cpu = (last + 1).to_string();
    fails_with(
        &stackcount(),
        &["-c", &cpu, "t:sched:sched_switch"],
        &format!("no CPU {cpu} (this machine has CPUs 0-{last})"),
    );
    // A CPU number that is not one (u32::MAX used to mean "all CPUs").
    let out = run(
        &stackcount(),
        &["-c", "4294967295", "t:sched:sched_switch"],
        T,
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert_contains(&out.stderr, "'4294967295' is not a CPU number");
    let out = run(
        &stackcount(),
        &["--stack-storage-size", "0", "t:sched:sched_switch"],
        T,
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert_contains(&out.stderr, "--stack-storage-size");
    // An unwritable SVG path fails at once, not after the trace.
    let dir = Scratch::new();
    let svg = dir.0.join("no/such/dir/x.svg");
    fails_with(
        &stackcount(),
        &[
            "-D",
            "30",
            "--svg",
            svg.to_str().unwrap(),
            "t:sched:sched_switch",
        ],
        &format!(
            "creating {}: No such file or directory (os error 2)",
            svg.display()
        ),
    );
    // funccount's habit: -d is the delimiter here, the duration is -D.
    fails_with(
        &stackcount(),
        &["-d", "5", "t:sched:sched_switch"],
        "'5' is not a PATTERN: -d is --delimited here; the duration is -D SECS (as in BCC's stackcount)",
    );
}

/// Stacks of the workload's `libc` mode (malloc N, read 3N times through libc).
fn libc_stacks(args: &[&str], n: u64) -> Vec<(Vec<String>, u64)> {
    let w = Workload::start(&prog("workload"), &["libc", &n.to_string()]);
    let out = trace_workload(&stackcount(), w, args, T);
    parse_stacks(&out.stdout)
}

#[test]
fn libc_frames_are_named_as_bcc_names_them() {
    // At the entry of libc's malloc (a uprobe): the leaf frame is `malloc`, not the
    // debug file's __GI___libc_malloc.
    let stacks = libc_stacks(&["-U", "c:malloc"], 300);
    assert!(!stacks.is_empty());
    for (frames, _) in &stacks {
        assert_eq!(frames[0], "malloc", "{frames:?}");
    }
    assert_eq!(stacks.iter().map(|s| s.1).sum::<u64>(), 300, "{stacks:?}");
    // Inside libc's read (the syscall instruction): `read`, not __GI___libc_read.
    let stacks = libc_stacks(&["-U", "t:syscalls:sys_enter_read"], 200);
    assert!(!stacks.is_empty());
    for (frames, _) in &stacks {
        assert_eq!(frames[0], "read", "{frames:?}");
    }
    assert_eq!(stacks.iter().map(|s| s.1).sum::<u64>(), 600, "{stacks:?}");
}

#[test]
fn too_few_file_descriptors_fail_before_attaching() {
    // Without this check stackcount attached what fit, traced, and then died at
    // the summary for want of descriptors to symbolize with, losing every stack.
    refused_for_want_of_descriptors(&stackcount(), "-D 5 't:sched:*'");
}

#[test]
fn process_names_cannot_break_lines_or_add_frames() {
    // The workload names itself `a;b\nc\x1b[1m`: raw, its folded line broke in
    // two and the `;` added a frame; its -P line printed the newline and the
    // escape sequence.
    let w = Workload::start(&prog("workload"), &["oddname", "7", "--hold"]);
    let pid = w.pid.to_string();
    let t = spawn(
        &stackcount(),
        &["-f", "-K", "-p", &pid, "t:syscalls:sys_enter_getppid"],
    );
    // No status line in folded mode: give attaching time to finish.
    std::thread::sleep(Duration::from_secs(2));
    w.go();
    std::thread::sleep(Duration::from_millis(300));
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    w.go();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.stdout);
    assert!(
        lines[0].starts_with(r"a\x3bb\x0ac\x1b[1m;") && lines[0].ends_with(" 7"),
        "{}",
        out.stdout
    );
    // The comm line of -P (without -p, as BCC prints it).
    let w = Workload::start(&prog("workload"), &["oddname", "7", "--hold"]);
    let pid = w.pid;
    let mut t = spawn(&stackcount(), &["-P", "-K", "t:syscalls:sys_enter_getppid"]);
    t.wait_ready();
    w.go();
    std::thread::sleep(Duration::from_millis(300));
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    w.go();
    assert_contains(&out.stdout, &format!("    a;b\\x0ac\\x1b[1m [{pid}]\n"));
}

#[test]
fn names_come_from_the_file_the_process_runs() {
    // The traced binary is replaced at its path while the process runs (as a
    // package upgrade does): its frames are named from the file it runs, read
    // through /proc/PID/map_files, not from the new file at the path (whose
    // names were given to the old addresses).
    let (out, _bin, _dir) = run_on_target_then(&[], |dir, bin| {
        std::fs::rename(dir.copy(&prog("workload")), bin).unwrap();
    });
    assert_the_two_stacks(&out.stdout, false);
}

#[test]
fn callers_whose_call_never_returns_are_named_at_their_call() {
    // main calls tk_last_call, which calls tk_end, which exits: neither call
    // returns, so each is its function's last instruction, and its return
    // address is past the function (tk_last_call's is tk_next's first byte).
    // A caller is named at its call, as debuggers name it; its offset is
    // still the return address's (tk_last_call+0xd: its size).
    let dir = Scratch::new();
    let bin = build_c(&dir, "noreturn");
    let spec = format!("{}:tk_end", bin.display());
    let out = trace_cprog(&stackcount(), &bin, &[], &["-U", &spec], |l| {
        l.starts_with("Tracing")
    });
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let stacks = parse_stacks(&out.stdout);
    assert_eq!(stacks.len(), 1, "{}", out.stdout);
    assert_eq!(
        stacks[0].0[..3],
        ["tk_end", "tk_last_call", "main"],
        "{}",
        out.stdout
    );
    // trace -U names build-ID frames the same way, with the return address's
    // offset.
    let out = trace_cprog(&tool("trace"), &bin, &[], &["-U", &spec], |l| {
        l.starts_with("PID")
    });
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let size = {
        let nm = std::process::Command::new("nm")
            .args(["-S"])
            .arg(&bin)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&nm.stdout).into_owned();
        let line = text
            .lines()
            .find(|l| l.ends_with(" tk_last_call"))
            .unwrap_or_else(|| panic!("no tk_last_call in nm -S:\n{text}"))
            .to_string();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    let frames: Vec<&str> = out.stdout.lines().map(str::trim).collect();
    let at = frames
        .iter()
        .position(|l| l.starts_with("tk_end+0x0 "))
        .unwrap_or_else(|| panic!("no tk_end frame:\n{}", out.stdout));
    assert_eq!(
        frames[at + 1].split_whitespace().next(),
        Some(format!("tk_last_call+0x{size:x}").as_str()),
        "{}",
        out.stdout
    );
    assert!(frames[at + 2].starts_with("main+0x"), "{}", out.stdout);
}
