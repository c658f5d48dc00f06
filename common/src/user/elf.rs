//! Reading a binary's function symbols: every defined function (`STT_FUNC` and
//! `STT_GNU_IFUNC`) of `.symtab` and `.dynsym`, plus the `.symtab` of its separate
//! debug file when one is installed, with the file offset uprobes attach to.
//!
//! Files are checked before they are read (a FIFO must not block, a directory or a
//! device is not a binary), and every failure is one line saying what is wrong.

use std::collections::BTreeMap;
use std::fs::{self, File, Metadata};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, SectionHeader, Sym};
use object::{Endianness, Object, ObjectSymbol, ReadCache, ReadRef};

use crate::diag::shorten;

/// A path as messages show it: control bytes and invalid UTF-8 escaped (`\x1b`),
/// very long paths shortened.
pub fn shown(path: &Path) -> String {
    shorten(path.as_os_str().as_bytes())
}

/// Describes an error from looking at or opening `path`, in words.
pub fn io_error(path: &Path, e: &io::Error) -> String {
    let p = shown(path);
    match e.raw_os_error() {
        Some(libc::ENOENT) => format!("{p}: no such file"),
        Some(libc::ENAMETOOLONG) => format!("{p}: file name too long"),
        Some(libc::ENOTDIR) => format!("{p}: a component of the path is not a directory"),
        Some(libc::EACCES) | Some(libc::EPERM) => format!("{p}: permission denied"),
        Some(libc::ELOOP) => format!("{p}: too many levels of symbolic links"),
        _ => format!("{p}: {e}"),
    }
}

/// Why a file that is not a regular file cannot be traced; `None` for a regular file.
fn not_regular(path: &Path, meta: &Metadata) -> Option<String> {
    let t = meta.file_type();
    let what = if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Some(format!(
        "{} is {what}, not an executable or library",
        shown(path)
    ))
}

/// Up to `len` bytes of the binary at `path` from file offset `offset` (fewer at
/// its end), with [`open_binary`]'s checks.
pub fn file_bytes(path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    let opened = open_binary(path)?;
    let mut buf = vec![0u8; len];
    let n = read_up_to(&opened.file, offset, &mut buf)
        .map_err(|e| anyhow::anyhow!(io_error(path, &e)))?;
    buf.truncate(n);
    Ok(buf)
}

/// A binary opened for tracing: a regular, 64-bit ELF file of this machine.
pub struct Opened {
    pub file: File,
    pub dev: u64,
    pub ino: u64,
}

/// Opens `path` for tracing, failing with one clear line when it is not a regular,
/// readable, 64-bit ELF file of this machine. Never blocks on a FIFO or device.
/// Only the headers are read.
pub fn open_binary(path: &Path) -> Result<Opened> {
    let io = |e: io::Error| anyhow::anyhow!(io_error(path, &e));
    let meta = fs::metadata(path).map_err(io)?;
    if let Some(why) = not_regular(path, &meta) {
        bail!(why);
    }
    // O_NONBLOCK: should the file have been replaced by a FIFO since the stat.
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if let Some(why) = not_regular(path, &meta) {
        bail!(why);
    }
    let mut head = [0u8; 64];
    let n = read_up_to(&file, 0, &mut head).map_err(io)?;
    check_ident(path, &head[..n])?;
    let cache = ReadCache::new(&file);
    check_header(path, &cache)?;
    Ok(Opened {
        file,
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// A binary's whole contents, checked as by [`open_binary`].
pub struct ElfData {
    pub data: Vec<u8>,
}

/// Reads all of `path`, checked as by [`open_binary`].
pub fn read_binary(path: &Path) -> Result<ElfData> {
    let Opened { mut file, .. } = open_binary(path)?;
    let mut data = Vec::new();
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_end(&mut data))
        .map_err(|e| anyhow::anyhow!(io_error(path, &e)))?;
    Ok(ElfData { data })
}

/// The GNU build ID of the ELF file at `path` (its notes only are read), for
/// naming user stack frames that the kernel gave as build ID and file offset.
pub fn build_id(path: &Path) -> Option<Vec<u8>> {
    let Opened { file, .. } = open_binary(path).ok()?;
    let cache = ReadCache::new(&file);
    let elf = ElfFile64::<Endianness, _>::parse(&cache).ok()?;
    elf.build_id().ok()?.map(<[u8]>::to_vec)
}

/// Reads into `buf` from `offset` until it is full or the file ends.
fn read_up_to(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Checks the first bytes of a file: ELF, 64-bit.
fn check_ident(path: &Path, head: &[u8]) -> Result<()> {
    let p = shown(path);
    if head.is_empty() {
        bail!("{p} is an empty file, not an ELF file");
    }
    if !head.starts_with(b"\x7fELF") {
        if head.starts_with(b"#!") {
            bail!("{p} is not an ELF file (it is a script: trace its interpreter)");
        }
        bail!("{p} is not an ELF file");
    }
    // e_ident[EI_CLASS]
    match head.get(4) {
        Some(&c) if c == elf::ELFCLASS64.0 => Ok(()),
        Some(&c) if c == elf::ELFCLASS32.0 => {
            bail!("{p} is a 32-bit ELF file; only 64-bit binaries can be traced")
        }
        _ => bail!("{p} is a truncated or corrupt ELF file (no valid ELF class)"),
    }
}

/// Checks that the ELF headers parse and are for this machine.
fn check_header(path: &Path, data: &ReadCache<&File>) -> Result<()> {
    let p = shown(path);
    let file = ElfFile64::<Endianness, _>::parse(data)
        .map_err(|e| anyhow::anyhow!("{p} is a truncated or corrupt ELF file ({e})"))?;
    let machine = file.elf_header().e_machine(file.endian());
    if cfg!(target_arch = "x86_64") && machine != elf::EM_X86_64 {
        bail!(
            "{p} is an ELF file for another architecture (e_machine {machine}); only x86-64 binaries can be traced here"
        );
    }
    if cfg!(target_arch = "aarch64") && machine != elf::EM_AARCH64 {
        bail!(
            "{p} is an ELF file for another architecture (e_machine {machine}); only aarch64 binaries can be traced here"
        );
    }
    if file.is_little_endian() != cfg!(target_endian = "little") {
        bail!("{p} is an ELF file of the other byte order");
    }
    Ok(())
}

/// One name of a function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name {
    /// The name without its symbol version (`memcpy` for `memcpy@@GLIBC_2.14`).
    pub name: String,
    /// Exported: in `.dynsym` with GLOBAL, WEAK or UNIQUE binding.
    pub exported: bool,
    /// The `.dynsym` version (`GLIBC_2.14`), when it has one.
    pub version: Option<String>,
    /// A non-default version (`memcpy@GLIBC_2.2.5` beside `memcpy@@GLIBC_2.14`),
    /// kept for programs linked against the old one.
    pub hidden: bool,
}

impl Name {
    /// Lower is preferred: exported names, then the plainest (fewest leading
    /// underscores, shortest), then alphabetical.
    fn rank(&self) -> (bool, (usize, usize), &str) {
        (!self.exported, plainness(&self.name), &self.name)
    }
}

/// Lower is plainer: fewer leading underscores, then shorter (`memcpy` before
/// `__memcpy`, `rawmemchr` before `__rawmemchr`).
pub fn plainness(name: &str) -> (usize, usize) {
    (name.len() - name.trim_start_matches('_').len(), name.len())
}

/// The name a function is shown by, among `names`: see [`Name`]'s order.
pub fn preferred<'a>(names: impl IntoIterator<Item = &'a Name>) -> Option<&'a Name> {
    names.into_iter().min_by(|a, b| a.rank().cmp(&b.rank()))
}

/// A function entry: all the names at one address.
#[derive(Debug, Clone)]
pub struct Func {
    /// Virtual address in the file (`st_value`).
    pub addr: u64,
    pub size: u64,
    /// File offset of the entry, when it lies in an executable PT_LOAD segment.
    pub offset: Option<u64>,
    /// `STT_GNU_IFUNC`: `addr` is the resolver that picks the implementation at load time.
    pub ifunc: bool,
    pub names: Vec<Name>,
}

impl Func {
    /// The name this function is shown by when nothing else decides.
    pub fn label(&self) -> &str {
        preferred(&self.names).map_or("", |n| n.name.as_str())
    }
}

/// The function symbols of a 64-bit ELF binary.
pub struct Binary {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    /// For reading code at function entries; `None` once released.
    file: Option<File>,
    /// Sorted by address; an IFUNC and a plain function at one address are two entries.
    funcs: Vec<Func>,
    /// The binary or its debug file has a `.symtab` (it is not stripped).
    pub has_symtab: bool,
    /// The separate debug file whose `.symtab` was read, if any (the tests ask
    /// which file named the functions).
    #[cfg_attr(not(test), allow(dead_code))]
    pub debug_file: Option<PathBuf>,
    /// The file offset of the ELF entry point (`_start`), if it is in code.
    pub entry: Option<u64>,
    /// A Go program or library (its build info or pc-line table is there).
    pub go: bool,
    /// C++ code whose exceptions can unwind through its functions: it has
    /// exception tables (.gcc_except_table) and uses C++'s personality routine
    /// (`__gxx_personality_v0`). The tables alone are no sign: libc and Rust
    /// programs have them too.
    pub cxx_exceptions: bool,
    /// Its executable PT_LOAD segments: (vaddr, filesz, file offset).
    segments: Segments,
}

/// A symbol as read from one table.
struct RawSym {
    name: String,
    addr: u64,
    size: u64,
    ifunc: bool,
    exported: bool,
    version: Option<String>,
    hidden: bool,
}

/// Executable PT_LOAD segments: (vaddr, file size, file offset).
type Segments = Vec<(u64, u64, u64)>;

impl Binary {
    /// Opens `path` (see [`open_binary`]) and reads its symbols, and those of its
    /// debug file. Only the headers and symbol tables are read.
    pub fn read(path: &Path) -> Result<Binary> {
        let Opened { file: f, dev, ino } = open_binary(path)?;
        let p = shown(path);
        let corrupt = |e: object::read::Error| {
            anyhow::anyhow!("{p} is a truncated or corrupt ELF file ({e})")
        };
        let cache = ReadCache::new(&f);
        let file = ElfFile64::<Endianness, _>::parse(&cache).map_err(corrupt)?;
        let endian = file.endian();
        let mut segments: Segments = Vec::new();
        for ph in file.elf_program_headers() {
            if ph.p_type(endian) == elf::PT_LOAD && ph.p_flags(endian).0 & elf::PF_X.0 != 0 {
                segments.push((ph.p_vaddr(endian), ph.p_filesz(endian), ph.p_offset(endian)));
            }
        }
        let entry = file_offset(&segments, file.elf_header().e_entry(endian));
        let go = [".go.buildinfo", ".gopclntab"]
            .iter()
            .any(|s| file.section_by_name(s).is_some());
        let cxx_exceptions = file.section_by_name(".gcc_except_table").is_some()
            && file
                .dynamic_symbols()
                .chain(file.symbols())
                .any(|s| s.name_bytes() == Ok(&b"__gxx_personality_v0"[..]));
        let mut syms = Vec::new();
        let mut has_symtab = symbols(&file, elf::SHT_SYMTAB, &mut syms).map_err(corrupt)?;
        symbols(&file, elf::SHT_DYNSYM, &mut syms).map_err(corrupt)?;

        let mut debug_file = None;
        if let Some(dbg) = find_debug_file(path, &file) {
            // A debug file that cannot be read adds nothing; the binary's own tables stand.
            if let Ok(d) = open_binary(&dbg) {
                let cache = ReadCache::new(&d.file);
                if let Ok(df) = ElfFile64::<Endianness, _>::parse(&cache) {
                    let mut more = Vec::new();
                    if let Ok(true) = symbols(&df, elf::SHT_SYMTAB, &mut more) {
                        syms.extend(more);
                        has_symtab = true;
                        debug_file = Some(dbg);
                    }
                }
            }
        }
        drop(file);
        drop(cache);
        let funcs = group(syms, &segments);
        Ok(Binary {
            path: path.to_path_buf(),
            dev,
            ino,
            file: Some(f),
            funcs,
            has_symtab,
            debug_file,
            entry,
            go,
            cxx_exceptions,
            segments,
        })
    }

    /// The virtual address (as its symbols give them) of file offset `offset`
    /// in its code.
    pub fn vaddr_of(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(_, filesz, off)| offset >= off && offset - off < filesz)
            .map(|&(vaddr, _, off)| offset - off + vaddr)
    }

    /// The symbol tables alone: the file is closed ([`Binary::bytes_at`] then
    /// returns nothing), for long-lived caches.
    pub fn without_code(mut self) -> Binary {
        self.file = None;
        self
    }

    pub fn functions(&self) -> &[Func] {
        &self.funcs
    }

    /// The functions with `name` among their names. A scan: a run looks up a
    /// name or two per binary (its literal patterns), and indexing libc's 20,000
    /// names for that took longer than scanning them.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Func> {
        self.funcs
            .iter()
            .filter(move |f| f.names.iter().any(|n| n.name == name))
    }

    /// The (non-IFUNC) function starting at virtual address `addr`.
    pub fn function_at(&self, addr: u64) -> Option<&Func> {
        let i = self.funcs.partition_point(|f| f.addr < addr);
        self.funcs[i..]
            .iter()
            .take_while(|f| f.addr == addr)
            .find(|f| !f.ifunc)
    }

    /// The (non-IFUNC) function whose symbol's extent holds virtual address `addr`.
    pub fn function_containing(&self, addr: u64) -> Option<&Func> {
        let i = self.funcs.partition_point(|f| f.addr <= addr);
        // The nearest symbols below it: one of them, unless symbols nest deeply.
        self.funcs[..i]
            .iter()
            .rev()
            .take(16)
            .find(|f| !f.ifunc && addr - f.addr < f.size.max(1))
    }

    /// The (non-IFUNC) function whose entry is at file offset `offset`.
    pub fn function_at_offset(&self, offset: u64) -> Option<&Func> {
        self.funcs
            .iter()
            .find(|f| !f.ifunc && f.offset == Some(offset))
    }

    /// Up to `len` bytes of the file at `offset` (fewer at its end or on errors).
    pub fn bytes_at(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let n = self
            .file
            .as_ref()
            .and_then(|f| read_up_to(f, offset, &mut buf).ok())
            .unwrap_or(0);
        buf.truncate(n);
        buf
    }

    /// How many functions have an exported name.
    pub fn exported(&self) -> usize {
        self.funcs
            .iter()
            .filter(|f| f.names.iter().any(|n| n.exported))
            .count()
    }
}

/// Appends the defined functions of the `sh_type` table; returns whether it exists.
fn symbols<'data, R: ReadRef<'data>>(
    file: &ElfFile64<'data, Endianness, R>,
    sh_type: elf::SectionType,
    out: &mut Vec<RawSym>,
) -> object::read::Result<bool> {
    let endian = file.endian();
    let data = file.data();
    let sections = file.elf_section_table();
    let table = sections.symbols(endian, data, sh_type)?;
    if table.is_empty() {
        return Ok(false);
    }
    // The names, read in one piece: through a ReadCache each name would be a
    // seek and a 256-byte read of its own (libc's debug file: 13,000 pairs,
    // 14 ms of a `c:getpid` run).
    let strtab = sections
        .section(table.string_section())?
        .data(endian, data)?;
    let names = object::read::StringTable::new(strtab, 0, strtab.len() as u64);
    let dynamic = sh_type == elf::SHT_DYNSYM;
    let versions = if dynamic {
        sections.versions(endian, data).ok().flatten()
    } else {
        None
    };
    for (index, sym) in table.enumerate() {
        let kind = sym.st_type();
        if !(kind == elf::STT_FUNC || kind == elf::STT_GNU_IFUNC)
            || sym.st_shndx(endian).0 == elf::SHN_UNDEF.0
            || sym.st_shndx(endian).0 == elf::SHN_ABS.0
            || sym.st_value(endian) == 0
        {
            continue;
        }
        let Ok(raw) = sym.name(endian, names) else {
            continue;
        };
        let raw = String::from_utf8_lossy(raw);
        // `.symtab` spells versions into names: memcpy@GLIBC_2.2.5, memcpy@@GLIBC_2.14.
        let (base, sym_version, mut hidden) = match raw.split_once('@') {
            Some((b, v)) => (
                b,
                Some(v.trim_start_matches('@').to_string()),
                !v.starts_with('@'),
            ),
            None => (raw.as_ref(), None, false),
        };
        if base.is_empty() {
            continue;
        }
        let version = match &versions {
            Some(v) => {
                let ix = v.version_index(endian, index);
                hidden = ix.is_hidden();
                v.version(ix.index())
                    .ok()
                    .flatten()
                    .map(|v| String::from_utf8_lossy(v.name()).into_owned())
            }
            None => sym_version,
        };
        let binding = sym.st_bind();
        let exported = dynamic
            && matches!(
                binding,
                elf::STB_GLOBAL | elf::STB_WEAK | elf::STB_GNU_UNIQUE
            )
            && matches!(sym.st_visibility(), elf::STV_DEFAULT | elf::STV_PROTECTED);
        out.push(RawSym {
            name: base.to_string(),
            addr: sym.st_value(endian),
            size: sym.st_size(endian),
            ifunc: kind == elf::STT_GNU_IFUNC,
            exported,
            version,
            hidden,
        });
    }
    Ok(true)
}

/// One entry per (address, IFUNC or not), names merged and sorted by preference.
fn group(syms: Vec<RawSym>, segments: &Segments) -> Vec<Func> {
    let mut by_addr: BTreeMap<(u64, bool), Func> = BTreeMap::new();
    for s in syms {
        let f = by_addr.entry((s.addr, s.ifunc)).or_insert_with(|| Func {
            addr: s.addr,
            size: 0,
            offset: file_offset(segments, s.addr),
            ifunc: s.ifunc,
            names: Vec::new(),
        });
        f.size = f.size.max(s.size);
        match f.names.iter_mut().find(|n| n.name == s.name) {
            Some(n) => {
                if s.exported && !n.exported {
                    n.version = s.version;
                    n.hidden = s.hidden;
                }
                n.exported |= s.exported;
            }
            None => f.names.push(Name {
                name: s.name,
                exported: s.exported,
                version: s.version,
                hidden: s.hidden,
            }),
        }
    }
    let mut funcs: Vec<Func> = by_addr.into_values().collect();
    for f in &mut funcs {
        f.names.sort_by(|a, b| a.rank().cmp(&b.rank()));
    }
    funcs
}

fn file_offset(segments: &Segments, addr: u64) -> Option<u64> {
    segments
        .iter()
        .find(|&&(vaddr, filesz, _)| addr >= vaddr && addr - vaddr < filesz)
        .map(|&(vaddr, _, off)| addr - vaddr + off)
}

/// Where distributions install debug files.
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// The separate debug file of `path`: by build ID under /usr/lib/debug/.build-id,
/// else by `.gnu_debuglink` in /usr/lib/debug<dir>, <dir> and <dir>/.debug.
pub(crate) fn find_debug_file<'data, R: ReadRef<'data>>(
    path: &Path,
    file: &ElfFile64<'data, Endianness, R>,
) -> Option<PathBuf> {
    let build_id: Option<Vec<u8>> = file
        .build_id()
        .ok()
        .flatten()
        .filter(|b| b.len() >= 2)
        .map(<[u8]>::to_vec);
    if let Some(id) = &build_id {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let p = Path::new(DEBUG_ROOT)
            .join(".build-id")
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..]));
        if p.is_file() {
            return Some(p);
        }
    }
    let (name, _crc) = file.gnu_debuglink().ok().flatten()?;
    let name = Path::new(std::ffi::OsStr::from_bytes(name));
    if name.components().count() != 1 {
        return None;
    }
    let real = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = real.parent()?;
    let candidates = [
        Path::new(DEBUG_ROOT)
            .join(dir.strip_prefix("/").unwrap_or(dir))
            .join(name),
        dir.join(name),
        dir.join(".debug").join(name),
    ];
    candidates.into_iter().find(|c| {
        c.is_file()
            && c != &real
            // A debug file made for another build of this binary has other addresses.
            && match build_id {
                Some(ref id) => debug_build_id(c).is_none_or(|d| &d == id),
                None => true,
            }
    })
}

fn debug_build_id(path: &Path) -> Option<Vec<u8>> {
    let d = open_binary(path).ok()?;
    let cache = ReadCache::new(&d.file);
    let f = ElfFile64::<Endianness, _>::parse(&cache).ok()?;
    let id = f.build_id().ok().flatten().map(<[u8]>::to_vec);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn libc() -> Binary {
        let p = crate::user::targets::resolve("c", None).unwrap();
        Binary::read(&p).unwrap()
    }

    fn named<'a>(b: &'a Binary, name: &str) -> Vec<&'a Func> {
        b.functions()
            .iter()
            .filter(|f| f.names.iter().any(|n| n.name == name))
            .collect()
    }

    #[test]
    fn libc_has_its_exported_functions() {
        let b = libc();
        for name in [
            "malloc",
            "free",
            "read",
            "write",
            "pthread_mutex_lock",
            "getpid",
        ] {
            let f = named(&b, name);
            assert_eq!(f.len(), 1, "{name}: {f:?}");
            assert!(!f[0].ifunc, "{name}");
            assert!(f[0].offset.is_some(), "{name}");
            assert_eq!(f[0].label(), name, "{f:?}");
        }
        // Aliases at one address are one entry, shown by the exported, plainest name.
        let read = named(&b, "read")[0];
        assert!(read.names.iter().any(|n| n.name == "__read" && n.exported));
        let malloc = named(&b, "__libc_malloc");
        assert_eq!(malloc.len(), 1);
        assert_eq!(malloc[0].addr, named(&b, "malloc")[0].addr);
    }

    #[test]
    fn common_libc_names_resolve() {
        // 59 names a user would try first; every one is a function of glibc 2.36
        // (exported, by that name, in .dynsym) except where versions or builds differ.
        const NAMES: [&str; 59] = [
            "malloc",
            "free",
            "calloc",
            "realloc",
            "read",
            "write",
            "open",
            "close",
            "printf",
            "fprintf",
            "puts",
            "fopen",
            "fclose",
            "fread",
            "fwrite",
            "fflush",
            "strlen",
            "strcmp",
            "strncmp",
            "strcpy",
            "strchr",
            "memcpy",
            "memset",
            "memmove",
            "memcmp",
            "nanosleep",
            "sleep",
            "usleep",
            "getpid",
            "getppid",
            "exit",
            "abort",
            "pthread_mutex_lock",
            "pthread_mutex_unlock",
            "pthread_create",
            "pthread_join",
            "mmap",
            "munmap",
            "mprotect",
            "socket",
            "connect",
            "accept",
            "send",
            "recv",
            "sendto",
            "recvfrom",
            "epoll_wait",
            "poll",
            "select",
            "getenv",
            "setenv",
            "opendir",
            "readdir",
            "closedir",
            "stat",
            "fstat",
            "lseek",
            "fork",
            "execve",
        ];
        let b = libc();
        let missing: Vec<&str> = NAMES
            .iter()
            .copied()
            .filter(|n| named(&b, n).is_empty())
            .collect();
        assert!(missing.len() <= 2, "not found: {missing:?}");
    }

    #[test]
    fn ifuncs_are_marked() {
        let b = libc();
        let strlen = named(&b, "strlen");
        assert!(!strlen.is_empty());
        assert!(strlen.iter().all(|f| f.ifunc), "{strlen:?}");
        let v = &strlen[0].names.iter().find(|n| n.name == "strlen").unwrap();
        assert_eq!(v.version.as_deref(), Some("GLIBC_2.2.5"));
    }

    #[test]
    fn offsets_follow_the_executable_segment() {
        let b = libc();
        let f = named(&b, "getpid")[0];
        let off = f.offset.unwrap();
        // The bytes there are the ones `objdump` shows at the symbol's address:
        // glibc's getpid is `mov $0x27,%eax; syscall; ret`.
        assert_eq!(b.bytes_at(off, 7), b"\xb8\x27\x00\x00\x00\x0f\x05");
    }

    #[test]
    fn versioned_names_match_by_base_name() {
        let syms = vec![
            RawSym {
                name: "memcpy".into(),
                addr: 0x1000,
                size: 8,
                ifunc: false,
                exported: false,
                version: Some("GLIBC_2.14".into()),
                hidden: false,
            },
            RawSym {
                name: "__memcpy_impl".into(),
                addr: 0x1000,
                size: 8,
                ifunc: false,
                exported: false,
                version: None,
                hidden: false,
            },
            RawSym {
                name: "memcpy".into(),
                addr: 0x1000,
                size: 8,
                ifunc: false,
                exported: true,
                version: Some("GLIBC_2.14".into()),
                hidden: false,
            },
        ];
        let funcs = group(syms, &vec![(0x1000, 0x100, 0x2000)]);
        assert_eq!(funcs.len(), 1);
        assert_eq!(funcs[0].offset, Some(0x2000));
        assert_eq!(funcs[0].names.len(), 2);
        assert_eq!(funcs[0].label(), "memcpy");
        assert!(funcs[0].names[0].exported);
    }

    #[test]
    fn preference_order() {
        let n = |name: &str, exported| Name {
            name: name.into(),
            exported,
            version: None,
            hidden: false,
        };
        let names = [
            n("__GI___libc_malloc", false),
            n("__libc_malloc", true),
            n("malloc", true),
            n("__malloc", false),
        ];
        assert_eq!(preferred(&names).unwrap().name, "malloc");
        assert_eq!(preferred(&names[..2]).unwrap().name, "__libc_malloc");
        let local = [n("b_local", false), n("__a", true)];
        assert_eq!(preferred(&local).unwrap().name, "__a");
    }

    #[test]
    fn file_checks_in_words() {
        let err = |p: &str| open_binary(Path::new(p)).err().unwrap().to_string();
        assert_eq!(
            err("/etc"),
            "/etc is a directory, not an executable or library"
        );
        assert_eq!(
            err("/dev/null"),
            "/dev/null is a character device, not an executable or library"
        );
        assert_eq!(err("/etc/passwd"), "/etc/passwd is not an ELF file");
        assert_eq!(err("/no/such/file"), "/no/such/file: no such file");
        let long = format!("/tmp/{}", "x".repeat(5000));
        assert_eq!(
            err(&long),
            format!("{}... (5005 bytes): file name too long", &long[..80])
        );
        assert_eq!(
            shown(Path::new("/tmp/a\x1b[31mb\n")),
            "/tmp/a\\x1b[31mb\\x0a"
        );
    }
}
