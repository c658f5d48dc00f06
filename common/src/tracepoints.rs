//! Kernel tracepoints, listed from tracefs `events/<category>/<event>/`.

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
