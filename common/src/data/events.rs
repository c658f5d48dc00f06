//! Per-event records from BPF (bpf/events.h): one ring buffer whose records are
//! decoded as the tool's skeleton type (`plain`), formatted into lines that are
//! written once per poll, and a lost-record counter kept in the kernel.
//!
//! ```text
//! unsafe impl plain::Plain for skel::types::event {}
//! open.maps.events.set_max_entries(events::ring_bytes()?)?;
//! let mut ev = Events::new(&skel.maps.events, &skel.maps.events_lost, |e: &types::event, out| {
//!     writeln!(out, "...")?; Ok(())
//! })?;
//! session.run(Schedule { interval: None, duration }, &mut Streamed { events: &mut ev, tool })?;
//! ```

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use libbpf_rs::{MapCore, RingBuffer, RingBufferBuilder};
use plain::Plain;

use crate::data::counters::PerCpuCounters;
use crate::diag::warn;
use crate::output::emit;
use crate::serve::http::Served;
use crate::serve::metrics::Metrics;

/// The ring buffer's size unless `TRACEKIT_RING_BYTES` says otherwise: 1 MiB
/// holds ~16,000 records of 64 bytes, well over a second of a busy disk.
pub const DEFAULT_RING_BYTES: u32 = 1 << 20;

/// Environment variable setting the ring buffer's size in bytes (a power of two,
/// at least a page): tests shrink it to make records get lost.
pub const RING_BYTES_ENV: &str = "TRACEKIT_RING_BYTES";

/// The ring buffer size to set before load (see [`RING_BYTES_ENV`]).
pub fn ring_bytes() -> Result<u32> {
    let Ok(v) = std::env::var(RING_BYTES_ENV) else {
        return Ok(DEFAULT_RING_BYTES);
    };
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u32;
    match v.trim().parse::<u32>() {
        Ok(n) if n.is_power_of_two() && n >= page => Ok(n),
        _ => bail!(
            "{RING_BYTES_ENV}={}: the ring buffer size must be a power of two of at least {page} bytes",
            crate::diag::escape(&v)
        ),
    }
}

/// `events_wakeup_bytes` for a ring of `ring` bytes (bpf/events.h): the reader
/// is woken when a CPU has added a sixteenth of the buffer over the CPUs (so at
/// most a sixteenth waits unseen), and otherwise finds the records at its next
/// look, within 100 ms ([`Events::poll`]).
pub fn wakeup_bytes(ring: u32) -> u64 {
    let cpus = libbpf_rs::num_possible_cpus().map_or(1, |n| n.max(1)) as u64;
    (u64::from(ring / 16) / cpus).max(1)
}

type Failure = Rc<RefCell<Option<anyhow::Error>>>;

/// The reader of a tool's `events` ring buffer and `events_lost` counter.
pub struct Events<'a> {
    rb: RingBuffer<'a>,
    out: Rc<RefCell<String>>,
    failed: Failure,
    lost: PerCpuCounters,
    lost_total: u64,
    ring: u32,
    last_report: Instant,
    /// trace's words for lost records are BCC's trace's ([`Events::in_bccs_words`]).
    bccs_words: bool,
}

impl<'a> Events<'a> {
    /// Reads records of type `T` from `ring`, each handed to `on` with the text
    /// to append its output to; `lost` is the `events_lost` map. Records shorter
    /// than `T` are an error (the object and the tool disagree).
    pub fn new<T: Plain + 'a>(
        ring: &'a dyn MapCore,
        lost: &dyn MapCore,
        mut on: impl FnMut(&T, &mut String) -> Result<()> + 'a,
    ) -> Result<Self> {
        Self::new_raw(
            ring,
            lost,
            move |data: &[u8], out: &mut String| match plain::from_bytes::<T>(data) {
                Ok(e) => on(e, out),
                Err(e) => Err(anyhow!(
                    "internal error: a {}-byte record does not decode as a {}-byte event ({e:?})",
                    data.len(),
                    size_of::<T>()
                )),
            },
        )
    }

    /// As [`Events::new`], for records of varying length (a fixed header and
    /// what follows it): `on` gets each record's bytes.
    pub fn new_raw(
        ring: &'a dyn MapCore,
        lost: &dyn MapCore,
        mut on: impl FnMut(&[u8], &mut String) -> Result<()> + 'a,
    ) -> Result<Self> {
        let out = Rc::new(RefCell::new(String::new()));
        let failed: Failure = Rc::new(RefCell::new(None));
        let (o, f) = (out.clone(), failed.clone());
        let mut b = RingBufferBuilder::new();
        b.add(ring, move |data: &[u8]| {
            match on(data, &mut o.borrow_mut()) {
                Ok(()) => 0,
                Err(e) => {
                    *f.borrow_mut() = Some(e);
                    -1
                }
            }
        })?;
        Ok(Events {
            rb: b.build()?,
            out,
            failed,
            lost: PerCpuCounters::new(lost, 1)?,
            lost_total: 0,
            ring: ring.max_entries(),
            last_report: Instant::now(),
            bccs_words: false,
        })
    }

    /// Waits up to `timeout` for a wakeup, handles every record that is there
    /// (also those that did not wake the reader), and writes their output in one
    /// piece.
    pub fn poll(&mut self, timeout: Duration) -> Result<()> {
        let rc = self.rb.poll_raw(timeout);
        let rc = if rc < 0 { rc } else { self.rb.consume_raw() };
        self.after(rc)
    }

    /// Handles every record already in the buffer, without waiting.
    pub fn drain(&mut self) -> Result<()> {
        let rc = self.rb.consume_raw();
        self.after(rc)
    }

    fn after(&mut self, rc: i32) -> Result<()> {
        let mut text = std::mem::take(&mut *self.out.borrow_mut());
        if !text.is_empty() {
            emit(&text)?;
            // The next batch reuses the buffer rather than growing a new one.
            text.clear();
            *self.out.borrow_mut() = text;
        }
        if let Some(e) = self.failed.borrow_mut().take() {
            return Err(e);
        }
        // A signal interrupting the wait is how a run ends, not an error.
        if rc < 0 && rc != -libc::EINTR {
            bail!(
                "reading the ring buffer: {}",
                std::io::Error::from_raw_os_error(-rc)
            );
        }
        Ok(())
    }

    /// Reports lost records as BCC's trace does ("Possibly lost N samples", on a
    /// line of its own, and no total at the end), which scripts written for it read.
    pub fn in_bccs_words(mut self) -> Self {
        self.bccs_words = true;
        self
    }

    /// Records lost (the buffer was full) since the previous call.
    pub fn lost(&mut self) -> Result<u64> {
        let n = self.lost.deltas()?.iter().sum::<u64>();
        self.lost_total += n;
        Ok(n)
    }

    /// Records lost since the run began.
    pub fn lost_total(&self) -> u64 {
        self.lost_total
    }

    /// Warns on stderr about records lost since the last warning; during a run
    /// (`final_ == false`) at most once a second.
    pub fn report_lost(&mut self, final_: bool) -> Result<()> {
        if !final_ && self.last_report.elapsed() < Duration::from_secs(1) {
            return Ok(());
        }
        self.last_report = Instant::now();
        let n = self.lost()?;
        if self.bccs_words {
            if n > 0 {
                crate::diag::stderr(&format!("Possibly lost {n} samples\n"));
            }
            return Ok(());
        }
        if n > 0 {
            warn(&format!(
                "lost {n} event{}: the {} KiB ring buffer was full (the reader fell behind)",
                if n == 1 { "" } else { "s" },
                self.ring / 1024
            ));
        }
        if final_ && self.lost_total > n {
            warn(&format!("lost {} events in all", self.lost_total));
        }
        Ok(())
    }
}

/// A per-event tool's run: `events` read while the run waits (lost records
/// reported at most once a second, and once more at the end), `tool` serving
/// `--listen` and printing each event as it comes.
pub struct Streamed<'a, 'b> {
    pub events: &'a mut Events<'b>,
    pub tool: &'a mut dyn Served,
}

impl Served for Streamed<'_, '_> {
    fn print(&mut self, last: bool) -> Result<()> {
        self.tool.print(last)
    }
    fn metrics(&mut self, m: &mut Metrics) -> Result<()> {
        self.tool.metrics(m)
    }
    fn summary(&mut self) -> Result<serde_json::Value> {
        self.tool.summary()
    }
    fn reset(&mut self) -> Result<()> {
        self.tool.reset()
    }
    fn folded(&mut self) -> Option<Result<String>> {
        self.tool.folded()
    }
    fn polls(&self) -> bool {
        true
    }
    fn poll(&mut self, timeout: Duration) -> Result<()> {
        self.events.poll(timeout)?;
        self.events.report_lost(false)
    }
    fn drain(&mut self) -> Result<()> {
        self.events.drain()?;
        self.events.report_lost(true)
    }
    fn lost(&self) -> Option<u64> {
        Some(self.events.lost_total())
    }
    fn prints_summaries(&self) -> bool {
        self.tool.prints_summaries()
    }
}

/// Converts BPF timestamps (`bpf_ktime_get_ns`, CLOCK_MONOTONIC) into seconds
/// and wall-clock time, by the offset between the two clocks at start.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// CLOCK_REALTIME - CLOCK_MONOTONIC, in ns.
    offset_ns: i128,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    pub fn new() -> Clock {
        let ns = |id| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: valid out-pointer.
            unsafe { libc::clock_gettime(id, &mut ts) };
            ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
        };
        let mono = ns(libc::CLOCK_MONOTONIC);
        let real = ns(libc::CLOCK_REALTIME);
        Clock {
            offset_ns: real - mono,
        }
    }

    /// A BPF timestamp in seconds (BCC's TIME(s) column).
    pub fn secs(ts_ns: u64) -> f64 {
        ts_ns as f64 / 1e9
    }

    /// A BPF timestamp as seconds since the Unix epoch.
    pub fn unix(&self, ts_ns: u64) -> f64 {
        (ts_ns as i128 + self.offset_ns) as f64 / 1e9
    }

    /// A BPF timestamp as local time, `HH:MM:SS.uuuuuu`.
    pub fn local(&self, ts_ns: u64) -> String {
        let wall = ts_ns as i128 + self.offset_ns;
        let secs = wall.div_euclid(1_000_000_000) as libc::time_t;
        let micros = wall.rem_euclid(1_000_000_000) / 1000;
        // SAFETY: localtime_r with valid pointers.
        let tm = unsafe {
            let mut tm: libc::tm = std::mem::zeroed();
            libc::localtime_r(&secs, &mut tm);
            tm
        };
        format!(
            "{:02}:{:02}:{:02}.{:06}",
            tm.tm_hour, tm.tm_min, tm.tm_sec, micros
        )
    }
}
