//! funccount on the host kernel: user functions, libc, tracepoints, USDT, the run
//! loop and every error path. Kernel functions are tested in the guest (tests/guest.rs).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::*;

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

/// [`count_with_pid`] with settings (`VAR=value`) in funccount's environment.
fn count_with_env(env: &[&str], wargs: &[&str], args: &[&str]) -> Output {
    let fc = funccount();
    let mut cmd = vec!["env"];
    cmd.extend_from_slice(env);
    cmd.push(fc.to_str().unwrap());
    trace_workload_via(&cmd, Workload::start(&workload(), wargs), args, T)
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
        "Tracing 1 functions for \"{spec}\"... Hit Ctrl-C to end."
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
            .contains("attached: 3 probes, 1 links (0 kprobe_multi, 0 uprobe_multi), 0 skipped\nuprobes: 3 in 1 tracefs uprobe group, 0 as single perf-event uprobes\n"),
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
fn cgroup_that_is_not_a_cgroup_v2_directory() {
    let dir = Scratch::new();
    let d = dir.0.display().to_string();
    let at = cgroup2_mount().display().to_string();
    let pattern = "t:sched:sched_switch";
    fails_with(
        &["--cgroup", &d, pattern],
        &format!("--cgroup {d}: not a cgroup v2 directory (cgroup v2 is mounted at {at})"),
    );
    fails_with(
        &["--cgroup", "/nonexistent-cgroup", pattern],
        &format!(
            "--cgroup /nonexistent-cgroup: no such directory; give a cgroup v2 directory (cgroup v2 is mounted at {at})"
        ),
    );
}

#[test]
fn libc_function_with_pid() {
    let out = count_with_pid(&["getpid", "4321"], &["c:getpid"]);
    assert_eq!(last_table(&out.stdout), rows(&[("getpid", 4321)]));
}

#[test]
fn timing_line_names_every_phase() {
    let mut cmd = Command::new(funccount());
    cmd.args(["-d", "0.2", "t:sched:sched_switch"])
        .env("TRACEKIT_TIMING", "1");
    // Waited for, not polled: the wall time is the run's.
    let t0 = std::time::Instant::now();
    let out = cmd.output().unwrap();
    let wall = t0.elapsed().as_secs_f64() * 1000.0;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("timing: "))
        .unwrap_or_else(|| panic!("no timing line in {stderr}"));
    for phase in [
        "exec ",
        "options ",
        "tables ",
        "features ",
        "load ",
        "attach ",
        "traced ",
        "first summary ",
        "detach ",
        "; overhead ",
    ] {
        assert!(line.contains(phase), "{phase:?} missing: {line}");
    }
    // The phases are parts of the run: together no longer than it took from
    // spawn to exit here (printed to 0.1 ms under 10 ms, else to 1 ms).
    let ms = |name: &str| -> f64 {
        let at = line.find(&format!("{name} ")).unwrap() + name.len() + 1;
        line[at..].split(' ').next().unwrap().parse().unwrap()
    };
    let (traced, overhead) = (ms("traced"), ms("overhead"));
    assert!(traced >= 200.0, "{line}");
    assert!(traced + overhead <= wall + 1.0, "{line}, in {wall:.1} ms");
    // Without TRACEKIT_TIMING or --debug: no timing line.
    let out = run(&funccount(), &["-d", "0.1", "t:sched:sched_switch"], T);
    assert!(!out.stderr.contains("timing:"), "{}", out.stderr);
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
        out.stderr.contains("Tracing 1 functions for \"c:getpid\""),
        "{}",
        out.stderr
    );
}

/// Reads a one-probe run's first line, its banner (tracing has begun), and
/// closes the pipe it came through.
fn read_banner(child: &mut std::process::Child) {
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("Tracing 1 functions for"), "{first}");
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
    read_banner(&mut child);
    let out = child.wait_with_output().unwrap(); // stdout is closed by now
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn closed_standard_descriptors_are_opened_on_dev_null() {
    // Started with stdin and stderr closed, the tool opens them on /dev/null
    // before anything else can take their numbers (a BPF map as fd 0, say), as
    // Rust's start-up would: the tools have their own entry (common/src/entry.rs).
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec {} -d 1 t:task:task_rename <&- 2>&-",
            funccount().display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    read_banner(&mut child);
    for fd in [0, 2] {
        let target = std::fs::read_link(format!("/proc/{}/fd/{fd}", child.id())).unwrap();
        assert_eq!(target, Path::new("/dev/null"), "fd {fd}");
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
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
    crate::util::fails_with(&funccount(), args, message);
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
    // The kernel would resolve these in the tool's own process.
    for target in ["/proc/self/exe", "/proc/thread-self/exe"] {
        fails_with(
            &[&format!("{target}:main")],
            &format!("probe \"{target}:main\": \"{target}\" is a file of this tool's own process: give the program's path, or /proc/PID/... with its PID"),
        );
    }
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
fn a_closed_pipe_ends_the_run() {
    // `funccount ... | head -1` takes the banner; nobody reads the summary.
    let (code, err) = exit_after_head_1(&funccount(), &["t:syscalls:sys_enter_acct"], T);
    assert_eq!((code, err.as_str()), (0, ""));
}

#[test]
fn attach_modes_of_timing_tools_are_refused() {
    // Whatever the patterns: with tracepoints alone they were ignored.
    for pattern in ["t:sched:sched_switch", "c:getpid"] {
        fails_with(
            &["--attach-mode", "session", pattern],
            "--attach-mode session is for tools that time calls (entry and return)",
        );
        fails_with(
            &["--attach-mode", "fentry", pattern],
            "--attach-mode fentry: fentry/fexit serve a single kernel function, in tools that \
             time calls",
        );
    }
}

#[test]
fn a_signal_during_the_detach_of_a_run_that_ended_is_answered() {
    // A run ended by -d had no stop request: the first SIGTERM during its
    // detach (2 s: syscall events as perf events each wait out an RCU grace
    // period) was taken as one, silently; the man page says it is told.
    let mut cmd = Command::new(funccount());
    cmd.env("TRACEKIT_PERF_SYSCALLS", "1")
        .args(["-d", "0.2", "t:syscalls:sys_enter_get*"]);
    let mut t = spawn_cmd(cmd);
    t.wait_line(|l| l.starts_with("Detaching"), T);
    t.signal(libc::SIGTERM);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(
        out.stderr,
        "funccount: detaching is in progress; it is not interrupted, so no probe is left behind\n"
    );
}

#[test]
fn pid_of_a_zombie() {
    // A child that exited, under a parent that never reaps it: the error said
    // it "exited while the probes were being attached". The parent is this
    // test, which reaps it only at the end (a shell parent could reap it
    // before its exec: a CI run saw the zombie vanish).
    let mut child = Command::new("true").spawn().unwrap();
    let zombie = child.id();
    let state = || {
        let stat = std::fs::read_to_string(format!("/proc/{zombie}/stat")).unwrap_or_default();
        stat.rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
    };
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while state().as_deref() != Some("Z") && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(state().as_deref(), Some("Z"));
    fails_with(
        &["-p", &zombie.to_string(), "c:getpid"],
        &format!(
            "no process with PID {zombie}: it has exited (a zombie its parent has not reaped)"
        ),
    );
    let _ = child.wait();
}

#[test]
fn pid_that_exits_during_the_attach() {
    // A process that lives 20 ms, past funccount's start-up but not its attach
    // of all of libc: the probes after its exit fail (ESRCH), and the error says
    // it exited (it named the first function skipped for another reason).
    let mut exited_during = 0;
    for _ in 0..5 {
        let mut c = Command::new("sleep").arg("0.02").spawn().unwrap();
        let pid = c.id().to_string();
        let reaper = std::thread::spawn(move || c.wait());
        let out = run(&funccount(), &["-p", &pid, "c:*"], T);
        reaper.join().unwrap().unwrap();
        if out.code() == 0 {
            continue; // it exited after the attach: an empty summary
        }
        assert_eq!(out.code(), 1, "{}", out.stderr);
        let during = format!(
            "funccount: error: no process with PID {pid}: it exited while the probes were being \
             attached\n"
        );
        let before = format!("funccount: error: no process with PID {pid}\n");
        // After the notes of IFUNCs sharing their code, the error.
        let last = out.stderr.lines().last().unwrap_or("").to_string() + "\n";
        assert!(last == during || last == before, "{}", out.stderr);
        exited_during += (last == during) as u32;
    }
    assert!(
        exited_during > 0,
        "the process never exited during the attach"
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
fn capabilities_without_tracefs() {
    // CAP_BPF and CAP_PERFMON without root: tracefs (mode 0700, root's) cannot
    // be read, and a tracepoint was "not matched" (it exists). Where tracefs is
    // open to all, the run is allowed and this case does not arise.
    let open_to_all = std::fs::metadata(tracefs())
        .is_ok_and(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o005 == 0o005);
    for pattern in ["t:sched:sched_switch", "t:sched:sched_sw*"] {
        let out = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=+bpf,+perfmon",
                "--ambient-caps=+bpf,+perfmon",
            ])
            .arg(funccount())
            .args(["-d", "0.1", pattern])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        if open_to_all {
            continue;
        }
        assert_eq!(out.status.code(), Some(1), "{pattern}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "funccount: error: cannot read /sys/kernel/tracing/events: permission denied \
             (tracepoints are found in tracefs, which only root may read here; run as root)\n"
        );
    }
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

// User functions of binaries this project did not build: the system libc (with and
// without libc6-dbg's debug files), zlib from its Debian package, a C program built
// without -g, and stripped copies.

const LIBC_N: u64 = 1000;

/// The workload's `libc` mode: exported libc functions, each called an exact number
/// of times (strlen is an IFUNC: the count is its implementation's on this CPU).
fn libc_rows(n: u64) -> Vec<(String, u64)> {
    rows(&[
        ("free", n),
        ("malloc", n),
        ("strlen", 2 * n),
        ("read", 3 * n),
        ("pthread_mutex_lock", 4 * n),
        ("pthread_mutex_unlock", 4 * n),
    ])
}

const LIBC_SPECS: [&str; 6] = [
    "c:malloc",
    "c:free",
    "c:strlen",
    "c:read",
    "c:pthread_mutex_lock",
    "c:pthread_mutex_unlock",
];

fn libc_workload() -> Workload {
    Workload::start(&workload(), &["libc", &LIBC_N.to_string()])
}

#[test]
fn libc_exported_functions_count_exactly() {
    let out = trace_workload(&funccount(), libc_workload(), &LIBC_SPECS, T);
    assert_eq!(last_table(&out.stdout), libc_rows(LIBC_N), "{}", out.stderr);
    assert_eq!(out.stderr, "");
}

#[test]
fn libc_debug_file_adds_internal_names() {
    // libc6-dbg's symtab names malloc's entry __GI___libc_malloc too: asked for by
    // that name, it is counted and shown by it.
    let out = trace_workload(
        &funccount(),
        libc_workload(),
        &["c:__GI___libc_malloc", "c:__libc_malloc"],
        T,
    );
    // Both names are one address: one probe, shown by the exported name asked for.
    assert_eq!(last_table(&out.stdout), rows(&[("__libc_malloc", LIBC_N)]));
}

#[test]
fn libc_without_debug_files_counts_the_same() {
    let cmd = without_debug_files(&funccount());
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let out = trace_workload_via(&cmd, libc_workload(), &LIBC_SPECS, T);
    assert_eq!(last_table(&out.stdout), libc_rows(LIBC_N), "{}", out.stderr);
    // The internal name exists only in the (now hidden) debug file.
    let mut args = cmd[1..].to_vec();
    args.push("c:__GI___libc_malloc");
    let out = run(Path::new(cmd[0]), &args, T);
    assert_eq!(out.code(), 1);
    // Debian's libc.so.6 is stripped: without its debug file only .dynsym is left.
    assert!(
        out.stderr.starts_with("funccount: error: no function in /")
            && out.stderr.contains(
                "/libc.so.6 matches \"c:__GI___libc_malloc\": /lib/x86_64-linux-gnu/libc.so.6 \
                 has no symbol table (it is stripped, and only its "
            )
            && out.stderr.ends_with(
                " exported functions are visible); install its debug symbols (the -dbgsym or \
                 -dbg package) or trace an unstripped build\n"
            ),
        "{}",
        out.stderr
    );
}

#[test]
fn libc_glob_shows_each_address_by_its_exported_name() {
    let out = trace_workload(&funccount(), libc_workload(), &["c:*malloc*"], T);
    let table = last_table(&out.stdout);
    assert!(table.contains(&("malloc".to_string(), LIBC_N)), "{table:?}");
    // Not again under its aliases at the same address.
    for alias in ["__libc_malloc", "__malloc", "__GI___libc_malloc"] {
        assert!(table.iter().all(|(n, _)| n != alias), "{table:?}");
    }
}

#[test]
fn zlib_from_its_debian_package() {
    // libz.so.1 has no symtab and no DWARF: only .dynsym. crc32 tail-calls crc32_z.
    let w = Workload::start(&workload(), &["zlib", "700"]);
    let out = trace_workload(&funccount(), w, &["z:crc32", "z:crc32_z"], T);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("crc32", 700), ("crc32_z", 700)])
    );
}

#[test]
fn c_binary_without_debug_info() {
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "nodebug", &[]);
    let w = Workload::start(&bin, &["plain", "2345"]);
    let spec = format!("{}:uf_target", bin.display());
    let out = trace_workload(&funccount(), w, &[&spec], T);
    assert_eq!(last_table(&out.stdout), rows(&[("uf_target", 2345)]));
}

#[test]
fn one_name_in_two_binaries_is_told_apart() {
    // Two rows of one name said nothing of which was which: each is labelled
    // with its binary where the name is shared; a name of one binary is not.
    let out = trace_two_copies(
        &funccount(),
        ("ufa", 30),
        ("ufb", 70),
        &["{a}:uf_target", "{b}:uf_target", "{a}:uf_tail"],
    );
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("ufa:uf_target", 30), ("ufb:uf_target", 70)])
    );
}

#[test]
fn ifuncs_sharing_their_code_are_said_to() {
    // On x86-64 glibc picks one implementation for memmove and memcpy: a probe
    // on it sees the calls of both, and funccount says so. Where the program
    // finds them apart, each counts its own calls and nothing is said.
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "copies", &[]);
    let how = Command::new(&bin).arg("ifuncs").output().unwrap();
    let shared = String::from_utf8_lossy(&how.stdout).trim() == "shared";
    let w = Workload::start(&bin, &["copies", "40"]);
    let out = trace_workload(&funccount(), w, &["c:memmove"], T);
    let note = "funccount: memmove runs the same code as memcpy on this CPU";
    if shared {
        assert_eq!(last_table(&out.stdout), rows(&[("memmove", 120)]));
        assert!(
            out.stderr.contains(note) && out.stderr.contains("also counts the calls of memcpy"),
            "{}",
            out.stderr
        );
    } else {
        assert_eq!(last_table(&out.stdout), rows(&[("memmove", 40)]));
        assert!(!out.stderr.contains(note), "{}", out.stderr);
    }
}

#[test]
fn cold_parts_are_counted() {
    // Only return hooks are refused on a cold part (tests/funclatency.rs): an
    // entry counts the jumps into it, and the workload checks its results.
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "cold", &[]);
    let w = Workload::start(&bin, &["cold", "60"]);
    let spec = format!("{}:uf_split*", bin.display());
    let out = trace_workload(&funccount(), w, &[&spec], T);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("uf_split.cold", 60), ("uf_split", 120)])
    );
}

#[test]
fn stripped_binary_exports_only() {
    let dir = Scratch::new();
    // Stripped, its functions are gone, and the message says why.
    let bin = build_userfuncs(&dir, "built", &[]);
    let stripped = stripped_copy(&dir, &bin, "stripped");
    let spec = format!("{}:uf_target", stripped.display());
    let p = stripped.display();
    fails_with(
        &[&spec],
        &format!(
            "no function in {p} matches \"{spec}\": {p} has no symbol table (it is stripped, \
             and exports no functions); install its debug symbols (the -dbgsym or -dbg \
             package) or trace an unstripped build"
        ),
    );
    // Functions it exports (-rdynamic) are still there.
    let bin = build_userfuncs(&dir, "exports", &["-rdynamic"]);
    let stripped = stripped_copy(&dir, &bin, "exports-stripped");
    let w = Workload::start(&stripped, &["plain", "432"]);
    let spec = format!("{}:uf_target", stripped.display());
    let out = trace_workload(&funccount(), w, &[&spec], T);
    assert_eq!(last_table(&out.stdout), rows(&[("uf_target", 432)]));
}

#[test]
fn stripped_binary_with_its_debug_file_by_debuglink() {
    // As distributions split them: the symbols in a .debug file, found through the
    // binary's .gnu_debuglink in <dir>/.debug/ (its build ID is in no debug root).
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "split", &["-g"]);
    std::fs::create_dir(dir.0.join(".debug")).unwrap();
    let debug = dir.0.join(".debug").join("split.debug");
    let stripped = dir.0.join("split-stripped");
    for args in [
        vec!["--only-keep-debug".into(), bin.clone(), debug.clone()],
        vec![
            "--strip-all".into(),
            format!("--add-gnu-debuglink={}", debug.display()).into(),
            bin.clone(),
            stripped.clone(),
        ],
    ] {
        let st = Command::new("objcopy").args(&args).status().unwrap();
        assert!(st.success());
    }
    let w = Workload::start(&stripped, &["plain", "321"]);
    let spec = format!("{}:uf_target", stripped.display());
    let out = trace_workload(&funccount(), w, &[&spec], T);
    assert_eq!(last_table(&out.stdout), rows(&[("uf_target", 321)]));
}

#[test]
fn entries_a_uprobe_cannot_step_are_skipped_with_the_reason() {
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "entries", &[]);
    let p = bin.display();
    fails_with(
        &[&format!("{p}:uf_evex")],
        &format!(
            "uf_evex in {p} cannot be traced: its first instruction (`vpbroadcastb %esi,%ymm17`) \
             is AVX-512 (EVEX-encoded), which a uprobe's out-of-line single step does not \
             execute correctly: the traced program would compute wrong results"
        ),
    );
    // The program checks every result (and runs the AVX ones where the CPU has them):
    // it exits 0 only when nothing corrupted it.
    let w = Workload::start(&bin, &["entries", "5000"]);
    let out = trace_workload(&funccount(), w, &["-D", &format!("{p}:uf_*")], T);
    assert_eq!(last_table(&out.stdout), rows(&[("uf_sse", 5000)]));
    assert!(
        out.stderr.contains(
            "  skipped uf_vex: its first instruction (`vmovd %esi,%xmm0`) is AVX (VEX-encoded) \
             on vector registers"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("  skipped uf_evex: its first instruction"),
        "{}",
        out.stderr
    );
}

#[test]
fn all_of_libc_leaves_the_traced_process_correct() {
    // The sweep's victim: with a probe on every libc function, its own snprintf,
    // strchr, strlen... results are checked on every round.
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "victim", &[]);
    let w = Workload::start(&bin, &["victim", "3000"]);
    let out = trace_workload(&funccount(), w, &["c:*"], Duration::from_secs(240));
    let table = last_table(&out.stdout);
    assert!(table.contains(&("snprintf".to_string(), 3000)), "{table:?}");
}

/// A 32-bit ELF header (i386 executable), as `gcc -m32` would start a file.
fn elf32_header() -> Vec<u8> {
    let mut h = vec![0x7f, b'E', b'L', b'F', 1, 1, 1];
    h.resize(16, 0);
    for v in [2u16, 3] {
        h.extend(v.to_le_bytes()); // e_type EXEC, e_machine 386
    }
    h.extend(1u32.to_le_bytes()); // e_version
    h.extend([0u8; 16]); // e_entry, e_phoff, e_shoff, e_flags
    for v in [52u16, 32, 0, 40, 0, 0] {
        h.extend(v.to_le_bytes()); // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
    }
    h
}

#[test]
fn files_that_are_not_binaries_say_what_they_are() {
    let dir = Scratch::new();
    let file = |name: &str, data: &[u8]| {
        let p = dir.0.join(name);
        std::fs::write(&p, data).unwrap();
        p.display().to_string()
    };
    let script = file("script", b"#!/bin/sh\necho hi\n");
    let elf32 = file("elf32", &elf32_header());
    let elf = std::fs::read(workload()).unwrap();
    let truncated = file("truncated", &elf[..100]);
    let empty = file("empty", b"");
    let magic_only = file("magic-only", b"\x7fELF");
    let cases: Vec<(String, String)> = vec![
        (
            "/etc".into(),
            "/etc is a directory, not an executable or library".into(),
        ),
        (
            "/dev/null".into(),
            "/dev/null is a character device, not an executable or library".into(),
        ),
        (
            "/etc/passwd".into(),
            "/etc/passwd is not an ELF file".into(),
        ),
        (
            script.clone(),
            format!("{script} is not an ELF file (it is a script: trace its interpreter)"),
        ),
        (
            elf32.clone(),
            format!("{elf32} is a 32-bit ELF file; only 64-bit binaries can be traced"),
        ),
        (
            empty.clone(),
            format!("{empty} is an empty file, not an ELF file"),
        ),
        (
            magic_only.clone(),
            format!("{magic_only} is a truncated or corrupt ELF file (no valid ELF class)"),
        ),
        (
            "/no/such/dir/x".into(),
            "/no/such/dir/x: no such file".into(),
        ),
        (
            "/etc/passwd/x".into(),
            "/etc/passwd/x: a component of the path is not a directory".into(),
        ),
    ];
    for (path, why) in &cases {
        for spec in [format!("{path}:foo"), format!("u:{path}:probe")] {
            fails_with(&[&spec], &format!("probe \"{spec}\": {why}"));
        }
    }
    // A truncated ELF file: the header parses, the tables it points to are missing.
    for spec in [format!("{truncated}:foo"), format!("u:{truncated}:probe")] {
        let out = run(&funccount(), &[&spec], T);
        assert_eq!(out.code(), 1);
        assert!(
            out.stderr.starts_with(&format!(
                "funccount: error: probe \"{spec}\": {truncated} is a truncated or corrupt ELF file ("
            )),
            "{}",
            out.stderr
        );
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    }
}

#[test]
fn unreadable_paths_are_shown_escaped_and_short() {
    // A 5,000-byte path: one line, its start and its length.
    let long = format!("/tmp/{}", "x".repeat(4995));
    let spec = format!("{long}:foo");
    let short = format!("{}... (5000 bytes)", &long[..80]);
    fails_with(
        &[&spec],
        &format!(
            "probe \"{}... (5004 bytes)\": {short}: file name too long",
            &spec[..80]
        ),
    );
    // Control bytes (a terminal escape, a newline) are escaped, never echoed raw.
    fails_with(
        &["/tmp/a\x1b[31mb\nc:foo"],
        "probe \"/tmp/a\\x1b[31mb\\x0ac:foo\": /tmp/a\\x1b[31mb\\x0ac: no such file",
    );
}

#[test]
fn fifo_as_the_binary_fails_at_once() {
    let dir = Scratch::new();
    let fifo = dir.0.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid path string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let p = fifo.display();
    for spec in [format!("{p}:foo"), format!("u:{p}:probe")] {
        let start = std::time::Instant::now();
        let out = run(&funccount(), &[&spec], Duration::from_secs(20));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        assert_eq!(out.code(), 1);
        assert_eq!(
            out.stderr,
            format!(
                "funccount: error: probe \"{spec}\": {p} is a FIFO (named pipe), not an executable or library\n"
            )
        );
    }
}

/// The libc this test process runs with, from its own memory map.
fn own_libc() -> PathBuf {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .map(PathBuf::from)
        .expect("libc in /proc/self/maps")
}

#[test]
fn one_file_by_two_paths_is_one_probe() {
    let dir = Scratch::new();
    let link = dir.0.join("libc-link.so");
    std::os::unix::fs::symlink(own_libc(), &link).unwrap();
    let spec = format!("{}:malloc", link.display());
    let out = trace_workload(&funccount(), libc_workload(), &["c:malloc", &spec], T);
    assert_eq!(last_table(&out.stdout), rows(&[("malloc", LIBC_N)]));
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
    w.go();
    let out = t.finish(T);
    assert!(w.wait().success());
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
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
fn bad_numbers_are_usage_errors() {
    for (args, msg) in [
        (
            vec!["-p", "-5"],
            "invalid value '-5' for '--pid <PID>': '-5' is not a process id (a positive integer)",
        ),
        (
            vec!["-c", "-1"],
            "invalid value '-1' for '--cpu <CPU>': '-1' is not a CPU number (0, 1, ...)",
        ),
        (
            vec!["-i", "-1"],
            "invalid value '-1' for '--interval <SECS>': '-1' must be a positive number of seconds",
        ),
        (
            vec!["-d", "18446744073709551616"],
            "'18446744073709551616' is too long: at most 4294967295 seconds",
        ),
        (vec!["-i", "1e300"], "'1e300' is too long"),
        (
            vec!["-d", "1e-300"],
            "'1e-300' is too short: at least 0.001 seconds",
        ),
    ] {
        let mut all = args.clone();
        all.push("t:sched:sched_switch");
        let out = run(&funccount(), &all, T);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(msg), "{args:?}: {}", out.stderr);
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
}

#[test]
fn unwritable_stderr_is_not_a_crash() {
    // An error, and a warning on a successful run, with stderr on a full device.
    for (args, code) in [
        (vec!["nosuchlib:foo"], 1),
        (vec!["-d", "0.2", "-p", "1", "t:sched:sched_switch"], 0),
    ] {
        let st = Command::new(funccount())
            .args(&args)
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            )
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(code), "{args:?}");
    }
}

#[test]
fn full_stdout_says_what_failed() {
    // --help and --version too (clap said nothing and exited 0).
    for args in [
        &["--help"][..],
        &["-V"],
        &["-d", "0.2", "t:sched:sched_switch"],
    ] {
        full_stdout(args);
    }
}

fn full_stdout(args: &[&str]) {
    let out = Command::new(funccount())
        .args(args)
        .stdout(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "funccount: error: writing the output: No space left on device (os error 28)\n"
    );
}

#[test]
fn control_bytes_are_escaped_in_messages() {
    fails_with(
        &["x\x1b[31m:a\nb:c"],
        "bad probe \"x\\x1b[31m:a\\x0ab:c\": probe type must be 'p', 't' or 'u', not 'x\\x1b[31m'",
    );
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
            l.strip_prefix("uprobes: 3 in ")?
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
            "  skipped tk_refused: the kernel refuses to single-step its first instruction (ENOTSUPP)\n"
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
            l.strip_prefix("uprobes: 1500 in ")?
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
        common::system::INIT_PIDNS_INO,
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
        "nothing could be attached: ftrace:print: the kernel refused it (EINVAL): BPF cannot \
         attach to ftrace's own events or to events defined in tracefs (kprobe, uprobe, \
         synthetic)",
    );
}

#[test]
fn a_signal_while_attaching_says_how_far_it_got() {
    // Ctrl-C 20 ms into attaching ~2,300 tracepoints (which takes far longer):
    // no "Tracing 0 functions ... Hit Ctrl-C to end", but how many were attached.
    let t = spawn(&funccount(), &["t:*:*"]);
    std::thread::sleep(Duration::from_millis(20));
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(!out.stdout.contains("Tracing"), "{}", out.stdout);
    let line = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("funccount: stopped by a signal while attaching: "))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    let (n, m) = line
        .strip_suffix(" probes were attached")
        .and_then(|r| r.split_once(" of "))
        .unwrap_or_else(|| panic!("{line}"));
    let (n, m): (usize, usize) = (n.parse().unwrap(), m.parse().unwrap());
    assert!(n < m && m > 1000, "{line}");
}
