//! trace on tracepoints: syscall fields signed as declared, syscall events on
//! raw links reading as perf events do, tracepoints that read no field on raw
//! links, predicates on fields, and field errors and refusals that name why.

use super::*;

#[test]
fn syscall_fields_are_signed_as_declared() {
    // sys_enter_lseek's `off_t offset` is 8 bytes marked unsigned in its format
    // file; as C (and BCC) read it, -1 is below 0.
    let out = run_on(
        "back",
        3,
        &["t:syscalls:sys_enter_lseek (args->offset < 0) \"%ld\", args->offset"],
    );
    assert_eq!(messages(&out.stdout), ["-1", "-2", "-3"]);
    let out = run_on("back", 1, &["--args", "t:syscalls:sys_enter_lseek"]);
    let m = messages(&out.stdout);
    assert!(m.len() == 1 && m[0].contains("offset=-1 "), "{m:?}");
}

#[test]
fn tracepoint_fields_of_a_syscall() {
    let out = run_on(
        "lseek",
        20,
        &["t:syscalls:sys_enter_lseek \"off=%d whence=%d\", args->offset, args->whence"],
    );
    let want: Vec<String> = (0..20)
        .map(|i| format!("off={} whence=0", 1000 + i))
        .collect();
    assert_eq!(messages(&out.stdout), want);
    assert!(events(&out.stdout).iter().all(|e| e.3 == "sys_enter_lseek"));
}

#[test]
fn syscall_events_on_raw_links_read_as_perf_events_do() {
    // With kernel reads, syscall events are served by one raw link on sys_enter
    // and one on sys_exit, whose programs rebuild each event's record from the
    // registers; without them (lockdown), or with TRACEKIT_PERF_SYSCALLS=1, by
    // the kernel's perf events. The workload's 8 writes of 100..107 bytes read the same both ways: argument,
    // predicate, return value, and no hit for a syscall it does not make.
    let specs = [
        "t:syscalls:sys_enter_write \"count=%d\", args->count",
        "t:syscalls:sys_enter_write (args->count > 104) \"big %d\", args->count",
        "t:syscalls:sys_exit_write (args->ret != 101) \"ret=%ld\", args->ret",
        "t:syscalls:sys_enter_lseek",
    ];
    let mut want = Vec::new();
    for n in 100..108 {
        want.push(format!("count={n}"));
        if n > 104 {
            want.push(format!("big {n}"));
        }
        if n != 101 {
            want.push(format!("ret={n}"));
        }
    }
    let mut args = vec!["-v"];
    args.extend(specs);
    for (env, how) in [
        (
            ("TRACEKIT_NO_KERNEL_READS", "0"),
            "tracepoints: 0 as raw tracepoint links, 3 syscall events through 2 raw sys_enter/sys_exit links, 0 as perf events",
        ),
        (
            ("TRACEKIT_NO_KERNEL_READS", "1"),
            "tracepoint syscalls:sys_exit_write: program trace_tp_24",
        ),
        // Perf events on request, with kernel reads.
        (
            ("TRACEKIT_PERF_SYSCALLS", "1"),
            "tracepoint syscalls:sys_exit_write: program trace_tp_read",
        ),
    ] {
        let reads = format!("{}={}", env.0, env.1);
        let out = run_on_env(&traced(), "write", 8, &[env], &args);
        assert_eq!(messages(&out.stdout), want, "{reads}: {}", out.stderr);
        assert!(out.stderr.lines().any(|l| l == how), "{reads}: {}", out.stderr);
        let hits: Vec<&str> = out
            .stderr
            .lines()
            .filter_map(|l| l.split_once("\"): ").map(|(_, h)| h))
            .collect();
        assert_eq!(
            hits,
            [
                "8 hits, 0 dropped by the predicate in the kernel",
                "8 hits, 5 dropped by the predicate in the kernel",
                "8 hits, 1 dropped by the predicate in the kernel",
                "0 hits, 0 dropped by the predicate in the kernel",
            ],
            "reads {reads}"
        );
    }
}

#[test]
fn tracepoints_that_read_no_field_on_raw_links() {
    // A tracepoint whose specs read no field of its record needs no record: a
    // raw tracepoint link serves it (detached at once, where a perf event
    // waits out RCU grace periods, about 70 ms each), its probe in the link's
    // cookie, or without raw tracepoint cookies (before Linux 6.10) when it is
    // the run's only probe. One whose spec reads a field stays a perf event,
    // as do several without cookies. The workload's 6 renames (its comm tk0,
    // tk1 in turn) are seen all four ways, with the same kernel stacks, which
    // begin where the tracepoint fired.
    // Raw links are expected: raw_tracepoint_counted_exactly, which runs in this
    // binary too, must not add its event named task_rename meanwhile.
    let _lock = rename_event_lock(false);
    let workload = prog("workload");
    let raw = "tracepoint task:task_rename: program trace_raw_tp on a raw tracepoint link (no field of the record is read)";
    // trace_tp_read, or trace_tp_12 without kernel reads.
    let perf = "tracepoint task:task_rename: program trace_tp_";
    let no_cookie = Some(("TRACEKIT_NO_RAW_TP_COOKIE", "1"));
    for (env, specs, how) in [
        (None, &["t:task:task_rename"][..], raw),
        (no_cookie, &["t:task:task_rename"], raw),
        (
            no_cookie,
            &["t:task:task_rename", "t:task:task_newtask"],
            perf,
        ),
        (None, &["t:task:task_rename \"%s\", args->newcomm"], perf),
    ] {
        let env: Vec<(&str, &str)> = env.into_iter().collect();
        let mut args = vec!["-v", "-K"];
        args.extend(specs);
        let spec = specs.join(" ");
        let out = run_on_env(&workload, "rename", 6, &env, &args);
        let ctx = format!("{env:?} {spec}: {}", out.stderr);
        assert!(out.stderr.lines().any(|l| l.starts_with(how)), "{ctx}");
        let raw = how.contains("raw tracepoint link");
        let tally = format!(
            "tracepoints: {} as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 0 as perf events",
            u8::from(raw)
        );
        assert_eq!(out.stderr.contains(&tally), raw, "{ctx}");
        let ev = events(&out.stdout);
        let comms: Vec<&str> = ev.iter().map(|e| e.2.as_str()).collect();
        assert_eq!(
            comms,
            ["workload", "tk0", "tk1", "tk0", "tk1", "tk0"],
            "{ctx}"
        );
        if spec.contains("newcomm") {
            let m: Vec<&str> = ev.iter().map(|e| e.4.as_str()).collect();
            assert_eq!(m, ["tk0", "tk1", "tk0", "tk1", "tk0", "tk1"], "{ctx}");
        }
        // Each event's stack: its first frame, then the prctl that renamed.
        let stacks: Vec<&str> = out
            .stdout
            .split("task_rename")
            .skip(1)
            .map(|s| s.lines().nth(1).unwrap_or("").trim())
            .collect();
        assert_eq!(stacks.len(), 6, "{ctx}");
        assert!(
            stacks.iter().all(|f| f.starts_with("__set_task_comm+")),
            "{ctx}\n{}",
            out.stdout
        );
    }
}

#[test]
fn every_syscall_event_on_two_raw_links() {
    // All of them, entries and exits: two raw links, no perf event (each would
    // take an RCU grace period, about 70 ms, to close). The workload's writes are
    // all there, each entry followed by its exit.
    let out = run_on(
        "write",
        5,
        &["-v", "t:syscalls:sys_enter_*", "t:syscalls:sys_exit_*"],
    );
    let how = out.stderr.lines().find(|l| l.starts_with("tracepoints: "));
    let how = how.unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(
        how.starts_with("tracepoints: 0 as raw tracepoint links, ")
            && how.ends_with(
                " syscall events through 2 raw sys_enter/sys_exit links, 0 as perf events"
            ),
        "{how}"
    );
    let writes: Vec<String> = events(&out.stdout)
        .into_iter()
        .map(|e| e.3)
        .filter(|f| f.ends_with("_write"))
        .collect();
    assert_eq!(writes, ["sys_enter_write", "sys_exit_write"].repeat(5));
}

#[test]
fn tracepoint_predicate_on_a_field() {
    let out = run_on(
        "lseek",
        20,
        &["t:syscalls:sys_enter_lseek (args->offset > 1016) \"%d\", args->offset"],
    );
    assert_eq!(messages(&out.stdout), ["1017", "1018", "1019"]);
}

#[test]
fn tracepoint_errors_name_the_field() {
    fails_with(
        &trace(),
        &["t:sched:sched_switch \"%d\", args->nosuch"],
        "bad probe \"t:sched:sched_switch \"%d\", args->nosuch\": sched:sched_switch: the tracepoint has no field 'nosuch' (fields: prev_comm, prev_pid, prev_prio, prev_state, next_comm, next_pid, next_prio)",
    );
    fails_with(
        &trace(),
        &["t:sched:sched_switch (args->prev_comm == 1)"],
        "bad probe \"t:sched:sched_switch (args->prev_comm == 1)\": sched:sched_switch: a tracepoint field of type u8[16] has no numeric value: print it with %s",
    );
}

#[test]
fn tracepoints_the_kernel_refuses_are_skipped_with_the_reason() {
    // ftrace:print takes no BPF program (EINVAL), as t:*:* always matches it:
    // trace ran nothing ("attaching tracepoint ftrace:print: failed to attach").
    let ftrace_print = "ftrace:print (the kernel refused it (EINVAL): BPF cannot attach to \
                        ftrace's own events or to events defined in tracefs (kprobe, uprobe, \
                        synthetic))";
    let out = run(
        &trace(),
        &[
            "-M",
            "1",
            r#"t:ftrace:print "%d", args->ip"#,
            "t:sched:sched_switch",
        ],
        T,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_contains(
        &out.stderr,
        &format!("trace: skipped 1 tracepoint that could not be attached: {ftrace_print}\n"),
    );
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.stdout);
    // -v, which the warning's "and N more" names, says so of each.
    let out = run(
        &trace(),
        &[
            "-v",
            "-M",
            "1",
            r#"t:ftrace:print "%d", args->ip"#,
            "t:sched:sched_switch",
        ],
        T,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("tracepoint ftrace:print: program "))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    let reason = ftrace_print
        .strip_prefix("ftrace:print (")
        .and_then(|r| r.strip_suffix(')'))
        .expect("a reason");
    assert!(line.ends_with(&format!(", skipped: {reason}")), "{line}");
    // Alone, it is an error that says why.
    fails_with(
        &trace(),
        &[r#"t:ftrace:print "%d", args->ip"#],
        &format!("nothing could be attached: {ftrace_print}"),
    );
}
