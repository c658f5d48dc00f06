//! A plan: a run's probe specs expanded into concrete probes, the attach mode chosen
//! for them, and the programs of a tool's BPF object that serve each kind.
//!
//! Probe `i` of a plan is attached with cookie `i`, so BPF programs index their
//! per-probe state by `bpf_get_attach_cookie()`.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{bail, Context, Result};

use crate::diag::escape_str;
use crate::kernel::functions::{KernelFunc, KernelFuncs};
use crate::kernel::tracepoints::{self, Tracepoint};
use crate::probe::perf::PerfSource;
use crate::probe::spec::{ProbeSpec, Source};
use crate::sys::process;
use crate::user::elf::{self, Binary};
use crate::user::targets::{self, UsdtProbe, UserFunc};

use crate::probe::mode::{AttachMode, Hooks};

pub mod mechanism;

use mechanism::{check_mode, choose_kernel_via, choose_user_via, Via};

#[derive(Debug, Clone)]
pub enum Site {
    Kernel(KernelFunc),
    User {
        binary: PathBuf,
        func: UserFunc,
    },
    Tracepoint(Tracepoint),
    Usdt {
        binary: PathBuf,
        probe: UsdtProbe,
    },
    /// A sampling or counter source: one perf event per CPU.
    Perf(PerfSource),
}

/// A probe site that could not be attached.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub label: String,
    pub reason: String,
}

/// `label (reason)`, as warnings and errors list skipped sites.
impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.label, self.reason)
    }
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
    /// Whether the tool's tracepoints may be raw tracepoint links: the plan says
    /// which of them its program may serve.
    pub raw_tracepoints: RawTracepoints,
    /// Return probes on Go programs, which crash them: refused unless the user
    /// asked for them (the tool's `--unsafe`, see [`UNSAFE_FLAG`]).
    pub unsafe_returns: bool,
    /// `-c CPU`: sampling sources open their perf event on that CPU only.
    pub cpu: Option<u32>,
}

/// The flag of tools that hook returns which lets them hook a Go program's:
/// bpftrace's name for allowing what can harm the traced system.
pub const UNSAFE_FLAG: &str = "--unsafe";

/// Whether a tool's tracepoints may be raw tracepoint links, through its
/// object's `SEC("raw_tp")` program, and what that program needs to know
/// which probe fired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RawTracepoints {
    /// No: perf-event tracepoints.
    #[default]
    No,
    /// The probe, from the link's cookie (Linux 6.10+); before 6.10, clones of
    /// the object's cookie-less `SEC("raw_tracepoint")` program if it has one
    /// (funccount).
    ByCookie,
    /// Nothing: one program serves every tracepoint alike (stackcount keys by
    /// stack), so raw links on any kernel, cookie-less before 6.10.
    Alike,
}

pub struct Plan {
    pub probes: Vec<Probe>,
    /// Per spec: the spec text and how many probes it matched.
    pub matches: Vec<(String, usize)>,
    pub pid: Option<u32>,
    /// `-c CPU` (where sampling sources open their events).
    pub cpu: Option<u32>,
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
    kernel_table: Option<(String, usize, usize)>,
    /// Kernel functions named exactly and left to the kernel to resolve (no
    /// table was read): one that does not attach is an error, not a skip.
    pub(crate) kernel_by_name: bool,
    /// Per probe, whether a raw tracepoint link may serve it (with
    /// [`Options::raw_tracepoints`]; else empty). Decided while the plan is
    /// built, where it overlaps the object's opening ahead, rather than at
    /// attach: it stats the event's name in every tracefs category.
    pub(crate) raw_attachable: Vec<bool>,
    /// What the tool's raw tracepoint program needs ([`Options::raw_tracepoints`]).
    pub(crate) raw_tracepoints: RawTracepoints,
    /// Per probe, the perf-event tracepoint program that serves it by name,
    /// where a tool has one per record shape (trace); else empty, and its
    /// tracepoints take the object's one `tp` program.
    pub(crate) tracepoint_programs: Vec<Option<String>>,
}

impl Plan {
    /// Whether a probe is a sampling or counter source (profile:, software:,
    /// hardware:): its events come anywhere in the code.
    pub fn samples(&self) -> bool {
        self.probes.iter().any(|p| matches!(p.site, Site::Perf(_)))
    }

    /// The files of the plan's user-function and USDT probes, each once.
    pub fn user_binaries(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for p in &self.probes {
            if let Site::User { binary, .. } | Site::Usdt { binary, .. } = &p.site {
                if !out.contains(binary) {
                    out.push(binary.clone());
                }
            }
        }
        out
    }

    /// Expands `specs`; fails naming the spec that matched nothing.
    pub fn build(specs: &[ProbeSpec], opts: &Options) -> Result<Plan> {
        Self::build_indexed(specs, opts).map(|(plan, _)| plan)
    }

    /// [`Plan::build`], also telling which probes each spec matched (by index in
    /// `probes`): specs that name one site share its probe, as tools that hang
    /// several actions on one site (trace) need to know.
    pub fn build_indexed(specs: &[ProbeSpec], opts: &Options) -> Result<(Plan, Vec<Vec<usize>>)> {
        // Whatever the patterns match (a run of tracepoints ignored the mode).
        check_mode(opts)?;
        if let Some(pid) = opts.pid {
            process::check_pid(pid)?;
            let user = specs
                .iter()
                .any(|s| matches!(s.source, Source::User { .. } | Source::Usdt { .. }));
            if let Some(name) = process::kernel_thread(pid).filter(|_| user) {
                let name = escape_str(&name);
                bail!("-p {pid} is a kernel thread ({name}): it runs no user code, so it has no user functions or USDT probes to trace; give a process");
            }
        }
        let mut kfuncs: Option<KernelFuncs> = None;
        // Only these names are parsed out of a cached table.
        let kernel_specs: Vec<&ProbeSpec> = specs
            .iter()
            .filter(|s| matches!(s.source, Source::Kernel))
            .collect();
        let keep = |name: &str| kernel_specs.iter().any(|s| s.matcher.is_match(name));
        let wanted = crate::kernel::functions::cache::Want {
            keep: &keep,
            prefixes: kernel_specs.iter().map(|s| s.matcher.prefix()).collect(),
        };
        let by_name = crate::timing::span("tables", || {
            kernel_by_name(&kernel_specs, &wanted, &mut kfuncs)
        })?;
        let mut binaries = Binaries::default();
        let mut skipped = Vec::new();
        let mut probes = Vec::new();
        let mut seen: HashMap<SiteKey, usize> = HashMap::new();
        let mut matches = Vec::new();
        let mut indexes = Vec::new();
        for spec in specs {
            let found = crate::timing::span("tables", || {
                expand(
                    spec,
                    opts.pid,
                    opts.hooks == Hooks::EntryAndReturn,
                    opts.unsafe_returns,
                    &mut kfuncs,
                    by_name,
                    &wanted,
                    &mut binaries,
                    &mut skipped,
                )
            })?;
            matches.push((spec.raw.clone(), found.len()));
            probes.reserve(found.len());
            seen.reserve(found.len());
            let mut mine = Vec::with_capacity(found.len());
            for p in found {
                match seen.entry(SiteKey::of(&p.site)) {
                    Entry::Vacant(v) => {
                        v.insert(probes.len());
                        mine.push(probes.len());
                        probes.push(p);
                    }
                    // Two patterns name one user function: show its preferred name.
                    Entry::Occupied(o) => {
                        mine.push(*o.get());
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
            indexes.push(mine);
        }
        qualify_shared_labels(&mut probes);
        if let Some(k) = &kfuncs {
            crate::timing::note("tables", k.how);
        } else if by_name {
            crate::timing::note("tables", "none: kernel functions by name");
        }
        let raw_attachable = if opts.raw_tracepoints != RawTracepoints::No {
            // Not syscall events: those have their own raw links.
            raw_attachable(&probes, |_, t| t.category != "syscalls")
        } else {
            Vec::new()
        };
        let kernel_via = choose_kernel_via(&probes, opts)?;
        let user_via = choose_user_via(&probes, opts)?;
        let plan = Plan {
            kernel_table: kfuncs.map(|k| (k.source.clone(), k.len(), k.removed)),
            kernel_by_name: by_name,
            raw_attachable,
            raw_tracepoints: opts.raw_tracepoints,
            tracepoint_programs: Vec::new(),
            probes,
            matches,
            pid: opts.pid,
            cpu: opts.cpu,
            hooks: opts.hooks,
            kernel_via,
            user_via,
            skipped,
            fd_reserve: DEFAULT_FD_RESERVE,
        };
        Ok((plan, indexes))
    }

    /// Replaces the probes, for a tool that orders them itself and serves its
    /// tracepoints with a program per record shape (trace). `raw[i]`: whether
    /// tracepoint i may be a raw tracepoint link (its name checked with
    /// [`raw_attachable`]), its program told which probe fired as `how` says.
    /// `programs[i]`: the perf-event program, by name, for tracepoint i when it
    /// is not a raw link.
    pub fn set_probes(
        &mut self,
        probes: Vec<Probe>,
        raw: Vec<bool>,
        how: RawTracepoints,
        programs: Vec<Option<String>>,
    ) {
        assert_eq!(probes.len(), raw.len(), "one flag per probe");
        assert_eq!(
            probes.len(),
            programs.len(),
            "one program (or none) per probe"
        );
        self.raw_tracepoints = if raw.contains(&true) {
            how
        } else {
            RawTracepoints::No
        };
        self.raw_attachable = raw;
        self.tracepoint_programs = programs;
        self.probes = probes;
    }

    /// The program named for probe `i` ([`Plan::set_probes`]), if any.
    pub(crate) fn tracepoint_program(&self, i: usize) -> Option<&str> {
        self.tracepoint_programs.get(i)?.as_deref()
    }

    /// Whether the plan names program `name` for some tracepoint.
    pub(crate) fn names_program(&self, name: &str) -> bool {
        self.tracepoint_programs.iter().flatten().any(|n| n == name)
    }

    /// Whether every probe is a tracepoint (what warnings call the sites).
    pub(crate) fn only_tracepoints(&self) -> bool {
        self.probes
            .iter()
            .all(|p| matches!(p.site, Site::Tracepoint(_)))
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
        if let Some((src, n, removed)) = &self.kernel_table {
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
                Site::Perf(p) => format!("perf event, {}, one per CPU", p.rate()),
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

    /// Hooks each traced call takes (separate entry and return probes: 2).
    pub(crate) fn hooks_per_call(&self) -> usize {
        match self.hooks {
            Hooks::Entry => 1,
            Hooks::EntryAndReturn => 2,
        }
    }

    pub(crate) fn count(&self, f: impl Fn(&Site) -> bool) -> usize {
        self.probes.iter().filter(|p| f(&p.site)).count()
    }
}

/// TRACEKIT_PERF_SYSCALLS=1: syscall events as one perf-event tracepoint each
/// instead of through the raw sys_enter/sys_exit links, whose programs run at
/// every syscall on the system: ~16 ns more per untraced syscall than the
/// kernel's perf-event check (`cargo xtask bench`), for a long run on a busy
/// machine tracing a rare syscall. Each perf event takes ~70 ms to detach.
pub fn perf_syscalls() -> bool {
    std::env::var_os("TRACEKIT_PERF_SYSCALLS").is_some_and(|v| v != "0")
}

/// TRACEKIT_PERF_UPROBES=1: one perf-event uprobe per function instead of tracefs
/// uprobe groups, where there is no uprobe_multi.
pub(crate) fn perf_uprobes() -> bool {
    std::env::var_os("TRACEKIT_PERF_UPROBES").is_some_and(|v| v != "0")
}

/// Labels user functions `BINARY:NAME` where their name is also another
/// binary's (or a kernel function's, a tracepoint's...), so that summaries tell
/// them apart rather than print two rows, or one histogram, of one name.
/// `BINARY` is the file's name, or its path where two files share a name.
/// Functions of one name within one binary (static ones) keep it, as BCC does.
fn qualify_shared_labels(probes: &mut [Probe]) {
    fn binary(p: &Probe) -> Option<&Path> {
        match &p.site {
            Site::User { binary, .. } => Some(binary),
            _ => None,
        }
    }
    // Per label, the binaries (None: not a user function) it comes from.
    let mut origins: HashMap<&str, HashSet<Option<&Path>>> = HashMap::new();
    for p in probes.iter() {
        origins.entry(&p.label).or_default().insert(binary(p));
    }
    let relabel: Vec<(usize, String)> = probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let (origins, path) = (origins.get(p.label.as_str())?, binary(p)?);
            if origins.len() < 2 {
                return None;
            }
            let same_file_name = origins
                .iter()
                .flatten()
                .filter(|o| o.file_name() == path.file_name())
                .count()
                > 1;
            Some((
                i,
                match path.file_name() {
                    Some(f) if !same_file_name => format!("{}:{}", f.to_string_lossy(), p.label),
                    _ => format!("{}:{}", path.display(), p.label),
                },
            ))
        })
        .collect();
    for (i, label) in relabel {
        probes[i].label = label;
    }
}

/// [`Plan::fd_reserve`] unless a tool sets more: libbpf, tracefs and output files.
pub const DEFAULT_FD_RESERVE: usize = 16;

/// Per probe, whether it is a tracepoint that `candidate` offers (by index)
/// and whose name a raw tracepoint link may serve
/// ([`tracepoints::raw_attachable`]).
pub fn raw_attachable(
    probes: &[Probe],
    candidate: impl Fn(usize, &Tracepoint) -> bool,
) -> Vec<bool> {
    let candidates: Vec<(usize, &Tracepoint)> = probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match &p.site {
            Site::Tracepoint(t) if candidate(i, t) => Some((i, t)),
            _ => None,
        })
        .collect();
    let mut out = vec![false; probes.len()];
    if candidates.is_empty() {
        return out;
    }
    let events: Vec<&Tracepoint> = candidates.iter().map(|(_, t)| *t).collect();
    for ((i, _), ok) in candidates.iter().zip(tracepoints::raw_attachable(&events)) {
        out[*i] = ok;
    }
    out
}

/// A syscalls:sys_enter_NAME / sys_exit_NAME event: (is exit, syscall number).
/// Events whose syscall this architecture's table does not name stay on perf.
pub fn syscall_event(t: &Tracepoint) -> Option<(bool, u32)> {
    if t.category != "syscalls" {
        return None;
    }
    let (exit, name) = match t.event.strip_prefix("sys_enter_") {
        Some(n) => (false, n),
        None => (true, t.event.strip_prefix("sys_exit_")?),
    };
    Some((exit, tracepoints::syscall_nr(name)?))
}

/// What makes two probes one: two patterns naming one site share its probe.
#[derive(PartialEq, Eq, Hash)]
enum SiteKey {
    Kernel(String),
    User(PathBuf, u64),
    Tracepoint(String, String),
    Usdt(PathBuf, String, String),
    Perf(String),
}

impl SiteKey {
    fn of(site: &Site) -> SiteKey {
        match site {
            Site::Kernel(f) => SiteKey::Kernel(f.name.clone()),
            Site::User { binary, func } => SiteKey::User(binary.clone(), func.offset),
            Site::Tracepoint(t) => SiteKey::Tracepoint(t.category.clone(), t.event.clone()),
            Site::Perf(p) => SiteKey::Perf(p.name.clone()),
            Site::Usdt { binary, probe } => {
                SiteKey::Usdt(binary.clone(), probe.provider.clone(), probe.name.clone())
            }
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
    /// Go and C++ binaries already warned of (once each, however many patterns).
    warned: std::collections::HashSet<(u64, u64)>,
}

impl Binaries {
    fn resolve(&mut self, target: &str, pid: Option<u32>) -> Result<PathBuf> {
        if let Some(p) = self.paths.get(target) {
            return Ok(p.clone());
        }
        let p = targets::resolve(target, pid)?;
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
             (and {} more; {} lists them)",
            rest.len() + 1,
            rest.len(),
            crate::diag::debug_flag()
        ),
    }
}

/// The error for a kernel function named exactly that is traceable but unsafe.
fn not_traced_unsafe(name: &str) -> String {
    format!("\"{name}\" is not traced: it is on the kprobe blacklist or the deny list of functions that hang or recurse when traced")
}

/// The error for a kernel function named exactly that cannot be traced.
pub(crate) fn not_traceable(name: &str) -> String {
    format!("\"{name}\" is not a traceable kernel function (it may not exist, be inlined, or be marked notrace)")
}

/// Whether this plan's kernel functions are left to the kernel to resolve by
/// name: every kernel pattern names one function exactly. No table is read then
/// (reading the kernel's lists, or even the cached table, costs more than
/// attaching one function); the deny list and the kprobe blacklist are still
/// checked, and a name the kernel cannot attach is an error in the same words.
/// The kernel traces the first traceable instance of a static function whose
/// name several share (a wildcard traces every instance).
/// Whether the kernel patterns are all exact names, to be resolved by the kernel
/// when it attaches, with no table read. A fresh cached table is used even
/// then (into `kfuncs`): it costs a few pages, finds every instance of a name,
/// and attaching by address spares the kernel a walk of all of kallsyms per
/// name (most of a one-function kprobe_multi attach).
fn kernel_by_name(
    kernel: &[&ProbeSpec],
    wanted: &crate::kernel::functions::cache::Want,
    kfuncs: &mut Option<KernelFuncs>,
) -> Result<bool> {
    if kernel.is_empty() || !kernel.iter().all(|s| s.matcher.literal().is_some()) {
        return Ok(false);
    }
    crate::kernel::access::require_kernel_functions(crate::kernel::tracefs::tracefs()?)?;
    if let Ok(k) = KernelFuncs::cached(wanted) {
        *kfuncs = Some(k);
        return Ok(false);
    }
    Ok(true)
}

/// One line when BCC's `-r` (anchored at the start only) would have taken
/// functions `-r` here does not (it matches whole names): `more`, by name.
fn warn_bcc_prefix<'a>(spec: &ProbeSpec, more: impl Iterator<Item = &'a str>) {
    let more: Vec<&str> = more.collect();
    if more.is_empty() {
        return;
    }
    let shown = more
        .iter()
        .take(3)
        .map(|n| escape_str(n))
        .collect::<Vec<_>>();
    let rest = match more.len() {
        n if n > 3 => format!(" and {} more", n - 3),
        _ => String::new(),
    };
    let re = escape_str(spec.matcher.as_str());
    crate::diag::warn(&format!(
        "-r '{re}' matches whole names; BCC's -r, which matches the start of a name, would also take {}{rest} (write '{re}.*' to take them)",
        shown.join(", ")
    ));
}

/// Expands one spec into its probes. `returns`: the plan hooks returns too;
/// `unsafe_returns`: also on Go programs.
#[allow(clippy::too_many_arguments)]
fn expand(
    spec: &ProbeSpec,
    pid: Option<u32>,
    returns: bool,
    unsafe_returns: bool,
    kfuncs: &mut Option<KernelFuncs>,
    by_name: bool,
    wanted: &crate::kernel::functions::cache::Want,
    binaries: &mut Binaries,
    skipped: &mut Vec<Skipped>,
) -> Result<Vec<Probe>> {
    let m = &spec.matcher;
    let probes: Vec<Probe> = match &spec.source {
        Source::Kernel if by_name => {
            let name = m
                .literal()
                .expect("by name: every kernel pattern is literal");
            if crate::kernel::functions::unsafe_to_trace(name) {
                bail!(not_traced_unsafe(name));
            }
            vec![Probe {
                label: name.to_string(),
                site: Site::Kernel(KernelFunc {
                    name: name.to_string(),
                    module: None,
                    addrs: Vec::new(),
                }),
            }]
        }
        Source::Kernel => {
            if kfuncs.is_none() {
                *kfuncs = Some(KernelFuncs::load(wanted)?);
            }
            let k = kfuncs.as_ref().expect("loaded above");
            let found: Vec<Probe> = k
                .matching(m)
                .map(|f| Probe {
                    label: f.name.clone(),
                    site: Site::Kernel(f.clone()),
                })
                .collect();
            if let Some(bcc) = m.bcc_prefix() {
                let more = k.matching(&bcc).filter(|f| !m.is_match(&f.name));
                warn_bcc_prefix(spec, more.map(|f| f.name.as_str()));
            }
            if found.is_empty() {
                if let Some(name) = m.literal() {
                    if k.is_removed(name) {
                        bail!(not_traced_unsafe(name));
                    }
                    bail!(not_traceable(name));
                }
                bail!("no traceable kernel function matches \"{spec}\"");
            }
            found
        }
        Source::User { target } => {
            let in_spec = || format!("probe \"{}\"", escape_str(&spec.raw));
            let binary = binaries.resolve(target, pid).with_context(in_spec)?;
            let bin = binaries.read(&binary).with_context(in_spec)?;
            let mut found = targets::functions(&bin, m);
            if let Some(bcc) = m.bcc_prefix() {
                let wider = targets::functions(&bin, &bcc);
                // By address: a function may have matched by another of its names.
                let ours: HashSet<u64> = found.funcs.iter().map(|f| f.offset).collect();
                let more = wider.funcs.iter().filter(|f| !ours.contains(&f.offset));
                warn_bcc_prefix(spec, more.map(|f| f.name.as_str()));
            }
            if returns {
                targets::skip_jump_entered(&mut found, bin.entry);
                let shown = || crate::user::elf::shown(&bin.path);
                // Go moves a goroutine's stack when it grows it, and walks stacks
                // by return address: a return probe's replaced address crashes
                // the program (3 of 3 runs in the sweep, in gcBgMarkWorker).
                if bin.go && !unsafe_returns {
                    bail!(
                        "{} is a Go program: return probes crash it (Go moves and walks goroutine stacks by return address, which a return probe replaces); {UNSAFE_FLAG} hooks its returns anyway",
                        shown()
                    );
                }
                if bin.go && binaries.warned.insert((bin.dev, bin.ino)) {
                    crate::diag::warn(&format!(
                        "{} is a Go program: hooking its functions' returns can crash it (Go's runtime walks goroutine stacks by return address, which a return probe replaces)",
                        shown()
                    ));
                }
                if bin.cxx_exceptions && binaries.warned.insert((bin.dev, bin.ino)) {
                    crate::diag::warn(&format!(
                        "{} is C++ with exceptions: one that unwinds through a function with a return probe aborts the program (the probe replaces the return address the unwinder follows)",
                        shown()
                    ));
                }
            }
            for note in &found.notes {
                crate::diag::warn(note);
            }
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
        Source::Perf(p) => {
            // Samples and counts have no call, so no return to hook.
            if returns {
                bail!(
                    "\"{spec}\" is a sampling source: it has no calls, so no returns (use it with funccount, stackcount or trace)"
                );
            }
            vec![Probe {
                label: p.name.clone(),
                site: Site::Perf(p.clone()),
            }]
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
            let found: Vec<Probe> = targets::usdt_probes(&binary)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn user(path: &str, name: &str) -> Probe {
        Probe {
            label: name.into(),
            site: Site::User {
                binary: PathBuf::from(path),
                func: UserFunc {
                    name: name.into(),
                    offset: 0x1000,
                    size: 8,
                    exported: true,
                },
            },
        }
    }

    #[test]
    fn shared_names_are_qualified_by_binary() {
        let tp = Tracepoint {
            category: "sched".into(),
            event: "sched_switch".into(),
        };
        let mut probes = vec![
            user("/a/prog", "foo"),
            user("/b/prog", "foo"),
            user("/c/other", "foo"),
            // Two of one name in one binary (static functions) keep it.
            user("/a/prog", "bar"),
            user("/a/prog", "bar"),
            user("/a/prog", "only"),
            user("/c/other", "sched:sched_switch"),
            Probe {
                label: tp.name(),
                site: Site::Tracepoint(tp),
            },
        ];
        qualify_shared_labels(&mut probes);
        let labels: Vec<&str> = probes.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "/a/prog:foo",
                "/b/prog:foo",
                "other:foo",
                "bar",
                "bar",
                "only",
                "other:sched:sched_switch",
                "sched:sched_switch"
            ]
        );
    }
}
