//! What `--listen` exposes at `GET /metrics`: a snapshot of a tool's counts, read
//! from its BPF maps at scrape time, encoded by the `prometheus-client` crate
//! (OpenMetrics text). The snapshot is plain data (families of labelled samples)
//! so that tools fill it without knowing the encoder, and the encoder gets an
//! owned, `'static` collector as the crate requires.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeMetric as _, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::output::hist::{Log2Hist, Unit as HistUnit};

/// Label pairs of one sample, in order.
pub type Labels = Vec<(&'static str, String)>;

/// One sample's value.
#[derive(Debug, Clone)]
enum Value {
    Counter(u64),
    Gauge(f64),
    /// Per-bucket counts with their upper bounds (not cumulative; the last bound
    /// is +Inf), the sum and the count.
    Histogram {
        buckets: Vec<(f64, u64)>,
        sum: f64,
        count: u64,
    },
}

#[derive(Debug, Clone)]
struct Family {
    name: String,
    help: String,
    unit: Option<Unit>,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

/// The metrics of one scrape, filled by the tool and the session.
#[derive(Debug, Default)]
pub struct Metrics {
    families: Vec<Family>,
    /// Records or calls the tool could not count (ring buffer full, unpaired
    /// returns): exposed as `tracekit_lost_records_total` by the session.
    pub lost_records: u64,
}

impl Metrics {
    fn family(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        kind: MetricType,
    ) -> &mut Family {
        self.families.push(Family {
            name: name.to_string(),
            help: help.to_string(),
            unit,
            kind,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }

    /// A counter family (`name` without `_total`, which the encoder adds).
    /// Samples with the same labels are summed: Prometheus rejects duplicate
    /// series, and two probes may carry one label (a name in two binaries).
    pub fn counters(&mut self, name: &str, help: &str, samples: Vec<(Labels, u64)>) {
        let mut merged: BTreeMap<Labels, u64> = BTreeMap::new();
        for (l, v) in samples {
            *merged.entry(l).or_default() += v;
        }
        self.family(name, help, None, MetricType::Counter).samples = merged
            .into_iter()
            .map(|(l, v)| (l, Value::Counter(v)))
            .collect();
    }

    /// A gauge family.
    pub fn gauges(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        samples: Vec<(Labels, f64)>,
    ) {
        self.family(name, help, unit, MetricType::Gauge).samples = samples
            .into_iter()
            .map(|(l, v)| (l, Value::Gauge(v)))
            .collect();
    }

    /// A histogram family in seconds (`name` without `_seconds`) from log2
    /// histograms as bpf/hist.h keeps them: `slots` in `unit`, `total_ns` the
    /// exact sum in nanoseconds. Samples with the same labels are merged.
    pub fn log2_seconds(
        &mut self,
        name: &str,
        help: &str,
        unit: HistUnit,
        samples: Vec<(Labels, Log2Hist, u64)>,
    ) {
        let mut merged: BTreeMap<Labels, (Log2Hist, u64)> = BTreeMap::new();
        for (l, h, total) in samples {
            let e = merged.entry(l).or_default();
            e.0.merge(&h);
            e.1 += total;
        }
        self.family(name, help, Some(Unit::Seconds), MetricType::Histogram)
            .samples = merged
            .into_iter()
            .map(|(l, (h, total_ns))| (l, log2_histogram(&h, total_ns, unit)))
            .collect();
    }
}

/// The largest value bucket bounds go up to, in nanoseconds (2^40 ns, 18
/// minutes): beyond it everything is in `+Inf`, so every series has the same
/// ~40 buckets whatever the unit, and scrapes of thousands of them stay small.
const MAX_BOUND_NS: u128 = 1 << 40;

/// Slot `i` of a log2 histogram holds values `v <= 2^i - 1` in `unit`, that is
/// `ns < 2^i * unit` (the BPF side truncates when it divides): so its bucket's
/// bound (`le`, inclusive) is `2^i * unit` seconds.
fn log2_histogram(h: &Log2Hist, total_ns: u64, unit: HistUnit) -> Value {
    let per = unit.divisor() as u128;
    let mut buckets = Vec::new();
    let mut rest = 0u64;
    for (i, &n) in h.slots.iter().enumerate().skip(1) {
        let bound_ns = (1u128 << i) * per;
        if bound_ns <= MAX_BOUND_NS {
            buckets.push((bound_ns as f64 / 1e9, n));
        } else {
            rest += n;
        }
    }
    buckets.push((f64::INFINITY, rest));
    Value::Histogram {
        buckets,
        sum: total_ns as f64 / 1e9,
        count: h.count(),
    }
}

/// The scrape's collector: owns the snapshot, as `Registry` requires.
#[derive(Debug)]
struct Snapshot(Arc<Vec<Family>>);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in self.0.iter() {
            let mut m = encoder.encode_descriptor(&f.name, &f.help, f.unit.as_ref(), f.kind)?;
            // One unlabelled sample: no `{}` after the name.
            if let [(labels, v)] = f.samples.as_slice() {
                if labels.is_empty() {
                    encode_value(v, m)?;
                    continue;
                }
            }
            for (labels, v) in &f.samples {
                let labels: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                encode_value(v, m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

fn encode_value(v: &Value, mut e: MetricEncoder) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::{counter::ConstCounter, gauge::ConstGauge};
    match v {
        Value::Counter(n) => ConstCounter::new(*n).encode(e),
        Value::Gauge(x) => ConstGauge::new(*x).encode(e),
        Value::Histogram {
            buckets,
            sum,
            count,
        } => e.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None),
    }
}

impl Metrics {
    /// The OpenMetrics text of this snapshot (ends with `# EOF`).
    pub fn encode(self) -> anyhow::Result<String> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Snapshot(Arc::new(self.families))));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .map_err(|_| anyhow::anyhow!("encoding the metrics failed"))?;
        Ok(out)
    }
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One label.
pub fn label(key: &'static str, value: impl Into<String>) -> Labels {
    vec![(key, value.into())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::hist::LOG2_SLOTS;

    #[test]
    fn counters_merge_duplicate_labels() {
        let mut m = Metrics::default();
        m.counters(
            "tracekit_funccount_calls",
            "Calls",
            vec![
                (label("probe", "a"), 2),
                (label("probe", "b"), 5),
                (label("probe", "a"), 3),
            ],
        );
        let text = m.encode().unwrap();
        assert!(
            text.contains("# TYPE tracekit_funccount_calls counter\n"),
            "{text}"
        );
        assert!(
            text.contains("tracekit_funccount_calls_total{probe=\"a\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("tracekit_funccount_calls_total{probe=\"b\"} 5\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn log2_histogram_buckets_are_cumulative_with_exact_sum() {
        let mut slots = vec![0; LOG2_SLOTS];
        slots[1] = 1; // 0..1 ns
        slots[11] = 4; // 1024..2047 ns
        slots[50] = 2; // beyond 2^40 ns: only in +Inf
        let mut m = Metrics::default();
        m.log2_seconds(
            "tracekit_funclatency",
            "Latency",
            HistUnit::Nsecs,
            vec![(
                label("probe", "f"),
                Log2Hist::from_slots(&slots),
                123_000_000_000,
            )],
        );
        let text = m.encode().unwrap();
        let line = |s: &str| text.lines().any(|l| l == s);
        assert!(
            line("tracekit_funclatency_seconds_count{probe=\"f\"} 7"),
            "{text}"
        );
        assert!(
            line("tracekit_funclatency_seconds_sum{probe=\"f\"} 123.0"),
            "{text}"
        );
        assert!(
            line("tracekit_funclatency_seconds_bucket{le=\"2e-9\",probe=\"f\"} 1"),
            "{text}"
        );
        assert!(
            line("tracekit_funclatency_seconds_bucket{le=\"0.000001024\",probe=\"f\"} 1"),
            "{text}"
        );
        assert!(
            line("tracekit_funclatency_seconds_bucket{le=\"0.000002048\",probe=\"f\"} 5"),
            "{text}"
        );
        assert!(
            line("tracekit_funclatency_seconds_bucket{le=\"+Inf\",probe=\"f\"} 7"),
            "{text}"
        );
        let buckets = text.lines().filter(|l| l.contains("_bucket")).count();
        assert_eq!(buckets, 41, "{text}");
    }

    #[test]
    fn microsecond_slots_keep_bounds_in_seconds() {
        let mut slots = vec![0; LOG2_SLOTS];
        slots[3] = 1; // 4..7 us: le = 8 us
        let v = log2_histogram(&Log2Hist::from_slots(&slots), 5_000, HistUnit::Usecs);
        let Value::Histogram { buckets, .. } = v else {
            panic!()
        };
        assert_eq!(buckets[2], (8e-6, 1));
        assert_eq!(buckets.len(), 31);
    }
}
