//! User-space targets: finding the binary for `lib:` / `/path:` / `u:lib:` specs, its
//! function symbols (for uprobes) and its USDT probes.

use std::collections::{BTreeMap, HashMap};
use std::env;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use object::read::elf::{FileHeader, SectionHeader};

use crate::probe::pattern::Matcher;
use crate::user::elf::{self, Binary, Func, Name};
use crate::user::ifunc;
use crate::user::insn;

/// Finds the file a user spec names: a path as given; else, with a PID, the library
/// or executable that process has mapped (seen through its root, so containers work);
/// else `lib<target>.so*` from ld.so.cache (`c` is libc); else an executable on PATH.
pub fn resolve(target: &str, pid: Option<u32>) -> Result<PathBuf> {
    if target.contains('/') {
        // The kernel would resolve these in the tool's own process.
        if ["/proc/self/", "/proc/thread-self/"]
            .iter()
            .any(|p| target.starts_with(p))
        {
            bail!(
                "\"{target}\" is a file of this tool's own process: give the program's path, or /proc/PID/... with its PID"
            );
        }
        let path = PathBuf::from(target);
        let err = match fs::metadata(&path) {
            Ok(_) => return Ok(path),
            Err(e) => e,
        };
        if let Some(p) = pid
            .filter(|_| path.is_absolute())
            .map(|p| in_root_of(p, &path))
        {
            if p.exists() {
                return Ok(p);
            }
        }
        bail!(elf::io_error(&path, &err));
    }
    if let Some(pid) = pid {
        if let Some(p) = mapped_by(pid, target) {
            return Ok(p);
        }
    }
    if let Some(p) = ld_so_cache(target) {
        return Ok(p);
    }
    if let Some(p) = on_path(target) {
        return Ok(p);
    }
    let here = if Path::new(target).exists() {
        format!(" (to trace the file in this directory, write ./{target})")
    } else {
        String::new()
    };
    bail!(
        "cannot find \"{target}\": no lib{target}.so in ld.so.cache{}, no executable on PATH{here}",
        pid.map(|p| format!(", not mapped by PID {p}"))
            .unwrap_or_default()
    )
}

/// `path` as seen from inside `pid`'s mount namespace.
fn in_root_of(pid: u32, path: &Path) -> PathBuf {
    let same_ns = match (
        fs::metadata("/proc/self/ns/mnt"),
        fs::metadata(format!("/proc/{pid}/ns/mnt")),
    ) {
        (Ok(a), Ok(b)) => a.ino() == b.ino(),
        _ => true,
    };
    if same_ns {
        path.to_path_buf()
    } else {
        Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path))
    }
}

/// Whether a library file is the one `target` names: `c` names libc.so.6 and
/// libc-2.31.so; a file name (libz.so.1) names itself.
fn lib_name_matches(file_name: &str, target: &str) -> bool {
    file_name == target
        || file_name
            .strip_prefix("lib")
            .and_then(|r| r.strip_prefix(target))
            .is_some_and(|r| r.starts_with(".so") || r.starts_with('-'))
}

fn mapped_by(pid: u32, target: &str) -> Option<PathBuf> {
    crate::user::maps::read(&pid.to_string())?
        .iter()
        .find_map(|l| {
            let path = Path::new(&l.path);
            let name = path.file_name()?.to_str()?;
            (l.path.starts_with('/') && (name == target || lib_name_matches(name, target)))
                .then(|| in_root_of(pid, path))
        })
}

fn on_path(name: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Looks `lib<name>.so*` up in /etc/ld.so.cache (glibc's "glibc-ld.so.cache1.1" format).
fn ld_so_cache(name: &str) -> Option<PathBuf> {
    let data = fs::read("/etc/ld.so.cache").ok()?;
    ld_so_cache_lookup(&data, name)
}

fn ld_so_cache_lookup(data: &[u8], name: &str) -> Option<PathBuf> {
    const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
    const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const HEADER: usize = 48; // magic+version, nlibs, len_strings, flags, pad, ext offset, unused
    const ENTRY: usize = 24; // flags, key, value, osversion, hwcap
                             // x86-64 libc6 entries; other ABIs (i386, x32) would not run in our process' arch.
    const FLAG_ELF_LIBC6: i32 = 0x0003;
    const FLAG_X8664_LIB64: i32 = 0x0300;

    let u32_at = |off: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(data.get(off..off + 4)?.try_into().ok()?))
    };
    // Old-format caches carry the new format after their own entries.
    let start = if data.starts_with(OLD_MAGIC) {
        let nlibs = u32_at(12)? as usize;
        (16 + nlibs * 12).next_multiple_of(8)
    } else {
        0
    };
    if !data.get(start..)?.starts_with(NEW_MAGIC) {
        return None;
    }
    let nlibs = u32_at(start + 20)? as usize;
    let cstr = |off: usize| -> Option<&str> {
        let s = data.get(start + off..)?;
        std::str::from_utf8(&s[..s.iter().position(|&b| b == 0)?]).ok()
    };
    (0..nlibs).find_map(|i| {
        let e = start + HEADER + i * ENTRY;
        let flags = u32_at(e)? as i32;
        if flags & 0xff != FLAG_ELF_LIBC6
            || (cfg!(target_arch = "x86_64") && flags & 0xff00 != FLAG_X8664_LIB64)
        {
            return None;
        }
        let key = cstr(u32_at(e + 4)? as usize)?;
        lib_name_matches(key, name)
            .then(|| cstr(u32_at(e + 8)? as usize).map(PathBuf::from))
            .flatten()
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserFunc {
    pub name: String,
    /// File offset of the entry, what uprobes attach to.
    pub offset: u64,
    /// Its size in bytes (`st_size`; 0 when unknown).
    pub size: u64,
    /// `name` is exported (see [`elf::Name`]): preferred when patterns meet.
    pub exported: bool,
}

impl UserFunc {
    /// True when `self`'s name is preferred over `other`'s for the same function
    /// (exported, then plainest: [`elf::preferred`]'s order).
    pub fn better_name_than(&self, other: &UserFunc) -> bool {
        let rank = |f: &UserFunc| {
            let underscores = f.name.len() - f.name.trim_start_matches('_').len();
            (!f.exported, underscores, f.name.len(), f.name.clone())
        };
        rank(self) < rank(other)
    }
}

/// `func` of `binary` entered `off` bytes in (trace's `func+off`): refused unless
/// one of its instructions begins there, and one a uprobe may sit on. The error
/// reads after "FUNC+OFF cannot be traced: ".
pub fn at_offset(binary: &Path, func: &UserFunc, off: u64) -> Result<UserFunc, String> {
    if func.size == 0 {
        return Err("the function's size is not in its symbol, so the offset cannot be checked against its instructions".into());
    }
    if off >= func.size {
        return Err(format!(
            "it is past the function's end ({} bytes)",
            func.size
        ));
    }
    // The instruction at `off` is at most 15 bytes long.
    let len = func.size.min(off + 15) as usize;
    let code = elf::file_bytes(binary, func.offset, len).map_err(|e| e.to_string())?;
    insn::check_boundary(&code, off)?;
    insn::check_insn(&code[off as usize..], "the")?;
    Ok(UserFunc {
        offset: func.offset + off,
        ..func.clone()
    })
}

/// The functions of a binary matching a pattern.
#[derive(Debug, Default)]
pub struct Found {
    /// One per entry address, sorted by name.
    pub funcs: Vec<UserFunc>,
    /// Matching functions that cannot be probed: (name, reason).
    pub skipped: Vec<(String, String)>,
    /// What the user should know of the probes found: IFUNCs that run the same
    /// implementation as other IFUNCs on this CPU (one probe sees the calls of all).
    pub notes: Vec<String>,
}

/// Functions of `bin` with a name matching `m`, one per entry address (aliases
/// collapse), each shown by its preferred matching name (see [`elf::preferred`]).
/// IFUNCs lead to the implementation this machine's dynamic linker picks; functions
/// whose entry cannot carry a uprobe are skipped with the reason.
pub fn functions(bin: &Binary, m: &Matcher) -> Found {
    let candidates: Vec<&Func> = match m.literal() {
        Some(name) => bin.named(name).collect(),
        None => bin
            .functions()
            .iter()
            .filter(|f| f.names.iter().any(|n| m.is_match(&n.name)))
            .collect(),
    };
    // Per entry: its names and size.
    let mut at: BTreeMap<u64, (Vec<&Name>, u64)> = BTreeMap::new();
    let mut found = Found::default();
    // Every exported IFUNC is looked up when one matches (one helper run): which
    // others share its implementation is known only then.
    let all_ifuncs: Vec<&Func> = if candidates.iter().any(|f| f.ifunc) {
        bin.functions().iter().filter(|f| f.ifunc).collect()
    } else {
        Vec::new()
    };
    let targets: HashMap<*const Func, Result<u64, String>> = all_ifuncs
        .iter()
        .map(|f| *f as *const Func)
        .zip(ifunc_targets(bin, all_ifuncs.iter()))
        .collect();
    let mut via_ifunc: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for f in candidates {
        let ifunc = f.ifunc.then(|| targets[&(f as *const Func)].clone());
        let matched: Vec<&Name> = f.names.iter().filter(|n| m.is_match(&n.name)).collect();
        let Some(label) = elf::preferred(matched.iter().copied()) else {
            continue;
        };
        let offset = if let Some(target) = ifunc {
            target
        } else {
            f.offset
                .ok_or_else(|| "its address is not in an executable segment of the file".into())
        };
        match offset {
            Ok(off) => {
                let e = at.entry(off).or_default();
                e.0.extend(matched);
                if !f.ifunc {
                    e.1 = e.1.max(f.size);
                } else {
                    via_ifunc.entry(off).or_default().push(f.label());
                }
            }
            Err(why) => found.skipped.push((label.name.clone(), why)),
        }
    }
    // IFUNCs whose implementation on this CPU is one probe's: memmove and memcpy
    // both run __memmove_avx512_unaligned_erms, say.
    for (off, mine) in &via_ifunc {
        let mut all: Vec<&str> = all_ifuncs
            .iter()
            .filter(|f| matches!(targets[&(**f as *const Func)], Ok(o) if o == *off))
            .map(|f| f.label())
            .collect();
        all.sort_unstable();
        all.dedup();
        if all.len() < 2 {
            continue;
        }
        let code = bin
            .function_at_offset(*off)
            .map_or_else(|| format!("offset {off:#x}"), |f| f.label().to_string());
        let others: Vec<&str> = all.iter().copied().filter(|n| !mine.contains(n)).collect();
        found.notes.push(if others.is_empty() {
            format!(
                "{} run the same code on this CPU ({code}): one probe counts their calls \
                 together",
                all.join(" and ")
            )
        } else {
            format!(
                "{} runs the same code as {} on this CPU ({code}): its probe also counts the \
                 calls of {}",
                mine.join(" and "),
                others.join(" and "),
                others.join(" and ")
            )
        });
    }
    let mut chosen: Vec<(&Name, u64, u64)> = Vec::new();
    // TRACEKIT_NO_INSN_CHECK=1 leaves the refusal to the kernel (to test how a
    // refused attach is handled); nothing else should set it.
    let check = std::env::var_os("TRACEKIT_NO_INSN_CHECK").is_none_or(|v| v == "0");
    for (offset, (names, size)) in at {
        let best = elf::preferred(names).expect("at least one name per offset");
        // An IFUNC's implementation is sized by its own symbol.
        let size = match size {
            0 => bin.function_at_offset(offset).map_or(0, |f| f.size),
            n => n,
        };
        let entry = if check {
            insn::check_entry(&bin.bytes_at(offset, 16))
        } else {
            Ok(())
        };
        match entry {
            Ok(()) => chosen.push((best, offset, size)),
            Err(why) => found.skipped.push((best.name.clone(), why)),
        }
    }
    // `memcpy@GLIBC_2.2.5` (old programs) and `memcpy` (the default version) are two
    // functions: the old one is shown with its version.
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (n, _, _) in &chosen {
        *count.entry(n.name.as_str()).or_default() += 1;
    }
    found.funcs = chosen
        .iter()
        .map(|&(n, offset, size)| UserFunc {
            name: match &n.version {
                Some(v) if n.hidden && count[n.name.as_str()] > 1 => format!("{}@{v}", n.name),
                _ => n.name.clone(),
            },
            offset,
            size,
            exported: n.exported,
        })
        .collect();
    found
        .funcs
        .sort_by(|a, b| a.name.cmp(&b.name).then(a.offset.cmp(&b.offset)));
    found.skipped.sort();
    found.skipped.dedup();
    found
}

/// Whether `name` is the cold part of a function that a compiler split off
/// (GCC's `f.cold`, `f.part.0.cold`; LLVM's `f.cold.1`).
pub fn is_cold_part(name: &str) -> bool {
    name.split('.').skip(1).any(|p| p == "cold")
}

/// Moves the functions that are entered by a jump, not a call, from
/// `found.funcs` to `found.skipped`, for a plan that hooks returns: the word at
/// the stack pointer there is not a return address, and a return hook would
/// overwrite it (the traced program goes on with a wrong value). Their entries
/// are counted safely. They are cold parts, entered from their function, and
/// the program's entry point (`_start`, at the ELF header's `entry`), entered
/// from the kernel with argc at the top of the stack.
pub fn skip_jump_entered(found: &mut Found, entry: Option<u64>) {
    let (jumped, funcs): (Vec<UserFunc>, Vec<UserFunc>) = std::mem::take(&mut found.funcs)
        .into_iter()
        .partition(|f| is_cold_part(&f.name) || Some(f.offset) == entry);
    found.funcs = funcs;
    for f in jumped {
        let reason = if Some(f.offset) == entry {
            "it is the program's entry point, entered by a jump from the kernel, not a \
             call, so a return hook there would overwrite argc at the top of the stack; \
             time main instead"
                .to_string()
        } else {
            let whole = f.name.split(".cold").next().unwrap_or(&f.name).to_string();
            format!(
                "it is a cold part of {whole}, entered by a jump, not a call, so a return \
                 hook there would overwrite a value in {whole}'s frame; time {whole} itself"
            )
        };
        found.skipped.push((f.name, reason));
    }
    found.skipped.sort();
}

/// The file offsets the IFUNCs `funcs` lead to on this machine, in order; all
/// looked up together (one helper run, see [`ifunc`]).
fn ifunc_targets<'a>(
    bin: &Binary,
    funcs: impl Iterator<Item = &'a &'a Func>,
) -> Vec<Result<u64, String>> {
    let names: Vec<Option<&Name>> = funcs
        .map(|f| elf::preferred(f.names.iter().filter(|n| n.exported)))
        .collect();
    let queries: Vec<(&str, Option<&str>)> = names
        .iter()
        .flatten()
        .map(|n| (n.name.as_str(), n.version.as_deref()))
        .collect();
    let mut answers = ifunc::implementations(&bin.path, bin.dev, bin.ino, &queries).into_iter();
    names
        .iter()
        .map(|n| match n {
            Some(_) => answers.next().expect("an answer per query"),
            None => Err(format!(
                "{}, and it is not exported, so which one cannot be looked up; trace the \
                 implementation by its own name",
                ifunc::WHY
            )),
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UsdtProbe {
    pub provider: String,
    pub name: String,
    /// Its number of arguments (the most any of its sites has).
    pub args: u32,
    /// Each argument's size in bytes and signedness, from its spec's `-4@`
    /// prefix, where every site that has the argument agrees.
    pub types: Vec<Option<(u8, bool)>>,
}

/// The size and signedness of a USDT argument spec ("-4@%edi": a signed int).
fn usdt_arg_type(spec: &[u8]) -> Option<(u8, bool)> {
    let at = spec.iter().position(|&b| b == b'@')?;
    let (signed, digits) = match &spec[..at] {
        [b'-', rest @ ..] => (true, rest),
        rest => (false, rest),
    };
    match digits {
        [d @ (b'1' | b'2' | b'4' | b'8')] => Some((d - b'0', signed)),
        _ => None,
    }
}

/// The distinct USDT probes (`.note.stapsdt`) of a 64-bit ELF file.
pub fn usdt_probes(binary: &Path) -> Result<Vec<UsdtProbe>> {
    let data = elf::read_binary(binary)?.data;
    let parse = || -> object::read::Result<Vec<UsdtProbe>> {
        let header = object::elf::FileHeader64::<object::Endianness>::parse(&*data)?;
        let endian = header.endian()?;
        let mut probes = Vec::new();
        for section in header.sections(endian, &*data)?.iter() {
            let Some(mut notes) = section.notes(endian, &*data)? else {
                continue;
            };
            while let Some(note) = notes.next()? {
                // NT_STAPSDT = 3; desc = pc, base, semaphore (3 x u64), then
                // provider\0name\0args\0.
                if note.name() != b"stapsdt" || note.n_type(endian) != object::elf::NoteType(3) {
                    continue;
                }
                let mut strs = note.desc().get(24..).unwrap_or_default().split(|&b| b == 0);
                if let (Some(p), Some(n)) = (strs.next(), strs.next()) {
                    // The arguments: "-4@%edi 8@-16(%rbp)", one word each.
                    let args: Vec<&[u8]> = strs
                        .next()
                        .unwrap_or_default()
                        .split(|b| b.is_ascii_whitespace())
                        .filter(|w| !w.is_empty())
                        .collect();
                    probes.push(UsdtProbe {
                        provider: String::from_utf8_lossy(p).into_owned(),
                        name: String::from_utf8_lossy(n).into_owned(),
                        args: args.len() as u32,
                        types: args.iter().map(|a| usdt_arg_type(a)).collect(),
                    });
                }
            }
        }
        Ok(probes)
    };
    let mut probes = parse().map_err(|e| {
        anyhow::anyhow!(
            "{} is a truncated or corrupt ELF file ({e})",
            elf::shown(binary)
        )
    })?;
    // One per probe name, with the most arguments any of its sites has.
    probes.sort();
    probes.dedup_by(|later, kept| {
        let same = later.provider == kept.provider && later.name == kept.name;
        if same {
            kept.args = kept.args.max(later.args);
            let n = kept.types.len().max(later.types.len());
            kept.types = (0..n)
                .map(|i| match (kept.types.get(i), later.types.get(i)) {
                    (Some(a), Some(b)) if a == b => *a,
                    (Some(a), None) => *a,
                    (None, Some(b)) => *b,
                    _ => None,
                })
                .collect();
        }
        same
    });
    Ok(probes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usdt_argument_types_from_their_specs() {
        assert_eq!(usdt_arg_type(b"-4@%edi"), Some((4, true)));
        assert_eq!(usdt_arg_type(b"8@-16(%rbp)"), Some((8, false)));
        assert_eq!(usdt_arg_type(b"-2@%di"), Some((2, true)));
        assert_eq!(usdt_arg_type(b"1@$5"), Some((1, false)));
        assert_eq!(usdt_arg_type(b"%edi"), None);
        assert_eq!(usdt_arg_type(b"-3@%edi"), None);
    }

    #[test]
    fn lib_names() {
        assert!(lib_name_matches("libc.so.6", "c"));
        assert!(lib_name_matches("libc-2.31.so", "c"));
        assert!(!lib_name_matches("libcap.so.2", "c"));
        assert!(lib_name_matches("libz.so.1", "libz.so.1"));
        assert!(lib_name_matches("libpthread.so.0", "pthread"));
    }

    #[test]
    fn finds_libc() {
        let p = resolve("c", None).expect("libc via ld.so.cache");
        assert!(
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("libc.so"),
            "{}",
            p.display()
        );
        let me = std::process::id();
        let p = resolve("c", Some(me)).expect("libc mapped by this process");
        assert!(p.to_str().unwrap().contains("libc"), "{}", p.display());
    }

    #[test]
    fn finds_executable_on_path() {
        assert!(resolve("sh", None).unwrap().ends_with("sh"));
        let e = resolve("no-such-lib-xyz", None).unwrap_err().to_string();
        assert!(e.contains("cannot find \"no-such-lib-xyz\""), "{e}");
    }

    fn libc() -> Binary {
        Binary::read(&resolve("c", None).unwrap()).unwrap()
    }

    fn find(b: &Binary, pattern: &str) -> Found {
        functions(b, &Matcher::glob(pattern).unwrap())
    }

    fn names(f: &Found) -> Vec<&str> {
        f.funcs.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn libc_functions() {
        let b = libc();
        let f = find(&b, "getpid");
        assert_eq!(names(&f), ["getpid"]);
        assert!(f.funcs[0].offset > 0);
        for name in [
            "malloc",
            "free",
            "read",
            "write",
            "pthread_mutex_lock",
            "strlen",
        ] {
            assert_eq!(names(&find(&b, name)), [name]);
        }
        // An internal name is shown as asked for.
        assert_eq!(names(&find(&b, "__libc_malloc")), ["__libc_malloc"]);
        assert_eq!(
            find(&b, "__libc_malloc").funcs[0].offset,
            find(&b, "malloc").funcs[0].offset
        );
    }

    #[test]
    fn a_glob_shows_each_address_once_by_its_exported_name() {
        let b = libc();
        let f = find(&b, "*malloc*");
        let malloc = find(&b, "malloc").funcs[0].offset;
        let at: Vec<&UserFunc> = f.funcs.iter().filter(|u| u.offset == malloc).collect();
        assert_eq!(at.len(), 1);
        assert_eq!(at[0].name, "malloc");
        let mut offsets: Vec<u64> = f.funcs.iter().map(|u| u.offset).collect();
        offsets.sort();
        offsets.dedup();
        assert_eq!(offsets.len(), f.funcs.len());
    }

    #[test]
    fn ifuncs_lead_to_this_cpus_implementation() {
        let b = libc();
        let strlen = &find(&b, "strlen").funcs[0];
        let resolver = b.named("strlen").find(|f| f.ifunc).unwrap();
        assert_ne!(Some(strlen.offset), resolver.offset);
        // The implementation's own name at that offset collapses into `strlen`.
        let f = find(&b, "*strlen*");
        assert_eq!(
            f.funcs.iter().filter(|u| u.offset == strlen.offset).count(),
            1
        );
        assert!(names(&f).contains(&"strlen"));
    }

    #[test]
    fn old_symbol_versions_are_shown_with_their_version() {
        // glibc has memcpy@@GLIBC_2.14 (an IFUNC) and memcpy@GLIBC_2.2.5 (for
        // programs linked before 2.14, an alias of memmove's SSE2 version).
        let b = libc();
        let f = find(&b, "memcpy");
        if f.funcs.len() == 2 {
            assert_eq!(names(&f), ["memcpy", "memcpy@GLIBC_2.2.5"]);
        }
    }
}
