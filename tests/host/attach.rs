//! Loading and attaching, shared by the tools: single uprobes in tracefs
//! groups and uprobe_multi, refused functions bisected out, raw tracepoints
//! with and without cookies, syscall events on raw links or perf events, PID
//! namespaces, maps and kernel BTF a run does not need, and tracefs mounted
//! when missing. Driven by funccount.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::funccount::{count_with_pid, fails_with, funccount, workload};
use crate::util::*;

const T: Duration = Duration::from_secs(60);

/// [`count_with_pid`] with settings (`VAR=value`) in funccount's environment.
fn count_with_env(env: &[&str], wargs: &[&str], args: &[&str]) -> Output {
    let fc = funccount();
    let mut cmd = vec!["env"];
    cmd.extend_from_slice(env);
    cmd.push(fc.to_str().unwrap());
    trace_workload_via(&cmd, Workload::start(&workload(), wargs), args, T)
}

#[test]
fn single_uprobes_count_the_same() {
    let dir = Scratch::new();
    let (w, spec) = private_workload(&dir, &workload(), &["funcs", "300"], "tk_*");
    let mut t = spawn(&funccount(), &["--attach-mode", "single", "-D", &spec]);
    t.wait_ready();
    let out = t.stop_after(w, libc::SIGINT, T);
    assert_contains(
        &out.stderr,
        "attach mode: user functions: single uprobes (3 functions)",
    );
    // The three functions' page offsets differ: one tracefs uprobe group.
    assert_contains(&out.stderr, "attached: 3 probes, 1 links (0 kprobe_multi, 0 uprobe_multi), 0 skipped\nuprobes: 3 in 1 tracefs uprobe group, 0 as single perf-event uprobes\n");
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_alpha", 300), ("tk_beta", 600), ("tk_gamma", 900)])
    );
}

#[test]
fn mounts_tracefs_when_missing() {
    // In a private mount namespace without tracefs, the tool mounts it itself.
    let script = format!(
        "umount /sys/kernel/tracing 2>/dev/null; umount /sys/kernel/debug/tracing 2>/dev/null; \
         grep -q ' tracefs ' /proc/self/mounts && exit 3; \
         {} -d 0.5 t:sched:sched_switch >/dev/null || exit 4; \
         grep -q '/sys/kernel/tracing tracefs' /proc/self/mounts || exit 5",
        funccount().display()
    );
    let st = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
}

#[test]
fn kernel_functions_on_a_kernel_without_kprobes() {
    // The host kernel of this project's machines has no kprobes (see ENVIRONMENT.md);
    // kernel functions themselves are tested in the guest kernels.
    if std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        let out = run(&funccount(), &["-d", "0.5", "vfs_read"], T);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        return;
    }
    let out = run(&funccount(), &["vfs_read"], T);
    assert_eq!(out.code(), 1);
    assert_starts_with(&out.stderr, "funccount: error: kernel functions cannot be traced here: it was built without kprobes (CONFIG_KPROBES is not set)");
    assert_ends_with(&out.stderr, "tracepoints (t:CATEGORY:EVENT), user functions (LIBRARY:FUNCTION) and USDT probes (u:LIBRARY:PROBE) still work\n");
}

#[test]
fn refused_function_is_skipped_and_the_rest_stay_in_uprobe_multi() {
    // tk_refused starts with an instruction uprobes refuse; the kernel then refuses
    // any uprobe_multi link holding it. Only it is skipped: the others are counted
    // exactly, in uprobe_multi links (no single uprobes).
    let out = trace_refused(&[]);
    let attached = attached_line(&out.stderr);
    // "attached: 3 probes, N links (...)": how many links the bisection made.
    let links: usize = attached
        .split(", ")
        .nth(1)
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{attached}"));
    assert_eq!(
        attached,
        format!(
            "attached: 3 probes, {links} links (0 kprobe_multi, {links} uprobe_multi), 1 skipped"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn refused_function_is_skipped_from_uprobe_groups() {
    // Without uprobe_multi the group holding tk_refused is refused as a whole and
    // bisected the same way.
    let out = trace_refused(&["--attach-mode", "single"]);
    let groups: usize = out
        .stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("uprobes: 3 in ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert_contains(
        &out.stderr,
        &format!(
            "attached: 3 probes, {groups} links (0 kprobe_multi, 0 uprobe_multi), 1 skipped\n"
        ),
    );
}

/// funccount -D ARGS on the `refused` C program's tk_* functions: exact counts
/// for the three it calls, tk_refused skipped with the reason.
fn trace_refused(args: &[&str]) -> Output {
    let dir = Scratch::new();
    let bin = build_c(&dir, "refused");
    let p = CProg::start(&bin);
    let pid = p.pid.to_string();
    let spec = format!("{}:tk_*", bin.display());
    // The kernel's own refusal is what these tests exercise: funccount's check of
    // first instructions (which skips tk_refused up front) is switched off.
    let fc = funccount();
    let mut all = vec![
        "TRACEKIT_NO_INSN_CHECK=1",
        fc.to_str().unwrap(),
        "-D",
        "-p",
        &pid,
        &spec,
    ];
    all.extend_from_slice(args);
    let mut t = spawn(std::path::Path::new("env"), &all);
    t.wait_ready();
    let out = t.finish_after(p, T);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_one", 10), ("tk_two", 20), ("tk_three", 30)])
    );
    assert_contains(&out.stderr, "  skipped tk_refused: the kernel refuses to single-step its first instruction (ENOTSUPP)\n");
    out
}

#[test]
fn syscall_events_share_one_raw_link_per_direction() {
    let out = count_with_pid(
        &["getppid", "321"],
        &[
            "-D",
            "t:syscalls:sys_enter_*",
            "t:syscalls:sys_exit_getppid",
        ],
    );
    let table = last_table(&out.stdout);
    assert!(
        table.contains(&("syscalls:sys_enter_getppid".to_string(), 321))
            && table.contains(&("syscalls:sys_exit_getppid".to_string(), 321)),
        "{table:?}"
    );
    let n = traced_count(&out.stdout);
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        format!("tracepoints: 0 as raw tracepoint links, {n} syscall events through 2 raw sys_enter/sys_exit links, 0 as perf events")
    );
}

#[test]
fn syscall_events_as_perf_events_on_request() {
    // TRACEKIT_PERF_SYSCALLS=1: one perf-event tracepoint per syscall event
    // (cheaper for the syscalls not traced), counted as exactly, with kernel
    // reads and without (the kernel's events know the syscall number).
    for reads in ["TRACEKIT_NO_KERNEL_READS=0", "TRACEKIT_NO_KERNEL_READS=1"] {
        let out = count_with_env(
            &["TRACEKIT_PERF_SYSCALLS=1", reads],
            &["getppid", "234"],
            &[
                "-D",
                "t:syscalls:sys_enter_getppid",
                "t:syscalls:sys_exit_getppid",
            ],
        );
        assert_eq!(
            last_table(&out.stdout),
            rows(&[
                ("syscalls:sys_enter_getppid", 234),
                ("syscalls:sys_exit_getppid", 234)
            ]),
            "{reads}"
        );
        assert_eq!(
            tracepoint_mechanisms(&out.stderr),
            "tracepoints: 0 as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 2 as perf events"
        );
    }
}

#[test]
fn syscall_exit_counted_exactly_without_kernel_reads() {
    // As under lockdown=confidentiality: sys_exit cannot read the syscall number
    // from the registers, so sys_enter remembers it per thread.
    let out = count_with_env(
        &["TRACEKIT_NO_KERNEL_READS=1"],
        &["getppid", "432"],
        &["-D", "t:syscalls:sys_exit_getppid"],
    );
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("syscalls:sys_exit_getppid", 432)])
    );
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        "tracepoints: 0 as raw tracepoint links, 1 syscall events through 2 raw sys_enter/sys_exit links, 0 as perf events"
    );
}

#[test]
fn raw_tracepoint_counted_exactly() {
    // It adds an event named task_rename below: no other test attaches the
    // tracepoint meanwhile.
    let _lock = rename_event_lock(true);
    // task:task_rename fires once per prctl(PR_SET_NAME) of the workload.
    let out = count_with_pid(&["rename", "345"], &["-D", "t:task:task_rename"]);
    assert_eq!(last_table(&out.stdout), rows(&[("task:task_rename", 345)]));
    // One tracepoint is a raw link with cookies (6.10+) or without.
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        "tracepoints: 1 as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 0 as perf events"
    );
    // A raw tracepoint is found by name alone: with a uprobe event named
    // task_rename in another group, task:task_rename is attached by its id (a
    // perf event), and still counted exactly. (Here, not in a test of its own:
    // the event would change how the run above attaches.)
    uprobe_events_command("p:tracekit_dup_test/task_rename /usr/bin/true:0x0");
    let out = count_with_pid(&["rename", "345"], &["-D", "t:task:task_rename"]);
    uprobe_events_command("-:tracekit_dup_test/task_rename");
    assert_eq!(last_table(&out.stdout), rows(&[("task:task_rename", 345)]));
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        "tracepoints: 0 as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 1 as perf events"
    );
}

#[test]
fn raw_tracepoints_without_cookies() {
    // Before Linux 6.10 (forced here) raw tracepoint links take no cookie:
    // tracepoints still get raw links, through the cookie-less program (the
    // first) and clones of it, each of which counts the probe its slot of a
    // global names. Perf events only past 1024.
    let _lock = rename_event_lock(false);
    let tool = funccount();
    let via = ["env", "TRACEKIT_NO_RAW_TP_COOKIE=1", tool.to_str().unwrap()];
    // task_rename is probe 3, on the third slot (a clone), after the syscall event.
    let out = trace_workload_via(
        &via,
        Workload::start(&workload(), &["rename", "345"]),
        &[
            "-D",
            "t:syscalls:sys_enter_prctl",
            "t:sched:sched_process_exec",
            "t:sched:sched_process_fork",
            "t:task:task_rename",
        ],
        T,
    );
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("syscalls:sys_enter_prctl", 345), ("task:task_rename", 345)])
    );
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        "tracepoints: 3 as raw tracepoint links, 1 syscall events through 1 raw sys_enter/sys_exit link, 0 as perf events"
    );
    // task_rename on the first slot (the program libbpf loaded), and on the
    // 41st, past what the object once had programs for: counted exactly.
    let events = tracefs_events(&["sched", "timer"]);
    assert!(events.len() >= 40, "{events:?}");
    for before in [0, 40] {
        let mut args = vec!["-D".to_string()];
        args.extend(events[..before].iter().map(|e| format!("t:{e}")));
        args.push("t:task:task_rename".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = trace_workload_via(
            &via,
            Workload::start(&workload(), &["rename", "345"]),
            &args,
            T,
        );
        assert!(
            last_table(&out.stdout).contains(&("task:task_rename".to_string(), 345)),
            "{}",
            out.stdout
        );
        assert_eq!(
            tracepoint_mechanisms(&out.stderr),
            format!(
                "tracepoints: {} as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 0 as perf events",
                before + 1
            )
        );
    }
}

/// The events (`category:event`) of these tracefs categories, sorted.
fn tracefs_events(categories: &[&str]) -> Vec<String> {
    let mut events = Vec::new();
    for cat in categories {
        let dir = tracefs().join("events").join(cat);
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let e = e.unwrap();
            if e.path().join("id").exists() {
                events.push(format!("{cat}:{}", e.file_name().to_string_lossy()));
            }
        }
    }
    events.sort();
    events
}

#[test]
fn funccount_runs_do_not_read_the_kernel_btf() {
    // funccount's object has no CO-RE relocation (the syscall programs read
    // the TS_COMPAT flag at an offset found once per boot), so libbpf is never
    // made to parse the kernel's 5 MB BTF, and the object opened while the
    // options are parsed is the one loaded: a syscall exit run, which had to
    // open it again for the kernel's BTF, loads like a tracepoint run. Both
    // count exactly.
    for (args, spec, count, load_note) in [
        (
            ["rename", "345"],
            "t:task:task_rename",
            345,
            "(opened ahead, kernel BTF not read)",
        ),
        (
            ["getppid", "432"],
            "t:syscalls:sys_exit_getppid",
            432,
            "(opened ahead, kernel BTF not read)",
        ),
    ] {
        let tool = funccount();
        let out = trace_workload_via(
            &["env", "TRACEKIT_TIMING=1", tool.to_str().unwrap()],
            Workload::start(&workload(), &args),
            &[spec],
            T,
        );
        assert_eq!(last_table(&out.stdout), rows(&[(&spec[2..], count)]));
        let timing = out
            .stderr
            .lines()
            .find(|l| l.starts_with("timing: "))
            .unwrap_or_else(|| panic!("no timing line in {}", out.stderr));
        // The load phase's note: the phase after it is attach.
        assert!(
            timing.contains(&format!("{load_note}, attach ")),
            "{spec}: {timing}"
        );
    }
}

#[test]
fn many_single_uprobes_count_exactly_in_groups() {
    let _turn = event_mutex_turn();
    // 1,500 tiny functions: many share a page offset, so they need several
    // tracefs uprobe groups; each function is counted exactly, and the groups'
    // events are gone afterwards.
    let dir = Scratch::new();
    let bin = build_many_functions(&dir, 1500);
    let p = CProg::start(&bin);
    let pid = p.pid.to_string();
    let spec = format!("{}:fn_*", bin.display());
    let mut t = spawn(
        &funccount(),
        &["-D", "--attach-mode", "single", "-p", &pid, &spec],
    );
    t.wait_ready();
    let group = format!("tracekit_{}_{}/", pid_namespace_of(t.pid()), t.pid());
    assert_eq!(
        code_bytes_changed(p.pid, &bin),
        1500,
        "one int3 per function"
    );
    let events = uprobe_events();
    assert_eq!(
        events.lines().filter(|l| l.contains(&group)).count(),
        1500,
        "{events}"
    );
    let out = t.finish_after(p, T);
    let table = last_table(&out.stdout);
    let want: Vec<(String, u64)> = (0..1500).map(|i| (format!("fn_{i:04}"), 1)).collect();
    let mut got = table.clone();
    got.sort();
    assert_eq!(got, want);
    let groups: usize = out
        .stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("uprobes: 1500 in ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(groups > 1, "{}", out.stderr);
    assert_contains(
        &out.stderr,
        &format!(
            "attached: 1500 probes, {groups} links (0 kprobe_multi, 0 uprobe_multi), 0 skipped\n"
        ),
    );
    let events = uprobe_events();
    assert!(!events.contains(&group), "{events}");
}

#[test]
fn uprobe_events_of_killed_runs_are_removed_by_the_next_run_that_makes_some() {
    // A run killed in single mode leaves its tracefs uprobe events (inert).
    // The next run that makes groups removes those of processes that are gone:
    // here, in another PID namespace (seen from the initial one, which sees
    // them all), or in a namespace that is gone; and an older version's
    // (named by PID alone). A live process's group is kept. 4194305 is above
    // PID_MAX_LIMIT: no process has it.
    let ours = pid_namespace_of(std::process::id());
    assert_eq!(
        ours,
        common::INIT_PIDNS_INO,
        "the tests run in the initial PID namespace"
    );
    let mut holder = Command::new("unshare")
        .args(["-fp", "--kill-child", "sleep", "60"])
        .spawn()
        .expect("unshare");
    let sleeper = child_of(holder.id(), T);
    let theirs = pid_namespace_of(sleeper);
    assert_ne!(theirs, ours);
    let groups = [
        (format!("tracekit_{ours}_4194305"), true),
        (format!("tracekit_{theirs}_2"), true),
        (format!("tracekit_{theirs}_1"), false),
        ("tracekit_1_1".to_string(), true),
        ("tracekit_4194305".to_string(), true),
    ];
    for (g, _) in &groups {
        uprobe_events_command(&format!("p:{g}/g0 /usr/bin/true:0x0"));
    }
    let out = run(
        &funccount(),
        &["-d", "0.1", "--attach-mode", "single", "c:getpid"],
        T,
    );
    let events = uprobe_events();
    for (g, _) in &groups {
        if events.contains(&format!("{g}/")) {
            uprobe_events_command(&format!("-:{g}/g0"));
        }
    }
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(out.code(), 0, "{}", out.stderr);
    for (g, stale) in &groups {
        assert_eq!(!events.contains(&format!("{g}/")), *stale, "{g}: {events}");
    }
}

#[test]
fn single_mode_runs_in_two_pid_namespaces_keep_their_own_events() {
    // Two runs in single mode in two PID namespaces, as in two containers: each
    // is PID 1 there. Each makes its own tracefs group and counts only its own
    // binary. (Groups named by PID alone were one: the second run's probe was
    // appended to the first's event, each counted both, and closing it oopsed
    // the kernel.) Relative paths are written absolute in uprobe_events.
    let dir = Scratch::new();
    let counts = [("nsa", 3), ("nsb", 5)];
    let bins: Vec<PathBuf> = counts
        .iter()
        .map(|(name, _)| build_userfuncs(&dir, name, &[]))
        .collect();
    let mut runs: Vec<Running> = counts
        .iter()
        .map(|(name, _)| {
            let mut cmd = Command::new("unshare");
            cmd.args(["-fp", "--mount-proc"])
                .arg(funccount())
                .args([
                    "-D",
                    "--attach-mode",
                    "single",
                    &format!("./{name}:uf_target"),
                ])
                .current_dir(&dir.0);
            let mut t = spawn_cmd(cmd);
            t.wait_ready();
            t
        })
        .collect();
    let events = uprobe_events();
    let groups: Vec<(String, String)> = runs
        .iter()
        .zip(&bins)
        .map(|(t, bin)| {
            let ns = pid_namespace_of(child_of(t.pid(), T));
            (
                format!("tracekit_{ns}_1/"),
                format!("p:tracekit_{ns}_1/g0 {}:0x", bin.display()),
            )
        })
        .collect();
    for (bin, (_, n)) in bins.iter().zip(counts) {
        let w = Workload::start(bin, &["plain", &n.to_string()]);
        w.go();
        assert!(w.wait().success());
    }
    for t in &runs {
        kill(child_of(t.pid(), T), libc::SIGINT);
    }
    for ((t, (_, n)), (_, line)) in runs.drain(..).zip(counts).zip(&groups) {
        let out = t.finish(T);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        assert_eq!(last_table(&out.stdout), rows(&[("uf_target", n)]));
        assert_eq!(
            events.lines().filter(|l| l.starts_with(line)).count(),
            1,
            "{line}: {events}\nstderr: {}",
            out.stderr
        );
    }
    assert_ne!(groups[0].0, groups[1].0);
    let groups: Vec<String> = groups.into_iter().map(|g| g.0).collect();
    let events = uprobe_events();
    for g in &groups {
        assert!(!events.contains(g.as_str()), "{g} left: {events}");
    }
}

#[test]
fn maps_of_probe_kinds_a_run_lacks_are_not_created() {
    // The USDT maps of libbpf's usdt.bpf.h (and its kconfig map), the syscall
    // tables and the uprobe group index are created, sized for the probes that
    // use them, only in a run with such probes: the kernel would allocate them
    // for nothing, and each is a map creation at start-up.
    let usdt = format!("u:{}:tick", workload().display());
    let uprobe = format!("{}:tk_beta", workload().display());
    // (spec, USDT spec and IP maps, syscall_probes, syscall_nrs, uprobe_groups)
    type Entries = (Option<(u32, u32)>, Option<u32>, Option<u32>, Option<u32>);
    let cases: [(&str, Entries); 4] = [
        ("t:sched:sched_switch", (None, None, None, None)),
        (
            "t:syscalls:sys_enter_getppid",
            (None, Some(2048), None, None),
        ),
        // libbpf's BPF_USDT_MAX_SPEC_CNT and BPF_USDT_MAX_IP_CNT.
        (usdt.as_str(), (Some((256, 1024)), None, None, None)),
        (uprobe.as_str(), (None, None, None, Some(1))),
    ];
    for (spec, want) in cases {
        let mut t = spawn(&funccount(), &[spec]);
        t.wait_ready();
        let maps = bpf_maps_of(t.pid());
        t.signal(libc::SIGINT);
        let out = t.finish(T);
        assert_eq!(out.code(), 0, "{spec}: {}", out.stderr);
        assert!(
            maps.iter().any(|(n, e)| n == "counts" && *e == 1),
            "{spec}: {maps:?}"
        );
        // Names as the kernel keeps them: 15 bytes.
        let entries = |name: &str| maps.iter().find(|(n, _)| n == name).map(|m| m.1);
        let usdt_maps = entries("__bpf_usdt_spec").zip(entries("__bpf_usdt_ip_t"));
        assert_eq!(entries("__bpf_usdt_spec").is_some(), usdt_maps.is_some());
        let got = (
            usdt_maps,
            entries("syscall_probes"),
            entries("syscall_nrs"),
            entries("uprobe_groups"),
        );
        assert_eq!(got, want, "{spec}: {maps:?}");
        // usdt.bpf.h's LINUX_HAS_BPF_COOKIE is the object's one kconfig extern.
        // funccount's own, not the warm-up object's (bpf/warmup.bpf.c), which its
        // thread may not have closed yet.
        let kconfig = maps.iter().any(|(n, _)| n == "funccou.kconfig");
        assert_eq!(kconfig, usdt_maps.is_some(), "{spec}: {maps:?}");
    }
}

#[test]
fn libbpf_feature_probes_are_asked_on_the_opening_thread() {
    // libbpf asks the kernel what it supports at a process's first object load
    // (about 15 syscalls, 9 of them BTF loads). The thread that opens the tool's
    // object ahead loads bpf/warmup.bpf.c, which asks them all: the tool's own
    // load, on its main thread, then loads one BTF, its object's. trace follows
    // the run from its first syscall: funccount is exec'd by a shell that stops
    // itself until trace is attached to its pid.
    let fc_bin = funccount();
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        "kill -STOP $$; exec \"$0\" -d 0.1 t:sched:sched_switch",
        fc_bin.to_str().unwrap(),
    ]);
    let fc = spawn_cmd(cmd);
    let pid = fc.pid();
    wait_stopped(pid, T);
    // BPF_BTF_LOAD is command 18 (include/uapi/linux/bpf.h).
    let mut tr = spawn(
        &tool("trace"),
        &[
            "-p",
            &pid.to_string(),
            "t:syscalls:sys_enter_bpf (args->cmd == 18)",
        ],
    );
    // Its column header is printed once it is attached.
    tr.wait_line(|l| l.starts_with("PID "), T);
    kill(pid, libc::SIGCONT);
    let fc_out = fc.finish(T);
    assert!(fc_out.status.success(), "{}", fc_out.stderr);
    let tr_out = tr.finish(T);
    assert!(tr_out.status.success(), "{}", tr_out.stderr);
    // PID TID COMM FUNC
    let mut main_thread = 0;
    let mut opening_thread = 0;
    for line in tr_out
        .stdout
        .lines()
        .filter(|l| l.trim_end().ends_with("sys_enter_bpf"))
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], pid.to_string(), "{line}");
        match f[2] {
            "open-bpf" => opening_thread += 1,
            _ if f[1] == pid.to_string() => main_thread += 1,
            _ => panic!("a BTF load on another thread: {line}"),
        }
    }
    assert_eq!(main_thread, 1, "{}", tr_out.stdout);
    // The 9 probes and the warm-up object's own BTF.
    assert!(opening_thread >= 10, "{}", tr_out.stdout);
}

#[test]
fn a_tracepoint_the_kernel_refuses_says_why() {
    // It said "EINVAL: not traceable (notrace, inlined, or not a function entry)",
    // the words for a kernel function.
    fails_with(
        &["t:ftrace:print"],
        "nothing could be attached: ftrace:print (the kernel refused it (EINVAL): BPF cannot \
         attach to ftrace's own events or to events defined in tracefs (kprobe, uprobe, \
         synthetic))",
    );
}

#[test]
fn tracepoint_patterns_skip_other_runs_uprobe_groups() {
    let _turn = event_mutex_turn();
    // Other runs' tracefs uprobe groups (tracekit_NS_PID) are listed among the
    // tracepoints, and go when those runs end: `trace 't:*:*'` failed with "no
    // tracepoint tracekit_..._N:g0" when one went between listing and reading
    // its format. Patterns no longer match them. This group's PID is this test
    // process, alive, so no run's sweep removes it meanwhile.
    let group = format!(
        "tracekit_{}_{}",
        pid_namespace_of(std::process::id()),
        std::process::id()
    );
    uprobe_events_command(&format!("p:{group}/g0 /usr/bin/true:0x0"));
    let out = run(&funccount(), &["-d", "0.1", "t:*:g0"], T);
    uprobe_events_command(&format!("-:{group}/g0"));
    assert_eq!(out.code(), 1, "{}", out.stdout);
    assert_eq!(
        out.stderr,
        "funccount: error: no tracepoint matches \"t:*:g0\" (tracepoints are listed under events/ in tracefs)\n"
    );
}

/// The file offset of `sym` in `bin` (what uprobe_events takes), from nm and
/// the program headers.
fn file_offset(bin: &std::path::Path, sym: &str) -> u64 {
    let text = |cmd: &str, args: &[&str]| {
        let out = Command::new(cmd).args(args).arg(bin).output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let nm = text("nm", &[]);
    let addr = nm
        .lines()
        .find_map(|l| l.strip_suffix(&format!(" T {sym}")))
        .map(hex)
        .unwrap_or_else(|| panic!("{sym} not in nm of {}", bin.display()));
    let phdrs = text("readelf", &["-lW"]);
    phdrs
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
        .find_map(|f| {
            let (off, vaddr, filesz) = (hex(&f[1]), hex(&f[2]), hex(&f[4]));
            (vaddr..vaddr + filesz)
                .contains(&addr)
                .then(|| addr - vaddr + off)
        })
        .unwrap()
}

#[test]
fn a_uprobe_another_tracer_holds_with_a_semaphore_is_named() {
    // BCC's and bpftrace's USDT probes with a semaphore register their uprobe
    // with a reference counter; the kernel refuses another probe at that
    // offset with a different one (EINVAL). A tracefs event with one stands
    // in for the other tracer, on a private copy no other test probes.
    let dir = Scratch::new();
    let bin = dir.copy(&prog("traced"));
    let off = file_offset(&bin, "tt_args");
    let event = format!("tkheld_{}/held", std::process::id());
    uprobe_events_command(&format!("p:{event} {}:{off:#x}(0x100)", bin.display()));
    struct Remove(String);
    impl Drop for Remove {
        fn drop(&mut self) {
            let enable = tracefs().join("events").join(&self.0).join("enable");
            let _ = std::fs::write(enable, "0");
            uprobe_events_command(&format!("-:{}", self.0));
        }
    }
    let _remove = Remove(event.clone());
    std::fs::write(tracefs().join("events").join(&event).join("enable"), "1").unwrap();
    for mode in ["multi", "single"] {
        fails_with(
            &["--attach-mode", mode, &format!("{}:tt_args", bin.display())],
            "nothing could be attached: tt_args (the kernel refused a probe at this \
             address (EINVAL): another tracer (BCC, bpftrace, perf) holds one there with \
             a different USDT semaphore, as dmesg's \"ref_ctr_offset mismatch\" says; stop \
             that tracer and retry)",
        );
    }
}
