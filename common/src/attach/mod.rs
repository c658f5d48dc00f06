//! Attaching a plan to a loaded object: each kind of probe through the
//! mechanism chosen for it, returns before entries, tracepoints through the
//! cheapest links the object and kernel allow, the descriptor limit checked first.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, Object, ProgramMut};

pub mod armed;
mod guardian;
pub mod links;
pub mod missed;
mod perf_events;
pub mod report;
mod tracepoints;
mod uprobe_groups;

use crate::diag::warn;
use crate::kernel::features;
use crate::kernel::functions::KernelFunc;
use crate::kernel::tracepoints::Tracepoint;
use crate::object::ProgKind;
use crate::plan::mechanism::Via;
use crate::plan::{perf_uprobes, syscall_event, Plan, Site};
use crate::probe::mode::Hook;
use crate::stop::{Phase, Stop};
use links::Attached;

/// Fails on a kernel function named exactly that the kernel did not attach (no
/// table was read to check it first), with the words a table check would give.
fn not_attached_by_name(kernel: &[(usize, &KernelFunc)], out: &Attached) -> Result<()> {
    for (i, f) in kernel {
        if out.is_attached(*i) {
            continue;
        }
        let reason = out
            .skipped
            .iter()
            .rev()
            .find(|s| s.label == f.name)
            .map(|s| s.reason.as_str());
        let missing =
            [libc::ESRCH, libc::ENOENT, libc::EINVAL].map(crate::sys::errno::errno_reason);
        match reason {
            Some(r) if !missing.iter().any(|m| m == r) => {
                bail!("\"{}\" could not be attached: {r}", f.name)
            }
            _ => bail!(crate::plan::not_traceable(&f.name)),
        }
    }
    Ok(())
}

/// How many file descriptors attaching `plan` holds with the `loaded`
/// program kinds: one per BPF link, and one more per perf event for the kinds
/// attached through perf events.
fn fds_needed(plan: &Plan, loaded: &HashSet<ProgKind>) -> usize {
    /// Links a refused multi set may be split into by bisection.
    const BISECT_SLACK: usize = 8;
    let mut binaries = HashSet::new();
    let mut n = 0;
    let mut kernel = 0;
    for p in &plan.probes {
        match &p.site {
            Site::Kernel(f) if plan.kernel_via == Some(Via::Single) => {
                n += 2 * f.addrs.len().max(1) * plan.hooks_per_call()
            }
            Site::Kernel(_) => kernel += 1,
            Site::User { binary, .. } if plan.user_via != Some(Via::Single) => {
                if binaries.insert(binary) {
                    n += 1 + BISECT_SLACK;
                }
            }
            // Grouped (see fds for groups below).
            Site::User { .. } => {}
            Site::Tracepoint(t) if syscall_event(t).is_some() => {}
            Site::Tracepoint(_) if loaded.contains(&ProgKind::RawTracepoint) => n += 1,
            Site::Tracepoint(_) => n += 2,
            // One uprobe per call site without uprobe_multi: at least two.
            Site::Usdt { .. } => n += 2,
            // A perf event and a link per CPU.
            Site::Perf(_) => n += 2 * perf_events::cpus(plan.cpu).len(),
        }
    }
    if kernel > 0 {
        n += 1 + BISECT_SLACK;
    }
    // Without uprobe_multi: a perf event and a link per uprobe group, of which a
    // binary has as many as functions share a page offset (+ bisection).
    if plan.user_via == Some(Via::Single) {
        let mut depth: BTreeMap<(&PathBuf, u64), usize> = BTreeMap::new();
        for p in &plan.probes {
            if let Site::User { binary, func } = &p.site {
                *depth.entry((binary, func.offset & 0xfff)).or_default() += 1;
            }
        }
        let mut per_binary: BTreeMap<&PathBuf, usize> = BTreeMap::new();
        for ((b, _), d) in depth {
            let m = per_binary.entry(b).or_default();
            *m = (*m).max(d);
        }
        n += per_binary
            .values()
            .map(|d| 2 * (d + BISECT_SLACK))
            .sum::<usize>();
    }
    // The raw sys_enter/sys_exit links, or one perf event pair per syscall event.
    for (kind, exit) in [
        (ProgKind::SyscallEnter, false),
        (ProgKind::SyscallExit, true),
    ] {
        let events = plan.count(|s| match s {
            Site::Tracepoint(t) => syscall_event(t).is_some_and(|(x, _)| x == exit),
            _ => false,
        });
        n += match (events, loaded.contains(&kind)) {
            (0, _) => 0,
            (_, true) => 1,
            (e, false) => 2 * e,
        };
    }
    n
}

/// Attaches every probe to the loaded object's programs. Stops early (keeping
/// what is attached, for the caller to drop) when `stop` is raised.
pub fn attach(plan: &Plan, obj: &Object, stop: &Stop) -> Result<Attached> {
    let loaded: HashSet<ProgKind> = obj
        .progs()
        .filter(|p| p.autoload())
        .filter_map(|p| p.section().to_str().and_then(ProgKind::of))
        .collect();
    crate::sys::fds::check_fd_limit(fds_needed(plan, &loaded), plan.fd_reserve)?;
    // A run that makes tracefs groups clears stale ones first (its own name may
    // be an earlier process's, which it would append to); every other run
    // sweeps on the side, so none waits for it.
    let makes_groups = plan.user_via == Some(Via::Single)
        && !perf_uprobes()
        && plan
            .probes
            .iter()
            .any(|p| matches!(p.site, Site::User { .. }));
    match makes_groups {
        true => links::remove_stale_uprobe_events(),
        false => sweep_stale_groups(),
    }
    stop.set_phase(Phase::Attaching);
    let out = attach_all(plan, obj, stop);
    stop.set_phase(Phase::Tracing);
    out
}

/// Whether a sweep was started, and whether it is over.
static SWEEP: (std::sync::Mutex<Option<bool>>, std::sync::Condvar) =
    (std::sync::Mutex::new(None), std::sync::Condvar::new());

/// Removes the tracefs uprobe groups of tracekit runs that are gone (killed
/// together with their guardian, see guardian.rs, or by an older version), on
/// a thread of its own: every run does it, so none is left for long, and no run
/// waits for it (reading uprobe_events waits for the kernel's event_mutex, which
/// a run removing many probes holds for seconds), neither while it starts nor
/// at its exit ([`hand_off_sweep`]). Only where tracefs is mounted: nothing can
/// be left where it is not.
pub fn sweep_stale_groups() {
    let (state, done) = &SWEEP;
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    if s.is_some() {
        return;
    }
    *s = Some(false);
    let spawned = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(move || {
            if crate::kernel::tracefs::if_mounted().is_some() {
                links::remove_stale_uprobe_events();
            }
            *state.lock().unwrap_or_else(|e| e.into_inner()) = Some(true);
            done.notify_all();
        });
    if spawned.is_err() {
        *s = None;
    }
}

/// The hidden sole argument that makes a tool's binary a sweeper: it removes
/// the stale groups ([`sweep_stale_groups`]) and exits. See [`hand_off_sweep`].
pub const SWEEP_FLAG: &str = "--sweep-stale-uprobe-groups";

/// At exit: a sweep [`sweep_stale_groups`] started that is still waiting for
/// the kernel is handed to a process of its own (this binary with
/// [`SWEEP_FLAG`]), so that the exit neither waits for it (a Ctrl-C under a
/// busy kernel is answered at once) nor cuts it short (a short run under a busy
/// kernel still removes what it found). The sweeper leaves our process group:
/// a Ctrl-C at the terminal is for the run, not for it.
pub fn hand_off_sweep() {
    use std::os::unix::process::CommandExt as _;
    use std::process::{Command, Stdio};
    let (state, _) = &SWEEP;
    if *state.lock().unwrap_or_else(|e| e.into_inner()) != Some(false) {
        return;
    }
    // /proc/self/exe: this very binary, even if its file was replaced since.
    let _ = Command::new("/proc/self/exe")
        .arg(SWEEP_FLAG)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
}

/// The sweeper's whole run (see [`hand_off_sweep`]).
pub fn sweep_now() {
    if crate::kernel::tracefs::if_mounted().is_some() {
        links::remove_stale_uprobe_events();
    }
}

fn attach_all(plan: &Plan, obj: &Object, stop: &Stop) -> Result<Attached> {
    // The loaded ones: a kind the plan did not load is not attached.
    let mut progs: BTreeMap<ProgKind, ProgramMut> = BTreeMap::new();
    for p in obj.progs_mut().filter(|p| p.autoload()) {
        // Programs a plan names are attached by name (attach_tracepoints).
        if p.name().to_str().is_some_and(|n| plan.names_program(n)) {
            continue;
        }
        if let Some(kind) = p.section().to_str().and_then(ProgKind::of) {
            progs.insert(kind, p);
        }
    }
    let prog = |k: ProgKind| {
        progs
            .get(&k)
            .with_context(|| format!("internal error: no loaded program for {k:?} probes"))
    };
    let mut out = Attached::new(plan.probes.len());
    out.skipped.extend(plan.skipped.iter().cloned());
    if stop.is_set() {
        return Ok(out); // stopped before attaching began
    }
    let pid = plan.pid;

    let kernel: Vec<(usize, &KernelFunc)> = plan
        .probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match &p.site {
            Site::Kernel(f) => Some((i, f)),
            _ => None,
        })
        .collect();
    if let Some(via) = plan.kernel_via {
        for (n, &kind) in ProgKind::for_via(via, true, plan.hooks).iter().enumerate() {
            let sites = later_hook_sites(&kernel, n, &out);
            let (p, hook) = (prog(kind)?, kind.hook());
            match via {
                Via::Session | Via::Multi => links::kprobe_multi(p, hook, &sites, stop, &mut out)?,
                Via::Single => links::kprobes(p, hook, &sites, stop, &mut out),
                Via::Trampoline => links::trampoline(p, &sites, &mut out),
            }
        }
        if plan.kernel_by_name && !stop.is_set() {
            not_attached_by_name(&kernel, &out)?;
        }
    }

    let mut by_binary: BTreeMap<&PathBuf, Vec<(usize, links::UserSite)>> = BTreeMap::new();
    for (i, p) in plan.probes.iter().enumerate() {
        if let Site::User { binary, func } = &p.site {
            by_binary
                .entry(binary)
                .or_default()
                .push((i, (i, &func.name, func.offset)));
        }
    }
    if let Some(via) = plan.user_via {
        let index = obj.maps().find(|m| m.name() == "uprobe_groups");
        // Hooks go in tracefs uprobe groups (fast to detach) where the
        // object can tell the functions of a group apart (its uprobe_groups
        // map for entries; returns paired with their entries by stack
        // pointer: trace, funclatency), or need not (entries only).
        let may_group = |hook| {
            !perf_uprobes()
                && (index.is_some()
                    || (hook == Hook::Entry && plan.hooks == crate::probe::mode::Hooks::Entry))
        };
        for (binary, sites) in by_binary {
            for (n, &kind) in ProgKind::for_via(via, false, plan.hooks).iter().enumerate() {
                let sites: Vec<links::UserSite> = later_hook_sites(&sites, n, &out)
                    .into_iter()
                    .map(|(_, s)| s)
                    .collect();
                let (p, hook) = (prog(kind)?, kind.hook());
                match via {
                    Via::Single if may_group(hook) => {
                        let rest = links::uprobe_groups(
                            p,
                            hook,
                            index.as_ref(),
                            pid,
                            binary,
                            &sites,
                            stop,
                            &mut out,
                        );
                        if !rest.is_empty() {
                            links::uprobes(p, hook, pid, binary, &rest, stop, &mut out);
                        }
                    }
                    Via::Single => links::uprobes(p, hook, pid, binary, &sites, stop, &mut out),
                    _ => links::uprobe_multi(p, hook, pid, binary, &sites, stop, &mut out),
                }
            }
        }
    }

    let tps: Vec<(usize, &Tracepoint, &str)> = plan
        .probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match &p.site {
            Site::Tracepoint(t) => Some((i, t, p.label.as_str())),
            _ => None,
        })
        .collect();
    if !tps.is_empty() {
        attach_tracepoints(plan, &progs, &tps, obj, stop, &mut out)?;
    }

    let usdts: Vec<(usize, &std::path::Path, &str, &str)> = plan
        .probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match &p.site {
            Site::Usdt { binary, probe } => Some((
                i,
                binary.as_path(),
                probe.provider.as_str(),
                probe.name.as_str(),
            )),
            _ => None,
        })
        .collect();
    if !usdts.is_empty() {
        links::usdts(prog(ProgKind::Usdt)?, pid, &usdts, stop, &mut out);
    }

    let perf: Vec<(usize, &crate::probe::perf::PerfSource)> = plan
        .probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match &p.site {
            Site::Perf(s) => Some((i, s)),
            _ => None,
        })
        .collect();
    if !perf.is_empty() {
        perf_events::attach(prog(ProgKind::PerfEvent)?, &perf, plan.cpu, stop, &mut out)?;
    }

    // A -p process that exited during the attach fails the probes after it
    // (ESRCH): say that, not the first reason in the list of skips.
    if let Some(pid) = pid.filter(|&p| crate::sys::process::exited(p)) {
        bail!("no process with PID {pid}: it exited while the probes were being attached");
    }
    if out.probes_attached() == 0 && !stop.is_set() {
        match out.skipped.is_empty() {
            false => bail!(
                "nothing could be attached: {}",
                report::listed(&out.skipped)
            ),
            true => bail!("nothing to attach"),
        }
    }
    Ok(out)
}

/// Tracepoints: syscall events through the raw sys_enter/sys_exit links, other
/// tracepoints through raw tracepoint links, where the object has those
/// programs loaded; perf-event tracepoints for the rest and for any that the
/// kernel refuses as raw tracepoints (before Linux 6.10, say).
fn attach_tracepoints(
    plan: &Plan,
    progs: &BTreeMap<ProgKind, ProgramMut>,
    tps: &[(usize, &Tracepoint, &str)],
    obj: &Object,
    stop: &Stop,
    out: &mut Attached,
) -> Result<()> {
    let mut syscalls = Vec::new();
    let mut raw = Vec::new();
    let mut clones = Vec::new();
    let mut perf = Vec::new();
    // Tracepoints whose tool names their program (trace: one per record shape).
    let mut named: BTreeMap<&str, Vec<(usize, &str, &str, &str)>> = BTreeMap::new();
    let cookie_program = progs.get(&ProgKind::RawTracepoint);
    // Probe i on the nth clone of the cookie-less program when slots[n] is i
    // (slots ascending).
    let slots = if progs.contains_key(&ProgKind::RawTracepointClone) {
        crate::object::raw_tp_clones(plan)
    } else {
        Vec::new()
    };
    for &(i, t, label) in tps {
        let raw_ok = plan.raw_attachable.get(i).copied().unwrap_or(false);
        let sys = syscall_event(t).filter(|(exit, _)| {
            progs.contains_key(if *exit {
                &ProgKind::SyscallExit
            } else {
                &ProgKind::SyscallEnter
            })
        });
        if let (Some(name), false) = (plan.tracepoint_program(i), raw_ok) {
            named
                .entry(name)
                .or_default()
                .push((i, t.category.as_str(), t.event.as_str(), label));
        } else if let Some((exit, nr)) = sys {
            syscalls.push(links::SyscallSite { probe: i, nr, exit });
        } else if cookie_program.is_some() && raw_ok {
            raw.push((i, t, label));
        } else if let Ok(slot) = slots.binary_search(&i) {
            clones.push((slot, (i, t, label)));
        } else {
            perf.push((i, t, label));
        }
    }
    if !syscalls.is_empty() && !stop.is_set() {
        let map = obj
            .maps()
            .find(|m| m.name() == "syscall_probes")
            .context("internal error: the BPF object has no syscall_probes map")?;
        let refused = links::syscalls(
            progs.get(&ProgKind::SyscallEnter),
            progs.get(&ProgKind::SyscallExit),
            &map,
            &syscalls,
            crate::object::remember_syscall_nrs(plan),
            out,
        );
        for (s, why) in refused {
            let &(i, t, l) = tps.iter().find(|(i, _, _)| *i == s.probe).expect("a site");
            // A tool that loads no perf-event program for these (trace,
            // whose programs are large to verify) skips them.
            match progs.contains_key(&ProgKind::Tracepoint) {
                true => perf.push((i, t, l)),
                false => out.skip_why(l, why),
            }
        }
    }
    if let (Some(prog), false) = (cookie_program, raw.is_empty()) {
        // Before 6.10 a link takes no cookie: only for a program that
        // serves every tracepoint alike.
        let cookie = features::raw_tp_cookie();
        let sites: Vec<(usize, &str)> =
            raw.iter().map(|(i, t, _)| (*i, t.event.as_str())).collect();
        let refused = links::raw_tracepoints(prog, cookie, &sites, stop, out);
        perf.extend(refused.into_iter().map(|k| raw[k]));
    }
    if let (Some(prog), false) = (progs.get(&ProgKind::RawTracepointClone), clones.is_empty()) {
        let slot_map = obj
            .maps()
            .find(|m| m.name() == ".rodata.raw_tp")
            .context("internal error: the BPF object has no .rodata.raw_tp map")?;
        let sites: Vec<links::CloneSite> = clones
            .iter()
            .map(|&(slot, (i, t, _))| links::CloneSite {
                probe: i,
                name: &t.event,
                slot,
            })
            .collect();
        let slot_map = std::os::fd::AsFd::as_fd(&slot_map);
        let refused = links::raw_tracepoint_clones(prog, slot_map, &sites, stop, out);
        perf.extend(refused.into_iter().map(|k| clones[k].1));
    }
    for (name, sites) in &named {
        if stop.is_set() {
            break;
        }
        let prog = obj
            .progs_mut()
            .find(|p| p.name().to_str() == Some(name))
            .with_context(|| format!("internal error: no program {name}"))?;
        links::tracepoints(&prog, sites, stop, out);
    }
    if !perf.is_empty() {
        let sites: Vec<(usize, &str, &str, &str)> = perf
            .iter()
            .map(|(i, t, l)| (*i, t.category.as_str(), t.event.as_str(), *l))
            .collect();
        match progs.get(&ProgKind::Tracepoint) {
            Some(prog) => links::tracepoints(prog, &sites, stop, out),
            // A tool that gave the plan only tracepoints for raw links
            // (trace) loads no perf-event program for them.
            None if plan.raw_tracepoints != crate::plan::RawTracepoints::No => {
                for (_, _, _, label) in sites {
                    out.skip_why(
                        label,
                        "the kernel refused it as a raw tracepoint link".into(),
                    );
                }
            }
            None => bail!("internal error: no loaded program for Tracepoint probes"),
        }
    }
    Ok(())
}

/// [`attach`], then what every tool reports: with `debug` the links and
/// every skipped probe (stderr), else a one-line warning about skipped probes.
pub fn attach_and_report(plan: &Plan, obj: &Object, stop: &Stop, debug: bool) -> Result<Attached> {
    let attached = attach(plan, obj, stop)?;
    if debug {
        crate::diag::stderr(&attached.describe());
    }
    let noun = match plan.only_tracepoints() {
        true => "tracepoint",
        false => "probe",
    };
    if let Some(w) = crate::attach::report::skipped_warning(noun, &attached.skipped) {
        warn(&w);
    }
    // Every probe is in: all start counting now (bpf/armed.h).
    let mut attached = attached;
    attached.arm(armed::Armed::of(obj));
    Ok(attached)
}

/// The sites a plan's `n`th hook attaches: all of them for the first; for a
/// later one (the entry, after the return) only those the first attached, so no
/// entry is recorded whose return is not hooked.
fn later_hook_sites<T: Clone>(sites: &[(usize, T)], n: usize, out: &Attached) -> Vec<(usize, T)> {
    sites
        .iter()
        .filter(|(i, _)| n == 0 || out.is_attached(*i))
        .cloned()
        .collect()
}
