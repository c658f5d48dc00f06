//! One tracing run from start to stop, the sequence every tool shares: checks,
//! the plan, attaching, the start line, the summary loop, and detaching.
//!
//! ```text
//! let mut s = Session::prepare(&specs, &mut args.common, how, debug)?;
//! // open the tool's skeleton with s.plan, size its maps, load it
//! s.attach(skel.object())?;
//! s.announce(&args.patterns)?;
//! s.run(schedule, |last| { ... print a summary ... })?;
//! s.finish()
//! ```

use std::cell::RefCell;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use libbpf_rs::{Link, Object};

use crate::attach::Attached;
use crate::cli::{self, CommonArgs};
use crate::events::Events;
use crate::metrics::{self, Metrics};
use crate::output;
use crate::plan::{self, Hooks, Plan};
use crate::run::{self, Schedule, Stop, StopReason};
use crate::serve::{self, Reply, Request, Route, Served, Server};
use crate::spec::ProbeSpec;
use crate::system;
use crate::tracefs;

/// What a tool hooks, beyond the common flags.
#[derive(Debug, Clone, Copy, Default)]
pub struct How {
    pub hooks: Hooks,
    /// The tool's object has fentry/fexit programs for a single kernel function.
    pub trampoline: bool,
}

pub struct Session {
    pub plan: Plan,
    pub stop: &'static Stop,
    /// Status lines go to stderr when stdout carries JSON.
    pub json: bool,
    debug: bool,
    pid: Option<u32>,
    attached: Option<Attached>,
    /// Links of a tool with fixed programs ([`Session::adopt`]).
    links: Vec<Link>,
    /// `--listen`: the server, and the `POST /stop` requests answered once
    /// everything is detached.
    server: Option<Server>,
    stopping: RefCell<Vec<Request>>,
}

impl Session {
    /// Checks privileges and the common flags, installs the signal handlers and
    /// builds the plan (printed on stderr with `debug`).
    pub fn prepare(
        specs: &[ProbeSpec],
        common: &mut CommonArgs,
        how: How,
        debug: bool,
    ) -> Result<Session> {
        system::require_root()?;
        common.check()?;
        let stop = Stop::install()?;
        let plan = Plan::build(
            specs,
            &plan::Options {
                pid: common.pid,
                mode: common.attach_mode,
                hooks: how.hooks,
                trampoline: how.trampoline,
            },
        )?;
        if debug {
            cli::stderr(&plan.describe());
        }
        Ok(Session {
            plan,
            stop,
            json: common.json,
            debug,
            pid: common.pid,
            attached: None,
            links: Vec::new(),
            server: listen(common)?,
            stopping: RefCell::new(Vec::new()),
        })
    }

    /// Attaches the plan to the loaded object and, with `-p`, ends the run when
    /// that process exits. Returns how many probes are attached.
    pub fn attach(&mut self, obj: &Object) -> Result<usize> {
        let attached = self.plan.attach_and_report(obj, self.stop, self.debug)?;
        let n = attached.probes_attached();
        self.attached = Some(attached);
        if let Some(pid) = self.pid {
            self.stop.watch_pid(pid)?;
        }
        Ok(n)
    }

    /// The attached probes (after [`Session::attach`]).
    pub fn attached(&self) -> Option<&Attached> {
        self.attached.as_ref()
    }

    /// BCC's start line for `patterns`.
    pub fn announce<S: AsRef<str>>(&self, patterns: &[S]) -> Result<()> {
        let n = self.attached.as_ref().map_or(0, Attached::probes_attached);
        self.status(&output::banner(n, patterns))
    }

    /// A status line: stdout with text output, stderr beside JSON.
    pub fn status(&self, line: &str) -> Result<()> {
        output::status(self.json, line)
    }

    /// The summary loop (see [`run::run_loop`]).
    pub fn run(
        &self,
        schedule: Schedule,
        summary: impl FnMut(bool) -> Result<()>,
    ) -> Result<StopReason> {
        run::run_loop(schedule, self.stop, summary)
    }

    /// The summary loop, calling `poll(timeout)` while waiting (a ring buffer).
    pub fn run_polling(
        &self,
        schedule: Schedule,
        mut poll: impl FnMut(std::time::Duration),
        summary: impl FnMut(bool) -> Result<()>,
    ) -> Result<StopReason> {
        run::run_loop_with(
            schedule,
            |deadline: Option<Instant>| self.stop.poll_until(deadline, &mut poll),
            summary,
        )
    }

    /// Prints `Detaching...` (unless `quiet`) and detaches everything.
    pub fn finish(mut self, quiet: bool) -> Result<()> {
        let printed = if quiet {
            Ok(())
        } else {
            self.status("Detaching...")
        };
        drop(self.attached.take());
        self.links.clear();
        // POST /stop is answered when nothing is attached any more.
        for rq in self.stopping.take() {
            rq.answer(Reply::json(&serde_json::json!({ "stopped": true })));
        }
        printed
    }
}

/// Tools with fixed programs (no probe pattern; see [`crate::fixed`]).
///
/// ```text
/// let mut s = Session::fixed(&mut args.common, debug)?;
/// let ((skel, links), choice) = fixed::choose(GROUPS, |storage, sel| { ... })?;
/// s.adopt(links)?;
/// let mut ev = Events::new(...)?;
/// s.run_events(duration, &mut ev)?;
/// s.finish(true)
/// ```
impl Session {
    /// The checks of [`Session::prepare`] (privileges, flags, `-p`), the signal
    /// handlers, and tracefs mounted for classic tracepoints; the plan is empty.
    pub fn fixed(common: &mut CommonArgs, debug: bool) -> Result<Session> {
        system::require_root()?;
        common.check()?;
        if common.attach_mode != crate::AttachMode::Auto {
            bail!("--attach-mode is for tools that trace patterns of functions; this tool picks its programs itself (--debug shows them)");
        }
        let stop = Stop::install()?;
        let plan = Plan::build(
            &[],
            &plan::Options {
                pid: common.pid,
                ..Default::default()
            },
        )?;
        // Classic tracepoints are attached by the id tracefs gives; a failure
        // here shows up as the reason those variants did not work.
        let _ = tracefs::tracefs();
        Ok(Session {
            plan,
            stop,
            json: common.json,
            debug,
            pid: common.pid,
            attached: None,
            links: Vec::new(),
            server: listen(common)?,
            stopping: RefCell::new(Vec::new()),
        })
    }

    /// Takes the links of the programs a tool attached itself (detached by
    /// [`Session::finish`], or when the session is dropped on an error) and, with
    /// `-p`, ends the run when that process exits.
    pub fn adopt(&mut self, links: Vec<Link>) -> Result<()> {
        self.links.extend(links);
        if let Some(pid) = self.pid {
            self.stop.watch_pid(pid)?;
        }
        Ok(())
    }

    /// Whether `--debug` was given.
    pub fn debug(&self) -> bool {
        self.debug
    }

    /// Serves `events` until a signal, the end of `duration`, or the `-p` process
    /// exits; then handles the records still buffered and reports lost ones.
    /// An error from a record's handler (a closed stdout) ends the run with it.
    pub fn run_events(
        &self,
        duration: Option<std::time::Duration>,
        events: &mut Events,
    ) -> Result<StopReason> {
        self.run_events_served(duration, events, None)
    }

    /// [`Session::run_events`] answering `--listen` requests from `tool`.
    pub fn run_events_served(
        &self,
        duration: Option<std::time::Duration>,
        events: &mut Events,
        mut tool: Option<&mut dyn Served>,
    ) -> Result<StopReason> {
        // Shorter with a server: requests are answered between polls.
        let slice = if self.server.is_some() {
            SERVE_SLICE
        } else {
            std::time::Duration::from_millis(100)
        };
        let end = duration.map(|d| Instant::now() + d);
        let why = loop {
            if let Some(r) = self.stop.reason() {
                break r;
            }
            let left = match end {
                Some(e) => e.saturating_duration_since(Instant::now()),
                None => slice,
            };
            if left.is_zero() {
                break StopReason::Duration;
            }
            events.poll(left.min(slice))?;
            events.report_lost(false)?;
            if let (Some(server), Some(tool)) = (&self.server, tool.as_deref_mut()) {
                while let Some(rq) = server.next(None) {
                    let lost = events.lost_total();
                    self.handle(rq, tool, Some(lost));
                }
            }
        };
        events.drain()?;
        events.report_lost(true)?;
        Ok(why)
    }
}

/// How often the run loop looks for a stop while it waits for requests.
const SERVE_SLICE: Duration = Duration::from_millis(50);

/// Binds `--listen` (before anything is attached, so a port in use fails fast).
fn listen(common: &CommonArgs) -> Result<Option<Server>> {
    let Some(addr) = common.listen else {
        return Ok(None);
    };
    let token = match &common.listen_token {
        Some(path) => Some(serve::read_token(path)?),
        None => None,
    };
    let server = Server::start(addr, token)?;
    cli::warn(&format!(
        "serving http://{}/ (GET /metrics, GET /summary, POST /stop, POST /reset)",
        server.addr()
    ));
    Ok(Some(server))
}

/// `--listen`: the run loop answering requests while it waits.
impl Session {
    /// The summary loop of [`Session::run`], with `tool` printing the summaries
    /// and, with `--listen`, answering requests between them.
    pub fn run_served(&self, schedule: Schedule, tool: &mut dyn Served) -> Result<StopReason> {
        let tool = RefCell::new(tool);
        let Some(server) = &self.server else {
            return self.run(schedule, |last| tool.borrow_mut().print(last));
        };
        run::run_loop_with(
            schedule,
            |deadline| loop {
                if let Some(r) = self.stop.reason() {
                    return Some(r);
                }
                let left = match deadline {
                    Some(d) => d.saturating_duration_since(Instant::now()),
                    None => SERVE_SLICE,
                };
                if left.is_zero() {
                    return None;
                }
                if let Some(rq) = server.next(Some(left.min(SERVE_SLICE))) {
                    self.handle(rq, &mut **tool.borrow_mut(), None);
                }
            },
            |last| tool.borrow_mut().print(last),
        )
    }

    /// [`Session::run_polling`] with `tool` printing the summaries and, with
    /// `--listen`, answering requests between polls.
    pub fn run_polling_served(
        &self,
        schedule: Schedule,
        mut poll: impl FnMut(Duration),
        tool: &mut dyn Served,
    ) -> Result<StopReason> {
        let tool = RefCell::new(tool);
        let Some(server) = &self.server else {
            return self.run_polling(schedule, poll, |last| tool.borrow_mut().print(last));
        };
        run::run_loop_with(
            schedule,
            |deadline| {
                self.stop.poll_until(deadline, |t| {
                    poll(t.min(SERVE_SLICE));
                    while let Some(rq) = server.next(None) {
                        self.handle(rq, &mut **tool.borrow_mut(), None);
                    }
                })
            },
            |last| tool.borrow_mut().print(last),
        )
    }

    /// Whether `--listen` is serving (tools count what they serve only then).
    pub fn serving(&self) -> bool {
        self.server.is_some()
    }

    /// Answers one request (`lost`: records a ring buffer lost). An error is a
    /// 500 for that request; tracing goes on.
    fn handle(&self, rq: Request, tool: &mut dyn Served, lost: Option<u64>) {
        let reply = match &rq.route {
            Route::Metrics => self
                .scrape(tool, lost)
                .map(|text| Reply::ok(metrics::CONTENT_TYPE, text)),
            Route::Summary => tool.summary().map(|v| Reply::json(&v)),
            Route::Reset => tool
                .reset()
                .map(|()| Reply::json(&serde_json::json!({ "reset": true }))),
            Route::Stacks => match tool.folded() {
                Some(r) => r.map(|text| Reply::ok("text/plain; charset=utf-8", text)),
                None => Ok(Reply::error(404, "this tool has no stacks")),
            },
            Route::Stop => {
                self.stop.trigger(StopReason::Requested);
                self.stopping.borrow_mut().push(rq);
                return;
            }
        };
        rq.answer(reply.unwrap_or_else(|e| Reply::error(500, &format!("{e:#}"))));
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
                    ("tool", cli::tool_name().to_string()),
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
            "Probes that matched but could not be attached (-D lists them)",
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
        Ok(m.encode())
    }
}
