//! trace: BCC's per-event tracer without a compiler at run time. Probe specs are
//! parsed here into small bytecode programs (compile.rs) that one prebuilt BPF
//! object (bpf/trace.bpf.c) interprets: predicates are evaluated in the kernel,
//! and only the events that pass reach user space, through one ring buffer.

#![cfg_attr(not(test), no_main)]

use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use common::ahead::OpenAhead;
use common::cli::CommonArgs;
use common::counters::PerCpuCounters;
use common::events::{self, Events};
use common::session::{How, Session};
use common::spec::{ProbeSpec, Source};
use common::tracepoints::Tracepoint;
use common::Matcher;
use common::{escape, warn};
use common::{syscall_event, Hooks, Plan, RawTracepoints, Site};
use common::{Schedule, StopReason, Streamed, Unserved};
use libbpf_rs::skel::{OpenSkel, Skel};
use libbpf_rs::{MapCore, MapFlags};
use serde_json::json;

mod compile;
mod desugar;
mod expr;
mod format;
mod grammar;
mod render;
mod tp_format;

use compile::{Ctx, Program, SiteCtx};
use grammar::Kind;
use tp_format::{format_of, TpField};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/trace.skel.rs"));
}

// SAFETY: C structs of integers (bpf/trace/abi.h), valid for any bit pattern,
// every byte of which is a field: the header names its padding, and
// libbpf-cargo names any other as a `__pad_*` field.
unsafe impl plain::Plain for skel::types::spec {}
unsafe impl plain::Plain for skel::types::specs_of {}
unsafe impl plain::Plain for skel::types::tk_event_head {}

/// A skeleton type's bytes, as a map update takes them.
fn bytes_of<T: plain::Plain>(v: &T) -> &[u8] {
    // SAFETY: a Plain type has no byte that is not a field (see above), so
    // every byte is initialized.
    unsafe { plain::as_bytes(v) }
}

const EXAMPLES: &str = r#"Examples:
  trace do_sys_open                        # trace the open syscall's kernel function
  trace 'do_sys_open "%s", arg2@user'      # with the file name
  trace 'do_sys_open "%s", filename@user'  # the same, by the argument's BTF name
  trace 'sys_read (arg3 > 20000) "read %d bytes", arg3'
  trace 'r::do_sys_open "%llx", retval'    # the return value
  trace 'r::do_sys_openat2 "%s -> %d", arg2@user, retval'  # entry argument and retval
  trace 'r::__kmalloc (retval == 0) "kmalloc failed!"'
  trace 'p:c:open (STRCMP("test.txt", arg1)) "opening %s", arg1'
  trace 'p::vfs_write (count > 4096) "%d bytes to %s", count, file->f_path.dentry->d_name.name'
  trace 'p::tcp_*'                         # every tcp_ function, one kprobe_multi link
  trace --args 'p::vfs_read'               # every argument, by name, from BTF
  trace 't:block:block_rq_complete "sectors=%d", args->nr_sector'
  trace 't:syscalls:sys_enter_openat "%s", args->filename'
  trace 'u:pthread:pthread_create (arg4 != 0)'
  trace -p 2740 'p:c:malloc "%d bytes", arg1' -U
  trace -M 10 -A 'p:c:write "%d", arg3'    # count identical events after 10
  trace 'c:malloc "%d", arg1' --json       # one JSON object per event
  trace -c system.slice/cron.service 'p::do_sys_openat2'  # only tasks of that cgroup"#;

/// Trace function calls, returns, tracepoints and USDT probes with a printf-style
/// message per event; predicates are evaluated in the kernel.
#[derive(Parser, Debug)]
#[command(name = "trace", version, after_help = EXAMPLES)]
// BCC's trace spells the cgroup filter -c; its CPU filter (BCC's trace has
// none) keeps only the long --cpu.
#[command(mut_arg("cpu", |a| a.short(None).help("Trace only events on this CPU")), mut_arg("cgroup", |a| a.short('c')))]
#[command(mut_arg("json", |a| a.help("Print one JSON object per event instead of text")))]
// An event stream has no summary to serve: --listen is refused, not offered.
#[command(mut_arg("listen", |a| a.hide(true)), mut_arg("listen_token", |a| a.hide(true)))]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// Trace this thread only
    #[arg(short = 'L', long = "tid", value_name = "TID", value_parser = common::cli::parse_pid, conflicts_with = "pid")]
    tid: Option<u32>,

    /// Trace this user id only
    #[arg(long, value_name = "UID")]
    uid: Option<u32>,

    /// Print the compiled probes, how they attach, and counts at the end
    #[arg(short, long)]
    verbose: bool,

    /// Bytes read for each %s string, its NUL included
    #[arg(short = 'Z', long = "string-size", value_name = "N", default_value_t = 80, value_parser = clap::value_parser!(u32).range(1..=4096))]
    string_size: u32,

    /// Also trace this trace process itself
    #[arg(short = 'S', long = "include-self")]
    include_self: bool,

    /// Stop after N events
    #[arg(short = 'M', long = "max-events", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_events: Option<u64>,

    /// TIME column: seconds since trace started
    #[arg(short = 't', long)]
    timestamp: bool,

    /// With -t: seconds since the Unix epoch
    #[arg(short = 'u', long = "unix-timestamp")]
    unix_timestamp: bool,

    /// TIME column: wall clock HH:MM:SS
    #[arg(short = 'T', long)]
    time: bool,

    /// CPU column
    #[arg(short = 'C', long = "print_cpu", visible_alias = "print-cpu")]
    print_cpu: bool,

    /// Only events of commands whose name contains NAME
    #[arg(short = 'n', long, value_name = "NAME")]
    name: Option<String>,

    /// Only events whose message contains STR
    #[arg(short = 'f', long = "msg-filter", value_name = "STR")]
    msg_filter: Option<String>,

    /// Print the kernel stack of each event
    #[arg(short = 'K', long = "kernel-stack")]
    kernel_stack: bool,

    /// Print the user stack of each event
    #[arg(short = 'U', long = "user-stack")]
    user_stack: bool,

    /// Print addresses in stacks
    #[arg(short = 'a', long)]
    address: bool,

    /// Files that name user stack frames, found by build ID before any other
    /// (comma-separated): the unstripped build of a stripped program, say
    #[arg(
        short = 's',
        long = "sym_file_list",
        visible_alias = "sym-file-list",
        value_name = "FILES",
        value_delimiter = ','
    )]
    sym_files: Vec<std::path::PathBuf>,

    /// STRCMP literals are lists of bytes, "{0x6C, 0x00}", compared with the
    /// bytes at the value as they are, NULs included
    #[arg(short = 'B', long = "bin_cmp", visible_alias = "bin-cmp")]
    bin_cmp: bool,

    /// Count identical events and print the counts at the end (or after -M)
    #[arg(short = 'A', long)]
    aggregate: bool,

    /// Probes without a format print every argument of the function (from
    /// BTF) or every field of the tracepoint, by name
    #[arg(long = "args")]
    all_args: bool,

    /// Ring buffer size in pages per CPU (BCC's per-probe perf buffer pages)
    #[arg(short = 'b', long = "buffer-pages", value_name = "PAGES", value_parser = clap::value_parser!(u32).range(1..=65536))]
    buffer_pages: Option<u32>,

    /// Accepted for BCC compatibility: types come from the kernel's BTF
    #[arg(short = 'I', long = "include", value_name = "HEADER")]
    include: Vec<String>,

    /// The probes: [{p,r}]:[lib]:func[+off][(sig)] [(pred)] ["fmt", args...],
    /// t:cat:event ..., u:lib:probe ...
    #[arg(required = true, value_name = "PROBE")]
    probes: Vec<String>,
}

common::entry!(main);

fn main() {
    let ahead = OpenAhead::start(skel::CORE_SECTIONS, skel::LIBBPF_WARMUP);
    common::cli::main("trace", || run(common::cli::parse::<Args>(), ahead))
}

/// The ring buffer's size unless -b or `TRACEKIT_RING_BYTES` says otherwise.
const TRACE_RING_BYTES: u32 = 16 << 20;

/// One compiled program and what renders its records.
struct Compiled {
    probe: usize,
    prog: Program,
    /// The probe as compiled (with --args' format).
    parsed: grammar::Probe,
}

fn run(mut args: Args, ahead: OpenAhead<skel::TraceSkelBuilder>) -> Result<()> {
    if !args.include.is_empty() {
        warn("-I is not needed: struct layouts come from the kernel's BTF");
    }
    if let Some(tid) = args.tid {
        common::thread_group(tid).map_err(|_| anyhow!("-L {tid}: no thread with that ID"))?;
    }
    for f in &args.sym_files {
        let shown = escape(f.display().to_string());
        if f.is_dir() {
            bail!("-s {shown}: a directory; give the files (comma-separated)");
        }
        if !f.is_file() {
            bail!("-s {shown}: no such file");
        }
        if common::build_id(f).is_none() {
            bail!("-s {shown}: the file has no build ID (.note.gnu.build-id), by which user stack frames name their files");
        }
    }
    let mut parsed = Vec::new();
    for text in &args.probes {
        let p = grammar::parse(text).map_err(|e| anyhow!("bad probe \"{}\": {e}", escape(text)))?;
        parsed.push(p);
    }
    let specs: Vec<ProbeSpec> = parsed.iter().map(common_spec).collect::<Result<_>>()?;
    let hooks = if parsed.iter().any(|p| p.kind == Kind::Return) {
        Hooks::EntryAndReturn
    } else {
        Hooks::Entry
    };
    let mut per_probe = Vec::new();
    // The specs of each probe, and their offsets, are applied inside: -v
    // prints the plan as attached.
    let mut session = Session::prepare_with(
        &mut args.common,
        How {
            hooks,
            ..How::default()
        },
        args.verbose,
        |opts| {
            let (mut plan, indexes) = Plan::build_indexed(&specs, opts)?;
            per_probe = specs_per_probe(&mut plan, &indexes, &parsed)?;
            Ok(plan)
        },
    )?;
    for (i, l) in per_probe.iter().enumerate() {
        if l.len() > compile::MAX_SPECS {
            bail!(
                "{} probes on {}: at most {} per function, event or USDT probe",
                l.len(),
                session.plan.probes[i].label,
                compile::MAX_SPECS
            );
        }
    }

    // Tracepoints are attached here, each to the program for its record's size
    // (see bpf/trace.bpf.c), but for those the plan attaches through raw links:
    // syscall events whose record the raw sys_enter/sys_exit programs rebuild,
    // and tracepoints whose specs read no field of the record. Probe indexes
    // (attach cookies): the plan's probes first, then the tracepoints attached
    // here.
    let kernel_reads = common::features::kernel_reads();
    let mut formats: HashMap<String, Vec<TpField>> = HashMap::new();
    let probes = std::mem::take(&mut session.plan.probes);
    let mut compiled = compile_all(
        &probes,
        &per_probe,
        &parsed,
        &args,
        kernel_reads,
        &mut formats,
    )?;
    let reads_record = |i: usize| compiled.iter().any(|c| c.probe == i && c.prog.rec_end > 0);
    // Raw links to other tracepoints carry the probe in their cookie (Linux
    // 6.10+); before, a run's only probe needs none (bpf/trace.bpf.c's one_probe).
    // (The cookie probe can take a trial attach: asked only with candidates.)
    let candidate = |i: usize, t: &Tracepoint| syscall_event(t).is_none() && !reads_record(i);
    let any_candidate = probes.iter().enumerate().any(|(i, p)| match &p.site {
        Site::Tracepoint(t) => candidate(i, t),
        _ => false,
    });
    let cookies = any_candidate && common::features::raw_tp_cookie();
    let raw = if cookies || probes.len() == 1 {
        common::raw_attachable(&probes, candidate)
    } else {
        vec![false; probes.len()]
    };
    let raw_how = if cookies {
        RawTracepoints::ByCookie
    } else {
        RawTracepoints::Alike
    };
    let mut here = vec![false; probes.len()];
    for (i, p) in probes.iter().enumerate() {
        if let Site::Tracepoint(t) = &p.site {
            let rebuilt = kernel_reads
                && !common::perf_syscalls()
                && syscall_event(t).is_some_and(|(exit, _)| {
                    format_of(t, &mut formats).is_ok_and(|f| tp_format::syscall_record(f, exit))
                });
            here[i] = !rebuilt && !raw[i];
        }
    }
    // The plan's probes first (in their order), then the others.
    let mut order: Vec<usize> = (0..probes.len()).collect();
    order.sort_by_key(|&i| here[i]);
    let nplan = here.iter().filter(|&&h| !h).count();
    let mut new_index = vec![0; probes.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    for c in &mut compiled {
        c.probe = new_index[c.probe];
    }
    let all: Vec<common::Probe> = order.iter().map(|&i| probes[i].clone()).collect();
    let tp_progs = tracepoint_programs(&all[nplan..], nplan, &compiled, &formats, kernel_reads)?;
    // Every probe goes to the plan, which attaches the tracepoints this run
    // serves with a program per record shape by that program's name.
    let mut programs = vec![None; all.len()];
    for (i, name) in &tp_progs {
        programs[*i] = Some(name.clone());
    }
    session.plan.set_probes(
        all.clone(),
        order.iter().map(|&i| raw[i]).collect(),
        raw_how,
        programs,
    );
    if args.verbose {
        for (id, c) in compiled.iter().enumerate() {
            // compile::specs_of's choice: a lone spec's fast predicate on a register.
            let lone = compiled.iter().filter(|d| d.probe == c.probe).count() == 1;
            common::stderr(&format!(
                "program {id}: probe {} ({}) for \"{}\"\n{}{}",
                c.probe,
                all[c.probe].label,
                escape(&c.parsed.text),
                c.prog.describe(),
                if lone && c.prog.gate().is_some() {
                    "    gate: decided on its register before anything else is read\n"
                } else {
                    ""
                }
            ));
        }
    }

    let ring = match args.buffer_pages {
        Some(p) => {
            let cpus = libbpf_rs::num_possible_cpus()? as u64;
            (u64::from(p) * 4096 * cpus)
                .next_power_of_two()
                .min(1 << 30) as u32
        }
        // Deeper than the other tools' default: trace prints every hit of hot
        // probes, and a reader the scheduler holds back on a busy machine must
        // not lose what the kernel side now produces faster (16 MiB: BCC's 64
        // pages per CPU on 64 CPUs).
        None if std::env::var_os(events::RING_BYTES_ENV).is_none() => TRACE_RING_BYTES,
        None => events::ring_bytes()?,
    };
    let plan = &session.plan;
    let self_tgid = if args.include_self {
        0
    } else {
        std::process::id()
    };
    let json_out = session.json;
    // A one-probe run's lone gated spec: its gate goes in .rodata
    // (bpf/trace.bpf.c's the_gate), entry or return.
    let lone_gate = match (&all[..], &compiled[..]) {
        ([_], [c]) => c
            .prog
            .gate()
            .map(|g| (g, c.prog.flags & compile::F_RETURN != 0)),
        _ => None,
    };
    let mut open = common::open_skeleton!(ahead, plan, args.common.cpu, |rodata| {
        rodata.kernel_reads = kernel_reads;
        // The plan's syscall events need kernel reads (see above): it never
        // has sys_enter remember numbers.
        rodata.task_status_off = common::SyscallGlobals::of(plan).task_status_off;
        rodata.self_tgid = self_tgid;
        rodata.filter_tid = args.tid.unwrap_or(0);
        rodata.filter_uid = args.uid.map_or(-1, i64::from);
        rodata.str_size = args.string_size;
        rodata.want_kstack = args.kernel_stack;
        rodata.want_ustack = args.user_stack;
        // Frames as build ID and file offset: named even after the process
        // exits, before its map could be read (BCC #2014).
        rodata.ustack_build_id = args.user_stack;
        // The header's ts, uid and cpu are only printed by these.
        rodata.want_extras = args.timestamp || args.print_cpu || json_out;
        // Only -v prints the per-spec counts: no counter to bump otherwise.
        rodata.want_stats = args.verbose;
        // One probe: every hit is of probe 0, no attach cookie to read.
        rodata.one_probe = all.len() == 1;
        if let Some((g, ret)) = lone_gate {
            rodata.gate_at = if ret {
                compile::GATE_RETURN
            } else {
                compile::GATE_ENTRY
            };
            rodata.the_gate = g;
        }
        // %U values, and the stack frames the kernel could not give by build
        // ID, are symbolized with the process's map, taken at its first
        // record: the reader is woken for every record, while it lives.
        rodata.events_wakeup_bytes = if args.user_stack || uses_u(&compiled) {
            0
        } else {
            events::wakeup_bytes(ring)
        };
    });
    open.maps
        .specs
        .set_max_entries(compiled.len().max(1) as u32)?;
    open.maps.probes.set_max_entries(all.len().max(1) as u32)?;
    open.maps
        .stats
        .set_max_entries((compile::STATS * compiled.len()).max(1) as u32)?;
    // Threads in a traced call at once: trace's frames are 7x funclatency's
    // (saved arguments), so fewer of them. Session programs save the arguments
    // there too (configure() sizes it for funclatency's, which keep only a time
    // in the kernel's cookie). A plan with no return keeps configure()'s one
    // entry: 4.7 MB preallocated otherwise.
    if compiled
        .iter()
        .any(|c| c.prog.flags & compile::F_RETURN != 0)
    {
        open.maps.calls.set_max_entries(4096)?;
    }
    open.maps.events.set_max_entries(ring)?;
    let skel = open.load().context("loading the BPF programs")?;
    for (id, c) in compiled.iter().enumerate() {
        skel.maps
            .specs
            .update(
                &(id as u32).to_ne_bytes(),
                bytes_of(&c.prog.to_spec()),
                MapFlags::ANY,
            )
            .context("writing the probe programs")?;
    }
    let mut lists: Vec<Vec<u32>> = vec![Vec::new(); all.len()];
    for (id, c) in compiled.iter().enumerate() {
        lists[c.probe].push(id as u32);
    }
    for (i, l) in lists.iter().enumerate() {
        let progs: Vec<&compile::Program> =
            l.iter().map(|&id| &compiled[id as usize].prog).collect();
        let v = compile::specs_of(l, &progs);
        skel.maps
            .probes
            .update(&(i as u32).to_ne_bytes(), bytes_of(&v), MapFlags::ANY)
            .context("writing the probe table")?;
    }

    let nprobes = all.len();
    let labels: Vec<String> = all
        .iter()
        .map(|p| match &p.site {
            Site::Tracepoint(t) => t.event.clone(),
            _ => p.label.clone(),
        })
        .collect();
    session.attach(skel.object())?;
    if args.verbose {
        let mut s = String::new();
        for p in &all[..nplan] {
            if let Site::Tracepoint(t) = &p.site {
                let _ = match syscall_event(t) {
                    Some((exit, _)) => {
                        let dir = if exit { "sys_exit" } else { "sys_enter" };
                        writeln!(
                            s,
                            "tracepoint {}: program trace_{dir} on the raw {dir} link, which rebuilds the record from the registers",
                            p.label
                        )
                    }
                    None => writeln!(
                        s,
                        "tracepoint {}: program trace_raw_tp on a raw tracepoint link (no field of the record is read)",
                        p.label
                    ),
                };
            }
        }
        let skipped = session.attached().map_or(&[][..], |a| &a.skipped[..]);
        for (i, name) in &tp_progs {
            let label = &all[*i].label;
            let _ = match skipped.iter().find(|k| &k.label == label) {
                Some(k) => writeln!(
                    s,
                    "tracepoint {label}: program {name}, skipped: {}",
                    k.reason
                ),
                None => writeln!(s, "tracepoint {label}: program {name}"),
            };
        }
        if !s.is_empty() {
            common::stderr(&s);
        }
    }
    let with_format = compiled.iter().any(|c| c.parsed.format.is_some());
    let json = session.json;
    let mut r = render::Renderer::new(render::Options {
        timestamp: args.timestamp,
        unix: args.unix_timestamp,
        time: args.time,
        cpu: args.print_cpu,
        address: args.address,
        kernel_stack: args.kernel_stack,
        user_stack: args.user_stack,
        json,
        str_size: args.string_size as usize,
    });
    // Files named with -s come first among those build IDs are looked up in.
    for f in &args.sym_files {
        r.add_file(f);
    }
    // The traced process's map is taken now: its records may arrive after it
    // exited (BCC #2014), and then /proc no longer has it.
    if let (Some(pid), true) = (args.common.pid, args.user_stack || uses_u(&compiled)) {
        r.remember(pid);
    }
    // Build-ID stack frames are looked for first in the binaries probed.
    for p in &session.plan.probes {
        if let Site::User { binary, .. } | Site::Usdt { binary, .. } = &p.site {
            r.add_file(binary);
        }
    }
    if json {
        session.status(&format!(
            "Tracing {nprobes} probe{}... Hit Ctrl-C to end.",
            if nprobes == 1 { "" } else { "s" }
        ))?;
    } else {
        common::emit(&r.header(with_format))?;
    }

    let stop = session.stop;
    let mut printed = 0u64;
    let mut received = 0u64;
    let mut aggregate: HashMap<String, u64> = HashMap::new();
    let mut done = false;
    let lost_total;
    {
        let ev = Events::new_raw(&skel.maps.events, &skel.maps.events_lost, |data, out| {
            received += 1;
            // Records without strings or stacks end after their last value.
            if done || data.len() < render::VALS_AT {
                return Ok(());
            }
            let h = render::Header::decode(data);
            let Some(c) = compiled.get(h.spec as usize) else {
                return Ok(());
            };
            if let Some(n) = &args.name {
                if !h.comm.contains(n.as_str()) {
                    return Ok(());
                }
            }
            let mut vals = [0u64; compile::MAX_VALS];
            for (k, v) in data[render::VALS_AT..data.len().min(render::TAIL_AT)]
                .chunks_exact(8)
                .enumerate()
            {
                vals[k] = u64::from_ne_bytes(v.try_into().expect("8 bytes"));
            }
            let tail = data.get(render::TAIL_AT..).unwrap_or(&[]);
            let msg = r.message(&c.parsed, &c.prog, &h, &vals, tail);
            if let Some(f) = &args.msg_filter {
                if !msg.text.contains(f.as_str()) {
                    return Ok(());
                }
            }
            let text = r.event(&h, &labels[c.probe], &c.parsed, &msg, tail);
            if args.aggregate {
                let key = if json {
                    json_aggregate_key(&text, args.print_cpu)
                } else {
                    text
                };
                *aggregate.entry(key).or_default() += 1;
            } else {
                out.push_str(&text);
            }
            printed += 1;
            if args.max_events.is_some_and(|m| printed >= m) {
                done = true;
                stop.trigger(StopReason::Signal);
            }
            Ok(())
        })?;
        // -M ends the run as a signal would; trace prints no summaries, and
        // reports lost records as BCC's trace does.
        let mut ev = ev.in_bccs_words();
        session.run(
            Schedule::default(),
            &mut Streamed {
                events: &mut ev,
                tool: &mut Unserved,
            },
        )?;
        lost_total = ev.lost_total();
    }
    if args.aggregate {
        let mut rows: Vec<(String, u64)> = aggregate.into_iter().collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut s = String::new();
        for (text, n) in rows {
            if json {
                let event: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                let _ = writeln!(s, "{}", json!({"event": event, "count": n}));
            } else {
                let _ = write!(s, "{text}-->COUNT {n}\n\n");
            }
        }
        common::emit(&s)?;
    }
    if json {
        // Last, so a script knows the run ended and whether anything was lost.
        let v = json!({"final": true, "events": printed, "records": received, "lost": lost_total});
        common::emit(&format!("{v}\n"))?;
    }
    if args.verbose {
        report_stats(&skel.maps.stats, &compiled, received)?;
    }
    report_unpaired(&skel.maps.pairing_lost, args.verbose)?;
    drop(r);
    session.finish(true)
}

/// Returns of `r:` probes not printed, from pairing_lost (bpf/pairing.h): a
/// warning when calls were too deep or too many threads were in calls; with -v
/// always, with the returns whose entry was not seen.
fn report_unpaired(map: &dyn MapCore, verbose: bool) -> Result<()> {
    let lost = PerCpuCounters::new(map, 3)?.totals()?;
    let what = [
        format!("calls nested deeper than {PAIR_DEPTH} on their thread (their entries could not be saved)"),
        "calls that never returned (left by longjmp or an exception) or whose return was missed".to_string(),
        "calls made while too many threads were in traced functions at once".to_string(),
    ];
    for (n, w) in lost.iter().zip(&what) {
        if *n > 0 || verbose {
            common::warn(&format!("{n} returns not printed: {w}"));
        }
    }
    Ok(())
}

/// bpf/trace.bpf.c's PAIR_DEPTH: the calls of one thread whose entries are kept
/// for their returns, as many as bpf/pairing.h's `thread_calls` has frames.
const PAIR_DEPTH: usize = frames_of(|t| t.frames);

/// The length of the skeleton's `thread_calls.frames`.
const fn frames_of<const N: usize>(
    _: fn(skel::types::thread_calls) -> [skel::types::frame; N],
) -> usize {
    N
}

/// What makes two --json events identical for -A: the event without its time
/// (and CPU, unless -C asks for it), as text does.
fn json_aggregate_key(event: &str, with_cpu: bool) -> String {
    let Ok(serde_json::Value::Object(mut o)) = serde_json::from_str(event) else {
        return event.to_string();
    };
    o.remove("time_s");
    o.remove("unix_time");
    if !with_cpu {
        o.remove("cpu");
    }
    serde_json::Value::Object(o).to_string()
}

/// Whether any format prints a user symbol (%U).
fn uses_u(compiled: &[Compiled]) -> bool {
    compiled
        .iter()
        .filter_map(|c| c.parsed.format.as_ref())
        .any(|f| f.convs().any(|c| c.ty == 'U'))
}

/// The common ProbeSpec that expands probe `p`'s sites.
fn common_spec(p: &grammar::Probe) -> Result<ProbeSpec> {
    let bad = |e: anyhow::Error| anyhow!("bad probe \"{}\": {e}", escape(&p.text));
    let (source, pattern) = match p.kind {
        Kind::Entry | Kind::Return if p.library.is_empty() => (Source::Kernel, p.name.clone()),
        Kind::Entry | Kind::Return => (
            Source::User {
                target: p.library.clone(),
            },
            p.name.clone(),
        ),
        Kind::Tracepoint => (Source::Tracepoint, p.name.clone()),
        Kind::Usdt => (
            Source::Usdt {
                target: p.library.clone(),
            },
            p.name.clone(),
        ),
    };
    Ok(ProbeSpec {
        raw: p.text.clone(),
        source,
        matcher: Matcher::glob(&pattern).map_err(bad)?,
    })
}

/// Which specs serve each of the plan's probes (`indexes`: the probes of each
/// spec), with their offsets applied. Probes no spec keeps (another USDT
/// provider's) are dropped from the plan.
fn specs_per_probe(
    plan: &mut Plan,
    indexes: &[Vec<usize>],
    parsed: &[grammar::Probe],
) -> Result<Vec<Vec<usize>>> {
    let mut per_probe: Vec<Vec<usize>> = vec![Vec::new(); plan.probes.len()];
    for (s, idx) in indexes.iter().enumerate() {
        for &i in idx {
            if let (Some(prov), Site::Usdt { probe, .. }) =
                (&parsed[s].provider, &plan.probes[i].site)
            {
                if &probe.provider != prov {
                    continue;
                }
            }
            if !per_probe[i].contains(&s) {
                per_probe[i].push(s);
            }
        }
    }
    for (s, p) in parsed.iter().enumerate() {
        if p.provider.is_some() && !per_probe.iter().any(|l| l.contains(&s)) {
            bail!(
                "bad probe \"{}\": no USDT probe {}:{} in {}",
                escape(&p.text),
                p.provider.as_deref().unwrap_or(""),
                p.name,
                p.library
            );
        }
    }
    let keep: Vec<bool> = per_probe.iter().map(|l| !l.is_empty()).collect();
    let mut k = 0;
    plan.probes.retain(|_| {
        k += 1;
        keep[k - 1]
    });
    per_probe.retain(|l| !l.is_empty());
    apply_offsets(plan, &per_probe, parsed)?;
    Ok(per_probe)
}

/// `func+offset`: user functions are probed that far into the function, and
/// named so.
fn apply_offsets(
    plan: &mut Plan,
    per_probe: &[Vec<usize>],
    parsed: &[grammar::Probe],
) -> Result<()> {
    for (i, specs) in per_probe.iter().enumerate() {
        let offs: Vec<u64> = specs.iter().map(|&s| parsed[s].offset).collect();
        let Some(&off) = offs.first() else { continue };
        if offs.iter().any(|&o| o != off) {
            bail!(
                "probes on {} at different offsets: give each its own run",
                plan.probes[i].label
            );
        }
        if off == 0 {
            continue;
        }
        match &mut plan.probes[i].site {
            Site::User { binary, func } => {
                *func = common::at_offset(binary, func, off).map_err(|why| {
                    anyhow!(
                        "bad probe \"{}\": {}+{off:#x} cannot be traced: {why}",
                        escape(&parsed[specs[0]].text),
                        func.name
                    )
                })?;
                plan.probes[i].label = format!("{}+{off:#x}", plan.probes[i].label);
            }
            Site::Kernel(f) => bail!(
                "bad probe \"{}\": offsets into kernel functions ({}+{off:#x}) are not supported: kernel functions are attached at their entry",
                escape(&parsed[specs[0]].text),
                f.name
            ),
            _ => {}
        }
    }
    Ok(())
}

/// Compiles every (site, probe) pair; identical programs of one probe share.
fn compile_all(
    all: &[common::Probe],
    per_probe: &[Vec<usize>],
    parsed: &[grammar::Probe],
    args: &Args,
    kernel_reads: bool,
    formats: &mut HashMap<String, Vec<TpField>>,
) -> Result<Vec<Compiled>> {
    let needs_btf = all.iter().any(|p| matches!(p.site, Site::Kernel(_)));
    let kbtf = if needs_btf {
        match common::btf::Kbtf::load() {
            Ok(b) => Some(b),
            Err(e) => {
                warn(&format!("{e:#}: only arg1..arg6 are known"));
                None
            }
        }
    } else {
        None
    };
    let mut out = Vec::new();
    for (i, specs) in per_probe.iter().enumerate() {
        let probe = &all[i];
        for &s in specs {
            let mut p = parsed[s].clone();
            let text = p.text.clone();
            let bad = |e: String| anyhow!("bad probe \"{}\": {}: {e}", escape(&text), probe.label);
            let site = match &probe.site {
                Site::Kernel(f) => {
                    let syscall = f.name.starts_with("__x64_sys_");
                    let proto = kbtf.as_ref().and_then(|b| {
                        if syscall {
                            let n = &f.name["__x64_sys_".len()..];
                            b.func(&format!("__do_sys_{n}"))
                                .or_else(|| b.func(&format!("__se_sys_{n}")))
                        } else {
                            b.func(&f.name)
                        }
                    });
                    SiteCtx::Kernel {
                        func: &f.name,
                        proto,
                        syscall,
                    }
                }
                Site::User { .. } => SiteCtx::User,
                Site::Tracepoint(t) => {
                    format_of(t, formats)?;
                    SiteCtx::Tracepoint {
                        fields: &formats[&t.name()],
                        syscalls: t.category == "syscalls",
                    }
                }
                Site::Usdt { probe, .. } => SiteCtx::Usdt {
                    args: probe.args,
                    types: &probe.types,
                },
            };
            if args.all_args && p.format.is_none() {
                desugar::all_args(&mut p, &site, kbtf.as_ref());
            }
            let ctx = Ctx {
                site,
                btf: kbtf.as_ref(),
                kernel_reads,
                str_size: args.string_size,
                bin_cmp: args.bin_cmp,
            };
            let prog = compile::compile(&p, &ctx).map_err(bad)?;
            out.push(Compiled {
                probe: i,
                prog,
                parsed: p,
            });
        }
    }
    Ok(out)
}

/// The program each tracepoint in `tps` (probes `first`...) is attached to:
/// with kernel reads the one that copies what the probes read; without them,
/// the one that reads the largest prefix the record has (bpf/trace.bpf.c).
fn tracepoint_programs(
    tps: &[common::Probe],
    first: usize,
    compiled: &[Compiled],
    formats: &HashMap<String, Vec<TpField>>,
    kernel_reads: bool,
) -> Result<Vec<(usize, String)>> {
    const CLASSES: &[u32] = &[
        12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 72, 80, 88, 96, 112, 128, 160, 192,
        256, 384, 512,
    ];
    let mut out = Vec::new();
    for (i, p) in (first..).zip(tps) {
        let Site::Tracepoint(t) = &p.site else {
            continue;
        };
        if kernel_reads {
            out.push((i, "trace_tp_read".to_string()));
            continue;
        }
        let fields = formats.get(&t.name()).map(Vec::as_slice).unwrap_or(&[]);
        let size = fields.iter().map(|f| f.offset + f.size).max().unwrap_or(8);
        let need = compiled
            .iter()
            .filter(|c| c.probe == i)
            .map(|c| c.prog.rec_end)
            .max()
            .unwrap_or(0);
        let class = CLASSES.iter().rev().find(|&&c| c <= size).copied();
        match class {
            Some(c) if need <= c => out.push((i, format!("trace_tp_{c}"))),
            _ if need == 0 => out.push((i, "trace_tp_12".to_string())),
            _ => bail!(
                "tracepoint {}: its fields past byte {} (of {size}) cannot be read on this kernel: without kernel reads (lockdown=confidentiality) trace reads records at fixed sizes",
                t.name(),
                class.unwrap_or(8)
            ),
        }
    }
    Ok(out)
}

/// -v: per program, hits seen in the kernel and dropped by the predicate, and
/// the records that reached user space.
fn report_stats(map: &dyn MapCore, compiled: &[Compiled], received: u64) -> Result<()> {
    let mut c = PerCpuCounters::new(map, compile::STATS * compiled.len().max(1))?;
    let t = c.totals()?;
    let mut s = format!("trace: {received} records reached user space\n");
    // Each spec's counters: [0] hits kept, [1] hits its predicate dropped.
    for (id, p) in compiled.iter().enumerate() {
        let (kept, dropped) = (t[compile::STATS * id], t[compile::STATS * id + 1]);
        let _ = writeln!(
            s,
            "trace: program {id} (\"{}\"): {} hits, {dropped} dropped by the predicate in the kernel",
            escape(&p.parsed.text),
            kept + dropped,
        );
    }
    common::stderr(&s);
    Ok(())
}
