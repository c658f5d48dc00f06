//! Under overload and hostile clients (the third sweep's bugs 1, 2, 5 and 6): a
//! reader behind a flood of events stays bounded and stops at once, and every
//! record is printed or counted lost; slow HTTP clients do not slow the tracing;
//! other local users and web pages cannot control a tool; idle connections
//! cannot hold every slot.

use std::io::Write;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::util::http::*;
use crate::util::kill;
use crate::util::*;

const T: Duration = Duration::from_secs(120);

/// getrandom() as fast as one thread can, until killed.
fn flood() -> Workload {
    Workload::start(&prog("random"), &["getrandom", "1000000000000", "8"])
}

/// The first line of a run: BCC's "Tracing..." or trace's and urandomread's
/// column header.
fn started(l: &str) -> bool {
    l.starts_with("Tracing") || l.starts_with("PID") || l.starts_with("TIME(s)")
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// trace's lost records, in BCC's words ("Possibly lost N samples").
fn possibly_lost(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("Possibly lost ")?.strip_suffix(" samples"))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// A tool, its arguments, and what its event lines look like.
type Case = (&'static str, &'static [&'static str], fn(&str) -> bool);

/// Whether process `pid` has exited (a zombie not yet reaped, or gone).
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn a_reader_behind_a_flood_stays_bounded_and_stops_at_once() {
    let _turn = event_mutex_turn();
    // Slow formats under a syscall flood: the reader drained the whole ring
    // before writing, so it printed nothing, ignored SIGINT, SIGTERM and a
    // second Ctrl-C, and grew by ~110 MB/s.
    let cases: [Case; 3] = [
        (
            "trace",
            &["--json", "t:syscalls:sys_enter_getrandom"],
            |l| l.starts_with('{'),
        ),
        ("trace", &["-U", "t:syscalls:sys_enter_getrandom"], |l| {
            l.contains("getrandom")
        }),
        ("urandomread", &["--json"], |l| l.starts_with('{')),
    ];
    for (tool, args, is_event) in cases {
        let w = flood();
        let pid = w.pid.to_string();
        let mut all = vec!["-p", pid.as_str()];
        all.extend_from_slice(args);
        let mut t = spawn(&crate::util::tool(tool), &all);
        t.wait_line(started, T);
        w.go();
        // Events are written while the flood goes on, not at its end.
        t.wait_line(is_event, Duration::from_secs(10));
        thread::sleep(Duration::from_secs(2));
        let rss = rss_kib(t.pid());
        assert!(rss < 200 * 1024, "{tool} {args:?}: {rss} KiB");
        t.signal(libc::SIGINT);
        let asked = Instant::now();
        // Timed to the tool's exit (its zombie), not to the end of this
        // harness's reading of the output, which a loaded machine slows.
        let pid = t.pid();
        while !exited(pid) && asked.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(5));
        }
        let took = asked.elapsed();
        let out = t.finish(Duration::from_secs(5));
        assert_eq!(out.code(), 0, "{tool} {args:?}: {}", out.stderr);
        assert!(
            took < Duration::from_secs(1),
            "{tool} {args:?}: {took:?} from SIGINT to exit"
        );
        drop(w);
    }
}

#[test]
fn a_closed_pipe_ends_a_flooded_run_at_once() {
    let _turn = event_mutex_turn();
    let w = flood();
    w.go();
    let pid = w.pid.to_string();
    let started = Instant::now();
    let (code, err) = exit_after_head_1(
        &crate::util::tool("trace"),
        &["--json", "-p", &pid, "t:syscalls:sys_enter_getrandom"],
        Duration::from_secs(20),
    );
    assert_eq!(code, 0, "{err}");
    // Start-up included; the run never ended while the flood went on.
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A tool, its arguments, and how it reports lost records.
type Counted = (&'static str, &'static [&'static str], fn(&str) -> u64);

#[test]
fn every_record_of_a_flood_is_printed_or_counted_lost() {
    // A 16 KiB ring, filled faster than JSON is written: the sum is exact.
    const N: u64 = 100_000;
    let cases: [Counted; 2] = [
        (
            "trace",
            // Rust's std asks getrandom() for 0 bytes to see that it works.
            &["--json", "t:syscalls:sys_enter_getrandom (args->len == 8)"],
            possibly_lost,
        ),
        ("urandomread", &["--json"], lost_reported),
    ];
    for (tool, args, lost_in) in cases {
        let w = Workload::start(&prog("random"), &["getrandom", &N.to_string(), "8"]);
        let bin = crate::util::tool(tool);
        let cmd = ["env", "TRACEKIT_RING_BYTES=16384", bin.to_str().unwrap()];
        let out = trace_workload_via(&cmd, w, args, T);
        let lines = out
            .stdout
            .lines()
            .filter(|l| l.contains("\"pid\":"))
            .count() as u64;
        let lost = lost_in(&out.stderr);
        assert_eq!(
            lines + lost,
            N,
            "{tool}: {lines} printed, {lost} lost:\n{}",
            out.stderr
        );
    }
}

#[test]
fn slow_clients_do_not_slow_the_tracing() {
    // 16 clients that ask for /metrics and then take their time: the tool
    // waited for each answer to be written (up to 2 s) before reading the ring
    // again, and lost most records (81% with 16 clients).
    const N: u64 = 30_000;
    let n = N.to_string();
    let w = Workload::start(&prog("random"), &["getrandom", &n, "8", "--rate", "10000"]);
    let pid = w.pid.to_string();
    let bin = crate::util::tool("urandomread");
    let mut cmd = Command::new("env");
    cmd.args([
        "TRACEKIT_RING_BYTES=262144",
        bin.to_str().unwrap(),
        "-p",
        &pid,
        "--listen",
        "127.0.0.1:0",
    ]);
    let mut t = spawn_cmd(cmd);
    let line = t.wait_line(|l| l.contains(": serving http://"), T);
    let addr: std::net::SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap();
    t.wait_line(started, T);
    let done = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let done = done.clone();
            thread::spawn(move || {
                let mut asked = 0;
                while !done.load(Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(addr) else {
                        continue;
                    };
                    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
                    asked += 1;
                    // Not reading the answer; a byte every 100 ms.
                    for _ in 0..6 {
                        thread::sleep(Duration::from_millis(100));
                        let _ = s.write_all(b"x");
                    }
                }
                asked
            })
        })
        .collect();
    w.go();
    let out = t.finish(T);
    done.store(true, Ordering::Relaxed);
    let asked: u32 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(asked >= 16 * 3, "{asked} requests");
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lines = out.stdout.lines().count() as u64 - 1; // the header
    assert_eq!(
        (lines, lost_reported(&out.stderr)),
        (N, 0),
        "{}",
        out.stderr
    );
}

/// A shell as user nobody, running `script` with `$PORT` set.
fn as_nobody(script: &str, port: u16) -> Command {
    as_user(65534, script, port)
}

/// A shell as user `uid` (no account needed), running `script` with `$PORT` set.
fn as_user(uid: u32, script: &str, port: u16) -> Command {
    let mut c = Command::new("bash");
    c.args(["-c", script])
        .env("PORT", port.to_string())
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null());
    c
}

/// What a raw request as user nobody got back: its status line.
fn nobody_asks(raw: &str, port: u16) -> String {
    user_asks(65534, raw, port)
}

/// What a raw request as user `uid` got back: its status line.
fn user_asks(uid: u32, raw: &str, port: u16) -> String {
    let script =
        "trap '' PIPE; exec 3<>/dev/tcp/127.0.0.1/$PORT && printf \"$REQ\" >&3 && head -1 <&3";
    let out = as_user(uid, script, port).env("REQ", raw).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `n` clients as user `uid` that each send one byte and wait, reconnecting
/// as soon as they are cut: every slot they may take stays held.
fn churning(uid: u32, n: usize, port: u16) -> Group {
    let script = format!(
        "for i in $(seq {n}); do \
         (while :; do exec 3<>/dev/tcp/127.0.0.1/$PORT || continue; printf G >&3; cat <&3 >/dev/null; done) & \
         done; wait"
    );
    Group(
        as_user(uid, &script, port)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap(),
    )
}

#[test]
fn a_client_that_asks_at_once_gets_in_however_the_slots_churn() {
    // Our sweep's second slowloris: clients that send a byte, are cut after
    // the head's 2 s, and reconnect at once kept every slot held, so 0 of 10
    // scrapes and no authenticated POST got through. A client whose head
    // comes at once now takes the slot of one still sending its head. Here
    // three users churn 16 clients each (every slot but root's 4); a fourth
    // user, who has no kept slot (as a remote client with the token has
    // none until its head is read), scrapes 10 times, and root posts.
    let w = Workload::start(&prog("random"), &["getrandom", "3", "8", "--hold"]);
    let pid = w.pid.to_string();
    let s = Served::start("urandomread", &["-p", &pid, "--listen", ":0"]);
    let port = s.addr.port();
    let get = "GET /metrics HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n";
    let loris: Vec<Group> = [65534, 1001, 1002]
        .iter()
        .map(|&u| churning(u, 16, port))
        .collect();
    thread::sleep(Duration::from_secs(1));
    let mut ok = 0;
    let mut tries = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let got = user_asks(1003, get, port);
        let took = started.elapsed();
        if got == "HTTP/1.1 200 OK" && took < Duration::from_secs(1) {
            ok += 1;
        }
        tries.push(format!("{got:?} in {took:.0?}"));
        thread::sleep(Duration::from_millis(100));
    }
    let reset = s.post("/reset").0;
    drop(loris);
    assert_eq!(
        (ok, reset),
        (10, 200),
        "{ok} of 10 scrapes answered: {}",
        tries.join(", ")
    );
    w.go();
    s.stop(T);
    w.go();
    assert!(w.wait().success());
}

/// A process group killed and reaped when dropped (a failing test leaves no
/// client running).
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of the group the child leads.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

#[test]
fn a_slowloris_cannot_hoard_the_slots() {
    // Sixteen idle connections made every scrape and POST /stop fail (48 of 48
    // over 12 s). Here 40 connections as user nobody, each sending a byte
    // and reopened as soon as it is cut: root's scrapes all get through.
    let w = Workload::start(&prog("random"), &["getrandom", "3", "8", "--hold"]);
    let pid = w.pid.to_string();
    let s = Served::start("urandomread", &["-p", &pid, "--listen", ":0"]);
    let port = s.addr.port();
    let script = "for i in $(seq 40); do \
        (while :; do exec 3<>/dev/tcp/127.0.0.1/$PORT || continue; printf G >&3; cat <&3 >/dev/null; done) & \
        done; wait";
    let loris = Group(
        as_nobody(script, port)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    thread::sleep(Duration::from_secs(1));
    // A nobody's fifth connection is refused at once.
    assert_eq!(
        nobody_asks(
            "GET /metrics HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n",
            port
        ),
        "HTTP/1.1 503 Service Unavailable"
    );
    let mut ok = 0;
    let end = Instant::now() + Duration::from_secs(4);
    let mut tries = 0;
    while Instant::now() < end {
        tries += 1;
        let started = Instant::now();
        if s.get("/metrics").0 == 200 && started.elapsed() < Duration::from_secs(1) {
            ok += 1;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let stop = s.post("/reset").0;
    drop(loris);
    assert_eq!((ok, stop), (tries, 200), "{ok} of {tries} scrapes answered");
    // The work, then POST /stop; then the workload may exit.
    w.go();
    s.stop(T);
    w.go();
    assert!(w.wait().success());
}

#[test]
fn refused_clients_are_drained_side_by_side_and_read_their_503() {
    // Refused connections were drained one after another, 200 ms each: ten
    // refused clients that never closed held the rest past their time, and
    // the next ones, writing their request a line at a time as bash does,
    // got EPIPE instead of their 503 (CI's slowloris test, under load). Here
    // nobody holds its four slots, ten refused clients stay silent, and five
    // more send their request 300 ms after connecting, in two writes.
    let s = Served::start("urandomread", &["--listen", ":0"]);
    let script = "trap '' PIPE; \
        for i in 1 2 3 4; do exec {fd}<>/dev/tcp/127.0.0.1/$PORT; printf G >&$fd; done; \
        sleep 0.1; \
        for i in $(seq 10); do exec {fd}<>/dev/tcp/127.0.0.1/$PORT; done; \
        sleep 0.05; \
        for i in 1 2 3 4 5; do (exec 3<>/dev/tcp/127.0.0.1/$PORT; sleep 0.3; \
            printf 'GET /metrics HTTP/1.1\\r\\n' >&3; sleep 0.01; \
            printf 'Host: localhost\\r\\n\\r\\n' >&3 && head -1 <&3) & \
        done; wait";
    let out = as_nobody(script, s.addr.port()).output().unwrap();
    let got = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = got.lines().map(str::trim).collect();
    assert_eq!(
        lines,
        vec!["HTTP/1.1 503 Service Unavailable"; 5],
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.stop(T);
}

#[test]
fn a_stdout_nobody_reads_does_not_hold_a_stopped_run() {
    // `trace --json ... | sleep 100` under a flood: the write to the full
    // pipe blocked for ever, through SIGINT, SIGTERM and a second SIGINT (our
    // own sweep). Now the run gives the output up once asked to stop.
    let w = flood();
    let pid = w.pid.to_string();
    let mut child = Command::new(crate::util::tool("trace"))
        .args(["--json", "-p", &pid, "t:syscalls:sys_enter_getrandom"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Held, never read.
    let _stdout = child.stdout.take();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let ready = rx
        .iter()
        .find(|l| l.starts_with("Tracing"))
        .expect("trace started");
    assert!(ready.starts_with("Tracing"));
    w.go();
    thread::sleep(Duration::from_secs(2));
    kill(child.id(), libc::SIGINT);
    let asked = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if asked.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            panic!("trace was still running 5 s after SIGINT");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let took = asked.elapsed();
    let said: Vec<String> = rx.try_iter().collect();
    assert_eq!(status.code(), Some(0), "{said:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(
        said.iter()
            .any(|l| l
                == "trace: stopping: stdout is not being read; the rest of the output is dropped"),
        "{said:?}"
    );
}

#[test]
fn a_client_that_closed_its_socket_is_nobody_s() {
    // A local user's POST /stop sent on a socket closed at once: by the time
    // the tool looked, the client's socket was in TIME_WAIT, which the kernel
    // reports as uid 0, and it was taken for root's (our own sweep).
    let w = Workload::start(&prog("random"), &["getrandom", "3", "8", "--hold"]);
    let pid = w.pid.to_string();
    let s = Served::start("urandomread", &["-p", &pid, "--listen", ":0"]);
    let port = s.addr.port();
    // Stopped, the tool accepts only after the client is gone.
    s.run.signal(libc::SIGSTOP);
    let script = "trap '' PIPE; exec 3<>/dev/tcp/127.0.0.1/$PORT && \
                  printf 'POST /stop HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n' >&3; exec 3>&-";
    let posted = as_nobody(script, port).status().unwrap();
    assert!(posted.success());
    thread::sleep(Duration::from_millis(200));
    s.run.signal(libc::SIGCONT);
    thread::sleep(Duration::from_millis(500));
    // Still tracing: root's scrape is answered, and root's POST /stop ends it.
    assert_eq!(s.get("/metrics").0, 200);
    w.go();
    s.stop(T);
    w.go();
    assert!(w.wait().success());
}
