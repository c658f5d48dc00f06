//! What the running kernel offers: its traceable functions (and their cache), its
//! text symbols (cached, for naming kernel frames), its
//! tracepoints and their record formats, tracefs, BTF, BPF features probed by
//! trying them, and whether kernel functions may be traced at all.

pub mod access;
pub mod btf;
pub mod features;
pub mod functions;
pub mod symbols;
pub mod tracefs;
pub mod tracepoints;
