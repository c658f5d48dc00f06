//! The one stop request of a run and the signal policy around it: SIGINT, SIGTERM
//! and SIGHUP (all print the final summary), the duration elapsing, the traced
//! process exiting or a client's `POST /stop`; polled by attach loops and the run loop.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Duration,
    TargetExited,
    /// `POST /stop` through `--listen`.
    Requested,
    /// The reader of stdout (a pipe or socket) went away: `... | head` has its lines.
    OutputClosed,
}

/// What the process is doing, for the signal handler: a repeated signal may end
/// the process at once only while no probe is attached. Exiting with probes
/// attached closes their descriptors from threads the exit has sent SIGKILL, and
/// the kernel cannot remove a uprobe's breakpoint from a traced process for a task
/// with a fatal signal pending ("leaking uprobe"): the int3 stays in the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Nothing attached (start-up, or everything detached): a second signal exits.
    Idle = 0,
    /// Probes are being attached: attaching stops at the next probe.
    Attaching = 1,
    /// Probes are attached and counting.
    Tracing = 2,
    /// Probes are being detached: further signals are ignored.
    Detaching = 3,
    /// Everything attached has been detached and the run is ending: further
    /// signals are ignored too (a second Ctrl-C there would turn a clean stop
    /// into status 130 as the last output is written).
    Done = 4,
}

/// Process-wide stop request, set from the signal handler or a watcher thread and
/// polled by long operations (attaching thousands of probes) and the run loop.
pub struct Stop {
    flag: AtomicBool,
    reason: Mutex<Option<StopReason>>,
    cv: Condvar,
    phase: AtomicU8,
    told: AtomicBool,
}

static STOP: OnceLock<Stop> = OnceLock::new();

impl Stop {
    pub(crate) fn new() -> Stop {
        Stop {
            flag: AtomicBool::new(false),
            reason: Mutex::new(None),
            cv: Condvar::new(),
            phase: AtomicU8::new(Phase::Idle as u8),
            told: AtomicBool::new(false),
        }
    }

    /// Installs the SIGINT/SIGTERM/SIGHUP handler (once) and returns the stop state.
    /// The first signal requests a stop (attaching stops at the next probe, then
    /// the final summary is printed and everything detached). A second signal
    /// exits at once (status 130) only while nothing is attached, as when start-up
    /// is stuck; with probes attached it is ignored, since exiting half way through
    /// a detach leaves uprobe breakpoints in traced processes (see [`Phase`]).
    pub fn install() -> Result<&'static Stop> {
        let mut first = false;
        let stop = STOP.get_or_init(|| {
            first = true;
            Stop::new()
        });
        if first {
            ctrlc::set_handler(move || {
                STOP.get()
                    .expect("initialised before the handler")
                    .on_signal()
            })
            .context("installing signal handlers")?;
        }
        Ok(stop)
    }

    fn on_signal(&self) {
        // A run that ended by itself (-d, -p's exit) has no stop request set:
        // the first signal during its detach is told of it like a second one.
        if !self.is_set() && !matches!(self.phase(), Phase::Detaching | Phase::Done) {
            self.trigger(StopReason::Signal);
            return;
        }
        // The run is ending: the flag lets an output nobody reads be given
        // up (output::emit), whatever the phase.
        self.flag.store(true, Ordering::Relaxed);
        let note = match self.phase() {
            Phase::Idle => std::process::exit(130),
            Phase::Attaching => "stopping: detaching the probes attached so far",
            // The run is ending: its last output, then the detach.
            Phase::Tracing => {
                "stopping: writing the last output, then detaching; this is not interrupted, so no probe is left behind"
            }
            Phase::Detaching => {
                "detaching is in progress; it is not interrupted, so no probe is left behind"
            }
            Phase::Done => return,
        };
        if !self.told.swap(true, Ordering::Relaxed) {
            crate::diag::warn(note);
        }
    }

    /// Whether the run was asked to stop (false before [`Stop::install`]).
    pub fn requested() -> bool {
        STOP.get().is_some_and(Stop::is_set)
    }

    /// The process-wide stop state, if [`Stop::install`] has run.
    pub fn global() -> Option<&'static Stop> {
        STOP.get()
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::SeqCst) {
            1 => Phase::Attaching,
            2 => Phase::Tracing,
            3 => Phase::Detaching,
            4 => Phase::Done,
            _ => Phase::Idle,
        }
    }

    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::SeqCst);
    }

    /// Runs `detach` as [`Phase::Detaching`], then enters [`Phase::Done`]: signals
    /// are ignored from here to the exit, so none cuts a detach short.
    pub fn detaching<T>(&self, detach: impl FnOnce() -> T) -> T {
        self.set_phase(Phase::Detaching);
        let out = detach();
        self.set_phase(Phase::Done);
        out
    }

    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    pub fn reason(&self) -> Option<StopReason> {
        *self.reason.lock().expect("stop lock")
    }

    /// Requests a stop; the first reason given wins.
    pub fn trigger(&self, why: StopReason) {
        let mut r = self.reason.lock().expect("stop lock");
        if r.is_none() {
            *r = Some(why);
        }
        self.flag.store(true, Ordering::Relaxed);
        self.cv.notify_all();
    }

    /// Sleeps until `deadline` (forever if `None`) or a stop; returns the stop reason.
    pub fn wait_until(&self, deadline: Option<Instant>) -> Option<StopReason> {
        let mut r = self.reason.lock().expect("stop lock");
        loop {
            if r.is_some() {
                return *r;
            }
            match deadline {
                None => r = self.cv.wait(r).expect("stop lock"),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    r = self.cv.wait_timeout(r, d - now).expect("stop lock").0;
                }
            }
        }
    }

    /// Stops the run when stdout is a pipe or socket whose reader goes away
    /// (`... | head -1` once the head has its line): a tool that writes only
    /// at events (trace, with none coming) or at its end would otherwise run on
    /// unseen, as BCC's do. Its next write fails and it ends quietly. A thread
    /// that sleeps in poll(2), started once and only for such an stdout.
    pub fn watch_output(&'static self) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: an all-zero stat is valid; fstat(1) writes into it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            if unsafe { libc::fstat(1, &mut st) } != 0 {
                return;
            }
            let kind = st.st_mode & libc::S_IFMT;
            if kind != libc::S_IFIFO && kind != libc::S_IFSOCK {
                return;
            }
            let _ = thread::Builder::new()
                .name("stdout-watch".into())
                .spawn(move || loop {
                    // No events asked: poll returns on POLLERR (a pipe without
                    // readers) or POLLHUP (a socket whose peer is gone).
                    let mut pfd = libc::pollfd {
                        fd: 1,
                        events: 0,
                        revents: 0,
                    };
                    // SAFETY: pfd is a valid pollfd for the duration of the call.
                    let rc = unsafe { libc::poll(&mut pfd, 1, -1) };
                    if rc < 0 {
                        if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                        {
                            continue;
                        }
                        return;
                    }
                    if pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                        self.trigger(StopReason::OutputClosed);
                        return;
                    }
                    if pfd.revents & libc::POLLNVAL != 0 {
                        return;
                    }
                });
        });
    }

    /// Stops the run when process `pid` exits (as bpftrace does for `-p`).
    pub fn watch_pid(&'static self, pid: u32) -> Result<()> {
        // SAFETY: plain syscall; a non-negative result is a new fd we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ESRCH) {
                bail!("no process with PID {pid}");
            }
            // Kernels before 5.3: poll /proc instead.
            thread::spawn(move || {
                while std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    thread::sleep(Duration::from_millis(100));
                }
                self.trigger(StopReason::TargetExited);
            });
            return Ok(());
        }
        // SAFETY: fd is a fresh pidfd owned from here on.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        thread::spawn(move || {
            let mut pfd = libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // A pidfd becomes readable when the process exits.
            // SAFETY: pfd is a valid pollfd for the duration of the call.
            while unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {}
            self.trigger(StopReason::TargetExited);
        });
        Ok(())
    }
}

impl Stop {
    /// Waits like [`Stop::wait_until`] while calling `poll(timeout)` (a ring buffer
    /// poll, say) in slices short enough to notice a stop request promptly; an
    /// error of `poll`'s ends the wait with it.
    pub fn poll_until(
        &self,
        deadline: Option<Instant>,
        mut poll: impl FnMut(Duration) -> anyhow::Result<()>,
    ) -> anyhow::Result<Option<StopReason>> {
        const SLICE: Duration = Duration::from_millis(100);
        loop {
            if let Some(r) = self.reason() {
                return Ok(Some(r));
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => SLICE,
            };
            if left.is_zero() {
                return Ok(None);
            }
            poll(left.min(SLICE))?;
        }
    }
}
