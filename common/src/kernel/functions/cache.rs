//! The table of traceable kernel functions, cached across runs.
//!
//! Reading the kernel's lists costs most of a run's start-up (about 1.2 s in the
//! emulated benchmark guest: kallsyms, available_filter_functions_addrs and the
//! kprobe blacklist are generated on every read), and they only change at boot
//! and when modules come or go. So the table is kept in `/run/tracekit/kfuncs`
//! (a tmpfs: gone at reboot), keyed by the boot id and a hash of the module list
//! (name, size and load address of each module, not the reference counts that
//! change with use). Anything wrong with the file (another boot, another module
//! list, truncated, corrupt, not ours, unreadable) means it is not used, and the
//! kernel is read instead; failing to write it is silent too.
//!
//! `TRACEKIT_NO_CACHE=1` bypasses it; `TRACEKIT_CACHE_DIR` moves it (tests).

use std::fmt::Write as _;
use std::fs;
use std::hash::Hasher;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::kernel::functions::KernelFunc;

/// Version 2: `f` lines sorted by name (a run reads only the ranges its patterns'
/// literal prefixes select).
const MAGIC: &str = "tracekit-kfuncs 2";
const FILE: &str = "kfuncs";
/// The kprobe blacklist, for runs that name their functions exactly and read no
/// table (it costs 0.2 s of emulated time to generate).
const BLACKLIST_MAGIC: &str = "tracekit-kprobe-blacklist 1";
const BLACKLIST: &str = "blacklist";
/// Where the kernel keeps a task's TS_COMPAT flag.
const TASK_STATUS_MAGIC: &str = "tracekit-task-status 1";
const TASK_STATUS: &str = "task-status";
/// The kernel's text symbols by address (kernel/symbols.rs).
const SYMBOLS: &str = "ksyms";

/// What a cache is valid for: this boot, with these modules loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub boot_id: String,
    pub modules: u64,
}

impl Key {
    /// The running system's key; `None` when it cannot be read (no cache then).
    pub fn current() -> Option<Key> {
        Key::of_modules(&read_proc("/proc/modules").unwrap_or_default())
    }

    /// The key of this boot with `modules`, /proc/modules as read already.
    pub fn of_modules(modules: &str) -> Option<Key> {
        Some(Key {
            boot_id: boot_id()?,
            modules: modules_hash(modules),
        })
    }
}

/// This boot's id, which keys everything cached here; `None` when it cannot be
/// read (no cache then).
pub fn boot_id() -> Option<String> {
    let id = read_proc("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string())
}

/// A /proc file in as few reads as it allows: it reports no size, so
/// `read_to_string` starts from 32 bytes and grows, a syscall each step (this is
/// on every run's start).
fn read_proc(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(64 << 10);
    fs::File::open(path)?.read_to_end(&mut buf)?;
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Hash of `/proc/modules`: per module its name, size and load address (fields
/// 1, 2 and 6), so a load, unload or reload changes it and a use count does not.
pub fn modules_hash(text: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        for field in [f.first(), f.get(1), f.get(5)].into_iter().flatten() {
            h.write(field.as_bytes());
            h.write_u8(b' ');
        }
        h.write_u8(b'\n');
    }
    h.finish()
}

/// A cached table: the functions, the names removed as unsafe to trace, and the
/// files it was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub source: String,
    /// The functions (only those a run asked for, when loaded with a filter).
    pub funcs: Vec<KernelFunc>,
    /// How many functions the whole table has.
    pub total: usize,
    pub removed: Vec<String>,
}

/// Whether TRACEKIT_NO_CACHE asks to bypass the cache.
pub fn disabled() -> bool {
    std::env::var_os("TRACEKIT_NO_CACHE").is_some_and(|v| v != "0")
}

/// The cache directory: TRACEKIT_CACHE_DIR, else `/run/tracekit`.
pub fn dir() -> PathBuf {
    std::env::var_os("TRACEKIT_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/tracekit"))
}

/// Why a cache was not used, for the `timing:` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    Absent,
    Stale,
    Corrupt,
}

/// Which functions a run wants from the table.
pub struct Want<'a> {
    /// Whether a name is wanted.
    pub keep: &'a dyn Fn(&str) -> bool,
    /// Literal prefixes every wanted name starts with one of (`tcp_` for
    /// `tcp_*`), when the patterns have them: only those ranges of the sorted
    /// table are read, by binary search. None: every line is read.
    pub prefixes: Option<Vec<&'a str>>,
}

/// The table cached in `dir` for `key`, with only the functions `want` asks for
/// (a run needs only those it will trace).
pub fn load(dir: &Path, key: &Key, want: &Want) -> Result<Table, Miss> {
    parse(&read(&dir.join(FILE))?, key, want)
}

/// Writes `table` for `key` to `dir` atomically (a temporary file renamed over
/// the old one); any failure leaves no trace and is not reported.
pub fn store(dir: &Path, key: &Key, table: &Table) {
    let _ = write(dir, FILE, &render(key, table));
}

/// The kprobe blacklist cached in `dir` for `key`.
pub fn load_blacklist(dir: &Path, key: &Key) -> Result<Vec<String>, Miss> {
    read_lines(dir, BLACKLIST, BLACKLIST_MAGIC, &header(key), |lines| {
        let mut names = Vec::new();
        for line in lines {
            if let Some(n) = line.strip_prefix("end ") {
                return match n.parse::<usize>() {
                    Ok(n) if n == names.len() => Ok(names),
                    _ => Err(Miss::Corrupt),
                };
            }
            names.push(line.to_string());
        }
        Err(Miss::Corrupt)
    })
}

/// Writes the kprobe blacklist for `key`, as [`store`] does.
pub fn store_blacklist<'a>(
    dir: &Path,
    key: &Key,
    names: impl ExactSizeIterator<Item = &'a String>,
) {
    let mut s = format!("{BLACKLIST_MAGIC}\n{}\n", header(key));
    let n = names.len();
    for name in names {
        let _ = writeln!(s, "{name}");
    }
    let _ = writeln!(s, "end {n}");
    let _ = write(dir, BLACKLIST, &s);
}

/// The kernel's symbols cached in `dir` for `key` (kernel/symbols.rs checks
/// and reads the rest): stale unless its second line is the key's.
pub fn load_symbols(dir: &Path, key: &Key, magic: &str) -> Result<memmap2::Mmap, Miss> {
    let m = read(&dir.join(SYMBOLS))?;
    let mut lines = m.split(|&b| b == b'\n');
    if lines.next() != Some(magic.as_bytes()) {
        return Err(Miss::Corrupt);
    }
    if lines.next() != Some(header(key).as_bytes()) {
        return Err(Miss::Stale);
    }
    Ok(m)
}

/// Writes the kernel's symbols (the whole file's text) atomically, as [`store`].
pub fn store_symbols(dir: &Path, text: &str) {
    let _ = write(dir, SYMBOLS, text);
}

/// The byte offset of `thread_info.status` in the kernel's `task_struct`
/// ([`crate::kernel::features::task_status_offset`]), cached in `dir` for this boot:
/// the kernel's layout changes only with a new kernel, hence a new boot id.
pub fn load_task_status(dir: &Path, boot_id: &str) -> Result<u32, Miss> {
    let key = format!("boot {boot_id}");
    read_lines(
        dir,
        TASK_STATUS,
        TASK_STATUS_MAGIC,
        &key,
        |mut lines| match (
            lines.next().and_then(|l| l.strip_prefix("offset ")),
            lines.next(),
        ) {
            (Some(n), Some("end")) => n.parse().map_err(|_| Miss::Corrupt),
            _ => Err(Miss::Corrupt),
        },
    )
}

/// Writes the offset for this boot, as [`store`] does.
pub fn store_task_status(dir: &Path, boot_id: &str, offset: u32) {
    let text = format!("{TASK_STATUS_MAGIC}\nboot {boot_id}\noffset {offset}\nend\n");
    let _ = write(dir, TASK_STATUS, &text);
}

/// The lines of the small text cache `file` after its first two, handed to
/// `body`: corrupt unless the first is `magic`, stale unless the second is
/// `key_line` (what the cache is valid for).
fn read_lines<T>(
    dir: &Path,
    file: &str,
    magic: &str,
    key_line: &str,
    body: impl FnOnce(std::str::Lines<'_>) -> Result<T, Miss>,
) -> Result<T, Miss> {
    let bytes = read(&dir.join(file))?;
    let text = std::str::from_utf8(&bytes).map_err(|_| Miss::Corrupt)?;
    let mut lines = text.lines();
    if lines.next() != Some(magic) {
        return Err(Miss::Corrupt);
    }
    if lines.next() != Some(key_line) {
        return Err(Miss::Stale);
    }
    body(lines)
}

/// The line naming what a cache is valid for.
pub fn header(key: &Key) -> String {
    format!("boot {} modules {:016x}", key.boot_id, key.modules)
}

/// A cache file's bytes, mapped rather than read: a run touches only the pages
/// it binary-searches (copying and validating the whole 2 MB table was most of
/// a cached `tcp_*` run's table time under emulation). Only a file this user
/// wrote is trusted (it decides what gets attached).
fn read(path: &Path) -> Result<memmap2::Mmap, Miss> {
    let file = fs::File::open(path).map_err(|_| Miss::Absent)?;
    let md = file.metadata().map_err(|_| Miss::Corrupt)?;
    // SAFETY: geteuid has no memory effects.
    if md.uid() != unsafe { libc::geteuid() } || !md.is_file() || md.len() == 0 {
        return Err(Miss::Corrupt);
    }
    // SAFETY: the file is only ever replaced whole by a rename ([`write`]), never
    // rewritten in place, so the mapped inode does not change under us.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|_| Miss::Corrupt)
}

fn write(dir: &Path, file: &str, text: &str) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{file}.{}", std::process::id()));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_data()?;
        fs::rename(&tmp, dir.join(file))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The file's text: a header, one line per function (`f NAME MODULE|- ADDR,...`)
/// and per removed name (`r NAME`), and an `end` line with the counts, so a
/// truncated file is told from a whole one.
fn render(key: &Key, t: &Table) -> String {
    let mut s = String::with_capacity(64 * (t.funcs.len() + 8));
    let _ = writeln!(s, "{MAGIC}");
    let _ = writeln!(s, "boot {}", key.boot_id);
    let _ = writeln!(s, "modules {:016x}", key.modules);
    let _ = writeln!(s, "source {}", t.source);
    let mut funcs: Vec<&KernelFunc> = t.funcs.iter().collect();
    funcs.sort_by(|a, b| a.name.cmp(&b.name));
    for f in funcs {
        let _ = write!(s, "f {} {} ", f.name, f.module.as_deref().unwrap_or("-"));
        for (i, a) in f.addrs.iter().enumerate() {
            let _ = write!(s, "{}{a:x}", if i == 0 { "" } else { "," });
        }
        s.push('\n');
    }
    for r in &t.removed {
        let _ = writeln!(s, "r {r}");
    }
    let _ = writeln!(s, "end {} {}", t.total, t.removed.len());
    s
}

/// `bytes` as text, for one line or field of a cache file.
fn utf8(bytes: &[u8]) -> Result<&str, Miss> {
    std::str::from_utf8(bytes).map_err(|_| Miss::Corrupt)
}

/// `text` split at its last newline (all of it after, if none).
fn split_last_line(text: &[u8]) -> (&[u8], &[u8]) {
    match text.iter().rposition(|&c| c == b'\n') {
        Some(i) => (&text[..i], &text[i + 1..]),
        None => (&[], text),
    }
}

/// The lines of `text` (none if it is empty; no trailing newline expected).
fn lines(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    text.split(|&c| c == b'\n')
        .take(if text.is_empty() { 0 } else { usize::MAX })
}

fn parse(text: &[u8], key: &Key, want: &Want) -> Result<Table, Miss> {
    // Four header lines, then the body.
    let mut lines_iter = text.splitn(5, |&c| c == b'\n');
    let mut next = || lines_iter.next();
    if next() != Some(MAGIC.as_bytes()) {
        return Err(Miss::Corrupt);
    }
    let mut field = |name: &str| -> Result<&str, Miss> {
        let line = utf8(next().ok_or(Miss::Corrupt)?)?;
        line.strip_prefix(name)
            .and_then(|l| l.strip_prefix(' '))
            .ok_or(Miss::Corrupt)
    };
    let boot = field("boot")?;
    let modules = u64::from_str_radix(field("modules")?, 16).map_err(|_| Miss::Corrupt)?;
    if boot != key.boot_id || modules != key.modules {
        return Err(Miss::Stale);
    }
    let source = field("source")?.to_string();
    let body = next().ok_or(Miss::Corrupt)?;
    // From the end: `end TOTAL REMOVED`, the `r` lines before it, and before
    // those the `f` lines.
    let body = body.strip_suffix(b"\n").ok_or(Miss::Corrupt)?;
    let (rest, end) = split_last_line(body);
    let mut counts = utf8(end)?
        .strip_prefix("end ")
        .ok_or(Miss::Corrupt)?
        .split(' ');
    let (total, nremoved): (usize, usize) = match (counts.next(), counts.next(), counts.next()) {
        (Some(t), Some(r), None) => (
            t.parse().map_err(|_| Miss::Corrupt)?,
            r.parse().map_err(|_| Miss::Corrupt)?,
        ),
        _ => return Err(Miss::Corrupt),
    };
    let mut removed = Vec::with_capacity(nremoved);
    let mut funcs_text = rest;
    while removed.len() < nremoved {
        let (before, line) = split_last_line(funcs_text);
        let name = utf8(line)?.strip_prefix("r ").ok_or(Miss::Corrupt)?;
        if name.is_empty() || name.contains(' ') {
            return Err(Miss::Corrupt);
        }
        removed.push(name.to_string());
        funcs_text = before;
    }
    removed.reverse();
    let mut funcs = Vec::new();
    match &want.prefixes {
        None => {
            let mut n = 0;
            for line in lines(funcs_text) {
                n += 1;
                if let Some(f) = func_line(line, want.keep)? {
                    funcs.push(f);
                }
            }
            if n != total {
                return Err(Miss::Corrupt);
            }
        }
        Some(prefixes) => {
            // Sorted, and none inside another's range: the ranges come out in
            // name order, each function once.
            let mut prefixes = prefixes.clone();
            prefixes.sort_unstable();
            prefixes.dedup_by(|b, a| b.starts_with(*a));
            for p in prefixes {
                let start = lower_bound(funcs_text, p)?;
                for line in lines(&funcs_text[start..]) {
                    if !func_name(line)?.starts_with(p.as_bytes()) {
                        break;
                    }
                    if let Some(f) = func_line(line, want.keep)? {
                        funcs.push(f);
                    }
                }
            }
        }
    }
    Ok(Table {
        source,
        funcs,
        total,
        removed,
    })
}

/// The name on an `f` line, as bytes: UTF-8 order is byte order, so the binary
/// search compares them without validating the lines it only passes through.
fn func_name(line: &[u8]) -> Result<&[u8], Miss> {
    let rest = line.strip_prefix(b"f ").ok_or(Miss::Corrupt)?;
    let name = rest.split(|&c| c == b' ').next().unwrap_or(&[]);
    if name.is_empty() {
        return Err(Miss::Corrupt);
    }
    Ok(name)
}

/// An `f` line's function, if `keep` wants it. Fields are split as bytes and
/// only the name is validated before `keep` sees it: a `tcp_*` run reads a few
/// hundred lines, and its start-up is the point.
fn func_line(line: &[u8], keep: &dyn Fn(&str) -> bool) -> Result<Option<KernelFunc>, Miss> {
    let mut f = line.split(|&c| c == b' ');
    let (Some(b"f"), Some(name), Some(module), Some(addrs), None) =
        (f.next(), f.next(), f.next(), f.next(), f.next())
    else {
        return Err(Miss::Corrupt);
    };
    let name = utf8(name)?;
    if name.is_empty() {
        return Err(Miss::Corrupt);
    }
    if !keep(name) {
        return Ok(None);
    }
    let addrs = if addrs.is_empty() {
        Vec::new()
    } else {
        addrs
            .split(|&c| c == b',')
            .map(|a| utf8(a).and_then(|a| u64::from_str_radix(a, 16).map_err(|_| Miss::Corrupt)))
            .collect::<Result<_, _>>()?
    };
    Ok(Some(KernelFunc {
        name: name.to_string(),
        module: (module != b"-")
            .then(|| utf8(module).map(str::to_string))
            .transpose()?,
        addrs,
    }))
}

/// The byte offset of the first `f` line (of the sorted `text`) whose name is
/// not below `prefix`, `text.len()` if none.
fn lower_bound(text: &[u8], prefix: &str) -> Result<usize, Miss> {
    // The start of the first line beginning at or after byte `pos`.
    let line_at = |pos: usize| -> usize {
        if pos == 0 {
            return 0;
        }
        text[pos - 1..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(text.len(), |i| pos + i)
    };
    let (mut lo, mut hi) = (0, text.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let line = line_at(mid);
        let below = line < text.len() && {
            let end = text[line..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(text.len(), |i| line + i);
            func_name(&text[line..end])? < prefix.as_bytes()
        };
        if below {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(line_at(lo))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_whole() {
        for path in [
            "/proc/self/maps",
            "/proc/self/status",
            "/proc/sys/kernel/random/boot_id",
        ] {
            let a = read_proc(path).unwrap();
            assert_eq!(
                a.lines().next(),
                fs::read_to_string(path).unwrap().lines().next()
            );
            assert!(a.ends_with('\n') || a.is_empty(), "{path}: {a}");
        }
        assert!(read_proc("/proc/no_such_file").is_err());
    }

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!(
                "tracekit-kcache-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&p);
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn every(_: &str) -> bool {
        true
    }

    const ALL: Want = Want {
        keep: &every,
        prefixes: None,
    };

    fn key() -> Key {
        Key {
            boot_id: "6f1c2d1e-0000-4000-8000-000000000001".into(),
            modules: modules_hash("ext4 1015808 1 - Live 0xffffffffc0a00000\n"),
        }
    }

    fn table() -> Table {
        Table {
            source: "available_filter_functions_addrs + /proc/kallsyms".into(),
            funcs: vec![
                KernelFunc {
                    name: "by_name".into(),
                    module: None,
                    addrs: vec![],
                },
                KernelFunc {
                    name: "ext4_sync_fs".into(),
                    module: Some("ext4".into()),
                    addrs: vec![0xffffffffc0a01000],
                },
                KernelFunc {
                    name: "t_start".into(),
                    module: None,
                    addrs: vec![0xffffffff81000040, 0xffffffff81000070],
                },
            ],
            total: 3,
            removed: vec!["migrate_disable".into()],
        }
    }

    #[test]
    fn a_fresh_cache_is_used_as_written() {
        let d = TempDir::new("fresh");
        store(&d.0, &key(), &table());
        assert_eq!(load(&d.0, &key(), &ALL), Ok(table()));
        // Nothing but the cache file is left behind.
        let names: Vec<_> = fs::read_dir(&d.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE)]);
        // A run asking for some functions gets those, and the table's size.
        let t_ = |n: &str| n.starts_with("t_");
        let some = load(
            &d.0,
            &key(),
            &Want {
                keep: &t_,
                prefixes: None,
            },
        )
        .unwrap();
        assert_eq!(some.funcs, table().funcs[2..3]);
        assert_eq!((some.total, some.removed), (3, table().removed));
    }

    #[test]
    fn prefixes_read_only_their_ranges_of_the_sorted_table() {
        let d = TempDir::new("prefixes");
        let names = ["a", "b", "ba", "bab", "bb", "c", "ca", "d"];
        let t = Table {
            source: "test".into(),
            // Stored in name order whatever the order given.
            funcs: names
                .iter()
                .rev()
                .map(|n| KernelFunc {
                    name: n.to_string(),
                    module: None,
                    addrs: vec![],
                })
                .collect(),
            total: names.len(),
            removed: vec!["r1".into(), "r2".into()],
        };
        store(&d.0, &key(), &t);
        let get = |prefixes: &[&str], keep: &dyn Fn(&str) -> bool| {
            let want = Want {
                keep,
                prefixes: Some(prefixes.to_vec()),
            };
            let got = load(&d.0, &key(), &want).unwrap();
            assert_eq!((got.total, got.removed.clone()), (8, t.removed.clone()));
            got.funcs.into_iter().map(|f| f.name).collect::<Vec<_>>()
        };
        assert_eq!(get(&["b"], &every), ["b", "ba", "bab", "bb"]);
        // Overlapping and repeated prefixes: each function once, in order.
        assert_eq!(
            get(&["ca", "ba", "b", "b"], &every),
            ["b", "ba", "bab", "bb", "ca"]
        );
        assert_eq!(get(&["a"], &every), ["a"]);
        assert_eq!(get(&["d"], &every), ["d"]);
        assert_eq!(get(&["bz", "0", "e"], &every), Vec::<String>::new());
        assert_eq!(get(&["b"], &|n: &str| n.ends_with('b')), ["b", "bab", "bb"]);
        // The same answers as reading every line.
        for p in ["", "a", "b", "ba", "bb", "c", "d", "x"] {
            let keep = |n: &str| n.starts_with(p);
            let all = load(
                &d.0,
                &key(),
                &Want {
                    keep: &keep,
                    prefixes: None,
                },
            )
            .unwrap();
            if !p.is_empty() {
                let names: Vec<String> = all.funcs.into_iter().map(|f| f.name).collect();
                assert_eq!(get(&[p], &keep), names, "{p}");
            }
        }
    }

    #[test]
    fn the_task_status_offset_is_cached_for_its_boot() {
        let d = TempDir::new("task-status");
        assert_eq!(load_task_status(&d.0, "boot-a"), Err(Miss::Absent));
        store_task_status(&d.0, "boot-a", 16);
        assert_eq!(load_task_status(&d.0, "boot-a"), Ok(16));
        assert_eq!(load_task_status(&d.0, "boot-b"), Err(Miss::Stale));
        let whole = fs::read_to_string(d.0.join(TASK_STATUS)).unwrap();
        fs::write(d.0.join(TASK_STATUS), &whole[..whole.len() - 4]).unwrap();
        assert_eq!(load_task_status(&d.0, "boot-a"), Err(Miss::Corrupt));
        fs::write(d.0.join(TASK_STATUS), whole.replace("16", "x")).unwrap();
        assert_eq!(load_task_status(&d.0, "boot-a"), Err(Miss::Corrupt));
    }

    #[test]
    fn the_blacklist_is_cached_with_the_same_key() {
        let d = TempDir::new("blacklist");
        let names = vec!["do_int3".to_string(), "kprobe_handler".to_string()];
        store_blacklist(&d.0, &key(), names.iter());
        assert_eq!(load_blacklist(&d.0, &key()), Ok(names.clone()));
        let other = Key {
            boot_id: "other".into(),
            ..key()
        };
        assert_eq!(load_blacklist(&d.0, &other), Err(Miss::Stale));
        let whole = fs::read_to_string(d.0.join(BLACKLIST)).unwrap();
        fs::write(d.0.join(BLACKLIST), whole.replace("end 2", "end 3")).unwrap();
        assert_eq!(load_blacklist(&d.0, &key()), Err(Miss::Corrupt));
        fs::write(d.0.join(BLACKLIST), &whole[..whole.len() - 6]).unwrap();
        assert_eq!(load_blacklist(&d.0, &key()), Err(Miss::Corrupt));
    }

    #[test]
    fn another_boot_is_stale() {
        let d = TempDir::new("boot");
        store(&d.0, &key(), &table());
        let other = Key {
            boot_id: "6f1c2d1e-0000-4000-8000-000000000002".into(),
            ..key()
        };
        assert_eq!(load(&d.0, &other, &ALL), Err(Miss::Stale));
    }

    #[test]
    fn a_changed_module_list_is_stale() {
        let d = TempDir::new("modules");
        store(&d.0, &key(), &table());
        let loaded = Key {
            modules: modules_hash(
                "ext4 1015808 1 - Live 0xffffffffc0a00000\n\
                 nf_tables 372736 0 - Live 0xffffffffc0b00000\n",
            ),
            ..key()
        };
        assert_eq!(load(&d.0, &loaded, &ALL), Err(Miss::Stale));
        // Reloaded elsewhere: other addresses, stale too.
        let moved = Key {
            modules: modules_hash("ext4 1015808 1 - Live 0xffffffffc0c00000\n"),
            ..key()
        };
        assert_eq!(load(&d.0, &moved, &ALL), Err(Miss::Stale));
        // A use count alone does not change the module list.
        assert_eq!(
            modules_hash("ext4 1015808 3 jbd2, Live 0xffffffffc0a00000\n"),
            key().modules
        );
    }

    #[test]
    fn corrupt_or_truncated_caches_are_not_used() {
        let d = TempDir::new("corrupt");
        store(&d.0, &key(), &table());
        let whole = fs::read_to_string(d.0.join(FILE)).unwrap();
        let cut = whole.len() - whole.lines().last().unwrap().len() - 1;
        for bad in [
            &whole[..cut],
            &whole[..whole.len() / 2],
            "",
            "garbage\n",
            &whole.replace("f t_start - ", "f t_start - zz"),
            &whole.replace("end 3 1", "end 4 1"),
            &whole.replace(MAGIC, "tracekit-kfuncs 0"),
        ] {
            fs::write(d.0.join(FILE), bad).unwrap();
            assert_eq!(load(&d.0, &key(), &ALL), Err(Miss::Corrupt), "{bad:?}");
        }
        fs::write(d.0.join(FILE), [0xff, 0xfe, 0]).unwrap();
        assert_eq!(load(&d.0, &key(), &ALL), Err(Miss::Corrupt));
        // Not UTF-8 in a line that a prefix search reads.
        let mut bytes = whole.clone().into_bytes();
        let at = whole.find("f t_start").unwrap() + 4;
        bytes[at] = 0xff;
        fs::write(d.0.join(FILE), &bytes).unwrap();
        let keep = |_: &str| true;
        let t_only = Want {
            keep: &keep,
            prefixes: Some(vec!["t_"]),
        };
        assert_eq!(load(&d.0, &key(), &t_only), Err(Miss::Corrupt));
        // A directory where the file should be.
        fs::remove_file(d.0.join(FILE)).unwrap();
        fs::create_dir(d.0.join(FILE)).unwrap();
        assert_eq!(load(&d.0, &key(), &ALL), Err(Miss::Corrupt));
    }

    #[test]
    fn an_absent_or_unwritable_cache_is_silent() {
        let d = TempDir::new("absent");
        assert_eq!(load(&d.0, &key(), &ALL), Err(Miss::Absent));
        // The directory cannot be created (a file is in the way): nothing happens.
        fs::write(&d.0, "not a directory").unwrap();
        store(&d.0, &key(), &table());
        assert_eq!(load(&d.0, &key(), &ALL), Err(Miss::Absent));
        fs::remove_file(&d.0).unwrap();
    }
}
