//! Refusals before anything is traced, shared by the tools: bad patterns,
//! numbers, CPUs and cgroups, a PID that does not exist, attach modes a tool
//! does not take, not root or too few capabilities, and control bytes escaped
//! in messages. Driven by funccount.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::funccount::{fails_with, funccount, workload};
use crate::util::*;

const T: Duration = Duration::from_secs(60);

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
fn bad_patterns() {
    fails_with(
        &["x:y:z"],
        "bad probe \"x:y:z\": probe type must be 'p', 't', 'u', 'profile', 'software' or 'hardware', not 'x'",
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
fn control_bytes_are_escaped_in_messages() {
    fails_with(
        &["x\x1b[31m:a\nb:c"],
        "bad probe \"x\\x1b[31m:a\\x0ab:c\": probe type must be 'p', 't', 'u', 'profile', 'software' or 'hardware', not 'x\\x1b[31m'",
    );
}

#[test]
fn usage_errors_are_one_line() {
    // Sweep bug 16: clap's errors were three lines or more (the error, a blank
    // line, usage, "For more information"). Now one, with exit status 2.
    for (tool_name, args, msg) in [
        (
            "funccount",
            vec!["--bogus"],
            "unexpected argument '--bogus' found; tip: to pass '--bogus' as a value, use '-- --bogus'",
        ),
        (
            "funccount",
            vec![],
            "the following required arguments were not provided: <PATTERN>...",
        ),
        (
            "trace",
            vec!["-p", "x", "t:sched:sched_switch"],
            "invalid value 'x' for '--pid <PID>': 'x' is not a process id (a positive integer)",
        ),
        (
            "disksnoop",
            vec!["-d"],
            "a value is required for '--disk <DISK>' but none was supplied",
        ),
    ] {
        let out = run(&tool(tool_name), &args, T);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
        assert_eq!(
            out.stderr,
            format!("{tool_name}: error: {msg}; see {tool_name} --help\n")
        );
        assert_eq!(out.stdout, "");
    }
}

#[test]
fn pid_of_a_kernel_thread() {
    // Sweep bug 16: `urandomread -p 2` (kthreadd) traced nothing in silence. A
    // kernel thread runs no user code: refused where only user code could be
    // traced, and taken where the kernel's work is (its tracepoints).
    assert_eq!(
        std::fs::read_to_string("/proc/2/comm").unwrap(),
        "kthreadd\n"
    );
    crate::util::fails_with(
        &tool("urandomread"),
        &["-p", "2"],
        "-p 2 is a kernel thread (kthreadd): it makes no getrandom() calls and reads no /dev/urandom; give a process",
    );
    fails_with(
        &["-p", "2", "c:malloc"],
        "-p 2 is a kernel thread (kthreadd): it runs no user code, so it has no user functions or USDT probes to trace; give a process",
    );
    let out = run(
        &funccount(),
        &["-p", "2", "-d", "0.2", "t:sched:sched_switch"],
        T,
    );
    assert_eq!((out.code(), out.stderr.as_str()), (0, ""));
}

#[test]
fn help_lists_no_option_a_tool_refuses() {
    // Sweep bug 16 (already so on main, kept so): the tools with fixed
    // programs refuse --attach-mode, so their --help does not offer it.
    for t in ["urandomread", "disksnoop"] {
        let out = run(&tool(t), &["--help"], T);
        assert_eq!(out.code(), 0);
        assert!(!out.stdout.contains("--attach-mode"), "{t}: {}", out.stdout);
        assert!(out.stdout.contains("--duration"), "{t}: {}", out.stdout);
    }
}
