//! What every tool's `main` shares: the flags common to all tools (declared and
//! validated once), value parsers, error reporting and exit codes.

use std::io::Write as _;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::diag::{escape, route_libbpf_messages, stderr, warn};
use crate::probe::mode::AttachMode;
use crate::sys::process;

/// Runs a tool's body. Errors print as one `tool: error: ...` line and exit 1; a
/// closed stdout ends quietly with 0. The body has returned, and so detached every
/// probe, before the process exits.
pub fn main(tool: &'static str, body: impl FnOnce() -> Result<()>) -> ! {
    crate::diag::set_tool(tool);
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if matches!(args.as_slice(), [a] if a == crate::attach::SWEEP_FLAG) {
        crate::attach::sweep_now();
        std::process::exit(0);
    }
    // Single probes hold descriptors; attach::attach checks the need against this.
    crate::sys::fds::raise_fd_soft_limit();
    route_libbpf_messages();
    let code = match body() {
        Ok(()) => 0,
        Err(e) if crate::output::is_closed_stdout(&e) => 0,
        Err(e) => {
            let mut msg = format!("{e:#}");
            if crate::sys::fds::out_of_fds(&e) {
                msg = format!("{msg}: {}", crate::sys::fds::fd_limit_hint());
            }
            stderr(&format!("{tool}: error: {}\n", escape(&msg)));
            1
        }
    };
    crate::attach::hand_off_sweep();
    std::process::exit(code)
}

/// The hidden flag that prints a shell completion script instead of running.
pub const COMPLETIONS_FLAG: &str = "--completions";

/// Parses the tool's command line, as `A::parse()` does, with one addition every
/// tool gets here: `TOOL --completions SHELL` (bash, zsh, fish, elvish,
/// powershell) prints the completion script `clap_complete` generates from the
/// tool's own clap definition, and exits. `cargo xtask install` and `cargo xtask
/// deb` install those scripts. The flag is looked for only as the sole option,
/// before clap parses, so it appears in no help, completion or suggestion.
pub fn parse<A: clap::Parser>() -> A {
    // Building the command again costs as much as parsing: only a message
    // that names the debug flag does it ([`debug_flag`]).
    crate::diag::set_command(<A as clap::CommandFactory>::command);
    match parse_from::<A>(std::env::args_os()) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Completions(script)) => {
            let mut out = std::io::stdout().lock();
            let failed = out.write_all(&script).and_then(|()| out.flush()).is_err();
            std::process::exit(i32::from(failed))
        }
        // --help and --version go to stdout: a full disk or a closed file is
        // reported as other output is (clap's exit ignores it and says 0).
        Err(e) if !e.use_stderr() => {
            let written = e.print().and_then(|()| std::io::stdout().flush());
            match written {
                Err(w) if w.kind() != std::io::ErrorKind::BrokenPipe => {
                    let tool = crate::diag::tool_name();
                    stderr(&format!("{tool}: error: writing the output: {w}\n"));
                    std::process::exit(1)
                }
                _ => std::process::exit(0),
            }
        }
        Err(e) => {
            let tool = crate::diag::tool_name();
            stderr(&format!("{tool}: error: {}\n", one_line(&e, tool)));
            std::process::exit(e.exit_code())
        }
    }
}

/// A clap usage error as one line, as every other error of the tools is: its
/// message and tip, without clap's usage and "For more information" lines
/// (which said nothing `--help` does not).
fn one_line(e: &clap::Error, tool: &str) -> String {
    let text = e.render().to_string();
    let mut line = String::new();
    for part in text.lines().map(str::trim) {
        if part.is_empty() || part.starts_with("Usage:") || part.starts_with("For more information")
        {
            continue;
        }
        let part = part.strip_prefix("error: ").unwrap_or(part);
        if !line.is_empty() {
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(part);
    }
    format!("{}; see {tool} --help", escape(line))
}

/// What a command line asks for.
#[derive(Debug)]
enum Parsed<A> {
    Run(A),
    Completions(Vec<u8>),
}

fn parse_from<A: clap::Parser>(
    argv: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<Parsed<A>, clap::Error> {
    let argv: Vec<std::ffi::OsString> = argv.into_iter().collect();
    let shell = match argv.get(1..).unwrap_or_default() {
        [flag, shell] if flag == COMPLETIONS_FLAG => Some(shell.clone()),
        [flag] => flag
            .to_str()
            .and_then(|f| f.strip_prefix(COMPLETIONS_FLAG)?.strip_prefix('='))
            .map(Into::into),
        _ => None,
    };
    if let Some(shell) = shell {
        use clap::ValueEnum as _;
        let shell = shell
            .to_str()
            .and_then(|s| clap_complete::Shell::from_str(s, false).ok())
            .ok_or_else(|| {
                A::command().error(
                    clap::error::ErrorKind::InvalidValue,
                    format!(
                        "{COMPLETIONS_FLAG} takes bash, zsh, fish, elvish or powershell, not '{}'",
                        escape(shell.as_encoded_bytes())
                    ),
                )
            })?;
        let mut cmd = A::command();
        let name = cmd.get_name().to_string();
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut cmd, name, &mut script);
        return Ok(Parsed::Completions(script));
    }
    A::try_parse_from(argv).map(Parsed::Run)
}

/// The options every tool takes, with BCC's letters. Flattened into each tool's
/// clap struct and checked once by [`CommonArgs::check`].
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CommonArgs {
    /// Trace this process (thread group) only
    #[arg(short, long, value_name = "PID", value_parser = parse_pid, allow_hyphen_values = true)]
    pub pid: Option<u32>,

    /// Count only events on this CPU
    #[arg(short, long, value_name = "CPU", value_parser = parse_cpu, allow_hyphen_values = true)]
    pub cpu: Option<u32>,

    /// Trace only tasks in this cgroup v2 or below it: a directory, or a path
    /// under the cgroup2 mount (system.slice/cron.service)
    #[arg(long, value_name = "PATH", visible_alias = "cgroup-path")]
    pub cgroup: Option<std::path::PathBuf>,

    /// Print JSON instead of text: one object per line, per summary (per event
    /// in tools that print events)
    #[arg(long)]
    pub json: bool,

    /// How to attach functions: auto, multi (kprobe_multi/uprobe_multi), single;
    /// for tools that time calls also session and fentry
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pub attach_mode: AttachMode,

    /// Serve HTTP on ADDR:PORT (:PORT binds 127.0.0.1): GET /metrics (Prometheus,
    /// cumulative), GET /summary (the --json object of the next summary), POST /stop
    /// (final summary, exit 0), POST /reset (zero the next summary); stackcount
    /// also GET /stacks (folded). SERVICE MODE in tracekit(7) has the details
    #[arg(long, value_name = "ADDR:PORT", value_parser = crate::serve::http::parse_listen)]
    pub listen: Option<std::net::SocketAddr>,

    /// POST /stop and /reset need `Authorization: Bearer TOKEN` (TOKEN read from
    /// FILE), and are then accepted from any address, not only loopback
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub listen_token: Option<std::path::PathBuf>,
}

impl CommonArgs {
    /// Validates the flags against this machine: the CPU exists, the PID names a
    /// process, and the cgroup is a cgroup v2 (its filter is armed here). A thread
    /// id is resolved to its process (thread group), which is what the filters
    /// compare, saying so on stderr.
    pub fn check(&mut self) -> Result<()> {
        if let Some(cpu) = self.cpu {
            let cpus = libbpf_rs::num_possible_cpus()?;
            if cpu as usize >= cpus {
                bail!(
                    "no CPU {cpu} (this machine has {})",
                    if cpus == 1 {
                        "CPU 0 only".to_string()
                    } else {
                        format!("CPUs 0-{}", cpus - 1)
                    }
                );
            }
        }
        if let Some(pid) = self.pid {
            let tgid = process::thread_group(pid)?;
            if tgid != pid {
                warn(&format!(
                    "{pid} is a thread of process {tgid}: tracing process {tgid}"
                ));
                self.pid = Some(tgid);
            }
            if process::exited(tgid) {
                bail!(
                    "no process with PID {pid}: it has exited (a zombie its parent has not reaped)"
                );
            }
        }
        if let Some(path) = &self.cgroup {
            crate::object::cgroup::arm(path)?;
        }
        if self.listen.is_some() {
            crate::serve::http::check_tool(crate::diag::tool_name())?;
        }
        Ok(())
    }
}

/// The interval, timestamp and regexp flags of the counting tools. The duration
/// stays with each tool: BCC spells it `-d` in some tools and `-D` in others.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SummaryArgs {
    /// Print a summary every SECS seconds
    #[arg(short, long, value_name = "SECS", value_parser = parse_secs, allow_hyphen_values = true)]
    pub interval: Option<Duration>,

    /// Print a HH:MM:SS line before each summary
    #[arg(short = 'T', long)]
    pub timestamp: bool,

    /// Patterns are regular expressions (matching whole names), not globs
    #[arg(short, long)]
    pub regexp: bool,
}

/// Shortest accepted interval or duration: below it a trace would not attach
/// before it ends.
const MIN_SECS: f64 = 0.001;
/// Longest accepted interval or duration (136 years), far from the overflow of
/// a monotonic deadline.
const MAX_SECS: f64 = u32::MAX as f64;

/// Parses a number of seconds (`1`, `0.5`, `2e3`) for `-i` and `-d`/`-D`.
pub fn parse_secs(s: &str) -> std::result::Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{}' is not a number of seconds", escape(s)))?;
    if v.is_nan() || v <= 0.0 {
        return Err(format!(
            "'{}' must be a positive number of seconds",
            escape(s)
        ));
    }
    if v < MIN_SECS {
        return Err(format!(
            "'{}' is too short: at least {MIN_SECS} seconds",
            escape(s)
        ));
    }
    if v > MAX_SECS {
        return Err(format!(
            "'{}' is too long: at most {MAX_SECS} seconds",
            escape(s)
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Parses a process id: a positive integer.
pub fn parse_pid(s: &str) -> std::result::Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(p) if p > 0 && p <= i32::MAX as u32 => Ok(p),
        _ => Err(format!(
            "'{}' is not a process id (a positive integer)",
            escape(s)
        )),
    }
}

/// Parses a CPU number: a non-negative integer (checked against the machine later).
pub fn parse_cpu(s: &str) -> std::result::Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(c) if c < i32::MAX as u32 => Ok(c),
        _ => Err(format!("'{}' is not a CPU number (0, 1, ...)", escape(s))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug)]
    #[command(name = "demo", version)]
    struct Demo {
        #[command(flatten)]
        common: CommonArgs,
        /// What to count
        #[arg(required = true)]
        patterns: Vec<String>,
    }

    fn demo(args: &[&str]) -> Result<Parsed<Demo>, clap::Error> {
        parse_from::<Demo>(
            std::iter::once("demo")
                .chain(args.iter().copied())
                .map(Into::into),
        )
    }

    #[test]
    fn completions_flag() {
        let Ok(Parsed::Completions(bash)) = demo(&["--completions", "bash"]) else {
            panic!("no bash script");
        };
        let bash = String::from_utf8(bash).unwrap();
        assert!(bash.contains("complete -F _demo"), "{bash}");
        assert!(bash.contains("--attach-mode"), "{bash}");
        // Hidden: neither completed nor in the help.
        assert!(!bash.contains("--completions"), "{bash}");
        for shell in ["zsh", "fish"] {
            assert!(
                matches!(demo(&["--completions", shell]), Ok(Parsed::Completions(s)) if !s.is_empty())
            );
        }
        assert!(matches!(
            demo(&["--completions=zsh"]),
            Ok(Parsed::Completions(_))
        ));
        let err = demo(&["--completions", "tcsh"]).unwrap_err().to_string();
        assert!(err.contains("takes bash, zsh, fish"), "{err}");
        // Only as the sole option: elsewhere it is an unknown argument, and clap
        // does not suggest it.
        let err = demo(&["--completions", "bash", "vfs_*"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unexpected argument"), "{err}");
        let err = demo(&["--completion", "bash"]).unwrap_err().to_string();
        assert!(!err.contains("--completions"), "{err}");
        let Ok(Parsed::Run(run)) = demo(&["-p", "1", "vfs_*"]) else {
            panic!("not parsed as a run");
        };
        assert_eq!(
            (run.common.pid, run.patterns),
            (Some(1), vec!["vfs_*".to_string()])
        );
        let help = demo(&["--help"]).unwrap_err().to_string();
        assert!(!help.contains("completions"), "{help}");
        assert!(demo(&[]).is_err(), "a required pattern is still required");
    }

    #[test]
    fn secs() {
        assert_eq!(parse_secs("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_secs("0.25").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_secs("1e3").unwrap(), Duration::from_secs(1000));
        for bad in ["0", "-1", "x", "nan", "inf", "-inf", ""] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
        // Finite but out of range: rejected, never a panic in Duration.
        for bad in [
            "18446744073709551616",
            "1e300",
            "1e30",
            "1e-300",
            "0.0000000001",
        ] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_secs("1e-300").unwrap_err(),
            "'1e-300' is too short: at least 0.001 seconds"
        );
    }

    #[test]
    fn pids_and_cpus() {
        assert_eq!(parse_pid("42"), Ok(42));
        assert_eq!(
            parse_pid("-5").unwrap_err(),
            "'-5' is not a process id (a positive integer)"
        );
        assert!(parse_pid("0").is_err());
        assert!(parse_pid("4294967295").is_err());
        assert_eq!(parse_cpu("0"), Ok(0));
        assert_eq!(
            parse_cpu("-1").unwrap_err(),
            "'-1' is not a CPU number (0, 1, ...)"
        );
        assert!(parse_cpu("4294967295").is_err());
    }
}
