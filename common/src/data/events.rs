//! Per-event records from BPF (bpf/events.h): one ring buffer whose records are
//! decoded as the tool's skeleton type (`plain`), formatted into lines that are
//! written once per batch of records ([`BATCH`]), and a lost-record counter kept
//! in the kernel. A reader that falls behind stays bounded and stoppable: it
//! never takes more than a batch before writing, nor more than [`BUDGET`] before
//! its run loop looks for a stop; what it cannot keep up with is lost in the
//! kernel, counted, and reported.
//!
//! ```text
//! unsafe impl plain::Plain for skel::types::event {}
//! open.maps.events.set_max_entries(events::ring_bytes()?)?;
//! let mut ev = Events::new(&skel.maps.events, &skel.maps.events_lost, |e: &types::event, out| {
//!     writeln!(out, "...")?; Ok(())
//! })?;
//! session.run(Schedule { interval: None, duration }, &mut Streamed { events: &mut ev, tool })?;
//! ```

use std::cell::{Cell, RefCell};
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

/// Records handled between two writes of their output: a reader's memory is
/// at most one batch's text, whatever the rate (a JSON line with a stack is
/// ~2 KiB).
pub const BATCH: usize = 512;

/// A batch also ends when it has taken this long, so that the first lines of
/// a slow format (stacks to symbolize) are written at once (`| head -1`).
const BATCH_TIME: Duration = Duration::from_millis(10);

/// The longest a reader handles records before it returns to its loop (which
/// then looks for a stop, answers `--listen` and prints summaries).
pub const BUDGET: Duration = Duration::from_millis(50);

/// Waits up to `timeout` until `rb` has data, without consuming any (libbpf's
/// `ring_buffer__poll` would consume all of it, however much keeps coming).
/// `Err(-errno)` for a failed wait; a signal ends it as a timeout does.
pub fn wait_readable(rb: &RingBuffer, timeout: Duration) -> std::result::Result<(), i32> {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid epoll_event for the kernel to fill.
    let rc = unsafe { libc::epoll_wait(rb.epoll_fd(), &mut ev, 1, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if e != libc::EINTR {
            return Err(-e);
        }
    }
    Ok(())
}

/// Bytes the ring buffer of `rb` holds that its reader has not consumed.
fn avail_bytes(rb: &RingBuffer, index: u32) -> u64 {
    use libbpf_rs::AsRawLibbpf;
    // SAFETY: `rb` is a live ring_buffer whose rings (`index` among them) live
    // as long as it.
    unsafe {
        let ring = libbpf_sys::ring_buffer__ring(rb.as_libbpf_object().as_ptr(), index);
        if ring.is_null() {
            return 0;
        }
        libbpf_sys::ring__avail_data_size(ring) as u64
    }
}

/// The room a record of `len` bytes takes in a ring buffer: an 8-byte header,
/// and the whole rounded up to 8 (the kernel's BPF_RINGBUF_HDR_SZ and alignment).
fn record_bytes(len: usize) -> u64 {
    (len as u64 + 8 + 7) & !7
}

/// What the ring buffer's callback and the reader share.
struct Batch {
    /// The batch's output, written when it ends.
    out: RefCell<String>,
    /// The tool's error for a record, which ends the run.
    failed: RefCell<Option<anyhow::Error>>,
    /// When the batch began; it ends after [`BATCH_TIME`] (`cut`).
    began: Cell<Instant>,
    cut: Cell<bool>,
    /// Bytes of the buffer the records handled took ([`Events::drain`]).
    taken: Cell<u64>,
    /// Records are counted in `unread`, not handled (the end of [`Events::drain`]).
    skip: Cell<bool>,
    unread: Cell<u64>,
}

/// What a callback returns to end libbpf's consume early: the record is taken,
/// and `Batch::cut` tells this from an error.
const CUT: i32 = -libc::ECANCELED;

/// A second ring read with the events, and what takes its records.
pub type SideRing<'a> = (&'a dyn MapCore, Box<dyn FnMut(&[u8]) + 'a>);

/// The reader of a tool's `events` ring buffer and `events_lost` counter.
pub struct Events<'a> {
    rb: RingBuffer<'a>,
    /// The events' ring among `rb`'s (after a side ring: see new_raw_with).
    ring_index: u32,
    batch: Rc<Batch>,
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
        on: impl FnMut(&[u8], &mut String) -> Result<()> + 'a,
    ) -> Result<Self> {
        Self::new_raw_with(ring, lost, on, None)
    }

    /// As [`Events::new_raw`], also reading `side`: a second ring of the
    /// object whose records `side_on` takes (as bpf/unwind.h's requests for a
    /// process' tables), in the same polls.
    pub fn new_raw_with(
        ring: &'a dyn MapCore,
        lost: &dyn MapCore,
        mut on: impl FnMut(&[u8], &mut String) -> Result<()> + 'a,
        side: Option<SideRing<'a>>,
    ) -> Result<Self> {
        let batch = Rc::new(Batch {
            out: RefCell::new(String::new()),
            failed: RefCell::new(None),
            began: Cell::new(Instant::now()),
            cut: Cell::new(false),
            taken: Cell::new(0),
            skip: Cell::new(false),
            unread: Cell::new(0),
        });
        let b = batch.clone();
        let mut builder = RingBufferBuilder::new();
        // The side ring first: libbpf consumes the rings in the order added,
        // up to a batch in all, and under a flood of events a side ring after
        // them was never reached (trace -U: a new process's tables were never
        // loaded, and its every stack was cut).
        let ring_index = u32::from(side.is_some());
        if let Some((ring, mut side_on)) = side {
            builder.add(ring, move |data: &[u8]| {
                side_on(data);
                0
            })?;
        }
        builder.add(ring, move |data: &[u8]| {
            b.taken.set(b.taken.get() + record_bytes(data.len()));
            if b.skip.get() {
                b.unread.set(b.unread.get() + 1);
                return 0;
            }
            if let Err(e) = on(data, &mut b.out.borrow_mut()) {
                *b.failed.borrow_mut() = Some(e);
                return -1;
            }
            if b.began.get().elapsed() >= BATCH_TIME {
                b.cut.set(true);
                return CUT;
            }
            0
        })?;
        Ok(Events {
            rb: builder.build()?,
            ring_index,
            batch,
            lost: PerCpuCounters::new(lost, 1)?,
            lost_total: 0,
            ring: ring.max_entries(),
            last_report: Instant::now(),
            bccs_words: false,
        })
    }

    /// Waits up to `timeout` for a wakeup, then handles what the buffer holds
    /// (also records that did not wake the reader) in batches, writing each
    /// batch's output before the next, for at most [`BUDGET`] or until a stop
    /// is requested: a reader that falls behind a flood goes on answering
    /// signals and holds one batch's text, and what it cannot take is counted
    /// by the kernel as lost.
    pub fn poll(&mut self, timeout: Duration) -> Result<()> {
        if let Err(e) = wait_readable(&self.rb, timeout) {
            return self.after(e).map(drop);
        }
        let started = Instant::now();
        while self.batch()? && started.elapsed() < BUDGET && !crate::stop::Stop::requested() {}
        Ok(())
    }

    /// At the end of the run: handles what the buffer held when the run stopped
    /// (its bytes counted at the start), in batches. Records made after that
    /// (probes still fire until they are detached) belong after the stop. When
    /// someone asked for the stop (a signal, `POST /stop`, a closed output)
    /// and printing takes longer than [`BUDGET`], the rest is counted unread
    /// rather than printed, and reported with the losses: the stop is prompt
    /// however slowly records render.
    pub fn drain(&mut self) -> Result<()> {
        let held = avail_bytes(&self.rb, self.ring_index);
        let asked = crate::stop::Stop::global()
            .and_then(|s| s.reason())
            .is_some_and(|r| {
                use crate::stop::StopReason::*;
                matches!(r, Signal | Requested | OutputClosed)
            });
        let started = Instant::now();
        self.batch.taken.set(0);
        loop {
            if asked && started.elapsed() >= BUDGET {
                self.batch.skip.set(true);
            }
            if !self.batch()? || self.batch.taken.get() >= held {
                self.batch.skip.set(false);
                return Ok(());
            }
        }
    }

    /// Handles one batch and writes its output; whether the batch was full
    /// (more may wait).
    fn batch(&mut self) -> Result<bool> {
        self.batch.began.set(Instant::now());
        let rc = self.rb.consume_raw_n(BATCH);
        self.after(rc)
    }

    fn after(&mut self, rc: i32) -> Result<bool> {
        let b = &self.batch;
        let mut text = std::mem::take(&mut *b.out.borrow_mut());
        if !text.is_empty() {
            emit(&text)?;
            // The next batch reuses the buffer rather than growing a new one.
            text.clear();
            *b.out.borrow_mut() = text;
        }
        if let Some(e) = b.failed.borrow_mut().take() {
            return Err(e);
        }
        if b.cut.replace(false) {
            return Ok(true);
        }
        // A signal interrupting the wait is how a run ends, not an error.
        if rc < 0 && rc != -libc::EINTR {
            bail!(
                "reading the ring buffer: {}",
                std::io::Error::from_raw_os_error(-rc)
            );
        }
        Ok(rc >= BATCH as i32)
    }

    /// Reports lost records as BCC's trace does ("Possibly lost N samples", on a
    /// line of its own, and no total at the end), which scripts written for it read.
    pub fn in_bccs_words(mut self) -> Self {
        self.bccs_words = true;
        self
    }

    /// Records lost (the buffer was full, or the run stopped before they were
    /// read) since the previous call.
    pub fn lost(&mut self) -> Result<u64> {
        let n = self.lost.deltas()?.iter().sum::<u64>() + self.batch.unread.take();
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
        let unread = self.batch.unread.get();
        let n = self.lost()?;
        if self.bccs_words {
            if n > 0 {
                crate::diag::stderr(&format!("Possibly lost {n} samples\n"));
            }
            return Ok(());
        }
        let full = n - unread;
        let s = |n: u64| if n == 1 { "" } else { "s" };
        if full > 0 {
            warn(&format!(
                "lost {full} event{}: the {} KiB ring buffer was full (the reader fell behind)",
                s(full),
                self.ring / 1024
            ));
        }
        if unread > 0 {
            warn(&format!(
                "lost {unread} event{}: the run was stopped before they were printed",
                s(unread)
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
