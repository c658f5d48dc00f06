//! Project tasks: `cargo xtask <task>`.
//!
//!   run TOOL [ARGS...]   build TOOL (release) and run it, installing build dependencies
//!   test [--no-guest]    the whole test suite: unit and host tests, then guest kernels
//!   guest [FILTER...]    only the kernel-function tests, in each guest kernel
//!   guest-exec CMD...    run a shell command in each guest kernel (debugging)
//!   bench                funccount vs bpftrace on the host (ready time, RSS, per-event cost,
//!                        detach time)
//!   bench-detach         only bench's detach rows (360 tracepoints, 1,000 single uprobes)
//!   bench-startup        exec to exit of a tracepoint run, of a run on user functions in
//!                        three binaries and of --version on the host, against bpftrace
//!                        (bench-attach --startup: the guest's rows)
//!   bench-stacks         stackcount vs bpftrace printing 10,000 distinct stacks
//!   bench-profile [--rounds N] [--seconds S]
//!                        on-CPU profile of all CPUs at 99 and 999 Hz: stackcount (unwind
//!                        tables, fp) vs perf record -g -a and bpftrace: tracer CPU,
//!                        samples, the busy workload's throughput loss
//!   bench-attach         attach/detach time for 10..all kernel functions in a guest,
//!                        against bpftrace and BCC's funccount
//!   bench-ab OLD NEW [--rounds N]
//!                        two funccount (or trace) binaries' start-up side by side in one guest boot
//!                        (rounds taking turns; medians of the paired differences)
//!   bench-latency [--no-host|--no-guest|--report]
//!                        funclatency vs bpftrace and BCC: per-call cost on hot user
//!                        functions (host) and vfs_read (guest), attach time for ~1000
//!                        kernel functions (guest)
//!   bench-io             disksnoop vs bpftrace and biosnoop-bpfcc on a loop device (cost per
//!                        request), and the event rate the ring buffer sustains
//!   bench-trace [--no-host|--no-guest] [--only CASE] [--rounds N] [--bpf-stats]
//!                        trace vs bpftrace printf (host) and trace-bpfcc (guest): cost per
//!                        event (uprobe, 1-in-1000 predicate, tracepoint, vfs_read), start-up;
//!                        --bpf-stats adds each BPF program's own run time (bpf_stats)
//!   install [--prefix DIR] [--uninstall]
//!                        install the tools (release), their man pages and
//!                        bash/zsh/fish completions under DIR (default /usr/local);
//!                        --uninstall removes exactly what was installed
//!   deb                  build target/debian/tracekit_<version>_<arch>.deb with cargo-deb
//!   install-test         only the install test `test` runs after the host tests: install
//!                        into a temporary prefix and uninstall, then the .deb on this host
//!   bench-load [--tools DIR] [--only TEXT]
//!                        urandomread and trace under 10,000..1,000,000 events/s against
//!                        bpftrace: printed, lost, CPU, RSS, exit time; urandomread also
//!                        with 16 hostile --listen clients; --tools: another build's
//!                        binaries (an older commit's target/release), for before/after
//!   bench-serve          funccount --listen: scrape time with 10,000 series, and the
//!                        traced calls' cost while scraped
//!   check-layers         common/src's rooms import only rooms on lower floors (`test` runs it
//!                        first)
//!   deps                 install every Debian package the tasks need

mod bench;
mod build;
mod deps;
mod guest;
mod install;
mod install_test;
mod layers;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

// Also reached as `crate::cargo`, `crate::workspace_root`, ... from install.rs
// and install_test.rs.
use build::{build_tools, cargo, status, workspace_root};

fn main() {
    if let Err(e) = real_main() {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    if args.first().map(String::as_str) == Some("install") {
        // Before entering the workspace: a user who cannot write to the prefix
        // is told what to do first (the install test checks this as nobody).
        return install::main(&args[1..]);
    }
    std::env::set_current_dir(&root)?;
    match args.first().map(String::as_str) {
        Some("run") => run_tool(&args[1..]),
        Some("test") => test(&args[1..]),
        Some("check-layers") => layers::main(&root),
        Some("guest") => {
            deps::ensure(&[deps::BUILD, deps::GUEST].concat())?;
            // The guest tests run the release tools: built from the tree as it
            // is, as `test` does, never left stale.
            let tools = install::package()?.tools;
            build_tools(&tools.iter().map(String::as_str).collect::<Vec<_>>())?;
            guest_tests(&args[1..])
        }
        Some("guest-exec") => {
            // Debugging aid: run a shell command in each guest kernel.
            deps::ensure(&[deps::BUILD, deps::GUEST].concat())?;
            let script = guest::write_script("exec.sh", &args[1..].join(" "))?;
            guest::run_all(&script, GUEST_TIMEOUT)
        }
        Some(task) if task.starts_with("bench") => match bench::run(task, &args[1..], &root) {
            Some(result) => result,
            None => usage(),
        },
        Some("deb") => install::deb(false).map(drop),
        Some("install-test") => {
            deps::ensure(&[deps::BUILD, deps::INSTALL_TEST, deps::DEB].concat())?;
            install_test::run()
        }
        Some("deps") => deps::ensure(
            &[
                deps::BUILD,
                deps::TEST,
                deps::INSTALL_TEST,
                deps::DEB,
                deps::GUEST,
                deps::BENCH,
            ]
            .concat(),
        ),
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: cargo xtask run TOOL [ARGS...] | test [--no-guest] | guest [TEST-FILTER...] \
         | install [--prefix DIR] [--uninstall] | deb | install-test | check-layers | deps"
    );
    std::process::exit(2);
}

/// `cargo xtask run funccount ARGS`: the README's first command.
fn run_tool(args: &[String]) -> Result<()> {
    let Some(tool) = args.first() else {
        bail!("usage: cargo xtask run TOOL [ARGS...]");
    };
    deps::ensure(deps::BUILD)?;
    build_tools(&[tool.as_str()])?;
    let bin = Path::new("target/release").join(tool);
    use std::os::unix::process::CommandExt;
    let err = Command::new(&bin).args(&args[1..]).exec();
    Err(err).with_context(|| format!("running {}", bin.display()))
}

/// `cargo xtask test`: the README's second command, and what CI runs.
fn test(args: &[String]) -> Result<()> {
    let guest = !args.iter().any(|a| a == "--no-guest");
    // Each phase's time, printed as it ends, so CI time can be traced to a phase.
    let start = Instant::now();
    let mut phase_start = start;
    let mut done = |what: &str| {
        eprintln!(
            "xtask: {what} took {:.0}s ({:.0}s in all)",
            phase_start.elapsed().as_secs_f64(),
            start.elapsed().as_secs_f64()
        );
        phase_start = Instant::now();
    };
    // First: it takes no time and needs no package.
    layers::main(&workspace_root())?;
    let mut pkgs = [deps::BUILD, deps::TEST, deps::INSTALL_TEST, deps::DEB].concat();
    if guest {
        pkgs.extend(deps::GUEST);
    }
    deps::ensure(&pkgs)?;
    done("installing packages");
    let mut t = cargo();
    // Builds the test programs (examples) without running them as tests.
    t.args(["test", "--workspace"]);
    status(t)?;
    done("debug build and host tests");
    // The host tests again, against the release tools users get: linked
    // statically, unlike the debug builds above, so anything that depends on the
    // tool's own libc (ifunc.rs's helper) is tested as shipped.
    let tools = install::package()?.tools;
    build_tools(&tools.iter().map(String::as_str).collect::<Vec<_>>())?;
    done("release build");
    let mut t = cargo();
    t.args(["test", "--workspace", "--tests", "--quiet"])
        .env("TRACEKIT_TOOL_DIR", workspace_root().join("target/release"));
    status(t)?;
    done("host tests of the release tools");
    install_test::run()?;
    done("install test");
    if guest {
        guest_tests(&[])?;
        done("guest tests");
    }
    Ok(())
}

/// Per-kernel bound on a guest run: a hung guest fails instead of stalling CI.
/// The whole list takes 5-8 minutes per kernel on a quiet 2-core machine, and
/// more when other work shares it; a hung guest still fails within this bound.
const GUEST_TIMEOUT: Duration = Duration::from_secs(1200);

/// Runs the guest tests (tests/guest/) inside every guest kernel.
fn guest_tests(filter: &[String]) -> Result<()> {
    let exe = guest::test_executable("guest", false)?;
    let script = guest::write_test_script(&exe, filter)?;
    guest::run_all(&script, GUEST_TIMEOUT)
}
