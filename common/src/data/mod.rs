//! Reading back what BPF recorded: per-CPU counters, ring-buffer events, stack
//! maps, and the symbolization of kernel and user addresses.

pub mod counters;
pub mod events;
pub mod stacks;
pub mod symbolize;
