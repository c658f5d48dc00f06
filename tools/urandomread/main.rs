//! urandomread: one line per read of random bytes (BCC's
//! examples/tracing/urandomread.py, which stopped working in Linux 5.18): reads of
//! /dev/urandom and /dev/random, and getrandom(2) calls.

#![cfg_attr(not(test), no_main)]

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use common::ahead::OpenAhead;
use common::cli::{parse_secs, CommonArgs};
use common::events::{self, Clock, Events};
use common::metrics::{label, Metrics};
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

mod skel {
    include!(concat!(env!("OUT_DIR"), "/urandomread.skel.rs"));
}

// SAFETY: a plain C struct of integers and bytes, valid for any bit pattern.
unsafe impl plain::Plain for skel::types::rand_event {}

const EXAMPLES: &str = "\
Examples:
  urandomread               # every read of random bytes
  urandomread -w            # with the SOURCE column (urandom, random, getrandom)
  urandomread -p 181        # only process 181
  urandomread --json        # one JSON object per read
  urandomread --duration 5  # for 5 seconds";

/// Trace reads of random bytes: /dev/urandom, /dev/random and getrandom(2), one
/// line per read with the bits delivered.
#[derive(Parser, Debug)]
#[command(name = "urandomread", version, after_help = EXAMPLES)]
// Its programs are fixed: --attach-mode is refused (common::Session::fixed), not offered.
#[command(mut_arg("attach_mode", |a| a.hide(true)))]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// Wide output: a SOURCE column (urandom, random, getrandom)
    #[arg(short, long)]
    wide: bool,

    /// Trace for SECS seconds, then exit
    #[arg(long, value_name = "SECS", value_parser = parse_secs, allow_hyphen_values = true)]
    duration: Option<Duration>,

    /// Print the programs in use, why others were not, and the time of each start-up phase
    #[arg(long)]
    debug: bool,
}

const DEVICES: usize = 0;

const GROUPS: &[Group] = &[
    Group {
        what: "reads of /dev/urandom and /dev/random",
        need: Need::Optional,
        variants: &[
            Variant {
                name: "tracepoint random:urandom_read",
                progs: &["tp_urandom_read"],
            },
            Variant {
                name: "fexit",
                progs: &["fexit_urandom_read_iter", "fexit_random_read_iter"],
            },
            Variant {
                name: "kretprobe",
                progs: &["kret_urandom_read_iter", "kret_random_read_iter"],
            },
            Variant {
                name: "kretprobe (before 5.19)",
                progs: &["kret_urandom_read", "kret_random_read"],
            },
        ],
    },
    Group {
        what: "getrandom() calls",
        need: Need::Optional,
        variants: &[Variant {
            name: "tracepoint syscalls:sys_exit_getrandom",
            progs: &["tp_getrandom"],
        }],
    },
];

const SOURCES: [&str; 3] = ["urandom", "random", "getrandom"];

common::entry!(main);

fn main() {
    let ahead = OpenAhead::start_for_trials(skel::LIBBPF_WARMUP);
    common::cli::main("urandomread", || run(common::cli::parse::<Args>(), ahead))
}

fn run(mut args: Args, mut ahead: OpenAhead<skel::UrandomreadSkelBuilder>) -> Result<()> {
    let mut session = Session::fixed(&mut args.common, args.debug)?;
    // A kernel thread makes no getrandom() call and reads no device file: it
    // would be traced in silence, for nothing.
    if let Some(pid) = args.common.pid {
        if let Some(name) = common::kernel_thread(pid) {
            let name = common::escape(name);
            anyhow::bail!("-p {pid} is a kernel thread ({name}): it makes no getrandom() calls and reads no /dev/urandom; give a process");
        }
    }
    let ring = events::ring_bytes()?;
    let filter = common::Filter::of(&session.plan, args.common.cpu);

    let ((skel, links), choice) = trials::choose(GROUPS, |sel: &Selection| {
        check_layouts(sel)?;
        let mut open = common::open_fixed_skeleton!(ahead, sel, filter, |rodata| {
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
    if choice.name(DEVICES).is_none() {
        warn(
            "reads of /dev/urandom and /dev/random are not traced: they need kprobes or \
             fentry on urandom_read_iter, which this kernel does not allow (--debug says \
             why); tracing getrandom() calls only",
        );
    }

    let json = session.json;
    let wide = args.wide;
    let clock = Clock::new();
    if !session.begins() {
        // Stopped while attaching: no start line for a run that is ending.
    } else if json {
        session.status("Tracing reads of random bytes... Hit Ctrl-C to end.")?;
    } else if wide {
        session.status(&format!(
            "{:<18} {:<16} {:<6} {:<9} {}",
            "TIME(s)", "COMM", "PID", "SOURCE", "GOTBITS"
        ))?;
    } else {
        session.status(&format!(
            "{:<18} {:<16} {:<6} {}",
            "TIME(s)", "COMM", "PID", "GOTBITS"
        ))?;
    }
    // --listen: reads and bytes by source, counted as the records arrive.
    let tally = Rc::new(RefCell::new(Tally::<u32>::new()));
    let count = session.serving().then(|| tally.clone());
    let mut ev = Events::new(
        &skel.maps.events,
        &skel.maps.events_lost,
        move |e: &skel::types::rand_event, out: &mut String| {
            if let Some(t) = &count {
                t.borrow_mut().add(e.source, e.bits / 8, None);
            }
            let comm: Vec<u8> = e
                .comm
                .iter()
                .map(|&c| c as u8)
                .take_while(|&c| c != 0)
                .collect();
            let comm = common::escape(&comm);
            let source = source_name(e.source);
            let secs = Clock::secs(e.ts);
            let _ = if json {
                writeln!(
                    out,
                    "{}",
                    json!({
                        "time_s": secs,
                        "unix_time": clock.unix(e.ts),
                        "comm": comm,
                        "pid": e.pid,
                        "tid": e.tid,
                        "source": source,
                        "bits": e.bits,
                    })
                )
            } else if wide {
                writeln!(
                    out,
                    "{secs:<18.9} {comm:<16} {:<6} {source:<9} {}",
                    e.pid, e.bits
                )
            } else {
                writeln!(out, "{secs:<18.9} {comm:<16} {:<6} {}", e.pid, e.bits)
            };
            Ok(())
        },
    )?;
    let mut sources = Sources(tally);
    let mut streamed = Streamed {
        events: &mut ev,
        tool: &mut sources,
    };
    session.run(Schedule::lasting(args.duration), &mut streamed)?;
    drop(ev);
    session.finish(true)
}

fn source_name(source: u32) -> &'static str {
    SOURCES.get(source as usize).copied().unwrap_or("?")
}

/// What --listen serves: reads and random bytes by source.
struct Sources(Rc<RefCell<Tally<u32>>>);

impl Served for Sources {
    fn print(&mut self, _last: bool) -> Result<()> {
        Ok(()) // every read is printed as it comes
    }

    fn metrics(&mut self, m: &mut Metrics) -> Result<()> {
        let t = self.0.borrow();
        let by = |f: fn(&Cell) -> u64| {
            t.totals()
                .map(|(s, c)| (label("source", source_name(*s)), f(c)))
                .collect()
        };
        m.counters(
            "tracekit_urandomread_reads",
            "Reads of random bytes since the start, by source (urandom, random, getrandom)",
            by(|c| c.events),
        );
        m.counters(
            "tracekit_urandomread_bytes",
            "Random bytes read since the start, by source",
            by(|c| c.bytes),
        );
        Ok(())
    }

    fn summary(&mut self) -> Result<serde_json::Value> {
        let rows = self
            .0
            .borrow()
            .since_reset()
            .into_iter()
            .map(|(s, c)| json!({ "source": source_name(s), "reads": c.events, "bytes": c.bytes }))
            .collect();
        Ok(tally::summary(rows))
    }

    fn reset(&mut self) -> Result<()> {
        self.0.borrow_mut().reset();
        Ok(())
    }
    fn prints_summaries(&self) -> bool {
        false // each event is printed as it comes
    }
}

/// Checks the classic tracepoints' records against the offsets the programs read.
fn check_layouts(sel: &Selection) -> Result<()> {
    if sel.has("tp_urandom_read") {
        Format::read("random", "urandom_read")?.expect("got_bits", 8, 4)?;
    }
    if sel.has("tp_getrandom") {
        Format::read("syscalls", "sys_exit_getrandom")?.expect("ret", 16, 8)?;
    }
    Ok(())
}
