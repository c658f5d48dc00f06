//! What the per-event tools (disksnoop, urandomread) count for `--listen`: every
//! record they print is also added here, by a small key (a device and an
//! operation, a source), so `/metrics` shows totals since the start and
//! `/summary` the same since the last `POST /reset`. Every record reaches user
//! space anyway, so these counts are exact (lost records are counted apart).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::output::hist::{Log2Hist, LOG2_SLOTS};

/// The counts of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cell {
    pub events: u64,
    pub bytes: u64,
    /// Latencies in ns as bpf/hist.h slots them, and their exact sum.
    pub hist: Log2Hist,
    pub total_ns: u64,
}

impl Cell {
    fn minus(&self, base: &Cell) -> Cell {
        let mut hist = self.hist.clone();
        for (a, b) in hist.slots.iter_mut().zip(&base.hist.slots) {
            *a -= b;
        }
        Cell {
            events: self.events - base.events,
            bytes: self.bytes - base.bytes,
            hist,
            total_ns: self.total_ns - base.total_ns,
        }
    }
}

/// Counts by key, cumulative, with the mark `/reset` sets.
#[derive(Debug, Default)]
pub struct Tally<K: Ord + Clone> {
    now: BTreeMap<K, Cell>,
    base: BTreeMap<K, Cell>,
}

/// bpf/hist.h's slot of `v`: floor(log2 v) + 1, 1 for 0, at most 63.
fn log2_slot(v: u64) -> usize {
    ((64 - v.leading_zeros()) as usize).clamp(1, LOG2_SLOTS - 1)
}

impl<K: Ord + Clone> Tally<K> {
    pub fn new() -> Self {
        Tally {
            now: BTreeMap::new(),
            base: BTreeMap::new(),
        }
    }

    /// One record of `bytes`, with its latency if it has one.
    pub fn add(&mut self, key: K, bytes: u64, lat_ns: Option<u64>) {
        let c = self.now.entry(key).or_default();
        c.events += 1;
        c.bytes += bytes;
        if let Some(ns) = lat_ns {
            if c.hist.slots.is_empty() {
                c.hist.slots = vec![0; LOG2_SLOTS];
            }
            c.hist.slots[log2_slot(ns)] += 1;
            c.total_ns += ns;
        }
    }

    /// Totals since the start.
    pub fn totals(&self) -> impl Iterator<Item = (&K, &Cell)> {
        self.now.iter()
    }

    /// Counts since the last [`Tally::reset`] (or the start), non-zero keys only.
    pub fn since_reset(&self) -> Vec<(K, Cell)> {
        let none = Cell::default();
        self.now
            .iter()
            .map(|(k, c)| (k.clone(), c.minus(self.base.get(k).unwrap_or(&none))))
            .filter(|(_, c)| c.events > 0)
            .collect()
    }

    pub fn reset(&mut self) {
        self.base = self.now.clone();
    }
}

/// A `/summary` object of a per-event tool: `rows` are one JSON object per key
/// (its labels and counts).
pub fn summary(rows: Vec<Value>) -> Value {
    crate::output::summary_record(false, json!({ "counts": rows }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_hist_h() {
        assert_eq!(log2_slot(0), 1);
        assert_eq!(log2_slot(1), 1);
        assert_eq!(log2_slot(2), 2);
        assert_eq!(log2_slot(1023), 10);
        assert_eq!(log2_slot(1024), 11);
        assert_eq!(log2_slot(u64::MAX), 63);
    }

    #[test]
    fn reset_marks_without_losing_totals() {
        let mut t = Tally::new();
        t.add('R', 4096, Some(1500));
        t.add('R', 512, Some(100));
        t.reset();
        t.add('W', 8, None);
        let (_, r) = t.totals().next().unwrap();
        assert_eq!(
            (r.events, r.bytes, r.total_ns, r.hist.count()),
            (2, 4608, 1600, 2)
        );
        let since = t.since_reset();
        assert_eq!(since.len(), 1);
        assert_eq!(
            (since[0].0, since[0].1.events, since[0].1.bytes),
            ('W', 1, 8)
        );
    }
}
