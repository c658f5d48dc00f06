//! Shared machinery of the tracekit tools, one folder per stage of a run's
//! pipeline. A stage imports only from the stages below it (`cargo xtask
//! check-layers` enforces the table in ARCHITECTURE.md), bottom up:
//!
//! | floor | stages | what they own |
//! |---|---|---|
//! | 1 | `diag`, `timing`, `sys/` | messages and escaping; the start-up timing line; raw syscalls |
//! | 2 | `stop`, `probe/`, `output/` | the stop request; what the user asked; what a tool prints |
//! | 3 | `kernel/`, `user/`, `serve/` | what the kernel and user binaries offer; `--listen` |
//! | 4 | `plan/`, `data/` | specs × kernel × user → probes; reading back what BPF recorded |
//! | 5 | `object/` | the BPF object before load |
//! | 6 | `attach/` | links, after load |
//! | 7 | `run/` | one run, start to stop: the command line and the session |
//!
//! The modules are private; this facade re-exports what the tools use, by stage.

mod attach;
mod data;
mod diag;
mod kernel;
mod object;
mod output;
mod plan;
mod probe;
mod run;
mod serve;
mod stop;
mod sys;
mod timing;
mod user;

// Floor 1: diagnostics, timing, the system edge.
pub use diag::{escape, stderr, tool_name, warn};
pub use sys::errno;
pub use sys::process::{kernel_thread, thread_group, INIT_PIDNS_INO};

// Floor 2: the stop request, what the user asked, output.
pub use output::{emit, status, summary_record, timestamp, unix_time};
pub use output::{hist, pprof};
pub use probe::mode::{AttachMode, Hooks, UserStacks};
pub use probe::pattern::Matcher;
pub use probe::perf;
pub use probe::spec::{self, ProbeSpec};
pub use stop::StopReason;

// Floor 3: the kernel, user binaries, --listen.
pub use kernel::access::NoKernelFunctions;
pub use kernel::{btf, features, tracefs, tracepoints};
pub use serve::http::{Served, Unserved};
pub use serve::{metrics, tally};
pub use user::cfi;
pub use user::elf::build_id;
pub use user::targets::at_offset;

// Floor 4: the plan, reading back what BPF recorded.
pub use data::events::Streamed;
pub use data::{counters, events, profile, stacks, symbolize};
pub use plan::{perf_syscalls, raw_attachable, syscall_event, Plan, Probe, RawTracepoints, Site};
// A tool's plan options beyond the shared ones (--unsafe: Go return probes).
pub use plan::{Options as PlanOptions, UNSAFE_FLAG};

// Floor 5: the object before load.
pub use object::ahead::{self, OpenAhead};
/// What [`open_skeleton!`] expands to; not for direct use.
#[doc(hidden)]
pub use object::configure as configure_plan;
pub use object::describe_programs;
pub use object::trials;
pub use object::unwind;
pub use object::{raw_tp_clones, Filter, ProgKind, SyscallGlobals, RAW_TP_CLONES};

// Floor 6: attached.
pub use attach::missed::program_misses;

// Floor 7: the run.
pub use run::cli;
/// What [`entry!`] expands to; not for direct use.
#[doc(hidden)]
pub use run::entry::run as entry_main;
pub use run::schedule::Schedule;
pub use run::session::{self, Session};
