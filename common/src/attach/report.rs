//! What an attached set reports: the links made and every probe skipped, for
//! the tool's debug option (`-D`/`--debug`; trace's `-v`), and a one-line warning otherwise.

use std::fmt::Write as _;

use crate::attach::links::Attached;
use crate::plan::Skipped;

impl Attached {
    /// What `-D` prints after attaching: links and every skipped probe.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "attached: {} probes, {} links ({} kprobe_multi, {} uprobe_multi), {} skipped\n",
            self.probes_attached(),
            self.links(),
            self.kprobe_multi_links,
            self.uprobe_multi_links,
            self.skipped.len()
        );
        let user = self.grouped_uprobes + self.single_uprobes;
        if user > 0 {
            let _ = writeln!(
                s,
                "uprobes: {} in {} tracefs uprobe group{}, {} as single perf-event uprobes",
                self.grouped_uprobes,
                self.uprobe_groups,
                if self.uprobe_groups == 1 { "" } else { "s" },
                self.single_uprobes
            );
        }
        let tracepoints = self.raw_tracepoint_links + self.syscall_events + self.perf_tracepoints;
        if tracepoints > 0 {
            let _ = writeln!(
                s,
                "tracepoints: {} as raw tracepoint links, {} syscall events through {} raw sys_enter/sys_exit link{}, {} as perf events",
                self.raw_tracepoint_links,
                self.syscall_events,
                self.syscall_links,
                if self.syscall_links == 1 { "" } else { "s" },
                self.perf_tracepoints
            );
        }
        for k in &self.skipped {
            let _ = writeln!(s, "  skipped {}: {}", k.label, k.reason);
        }
        s
    }
}

/// A one-line warning about `skipped` sites (`noun`s: probes, tracepoints), if
/// any: the first few with their reasons, then how many more, which the
/// tool's debug option lists.
pub fn skipped_warning(noun: &str, skipped: &[Skipped]) -> Option<String> {
    if skipped.is_empty() {
        return None;
    }
    Some(format!(
        "skipped {} {noun}{} that could not be attached: {}",
        skipped.len(),
        if skipped.len() == 1 { "" } else { "s" },
        listed(skipped)
    ))
}

/// `skipped` as warnings and errors list them: the first few with their
/// reasons, then how many more, which the tool's debug option lists.
pub fn listed(skipped: &[Skipped]) -> String {
    const SHOWN: usize = 5;
    let mut list: Vec<String> = skipped.iter().take(SHOWN).map(Skipped::to_string).collect();
    if skipped.len() > SHOWN {
        list.push(format!(
            "and {} more ({} lists them)",
            skipped.len() - SHOWN,
            crate::diag::debug_flag()
        ));
    }
    list.join(", ")
}
