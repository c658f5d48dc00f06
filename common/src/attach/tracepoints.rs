//! Tracepoints: perf-event tracepoint links, raw tracepoint links (with
//! cookies, or without, a clone of the program each), and the syscall events
//! served by one raw sys_enter and one sys_exit link.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use libbpf_rs::{Link, ProgramMut as Program};
use libbpf_sys as sys;

use super::links::{collect, parallel, take_link, Attached, Held, Prog, ATTACH_THREADS};
use crate::stop::Stop;
use crate::sys::errno::tracepoint_errno_reason;

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
    collect(
        sites,
        results,
        |s| s.0,
        |s| s.3,
        out,
        Attached::skip_tracepoint,
    );
    out.perf_tracepoints += out.links() - before;
}

/// Raw tracepoint sites (probe index, tracepoint name) on `prog`, each link
/// carrying its probe index as cookie when `cookie` (Linux 6.10+; without, the
/// program serves every tracepoint alike). Returns the indices (into `sites`)
/// of those the kernel refused, for perf-event tracepoints to try.
pub(crate) fn raw_tracepoints(
    prog: &Program,
    cookie: bool,
    sites: &[(usize, &str)],
    stop: &Stop,
    out: &mut Attached,
) -> Vec<usize> {
    let prog = Prog::of(prog);
    let results = parallel(sites, ATTACH_THREADS, stop, |&(i, name)| {
        let name = CString::new(name).map_err(|_| libc::EINVAL)?;
        let mut opts = sys::bpf_raw_tracepoint_opts {
            sz: size_of::<sys::bpf_raw_tracepoint_opts>() as _,
            cookie: if cookie { i as u64 } else { 0 },
        };
        // SAFETY: name and opts outlive the call.
        take_link(unsafe {
            sys::bpf_program__attach_raw_tracepoint_opts(prog.ptr(), name.as_ptr(), &mut opts)
        })
        .map(Held::Libbpf)
    });
    keep_raw_links(results, |k| sites[k].0, out)
}

/// A tracepoint as a raw tracepoint link without a cookie (before Linux 6.10):
/// the probe index, the tracepoint's name, and which clone of the cookie-less
/// program counts it (the one whose `raw_tp_probes` slot names the probe).
pub(crate) struct CloneSite<'a> {
    pub probe: usize,
    pub name: &'a str,
    pub slot: usize,
}

/// Attaches cookie-less raw tracepoint sites: slot 0 through `prog` itself,
/// the others through clones of it, each loaded with `bpf_prog_load` from
/// the instructions libbpf loaded `prog` with (`bpf_program__insns`, libbpf's
/// way to clone a program after it has resolved maps and relocations), with
/// its one load from the `slots` map (the `raw_tp_probes` array) moved to
/// its slot. Returns the indices (into `sites`) of those not attached, for
/// perf-event tracepoints to try.
pub(crate) fn raw_tracepoint_clones(
    prog: &Program,
    slots: BorrowedFd<'_>,
    sites: &[CloneSite],
    stop: &Stop,
    out: &mut Attached,
) -> Vec<usize> {
    let prog = Prog::of(prog);
    // SAFETY: a loaded program's instructions stay until its object closes,
    // after the attach.
    let insns = unsafe {
        let (p, n) = (
            sys::bpf_program__insns(prog.ptr()),
            sys::bpf_program__insn_cnt(prog.ptr()),
        );
        if p.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(p, n as usize)
        }
    };
    let slot_load = slot_load(insns, slots.as_raw_fd());
    // SAFETY: a loaded program's name is a NUL-terminated string it owns.
    let name = unsafe { CStr::from_ptr(sys::bpf_program__name(prog.ptr())) };
    let results = parallel(sites, ATTACH_THREADS, stop, |site| {
        let tp = CString::new(site.name).map_err(|_| libc::EINVAL)?;
        if site.slot == 0 {
            // SAFETY: tp outlives the call.
            let link = take_link(unsafe {
                sys::bpf_program__attach_raw_tracepoint(prog.ptr(), tp.as_ptr())
            })?;
            return Ok(Held::Libbpf(link));
        }
        let at = slot_load.ok_or(libc::ENOTSUP)?;
        let mut copy = insns.to_vec();
        let offset = site.slot * size_of::<u32>();
        copy[at + 1].imm = i32::try_from(offset).map_err(|_| libc::E2BIG)?;
        let clone = crate::sys::bpf::load_insns(
            sys::BPF_PROG_TYPE_RAW_TRACEPOINT,
            Some(name),
            0,
            0,
            &copy,
        )?;
        // SAFETY: tp outlives the call; the link holds the clone from now on.
        let link = unsafe { sys::bpf_raw_tracepoint_open(tp.as_ptr(), clone.as_raw_fd()) };
        if link < 0 {
            return Err(-link);
        }
        // SAFETY: a new link descriptor, ours alone.
        Ok(Held::Fd(unsafe { OwnedFd::from_raw_fd(link) }))
    });
    keep_raw_links(results, |k| sites[k].probe, out)
}

/// Keeps the raw tracepoint links made for sites in order (`probe(k)`: the
/// kth site's probe); returns the indices of the sites refused.
fn keep_raw_links(
    results: Vec<Option<Result<Held, i32>>>,
    probe: impl Fn(usize) -> usize,
    out: &mut Attached,
) -> Vec<usize> {
    let mut refused = Vec::new();
    for (k, r) in results.into_iter().enumerate() {
        match r {
            Some(Ok(link)) => {
                out.add_held(link, probe(k) as u64);
                out.raw_tracepoint_links += 1;
            }
            Some(Err(_)) => refused.push(k),
            None => {}
        }
    }
    refused
}

/// The index of the one 64-bit load of an address in the map `fd`'s value, at
/// its start (`&raw_tp_probes[0]`), in a loaded program's instructions; None
/// when there is not exactly one (then no clone is made).
fn slot_load(insns: &[sys::bpf_insn], fd: RawFd) -> Option<usize> {
    const LD_IMM64: u8 = (sys::BPF_LD | sys::BPF_IMM | sys::BPF_DW) as u8;
    let mut found = insns.windows(2).enumerate().filter(|(_, w)| {
        w[0].code == LD_IMM64
            && u32::from(w[0].src_reg()) == sys::BPF_PSEUDO_MAP_VALUE
            && w[0].imm == fd
    });
    match (found.next(), found.next()) {
        (Some((at, w)), None) if w[1].imm == 0 => Some(at),
        _ => None,
    }
}

/// A syscalls:sys_enter_* / sys_exit_* event served by the raw syscall links.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SyscallSite {
    pub probe: usize,
    pub nr: u32,
    pub exit: bool,
}

/// Slots per direction in the BPF `syscall_probes` map (bpf/syscalls.h).
const SYSCALL_SLOTS: u32 = 1024;

/// Fills the `syscall_probes` map (syscall number to probe index) and attaches one
/// raw link on sys_enter and/or sys_exit for all the syscall events. With
/// `remember`, sys_enter is attached even for exit events only (it remembers
/// each syscall's number for sys_exit). Returns the sites not served, with
/// why (a link the kernel refused, say), for perf-event tracepoints to try.
pub(crate) fn syscalls(
    enter: Option<&Program>,
    exit: Option<&Program>,
    map: &libbpf_rs::Map,
    sites: &[SyscallSite],
    remember: bool,
    out: &mut Attached,
) -> Vec<(SyscallSite, String)> {
    use libbpf_rs::MapCore;
    let mut refused = Vec::new();
    let (mut enters, mut exits): (Vec<SyscallSite>, Vec<SyscallSite>) =
        sites.iter().partition(|s| !s.exit);
    for s in enters.iter().chain(&exits) {
        let slot = s.nr + if s.exit { SYSCALL_SLOTS } else { 0 };
        let value = s.probe as u32 + 1;
        if s.nr >= SYSCALL_SLOTS {
            let why = format!("syscall number {} is past the raw links' table", s.nr);
            refused.push((*s, why));
        } else if let Err(e) = map.update(
            &slot.to_ne_bytes(),
            &value.to_ne_bytes(),
            libbpf_rs::MapFlags::ANY,
        ) {
            refused.push((*s, format!("writing the syscall table: {e}")));
        }
    }
    enters.retain(|s| !refused.iter().any(|(r, _)| r.probe == s.probe));
    exits.retain(|s| !refused.iter().any(|(r, _)| r.probe == s.probe));
    let attach = |prog: Option<&Program>, tp: &str| -> Result<Link, String> {
        let name = CString::new(tp).expect("no NUL");
        let prog = prog.ok_or("no program for it was loaded")?;
        // SAFETY: name outlives the call.
        take_link(unsafe {
            sys::bpf_program__attach_raw_tracepoint(Prog::of(prog).ptr(), name.as_ptr())
        })
        .map_err(|errno| {
            format!(
                "the kernel refused a raw {tp} link: {}",
                tracepoint_errno_reason(errno)
            )
        })
    };
    let refuse = |sites: &mut Vec<SyscallSite>, why: &str, refused: &mut Vec<_>| {
        refused.extend(sites.drain(..).map(|s| (s, why.to_string())));
    };
    if !enters.is_empty() || (remember && !exits.is_empty()) {
        match attach(enter, "sys_enter") {
            Ok(link) => {
                out.add(link, enters.iter().map(|s| s.probe as u64));
                out.syscall_links += 1;
                out.syscall_events += enters.len();
            }
            Err(why) => {
                refuse(&mut enters, &why, &mut refused);
                if remember {
                    refuse(&mut exits, &why, &mut refused);
                }
            }
        }
    }
    if !exits.is_empty() {
        match attach(exit, "sys_exit") {
            Ok(link) => {
                out.add(link, exits.iter().map(|s| s.probe as u64));
                out.syscall_links += 1;
                out.syscall_events += exits.len();
            }
            Err(why) => refuse(&mut exits, &why, &mut refused),
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-bit load of `src` (a pseudo source) `imm` at `off` into the value,
    /// its second half, and a plain load.
    fn ld_imm64(src: u32, imm: i32, off: i32) -> [sys::bpf_insn; 3] {
        let mut first = sys::bpf_insn {
            code: (sys::BPF_LD | sys::BPF_IMM | sys::BPF_DW) as u8,
            imm,
            ..Default::default()
        };
        first.set_src_reg(src as u8);
        let second = sys::bpf_insn {
            imm: off,
            ..Default::default()
        };
        let ldx = sys::bpf_insn {
            code: (sys::BPF_LDX | sys::BPF_MEM | sys::BPF_W) as u8,
            ..Default::default()
        };
        [first, second, ldx]
    }

    #[test]
    fn the_slot_load_is_the_one_load_of_the_maps_value_start() {
        let value = sys::BPF_PSEUDO_MAP_VALUE;
        let insns: Vec<_> = [ld_imm64(value, 5, 12), ld_imm64(value, 7, 0)].concat();
        assert_eq!(slot_load(&insns, 7), Some(3));
        // Another map's load only, or none at all.
        assert_eq!(slot_load(&insns, 9), None);
        assert_eq!(slot_load(&insns[..3], 7), None);
        // Not at the array's start: not the load to move.
        assert_eq!(slot_load(&ld_imm64(value, 7, 4), 7), None);
        // Two loads of the map: which one names the slot is unknown.
        let twice: Vec<_> = [ld_imm64(value, 7, 0), ld_imm64(value, 7, 0)].concat();
        assert_eq!(slot_load(&twice, 7), None);
        // A map's address (not its value's) with the same descriptor.
        assert_eq!(slot_load(&ld_imm64(sys::BPF_PSEUDO_MAP_FD, 7, 0), 7), None);
    }
}
