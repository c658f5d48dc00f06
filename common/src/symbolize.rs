//! Stack symbolization with blazesym, for every tool that prints stacks.
//!
//! Kernel frames resolve through kallsyms (or vmlinux when installed). User frames
//! resolve through the process's ELF symbols and DWARF, with Rust and C++ names
//! demangled and inlined calls expanded. A process's memory map is snapshotted as
//! soon as it is seen ([`Symbols::remember`]) so its stacks still get names after it
//! exits. Callers pass each distinct address once per summary.

use std::collections::{HashMap, HashSet};

use blazesym::symbolize::cache::{self, Cache};
use blazesym::symbolize::source::{Kernel, Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use blazesym::Pid;

/// One symbolized address; `inlined` lists calls inlined at that address,
/// innermost first (what a stack printout shows above the function itself).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    pub addr: u64,
    /// `None` when the address could not be resolved.
    pub name: Option<String>,
    pub offset: u64,
    pub inlined: Vec<String>,
}

impl Frame {
    pub const UNKNOWN: &'static str = "[unknown]";

    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(Self::UNKNOWN)
    }

    /// The lines a stack printout shows for this address, leaf first: inlined
    /// calls (innermost first) then the function, with `+0x..` when `offsets`.
    pub fn lines(&self, offsets: bool) -> Vec<String> {
        let mut out: Vec<String> = self
            .inlined
            .iter()
            .map(|n| format!("{n} (inlined)"))
            .collect();
        out.push(match (&self.name, offsets) {
            (Some(n), true) => format!("{n}+0x{:x}", self.offset),
            (Some(n), false) => n.clone(),
            (None, _) => Self::UNKNOWN.to_string(),
        });
        out
    }

    /// The frame names for folded output, leaf first (no offsets, no markers).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inlined
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(self.name()))
    }
}

pub struct Symbols {
    sym: Symbolizer,
    remembered: HashSet<u32>,
}

impl Default for Symbols {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbols {
    pub fn new() -> Self {
        Symbols {
            sym: Symbolizer::new(),
            remembered: HashSet::new(),
        }
    }

    /// Snapshots `pid`'s memory map (once) so that its addresses can be symbolized
    /// after it exits. Returns false when the process is already gone.
    pub fn remember(&mut self, pid: u32) -> bool {
        if self.remembered.contains(&pid) {
            return true;
        }
        let ok = self
            .sym
            .cache(&Cache::Process(cache::Process::new(Pid::from(pid))))
            .is_ok();
        if ok {
            self.remembered.insert(pid);
        }
        ok
    }

    /// Symbolizes kernel addresses.
    pub fn kernel(&self, addrs: &[u64]) -> HashMap<u64, Frame> {
        self.resolve(&Source::Kernel(Kernel::default()), addrs)
    }

    /// Symbolizes addresses in process `pid`.
    pub fn user(&self, pid: u32, addrs: &[u64]) -> HashMap<u64, Frame> {
        let mut p = Process::new(Pid::from(pid));
        // Snapshotted VMAs carry paths; /proc/PID/map_files is gone once it exits.
        p.map_files = false;
        self.resolve(&Source::Process(p), addrs)
    }

    fn resolve(&self, src: &Source, addrs: &[u64]) -> HashMap<u64, Frame> {
        let unknown = |a: u64| Frame {
            addr: a,
            name: None,
            offset: 0,
            inlined: Vec::new(),
        };
        let Ok(syms) = self.sym.symbolize(src, Input::AbsAddr(addrs)) else {
            return addrs.iter().map(|&a| (a, unknown(a))).collect();
        };
        addrs
            .iter()
            .zip(syms)
            .map(|(&a, s)| {
                let f = match s {
                    Symbolized::Sym(s) => Frame {
                        addr: a,
                        name: Some(s.name.into_owned()),
                        offset: s.offset as u64,
                        inlined: s.inlined.iter().rev().map(|i| i.name.to_string()).collect(),
                    },
                    Symbolized::Unknown(_) => unknown(a),
                };
                (a, f)
            })
            .collect()
    }
}
