//! A run from start to exit, shared by the tools: signals (during the attach,
//! the run and the detach), closed or full stdout and stderr, closed standard
//! descriptors, a target that exits or is a zombie, the timing line, and
//! file-descriptor limits. Driven by funccount.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::funccount::{fails_with, funccount, workload};
use crate::util::*;

const T: Duration = Duration::from_secs(60);

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

/// Reads a one-probe run's first line, its banner (tracing has begun), and
/// closes the pipe it came through.
/// Reads the child's banner line; the rest of its stdout is the returned
/// reader's. Dropping it closes the pipe, which ends the run.
fn read_banner(child: &mut std::process::Child) -> BufReader<std::process::ChildStdout> {
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("Tracing 1 functions for"), "{first}");
    stdout
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
    drop(read_banner(&mut child));
    let out = child.wait_with_output().unwrap(); // stdout is closed by now
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn closed_standard_descriptors_are_opened_on_dev_null() {
    // Started with stdin and stderr closed, the tool opens them on /dev/null
    // before anything else can take their numbers (a BPF map as fd 0, say), as
    // Rust's start-up would: the tools have their own entry (common/src/run/entry.rs).
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec {} -d 60 t:task:task_rename <&- 2>&-",
            funccount().display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Its stdout is kept open while the descriptors are looked at: a closed
    // pipe ends the run at once (a dropped reader here had the run gone
    // before the look, once, under CI's load), then it is stopped.
    let _stdout = read_banner(&mut child);
    let fds: Vec<_> = [0, 2]
        .map(|fd| std::fs::read_link(format!("/proc/{}/fd/{fd}", child.id())))
        .into_iter()
        .collect();
    crate::util::kill(child.id(), libc::SIGINT);
    assert_eq!(child.wait().unwrap().code(), Some(0));
    for (fd, target) in [0, 2].iter().zip(fds) {
        assert_eq!(target.unwrap(), Path::new("/dev/null"), "fd {fd}");
    }
}

#[test]
fn a_closed_pipe_ends_the_run() {
    // `funccount ... | head -1` takes the banner; nobody reads the summary.
    let (code, err) = exit_after_head_1(&funccount(), &["t:syscalls:sys_enter_acct"], T);
    assert_eq!((code, err.as_str()), (0, ""));
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
    let _turn = event_mutex_turn();
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
fn second_signal_during_detach_leaves_no_breakpoint() {
    let _turn = event_mutex_turn();
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
        assert_links_gone(links);
    }
}

#[test]
fn too_few_file_descriptors_fail_before_attaching() {
    // `ulimit -n 40` sets the hard limit too, so it cannot be raised: the run must
    // fail before attaching anything, saying how many descriptors it needs.
    let need = refused_for_want_of_descriptors(&funccount(), "-d 5 't:sched:*'");
    assert!(need > 40, "needs {need}");
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
    let out = t.finish_after(w, T);
    assert!(
        last_table(&out.stdout).contains(&("syscalls:sys_enter_getppid".to_string(), 100)),
        "{}",
        out.stdout
    );
}

#[test]
fn ctrl_c_while_attaching_stops_and_detaches_promptly() {
    let _turn = event_mutex_turn();
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
    assert_ends_with(&out.stdout, "Detaching...\n");
    assert_links_gone(links);
}

#[test]
fn a_signal_while_attaching_says_how_far_it_got() {
    let _turn = event_mutex_turn();
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

/// Waits until process `pid` handles signal `sig` (its SigCgt mask has it): the
/// tool has installed its handlers, so a delay counted from now is a delay into
/// the run, not into exec.
fn wait_handled(pid: u32, sig: i32) {
    let end = std::time::Instant::now() + T;
    while std::time::Instant::now() < end {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0);
        if caught & 1 << (sig - 1) != 0 {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    panic!("process {pid} never handled signal {sig}");
}

#[test]
fn trace_stopped_while_attaching_says_how_far_it_got() {
    let _turn = event_mutex_turn();
    // Sweep bug 7: trace 't:*:*' stopped 3-60 ms after start exited 1 ("nothing
    // could be attached"), then printed its header as if tracing. Every tool
    // goes through Session::begins: exit 0, how far attaching got, no header.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        for ms in [5, 20, 60] {
            let t = spawn(&tool("trace"), &["t:*:*"]);
            wait_handled(t.pid(), sig);
            std::thread::sleep(Duration::from_millis(ms));
            t.signal(sig);
            let out = t.finish(T);
            let what = format!("signal {sig} at {ms} ms: {}", out.stderr);
            assert_eq!(out.code(), 0, "{what}");
            assert_eq!(out.stdout, "", "{what}");
            let line = out
                .stderr
                .lines()
                .find_map(|l| l.strip_prefix("trace: stopped by a signal while attaching: "))
                .unwrap_or_else(|| panic!("{what}"));
            let (n, m) = line
                .strip_suffix(" probes were attached")
                .and_then(|r| r.split_once(" of "))
                .unwrap_or_else(|| panic!("{what}"));
            let (n, m): (usize, usize) = (n.parse().unwrap(), m.parse().unwrap());
            assert!(n < m && m > 1000, "{what}");
            assert!(!out.stderr.contains("error"), "{what}");
        }
    }
}

/// The tracefs uprobe events of group `group` (`tracekit_<ns>_<pid>/`) now.
fn group_events(group: &str) -> usize {
    uprobe_events()
        .lines()
        .filter(|l| l.contains(group))
        .count()
}

/// The child processes of `pid` (from /proc: the fourth field of stat).
fn children_of(pid: u32) -> Vec<u32> {
    let mut kids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let after = stat.rsplit_once(") ").map_or("", |r| r.1);
        if after.split(' ').nth(1).and_then(|v| v.parse().ok()) == Some(pid) {
            kids.push(p);
        }
    }
    kids
}

/// Whether `pid` is alive (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s.rsplit_once(") ")?.1.starts_with('Z')))
        == Some(false)
}

#[test]
fn kill_9_in_group_mode_leaves_no_uprobe_event() {
    let _turn = event_mutex_turn();
    // Sweep bug 8: kill -9 of a run that made tracefs uprobe groups (single
    // mode, and auto mode without uprobe_multi) left its events until another
    // group-mode run. Its guardian removes them, also when the run's whole
    // process group is killed; and the guardian is gone then too.
    let dir = Scratch::new();
    let bin = build_many_functions(&dir, 300);
    let spec = format!("{}:fn_*", bin.display());
    for whole_group in [false, true] {
        let p = CProg::start(&bin);
        let pid = p.pid.to_string();
        let mut cmd = Command::new(funccount());
        cmd.args(["--attach-mode", "single", "-p", &pid, &spec]);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut t = spawn_cmd(cmd);
        t.wait_ready();
        let group = format!("tracekit_{}_{}/", pid_namespace_of(t.pid()), t.pid());
        assert_eq!(group_events(&group), 300, "{whole_group}");
        let guardians = children_of(t.pid());
        assert_eq!(guardians.len(), 1, "{guardians:?}");
        match whole_group {
            true => kill(0u32.wrapping_sub(t.pid()), libc::SIGKILL),
            false => t.signal(libc::SIGKILL),
        }
        let killed = std::time::Instant::now();
        let out = t.finish(T);
        assert_eq!(out.status.signal(), Some(libc::SIGKILL));
        while (group_events(&group) > 0 || alive(guardians[0]))
            && killed.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            group_events(&group),
            0,
            "whole group {whole_group}: 2 s after kill -9"
        );
        assert!(!alive(guardians[0]), "the guardian lives on");
        drop(p);
    }
}

#[test]
fn stale_uprobe_groups_are_removed_by_every_run() {
    let _turn = event_mutex_turn();
    // Sweep bug 8: only a run that made groups removed those of dead runs; now
    // every run does (on the side, and at its exit hands what is unfinished to
    // a process of its own): a tracepoint run, a tool with fixed programs, and
    // that process alone. 4194305 is above PID_MAX_LIMIT: no process has it.
    let group = format!("tracekit_{}_4194305", pid_namespace_of(std::process::id()));
    for args in [
        (funccount(), vec!["-d", "0.5", "t:sched:sched_switch"]),
        (tool("urandomread"), vec!["--duration", "0.5"]),
        (funccount(), vec!["--sweep-stale-uprobe-groups"]),
    ] {
        uprobe_events_command(&format!("p:{group}/g0 /usr/bin/true:0x0"));
        let out = run(&args.0, &args.1, T);
        // A sweep the kernel kept waiting is finished after the exit, by the
        // process the run handed it to.
        let ended = std::time::Instant::now();
        let mut left = group_events(&format!("{group}/"));
        while left > 0 && ended.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
            left = group_events(&format!("{group}/"));
        }
        if left > 0 {
            uprobe_events_command(&format!("-:{group}/g0"));
        }
        assert_eq!(out.code(), 0, "{}", out.stderr);
        assert_eq!(left, 0, "{:?} left a dead run's group", args.0);
    }
}
