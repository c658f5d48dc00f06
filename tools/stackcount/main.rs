//! stackcount: count events by their kernel and user stacks.

#![cfg_attr(not(test), no_main)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::mem::offset_of;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use common::ahead::OpenAhead;
use common::cli::{parse_secs, CommonArgs, SummaryArgs};
use common::counters::PerCpuCounters;
use common::events;
use common::metrics::Metrics;
use common::session::{How, Session};
use common::stacks::{self, Batch};
use common::symbolize::{Frame, Symbols};
use common::unwind::{self, Tables};
use common::warn;
use common::ProbeSpec;
use common::Schedule;
use common::Served;
use common::UserStacks;
use common::{emit, summary_record, timestamp};
use common::{RawTracepoints, Site};
use libbpf_rs::skel::{OpenSkel, Skel};
use libbpf_rs::{MapCore, MapFlags, RingBufferBuilder};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/stackcount.skel.rs"));
}

mod pprof;

const EXAMPLES: &str = "\
Examples:
  stackcount submit_bio          # kernel stacks leading to submit_bio()
  stackcount -d ip_output        # show a -- delimiter between kernel and user stacks
  stackcount -s ip_output        # show symbol offsets
  stackcount -sv ip_output       # show offsets and raw addresses
  stackcount 'tcp_send*'         # stacks for functions matching tcp_send*
  stackcount -r '^tcp_send.*'    # the same, as a regular expression
  stackcount -Ti 5 ip_output     # a summary every 5 seconds, with timestamps
  stackcount -p 185 ip_output    # only process 185
  stackcount -U t:sched:sched_switch  # user stacks at a tracepoint
  stackcount -K t:sched:sched_switch  # kernel stacks at a tracepoint
  stackcount -P c:malloc         # malloc() stacks per process
  stackcount -f -D 10 vfs_read > out.folded   # folded, for flame graphs
  stackcount -D 10 --svg read.svg vfs_read    # write a flame graph directly
  stackcount -D 10 --pprof cpu.pb.gz profile:hz:99  # a profile for go tool pprof
  stackcount -i 5 --pprof out.pb.gz -p 185 c:malloc  # out.1.pb.gz, out.2.pb.gz...
  stackcount -f -D 10 profile:hz:99 > cpu.folded  # an on-CPU profile of every CPU";

/// Count events by kernel and user stack (kernel functions, user functions,
/// tracepoints, USDT probes); stacks are aggregated in the kernel.
#[derive(Parser, Debug)]
#[command(
    name = "stackcount",
    version,
    after_help = EXAMPLES,
    // One pattern, as BCC's, or several (a sampling source beside a tracepoint,
    // say); a number among them is refused with a hint (patterns), not by clap.
    override_usage = "stackcount [OPTIONS] <PATTERN>..."
)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    summary: SummaryArgs,

    /// Trace for SECS seconds, then print and exit (capital D, as BCC)
    #[arg(short = 'D', long, value_name = "SECS", value_parser = parse_secs, allow_hyphen_values = true)]
    duration: Option<Duration>,

    /// Show symbol offsets
    #[arg(short = 's', long)]
    offset: bool,

    /// Count stacks per process and print "comm [pid]" with each (not with -p,
    /// which counts per process too, as BCC)
    #[arg(short = 'P', long)]
    perpid: bool,

    /// Kernel stacks only
    #[arg(
        short = 'K',
        long = "kernel-stacks-only",
        conflicts_with = "user_stacks_only"
    )]
    kernel_stacks_only: bool,

    /// User stacks only
    #[arg(short = 'U', long = "user-stacks-only")]
    user_stacks_only: bool,

    /// Show raw addresses
    #[arg(short, long)]
    verbose: bool,

    /// Insert a -- delimiter between kernel and user stacks
    #[arg(short = 'd', long = "delimited")]
    delimited: bool,

    /// Folded output (comm;user;kernel count), for flamegraph.pl or inferno
    #[arg(short = 'f', long)]
    folded: bool,

    /// Also show calls inlined at each frame, as "name (inlined)" lines
    #[arg(long)]
    inline: bool,

    /// Also write an interactive flame graph SVG of the whole run to FILE
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,

    /// Also write a gzipped pprof profile (profile.proto, for go tool pprof) to
    /// FILE at the end; with -i, one per interval, numbered before the
    /// extension: out.pb.gz is out.1.pb.gz, out.2.pb.gz...
    #[arg(long, value_name = "FILE")]
    pprof: Option<PathBuf>,

    /// Print the plan (what matched, attach mode, skipped probes) and the time of each start-up phase
    #[arg(long)]
    debug: bool,

    /// How user stacks are walked: auto (by the binaries' unwind tables, or by
    /// frame pointers where the traced process keeps them everywhere), fp (frame
    /// pointers only: cheaper, stops at code built without them) or dwarf
    /// (unwind tables: .eh_frame, .debug_frame)
    #[arg(long, value_name = "WALK", default_value = "auto")]
    user_stacks: UserStacks,

    /// Distinct stacks the kernel can hold per interval (about 1 KiB each)
    #[arg(long, value_name = "N", default_value_t = 16384,
          value_parser = clap::value_parser!(u32).range(1..=MAX_STACK_STORAGE as i64))]
    stack_storage_size: u32,

    /// What to count: FUNC, p::FUNC, LIB:FUNC, /PATH:FUNC, t:CAT:EVENT, u:LIB:PROBE,
    /// profile:hz:N, software:EVENT[:PERIOD], hardware:EVENT[:PERIOD]
    #[arg(value_name = "PATTERN", required = true)]
    patterns: Vec<String>,
}

/// Upper bound of --stack-storage-size: the map is preallocated at about 1 KiB
/// per stack, so this is 1 GiB of kernel memory.
const MAX_STACK_STORAGE: u32 = 1 << 20;

common::entry!(main);

fn main() {
    let ahead = OpenAhead::start(skel::CORE_SECTIONS, skel::LIBBPF_WARMUP);
    common::cli::main("stackcount", || run(common::cli::parse::<Args>(), ahead))
}

/// One distinct stack of a summary, as printed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    pid: Option<u32>,
    comm: Option<String>,
    /// The plan's index of the probe that took it (only for profiles: see
    /// [`Shape::probe`]).
    probe: Option<u32>,
    kernel: Vec<Frame>,
    user: Vec<Frame>,
}

/// How a run keys and prints stacks, from the flags.
struct Shape {
    /// Key stacks by process (-P, or -p).
    perpid: bool,
    /// Keep the process name in the key: per process, or for folded lines and
    /// the flame graph, which always start with it.
    comm: bool,
    /// Print the `comm [pid]` line in text output (asked for with -P).
    comm_line: bool,
    /// Put the `--` / `-` delimiter in every stack (-d with both kinds of stack).
    delimit: bool,
    /// Key stacks by probe too: the `probe` label of pprof profiles, in a run
    /// of several probes (the other outputs merge it away, see [`shown`]).
    probe: bool,
}

fn run(mut args: Args, ahead: OpenAhead<skel::StackcountSkelBuilder>) -> Result<()> {
    let patterns = patterns(&args)?;
    let pattern = patterns.join(" ");
    let specs = ProbeSpec::parse_all(&patterns, args.summary.regexp)?;
    let profiled = raw_keys(&args);
    let mut session = Session::prepare(
        &specs,
        &mut args.common,
        How {
            // Stacks are counted alike whichever tracepoint took them, except
            // in profiles, which label them with their probe: that needs a
            // cookie (raw links before 6.10 have none; perf events do).
            raw_tracepoints: match profiled {
                true => RawTracepoints::ByCookie,
                false => RawTracepoints::Alike,
            },
            ..How::default()
        },
        args.debug,
    )?;
    // Fail on an unwritable SVG path now, not after the whole trace.
    let svg = args
        .svg
        .as_ref()
        .map(|p| File::create(p).with_context(|| format!("creating {}", p.display())))
        .transpose()?;
    // Symbolizing at the summary opens the traced processes' binaries and maps.
    session.plan.fd_reserve = 64;
    let plan = &session.plan;
    let perpid = args.perpid || args.common.pid.is_some(); // BCC: -p implies -P
                                                           // As the SVG path: an unwritable profile path fails now.
    let profile_kind = pprof::Kind::of(plan, perpid);
    let mut profiles = args
        .pprof
        .as_ref()
        .map(|p| pprof::Profiles::check(p, args.summary.interval.is_some(), profile_kind.clone()))
        .transpose()?;
    // User-space probes have no interesting kernel stack (it is the uprobe trap).
    let user_probe = plan
        .probes
        .iter()
        .all(|p| matches!(p.site, Site::User { .. } | Site::Usdt { .. }));
    let want_kernel = !args.user_stacks_only && (args.kernel_stacks_only || !user_probe);
    let want_user = !args.kernel_stacks_only;
    let shape = Shape {
        perpid,
        comm: perpid || args.folded || args.svg.is_some(),
        // BCC prints it only with -P and no -p.
        comm_line: args.perpid && args.common.pid.is_none(),
        delimit: args.delimited && !args.kernel_stacks_only && !args.user_stacks_only,
        probe: profiled && plan.probes.len() > 1,
    };

    let walk_tables =
        want_user && unwind::choose(args.user_stacks, args.common.pid, plan.samples())?;
    let mut symbols = Symbols::with_inlined(args.inline);
    if let Some(pid) = args.common.pid {
        // Snapshot its memory map now: it may exit before the summary.
        symbols.remember(pid);
    }

    let mut open = common::open_skeleton!(ahead, plan, args.common.cpu, |rodata| {
        rodata.kernel_stacks = want_kernel;
        rodata.user_stacks = want_user;
        rodata.probe_keys = shape.probe;
        let g = common::SyscallGlobals::of(plan);
        rodata.kernel_reads = g.kernel_reads;
        rodata.remember_nr = g.remember_nr;
        rodata.task_status_off = g.task_status_off;
        rodata.unwind_tables = walk_tables;
    });
    open.maps.stacks.set_max_entries(args.stack_storage_size)?;
    let skel = open.load().context("loading the BPF programs")?;
    // The traced process' tables before the first event; others' when BPF asks.
    let tables = match walk_tables {
        true => Some(RefCell::new(Tables::new(unwind::Maps::of(
            &skel.maps.unwind_files,
            &skel.maps.unwind_file_info,
            &skel.maps.unwind_mappings,
            &skel.maps.unwind_procs,
        )?))),
        false => None,
    };
    if let Some(t) = &tables {
        t.borrow_mut()
            .load_start(args.common.pid, &plan.user_binaries())?;
        if session.debug() {
            common::stderr(&t.borrow().describe());
        }
    }

    session.attach(skel.object())?;
    let json = session.json;
    if !args.folded {
        session.announce(&patterns)?;
    } else {
        // Folded output has no start line, but a stop while attaching is said.
        session.begins();
    }

    // New processes announced by BPF: snapshot their maps before they can exit.
    let new_pids = RefCell::new(Vec::<u32>::new());
    let unwind_pids = RefCell::new(Vec::<u32>::new());
    let mut rb = RingBufferBuilder::new();
    rb.add(&skel.maps.new_procs, |data: &[u8]| {
        if let Some(b) = data.get(..4).and_then(|b| b.try_into().ok()) {
            new_pids.borrow_mut().push(u32::from_ne_bytes(b));
        }
        0
    })?;
    rb.add(&skel.maps.unwind_requests, |data: &[u8]| {
        if let Some(b) = data.get(..4).and_then(|b| b.try_into().ok()) {
            unwind_pids.borrow_mut().push(u32::from_ne_bytes(b));
        }
        0
    })?;
    let rb = rb.build()?;
    let symbols = RefCell::new(symbols);
    let schedule = Schedule {
        interval: args.summary.interval,
        duration: args.duration,
    };
    if let Some(p) = &mut profiles {
        p.start(); // the first interval starts now
    }
    let mut st = Stacks {
        skel: &skel,
        symbols: &symbols,
        new_pids: &new_pids,
        unwind_pids: &unwind_pids,
        tables: tables.as_ref(),
        unwind_stats: PerCpuCounters::new(&skel.maps.unwind_stats, unwind::STATS)?,
        rb: &rb,
        args: &args,
        shape: &shape,
        json,
        stacks_lost: PerCpuCounters::new(&skel.maps.stacks_lost, 2)?,
        counts_lost: PerCpuCounters::new(&skel.maps.counts_lost, 1)?,
        keep_run: svg.is_some() || session.serving(),
        profiles: profiles.as_mut(),
        pending: HashMap::new(),
        lost: [0; 4],
        lost_total: 0,
        run: BTreeMap::new(),
        total: HashMap::new(),
        marks: HashMap::new(),
        next_mark: 0,
        profile_kind,
    };
    session.run(schedule, &mut st)?;
    let folded_run = std::mem::take(&mut st.run);
    drop(st);
    session.finish(args.folded)?;
    if let (Some(file), Some(path)) = (svg, &args.svg) {
        // Folded lines were keyed with count 0; put the run's totals back.
        let lines: Vec<String> = folded_run
            .iter()
            .map(|(l, c)| format!("{} {c}", l.rsplit_once(' ').map_or(l.as_str(), |x| x.0)))
            .collect();
        stacks::write_svg(
            file,
            path,
            &format!("stackcount {}", common::escape(&pattern)),
            "events",
            &lines,
        )?;
    }
    Ok(())
}

/// A run's stacks: drained from the maps at each summary and, with --listen,
/// at each request; printed per summary and served.
struct Stacks<'a> {
    skel: &'a skel::StackcountSkel<'a>,
    symbols: &'a RefCell<Symbols>,
    new_pids: &'a RefCell<Vec<u32>>,
    /// Processes whose unwind tables BPF asked for, and the tables (when user
    /// stacks are walked by them).
    unwind_pids: &'a RefCell<Vec<u32>>,
    tables: Option<&'a RefCell<Tables>>,
    unwind_stats: PerCpuCounters,
    rb: &'a libbpf_rs::RingBuffer<'a>,
    args: &'a Args,
    shape: &'a Shape,
    json: bool,
    stacks_lost: PerCpuCounters,
    counts_lost: PerCpuCounters,
    /// Keep the run's folded totals (--svg, --listen's /stacks).
    keep_run: bool,
    /// --pprof: `pending` then keeps each frame's address and each stack's
    /// process, which the profile needs and the other outputs merge away
    /// ([`shown`]).
    profiles: Option<&'a mut pprof::Profiles>,
    /// Drained since the last summary (or /reset), and what was lost meanwhile
    /// (requests only read the maps: they drain at summaries and /reset).
    pending: HashMap<Key, u64>,
    lost: [u64; 4],
    lost_total: u64,
    /// Folded lines (keyed with count 0) and their totals since the start.
    run: BTreeMap<String, u64>,
    /// --listen: the stacks drained since the start (never reset), and the
    /// marks of /debug/pprof/profile windows open (the totals then).
    total: HashMap<Key, u64>,
    marks: HashMap<u64, HashMap<Key, u64>>,
    next_mark: u64,
    /// What a profile's samples measure, and their labels.
    profile_kind: pprof::Kind,
}

impl Stacks<'_> {
    /// Handles what the ring holds now (`timeout` zero) or within `timeout`: the
    /// memory maps of processes BPF saw start, snapshotted before they can exit.
    fn read_ring(&self, timeout: Duration) {
        if !timeout.is_zero() && events::wait_readable(self.rb, timeout).is_err() {
            return;
        }
        // In batches, each process's maps read before the next batch: a fork
        // flood must not hold the run loop (or grow the list) without end.
        let started = std::time::Instant::now();
        loop {
            let n = self.rb.consume_raw_n(events::BATCH);
            for pid in self.new_pids.borrow_mut().drain(..) {
                self.symbols.borrow_mut().remember(pid);
            }
            for pid in self.unwind_pids.borrow_mut().drain(..) {
                if let Some(t) = self.tables {
                    match t.borrow_mut().load_process(pid) {
                        Ok(true) => drop(self.symbols.borrow_mut().refresh(pid)),
                        Ok(false) => {}
                        Err(e) => warn(&format!("{e:#}")),
                    }
                }
            }
            if n < events::BATCH as i32 || started.elapsed() >= events::BUDGET {
                return;
            }
        }
    }

    /// Moves what the maps counted since the last drain into `pending` (at a
    /// summary, or a /reset).
    fn collect(&mut self) -> Result<()> {
        self.read_ring(Duration::ZERO);
        let (entries, expired) = drain(
            self.skel,
            &self.symbols.borrow(),
            self.args,
            self.shape,
            true,
        )?;
        let mut lost = self.stacks_lost.deltas()?;
        lost.extend(self.counts_lost.deltas()?);
        lost.push(expired);
        for (l, n) in self.lost.iter_mut().zip(&lost) {
            *l += n;
        }
        self.lost_total += lost.iter().sum::<u64>();
        for (k, c) in entries {
            if self.keep_run {
                *self.run.entry(folded_line(self.shape, &k, 0)).or_default() += c;
            }
            if self.args.common.listen.is_some() {
                *self.total.entry(k.clone()).or_default() += c;
            }
            *self.pending.entry(k).or_default() += c;
        }
        Ok(())
    }

    /// The stacks counted since the start: drained, and in the maps now.
    fn total_now(&self) -> Result<HashMap<Key, u64>> {
        let mut now = self.total.clone();
        for (k, c) in self.peek()? {
            *now.entry(k).or_default() += c;
        }
        Ok(now)
    }

    /// What the maps hold now, read without clearing them (a request).
    fn peek(&self) -> Result<Vec<(Key, u64)>> {
        self.read_ring(Duration::ZERO);
        Ok(drain(
            self.skel,
            &self.symbols.borrow(),
            self.args,
            self.shape,
            false,
        )?
        .0)
    }

    /// Folded lines (count 0) and their totals since the start: the drained
    /// run plus what the maps hold now.
    fn run_now(&self) -> Result<BTreeMap<String, u64>> {
        let mut run = self.run.clone();
        for (k, c) in self.peek()? {
            *run.entry(folded_line(self.shape, &k, 0)).or_default() += c;
        }
        Ok(run)
    }

    /// Ascending by count (BCC order).
    fn sorted(entries: impl IntoIterator<Item = (Key, u64)>) -> Vec<(Key, u64)> {
        let mut out: Vec<(Key, u64)> = entries.into_iter().collect();
        out.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

impl Served for Stacks<'_> {
    fn polls(&self) -> bool {
        true
    }
    fn poll(&mut self, timeout: Duration) -> Result<()> {
        self.read_ring(timeout);
        Ok(())
    }
    fn print(&mut self, last: bool) -> Result<()> {
        let end = std::time::SystemTime::now();
        self.collect()?;
        let pending = std::mem::take(&mut self.pending);
        if let Some(p) = self.profiles.as_deref_mut() {
            p.write(&pending, &self.symbols.borrow(), end)?;
        }
        let entries = Self::sorted(shown(pending, self.args, self.shape));
        let lost = std::mem::take(&mut self.lost);
        report_lost(&lost);
        if self.tables.is_some() {
            unwind::report(&self.unwind_stats.deltas()?, self.args.verbose);
        }
        emit(&if self.json {
            json_summary(&entries, &lost, last, self.args)
        } else if self.args.folded {
            entries
                .iter()
                .map(|(k, c)| format!("{}\n", folded_line(self.shape, k, *c)))
                .collect()
        } else {
            text(&entries, self.args, self.shape)
        })
    }

    fn metrics(&mut self, m: &mut Metrics) -> Result<()> {
        let run = self.run_now()?;
        let none = Vec::new;
        m.counters(
            "tracekit_stackcount_events",
            "Events counted with their stacks since the start (GET /stacks has them folded)",
            vec![(none(), run.values().sum())],
        );
        m.gauges(
            "tracekit_stackcount_stacks",
            "Distinct stacks seen since the start",
            None,
            vec![(none(), run.len() as f64)],
        );
        m.lost_records = self.lost_total
            + self.stacks_lost.peek()?.iter().sum::<u64>()
            + self.counts_lost.peek()?.iter().sum::<u64>();
        Ok(())
    }

    fn summary(&mut self) -> Result<serde_json::Value> {
        let mut pending = self.pending.clone();
        for (k, c) in self.peek()? {
            *pending.entry(k).or_default() += c;
        }
        Ok(serde_json::from_str(&json_summary(
            &Self::sorted(shown(pending, self.args, self.shape)),
            &self.lost,
            false,
            self.args,
        ))?)
    }

    fn reset(&mut self) -> Result<()> {
        self.collect()?;
        self.pending.clear();
        self.lost = [0; 4];
        Ok(())
    }

    fn profile_mark(&mut self) -> Option<Result<u64>> {
        Some(self.total_now().map(|now| {
            self.next_mark += 1;
            self.marks.insert(self.next_mark, now);
            self.next_mark
        }))
    }

    fn profile_since(
        &mut self,
        mark: u64,
        start: std::time::SystemTime,
        duration: Duration,
    ) -> Result<Vec<u8>> {
        let then = self.marks.remove(&mark).unwrap_or_default();
        let mut since = self.total_now()?;
        for (k, c) in since.iter_mut() {
            *c -= then.get(k).copied().unwrap_or(0).min(*c);
        }
        since.retain(|_, c| *c > 0);
        Ok(self
            .profile_kind
            .encoded(&since, &self.symbols.borrow(), start, duration))
    }

    fn folded(&mut self) -> Option<Result<String>> {
        Some(self.run_now().map(|run| {
            run.iter()
                .map(|(l, c)| format!("{} {c}\n", l.rsplit_once(' ').map_or(l.as_str(), |x| x.0)))
                .collect()
        }))
    }
}

/// The patterns stackcount takes: one, as BCC's, or several; a number among
/// them is most often a duration given to -d out of funccount habit.
fn patterns(args: &Args) -> Result<Vec<String>> {
    let number = |p: &String| p.parse::<f64>().is_ok();
    match args.patterns.as_slice() {
        ps if !ps.iter().any(number) => Ok(ps.to_vec()),
        [first, ..] if args.delimited && number(first) => bail!(
            "'{}' is not a PATTERN: -d is --delimited here; the duration is -D SECS (as in \
             BCC's stackcount)",
            common::escape(first)
        ),
        ps => bail!(
            "'{}' is not a PATTERN; the duration is -D SECS",
            common::escape(ps.iter().find(|p| number(p)).expect("a number"))
        ),
    }
}

/// A counts key (bpf/stackcount.bpf.c's `struct stack_key`), decoded.
struct RawKey {
    tgid: u32,
    /// The probe's index (0 without `probe_keys`).
    probe: u32,
    /// Stack hashes, 0 for none.
    kernel: u64,
    user: u64,
    comm: String,
}

// SAFETY: a C struct of integers and bytes, valid for any bit pattern.
unsafe impl plain::Plain for skel::types::stack_key {}

// common::stacks::read takes `struct stack` (bpf/stacks.h) by these offsets:
// a change there that it does not follow fails to compile here.
const _: () = {
    use skel::types::stack;
    assert!(offset_of!(stack, depth) == 0 && offset_of!(stack, first) == 4);
    assert!(offset_of!(stack, ip) == 8);
};

/// A key as the skeleton's `stack_key`; None for a key too short to be one.
fn parse_key(k: &[u8]) -> Option<RawKey> {
    let mut key = skel::types::stack_key::default();
    plain::Plain::copy_from_bytes(&mut key, k).ok()?;
    let comm: Vec<u8> = key.comm.iter().map(|&c| c as u8).collect();
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    Some(RawKey {
        tgid: key.tgid,
        probe: key.probe,
        kernel: key.kernel_stack,
        user: key.user_stack,
        comm: String::from_utf8_lossy(&comm[..end]).into_owned(),
    })
}

/// Reads and clears this interval's counts, resolves every distinct address once,
/// and merges stacks that print the same. Sorted ascending by count (BCC order).
/// Also returns how many events referred to a stack no longer stored. With
/// `consume` false (a --listen request) nothing is cleared or freed, so a
/// request never races an event out of the counts.
fn drain(
    skel: &skel::StackcountSkel,
    symbols: &Symbols,
    args: &Args,
    shape: &Shape,
    consume: bool,
) -> Result<(Vec<(Key, u64)>, u64)> {
    let counts = &skel.maps.counts;
    let keys: Vec<Vec<u8>> = counts.keys().collect();
    let mut raw = Vec::with_capacity(keys.len());
    for k in &keys {
        if let Some(v) = counts.lookup(k, MapFlags::ANY)? {
            if consume {
                let _ = counts.delete(k);
            }
            let n = u64::from_ne_bytes(v[..8].try_into().context("count value")?);
            if let Some(key) = parse_key(k) {
                raw.push((key, n));
            }
        }
    }
    let hashes: HashSet<u64> = raw
        .iter()
        .flat_map(|(k, _)| [k.kernel, k.user])
        .filter(|&h| h != 0)
        .collect();
    let mut addrs: HashMap<u64, Vec<u64>> = HashMap::new();
    for &h in &hashes {
        if let Some(a) = stacks::read(&skel.maps.stacks, h) {
            addrs.insert(h, a);
        }
    }
    if consume {
        stacks::forget(&skel.maps.stacks, hashes);
    }
    // A stack freed by the previous summary just as this event counted it.
    let mut expired = 0;
    raw.retain(|(k, n)| {
        let gone = [k.kernel, k.user]
            .iter()
            .any(|h| *h != 0 && !addrs.contains_key(h));
        if gone {
            expired += n;
        }
        !gone
    });
    let get = |h: u64| -> &[u64] { addrs.get(&h).map(Vec::as_slice).unwrap_or(&[]) };

    let mut batch = Batch::default();
    for (k, _) in &raw {
        batch.kernel(get(k.kernel));
        batch.user(k.tgid, get(k.user));
    }
    let resolved = batch.resolve(symbols);
    let mut merged: HashMap<Key, u64> = HashMap::new();
    for (k, n) in raw {
        // Profiles keep what they need: see `shown`.
        let keep = raw_keys(args);
        let key = Key {
            pid: (shape.perpid || keep).then_some(k.tgid),
            comm: shape.comm.then(|| k.comm.clone()),
            probe: shape.probe.then_some(k.probe),
            kernel: strip(resolved.kernel(get(k.kernel)), args, keep),
            user: strip(resolved.user(k.tgid, get(k.user)), args, keep),
        };
        *merged.entry(key).or_default() += n;
    }
    let mut out: Vec<(Key, u64)> = merged.into_iter().collect();
    out.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    Ok((out, expired))
}

/// Keeps only what the output shows, so stacks that print alike merge; and
/// the addresses with `keep_addr` (--pprof).
fn strip(frames: Vec<Frame>, args: &Args, keep_addr: bool) -> Vec<Frame> {
    frames
        .into_iter()
        .map(|mut f| {
            if !args.offset {
                f.offset = 0;
            }
            if !args.verbose && !keep_addr {
                f.addr = 0;
            }
            f
        })
        .collect()
}

/// Whether counted stacks keep each frame's address and their process, which
/// pprof profiles need (--pprof, and --listen's /debug/pprof/profile).
fn raw_keys(args: &Args) -> bool {
    args.pprof.is_some() || args.common.listen.is_some()
}

/// The stacks as the text, folded and JSON outputs show them: what --pprof
/// kept in the keys (addresses, the process when not counted per process)
/// dropped, and stacks that then print alike merged. Without --pprof the keys
/// are already so.
fn shown(entries: HashMap<Key, u64>, args: &Args, shape: &Shape) -> HashMap<Key, u64> {
    if !raw_keys(args) {
        return entries;
    }
    let mut out: HashMap<Key, u64> = HashMap::new();
    for (mut k, c) in entries {
        if !shape.perpid {
            k.pid = None;
        }
        k.probe = None;
        k.kernel = strip(k.kernel, args, false);
        k.user = strip(k.user, args, false);
        *out.entry(k).or_default() += c;
    }
    out
}

fn frame_lines(out: &mut String, frames: &[Frame], args: &Args) {
    for f in frames {
        for line in f.lines(args.offset) {
            if args.verbose {
                let _ = writeln!(out, "  {:<16x} {line}", f.addr);
            } else {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
}

/// BCC's layout: kernel frames leaf first, `--`, user frames, `comm [pid]`, count.
fn text(entries: &[(Key, u64)], args: &Args, shape: &Shape) -> String {
    let mut s = String::from("\n");
    if args.summary.timestamp {
        let _ = writeln!(s, "{:<8}", timestamp());
    }
    for (k, count) in entries {
        frame_lines(&mut s, &k.kernel, args);
        if shape.delimit {
            s.push_str("    --\n");
        }
        frame_lines(&mut s, &k.user, args);
        if let (true, Some(comm), Some(pid)) = (shape.comm_line, &k.comm, k.pid) {
            let _ = writeln!(s, "    {} [{pid}]", common::escape(comm));
        }
        let _ = writeln!(s, "    {count}\n");
    }
    s
}

/// A folded line: always led by the process name, so flame graphs never get an
/// empty root frame.
fn folded_line(shape: &Shape, k: &Key, count: u64) -> String {
    stacks::folded(k.comm.as_deref(), &k.user, &k.kernel, shape.delimit, count)
}

/// `args`: a frame has "addr" with -v and "offset" with -s, as text shows them
/// (without, stacks that differ only there are merged: see `strip`).
fn json_summary(entries: &[(Key, u64)], lost: &[u64], last: bool, args: &Args) -> String {
    let frames = |fs: &[Frame]| -> Vec<serde_json::Value> {
        fs.iter()
            .map(|f| {
                let mut o = serde_json::json!({"symbol": f.name(), "inlined": f.inlined});
                if args.verbose {
                    o["addr"] = format!("0x{:x}", f.addr).into();
                }
                if args.offset {
                    o["offset"] = f.offset.into();
                }
                o
            })
            .collect()
    };
    let stacks: Vec<serde_json::Value> = entries
        .iter()
        .map(|(k, c)| {
            serde_json::json!({
                "count": c, "pid": k.pid, "comm": k.comm,
                "kernel": frames(&k.kernel), "user": frames(&k.user),
            })
        })
        .collect();
    let v = summary_record(
        last,
        serde_json::json!({
            "stacks": stacks,
            "lost": {
                "kernel_stacks": lost[0], "user_stacks": lost[1],
                "counts_full": lost[2], "stacks_expired": lost[3],
            },
        }),
    );
    format!("{v}\n")
}

/// lost = [kernel stacks, user stacks (stack map full), events (counts map full),
/// events whose stack was freed under them].
fn report_lost(lost: &[u64]) {
    let what = [
        "kernel stacks (the stack map is full; raise --stack-storage-size)",
        "user stacks (the stack map is full; raise --stack-storage-size)",
        "events (the stack count table is full)",
        "events whose stack was freed by the previous summary",
    ];
    for (n, w) in lost.iter().zip(what) {
        if *n > 0 {
            warn(&format!("lost {n} {w}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, addr: u64) -> Frame {
        Frame {
            addr,
            name: Some(name.into()),
            offset: 0,
            inlined: Vec::new(),
        }
    }

    #[test]
    fn pprof_keys_merge_back_into_the_stacks_text_shows() {
        // --pprof keeps addresses, the process and the probe in the keys;
        // without -P/-p and -v, two processes' stacks at other addresses, taken
        // by two probes, print as one.
        let args = Args::try_parse_from(["stackcount", "--pprof", "x.pb.gz", "c:malloc"]).unwrap();
        let shape = Shape {
            perpid: false,
            comm: false,
            comm_line: false,
            delimit: false,
            probe: true,
        };
        let key = |pid, addr| Key {
            pid: Some(pid),
            comm: None,
            probe: Some(pid - 1),
            kernel: vec![frame("do_syscall_64", addr)],
            user: vec![frame("malloc", addr + 1), frame("main", addr + 2)],
        };
        let full = HashMap::from([(key(1, 0x100), 3), (key(2, 0x200), 4)]);
        let shown = shown(full, &args, &shape);
        let want = Key {
            pid: None,
            comm: None,
            probe: None,
            kernel: vec![frame("do_syscall_64", 0)],
            user: vec![frame("malloc", 0), frame("main", 0)],
        };
        assert_eq!(shown, HashMap::from([(want, 7)]));
    }
}
