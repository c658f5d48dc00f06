//! Writing results: whole summaries at once, a closed stdout treated as a quiet end,
//! and a stdout nobody reads given up once the run is asked to stop.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use anyhow::{Context, Result};

pub mod hist;
pub mod pprof;

/// Writes `text` to stdout and flushes, so a summary reaches a pipe in one piece.
/// A closed stdout (`| head`) surfaces as an error that [`is_closed_stdout`] recognises.
///
/// To a pipe, socket or terminal it writes in pieces the kernel takes without
/// blocking (at most PIPE_BUF bytes once poll(2) says there is room), so that a
/// reader that stops reading (`| sleep 100`) cannot hold the run for ever:
/// while it waits, the run's [`give_up_when`] check is asked every 100 ms, and
/// once it says so (a stop was requested) the rest of the output is dropped,
/// with one warning.
pub fn emit(text: &str) -> Result<()> {
    let mut out = io::stdout().lock();
    if !stdout_may_block() {
        return out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("writing the output");
    }
    let mut bytes = text.as_bytes();
    while !bytes.is_empty() {
        if ABANDONED.load(Ordering::Relaxed) || !writable() {
            return Ok(());
        }
        let n = bytes.len().min(libc::PIPE_BUF);
        match out.write(&bytes[..n]) {
            Ok(k) => bytes = &bytes[k..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("writing the output"),
        }
    }
    out.flush().context("writing the output")
}

static GIVE_UP: OnceLock<fn() -> bool> = OnceLock::new();
static ABANDONED: AtomicBool = AtomicBool::new(false);

/// Sets when [`emit`] stops waiting for a stdout nobody reads (the session:
/// when a stop was requested).
pub fn give_up_when(check: fn() -> bool) {
    let _ = GIVE_UP.set(check);
}

/// Waits until stdout takes a PIPE_BUF write; false once the wait is given up.
fn writable() -> bool {
    loop {
        let mut pfd = libc::pollfd {
            fd: 1,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, 100) };
        // Ready, or an error the write will report (POLLERR: no reader).
        if rc != 0 && !(rc < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted) {
            return true;
        }
        if GIVE_UP.get().is_some_and(|g| g()) {
            if !ABANDONED.swap(true, Ordering::Relaxed) {
                crate::diag::warn(
                    "stopping: stdout is not being read; the rest of the output is dropped",
                );
            }
            return false;
        }
    }
}

/// Whether stdout is a pipe, socket or terminal (a reader may stop taking
/// what is written), not a file or /dev/null.
fn stdout_may_block() -> bool {
    static MAY: OnceLock<bool> = OnceLock::new();
    *MAY.get_or_init(|| {
        // SAFETY: an all-zero stat is valid; fstat(1) fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(1, &mut st) } != 0 {
            return false;
        }
        let kind = st.st_mode & libc::S_IFMT;
        // SAFETY: isatty has no preconditions.
        kind == libc::S_IFIFO || kind == libc::S_IFSOCK || unsafe { libc::isatty(1) } == 1
    })
}

/// A status line ("Tracing...", "Detaching..."): on stdout with the tables, as BCC
/// prints it, or on stderr when stdout carries JSON.
pub fn status(json: bool, line: &str) -> Result<()> {
    if json {
        crate::diag::stderr(&format!("{line}\n"));
        Ok(())
    } else {
        emit(&format!("{line}\n"))
    }
}

/// True when the error comes from writing to a closed pipe.
pub fn is_closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Local wall-clock time as `HH:MM:SS`, BCC's `-T` format.
pub fn timestamp() -> String {
    // SAFETY: time(NULL) and localtime_r with a valid out-pointer.
    let tm = unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

/// Seconds since the Unix epoch, for machine-readable output.
pub fn unix_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// The one envelope of every `--json` summary and `/summary` reply: `time` (as the
/// tables print it), `unix_time`, whether it is the `final` one, and the tool's
/// `fields` (an object) beside them.
pub fn summary_record(last: bool, fields: serde_json::Value) -> serde_json::Value {
    let mut v = serde_json::json!({
        "time": timestamp(),
        "unix_time": unix_time(),
        "final": last,
    });
    if let (Some(v), serde_json::Value::Object(fields)) = (v.as_object_mut(), fields) {
        v.extend(fields);
    }
    v
}

/// BCC's start line, `Tracing N functions for "PATTERN"... Hit Ctrl-C to end.`
/// ("functions" even for one, as BCC prints it and scripts wait for it). Patterns
/// are quoted with control characters escaped.
pub fn banner<S: AsRef<str>>(probes: usize, patterns: &[S]) -> String {
    let patterns = patterns
        .iter()
        .map(|p| format!("\"{}\"", crate::diag::escape(p.as_ref())))
        .collect::<Vec<_>>()
        .join(", ");
    format!("Tracing {probes} functions for {patterns}... Hit Ctrl-C to end.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banner_is_bccs() {
        assert_eq!(
            banner(1, &["vfs_read"]),
            "Tracing 1 functions for \"vfs_read\"... Hit Ctrl-C to end."
        );
        assert_eq!(
            banner(2, &["a", "b\x1b"]),
            "Tracing 2 functions for \"a\", \"b\\x1b\"... Hit Ctrl-C to end."
        );
    }
}
