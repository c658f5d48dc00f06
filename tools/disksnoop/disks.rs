//! Disk names and device numbers, from /sys/class/block.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use anyhow::{bail, Result};
use common::escape;

const SYS_BLOCK: &str = "/sys/class/block";

/// The kernel's dev_t layout (MKDEV), as block tracepoints record devices.
pub fn kdev(major: u32, minor: u32) -> u32 {
    (major << 20) | (minor & 0xf_ffff)
}

/// `major:minor` of a kernel dev_t.
pub fn show_dev(dev: u32) -> String {
    format!("{}:{}", dev >> 20, dev & 0xf_ffff)
}

fn read_dev(dir: &Path) -> Option<u32> {
    let s = fs::read_to_string(dir.join("dev")).ok()?;
    let (maj, min) = s.trim().split_once(':')?;
    Some(kdev(maj.parse().ok()?, min.parse().ok()?))
}

/// The whole disk `name` as a kernel dev_t: a name under /sys/class/block
/// (`loop0`, `vda`, `/dev/sda`), its `MAJOR:MINOR`, or a path to its device
/// node (symlinks followed: `/dev/disk/by-id/...`, `/dev/../dev/loop0`).
pub fn resolve(name: &str) -> Result<u32> {
    let short = name.strip_prefix("/dev/").unwrap_or(name);
    let by_name = Path::new(SYS_BLOCK).join(short);
    let plain = !short.is_empty() && !short.contains('/') && !short.starts_with('.');
    let dir = if plain && by_name.exists() {
        by_name
    } else if let Some((maj, min)) = major_minor(name) {
        let dir = Path::new(SYS_DEV_BLOCK).join(format!("{maj}:{min}"));
        if !dir.exists() {
            bail!("no block device {maj}:{min} ({})", disks_here());
        }
        dir
    } else if name.contains('/') {
        Path::new(SYS_DEV_BLOCK).join(device_node(name)?)
    } else {
        bail!("no disk named '{}' ({})", escape(name), disks_here());
    };
    // The device's own directory: its name, and whether it is a partition.
    let dir = fs::canonicalize(&dir).unwrap_or(dir);
    let shown = dir
        .file_name()
        .map_or_else(|| escape(name), |n| escape(n.as_encoded_bytes()));
    if dir.join("partition").exists() {
        let disk = dir
            .parent()
            .and_then(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "its disk".to_string());
        bail!(
            "'{shown}' is a partition: block requests are traced per whole disk (-d {})",
            escape(&disk)
        );
    }
    match read_dev(&dir) {
        Some(d) => Ok(d),
        None => bail!("cannot read the device number of disk '{shown}'"),
    }
}

/// Block devices by `major:minor`, each a link to its directory.
const SYS_DEV_BLOCK: &str = "/sys/dev/block";

/// `MAJOR:MINOR` in decimal, as /sys and lsblk show device numbers.
fn major_minor(s: &str) -> Option<(u32, u32)> {
    let (maj, min) = s.split_once(':')?;
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    (digits(maj) && digits(min)).then_some((maj.parse().ok()?, min.parse().ok()?))
}

/// The `major:minor` of the block device node at `path` (symlinks followed).
fn device_node(path: &str) -> Result<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no disk named '{}' ({})", escape(path), disks_here())
        }
        Err(e) => bail!("-d '{}': {e}", escape(path)),
    };
    if !meta.file_type().is_block_device() {
        bail!(
            "-d '{}' is not a block device; give a disk's name, MAJOR:MINOR or device node",
            escape(path)
        );
    }
    let rdev = meta.rdev();
    Ok(format!("{}:{}", libc::major(rdev), libc::minor(rdev)))
}

/// "disks: loop0, vda, ..." for a message: the whole disks of this system.
fn disks_here() -> String {
    let mut all: Vec<String> = fs::read_dir(SYS_BLOCK)
        .map(|d| {
            d.flatten()
                .filter(|e| !e.path().join("partition").exists())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    all.sort();
    const SHOWN: usize = 12;
    let more = all.len().saturating_sub(SHOWN);
    all.truncate(SHOWN);
    format!(
        "disks: {}{}",
        if all.is_empty() {
            "none".to_string()
        } else {
            all.join(", ")
        },
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

/// Names of devices by kernel dev_t, refreshed when an unknown one appears.
#[derive(Default)]
pub struct Names {
    by_dev: HashMap<u32, String>,
}

impl Names {
    pub fn load() -> Names {
        let mut n = Names::default();
        n.refresh();
        n
    }

    fn refresh(&mut self) {
        if let Ok(d) = fs::read_dir(SYS_BLOCK) {
            for e in d.flatten() {
                if let (Some(dev), Ok(name)) = (read_dev(&e.path()), e.file_name().into_string()) {
                    self.by_dev.insert(dev, name);
                }
            }
        }
    }

    /// The disk's name, or `major:minor` for one that is gone or unnamed.
    pub fn name(&mut self, dev: u32) -> String {
        if !self.by_dev.contains_key(&dev) {
            self.refresh();
            // Remember misses too: one scan per unknown device, not per request.
            self.by_dev.entry(dev).or_insert_with(|| show_dev(dev));
        }
        self.by_dev[&dev].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_numbers() {
        assert_eq!(kdev(7, 0), 7 << 20);
        assert_eq!(show_dev(kdev(259, 3)), "259:3");
    }
}
