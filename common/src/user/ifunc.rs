//! Where an IFUNC leads on this machine.
//!
//! An `STT_GNU_IFUNC` symbol (glibc's `strlen`, `memcpy`, ...) points at a resolver
//! that the dynamic linker runs once, at load time, to pick the implementation for
//! this CPU (`__strlen_evex`, `__strlen_avx2`, ...). A probe on the resolver counts
//! nothing useful. The dynamic linker of a process that has loaded the file gives
//! the implementation every process on this machine gets: `dlsym` runs the
//! resolver, and the process's maps turn the address back into a file offset.
//!
//! The tools are linked statically, with no dynamic linker of their own, so they
//! ask a small dynamically linked helper (`helpers/ifunc.c`, built by build.rs and
//! embedded here), run from a memfd: one short process for all the IFUNCs a
//! pattern matches in a file. It asks only about libraries it has loaded anyway
//! (libc), so no library's constructors run for the question.

use std::fs;
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::user::maps::{self, Line};

/// The helper's executable (build.rs).
static HELPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ifunc-helper"));

/// How every reason an IFUNC cannot be traced begins.
pub(crate) const WHY: &str = "an IFUNC whose implementation is chosen when the program loads";

/// For each IFUNC (name, version when the symbol is versioned) of the file at
/// `path` (`dev`/`ino`), the file offset of the implementation it resolves to on
/// this machine, or why that cannot be known; one helper run for them all.
pub fn implementations(
    path: &Path,
    dev: u64,
    ino: u64,
    names: &[(&str, Option<&str>)],
) -> Vec<Result<u64, String>> {
    let not_loaded = || {
        format!(
            "{WHY}, and only the implementations of the libraries every program loads (libc) \
             can be looked up; trace the implementation by its own name"
        )
    };
    if names.is_empty() {
        return Vec::new();
    }
    let queries = names.iter().map(|(n, v)| match v {
        Some(v) => format!("{n}@{v}"),
        None => n.to_string(),
    });
    let out = match ask_helper(path, queries) {
        Ok(out) => out,
        Err(e) => {
            let e = format!("{WHY}, and the helper that looks it up could not run ({e})");
            return vec![Err(e); names.len()];
        }
    };
    let mut lines = out.lines();
    let answers: Vec<&str> = lines.by_ref().take_while(|l| *l != "maps").collect();
    if answers.first() == Some(&"not-loaded") {
        return vec![Err(not_loaded()); names.len()];
    }
    let rest: Vec<&str> = lines.collect();
    let maps: Vec<Line> = maps::parse_lines(&rest.join("\n"))
        .into_iter()
        .filter(Line::of_file)
        .collect();
    let ours = maps.iter().any(|m| m.st_dev() == dev && m.ino == ino);
    let one = |answer: Option<&&str>| -> Result<u64, String> {
        let answer = answer.copied().unwrap_or("");
        if let Some(e) = answer.strip_prefix("not-resolved") {
            let e = match e.trim() {
                "" => String::new(),
                e => format!(" ({e})"),
            };
            return Err(format!(
                "{WHY}, and the dynamic linker does not resolve it here{e}"
            ));
        }
        let Ok(addr) = u64::from_str_radix(answer, 16) else {
            return Err(format!("{WHY}, and its helper answered {answer:?}"));
        };
        // The resolver may pick code of another file; the probe goes where the code is.
        match maps.iter().find(|m| addr >= m.start && addr < m.end) {
            Some(m) if m.st_dev() == dev && m.ino == ino => Ok(addr - m.start + m.pgoff),
            Some(m) if ours => Err(format!(
                "{WHY}, and here it resolves to code in another file ({})",
                m.path
            )),
            // dlopen found a library by this path, but another file (replaced
            // since, or another copy): what it says is not about `path`.
            Some(_) => Err(not_loaded()),
            None => Err(format!("{WHY}, and here it resolves outside any file")),
        }
    };
    (0..names.len()).map(|i| one(answers.get(i))).collect()
}

/// Runs the embedded helper from a memfd and returns what it printed.
fn ask_helper(path: &Path, queries: impl Iterator<Item = String>) -> Result<String, String> {
    const MFD_EXEC: libc::c_uint = 0x10; // Linux 6.3+; refused as unknown before.
    let memfd = |flags| {
        // SAFETY: a valid C string and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"tracekit-ifunc".as_ptr(), flags) };
        // SAFETY: a fresh descriptor, owned from here on.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let fd = memfd(libc::MFD_CLOEXEC | MFD_EXEC)
        .or_else(|| memfd(libc::MFD_CLOEXEC))
        .ok_or_else(|| format!("memfd_create: {}", std::io::Error::last_os_error()))?;
    let mut writer = fs::File::from(fd);
    writer
        .write_all(HELPER)
        .map_err(|e| format!("writing the memfd: {e}"))?;
    // Exec'd through a read-only descriptor, the writable one closed first: exec
    // refuses a file that is open for writing (ETXTBSY) where that is counted.
    let file = fs::File::open(format!("/proc/self/fd/{}", writer.as_raw_fd()))
        .map_err(|e| format!("reopening the memfd: {e}"))?;
    drop(writer);
    // By its /proc/self/fd path, which the child still has open at exec
    // (close-on-exec closes it only once the exec has succeeded).
    let exe = format!("/proc/self/fd/{}", file.as_raw_fd());
    let out = Command::new(&exe)
        .arg(path)
        .args(queries)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("exec: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// This test process's file mappings.
    fn own_mappings() -> Vec<Line> {
        let maps = maps::read("self").unwrap();
        maps.into_iter().filter(Line::of_file).collect()
    }

    #[test]
    fn libc_strlen_is_what_this_process_calls() {
        let libc_path = crate::user::targets::resolve("c", None).unwrap();
        let meta = fs::metadata(&libc_path).unwrap();
        let [strlen, nosuch] = &implementations(
            &libc_path,
            meta.dev(),
            meta.ino(),
            &[("strlen", Some("GLIBC_2.2.5")), ("tk_no_such", None)],
        )[..] else {
            panic!("two answers")
        };
        let off = *strlen.as_ref().unwrap();
        let e = nosuch.as_ref().unwrap_err();
        assert!(
            e.contains("the dynamic linker does not resolve it here"),
            "{e}"
        );
        // Our own strlen (through the PLT, resolved the same way) is at that offset.
        let ours = libc::strlen as *const () as u64;
        let maps = own_mappings();
        let m = maps
            .iter()
            .find(|m| ours >= m.start && ours < m.end)
            .unwrap();
        // A function pointer to an imported function is its resolved address (GOT).
        assert_eq!(m.ino, meta.ino());
        assert_eq!(off, ours - m.start + m.pgoff);
        let b = crate::user::elf::Binary::read(&libc_path).unwrap();
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
        // A library the helper has not loaded is not asked about.
        let zlib = crate::user::targets::resolve("z", None).unwrap();
        let z = fs::metadata(&zlib).unwrap();
        let e = implementations(&zlib, z.dev(), z.ino(), &[("crc32", None)]);
        assert!(
            matches!(&e[..], [Err(e)] if e.contains("only the implementations of the libraries every program loads")),
            "{e:?}"
        );
    }
}
