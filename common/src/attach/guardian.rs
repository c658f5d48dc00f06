//! The guardian of a run's tracefs uprobe groups: a forked child that removes
//! them when the run is gone, however it went (kill -9 included).
//!
//! Why a process: tracefs events outlive their creator. A run that is killed
//! before its own cleanup leaves its `uprobe_events` lines (inert, but
//! "nothing left behind after any exit" is promised), and the sweep every run
//! does at its start ([`super::uprobe_groups::remove_stale_uprobe_events`])
//! only helps once another run comes, and cannot judge a group whose PID was
//! reused. Only something outside the process can act at its death.
//!
//! Why this shape, kept small:
//! - It waits on a pidfd of the run, opened by the run itself before the
//!   fork: that names the process, not its PID, so PID reuse cannot confuse
//!   it, and it becomes readable only after the run's descriptors are closed
//!   (exit_notify comes after exit_files), not when a thread exits (the
//!   flaw of PR_SET_PDEATHSIG).
//! - It removes the whole group in one command (`-:GROUP/`, which tracefs
//!   takes as "every event of GROUP"), so it needs to know no event names,
//!   retrying while the kernel still holds a perf event of it (EBUSY), for a
//!   bounded time.
//! - It never outlives the run by more than that: it has no other way to end,
//!   and after a normal exit (the run removed its groups itself) its one
//!   command fails with ENOENT at once.
//! - It is forked from a process with threads, so between fork and `_exit` it
//!   makes only raw system calls, on memory prepared before the fork (no
//!   allocation, no lock). It closes every inherited descriptor first (the
//!   run's BPF links and perf events must not live on in it, nor its stdout
//!   keep a pipe open), blocks every signal it can (Ctrl-C and SIGTERM are for
//!   the run, whose death it waits for), and leaves the run's process group,
//!   so a kill of that group leaves it to clean up.

use std::ffi::CString;
use std::sync::OnceLock;

/// How long the guardian retries a group the kernel still calls busy.
const BUSY_FOR_MS: u32 = 30_000;
const BUSY_STEP_MS: u32 = 20;

/// Starts the guardian of `group` (this process' uprobe group name, see
/// `uprobe_event_group`) once per process, before the first event of it is
/// made. Where it cannot be started (no pidfd before Linux 5.3, fork refused)
/// the run goes on: the sweep of the next run removes what a kill leaves.
pub(super) fn guard(uprobe_events: &std::path::Path, group: &str) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let _ = start(uprobe_events, group);
    });
}

fn start(uprobe_events: &std::path::Path, group: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(uprobe_events.as_os_str().as_bytes())?;
    let command = format!("-:{group}/\n").into_bytes();
    // SAFETY: pidfd_open of this process; a non-negative result is our fd.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let pidfd = pidfd as libc::c_int;
    // SAFETY: fork; the child runs only `watch`, which makes raw system calls
    // on memory prepared above and ends in _exit.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: in the child, see above.
        unsafe { watch(pidfd, &path, &command) }
    }
    // SAFETY: our descriptor; the child has its own copy.
    unsafe { libc::close(pidfd) };
    if child < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The guardian's life: wait for the run's exit, remove its group, exit.
///
/// # Safety
/// Only in the child of a fork: it closes every descriptor but `pidfd`.
unsafe fn watch(pidfd: libc::c_int, path: &CString, command: &[u8]) -> ! {
    let mut all: libc::sigset_t = std::mem::zeroed();
    libc::sigfillset(&mut all);
    libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
    libc::setpgid(0, 0);
    close_all_but(pidfd);
    let mut pfd = libc::pollfd {
        fd: pidfd,
        events: libc::POLLIN,
        revents: 0,
    };
    // Readable when the run has exited. On an error other than EINTR the run's
    // fate is unknown: leave its group (to the sweep) rather than remove it
    // from under a live run.
    loop {
        let r = libc::poll(&mut pfd, 1, -1);
        if r > 0 {
            break;
        }
        if r < 0 && *libc::__errno_location() != libc::EINTR {
            libc::_exit(0);
        }
    }
    let mut waited = 0;
    loop {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC,
        );
        if fd < 0 {
            break;
        }
        let n = libc::write(fd, command.as_ptr().cast(), command.len());
        let busy = n < 0 && *libc::__errno_location() == libc::EBUSY;
        libc::close(fd);
        if !busy || waited >= BUSY_FOR_MS {
            break;
        }
        let step = libc::timespec {
            tv_sec: 0,
            tv_nsec: i64::from(BUSY_STEP_MS) * 1_000_000,
        };
        libc::nanosleep(&step, std::ptr::null_mut());
        waited += BUSY_STEP_MS;
    }
    libc::_exit(0)
}

/// Closes every descriptor but `keep` (close_range since Linux 5.9; a loop
/// over the usual limit before it).
unsafe fn close_all_but(keep: libc::c_int) {
    let keep = keep as libc::c_uint;
    let below = keep.checked_sub(1).map(|hi| (0, hi));
    for (lo, hi) in below.into_iter().chain([(keep + 1, libc::c_uint::MAX)]) {
        if libc::syscall(libc::SYS_close_range, lo, hi, 0) < 0 {
            for fd in lo..hi.min(65_536) {
                libc::close(fd as libc::c_int);
            }
        }
    }
}
