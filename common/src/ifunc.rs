//! Where an IFUNC leads on this machine.
//!
//! An `STT_GNU_IFUNC` symbol (glibc's `strlen`, `memcpy`, ...) points at a resolver
//! that the dynamic linker runs once, at load time, to pick the implementation for
//! this CPU (`__strlen_evex`, `__strlen_avx2`, ...). A probe on the resolver counts
//! nothing useful. When the file is one this process has mapped too (libc always is),
//! asking our own dynamic linker gives the implementation every process on this
//! machine gets: `dlsym` runs the resolver, and /proc/self/maps turns the address
//! back into a file offset.

use std::ffi::{CStr, CString};
use std::fs;

/// A file mapping of this process: the part of the file at `offset` is at `start..end`.
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    dev: u64,
    ino: u64,
    path: String,
}

fn own_mappings() -> Vec<Mapping> {
    let Ok(maps) = fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    maps.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut f = line.split_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let _perms = f.next()?;
    let offset = f.next()?;
    let (maj, min) = f.next()?.split_once(':')?;
    let ino: u64 = f.next()?.parse().ok()?;
    let path = f.collect::<Vec<_>>().join(" ");
    if ino == 0 || !path.starts_with('/') {
        return None;
    }
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    Some(Mapping {
        start: hex(start)?,
        end: hex(end)?,
        offset: hex(offset)?,
        dev: libc::makedev(hex(maj)? as u32, hex(min)? as u32),
        ino,
        path,
    })
}

/// The file offset of the implementation that IFUNC `name` (at `version`, when the
/// symbol is versioned) of the file `dev`/`ino` resolves to on this machine, or why
/// that cannot be known.
pub fn implementation(
    dev: u64,
    ino: u64,
    name: &str,
    version: Option<&str>,
) -> Result<u64, String> {
    const WHY: &str = "an IFUNC whose implementation is chosen when the program loads";
    let maps = own_mappings();
    let Some(ours) = maps.iter().find(|m| m.dev == dev && m.ino == ino) else {
        return Err(format!(
            "{WHY}, and only the implementations of libraries this tool has loaded itself can be \
             looked up; trace the implementation by its own name"
        ));
    };
    let lookup = || -> Option<u64> {
        let path = CString::new(ours.path.as_str()).ok()?;
        let cname = CString::new(name).ok()?;
        let cver = version.and_then(|v| CString::new(v).ok());
        // SAFETY: RTLD_NOLOAD only returns a handle of an already loaded object (no
        // constructors run); the strings are valid; the handle is closed below.
        unsafe {
            let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if h.is_null() {
                return None;
            }
            let p = match &cver {
                Some(v) => libc::dlvsym(h, cname.as_ptr(), v.as_ptr()),
                None => libc::dlsym(h, cname.as_ptr()),
            };
            libc::dlclose(h);
            (!p.is_null()).then_some(p as u64)
        }
    };
    let Some(addr) = lookup() else {
        return Err(format!(
            "{WHY}, and the dynamic linker does not resolve it here{}",
            dl_error()
        ));
    };
    // The resolver may pick code of another file; the probe goes where the code is.
    match maps.iter().find(|m| addr >= m.start && addr < m.end) {
        Some(m) if m.dev == dev && m.ino == ino => Ok(addr - m.start + m.offset),
        Some(m) => Err(format!(
            "{WHY}, and here it resolves to code in another file ({})",
            m.path
        )),
        None => Err(format!("{WHY}, and here it resolves outside any file")),
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a valid C string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        String::new()
    } else {
        // SAFETY: checked non-null above.
        format!(" ({})", unsafe { CStr::from_ptr(e) }.to_string_lossy())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn maps_lines() {
        let m = parse_line(
            "7f2ed13f5000-7f2ed154b000 r-xp 00026000 fe:00 326279                     /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert_eq!(
            (m.start, m.end, m.offset, m.ino),
            (0x7f2ed13f5000, 0x7f2ed154b000, 0x26000, 326279)
        );
        assert_eq!(m.dev, libc::makedev(0xfe, 0));
        assert_eq!(m.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert!(parse_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0   [stack]").is_none());
    }

    #[test]
    fn libc_strlen_is_what_this_process_calls() {
        let libc_path = crate::ufuncs::resolve("c", None).unwrap();
        let meta = fs::metadata(&libc_path).unwrap();
        let off = implementation(meta.dev(), meta.ino(), "strlen", Some("GLIBC_2.2.5")).unwrap();
        // Our own strlen (through the PLT, resolved the same way) is at that offset.
        let ours = libc::strlen as *const () as u64;
        let maps = own_mappings();
        let m = maps
            .iter()
            .find(|m| ours >= m.start && ours < m.end)
            .unwrap();
        // A function pointer to an imported function is its resolved address (GOT).
        assert_eq!(m.ino, meta.ino());
        assert_eq!(off, ours - m.start + m.offset);
        let b = crate::elf::Binary::read(&libc_path).unwrap();
        if b.debug_file.is_some() {
            // The implementations are local symbols, named in libc6-dbg's symtab.
            let f = b
                .function_at_offset(off)
                .expect("a function at the implementation");
            assert!(
                f.names.iter().any(|n| n.name.starts_with("__strlen_")),
                "{f:?}"
            );
        }
        let e = implementation(1, 1, "strlen", None).unwrap_err();
        assert!(e.starts_with("an IFUNC whose implementation is chosen when the program loads"));
    }
}
