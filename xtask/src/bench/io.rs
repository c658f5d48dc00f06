//! `cargo xtask bench-io`: the per-event cost of disksnoop on a loop device, next
//! to bpftrace's biosnoop idiom (block tracepoints keyed by device and sector) and
//! BCC's biosnoop-bpfcc, in one run; and the event rate the ring-buffer path
//! sustains without loss (urandomread on back-to-back getrandom() calls).
//!
//! The workload writes 4 KiB blocks with O_DIRECT for a fixed time; the added
//! cost per request is 1/rate(traced) - 1/rate(untraced). Every traced run
//! checks that the tool printed one line per request, so a fast wrong answer
//! cannot win.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{cpu_ns, median, num_cpus, reported_lost, BpfStats, Line, Output, Tracer};

const REPEATS: usize = 5;
const SECS: f64 = 2.0;
const BLOCK: usize = 4096;

#[derive(Clone, Copy, PartialEq)]
enum Tool {
    None,
    Disksnoop,
    Bpftrace,
    Biosnoop,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::None => "untraced",
            Tool::Disksnoop => "disksnoop",
            Tool::Bpftrace => "bpftrace",
            Tool::Biosnoop => "biosnoop-bpfcc",
        }
    }
}

/// A loop device over a file in tmpfs (no disk under it to add noise), detached
/// and removed on drop.
struct Loop {
    dev: String,
    file: std::path::PathBuf,
}

impl Loop {
    fn new() -> Result<Loop> {
        let file = std::path::PathBuf::from(format!(
            "/dev/shm/tracekit-bench-io-{}.img",
            std::process::id()
        ));
        fs::File::create(&file)?.set_len(128 << 20)?;
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .context("running losetup")?;
        if !out.status.success() {
            bail!("losetup: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(Loop {
            dev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            file,
        })
    }

    fn name(&self) -> &str {
        self.dev.trim_start_matches("/dev/")
    }

    /// The kernel's dev_t (major << 20 | minor), as block tracepoints record it.
    fn kdev(&self) -> Result<u64> {
        let s = fs::read_to_string(format!("/sys/class/block/{}/dev", self.name()))?;
        let (maj, min) = s.trim().split_once(':').context("dev file")?;
        Ok((maj.parse::<u64>()? << 20) | min.parse::<u64>()?)
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = fs::remove_file(&self.file);
    }
}

/// A line after the start is a record when it begins with a number (the time,
/// or bpftrace's sector count), not a blank or a map dump at exit; bpftrace
/// reports records lost on stdout ("Lost N events").
fn classify(l: &str) -> Line {
    if l.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        Line::Record
    } else if let Some(k) = l
        .strip_prefix("Lost ")
        .and_then(|r| r.split(' ').next()?.parse::<u64>().ok())
    {
        Line::Lost(k)
    } else {
        Line::Skip
    }
}

fn start_tracer(cmd: Command, ready: Ready) -> Result<Tracer> {
    Tracer::start(cmd, ready, Duration::from_secs(120), classify)
}

/// Stops it and returns what it printed.
fn stop(mut t: Tracer) -> Result<Output> {
    // Let the last records reach the reader.
    thread::sleep(Duration::from_millis(500));
    t.interrupt();
    t.wait()?;
    Ok(t.finish())
}

/// `direct_io DEV --bench SECS 4096`: (ops, seconds).
fn write_for(direct_io: &Path, dev: &str) -> Result<(u64, f64)> {
    let out = Command::new(direct_io)
        .args([dev, "--bench", &SECS.to_string(), &BLOCK.to_string()])
        .output()?;
    if !out.status.success() {
        bail!("direct_io failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let s = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = s.split_whitespace().collect();
    match f.as_slice() {
        ["ops", n, "secs", t] => Ok((n.parse()?, t.parse()?)),
        _ => bail!("direct_io printed {s:?}"),
    }
}

/// Whether a tracer's output line says it is ready.
type Ready = fn(&str) -> bool;

fn tracer_cmd(tool: Tool, root: &Path, lo: &Loop) -> Result<(Command, Ready)> {
    Ok(match tool {
        Tool::Disksnoop => {
            let mut c = Command::new(root.join("target/release/disksnoop"));
            c.args(["-d", lo.name()]);
            (c, |l: &str| l.starts_with("TIME(s)"))
        }
        Tool::Bpftrace => {
            let dev = lo.kdev()?;
            let mut c = Command::new("bpftrace");
            c.arg("-e").arg(format!(
                "BEGIN {{ printf(\"READY\\n\"); }} \
                 tracepoint:block:block_rq_issue /args->dev == {dev}/ {{ @start[args->dev, args->sector] = nsecs; }} \
                 tracepoint:block:block_rq_complete /@start[args->dev, args->sector]/ {{ \
                   printf(\"%u %llu %llu\\n\", args->nr_sector, args->sector, (nsecs - @start[args->dev, args->sector]) / 1000); \
                   delete(@start[args->dev, args->sector]); }} \
                 END {{ clear(@start); }}"
            ));
            (c, |l: &str| l == "READY")
        }
        Tool::Biosnoop => {
            let mut c = Command::new("biosnoop-bpfcc");
            c.args(["-d", lo.name()]);
            (c, |l: &str| l.starts_with("TIME(s)"))
        }
        Tool::None => unreachable!(),
    })
}

/// One measured run: requests per second (wall clock, noisy on a shared
/// machine), and per request the time the tool's BPF programs ran (from the
/// kernel's BPF run-time statistics) and the CPU time of the tool's process (its
/// reader and output).
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    rate: f64,
    /// Percent of requests the tool lost (buffer full).
    lost: f64,
    bpf_ns: f64,
    cpu_ns: f64,
}

/// Sum of run_time_ns over the BPF programs `pid` holds (its fdinfo).
fn bpf_run_ns(pid: u32) -> u64 {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let mut total = 0;
    for fd in fds.flatten() {
        let is_prog =
            fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy() == "anon_inode:bpf-prog");
        if !is_prog {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        total += info
            .lines()
            .find_map(|l| l.strip_prefix("run_time_ns:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

fn measure(tool: Tool, root: &Path, lo: &Loop) -> Result<Sample> {
    let direct_io = root.join("target/release/examples/direct_io");
    if tool == Tool::None {
        let (ops, secs) = write_for(&direct_io, &lo.dev)?;
        return Ok(Sample {
            rate: ops as f64 / secs,
            ..Default::default()
        });
    }
    let (cmd, ready) = tracer_cmd(tool, root, lo)?;
    let t = start_tracer(cmd, ready)?;
    let pid = t.pid();
    let (bpf0, cpu0) = (bpf_run_ns(pid), cpu_ns(pid));
    let (ops, secs) = write_for(&direct_io, &lo.dev)?;
    // Let the reader catch up before reading its CPU time.
    thread::sleep(Duration::from_millis(500));
    let (bpf1, cpu1) = (bpf_run_ns(pid), cpu_ns(pid));
    let out = stop(t)?;
    let (lines, lost_out) = (out.records, out.lost);
    // Records the tool could not pass on: disksnoop's "lost N events: ...",
    // bpftrace's "Lost N events".
    let lost = reported_lost(&out.stderr) + lost_out;
    // One line per request or a lost record, except that this host's kernel now
    // and then ends a loop-device request without firing block_rq_complete
    // (funccount counts one block_rq_issue more than block_rq_complete then):
    // allow 1 in 10,000.
    let seen = lines + lost;
    if seen > ops || seen + ops / 10_000 + 1 < ops {
        bail!(
            "{} printed {lines} lines and lost {lost} for {ops} requests",
            tool.name()
        );
    }
    Ok(Sample {
        rate: ops as f64 / secs,
        lost: lost as f64 / ops as f64 * 100.0,
        bpf_ns: bpf1.saturating_sub(bpf0) as f64 / ops as f64,
        cpu_ns: cpu1.saturating_sub(cpu0) as f64 / ops as f64,
    })
}

/// urandomread on `random getrandom N 8 --rate R`: (events/s made, lines
/// printed, records lost).
fn ring_rate(root: &Path, n: u64, rate: u64) -> Result<(f64, u64, u64)> {
    let mut w = Command::new(root.join("target/release/examples/random"))
        .args([
            "getrandom",
            &n.to_string(),
            "8",
            "--rate",
            &rate.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(w.stdout.take().expect("piped")).read_line(&mut line)?;
    let mut c = Command::new(root.join("target/release/urandomread"));
    c.args(["-p", &w.id().to_string()]);
    let t = start_tracer(c, |l: &str| l.starts_with("TIME(s)"))?;
    let start = Instant::now();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(w.id() as i32, libc::SIGUSR1) };
    w.wait()?;
    let secs = start.elapsed().as_secs_f64();
    let out = stop(t)?;
    let lines = out.records;
    // Per-report counts ("lost N events: ..."), not the total line.
    let lost = reported_lost(&out.stderr);
    Ok((n as f64 / secs, lines, lost))
}

pub fn run(root: &Path) -> Result<()> {
    crate::build::build_release(&[
        "--bin",
        "disksnoop",
        "--bin",
        "urandomread",
        "--example",
        "direct_io",
        "--example",
        "random",
    ])?;
    let lo = Loop::new()?;
    eprintln!(
        "xtask: O_DIRECT 4 KiB writes to {} (over tmpfs) for {SECS} s; {REPEATS} rounds, tools interleaved",
        lo.dev
    );
    let tools = [Tool::None, Tool::Disksnoop, Tool::Bpftrace, Tool::Biosnoop];
    // Not fatal: without the statistics (not root) the BPF column reads 0.
    let _stats = BpfStats::enable();
    let mut runs: Vec<Vec<Sample>> = vec![Vec::new(); tools.len()];
    let mut failed: Vec<Option<anyhow::Error>> = tools.iter().map(|_| None).collect();
    // Warm up the device and page cache.
    measure(Tool::None, root, &lo)?;
    for round in 0..REPEATS {
        for (i, &tool) in tools.iter().enumerate() {
            if failed[i].is_some() {
                continue;
            }
            match measure(tool, root, &lo) {
                Ok(r) => runs[i].push(r),
                Err(e) => failed[i] = Some(e),
            }
        }
        eprintln!(
            "xtask: round {}: {:?}",
            round + 1,
            runs.iter().map(|r| r.last().copied()).collect::<Vec<_>>()
        );
    }
    let mut raw = Vec::new();
    let mut rows: Vec<(Tool, Result<Sample>)> = Vec::new();
    for ((tool, r), f) in tools.iter().zip(runs).zip(failed) {
        raw.push(serde_json::json!({"tool": tool.name(),
            "writes_per_sec": r.iter().map(|x| x.rate).collect::<Vec<_>>(),
            "bpf_ns_per_request": r.iter().map(|x| x.bpf_ns).collect::<Vec<_>>(),
            "tool_cpu_ns_per_request": r.iter().map(|x| x.cpu_ns).collect::<Vec<_>>(),
            "lost_percent": r.iter().map(|x| x.lost).collect::<Vec<_>>(),
            "error": f.as_ref().map(|e| format!("{e:#}"))}));
        let m = |g: fn(&Sample) -> f64| median(r.iter().map(g).collect());
        rows.push((
            *tool,
            f.map_or_else(
                || {
                    Ok(Sample {
                        rate: m(|x| x.rate),
                        lost: m(|x| x.lost),
                        bpf_ns: m(|x| x.bpf_ns),
                        cpu_ns: m(|x| x.cpu_ns),
                    })
                },
                Err,
            ),
        ));
    }
    let ours = rows[1].1.as_ref().ok().map(|s| s.bpf_ns + s.cpu_ns);
    let mut table = Builder::default();
    table.push_record([
        format!("tool (median of {REPEATS})"),
        "writes/s".to_string(),
        "BPF ns / request".to_string(),
        "tool CPU ns / request".to_string(),
        "total / disksnoop's".to_string(),
        "lost".to_string(),
    ]);
    for (tool, r) in &rows {
        match r {
            Ok(x) if *tool == Tool::None => table.push_record([
                tool.name().to_string(),
                format!("{:.0}", x.rate),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
            ]),
            Ok(x) => table.push_record([
                tool.name().to_string(),
                format!("{:.0}", x.rate),
                format!("{:.0}", x.bpf_ns),
                format!("{:.0}", x.cpu_ns),
                ours.map_or("?".to_string(), |o| {
                    format!("{:.2}x", (x.bpf_ns + x.cpu_ns) / o)
                }),
                format!("{:.1}%", x.lost),
            ]),
            Err(e) => table.push_record([
                tool.name().to_string(),
                format!("unavailable: {}", one_line(&format!("{e:#}"))),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]),
        }
    }
    println!("\nBlock requests on {} ({} CPUs):", lo.dev, num_cpus());
    println!("{}", table.build().with(Style::markdown()));
    println!(
        "BPF ns: the tool's programs' run time (kernel.bpf_stats_enabled) per request; tool CPU:\n\
         its process's user+system time per request (reading records, printing lines).\n\
         writes/s is wall-clock and only meaningful on an idle machine."
    );
    println!(
        "Every traced run accounted for every request: a line, or a record it reported lost\n\
         (all but at most 1 in 10,000: this kernel sometimes ends a loop request without\n\
         block_rq_complete)."
    );

    println!(
        "\nRing buffer (urandomread, default 1 MiB): getrandom() calls paced at a rate for 1 s,\n\
         printed lines vs records lost:"
    );
    let mut best = None;
    for rate in [50_000u64, 100_000, 200_000, 400_000, 800_000] {
        let (offered, delivered, lost) = ring_rate(root, rate, rate)?;
        println!("  {rate:>7}/s asked, {offered:>9.0}/s made: {delivered} lines, {lost} lost");
        raw.push(
            serde_json::json!({"ring_rate": rate, "offered_per_sec": offered,
            "delivered": delivered, "lost": lost}),
        );
        if lost == 0 && delivered == rate {
            best = Some(offered);
        }
    }
    match best {
        Some(r) => println!(
            "sustained without loss: {r:.0} events/s (the highest rate made with none lost)"
        ),
        None => println!("records were lost at every rate tried"),
    }
    let out = root.join("target/bench/io.json");
    fs::write(&out, serde_json::to_string_pretty(&raw)?)?;
    println!("raw numbers: {}", out.display());
    Ok(())
}

fn one_line(s: &str) -> String {
    let s = s.lines().last().unwrap_or("").trim();
    if s.chars().count() > 100 {
        format!("{}...", s.chars().take(100).collect::<String>())
    } else {
        s.to_string()
    }
}
