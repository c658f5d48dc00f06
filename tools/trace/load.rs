//! Loading the object for a run: the ring buffer's size, the .rodata globals
//! (filters, -Z/-K/-U, a one-probe run's gate), map sizes and which tracepoint
//! programs load; then the spec tables (`specs`, `probes`) filled with the
//! compiled programs.

use anyhow::{Context, Result};
use common::ahead::OpenAhead;
use common::events;
use common::session::Session;
use libbpf_rs::skel::OpenSkel;
use libbpf_rs::{MapCore, MapFlags};

use crate::compile::{self, Compiled};
use crate::placement::Placement;
use crate::{bytes_of, skel, uses_u, Args};

/// The ring buffer's size unless -b or `TRACEKIT_RING_BYTES` says otherwise.
const TRACE_RING_BYTES: u32 = 16 << 20;

/// The ring buffer's size: -b pages per CPU, else `TRACEKIT_RING_BYTES`, else
/// TRACE_RING_BYTES.
pub fn ring_bytes(args: &Args) -> Result<u32> {
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
    Ok(ring)
}

/// How the object is set up, besides the plan and the compiled programs.
pub struct How {
    /// BPF may read kernel memory (not under lockdown=confidentiality).
    pub kernel_reads: bool,
    /// The events ring's size.
    pub ring: u32,
    /// -U stacks are walked by unwind tables (bpf/unwind.h).
    pub walk_tables: bool,
}

/// Opens (or takes the opened-ahead) object, configures it for the run and
/// loads it.
pub fn load(
    ahead: OpenAhead<skel::TraceSkelBuilder>,
    session: &Session,
    args: &Args,
    compiled: &[Compiled],
    placed: &Placement,
    how: How,
) -> Result<skel::TraceSkel<'static>> {
    let How {
        kernel_reads,
        ring,
        walk_tables,
    } = how;
    let (all, tp_progs) = (&placed.all, &placed.tp_progs);
    let plan = &session.plan;
    let self_tgid = if args.include_self {
        0
    } else {
        std::process::id()
    };
    let json_out = session.json;
    // A one-probe run's lone gated spec: its gate goes in .rodata
    // (bpf/trace.bpf.c's the_gate), entry or return.
    let lone_gate = match (&all[..], compiled) {
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
        rodata.ustack_build_id = args.user_stack && !walk_tables;
        // Or walked by unwind tables, as addresses (bpf/unwind.h).
        rodata.unwind_tables = walk_tables;
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
        rodata.events_wakeup_bytes = if args.user_stack || uses_u(compiled) {
            0
        } else {
            events::wakeup_bytes(ring)
        };
    });
    open.maps
        .specs
        .set_max_entries(compiled.len().max(1) as u32)?;
    open.maps.probes.set_max_entries(all.len().max(1) as u32)?;
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        if name.starts_with("trace_tp_") {
            prog.set_autoload(tp_progs.iter().any(|(_, n)| *n == name));
        }
    }
    open.maps
        .stats
        .set_max_entries((compile::STATS * compiled.len()).max(1) as u32)?;
    open.maps.events.set_max_entries(ring)?;
    let skel = open.load().context("loading the BPF programs")?;
    Ok(skel)
}

/// Writes each compiled program to `specs` and each probe's specs to `probes`.
pub fn fill_tables(skel: &skel::TraceSkel, compiled: &[Compiled], nprobes: usize) -> Result<()> {
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
    let mut lists: Vec<Vec<u32>> = vec![Vec::new(); nprobes];
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
    Ok(())
}
