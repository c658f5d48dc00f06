//! trace: BCC's per-event tracer without a compiler at run time. Probe specs are
//! parsed here into small bytecode programs (compile/) that one prebuilt BPF
//! object (bpf/trace.bpf.c) interprets: predicates are evaluated in the kernel,
//! and only the events that pass reach user space, through one ring buffer.
//!
//! run() in stages: parse, plan, compile (compile/), place (placement.rs), load
//! (load.rs), attach (through the plan), stream (stream.rs).

#![cfg_attr(not(test), no_main)]

use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::{anyhow, bail, Result};
use clap::Parser;
use common::ahead::OpenAhead;
use common::cli::CommonArgs;
use common::session::{How, Session};
use common::spec::{ProbeSpec, Source};
use common::Matcher;
use common::{escape, warn};
use common::{syscall_event, Hooks, Plan, Site};
use libbpf_rs::skel::Skel;

mod compile;
mod desugar;
mod expr;
mod format;
mod grammar;
mod load;
mod placement;
mod render;
mod stream;
mod tp_format;

use compile::Compiled;
use grammar::Kind;
use placement::Placement;
use tp_format::TpField;

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
pub(crate) fn bytes_of<T: plain::Plain>(v: &T) -> &[u8] {
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

    /// Allow r: probes on Go programs, which crash them (Go moves and walks goroutine stacks by return address, which a return probe replaces); refused without it
    #[arg(long = "unsafe", alias = "force")]
    unsafe_returns: bool,

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

    /// How -U stacks are walked: auto (by the binaries' unwind tables, or by
    /// frame pointers where the traced process keeps them everywhere), fp (frame
    /// pointers only: cheaper, stops at code built without them) or dwarf
    /// (unwind tables: .eh_frame, .debug_frame)
    #[arg(long, value_name = "WALK", default_value = "auto")]
    user_stacks: common::UserStacks,

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
    /// t:cat:event ..., u:lib:probe ..., profile:hz:N, software:EVENT[:PERIOD],
    /// hardware:EVENT[:PERIOD] ...
    #[arg(required = true, value_name = "PROBE")]
    probes: Vec<String>,
}

common::entry!(main);

fn main() {
    let ahead = OpenAhead::start(skel::CORE_SECTIONS, skel::LIBBPF_WARMUP);
    common::cli::main("trace", || run(common::cli::parse::<Args>(), ahead))
}

fn run(mut args: Args, ahead: OpenAhead<skel::TraceSkelBuilder>) -> Result<()> {
    check(&args)?;
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
            let opts = common::PlanOptions {
                unsafe_returns: args.unsafe_returns,
                ..opts.clone()
            };
            let (mut plan, indexes) = Plan::build_indexed(&specs, &opts)?;
            per_probe = placement::specs_per_probe(&mut plan, &indexes, &parsed)?;
            Ok(plan)
        },
    )?;
    placement::check_specs_per_probe(&per_probe, &session.plan)?;

    // Compiled per site, then placed: which tracepoints take a perf event on
    // their record size's program, attached by name through the plan
    // (placement.rs).
    let kernel_reads = common::features::kernel_reads();
    let mut formats: HashMap<String, Vec<TpField>> = HashMap::new();
    let samples = session.plan.samples();
    let probes = std::mem::take(&mut session.plan.probes);
    let mut compiled = compile::compile_all(
        &probes,
        &per_probe,
        &parsed,
        &args,
        kernel_reads,
        &mut formats,
    )?;
    let placed = placement::place(
        &mut session.plan,
        probes,
        &mut compiled,
        &mut formats,
        kernel_reads,
    )?;
    if args.verbose {
        print_programs(&compiled, &placed.all);
    }

    let ring = load::ring_bytes(&args)?;
    let walk_tables =
        args.user_stack && common::unwind::choose(args.user_stacks, args.common.pid, samples)?;
    let skel = load::load(
        ahead,
        &session,
        &args,
        &compiled,
        &placed,
        load::How {
            kernel_reads,
            ring,
            walk_tables,
        },
    )?;
    load::fill_tables(&skel, &compiled, placed.all.len())?;
    // The traced processes' unwind tables before the first event; others'
    // when BPF asks (stream::run).
    let tables = match walk_tables {
        true => Some(std::cell::RefCell::new(common::unwind::Tables::new(
            common::unwind::Maps::of(
                &skel.maps.unwind_files,
                &skel.maps.unwind_file_info,
                &skel.maps.unwind_mappings,
                &skel.maps.unwind_procs,
            )?,
        ))),
        false => None,
    };
    if let Some(t) = &tables {
        t.borrow_mut()
            .load_start(args.common.pid, &session.plan.user_binaries())?;
        if args.verbose {
            common::stderr(&t.borrow().describe());
        }
    }
    attach(&mut session, &skel, &placed, args.verbose)?;
    stream::run(
        &mut session,
        &skel,
        &args,
        &compiled,
        &placed,
        tables.as_ref(),
    )?;
    session.finish(true)
}

/// The options checked before anything is planned: -I, -L and -s.
fn check(args: &Args) -> Result<()> {
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
    Ok(())
}

/// Attaches every probe through the plan (the tracepoints trace serves with a
/// perf event by their program's name, see placement.rs); with -v, how each
/// tracepoint is attached.
fn attach(
    session: &mut Session,
    skel: &skel::TraceSkel,
    placed: &Placement,
    verbose: bool,
) -> Result<()> {
    let (all, named_from, tp_progs) = (&placed.all, placed.named_from, &placed.tp_progs);
    session.attach(skel.object())?;
    if verbose {
        let mut s = String::new();
        for p in &all[..named_from] {
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
        for (i, name) in tp_progs {
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
    Ok(())
}

/// -v: each compiled program, its probe and instructions, and whether a gate
/// decides its hits.
fn print_programs(compiled: &[Compiled], all: &[common::Probe]) {
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

/// Whether any format prints a user symbol (%U).
pub(crate) fn uses_u(compiled: &[Compiled]) -> bool {
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
        Kind::Perf => return ProbeSpec::parse(&p.name, false),
    };
    // Messages about what the spec matched quote the spec alone (to the first
    // blank or '(', as the grammar reads it), not its filter, format and
    // arguments: they are about the probe.
    let t = p.text.trim_start();
    let spec = &t[..t
        .find(|c: char| c.is_whitespace() || c == '(')
        .unwrap_or(t.len())];
    Ok(ProbeSpec {
        raw: spec.to_string(),
        source,
        matcher: Matcher::glob(&pattern).map_err(bad)?,
    })
}
