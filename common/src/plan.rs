//! A plan: a run's probe specs expanded into concrete probes, the attach mode chosen
//! for them, and the programs of a tool's BPF object that serve each kind.
//!
//! Probe `i` of a plan is attached with cookie `i`, so BPF programs index their
//! per-probe state by `bpf_get_attach_cookie()`.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::rc::Rc;

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, Object, OpenObject, ProgramMut};

use crate::attach::{self, Attached, Skipped};
use crate::cli::warn;
use crate::elf::{self, Binary};
use crate::features;
use crate::kfuncs::{KernelFunc, KernelFuncs};
use crate::output::escape_str;
use crate::run::{Phase, Stop};
use crate::spec::{ProbeSpec, Source};
use crate::system::{self, PidNs};
use crate::tracepoints::{self, Tracepoint};
use crate::ufuncs::{self, UsdtProbe, UserFunc};

/// How kernel and user functions are attached (`--attach-mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AttachMode {
    /// The best the kernel has: session links for entry+return tools, else one
    /// multi link per kind (and hook), else one probe per function.
    #[default]
    Auto,
    /// Session links (kprobe.session, uprobe.session), failing if the kernel
    /// lacks them; only for tools that hook returns.
    Session,
    /// kprobe_multi / uprobe_multi links (entry and return links apart), failing
    /// if the kernel lacks them.
    Multi,
    /// One perf-event probe per function (and hook).
    Single,
}

impl std::str::FromStr for AttachMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AttachMode::Auto),
            "session" => Ok(AttachMode::Session),
            "multi" => Ok(AttachMode::Multi),
            "single" => Ok(AttachMode::Single),
            _ => Err(format!(
                "'{s}' is not an attach mode (auto, session, multi, single)"
            )),
        }
    }
}

/// Which points of a function a tool hooks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Hooks {
    /// Function entry only (counting tools).
    #[default]
    Entry,
    /// Entry and return of each call, paired (latency tools).
    EntryAndReturn,
}

/// The mechanism chosen for one kind of function (kernel or user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// One session link: one program runs at entry and return, with a per-call
    /// cookie (kprobe.session 6.10+, uprobe.session 6.13+).
    Session,
    /// kprobe_multi / uprobe_multi links: one for entries, one for returns.
    Multi,
    /// One perf-event probe per function and hook.
    Single,
    /// fentry/fexit through a BPF trampoline, for a single kernel function.
    Trampoline,
}

impl Via {
    fn describe(self, kernel: bool, hooks: Hooks) -> &'static str {
        match (self, kernel, hooks) {
            (Via::Session, true, _) => "kprobe.session",
            (Via::Session, false, _) => "uprobe.session",
            (Via::Multi, true, Hooks::Entry) => "kprobe_multi",
            (Via::Multi, true, Hooks::EntryAndReturn) => "kprobe_multi + kretprobe_multi",
            (Via::Multi, false, Hooks::Entry) => "uprobe_multi",
            (Via::Multi, false, Hooks::EntryAndReturn) => "uprobe_multi + uretprobe_multi",
            (Via::Single, true, Hooks::Entry) => "single kprobes",
            (Via::Single, true, Hooks::EntryAndReturn) => "single kprobes + kretprobes",
            (Via::Single, false, Hooks::Entry) => "single uprobes",
            (Via::Single, false, Hooks::EntryAndReturn) => "single uprobes + uretprobes",
            (Via::Trampoline, _, Hooks::Entry) => "fentry",
            (Via::Trampoline, _, Hooks::EntryAndReturn) => "fentry + fexit",
        }
    }
}

#[derive(Debug, Clone)]
pub enum Site {
    Kernel(KernelFunc),
    User { binary: PathBuf, func: UserFunc },
    Tracepoint(Tracepoint),
    Usdt { binary: PathBuf, probe: UsdtProbe },
}

#[derive(Debug, Clone)]
pub struct Probe {
    /// What summaries print: the function, `category:event`, or USDT probe name.
    pub label: String,
    pub site: Site,
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub pid: Option<u32>,
    pub mode: AttachMode,
    pub hooks: Hooks,
    /// The tool's object has fentry/fexit programs: use them for a plan of a
    /// single kernel function when the kernel allows it.
    pub trampoline: bool,
}

/// The kinds of BPF program a plan needs, named by their ELF section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProgKind {
    KprobeMulti,
    KretprobeMulti,
    KprobeSession,
    Kprobe,
    Kretprobe,
    Fentry,
    Fexit,
    UprobeMulti,
    UretprobeMulti,
    UprobeSession,
    Uprobe,
    Uretprobe,
    Tracepoint,
    /// Raw tracepoint links with cookies (Linux 6.10+), for tools whose BPF object
    /// has such a program (`SEC("raw_tp")`); others use perf-event tracepoints.
    RawTracepoint,
    /// The raw `sys_enter` / `sys_exit` tracepoints serving every
    /// syscalls:sys_enter_* / sys_exit_* event (`SEC("raw_tp/sys_enter")`, ...).
    SyscallEnter,
    SyscallExit,
    Usdt,
}

impl ProgKind {
    fn of(prog_section: &str) -> Option<Self> {
        match prog_section {
            "raw_tp/sys_enter" => return Some(ProgKind::SyscallEnter),
            "raw_tp/sys_exit" => return Some(ProgKind::SyscallExit),
            "raw_tp" | "raw_tracepoint" => return Some(ProgKind::RawTracepoint),
            _ => {}
        }
        Some(match prog_section.split('/').next()? {
            "kprobe.multi" => ProgKind::KprobeMulti,
            "kretprobe.multi" => ProgKind::KretprobeMulti,
            "kprobe.session" => ProgKind::KprobeSession,
            "kprobe" => ProgKind::Kprobe,
            "kretprobe" => ProgKind::Kretprobe,
            "fentry" => ProgKind::Fentry,
            "fexit" => ProgKind::Fexit,
            "uprobe.multi" => ProgKind::UprobeMulti,
            "uretprobe.multi" => ProgKind::UretprobeMulti,
            "uprobe.session" => ProgKind::UprobeSession,
            "uprobe" => ProgKind::Uprobe,
            "uretprobe" => ProgKind::Uretprobe,
            "tracepoint" | "tp" => ProgKind::Tracepoint,
            "usdt" => ProgKind::Usdt,
            _ => return None,
        })
    }

    /// The programs that serve kernel or user functions attached `via`, in
    /// attach order: returns before entries, so that no entry is recorded
    /// whose return would go unseen.
    fn for_via(via: Via, kernel: bool, hooks: Hooks) -> &'static [ProgKind] {
        use ProgKind::*;
        let ret = hooks == Hooks::EntryAndReturn;
        match (via, kernel, ret) {
            (Via::Session, true, _) => &[KprobeSession],
            (Via::Session, false, _) => &[UprobeSession],
            (Via::Multi, true, false) => &[KprobeMulti],
            (Via::Multi, true, true) => &[KretprobeMulti, KprobeMulti],
            (Via::Multi, false, false) => &[UprobeMulti],
            (Via::Multi, false, true) => &[UretprobeMulti, UprobeMulti],
            (Via::Single, true, false) => &[Kprobe],
            (Via::Single, true, true) => &[Kretprobe, Kprobe],
            (Via::Single, false, false) => &[Uprobe],
            (Via::Single, false, true) => &[Uretprobe, Uprobe],
            (Via::Trampoline, _, false) => &[Fentry],
            (Via::Trampoline, _, true) => &[Fexit, Fentry],
        }
    }

    /// How an attach with this program treats the site: entry, return or session.
    fn hook(self) -> attach::Hook {
        use ProgKind::*;
        match self {
            KretprobeMulti | Kretprobe | UretprobeMulti | Uretprobe | Fexit => attach::Hook::Return,
            KprobeSession | UprobeSession => attach::Hook::Session,
            _ => attach::Hook::Entry,
        }
    }
}

/// Writes a [`Filter`] into a skeleton's `.rodata` (the globals of bpf/filter.h).
#[macro_export]
macro_rules! set_filter {
    ($rodata:expr, $filter:expr) => {{
        let (r, f) = ($rodata, $filter);
        r.filter_tgid = f.tgid;
        r.filter_pidns_dev = f.pidns_dev;
        r.filter_pidns_ino = f.pidns_ino;
        r.filter_cpu = f.cpu;
    }};
}

/// Opens a tool's skeleton for a plan: programs configured for the plan's attach
/// kinds and the PID/CPU filters written; `|rodata| { .. }` sets the tool's own
/// read-only globals. Evaluates to the open skeleton, ready for map sizing and load.
#[macro_export]
macro_rules! open_skeleton {
    ($builder:ty, $obj:expr, $plan:expr, $cpu:expr, |$rodata:ident| $body:block) => {{
        let mut open = <$builder>::default()
            .open($obj)
            .context("opening the BPF object")?;
        $plan.configure(open.open_object_mut())?;
        let $rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .context("BPF object has no .rodata")?;
        $crate::set_filter!(&mut *$rodata, $plan.filter($cpu));
        $body
        open
    }};
}

/// Values for the filters in bpf/filter.h.
#[derive(Debug, Clone, Copy)]
pub struct Filter {
    pub tgid: u32,
    pub pidns_dev: u64,
    pub pidns_ino: u64,
    pub cpu: i32,
}

pub struct Plan {
    pub probes: Vec<Probe>,
    /// Per spec: the spec text and how many probes it matched.
    pub matches: Vec<(String, usize)>,
    pub pid: Option<u32>,
    pub hooks: Hooks,
    /// How kernel functions are attached (`None`: the plan has none).
    pub kernel_via: Option<Via>,
    /// How user functions are attached (`None`: the plan has none).
    pub user_via: Option<Via>,
    /// Matching user functions that are not probed, with the reason (reported with
    /// the probes that fail to attach).
    pub skipped: Vec<Skipped>,
    /// File descriptors to keep free beyond the probes' own (symbolization opens
    /// files after attaching); checked against RLIMIT_NOFILE before attaching.
    pub fd_reserve: usize,
    kernel_table: Option<(&'static str, usize, usize)>,
}

impl Plan {
    /// Expands `specs`; fails naming the spec that matched nothing.
    pub fn build(specs: &[ProbeSpec], opts: &Options) -> Result<Plan> {
        if let Some(pid) = opts.pid {
            system::check_pid(pid)?;
        }
        let mut kfuncs: Option<KernelFuncs> = None;
        let mut binaries = Binaries::default();
        let mut skipped = Vec::new();
        let mut probes = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut matches = Vec::new();
        for spec in specs {
            let found = expand(spec, opts.pid, &mut kfuncs, &mut binaries, &mut skipped)?;
            matches.push((spec.raw.clone(), found.len()));
            for p in found {
                match seen.entry(site_key(&p.site)) {
                    Entry::Vacant(v) => {
                        v.insert(probes.len());
                        probes.push(p);
                    }
                    // Two patterns name one user function: show its preferred name.
                    Entry::Occupied(o) => {
                        let old: &mut Probe = &mut probes[*o.get()];
                        if let (Site::User { func: new, .. }, Site::User { func: was, .. }) =
                            (&p.site, &old.site)
                        {
                            if new.better_name_than(was) {
                                *old = p;
                            }
                        }
                    }
                }
            }
        }
        let kernel_via = choose_kernel_via(&probes, opts)?;
        let user_via = choose_user_via(&probes, opts)?;
        Ok(Plan {
            kernel_table: kfuncs.map(|k| (k.source, k.len(), k.removed)),
            probes,
            matches,
            pid: opts.pid,
            hooks: opts.hooks,
            kernel_via,
            user_via,
            skipped,
            fd_reserve: DEFAULT_FD_RESERVE,
        })
    }

    /// The BPF program kinds this plan attaches.
    pub fn prog_kinds(&self) -> Vec<ProgKind> {
        let mut kinds: Vec<ProgKind> = self
            .probes
            .iter()
            .flat_map(|p| match p.site {
                Site::Kernel(_) => self
                    .kernel_via
                    .map_or(&[][..], |v| ProgKind::for_via(v, true, self.hooks)),
                Site::User { .. } => self
                    .user_via
                    .map_or(&[][..], |v| ProgKind::for_via(v, false, self.hooks)),
                Site::Tracepoint(_) => &[ProgKind::Tracepoint][..],
                Site::Usdt { .. } => &[ProgKind::Usdt][..],
            })
            .copied()
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }

    /// Loads only the programs this plan needs: a kprobe.multi program would fail
    /// to load on a kernel without that attach type, and unused ones cost verifier
    /// time. Raw tracepoint programs are loaded when the object has them and the
    /// kernel takes them; perf-event tracepoints stay loaded as their fallback.
    pub fn configure(&self, obj: &mut OpenObject) -> Result<()> {
        let present: HashSet<ProgKind> = obj
            .progs()
            .filter_map(|p| p.section().to_str().and_then(ProgKind::of))
            .collect();
        let mut need = self.prog_kinds();
        need.extend(self.raw_tracepoint_kinds(&present));
        let mut have = HashSet::new();
        // A trampoline is bound to its function when it is loaded.
        let target = self.probes.iter().find_map(|p| match &p.site {
            Site::Kernel(f) if self.kernel_via == Some(Via::Trampoline) => Some(f.name.clone()),
            _ => None,
        });
        for mut prog in obj.progs_mut() {
            let Some(kind) = prog.section().to_str().and_then(ProgKind::of) else {
                continue;
            };
            let on = need.contains(&kind);
            prog.set_autoload(on);
            if on {
                have.insert(kind);
                if matches!(kind, ProgKind::Fentry | ProgKind::Fexit) {
                    prog.set_attach_target(0, target.clone())
                        .context("setting the fentry/fexit target")?;
                }
            }
        }
        if let Some(missing) = need.iter().find(|k| !have.contains(k)) {
            bail!("internal error: the BPF object has no program for {missing:?} probes");
        }
        let user = self.count(|s| matches!(s, Site::User { .. }));
        for mut map in obj.maps_mut() {
            if map.name() == "uprobe_groups" {
                map.set_max_entries(user.max(1) as u32)?;
            }
            // Threads in a syscall at once; only needed to remember numbers.
            if map.name() == "syscall_nrs" && !self.remember_syscall_nrs() {
                map.set_max_entries(1)?;
            }
        }
        Ok(())
    }

    /// The raw tracepoint programs worth loading for this plan's tracepoints, of
    /// those the object has (`present`).
    fn raw_tracepoint_kinds(&self, present: &HashSet<ProgKind>) -> Vec<ProgKind> {
        let mut kinds = Vec::new();
        let tps = || {
            self.probes.iter().filter_map(|p| match &p.site {
                Site::Tracepoint(t) => Some(t),
                _ => None,
            })
        };
        let syscalls = |exit: bool| tps().any(|t| syscall_event(t).is_some_and(|(x, _)| x == exit));
        let (enter, exit) = (syscalls(false), syscalls(true));
        if present.contains(&ProgKind::SyscallExit) && exit {
            kinds.push(ProgKind::SyscallExit);
        }
        // Without kernel reads, sys_enter remembers numbers for sys_exit.
        if present.contains(&ProgKind::SyscallEnter)
            && (enter || (kinds.contains(&ProgKind::SyscallExit) && !features::kernel_reads()))
        {
            kinds.push(ProgKind::SyscallEnter);
        }
        if present.contains(&ProgKind::RawTracepoint)
            && tps().any(|t| t.category != "syscalls")
            && features::raw_tp_cookie()
        {
            kinds.push(ProgKind::RawTracepoint);
        }
        kinds
    }

    /// Whether the syscall exit link needs sys_enter to remember syscall numbers
    /// (the BPF program cannot read them from the registers): tools set their
    /// `remember_nr` switch from it.
    pub fn remember_syscall_nrs(&self) -> bool {
        !features::kernel_reads()
            && self.probes.iter().any(|p| match &p.site {
                Site::Tracepoint(t) => syscall_event(t).is_some_and(|(exit, _)| exit),
                _ => false,
            })
    }

    /// Filter values for bpf/filter.h: the target PID (in our pid namespace when we
    /// run in a container) and CPU.
    pub fn filter(&self, cpu: Option<u32>) -> Filter {
        let ns: Option<PidNs> = self.pid.and_then(|_| system::own_pidns());
        Filter {
            tgid: self.pid.unwrap_or(0),
            pidns_dev: ns.map_or(0, |n| n.dev),
            pidns_ino: ns.map_or(0, |n| n.ino),
            cpu: cpu.map_or(-1, |c| c as i32),
        }
    }

    /// Attaches every probe to the loaded object's programs. Stops early (keeping
    /// what is attached, for the caller to drop) when `stop` is raised.
    pub fn attach(&self, obj: &Object, stop: &Stop) -> Result<Attached> {
        let loaded: HashSet<ProgKind> = obj
            .progs()
            .filter(|p| p.autoload())
            .filter_map(|p| p.section().to_str().and_then(ProgKind::of))
            .collect();
        system::check_fd_limit(self.fds_needed(&loaded), self.fd_reserve)?;
        stop.set_phase(Phase::Attaching);
        let out = self.attach_all(obj, stop);
        stop.set_phase(Phase::Tracing);
        out
    }

    fn attach_all(&self, obj: &Object, stop: &Stop) -> Result<Attached> {
        let progs: BTreeMap<ProgKind, ProgramMut> = obj
            .progs_mut()
            .filter_map(|p| {
                let kind = p.section().to_str().and_then(ProgKind::of)?;
                Some((kind, p))
            })
            .collect();
        let prog = |k: ProgKind| {
            progs
                .get(&k)
                .with_context(|| format!("internal error: no loaded program for {k:?} probes"))
        };
        let mut out = Attached::new(self.probes.len());
        out.skipped.extend(self.skipped.iter().cloned());
        if stop.is_set() {
            return Ok(out); // stopped before attaching began
        }
        let pid = self.pid;

        let kernel: Vec<(usize, &KernelFunc)> = self
            .probes
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match &p.site {
                Site::Kernel(f) => Some((i, f)),
                _ => None,
            })
            .collect();
        if let Some(via) = self.kernel_via {
            for (n, &kind) in ProgKind::for_via(via, true, self.hooks).iter().enumerate() {
                let sites = later_hook_sites(&kernel, n, &out);
                let (p, hook) = (prog(kind)?, kind.hook());
                match via {
                    Via::Session | Via::Multi => {
                        attach::kprobe_multi(p, hook, &sites, stop, &mut out)?
                    }
                    Via::Single => attach::kprobes(p, hook, &sites, stop, &mut out),
                    Via::Trampoline => attach::trampoline(p, &sites, &mut out),
                }
            }
        }

        let mut by_binary: BTreeMap<&PathBuf, Vec<(usize, attach::UserSite)>> = BTreeMap::new();
        for (i, p) in self.probes.iter().enumerate() {
            if let Site::User { binary, func } = &p.site {
                by_binary
                    .entry(binary)
                    .or_default()
                    .push((i, (i, &func.name, func.offset)));
            }
        }
        if let Some(via) = self.user_via {
            for (binary, sites) in by_binary {
                for (n, &kind) in ProgKind::for_via(via, false, self.hooks).iter().enumerate() {
                    let sites: Vec<attach::UserSite> = later_hook_sites(&sites, n, &out)
                        .into_iter()
                        .map(|(_, s)| s)
                        .collect();
                    let (p, hook) = (prog(kind)?, kind.hook());
                    match via {
                        // Entry-only tools take tracefs uprobe groups (fast to
                        // detach); tools that pair calls need each function's
                        // own cookie.
                        Via::Single if hook == attach::Hook::Entry && !perf_uprobes() => {
                            let index = obj.maps().find(|m| m.name() == "uprobe_groups");
                            let rest = attach::uprobe_groups(
                                p,
                                index.as_ref(),
                                pid,
                                binary,
                                &sites,
                                stop,
                                &mut out,
                            );
                            if !rest.is_empty() {
                                attach::uprobes(p, hook, pid, binary, &rest, stop, &mut out);
                            }
                        }
                        Via::Single => {
                            attach::uprobes(p, hook, pid, binary, &sites, stop, &mut out)
                        }
                        _ => attach::uprobe_multi(p, hook, pid, binary, &sites, stop, &mut out),
                    }
                }
            }
        }

        let tps: Vec<(usize, &Tracepoint, &str)> = self
            .probes
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match &p.site {
                Site::Tracepoint(t) => Some((i, t, p.label.as_str())),
                _ => None,
            })
            .collect();
        if !tps.is_empty() {
            self.attach_tracepoints(&progs, &tps, obj, stop, &mut out)?;
        }

        let usdts: Vec<(usize, &std::path::Path, &str, &str)> = self
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
            attach::usdts(prog(ProgKind::Usdt)?, pid, &usdts, stop, &mut out);
        }

        if out.probes_attached() == 0 && !stop.is_set() {
            match out.skipped.first() {
                Some(s) => bail!("nothing could be attached: {}: {}", s.label, s.reason),
                None => bail!("nothing to attach"),
            }
        }
        Ok(out)
    }

    /// Tracepoints: syscall events through the raw sys_enter/sys_exit links, other
    /// tracepoints through raw tracepoint links, where the object has those
    /// programs loaded; perf-event tracepoints for the rest and for any that the
    /// kernel refuses as raw tracepoints (before Linux 6.10, say).
    fn attach_tracepoints(
        &self,
        progs: &BTreeMap<ProgKind, ProgramMut>,
        tps: &[(usize, &Tracepoint, &str)],
        obj: &Object,
        stop: &Stop,
        out: &mut Attached,
    ) -> Result<()> {
        let mut syscalls = Vec::new();
        let mut raw = Vec::new();
        let mut perf = Vec::new();
        let candidates: Vec<&Tracepoint> = tps
            .iter()
            .filter(|(_, t, _)| t.category != "syscalls")
            .map(|(_, t, _)| *t)
            .collect();
        let attachable = if progs.contains_key(&ProgKind::RawTracepoint) {
            tracepoints::raw_attachable(&candidates)
        } else {
            Vec::new()
        };
        let mut candidate = 0;
        for &(i, t, label) in tps {
            let raw_ok = t.category != "syscalls" && {
                candidate += 1;
                attachable.get(candidate - 1).copied().unwrap_or(false)
            };
            let sys = syscall_event(t).filter(|(exit, _)| {
                progs.contains_key(if *exit {
                    &ProgKind::SyscallExit
                } else {
                    &ProgKind::SyscallEnter
                })
            });
            if let Some((exit, nr)) = sys {
                syscalls.push(attach::SyscallSite { probe: i, nr, exit });
            } else if raw_ok {
                raw.push((i, t, label));
            } else {
                perf.push((i, t, label));
            }
        }
        if !syscalls.is_empty() && !stop.is_set() {
            let map = obj
                .maps()
                .find(|m| m.name() == "syscall_probes")
                .context("internal error: the BPF object has no syscall_probes map")?;
            let refused = attach::syscalls(
                progs.get(&ProgKind::SyscallEnter),
                progs.get(&ProgKind::SyscallExit),
                &map,
                &syscalls,
                self.remember_syscall_nrs(),
                out,
            );
            perf.extend(refused.into_iter().map(|s| {
                let (i, t, l) = tps.iter().find(|(i, _, _)| *i == s.probe).expect("a site");
                (*i, *t, *l)
            }));
        }
        if !raw.is_empty() {
            let sites: Vec<(usize, &str, &str)> = raw
                .iter()
                .map(|(i, t, l)| (*i, t.event.as_str(), *l))
                .collect();
            let refused =
                attach::raw_tracepoints(&progs[&ProgKind::RawTracepoint], &sites, stop, out);
            perf.extend(refused.into_iter().map(|k| raw[k]));
        }
        if !perf.is_empty() {
            let sites: Vec<(usize, &str, &str, &str)> = perf
                .iter()
                .map(|(i, t, l)| (*i, t.category.as_str(), t.event.as_str(), *l))
                .collect();
            let prog = progs
                .get(&ProgKind::Tracepoint)
                .context("internal error: no loaded program for Tracepoint probes")?;
            attach::tracepoints(prog, &sites, stop, out);
        }
        Ok(())
    }

    /// [`Plan::attach`], then what every tool reports: with `debug` the links and
    /// every skipped probe (stderr), else a one-line warning about skipped probes.
    pub fn attach_and_report(&self, obj: &Object, stop: &Stop, debug: bool) -> Result<Attached> {
        let attached = self.attach(obj, stop)?;
        if debug {
            crate::cli::stderr(&attached.describe());
        }
        if let Some(w) = attached.skipped_warning() {
            warn(&w);
        }
        Ok(attached)
    }

    /// What `-D` prints before attaching: matches, sources, modes, every probe.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (spec, n) in &self.matches {
            let _ = writeln!(
                s,
                "pattern \"{spec}\": {n} match{}",
                if *n == 1 { "" } else { "es" }
            );
        }
        if let Some((src, n, removed)) = self.kernel_table {
            let _ = writeln!(
                s,
                "kernel functions: {n} traceable (from {src}), {removed} excluded by the deny list and kprobe blacklist"
            );
        }
        let kernel = self.count(|s| matches!(s, Site::Kernel(_)));
        if kernel > 0 {
            let by_addr = self.probes.iter().all(|p| match &p.site {
                Site::Kernel(f) => !f.addrs.is_empty(),
                _ => true,
            });
            let via = self
                .kernel_via
                .map_or("none", |v| v.describe(true, self.hooks));
            let _ = writeln!(
                s,
                "attach mode: kernel functions: {via} ({kernel} functions, by {})",
                if by_addr { "address" } else { "name" }
            );
        }
        let user = self.count(|s| matches!(s, Site::User { .. }));
        if user > 0 {
            let via = self
                .user_via
                .map_or("none", |v| v.describe(false, self.hooks));
            let _ = writeln!(s, "attach mode: user functions: {via} ({user} functions)");
        }
        for (i, p) in self.probes.iter().enumerate() {
            let where_ = match &p.site {
                Site::Kernel(f) => match &f.module {
                    Some(m) => format!("kernel [{m}], {} instance(s)", f.addrs.len().max(1)),
                    None => format!("kernel, {} instance(s)", f.addrs.len().max(1)),
                },
                Site::User { binary, func } => format!("{} +0x{:x}", binary.display(), func.offset),
                Site::Tracepoint(_) => "tracepoint".to_string(),
                Site::Usdt { binary, probe } => format!(
                    "usdt {}:{} in {}",
                    probe.provider,
                    probe.name,
                    binary.display()
                ),
            };
            let _ = writeln!(s, "  probe {i}: {} ({where_})", p.label);
        }
        s
    }

    /// How many file descriptors attaching this plan holds with the `loaded`
    /// program kinds: one per BPF link, and one more per perf event for the kinds
    /// attached through perf events.
    pub fn fds_needed(&self, loaded: &HashSet<ProgKind>) -> usize {
        /// Links a refused multi set may be split into by bisection.
        const BISECT_SLACK: usize = 8;
        let mut binaries = HashSet::new();
        let mut n = 0;
        let mut kernel = 0;
        for p in &self.probes {
            match &p.site {
                Site::Kernel(f) if self.kernel_via == Some(Via::Single) => {
                    n += 2 * f.addrs.len().max(1) * self.hooks_per_call()
                }
                Site::Kernel(_) => kernel += 1,
                Site::User { binary, .. } if self.user_via != Some(Via::Single) => {
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
            }
        }
        if kernel > 0 {
            n += 1 + BISECT_SLACK;
        }
        // Without uprobe_multi: a perf event and a link per uprobe group, of which a
        // binary has as many as functions share a page offset (+ bisection).
        if self.user_via == Some(Via::Single) {
            let mut depth: BTreeMap<(&PathBuf, u64), usize> = BTreeMap::new();
            for p in &self.probes {
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
            let events = self.count(|s| match s {
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

    /// Hooks each traced call takes (separate entry and return probes: 2).
    fn hooks_per_call(&self) -> usize {
        match self.hooks {
            Hooks::Entry => 1,
            Hooks::EntryAndReturn => 2,
        }
    }

    fn count(&self, f: impl Fn(&Site) -> bool) -> usize {
        self.probes.iter().filter(|p| f(&p.site)).count()
    }
}

impl Attached {
    /// What `-D` prints after attaching: links and every skipped probe.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "attached: {} probes, {} links ({} kprobe_multi, {} uprobe_multi), {} skipped\n",
            self.probes_attached(),
            self.links(),
            self.kprobe_multi_links,
            self.uprobe_multi_links,
            self.skipped.len()
        );
        let user = self.grouped_uprobes + self.single_uprobes;
        if user > 0 {
            let _ = writeln!(
                s,
                "user functions: {} in {} tracefs uprobe group{}, {} as single perf-event uprobes",
                self.grouped_uprobes,
                self.uprobe_groups,
                if self.uprobe_groups == 1 { "" } else { "s" },
                self.single_uprobes
            );
        }
        let tracepoints = self.raw_tracepoint_links + self.syscall_events + self.perf_tracepoints;
        if tracepoints > 0 {
            let _ = writeln!(
                s,
                "tracepoints: {} as raw tracepoint links, {} syscall events through {} raw sys_enter/sys_exit link{}, {} as perf events",
                self.raw_tracepoint_links,
                self.syscall_events,
                self.syscall_links,
                if self.syscall_links == 1 { "" } else { "s" },
                self.perf_tracepoints
            );
        }
        for k in &self.skipped {
            let _ = writeln!(s, "  skipped {}: {}", k.label, k.reason);
        }
        s
    }

    /// A one-line warning about skipped probes, if any.
    pub fn skipped_warning(&self) -> Option<String> {
        if self.skipped.is_empty() {
            return None;
        }
        const SHOWN: usize = 5;
        let mut list: Vec<String> = self
            .skipped
            .iter()
            .take(SHOWN)
            .map(|k| format!("{} ({})", k.label, k.reason))
            .collect();
        if self.skipped.len() > SHOWN {
            list.push(format!(
                "and {} more (-D lists them)",
                self.skipped.len() - SHOWN
            ));
        }
        Some(format!(
            "skipped {} probe{} that could not be attached: {}",
            self.skipped.len(),
            if self.skipped.len() == 1 { "" } else { "s" },
            list.join(", ")
        ))
    }
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

/// Picks how kernel functions are attached: the cheapest mechanism the kernel
/// has that `--attach-mode` allows, probed, never decided by version.
fn choose_kernel_via(probes: &[Probe], opts: &Options) -> Result<Option<Via>> {
    let kernel: Vec<&KernelFunc> = probes
        .iter()
        .filter_map(|p| match &p.site {
            Site::Kernel(f) => Some(f),
            _ => None,
        })
        .collect();
    let Some(first) = kernel.first() else {
        return Ok(None);
    };
    let ret = opts.hooks == Hooks::EntryAndReturn;
    if opts.mode == AttachMode::Session && !ret {
        bail!("--attach-mode session is for tools that time calls (entry and return)");
    }
    let via = match opts.mode {
        AttachMode::Single => Via::Single,
        mode => {
            // One function: a trampoline is cheapest per call where the kernel
            // allows it (not under lockdown, which forbids tracing programs).
            if mode == AttachMode::Auto
                && opts.trampoline
                && kernel.len() == 1
                && features::fentry(&first.name).is_ok()
            {
                return Ok(Some(Via::Trampoline));
            }
            let session = if ret && mode != AttachMode::Multi {
                features::kprobe_session(&first.name)
            } else {
                Err(String::new())
            };
            match session {
                Ok(()) => Via::Session,
                Err(why) if mode == AttachMode::Session => bail!(
                    "--attach-mode session: this kernel cannot create kprobe.session links ({why}; needs Linux 6.10+ with CONFIG_FPROBE)"
                ),
                Err(_) => match features::kprobe_multi(&first.name) {
                    Ok(()) => Via::Multi,
                    Err(why) if mode == AttachMode::Multi => bail!(
                        "--attach-mode multi: this kernel cannot create kprobe_multi links ({why}; needs Linux 5.18+ with CONFIG_FPROBE)"
                    ),
                    Err(why) => {
                        warn(&format!(
                            "kprobe_multi is not available on this kernel ({why}): attaching one kprobe per function (slower to attach and detach)"
                        ));
                        Via::Single
                    }
                },
            }
        }
    };
    let n = kernel.len();
    if via == Via::Single && n > max_single_kprobes() {
        let why = if opts.mode == AttachMode::Single {
            "--attach-mode single"
        } else {
            "no kprobe_multi on this kernel"
        };
        bail!(
            "{n} kernel functions would need one kprobe each ({why}), over the \
             limit of {}: that takes minutes to attach and detach, and has crashed kernels; \
             narrow the pattern, or raise the limit with TRACEKIT_MAX_KPROBES=N",
            max_single_kprobes()
        );
    }
    Ok(Some(via))
}

/// Picks how user functions are attached, as [`choose_kernel_via`] does.
fn choose_user_via(probes: &[Probe], opts: &Options) -> Result<Option<Via>> {
    if !probes.iter().any(|p| matches!(p.site, Site::User { .. })) {
        return Ok(None);
    }
    let ret = opts.hooks == Hooks::EntryAndReturn;
    if opts.mode == AttachMode::Session && !ret {
        bail!("--attach-mode session is for tools that time calls (entry and return)");
    }
    Ok(Some(match opts.mode {
        AttachMode::Single => Via::Single,
        mode => {
            if ret && mode != AttachMode::Multi && features::uprobe_session() {
                Via::Session
            } else if mode == AttachMode::Session {
                bail!("--attach-mode session: this kernel cannot create uprobe.session links (needs Linux 6.13+)");
            } else if features::uprobe_multi() {
                Via::Multi
            } else if mode == AttachMode::Multi {
                bail!("--attach-mode multi: this kernel cannot create uprobe_multi links (needs Linux 6.10+)");
            } else {
                Via::Single
            }
        }
    }))
}

/// How many single kprobes a run may create (TRACEKIT_MAX_KPROBES overrides), as
/// BCC's BCC_PROBE_LIMIT and bpftrace's max_probes: mass single kprobes are slow
/// to attach and detach, and ftrace-based kprobes on every function have crashed
/// the 6.1 and 6.12 guest kernels. kprobe_multi links have no such limit.
pub const DEFAULT_MAX_KPROBES: usize = 5000;

/// [`Plan::fd_reserve`] unless a tool sets more: libbpf, tracefs and output files.
pub const DEFAULT_FD_RESERVE: usize = 16;

/// TRACEKIT_PERF_UPROBES=1: one perf-event uprobe per function instead of tracefs
/// uprobe groups, where there is no uprobe_multi.
fn perf_uprobes() -> bool {
    std::env::var_os("TRACEKIT_PERF_UPROBES").is_some_and(|v| v != "0")
}

fn max_single_kprobes() -> usize {
    std::env::var("TRACEKIT_MAX_KPROBES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MAX_KPROBES)
}

/// A syscalls:sys_enter_NAME / sys_exit_NAME event: (is exit, syscall number).
/// Events whose syscall this architecture's table does not name stay on perf.
fn syscall_event(t: &Tracepoint) -> Option<(bool, u32)> {
    if t.category != "syscalls" {
        return None;
    }
    let (exit, name) = match t.event.strip_prefix("sys_enter_") {
        Some(n) => (false, n),
        None => (true, t.event.strip_prefix("sys_exit_")?),
    };
    Some((exit, tracepoints::syscall_nr(name)?))
}

fn site_key(site: &Site) -> String {
    match site {
        Site::Kernel(f) => format!("k:{}", f.name),
        Site::User { binary, func } => format!("u:{}:{}", binary.display(), func.offset),
        Site::Tracepoint(t) => format!("t:{}", t.name()),
        Site::Usdt { binary, probe } => {
            format!("s:{}:{}:{}", binary.display(), probe.provider, probe.name)
        }
    }
}

/// The binaries of one plan build, each found and read once however many patterns
/// name it (1,500 `c:NAME` patterns parse libc once).
#[derive(Default)]
struct Binaries {
    paths: HashMap<String, PathBuf>,
    read: HashMap<PathBuf, Rc<Binary>>,
    /// By device and inode: `c:malloc` and `/usr/lib/.../libc.so.6:malloc` are one
    /// file, and one probe.
    files: HashMap<(u64, u64), Rc<Binary>>,
}

impl Binaries {
    fn resolve(&mut self, target: &str, pid: Option<u32>) -> Result<PathBuf> {
        if let Some(p) = self.paths.get(target) {
            return Ok(p.clone());
        }
        let p = ufuncs::resolve(target, pid)?;
        self.paths.insert(target.to_string(), p.clone());
        Ok(p)
    }

    fn read(&mut self, path: &PathBuf) -> Result<Rc<Binary>> {
        if let Some(b) = self.read.get(path) {
            return Ok(b.clone());
        }
        let b = Rc::new(Binary::read(path)?);
        let b = self.files.entry((b.dev, b.ino)).or_insert(b).clone();
        self.read.insert(path.clone(), b.clone());
        Ok(b)
    }
}

/// Why `spec` selects no user function of `bin`, in words.
fn no_user_function(spec: &ProbeSpec, bin: &Binary, skipped: &[(String, String)]) -> String {
    let path = elf::shown(&bin.path);
    let spec = escape_str(&spec.raw);
    match skipped {
        [] if !bin.has_symtab => format!(
            "no function in {path} matches \"{spec}\": {path} has no symbol table (it is \
             stripped, and {}); install its debug symbols (the -dbgsym or -dbg package) or \
             trace an unstripped build",
            match bin.exported() {
                0 => "exports no functions".to_string(),
                1 => "only its 1 exported function is visible".to_string(),
                n => format!("only its {n} exported functions are visible"),
            }
        ),
        [] => format!("no function in {path} matches \"{spec}\""),
        [(name, why)] => format!("{name} in {path} cannot be traced: {why}"),
        [(name, why), rest @ ..] => format!(
            "none of the {} functions in {path} matching \"{spec}\" can be traced: {name}: {why} \
             (and {} more; -D lists them)",
            rest.len() + 1,
            rest.len()
        ),
    }
}

fn expand(
    spec: &ProbeSpec,
    pid: Option<u32>,
    kfuncs: &mut Option<KernelFuncs>,
    binaries: &mut Binaries,
    skipped: &mut Vec<Skipped>,
) -> Result<Vec<Probe>> {
    let m = &spec.matcher;
    let probes: Vec<Probe> = match &spec.source {
        Source::Kernel => {
            if kfuncs.is_none() {
                *kfuncs = Some(KernelFuncs::load()?);
            }
            let k = kfuncs.as_ref().expect("loaded above");
            let found: Vec<Probe> = k
                .matching(m)
                .map(|f| Probe {
                    label: f.name.clone(),
                    site: Site::Kernel(f.clone()),
                })
                .collect();
            if found.is_empty() {
                if let Some(name) = m.literal() {
                    if k.is_removed(name) {
                        bail!("\"{name}\" is not traced: it is on the kprobe blacklist or the deny list of functions that hang or recurse when traced");
                    }
                    bail!("\"{name}\" is not a traceable kernel function (it may not exist, be inlined, or be marked notrace)");
                }
                bail!("no traceable kernel function matches \"{spec}\"");
            }
            found
        }
        Source::User { target } => {
            let in_spec = || format!("probe \"{}\"", escape_str(&spec.raw));
            let binary = binaries.resolve(target, pid).with_context(in_spec)?;
            let bin = binaries.read(&binary).with_context(in_spec)?;
            let found = ufuncs::functions(&bin, m);
            if found.funcs.is_empty() {
                bail!(no_user_function(spec, &bin, &found.skipped));
            }
            skipped.extend(
                found
                    .skipped
                    .into_iter()
                    .map(|(label, reason)| Skipped { label, reason }),
            );
            found
                .funcs
                .into_iter()
                .map(|func| Probe {
                    label: func.name.clone(),
                    site: Site::User {
                        binary: bin.path.clone(),
                        func,
                    },
                })
                .collect()
        }
        Source::Tracepoint => {
            let found: Vec<Probe> = tracepoints::matching(m)?
                .into_iter()
                .map(|t| Probe {
                    label: t.name(),
                    site: Site::Tracepoint(t),
                })
                .collect();
            if found.is_empty() {
                bail!("no tracepoint matches \"{spec}\" (tracepoints are listed under events/ in tracefs)");
            }
            found
        }
        Source::Usdt { target } => {
            let in_spec = || format!("probe \"{}\"", escape_str(&spec.raw));
            let binary = binaries.resolve(target, pid).with_context(in_spec)?;
            let found: Vec<Probe> = ufuncs::usdt_probes(&binary)
                .with_context(in_spec)?
                .into_iter()
                .filter(|p| m.is_match(&p.name))
                .map(|probe| Probe {
                    label: probe.name.clone(),
                    site: Site::Usdt {
                        binary: binary.clone(),
                        probe,
                    },
                })
                .collect();
            if found.is_empty() {
                bail!(
                    "no USDT probe in {} matches \"{}\"",
                    elf::shown(&binary),
                    escape_str(&spec.raw)
                );
            }
            found
        }
    };
    Ok(probes)
}
