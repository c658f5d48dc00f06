//! File descriptors: the soft limit raised to the hard one, how many are open, and
//! the check (and its advice) that a run's probes fit in the limit.

use std::fs;

use anyhow::{bail, Result};

/// Raises the open-file soft limit to the hard limit (tools call it at start:
/// single probes hold two descriptors each). Returns the soft limit in force.
pub fn raise_fd_soft_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return u64::MAX;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: valid in-pointer; failure leaves the limit unchanged.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    lim.rlim_cur
}

/// How many file descriptors this process has open.
pub fn open_fds() -> usize {
    fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

/// Whether `e` comes from running out of file descriptors (EMFILE), which
/// libbpf's errors carry only in their text.
pub fn out_of_fds(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EMFILE))
            || c.to_string()
                .contains(&format!("(os error {})", libc::EMFILE))
    })
}

/// What to do about [`out_of_fds`]: the limit, and how to raise it.
pub fn fd_limit_hint() -> String {
    let limit = raise_fd_soft_limit();
    format!("the open-file limit is {limit}: raise it with `ulimit -n 1024` (or `prlimit --nofile=1024`)")
}

/// Fails, before anything is attached, when `probes` more descriptors (plus
/// `reserve` for what the run opens later, such as symbol files) would not fit
/// under the open-file limit, saying how many are needed and how to get them.
pub fn check_fd_limit(probes: usize, reserve: usize) -> Result<()> {
    /// Room under the limit beyond which the descriptors already open are not
    /// counted (a directory listing): a tool has a few dozen open before
    /// attaching, not thousands.
    const HEADROOM: u64 = 4096;
    let limit = raise_fd_soft_limit();
    if (probes + reserve) as u64 + HEADROOM <= limit {
        return Ok(());
    }
    let need = open_fds() + probes + reserve;
    if need as u64 <= limit {
        return Ok(());
    }
    bail!(
        "this run needs {need} file descriptors ({probes} for its probes), over the \
         open-file limit of {limit}: raise it with `ulimit -n {need}` (or `prlimit \
         --nofile={need}`), or trace fewer probes"
    )
}
