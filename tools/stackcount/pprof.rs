//! stackcount --pprof FILE: which file each summary's profile goes to (one
//! per interval with -i), what its samples measure (from the run's patterns),
//! and its labels; the profile itself is built by common's pprof builder.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Result};
use common::perf::{Every, Family};
use common::pprof::{self, Builder, Label, Sampling};
use common::profile::Frames;
use common::symbolize::Symbols;
use common::{Plan, Site};

use crate::Key;

/// What a run's profiles measure, and how their samples are labelled.
#[derive(Clone)]
pub struct Kind {
    sampling: Option<Sampling>,
    /// Label samples with `comm` and `pid` (stacks counted per process).
    per_process: bool,
    /// In a run of several probes, each probe's name by its index: samples are
    /// labelled `probe` with it, as bpftrace's `probe` names the probe.
    probes: Vec<String>,
}

impl Kind {
    pub fn of(plan: &Plan, per_process: bool) -> Kind {
        Kind {
            sampling: sampling(plan),
            per_process,
            probes: match plan.probes.len() {
                0 | 1 => Vec::new(),
                _ => plan.probes.iter().map(|p| p.label.clone()).collect(),
            },
        }
    }

    /// The profile of `entries` (keys with their addresses and process, see
    /// `drain`), counted over `duration` from `start`.
    fn build(
        &self,
        entries: &HashMap<Key, u64>,
        symbols: &Symbols,
        start: SystemTime,
        duration: Duration,
    ) -> pprof::proto::Profile {
        let mut frames = Frames::new(symbols);
        let mut b = Builder::new(self.sampling);
        // Sorted, so that a profile of the same counts is the same file.
        let mut sorted: Vec<(&Key, &u64)> = entries.iter().collect();
        sorted.sort();
        for (k, &count) in sorted {
            let mut stack = frames.kernel(&k.kernel);
            stack.extend(frames.user(k.pid, &k.user));
            let mut labels = Vec::new();
            if self.per_process {
                if let Some(comm) = &k.comm {
                    labels.push(Label::Str("comm", comm.clone()));
                }
                if let Some(pid) = k.pid {
                    labels.push(Label::Num("pid", pid.into()));
                }
            }
            if let Some(name) = k.probe.and_then(|i| self.probes.get(i as usize)) {
                labels.push(Label::Str("probe", name.clone()));
            }
            b.add(&stack, count, &labels);
        }
        b.finish(start, duration)
    }

    /// [`Kind::build`], gzipped (`/debug/pprof/profile`'s answer).
    pub fn encoded(
        &self,
        entries: &HashMap<Key, u64>,
        symbols: &Symbols,
        start: SystemTime,
        duration: Duration,
    ) -> Vec<u8> {
        pprof::encode(&self.build(entries, symbols, start, duration))
    }
}

/// The profiles of a run.
pub struct Profiles {
    path: PathBuf,
    /// One file per interval (-i), numbered from 1.
    numbered: bool,
    written: u64,
    kind: Kind,
    /// Start of the current interval.
    since: SystemTime,
}

impl Profiles {
    /// Checks now, before tracing, that the first file can be written: a
    /// mistyped directory fails in a second, not after the whole trace.
    pub fn check(path: &Path, numbered: bool, kind: Kind) -> Result<Profiles> {
        let first = if numbered {
            pprof::numbered(path, 1)
        } else {
            path.to_path_buf()
        };
        File::create(&first).map_err(|e| {
            anyhow!(
                "cannot create {} for --pprof: {e}; give a path in a writable directory",
                first.display()
            )
        })?;
        Ok(Profiles {
            path: path.to_path_buf(),
            numbered,
            written: 0,
            kind,
            since: SystemTime::now(),
        })
    }

    /// Tracing starts: the first interval's time.
    pub fn start(&mut self) {
        self.since = SystemTime::now();
    }

    /// Writes the profile of one summary's stacks (keys with their addresses
    /// and process, see `drain`), counted until `end` (when the summary began:
    /// reading and symbolizing them is not part of the interval).
    pub fn write(
        &mut self,
        entries: &HashMap<Key, u64>,
        symbols: &Symbols,
        end: SystemTime,
    ) -> Result<()> {
        let duration = end.duration_since(self.since).unwrap_or_default();
        let profile = self.kind.build(entries, symbols, self.since, duration);
        self.since = end;
        self.written += 1;
        let path = match self.numbered {
            true => pprof::numbered(&self.path, self.written),
            false => self.path.clone(),
        };
        pprof::write(&path, &profile)
    }
}

/// What a sample is beyond its count: when every pattern is the same sampling
/// source, its period (a profile has one set of sample types, so a run that
/// mixes sources, or a source with probes, counts samples only; the `probe`
/// label tells them apart).
fn sampling(plan: &Plan) -> Option<Sampling> {
    let mut sources = plan.probes.iter().map(|p| match &p.site {
        Site::Perf(s) => Some(s),
        _ => None,
    });
    let first = sources.next()??;
    if !sources.all(|s| s.is_some_and(|s| s.name == first.name)) {
        return None;
    }
    match (first.family, first.every) {
        (Family::Profile, Every::Hz(hz)) => Some(Sampling::CpuNanos(1_000_000_000 / hz)),
        (Family::Profile, Every::Period(ns)) => Some(Sampling::CpuNanos(ns)),
        (_, Every::Period(n)) => Some(Sampling::Events(n)),
        (_, Every::Hz(_)) => None,
    }
}
