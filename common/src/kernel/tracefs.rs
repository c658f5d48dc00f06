//! Locating (and when needed mounting) tracefs and debugfs.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Result};

use crate::sys::mounts;

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS: &str = "/sys/kernel/debug";
/// Their filesystems' magic numbers (linux/magic.h), as statfs(2) reports them.
const TRACEFS_MAGIC: i64 = 0x7472_6163;
const DEBUGFS_MAGIC: i64 = 0x6462_6720;

/// The tracefs mount point; mounts tracefs at /sys/kernel/tracing when it is not mounted.
pub fn tracefs() -> Result<&'static Path> {
    static PATH: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| find_or_mount("tracefs", TRACEFS, TRACEFS_MAGIC).map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|e| anyhow!("{e}"))
}

/// The tracefs mount point when tracefs is mounted; never mounts it (for work
/// that has something to do only where tracefs has been used).
pub fn if_mounted() -> Option<PathBuf> {
    if mounts::is_mounted_at(Path::new(TRACEFS), TRACEFS_MAGIC) {
        return Some(PathBuf::from(TRACEFS));
    }
    mounts::mount_point("tracefs")
}

/// A tracefs list (uprobe_events, say) as one consistent snapshot. The kernel
/// gives it a page per read and finds where the next read starts by position,
/// so a line added or removed by another process between two reads shifts the
/// rest: a line can be skipped or repeated. Read until two reads agree.
pub fn read_list(path: &Path) -> std::io::Result<String> {
    let mut last = std::fs::read_to_string(path)?;
    for _ in 0..20 {
        let now = std::fs::read_to_string(path)?;
        if now == last {
            break;
        }
        last = now;
    }
    Ok(last)
}

/// The debugfs mount point, mounted when missing; `None` when it cannot be had
/// (only optional information, such as the kprobe blacklist, lives there).
pub fn debugfs() -> Option<&'static Path> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| find_or_mount("debugfs", DEBUGFS, DEBUGFS_MAGIC).ok())
        .as_deref()
}

fn find_or_mount(fstype: &str, target: &str, magic: i64) -> Result<PathBuf> {
    // Where it is almost always mounted: one statfs, not a read of the mount table.
    if mounts::is_mounted_at(Path::new(target), magic) {
        return Ok(PathBuf::from(target));
    }
    if let Some(p) = mounts::mount_point(fstype) {
        return Ok(p);
    }
    // Older systems reach tracefs through debugfs's automount.
    if fstype == "tracefs" && Path::new("/sys/kernel/debug/tracing/events").is_dir() {
        return Ok(PathBuf::from("/sys/kernel/debug/tracing"));
    }
    mounts::mount("nodev", fstype, target).map_err(|e| {
        anyhow!(
            "{fstype} is not mounted and mounting it at {target} failed ({e}); \
             run: mount -t {fstype} nodev {target}"
        )
    })?;
    Ok(PathBuf::from(target))
}
