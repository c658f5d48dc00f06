//! disksnoop: one line per completed block request, with its latency (BCC's
//! examples/tracing/disksnoop.py, keyed by request and read from a ring buffer).

#![cfg_attr(not(test), no_main)]

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use common::ahead::OpenAhead;
use common::cli::{parse_secs, CommonArgs};
use common::events::{self, Clock, Events};
use common::hist::Unit;
use common::metrics::{Labels, Metrics};
use common::session::Session;
use common::tally::{self, Cell, Tally};
use common::tracepoints::Format;
use common::trials::{self, Group, Need, Selection, Variant};
use common::warn;
use common::{Schedule, Served, Streamed};
use libbpf_rs::skel::{OpenSkel, Skel};
use serde_json::json;
use std::cell::RefCell;
use std::rc::Rc;

mod disks;

mod skel {
    include!(concat!(env!("OUT_DIR"), "/disksnoop.skel.rs"));
}

// SAFETY: a plain C struct of integers and bytes, valid for any bit pattern.
unsafe impl plain::Plain for skel::types::disk_event {}

const EXAMPLES: &str = "\
Examples:
  disksnoop                 # every completed block request
  disksnoop -d vda          # only requests to disk vda
  disksnoop -w              # also the issuing process, disk and sector
  disksnoop -T              # wall-clock times
  disksnoop --json          # one JSON object per request
  disksnoop --duration 10   # for 10 seconds";

/// Trace block device requests: one line per completed request, with its type,
/// size and latency from issue to completion.
#[derive(Parser, Debug)]
#[command(name = "disksnoop", version, after_help = EXAMPLES)]
// Its programs are fixed: --attach-mode is refused (common::Session::fixed), not offered.
#[command(mut_arg("attach_mode", |a| a.hide(true)))]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// Only requests to this disk: a name (loop0, vda, /dev/nvme0n1), MAJOR:MINOR (8:0) or a path to its node (/dev/disk/by-id/...)
    #[arg(short, long, value_name = "DISK")]
    disk: Option<String>,

    /// Wide output: also COMM and PID of the issuing process, DISK and SECTOR
    #[arg(short, long)]
    wide: bool,

    /// Wall-clock time (HH:MM:SS.micros) instead of seconds since boot
    #[arg(short = 'T', long)]
    timestamp: bool,

    /// Trace for SECS seconds, then exit
    #[arg(long, value_name = "SECS", value_parser = parse_secs, allow_hyphen_values = true)]
    duration: Option<Duration>,

    /// Print the programs in use (tp_btf, raw_tp, tracepoint), why others were not, and the time of each start-up phase
    #[arg(long)]
    debug: bool,
}

/// Which of the three program sets pairs requests: see bpf/disksnoop.bpf.c.
const GROUPS: &[Group] = &[
    Group {
        what: "block requests",
        need: Need::Required,
        variants: &[
            Variant {
                name: "tp_btf",
                progs: &["btf_issue", "btf_complete", "btf_requeue", "btf_insert"],
            },
            Variant {
                name: "raw_tp",
                progs: &["raw_issue", "raw_complete", "raw_requeue", "raw_insert"],
            },
            Variant {
                name: "tracepoint",
                progs: &["tp_issue", "tp_complete", "tp_requeue", "tp_insert"],
            },
        ],
    },
    // Linux 6.5+: the submitting process, before a kworker may issue the request.
    Group {
        what: "request submitters (block_io_start)",
        need: Need::SameAs(0),
        variants: &[
            Variant {
                name: "tp_btf",
                progs: &["btf_io_start"],
            },
            Variant {
                name: "raw_tp",
                progs: &["raw_io_start"],
            },
            Variant {
                name: "tracepoint",
                progs: &["tp_io_start"],
            },
        ],
    },
];

common::entry!(main);

fn main() {
    let ahead = OpenAhead::start_for_trials(skel::LIBBPF_WARMUP);
    common::cli::main("disksnoop", || run(common::cli::parse::<Args>(), ahead))
}

fn run(mut args: Args, mut ahead: OpenAhead<skel::DisksnoopSkelBuilder>) -> Result<()> {
    let mut session = Session::fixed(&mut args.common, args.debug)?;
    let filter_dev = match &args.disk {
        Some(d) => disks::resolve(d)?,
        None => 0,
    };
    let ring = events::ring_bytes()?;
    let filter = common::Filter::of(&session.plan, args.common.cpu);
    // block_rq_issue/insert: (rq) since Linux 5.11 and 5.10.137, (q, rq) before.
    let rq_arg = match common::features::tracepoint_has_arg("block_rq_issue", 2) {
        Some(true) => 1,
        _ => 0,
    };

    let ((skel, links), choice) = trials::choose(GROUPS, |sel: &Selection| {
        let rwbs_off = if sel.has("tp_issue") {
            classic_layout(sel)?
        } else {
            34
        };
        let mut open = common::open_fixed_skeleton!(ahead, sel, filter, |rodata| {
            rodata.rq_arg = rq_arg;
            rodata.filter_dev = filter_dev;
            rodata.issue_rwbs_off = rwbs_off;
            rodata.events_wakeup_bytes = events::wakeup_bytes(ring);
        });
        open.maps.events.set_max_entries(ring)?;
        let skel = open.load().context("loading")?;
        let links = sel.attach(skel.object())?;
        Ok((skel, links))
    })?;
    session.adopt(links)?;
    if args.debug {
        common::stderr(&choice.describe());
    }
    if choice.name(0) == Some("tracepoint") {
        warn(
            "requests are paired by (device, sector), which is approximate when two requests \
             to one sector are in flight at once: the programs that pair them by request \
             do not work here (--debug says why)",
        );
    }

    let json = session.json;
    let clock = Clock::new();
    let mut names = disks::Names::load();
    let wide = args.wide;
    let wall = args.timestamp;
    if !session.begins() {
        // Stopped while attaching: no start line for a run that is ending.
    } else if json {
        session.status("Tracing block requests... Hit Ctrl-C to end.")?;
    } else {
        session.status(&header(wide, wall))?;
    }
    // --listen: requests, bytes and latency by device and operation, counted as
    // the records arrive (names are looked up at scrape time).
    let tally = Rc::new(RefCell::new(Tally::<(u32, u8)>::new()));
    let count = session.serving().then(|| tally.clone());
    let mut ev = Events::new(
        &skel.maps.events,
        &skel.maps.events_lost,
        |e: &skel::types::disk_event, out: &mut String| {
            if let Some(t) = &count {
                t.borrow_mut()
                    .add((e.dev, e.r#type as u8), u64::from(e.bytes), Some(e.lat_ns));
            }
            // Disk names only where they are printed: the narrow lines stay cheap.
            let r = Request::of(e, (wide || json).then_some(&mut names));
            if json {
                let _ = writeln!(out, "{}", r.json(&clock));
            } else {
                let _ = writeln!(out, "{}", r.line(&clock, wide, wall));
            }
            Ok(())
        },
    )?;
    let mut served = Disks {
        tally,
        names: disks::Names::load(),
    };
    let mut streamed = Streamed {
        events: &mut ev,
        tool: &mut served,
    };
    session.run(Schedule::lasting(args.duration), &mut streamed)?;
    drop(ev);
    session.finish(true)
}

/// The operation of a request type letter (bpf/disksnoop.bpf.c).
fn operation(kind: u8) -> &'static str {
    match kind {
        b'R' => "read",
        b'W' => "write",
        b'F' => "flush",
        b'D' => "discard",
        _ => "other",
    }
}

/// What --listen serves: requests, bytes and latency by disk and operation.
struct Disks {
    tally: Rc<RefCell<Tally<(u32, u8)>>>,
    names: disks::Names,
}

impl Disks {
    fn labels(&mut self, (dev, kind): (u32, u8)) -> Labels {
        vec![
            ("disk", self.names.name(dev)),
            ("dev", disks::show_dev(dev)),
            ("operation", operation(kind).to_string()),
        ]
    }
}

impl Served for Disks {
    fn print(&mut self, _last: bool) -> Result<()> {
        Ok(()) // every request is printed as it completes
    }

    fn metrics(&mut self, m: &mut Metrics) -> Result<()> {
        let cells: Vec<((u32, u8), Cell)> = self
            .tally
            .borrow()
            .totals()
            .map(|(k, c)| (*k, c.clone()))
            .collect();
        let mut hists = Vec::new();
        let mut bytes = Vec::new();
        for (k, c) in cells {
            let l = self.labels(k);
            bytes.push((l.clone(), c.bytes));
            hists.push((l, c.hist, c.total_ns));
        }
        m.log2_seconds(
            "tracekit_disksnoop_request",
            "Block request latency (issue to completion) since the start, by disk and operation",
            Unit::Nsecs,
            hists,
        );
        m.counters(
            "tracekit_disksnoop_bytes",
            "Bytes of completed block requests since the start, by disk and operation",
            bytes,
        );
        Ok(())
    }

    fn summary(&mut self) -> Result<serde_json::Value> {
        let cells = self.tally.borrow().since_reset();
        let rows = cells
            .into_iter()
            .map(|((dev, kind), c)| {
                json!({
                    "disk": self.names.name(dev),
                    "dev": disks::show_dev(dev),
                    "operation": operation(kind),
                    "requests": c.events,
                    "bytes": c.bytes,
                    "total_ns": c.total_ns,
                    "hist": c.hist.to_json(),
                })
            })
            .collect();
        Ok(tally::summary(rows))
    }

    fn reset(&mut self) -> Result<()> {
        self.tally.borrow_mut().reset();
        Ok(())
    }
    fn prints_summaries(&self) -> bool {
        false // each event is printed as it comes
    }
}

/// Checks the classic tracepoints' records against the offsets the programs
/// read (bpf/disksnoop.bpf.c) and returns block_rq_issue's rwbs offset.
fn classic_layout(sel: &Selection) -> Result<u32> {
    let common = |f: &Format| -> Result<()> {
        f.expect("dev", 8, 4)?;
        f.expect("sector", 16, 8)?;
        f.expect("nr_sector", 24, 4)
    };
    let issue = Format::read("block", "block_rq_issue")?;
    common(&issue)?;
    issue.expect("bytes", 28, 4)?;
    let rwbs = match issue.field("rwbs") {
        Some((off @ (32 | 34), _)) => off,
        other => anyhow::bail!("block_rq_issue's rwbs field is at {other:?}, not 32 or 34"),
    };
    common(&Format::read("block", "block_rq_complete")?)?;
    common(&Format::read("block", "block_rq_requeue")?)?;
    for (prog, event) in [
        ("tp_insert", "block_rq_insert"),
        ("tp_io_start", "block_io_start"),
    ] {
        if sel.has(prog) {
            common(&Format::read("block", event)?)?;
        }
    }
    Ok(rwbs)
}

fn header(wide: bool, wall: bool) -> String {
    let time = if wall { "TIME" } else { "TIME(s)" };
    if wide {
        format!(
            "{time:<18} {:<16} {:<7} {:<7} {:<2} {:<10} {:<7} {:>8}",
            "COMM", "PID", "DISK", "T", "SECTOR", "BYTES", "LAT(ms)"
        )
    } else {
        format!("{time:<18} {:<2} {:<7} {:>8}", "T", "BYTES", "LAT(ms)")
    }
}

/// One completed request, decoded.
struct Request {
    ts: u64,
    lat_ns: u64,
    sector: u64,
    bytes: u32,
    dev: u32,
    disk: String,
    pid: u32,
    comm: String,
    kind: char,
}

impl Request {
    fn of(e: &skel::types::disk_event, names: Option<&mut disks::Names>) -> Request {
        let comm: Vec<u8> = e
            .comm
            .iter()
            .map(|&c| c as u8)
            .take_while(|&c| c != 0)
            .collect();
        Request {
            ts: e.ts,
            lat_ns: e.lat_ns,
            sector: e.sector,
            bytes: e.bytes,
            dev: e.dev,
            disk: names.map(|n| n.name(e.dev)).unwrap_or_default(),
            pid: e.pid,
            comm: common::escape(&comm),
            kind: (e.r#type as u8) as char,
        }
    }

    fn line(&self, clock: &Clock, wide: bool, wall: bool) -> String {
        let time = if wall {
            clock.local(self.ts)
        } else {
            format!("{:.9}", Clock::secs(self.ts))
        };
        let lat_ms = self.lat_ns as f64 / 1e6;
        if wide {
            format!(
                "{time:<18} {:<16} {:<7} {:<7} {:<2} {:<10} {:<7} {lat_ms:>8.2}",
                self.comm, self.pid, self.disk, self.kind, self.sector, self.bytes
            )
        } else {
            format!(
                "{time:<18} {:<2} {:<7} {lat_ms:>8.2}",
                self.kind, self.bytes
            )
        }
    }

    fn json(&self, clock: &Clock) -> serde_json::Value {
        json!({
            "time_s": Clock::secs(self.ts),
            "unix_time": clock.unix(self.ts),
            "type": self.kind.to_string(),
            "bytes": self.bytes,
            "lat_ms": self.lat_ns as f64 / 1e6,
            "lat_ns": self.lat_ns,
            "comm": self.comm,
            "pid": self.pid,
            "disk": self.disk,
            "dev": disks::show_dev(self.dev),
            "sector": self.sector,
        })
    }
}
