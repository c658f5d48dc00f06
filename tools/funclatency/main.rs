//! funclatency: time kernel and user function calls, as a log2 histogram.

#![cfg_attr(not(test), no_main)]

use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use common::cli::{parse_secs, CommonArgs, SummaryArgs};
use common::hist::Unit;
use common::ProbeSpec;
use common::Schedule;

mod latency;

const EXAMPLES: &str = "\
Examples:
  funclatency do_sys_open            # time do_sys_open() calls, in nanoseconds
  funclatency c:read                 # time libc read() calls
  funclatency -u vfs_read            # in microseconds
  funclatency -m do_nanosleep        # in milliseconds
  funclatency -i 2 -d 10 c:open      # every 2 seconds, for 10 seconds
  funclatency -mTi 5 vfs_read        # every 5 seconds, with timestamps
  funclatency -p 181 vfs_read        # only process 181
  funclatency 'vfs_fstat*'           # every vfs_fstat* function, one histogram
  funclatency -F 'vfs_r*'            # one histogram per function
  funclatency vfs_read vfs_write     # several patterns in one run
  funclatency -r '^vfs_(read|write)$'  # regular expressions";

/// Time calls of functions matching patterns: a log2 histogram of their
/// latency. Nested and recursive calls are each measured.
#[derive(Parser, Debug)]
#[command(name = "funclatency", version, after_help = EXAMPLES)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    summary: SummaryArgs,

    /// Trace for SECS seconds, then print the final summary and exit
    #[arg(short, long, value_name = "SECS", value_parser = parse_secs, allow_hyphen_values = true)]
    duration: Option<Duration>,

    /// Microsecond histogram
    #[arg(short = 'u', long)]
    microseconds: bool,

    /// Millisecond histogram (with -u too, as BCC)
    #[arg(short = 'm', long)]
    milliseconds: bool,

    /// One histogram per function
    #[arg(short = 'F', long = "function")]
    function: bool,

    /// Accepted for BCC compatibility: every nesting level is always measured
    #[arg(short = 'l', long, value_name = "LEVEL", value_parser = clap::value_parser!(u32).range(1..))]
    level: Option<u32>,

    /// Print the plan (what matched, the attach mechanism, skipped probes), the BPF programs loaded and the time of each start-up phase
    #[arg(short = 'D', long)]
    debug: bool,

    /// BCC's -v: as -D (the plan and the BPF programs, where BCC prints its C source)
    #[arg(short = 'v', long)]
    verbose: bool,

    /// Time functions of Go programs too, which crashes them (Go moves and walks goroutine stacks by return address, which a return probe replaces); refused without it
    #[arg(long = "unsafe", alias = "force")]
    unsafe_returns: bool,

    /// What to time: FUNC, p::FUNC, LIB:FUNC, /PATH:FUNC
    #[arg(required = true, value_name = "PATTERN")]
    patterns: Vec<String>,
}

common::entry!(main);

fn main() {
    let ahead = latency::open_ahead();
    common::cli::main("funclatency", || run(common::cli::parse::<Args>(), ahead))
}

fn run(args: Args, ahead: latency::Ahead) -> Result<()> {
    let specs = ProbeSpec::parse_all(&args.patterns, args.summary.regexp)?;
    if let Some(s) = specs.iter().find(|s| !s.is_function()) {
        anyhow::bail!(
            "probe \"{s}\": funclatency times functions (FUNC, LIB:FUNC, /PATH:FUNC), \
             not tracepoints or USDT probes"
        );
    }
    // BCC tests -m first, so -u -m is milliseconds.
    let unit = if args.milliseconds {
        Unit::Msecs
    } else if args.microseconds {
        Unit::Usecs
    } else {
        Unit::Nsecs
    };
    latency::run(
        latency::Config {
            specs,
            patterns: args.patterns,
            common: args.common,
            schedule: Schedule {
                interval: args.summary.interval,
                duration: args.duration,
            },
            unit,
            per_function: args.function,
            timestamp: args.summary.timestamp,
            debug: args.debug || args.verbose,
            totals: true,
            banner: None,
            unsafe_returns: args.unsafe_returns,
        },
        ahead,
    )
}
