//! Diagnostics every stage may print: the tool's name, warnings and errors on
//! stderr, libbpf's messages, the option that asks for more detail, and escaping
//! of text that came from users or the kernel, so that it can neither break a line
//! nor drive a terminal. The bottom of the crate: it imports nothing of it.

use std::io::Write as _;
use std::sync::OnceLock;

static TOOL: OnceLock<&'static str> = OnceLock::new();

/// Names the running tool for every message it prints (once, from `cli::main`).
pub fn set_tool(tool: &'static str) {
    let _ = TOOL.set(tool);
}

/// Records the running tool's clap command for [`debug_flag`] (once, from `cli::parse`).
pub fn set_command(command: fn() -> clap::Command) {
    let _ = COMMAND.set(command);
}

/// The running tool's clap command, for [`debug_flag`] (set by `cli::parse`).
static COMMAND: OnceLock<fn() -> clap::Command> = OnceLock::new();

/// The option that makes the running tool list what it matched and skipped:
/// its `--debug` (as `-D` where it has that short form: stackcount's `-D` is
/// BCC's duration), else its `--verbose` (trace's `-v`).
pub fn debug_flag() -> String {
    COMMAND
        .get()
        .map_or_else(|| "--debug".into(), |command| debug_flag_of(&command()))
}

fn debug_flag_of(cmd: &clap::Command) -> String {
    let flag = |id: &str| {
        let a = cmd.get_arguments().find(|a| a.get_id() == id)?;
        match (a.get_short(), a.get_long()) {
            (Some(c), _) => Some(format!("-{c}")),
            (None, l) => l.map(|l| format!("--{l}")),
        }
    };
    flag("debug")
        .or_else(|| flag("verbose"))
        .unwrap_or_else(|| "--debug".into())
}

/// The running tool's name (as given to `cli::main`).
pub fn tool_name() -> &'static str {
    TOOL.get().copied().unwrap_or("tracekit")
}

/// Silences libbpf's own messages, noise next to ours, unless TRACEKIT_DEBUG=1
/// asks for them. Once per process, before libbpf can print: a tool's object is
/// opened on another thread from its first line ([`crate::object::ahead`]).
pub fn route_libbpf_messages() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let verbose = std::env::var_os("TRACEKIT_DEBUG").is_some_and(|v| v != "0");
        let _ = libbpf_rs::set_print(
            verbose.then_some((libbpf_rs::PrintLevel::Debug, print_libbpf as _)),
        );
    });
}

fn print_libbpf(_level: libbpf_rs::PrintLevel, msg: String) {
    // libbpf names itself in most of its messages.
    match msg.starts_with("libbpf: ") {
        true => stderr(&msg),
        false => stderr(&format!("libbpf: {msg}")),
    }
}

/// Writes `text` to stderr. An unwritable stderr (`2>/dev/full`, a closed pipe)
/// is ignored: losing a message must not abort a trace or skip its detach.
pub fn stderr(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// A one-line warning on stderr, prefixed with the tool's name.
pub fn warn(msg: &str) {
    stderr(&format!("{}: {}\n", tool_name(), one_line(msg)));
}

/// A message kept to one line: control characters in it are escaped.
fn one_line(msg: &str) -> String {
    escape(msg)
}

/// `text` safe to print on one line of a terminal: control characters (including
/// ESC and newlines) and invalid UTF-8 become `\xNN`, so that user input or kernel
/// data echoed in a message can neither break it over lines nor drive the terminal.
pub fn escape(text: impl AsRef<[u8]>) -> String {
    let bytes = text.as_ref();
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\x{b:02x}"));
                }
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// [`escape`] for a string, shortened when very long (a 10,000-byte path is not read
/// by anyone): its start, then `... (N bytes)`.
pub fn escape_str(s: &str) -> String {
    shorten(s.as_bytes())
}

pub(crate) fn shorten(bytes: &[u8]) -> String {
    const MAX: usize = 160;
    if bytes.len() > MAX {
        format!("{}... ({} bytes)", escape(&bytes[..MAX / 2]), bytes.len())
    } else {
        escape(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_control_bytes() {
        assert_eq!(escape("a\x1b[31mb\nc\x01"), "a\\x1b[31mb\\x0ac\\x01");
        assert_eq!(escape("vfs_*"), "vfs_*");
    }

    /// The debug options of funccount (`-D`/`--debug`), stackcount (`--debug`
    /// beside `-v`/`--verbose` and a `-D` of its own) and trace (`-v`/`--verbose`).
    #[test]
    fn the_debug_flag_is_the_tools_own() {
        #[derive(clap::Parser)]
        struct Funccount {
            #[arg(short = 'D', long)]
            debug: bool,
        }
        #[derive(clap::Parser)]
        struct Stackcount {
            #[arg(long)]
            debug: bool,
            #[arg(short, long)]
            verbose: bool,
            #[arg(short = 'D')]
            duration: Option<u64>,
        }
        #[derive(clap::Parser)]
        struct Trace {
            #[arg(short, long)]
            verbose: bool,
        }
        use clap::CommandFactory as _;
        assert_eq!(debug_flag_of(&Funccount::command()), "-D");
        assert_eq!(debug_flag_of(&Stackcount::command()), "--debug");
        assert_eq!(debug_flag_of(&Trace::command()), "-v");
    }
}
