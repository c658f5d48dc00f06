//! The system edge: raw syscalls and `/proc` reads with no policy of their own
//! (BPF commands, errno words, processes and PID namespaces, descriptor limits,
//! mounts, perf events, the owner of a local TCP peer). Every stage above may use it; it uses only `diag`.

pub mod bpf;
pub mod errno;
pub mod fds;
pub mod mounts;
pub mod perf;
pub mod process;
pub mod sockets;
