//! Reading back what BPF recorded: per-CPU counters, ring-buffer events, stack
//! maps, the symbolization of kernel and user addresses, and symbolized stacks
//! as pprof frames.

pub mod counters;
pub mod events;
pub mod profile;
pub mod stacks;
pub mod symbolize;
