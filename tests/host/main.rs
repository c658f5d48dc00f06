//! The host tests: one binary, a module per tool or per stage of the machinery
//! the tools share, run against the host kernel (tracepoints, uprobes,
//! uprobe_multi, USDT). A test goes under what it tests, not under the first
//! tool that happened to need it. Kernel functions, which the host cannot
//! trace, are tested in guest kernels (tests/guest).

#[path = "../util/mod.rs"]
mod util;

// funccount's own output: counts, -i/-d, --json, and the -p/--cgroup/-c filters.
mod funccount;
// Finding what to probe in binaries: libc, debug files, stripped, IFUNCs, paths.
mod targets;
// Loading and attaching: uprobe groups and multi links, refusals bisected,
// raw tracepoints, syscall events, PID namespaces, maps a run does not need.
mod attach;
// A run from start to exit: signals, closed or full output, exiting targets,
// the timing line, file-descriptor limits.
mod lifecycle;
// Refusals before tracing: bad patterns and numbers, permissions, attach modes.
mod cli;
// stackcount: user and kernel stacks, folded and SVG output, names after exit.
mod stackcount;
// stackcount --pprof, read back by go tool pprof.
mod pprof;
// funclatency: call timing in every attach mode, histograms, units, intervals.
mod funclatency;
// disksnoop: block requests of known count and size to a loop device.
mod disksnoop;
// urandomread: getrandom() calls of known count and size.
mod urandomread;
// trace: its probe grammar, user functions and USDT, and tracepoints.
mod trace;
// --listen, shared by the tools: /metrics, /summary, /stop, /reset over HTTP.
mod serve;
// Under overload and hostile clients: floods of events, slow, idle and foreign
// HTTP clients.
mod overload;

// Whole user stacks without frame pointers (unwind tables).
mod ustacks;

// Sampling and counter sources: profile:, software:, hardware:.
mod sampling;
// Each tool's man page and --help name the same options.
mod manpages;
