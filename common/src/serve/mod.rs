//! `--listen`: the small blocking HTTP server, the Prometheus metrics it exposes,
//! and the tallies of per-event tools that feed them.

pub mod http;
pub mod metrics;
pub mod tally;
