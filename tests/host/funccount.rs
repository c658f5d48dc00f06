//! funccount's own output on the host kernel: counts of user functions, libc,
//! tracepoints and USDT probes, -i/-d summaries, --json, and the -p, --cgroup
//! and -c filters. funccount also drives the tests of the stages the tools
//! share (targets, attach, lifecycle, cli), with the helpers here. Kernel
//! functions are tested in the guest (tests/guest/funccount.rs).

use std::path::PathBuf;
use std::time::Duration;

use crate::util::*;

const T: Duration = Duration::from_secs(60);

pub(crate) fn funccount() -> PathBuf {
    tool("funccount")
}

pub(crate) fn workload() -> PathBuf {
    prog("workload")
}

/// Runs funccount `args` against a workload started with `wargs`, filtered to its
/// PID; funccount ends by itself when the workload exits.
pub(crate) fn count_with_pid(wargs: &[&str], args: &[&str]) -> Output {
    trace_workload(&funccount(), Workload::start(&workload(), wargs), args, T)
}

#[test]
fn user_function_counted_exactly() {
    // A private copy of the binary: only this test's process runs it, so no -p.
    let dir = Scratch::new();
    let (w, spec) = private_workload(&dir, &workload(), &["funcs", "1234"], "tk_alpha");
    let mut t = spawn(&funccount(), &[&spec]);
    t.wait_ready();
    let out = t.stop_after(w, libc::SIGINT, T);
    assert_eq!(last_table(&out.stdout), rows(&[("tk_alpha", 1234)]));
    assert!(out.stdout.contains(&format!(
        "Tracing 1 functions for \"{spec}\"... Hit Ctrl-C to end."
    )));
    assert_ends_with(&out.stdout, "Detaching...\n");
}

#[test]
fn user_glob_counts_each_function() {
    let dir = Scratch::new();
    let (w, spec) = private_workload(&dir, &workload(), &["funcs", "500"], "tk_*");
    let mut t = spawn(&funccount(), &[&spec]);
    t.wait_ready();
    let out = t.stop_after(w, libc::SIGTERM, T);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_alpha", 500), ("tk_beta", 1000), ("tk_gamma", 1500)])
    );
}

#[test]
fn pid_filter_counts_only_that_process() {
    // Two processes of the same binary; only the -p one is counted.
    let other = Workload::start(&workload(), &["funcs", "77"]);
    let w = Workload::start(&workload(), &["funcs", "100"]);
    let pid = w.pid.to_string();
    let spec = format!("{}:tk_*", workload().display());
    let mut t = spawn(&funccount(), &["-p", &pid, &spec]);
    t.wait_ready();
    other.go();
    assert!(other.wait().success());
    let out = t.finish_after(w, T);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_alpha", 100), ("tk_beta", 200), ("tk_gamma", 300)])
    );
}

#[test]
fn cgroup_filter_counts_only_tasks_in_it_and_below() {
    // Three processes of the same binary: one in a cgroup below the one
    // filtered (counted), one in a sibling cgroup and one in ours (not).
    let top = Cgroup::new("cg-count");
    let below = Cgroup::new("cg-count/below");
    let sibling = Cgroup::new("cg-sibling");
    let inside = Workload::start(&workload(), &["funcs", "100"]);
    let beside = Workload::start(&workload(), &["funcs", "77"]);
    let outside = Workload::start(&workload(), &["funcs", "55"]);
    below.adopt(inside.pid);
    sibling.adopt(beside.pid);
    let spec = format!("{}:tk_*", workload().display());
    let mut t = spawn(&funccount(), &["--cgroup", &top.rel, &spec]);
    t.wait_ready();
    for w in [&beside, &outside, &inside] {
        w.go();
    }
    for w in [beside, outside, inside] {
        assert!(w.wait().success());
    }
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_alpha", 100), ("tk_beta", 200), ("tk_gamma", 300)])
    );
}

#[test]
fn libc_function_with_pid() {
    let out = count_with_pid(&["getpid", "4321"], &["c:getpid"]);
    assert_eq!(last_table(&out.stdout), rows(&[("getpid", 4321)]));
}

#[test]
fn tracepoint_with_pid() {
    let out = count_with_pid(&["getppid", "777"], &["t:syscalls:sys_enter_getppid"]);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("syscalls:sys_enter_getppid", 777)])
    );
}

#[test]
fn tracepoint_glob_includes_the_event() {
    let out = count_with_pid(&["getppid", "555"], &["t:syscalls:sys_enter_*"]);
    let table = last_table(&out.stdout);
    assert!(
        table.contains(&("syscalls:sys_enter_getppid".to_string(), 555)),
        "{table:?}"
    );
    let n = traced_count(&out.stdout);
    assert!(
        n > 100,
        "sys_enter_* should match hundreds of tracepoints, got {n}"
    );
}

#[test]
fn usdt_probe_with_pid() {
    let spec = format!("u:{}:tick", workload().display());
    let out = count_with_pid(&["usdt", "250"], &[&spec]);
    assert_eq!(last_table(&out.stdout), rows(&[("tick", 250)]));
}

#[test]
fn several_patterns_in_one_run() {
    let spec = format!("{}:tk_beta", workload().display());
    let out = count_with_pid(
        &["funcs", "40"],
        &[&spec, "t:syscalls:sys_enter_getppid", "c:getpid"],
    );
    // The workload makes no getppid/getpid calls in "funcs" mode: zero rows hidden.
    assert_eq!(last_table(&out.stdout), rows(&[("tk_beta", 80)]));
    assert_contains(&out.stdout, "Tracing 3 functions for");
}

#[test]
fn interval_and_duration_print_three_summaries() {
    let out = run(
        &funccount(),
        &["-i", "1", "-d", "3", "-T", "t:sched:sched_switch"],
        T,
    );
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    let headers = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("FUNC "))
        .count();
    assert_eq!(headers, 3, "{}", out.stdout);
    let stamps = out
        .stdout
        .lines()
        .filter(|l| l.len() == 8 && l.as_bytes()[2] == b':' && l.as_bytes()[5] == b':')
        .count();
    assert_eq!(stamps, 3, "{}", out.stdout);
    assert!(out.stdout.ends_with("Detaching...\n"));
}

#[test]
fn counts_reset_each_interval() {
    let w = Workload::start(&workload(), &["getppid", "90", "--hold"]);
    let pid = w.pid.to_string();
    let mut t = spawn(
        &funccount(),
        &["-p", &pid, "-i", "0.5", "t:syscalls:sys_enter_getppid"],
    );
    t.wait_ready();
    w.go();
    // The first summary after the calls holds 90; later ones are empty.
    t.wait_line(
        |l| l.starts_with("syscalls:sys_enter_getppid") && l.ends_with(" 90"),
        T,
    );
    t.wait_line(|l| l.starts_with("FUNC"), T);
    w.go();
    let out = t.finish(T);
    assert_eq!(out.code(), 0);
    assert!(last_table(&out.stdout).is_empty(), "{}", out.stdout);
    assert_eq!(out.stdout.matches(" 90\n").count(), 1, "{}", out.stdout);
}

#[test]
fn json_output_parses() {
    let out = count_with_pid(&["getpid", "64"], &["--json", "-i", "5", "c:getpid"]);
    let objs = json_lines(&out.stdout);
    let last = objs.last().expect("a JSON summary");
    assert_eq!(last["final"], true);
    assert_eq!(
        last["counts"],
        serde_json::json!([{ "func": "getpid", "count": 64 }])
    );
    assert_contains(&out.stderr, "Tracing 1 functions for \"c:getpid\"");
}

/// Asserts that funccount `args` exits 1 with exactly `funccount: error: message`.
pub(crate) fn fails_with(args: &[&str], message: &str) {
    crate::util::fails_with(&funccount(), args, message);
}

#[test]
fn cpu_filter_counts_only_that_cpu() {
    // Pin the workload to CPU 0 and count on CPU 0 and on another CPU.
    let mut cases = vec![("0", Some(200))];
    if std::thread::available_parallelism().unwrap().get() > 1 {
        cases.push(("1", None));
    }
    for (cpu, expect) in cases {
        let w = Workload::start(
            &PathBuf::from("taskset"),
            &["-c", "0", workload().to_str().unwrap(), "getppid", "200"],
        );
        let out = trace_workload(
            &funccount(),
            w,
            &["-c", cpu, "t:syscalls:sys_enter_getppid"],
            T,
        );
        let want: Vec<(String, u64)> = expect
            .iter()
            .map(|n| ("syscalls:sys_enter_getppid".to_string(), *n))
            .collect();
        assert_eq!(last_table(&out.stdout), want, "cpu {cpu}");
    }
}

#[test]
fn thread_id_is_resolved_to_its_process() {
    // -p with the id of a thread that is not the leader: the filter is on the
    // thread group, so it traces the whole process and says so.
    let w = Workload::start(&workload(), &["thread-getppid", "345"]);
    let tid = std::fs::read_dir(format!("/proc/{}/task", w.pid))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|t| *t != w.pid)
        .expect("a second thread");
    let (tid_s, pid) = (tid.to_string(), w.pid);
    let mut t = spawn(
        &funccount(),
        &["-p", &tid_s, "t:syscalls:sys_enter_getppid"],
    );
    t.wait_ready();
    let out = t.finish_after(w, T);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("syscalls:sys_enter_getppid", 345)])
    );
    assert_eq!(
        out.stderr,
        format!("funccount: {tid} is a thread of process {pid}: tracing process {pid}\n")
    );
}

#[test]
fn a_caller_and_its_callees_are_counted_over_one_window() {
    let _turn = event_mutex_turn();
    // glibc's usleep calls nanosleep, which calls clock_nanosleep: once each per
    // call. Probes on all of libc attach and detach one link at a time; counting
    // armed once every probe is attached and disarmed before the final read
    // gives the three one window (each had a window of its own: 2735 / 2740 /
    // 2744).
    let dir = Scratch::new();
    let bin = build_c(&dir, "pairing");
    for mode in ["auto", "multi", "single"] {
        let mut p = CProg::start_with(&bin, &["chain", "100000", "10000"]);
        let pid = p.pid.to_string();
        p.go();
        let out = run(
            &funccount(),
            &["--attach-mode", mode, "-d", "2", "-p", &pid, "c:*"],
            T,
        );
        assert_eq!(out.code(), 0, "{mode}: {}", out.stderr);
        let table = last_table(&out.stdout);
        let count = |f: &str| {
            table
                .iter()
                .find(|(n, _)| n == f)
                .unwrap_or_else(|| panic!("{mode}: no {f} in {}", out.stdout))
                .1
        };
        let calls = [
            count("usleep"),
            count("nanosleep"),
            count("clock_nanosleep"),
        ];
        assert!(calls[0] >= 100, "{mode}: {}", out.stdout);
        // One window over one thread counts one stretch of its calls in their
        // order (usleep, nanosleep, clock_nanosleep, usleep, ...). The window
        // can open or close between two of one chain's probes (a preemption
        // at a probe's trap, under load: 195 / 196 / 196 in CI), so each end
        // can give a chain's later or earlier calls alone: the three are equal
        // or one apart, and any such three is such a stretch. A window per
        // link puts them apart by the calls made during the attach.
        let (lo, hi) = (calls.iter().min().unwrap(), calls.iter().max().unwrap());
        assert!(hi - lo <= 1, "{mode}: {}", out.stdout);
    }
}
