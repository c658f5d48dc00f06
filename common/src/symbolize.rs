//! Stack symbolization with blazesym, for every tool that prints stacks.
//!
//! Kernel frames resolve through kallsyms (or vmlinux when installed). User frames
//! resolve through the process's ELF symbols and DWARF, with Rust and C++ names
//! demangled, C functions named by their exported alias as BCC prints them, and
//! (optionally) inlined calls expanded. A process's memory map is snapshotted as
//! soon as it is seen ([`Symbols::remember`]) so its stacks still get names after it
//! exits. Callers pass each distinct address once per summary.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use blazesym::symbolize::cache::{self, Cache};
use blazesym::symbolize::source::{Kernel, Process, Source};
use blazesym::symbolize::{Input, Sym, Symbolized, Symbolizer};
use blazesym::Pid;

use crate::elf::{self, Binary};

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

    /// An address that could not be resolved.
    pub fn unknown(addr: u64) -> Frame {
        Frame {
            addr,
            name: None,
            offset: 0,
            inlined: Vec::new(),
        }
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
    /// Executable mappings of remembered processes, for after they exit.
    exec_maps: HashMap<u32, Vec<ExecMapping>>,
    /// Symbol tables of the files user frames fall in (None: unreadable).
    binaries: RefCell<HashMap<PathBuf, Option<Rc<Binary>>>>,
}

/// An executable mapping of a process: addresses symbolization can name.
#[derive(Debug, Clone, Copy)]
struct ExecMapping {
    start: u64,
    end: u64,
}

/// The executable mappings of `pid` (files and the vDSO), from /proc/PID/maps.
fn exec_mappings(pid: u32) -> Option<Vec<ExecMapping>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(
        maps.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (start, end) = f.next()?.split_once('-')?;
                let perms = f.next()?;
                let path = f.nth(3).unwrap_or("");
                (perms.contains('x') && (path.starts_with('/') || path == "[vdso]")).then(|| {
                    Some(ExecMapping {
                        start: u64::from_str_radix(start, 16).ok()?,
                        end: u64::from_str_radix(end, 16).ok()?,
                    })
                })?
            })
            .collect(),
    )
}

impl Default for Symbols {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbols {
    /// A symbolizer printing one frame per address (BCC's output): inlined calls
    /// are not expanded.
    pub fn new() -> Self {
        Self::with_inlined(false)
    }

    /// With `inlined`, each frame also lists the calls inlined at its address
    /// ([`Frame::inlined`]), from DWARF where the binary has it.
    pub fn with_inlined(inlined: bool) -> Self {
        Symbols {
            sym: Symbolizer::builder()
                .enable_inlined_fns(inlined)
                .enable_code_info(inlined)
                .build(),
            remembered: HashSet::new(),
            exec_maps: HashMap::new(),
            binaries: RefCell::new(HashMap::new()),
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
            if let Some(m) = exec_mappings(pid) {
                self.exec_maps.insert(pid, m);
            }
        }
        ok
    }

    /// Symbolizes kernel addresses.
    pub fn kernel(&self, addrs: &[u64]) -> HashMap<u64, Frame> {
        self.resolve(&Source::Kernel(Kernel::default()), addrs, false)
    }

    /// Symbolizes addresses in process `pid`. Functions are named as BCC names them:
    /// by their preferred exported alias (`read`, not `__GI___libc_read`). Addresses
    /// outside the process's executable mappings (a frame-pointer walk through code
    /// without frame pointers reads garbage) are unknown without costing the others
    /// their names.
    pub fn user(&self, pid: u32, addrs: &[u64]) -> HashMap<u64, Frame> {
        let mut p = Process::new(Pid::from(pid));
        // Snapshotted VMAs carry paths; /proc/PID/map_files is gone once it exits.
        p.map_files = false;
        let live;
        let maps = match self.exec_maps.get(&pid) {
            Some(m) => Some(m),
            None => {
                live = exec_mappings(pid);
                live.as_ref()
            }
        };
        let (named, outside): (Vec<u64>, Vec<u64>) = addrs
            .iter()
            .partition(|&&a| maps.is_none_or(|m| m.iter().any(|m| a >= m.start && a < m.end)));
        let mut out = self.resolve(&Source::Process(p), &named, true);
        out.extend(outside.into_iter().map(|a| (a, Frame::unknown(a))));
        out
    }

    fn resolve(&self, src: &Source, addrs: &[u64], user: bool) -> HashMap<u64, Frame> {
        if addrs.is_empty() {
            return HashMap::new();
        }
        let syms = match self.sym.symbolize(src, Input::AbsAddr(addrs)) {
            Ok(syms) => syms,
            // One address blazesym cannot handle fails the whole batch: retry each.
            Err(_) if addrs.len() > 1 => {
                return addrs
                    .iter()
                    .flat_map(|&a| self.resolve(src, &[a], user))
                    .collect();
            }
            Err(_) => return addrs.iter().map(|&a| (a, Frame::unknown(a))).collect(),
        };
        addrs
            .iter()
            .zip(syms)
            .map(|(&a, s)| {
                let f = match s {
                    Symbolized::Sym(s) => {
                        let name = if user { self.preferred_name(&s) } else { None };
                        Frame {
                            addr: a,
                            name: Some(name.unwrap_or_else(|| s.name.to_string())),
                            offset: s.offset as u64,
                            inlined: s.inlined.iter().rev().map(|i| i.name.to_string()).collect(),
                        }
                    }
                    Symbolized::Unknown(_) => Frame::unknown(a),
                };
                (a, f)
            })
            .collect()
    }

    /// The name BCC would print for `sym`: the preferred exported alias at its start
    /// address in its file's symbol tables, when `sym`'s own name is one of that
    /// function's names (not demangled or otherwise rewritten).
    fn preferred_name(&self, sym: &Sym<'_>) -> Option<String> {
        let module = Path::new(sym.module.as_deref()?);
        let bin = self
            .binaries
            .borrow_mut()
            .entry(module.to_path_buf())
            .or_insert_with(|| Binary::read(module).ok().map(|b| Rc::new(b.without_code())))
            .clone()?;
        let f = bin.function_at(sym.addr)?;
        if !f.names.iter().any(|n| n.name == sym.name) {
            return None;
        }
        elf::preferred(f.names.iter().filter(|n| n.exported)).map(|n| n.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    #[no_mangle]
    pub extern "C" fn tk_symbolize_me() -> u64 {
        std::hint::black_box(7)
    }

    /// The address of an instruction inside `tk_inlined_helper`, inlined here.
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    #[no_mangle]
    pub extern "C" fn tk_with_inlined() -> u64 {
        std::hint::black_box(tk_inlined_helper())
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn tk_inlined_helper() -> u64 {
        let pc: u64;
        // SAFETY: reads the instruction pointer into a register.
        unsafe { std::arch::asm!("lea {}, [rip]", out(reg) pc) };
        pc
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn inlined_frames_only_when_asked_for() {
        let pc = tk_with_inlined();
        let me = std::process::id();
        let off = Symbols::new().user(me, &[pc]);
        assert_eq!(off[&pc].name.as_deref(), Some("tk_with_inlined"));
        assert_eq!(off[&pc].inlined, Vec::<String>::new());
        let on = Symbols::with_inlined(true).user(me, &[pc]);
        assert_eq!(on[&pc].name.as_deref(), Some("tk_with_inlined"));
        assert_eq!(
            on[&pc].inlined,
            ["tracekit_common::symbolize::tests::tk_inlined_helper"]
        );
    }

    #[test]
    fn libc_functions_are_named_by_their_exported_alias() {
        // getpid's code in libc.so.6 is named __getpid and __GI___getpid in the
        // debug file, getpid and __getpid in .dynsym: BCC prints getpid.
        let libc = crate::ufuncs::resolve("c", None).unwrap();
        let b = Binary::read(&libc).unwrap();
        let f = b.named("getpid").next().unwrap();
        let off = f.offset.unwrap();
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        let libc_name = libc.file_name().unwrap().to_str().unwrap();
        // The address of file offset `off` in our own mapping of libc.
        let addr = maps
            .lines()
            .filter(|l| l.ends_with(libc_name))
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let (s, e) = f.next()?.split_once('-')?;
                let (s, e) = (
                    u64::from_str_radix(s, 16).ok()?,
                    u64::from_str_radix(e, 16).ok()?,
                );
                let o = u64::from_str_radix(f.nth(1)?, 16).ok()?;
                (off >= o && off - o < e - s).then(|| s + off - o)
            })
            .expect("libc mapped");
        let got = Symbols::new().user(std::process::id(), &[addr + 1]);
        assert_eq!(got[&(addr + 1)].name.as_deref(), Some("getpid"));
        assert_eq!(got[&(addr + 1)].offset, 1);
    }

    #[test]
    fn one_address_in_a_data_file_does_not_cost_the_others_their_names() {
        // A locale archive-like mapping: a file that is not ELF, mapped read-only.
        let f = std::fs::File::open("/etc/passwd").unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh read-only private mapping of one page, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let func = tk_symbolize_me as *const () as u64;
        let data = p as u64 + 16;
        let s = Symbols::new();
        let got = s.user(std::process::id(), &[func, data]);
        // SAFETY: mapped above.
        unsafe { libc::munmap(p, 4096) };
        assert_eq!(
            got[&func].name.as_deref(),
            Some("tk_symbolize_me"),
            "{got:?}"
        );
        assert_eq!(got[&data].name, None);
    }
}
