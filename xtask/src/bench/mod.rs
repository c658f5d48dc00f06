//! The `bench-*` tasks: which task runs which benchmark, and what each needs
//! installed first. Every benchmark is a file here; what they share (the
//! workload, the traced child, guest runs) is in [`harness`].

mod ab;
mod attach;
pub mod harness;
mod host;
mod io;
mod latency;
mod load;
mod profile;
mod serve;
mod stacks;
mod startup;
mod trace;
mod unwind;

use std::path::Path;

use anyhow::Result;

use crate::build::build_release;
use crate::deps;

/// Runs benchmark task `task` (`bench`, `bench-io`, ..., and the guest halves
/// `bench-*-guest`) with `args`; `None` if there is no such task.
pub fn run(task: &str, args: &[String], root: &Path) -> Option<Result<()>> {
    let bench_deps = || deps::ensure(&[deps::BUILD, deps::BENCH].concat());
    Some(match task {
        "bench" => bench_deps().and_then(|()| host::host(root)),
        "bench-detach" => bench_deps().and_then(|()| host::detach(root)),
        "bench-startup" => bench_deps()
            .and_then(|()| build_release(&["--bin", "funccount"]))
            .and_then(|()| startup::host(root)),
        "bench-stacks" => bench_deps().and_then(|()| stacks::run(root, args)),
        "bench-profile" => bench_deps().and_then(|()| profile::run(root, args)),
        "bench-io" => bench_deps().and_then(|()| io::run(root)),
        "bench-load" => bench_deps().and_then(|()| load::run(root, args)),
        "bench-serve" => deps::ensure(deps::BUILD).and_then(|()| serve::run(root)),
        "bench-attach" => attach::host(root, args),
        "bench-ab" => ab::host(root, args),
        "bench-trace" => trace::host(root, args),
        "bench-latency" => latency::host(root, args),
        // The guest halves: run inside the benchmark guest.
        "bench-ab-guest" => ab::guest(args),
        "bench-trace-guest" => trace::guest(args),
        "bench-attach-guest" => attach::guest(args),
        "bench-latency-guest" => latency::guest(args),
        _ => return None,
    })
}
