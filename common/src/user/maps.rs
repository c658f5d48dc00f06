//! /proc/PID/maps, read into its fields, for every stage that needs a
//! process's mappings (symbolization, unwind tables, the libraries a `-p`
//! process maps, the IFUNC helper's answer).

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    /// File offset of `start`.
    pub pgoff: u64,
    /// Device as major << 32 | minor, and inode (0: no file).
    pub dev: u64,
    pub ino: u64,
    /// The rest of the line, blanks as one space: a path, `[vdso]`, a path
    /// with " (deleted)", or empty.
    pub path: String,
}

/// The lines of `/proc/<pid>/maps` (`pid` as /proc names it: a number or
/// `self`); `None` once the process is gone, or going: an exiting process
/// has released its memory before it is reaped, and reads as no mapping at
/// all (so does a kernel thread), which must not replace what was read of it
/// while it lived.
pub fn read(pid: &str) -> Option<Vec<Line>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let lines = parse_lines(&text);
    (!lines.is_empty()).then_some(lines)
}

/// The lines of a maps text (read here, or printed by another process: the
/// IFUNC helper's), those that parse.
pub fn parse_lines(text: &str) -> Vec<Line> {
    text.lines().filter_map(parse).collect()
}

impl Line {
    /// The device as stat(2)'s `st_dev` gives it.
    pub fn st_dev(&self) -> u64 {
        libc::makedev((self.dev >> 32) as u32, self.dev as u32)
    }

    /// A mapping of a file by its path (not of none, the vDSO or the stack).
    pub fn of_file(&self) -> bool {
        self.ino != 0 && self.path.starts_with('/')
    }
}

fn parse(l: &str) -> Option<Line> {
    let hex = |v| u64::from_str_radix(v, 16).ok();
    let mut f = l.split_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let perms = f.next()?.to_string();
    let pgoff = hex(f.next()?)?;
    let (major, minor) = f.next()?.split_once(':')?;
    let ino = f.next()?.parse().ok()?;
    Some(Line {
        start: hex(start)?,
        end: hex(end)?,
        perms,
        pgoff,
        dev: hex(major)? << 32 | hex(minor)?,
        ino,
        path: f.collect::<Vec<_>>().join(" "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_as_stat_gives_them_and_files_by_path() {
        let m = parse(
            "7f2ed13f5000-7f2ed154b000 r-xp 00026000 fe:00 326279                     /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert_eq!(m.st_dev(), libc::makedev(0xfe, 0));
        assert!(m.of_file());
        for l in [
            "7ffd1000-7ffd2000 rw-p 00000000 00:00 0   [stack]",
            "7ffd1000-7ffd2000 r-xp 00000000 00:00 0   [vdso]",
            "7ffd1000-7ffd2000 r-xp 00000000 00:00 0",
        ] {
            assert!(!parse(l).unwrap().of_file(), "{l}");
        }
    }

    #[test]
    fn a_line_in_fields() {
        let l = parse("7f10a000-7f10b000 r-xp 00002000 fd:01 1234   /usr/lib/a b.so (deleted)")
            .unwrap();
        assert_eq!((l.start, l.end, l.pgoff), (0x7f10a000, 0x7f10b000, 0x2000));
        assert_eq!(
            (l.perms.as_str(), l.dev, l.ino),
            ("r-xp", 0xfd << 32 | 1, 1234)
        );
        assert_eq!(l.path, "/usr/lib/a b.so (deleted)");
        assert_eq!(parse("1000-2000 rw-p 00000000 00:00 0").unwrap().path, "");
    }

    #[test]
    fn an_exited_process_not_yet_reaped_has_no_maps() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id().to_string();
        let zombie = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        let t = std::time::Instant::now();
        while !zombie() && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(zombie(), "pid {pid} did not exit");
        assert!(read(&pid).is_none());
        assert!(read("self").is_some_and(|l| !l.is_empty()));
        child.wait().unwrap();
        assert!(read(&pid).is_none());
    }
}
