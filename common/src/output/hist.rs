//! Log2 histograms as BCC prints them (table.py `print_log2_hist`), byte for byte,
//! plus their JSON form. The slots come from bpf/hist.h: slot `i` (1..63) holds
//! values in [2^(i-1), 2^i - 1], slot 1 also 0, as BCC's `bpf_log2l` does.

use std::fmt::Write as _;

use serde_json::{json, Value};

/// Slots per histogram row in bpf/hist.h (`LOG2_SLOTS`); the last also holds
/// everything above it.
pub const LOG2_SLOTS: usize = 64;

/// The unit latencies are measured in; the BPF side divides before taking log2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unit {
    #[default]
    Nsecs,
    Usecs,
    Msecs,
}

impl Unit {
    /// BCC's label (`nsecs`, `usecs`, `msecs`).
    pub fn label(self) -> &'static str {
        match self {
            Unit::Nsecs => "nsecs",
            Unit::Usecs => "usecs",
            Unit::Msecs => "msecs",
        }
    }

    /// Nanoseconds per unit.
    pub fn divisor(self) -> u64 {
        match self {
            Unit::Nsecs => 1,
            Unit::Usecs => 1_000,
            Unit::Msecs => 1_000_000,
        }
    }
}

/// One log2 histogram: `slots[i]` as in the module doc (`slots[0]` is unused).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Log2Hist {
    pub slots: Vec<u64>,
}

/// Width of the star bar: 40 for narrow tables, 20 for wide ones.
const STARS: usize = 40;

impl Log2Hist {
    pub fn from_slots(slots: &[u64]) -> Self {
        Log2Hist {
            slots: slots.to_vec(),
        }
    }

    pub fn merge(&mut self, other: &Log2Hist) {
        if self.slots.len() < other.slots.len() {
            self.slots.resize(other.slots.len(), 0);
        }
        for (a, b) in self.slots.iter_mut().zip(&other.slots) {
            *a += b;
        }
    }

    /// Events in the histogram.
    pub fn count(&self) -> u64 {
        self.slots.iter().sum()
    }

    /// The value range of slot `i`, as BCC labels it (`0 -> 1` for slot 1).
    pub fn range(i: usize) -> (u128, u128) {
        let high = (1u128 << i) - 1;
        let low = (1u128 << i) >> 1;
        if low == high {
            (low.saturating_sub(1), high)
        } else {
            (low, high)
        }
    }

    /// BCC's text: nothing when empty; else the header, then a row for every slot
    /// from 1 to the last non-zero one. Past slot 32 the columns widen and the
    /// bar halves, as in BCC.
    pub fn render(&self, val_type: &str) -> String {
        let mut out = String::new();
        let Some(idx_max) = self.slots.iter().rposition(|&v| v > 0) else {
            return out;
        };
        if idx_max == 0 {
            return out; // BCC prints nothing when only the unused slot 0 is set
        }
        let val_max = self.slots.iter().copied().max().unwrap_or(0);
        let wide = idx_max > 32;
        let width = if wide { STARS / 2 } else { STARS };
        if wide {
            let _ = writeln!(
                out,
                "               {val_type:<29} : count     distribution"
            );
        } else {
            let _ = writeln!(out, "     {val_type:<19} : count     distribution");
        }
        for i in 1..=idx_max {
            let (low, high) = Self::range(i);
            let val = self.slots[i];
            let bar = stars(val, val_max, width);
            if wide {
                let _ = writeln!(out, "{low:>20} -> {high:<20} : {val:<8} |{bar:<width$}|");
            } else {
                let _ = writeln!(out, "{low:>10} -> {high:<10} : {val:<8} |{bar:<width$}|");
            }
        }
        out
    }

    /// `[{"low":L,"high":H,"count":N}, ...]` for the non-empty slots.
    pub fn to_json(&self) -> Value {
        Value::Array(
            self.slots
                .iter()
                .enumerate()
                .skip(1)
                .filter(|(_, &n)| n > 0)
                .map(|(i, &n)| {
                    let (low, high) = Self::range(i);
                    json!({ "low": low as u64, "high": high.min(u64::MAX as u128) as u64, "count": n })
                })
                .collect(),
        )
    }
}

/// BCC's bar: floor(width * val / max) stars.
fn stars(val: u64, max: u64, width: usize) -> String {
    if max == 0 {
        return String::new();
    }
    let n = ((width as u128 * val as u128) / max as u128).min(width as u128) as usize;
    "*".repeat(n)
}

/// Latency totals of a summary: time in nanoseconds and number of calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    pub total_ns: u64,
    pub count: u64,
}

impl Totals {
    /// BCC funclatency's line as its `print` writes it,
    /// `\navg = %ld U, total: %ld U, count: %ld\n` and print's own newline, with
    /// total in the unit and both truncated as Python's `%ld` does; empty when
    /// nothing was counted.
    pub fn render(&self, unit: Unit) -> String {
        if self.count == 0 {
            return String::new();
        }
        let total = self.total_ns as f64 / unit.divisor() as f64;
        let avg = total / self.count as f64;
        format!(
            "\navg = {} {u}, total: {} {u}, count: {}\n\n",
            avg as u64,
            total as u64,
            self.count,
            u = unit.label()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(pairs: &[(usize, u64)]) -> Log2Hist {
        let mut slots = vec![0; LOG2_SLOTS];
        for &(i, n) in pairs {
            slots[i] = n;
        }
        Log2Hist::from_slots(&slots)
    }

    #[test]
    fn renders_bccs_example_byte_for_byte() {
        // From BCC's funclatency_example.txt layout (current 40-star printer).
        let h = hist(&[(12, 124), (13, 291)]);
        let want = "     nsecs               : count     distribution\n".to_string()
            + "         0 -> 1          : 0        |                                        |\n"
            + "         2 -> 3          : 0        |                                        |\n"
            + "         4 -> 7          : 0        |                                        |\n"
            + "         8 -> 15         : 0        |                                        |\n"
            + "        16 -> 31         : 0        |                                        |\n"
            + "        32 -> 63         : 0        |                                        |\n"
            + "        64 -> 127        : 0        |                                        |\n"
            + "       128 -> 255        : 0        |                                        |\n"
            + "       256 -> 511        : 0        |                                        |\n"
            + "       512 -> 1023       : 0        |                                        |\n"
            + "      1024 -> 2047       : 0        |                                        |\n"
            + "      2048 -> 4095       : 124      |*****************                       |\n"
            + "      4096 -> 8191       : 291      |****************************************|\n";
        assert_eq!(h.render("nsecs"), want);
    }

    #[test]
    fn empty_prints_nothing() {
        assert_eq!(hist(&[]).render("usecs"), "");
    }

    #[test]
    fn wide_past_slot_32() {
        let h = hist(&[(33, 1)]);
        let text = h.render("nsecs");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "               nsecs                         : count     distribution"
        );
        assert_eq!(
            lines[1],
            "                   0 -> 1                    : 0        |                    |"
        );
        assert_eq!(
            lines[33],
            "          4294967296 -> 8589934591           : 1        |********************|"
        );
        assert_eq!(lines.len(), 34);
    }

    #[test]
    fn totals_line_truncates_like_python() {
        let t = Totals {
            total_ns: 6_543_360,
            count: 476,
        };
        assert_eq!(
            t.render(Unit::Nsecs),
            "\navg = 13746 nsecs, total: 6543360 nsecs, count: 476\n\n"
        );
        assert_eq!(
            t.render(Unit::Usecs),
            "\navg = 13 usecs, total: 6543 usecs, count: 476\n\n"
        );
        assert_eq!(Totals::default().render(Unit::Msecs), "");
    }

    #[test]
    fn json_lists_non_empty_slots() {
        let h = hist(&[(1, 2), (3, 5)]);
        assert_eq!(
            h.to_json(),
            json!([{"low":0,"high":1,"count":2},{"low":4,"high":7,"count":5}])
        );
    }
}
