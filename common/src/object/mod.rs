//! A tool's BPF object seen from a plan: which program (by ELF section) serves
//! which kind of probe and hook, which of them to load, and the filter globals
//! every program reads (bpf/filter.h).

use std::collections::HashSet;

use anyhow::{bail, Context, Result};
use libbpf_rs::OpenObject;

pub mod ahead;
pub mod cgroup;
pub mod trials;
pub mod unwind;

use crate::kernel::features;
use crate::plan::mechanism::Via;
use crate::plan::{syscall_event, Plan, RawTracepoints, Site};
use crate::probe::mode::Hook;
use crate::probe::mode::Hooks;
use crate::sys::process::{self, PidNs};

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
    /// Raw tracepoint links (`SEC("raw_tp")`), with the probe as cookie (Linux
    /// 6.10+), or without for a program that serves every tracepoint alike
    /// ([`RawTracepoints`]); tools without one use perf-event tracepoints.
    RawTracepoint,
    /// Raw tracepoint links without a cookie (before Linux 6.10): the object's
    /// `SEC("raw_tracepoint")` program, cloned per probe at attach (from the
    /// instructions libbpf loaded it with), the nth clone counting the
    /// probe its `raw_tp_probes[n]` global names ([`raw_tp_clones`]).
    RawTracepointClone,
    /// The raw `sys_enter` / `sys_exit` tracepoints serving every
    /// syscalls:sys_enter_* / sys_exit_* event (`SEC("raw_tp/sys_enter")`, ...).
    SyscallEnter,
    SyscallExit,
    Usdt,
    /// Sampling and counter sources (`SEC("perf_event")`), the probe as cookie.
    PerfEvent,
}

impl ProgKind {
    /// The kinds of program `obj` has.
    pub fn in_object(obj: &OpenObject) -> HashSet<ProgKind> {
        obj.progs()
            .filter_map(|p| p.section().to_str().and_then(ProgKind::of))
            .collect()
    }

    pub(crate) fn of(prog_section: &str) -> Option<Self> {
        match prog_section {
            "raw_tp/sys_enter" => return Some(ProgKind::SyscallEnter),
            "raw_tp/sys_exit" => return Some(ProgKind::SyscallExit),
            "raw_tp" => return Some(ProgKind::RawTracepoint),
            "raw_tracepoint" => return Some(ProgKind::RawTracepointClone),
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
            "perf_event" => ProgKind::PerfEvent,
            _ => return None,
        })
    }

    /// The programs that serve kernel or user functions attached `via`, in
    /// attach order: returns before entries, so that no entry is recorded
    /// whose return would go unseen.
    pub(crate) fn for_via(via: Via, kernel: bool, hooks: Hooks) -> &'static [ProgKind] {
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
    pub(crate) fn hook(self) -> Hook {
        use ProgKind::*;
        match self {
            KretprobeMulti | Kretprobe | UretprobeMulti | Uretprobe | Fexit => Hook::Return,
            KprobeSession | UprobeSession => Hook::Session,
            _ => Hook::Entry,
        }
    }
}

/// What bpf/syscalls.h's programs are told before load ([`SyscallGlobals::of`]).
#[derive(Debug, Clone, Copy)]
pub struct SyscallGlobals {
    /// BPF may read kernel memory (not under lockdown=confidentiality).
    pub kernel_reads: bool,
    /// sys_enter remembers syscall numbers for sys_exit.
    pub remember_nr: bool,
    /// thread_info.status in task_struct, for the compat flag (0: unknown).
    pub task_status_off: u32,
}

impl SyscallGlobals {
    /// The globals of bpf/syscalls.h, for a tool's rodata.
    pub fn of(plan: &Plan) -> SyscallGlobals {
        let kernel_reads = features::kernel_reads();
        SyscallGlobals {
            kernel_reads,
            remember_nr: remember_syscall_nrs(plan),
            // Only the syscall programs read it, and finding it may parse the
            // kernel's BTF (once per boot).
            task_status_off: match kernel_reads && has_syscall_events(plan) {
                true => features::task_status_offset().unwrap_or(0),
                false => 0,
            },
        }
    }
}

/// How many clones of its cookie-less raw tracepoint program an object serves
/// at most (`RAW_TP_CLONES` in bpf/funccount.bpf.c, the length of its
/// `raw_tp_probes`); further tracepoints are perf events.
pub const RAW_TP_CLONES: usize = 1024;

/// Writes a [`Filter`] into a skeleton's `.rodata` (the globals of bpf/filter.h).
#[macro_export]
macro_rules! set_filter {
    ($rodata:expr, $filter:expr) => {{
        let (r, f) = ($rodata, $filter);
        r.filter_tgid = f.tgid;
        r.filter_pidns_dev = f.pidns_dev;
        r.filter_pidns_ino = f.pidns_ino;
        r.filter_cpu = f.cpu;
        r.filter_cgroup = f.cgroup.is_some();
    }};
}

/// A tool's skeleton for a plan, from its [`crate::object::ahead::OpenAhead`]: programs
/// configured for the plan's attach kinds and the PID/CPU filters written;
/// `|rodata| { .. }` sets the tool's own read-only globals. Evaluates to the open
/// skeleton, ready for map sizing and load.
#[macro_export]
macro_rules! open_skeleton {
    ($ahead:expr, $plan:expr, $cpu:expr, |$rodata:ident| $body:block) => {{
        let open = $ahead.take($plan)?;
        $crate::configure_open!(
            open,
            |obj| $crate::configure_plan($plan, obj),
            $crate::Filter::of($plan, $cpu),
            |$rodata| $body
        )
    }};
}

/// The next skeleton of a tool with fixed programs ([`crate::object::trials`]), from its
/// [`crate::object::ahead::OpenAhead`]: the selection's programs configured and the
/// filters written, as [`open_skeleton!`].
#[macro_export]
macro_rules! open_fixed_skeleton {
    ($ahead:expr, $selection:expr, $filter:expr, |$rodata:ident| $body:block) => {{
        let open = $ahead.next_open()?;
        $crate::configure_open!(open, |obj| $selection.configure(obj), $filter, |$rodata| {
            $body
        })
    }};
}

/// The part of [`open_skeleton!`] and [`open_fixed_skeleton!`] after opening:
/// `$configure` (the plan's or the selection's), filters and the tool's globals. The cgroup filter's
/// map is the one [`crate::object::cgroup`] armed, or none is created.
#[doc(hidden)]
#[macro_export]
macro_rules! configure_open {
    ($open:expr, $configure:expr, $filter:expr, |$rodata:ident| $body:block) => {{
        let mut open = $open;
        let filter: $crate::Filter = $filter;
        ($configure)(open.open_object_mut())?;
        match filter.cgroup {
            Some(fd) => open.maps.filter_cgroups.reuse_fd(fd),
            None => open.maps.filter_cgroups.set_autocreate(false),
        }
        .context("setting up the cgroup filter's map")?;
        let $rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .context("BPF object has no .rodata")?;
        $crate::set_filter!(&mut *$rodata, filter);
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
    /// The `--cgroup` filter's map ([`crate::object::cgroup::map`]).
    pub cgroup: Option<std::os::fd::BorrowedFd<'static>>,
}

impl Filter {
    /// Filter values for bpf/filter.h: the target PID (in our pid namespace when we
    /// run in a container), CPU and cgroup.
    pub fn of(plan: &Plan, cpu: Option<u32>) -> Filter {
        let ns: Option<PidNs> = plan.pid.and_then(|_| process::own_pidns());
        Filter {
            tgid: plan.pid.unwrap_or(0),
            pidns_dev: ns.map_or(0, |n| n.dev),
            pidns_ino: ns.map_or(0, |n| n.ino),
            cpu: cpu.map_or(-1, |c| c as i32),
            cgroup: crate::object::cgroup::map(),
        }
    }
}

// What the object needs of a plan: the programs it loads, its configuration
// before load, and the values its globals take. Functions of the object stage,
// not methods of Plan, so that the plan (a lower stage) knows nothing of objects.

/// The BPF program kinds this plan attaches.
pub fn prog_kinds(plan: &Plan) -> Vec<ProgKind> {
    let mut kinds: Vec<ProgKind> = plan
        .probes
        .iter()
        .flat_map(|p| match p.site {
            Site::Kernel(_) => plan
                .kernel_via
                .map_or(&[][..], |v| ProgKind::for_via(v, true, plan.hooks)),
            Site::User { .. } => plan
                .user_via
                .map_or(&[][..], |v| ProgKind::for_via(v, false, plan.hooks)),
            Site::Tracepoint(_) => &[ProgKind::Tracepoint][..],
            Site::Usdt { .. } => &[ProgKind::Usdt][..],
            Site::Perf(_) => &[ProgKind::PerfEvent][..],
        })
        .copied()
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// What `--debug` (BCC's `-v`, which prints its C source) shows of a loaded
/// object: each program loaded, with its section and size.
pub fn describe_programs(obj: &libbpf_rs::Object) -> String {
    let mut s = String::new();
    for p in obj.progs().filter(|p| p.autoload()) {
        s.push_str(&format!(
            "program {} (SEC(\"{}\")): {} instructions\n",
            p.name().to_string_lossy(),
            p.section().to_string_lossy(),
            p.insn_cnt()
        ));
    }
    s
}

/// Loads only the programs this plan needs: a kprobe.multi program would fail
/// to load on a kernel without that attach type, and unused ones cost verifier
/// time. Raw tracepoint programs are loaded when the object has them and the
/// kernel takes them; perf-event tracepoints stay loaded as their fallback.
pub fn configure(plan: &Plan, obj: &mut OpenObject) -> Result<()> {
    let present = ProgKind::in_object(obj);
    let mut need = prog_kinds(plan);
    need.extend(raw_tracepoint_kinds(plan, |k| present.contains(&k)));
    // A plan that names its tracepoints' programs (trace) loads those of the
    // object's tracepoint programs, and no other.
    let named: HashSet<&str> = plan
        .tracepoint_programs
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    let by_name = !plan.tracepoint_programs.is_empty();
    if by_name {
        need.retain(|k| *k != ProgKind::Tracepoint || !named.is_empty());
    }
    let mut have = HashSet::new();
    // A trampoline is bound to its function when it is loaded.
    let target = plan.probes.iter().find_map(|p| match &p.site {
        Site::Kernel(f) if plan.kernel_via == Some(Via::Trampoline) => Some(f.name.clone()),
        _ => None,
    });
    for mut prog in obj.progs_mut() {
        let Some(kind) = prog.section().to_str().and_then(ProgKind::of) else {
            continue;
        };
        let on = match (by_name, kind) {
            (true, ProgKind::Tracepoint) => prog.name().to_str().is_some_and(|n| named.contains(n)),
            _ => need.contains(&kind),
        };
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
    let user = plan.count(|s| matches!(s, Site::User { .. }));
    let usdt = plan.count(|s| matches!(s, Site::Usdt { .. }));
    let syscalls = have.contains(&ProgKind::SyscallEnter) || have.contains(&ProgKind::SyscallExit);
    for mut map in obj.maps_mut() {
        // Maps only some probe kinds use are not created when the plan has
        // none of those (libbpf poisons their loads in programs, which
        // fails only where the verifier reaches one): the kernel would
        // allocate what they hold (a USDT run's 80 KB of specs, a
        // preallocated hash of 1024) for nothing, and each is a map
        // creation at load and a close at exit.
        let unused = match map.name().to_str() {
            Some("uprobe_groups") => {
                map.set_max_entries(user.max(1) as u32)?;
                user == 0
            }
            // Threads in a syscall at once; only needed to remember numbers.
            Some("syscall_nrs") => !remember_syscall_nrs(plan),
            Some("syscall_probes") => !syscalls,
            // Read only by the cookie-less raw tracepoint program.
            Some(".rodata.raw_tp") => !have.contains(&ProgKind::RawTracepointClone),
            // libbpf's usdt.bpf.h, whose LINUX_HAS_BPF_COOKIE is the
            // objects' only kconfig extern.
            Some("__bpf_usdt_specs" | "__bpf_usdt_ip_to_spec_id") => usdt == 0,
            Some(n) if n.ends_with(".kconfig") => usdt == 0,
            _ => false,
        };
        if unused {
            map.set_autocreate(false)?;
        }
    }
    Ok(())
}

/// What libbpf should resolve CO-RE relocations against, when not the kernel's
/// own BTF: an empty BTF when none of the programs this plan loads has a CO-RE
/// relocation (`core_sections`, the object's sections that have, from build.rs).
///
/// libbpf reads and parses /sys/kernel/btf/vmlinux (5 MB) at load when any
/// program of the object has a relocation, loaded or not: 4 ms on hardware,
/// about 100 ms under emulation, a third of a tracepoint run's start-up there.
/// It relocates only the programs it loads, so for the others any target
/// will do. It still reads the kernel's BTF where it needs it for itself
/// (fentry targets, kfuncs). None when a loaded program may be relocated (a
/// relocation in an unknown section, `.text` say, could be in any of them).
pub fn core_target(plan: &Plan, core_sections: &[&str]) -> Option<&'static std::path::Path> {
    if core_sections.is_empty() {
        return None; // libbpf does not read the kernel's BTF for CO-RE then
    }
    let mut relocated = HashSet::new();
    for s in core_sections {
        relocated.insert(ProgKind::of(s)?);
    }
    // Every kind assumed present: the kinds needed can only grow.
    let mut need = prog_kinds(plan);
    need.extend(raw_tracepoint_kinds(plan, |_| true));
    if need.iter().any(|k| relocated.contains(k)) {
        return None;
    }
    empty_btf()
}

/// [`core_target`] before there is a plan, guessing it loads no
/// program with relocations (the common case: only syscall and block
/// tracepoints have them).
pub fn core_target_guess(core_sections: &[&str]) -> Option<&'static std::path::Path> {
    if core_sections.is_empty() {
        None
    } else {
        empty_btf()
    }
}

/// The raw tracepoint programs worth loading for this plan's tracepoints, of
/// those the object has (`present`).
pub(crate) fn raw_tracepoint_kinds(
    plan: &Plan,
    present: impl Fn(ProgKind) -> bool,
) -> Vec<ProgKind> {
    let mut kinds = Vec::new();
    // Tracepoints whose program the plan names take none of these links.
    let tps = || {
        plan.probes
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match &p.site {
                Site::Tracepoint(t) if plan.tracepoint_program(i).is_none() => Some(t),
                _ => None,
            })
    };
    let syscalls = |exit: bool| syscall_events(plan).any(|x| x == exit);
    let (enter, exit) = (syscalls(false), syscalls(true));
    if present(ProgKind::SyscallExit) && exit {
        kinds.push(ProgKind::SyscallExit);
    }
    // Without kernel reads, sys_enter remembers numbers for sys_exit.
    if present(ProgKind::SyscallEnter)
        && (enter || (kinds.contains(&ProgKind::SyscallExit) && !features::kernel_reads()))
    {
        kinds.push(ProgKind::SyscallEnter);
    }
    // A program that serves every tracepoint alike needs no cookie.
    let cookies = plan.raw_tracepoints == RawTracepoints::Alike || features::raw_tp_cookie();
    if present(ProgKind::RawTracepoint) && tps().any(|t| t.category != "syscalls") && cookies {
        kinds.push(ProgKind::RawTracepoint);
    } else if present(ProgKind::RawTracepointClone) && !raw_tp_clones(plan).is_empty() {
        kinds.push(ProgKind::RawTracepointClone);
    }
    kinds
}

/// Without raw tracepoint cookies, the probes the clones of the cookie-less
/// raw tracepoint program serve, ascending, the nth clone the nth probe: the
/// first [`RAW_TP_CLONES`] tracepoints a raw link may serve (the others are
/// perf events). Empty with cookies.
pub fn raw_tp_clones(plan: &Plan) -> Vec<usize> {
    if plan.raw_tracepoints != RawTracepoints::ByCookie
        || !plan.raw_attachable.contains(&true)
        || features::raw_tp_cookie()
    {
        return Vec::new();
    }
    let ones = plan.raw_attachable.iter().enumerate().filter(|(_, &ok)| ok);
    ones.map(|(i, _)| i).take(RAW_TP_CLONES).collect()
}

/// Whether the plan has syscall events (`syscalls:sys_enter_*`/`sys_exit_*`)
/// for the syscall programs to serve.
pub fn has_syscall_events(plan: &Plan) -> bool {
    syscall_events(plan).next().is_some()
}

/// The plan's syscall events for the syscall programs, each as whether it is
/// an exit (`sys_exit_*`); none with TRACEKIT_PERF_SYSCALLS=1 (perf events).
fn syscall_events(plan: &Plan) -> impl Iterator<Item = bool> + '_ {
    let raw = !crate::plan::perf_syscalls();
    // Those whose program the plan names are perf events.
    plan.probes
        .iter()
        .enumerate()
        .filter_map(move |(i, p)| match &p.site {
            Site::Tracepoint(t) if raw && plan.tracepoint_program(i).is_none() => {
                syscall_event(t).map(|(exit, _)| exit)
            }
            _ => None,
        })
}

/// Whether the syscall exit link needs sys_enter to remember syscall numbers
/// (the BPF program cannot read them from the registers): tools set their
/// `remember_nr` switch from it.
pub fn remember_syscall_nrs(plan: &Plan) -> bool {
    !features::kernel_reads() && syscall_events(plan).any(|exit| exit)
}

/// A path to an empty BTF (a header and the empty string), for libbpf's
/// `btf_custom_path`: a memfd kept open for the life of the process. None when it
/// cannot be made (no /proc, say); libbpf then reads the kernel's BTF as usual.
fn empty_btf() -> Option<&'static std::path::Path> {
    use std::io::Write;
    use std::os::fd::{FromRawFd, IntoRawFd};
    use std::sync::OnceLock;

    static PATH: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| {
        // struct btf_header: magic, version 1, flags, hdr_len 24, type_off,
        // type_len, str_off, str_len 1; then the string section "\0".
        let mut btf = Vec::with_capacity(25);
        btf.extend_from_slice(&0xeb9f_u16.to_le_bytes());
        btf.extend_from_slice(&[1, 0]);
        for v in [24u32, 0, 0, 0, 1] {
            btf.extend_from_slice(&v.to_le_bytes());
        }
        btf.push(0);
        // SAFETY: memfd_create with a valid NUL-terminated name; the fd is owned below.
        let fd = unsafe { libc::memfd_create(c"tracekit-empty-btf".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd is a fresh descriptor we own.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.write_all(&btf).ok()?;
        let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", file.into_raw_fd()));
        path.exists().then_some(path)
    })
    .as_deref()
}
