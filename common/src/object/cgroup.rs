//! `--cgroup PATH` (trace's `-c PATH`, as in BCC): trace only the tasks of one
//! cgroup v2 and of the cgroups below it (a systemd service, a container). The
//! directory is checked once and put in a one-entry cgroup array, which the
//! filter of every BPF object (bpf/filter.h) shares instead of creating its own.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

/// CGROUP2_SUPER_MAGIC (linux/magic.h), as statfs(2) reports it.
const CGROUP2_MAGIC: i64 = 0x6367_7270;

/// The armed filter's map, for the life of the process (objects reuse its fd).
static MAP: OnceLock<MapHandle> = OnceLock::new();

/// Checks that `path` is a cgroup v2 directory and arms the filter with it. A
/// relative path is taken below the cgroup2 mount (`system.slice/cron.service`).
pub fn arm(path: &Path) -> Result<()> {
    let mount = crate::sys::mounts::mount_point("cgroup2");
    let full: PathBuf = match (&mount, path.is_absolute()) {
        (Some(m), false) => m.join(path),
        _ => path.to_path_buf(),
    };
    let shown = full.display();
    let where_ = match &mount {
        Some(m) => format!("cgroup v2 is mounted at {}", m.display()),
        None => "this system has no cgroup v2 mount (mount -t cgroup2 none /sys/fs/cgroup)".into(),
    };
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(&full)
        .map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::ENOENT) => "no such directory".to_string(),
                Some(libc::ENOTDIR) => "not a directory".to_string(),
                _ => e.to_string(),
            };
            anyhow!("--cgroup {shown}: {why}; give a cgroup v2 directory ({where_})")
        })?;
    if !crate::sys::mounts::is_mounted_at(&full, CGROUP2_MAGIC) {
        bail!("--cgroup {shown}: not a cgroup v2 directory ({where_})");
    }
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        ..Default::default()
    };
    let map = MapHandle::create(MapType::CgroupArray, Some("filter_cgroups"), 4, 4, 1, &opts)
        .context("creating the cgroup filter's map")?;
    let value = (dir.as_raw_fd() as u32).to_ne_bytes();
    map.update(&0u32.to_ne_bytes(), &value, MapFlags::ANY)
        .with_context(|| format!("--cgroup {shown}: the kernel refused it as a cgroup"))?;
    // The map holds the cgroup now; the directory's fd is closed on return.
    let _ = MAP.set(map);
    Ok(())
}

/// The armed filter's map, if `--cgroup` was given.
pub fn map() -> Option<BorrowedFd<'static>> {
    MAP.get().map(|m| m.as_fd())
}
