//! Processes: the privileges tracing needs, a target PID and its thread group,
//! whether it exited, and PID namespaces.

use std::fs;
use std::os::unix::fs::MetadataExt;

use anyhow::{bail, Result};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Fails unless the process may load BPF programs and open perf events.
pub fn require_root() -> Result<()> {
    let caps = effective_caps();
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    bail!("tracing needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN); run it with sudo")
}

/// The process's effective capabilities (none if they cannot be read), from
/// one capget(2) rather than parsing /proc/self/status.
fn effective_caps() -> u64 {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    /// _LINUX_CAPABILITY_VERSION_3: 64-bit sets, in two halves.
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: header and data are what capget(2) reads and writes for version 3.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if r != 0 {
        return 0;
    }
    u64::from(data[0].effective) | u64::from(data[1].effective) << 32
}

/// Fails with a clear message when `pid` names no running process.
pub fn check_pid(pid: u32) -> Result<()> {
    thread_group(pid).map(|_| ())
}

/// The name of `pid` if it is a kernel thread (PF_KTHREAD in the flags of its
/// stat): it has no user memory, runs no user code and makes no system calls.
/// The name is as the kernel gives it (escape it to print).
pub fn kernel_thread(pid: u32) -> Option<String> {
    /// include/linux/sched.h.
    const PF_KTHREAD: u64 = 0x0020_0000;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    // After the name: state, ppid, pgrp, session, tty_nr, tpgid, flags.
    let flags: u64 = rest.split_whitespace().nth(6)?.parse().ok()?;
    let name = head.split_once('(')?.1;
    (flags & PF_KTHREAD != 0).then(|| name.to_string())
}

/// Whether process `pid` has exited: it is gone, or a zombie not yet reaped
/// (which uprobes refuse with ESRCH).
pub fn exited(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// The process (thread group id) that `pid` belongs to: `pid` itself for a
/// process, its leader for a thread id. Fails when there is no such task.
pub fn thread_group(pid: u32) -> Result<u32> {
    let status = match fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) if pid != 0 => s,
        _ => bail!("no process with PID {pid}"),
    };
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok());
    match tgid {
        // A zombie that already released its threads still reports itself.
        Some(0) | None => Ok(pid),
        Some(t) => Ok(t),
    }
}

/// A pid namespace, identified as `bpf_get_ns_current_pid_tgid` expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidNs {
    pub dev: u64,
    pub ino: u64,
}

/// PROC_PID_INIT_INO: the inode number of the initial pid namespace, the one
/// that sees every process.
pub const INIT_PIDNS_INO: u64 = 0xEFFF_FFFC;

/// Our pid namespace; `None` where /proc cannot tell.
pub fn pidns() -> Option<PidNs> {
    static NS: std::sync::OnceLock<Option<PidNs>> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        let md = fs::metadata("/proc/self/ns/pid").ok()?;
        Some(PidNs {
            dev: md.dev(),
            ino: md.ino(),
        })
    })
}

/// Our pid namespace when it is not the initial one (we run in a container), in
/// which case PIDs given by the user must be matched in that namespace.
pub fn own_pidns() -> Option<PidNs> {
    pidns().filter(|ns| ns.ino != INIT_PIDNS_INO)
}

/// The PIDs of every process /proc shows (as it shows them).
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}
