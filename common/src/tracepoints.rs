//! Kernel tracepoints, listed from tracefs `events/<category>/<event>/`.

use std::collections::HashSet;
use std::fs;

use anyhow::{Context, Result};

use crate::pattern::Matcher;
use crate::tracefs;

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
        let found = events.join(cat).join(ev).join("id").exists();
        return Ok(found
            .then(|| Tracepoint {
                category: cat.to_string(),
                event: ev.to_string(),
            })
            .into_iter()
            .collect());
    }
    let mut found = Vec::new();
    let cats = fs::read_dir(&events).with_context(|| format!("listing {}", events.display()))?;
    for cat in cats.flatten() {
        let Ok(cat_name) = cat.file_name().into_string() else {
            continue;
        };
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

/// The (group, event) of every dynamic event (kprobe, uprobe, synthetic, ...
/// events defined through tracefs): they have no kernel tracepoint of their own,
/// whatever their name.
pub fn dynamic_events() -> HashSet<(String, String)> {
    let Ok(dir) = tracefs::tracefs() else {
        return HashSet::new();
    };
    // dynamic_events (Linux 5.0+) lists them all; each read waits for the kernel's
    // event_mutex, so read no more files than needed.
    let files: &[&str] = if dir.join("dynamic_events").exists() {
        &["dynamic_events"]
    } else {
        &["kprobe_events", "uprobe_events"]
    };
    files
        .iter()
        .filter_map(|f| fs::read_to_string(dir.join(f)).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| {
                    // "p:GROUP/EVENT ...", "s:GROUP/EVENT ..." (synthetic: "s:EVENT")
                    let def = l.split_whitespace().next()?.split_once(':')?.1;
                    let (g, e) = def.split_once('/').unwrap_or(("synthetic", def));
                    Some((g.to_string(), e.to_string()))
                })
                .collect::<Vec<_>>()
        })
        .collect()
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
