//! What the user asked for, as data: probe specs (`p:`, `t:`, `u:`, `c:`, `U:`,
//! and the sampling sources `profile:`, `software:`, `hardware:`), name
//! patterns, and the attach-mode vocabulary. Pure: no kernel, no files.

pub mod mode;
pub mod pattern;
pub mod perf;
pub mod spec;
