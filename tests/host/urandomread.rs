//! urandomread on the host: getrandom() calls of known count and size. The host
//! cannot trace kernel functions, so /dev/urandom reads are not seen and the tool
//! says so once; the guest tests cover them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::util::*;

const T: Duration = Duration::from_secs(120);

fn urandomread() -> PathBuf {
    tool("urandomread")
}

/// Whether this kernel has kprobes (the host does not; then reads of the device
/// files cannot be traced unless fentry works).
fn kernel_functions_traceable(stderr: &str) -> bool {
    !stderr.contains("are not traced")
}

#[test]
fn getrandom_calls_exactly() {
    let w = Workload::start(&prog("random"), &["getrandom", "50", "32"]);
    let pid = w.pid;
    let bin = urandomread();
    let out = trace_workload_until(&[bin.to_str().unwrap()], w, &[], header_or_tracing, T);
    let mut lines = out.stdout.lines();
    assert_eq!(
        lines.next().unwrap(),
        "TIME(s)            COMM             PID    GOTBITS"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 50, "stdout:\n{}", out.stdout);
    for r in rows {
        // "%-18.9f %-16s %-6d %s", as BCC prints.
        assert_eq!(&r[18..19], " ");
        assert_eq!(r[19..35].trim_end(), "random");
        assert_eq!(r[36..42].trim_end(), pid.to_string());
        assert_eq!(&r[43..], "256");
    }
    if !kernel_functions_traceable(&out.stderr) {
        assert_eq!(
            out.stderr,
            "urandomread: reads of /dev/urandom and /dev/random are not traced: they need \
             kprobes or fentry on urandom_read_iter, which this kernel does not allow \
             (--debug says why); tracing getrandom() calls only\n"
        );
    }
}

#[test]
fn cgroup_filter_in_a_tool_with_fixed_programs() {
    // --cgroup through the objects a fixed tool opens one per trial: only the
    // 5 calls of the process in the cgroup are printed, none of the other's 3.
    let cg = Cgroup::new("cg-random");
    let inside = Workload::start(&prog("random"), &["getrandom", "5", "32"]);
    let outside = Workload::start(&prog("random"), &["getrandom", "3", "100"]);
    cg.adopt(inside.pid);
    let mut t = spawn(&urandomread(), &["--cgroup", &cg.rel]);
    t.wait_line(header_or_tracing, T);
    outside.go();
    inside.go();
    let pid = inside.pid.to_string();
    assert!(outside.wait().success() && inside.wait().success());
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    let rows: Vec<(String, String)> = out
        .stdout
        .lines()
        .skip(1)
        .map(|r| (r[36..42].trim_end().to_string(), r[43..].to_string()))
        .collect();
    assert_eq!(rows, vec![(pid, "256".to_string()); 5], "{}", out.stdout);
}

#[test]
fn wide_and_json() {
    let bin = urandomread();
    let w = Workload::start(&prog("random"), &["getrandom", "7", "100"]);
    let out = trace_workload_until(&[bin.to_str().unwrap()], w, &["-w"], header_or_tracing, T);
    let mut lines = out.stdout.lines();
    assert_eq!(
        lines.next().unwrap(),
        "TIME(s)            COMM             PID    SOURCE    GOTBITS"
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 7);
    assert!(rows.iter().all(|r| r[3] == "getrandom" && r[4] == "800"));

    let w = Workload::start(&prog("random"), &["getrandom", "9", "5"]);
    let pid = w.pid;
    let out = trace_workload_until(
        &[bin.to_str().unwrap()],
        w,
        &["--json", "--debug"],
        header_or_tracing,
        T,
    );
    let recs: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 9);
    for r in &recs {
        assert_eq!(r["pid"], pid);
        assert_eq!(r["tid"], pid);
        assert_eq!(r["comm"], "random");
        assert_eq!(r["source"], "getrandom");
        assert_eq!(r["bits"], 40);
    }
    assert_contains(
        &out.stderr,
        "getrandom() calls: tracepoint syscalls:sys_exit_getrandom (tp_getrandom)",
    );
}

/// With a one-page ring buffer and the reader stopped while the workload runs,
/// most records cannot be stored: each is counted, and every call is either a
/// line or a lost record. The run neither hangs nor crashes.
#[test]
fn lost_records_are_counted_exactly() {
    const N: u64 = 20_000;
    let w = Workload::start(&prog("random"), &["getrandom", &N.to_string(), "8"]);
    let pid = w.pid.to_string();
    let bin = urandomread();
    let mut t = spawn(
        Path::new("env"),
        &[
            "TRACEKIT_RING_BYTES=4096",
            bin.to_str().unwrap(),
            "-p",
            &pid,
        ],
    );
    t.wait_line(header_or_tracing, Duration::from_secs(60));
    t.signal(libc::SIGSTOP);
    w.go();
    assert!(w.wait().success());
    t.signal(libc::SIGCONT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lines = out.stdout.lines().count() as u64 - 1;
    let lost = lost_reported(&out.stderr);
    assert!(lost > 0, "nothing lost:\n{}", out.stderr);
    assert!(lines > 0);
    assert_eq!(
        lines + lost,
        N,
        "{lines} lines, {lost} lost:\n{}",
        out.stderr
    );
    assert_contains(&out.stderr, "the 4 KiB ring buffer was full");
}

#[test]
fn too_few_file_descriptors_say_so() {
    // With 8 descriptors the object cannot even be opened: the error names the
    // limit (it blamed the kernel: "none of the events can be traced").
    let tool = urandomread();
    let out = std::process::Command::new("sh")
        .args(["-c", "ulimit -n 8 && exec \"$0\" --duration 0.2"])
        .arg(&tool)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // Where it runs out depends on the build (what it opens first).
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("urandomread: error: ")
            && last.ends_with(
                ": Too many open files (os error 24): the open-file limit is 8: raise it with \
                 `ulimit -n 1024` (or `prlimit --nofile=1024`)"
            )
            && !last.contains("no tracepoint"),
        "{stderr}"
    );
}

#[test]
fn ends_with_its_process_and_on_signals() {
    let out = run(&urandomread(), &["--duration", "0.3"], T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let mut t = spawn(&urandomread(), &[]);
        t.wait_line(header_or_tracing, Duration::from_secs(60));
        t.signal(sig);
        assert_eq!(t.finish(T).code(), 0);
    }
    // A second signal soon after the first (an impatient Ctrl-C) waits for the
    // detach: it cut it short with status 130 (urandomread's tools-own links
    // had no phase for the signal handler).
    for _ in 0..3 {
        let mut t = spawn(&urandomread(), &[]);
        t.wait_line(header_or_tracing, Duration::from_secs(60));
        t.signal(libc::SIGINT);
        std::thread::sleep(Duration::from_millis(5));
        t.signal(libc::SIGINT);
        let out = t.finish(T);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let gone = c.id();
    c.wait().unwrap();
    fails_with(
        &urandomread(),
        &["-p", &gone.to_string()],
        &format!("no process with PID {gone}"),
    );
    let out = run(&urandomread(), &["-p", "-3"], T);
    assert_eq!(out.code(), 2);
    assert!(out.stderr.contains("'-3' is not a process id"));
}
