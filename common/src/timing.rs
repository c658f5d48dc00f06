//! Where a run's time goes, for the `timing:` line that `--debug` (or
//! `TRACEKIT_TIMING=1`, without the rest of `--debug`) prints when a run ends:
//!
//! ```text
//! timing: exec 1.4 ms, options 0.6 ms, tables 3.1 ms (cache), features 0.4 ms,
//!   load 1.2 ms, attach 1.8 ms, traced 1000 ms, first summary 0.1 ms,
//!   detach 0.2 ms; overhead 8.8 ms
//! ```
//!
//! - `exec`: fork and exec, to the tool's `main`: the CPU time the process had
//!   used by then ([`entered`]), or, when it also waited (a binary read from
//!   disk), from its start time in /proc/self/stat (10 ms resolution);
//! - `options`: from `main` to the session's start (parsing the options,
//!   starting the thread that opens the BPF object);
//! - `tables`: reading what patterns are matched against (the kernel's traceable
//!   functions, binaries' symbols, tracepoint lists), with a note of the source;
//! - `features`: kernel feature probes, wherever they ran;
//! - `load`: the rest of start-up (loading and verifying the BPF object, and
//!   waiting for its opening, which runs beside the options and the plan:
//!   [`crate::object::ahead`]);
//! - `unwind`: building and loading the unwind tables of the processes traced
//!   from the start (stackcount, trace -U; only when user stacks are walked by
//!   them);
//! - `attach`, `detach`: creating and closing the links;
//! - `traced`: from attached to the first summary (the `-i`/`-d` time);
//! - `first summary`: reading and printing it.
//!
//! `overhead` is everything but `traced`: the time the tool adds to the user's wait.
//! The phases are process-wide sums, recorded where they happen ([`span`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Sums per phase, and notes (`tables`: where the table came from).
static SPANS: Mutex<BTreeMap<&'static str, (Duration, Option<String>)>> =
    Mutex::new(BTreeMap::new());

/// Adds `d` to `phase`.
pub fn add(phase: &'static str, d: Duration) {
    let mut s = SPANS.lock().unwrap_or_else(|e| e.into_inner());
    s.entry(phase).or_default().0 += d;
}

/// Runs `f`, adding its time to `phase`.
pub fn span<T>(phase: &'static str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    add(phase, t.elapsed());
    out
}

/// Attaches a note to `phase` (the last note wins).
pub fn note(phase: &'static str, text: impl Into<String>) {
    let mut s = SPANS.lock().unwrap_or_else(|e| e.into_inner());
    s.entry(phase).or_default().1 = Some(text.into());
}

/// The sum recorded for `phase` so far.
pub fn total(phase: &'static str) -> Duration {
    let s = SPANS.lock().unwrap_or_else(|e| e.into_inner());
    s.get(phase).map_or(Duration::ZERO, |v| v.0)
}

fn noted(phase: &'static str) -> Option<String> {
    let s = SPANS.lock().unwrap_or_else(|e| e.into_inner());
    s.get(phase).and_then(|v| v.1.clone())
}

/// Whether TRACEKIT_TIMING asks for the timing line without `--debug`.
pub fn requested() -> bool {
    std::env::var_os("TRACEKIT_TIMING").is_some_and(|v| v != "0")
}

/// The time since boot (CLOCK_BOOTTIME, the clock of /proc/self/stat's start
/// time).
fn boottime() -> Option<Duration> {
    clock(libc::CLOCK_BOOTTIME)
}

/// The tool's `main` entry: when, since boot too, and the CPU time the process
/// had used by then (its fork and exec: a new task's count starts at fork).
struct Entry {
    at: Instant,
    boot: Option<Duration>,
    cpu: Option<Duration>,
}

static ENTRY: OnceLock<Entry> = OnceLock::new();

/// Records the entry of the tool's `main` (first thing in [`crate::run::entry::run`]):
/// three clock reads, for every run, so that the `exec` and `options` phases can
/// be told apart when a line is printed.
pub fn entered() {
    let _ = ENTRY.set(Entry {
        at: Instant::now(),
        boot: boottime(),
        cpu: clock(libc::CLOCK_PROCESS_CPUTIME_ID),
    });
}

/// The time of `main`'s entry since the process started. The CPU time used by
/// then is exact when the exec only computed; the start time in clock ticks
/// bounds a longer wait (for a binary read from disk, say) to within a tick.
fn exec_time(e: &Entry, process_start: Option<(Duration, Duration)>) -> Option<Duration> {
    let waited = e
        .boot
        .zip(process_start)
        .and_then(|(at, (start, tick))| at.checked_sub(start)?.checked_sub(tick));
    match (e.cpu, waited) {
        (Some(cpu), Some(w)) => Some(cpu.max(w)),
        (cpu, w) => cpu.or(w),
    }
}

fn clock(id: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for the call.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return None;
    }
    Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// When this process started (fork/exec), since boot, rounded down to a clock
/// tick, and the tick: /proc/self/stat's start time in clock ticks.
fn process_start() -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    // starttime is field 22; `rest` starts at field 3.
    let ticks: u64 = rest.split(' ').nth(19)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return None;
    }
    Some((
        Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / hz as u64),
        Duration::from_nanos(1_000_000_000 / hz as u64),
    ))
}

/// The marks a session sets as it goes (see the module comment).
#[derive(Debug, Clone)]
pub struct Marks {
    start: Instant,
    /// `features` recorded before the session began (none, usually).
    features_before: Duration,
    attach_start: Option<Instant>,
    attach_end: Option<Instant>,
    /// `features` recorded by the time attaching began.
    features_at_attach: Duration,
    tables_at_attach: Duration,
    summary_start: Option<Instant>,
    summary_end: Option<Instant>,
    detach: Option<Duration>,
}

impl Marks {
    pub fn start() -> Marks {
        Marks {
            start: Instant::now(),
            features_before: total("features"),
            attach_start: None,
            attach_end: None,
            features_at_attach: Duration::ZERO,
            tables_at_attach: Duration::ZERO,
            summary_start: None,
            summary_end: None,
            detach: None,
        }
    }

    pub fn attach_start(&mut self) {
        if self.attach_start.is_none() {
            self.attach_start = Some(Instant::now());
            self.features_at_attach = total("features");
            self.tables_at_attach = total("tables");
        }
    }

    pub fn attach_end(&mut self) {
        self.attach_start();
        self.attach_end = Some(Instant::now());
    }

    /// When attaching ended, if it did.
    pub fn attached_at(&self) -> Option<Instant> {
        self.attach_end
    }

    /// Attaching happened inside the load phase, `d` in all (tools with fixed
    /// programs load and attach trial by trial).
    pub fn attached_within(&mut self, d: Duration) {
        let now = Instant::now();
        self.attach_start = Some(now.checked_sub(d).unwrap_or(now).max(self.start));
        self.features_at_attach = total("features");
        self.tables_at_attach = total("tables");
        self.attach_end = Some(now);
    }

    /// Times the first call of a summary (later ones are not start-up).
    pub fn summary<T>(&mut self, f: impl FnOnce() -> T) -> T {
        if self.summary_start.is_some() {
            return f();
        }
        self.summary_start = Some(Instant::now());
        let out = f();
        self.summary_end = Some(Instant::now());
        out
    }

    pub fn detached(&mut self, d: Duration) {
        self.detach = Some(d);
    }

    /// The `timing:` line (with its newline).
    pub fn line(&self) -> String {
        let ms = |d: Duration| {
            let v = d.as_secs_f64() * 1000.0;
            if v < 10.0 {
                format!("{v:.1} ms")
            } else {
                format!("{v:.0} ms")
            }
        };
        let mut s = String::from("timing:");
        let mut overhead = Duration::ZERO;
        let item = |s: &mut String, name: &str, d: Duration, note: Option<String>| {
            let _ = write!(s, " {name} {}", ms(d));
            if let Some(n) = note {
                let _ = write!(s, " ({n})");
            }
            s.push(',');
        };
        // Every tool's entry records it (a unit test's process has none).
        if let Some(e) = ENTRY.get() {
            if let Some(exec) = exec_time(e, process_start()) {
                item(&mut s, "exec", exec, None);
                overhead += exec;
            }
            let options = self.start.saturating_duration_since(e.at);
            item(&mut s, "options", options, None);
            overhead += options;
        }
        let tables = self.tables_at_attach;
        let features = self.features_at_attach.saturating_sub(self.features_before);
        item(&mut s, "tables", tables, noted("tables"));
        item(&mut s, "features", features, None);
        if let (Some(a0), Some(a1)) = (self.attach_start, self.attach_end) {
            // Attaching itself may probe features (counted there, not here).
            let attach_features = total("features").saturating_sub(self.features_at_attach);
            let unwind = total("unwind");
            let load = (a0 - self.start).saturating_sub(tables + features + unwind);
            let attach = (a1 - a0).saturating_sub(attach_features);
            item(&mut s, "load", load, noted("load"));
            if !unwind.is_zero() {
                item(&mut s, "unwind", unwind, None);
            }
            item(&mut s, "attach", attach, None);
            overhead += a1 - self.start;
            if let (Some(s0), Some(s1)) = (self.summary_start, self.summary_end) {
                item(&mut s, "traced", s0 - a1, None);
                item(&mut s, "first summary", s1 - s0, None);
                overhead += s1 - s0;
            }
        }
        if let Some(d) = self.detach {
            item(&mut s, "detach", d, None);
            overhead += d;
        }
        s.pop();
        let _ = writeln!(s, "; overhead {}", ms(overhead));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_start_is_in_the_past() {
        let (start, _) = process_start().expect("readable /proc/self/stat");
        let d = boottime().expect("CLOCK_BOOTTIME") - start;
        assert!(d < Duration::from_secs(24 * 3600), "{d:?}");
    }

    #[test]
    fn exec_is_the_cpu_time_unless_the_start_time_says_it_waited() {
        let ms = Duration::from_millis;
        let entry = |boot: u64, cpu: u64| Entry {
            at: Instant::now(),
            boot: Some(ms(boot)),
            cpu: Some(ms(cpu)),
        };
        // Started at 1000 ms since boot (rounded down to a 10 ms tick).
        let start = Some((ms(1000), ms(10)));
        // Entered 8 ms after the start tick, 3 ms of CPU: within a tick, the CPU time.
        assert_eq!(exec_time(&entry(1008, 3), start), Some(ms(3)));
        // Entered 250 ms after it: it waited, at least 240 ms.
        assert_eq!(exec_time(&entry(1250, 3), start), Some(ms(240)));
        // No start time: the CPU time; no CPU time: the start time's bound.
        assert_eq!(exec_time(&entry(1250, 3), None), Some(ms(3)));
        let no_cpu = Entry {
            cpu: None,
            ..entry(1250, 0)
        };
        assert_eq!(exec_time(&no_cpu, start), Some(ms(240)));
    }

    #[test]
    fn line_names_every_phase() {
        let mut m = Marks::start();
        add("tables", Duration::from_millis(3));
        note("tables", "cache");
        m.attach_start();
        m.attach_end();
        m.summary(|| ());
        m.detached(Duration::from_millis(2));
        let l = m.line();
        for p in [
            "tables",
            "(cache)",
            "features",
            "load",
            "attach",
            "traced",
            "first summary",
            "detach 2.0 ms",
            "overhead",
        ] {
            assert!(l.contains(p), "{p} missing from {l}");
        }
        assert!(l.ends_with('\n'));
    }
}
