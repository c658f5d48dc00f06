//! funccount on the host kernel: user functions, libc, tracepoints, USDT, the run
//! loop and every error path. Kernel functions are tested in the guest (tests/guest.rs).

mod util;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use util::*;

const T: Duration = Duration::from_secs(60);

fn funccount() -> PathBuf {
    tool("funccount")
}

fn workload() -> PathBuf {
    prog("workload")
}

/// Runs funccount `args` against a workload started with `wargs`, filtered to its
/// PID; funccount ends by itself when the workload exits.
fn count_with_pid(wargs: &[&str], args: &[&str]) -> Output {
    trace_workload(&funccount(), Workload::start(&workload(), wargs), args, T)
}

#[test]
fn user_function_counted_exactly() {
    // A private copy of the binary: only this test's process runs it, so no -p.
    let dir = Scratch::new();
    let bin = dir.copy(&workload());
    let w = Workload::start(&bin, &["funcs", "1234"]);
    let spec = format!("{}:tk_alpha", bin.display());
    let mut t = spawn(&funccount(), &[&spec]);
    t.wait_ready();
    w.go();
    assert!(w.wait().success());
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_eq!(last_table(&out.stdout), rows(&[("tk_alpha", 1234)]));
    assert!(out.stdout.contains(&format!(
        "Tracing 1 function for \"{spec}\"... Hit Ctrl-C to end."
    )));
    assert!(out.stdout.ends_with("Detaching...\n"), "{}", out.stdout);
}

#[test]
fn user_glob_counts_each_function() {
    let dir = Scratch::new();
    let bin = dir.copy(&workload());
    let w = Workload::start(&bin, &["funcs", "500"]);
    let spec = format!("{}:tk_*", bin.display());
    let mut t = spawn(&funccount(), &[&spec]);
    t.wait_ready();
    w.go();
    assert!(w.wait().success());
    t.signal(libc::SIGTERM);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_alpha", 500), ("tk_beta", 1000), ("tk_gamma", 1500)])
    );
}

#[test]
fn single_uprobes_count_the_same() {
    let dir = Scratch::new();
    let bin = dir.copy(&workload());
    let w = Workload::start(&bin, &["funcs", "300"]);
    let spec = format!("{}:tk_*", bin.display());
    let mut t = spawn(&funccount(), &["--attach-mode", "single", "-D", &spec]);
    t.wait_ready();
    w.go();
    assert!(w.wait().success());
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert!(
        out.stderr
            .contains("attach mode: user functions: single uprobes (3 functions)"),
        "{}",
        out.stderr
    );
    // The three functions' page offsets differ: one tracefs uprobe group.
    assert!(
        out.stderr
            .contains("attached: 3 probes, 1 links (0 kprobe_multi, 0 uprobe_multi), 0 skipped\nuser functions: 3 in 1 tracefs uprobe group, 0 as single perf-event uprobes\n"),
        "{}",
        out.stderr
    );
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_alpha", 300), ("tk_beta", 600), ("tk_gamma", 900)])
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
    w.go();
    let out = t.finish(T);
    assert!(w.wait().success());
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
    let n: usize = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Tracing ")?.split(' ').next()?.parse().ok())
        .unwrap();
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
    assert!(
        out.stdout.contains("Tracing 3 functions for"),
        "{}",
        out.stdout
    );
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
fn sigterm_prints_the_summary_and_exits_zero() {
    let w = Workload::start(&workload(), &["getppid", "321", "--hold"]);
    let pid = w.pid.to_string();
    let mut t = spawn(&funccount(), &["-p", &pid, "t:syscalls:sys_enter_getppid"]);
    t.wait_ready();
    w.go();
    // The workload holds after its calls; give them time to complete, then stop us.
    std::thread::sleep(Duration::from_millis(300));
    t.signal(libc::SIGTERM);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("syscalls:sys_enter_getppid", 321)])
    );
    assert!(out.stdout.ends_with("Detaching...\n"));
    w.go();
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
    let objs: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let last = objs.last().expect("a JSON summary");
    assert_eq!(last["final"], true);
    assert_eq!(
        last["counts"],
        serde_json::json!([{ "func": "getpid", "count": 64 }])
    );
    assert!(
        out.stderr.contains("Tracing 1 function for \"c:getpid\""),
        "{}",
        out.stderr
    );
}

#[test]
fn closed_stdout_ends_quietly() {
    // As `funccount -i 0.2 ... | head -1`: the reader goes away after one line.
    let mut child = Command::new(funccount())
        .args(["-i", "0.2", "t:sched:sched_switch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("Tracing 1 function"), "{first}");
    let out = child.wait_with_output().unwrap(); // stdout is closed by now
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
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

fn fails_with(args: &[&str], message: &str) {
    util::fails_with(&funccount(), args, message);
}

#[test]
fn bad_patterns() {
    fails_with(
        &["x:y:z"],
        "bad probe \"x:y:z\": probe type must be 'p', 't' or 'u', not 'x'",
    );
    fails_with(
        &["a:b:c:d"],
        "bad probe \"a:b:c:d\": too many ':'-separated parts (at most 3: TYPE:LIBRARY:NAME)",
    );
    fails_with(
        &["t:sched"],
        "bad probe \"t:sched\": 't:' needs three parts: t:CATEGORY:EVENT",
    );
    fails_with(
        &["-r", "c:("],
        "bad probe \"c:(\": invalid regular expression: unclosed group",
    );
}

#[test]
fn nothing_matched() {
    let bin = workload();
    fails_with(
        &[&format!("{}:nothing_here*", bin.display())],
        &format!(
            "no function in {} matches \"{}:nothing_here*\"",
            bin.display(),
            bin.display()
        ),
    );
    fails_with(
        &["t:nosuchcategory:*"],
        "no tracepoint matches \"t:nosuchcategory:*\" (tracepoints are listed under events/ in tracefs)",
    );
    fails_with(
        &[&format!("u:{}:nosuchprobe", bin.display())],
        &format!(
            "no USDT probe in {} matches \"u:{}:nosuchprobe\"",
            bin.display(),
            bin.display()
        ),
    );
    fails_with(
        &["nosuchlib:foo"],
        "probe \"nosuchlib:foo\": cannot find \"nosuchlib\": no libnosuchlib.so in ld.so.cache, no executable on PATH",
    );
}

#[test]
fn pid_that_does_not_exist() {
    let mut c = Command::new("true").spawn().unwrap();
    let gone = c.id();
    c.wait().unwrap();
    fails_with(
        &["-p", &gone.to_string(), "t:sched:sched_switch"],
        &format!("no process with PID {gone}"),
    );
}

#[test]
fn not_root() {
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(funccount())
        .arg("t:sched:sched_switch")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "funccount: error: tracing needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN); run it with sudo\n"
    );
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
    assert!(
        out.stderr.starts_with("funccount: error: kernel functions cannot be traced here: it was built without kprobes (CONFIG_KPROBES is not set)"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.ends_with("tracepoints (t:CATEGORY:EVENT), user functions (LIBRARY:FUNCTION) and USDT probes (u:LIBRARY:PROBE) still work\n"),
        "{}",
        out.stderr
    );
}

#[test]
fn bad_cpu() {
    // /sys/devices/system/cpu/possible is "0-N" (or "0" on one CPU).
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let last = possible.trim().rsplit('-').next().unwrap();
    fails_with(
        &["-c", "4096", "t:sched:sched_switch"],
        &format!("no CPU 4096 (this machine has CPUs 0-{last})"),
    );
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
fn refused_function_is_skipped_and_the_rest_stay_in_uprobe_multi() {
    // tk_refused starts with an instruction uprobes refuse; the kernel then refuses
    // any uprobe_multi link holding it. Only it is skipped: the others are counted
    // exactly, in uprobe_multi links (no single uprobes).
    let out = trace_refused(&[]);
    let attached = out
        .stderr
        .lines()
        .find(|l| l.starts_with("attached: "))
        .unwrap_or_else(|| panic!("{}", out.stderr));
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
            l.strip_prefix("user functions: 3 in ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(
        out.stderr.contains(&format!(
            "attached: 3 probes, {groups} links (0 kprobe_multi, 0 uprobe_multi), 1 skipped\n"
        )),
        "{}",
        out.stderr
    );
}

/// funccount -D ARGS on the `refused` C program's tk_* functions: exact counts
/// for the three it calls, tk_refused skipped with the reason.
fn trace_refused(args: &[&str]) -> Output {
    let dir = Scratch::new();
    let bin = build_c(&dir, "refused");
    let mut p = CProg::start(&bin);
    let pid = p.pid.to_string();
    let spec = format!("{}:tk_*", bin.display());
    let mut all = vec!["-D", "-p", &pid, &spec];
    all.extend_from_slice(args);
    let mut t = spawn(&funccount(), &all);
    t.wait_ready();
    p.go();
    let out = t.finish(T);
    assert!(p.wait().success());
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_one", 10), ("tk_two", 20), ("tk_three", 30)])
    );
    assert!(
        out.stderr.contains(
            "  skipped tk_refused: uprobes cannot probe this function: the kernel refuses to single-step its first instruction\n"
        ),
        "{}",
        out.stderr
    );
    out
}

#[test]
fn second_signal_during_detach_leaves_no_breakpoint() {
    // Single uprobes on 100 functions of a process that keeps running; a second
    // SIGINT right after "Detaching..." must not cut the detach short: the
    // process' code must be the file's again, and every link of the tool gone.
    // Single perf-event uprobes take about 100 ms each to detach, so there the
    // second signal lands in the middle of it; tracefs uprobe groups are checked too.
    for perf_uprobes in ["1", "0"] {
        let dir = Scratch::new();
        let bin = build_many_functions(&dir, 100);
        let p = CProg::start(&bin);
        let pid = p.pid.to_string();
        let spec = format!("{}:fn_*", bin.display());
        let mut cmd = Command::new(funccount());
        cmd.env("TRACEKIT_PERF_UPROBES", perf_uprobes).args([
            "--attach-mode",
            "single",
            "-p",
            &pid,
            &spec,
        ]);
        let mut t = spawn_cmd(cmd);
        t.wait_ready();
        assert_eq!(code_bytes_changed(p.pid, &bin), 100, "one int3 per probe");
        let links = bpf_link_ids_of(t.pid());
        assert!(!links.is_empty());
        t.signal(libc::SIGINT);
        t.wait_line(|l| l == "Detaching...", T);
        t.signal(libc::SIGINT);
        t.signal(libc::SIGTERM);
        let out = t.finish(Duration::from_secs(300));
        assert_eq!(
            code_bytes_changed(p.pid, &bin),
            0,
            "breakpoints left behind"
        );
        assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
        let left: Vec<u32> = links
            .into_iter()
            .filter(|id| bpf_link_exists(*id))
            .collect();
        assert!(left.is_empty(), "links left: {left:?}");
    }
}

#[test]
fn too_few_file_descriptors_fail_before_attaching() {
    // `ulimit -n 40` sets the hard limit too, so it cannot be raised: the run must
    // fail before attaching anything, saying how many descriptors it needs.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 40 && exec {} -d 5 't:sched:*'",
            funccount().display()
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let need: usize = stderr
        .strip_prefix("funccount: error: this run needs ")
        .and_then(|r| r.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(need > 40, "{stderr}");
    let probes = stderr
        .split(" file descriptors (")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(
        stderr,
        format!(
            "funccount: error: this run needs {need} file descriptors ({probes} for its probes), \
             over the open-file limit of 40: raise it with `ulimit -n {need}` (or `prlimit \
             --nofile={need}`), or trace fewer probes\n"
        )
    );
}

#[test]
fn soft_file_limit_is_raised_to_the_hard_limit() {
    // A low soft limit under a high hard one is no obstacle: it is raised.
    let w = Workload::start(&workload(), &["getppid", "100"]);
    let pid = w.pid.to_string();
    let mut t = Command::new("sh");
    t.arg("-c").arg(format!(
        "ulimit -S -n 20 && exec {} -p {pid} 't:sched:*' t:syscalls:sys_enter_getppid",
        funccount().display()
    ));
    let mut t = spawn_cmd(t);
    t.wait_ready();
    w.go();
    let out = t.finish(T);
    assert!(w.wait().success());
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert!(
        last_table(&out.stdout).contains(&("syscalls:sys_enter_getppid".to_string(), 100)),
        "{}",
        out.stdout
    );
}

/// The `-D` line saying how tracepoints were attached.
fn tracepoint_mechanisms(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("tracepoints: "))
        .unwrap_or_else(|| panic!("no tracepoints line in:\n{stderr}"))
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
    let n: usize = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Tracing ")?.split(' ').next()?.parse().ok())
        .unwrap();
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        format!("tracepoints: 0 as raw tracepoint links, {n} syscall events through 2 raw sys_enter/sys_exit links, 0 as perf events")
    );
}

#[test]
fn syscall_exit_counted_exactly_without_kernel_reads() {
    // As under lockdown=confidentiality: sys_exit cannot read the syscall number
    // from the registers, so sys_enter remembers it per thread.
    let w = Workload::start(&workload(), &["getppid", "432"]);
    let pid = w.pid.to_string();
    let mut cmd = Command::new(funccount());
    cmd.env("TRACEKIT_NO_KERNEL_READS", "1").args([
        "-D",
        "-p",
        &pid,
        "t:syscalls:sys_exit_getppid",
    ]);
    let mut t = spawn_cmd(cmd);
    t.wait_ready();
    w.go();
    let out = t.finish(T);
    assert!(w.wait().success());
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
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
    // task:task_rename fires once per prctl(PR_SET_NAME) of the workload.
    let out = count_with_pid(&["rename", "345"], &["-D", "t:task:task_rename"]);
    assert_eq!(last_table(&out.stdout), rows(&[("task:task_rename", 345)]));
    let raw = if common_raw_tp_cookies() { 1 } else { 0 };
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        format!(
            "tracepoints: {raw} as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, {} as perf events",
            1 - raw
        )
    );
}

/// Whether this kernel has raw tracepoint cookies (6.10+): the host's does.
fn common_raw_tp_cookies() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (v.next().unwrap(), v.next().unwrap()) >= (6, 10)
}

#[test]
fn many_single_uprobes_count_exactly_in_groups() {
    // 1,500 tiny functions: many share a page offset, so they need several
    // tracefs uprobe groups; each function is counted exactly, and the groups'
    // events are gone afterwards.
    let dir = Scratch::new();
    let bin = build_many_functions(&dir, 1500);
    let mut p = CProg::start(&bin);
    let pid = p.pid.to_string();
    let spec = format!("{}:fn_*", bin.display());
    let mut t = spawn(
        &funccount(),
        &["-D", "--attach-mode", "single", "-p", &pid, &spec],
    );
    t.wait_ready();
    let tool = t.pid();
    assert_eq!(
        code_bytes_changed(p.pid, &bin),
        1500,
        "one int3 per function"
    );
    p.go();
    let out = t.finish(T);
    assert!(p.wait().success());
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    let table = last_table(&out.stdout);
    let want: Vec<(String, u64)> = (0..1500).map(|i| (format!("fn_{i:04}"), 1)).collect();
    let mut got = table.clone();
    got.sort();
    assert_eq!(got, want);
    let groups: usize = out
        .stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("user functions: 1500 in ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(groups > 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "attached: 1500 probes, {groups} links (0 kprobe_multi, 0 uprobe_multi), 0 skipped\n"
        )),
        "{}",
        out.stderr
    );
    let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap();
    assert!(!events.contains(&format!("tracekit_{tool}/")), "{events}");
}

#[test]
fn ctrl_c_while_attaching_stops_and_detaches_promptly() {
    // SIGINT as soon as the plan is printed (before the BPF object is loaded):
    // attaching stops short of the whole set, everything attached is detached and
    // the summary printed, all within seconds.
    let mut t = spawn(&funccount(), &["-D", "t:*:*"]);
    let matched: usize = t
        .wait_line(|l| l.starts_with("pattern \"t:*:*\": "), T)
        .split(": ")
        .nth(1)
        .and_then(|n| n.split(' ').next()?.parse().ok())
        .unwrap();
    t.wait_line(|l| l.starts_with(&format!("  probe {}: ", matched - 1)), T);
    t.signal(libc::SIGINT);
    let sent = std::time::Instant::now();
    let links = bpf_link_ids_of(t.pid());
    let out = t.finish(T);
    let took = sent.elapsed();
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let attached: usize = out
        .stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("attached: ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(attached < matched, "{attached} of {matched} attached");
    assert!(out.stdout.ends_with("Detaching...\n"), "{}", out.stdout);
    let left: Vec<u32> = links
        .into_iter()
        .filter(|id| bpf_link_exists(*id))
        .collect();
    assert!(left.is_empty(), "links left: {left:?}");
}
