//! Writing results: whole summaries at once, a closed stdout treated as a quiet end.

use std::io::{self, Write};

use anyhow::{Context, Result};

pub mod hist;

/// Writes `text` to stdout and flushes, so a summary reaches a pipe in one piece.
/// A closed stdout (`| head`) surfaces as an error that [`is_closed_stdout`] recognises.
pub fn emit(text: &str) -> Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing the output")
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
