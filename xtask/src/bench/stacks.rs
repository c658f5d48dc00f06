//! `cargo xtask bench-stacks`: stackcount against bpftrace on printing many
//! distinct stacks: the time from SIGINT until each tool's output is complete, and
//! the stacks it printed. Both tools are attached at the same time to the same
//! events, so they see the same stacks:
//!
//! - user stacks: a uprobe on tests/progs/stacks.rs `tree 10000`, which reaches
//!   its target through 10,000 distinct call paths;
//! - kernel stacks: a set of busy tracepoints during a file-system, network and
//!   scheduler workload (as many distinct stacks as that produces).
//!
//! Then (module [`super::unwind`]) the cost of whole user stacks of code built
//! without frame pointers: stackcount's frame-pointer walk and its walk by the
//! unwind tables against `perf record --call-graph dwarf` and bpftrace, per
//! event, on one chain of calls; and the tables' start-up cost on python3.
//! `--only-unwind` runs that part alone.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tabled::builder::Builder;
use tabled::settings::Style;

use super::harness::{Line, Tracer};

const USER_STACKS: u32 = 10_000;
const TRACEPOINTS: &str =
    "kmem|sched|irq|timer|workqueue|block|writeback|filemap|net|skb|sock|tcp|signal|task|mmap_lock|percpu|vmscan|rseq|ext4|jbd2";

/// Starts a tool, ready at its first line starting with `ready`; every line
/// after it is kept with its time.
fn start(cmd: Command, ready: &'static str) -> Result<Tracer> {
    Tracer::start(
        cmd,
        move |l| l.starts_with(ready),
        Duration::from_secs(120),
        |_| Line::Keep,
    )
}

/// SIGINT, then (seconds to the last output line, seconds to exit, lines).
fn stop(mut t: Tracer) -> Result<(f64, f64, Vec<String>)> {
    let start = Instant::now();
    t.interrupt();
    t.wait()?;
    let exit = start.elapsed().as_secs_f64();
    let mut last = start;
    let mut lines = Vec::new();
    for (at, l) in t.finish().kept {
        // stackcount's status line at SIGINT (as BCC's), before any stack.
        if l != "Detaching..." {
            last = at;
        }
        lines.push(l);
    }
    Ok((
        last.saturating_duration_since(start).as_secs_f64(),
        exit,
        lines,
    ))
}

fn stackcount_stacks(lines: &[String]) -> usize {
    lines
        .iter()
        .filter(|l| l.starts_with("    ") && l.trim().parse::<u64>().is_ok())
        .count()
}

fn bpftrace_stacks(lines: &[String]) -> usize {
    lines.iter().filter(|l| l.starts_with("@[")).count()
}

fn bpftrace(script: String) -> Command {
    let mut c = Command::new("bpftrace");
    c.arg("-e")
        .arg(format!("BEGIN {{ printf(\"READY\\n\"); }} {script}"));
    // Room for every distinct stack (its default is 4096 keys).
    c.env("BPFTRACE_MAP_KEYS_MAX", "65536");
    c
}

fn workload() {
    // File system, network and process activity: many distinct kernel paths.
    let _ = Command::new("sh")
        .arg("-c")
        .arg(
            "find /usr >/dev/null 2>&1; tar c /usr/share/doc 2>/dev/null | cat >/dev/null; \
             ls -lR /proc/self/ >/dev/null 2>&1; for i in 1 2 3 4 5; do sh -c true; done; \
             python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen(); \
             c=socket.create_connection(s.getsockname()); c.send(b\"x\"*200000)'",
        )
        .status();
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    crate::build::build_release(&[
        "--bin",
        "stackcount",
        "--bin",
        "funccount",
        "--example",
        "stacks",
    ])?;
    let stackcount = root.join("target/release/stackcount");
    let funccount = root.join("target/release/funccount");
    if args.iter().any(|a| a == "--only-unwind") {
        return super::unwind::run(root, &stackcount, &funccount);
    }
    let prog = root.join("target/release/examples/stacks");
    let mut rows = Vec::new();

    // User stacks.
    let mut w = Command::new(&prog)
        .args(["tree", &USER_STACKS.to_string(), "--hold"])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut ready = String::new();
    BufReader::new(w.stdout.take().expect("piped")).read_line(&mut ready)?;
    let spec = format!("{}:tk_target", prog.display());
    let mut sc = Command::new(&stackcount);
    sc.arg(&spec);
    let s = start(sc, "Tracing ")?;
    let b = start(
        bpftrace(format!("uprobe:{spec} {{ @[ustack] = count(); }}")),
        "READY",
    )?;
    // SAFETY: plain kill(2) on our children.
    unsafe { libc::kill(w.id() as i32, libc::SIGUSR1) };
    thread::sleep(Duration::from_secs(2));
    let (s_out, s_exit, s_lines) = stop(s)?;
    let (b_out, b_exit, b_lines) = stop(b)?;
    unsafe { libc::kill(w.id() as i32, libc::SIGUSR1) };
    w.wait()?;
    rows.push((
        format!("user stacks ({USER_STACKS} distinct)"),
        (s_out, s_exit, stackcount_stacks(&s_lines)),
        (b_out, b_exit, bpftrace_stacks(&b_lines)),
    ));

    // Kernel stacks.
    let mut sc = Command::new(&stackcount);
    sc.args(["-K", "-r", &format!("t:({TRACEPOINTS}):.*")]);
    let s = start(sc, "Tracing ")?;
    let probes: Vec<String> = TRACEPOINTS
        .split('|')
        .map(|c| format!("tracepoint:{c}:*"))
        .collect();
    let b = start(
        bpftrace(format!("{} {{ @[kstack] = count(); }}", probes.join(","))),
        "READY",
    )
    .context("bpftrace on the tracepoint set")?;
    workload();
    let (s_out, s_exit, s_lines) = stop(s)?;
    let (b_out, b_exit, b_lines) = stop(b)?;
    rows.push((
        "kernel stacks (tracepoint set + workload)".to_string(),
        (s_out, s_exit, stackcount_stacks(&s_lines)),
        (b_out, b_exit, bpftrace_stacks(&b_lines)),
    ));

    let mut t = Builder::default();
    t.push_record([
        "case",
        "stackcount: stacks printed",
        "stackcount: SIGINT to full output (s)",
        "per stack (us)",
        "bpftrace: stacks printed",
        "bpftrace: SIGINT to full output (s)",
        "per stack (us)",
        "bpftrace / stackcount",
    ]);
    for (case, s, b) in &rows {
        let per = |secs: f64, n: usize| secs * 1e6 / n.max(1) as f64;
        t.push_record([
            case.clone(),
            s.2.to_string(),
            format!("{:.2}", s.0),
            format!("{:.0}", per(s.0, s.2)),
            b.2.to_string(),
            format!("{:.2}", b.0),
            format!("{:.0}", per(b.0, b.2)),
            format!("{:.1}x", b.0 / s.0),
        ]);
    }
    println!(
        "\nstackcount vs bpftrace, both attached to the same events (release build, this host):"
    );
    println!("{}", t.build().with(Style::markdown()));
    println!(
        "Stacks printed differ where stackcount merges stacks that print alike (frames \
         without -s offsets) and bpftrace keys by address, or where bpftrace's stack-id \
         map dropped colliding stacks."
    );
    for (case, s, b) in &rows {
        println!(
            "{case}: SIGINT to exit: stackcount {:.2} s, bpftrace {:.2} s (detach order and \
             shared tracepoints make this one less comparable)",
            s.1, b.1
        );
    }
    super::unwind::run(root, &stackcount, &funccount)
}
