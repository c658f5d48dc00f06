//! The session's `--listen` side: binding at start, the run loops that answer
//! requests between their waits (so map reads stay on the tool's thread), and
//! the session's own health metrics. The HTTP server is [`crate::serve::http`].

use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;

use crate::run::cli::CommonArgs;
use crate::run::session::Session;
use crate::serve::http::{Reply, Request, Route, Served, Server};
use crate::serve::metrics::{self, Metrics};
use crate::stop::StopReason;

/// How long a `GET /stacks` answer is served again (symbolizing every stack
/// is the costliest answer, and any client may ask).
const STACKS_FRESH: Duration = Duration::from_secs(1);

/// How often the run loop looks for a stop while it waits for requests.
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// `GET /debug/pprof/profile` windows open at once; more are answered 503
/// (each holds a connection for its seconds, and a snapshot of the counts).
pub(crate) const MAX_PROFILES: usize = 4;

/// A `GET /debug/pprof/profile` request waiting for its window to end.
pub(crate) struct Window {
    rq: Request,
    mark: u64,
    start: SystemTime,
    opened: Instant,
    length: Duration,
}

/// Binds `--listen` (before anything is attached, so a port in use fails fast).
pub(crate) fn bind(common: &CommonArgs) -> Result<Option<Server>> {
    let Some(addr) = common.listen else {
        return Ok(None);
    };
    let token = match &common.listen_token {
        Some(path) => Some(crate::serve::http::read_token(path)?),
        None => None,
    };
    let server = Server::start(addr, token)?;
    crate::diag::warn(&format!(
        "serving http://{}/ (GET /metrics, GET /summary, POST /stop, POST /reset)",
        server.addr()
    ));
    Ok(Some(server))
}

/// `--listen`: the session's answers to requests, and its health metrics.
impl Session {
    /// Whether `--listen` is serving (tools count what they serve only then).
    pub fn serving(&self) -> bool {
        self.server.is_some()
    }

    /// Answers one request (`lost`: records a ring buffer lost). An error is a
    /// 500 for that request; tracing goes on.
    pub(crate) fn handle(&self, rq: Request, tool: &mut dyn Served, lost: Option<u64>) {
        let reply = match &rq.route {
            Route::Metrics => self
                .scrape(tool, lost)
                .map(|text| Reply::ok(metrics::CONTENT_TYPE, text)),
            Route::Summary => tool.summary().map(|v| Reply::json(&v)),
            Route::Reset => tool
                .reset()
                .map(|()| Reply::json(&serde_json::json!({ "reset": true }))),
            Route::Stacks => self.stacks(tool),
            Route::Profile(seconds) => {
                let seconds = *seconds;
                if self.profiles.borrow().len() >= MAX_PROFILES {
                    Ok(Reply::error(
                        503,
                        &format!("{MAX_PROFILES} profiles are being taken; try again later"),
                    ))
                } else {
                    match tool.profile_mark() {
                        None => Ok(Reply::error(404, "this tool has no stacks")),
                        Some(Err(e)) => Err(e),
                        Some(Ok(mark)) => {
                            self.profiles.borrow_mut().push(Window {
                                rq,
                                mark,
                                start: SystemTime::now(),
                                opened: Instant::now(),
                                length: Duration::from_secs(seconds.into()),
                            });
                            return;
                        }
                    }
                }
            }
            Route::Stop => {
                self.stop.trigger(StopReason::Requested);
                self.stopping.borrow_mut().push(rq);
                return;
            }
        };
        rq.answer(reply.unwrap_or_else(|e| Reply::error(500, &format!("{e:#}"))));
    }

    /// Answers the profile windows that have ended (`all`: every one, at the
    /// end of the run, with what was counted until then).
    pub(crate) fn answer_profiles(&self, tool: &mut dyn Served, all: bool) {
        if self.profiles.borrow().is_empty() {
            return;
        }
        let due: Vec<Window> = {
            let mut open = self.profiles.borrow_mut();
            let (due, wait) = open
                .drain(..)
                .partition(|w| all || w.opened.elapsed() >= w.length);
            *open = wait;
            due
        };
        for w in due {
            let length = w.opened.elapsed().min(w.length);
            let reply = tool
                .profile_since(w.mark, w.start, length)
                .map(|gz| Reply::bytes("application/octet-stream", gz))
                .unwrap_or_else(|e| Reply::error(500, &format!("{e:#}")));
            w.rq.answer(reply);
        }
    }

    /// `GET /stacks`, symbolized at most once a [`STACKS_FRESH`]: clients
    /// asking again and again share one answer rather than the loop's time.
    fn stacks(&self, tool: &mut dyn Served) -> Result<Reply> {
        let mut cache = self.stacks_cache.borrow_mut();
        if let Some((at, text)) = cache.as_ref() {
            if at.elapsed() < STACKS_FRESH {
                return Ok(Reply::ok("text/plain; charset=utf-8", text.clone()));
            }
        }
        match tool.folded() {
            Some(r) => {
                let text = r?;
                *cache = Some((Instant::now(), text.clone()));
                Ok(Reply::ok("text/plain; charset=utf-8", text))
            }
            None => Ok(Reply::error(404, "this tool has no stacks")),
        }
    }

    /// The tool's metrics and the session's own health, read now.
    fn scrape(&self, tool: &mut dyn Served, lost: Option<u64>) -> Result<String> {
        let t0 = Instant::now();
        let mut m = Metrics::default();
        tool.metrics(&mut m)?;
        if let Some(n) = lost {
            m.lost_records += n;
        }
        let none = || Vec::new();
        let (attached, skipped, missed) = match &self.attached {
            Some(a) => (a.probes_attached(), a.skipped.len(), a.missed()),
            None => (self.links.len(), 0, 0),
        };
        let one = |v: f64| vec![(none(), v)];
        m.gauges(
            "tracekit_info",
            "The tool serving these metrics, and its version",
            None,
            vec![(
                vec![
                    ("tool", crate::diag::tool_name().to_string()),
                    ("version", env!("CARGO_PKG_VERSION").to_string()),
                ],
                1.0,
            )],
        );
        m.gauges(
            "tracekit_probes_attached",
            "Probes attached",
            None,
            one(attached as f64),
        );
        m.gauges(
            "tracekit_probes_skipped",
            "Probes that matched but could not be attached (the debug option lists them)",
            None,
            one(skipped as f64),
        );
        m.counters(
            "tracekit_missed",
            "Probe hits the kernel dropped before the program ran (Linux 6.7+ reports them)",
            vec![(none(), missed)],
        );
        let lost = m.lost_records;
        m.counters(
            "tracekit_lost_records",
            "Records or calls the tool could not count (ring buffer full, unpaired returns)",
            vec![(none(), lost)],
        );
        m.gauges(
            "tracekit_scrape_duration",
            "Time taken to read this scrape's values from the BPF maps",
            Some(prometheus_client::registry::Unit::Seconds),
            one(t0.elapsed().as_secs_f64()),
        );
        m.encode()
    }
}
