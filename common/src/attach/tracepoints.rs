//! Tracepoints: perf-event tracepoint links, raw tracepoint links (with
//! cookies, or without, a program each), and the syscall events served by one
//! raw sys_enter and one sys_exit link.

use std::ffi::CString;

use libbpf_rs::{Link, ProgramMut as Program};
use libbpf_sys as sys;

use super::{collect, parallel, take_link, Attached, Prog, ATTACH_THREADS};
use crate::run::Stop;

/// Tracepoint sites: probe index, category, event, label.
pub(crate) fn tracepoints(
    prog: &Program,
    sites: &[(usize, &str, &str, &str)],
    stop: &Stop,
    out: &mut Attached,
) {
    let prog = Prog::of(prog);
    let results = parallel(sites, ATTACH_THREADS, stop, |&(i, cat, ev, _)| {
        let (cat, ev) = (
            CString::new(cat).map_err(|_| libc::EINVAL)?,
            CString::new(ev).map_err(|_| libc::EINVAL)?,
        );
        // bpf_tracepoint_opts has padding on some targets and none on others.
        #[allow(clippy::needless_update)]
        let opts = sys::bpf_tracepoint_opts {
            sz: size_of::<sys::bpf_tracepoint_opts>() as _,
            bpf_cookie: i as u64,
            ..Default::default()
        };
        // SAFETY: strings and opts outlive the call.
        take_link(unsafe {
            sys::bpf_program__attach_tracepoint_opts(prog.ptr(), cat.as_ptr(), ev.as_ptr(), &opts)
        })
    });
    let before = out.links();
    collect(sites, results, |s| s.0, |s| s.3, out, Attached::skip);
    out.perf_tracepoints += out.links() - before;
}

/// A tracepoint as a raw tracepoint link: the program, the probe index, the
/// tracepoint's name, and whether the link carries the probe index as its
/// cookie (Linux 6.10+; a cookie-less program knows its probe itself).
pub(crate) struct RawSite<'a, 'p> {
    pub prog: &'a Program<'p>,
    pub probe: usize,
    pub name: &'a str,
    pub cookie: bool,
}

/// Attaches raw tracepoint sites. Returns the indices (into `sites`) of those the
/// kernel refused, for perf-event tracepoints to try.
pub(crate) fn raw_tracepoints(sites: &[RawSite], stop: &Stop, out: &mut Attached) -> Vec<usize> {
    let sites: Vec<(Prog, usize, &str, bool)> = sites
        .iter()
        .map(|s| (Prog::of(s.prog), s.probe, s.name, s.cookie))
        .collect();
    let results = parallel(&sites, ATTACH_THREADS, stop, |&(prog, i, name, cookie)| {
        let name = CString::new(name).map_err(|_| libc::EINVAL)?;
        let mut opts = sys::bpf_raw_tracepoint_opts {
            sz: size_of::<sys::bpf_raw_tracepoint_opts>() as _,
            cookie: if cookie { i as u64 } else { 0 },
        };
        // SAFETY: name and opts outlive the call.
        take_link(unsafe {
            sys::bpf_program__attach_raw_tracepoint_opts(prog.ptr(), name.as_ptr(), &mut opts)
        })
    });
    let mut refused = Vec::new();
    for (k, r) in results.into_iter().enumerate() {
        match r {
            Some(Ok(link)) => {
                out.add(link, [sites[k].1 as u64]);
                out.raw_tracepoint_links += 1;
            }
            Some(Err(_)) => refused.push(k),
            None => {}
        }
    }
    refused
}

/// A syscalls:sys_enter_* / sys_exit_* event served by the raw syscall links.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SyscallSite {
    pub probe: usize,
    pub nr: u32,
    pub exit: bool,
}

/// Slots per direction in the BPF `syscall_probes` map (bpf/funccount.bpf.c).
const SYSCALL_SLOTS: u32 = 1024;

/// Fills the `syscall_probes` map (syscall number to probe index) and attaches one
/// raw link on sys_enter and/or sys_exit for all the syscall events. With
/// `remember`, sys_enter is attached even for exit events only (it remembers
/// each syscall's number for sys_exit). Returns the sites not served (a link the
/// kernel refused), for perf-event tracepoints to try.
pub(crate) fn syscalls(
    enter: Option<&Program>,
    exit: Option<&Program>,
    map: &libbpf_rs::Map,
    sites: &[SyscallSite],
    remember: bool,
    out: &mut Attached,
) -> Vec<SyscallSite> {
    use libbpf_rs::MapCore;
    let mut refused = Vec::new();
    let (mut enters, mut exits): (Vec<SyscallSite>, Vec<SyscallSite>) =
        sites.iter().partition(|s| !s.exit);
    for s in enters.iter().chain(&exits) {
        let slot = s.nr + if s.exit { SYSCALL_SLOTS } else { 0 };
        let value = s.probe as u32 + 1;
        if s.nr >= SYSCALL_SLOTS
            || map
                .update(
                    &slot.to_ne_bytes(),
                    &value.to_ne_bytes(),
                    libbpf_rs::MapFlags::ANY,
                )
                .is_err()
        {
            refused.push(*s);
        }
    }
    enters.retain(|s| s.nr < SYSCALL_SLOTS);
    exits.retain(|s| s.nr < SYSCALL_SLOTS);
    let attach = |prog: Option<&Program>, tp: &str| -> Option<Link> {
        let name = CString::new(tp).expect("no NUL");
        // SAFETY: name outlives the call.
        take_link(unsafe {
            sys::bpf_program__attach_raw_tracepoint(Prog::of(prog?).ptr(), name.as_ptr())
        })
        .ok()
    };
    let enter_link = if !enters.is_empty() || (remember && !exits.is_empty()) {
        attach(enter, "sys_enter")
    } else {
        None
    };
    match enter_link {
        Some(link) => {
            out.add(link, enters.iter().map(|s| s.probe as u64));
            out.syscall_links += 1;
            out.syscall_events += enters.len();
        }
        None => {
            refused.append(&mut enters);
            if remember {
                refused.append(&mut exits);
            }
        }
    }
    if !exits.is_empty() {
        match attach(exit, "sys_exit") {
            Some(link) => {
                out.add(link, exits.iter().map(|s| s.probe as u64));
                out.syscall_links += 1;
                out.syscall_events += exits.len();
            }
            None => refused.append(&mut exits),
        }
    }
    refused
}
