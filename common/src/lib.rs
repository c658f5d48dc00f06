//! Shared machinery of the tracekit tools: probe specs, expansion of patterns into
//! kernel/user/tracepoint/USDT probes, attaching them (kprobe_multi with fallbacks),
//! reading counters, the interval/duration/signal loop, and output helpers.

pub mod ahead;
pub mod attach;
pub mod attaching;
pub mod cgroup;
pub mod cli;
pub mod counters;
pub mod elf;
pub mod entry;
pub mod events;
pub mod features;
pub mod fixed;
pub mod hist;
pub mod ifunc;
pub mod insn;
pub mod kbtf;
pub mod kcache;
pub mod kfuncs;
pub mod listen;
pub mod mechanism;
pub mod metrics;
pub mod missed;
pub mod object;
pub mod output;
pub mod pattern;
pub mod plan;
pub mod report;
pub mod run;
pub mod serve;
pub mod session;
pub mod spec;
pub mod stacks;
pub mod symbolize;
pub mod system;
pub mod tally;
pub mod timing;
pub mod tracefs;
pub mod tracepoints;
pub mod ufuncs;

pub use plan::{AttachMode, Plan};
pub use spec::ProbeSpec;
