//! What every tool's `main` shares: error reporting and exit codes.

use std::sync::OnceLock;

use anyhow::Result;

static TOOL: OnceLock<&'static str> = OnceLock::new();

/// Runs a tool's body. Errors print as one `tool: error: ...` line and exit 1; a
/// closed stdout ends quietly with 0. The body has returned, and so detached every
/// probe, before the process exits.
pub fn main(tool: &'static str, body: impl FnOnce() -> Result<()>) -> ! {
    let _ = TOOL.set(tool);
    // Single probes hold descriptors; Plan::attach checks the need against this.
    crate::system::raise_fd_soft_limit();
    // libbpf's own messages are noise next to ours; TRACEKIT_DEBUG=1 shows them.
    let verbose = std::env::var_os("TRACEKIT_DEBUG").is_some_and(|v| v != "0");
    let _ =
        libbpf_rs::set_print(verbose.then_some((libbpf_rs::PrintLevel::Debug, print_libbpf as _)));
    let code = match body() {
        Ok(()) => 0,
        Err(e) if crate::output::is_closed_stdout(&e) => 0,
        Err(e) => {
            eprintln!("{tool}: error: {e:#}");
            1
        }
    };
    std::process::exit(code)
}

fn print_libbpf(_level: libbpf_rs::PrintLevel, msg: String) {
    eprint!("libbpf: {msg}");
}

/// A one-line warning on stderr, prefixed with the tool's name.
pub fn warn(msg: &str) {
    eprintln!("{}: {msg}", TOOL.get().copied().unwrap_or("tracekit"));
}
