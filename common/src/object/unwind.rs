//! The unwind tables of traced processes, loaded into the BPF maps that
//! bpf/unwind.h walks: one array map of rows per executable file (built by
//! [`crate::user::cfi`] once per file and shared by every process that maps it),
//! and per process the prefixes of its executable mappings in an LPM trie,
//! each giving the file and its load bias.
//!
//! Processes are loaded before attaching (`-p`), and when the BPF side asks
//! (`unwind_requests`: a process seen for the first time, or an address no
//! known mapping holds, as after a dlopen). Files are named by device and inode
//! as the process' maps give them, and opened through /proc/PID/map_files, so
//! that a file in another mount namespace or deleted since is still the one
//! mapped. The vDSO, code of no file, has a table too: every process maps
//! the kernel's one image, copied once from this process's own.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use crate::user::cfi::{self, Row};

/// bpf/unwind.h's UNWIND_NO_FILE: a mapping known to have no table.
const NO_FILE: u32 = u32::MAX;
/// bpf/unwind.h's UNWIND_PROC_READY.
const PROC_READY: u32 = 1;

/// How many files and mapping prefixes the maps hold (set before load).
pub const MAX_FILES: u32 = 4096;
pub const MAX_PREFIXES: u32 = 262_144;

/// The maps of bpf/unwind.h, as handles.
pub struct Maps {
    pub files: MapHandle,
    pub file_info: MapHandle,
    pub mappings: MapHandle,
    pub procs: MapHandle,
}

impl Maps {
    /// The maps of a loaded object that includes bpf/unwind.h.
    pub fn of(
        files: &libbpf_rs::MapMut,
        file_info: &libbpf_rs::MapMut,
        mappings: &libbpf_rs::MapMut,
        procs: &libbpf_rs::MapMut,
    ) -> Result<Maps> {
        let handle = |m: &libbpf_rs::MapMut| MapHandle::try_from(m).context("opening a map");
        Ok(Maps {
            files: handle(files)?,
            file_info: handle(file_info)?,
            mappings: handle(mappings)?,
            procs: handle(procs)?,
        })
    }
}

/// bpf/unwind.h's `unwind_stats` slots: stacks walked, of processes whose
/// tables were not loaded yet, cut short, frames found by frame pointers.
pub const STATS: usize = 4;

/// Says what the walks of a summary could not do (`stats`: the deltas of
/// `unwind_stats`); with `verbose`, also how many were walked.
pub fn report(stats: &[u64], verbose: bool) {
    let [walked, early, cut, fp] = [0, 1, 2, 3].map(|i| stats.get(i).copied().unwrap_or(0));
    if early > 0 {
        crate::diag::warn(&format!(
            "{early} user stacks end in [truncated]: their process was seen before its unwind \
             tables were loaded, or reloaded after it mapped new code or exec'd (use -p PID to \
             load them before tracing)"
        ));
    }
    if verbose && walked > 0 {
        crate::diag::warn(&format!(
            "user stacks: {walked} walked by unwind tables, {cut} of them cut short \
             ([truncated]), {fp} frames found by frame pointers"
        ));
    }
}

/// A file's table as loaded: its index in `unwind_files` (or [`NO_FILE`]).
struct Loaded {
    id: u32,
    /// Kept open: the outer map holds a reference too, but closing ours at the
    /// end is what frees it with the object.
    _rows: Option<MapHandle>,
}

/// What one run has loaded.
pub struct Tables {
    maps: Maps,
    /// By build ID where the file has one (the same build in two containers
    /// is one table), else by device and inode; and the inodes seen, each
    /// opened once.
    files: HashMap<FileKey, Loaded>,
    inodes: HashMap<(u64, u64), FileKey>,
    /// Per process, the LPM keys it holds, to replace them on a refresh.
    procs: HashMap<u32, HashSet<[u8; 16]>>,
    /// Per process, a hash of its executable mappings at the last load: a
    /// reload that finds the same is no refresh.
    mapped: HashMap<u32, u64>,
    next_id: u32,
    prefixes: u32,
    /// Files whose table could not be built, with why (for --debug and -v).
    pub failed: Vec<String>,
    /// Rows loaded, over all files.
    pub rows: u64,
    /// Per file loaded: its path, rows, where they came from and the time
    /// its table took to build and load (for --debug).
    loaded: Vec<(String, u32, String, std::time::Duration)>,
    last_loaded: Option<(u32, String)>,
    /// Tables built but not yet in `unwind_files` (see [`Tables::publish`]).
    pending: Vec<(u32, u32, [u8; 24])>,
}

/// What names a file's table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum FileKey {
    BuildId(Vec<u8>),
    Inode(u64, u64),
    /// The vDSO: no build ID given to the BPF side, so its frames are
    /// addresses, named by the process's maps (no file has that build ID).
    Vdso,
}

/// One executable mapping of a process (of a file, or of none: ino 0).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Mapping {
    start: u64,
    end: u64,
    pgoff: u64,
    dev: u64,
    ino: u64,
    path: String,
}

impl Tables {
    pub fn new(maps: Maps) -> Tables {
        Tables {
            maps,
            files: HashMap::new(),
            inodes: HashMap::new(),
            procs: HashMap::new(),
            mapped: HashMap::new(),
            next_id: 0,
            prefixes: 0,
            failed: Vec::new(),
            rows: 0,
            loaded: Vec::new(),
            last_loaded: None,
            pending: Vec::new(),
        }
    }

    /// Loads (or refreshes) process `pid`'s mappings, building the tables of
    /// files not seen before. A process gone already is no error. Whether it
    /// was a refresh that found other mappings (the process mapped code
    /// since: its symbols need it too).
    pub fn load_process(&mut self, pid: u32) -> Result<bool> {
        let Some(maps) = exec_mappings(pid) else {
            return Ok(false);
        };
        let mut keys = HashSet::new();
        for m in &maps {
            // Code of no file (a JIT's) is known too, as a mapping without a
            // table: else every walk through it would ask for the process
            // again (the walk takes frame-pointer steps there).
            let found = match m.ino {
                0 if m.path == "[vdso]" => self.vdso(m),
                0 => None,
                _ => self.file_of(pid, m),
            };
            let (file, bias) = found.unwrap_or((NO_FILE, 0));
            // bpf/unwind.h's struct uw_map.
            let mut value = [0u8; 40];
            value[..4].copy_from_slice(&file.to_ne_bytes());
            value[8..16].copy_from_slice(&bias.to_ne_bytes());
            value[16..24].copy_from_slice(&m.start.wrapping_sub(m.pgoff).to_ne_bytes());
            value[24..32].copy_from_slice(&m.start.to_ne_bytes());
            value[32..].copy_from_slice(&m.end.to_ne_bytes());
            for key in prefixes(pid, m.start, m.end) {
                if !keys.insert(key) {
                    continue;
                }
                let known = self.procs.get(&pid).is_some_and(|k| k.contains(&key));
                if !known && self.prefixes >= MAX_PREFIXES {
                    break; // full: the walk takes frame-pointer steps there
                }
                if self
                    .maps
                    .mappings
                    .update(&key, &value, MapFlags::ANY)
                    .is_ok()
                    && !known
                {
                    self.prefixes += 1;
                }
            }
        }
        self.publish()?;
        // Mappings gone since the last load (a dlclose, an exec).
        if let Some(old) = self.procs.get(&pid) {
            for k in old.difference(&keys) {
                if self.maps.mappings.delete(k).is_ok() {
                    self.prefixes = self.prefixes.saturating_sub(1);
                }
            }
        }
        self.procs.insert(pid, keys);
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            maps.hash(&mut h);
            h.finish()
        };
        let refresh = self.mapped.insert(pid, hash).is_some_and(|old| old != hash);
        self.maps
            .procs
            .update(&pid.to_ne_bytes(), &PROC_READY.to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("marking process {pid}'s unwind tables loaded"))?;
        Ok(refresh)
    }

    /// Loads, before tracing, the processes whose first events would otherwise
    /// come before their tables: the `-p` process, else the processes that map
    /// one of `binaries` (the user probes' files), for up to a second (the rest
    /// are loaded when BPF asks, and their first stacks counted as early).
    pub fn load_start(&mut self, pid: Option<u32>, binaries: &[PathBuf]) -> Result<()> {
        crate::timing::span("unwind", || self.load_start_now(pid, binaries))
    }

    fn load_start_now(&mut self, pid: Option<u32>, binaries: &[PathBuf]) -> Result<()> {
        if let Some(pid) = pid {
            return self.load_process(pid).map(drop);
        }
        let files: HashSet<(u64, u64)> = binaries
            .iter()
            .filter_map(|b| {
                use std::os::unix::fs::MetadataExt as _;
                let m = std::fs::metadata(b).ok()?;
                let dev = u64::from(libc::major(m.dev())) << 32 | u64::from(libc::minor(m.dev()));
                Some((dev, m.ino()))
            })
            .collect();
        if files.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let me = std::process::id();
        for pid in crate::sys::process::all_pids() {
            if started.elapsed() > std::time::Duration::from_secs(1) {
                break;
            }
            if pid == me {
                continue;
            }
            let maps = exec_mappings(pid).unwrap_or_default();
            if maps.iter().any(|m| files.contains(&(m.dev, m.ino))) {
                self.load_process(pid)?;
            }
        }
        Ok(())
    }

    /// Puts the tables built since the last call into `unwind_files` in one
    /// bpf(BPF_MAP_UPDATE_BATCH): each update of an array of maps from user
    /// space waits for an RCU grace period (so that no program still uses the
    /// map it replaced), 7 ms here, which one element at a time made a
    /// process of 18 files take 150 ms to load. Then their sizes and build
    /// IDs, which the walk reads first.
    fn publish(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let keys: Vec<u32> = pending.iter().map(|p| p.0).collect();
        let fds: Vec<u32> = pending.iter().map(|p| p.1).collect();
        let mut count = keys.len() as u32;
        let opts = libbpf_sys::bpf_map_batch_opts {
            sz: size_of::<libbpf_sys::bpf_map_batch_opts>() as _,
            ..Default::default()
        };
        // SAFETY: keys and fds hold `count` u32 keys and values (map fds).
        let rc = unsafe {
            libbpf_sys::bpf_map_update_batch(
                self.maps.files.as_fd().as_raw_fd(),
                keys.as_ptr().cast(),
                fds.as_ptr().cast(),
                &mut count,
                &opts,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("storing unwind tables");
        }
        for (id, _, info) in pending {
            self.maps
                .file_info
                .update(&id.to_ne_bytes(), &info, MapFlags::ANY)
                .context("storing an unwind table's size")?;
        }
        Ok(())
    }

    /// The table id of mapping `m`'s file, loading it the first time, and the
    /// mapping's load bias; `None` where the file has no usable table.
    fn file_of(&mut self, pid: u32, m: &Mapping) -> Option<(u32, u64)> {
        let path = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
        let bias = load_bias(&path, m)?;
        let key = match self.inodes.get(&(m.dev, m.ino)) {
            Some(k) => k.clone(),
            None => {
                let k = match crate::user::elf::build_id(&path) {
                    Some(b) if !b.is_empty() => FileKey::BuildId(b),
                    _ => FileKey::Inode(m.dev, m.ino),
                };
                self.inodes.insert((m.dev, m.ino), k.clone());
                k
            }
        };
        self.table_for(&path, m, key, bias)
    }

    /// The vDSO's table id, as [`Tables::file_of`]: built from this process's
    /// vDSO, which is the one the kernel maps into every (64-bit) process.
    fn vdso(&mut self, m: &Mapping) -> Option<(u32, u64)> {
        let (file, len) = vdso_image()?;
        if m.end - m.start != *len {
            return None; // not the image this process maps (a 32-bit one's)
        }
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let bias = load_bias(&path, m)?;
        self.table_for(&path, m, FileKey::Vdso, bias)
    }

    /// The table id of the file at `path` named `key`, loading it the first
    /// time, with mapping `m`'s `bias`.
    fn table_for(
        &mut self,
        path: &std::path::Path,
        m: &Mapping,
        key: FileKey,
        bias: u64,
    ) -> Option<(u32, u64)> {
        if let Some(l) = self.files.get(&key) {
            return (l.id != NO_FILE).then_some((l.id, bias));
        }
        let started = std::time::Instant::now();
        let loaded = match self.load_file(path, m, &key) {
            Ok(l) => l,
            Err(e) => {
                self.failed.push(format!("{}: {e:#}", m.path));
                Loaded {
                    id: NO_FILE,
                    _rows: None,
                }
            }
        };
        let id = loaded.id;
        if id != NO_FILE {
            let (rows, source) = self.last_loaded.take().unwrap_or_default();
            self.loaded
                .push((m.path.clone(), rows, source, started.elapsed()));
        }
        self.files.insert(key, loaded);
        (id != NO_FILE).then_some((id, bias))
    }

    fn load_file(&mut self, path: &std::path::Path, m: &Mapping, key: &FileKey) -> Result<Loaded> {
        if self.next_id >= MAX_FILES {
            bail!("no room for more than {MAX_FILES} files' unwind tables");
        }
        let table = table_of(path, m)?;
        if let Some(b) = BUILT.get() {
            b.lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&(m.dev, m.ino));
        }
        if table.rows.is_empty() {
            bail!("no call frame information");
        }
        let n = u32::try_from(table.rows.len()).context("too many rows")?;
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            map_flags: libbpf_sys::BPF_F_INNER_MAP,
            ..Default::default()
        };
        let rows = MapHandle::create(
            MapType::Array,
            Some("unwind_rows"),
            4,
            size_of::<Row>() as u32,
            n,
            &opts,
        )
        .context("creating a map for unwind rows")?;
        fill_array(&rows, &table.rows)?;
        let id = self.next_id;
        let fd = rows.as_fd().as_raw_fd() as u32;
        // bpf/unwind.h's struct uw_file: the rows, and the build ID (zero: none).
        let mut info = [0u8; 24];
        info[..4].copy_from_slice(&n.to_ne_bytes());
        if let FileKey::BuildId(b) = key {
            let k = b.len().min(20);
            info[4..4 + k].copy_from_slice(&b[..k]);
        }
        self.pending.push((id, fd, info));
        self.next_id += 1;
        self.rows += u64::from(n);
        self.last_loaded = Some((n, table.source.clone()));
        Ok(Loaded {
            id,
            _rows: Some(rows),
        })
    }

    /// Files with tables loaded.
    pub fn files(&self) -> usize {
        self.files.values().filter(|l| l.id != NO_FILE).count()
    }

    /// What `--debug` says of the tables: how many, for how many processes,
    /// and each file that has none, with why.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "user stacks: by unwind tables: {} files, {} rows ({} KiB), {} processes\n",
            self.files(),
            self.rows,
            self.rows * size_of::<Row>() as u64 / 1024,
            self.procs.len()
        );
        for (path, rows, source, took) in &self.loaded {
            s.push_str(&format!(
                "  {}: {rows} rows from {source}, {:.1} ms\n",
                crate::diag::escape(path),
                took.as_secs_f64() * 1e3
            ));
        }
        for f in &self.failed {
            s.push_str(&format!("  no table: {}\n", crate::diag::escape(f)));
        }
        s
    }
}

/// Whether a run walks user stacks by unwind tables, for `--user-stacks
/// mode` and the process `-p` names: `dwarf` where the kernel cannot is an
/// error; `auto` says once why it walks by frame pointers there, and walks by
/// them without a word when every file the process maps keeps them, unless
/// the run `samples`: a sample may come in a leaf function that set up no
/// frame (gcc's -fno-omit-frame-pointer leaves some without), whose caller a
/// frame-pointer walk skips.
pub fn choose(
    mode: crate::probe::mode::UserStacks,
    pid: Option<u32>,
    samples: bool,
) -> Result<bool> {
    use crate::probe::mode::UserStacks;
    let kernel = crate::kernel::features::unwind_tables();
    match (mode, kernel) {
        (UserStacks::Fp, _) => Ok(false),
        (UserStacks::Dwarf, Err(why)) => bail!(
            "--user-stacks dwarf cannot be used: {why}; use --user-stacks fp (frame pointers)"
        ),
        (UserStacks::Dwarf, Ok(())) => Ok(true),
        (UserStacks::Auto, Err(why)) => {
            crate::diag::warn(&format!("user stacks are walked by frame pointers: {why}"));
            Ok(false)
        }
        (UserStacks::Auto, Ok(())) => Ok(samples || !pid.is_some_and(keeps_frame_pointers)),
    }
}

/// Whether every executable file process `pid` maps keeps frame pointers.
/// Code of no file is not looked at: the vDSO keeps them, and a JIT's has no
/// table to say (it was counted against, so every process went to tables).
fn keeps_frame_pointers(pid: u32) -> bool {
    let Some(maps) = exec_mappings(pid) else {
        return false;
    };
    let mut seen = HashSet::new();
    maps.iter()
        .filter(|m| m.ino != 0 && seen.insert((m.dev, m.ino)))
        .all(|m| {
            let path = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
            table_of(&path, m).is_ok_and(|t| cfi::keeps_frame_pointers(&t))
        })
}

type Cache = std::sync::Mutex<HashMap<(u64, u64), std::sync::Arc<cfi::Table>>>;
/// Tables built by `auto`'s look at a process, until its load takes them.
static BUILT: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();

/// The table of mapping `m`'s file, built once for `auto`'s look and the load
/// that follows it; the load takes it (`take`), the BPF map holds it then.
fn table_of(path: &std::path::Path, m: &Mapping) -> Result<std::sync::Arc<cfi::Table>> {
    let built = BUILT.get_or_init(Default::default);
    if let Some(t) = built
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(m.dev, m.ino))
    {
        return Ok(t.clone());
    }
    let t = std::sync::Arc::new(cfi::table_of(path)?);
    built
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((m.dev, m.ino), t.clone());
    Ok(t)
}

/// This machine's vDSO as a file, and its size: a copy of this process's own
/// in a memfd, which the ELF and CFI readers open by its /proc/self/fd path
/// like any file. Made once.
fn vdso_image() -> Option<&'static (std::fs::File, u64)> {
    static VDSO: std::sync::OnceLock<Option<(std::fs::File, u64)>> = std::sync::OnceLock::new();
    VDSO.get_or_init(|| {
        use std::io::Write as _;
        use std::os::fd::FromRawFd;
        let m = crate::user::maps::read("self")?
            .into_iter()
            .find(|l| l.path == "[vdso]")?;
        // SAFETY: getauxval(3) has no preconditions.
        if unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } != m.start {
            return None;
        }
        let len = usize::try_from(m.end - m.start).ok()?;
        // SAFETY: [start, end) is the vDSO, mapped readable in this process
        // for all its life and never written.
        let image = unsafe { std::slice::from_raw_parts(m.start as *const u8, len) };
        // SAFETY: a valid NUL-terminated name; the fd is owned below.
        let fd = unsafe { libc::memfd_create(c"tracekit-vdso".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd is a fresh descriptor we own.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.write_all(image).ok()?;
        Some((file, len as u64))
    })
    .as_ref()
}

/// Writes `rows` to array map `map` in one bpf(BPF_MAP_UPDATE_BATCH) call per
/// chunk (one call per row took ~1 µs each: 100 ms for python3).
fn fill_array(map: &MapHandle, rows: &[Row]) -> Result<()> {
    const CHUNK: usize = 65_536;
    for (c, chunk) in rows.chunks(CHUNK).enumerate() {
        let keys: Vec<u32> = (0..chunk.len()).map(|i| (c * CHUNK + i) as u32).collect();
        let mut count = chunk.len() as u32;
        let opts = libbpf_sys::bpf_map_batch_opts {
            sz: size_of::<libbpf_sys::bpf_map_batch_opts>() as _,
            ..Default::default()
        };
        // SAFETY: keys and values hold `count` elements of the map's key and
        // value sizes (u32, and Row, which is repr(C) and 16 bytes).
        let rc = unsafe {
            libbpf_sys::bpf_map_update_batch(
                map.as_fd().as_raw_fd(),
                keys.as_ptr().cast(),
                chunk.as_ptr().cast(),
                &mut count,
                &opts,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("filling an unwind table map");
        }
    }
    Ok(())
}

/// The executable file mappings of `pid`, from /proc/PID/maps; `None` once it
/// is gone.
/// A process's executable mappings in user space: of files, and of no file
/// (ino 0: the vDSO, anonymous code); not the vsyscall page, in the kernel's
/// half.
fn exec_mappings(pid: u32) -> Option<Vec<Mapping>> {
    let lines = crate::user::maps::read(&pid.to_string())?;
    Some(
        lines
            .into_iter()
            .filter(|l| {
                l.perms.contains('x')
                    && l.start >> 63 == 0
                    && (l.ino == 0 || l.path.starts_with('/'))
            })
            .map(|l| Mapping {
                start: l.start,
                end: l.end,
                pgoff: l.pgoff,
                dev: l.dev,
                ino: l.ino,
                path: l.path,
            })
            .collect(),
    )
}

/// The bias of mapping `m` of the ELF file at `path`: the file's virtual
/// address of a process address is the address minus it. From the loadable
/// segment that holds the mapping's file offset.
fn load_bias(path: &std::path::Path, m: &Mapping) -> Option<u64> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let file = std::fs::File::open(path).ok()?;
    let cache = object::ReadCache::new(&file);
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&cache).ok()?;
    let endian = header.endian().ok()?;
    for ph in header.program_headers(endian, &cache).ok()? {
        // Executable segments only: a read-only one before it may share the
        // mapping's first page (then its offsets are not the code's).
        if ph.p_type(endian) != object::elf::PT_LOAD
            || ph.p_flags(endian).0 & object::elf::PF_X.0 == 0
        {
            continue;
        }
        let (off, vaddr, size) = (ph.p_offset(endian), ph.p_vaddr(endian), ph.p_filesz(endian));
        // Mappings start at page boundaries: the segment's first page.
        let page_off = off & !0xfff;
        if m.pgoff >= page_off && m.pgoff < off + size {
            // file address of m.start = vaddr - (off - m.pgoff)
            let at_start = (vaddr + m.pgoff).wrapping_sub(off);
            return Some(m.start.wrapping_sub(at_start));
        }
    }
    None
}

/// The LPM trie keys (bpf/unwind.h's struct uw_map_key) that cover
/// [start, end) of process `pid`: aligned power-of-two blocks, largest first.
fn prefixes(pid: u32, start: u64, end: u64) -> Vec<[u8; 16]> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let align = if at == 0 {
            63
        } else {
            at.trailing_zeros().min(63)
        };
        let fits = 63 - (end - at).leading_zeros();
        let bits = align.min(fits);
        let mut key = [0u8; 16];
        key[..4].copy_from_slice(&(32 + 64 - bits).to_ne_bytes());
        key[4..8].copy_from_slice(&pid.to_be_bytes());
        key[8..].copy_from_slice(&at.to_be_bytes());
        out.push(key);
        at += 1u64 << bits;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(keys: &[[u8; 16]]) -> Vec<(u64, u64)> {
        keys.iter()
            .map(|k| {
                let len = u32::from_ne_bytes(k[..4].try_into().unwrap());
                let at = u64::from_be_bytes(k[8..].try_into().unwrap());
                (at, at + (1u64 << (96 - len)))
            })
            .collect()
    }

    #[test]
    fn prefixes_cover_a_range_exactly() {
        let keys = prefixes(7, 0x7f00_0000_1000, 0x7f00_0000_9000);
        assert_eq!(
            covered(&keys),
            [
                (0x7f00_0000_1000, 0x7f00_0000_2000),
                (0x7f00_0000_2000, 0x7f00_0000_4000),
                (0x7f00_0000_4000, 0x7f00_0000_8000),
                (0x7f00_0000_8000, 0x7f00_0000_9000),
            ]
        );
        assert!(keys.iter().all(|k| k[4..8] == 7u32.to_be_bytes()));
        let keys = prefixes(1, 0x400000, 0x400000 + 0x200000);
        assert_eq!(covered(&keys), [(0x400000, 0x600000)]);
    }

    #[test]
    fn own_mappings_have_a_bias_that_finds_main() {
        let me = std::process::id();
        let maps = exec_mappings(me).unwrap();
        let here = own_mappings_have_a_bias_that_finds_main as *const () as u64;
        let m = maps
            .iter()
            .find(|m| m.start <= here && here < m.end)
            .expect("the test binary's text");
        let path = PathBuf::from(format!("/proc/{me}/map_files/{:x}-{:x}", m.start, m.end));
        let bias = load_bias(&path, m).unwrap();
        // The symbol table's address of this function is here - bias.
        let data = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*data).unwrap();
        use object::{Object, ObjectSymbol};
        let sym = file
            .symbols()
            .find(|s| s.address() == here.wrapping_sub(bias))
            .unwrap_or_else(|| {
                panic!(
                    "no symbol at {:#x} ({here:#x} - {bias:#x}), {m:?}",
                    here.wrapping_sub(bias)
                )
            });
        assert!(sym.name().unwrap().contains("own_mappings_have_a_bias"));
    }
}
