//! Stack symbolization with blazesym, for every tool that prints stacks.
//!
//! Kernel frames in the kernel's text and its modules' are named from the cached
//! copy of kallsyms (`kernel::symbols`); the rest (BPF programs, trampolines),
//! and all of them with inlined calls asked for, through blazesym (the live
//! kallsyms, or vmlinux when installed). User frames
//! resolve through the process's ELF symbols and DWARF, with Rust and C++ names
//! demangled, C functions named by their exported alias as BCC prints them, and
//! (optionally) inlined calls expanded. A process's memory map is snapshotted as
//! soon as it is seen ([`Symbols::remember`]) so its stacks still get names after it
//! exits. User stacks taken with build IDs ([`UserFrame`]) need no map at all: a
//! frame names its file by build ID, found among the files of the processes seen,
//! the files callers name, this process's own libraries and the program named
//! like the process. Callers pass each distinct address once per summary.
//! Source files and lines ([`Symbols::source_lines`]) are read from DWARF only
//! for the outputs that carry them (pprof profiles), once per address.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use blazesym::symbolize::cache::{self, Cache};
use blazesym::symbolize::source::{Elf, Kernel, Process, Source};
use blazesym::symbolize::{Input, Sym, Symbolized, Symbolizer};
use blazesym::Pid;

use crate::kernel::symbols::KernelSymbols;
use crate::user::elf::{self, Binary};
use crate::user::plt::Plt;

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
    pub const TRUNCATED: &'static str = "[truncated]";

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

    /// The frame [`CUT`] stands for: `[truncated]`.
    pub fn truncated() -> Frame {
        Frame {
            addr: 0,
            name: Some(Self::TRUNCATED.into()),
            offset: 0,
            inlined: Vec::new(),
        }
    }

    /// Whether this is the cut marker ([`Frame::truncated`]), which stands for
    /// no code: printed without an offset.
    fn is_truncated(&self) -> bool {
        self.addr == 0 && self.name.as_deref() == Some(Self::TRUNCATED)
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
            (Some(n), true) if !self.is_truncated() => format!("{n}+0x{:x}", self.offset),
            (Some(n), _) => n.clone(),
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

/// Where frame `i` of a stack (leaf first) is looked up first: a frame after
/// the first is a return address, after its call; a call that never returns
/// is its function's last instruction, so its return address is past the
/// function (in the next one, or in none). Those are looked up at the address
/// before, as debuggers take a caller's line; where nothing is there, at the
/// address itself (see [`frame_at`]).
pub fn lookup_addr(i: usize, addr: u64) -> u64 {
    match i {
        0 => addr,
        _ if addr == 0 || addr == CUT => addr,
        _ => addr - 1,
    }
}

/// The addresses frame `i` at `addr` is looked up at: [`lookup_addr`], and for
/// a caller the address itself too.
pub fn lookup_addrs(i: usize, addr: u64) -> impl Iterator<Item = u64> {
    let before = lookup_addr(i, addr);
    std::iter::once(before).chain((before != addr).then_some(addr))
}

/// Frame `i` at `addr`, from the frames `found` at [`lookup_addrs`]: a caller
/// by the address before its return address when that names a function, else
/// by the return address itself (a signal handler "returns" to the first byte
/// of the signal trampoline, `__restore_rt`, after no call: the byte before it
/// is padding).
pub fn frame_at(i: usize, addr: u64, found: impl Fn(u64) -> Option<Frame>) -> Frame {
    let before = lookup_addr(i, addr);
    if before != addr {
        if let Some(f) = found(before).filter(|f| f.name.is_some()) {
            return own_frame(i, addr, f);
        }
    }
    found(addr).unwrap_or(Frame::unknown(addr))
}

/// Frame `i`, found at [`lookup_addr`], with its own address and offset again.
pub fn own_frame(i: usize, addr: u64, mut f: Frame) -> Frame {
    if lookup_addr(i, addr) != addr {
        f.addr = addr;
        if f.name.is_some() {
            f.offset += 1;
        }
    }
    f
}

/// A user stack frame as `bpf_get_stack(BPF_F_USER_STACK | BPF_F_USER_BUILD_ID)`
/// gives it: a file, by its build ID, and an offset in that file; or the
/// address, where the kernel could not read the file's build ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UserFrame {
    Addr(u64),
    File { build_id: BuildId, offset: u64 },
}

/// The address that stands, at the outer end of a user stack walked by unwind
/// tables, for "the walk stopped here, short of the outermost frame"
/// (bpf/unwind.h's UNWIND_CUT): it is the frame [`Frame::truncated`].
pub const CUT: u64 = u64::MAX;

/// A build ID as the kernel reports it: 20 bytes, zero-padded.
pub type BuildId = [u8; 20];

impl UserFrame {
    /// Size of the kernel's `struct bpf_stack_build_id`.
    pub const SIZE: usize = 32;

    /// Decodes an array of `struct bpf_stack_build_id` (status, build ID, then
    /// the file offset or the address at byte 24), up to the first empty entry.
    pub fn decode(bytes: &[u8]) -> Vec<UserFrame> {
        const VALID: i32 = 1;
        const IP: i32 = 2;
        bytes
            .chunks_exact(Self::SIZE)
            .map_while(|e| {
                let status = i32::from_ne_bytes(e[..4].try_into().expect("4 bytes"));
                let value = u64::from_ne_bytes(e[24..32].try_into().expect("8 bytes"));
                match status {
                    VALID => Some(UserFrame::File {
                        build_id: e[4..24].try_into().expect("20 bytes"),
                        offset: value,
                    }),
                    IP if value != 0 => Some(UserFrame::Addr(value)),
                    _ => None,
                }
            })
            .collect()
    }
}

pub struct Symbols {
    sym: Symbolizer,
    remembered: HashSet<u32>,
    /// Executable mappings of remembered processes, for after they exit.
    exec_maps: HashMap<u32, Vec<ExecMapping>>,
    /// Symbol tables of the files user frames fall in (None: unreadable).
    binaries: RefCell<HashMap<PathBuf, Option<Rc<Binary>>>>,
    /// Their PLT stubs, which no symbol covers.
    plts: RefCell<HashMap<PathBuf, Rc<Plt>>>,
    /// Files by build ID, for build-ID frames.
    files: RefCell<FileIndex>,
    /// Whether DWARF is read: for inlined calls only. Names come from symbol
    /// tables, the file's and its separate debug file's, as perf takes them:
    /// inflating the compressed DWARF of a debug file (libc6-dbg's) to name
    /// two frames cost more than a whole profile's sampling.
    inlined: bool,
    /// Reads DWARF's line tables (pprof's file names and line numbers); made
    /// at the first use, as most runs never need it.
    lines: std::cell::OnceCell<Symbolizer>,
    /// Source lines found so far, by file and file offset.
    lines_of: RefCell<HashMap<(PathBuf, u64), Found>>,
    /// The kernel's text symbols, loaded at the first kernel frame.
    kernel_symbols: std::cell::OnceCell<Option<KernelSymbols>>,
}

/// A lookup's result, kept: the lines, or None (no DWARF there).
type Found = Option<Rc<SourceLines>>;

/// Where in the source an address is, from DWARF: in its function, and in each
/// call inlined there (innermost first, as [`Frame::inlined`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceLines {
    pub function: Option<SourceLine>,
    pub inlined: Vec<Option<SourceLine>>,
}

/// A source file and a line in it (0: the file is known, the line not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLine {
    pub file: String,
    pub line: u32,
}

/// Files by build ID: those read so far, and those known but not yet read
/// (read when a build ID is not found).
#[derive(Default)]
struct FileIndex {
    by_id: HashMap<BuildId, PathBuf>,
    read: HashSet<PathBuf>,
    pending: Vec<PathBuf>,
    own_added: bool,
}

impl FileIndex {
    fn add(&mut self, path: &Path) {
        if !self.read.contains(path) {
            self.pending.push(path.to_path_buf());
        }
    }

    /// Reads the build IDs of the pending files.
    fn read_pending(&mut self) {
        for path in std::mem::take(&mut self.pending) {
            if !self.read.insert(path.clone()) {
                continue;
            }
            if let Some(id) = elf::build_id(&path) {
                let mut key = [0u8; 20];
                let n = id.len().min(20);
                key[..n].copy_from_slice(&id[..n]);
                self.by_id.entry(key).or_insert(path);
            }
        }
    }
}

/// An executable mapping of a process: addresses symbolization can name.
#[derive(Debug, Clone)]
struct ExecMapping {
    start: u64,
    end: u64,
    /// Where in the file it starts.
    pgoff: u64,
    /// The file (None: the vDSO).
    path: Option<PathBuf>,
    /// Start less file offset of the file's lowest mapping, executable or not
    /// (where the kernel puts an address below every mapping; see user_frames).
    low_base: u64,
}

/// A file mapped executable in a process, as [`Symbols::mappings`] gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    /// Where in the file `start` is.
    pub pgoff: u64,
    /// The file (None: the vDSO).
    pub path: Option<PathBuf>,
}

/// Whether `pid`'s memory is gone: it has exited, or is exiting. An exiting
/// process releases its mappings (and /proc/PID/map_files) before it becomes a
/// zombie, so for that while its state is not yet Z but it maps nothing.
fn memory_gone(pid: u32) -> bool {
    crate::sys::process::exited(pid) || exec_mappings(&pid.to_string()).is_none_or(|m| m.is_empty())
}

/// The executable mappings of `pid` (files and the vDSO), from /proc/PID/maps.
fn exec_mappings(pid: &str) -> Option<Vec<ExecMapping>> {
    let maps = crate::user::maps::read(pid)?;
    // Each line once: start, end, permissions, file offset, path ("" for none;
    // its first word: " (deleted)" is not part of it).
    let lines: Vec<(u64, u64, &str, u64, &str)> = maps
        .iter()
        .map(|l| {
            let path = l.path.split(' ').next().unwrap_or("");
            (l.start, l.end, l.perms.as_str(), l.pgoff, path)
        })
        .collect();
    // Per file, its lowest mapping of any kind: (start, file offset).
    let mut low: HashMap<&str, (u64, u64)> = HashMap::new();
    for &(start, _, _, pgoff, path) in &lines {
        let e = low.entry(path).or_insert((start, pgoff));
        if start < e.0 {
            *e = (start, pgoff);
        }
    }
    Some(
        lines
            .iter()
            .filter(|(_, _, perms, _, path)| {
                perms.contains('x') && (path.starts_with('/') || *path == "[vdso]")
            })
            .map(|&(start, end, _, pgoff, path)| ExecMapping {
                start,
                end,
                pgoff,
                path: path.starts_with('/').then(|| PathBuf::from(path)),
                low_base: low.get(path).map_or(0, |(s, o)| s.wrapping_sub(*o)),
            })
            .collect(),
    )
}

/// The last component of `path`, as stacks show a frame's file (`[libc.so.6]`).
fn base_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
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
            plts: RefCell::new(HashMap::new()),
            files: RefCell::new(FileIndex::default()),
            inlined,
            lines: std::cell::OnceCell::new(),
            lines_of: RefCell::new(HashMap::new()),
            kernel_symbols: std::cell::OnceCell::new(),
        }
    }

    /// The source file and line of the instruction at file offset `offset` of
    /// `path`, in its function and in each call inlined there, from the DWARF
    /// of the file or of its separate debug file; None without DWARF there.
    /// Looked up once per address.
    pub fn source_lines(&self, path: &Path, offset: u64) -> Option<Rc<SourceLines>> {
        let key = (path.to_path_buf(), offset);
        if let Some(found) = self.lines_of.borrow().get(&key) {
            return found.clone();
        }
        let sym = self.lines.get_or_init(|| {
            // Inlined calls always: without them the one line given is that of
            // the innermost inlined call, not of the function that holds it.
            Symbolizer::builder()
                .enable_inlined_fns(true)
                .enable_code_info(true)
                .build()
        });
        let mut elf = Elf::new(path);
        elf.debug_syms = true;
        let found = match sym.symbolize_single(&Source::Elf(elf), Input::FileOffset(offset)) {
            Ok(Symbolized::Sym(s)) => s.code_info.as_deref().map(|c| {
                let line = |c: &blazesym::symbolize::CodeInfo<'_>| SourceLine {
                    file: c.to_path().display().to_string(),
                    line: c.line.unwrap_or(0),
                };
                // blazesym gives each inlined function outermost first, with
                // the line in it; the function's own line is `code_info`.
                Rc::new(SourceLines {
                    function: Some(line(c)),
                    inlined: s
                        .inlined
                        .iter()
                        .rev()
                        .map(|i| i.code_info.as_ref().map(line))
                        .collect(),
                })
            }),
            _ => None,
        };
        self.lines_of.borrow_mut().insert(key, found.clone());
        found
    }

    /// A file whose build ID user frames may name (the binary a probe is in).
    pub fn add_file(&self, path: &Path) {
        self.files.borrow_mut().add(path);
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
            if let Some(m) = exec_mappings(&pid.to_string()) {
                let mut files = self.files.borrow_mut();
                for path in m.iter().filter_map(|m| m.path.as_deref()) {
                    files.add(path);
                }
                self.exec_maps.insert(pid, m);
            }
        }
        ok
    }

    /// Takes `pid`'s mappings again (a library it loaded since the snapshot).
    /// A process gone (or exiting: no mapping left) keeps its snapshot.
    pub fn refresh(&mut self, pid: u32) -> bool {
        if exec_mappings(&pid.to_string()).is_none() {
            return false;
        }
        self.remembered.remove(&pid);
        self.remember(pid)
    }

    /// `pid`'s executable mappings (its snapshot if remembered, else read now;
    /// None for a process gone unremembered), for naming the file each frame's
    /// address is in (pprof's mappings).
    pub fn mappings(&self, pid: u32) -> Option<Vec<MappedFile>> {
        let maps = self.maps_of(pid)?;
        Some(
            maps.iter()
                .map(|m| MappedFile {
                    start: m.start,
                    end: m.end,
                    pgoff: m.pgoff,
                    path: m.path.clone(),
                })
                .collect(),
        )
    }

    /// `pid`'s executable mappings: its snapshot if remembered, else read now.
    fn maps_of(&self, pid: u32) -> Option<std::borrow::Cow<'_, [ExecMapping]>> {
        match self.exec_maps.get(&pid) {
            Some(m) => Some(std::borrow::Cow::Borrowed(m)),
            None => exec_mappings(&pid.to_string()).map(std::borrow::Cow::Owned),
        }
    }

    /// The file with `build_id`: among the files known so far, then this
    /// process's own and the system's libc (everyone's), then the program in PATH named
    /// like the process (`comm`): each found file is checked by its build ID.
    fn file_with(&self, build_id: &BuildId, comm: &str) -> Option<PathBuf> {
        let mut files = self.files.borrow_mut();
        if let Some(p) = files.by_id.get(build_id) {
            return Some(p.clone());
        }
        files.read_pending();
        if !files.own_added {
            files.own_added = true;
            for m in exec_mappings("self").unwrap_or_default() {
                if let Some(p) = &m.path {
                    files.add(p);
                }
            }
            // A statically linked tool maps no libc: the system's, as the
            // loader finds it.
            if let Ok(libc) = crate::user::targets::resolve("c", None) {
                files.add(&libc);
            }
            files.read_pending();
        }
        if !files.by_id.contains_key(build_id) && !comm.is_empty() && !comm.contains('/') {
            for dir in std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default()
            {
                files.add(&dir.join(comm));
            }
            files.read_pending();
        }
        files.by_id.get(build_id).cloned()
    }

    /// Symbolizes the user stack frames of process `pid` (named `comm`), with
    /// the file each is in (its last path component) when known. Build-ID frames
    /// are named from their file whether or not the process still exists.
    pub fn user_frames(
        &self,
        pid: u32,
        comm: &str,
        frames: &[UserFrame],
    ) -> Vec<(Frame, Option<String>)> {
        // Callers looked up at their call too (see `frame_at`): the frames as
        // given, then each caller's address (or file offset) less one.
        let moved = |i: usize, f: &UserFrame| match *f {
            UserFrame::Addr(a) => UserFrame::Addr(lookup_addr(i, a)),
            UserFrame::File { build_id, offset } => UserFrame::File {
                build_id,
                offset: lookup_addr(i, offset),
            },
        };
        let callers: Vec<usize> = (1..frames.len())
            .filter(|&i| moved(i, &frames[i]) != frames[i])
            .collect();
        let mut all = frames.to_vec();
        all.extend(callers.iter().map(|&i| moved(i, &frames[i])));
        let mut found = self.user_frames_as_given(pid, comm, &all);
        let mut at_call = found.split_off(frames.len());
        for (&i, (mut f, module)) in callers.iter().zip(at_call.drain(..)) {
            if f.name.is_some() {
                if f.addr != 0 {
                    f.addr += 1;
                }
                f.offset += 1;
                found[i] = (f, module);
            }
        }
        found
    }

    /// [`Symbols::user_frames`], each frame looked up where it is.
    fn user_frames_as_given(
        &self,
        pid: u32,
        comm: &str,
        frames: &[UserFrame],
    ) -> Vec<(Frame, Option<String>)> {
        let addrs: Vec<u64> = frames
            .iter()
            .filter_map(|f| match f {
                UserFrame::Addr(CUT) => None,
                UserFrame::Addr(a) => Some(*a),
                UserFrame::File { .. } => None,
            })
            .collect();
        let by_addr = if addrs.is_empty() {
            HashMap::new()
        } else {
            self.user(pid, &addrs)
        };
        let maps = self.maps_of(pid);
        let maps = maps.as_deref();
        // Each build-ID frame's file, found once.
        let files: Vec<Option<PathBuf>> = frames
            .iter()
            .map(|f| match f {
                UserFrame::File { build_id, .. } => self.file_with(build_id, comm),
                UserFrame::Addr(_) => None,
            })
            .collect();
        // Build-ID frames, symbolized a file at a time.
        let mut by_file: HashMap<&Path, Vec<u64>> = HashMap::new();
        for (f, path) in frames.iter().zip(&files) {
            if let (UserFrame::File { offset, .. }, Some(path)) = (f, path) {
                by_file.entry(path).or_default().push(*offset);
            }
        }
        let mut by_offset: HashMap<(&Path, u64), Frame> = HashMap::new();
        for (path, offsets) in by_file {
            let mut elf = Elf::new(path);
            elf.debug_syms = self.inlined;
            let src = Source::Elf(elf);
            for (off, mut f) in self.resolve_with(&src, Input::FileOffset(&offsets), &offsets, true)
            {
                if f.name.is_none() {
                    self.name_unnamed(&mut f, path, off);
                }
                by_offset.insert((path, off), f);
            }
        }
        frames
            .iter()
            .zip(&files)
            .map(|(f, path)| match f {
                UserFrame::Addr(CUT) => (Frame::truncated(), None),
                UserFrame::Addr(a) => {
                    let module = maps.and_then(|m| {
                        m.iter()
                            .find(|m| *a >= m.start && *a < m.end)
                            // The vDSO as perf names it.
                            .map(|m| m.path.as_deref().map_or("vdso".into(), base_name))
                    });
                    (
                        by_addr.get(a).cloned().unwrap_or(Frame::unknown(*a)),
                        module,
                    )
                }
                UserFrame::File { offset, .. } => {
                    let Some(path) = path.as_deref() else {
                        return (Frame::unknown(0), None);
                    };
                    let mine = || {
                        maps.into_iter()
                            .flatten()
                            .filter(move |m| m.path.as_deref() == Some(path))
                    };
                    let within =
                        mine().find(|m| *offset >= m.pgoff && *offset - m.pgoff < m.end - m.start);
                    // An address below every mapping (a garbage frame of a walk
                    // without frame pointers: 0x20, say) is given by the kernel
                    // as an offset in the lowest mapping, computed as if it were
                    // in it (find_vma takes the first mapping ending above it):
                    // it is no frame of that file.
                    if let (None, Some(low)) = (within, mine().min_by_key(|m| m.start)) {
                        let ip = low.low_base.wrapping_add(*offset);
                        if ip < low.start {
                            return (Frame::unknown(ip), None);
                        }
                    }
                    // The address, where the process's map is known (0 if not).
                    let addr = within.map_or(0, |m| m.start + (*offset - m.pgoff));
                    let mut f = by_offset
                        .get(&(path, *offset))
                        .cloned()
                        .unwrap_or(Frame::unknown(0));
                    f.addr = addr;
                    (f, Some(base_name(path)))
                }
            })
            .collect()
    }

    /// Symbolizes kernel addresses.
    pub fn kernel(&self, addrs: &[u64]) -> HashMap<u64, Frame> {
        let table = match self.inlined {
            // Inlined calls are in vmlinux's DWARF only: blazesym's.
            true => None,
            false => self
                .kernel_symbols
                .get_or_init(KernelSymbols::load)
                .as_ref(),
        };
        let mut out = HashMap::with_capacity(addrs.len());
        let mut rest = Vec::new();
        for &a in addrs {
            match table.and_then(|t| t.lookup(a)) {
                Some((name, offset)) => {
                    out.insert(
                        a,
                        Frame {
                            addr: a,
                            name: Some(name.to_string()),
                            offset,
                            inlined: Vec::new(),
                        },
                    );
                }
                None => rest.push(a),
            }
        }
        out.extend(self.resolve(&Source::Kernel(Kernel::default()), &rest, false));
        out
    }

    /// Symbolizes addresses in process `pid`. Functions are named as BCC names them:
    /// by their preferred exported alias (`read`, not `__GI___libc_read`). Addresses
    /// outside the process's executable mappings (a frame-pointer walk through code
    /// without frame pointers reads garbage) are unknown without costing the others
    /// their names.
    pub fn user(&self, pid: u32, addrs: &[u64]) -> HashMap<u64, Frame> {
        let process = |map_files: bool| {
            let mut p = Process::new(Pid::from(pid));
            p.map_files = map_files;
            p.debug_syms = self.inlined;
            Source::Process(p)
        };
        // While the process lives, its files are read through /proc/PID/map_files:
        // the files it runs, even if a package upgrade replaced or deleted them
        // since (by path, the new file's names were given to the old addresses).
        // Once it has exited, that is gone; the snapshotted VMAs carry paths.
        let alive = !crate::sys::process::exited(pid);
        let maps = self.maps_of(pid);
        let maps = maps.as_deref();
        let (named, outside): (Vec<u64>, Vec<u64>) = addrs
            .iter()
            .partition(|&&a| maps.is_none_or(|m| m.iter().any(|m| a >= m.start && a < m.end)));
        let mut out = self.resolve(&process(alive), &named, true);
        // Only an unknown name can come of an exit during the lookup (its
        // map_files went with it): then, and then only, /proc is asked again.
        if alive && out.values().any(|f| f.name.is_none()) && memory_gone(pid) {
            // By the snapshot's paths.
            out = self.resolve(&process(false), &named, true);
        }
        // What the files' own tables do not name (a static function of a
        // stripped library): their debug files' symbol tables.
        for (a, f) in out.iter_mut().filter(|(_, f)| f.name.is_none()) {
            let m = maps.and_then(|m| m.iter().find(|m| *a >= m.start && *a < m.end));
            if let Some((m, path)) = m.and_then(|m| m.path.as_deref().map(|p| (m, p))) {
                self.name_unnamed(f, path, *a - m.start + m.pgoff);
            }
        }
        out.extend(outside.into_iter().map(|a| (a, Frame::unknown(a))));
        out
    }

    /// Names `f`, at file offset `offset` of `path`, that the symbolizer did
    /// not: a PLT stub, or a function its tables do not have.
    fn name_unnamed(&self, f: &mut Frame, path: &Path, offset: u64) {
        if let Some((name, off)) = self.plt_at(path).stub_at_offset(offset) {
            f.name = Some(name.to_string());
            f.offset = off;
            return;
        }
        self.name_by_symtabs(f, path, offset);
    }

    /// The PLT stubs of the file at `path`, read once (asked at every user
    /// frame: no path is copied for a file known already).
    fn plt_at(&self, path: &Path) -> Rc<Plt> {
        if let Some(p) = self.plts.borrow().get(path) {
            return p.clone();
        }
        let p = Rc::new(Plt::read(path));
        self.plts.borrow_mut().insert(path.to_path_buf(), p.clone());
        p
    }

    /// Names `f`, at file offset `offset` of `path`, by the function holding
    /// it in the symbol tables of the file and of its separate debug file
    /// (preferring exported names, as BCC shows them), when DWARF is not read.
    fn name_by_symtabs(&self, f: &mut Frame, path: &Path, offset: u64) {
        if self.inlined {
            return;
        }
        let Some(bin) = self.binary_at(path) else {
            return;
        };
        let Some(addr) = bin.vaddr_of(offset) else {
            return;
        };
        if let Some(func) = bin.function_containing(addr) {
            let name = elf::preferred(func.names.iter().filter(|n| n.exported))
                .or_else(|| elf::preferred(&func.names));
            if let Some(n) = name {
                f.name = Some(n.name.clone());
                f.offset = addr - func.addr;
            }
        }
    }

    fn resolve(&self, src: &Source, addrs: &[u64], user: bool) -> HashMap<u64, Frame> {
        self.resolve_with(src, Input::AbsAddr(addrs), addrs, user)
    }

    /// Names `input` (absolute addresses or file offsets: `addrs`); user
    /// functions as BCC names them.
    fn resolve_with(
        &self,
        src: &Source,
        input: Input<&[u64]>,
        addrs: &[u64],
        user: bool,
    ) -> HashMap<u64, Frame> {
        if addrs.is_empty() {
            return HashMap::new();
        }
        let syms = match self.sym.symbolize(src, input) {
            Ok(syms) => syms,
            // One address blazesym cannot handle fails the whole batch: retry each.
            Err(_) if addrs.len() > 1 => {
                return addrs
                    .iter()
                    .flat_map(|&a| {
                        let one = std::slice::from_ref(&a);
                        self.resolve_with(src, input.map(|_| one), one, user)
                    })
                    .collect();
            }
            Err(_) => return addrs.iter().map(|&a| (a, Frame::unknown(a))).collect(),
        };
        addrs
            .iter()
            .zip(syms)
            .map(|(&a, s)| {
                let stub = match &s {
                    Symbolized::Sym(s) if user => self.plt_stub(s),
                    _ => None,
                };
                let f = match (s, stub) {
                    (_, Some((name, offset))) => Frame {
                        addr: a,
                        name: Some(name),
                        offset,
                        inlined: Vec::new(),
                    },
                    (Symbolized::Sym(s), None) => {
                        // A function whose DWARF entry has only ranges (a hot and a
                        // .cold part: glibc's _IO_puts) comes with address 0 and the
                        // whole address as its offset; its ELF symbol has its entry.
                        let symtab = (user && s.addr == 0 && s.size.is_none())
                            .then(|| self.symtab_frame(&s))
                            .flatten();
                        let (name, offset) = match symtab {
                            Some(found) => found,
                            None => {
                                let name = if user { self.preferred_name(&s) } else { None };
                                (name.unwrap_or_else(|| s.name.to_string()), s.offset as u64)
                            }
                        };
                        Frame {
                            addr: a,
                            name: Some(name),
                            offset,
                            inlined: s.inlined.iter().rev().map(|i| i.name.to_string()).collect(),
                        }
                    }
                    (Symbolized::Unknown(_), None) => Frame::unknown(a),
                };
                (a, f)
            })
            .collect()
    }

    /// The PLT stub `sym`'s address is in, and its offset there: a symbolizer
    /// names it by the symbol before the section (`_init`).
    fn plt_stub(&self, sym: &Sym<'_>) -> Option<(String, u64)> {
        let plt = self.plt_at(Path::new(sym.module.as_deref()?));
        let (name, off) = plt.stub_at(sym.addr + sym.offset as u64)?;
        Some((name.to_string(), off))
    }

    /// The name BCC would print for `sym`: the preferred exported alias at its start
    /// address in its file's symbol tables, when `sym`'s own name is one of that
    /// function's names (not demangled or otherwise rewritten).
    fn preferred_name(&self, sym: &Sym<'_>) -> Option<String> {
        let bin = self.binary(sym)?;
        let f = bin.function_at(sym.addr)?;
        if !f.names.iter().any(|n| n.name == sym.name) {
            return None;
        }
        elf::preferred(f.names.iter().filter(|n| n.exported)).map(|n| n.name.clone())
    }

    /// (name, offset) of the address `sym` stands for, from its file's symbol
    /// tables: the preferred name (exported first) of the function holding it.
    fn symtab_frame(&self, sym: &Sym<'_>) -> Option<(String, u64)> {
        let bin = self.binary(sym)?;
        let addr = sym.addr + sym.offset as u64;
        let f = bin.function_containing(addr)?;
        let name = elf::preferred(f.names.iter().filter(|n| n.exported))
            .or_else(|| elf::preferred(&f.names))?;
        Some((name.name.clone(), addr - f.addr))
    }

    /// The symbol tables of `sym`'s file, read once.
    fn binary(&self, sym: &Sym<'_>) -> Option<Rc<Binary>> {
        self.binary_at(Path::new(sym.module.as_deref()?))
    }

    /// The symbol tables of the file at `path` and its debug file, read once.
    fn binary_at(&self, path: &Path) -> Option<Rc<Binary>> {
        // Looked up by reference first: this runs at every frame not named.
        if let Some(b) = self.binaries.borrow().get(path) {
            return b.clone();
        }
        let b = Binary::read(path).ok().map(|b| Rc::new(b.without_code()));
        self.binaries
            .borrow_mut()
            .insert(path.to_path_buf(), b.clone());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

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
            ["tracekit_common::data::symbolize::tests::tk_inlined_helper"]
        );
    }

    #[test]
    fn the_cut_marker_has_no_offset() {
        assert_eq!(Frame::truncated().lines(true), ["[truncated]"]);
        let f = Frame {
            addr: 0x1000,
            name: Some("main".into()),
            offset: 0x1f,
            inlined: Vec::new(),
        };
        assert_eq!(f.lines(true), ["main+0x1f"]);
    }

    #[test]
    fn build_id_frames_decode_to_the_first_empty_entry() {
        let entry = |status: i32, id: u8, value: u64| {
            let mut e = vec![0u8; UserFrame::SIZE];
            e[..4].copy_from_slice(&status.to_ne_bytes());
            e[4..24].fill(id);
            e[24..].copy_from_slice(&value.to_ne_bytes());
            e
        };
        let bytes = [
            entry(1, 0xab, 0x1234),
            entry(2, 0, 0x7f00_0000_1000),
            entry(1, 0xcd, 0x40),
            entry(0, 0, 0),
            entry(1, 0xef, 0x99),
        ]
        .concat();
        assert_eq!(
            UserFrame::decode(&bytes),
            [
                UserFrame::File {
                    build_id: [0xab; 20],
                    offset: 0x1234
                },
                UserFrame::Addr(0x7f00_0000_1000),
                UserFrame::File {
                    build_id: [0xcd; 20],
                    offset: 0x40
                },
            ]
        );
    }

    #[test]
    fn build_id_frames_name_a_file_by_its_build_id() {
        // This test binary's own function, as the kernel would give it: build
        // ID and file offset (found in this process's own files).
        let func = tk_symbolize_me as *const () as u64;
        let maps = exec_mappings("self").unwrap();
        let m = maps
            .iter()
            .find(|m| func >= m.start && func < m.end)
            .unwrap();
        let path = m.path.clone().unwrap();
        let id = elf::build_id(&path).expect("a build ID");
        let mut build_id = [0u8; 20];
        build_id[..id.len().min(20)].copy_from_slice(&id[..id.len().min(20)]);
        let frame = UserFrame::File {
            build_id,
            offset: func - m.start + m.pgoff,
        };
        // A pid that does not exist: only the build ID can name the frame.
        let got = Symbols::new().user_frames(u32::MAX, "", &[frame]);
        assert_eq!(got[0].0.name.as_deref(), Some("tk_symbolize_me"));
        assert_eq!(got[0].0.offset, 0);
        assert_eq!(got[0].1.as_deref(), path.file_name().unwrap().to_str());
    }

    #[test]
    fn a_frame_below_every_mapping_is_no_frame_of_the_file() {
        // A walk without frame pointers may give 0x20: the kernel's build-ID
        // stack gives it as the lowest mapping's file at offset 0x20 - its start
        // (wrapped). It was shown as a frame of that file with address "?".
        let exe = fs::read_link("/proc/self/exe").unwrap();
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        let base = maps
            .lines()
            .filter(|l| l.ends_with(exe.to_str().unwrap()))
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let start = u64::from_str_radix(f.next()?.split_once('-')?.0, 16).ok()?;
                let pgoff = u64::from_str_radix(f.nth(1)?, 16).ok()?;
                Some(start.wrapping_sub(pgoff))
            })
            .min()
            .unwrap();
        let id = elf::build_id(&exe).expect("a build ID");
        let mut build_id = [0u8; 20];
        build_id[..id.len().min(20)].copy_from_slice(&id[..id.len().min(20)]);
        let frame = UserFrame::File {
            build_id,
            offset: 0x20u64.wrapping_sub(base),
        };
        let got = Symbols::new().user_frames(std::process::id(), "", &[frame]);
        assert_eq!(got[0].0.addr, 0x20);
        assert_eq!(got[0].0.name, None);
        assert_eq!(got[0].1, None);
    }

    #[test]
    fn libc_functions_are_named_by_their_exported_alias() {
        // getpid's code in libc.so.6 is named __getpid and __GI___getpid in the
        // debug file, getpid and __getpid in .dynsym: BCC prints getpid.
        let libc = crate::user::targets::resolve("c", None).unwrap();
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
