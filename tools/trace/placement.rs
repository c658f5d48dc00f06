//! Where each probe goes: which specs serve each of the plan's probes (and
//! their `func+offset`), and for tracepoints, whether the plan attaches them
//! (raw links: syscall events whose record the raw sys_enter/sys_exit programs
//! rebuild, tracepoints whose specs read no field) or a perf event does, and
//! then the program class for the record's size, which the plan attaches by
//! name. Probe indexes (attach cookies): the others first, then those
//! tracepoints.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Result};
use common::escape;
use common::tracepoints::Tracepoint;
use common::{syscall_event, Plan, RawTracepoints, Site};

use crate::compile::{Compiled, MAX_SPECS};
use crate::grammar;
use crate::tp_format::{self, format_of, TpField};

/// The probes as placed.
pub struct Placement {
    /// Every probe, the plan's first: a probe's index is its attach cookie.
    pub all: Vec<common::Probe>,
    /// Where the tracepoints on a perf event begin in `all` (those before it take
    /// the links the plan chooses by kind).
    pub named_from: usize,
    /// Those tracepoints: (probe index, the program the plan attaches by name).
    pub tp_progs: Vec<(usize, String)>,
}

/// Refuses a probe served by more specs than the BPF side's MAX_SPECS.
pub fn check_specs_per_probe(per_probe: &[Vec<usize>], plan: &Plan) -> Result<()> {
    for (i, l) in per_probe.iter().enumerate() {
        if l.len() > MAX_SPECS {
            bail!(
                "{} probes on {}: at most {} per function, event or USDT probe",
                l.len(),
                plan.probes[i].label,
                MAX_SPECS
            );
        }
    }
    Ok(())
}

/// Orders `probes` (`plan`'s, taken out of it): those on links the plan chooses
/// by kind first, then the tracepoints on a perf event, each with its record
/// size's program; renumbers `compiled`'s probes to match, and gives the plan
/// back all of them with those program names.
pub fn place(
    plan: &mut Plan,
    probes: Vec<common::Probe>,
    compiled: &mut [Compiled],
    formats: &mut HashMap<String, Vec<TpField>>,
    kernel_reads: bool,
) -> Result<Placement> {
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
                    format_of(t, formats).is_ok_and(|f| tp_format::syscall_record(f, exit))
                });
            here[i] = !rebuilt && !raw[i];
        }
    }
    // The plan's probes first (in their order), then the others.
    let mut order: Vec<usize> = (0..probes.len()).collect();
    order.sort_by_key(|&i| here[i]);
    let named_from = here.iter().filter(|&&h| !h).count();
    let mut new_index = vec![0; probes.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    for c in compiled.iter_mut() {
        c.probe = new_index[c.probe];
    }
    let all: Vec<common::Probe> = order.iter().map(|&i| probes[i].clone()).collect();
    let tp_progs = tracepoint_programs(
        &all[named_from..],
        named_from,
        compiled,
        formats,
        kernel_reads,
    )?;
    // Every probe goes to the plan, which attaches the tracepoints this run
    // serves with a program per record shape by that program's name.
    let mut programs = vec![None; all.len()];
    for (i, name) in &tp_progs {
        programs[*i] = Some(name.clone());
    }
    plan.set_probes(
        all.clone(),
        order.iter().map(|&i| raw[i]).collect(),
        raw_how,
        programs,
    );
    Ok(Placement {
        all,
        named_from,
        tp_progs,
    })
}

/// Which specs serve each of the plan's probes (`indexes`: the probes of each
/// spec), with their offsets applied. Probes no spec keeps (another USDT
/// provider's) are dropped from the plan.
pub fn specs_per_probe(
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
