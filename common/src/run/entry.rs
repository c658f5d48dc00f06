//! The process entry of every tool: the C `main` ([`crate::entry!`]), in place of the
//! one Rust's standard library defines for a binary.
//!
//! std's own start-up finds the main thread's stack guard for its stack-overflow
//! message, and glibc answers that by reading and `sscanf`-parsing all of
//! `/proc/self/maps`: 15% of the instructions of `funccount --version` on the
//! host, and about 12 ms of every run in the emulated benchmark guest (a
//! hello-world took 49.5 ms from fork to exit with it, 37.4 ms without, against
//! 34.3 ms for `/bin/true`). The tools start many times in scripts and their
//! start-up is the point of them, so they keep what of std's start-up they use:
//!
//! - standard descriptors 0-2 are opened on `/dev/null` when closed, so no BPF
//!   object or file ever takes their number (as std does);
//! - SIGPIPE is ignored, so a closed stdout is an `EPIPE` the tools end on
//!   quietly (as std does);
//! - a panic prints its message and exits with status 101 (as std does).
//!
//! What they give up is std's "thread 'main' has overflowed its stack" message:
//! a stack overflow is a plain SIGSEGV. Arguments still come from
//! `std::env::args` (glibc hands them to std's initializer), and
//! `std::process::exit` still flushes stdout.

/// Defines the C `main` of a tool whose crate is `#![no_main]` (outside
/// tests): the standard descriptors and SIGPIPE set up as std would, then
/// `$main()` (which ends the process with [`crate::run::cli::main`]); a panic exits
/// with status 101.
#[macro_export]
macro_rules! entry {
    ($main:path) => {
        // A test build keeps the test harness's own `main`.
        #[cfg(not(test))]
        #[export_name = "main"]
        extern "C" fn tracekit_entry(
            _argc: ::std::ffi::c_int,
            _argv: *const *const ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            $crate::entry_main($main)
        }
    };
}

/// The body of [`crate::entry!`]'s `main`.
pub fn run(main: fn()) -> ! {
    crate::timing::entered();
    standard_fds();
    // SAFETY: setting a signal's disposition to SIG_IGN has no memory effects.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // The stop handler first, before options are parsed: a tool started in the
    // background by a script inherits SIGINT ignored (BCC #2374), and a SIGINT
    // sent before the handler replaces that is lost, leaving the run endless.
    // One that comes early now ends the run at its first check.
    let _ = crate::stop::Stop::install();
    // `main` ends the process itself; exiting here flushes stdout as std does
    // after a panic (whose message the panic hook has printed).
    let code = match std::panic::catch_unwind(main) {
        Ok(()) => 0,
        Err(_) => 101,
    };
    std::process::exit(code)
}

/// Opens `/dev/null` on whichever of descriptors 0, 1 and 2 are closed, with
/// one `poll` for the usual case that none is.
fn standard_fds() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: fds is a valid array of three pollfds for the call.
    if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } < 0 {
        return;
    }
    for pfd in fds {
        if pfd.revents & libc::POLLNVAL != 0 {
            // SAFETY: a plain open(2); it takes the lowest free descriptor,
            // which is the closed one (lower ones are open or being filled).
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}
