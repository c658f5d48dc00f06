//! Attach machinery every tool shares, seen in the guest kernels: the cgroup
//! filter in each kind of kernel-function program, uprobe groups and raw
//! syscall links on kernels without uprobe_multi or raw tracepoint cookies, and
//! compat syscalls told from native ones.

use crate::funccount::{funccount, vfs_read_count};
use crate::funclatency::{funclatency, hist_total};
use crate::trace::trace_tool;
use crate::util::*;
use crate::{assert_nothing_left, data_file, expect_kprobe_multi, T};

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn cgroup_filter_with_every_kernel_mechanism() {
    // --cgroup in each kind of program that serves kernel functions (the
    // verifier must take the helper in each): only the reads of the process in
    // a cgroup below the one named are seen, not those of another reading the
    // same file outside it, nor the rest of the system's.
    let dir = Scratch::new();
    let file = data_file(&dir);
    let top = Cgroup::new("cg-kernel");
    let below = Cgroup::new("cg-kernel/below");
    let mut runs = vec![
        (funccount(), "single"),
        (funclatency(), "single"),
        (funclatency(), "fentry"),
    ];
    if expect_kprobe_multi() {
        runs.extend([
            (funccount(), "multi"),
            (funclatency(), "multi"),
            (funclatency(), "session"),
        ]);
    }
    for (tool, mode) in runs {
        let what = format!("{} --attach-mode {mode}", tool.display());
        let reads =
            |n: &str| Workload::start(&prog("workload"), &["read", n, file.to_str().unwrap()]);
        let (inside, outside) = (reads("300"), reads("200"));
        below.adopt(inside.pid);
        let mut t = spawn(
            &tool,
            &["--cgroup", &top.rel, "--attach-mode", mode, "vfs_read"],
        );
        t.wait_ready();
        outside.go();
        inside.go();
        assert!(outside.wait().success() && inside.wait().success());
        t.signal(libc::SIGINT);
        let out = t.finish(T);
        assert_eq!(out.code(), 0, "{what}: {}", out.stderr);
        let seen = if tool == funccount() {
            vfs_read_count(&out)
        } else {
            hist_total(&out.stdout)
        };
        assert_eq!(seen, 300, "{what}: {}", out.stdout);
        assert_nothing_left(&what);
    }
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn uprobe_groups_and_raw_syscall_links_on_older_kernels() {
    // Debian 12's 6.1 has no uprobe_multi and no raw tracepoint cookies: user
    // functions go into tracefs uprobe groups, syscall events through the raw
    // sys_enter/sys_exit links (no cookie needed), and other tracepoints
    // through the raw tracepoint program that needs no cookie and its clones
    // (task_rename on the third, a clone).
    let dir = Scratch::new();
    let bin = dir.copy(&prog("workload"));
    let w = Workload::start(&bin, &["funcs", "100"]);
    let spec = format!("{}:tk_*", bin.display());
    let out = trace_workload(
        &funccount(),
        w,
        &["-D", "--attach-mode", "single", &spec],
        T,
    );
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_alpha", 100), ("tk_beta", 200), ("tk_gamma", 300)])
    );
    assert_contains(
        &out.stderr,
        "uprobes: 3 in 1 tracefs uprobe group, 0 as single perf-event uprobes\n",
    );
    // funclatency: the entries grouped too, the returns in a group of their
    // own; every one of the 600 calls timed.
    let w = Workload::start(&bin, &["funcs", "100"]);
    let args = ["-D", "--attach-mode", "single", &spec];
    let out = trace_workload(&funclatency(), w, &args, T);
    assert_eq!(hist_total(&out.stdout), 600, "{}", out.stdout);
    assert_contains(
        &out.stderr,
        "uprobes: 6 in 2 tracefs uprobe groups, 0 as single perf-event uprobes\n",
    );

    let w = Workload::start(&prog("workload"), &["rename", "60"]);
    let out = trace_workload(
        &funccount(),
        w,
        &[
            "-D",
            "t:syscalls:sys_enter_prctl",
            "t:syscalls:sys_exit_prctl",
            "t:sched:sched_process_exec",
            "t:sched:sched_process_fork",
            "t:task:task_rename",
        ],
        T,
    );
    assert_eq!(
        last_table(&out.stdout),
        rows(&[
            ("syscalls:sys_enter_prctl", 60),
            ("syscalls:sys_exit_prctl", 60),
            ("task:task_rename", 60)
        ])
    );
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        "tracepoints: 3 as raw tracepoint links, 2 syscall events through 2 raw sys_enter/sys_exit links, 0 as perf events"
    );
    // trace: a tracepoint whose spec reads no field of the record, the run's
    // only probe, on a raw link on both kernels (before 6.10 without a cookie,
    // which one probe does not need); all 60 renames printed.
    let w = Workload::start(&prog("workload"), &["rename", "60"]);
    let pid = w.pid.to_string();
    let mut t = spawn(&trace_tool(), &["-v", "-p", &pid, "t:task:task_rename"]);
    t.wait_line(|l| l.starts_with("PID "), T);
    w.go();
    let out = t.finish(T);
    assert!(w.wait().success(), "the workload failed");
    let renames =
        (out.stdout.lines()).filter(|l| l.split_whitespace().nth(3) == Some("task_rename"));
    assert_eq!(renames.count(), 60, "{}", out.stdout);
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        "tracepoints: 1 as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 0 as perf events"
    );
    let events = uprobe_events();
    assert_eq!(events, "", "uprobe events left behind");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn compat_syscalls_are_not_counted_as_native_ones() {
    // The workload makes 50 native getppid calls, then 50 ia32 ones (int 0x80,
    // number 64: semget's in the native table). As the kernel's own syscall
    // events do, funccount counts only the native calls: its sys_enter program
    // reads the task's TS_COMPAT flag at the offset found in the kernel's BTF.
    // A wrong offset counts 50 semget calls, or none of the getppid ones.
    // Without kernel reads (lockdown) compat calls cannot be told apart: the
    // ia32 getppid calls are counted as semget, which shows that the workload
    // makes them and that the raw sys_enter link sees them.
    let fc = funccount();
    let events = [
        "t:syscalls:sys_enter_getppid",
        "t:syscalls:sys_enter_semget",
    ];
    for (env, want) in [
        (
            "TRACEKIT_NO_KERNEL_READS=0",
            &[("syscalls:sys_enter_getppid", 50)][..],
        ),
        (
            "TRACEKIT_NO_KERNEL_READS=1",
            &[
                ("syscalls:sys_enter_getppid", 50),
                ("syscalls:sys_enter_semget", 50),
            ][..],
        ),
    ] {
        let w = Workload::start(&prog("workload"), &["int80", "50"]);
        let cmd = ["/usr/bin/env", env, fc.to_str().unwrap()];
        let out = trace_workload_via(&cmd, w, &events, T);
        assert_eq!(last_table(&out.stdout), rows(want), "{env}: {}", out.stderr);
    }
    // trace prints only the native calls both ways: with kernel reads its raw
    // sys_enter program leaves the compat ones out, without them the kernel's
    // perf events do.
    let tr = trace_tool();
    for env in ["TRACEKIT_NO_KERNEL_READS=0", "TRACEKIT_NO_KERNEL_READS=1"] {
        let w = Workload::start(&prog("workload"), &["int80", "50"]);
        let cmd = ["/usr/bin/env", env, tr.to_str().unwrap()];
        let ready = |l: &str| l.starts_with("PID ");
        let out = trace_workload_until(&cmd, w, &events, ready, T);
        let funcs: Vec<&str> = (out.stdout.lines().skip(1))
            .filter_map(|l| l.split_whitespace().nth(3))
            .collect();
        assert_eq!(funcs, ["sys_enter_getppid"; 50], "{env}: {}", out.stderr);
    }
}
