//! trace on the host kernel: user functions (entries and returns), tracepoints and
//! USDT probes of the `traced` test program, whose calls have known arguments, so
//! every line is checked. Here: the helpers the submodules share, and trace's
//! output and options (-M, -A, --json, -c, -L, a closed pipe, escaped strings).
//! Kernel functions (BTF names, members, globs, -K) are tested in the guest
//! (tests/guest/trace.rs).

// The probe language: predicates and gates, STRCMP and -B, signatures, errors.
mod grammar;
// Tracepoints: syscall fields, raw links, predicates on fields, refusals.
mod tracepoints;
// User functions and USDT: arguments, returns, offsets, stacks, -s.
mod user;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::*;

const T: Duration = Duration::from_secs(60);

fn trace() -> PathBuf {
    tool("trace")
}

fn traced() -> PathBuf {
    prog("traced")
}

/// `traced`'s path in a spec (`PATH:FUNC`).
fn bin() -> String {
    traced().display().to_string()
}

/// Runs `trace -p PID args` on `traced MODE N`: waits until trace has attached (its
/// header, or the status line with --json), lets the program run, and returns
/// trace's output once both have exited with success (trace ends by itself when
/// the traced process exits, or at -M).
fn run_on(mode: &str, n: u64, args: &[&str]) -> Output {
    run_on_prog(&traced(), mode, n, args)
}

/// [`run_on`] for another test program with the same protocol (`ready`, then
/// SIGUSR1): tests/progs/userfuncs.c, say.
fn run_on_prog(prog: &Path, mode: &str, n: u64, args: &[&str]) -> Output {
    run_on_env(prog, mode, n, &[], args)
}

/// [`run_on_prog`] with settings in trace's environment.
fn run_on_env(prog: &Path, mode: &str, n: u64, env: &[(&str, &str)], args: &[&str]) -> Output {
    let trace = trace();
    run_on_via(&[trace.to_str().unwrap()], prog, mode, n, env, args)
}

/// [`run_on_env`] with trace started by a command prefix (`via[0]` runs
/// `via[1..]`, the last of which is trace), e.g. [`without_kernel_btf`].
fn run_on_via(
    via: &[&str],
    prog: &Path,
    mode: &str,
    n: u64,
    env: &[(&str, &str)],
    args: &[&str],
) -> Output {
    let w = Workload::start(prog, &[mode, &n.to_string()]);
    let pid = w.pid.to_string();
    let mut all = via[1..].to_vec();
    all.extend(["-p", pid.as_str()]);
    all.extend_from_slice(args);
    let mut cmd = Command::new(via[0]);
    cmd.envs(env.iter().copied()).args(&all);
    let mut t = spawn_cmd(cmd);
    t.wait_line(
        |l| l.starts_with("PID ") || l.starts_with("TIME ") || l.starts_with("Tracing "),
        T,
    );
    t.finish_after(w, T)
}

/// The event lines of BCC's layout (after the header), as (pid, tid, comm, func,
/// message); stack lines (indented) are left out.
fn events(stdout: &str) -> Vec<(u32, u32, String, String, String)> {
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert!(header.starts_with("PID     TID     COMM"), "{stdout}");
    lines
        .filter(|l| !l.is_empty() && !l.starts_with(' '))
        .map(|l| {
            let f: Vec<&str> = l.splitn(5, char::is_whitespace).collect();
            let mut it = l.split_whitespace();
            let pid = it.next().unwrap().parse().expect("pid");
            let tid = it.next().unwrap().parse().expect("tid");
            let comm = it.next().unwrap().to_string();
            let func = it.next().unwrap().to_string();
            assert!(f.len() >= 4, "{l}");
            // The message starts at column 49 (7+1+7+1+15+1+16+1).
            let msg = l.get(49..).unwrap_or("").to_string();
            (pid, tid, comm, func, msg)
        })
        .collect()
}

fn messages(stdout: &str) -> Vec<String> {
    events(stdout).into_iter().map(|e| e.4).collect()
}

#[test]
fn max_events_stops_after_m() {
    let spec = format!("{}:tt_args \"%d\", arg1", bin());
    let out = run_on("calls", 100, &["-M", "7", &spec]);
    assert_eq!(messages(&out.stdout), ["0", "1", "2", "3", "4", "5", "6"]);
}

#[test]
fn aggregate_counts_identical_events() {
    let spec = format!("r:{}:tt_recurse \"%d\", retval", bin());
    let out = run_on("recurse", 9, &["-A", &spec]);
    let mut counts: Vec<(String, u64)> = Vec::new();
    let mut last = String::new();
    for l in out.stdout.lines().skip(1) {
        if let Some(n) = l.strip_prefix("-->COUNT ") {
            let msg = last.get(49..).unwrap_or("").to_string();
            counts.push((msg, n.parse().unwrap()));
        } else if !l.is_empty() {
            last = l.to_string();
        }
    }
    counts.sort();
    let want: Vec<(String, u64)> = [("107".into(), 9), ("207".into(), 9), ("307".into(), 9)].into();
    assert_eq!(counts, want, "{}", out.stdout);
    // --json: one object per distinct event, the event an object without its time.
    let out = run_on("recurse", 9, &["-A", "--json", &spec]);
    let objs: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .filter(|l| l.contains("\"count\""))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let mut counts: Vec<(String, u64)> = objs
        .iter()
        .map(|o| {
            assert!(
                o["event"]["time_s"].is_null() && o["event"]["cpu"].is_null(),
                "{o}"
            );
            let msg = o["event"]["message"].as_str().unwrap().to_string();
            (msg, o["count"].as_u64().unwrap())
        })
        .collect();
    counts.sort();
    assert_eq!(counts, want, "{}", out.stdout);
}

#[test]
fn dash_l_of_no_thread() {
    // Above PID_MAX_LIMIT (4194304): no task has this ID.
    fails_with(
        &trace(),
        &["-L", "4194305", "c:snprintf"],
        "-L 4194305: no thread with that ID",
    );
}

#[test]
fn dash_c_is_bcc_cgroup_path() {
    // BCC's `trace -c CGROUP_PATH`: only the process in the cgroup is traced,
    // as in the man page's example with a path below the cgroup2 mount.
    let cg = Cgroup::new("cg-trace");
    let inside = Workload::start(&traced(), &["calls", "3"]);
    let outside = Workload::start(&traced(), &["calls", "2"]);
    cg.adopt(inside.pid);
    let spec = format!(r#"{}:tt_args "%d", arg1"#, bin());
    let mut t = spawn(&trace(), &["-c", &cg.path.display().to_string(), &spec]);
    t.wait_line(|l| l.starts_with("PID "), T);
    outside.go();
    inside.go();
    let pid = inside.pid;
    assert!(outside.wait().success() && inside.wait().success());
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    let seen: Vec<(u32, String)> = events(&out.stdout)
        .into_iter()
        .map(|e| (e.0, e.4))
        .collect();
    let want: Vec<(u32, String)> = (0..3).map(|i| (pid, i.to_string())).collect();
    assert_eq!(seen, want, "{}", out.stdout);
}

#[test]
fn json_one_typed_object_per_event() {
    let spec = format!("{}:tt_args \"%d %s\", arg1, arg3", bin());
    let out = run_on("calls", 5, &["--json", &spec]);
    let objs = json_lines(&out.stdout);
    assert_eq!(objs.len(), 6, "{}", out.stdout);
    // The last one says the run ended, and that nothing was lost.
    assert_eq!(
        objs[5],
        serde_json::json!({"final": true, "events": 5, "records": 5, "lost": 0})
    );
    for (i, o) in objs[..5].iter().enumerate() {
        assert_eq!(o["func"], "tt_args");
        assert_eq!(o["comm"], "traced");
        assert_eq!(o["probe"], spec.as_str());
        assert_eq!(o["message"], format!("{i} name-{i}"));
        assert_eq!(o["values"], serde_json::json!([i, format!("name-{i}")]));
        assert_eq!(o["pid"], o["tid"]);
    }
}

#[test]
fn several_probes_in_one_run() {
    let a = format!("{}:tt_args (arg1 < 2) \"args %d\", arg1", bin());
    let c = format!("{}:tt_caller (arg1 < 2) \"caller %d\", arg1", bin());
    let out = run_on("calls", 10, &[&a, &c]);
    assert_eq!(
        messages(&out.stdout),
        ["caller 0", "args 0", "caller 1", "args 1"]
    );
}

#[test]
fn aggregate_flushed_on_sigterm() {
    // The traced process lives on; SIGTERM ends trace, which prints its counts
    // and exits 0.
    let w = Workload::start(&traced(), &["recurse", "4", "--hold"]);
    let spec = format!("r:{}:tt_recurse (arg1 == 3) \"%d\", retval", bin());
    let pid = w.pid.to_string();
    let mut t = spawn(&trace(), &["-A", "-p", &pid, &spec]);
    t.wait_line(|l| l.starts_with("PID "), T);
    w.go();
    std::thread::sleep(Duration::from_millis(500));
    t.signal(libc::SIGTERM);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", out.stdout);
    assert_eq!(lines[1].get(49..), Some("307"), "{}", out.stdout);
    assert_eq!(lines[2], "-->COUNT 4");
    w.go();
    assert!(w.wait().success());
}

#[test]
fn a_closed_pipe_ends_the_run_with_no_event_to_write() {
    // `trace ... | head -1` ran on after the header until the next event: with
    // none coming (no program calls acct), forever.
    let (code, err) = exit_after_head_1(&trace(), &["t:syscalls:sys_enter_acct"], T);
    assert_eq!((code, err.as_str()), (0, ""));
}

#[test]
fn control_bytes_in_strings_are_escaped() {
    // The workload renames itself `a;b\nc\x1b[1m`: %s printed the newline and
    // the escape sequence raw, splitting the event over two lines and sending
    // the terminal an escape; COMM was already escaped.
    let out = run_on_env(
        &prog("workload"),
        "oddname",
        1,
        &[],
        &[r#"t:task:task_rename "%s", args->newcomm"#],
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(lines[1].ends_with(r" a;b\x0ac\x1b[1m"), "{}", out.stdout);
}
