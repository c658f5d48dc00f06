//! Probe hits the kernel dropped before a program ran (kretprobe instances used
//! up, recursion), as it reports them in link info since Linux 6.7; older kernels
//! report none. Latency tools print them so that no call is lost in silence.
//!
//! libbpf-rs has no link-info reader for these fields; libbpf-sys's raw
//! `bpf_link_get_info_by_fd` is used.

use std::os::fd::{AsRawFd, BorrowedFd};

use libbpf_sys as sys;

/// Hits the kernel missed on these links, summed: kprobe_multi (and session)
/// links and perf-event kprobes/kretprobes.
pub fn missed<'a>(links: impl Iterator<Item = BorrowedFd<'a>>) -> u64 {
    links.map(|fd| link_missed(fd.as_raw_fd())).sum()
}

fn link_missed(fd: i32) -> u64 {
    // SAFETY: a zeroed bpf_link_info is valid (no pointers are handed to the
    // kernel: every array pointer stays 0, so only counts come back).
    let mut info: sys::bpf_link_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<sys::bpf_link_info>() as u32;
    // SAFETY: info and len are valid for the call.
    if unsafe { sys::bpf_link_get_info_by_fd(fd, &mut info, &mut len) } != 0 {
        return 0;
    }
    // SAFETY: the union member read is the one the kernel filled for this type.
    unsafe {
        match info.type_ {
            sys::BPF_LINK_TYPE_KPROBE_MULTI => info.__bindgen_anon_1.kprobe_multi.missed,
            sys::BPF_LINK_TYPE_PERF_EVENT => {
                let pe = info.__bindgen_anon_1.perf_event;
                match pe.type_ {
                    sys::BPF_PERF_EVENT_KPROBE | sys::BPF_PERF_EVENT_KRETPROBE => {
                        pe.__bindgen_anon_1.kprobe.missed
                    }
                    _ => 0,
                }
            }
            _ => 0,
        }
    }
}
