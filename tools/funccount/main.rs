//! funccount: count kernel/user function calls, tracepoints and USDT probes.

#![cfg_attr(not(test), no_main)]

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use common::ahead::OpenAhead;
use common::cli::{parse_secs, CommonArgs, SummaryArgs};
use common::counters::PerCpuCounters;
use common::metrics::{label, Metrics};
use common::session::{How, Session};
use common::ProbeSpec;
use common::RawTracepoints;
use common::Schedule;
use common::Served;
use common::{emit, summary_record, timestamp};
use libbpf_rs::skel::{OpenSkel, Skel};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/funccount.skel.rs"));
}

const EXAMPLES: &str = "\
Examples:
  funccount 'vfs_*'                  # count kernel functions starting with vfs_
  funccount -r '^vfs.*'              # the same, as a regular expression
  funccount -Ti 5 'vfs_*'            # summary every 5 seconds, with timestamps
  funccount -d 10 'tcp_*' 'udp_*'    # several patterns, one summary after 10 s
  funccount -p 185 'vfs_*'           # only calls made by process 185
  funccount t:sched:sched_fork       # count a tracepoint
  funccount 't:syscalls:sys_enter_*' # every syscall-entry tracepoint
  funccount -p 185 c:malloc          # malloc() calls in libc by process 185
  funccount 'go:os.*'                # os.* calls in the go binary on PATH
  funccount u:pthread:*mutex* -p 442 # USDT probes in libpthread
  funccount -i 1 --json 'vfs_*'      # one JSON object per second
  funccount software:page-faults:1   # every page fault (period 1)
  funccount software:cs:1 c:malloc   # context switches and malloc() calls";

/// Count function calls, tracepoints and USDT probes matching patterns.
///
/// Counting happens in the kernel; summaries print at each interval and at the end
/// (Ctrl-C, SIGTERM, -d elapsing, or the -p process exiting).
#[derive(Parser, Debug)]
#[command(name = "funccount", version, after_help = EXAMPLES)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    summary: SummaryArgs,

    /// Trace for SECS seconds, then print the final summary and exit
    #[arg(short, long, value_name = "SECS", value_parser = parse_secs, allow_hyphen_values = true)]
    duration: Option<Duration>,

    /// Print the plan (what matched, the attach mode, skipped probes) and the time of each start-up phase
    #[arg(short = 'D', long)]
    debug: bool,

    /// What to count: FUNC, p::FUNC, LIB:FUNC, /PATH:FUNC, t:CAT:EVENT, u:LIB:PROBE,
    /// profile:hz:N, software:EVENT[:PERIOD], hardware:EVENT[:PERIOD]
    #[arg(required = true, value_name = "PATTERN")]
    patterns: Vec<String>,
}

common::entry!(main);

fn main() {
    let ahead = OpenAhead::start(skel::CORE_SECTIONS, skel::LIBBPF_WARMUP);
    common::cli::main("funccount", || run(common::cli::parse::<Args>(), ahead))
}

fn run(mut args: Args, ahead: OpenAhead<skel::FunccountSkelBuilder>) -> Result<()> {
    let specs = ProbeSpec::parse_all(&args.patterns, args.summary.regexp)?;
    let how = How {
        raw_tracepoints: RawTracepoints::ByCookie,
        ..How::default()
    };
    let mut session = Session::prepare(&specs, &mut args.common, how, args.debug)?;
    let plan = &session.plan;

    let mut open = common::open_skeleton!(ahead, plan, args.common.cpu, |rodata| {
        let g = common::SyscallGlobals::of(plan);
        rodata.kernel_reads = g.kernel_reads;
        rodata.remember_nr = g.remember_nr;
        rodata.task_status_off = g.task_status_off;
    });
    // Without raw tracepoint cookies, the probe each clone of the cookie-less
    // raw tracepoint program counts (the array is as long as common expects).
    if let Some(clones) = open.maps.rodata_raw_tp_data.as_deref_mut() {
        let slots: &mut [u32; common::RAW_TP_CLONES] = &mut clones.raw_tp_probes;
        for (slot, probe) in slots.iter_mut().zip(common::raw_tp_clones(plan)) {
            *slot = probe as u32;
        }
    }
    open.maps.counts.set_max_entries(plan.probes.len() as u32)?;
    let skel = open.load().context("loading the BPF programs")?;
    let labels: Vec<String> = plan.probes.iter().map(|p| p.label.clone()).collect();

    session.attach(skel.object())?;
    let counters = PerCpuCounters::new(&skel.maps.counts, labels.len())?;
    session.announce(&args.patterns)?;
    let schedule = Schedule {
        interval: args.summary.interval,
        duration: args.duration,
    };
    let mut counts = Counts {
        labels,
        counters,
        json: session.json,
        timestamp: args.summary.timestamp,
    };
    session.run(schedule, &mut counts)?;
    session.finish(false)
}

/// The counts of a run: printed per summary, served with --listen.
struct Counts {
    labels: Vec<String>,
    counters: PerCpuCounters,
    json: bool,
    timestamp: bool,
}

impl Served for Counts {
    fn print(&mut self, last: bool) -> Result<()> {
        let rows = rows(&self.labels, &self.counters.deltas()?);
        emit(&if self.json {
            json_summary(&rows, last)
        } else {
            table(&rows, self.timestamp)
        })
    }

    fn metrics(&mut self, m: &mut Metrics) -> Result<()> {
        let totals = self.counters.totals()?;
        m.counters(
            "tracekit_funccount_calls",
            "Calls (or events) of each probe since the start",
            self.labels
                .iter()
                .zip(totals)
                .map(|(l, n)| (label("probe", l.as_str()), n))
                .collect(),
        );
        Ok(())
    }

    fn summary(&mut self) -> Result<serde_json::Value> {
        let rows = rows(&self.labels, &self.counters.peek()?);
        Ok(serde_json::from_str(&json_summary(&rows, false))?)
    }

    fn reset(&mut self) -> Result<()> {
        self.counters.deltas().map(drop)
    }
}

/// Non-zero counts, ascending (BCC order; ties by name for stable output).
fn rows<'a>(labels: &'a [String], counts: &[u64]) -> Vec<(&'a str, u64)> {
    let mut rows: Vec<(&str, u64)> = labels
        .iter()
        .zip(counts)
        .filter(|(_, c)| **c > 0)
        .map(|(l, c)| (l.as_str(), *c))
        .collect();
    rows.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(b.0)));
    rows
}

fn table(rows: &[(&str, u64)], with_time: bool) -> String {
    let mut s = String::from("\n");
    if with_time {
        let _ = writeln!(s, "{:<8}", timestamp());
    }
    let _ = writeln!(s, "{:<36} {:>8}", "FUNC", "COUNT");
    for (name, count) in rows {
        let _ = writeln!(s, "{name:<36} {count:>8}");
    }
    s
}

fn json_summary(rows: &[(&str, u64)], last: bool) -> String {
    let counts: Vec<serde_json::Value> = rows
        .iter()
        .map(|(f, c)| serde_json::json!({ "func": f, "count": c }))
        .collect();
    let v = summary_record(last, serde_json::json!({ "counts": counts }));
    format!("{v}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_bcc_layout() {
        let labels = ["vfs_write", "vfs_read", "vfs_open"].map(String::from);
        let r = rows(&labels, &[4, 30, 0]);
        assert_eq!(
            table(&r, false),
            "\nFUNC                                    COUNT\n\
             vfs_write                                   4\n\
             vfs_read                                   30\n"
        );
    }
}
