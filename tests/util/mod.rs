//! Helpers for the integration tests (tests/host and tests/guest), by job: `run`
//! locates and starts tools and test programs and collects their output,
//! `fixtures` makes what a test traces or runs in, `kernel` reads what the kernel
//! holds, `parse` reads the tools' output, `http` talks to `--listen`, and
//! `pprof` reads profiles with `go tool pprof`.

mod fixtures;
pub mod http;
mod kernel;
mod parse;
pub mod pprof;
mod run;

pub use fixtures::*;
pub use kernel::*;
pub use parse::*;
pub use run::*;
