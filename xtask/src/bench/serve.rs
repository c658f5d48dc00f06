//! `cargo xtask bench-serve`: the cost of `--listen` scrapes on the host.
//!
//! One funccount (release) traces 10,000 user functions of a generated C
//! program (10,000 series) and the workload's tk_* functions. It reports:
//! - the time a scrape of /metrics takes, seen by the client and as the tool's
//!   own `tracekit_scrape_duration_seconds` (reading the maps), over many scrapes;
//! - the traced workload's cost per call with no scrapes, with one scrape a
//!   second (a Prometheus), and with scrapes back to back (worst case), as
//!   ratios to the first.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{lines_of, many_functions, median, wait_for, Workload};

const FUNCS: usize = 10_000;
const SCRAPES: usize = 30;
const CALLS: u64 = 300_000;
const ROUNDS: usize = 5;

fn get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    if !text.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", text.lines().next().unwrap_or(""));
    }
    Ok(text)
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The workload's ns per call over `ROUNDS` runs (median), while `scrape`
/// scrapes every `every` (None: not at all; zero: back to back).
fn per_call(workload: &Path, addr: SocketAddr, every: Option<Duration>) -> Result<(f64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let scraper = every.map(|every| {
        let (stop, count) = (stop.clone(), count.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if get(addr, "/metrics").is_ok() {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                thread::sleep(every);
            }
        })
    });
    let mut v = Vec::new();
    for _ in 0..ROUNDS {
        let w = Workload::start(workload, &["funcs".into(), CALLS.to_string()])?;
        v.push(w.run()?);
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = scraper {
        let _ = t.join();
    }
    Ok((median(v), count.load(Ordering::Relaxed)))
}

pub fn run(root: &Path) -> Result<()> {
    crate::build::build_release(&["--bin", "funccount", "--example", "workload"])?;
    let funccount = root.join("target/release/funccount");
    let dir = std::env::temp_dir().join(format!("tk-bench-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let many = many_functions(&dir, FUNCS)?;
    // A private copy: the workload runs only for this benchmark.
    let workload = dir.join("workload");
    std::fs::copy(root.join("target/release/examples/workload"), &workload)?;

    let mut tool = Command::new(&funccount)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg(format!("{}:fn_*", many.display()))
        .arg(format!("{}:tk_*", workload.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let lines = lines_of(&mut tool);
    let l = wait_for(
        &lines,
        |l| l.contains(": serving http://"),
        "funccount --listen",
    )?;
    let addr: SocketAddr = l
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .context("no address")?
        .parse()?;
    // Attached once /metrics shows every probe.
    let end = Instant::now() + Duration::from_secs(300);
    loop {
        let m = get(addr, "/metrics")?;
        if sample(&m, "tracekit_probes_attached") == Some((FUNCS + 3) as f64) {
            break;
        }
        if Instant::now() > end {
            bail!("funccount did not attach {} probes", FUNCS + 3);
        }
        thread::sleep(Duration::from_millis(200));
    }
    // Every function called once: 10,000 non-zero series.
    let mut prog = Command::new(&many)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(prog.stdout.take().context("stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    prog.stdin.as_mut().context("stdin")?.write_all(b"go\n")?;
    line.clear();
    out.read_line(&mut line)?;

    let mut client = Vec::new();
    let mut server = Vec::new();
    let mut series = 0;
    let mut bytes = 0;
    for _ in 0..SCRAPES {
        let t = Instant::now();
        let m = get(addr, "/metrics")?;
        client.push(t.elapsed().as_secs_f64() * 1e3);
        server.push(sample(&m, "tracekit_scrape_duration_seconds").unwrap_or(0.0) * 1e3);
        series = m
            .lines()
            .filter(|l| l.starts_with("tracekit_funccount_calls_total{"))
            .count();
        let ones = m
            .lines()
            .filter(|l| {
                l.starts_with("tracekit_funccount_calls_total{probe=\"fn_") && l.ends_with(" 1")
            })
            .count();
        if ones != FUNCS {
            bail!("{ones} of {FUNCS} functions show exactly 1 call");
        }
        bytes = m.len();
    }
    drop(prog.stdin.take());
    let _ = prog.wait();
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);

    let (none, _) = per_call(&workload, addr, None)?;
    let (second, n1) = per_call(&workload, addr, Some(Duration::from_secs(1)))?;
    let (busy, n2) = per_call(&workload, addr, Some(Duration::ZERO))?;

    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(tool.id() as i32, libc::SIGINT) };
    tool.wait()?;
    let _ = std::fs::remove_dir_all(&dir);

    let mut b = Builder::default();
    b.push_record(["what", "median", "max"]);
    b.push_record([
        format!(
            "scrape of {series} series ({} KiB), client ms",
            bytes / 1024
        ),
        format!("{:.1}", median(client.clone())),
        format!("{:.1}", max(&client)),
    ]);
    b.push_record([
        "  of which reading the maps (tracekit_scrape_duration_seconds), ms".to_string(),
        format!("{:.1}", median(server.clone())),
        format!("{:.1}", max(&server)),
    ]);
    println!(
        "\nfunccount --listen (release), {FUNCS} user functions + 3, {SCRAPES} scrapes:\n{}",
        b.build().with(Style::markdown())
    );
    let mut b = Builder::default();
    b.push_record([
        "scraping while the workload runs",
        "ns per traced call",
        "ratio",
        "scrapes",
    ]);
    b.push_record([
        "none".to_string(),
        format!("{none:.0}"),
        "1.00".into(),
        "0".into(),
    ]);
    b.push_record([
        "one per second".to_string(),
        format!("{second:.0}"),
        format!("{:.2}", second / none),
        n1.to_string(),
    ]);
    b.push_record([
        "back to back".to_string(),
        format!("{busy:.0}"),
        format!("{:.2}", busy / none),
        n2.to_string(),
    ]);
    println!(
        "\nper-call cost of the workload's traced tk_* calls ({CALLS} x 6 calls, median of {ROUNDS}):\n{}",
        b.build().with(Style::markdown())
    );
    Ok(())
}
