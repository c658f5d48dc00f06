//! Symbolized frames as pprof frames ([`crate::output::pprof`]): each user
//! frame with the file its address is in (from the process's maps snapshot,
//! and that file's build ID, read once), each kernel frame in one mapping named
//! `[kernel.kallsyms]` (with the running kernel's build ID), inlined calls as
//! lines of one location; user frames' source files and lines from DWARF
//! where the file (or its debug file) has it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::data::symbolize::{lookup_addr, Frame, MappedFile, SourceLines, Symbols};
use crate::output::pprof;

/// The name perf and pprof give the kernel's mapping.
pub const KERNEL: &str = "[kernel.kallsyms]";

/// Turns symbolized stacks into pprof frames; a process's mappings and a
/// file's build ID are looked up once per `Frames`.
pub struct Frames<'a> {
    symbols: &'a Symbols,
    maps: HashMap<u32, Option<Vec<MappedFile>>>,
    build_ids: HashMap<PathBuf, String>,
    kernel: pprof::Mapping,
}

impl<'a> Frames<'a> {
    pub fn new(symbols: &'a Symbols) -> Frames<'a> {
        Frames {
            symbols,
            maps: HashMap::new(),
            build_ids: HashMap::new(),
            kernel: pprof::Mapping {
                // The kernel's half of the address space (x86-64 and arm64
                // alike); frames come named, so pprof needs no exact range.
                start: 1 << 63,
                limit: u64::MAX,
                offset: 0,
                file: KERNEL.into(),
                build_id: kernel_build_id().unwrap_or_default(),
            },
        }
    }

    /// Kernel frames, leaf first.
    pub fn kernel(&mut self, frames: &[Frame]) -> Vec<pprof::Frame> {
        frames
            .iter()
            .map(|f| frame(f, (f.addr != 0).then(|| self.kernel.clone()), None))
            .collect()
    }

    /// User frames of process `pid` (leaf first); without a pid (or a map of
    /// it) frames have no mapping.
    pub fn user(&mut self, pid: Option<u32>, frames: &[Frame]) -> Vec<pprof::Frame> {
        frames
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let Some(m) = pid.and_then(|p| self.mapping(p, f.addr)) else {
                    return frame(f, None, None);
                };
                // A caller's line is that of its call, as its name is.
                let at = lookup_addr(i, f.addr) - m.start + m.offset;
                let lines = match m.file.starts_with('/') {
                    true => self.symbols.source_lines(Path::new(&m.file), at),
                    false => None,
                };
                frame(f, Some(m), lines.as_deref())
            })
            .collect()
    }

    fn mapping(&mut self, pid: u32, addr: u64) -> Option<pprof::Mapping> {
        if addr == 0 {
            return None;
        }
        let symbols = self.symbols;
        let maps = self
            .maps
            .entry(pid)
            .or_insert_with(|| symbols.mappings(pid));
        let m = maps
            .as_ref()?
            .iter()
            .find(|m| addr >= m.start && addr < m.end)?
            .clone();
        let (file, build_id) = match &m.path {
            Some(p) => {
                let id = self
                    .build_ids
                    .entry(p.clone())
                    .or_insert_with(|| crate::user::elf::build_id(p).map_or(String::new(), hex));
                (p.display().to_string(), id.clone())
            }
            None => ("[vdso]".to_string(), String::new()),
        };
        Some(pprof::Mapping {
            start: m.start,
            limit: m.end,
            offset: m.pgoff,
            file,
            build_id,
        })
    }
}

/// One frame: its inlined calls (innermost first), then its function, each
/// with its source file and line where `source` has them.
fn frame(f: &Frame, mapping: Option<pprof::Mapping>, source: Option<&SourceLines>) -> pprof::Frame {
    // The frame's inlined calls are those DWARF gave `source`, in its order.
    let inlined = source.filter(|s| s.inlined.len() == f.inlined.len());
    let at = |i: usize| match i < f.inlined.len() {
        true => inlined.and_then(|s| s.inlined[i].as_ref()),
        false => source.and_then(|s| s.function.as_ref()),
    };
    pprof::Frame {
        addr: f.addr,
        lines: f
            .names()
            .enumerate()
            .map(|(i, name)| pprof::Line {
                function: name.to_string(),
                file: at(i).map_or(String::new(), |l| l.file.clone()),
                line: at(i).map_or(0, |l| l.line.into()),
            })
            .collect(),
        mapping,
    }
}

fn hex(bytes: Vec<u8>) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The running kernel's GNU build ID, from its notes (/sys/kernel/notes: ELF
/// note records, each a name size, a descriptor size and a type, then the
/// name and the descriptor, each padded to 4 bytes).
fn kernel_build_id() -> Option<String> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let notes = std::fs::read("/sys/kernel/notes").ok()?;
    let word = |at: usize| -> Option<usize> {
        Some(u32::from_ne_bytes(notes.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let pad = |n: usize| (n + 3) & !3;
    let mut at = 0;
    while at + 12 <= notes.len() {
        let (namesz, descsz, ty) = (word(at)?, word(at + 4)?, word(at + 8)? as u32);
        let name = notes.get(at + 12..at + 12 + namesz)?;
        let desc_at = at + 12 + pad(namesz);
        let desc = notes.get(desc_at..desc_at + descsz)?;
        if ty == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return Some(hex(desc.to_vec()));
        }
        at = desc_at + pad(descsz);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pprof_frames_keep_inlined_calls_innermost_first() {
        let f = Frame {
            addr: 0x10,
            name: Some("outer".into()),
            offset: 0,
            inlined: vec!["inner".into(), "middle".into()],
        };
        let p = frame(&f, None, None);
        let names: Vec<&str> = p.lines.iter().map(|l| l.function.as_str()).collect();
        assert_eq!(names, ["inner", "middle", "outer"]);
    }

    #[test]
    fn pprof_kernel_build_id_is_hex_when_the_kernel_has_one() {
        if let Some(id) = kernel_build_id() {
            assert!(
                id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()),
                "{id}"
            );
        }
    }
}
