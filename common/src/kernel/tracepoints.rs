//! Kernel tracepoints, listed from tracefs `events/<category>/<event>/`.

use std::fs;

use anyhow::{bail, Context, Result};

use crate::kernel::tracefs;
use crate::probe::pattern::Matcher;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tracepoint {
    pub category: String,
    pub event: String,
}

impl Tracepoint {
    /// `category:event`, the name BCC prints and patterns match.
    pub fn name(&self) -> String {
        format!("{}:{}", self.category, self.event)
    }
}

/// Every tracepoint whose `category:event` the matcher accepts, sorted.
pub fn matching(m: &Matcher) -> Result<Vec<Tracepoint>> {
    let events = tracefs::tracefs()?.join("events");
    if let Some((cat, ev)) = m.literal().and_then(|l| l.split_once(':')) {
        let id = events.join(cat).join(ev).join("id");
        let found = match fs::metadata(&id) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                bail!(denied(&events))
            }
            Err(_) => false,
        };
        return Ok(found
            .then(|| Tracepoint {
                category: cat.to_string(),
                event: ev.to_string(),
            })
            .into_iter()
            .collect());
    }
    let mut found = Vec::new();
    let cats = match fs::read_dir(&events) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(denied(&events)),
        Err(e) => return Err(e).with_context(|| format!("listing {}", events.display())),
    };
    for cat in cats.flatten() {
        let Ok(cat_name) = cat.file_name().into_string() else {
            continue;
        };
        // Other tracekit runs' uprobe groups (see attach/uprobe_groups.rs)
        // come and go with those runs: a pattern that happened to match one
        // failed when it went away before its format was read. Only a
        // literal name reaches them.
        if cat_name.starts_with("tracekit_") {
            continue;
        }
        let Ok(evs) = fs::read_dir(cat.path()) else {
            continue; // a file such as header_page
        };
        for ev in evs.flatten() {
            let Ok(ev_name) = ev.file_name().into_string() else {
                continue;
            };
            // Event directories hold an `id`; files like `enable` and `filter` do not.
            if m.is_match(&format!("{cat_name}:{ev_name}")) && ev.path().join("id").exists() {
                found.push(Tracepoint {
                    category: cat_name.clone(),
                    event: ev_name,
                });
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Tracepoints need tracefs, which is root's alone on most systems: with CAP_BPF
/// and CAP_PERFMON but not root, user functions work and tracepoints cannot be
/// found (they were "no tracepoint matches").
fn denied(events: &std::path::Path) -> String {
    format!(
        "cannot read {}: permission denied (tracepoints are found in tracefs, which only \
         root may read here; run as root)",
        events.display()
    )
}

/// Whether an event can be attached as the kernel tracepoint of the same name (a
/// raw tracepoint is found by name alone). Tracepoint names are unique, so an
/// event name found in several categories, or an event in a group of dynamic
/// events (kprobe, uprobe, synthetic, ... events defined through tracefs, which
/// have no tracepoint of their own), is not. Decided from the tracefs directory
/// alone: the lists of dynamic events would wait for the kernel's event_mutex,
/// which other tools hold for seconds while they detach perf events.
pub fn raw_attachable(events: &[&Tracepoint]) -> Vec<bool> {
    const DYNAMIC_GROUPS: &[&str] = &[
        "kprobes",
        "uprobes",
        "synthetic",
        "eprobes",
        "fprobes",
        "tracepoints",
        "ftrace",
    ];
    let mut categories: std::collections::HashMap<String, usize> = Default::default();
    let events_dir = tracefs::tracefs().ok().map(|d| d.join("events"));
    let listing = events_dir
        .as_ref()
        .and_then(|d| Some((fs::read_dir(d).ok()?, fs::File::open(d).ok()?)));
    if let Some((cats, dir)) = listing {
        // A few events: look each up in every category (a stat each, relative
        // to the events directory: two path steps, not six) rather than list
        // all ~2000 events (15 ms of a tracepoint run's start-up under
        // emulation).
        let names: std::collections::HashSet<&str> =
            events.iter().map(|t| t.event.as_str()).collect();
        let few = names.len() <= 16;
        for cat in cats.flatten() {
            if few {
                for name in &names {
                    if is_dir_at(&dir, &cat.file_name(), name) {
                        *categories.entry(name.to_string()).or_default() += 1;
                    }
                }
                continue;
            }
            for ev in fs::read_dir(cat.path()).into_iter().flatten().flatten() {
                if let Ok(name) = ev.file_name().into_string() {
                    if ev.file_type().is_ok_and(|t| t.is_dir()) {
                        *categories.entry(name).or_default() += 1;
                    }
                }
            }
        }
    }
    events
        .iter()
        .map(|t| {
            !DYNAMIC_GROUPS.contains(&t.category.as_str())
                && categories.get(&t.event).copied().unwrap_or(1) == 1
        })
        .collect()
}

/// Whether `category/name` under the directory `dir` is a directory.
fn is_dir_at(dir: &fs::File, category: &std::ffi::OsStr, name: &str) -> bool {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let mut path = category.as_bytes().to_vec();
    path.push(b'/');
    path.extend_from_slice(name.as_bytes());
    let Ok(path) = std::ffi::CString::new(path) else {
        return false;
    };
    // SAFETY: an all-zero stat is valid; the path is NUL-terminated and dir open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatat(dir.as_raw_fd(), path.as_ptr(), &mut st, 0) };
    rc == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// The x86_64 number of the syscall an ftrace syscall event is named after
/// (`sys_enter_NAME`). The events carry the kernel's entry-point names, which
/// differ from the syscall names in six cases.
pub fn syscall_nr(event_name: &str) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    {
        let name = match event_name {
            "newstat" => "stat",
            "newfstat" => "fstat",
            "newlstat" => "lstat",
            "newuname" => "uname",
            "sendfile64" => "sendfile",
            "umount" => "umount2",
            n => n,
        };
        name.parse::<syscalls::Sysno>().ok().map(|s| s.id() as u32)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = event_name;
        None
    }
}

/// A tracepoint's record layout, from tracefs `events/C/E/format`: the one
/// parser of these files. Programs for classic tracepoints read fixed offsets
/// checked against it (so they need no kernel BTF), and trace types its
/// fields from the declarations.
#[derive(Debug, Clone, Default)]
pub struct Format {
    pub fields: Vec<Field>,
}

/// One field of a [`Format`] (the `common_` ones included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The declaration's last word without `[..]`: "nr_sector", "rwbs".
    pub name: String,
    /// The whole C declaration: "unsigned int nr_sector", "char rwbs\[10\]",
    /// "__data_loc char[] name".
    pub decl: String,
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
}

impl Format {
    /// Reads `category:event`'s format (mounting tracefs if needed).
    pub fn read(category: &str, event: &str) -> Result<Format> {
        let path = crate::kernel::tracefs::tracefs()?
            .join("events")
            .join(category)
            .join(event)
            .join("format");
        // By the error, not by a second look: out of descriptors, the file
        // exists but cannot be opened.
        let text = fs::read_to_string(&path).map_err(|e| {
            let what = match e.kind() {
                std::io::ErrorKind::NotFound => {
                    format!("no tracepoint {category}:{event} ({})", path.display())
                }
                _ => format!("reading {}", path.display()),
            };
            anyhow::Error::new(e).context(what)
        })?;
        Ok(Format::parse(&text))
    }

    /// Parses the text of a `format` file; lines that are not fields are skipped.
    pub fn parse(text: &str) -> Format {
        let mut fields = Vec::new();
        for line in text.lines() {
            let (mut decl, mut off, mut size, mut signed) = (None, None, None, false);
            for part in line.trim().split(';') {
                let part = part.trim();
                if let Some(d) = part.strip_prefix("field:") {
                    decl = Some(d.trim().to_string());
                } else if let Some(v) = part.strip_prefix("offset:") {
                    off = v.parse::<u32>().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.parse::<u32>().ok();
                } else if let Some(v) = part.strip_prefix("signed:") {
                    signed = v == "1";
                }
            }
            let (Some(decl), Some(offset), Some(size)) = (decl, off, size) else {
                continue;
            };
            // "unsigned int nr_sector" or "char rwbs[10]": the last word, without [..].
            let Some(last) = decl.split_whitespace().last() else {
                continue;
            };
            let name = last.split('[').next().unwrap_or(last).to_string();
            fields.push(Field {
                name,
                decl,
                offset,
                size,
                signed,
            });
        }
        Format { fields }
    }

    /// (offset, size) of `field`.
    pub fn field(&self, field: &str) -> Option<(u32, u32)> {
        self.fields
            .iter()
            .find(|f| f.name == field)
            .map(|f| (f.offset, f.size))
    }

    /// Fails unless `field` lies at `offset` with `size` bytes, as the programs read it.
    pub fn expect(&self, field: &str, offset: u32, size: u32) -> Result<()> {
        match self.field(field) {
            Some((o, s)) if o == offset && s == size => Ok(()),
            Some((o, s)) => {
                bail!("tracepoint field {field} is {s} bytes at offset {o}, not {size} at {offset}")
            }
            None => bail!("tracepoint has no field {field}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_format() {
        let f = Format::parse(
            "name: block_rq_issue\nID: 2104\nformat:\n\
             \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
             \tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;\n\
             \tfield:char rwbs[10];\toffset:34;\tsize:10;\tsigned:0;\n\
             \tfield:__data_loc char[] cmd;\toffset:60;\tsize:4;\tsigned:0;\n\n\
             print fmt: \"%d\", REC->dev\n",
        );
        assert_eq!(f.field("dev"), Some((8, 4)));
        assert_eq!(f.field("rwbs"), Some((34, 10)));
        assert_eq!(f.field("cmd"), Some((60, 4)));
        assert!(f.expect("dev", 8, 4).is_ok());
        assert_eq!(
            f.expect("rwbs", 32, 8).unwrap_err().to_string(),
            "tracepoint field rwbs is 10 bytes at offset 34, not 8 at 32"
        );
    }
}
