//! One run, start to stop: the command line, the session that plans, loads,
//! attaches, loops and detaches, the `--listen` endpoint's view of it, the
//! summary schedule, whether tracing begins after a signal, and the entry point every tool's `main` goes through.

pub mod begin;
pub mod cli;
pub mod entry;
pub mod listen;
pub mod schedule;
pub mod session;
