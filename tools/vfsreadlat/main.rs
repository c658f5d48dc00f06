//! vfsreadlat: a histogram of vfs_read() latency, per interval (BCC's example).

#![cfg_attr(not(test), no_main)]

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use common::cli::{parse_secs, CommonArgs};
use common::hist::Unit;
use common::ProbeSpec;
use common::Schedule;

#[path = "../funclatency/latency.rs"]
mod latency;

const EXAMPLES: &str = "\
Examples:
  vfsreadlat             # a histogram every 5 seconds, until Ctrl-C
  vfsreadlat 1           # every second
  vfsreadlat 1 10        # every second, 10 times
  vfsreadlat -p 185 1    # reads of process 185 only";

/// vfs_read() latency in microseconds: a log2 histogram every INTERVAL seconds.
#[derive(Parser, Debug)]
#[command(name = "vfsreadlat", version, after_help = EXAMPLES)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// Print a HH:MM:SS line before each histogram
    #[arg(short = 'T', long)]
    timestamp: bool,

    /// Print the plan (the attach mechanism chosen: fentry/fexit, session, ...) and the time of each start-up phase
    #[arg(long)]
    debug: bool,

    /// Seconds between histograms
    #[arg(value_name = "INTERVAL", default_value = "5", value_parser = parse_secs)]
    interval: Duration,

    /// Number of histograms, then exit (default: until Ctrl-C)
    #[arg(value_name = "COUNT", value_parser = clap::value_parser!(u32).range(1..))]
    count: Option<u32>,
}

common::entry!(main);

fn main() {
    let ahead = latency::open_ahead();
    common::cli::main("vfsreadlat", || run(common::cli::parse::<Args>(), ahead))
}

fn run(args: Args, ahead: latency::Ahead) -> Result<()> {
    let duration = match args.count {
        Some(n) => match args.interval.checked_mul(n) {
            Some(d) => Some(d),
            None => bail!("{n} intervals of {:?} is too long", args.interval),
        },
        None => None,
    };
    latency::run(
        latency::Config {
            specs: vec![ProbeSpec::parse("vfs_read", false)?],
            patterns: vec!["vfs_read".to_string()],
            common: args.common,
            schedule: Schedule {
                interval: Some(args.interval),
                duration,
            },
            unit: Unit::Usecs,
            per_function: false,
            timestamp: args.timestamp,
            debug: args.debug,
            totals: false,
            banner: Some("Tracing... Hit Ctrl-C to end."),
            unsafe_returns: false,
        },
        ahead,
    )
    .map_err(|e| match e.downcast_ref::<common::NoKernelFunctions>() {
        // Patterns are not ours to offer: vfs_read is a kernel function.
        Some(why) => anyhow::anyhow!(
            "vfsreadlat times vfs_read, a kernel function, and kernel functions cannot be traced here: {}",
            why.0
        ),
        None => e,
    })
}
