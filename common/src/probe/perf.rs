//! Sampling and counter sources, in bpftrace's words: `profile:hz:N` (and
//! `s`, `ms`, `us`: timed samples on every CPU), `software:EVENT[:PERIOD]` and
//! `hardware:EVENT[:PERIOD]` (the kernel's software events and the PMU's
//! generalized ones, or a raw PMU event `rXXXX`). Parsed into the perf event
//! each stands for; opening it is `attach/`'s.

use anyhow::{bail, Result};

/// perf_event_attr's `type` values (linux/perf_event.h, user ABI).
pub const PERF_TYPE_HARDWARE: u32 = 0;
pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_TYPE_RAW: u32 = 4;

/// The software event behind `profile:` (PERF_COUNT_SW_CPU_CLOCK).
const SW_CPU_CLOCK: u64 = 0;

/// How often a perf event samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Every {
    /// `sample_freq` per second (the kernel adjusts the period to reach it).
    Hz(u64),
    /// Every `sample_period` events (nanoseconds for the clock events).
    Period(u64),
}

/// Which family a source is of, for messages and the banner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Profile,
    Software,
    Hardware,
}

/// A sampling or counter source.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PerfSource {
    pub family: Family,
    /// perf_event_attr's type and config.
    pub type_: u32,
    pub config: u64,
    pub every: Every,
    /// The source with its event's canonical name and the period used:
    /// `profile:hz:99`, `software:page-faults:100`, `hardware:r01c2:100000`.
    pub name: String,
}

impl PerfSource {
    /// The period or frequency, in words (the banner, --debug, --json).
    pub fn rate(&self) -> String {
        match self.every {
            Every::Hz(n) => format!("{n} Hz"),
            Every::Period(n) if self.type_ == PERF_TYPE_SOFTWARE && self.config == SW_CPU_CLOCK => {
                format!("every {}", ns_text(n))
            }
            Every::Period(1) => "every event".into(),
            Every::Period(n) => format!("every {n} events"),
        }
    }
}

fn ns_text(ns: u64) -> String {
    match ns {
        n if n % 1_000_000_000 == 0 => format!("{} s", n / 1_000_000_000),
        n if n % 1_000_000 == 0 => format!("{} ms", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{} us", n / 1_000),
        n => format!("{n} ns"),
    }
}

/// Software events: bpftrace's names and aliases, the kernel's config, and
/// bpftrace's default period.
const SOFTWARE: &[(&[&str], u64, u64)] = &[
    (&["cpu-clock", "cpu"], 0, 1_000_000),
    (&["task-clock"], 1, 1_000_000),
    (&["page-faults", "faults"], 2, 100),
    (&["context-switches", "cs"], 3, 1_000),
    (&["cpu-migrations"], 4, 1),
    (&["minor-faults"], 5, 100),
    (&["major-faults"], 6, 1),
    (&["alignment-faults"], 7, 1),
    (&["emulation-faults"], 8, 1),
    (&["dummy"], 9, 1),
    (&["bpf-output"], 10, 1),
];

/// Hardware events, as [`SOFTWARE`]. frontend-stalls and backend-stalls are
/// the kernel's stalled-cycles-frontend/backend.
const HARDWARE: &[(&[&str], u64, u64)] = &[
    (&["cpu-cycles", "cycles"], 0, 1_000_000),
    (&["instructions"], 1, 1_000_000),
    (&["cache-references"], 2, 1_000_000),
    (&["cache-misses"], 3, 1_000_000),
    (&["branch-instructions", "branches"], 4, 100_000),
    (&["branch-misses"], 5, 100_000),
    (&["bus-cycles"], 6, 100_000),
    (&["frontend-stalls"], 7, 1_000_000),
    (&["backend-stalls"], 8, 1_000_000),
    (&["ref-cycles"], 9, 1_000_000),
];

/// Whether `first` (a spec's first `:`-separated part) names a perf source.
pub fn is_perf(first: &str) -> bool {
    matches!(first, "profile" | "software" | "hardware")
}

/// Parses the parts of a `profile:`, `software:` or `hardware:` spec.
pub fn parse(parts: &[&str]) -> Result<PerfSource> {
    let number = |s: &str, what: &str| -> Result<u64> {
        match s.parse::<u64>() {
            Ok(0) => bail!("{what} must be above 0"),
            Ok(n) => Ok(n),
            Err(_) => bail!("{what} '{s}' is not a whole number"),
        }
    };
    match parts {
        ["profile", unit, n] => {
            let n = number(n, "the rate")?;
            let every = match *unit {
                "hz" => Every::Hz(n),
                "s" => Every::Period(n.saturating_mul(1_000_000_000)),
                "ms" => Every::Period(n.saturating_mul(1_000_000)),
                "us" => Every::Period(n.saturating_mul(1_000)),
                u => bail!("profile's unit must be hz, s, ms or us, not '{u}'"),
            };
            Ok(PerfSource {
                family: Family::Profile,
                type_: PERF_TYPE_SOFTWARE,
                config: SW_CPU_CLOCK,
                every,
                name: format!("profile:{unit}:{n}"),
            })
        }
        ["profile", ..] => bail!("profile takes a unit and a rate: profile:hz:99, profile:ms:10"),
        [family @ ("software" | "hardware"), event, rest @ ..] => {
            let period = match rest {
                [] => None,
                [p] => Some(number(p, "the period")?),
                _ => bail!("{family}:EVENT[:PERIOD] has at most three parts"),
            };
            let (fam, type_, table) = match *family {
                "software" => (Family::Software, PERF_TYPE_SOFTWARE, SOFTWARE),
                _ => (Family::Hardware, PERF_TYPE_HARDWARE, HARDWARE),
            };
            if let (Family::Hardware, Some(hex)) = (fam, event.strip_prefix('r')) {
                if let Ok(config) = u64::from_str_radix(hex, 16) {
                    let period = period.unwrap_or(1_000_000);
                    return Ok(PerfSource {
                        family: fam,
                        type_: PERF_TYPE_RAW,
                        config,
                        every: Every::Period(period),
                        name: format!("hardware:r{hex}:{period}"),
                    });
                }
            }
            let Some((names, config, default)) =
                table.iter().find(|(names, ..)| names.contains(event))
            else {
                let known: Vec<&str> = table.iter().map(|(n, ..)| n[0]).collect();
                let raw = match fam {
                    Family::Hardware => ", or a raw PMU event rXXXX (hex)",
                    _ => "",
                };
                bail!(
                    "unknown {family} event '{event}': use {}{raw}",
                    known.join(", ")
                );
            };
            let period = period.unwrap_or(*default);
            Ok(PerfSource {
                family: fam,
                type_,
                config: *config,
                every: Every::Period(period),
                name: format!("{family}:{}:{period}", names[0]),
            })
        }
        [family, ..] => bail!("{family} takes an event: {family}:EVENT[:PERIOD]"),
        [] => bail!("an empty probe"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PerfSource {
        parse(&s.split(':').collect::<Vec<_>>()).unwrap()
    }

    fn err(s: &str) -> String {
        parse(&s.split(':').collect::<Vec<_>>())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn profile_rates() {
        let s = p("profile:hz:99");
        assert_eq!((s.type_, s.config, s.every), (1, 0, Every::Hz(99)));
        assert_eq!(s.rate(), "99 Hz");
        assert_eq!(p("profile:ms:10").every, Every::Period(10_000_000));
        assert_eq!(p("profile:ms:10").rate(), "every 10 ms");
        assert_eq!(p("profile:us:250").every, Every::Period(250_000));
        assert_eq!(p("profile:s:1").every, Every::Period(1_000_000_000));
        assert!(err("profile:hz:0").contains("above 0"));
        assert!(err("profile:min:1").contains("hz, s, ms or us"));
        assert!(err("profile:hz").contains("profile:hz:99"));
    }

    #[test]
    fn software_names_aliases_and_periods() {
        let s = p("software:cs");
        assert_eq!((s.type_, s.config, s.every), (1, 3, Every::Period(1000)));
        assert_eq!(s.name, "software:context-switches:1000");
        assert_eq!(p("software:faults:1").config, 2);
        assert_eq!(p("software:page-faults:1").every, Every::Period(1));
        assert_eq!(p("software:page-faults:1").rate(), "every event");
        assert_eq!(p("software:cs").rate(), "every 1000 events");
        assert_eq!(p("software:major-faults").every, Every::Period(1));
        assert!(err("software:nope").starts_with("unknown software event 'nope': use cpu-clock"));
        assert!(err("software:cs:x").contains("not a whole number"));
    }

    #[test]
    fn hardware_names_and_raw_events() {
        let s = p("hardware:cycles");
        assert_eq!(
            (s.type_, s.config, s.every),
            (0, 0, Every::Period(1_000_000))
        );
        assert_eq!(s.name, "hardware:cpu-cycles:1000000");
        assert_eq!(p("hardware:branches").config, 4);
        assert_eq!(p("hardware:backend-stalls").config, 8);
        let r = p("hardware:r01c2:100000");
        assert_eq!(
            (r.type_, r.config, r.every),
            (4, 0x1c2, Every::Period(100_000))
        );
        assert!(err("hardware:rzz").contains("raw PMU event rXXXX"));
    }
}
