//! The interval/duration schedule of summaries: when each is printed, counted from
//! the end of attaching, and the loop that waits for it or for a stop request.

use std::time::{Duration, Instant};

use anyhow::Result;

#[cfg(test)]
use crate::stop::Stop;
use crate::stop::StopReason;

/// When summaries are printed: every `interval`, and at the end of `duration`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Schedule {
    pub interval: Option<Duration>,
    pub duration: Option<Duration>,
}

impl Schedule {
    /// A per-event tool's run: no interval, until `duration` (`-d`) if given.
    pub fn lasting(duration: Option<Duration>) -> Schedule {
        Schedule {
            interval: None,
            duration,
        }
    }
}

/// Runs until stopped, calling `summary(is_final)` at each interval and once at the
/// end. With only a duration there is one summary, at its end (BCC semantics).
///
/// Intervals and the duration count from `since`, when tracing began (the end of
/// attaching): `-d 1` counts events for one second, not one second plus the time
/// it took to print the banner. The session's loop is [`run_loop_with`]; this
/// plain wait is the tests'.
#[cfg(test)]
pub fn run_loop(
    since: Instant,
    schedule: Schedule,
    stop: &Stop,
    summary: impl FnMut(bool) -> Result<()>,
) -> Result<StopReason> {
    run_loop_with(
        since,
        schedule,
        |deadline| Ok(stop.wait_until(deadline)),
        summary,
    )
}

/// The summary loop (`run_loop` in the tests) with the waiting done by `wait(deadline)`, which must return at the
/// deadline (`None`) or on a stop request (its reason), or fail; the session uses
/// it to serve a ring buffer and `--listen` meanwhile (see [`crate::stop::Stop::poll_until`]).
pub fn run_loop_with(
    since: Instant,
    schedule: Schedule,
    mut wait: impl FnMut(Option<Instant>) -> Result<Option<StopReason>>,
    mut summary: impl FnMut(bool) -> Result<()>,
) -> Result<StopReason> {
    let end = schedule.duration.map(|d| since + d);
    let mut next = schedule.interval.map(|i| since + i);
    loop {
        let wake = match (next, end) {
            (Some(n), Some(e)) => Some(n.min(e)),
            (n, e) => n.or(e),
        };
        if let Some(reason) = wait(wake)? {
            summary(true)?;
            return Ok(reason);
        }
        let now = Instant::now();
        if end.is_some_and(|e| now >= e) {
            summary(true)?;
            return Ok(StopReason::Duration);
        }
        summary(false)?;
        if let (Some(n), Some(i)) = (next.as_mut(), schedule.interval) {
            // Keep to the original cadence; skip ticks missed while printing.
            while *n <= now {
                *n += i;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which summaries a run with 30 ms intervals and a 100 ms duration prints
    /// (`true`: the final one) when tracing began `ago`.
    fn summaries(ago: Duration) -> Vec<bool> {
        let stop = Stop::new();
        let mut finals = Vec::new();
        let why = run_loop(
            Instant::now() - ago,
            Schedule {
                interval: Some(Duration::from_millis(30)),
                duration: Some(Duration::from_millis(100)),
            },
            &stop,
            |f| {
                finals.push(f);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(why, StopReason::Duration);
        finals
    }

    #[test]
    fn interval_and_duration_give_exact_summary_count() {
        assert_eq!(summaries(Duration::ZERO), vec![false, false, false, true]);
    }

    #[test]
    fn duration_and_intervals_count_from_when_tracing_began() {
        // Tracing began 95 ms ago: of the 30 ms ticks, those at 30, 60 and 90 ms
        // have passed (one summary for them, as for ticks missed while printing),
        // and the 100 ms duration ends 5 ms from now.
        assert_eq!(summaries(Duration::from_millis(95)), vec![false, true]);
    }
}
