//! Tools with fixed programs (disksnoop, urandomread): no probe pattern, but
//! several ways to reach the same events, of which a kernel accepts some. Each
//! tool lists them per group of events, best first (tp_btf, raw_tp, classic
//! tracepoint; fexit, kretprobe), and [`choose`] keeps the first that loads and
//! attaches here: decided by trying, never by kernel version (lockdown, missing
//! kprobes, a tracepoint removed in a stable kernel all show up only so).
//!
//! A trial loads the tool's object with the chosen programs of the earlier groups
//! plus one candidate's, and attaches them; the last trial that worked is kept, so
//! no extra load is needed at the end. Groups that follow the first one's choice
//! are tried with it in one trial first: on most kernels it is the only one.

use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use libbpf_rs::{Link, Object, OpenObject};

use crate::diag::escape;

/// One way to reach a group's events: the programs (by function name in the
/// BPF object) that are loaded and attached together.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// What `--debug` calls it: `tp_btf`, `raw_tp`, `tracepoint`, `kretprobe`...
    pub name: &'static str,
    pub progs: &'static [&'static str],
}

/// Whether a group must have a working variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The tool cannot run without these events.
    Required,
    /// Traced when possible (the tool says what it misses).
    Optional,
    /// Optional, and only the variant named as the one chosen for group `n`
    /// is tried (its programs share that group's map keys).
    SameAs(usize),
}

#[derive(Debug, Clone, Copy)]
pub struct Group {
    /// The events, in words: "block requests", "getrandom() calls".
    pub what: &'static str,
    pub variants: &'static [Variant],
    pub need: Need,
}

/// Environment variable naming the only variants to try (comma-separated), to
/// test a fallback on a kernel that has better: `TRACEKIT_PROGRAMS=tracepoint`.
pub const FORCE_ENV: &str = "TRACEKIT_PROGRAMS";

/// What [`choose`] picked, and why the variants before it were passed over.
#[derive(Debug, Clone)]
pub struct Choice {
    groups: Vec<Group>,
    /// Per group: the index of the variant in use.
    pub chosen: Vec<Option<usize>>,
    /// Per group: (variant, why it did not work).
    pub failed: Vec<Vec<(&'static str, String)>>,
}

impl Choice {
    /// The name of the variant in use for group `g`.
    pub fn name(&self, g: usize) -> Option<&'static str> {
        self.chosen[g].map(|v| self.groups[g].variants[v].name)
    }

    /// Why group `g` has no variant (or what was tried before the one in use):
    /// `variant: reason; variant: reason`.
    pub fn why_not(&self, g: usize) -> String {
        self.failed[g]
            .iter()
            .map(|(v, why)| format!("{v}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// What `--debug` prints: per group the programs in use and every variant
    /// passed over, with the reason.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        // The usual reason for refusals: lockdown=confidentiality forbids reading
        // kernel memory (raw_tp), kprobes and, on some kernels, BTF-typed programs.
        if let Some(mode) = crate::kernel::access::lockdown().filter(|m| m != "none") {
            let _ = writeln!(s, "kernel lockdown: {mode}");
        }
        for (g, group) in self.groups.iter().enumerate() {
            match self.chosen[g] {
                Some(v) => {
                    let var = &group.variants[v];
                    let _ = writeln!(s, "{}: {} ({})", group.what, var.name, var.progs.join(", "));
                }
                None => {
                    let _ = writeln!(s, "{}: not traced", group.what);
                }
            }
            for (v, why) in &self.failed[g] {
                let _ = writeln!(s, "  {v} did not work: {why}");
            }
        }
        s
    }
}

/// The programs of one trial: [`Selection::configure`] them on the open object
/// before load, [`Selection::attach`] them after.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    progs: Vec<&'static str>,
}

impl Selection {
    /// Whether program `name` is part of this trial.
    pub fn has(&self, name: &str) -> bool {
        self.progs.contains(&name)
    }

    /// Loads only the selected programs (the others would fail to load, which is
    /// why they were passed over, or cost verifier time).
    pub fn configure(&self, obj: &mut OpenObject) -> Result<()> {
        let mut found = 0;
        for mut prog in obj.progs_mut() {
            let on = prog.name().to_str().is_some_and(|n| self.has(n));
            found += usize::from(on);
            prog.set_autoload(on);
        }
        if found != self.progs.len() {
            bail!(
                "internal error: the BPF object lacks some of the programs {}",
                self.progs.join(", ")
            );
        }
        Ok(())
    }

    /// Attaches every selected program where its section says (libbpf's
    /// auto-attach: `tp_btf/X`, `raw_tp/X`, `tracepoint/C/X`, `kretprobe/F`,
    /// `fexit/F`); fails on the first that does not attach.
    pub fn attach(&self, obj: &Object) -> Result<Vec<Link>> {
        crate::timing::span("attach", || self.attach_all(obj))
    }

    fn attach_all(&self, obj: &Object) -> Result<Vec<Link>> {
        let mut links = Vec::new();
        for prog in obj.progs_mut() {
            let Some(name) = prog.name().to_str() else {
                continue;
            };
            if !self.has(name) {
                continue;
            }
            let section = prog.section().to_string_lossy().into_owned();
            let link = prog
                .attach()
                .with_context(|| format!("attaching {section}"))?;
            links.push(link);
        }
        Ok(links)
    }
}

/// Tries the variants of each group in order (see the module comment) and
/// returns the last successful trial's result with the choice. `trial` opens the
/// tool's object in the storage it is given, calls [`Selection::configure`],
/// loads, and calls [`Selection::attach`].
///
/// Where the later groups all follow the first one's choice ([`Need::SameAs`]:
/// the same kind of program for more events), the first trial takes the first
/// variant of every group at once: where the kernel takes them all (the usual
/// case), one load rather than one per group (each load parses the kernel's BTF
/// and resolves CO-RE relocations: about 25 ms of disksnoop's start-up on the
/// host). Only if it fails are the groups tried one at a time, which finds what
/// failed and why (not trying that first selection again: where a kernel lacks
/// the later group's events, as before Linux 6.5 block_io_start, that costs no
/// more trials than before). Independent groups (urandomread's) are tried one
/// at a time from the start: their first variants fail on many kernels.
///
/// Fails, listing every variant tried and why, when a required group has none.
pub fn choose<S>(
    groups: &[Group],
    mut trial: impl FnMut(&Selection) -> Result<S>,
) -> Result<(S, Choice)> {
    let forced: Option<Vec<String>> = std::env::var(FORCE_ENV)
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let mut choice = Choice {
        groups: groups.to_vec(),
        chosen: vec![None; groups.len()],
        failed: vec![Vec::new(); groups.len()],
    };
    // Whether variant v of group g may be tried, given the choices so far:
    // Some(reason) for one passed over (recorded), None to try it.
    let passed_over = |g: usize, v: usize, choice: &Choice| -> Option<Option<String>> {
        let var = &groups[g].variants[v];
        if let Need::SameAs(other) = groups[g].need {
            if choice.name(other) != Some(var.name) {
                return Some(None);
            }
        }
        if forced
            .as_ref()
            .is_some_and(|f| !f.iter().any(|n| n == var.name))
        {
            return Some(Some(format!("not selected by {FORCE_ENV}")));
        }
        None
    };

    let mut refused: Option<(Selection, String)> = None;
    let linked = groups
        .iter()
        .skip(1)
        .all(|g| matches!(g.need, Need::SameAs(_)));
    if groups.len() > 1 && linked {
        let mut all = choice.clone();
        let mut sel = Selection::default();
        for (g, group) in groups.iter().enumerate() {
            for (v, var) in group.variants.iter().enumerate() {
                match passed_over(g, v, &all) {
                    Some(why) => all.failed[g].extend(why.map(|w| (var.name, w))),
                    None => {
                        sel.progs.extend_from_slice(var.progs);
                        all.chosen[g] = Some(v);
                        break;
                    }
                }
            }
        }
        if all.chosen.iter().all(Option::is_some) {
            match trial(&sel) {
                Ok(s) => return Ok((s, all)),
                // Out of descriptors is not the kernel refusing a variant.
                Err(e) if crate::sys::fds::out_of_fds(&e) => return Err(e),
                // Where only the last group failed, its trial below is this one.
                Err(e) => refused = Some((sel, one_reason(&e))),
            }
        }
    }

    let mut base = Selection::default();
    let mut best: Option<S> = None;
    for (g, group) in groups.iter().enumerate() {
        for (v, var) in group.variants.iter().enumerate() {
            match passed_over(g, v, &choice) {
                Some(Some(why)) => {
                    choice.failed[g].push((var.name, why));
                    continue;
                }
                Some(None) => continue,
                None => {}
            }
            let mut sel = base.clone();
            sel.progs.extend_from_slice(var.progs);
            if let Some((_, why)) = refused.as_ref().filter(|(r, _)| r.progs == sel.progs) {
                choice.failed[g].push((var.name, why.clone()));
                continue;
            }
            match trial(&sel) {
                Ok(s) => {
                    best = Some(s);
                    base = sel;
                    choice.chosen[g] = Some(v);
                    break;
                }
                Err(e) if crate::sys::fds::out_of_fds(&e) => return Err(e),
                Err(e) => choice.failed[g].push((var.name, one_reason(&e))),
            }
        }
        if choice.chosen[g].is_none() && group.need == Need::Required {
            bail!(
                "no way to trace {} works on this kernel ({})",
                group.what,
                choice.why_not(g)
            );
        }
    }
    match best {
        Some(s) => Ok((s, choice)),
        None => bail!(
            "none of the events can be traced on this kernel: {}",
            groups
                .iter()
                .enumerate()
                .map(|(g, group)| format!("{}: {}", group.what, choice.why_not(g)))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// An error chain as one short line (libbpf's errors are terse already).
fn one_reason(e: &anyhow::Error) -> String {
    escape(format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &[Group] = &[
        Group {
            what: "requests",
            need: Need::Required,
            variants: &[
                Variant {
                    name: "tp_btf",
                    progs: &["btf_a", "btf_b"],
                },
                Variant {
                    name: "tracepoint",
                    progs: &["tp_a", "tp_b"],
                },
            ],
        },
        Group {
            what: "submitters",
            need: Need::SameAs(0),
            variants: &[
                Variant {
                    name: "tp_btf",
                    progs: &["btf_c"],
                },
                Variant {
                    name: "tracepoint",
                    progs: &["tp_c"],
                },
            ],
        },
    ];

    /// Runs `choose` over TWO with a kernel that refuses the programs in
    /// `refused`: the trials made (their programs) and the choice.
    fn run(refused: &[&str]) -> (Vec<String>, Result<Choice>) {
        run_groups(TWO, refused)
    }

    fn run_groups(groups: &[Group], refused: &[&str]) -> (Vec<String>, Result<Choice>) {
        let mut trials = Vec::new();
        let r = choose(groups, |sel| {
            trials.push(sel.progs.join(","));
            match sel.progs.iter().find(|p| refused.contains(p)) {
                Some(p) => bail!("{p} refused"),
                None => Ok(()),
            }
        });
        (trials, r.map(|(_, c)| c))
    }

    #[test]
    fn one_trial_where_the_best_of_every_group_works() {
        let (trials, c) = run(&[]);
        assert_eq!(trials, ["btf_a,btf_b,btf_c"]);
        let c = c.unwrap();
        assert_eq!((c.name(0), c.name(1)), (Some("tp_btf"), Some("tp_btf")));
        assert_eq!(
            choice_text(&c),
            "requests: tp_btf (btf_a, btf_b)\nsubmitters: tp_btf (btf_c)\n"
        );
    }

    /// `describe` without the lockdown line (which depends on the host).
    fn choice_text(c: &Choice) -> String {
        c.describe()
            .lines()
            .filter(|l| !l.starts_with("kernel lockdown"))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    #[test]
    fn independent_groups_one_at_a_time() {
        // A group that does not follow the first one's choice: no joint trial.
        let independent = [
            TWO[0],
            Group {
                need: Need::Optional,
                ..TWO[1]
            },
        ];
        let (trials, c) = run_groups(&independent, &["btf_a"]);
        assert_eq!(trials, ["btf_a,btf_b", "tp_a,tp_b", "tp_a,tp_b,btf_c"]);
        let c = c.unwrap();
        assert_eq!((c.name(0), c.name(1)), (Some("tracepoint"), Some("tp_btf")));
    }

    #[test]
    fn groups_one_at_a_time_when_that_fails() {
        // An optional group the kernel lacks: the first group keeps its best.
        let (trials, c) = run(&["btf_c"]);
        assert_eq!(trials, ["btf_a,btf_b,btf_c", "btf_a,btf_b"]);
        let c = c.unwrap();
        assert_eq!((c.name(0), c.name(1)), (Some("tp_btf"), None));
        assert_eq!(
            choice_text(&c),
            "requests: tp_btf (btf_a, btf_b)\nsubmitters: not traced\n  tp_btf did not work: btf_c refused\n"
        );
        // The first group's best refused: the second follows its choice.
        let (trials, c) = run(&["btf_b"]);
        assert_eq!(
            trials,
            [
                "btf_a,btf_b,btf_c",
                "btf_a,btf_b",
                "tp_a,tp_b",
                "tp_a,tp_b,tp_c"
            ]
        );
        let c = c.unwrap();
        assert_eq!(
            (c.name(0), c.name(1)),
            (Some("tracepoint"), Some("tracepoint"))
        );
        assert_eq!(c.why_not(0), "tp_btf: btf_b refused");
    }
}
