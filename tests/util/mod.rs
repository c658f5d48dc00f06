//! Helpers for the integration tests (tests/host and tests/guest), by job: `run`
//! locates and starts tools and test programs and collects their output,
//! `fixtures` makes what a test traces or runs in, `kernel` reads what the kernel
//! holds, `parse` reads the tools' output, and `http` talks to `--listen`.

mod fixtures;
pub mod http;
mod kernel;
mod parse;
mod run;

pub use fixtures::*;
pub use kernel::*;
pub use parse::*;
pub use run::*;
