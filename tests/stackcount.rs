//! stackcount on the host kernel: user stacks of a program with known call paths,
//! folded output, flame graph SVG, a process that exits before the summary, and
//! kernel stacks at a tracepoint. Kernel-function stacks: tests/guest.rs.

mod util;

use std::path::PathBuf;
use std::time::Duration;

use util::*;

const T: Duration = Duration::from_secs(60);
const N: u64 = 1000;
const M: u64 = 400;

fn stackcount() -> PathBuf {
    tool("stackcount")
}

/// Runs stackcount `args` + `BIN:tk_target` on a private copy of the stacks program
/// (calls N via tk_a, M via tk_b/tk_c), stopping it with SIGINT after the calls.
fn run_on_target(extra: &[&str]) -> (Output, PathBuf, Scratch) {
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
    w.go();
    std::thread::sleep(Duration::from_millis(300));
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    w.go();
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    (out, bin, dir)
}

/// The frames below `main`: glibc's start code, whatever this libc calls it.
fn libc_start(frames: &[String]) -> Vec<String> {
    let i = frames.iter().position(|f| f == "main").expect("main frame");
    let rest = frames[i + 1..].to_vec();
    assert!(
        rest.iter()
            .all(|f| f.starts_with("__libc_start") || f == "_start"),
        "frames below main are not libc start code: {rest:?}"
    );
    rest
}

fn expected_stacks(libc: &[String]) -> Vec<(Vec<String>, u64)> {
    let with = |v: &[&str]| -> Vec<String> {
        v.iter()
            .map(|s| s.to_string())
            .chain(libc.iter().cloned())
            .collect()
    };
    vec![
        (
            with(&[
                "tk_target",
                "stacks::via_helper (inlined)",
                "tk_c",
                "tk_b",
                "main",
            ]),
            M,
        ),
        (with(&["tk_target", "tk_a", "main"]), N),
    ]
}

#[test]
fn user_stacks_with_exact_counts_and_names() {
    let (out, _bin, _dir) = run_on_target(&[]);
    let stacks = parse_stacks(&out.stdout);
    assert_eq!(stacks.len(), 2, "{}", out.stdout);
    let libc = libc_start(&stacks[0].0);
    assert_eq!(stacks, expected_stacks(&libc), "{}", out.stdout);
    assert!(out.stdout.starts_with("Tracing 1 function for \""));
    assert!(out.stdout.ends_with("Detaching...\n"));
}

#[test]
fn folded_output_is_exact() {
    let (out, _bin, _dir) = run_on_target(&["-f"]);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    // Outermost first; without -P the comm field is empty (BCC's format).
    let libc: Vec<String> = lines[0]
        .trim_start_matches(';')
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
            format!("{prefix};main;tk_b;tk_c;stacks::via_helper;tk_target {M}"),
            format!("{prefix};main;tk_a;tk_target {N}"),
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
        format!("<title>stacks::via_helper ({} events", n(M)),
        format!("<title>main ({} events", n(N + M)),
    ] {
        assert!(text.contains(&frame), "SVG lacks {frame:?}");
    }
    assert!(!text.contains("<title> ("), "empty root frame in the SVG");
}

#[test]
fn names_survive_the_process_exiting_first() {
    // With -p, stackcount ends when the process exits, and prints after that.
    let w = Workload::start(&prog("stacks"), &[&N.to_string(), &M.to_string()]);
    let spec = format!("{}:tk_target", prog("stacks").display());
    let out = trace_workload(&stackcount(), w, &[&spec], T);
    let stacks = parse_stacks(&out.stdout);
    assert_eq!(stacks.len(), 2, "{}", out.stdout);
    let libc = libc_start(&stacks[0].0);
    assert_eq!(stacks, expected_stacks(&libc), "{}", out.stdout);
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

#[test]
fn kernel_stacks_at_a_tracepoint() {
    let w = Workload::start(&prog("workload"), &["getppid", "333"]);
    let out = trace_workload(
        &stackcount(),
        w,
        &["--debug", "-K", "t:syscalls:sys_enter_getppid"],
        T,
    );
    // stackcount stays on perf-event tracepoints: a raw tracepoint's kernel stack
    // would start with BPF trampoline frames.
    assert!(
        out.stderr.contains(
            "tracepoints: 0 as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 1 as perf events\n"
        ),
        "{}",
        out.stderr
    );
    let stacks = parse_stacks(&out.stdout);
    assert_eq!(stacks.len(), 1, "{}", out.stdout);
    let (frames, count) = &stacks[0];
    assert_eq!(*count, 333);
    // Every frame is a real kernel symbol, and the syscall entry path is there.
    let names = kernel_symbols();
    for f in frames {
        assert!(names.contains(f), "{f} is not a kernel symbol");
    }
    assert!(frames.iter().any(|f| f == "do_syscall_64"), "{frames:?}");
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
}

#[test]
fn kernel_and_user_only_exclude_each_other() {
    let out = run(&stackcount(), &["-K", "-U", "t:sched:sched_switch"], T);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("cannot be used with"), "{}", out.stderr);
}

#[test]
fn too_few_file_descriptors_fail_before_attaching() {
    // Without this check stackcount attached what fit, traced, and then died at
    // the summary for want of descriptors to symbolize with, losing every stack.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 40 && exec {} -D 5 't:sched:*'",
            stackcount().display()
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let need = stderr
        .strip_prefix("stackcount: error: this run needs ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("{stderr}"));
    let probes = stderr
        .split(" file descriptors (")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(
        stderr,
        format!(
            "stackcount: error: this run needs {need} file descriptors ({probes} for its probes), \
             over the open-file limit of 40: raise it with `ulimit -n {need}` (or `prlimit \
             --nofile={need}`), or trace fewer probes\n"
        )
    );
}
