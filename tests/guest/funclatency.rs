//! funclatency and vfsreadlat on kernel functions: every read timed by each
//! mechanism the kernel has, nested functions, --listen, and nothing left after
//! SIGTERM or SIGKILL.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::util::*;
use crate::{assert_nothing_left, bpf_links, expect_kprobe_multi, read_data, T};

pub(crate) fn funclatency() -> PathBuf {
    tool("funclatency")
}

/// Sum of the histogram rows in funclatency/vfsreadlat text output.
pub(crate) fn hist_total(stdout: &str) -> u64 {
    stdout
        .lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(" : ")?;
            range.contains(" -> ").then_some(())?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Runs `tool -p WORKLOAD args` while the workload makes `n` reads.
fn time_reads(tool: &std::path::Path, n: u64, args: &[&str]) -> Output {
    let dir = Scratch::new();
    let w = read_data(&dir, n, &[]);
    trace_workload(tool, w, args, T)
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn funclatency_times_every_read() {
    // Each mechanism the kernel has, named by -D, times exactly the reads made.
    // auto takes kprobe.session where the kernel has it (cheapest per call, see
    // `cargo xtask bench-latency`), else fentry/fexit for one function.
    let auto = if expect_kprobe_multi() {
        "kprobe.session"
    } else {
        "fentry + fexit"
    };
    let mut modes = vec![
        ("auto", auto),
        ("fentry", "fentry + fexit"),
        ("single", "single kprobes + kretprobes"),
    ];
    if expect_kprobe_multi() {
        modes.push(("multi", "kprobe_multi + kretprobe_multi"));
    }
    for (mode, mechanism) in modes {
        let out = time_reads(
            &funclatency(),
            500,
            &["-D", "--attach-mode", mode, "vfs_read"],
        );
        assert!(
            out.stderr.contains(&format!(
                "attach mode: kernel functions: {mechanism} (1 functions"
            )),
            "{mode}: {}",
            out.stderr
        );
        assert_eq!(hist_total(&out.stdout), 500, "{mode}: {}", out.stdout);
        assert!(
            out.stdout.contains(", count: 500\n"),
            "{mode}: {}",
            out.stdout
        );
        assert_nothing_left(&format!("funclatency in {mode} mode"));
    }
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn funclatency_times_nested_functions() {
    // rw_verify_area runs inside vfs_read: with both traced, each call of each is
    // timed (keying by thread alone would lose every vfs_read).
    let out = time_reads(&funclatency(), 300, &["-F", "vfs_read", "rw_verify_area"]);
    let rw = out
        .stdout
        .find("\nFunction = rw_verify_area\n")
        .expect("rw_verify_area section");
    let vfs = out
        .stdout
        .find("\nFunction = vfs_read\n")
        .expect("vfs_read section");
    assert!(rw < vfs, "{}", out.stdout);
    assert_eq!(hist_total(&out.stdout[rw..vfs]), 300, "{}", out.stdout);
    assert_eq!(hist_total(&out.stdout[vfs..]), 300, "{}", out.stdout);
    assert_contains(&out.stdout, ", count: 600\n");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn vfsreadlat_histogram_covers_the_reads() {
    let out = time_reads(&tool("vfsreadlat"), 400, &["--debug", "1"]);
    assert!(
        out.stdout.starts_with(
            "Tracing... Hit Ctrl-C to end.\n\n     usecs               : count     distribution\n"
        ),
        "{}",
        out.stdout
    );
    assert_eq!(hist_total(&out.stdout), 400, "{}", out.stdout);
    let mechanism = if expect_kprobe_multi() {
        "kprobe.session"
    } else {
        "fentry + fexit"
    };
    assert!(
        out.stderr.contains(&format!(
            "attach mode: kernel functions: {mechanism} (1 functions"
        )),
        "{}",
        out.stderr
    );
    assert_nothing_left("vfsreadlat");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn funclatency_listen_serves_kernel_function_latency() {
    // Scraped from inside the guest (std TcpStream: no curl here). The workload
    // holds after its reads, so -p does not end the run before the scrape.
    let dir = Scratch::new();
    let w = read_data(&dir, 600, &["--hold"]);
    let pid = w.pid.to_string();
    let s = crate::util::http::Served::start(
        "funclatency",
        &["--listen", ":0", "-p", &pid, "vfs_read"],
    );
    w.go();
    let series = "tracekit_funclatency_seconds_count{probe=\"vfs_read\"}";
    let end = Instant::now() + T;
    let m = loop {
        let m = s.get("/metrics").1;
        if crate::util::http::sample(&m, series) >= 600.0 || Instant::now() > end {
            break m;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(crate::util::http::sample(&m, series), 600.0, "{m}");
    assert_eq!(
        crate::util::http::sample(&m, "tracekit_probes_attached"),
        1.0
    );
    assert_eq!(
        crate::util::http::sample(
            &m,
            "tracekit_funclatency_seconds_bucket{le=\"+Inf\",probe=\"vfs_read\"}"
        ),
        600.0
    );
    let v: serde_json::Value = serde_json::from_str(&s.get("/summary").1).unwrap();
    assert_eq!(v["count"], 600);
    let out = s.stop(T);
    assert_contains(&out.stdout, ", count: 600\n");
    w.go();
    assert!(w.wait().success());
    assert_nothing_left("funclatency --listen");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn funclatency_leaves_nothing_after_sigterm_and_kill() {
    // Every mechanism, each ended by one of the two signals (both signals on the
    // mechanism the kernel picks by itself), to keep the guest run short.
    let both: &[&str] = &["vfs_read", "vfs_write"];
    let mut runs = vec![
        ("auto", libc::SIGTERM, both),
        ("auto", libc::SIGKILL, both),
        ("single", libc::SIGKILL, &["vfs_read"][..]),
        ("fentry", libc::SIGKILL, &["vfs_read"][..]),
    ];
    if expect_kprobe_multi() {
        runs.push(("multi", libc::SIGTERM, both));
    }
    for (mode, sig, patterns) in runs {
        let mut args = vec!["--attach-mode", mode];
        args.extend_from_slice(patterns);
        let mut t = spawn(&funclatency(), &args);
        t.wait_ready();
        assert!(bpf_links().0 > 0);
        t.signal(sig);
        let out = t.finish(T);
        if sig == libc::SIGTERM {
            assert_eq!(out.code(), 0, "{}", out.stderr);
            assert_ends_with(&out.stdout, "Detaching...\n");
        }
        assert_nothing_left(&format!("funclatency: signal {sig} in {mode} mode"));
    }
}
