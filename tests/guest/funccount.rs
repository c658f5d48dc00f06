//! funccount on kernel functions: vfs_read counted exactly through kprobe_multi
//! or single kprobes, kernel functions beside other sources, thousands of
//! functions attached and detached, nothing left after SIGTERM or SIGKILL, and
//! the errors of kernel-function patterns.

use std::path::PathBuf;
use std::time::Instant;

use crate::util::*;
use crate::{assert_nothing_left, bpf_links, expect_kprobe_multi, read_data, tracefs_file, T};

pub(crate) fn funccount() -> PathBuf {
    tool("funccount")
}

/// funccount -p WORKLOAD vfs_* while the workload makes `n` reads; returns output
/// and the kprobe_multi link count seen while it was attached.
fn count_reads(n: u64, extra: &[&str]) -> (Output, usize) {
    let dir = Scratch::new();
    let w = read_data(&dir, n, &[]);
    let pid = w.pid.to_string();
    let mut args = vec!["-D", "-p", &pid];
    args.extend_from_slice(extra);
    args.push("vfs_*");
    let mut t = spawn(&funccount(), &args);
    t.wait_ready();
    let multi = bpf_links().1;
    let out = t.finish_after(w, T);
    (out, multi)
}

pub(crate) fn vfs_read_count(out: &Output) -> u64 {
    last_table(&out.stdout)
        .into_iter()
        .find(|(n, _)| n == "vfs_read")
        .map(|(_, c)| c)
        .unwrap_or_else(|| panic!("no vfs_read row:\n{}", out.stdout))
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn vfs_read_counted_exactly() {
    let (out, multi) = count_reads(2000, &[]);
    assert_eq!(vfs_read_count(&out), 2000);
    if expect_kprobe_multi() {
        // Every vfs_* function in one kprobe_multi link.
        assert_eq!(multi, 1, "kprobe_multi links while attached");
        assert_contains(&out.stderr, "attach mode: kernel functions: kprobe_multi (");
        assert_contains(
            &out.stderr,
            ", 1 links (1 kprobe_multi, 0 uprobe_multi), 0 skipped",
        );
    } else {
        // No kprobe_multi: the fallback says so and counts the same.
        assert_eq!(multi, 0);
        assert_contains(
            &out.stderr,
            "funccount: kprobe_multi is not available on this kernel (",
        );
        assert_contains(
            &out.stderr,
            "attach mode: kernel functions: single kprobes (",
        );
    }
    assert_nothing_left("a -p run ending with its process");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn single_kprobes_count_the_same() {
    let (out, multi) = count_reads(2000, &["--attach-mode", "single"]);
    assert_eq!(vfs_read_count(&out), 2000);
    assert_eq!(multi, 0, "no kprobe_multi link in single mode");
    assert_contains(
        &out.stderr,
        "attach mode: kernel functions: single kprobes (",
    );
    assert_nothing_left("a single-kprobe run");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn kernel_and_other_sources_in_one_run() {
    let dir = Scratch::new();
    let w = read_data(&dir, 300, &[]);
    let out = trace_workload(
        &funccount(),
        w,
        &["vfs_read", "t:syscalls:sys_enter_pread64"],
        T,
    );
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("syscalls:sys_enter_pread64", 300), ("vfs_read", 300)])
    );
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn thousands_of_functions_attach_count_and_detach() {
    // kprobe_multi: ~9,000 functions, spin locks and scheduler paths included.
    // Not every function: under qemu TCG, patching all ~42,000 crashes 6.12 with an
    // int3 oops in ftrace's text patching, for bpftrace's kprobe_multi as for ours
    // (4 of 4 runs in `cargo xtask bench-attach`), which CI must not gamble on.
    // Single kprobes cost ~37 ms each to attach and ~47 ms to detach under
    // emulation (6.1: 290 s for the 3,418 of "s*", this test's old pattern, which
    // timed out on a slower CI machine), so there ~1,200 (BCC's funccount refuses
    // more than 1,000), "s_*" included: on 6.1 those are static names shared by
    // several functions, which the kernel refuses and which must be reported,
    // not fatal. Grouping the kprobes under one tracefs event, as uprobes are,
    // was measured and rejected: 1,000 of them took 20 s to attach and 35 s to
    // detach on 6.1, against 37 s and 47 s one per perf event; the kernel patches
    // text and waits for RCU per probe either way.
    let (args, at_least): (&[&str], usize) = if expect_kprobe_multi() {
        (&["*in*"], 8_000)
    } else {
        (&["-r", "s_.*|se.*"], 1_000)
    };
    let pattern = args.last().unwrap();
    let start = Instant::now();
    let mut argv = vec!["-D", "-d", "2"];
    argv.extend_from_slice(args);
    let out = run(&funccount(), &argv, T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    let n = traced_count(&out.stdout);
    assert!(n >= at_least, "only {n} functions attached");
    assert!(
        !last_table(&out.stdout).is_empty(),
        "nothing counted:\n{}",
        out.stdout
    );
    let attached = attached_line(&out.stderr);
    let skipped: usize = attached
        .split(", ")
        .last()
        .and_then(|s| s.split(' ').next()?.parse().ok())
        .expect("skipped count");
    // Every refused function is listed with its reason, and the warning counts them.
    assert_eq!(
        out.stderr.matches("\n  skipped ").count(),
        skipped,
        "{}",
        out.stderr
    );
    if skipped > 0 {
        assert_contains(&out.stderr, &format!("funccount: skipped {skipped} probe"));
    }
    eprintln!(
        "{pattern}: {n} functions, {skipped} skipped, {:?} in all",
        start.elapsed()
    );
    assert_nothing_left("tracing thousands of functions");
    // The guest is still healthy: a normal traced run is exact.
    let (out, _) = count_reads(100, &[]);
    assert_eq!(vfs_read_count(&out), 100);
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn no_leftovers_after_sigterm_and_kill() {
    let modes: &[&str] = if expect_kprobe_multi() {
        &["multi", "single"]
    } else {
        // Forcing a mode the kernel lacks is a clear error, not a silent fallback.
        fails_with(
            &["--attach-mode", "multi", "vfs_*"],
            "--attach-mode multi: this kernel cannot create kprobe_multi links (creating a kprobe_multi link: not supported by this kernel; needs Linux 5.18+ with CONFIG_FPROBE)",
        );
        &["single"]
    };
    for &mode in modes {
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            let mut t = spawn(&funccount(), &["--attach-mode", mode, "vfs_*"]);
            t.wait_ready();
            assert!(bpf_links().0 > 0);
            assert!(!tracefs_file("enabled_functions").trim().is_empty());
            t.signal(sig);
            let out = t.finish(T);
            if sig == libc::SIGTERM {
                assert_eq!(out.code(), 0, "{}", out.stderr);
                assert!(out.stdout.ends_with("Detaching...\n"));
            }
            assert_nothing_left(&format!("signal {sig} in {mode} mode"));
        }
    }
}

fn fails_with(args: &[&str], message: &str) {
    crate::util::fails_with(&funccount(), args, message);
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn kernel_function_errors() {
    fails_with(
        &["tk_no_such_function"],
        "\"tk_no_such_function\" is not a traceable kernel function (it may not exist, be inlined, or be marked notrace)",
    );
    fails_with(
        &["tk_nothing_*"],
        "no traceable kernel function matches \"tk_nothing_*\"",
    );
    // Every function as single kprobes is refused up front (slow, and has crashed kernels).
    let out = run(&funccount(), &["--attach-mode", "single", "*"], T);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.starts_with("funccount: error: ")
            && out.stderr.contains(" kernel functions would need one kprobe each (--attach-mode single), over the limit of 5000: ")
            && out.stderr.ends_with("raise the limit with TRACEKIT_MAX_KPROBES=N\n"),
        "{}",
        out.stderr
    );
    // Without kprobe_multi, the automatic fallback is refused the same way.
    if !expect_kprobe_multi() {
        let out = run(&funccount(), &["*"], T);
        assert_eq!(out.code(), 1, "{}", out.stderr);
        assert_contains(&out.stderr, " kernel functions would need one kprobe each (no kprobe_multi on this kernel), over the limit of 5000: ");
    }
    // A deny-listed function this kernel lists as traceable.
    let aff = tracefs_file("available_filter_functions");
    let denied = [
        "migrate_disable",
        "preempt_count_add",
        "default_idle",
        "arch_cpu_idle",
    ]
    .into_iter()
    .find(|f| aff.lines().any(|l| l == *f))
    .expect("a deny-listed function in available_filter_functions");
    fails_with(
        &[denied],
        &format!("\"{denied}\" is not traced: it is on the kprobe blacklist or the deny list of functions that hang or recurse when traced"),
    );
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn sampling_and_counter_sources_in_the_guest_kernels() {
    // A python3 that sleeps 100 times (and writes its own count of its
    // switches over them to a file); then 2 s of its CPU time sampled at 99
    // Hz: 198 +-10%.
    let dir = Scratch::new();
    let said = dir.0.join("switches");
    let script = format!(
        "import sys,time\n\
         def n():\n  s = open('/proc/self/status').read().split('\\n')\n  return sum(int(l.split()[1]) for l in s if 'ctxt_switches' in l)\n\
         sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()\n\
         a = n()\nfor i in range(100): time.sleep(0.01)\nb = n()\nopen('{}', 'w').write(str(b - a))\n",
        said.display()
    );
    // The switches counted with the stacks where they came: those in libc's
    // clock_nanosleep are the sleeps', one each, and at most python3's own
    // count (an emulated guest also preempts python3 elsewhere, and its exit
    // switches a few times more). 10 ms sleeps: a 1 ms timer could expire in
    // the emulated guest before the task slept (98 of 100 switched once).
    let out = trace_cprog(
        &tool("stackcount"),
        std::path::Path::new("/usr/bin/python3"),
        &["-c", &script],
        &["-U", "software:cs:1"],
        |l| l.starts_with("Tracing"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let sleeping: u64 = parse_stacks(&out.stdout)
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "clock_nanosleep"))
        .map(|s| s.1)
        .sum();
    let own: u64 = std::fs::read_to_string(&said)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        (100..=own).contains(&sleeping),
        "{sleeping} in clock_nanosleep, {own} its own:\n{}",
        out.stdout
    );
    let burn = "import sys,time\nsys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()\nt = time.process_time()\nwhile time.process_time() - t < 2: pass\n";
    let out = trace_cprog(
        &tool("stackcount"),
        std::path::Path::new("/usr/bin/python3"),
        &["-c", burn],
        &["-U", "profile:hz:99"],
        |l| l.starts_with("Tracing"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let stacks = parse_stacks(&out.stdout);
    let all: u64 = stacks.iter().map(|s| s.1).sum();
    assert!((178..=218).contains(&all), "{all} samples:\n{}", out.stdout);
    // Walked whole by the unwind tables and named: python3's interpreter
    // loop is many frames deep down to Py_BytesMain (frame pointers give two).
    let whole: u64 = stacks
        .iter()
        .filter(|(f, _)| f.len() >= 8 && f.iter().any(|f| f == "Py_BytesMain"))
        .map(|s| s.1)
        .sum();
    assert!(
        whole * 100 >= all * 95,
        "{whole} of {all} whole and named:\n{}",
        out.stdout
    );
    assert_nothing_left("stackcount");
}
