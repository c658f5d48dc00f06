//! Probe hits the kernel dropped before a program ran (kretprobe instances used
//! up, recursion), as it reports them in link info since Linux 6.7; older kernels
//! report none. Uprobes have no such count in link info: their programs' own
//! recursion misses are read (a uprobe program runs preemptible, so another
//! task's BPF program preempted on the same CPU makes the kernel skip it).
//! Latency tools print them so that no call is lost in silence.
//!
//! libbpf-rs has no link-info reader for these fields; libbpf-sys's raw
//! `bpf_link_get_info_by_fd` is used.

use std::os::fd::{AsRawFd, BorrowedFd};

use libbpf_sys as sys;

/// Hits the kernel missed on these links, summed: kprobe_multi (and session)
/// links and perf-event kprobes/kretprobes.
pub fn missed<'a>(links: impl Iterator<Item = BorrowedFd<'a>>) -> u64 {
    let mut uprobe_progs = std::collections::BTreeSet::new();
    let mut n = 0;
    for fd in links {
        let (missed, uprobe_prog) = link_missed(fd.as_raw_fd());
        n += missed;
        uprobe_progs.extend(uprobe_prog);
    }
    n + uprobe_progs.into_iter().map(prog_misses).sum::<u64>()
}

/// The recursion misses of the program `fd` holds: the runs the kernel skipped
/// because the program was running on that CPU already (a raw tracepoint's
/// program preempted there by another task that hits the tracepoint).
pub fn program_misses(fd: BorrowedFd) -> u64 {
    let mut info: sys::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<sys::bpf_prog_info>() as u32;
    // SAFETY: a zeroed bpf_prog_info with every array pointer 0 asks for
    // counts only.
    match unsafe { sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), &mut info, &mut len) } {
        0 => info.recursion_misses,
        _ => 0,
    }
}

/// The recursion misses of program `id` (0 when it cannot be read).
fn prog_misses(id: u32) -> u64 {
    // SAFETY: plain bpf(2) wrappers; a zeroed bpf_prog_info with every array
    // pointer 0 asks for counts only; the fd is closed at once.
    unsafe {
        let fd = sys::bpf_prog_get_fd_by_id(id);
        if fd < 0 {
            return 0;
        }
        let mut info: sys::bpf_prog_info = std::mem::zeroed();
        let mut len = size_of::<sys::bpf_prog_info>() as u32;
        let ok = sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len) == 0;
        libc::close(fd);
        if ok {
            info.recursion_misses
        } else {
            0
        }
    }
}

/// A link's missed hits, and its program's id when it is a uprobe's (whose
/// misses are the program's).
fn link_missed(fd: i32) -> (u64, Option<u32>) {
    // SAFETY: a zeroed bpf_link_info is valid (no pointers are handed to the
    // kernel: every array pointer stays 0, so only counts come back).
    let mut info: sys::bpf_link_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<sys::bpf_link_info>() as u32;
    // SAFETY: info and len are valid for the call.
    if unsafe { sys::bpf_link_get_info_by_fd(fd, &mut info, &mut len) } != 0 {
        return (0, None);
    }
    // SAFETY: the union member read is the one the kernel filled for this type.
    unsafe {
        match info.type_ {
            sys::BPF_LINK_TYPE_KPROBE_MULTI => (info.__bindgen_anon_1.kprobe_multi.missed, None),
            sys::BPF_LINK_TYPE_UPROBE_MULTI => (0, Some(info.prog_id)),
            sys::BPF_LINK_TYPE_PERF_EVENT => {
                let pe = info.__bindgen_anon_1.perf_event;
                match pe.type_ {
                    sys::BPF_PERF_EVENT_KPROBE | sys::BPF_PERF_EVENT_KRETPROBE => {
                        (pe.__bindgen_anon_1.kprobe.missed, None)
                    }
                    sys::BPF_PERF_EVENT_UPROBE | sys::BPF_PERF_EVENT_URETPROBE => {
                        (0, Some(info.prog_id))
                    }
                    _ => (0, None),
                }
            }
            _ => (0, None),
        }
    }
}
