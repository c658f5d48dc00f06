//! `cargo xtask bench-load`: the event tools under load, against bpftrace.
//!
//! Each tool traces `random getrandom N 8 --rate R` (tests/progs/random.rs) with
//! `-p`, at rates from 10,000 to 1,000,000 calls a second (the last unpaced:
//! as fast as one thread makes them), its stdout read as fast as it comes (as a
//! file or terminal would take it). For each rate a row says how many events
//! were printed and how many the tool reported lost (the two add up to the calls,
//! or the row says not), the tool's CPU time as a share of one CPU, its peak RSS,
//! and how long it took to exit after the work ended. urandomread also runs with
//! 16 hostile HTTP clients on `--listen` (each asks for /metrics, never reads the
//! answer, trickles a byte every 100 ms and starts again): the tracing loop must
//! not notice them. bpftrace prints the same event with printf from the same
//! tracepoint.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{cpu_ns, reported_lost, Line, Tracer};

/// Calls a second; 0: unpaced.
const RATES: &[u64] = &[10_000, 30_000, 100_000, 300_000, 0];
/// Seconds of work per rate (the unpaced run makes [`UNPACED`] calls).
const SECS: u64 = 2;
const UNPACED: u64 = 2_000_000;
const CLIENTS: usize = 16;

#[derive(Clone, Copy, PartialEq)]
enum Setup {
    Urandomread { json: bool, clients: bool },
    Trace { json: bool },
    Bpftrace,
}

impl Setup {
    fn name(self) -> String {
        match self {
            Setup::Urandomread { json, clients } => format!(
                "urandomread{}{}",
                if json { " --json" } else { "" },
                if clients { " + 16 hostile clients" } else { "" }
            ),
            Setup::Trace { json } => {
                format!(
                    "trace{} t:syscalls:sys_enter_getrandom",
                    if json { " --json" } else { "" }
                )
            }
            Setup::Bpftrace => "bpftrace printf, same tracepoint".into(),
        }
    }
}

/// One run's numbers.
struct Row {
    rate: f64,
    calls: u64,
    printed: u64,
    lost: u64,
    cpu: f64,
    rss_mib: f64,
    exit_s: f64,
}

/// The workload, started and waiting for SIGUSR1.
struct Work(Child);

impl Work {
    fn start(root: &Path, n: u64, rate: u64) -> Result<Work> {
        let mut c = Command::new(root.join("target/release/examples/random"));
        c.args(["getrandom", &n.to_string(), "8"]);
        if rate > 0 {
            c.args(["--rate", &rate.to_string()]);
        }
        let mut child = c
            .stdout(Stdio::piped())
            .spawn()
            .context("starting random")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("random did not start: {line:?}");
        }
        Ok(Work(child))
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Whether our child `pid` has exited (gone, or a zombie not yet reaped).
fn exited(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_none_or(|state| state == "Z" || state == "X")
}

/// Peak RSS (VmHWM) of `pid`, in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Clients that ask for /metrics and then hold the connection, trickling.
struct Hostile {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Hostile {
    fn start(addr: SocketAddr) -> Hostile {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..CLIENTS)
            .map(|_| {
                let stop = stop.clone();
                thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut s) = TcpStream::connect(addr) else {
                            thread::sleep(Duration::from_millis(10));
                            continue;
                        };
                        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
                        for _ in 0..6 {
                            thread::sleep(Duration::from_millis(100));
                            let _ = s.write_all(b"x");
                        }
                    }
                })
            })
            .collect();
        Hostile { stop, threads }
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn run_one(root: &Path, tools: &Path, setup: Setup, rate: u64) -> Result<Row> {
    let n = if rate == 0 { UNPACED } else { rate * SECS };
    let work = Work::start(root, n, rate)?;
    let pid = work.0.id().to_string();
    let bin = |t: &str| tools.join(t);
    let listen = free_addr()?;
    let (cmd, ready_on_stderr, ready): (Command, bool, fn(&str) -> bool) = match setup {
        Setup::Urandomread { json, clients } => {
            let mut c = Command::new(bin("urandomread"));
            c.args(["-p", &pid]);
            if json {
                c.arg("--json");
            }
            if clients {
                c.args(["--listen", &listen.to_string()]);
            }
            if json {
                (c, true, |l| l.starts_with("Tracing"))
            } else {
                (c, false, |l| l.starts_with("TIME(s)"))
            }
        }
        Setup::Trace { json } => {
            let mut c = Command::new(bin("trace"));
            c.args(["-p", &pid]);
            if json {
                c.arg("--json");
            }
            c.arg("t:syscalls:sys_enter_getrandom");
            if json {
                (c, true, |l| l.starts_with("Tracing"))
            } else {
                (c, false, |l| l.starts_with("PID"))
            }
        }
        Setup::Bpftrace => {
            let mut c = Command::new("bpftrace");
            c.args([
                "-e",
                &format!(
                    "tracepoint:syscalls:sys_enter_getrandom /pid == {pid}/ \
                     {{ printf(\"%d %d %s %d\\n\", pid, tid, comm, args->len); }}"
                ),
            ]);
            (c, false, |l| l.starts_with("Attaching"))
        }
    };
    let classify = |l: &str| {
        // bpftrace reports its losses on stdout ("Lost N events").
        if let Some(n) = l
            .strip_prefix("Lost ")
            .and_then(|r| r.strip_suffix(" events"))
        {
            return Line::Lost(n.parse().unwrap_or(0));
        }
        if l.starts_with('{') && l.contains("\"pid\"") || l.split_whitespace().count() >= 3 {
            Line::Record
        } else {
            Line::Skip
        }
    };
    let limit = Duration::from_secs(60);
    let mut t = if ready_on_stderr {
        Tracer::start_ready_on_stderr(cmd, ready, limit, classify)?
    } else {
        Tracer::start(cmd, ready, limit, classify)?
    };
    let tool = t.pid();
    let hostile = match setup {
        Setup::Urandomread { clients: true, .. } => Some(Hostile::start(listen)),
        _ => None,
    };
    let cpu0 = cpu_ns(tool);
    let start = Instant::now();
    let mut work = work;
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(work.0.id() as i32, libc::SIGUSR1) };
    work.0.wait()?;
    let secs = start.elapsed().as_secs_f64();
    let ended = Instant::now();
    let mut rss = peak_rss_mib(tool);
    let mut cpu = cpu_ns(tool);
    // tracekit's tools end with their -p process; bpftrace is stopped.
    if setup == Setup::Bpftrace {
        thread::sleep(Duration::from_millis(500));
        t.interrupt();
    }
    let deadline = ended + Duration::from_secs(30);
    while Instant::now() < deadline {
        if exited(tool) {
            break;
        }
        rss = rss.max(peak_rss_mib(tool));
        let c = cpu_ns(tool);
        if c > 0 {
            cpu = c;
        }
        thread::sleep(Duration::from_millis(20));
    }
    if !t.wait_within(Duration::from_secs(5), Some(Duration::from_secs(1)))? {
        bail!(
            "{} did not exit within 35 s of the work's end",
            setup.name()
        );
    }
    let exit_s = ended.elapsed().as_secs_f64();
    drop(hostile);
    let out = t.finish();
    // bpftrace's "Lost N events" come on stdout (classified), ours on stderr.
    let lost = reported_lost(&out.stderr) + out.lost;
    Ok(Row {
        rate: n as f64 / secs,
        calls: n,
        printed: out.records,
        lost,
        cpu: (cpu.saturating_sub(cpu0)) as f64 / 1e9 / secs,
        rss_mib: rss,
        exit_s,
    })
}

/// A loopback address with a port free now, for the tool's `--listen`.
fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// `args`: `--tools DIR` takes urandomread and trace from DIR (another build's
/// target/release: the numbers before a change), the workload still from here;
/// `--only TEXT` runs the setups whose name contains TEXT.
pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let usage = "usage: cargo xtask bench-load [--tools DIR] [--only TEXT]";
    let (mut tools, mut only) = (None, None);
    let mut a = args.iter();
    while let Some(flag) = a.next() {
        let value = a.next().with_context(|| usage.to_string())?;
        match flag.as_str() {
            "--tools" => tools = Some(PathBuf::from(value)),
            "--only" => only = Some(value.clone()),
            _ => bail!(usage),
        }
    }
    if let Some(dir) = &tools {
        for t in ["urandomread", "trace"] {
            if !dir.join(t).is_file() {
                bail!(
                    "--tools {}: no {t} there (build it: cargo build --release --bin {t})",
                    dir.display()
                );
            }
        }
    }
    let tools = tools.unwrap_or_else(|| root.join("target/release"));
    crate::build::build_release(&[
        "--bin",
        "urandomread",
        "--bin",
        "trace",
        "--example",
        "random",
    ])?;
    eprintln!("xtask: bench-load: the tools from {}", tools.display());
    let setups = [
        Setup::Urandomread {
            json: false,
            clients: false,
        },
        Setup::Urandomread {
            json: false,
            clients: true,
        },
        Setup::Urandomread {
            json: true,
            clients: false,
        },
        Setup::Urandomread {
            json: true,
            clients: true,
        },
        Setup::Trace { json: false },
        Setup::Trace { json: true },
        Setup::Bpftrace,
    ];
    let mut b = Builder::default();
    b.push_record([
        "tool",
        "calls/s made",
        "printed",
        "lost",
        "lost %",
        "CPU (of one)",
        "peak RSS",
        "exit after work",
    ]);
    for setup in setups {
        if only
            .as_ref()
            .is_some_and(|o| !setup.name().contains(o.as_str()))
        {
            continue;
        }
        for &rate in RATES {
            let what = format!(
                "{} at {}",
                setup.name(),
                if rate == 0 {
                    "full speed".to_string()
                } else {
                    format!("{rate}/s")
                }
            );
            eprintln!("xtask: {what}");
            match run_one(root, &tools, setup, rate) {
                Ok(r) => {
                    let sum = if r.printed + r.lost == r.calls {
                        String::new()
                    } else {
                        format!(" (sum {} of {})", r.printed + r.lost, r.calls)
                    };
                    b.push_record([
                        setup.name(),
                        format!("{:.0}", r.rate),
                        format!("{}{sum}", r.printed),
                        r.lost.to_string(),
                        format!("{:.1}", r.lost as f64 * 100.0 / r.calls as f64),
                        format!("{:.0}%", r.cpu * 100.0),
                        format!("{:.0} MiB", r.rss_mib),
                        format!("{:.2} s", r.exit_s),
                    ]);
                }
                Err(e) => {
                    b.push_record([
                        setup.name(),
                        format!("{rate}"),
                        format!("failed: {e:#}"),
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                    ]);
                }
            }
        }
    }
    println!("{}", b.build().with(Style::markdown()));
    Ok(())
}
