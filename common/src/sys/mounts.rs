//! Mounts: whether a path is on a file system of a given type, where a type is
//! mounted, and the one `mount(2)` call of the crate.

use std::ffi::CString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Mounts file system `fstype` from `source` at `target` (tracefs, debugfs,
/// securityfs: the pseudo file systems a tool reads).
pub fn mount(source: &str, fstype: &str, target: &str) -> io::Result<()> {
    let c = |s: &str| CString::new(s).expect("no NUL");
    let (src, tgt, ty) = (c(source), c(target), c(fstype));
    // SAFETY: all pointers are valid NUL-terminated strings for the call's duration.
    let rc = unsafe { libc::mount(src.as_ptr(), tgt.as_ptr(), ty.as_ptr(), 0, std::ptr::null()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `path` is the root or inside of a file system with this magic number
/// (statfs(2)'s f_type, linux/magic.h).
pub fn is_mounted_at(path: &Path, magic: i64) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and st is a valid statfs for the call.
    unsafe { libc::statfs(path.as_ptr(), &mut st) == 0 && st.f_type as i64 == magic }
}

/// Where a file system of type `fstype` is mounted (its first line in
/// /proc/self/mounts).
pub fn mount_point(fstype: &str) -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, ty) = (f.next()?, f.next()?, f.next()?);
        (ty == fstype).then(|| PathBuf::from(unescape_mount(dir)))
    })
}

/// /proc/mounts escapes space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape_mount(r"/a\040b"), "/a b");
        assert_eq!(unescape_mount("/plain"), "/plain");
    }
}
