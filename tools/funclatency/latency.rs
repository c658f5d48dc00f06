//! The latency tracing that funclatency and vfsreadlat share: one BPF object
//! (bpf/funclatency.bpf.c), a log2 histogram per summary (per function with -F),
//! BCC's text or JSON.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use common::ahead::OpenAhead;
use common::cli::CommonArgs;
use common::counters::{PerCpuCounters, PerCpuTable};
use common::hist::{Log2Hist, Totals, Unit, LOG2_SLOTS};
use common::metrics::{label, Metrics};
use common::session::{How, Session};
use common::warn;
use common::Hooks;
use common::ProbeSpec;
use common::Schedule;
use common::Served;
use common::{emit, summary_record, timestamp};
use libbpf_rs::skel::{OpenSkel, Skel};
use serde_json::json;

mod skel {
    include!(concat!(env!("OUT_DIR"), "/funclatency.skel.rs"));
}

/// The tool's BPF object, opened while it parses its options.
pub type Ahead = OpenAhead<skel::FunclatencySkelBuilder>;

/// Starts opening the BPF object: the first line of `main`.
pub fn open_ahead() -> Ahead {
    OpenAhead::start_timing(skel::CORE_SECTIONS, skel::LIBBPF_WARMUP)
}

/// What to measure and how to print it.
pub struct Config {
    pub specs: Vec<ProbeSpec>,
    /// As the user wrote them, for the start line.
    pub patterns: Vec<String>,
    pub common: CommonArgs,
    pub schedule: Schedule,
    pub unit: Unit,
    /// -F: one histogram per function.
    pub per_function: bool,
    pub timestamp: bool,
    pub debug: bool,
    /// BCC's totals line after each histogram (funclatency; not vfsreadlat).
    pub totals: bool,
    /// The start line when it is not funccount's "Tracing N functions for ..."
    /// (vfsreadlat prints BCC's example's line); such tools print no
    /// "Detaching..." either.
    pub banner: Option<&'static str>,
    /// --unsafe: return probes on Go programs too (which crash them).
    pub unsafe_returns: bool,
}

/// Cells of one histogram row in bpf/hist.h: slots, then total and count.
const ROW: usize = LOG2_SLOTS + 2;

pub fn run(mut cfg: Config, ahead: Ahead) -> Result<()> {
    let how = How {
        hooks: Hooks::EntryAndReturn,
        trampoline: true,
        ..How::default()
    };
    let (specs, unsafe_returns) = (&cfg.specs, cfg.unsafe_returns);
    let mut session = Session::prepare_with(&mut cfg.common, how, cfg.debug, |opts| {
        common::Plan::build(
            specs,
            &common::PlanOptions {
                unsafe_returns,
                ..opts.clone()
            },
        )
    })?;
    let plan = &session.plan;
    // With --listen every probe has its own row, for a histogram per probe in
    // /metrics; the text still merges them unless -F.
    let per_probe = cfg.per_function || cfg.common.listen.is_some();
    let rows = if per_probe { plan.probes.len() } else { 1 };
    let labels: Vec<String> = plan.probes.iter().map(|p| p.label.clone()).collect();

    let mut open = common::open_skeleton!(ahead, plan, cfg.common.cpu, |rodata| {
        rodata.unit_ns = cfg.unit.divisor();
        rodata.per_probe = per_probe;
    });
    open.maps.hists.set_max_entries(rows as u32)?;
    let skel = open.load().context("loading the BPF programs")?;
    if cfg.debug {
        common::stderr(&common::describe_programs(skel.object()));
    }
    // Counts the calls of threads that exit inside them (bpf/pairing.h);
    // attached before the probes, so that it counts every thread they see
    // (attached after the banner, the first threads of a run that starts on
    // it exited uncounted).
    let _exits = skel
        .progs
        .lat_thread_exit
        .attach()
        .context("attaching to sched_process_exit")?;
    session.attach(skel.object())?;
    match cfg.banner {
        Some(line) if session.begins() => session.status(line)?,
        Some(_) => {}
        None => session.announce(&cfg.patterns)?,
    }

    let table = PerCpuTable::new(&skel.maps.hists, rows)?;
    if table.width() != ROW {
        anyhow::bail!(
            "internal error: histogram rows are {} cells, not {ROW}",
            table.width()
        );
    }
    let lost = PerCpuCounters::new(&skel.maps.pairing_lost, PAIR_STATS)?;
    let mut lat = Latency {
        table,
        lost,
        labels: &labels,
        cfg: &cfg,
        json: session.json,
        session: &session,
        missed_before: 0,
        exit_prog: std::os::fd::AsFd::as_fd(&skel.progs.lat_thread_exit),
    };
    session.run(cfg.schedule, &mut lat)?;
    drop(lat);
    session.finish(cfg.banner.is_some())
}

/// A run's histograms: printed per summary, served with --listen.
struct Latency<'a> {
    table: PerCpuTable,
    lost: PerCpuCounters,
    labels: &'a [String],
    cfg: &'a Config,
    json: bool,
    session: &'a Session,
    missed_before: u64,
    /// The program that counts thread exits, whose own misses are said.
    exit_prog: std::os::fd::BorrowedFd<'a>,
}

impl Latency<'_> {
    /// Histogram rows from the table's cells, merged into one unless -F.
    fn rows(&self, cells: &[u64]) -> Vec<(Log2Hist, Totals)> {
        let rows = hist_rows(cells);
        if self.cfg.per_function || rows.len() <= 1 {
            return rows;
        }
        let mut one = (Log2Hist::default(), Totals::default());
        for (h, t) in &rows {
            one.0.merge(h);
            one.1.total_ns += t.total_ns;
            one.1.count += t.count;
        }
        vec![one]
    }
}

fn hist_rows(cells: &[u64]) -> Vec<(Log2Hist, Totals)> {
    cells
        .chunks_exact(ROW)
        .map(|r| {
            (
                Log2Hist::from_slots(&r[..LOG2_SLOTS]),
                Totals {
                    total_ns: r[LOG2_SLOTS],
                    count: r[LOG2_SLOTS + 1],
                },
            )
        })
        .collect()
}

impl Served for Latency<'_> {
    fn print(&mut self, last: bool) -> Result<()> {
        let cells = self.table.deltas()?;
        let hists = self.rows(&cells);
        report_lost(&self.lost.deltas()?);
        if last {
            // Known only at the end: a return may still come until then.
            report_unreturned(&self.lost.totals()?);
            let exits = common::program_misses(self.exit_prog);
            if exits > 0 {
                warn(&format!(
                    "the kernel missed {exits} thread exits (another thread exiting on the same \
                     CPU): calls those threads were inside are not counted"
                ));
            }
        }
        let missed = self.session.attached().map_or(0, |a| a.missed());
        if missed > self.missed_before {
            warn(&format!(
                "the kernel missed {} probe hits (kretprobe instances used up, or \
                 recursion): those calls are not in the histogram",
                missed - self.missed_before
            ));
        }
        self.missed_before = missed;
        let sections = sections(&hists, self.labels, self.cfg.per_function);
        emit(&if self.json {
            json_summary(&sections, self.cfg.unit, last)
        } else {
            text(&sections, self.cfg)
        })
    }

    fn metrics(&mut self, m: &mut Metrics) -> Result<()> {
        let rows = hist_rows(&self.table.totals()?);
        let tool = common::tool_name();
        m.log2_seconds(
            &format!("tracekit_{tool}"),
            "Time from each call of a function to its return, since the start",
            self.cfg.unit,
            rows.into_iter()
                .zip(self.labels)
                .map(|((h, t), l)| (label("probe", l.as_str()), h, t.total_ns))
                .collect(),
        );
        m.lost_records = not_timed(&self.lost.totals()?);
        Ok(())
    }

    fn summary(&mut self) -> Result<serde_json::Value> {
        let cells = self.table.peek()?;
        let hists = self.rows(&cells);
        let sections = sections(&hists, self.labels, self.cfg.per_function);
        Ok(serde_json::from_str(&json_summary(
            &sections,
            self.cfg.unit,
            false,
        ))?)
    }

    fn reset(&mut self) -> Result<()> {
        self.table.deltas().map(drop)
    }
}

/// One printed histogram: its function (with -F) and its data.
struct Section<'a> {
    function: Option<&'a str>,
    hist: Log2Hist,
    totals: Totals,
}

/// The summary's histograms: one overall, or one per function that was called
/// (sorted by name, as the other tools sort their rows).
fn sections<'a>(
    rows: &[(Log2Hist, Totals)],
    labels: &'a [String],
    per_function: bool,
) -> Vec<Section<'a>> {
    if !per_function {
        let (hist, totals) = rows.first().cloned().unwrap_or_default();
        return vec![Section {
            function: None,
            hist,
            totals,
        }];
    }
    // Functions that share a name within a binary (static functions of two
    // files) share a section; in two binaries their labels name the binary.
    let mut by_name: BTreeMap<&str, (Log2Hist, Totals)> = BTreeMap::new();
    for ((h, t), label) in rows.iter().zip(labels) {
        if t.count == 0 {
            continue;
        }
        let e = by_name.entry(label.as_str()).or_default();
        e.0.merge(h);
        e.1.total_ns += t.total_ns;
        e.1.count += t.count;
    }
    by_name
        .into_iter()
        .map(|(name, (hist, totals))| Section {
            function: Some(name),
            hist,
            totals,
        })
        .collect()
}

/// BCC's layout: a blank line, the optional time, the histogram(s) (with -F each
/// under `Function = name`), then the totals line over all functions.
fn text(sections: &[Section], cfg: &Config) -> String {
    let label = cfg.unit.label();
    let mut s = String::from("\n");
    if cfg.timestamp {
        s.push_str(&format!("{:<8}\n", timestamp()));
    }
    let mut all = Totals::default();
    for sec in sections {
        if let Some(f) = sec.function {
            s.push_str(&format!("\nFunction = {f}\n"));
        }
        s.push_str(&sec.hist.render(label));
        all.total_ns += sec.totals.total_ns;
        all.count += sec.totals.count;
    }
    if cfg.totals {
        s.push_str(&all.render(cfg.unit));
    }
    s
}

fn json_summary(sections: &[Section], unit: Unit, last: bool) -> String {
    let one = |sec: &Section| {
        json!({
            "hist": sec.hist.to_json(),
            "total_ns": sec.totals.total_ns,
            "count": sec.totals.count,
        })
    };
    let mut all = Totals::default();
    for sec in sections {
        all.total_ns += sec.totals.total_ns;
        all.count += sec.totals.count;
    }
    let mut v = summary_record(
        last,
        json!({
        "unit": unit.label(),
        "total_ns": all.total_ns,
        "count": all.count,
        }),
    );
    if sections.iter().any(|s| s.function.is_some()) {
        v["functions"] = sections
            .iter()
            .map(|sec| {
                let mut o = one(sec);
                o["function"] = json!(sec.function);
                o
            })
            .collect();
    } else if let Some(sec) = sections.first() {
        v["hist"] = sec.hist.to_json();
    }
    format!("{v}\n")
}

/// Slots of pairing_lost (bpf/pairing.h's enum pairing_stat).
const PAIR_STATS: usize = 6;
const PAIR_ENTERED: usize = 3;
const PAIR_RETURNED: usize = 4;

/// pairing_lost in bpf/pairing.h: calls that could not be timed, by reason.
fn report_lost(lost: &[u64]) {
    let what = [
        (0, "calls nested deeper than 32 on one thread were not timed"),
        (1, "calls never returned (left by longjmp or an exception) or their return was missed: not timed"),
        (2, "calls were not timed: no memory for their thread's call stack"),
        (5, "calls were not timed: their thread exited inside them (pthread_exit, cancellation or a kill)"),
    ];
    for (i, w) in what {
        if lost[i] > 0 {
            warn(&format!("{} {w}", lost[i]));
        }
    }
}

/// Session programs' calls entered and never returned from: the kernel omits
/// return probes nested deeper than 64 on a thread (MAX_URETPROBE_DEPTH), and
/// longjmp, an exception or the thread's exit leave calls without a return.
fn unreturned(totals: &[u64]) -> u64 {
    totals[PAIR_ENTERED].saturating_sub(totals[PAIR_RETURNED])
}

fn report_unreturned(totals: &[u64]) {
    let n = unreturned(totals);
    if n > 0 {
        warn(&format!(
            "{n} calls were not timed: their return never came (nested deeper than the kernel's \
             64 return probes, left by longjmp or an exception, their thread exited, or still running)"
        ));
    }
}

/// Every call not timed, for /metrics.
fn not_timed(totals: &[u64]) -> u64 {
    [0, 1, 2, 5].iter().map(|&i| totals[i]).sum::<u64>() + unreturned(totals)
}
