//! Kernel feature probes that must run before a program is loaded: a program's
//! expected attach type (multi or single) is fixed at load time.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::OnceLock;

use libbpf_sys as sys;

use crate::kernel::btf::{Kbtf, Ty};
use crate::sys::bpf::{call, link_create, load, load_trivial, raw_tp_open, EXIT, R0_0};

/// Whether kprobe_multi links work. Asked first without touching kernel text
/// (`kprobe_link_refused`); a kernel that answers otherwise than expected gets
/// the trial attach to a function every kernel has and can trace (as bpftrace
/// and cilium/ebpf do). A name that happens not to exist (ESRCH) moves on to the
/// next candidate, ending with `fallback`.
pub fn kprobe_multi(fallback: &str) -> Result<(), String> {
    crate::timing::span("features", || {
        kprobe_link("kprobe_multi", sys::BPF_TRACE_KPROBE_MULTI, fallback)
    })
}

/// Whether kprobe.session links work (Linux 6.10+ with CONFIG_FPROBE), tested as
/// [`kprobe_multi`] is.
pub fn kprobe_session(fallback: &str) -> Result<(), String> {
    crate::timing::span("features", || {
        kprobe_link("kprobe.session", sys::BPF_TRACE_KPROBE_SESSION, fallback)
    })
}

fn kprobe_link(what: &str, ty: sys::bpf_attach_type, fallback: &str) -> Result<(), String> {
    let prog = load_trivial(ty).map_err(|e| {
        format!(
            "loading a {what} program: {}",
            crate::sys::errno::errno_reason(e)
        )
    })?;
    match kprobe_link_refused(&prog, ty) {
        Some(libc::E2BIG) => return Ok(()),
        Some(e @ (libc::EOPNOTSUPP | 524)) => {
            return Err(format!(
                "creating a {what} link: {}",
                crate::sys::errno::errno_reason(e)
            ))
        }
        _ => {}
    }
    for symbol in ["vprintk", "ksys_read", "do_sys_openat2", fallback] {
        let Ok(name) = CString::new(symbol) else {
            continue;
        };
        let mut syms = [name.as_ptr()];
        let mut opts = sys::bpf_link_create_opts {
            sz: size_of::<sys::bpf_link_create_opts>() as _,
            ..Default::default()
        };
        opts.__bindgen_anon_1.kprobe_multi =
            sys::bpf_link_create_opts__bindgen_ty_1__bindgen_ty_2 {
                cnt: 1,
                syms: syms.as_mut_ptr(),
                ..Default::default()
            };
        match link_create(&prog, ty, &opts) {
            Ok(_) => return Ok(()),
            Err(libc::ESRCH | libc::ENOENT) => continue,
            Err(e) => {
                return Err(format!(
                    "creating a {what} link on {symbol}: {}",
                    crate::sys::errno::errno_reason(e)
                ))
            }
        }
    }
    Err("no probe symbol found".to_string())
}

/// A kprobe_multi-style link request that fails fast and patches nothing: more
/// functions than the kernel takes in one link (MAX_KPROBE_MULTI_CNT, 2^20), so
/// a kernel with the link type answers E2BIG before it reads the (invalid)
/// address array; one built without fprobe answers EOPNOTSUPP, one older than
/// the link type EINVAL. (An address that is no function would get EINVAL from
/// ftrace, the same as an old kernel.) Returns the errno (`None` if a link was
/// made, which cannot happen).
fn kprobe_link_refused(prog: &OwnedFd, ty: sys::bpf_attach_type) -> Option<i32> {
    const MAX_KPROBE_MULTI_CNT: u32 = 1 << 20;
    let mut opts = sys::bpf_link_create_opts {
        sz: size_of::<sys::bpf_link_create_opts>() as _,
        ..Default::default()
    };
    opts.__bindgen_anon_1.kprobe_multi = sys::bpf_link_create_opts__bindgen_ty_1__bindgen_ty_2 {
        cnt: MAX_KPROBE_MULTI_CNT + 1,
        // Never dereferenced by a kernel that checks the count first; one that
        // does not faults on it (EFAULT) and gets the trial attach.
        addrs: std::ptr::dangling(),
        ..Default::default()
    };
    link_create(prog, ty, &opts).err()
}

/// Whether the kernel's BTF is there for libbpf to resolve the session
/// programs' kfuncs at load (without it, the load fails with ESRCH). Only its
/// sysfs file is looked for: a kernel whose BTF is elsewhere (a vmlinux under
/// /boot) gets the mechanisms that need none.
pub fn kernel_btf() -> bool {
    std::fs::File::open("/sys/kernel/btf/vmlinux").is_ok()
}

/// The reason [`kernel_btf`] gives no.
pub const NO_KERNEL_BTF: &str =
    "the session programs need the kernel's BTF, and /sys/kernel/btf/vmlinux cannot be read (CONFIG_DEBUG_INFO_BTF)";

/// Whether uprobe_multi links work with PID filtering (kernel 6.6, PID fix in 6.10),
/// probed the way libbpf does: a bad path must give EBADF, a bad PID EINVAL.
pub fn uprobe_multi() -> bool {
    crate::timing::span("features", || uprobe_link(sys::BPF_TRACE_UPROBE_MULTI))
}

/// Whether uprobe.session links work (Linux 6.13+), probed as [`uprobe_multi`].
pub fn uprobe_session() -> bool {
    crate::timing::span("features", || uprobe_link(sys::BPF_TRACE_UPROBE_SESSION))
}

fn uprobe_link(ty: sys::bpf_attach_type) -> bool {
    let Ok(prog) = load_trivial(ty) else {
        return false;
    };
    let path = CString::new("/").expect("no NUL");
    let offset: std::os::raw::c_ulong = 0;
    let attempt = |pid: u32| {
        let mut opts = sys::bpf_link_create_opts {
            sz: size_of::<sys::bpf_link_create_opts>() as _,
            ..Default::default()
        };
        opts.__bindgen_anon_1.uprobe_multi =
            sys::bpf_link_create_opts__bindgen_ty_1__bindgen_ty_3 {
                cnt: 1,
                path: path.as_ptr(),
                offsets: &offset,
                pid,
                ..Default::default()
            };
        link_create(&prog, ty, &opts).err()
    };
    attempt(0) == Some(libc::EBADF) && attempt(u32::MAX) == Some(libc::EINVAL)
}

/// Whether raw tracepoint links take a BPF cookie (Linux 6.10+), found by loading a
/// raw tracepoint program that reads its cookie and opening a link with one (to a
/// tracepoint that does not exist, else to one every kernel has, for the moment
/// of the probe). TRACEKIT_NO_RAW_TP_COOKIE=1 answers no (to test, on any
/// kernel, the paths of kernels before 6.10).
pub fn raw_tp_cookie() -> bool {
    *RAW_TP_COOKIE.get_or_init(|| crate::timing::span("features", raw_tp_cookie_probe))
}

static RAW_TP_COOKIE: OnceLock<bool> = OnceLock::new();

fn raw_tp_cookie_forced_off() -> bool {
    std::env::var_os("TRACEKIT_NO_RAW_TP_COOKIE").is_some_and(|v| v != "0")
}

fn raw_tp_cookie_probe() -> bool {
    if raw_tp_cookie_forced_off() {
        return false;
    }
    match raw_tp_cookie_untried() {
        Some(answer) => answer,
        None => raw_tp_cookie_trial(),
    }
}

/// The cookie program's load, then a link to a tracepoint that does not exist:
/// a kernel that takes the cookie gets as far as looking the name up (ENOENT)
/// and enables nothing. None: any other answer, for the trial attach to decide.
fn raw_tp_cookie_untried() -> Option<bool> {
    let Ok(prog) = raw_tp_cookie_prog() else {
        return Some(false);
    };
    match raw_tp_open(&prog, "tracekit_no_such_tracepoint", 1) {
        Err(libc::ENOENT) => Some(true),
        _ => None,
    }
}

/// A link to a tracepoint every kernel has, for the moment of the probe.
fn raw_tp_cookie_trial() -> bool {
    raw_tp_cookie_prog().is_ok_and(|prog| raw_tp_open(&prog, "sched_switch", 1).is_ok())
}

fn raw_tp_cookie_prog() -> Result<OwnedFd, i32> {
    const GET_ATTACH_COOKIE: u8 = 174;
    load(
        sys::BPF_PROG_TYPE_RAW_TRACEPOINT,
        0,
        0,
        &[call(GET_ATTACH_COOKIE), R0_0, EXIT],
    )
}

/// Answers, ahead of the asking, probes that cannot change the kernel's state
/// (program loads, a link to no tracepoint), from the thread that opens the
/// tool's object while the tool parses its options ([`crate::object::ahead`]): whether
/// kernel reads work, for an object with a syscall-exit program, and whether
/// raw tracepoints take cookies, for one with raw tracepoint programs. An answer
/// that would take a trial attach is left for the run that asks, if it asks.
pub fn answer_ahead(kernel_reads: bool, raw_tp_cookie: bool) {
    if kernel_reads {
        let _ = KERNEL_READS.get_or_init(kernel_reads_probe);
    }
    if raw_tp_cookie && !raw_tp_cookie_forced_off() {
        if let Some(answer) = raw_tp_cookie_untried() {
            let _ = RAW_TP_COOKIE.set(answer);
        }
    }
}

/// Whether raw tracepoint `name` passes its programs at least `n` (1..=12)
/// arguments; `None` when there is no such tracepoint or no answer. The kernel
/// refuses to attach a raw tracepoint program that reads past the tracepoint's
/// arguments (EINVAL): a program reading argument n is tried, and where it
/// attaches, detached at once. Tracepoints change arguments between versions
/// (block_rq_issue lost its queue in Linux 5.11 and in 5.10.137); this answers
/// without parsing the kernel's BTF (9 ms on the host, for one answer).
pub fn tracepoint_has_arg(name: &str, n: u8) -> Option<bool> {
    if !(1..=12).contains(&n) {
        return None;
    }
    let off = (8 * (u16::from(n) - 1)).to_le_bytes();
    // r0 = *(u64 *)(r1 + off); r0 = 0; exit
    let read = [0x79, 0x10, off[0], off[1], 0, 0, 0, 0];
    let prog = load(sys::BPF_PROG_TYPE_RAW_TRACEPOINT, 0, 0, &[read, R0_0, EXIT]).ok()?;
    // The link, if made, is dropped (detached) at once.
    match raw_tp_open(&prog, name, 0) {
        Ok(_) => Some(true),
        Err(e) => (e == libc::EINVAL).then_some(false),
    }
}

/// Whether BPF programs may read kernel memory (bpf_probe_read_kernel, which
/// lockdown=confidentiality forbids), found by loading a program that calls it.
/// TRACEKIT_NO_KERNEL_READS=1 answers no (to test the locked-down paths).
pub fn kernel_reads() -> bool {
    *KERNEL_READS.get_or_init(|| crate::timing::span("features", kernel_reads_probe))
}

static KERNEL_READS: OnceLock<bool> = OnceLock::new();

/// What the warm-up object's load (bpf/warmup.bpf.c, [`crate::object::ahead`]) tells:
/// its program calls bpf_probe_read_kernel too, so when it loaded, kernel reads
/// work and the probe need not load a program of its own to say so.
pub fn kernel_reads_seen_in_warmup() {
    let _ = KERNEL_READS.get_or_init(|| !kernel_reads_forced_off());
}

/// TRACEKIT_NO_KERNEL_READS=1 (tests of the locked-down paths).
fn kernel_reads_forced_off() -> bool {
    std::env::var_os("TRACEKIT_NO_KERNEL_READS").is_some_and(|v| v != "0")
}

fn kernel_reads_probe() -> bool {
    if kernel_reads_forced_off() {
        return false;
    }
    const PROBE_READ_KERNEL: u8 = 113;
    load(
        sys::BPF_PROG_TYPE_RAW_TRACEPOINT,
        0,
        0,
        &[
            [0xbf, 0xa1, 0, 0, 0, 0, 0, 0],             // r1 = r10
            [0x07, 0x01, 0, 0, 0xf8, 0xff, 0xff, 0xff], // r1 += -8
            [0xb7, 0x02, 0, 0, 8, 0, 0, 0],             // r2 = 8
            [0xb7, 0x03, 0, 0, 0, 0, 0, 0],             // r3 = 0
            call(PROBE_READ_KERNEL),
            R0_0,
            EXIT,
        ],
    )
    .is_ok()
}

/// The byte offset of `thread_info.status` (its TS_COMPAT flag) in the kernel's
/// `task_struct`, which funccount's syscall programs read to leave out compat
/// syscalls. Read from the kernel's BTF once per boot and cached
/// ([`crate::kernel::functions::cache`]): parsing the BTF costs 4 ms on hardware and about 90 ms
/// under emulation, which a CO-RE relocation would make libbpf pay at every
/// load. None without BTF, or when the field is not a 32-bit integer.
pub fn task_status_offset() -> Option<u32> {
    *TASK_STATUS.get_or_init(|| crate::timing::span("features", task_status_lookup))
}

static TASK_STATUS: OnceLock<Option<u32>> = OnceLock::new();

fn task_status_lookup() -> Option<u32> {
    let boot = crate::kernel::functions::cache::boot_id()
        .filter(|_| !crate::kernel::functions::cache::disabled());
    if let Some(boot) = &boot {
        if let Ok(off) = crate::kernel::functions::cache::load_task_status(
            &crate::kernel::functions::cache::dir(),
            boot,
        ) {
            return Some(off);
        }
    }
    let off = task_status_from_btf()?;
    if let Some(boot) = &boot {
        crate::kernel::functions::cache::store_task_status(
            &crate::kernel::functions::cache::dir(),
            boot,
            off,
        );
    }
    Some(off)
}

/// `task_struct.thread_info` plus `thread_info.status`, from the kernel's BTF.
fn task_status_from_btf() -> Option<u32> {
    task_status_in(&Kbtf::load().ok()?)
}

fn task_status_in(btf: &Kbtf) -> Option<u32> {
    let task = btf.record("struct", "task_struct")?;
    let (ti, ti_ty) = btf.member(task, "thread_info").ok()?;
    let (status, status_ty) = btf.member(ti_ty, "status").ok()?;
    matches!(btf.ty(status_ty), Ty::Int { bytes: 4, .. }).then_some(ti + status)
}

/// Whether `func` (a vmlinux function) can be traced with fentry/fexit: a trivial
/// tracing program is loaded for it (as libbpf-tools' fentry_can_attach does), and
/// the function must have an ftrace site, which the cached function table knows;
/// without a fresh cache the program is attached to find out. Fails under
/// lockdown, without BTF, and for module functions.
pub fn fentry(func: &str) -> Result<(), String> {
    crate::timing::span("features", || fentry_probe(func))
}

fn fentry_probe(func: &str) -> Result<(), String> {
    let btf = Kbtf::load().map_err(|_| "no kernel BTF".to_string())?;
    let id = btf
        .func_id(func)
        .ok_or_else(|| format!("{func} is not in the kernel's BTF"))?;
    drop(btf);
    let prog = load(
        sys::BPF_PROG_TYPE_TRACING,
        sys::BPF_TRACE_FENTRY,
        id,
        &[R0_0, EXIT],
    )
    .map_err(|e| {
        format!(
            "loading an fentry program: {}",
            crate::sys::errno::errno_reason(e)
        )
    })?;
    // Loaded: the kernel takes the target's prototype. Attaching patches the
    // function's ftrace site (a trampoline built, then torn down after an RCU
    // tasks grace period: 0.2 s under emulation), so ask the table first.
    if let Some(traceable) = crate::kernel::functions::has_ftrace_site(func) {
        return if traceable {
            Ok(())
        } else {
            Err(format!(
                "{func} has no ftrace site (not in available_filter_functions)"
            ))
        };
    }
    let opts = sys::bpf_link_create_opts {
        sz: size_of::<sys::bpf_link_create_opts>() as _,
        ..Default::default()
    };
    link_create(&prog, sys::BPF_TRACE_FENTRY, &opts)
        .map(drop)
        .map_err(|e| {
            format!(
                "attaching fentry to {func}: {}",
                crate::sys::errno::errno_reason(e)
            )
        })
}

/// Whether BPF programs can walk user stacks by unwind tables here
/// (bpf/unwind.h): bpf_loop (Linux 5.17) and bpf_task_pt_regs (5.15), asked of
/// the kernel as libbpf probes helpers, and an x86-64 machine (the tables'
/// registers are x86-64's). TRACEKIT_NO_UNWIND=1 answers no, to test the
/// fallback anywhere.
pub fn unwind_tables() -> Result<(), String> {
    if !cfg!(target_arch = "x86_64") {
        return Err("the unwind tables are x86-64's".into());
    }
    if std::env::var_os("TRACEKIT_NO_UNWIND").is_some_and(|v| v != "0") {
        return Err("TRACEKIT_NO_UNWIND is set".into());
    }
    let has = |helper| {
        // SAFETY: no options; the probe loads and frees a program of its own.
        let rc = unsafe {
            sys::libbpf_probe_bpf_helper(sys::BPF_PROG_TYPE_KPROBE, helper, std::ptr::null())
        };
        rc == 1
    };
    crate::timing::span("features", || {
        match (has(sys::BPF_FUNC_loop), has(sys::BPF_FUNC_task_pt_regs)) {
            (true, true) => Ok(()),
            (false, _) => Err("this kernel has no bpf_loop (Linux 5.17)".into()),
            (_, false) => Err("this kernel has no bpf_task_pt_regs (Linux 5.15)".into()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compat_check_reads_thread_info_status() {
        // x86-64 since 5.11: task_struct begins with thread_info { unsigned long
        // flags; unsigned long syscall_work; u32 status; ... }.
        let btf = Kbtf::load().expect("the kernel's BTF");
        assert_eq!(task_status_in(&btf), Some(16));
    }

    #[test]
    fn tracepoint_arguments_as_the_kernel_counts_them() {
        // sched_switch(preempt, prev, next, prev_state) since Linux 5.18;
        // block_rq_issue(rq) since 5.11.
        assert_eq!(tracepoint_has_arg("sched_switch", 4), Some(true));
        assert_eq!(tracepoint_has_arg("sched_switch", 5), Some(false));
        assert_eq!(tracepoint_has_arg("block_rq_issue", 1), Some(true));
        assert_eq!(tracepoint_has_arg("block_rq_issue", 2), Some(false));
        assert_eq!(tracepoint_has_arg("tracekit_no_such_tracepoint", 1), None);
    }
}
