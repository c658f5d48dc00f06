//! Raw BPF commands through libbpf's low-level API: loading a program from
//! instructions, creating links, opening raw tracepoints. For the feature probes
//! and for copies of loaded programs; no policy here.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

use libbpf_sys as sys;

/// Raw encodings of the few instructions the probes need.
pub const R0_0: [u8; 8] = [0xb7, 0, 0, 0, 0, 0, 0, 0]; // r0 = 0
pub const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0]; // exit

pub const fn call(helper: u8) -> [u8; 8] {
    [0x85, 0, 0, 0, helper, 0, 0, 0]
}

/// Loads `r0 = 0; exit` as a kprobe-type program with `expected` attach type.
pub fn load_trivial(expected: sys::bpf_attach_type) -> Result<OwnedFd, i32> {
    load(sys::BPF_PROG_TYPE_KPROBE, expected, 0, &[R0_0, EXIT])
}

pub fn load(
    ty: sys::bpf_prog_type,
    expected: sys::bpf_attach_type,
    attach_btf_id: u32,
    code: &[[u8; 8]],
) -> Result<OwnedFd, i32> {
    let insns: Vec<sys::bpf_insn> = code
        .iter()
        // SAFETY: bpf_insn is a plain 8-byte struct; these are its wire encodings.
        .map(|i| unsafe { std::mem::transmute::<[u8; 8], sys::bpf_insn>(*i) })
        .collect();
    load_insns(ty, None, expected, attach_btf_id, &insns)
}

/// Loads `insns` as a program of type `ty` (a GPL one) with libbpf's
/// low-level `bpf_prog_load`: these probes, and copies of loaded programs
/// ([`crate::attach::links`]'s raw tracepoint clones).
pub fn load_insns(
    ty: sys::bpf_prog_type,
    name: Option<&CStr>,
    expected: sys::bpf_attach_type,
    attach_btf_id: u32,
    insns: &[sys::bpf_insn],
) -> Result<OwnedFd, i32> {
    let mut opts = sys::bpf_prog_load_opts {
        sz: size_of::<sys::bpf_prog_load_opts>() as _,
        expected_attach_type: expected,
        attach_btf_id,
        ..Default::default()
    };
    // SAFETY: insns and the strings outlive the call; opts is a valid, sized struct.
    let fd = unsafe {
        sys::bpf_prog_load(
            ty,
            name.map_or(ptr::null(), CStr::as_ptr),
            c"GPL".as_ptr(),
            insns.as_ptr(),
            insns.len() as _,
            &mut opts,
        )
    };
    if fd < 0 {
        return Err(-fd);
    }
    // SAFETY: a non-negative return is a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn link_create(
    prog: &OwnedFd,
    ty: sys::bpf_attach_type,
    opts: &sys::bpf_link_create_opts,
) -> Result<OwnedFd, i32> {
    // SAFETY: opts points at caller-owned data valid for the call.
    let fd = unsafe { sys::bpf_link_create(prog.as_raw_fd(), 0, ty, opts) };
    if fd >= 0 {
        // SAFETY: a non-negative return is a new fd that we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    } else {
        Err(-fd)
    }
}

/// Opens a raw tracepoint link, with `cookie` unless it is 0 (which kernels
/// before 6.10 take); the link closes (detaches) when the fd is dropped.
pub fn raw_tp_open(prog: &OwnedFd, name: &str, cookie: u64) -> Result<OwnedFd, i32> {
    let name = CString::new(name).map_err(|_| libc::EINVAL)?;
    let opts = sys::bpf_raw_tp_opts {
        sz: size_of::<sys::bpf_raw_tp_opts>() as _,
        tp_name: name.as_ptr(),
        cookie,
    };
    // SAFETY: name outlives the call; opts is a valid, sized struct.
    let fd =
        unsafe { sys::bpf_raw_tracepoint_open_opts(prog.as_raw_fd(), &opts as *const _ as *mut _) };
    if fd < 0 {
        return Err(-fd);
    }
    // SAFETY: a non-negative return is a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
