//! User-space targets: finding the binary for `lib:` / `/path:` / `u:lib:` specs, its
//! function symbols (for uprobes) and its USDT probes.

use std::collections::HashMap;
use std::env;
use std::fs;
use std::ops::ControlFlow;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use blazesym::inspect::{self, Inspector};
use blazesym::SymType;
use object::read::elf::{FileHeader, SectionHeader};

use crate::pattern::Matcher;

/// Finds the file a user spec names: a path as given; else, with a PID, the library
/// or executable that process has mapped (seen through its root, so containers work);
/// else `lib<target>.so*` from ld.so.cache (`c` is libc); else an executable on PATH.
pub fn resolve(target: &str, pid: Option<u32>) -> Result<PathBuf> {
    if target.contains('/') {
        let path = PathBuf::from(target);
        if path.exists() {
            return Ok(path);
        }
        if let Some(p) = pid
            .filter(|_| path.is_absolute())
            .map(|p| in_root_of(p, &path))
        {
            if p.exists() {
                return Ok(p);
            }
        }
        bail!("{target}: no such file");
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
    bail!(
        "cannot find \"{target}\": no lib{target}.so in ld.so.cache{}, no executable on PATH",
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

fn lib_name_matches(file_name: &str, target: &str) -> bool {
    file_name
        .strip_prefix("lib")
        .and_then(|r| r.strip_prefix(target))
        .is_some_and(|r| r.starts_with(".so") || r.starts_with('-'))
}

fn mapped_by(pid: u32, target: &str) -> Option<PathBuf> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|l| {
        let path = l.split_whitespace().nth(5)?;
        let name = Path::new(path).file_name()?.to_str()?;
        (path.starts_with('/') && (name == target || lib_name_matches(name, target)))
            .then(|| in_root_of(pid, Path::new(path)))
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
}

/// Function symbols of `binary` (symtab and dynsym) matching `m`, one per address:
/// aliases such as `write`/`__write` collapse to the plainest name. Sorted by name.
pub fn functions(binary: &Path, m: &Matcher) -> Result<Vec<UserFunc>> {
    let src = inspect::source::Source::Elf(inspect::source::Elf::new(binary));
    let mut by_offset: HashMap<u64, String> = HashMap::new();
    Inspector::new()
        .for_each(&src, |sym| {
            if sym.sym_type == SymType::Function && sym.addr != 0 && m.is_match(&sym.name) {
                if let Some(off) = sym.file_offset {
                    let plainer = |old: &String| name_rank(&sym.name) < name_rank(old);
                    by_offset
                        .entry(off)
                        .and_modify(|old| {
                            if plainer(old) {
                                *old = sym.name.to_string();
                            }
                        })
                        .or_insert_with(|| sym.name.to_string());
                }
            }
            ControlFlow::Continue(())
        })
        .with_context(|| format!("reading symbols of {}", binary.display()))?;
    let mut funcs: Vec<UserFunc> = by_offset
        .into_iter()
        .map(|(offset, name)| UserFunc { name, offset })
        .collect();
    funcs.sort_by(|a, b| a.name.cmp(&b.name).then(a.offset.cmp(&b.offset)));
    Ok(funcs)
}

fn name_rank(name: &str) -> (usize, usize, &str) {
    let underscores = name.len() - name.trim_start_matches('_').len();
    (underscores, name.len(), name)
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UsdtProbe {
    pub provider: String,
    pub name: String,
}

/// The distinct USDT probes (`.note.stapsdt`) of a 64-bit ELF file.
pub fn usdt_probes(binary: &Path) -> Result<Vec<UsdtProbe>> {
    let data = fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
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
                    probes.push(UsdtProbe {
                        provider: String::from_utf8_lossy(p).into_owned(),
                        name: String::from_utf8_lossy(n).into_owned(),
                    });
                }
            }
        }
        Ok(probes)
    };
    let mut probes =
        parse().with_context(|| format!("{}: not a readable 64-bit ELF file", binary.display()))?;
    probes.sort();
    probes.dedup();
    Ok(probes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lib_names() {
        assert!(lib_name_matches("libc.so.6", "c"));
        assert!(lib_name_matches("libc-2.31.so", "c"));
        assert!(!lib_name_matches("libcap.so.2", "c"));
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

    #[test]
    fn libc_functions() {
        let libc = resolve("c", None).unwrap();
        let funcs = functions(&libc, &Matcher::glob("getpid").unwrap()).unwrap();
        assert_eq!(funcs.len(), 1);
        assert_eq!(funcs[0].name, "getpid");
        assert!(funcs[0].offset > 0);
    }
}
