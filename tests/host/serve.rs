//! `--listen` on the host: funccount and funclatency on user functions called an
//! exact number of times, scraped and controlled over HTTP (std TcpStream, no
//! client library): /metrics, /summary, POST /stop and /reset, refusals of bad,
//! oversized, slow and non-loopback requests, and a real Prometheus server.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::http::*;
use crate::util::*;

const T: Duration = Duration::from_secs(60);

fn calls(metrics: &str, probe: &str) -> u64 {
    sample(
        metrics,
        &format!("tracekit_funccount_calls_total{{probe=\"{probe}\"}}"),
    ) as u64
}

/// (func, count) rows of a funccount JSON summary.
fn json_counts(v: &serde_json::Value) -> Vec<(String, u64)> {
    v["counts"]
        .as_array()
        .expect("counts")
        .iter()
        .map(|r| {
            (
                r["func"].as_str().unwrap().to_string(),
                r["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// funccount --listen on a private copy of the workload (tk_alpha N, tk_beta
/// 2N, tk_gamma 3N), after the workload ran.
fn funccount_after_work(n: u64, extra: &[&str]) -> (Served, Scratch) {
    let dir = Scratch::new();
    let (w, spec) = private_workload(&dir, &prog("workload"), &["funcs", &n.to_string()], "tk_*");
    let mut args = vec!["--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    args.push(&spec);
    let s = Served::start("funccount", &args);
    w.go();
    assert!(w.wait().success());
    (s, dir)
}

#[test]
fn metrics_summary_and_stop() {
    let (s, _dir) = funccount_after_work(700, &[]);
    let (code, m) = s.get("/metrics");
    assert_eq!(code, 200, "{m}");
    assert_eq!(calls(&m, "tk_alpha"), 700);
    assert_eq!(calls(&m, "tk_beta"), 1400);
    assert_eq!(calls(&m, "tk_gamma"), 2100);
    assert_eq!(sample(&m, "tracekit_probes_attached"), 3.0);
    assert_eq!(sample(&m, "tracekit_probes_skipped"), 0.0);
    assert_eq!(sample(&m, "tracekit_lost_records_total"), 0.0);
    assert!(sample(&m, "tracekit_scrape_duration_seconds") > 0.0);
    assert!(m.ends_with("# EOF\n"), "{m}");

    let (code, body) = s.get("/summary");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("summary is JSON");
    assert_eq!(
        json_counts(&v),
        rows(&[("tk_alpha", 700), ("tk_beta", 1400), ("tk_gamma", 2100)])
    );
    assert_eq!(v["final"], false);

    let (code, body) = s.post("/stop");
    assert_eq!((code, body.trim()), (200, "{\"stopped\":true}"));
    let out = s.run.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("tk_alpha", 700), ("tk_beta", 1400), ("tk_gamma", 2100)])
    );
    assert_ends_with(&out.stdout, "Detaching...\n");
}

#[test]
fn reset_zeroes_the_summary_not_the_metrics() {
    let (s, _dir) = funccount_after_work(300, &["--json"]);
    let (code, body) = s.post("/reset");
    assert_eq!((code, body.trim()), (200, "{\"reset\":true}"));
    let v: serde_json::Value = serde_json::from_str(&s.get("/summary").1).unwrap();
    assert_eq!(json_counts(&v), vec![]);
    // Prometheus counters are cumulative: a reset does not touch them.
    let m = s.get("/metrics").1;
    assert_eq!(calls(&m, "tk_gamma"), 900);
    s.run.signal(libc::SIGINT);
    let out = s.run.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    let last: serde_json::Value =
        serde_json::from_str(out.stdout.lines().last().expect("a summary")).unwrap();
    assert_eq!(last["final"], true);
    assert_eq!(json_counts(&last), vec![]);
}

#[test]
fn interval_printing_does_not_reset_the_metrics() {
    let (s, _dir) = funccount_after_work(200, &["-i", "0.2"]);
    // Several summaries have been printed (and zeroed) since.
    std::thread::sleep(Duration::from_millis(700));
    let m = s.get("/metrics").1;
    assert_eq!(calls(&m, "tk_alpha"), 200);
    assert_eq!(calls(&m, "tk_beta"), 400);
    s.run.signal(libc::SIGTERM);
    let out = s.run.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_contains(&out.stdout, "tk_alpha");
}

#[test]
fn bad_requests_get_4xx_and_counts_stay_exact() {
    let dir = Scratch::new();
    let (w, spec) = private_workload(&dir, &prog("workload"), &["funcs", "1000"], "tk_alpha");
    let s = Served::start("funccount", &["--listen", ":0", &spec]);
    let a = s.local();

    // Slow clients hold connections: the tool still counts, and they are cut
    // off after the timeout. A 17th client that asks at once takes the
    // oldest one's place (closed unanswered: it never sent a byte).
    let idle: Vec<TcpStream> = (0..16).map(|_| TcpStream::connect(a).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.get("/metrics").0, 200, "a 17th connection asking at once");
    w.go();

    let cases: Vec<(String, u16)> = vec![
        ("GARBAGE\r\n\r\n".into(), 400),
        ("GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n".into(), 400),
        (
            format!(
                "GET /metrics HTTP/1.1\r\nX-Big: {}\r\n\r\n",
                "a".repeat(20_000)
            ),
            431,
        ),
        (
            "POST /stop HTTP/1.1\r\nContent-Length: 100000\r\n\r\n".into(),
            413,
        ),
        (
            "POST /stop HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
            411,
        ),
        ("GET /stop HTTP/1.1\r\n\r\n".into(), 405),
        ("DELETE /metrics HTTP/1.1\r\n\r\n".into(), 405),
        ("GET /nothing HTTP/1.1\r\n\r\n".into(), 404),
    ];
    // The idle connections time out (408) after a second without a byte,
    // freeing their places; the one pushed out was closed unanswered.
    let start = Instant::now();
    let mut answers: Vec<String> = idle
        .into_iter()
        .map(|mut c| {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut c, &mut text);
            text.split("\r\n").next().unwrap_or("").to_string()
        })
        .collect();
    answers.sort();
    let mut want = vec!["HTTP/1.1 408 Request Timeout".to_string(); 15];
    want.insert(0, String::new());
    assert_eq!(answers, want);
    assert!(start.elapsed() < Duration::from_millis(1500));
    // Their slots come back as their threads see the close.
    std::thread::sleep(Duration::from_millis(200));
    for (raw, want) in &cases {
        let (code, body) = request(a, raw);
        assert_eq!(code, *want, "{raw:.60?}: {body}");
    }
    assert!(w.wait().success());
    let m = s.get("/metrics").1;
    assert_eq!(calls(&m, "tk_alpha"), 1000);
    s.run.signal(libc::SIGINT);
    let out = s.run.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_eq!(last_table(&out.stdout), rows(&[("tk_alpha", 1000)]));
}

#[test]
fn funclatency_histogram_counts_every_call() {
    // A private copy: only this workload's calls are timed (no -p, which
    // would end the run when the workload exits).
    let dir = Scratch::new();
    let (w, spec) = private_workload(&dir, &prog("latency"), &["sleep", "6"], "tk_sleep");
    let s = Served::start("funclatency", &["--listen", ":0", &spec]);
    w.go();
    // Scrape while the calls are being made, then after.
    let during = s.get("/metrics").1;
    assert!(
        sample(
            &during,
            "tracekit_funclatency_seconds_count{probe=\"tk_sleep\"}"
        ) <= 6.0
    );
    let ended = Instant::now() + T;
    let m = loop {
        let m = s.get("/metrics").1;
        if sample(&m, "tracekit_funclatency_seconds_count{probe=\"tk_sleep\"}") == 6.0
            || Instant::now() > ended
        {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let series = "tracekit_funclatency_seconds";
    assert_eq!(
        sample(&m, &format!("{series}_count{{probe=\"tk_sleep\"}}")),
        6.0
    );
    // The buckets and sum agree exactly with the summary's histogram (same
    // BPF row, and no call since): le = high + 1 of each log2 slot, in seconds.
    let v: serde_json::Value = serde_json::from_str(&s.get("/summary").1).unwrap();
    assert_eq!(v["count"], 6);
    let sum = sample(&m, &format!("{series}_sum{{probe=\"tk_sleep\"}}"));
    assert_eq!(sum, v["total_ns"].as_u64().unwrap() as f64 / 1e9);
    let slots: Vec<(u64, u64)> = v["hist"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["high"].as_u64().unwrap() + 1,
                b["count"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut seen = 0;
    for line in m
        .lines()
        .filter(|l| l.starts_with(&format!("{series}_bucket{{le=\"")))
    {
        let (le, n) = line[line.find("le=\"").unwrap() + 4..]
            .split_once('"')
            .unwrap();
        let n: f64 = n.rsplit(' ').next().unwrap().parse().unwrap();
        let want: u64 = if le == "+Inf" {
            6
        } else {
            let le_ns = (le.parse::<f64>().unwrap() * 1e9).round() as u64;
            slots
                .iter()
                .filter(|(hi, _)| *hi <= le_ns)
                .map(|(_, c)| c)
                .sum()
        };
        assert_eq!(n, want as f64, "{line}");
        seen += 1;
    }
    assert_eq!(seen, 41, "40 log2 buckets up to 2^40 ns, and +Inf");
    assert!(w.wait().success());
    let out = s.stop(T);
    assert_contains(&out.stdout, "count: 6\n");
}

#[test]
fn listen_errors_are_one_line() {
    let f = crate::util::tool("funccount");
    for (args, msg) in [
        (
            vec!["--listen", "9435", "c:getpid"],
            "is not ADDR:PORT or :PORT",
        ),
        (vec!["--listen-token", "/x", "c:getpid"], "--listen"),
    ] {
        let out = run(&f, &args, T);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(msg), "{args:?}: {}", out.stderr);
    }
    // A port in use fails before anything is attached.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    fails_with(
        &f,
        &["--listen", &format!(":{}", addr.port()), "c:getpid"],
        &format!("--listen {addr}: binding: Address already in use (os error 98)"),
    );
    let dir = Scratch::new();
    let empty = dir.0.join("token");
    std::fs::write(&empty, "\n").unwrap();
    fails_with(
        &f,
        &[
            "--listen",
            ":0",
            "--listen-token",
            empty.to_str().unwrap(),
            "c:getpid",
        ],
        &format!("the --listen-token file {} is empty", empty.display()),
    );
    // Not a FIFO (it would block the start) nor /dev/zero (endless).
    let fifo = dir.0.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for path in [fifo.to_str().unwrap(), "/dev/zero"] {
        fails_with(
            &f,
            &["--listen", ":0", "--listen-token", path, "c:getpid"],
            &format!("the --listen-token file {path} is not a regular file"),
        );
    }
    let big = dir.0.join("big");
    std::fs::write(&big, "x".repeat(5000)).unwrap();
    fails_with(
        &f,
        &[
            "--listen",
            ":0",
            "--listen-token",
            big.to_str().unwrap(),
            "c:getpid",
        ],
        &format!(
            "the --listen-token file {} is over 4096 bytes: it holds one token",
            big.display()
        ),
    );
}

/// A network namespace joined to this one by a veth pair: this side
/// 198.51.100.1, the other 198.51.100.2 (TEST-NET-2, reachable only here).
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Netns {
        let name = format!("tkserve{}", std::process::id());
        let host = format!("tkh{}", std::process::id() % 100000);
        let sh = |cmd: &str| {
            let st = Command::new("sh").arg("-ec").arg(cmd).status().unwrap();
            assert!(st.success(), "{cmd}");
        };
        sh(&format!(
            "ip netns add {name}
             ip link add {host} type veth peer name eth0 netns {name}
             ip addr add 198.51.100.1/30 dev {host}
             ip link set {host} up
             ip -n {name} addr add 198.51.100.2/30 dev eth0
             ip -n {name} link set eth0 up
             ip -n {name} link set lo up"
        ));
        Netns { name }
    }

    /// Runs `f` on a thread that has joined the namespace.
    fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            use std::os::fd::AsRawFd;
            // SAFETY: setns on a valid namespace fd; only this thread moves.
            assert_eq!(
                unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            f()
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace removes its veth end and so the pair.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

#[test]
fn post_from_another_host_needs_the_token() {
    let ns = Netns::new();
    let dir = Scratch::new();
    let bin = dir.copy(&prog("workload"));
    let spec = format!("{}:tk_alpha", bin.display());

    // Without a token: a warning, GET from anywhere, POST only from loopback.
    let s = Served::start("funccount", &["--listen", "0.0.0.0:0", &spec]);
    let port = s.addr.port();
    let remote: SocketAddr = format!("198.51.100.1:{port}").parse().unwrap();
    let post = "POST /stop HTTP/1.1\r\nHost: t\r\n\r\n";
    let (get_code, post_code) = ns.run(move || {
        (
            request(remote, "GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n").0,
            request(remote, post).0,
        )
    });
    assert_eq!((get_code, post_code), (200, 403));
    assert_eq!(s.post("/reset").0, 200, "loopback POST is accepted");
    s.run.signal(libc::SIGINT);
    let out = s.run.finish(T);
    assert_eq!(
        out.code(),
        0,
        "the refused POST did not stop it: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("is not a loopback address")
            && out.stderr.contains("are refused from other hosts"),
        "{}",
        out.stderr
    );

    // With a token: POST from anywhere with the right bearer token only.
    let token = dir.0.join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let s = Served::start(
        "funccount",
        &[
            "--listen",
            "0.0.0.0:0",
            "--listen-token",
            token.to_str().unwrap(),
            &spec,
        ],
    );
    let remote: SocketAddr = format!("198.51.100.1:{}", s.addr.port()).parse().unwrap();
    let codes = ns.run(move || {
        [
            request(remote, "POST /reset HTTP/1.1\r\nHost: h\r\n\r\n").0,
            request(
                remote,
                "POST /reset HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer wrong\r\n\r\n",
            )
            .0,
            request(
                remote,
                "POST /reset HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer s3cret-token\r\n\r\n",
            )
            .0,
            request(
                remote,
                "POST /stop HTTP/1.1\r\nHost: h\r\nAuthorization: bearer s3cret-token\r\n\r\n",
            )
            .0,
        ]
    });
    assert_eq!(codes, [401, 401, 200, 200]);
    let out = s.run.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_contains(&out.stderr, "need the --listen-token");
}

/// The `prometheus` binary (Debian's package, installed by `cargo xtask deps`).
fn prometheus() -> PathBuf {
    PathBuf::from("/usr/bin/prometheus")
}

/// Asks Prometheus's HTTP API for `query` and returns the single result's value.
fn prom_query(api: SocketAddr, query: &str) -> Option<f64> {
    let q: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    // Refused until Prometheus listens.
    let (code, body) = try_request(
        api,
        &format!("GET /api/v1/query?query={q} HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n"),
    )
    .ok()?;
    if code != 200 {
        return None;
    }
    // A chunked answer: the JSON object is between the first '{' and last '}'.
    let json = &body[body.find('{')?..=body.rfind('}')?];
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let r = v["data"]["result"].as_array()?;
    r.first()?["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_scrapes_exact_counts() {
    assert!(
        prometheus().exists(),
        "Debian's prometheus is missing: cargo xtask deps installs it"
    );
    let dir = Scratch::new();
    let bin = dir.copy(&prog("workload"));
    let w = Workload::start(&bin, &["funcs", "4321"]);
    let fc = Served::start(
        "funccount",
        &["--listen", ":0", &format!("{}:tk_beta", bin.display())],
    );
    let lbin = dir.copy(&prog("latency"));
    let lat = Workload::start(&lbin, &["sleep", "3"]);
    let fl = Served::start(
        "funclatency",
        &["--listen", ":0", &format!("{}:tk_sleep", lbin.display())],
    );

    // Prometheus on a free loopback port, scraping both every second.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let api: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let config = dir.0.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: tracekit\n    static_configs:\n      \
             - targets: ['{}', '{}']\n",
            fc.addr, fl.addr
        ),
    )
    .unwrap();
    let mut prom = Command::new(prometheus())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.0.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.0.join("prometheus.log")).unwrap())
        .spawn()
        .expect("start prometheus");

    w.go();
    lat.go();
    assert!(w.wait().success());
    assert!(lat.wait().success());
    let calls = "tracekit_funccount_calls_total{probe=\"tk_beta\"}";
    let count = "tracekit_funclatency_seconds_count{probe=\"tk_sleep\"}";
    let up = "sum(up{job=\"tracekit\"})";
    let end = Instant::now() + Duration::from_secs(90);
    let mut seen = (None, None, None);
    while Instant::now() < end {
        seen = (
            prom_query(api, calls),
            prom_query(api, count),
            prom_query(api, up),
        );
        if seen == (Some(8642.0), Some(3.0), Some(2.0)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = prom.kill();
    let _ = prom.wait();
    let log = std::fs::read_to_string(dir.0.join("prometheus.log")).unwrap_or_default();
    assert_eq!(
        seen,
        (Some(8642.0), Some(3.0), Some(2.0)),
        "prometheus log:\n{log}"
    );

    fc.run.signal(libc::SIGINT);
    let out = fc.run.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_eq!(last_table(&out.stdout), rows(&[("tk_beta", 8642)]));
    fl.run.signal(libc::SIGTERM);
    let out = fl.run.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert_contains(&out.stdout, "count: 3\n");
}

#[test]
fn urandomread_counts_getrandom_bytes_by_source() {
    let w = Workload::start(&prog("random"), &["getrandom", "40", "48", "--hold"]);
    let pid = w.pid.to_string();
    // --json puts the "Tracing" line where Served::start waits for it.
    let s = Served::start("urandomread", &["--listen", ":0", "--json", "-p", &pid]);
    w.go();
    let reads = "tracekit_urandomread_reads_total{source=\"getrandom\"}";
    let end = Instant::now() + T;
    let m = loop {
        let m = s.get("/metrics").1;
        if m.contains(&format!("{reads} 40")) || Instant::now() > end {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(sample(&m, reads), 40.0, "{m}");
    assert_eq!(
        sample(&m, "tracekit_urandomread_bytes_total{source=\"getrandom\"}"),
        40.0 * 48.0
    );
    assert_eq!(sample(&m, "tracekit_lost_records_total"), 0.0);
    let v: serde_json::Value = serde_json::from_str(&s.get("/summary").1).unwrap();
    assert_eq!(
        v["counts"],
        serde_json::json!([{"source": "getrandom", "reads": 40, "bytes": 1920}])
    );
    assert_eq!(s.post("/reset").0, 200);
    let v: serde_json::Value = serde_json::from_str(&s.get("/summary").1).unwrap();
    assert_eq!(v["counts"], serde_json::json!([]));
    let out = s.stop(T);
    assert_eq!(out.stdout.lines().count(), 40, "{}", out.stdout);
    w.go();
    assert!(w.wait().success());
}

#[test]
fn disksnoop_latency_and_bytes_by_disk_and_operation() {
    let lo = LoopDev::new(16);
    let w = Workload::start(&prog("direct_io"), &[&lo.dev, "w:37:8192", "r:13:4096"]);
    // -d: only this loop device's requests, so the counts are exact.
    let s = Served::start("disksnoop", &["--listen", ":0", "--json", "-d", lo.name()]);
    w.go();
    assert!(w.wait().success());
    // The values of the series of `metric` for this disk and `op` (one expected).
    let values = |m: &str, metric: &str, op: &str| -> Vec<f64> {
        let prefix = format!("{metric}{{disk=\"{}\",", lo.name());
        m.lines()
            .filter(|l| l.starts_with(&prefix) && l.contains(&format!("operation=\"{op}\"}}")))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect()
    };
    let value = |m: &str, metric: &str, op: &str| -> f64 {
        let v = values(m, metric, op);
        assert_eq!(v.len(), 1, "{metric} {op}:\n{m}");
        v[0]
    };
    let count = "tracekit_disksnoop_request_seconds_count";
    // The workload is done, but its completions reach the tool as ring buffer
    // records: scrape until all 50 are in (or T passes), then check exactly.
    let end = Instant::now() + T;
    let m = loop {
        let m = s.get("/metrics").1;
        let n: f64 = ["write", "read"]
            .iter()
            .flat_map(|op| values(&m, count, op))
            .sum();
        if n >= 50.0 || Instant::now() > end {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(value(&m, count, "write"), 37.0);
    assert_eq!(value(&m, count, "read"), 13.0);
    assert_eq!(
        value(&m, "tracekit_disksnoop_bytes_total", "write"),
        37.0 * 8192.0
    );
    assert_eq!(
        value(&m, "tracekit_disksnoop_bytes_total", "read"),
        13.0 * 4096.0
    );
    assert!(value(&m, "tracekit_disksnoop_request_seconds_sum", "write") > 0.0);
    let v: serde_json::Value = serde_json::from_str(&s.get("/summary").1).unwrap();
    let reqs: Vec<(String, u64, u64)> = v["counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["disk"], lo.name());
            (
                c["operation"].as_str().unwrap().to_string(),
                c["requests"].as_u64().unwrap(),
                c["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        reqs,
        vec![
            ("read".into(), 13, 13 * 4096),
            ("write".into(), 37, 37 * 8192)
        ]
    );
    let out = s.stop(T);
    assert_eq!(out.stdout.lines().count(), 50, "{}", out.stdout);
}

#[test]
fn stackcount_serves_folded_stacks() {
    let dir = Scratch::new();
    let bin = dir.copy(&prog("workload"));
    let w = Workload::start(&bin, &["funcs", "250", "--hold"]);
    let pid = w.pid.to_string();
    let spec = format!("{}:tk_beta", bin.display());
    let s = Served::start("stackcount", &["--listen", ":0", "-p", &pid, &spec]);
    w.go();
    let end = Instant::now() + T;
    let folded = loop {
        let (code, f) = s.get("/stacks");
        assert_eq!(code, 200);
        let total: u64 = f
            .lines()
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum();
        if total >= 500 || Instant::now() > end {
            break f;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let lines: Vec<&str> = folded.lines().collect();
    assert_eq!(lines.len(), 1, "one call path:\n{folded}");
    assert!(lines[0].ends_with(";tk_beta 500"), "{folded}");
    let m = s.get("/metrics").1;
    assert_eq!(sample(&m, "tracekit_stackcount_events_total"), 500.0);
    assert_eq!(sample(&m, "tracekit_stackcount_stacks"), 1.0);
    // Requests only read the maps: the final summary still has every event.
    let out = s.stop(T);
    assert_contains(&out.stdout, "\n    500\n");
    w.go();
    assert!(w.wait().success());
}
