//! The start-up handshake of the test programs (included with `#[path]`): block
//! SIGUSR1, print `ready`, and wait for the signal before doing the measured work,
//! so nothing else runs between the test's go-ahead and the calls it counts.

use std::io::Write;

pub struct Ready(libc::sigset_t);

impl Ready {
    /// Blocks SIGUSR1 (so it is only taken by `wait`) and announces readiness.
    #[allow(dead_code)] // not every program uses both forms
    pub fn announce() -> Ready {
        let r = Ready::blocked();
        r.print();
        r
    }

    /// Blocks SIGUSR1 in this thread and in the threads it starts from now on;
    /// [`Ready::print`] then announces readiness.
    pub fn blocked() -> Ready {
        // SAFETY: plain libc signal-mask calls on a zeroed, then initialised, set.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            set
        };
        Ready(set)
    }

    pub fn print(&self) {
        println!("ready");
        std::io::stdout().flush().unwrap();
    }

    /// Waits for the next SIGUSR1.
    pub fn wait(&self) {
        let mut sig = 0;
        // SAFETY: the set is initialised; sig is a valid out-pointer.
        while unsafe { libc::sigwait(&self.0, &mut sig) } != 0 || sig != libc::SIGUSR1 {}
    }
}
