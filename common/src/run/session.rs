//! One tracing run from start to stop, the sequence every tool shares: checks,
//! the plan, attaching, the start line, the summary loop, and detaching.
//!
//! ```text
//! let mut s = Session::prepare(&specs, &mut args.common, how, debug)?;
//! // take the tool's skeleton (opened ahead) for s.plan, size its maps, load it
//! s.attach(skel.object())?;
//! s.announce(&args.patterns)?;
//! s.run(schedule, &mut tool)?; // tool: Served, which prints the summaries
//! s.finish()
//! ```

use std::cell::RefCell;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use libbpf_rs::{Link, Object};

use crate::attach::links::Attached;
use crate::kernel::tracefs;
use crate::output;
use crate::plan::{self, Plan, RawTracepoints};
use crate::probe::mode::Hooks;
use crate::probe::spec::ProbeSpec;
use crate::run::cli::CommonArgs;
use crate::run::schedule::{self, Schedule};
use crate::serve::http::{Reply, Request, Route, Served, Server};
use crate::stop::{Phase, Stop, StopReason};
use crate::sys::process;
use crate::timing::{self, Marks};

/// What a tool hooks, beyond the common flags.
#[derive(Debug, Clone, Copy, Default)]
pub struct How {
    pub hooks: Hooks,
    /// The tool's object has fentry/fexit programs for a single kernel function.
    pub trampoline: bool,
    /// Whether tracepoints may be raw tracepoint links (see [`RawTracepoints`]).
    pub raw_tracepoints: RawTracepoints,
}

pub struct Session {
    pub plan: Plan,
    pub stop: &'static Stop,
    /// Status lines go to stderr when stdout carries JSON.
    pub json: bool,
    debug: bool,
    pid: Option<u32>,
    pub(crate) attached: Option<Attached>,
    /// Links of a tool with fixed programs ([`Session::adopt`]).
    pub(crate) links: Vec<Link>,
    /// `--listen` (see [`crate::run::listen`]): the server, and the `POST /stop`
    /// requests answered once everything is detached.
    pub(crate) server: Option<Server>,
    pub(crate) stopping: RefCell<Vec<Request>>,
    /// The last `GET /stacks` answer and when it was made.
    pub(crate) stacks_cache: RefCell<Option<(Instant, String)>>,
    /// `GET /debug/pprof/profile` requests waiting for their window to end.
    pub(crate) profiles: RefCell<Vec<crate::run::listen::Window>>,
    /// Phase times for the `timing:` line ([`crate::timing`]).
    marks: RefCell<Marks>,
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
        Self::prepare_with(common, how, debug, |opts| Plan::build(specs, opts))
    }

    /// [`Session::prepare`] for a tool that builds its plan itself (with
    /// [`Plan::build_indexed`], say) from the options `build` is given.
    pub fn prepare_with(
        common: &mut CommonArgs,
        how: How,
        debug: bool,
        build: impl FnOnce(&plan::Options) -> Result<Plan>,
    ) -> Result<Session> {
        let marks = Marks::start();
        process::require_root()?;
        common.check()?;
        let stop = Stop::install()?;
        let plan = build(&plan::Options {
            pid: common.pid,
            mode: common.attach_mode,
            hooks: how.hooks,
            trampoline: how.trampoline,
            raw_tracepoints: how.raw_tracepoints,
            cpu: common.cpu,
            ..Default::default()
        })?;
        if debug {
            crate::diag::stderr(&plan.describe());
        }
        Session::new(plan, stop, common, debug, marks)
    }

    /// Attaches the plan to the loaded object and, with `-p`, ends the run when
    /// that process exits. Returns how many probes are attached.
    pub fn attach(&mut self, obj: &Object) -> Result<usize> {
        self.marks.get_mut().attach_start();
        let attached = crate::attach::attach_and_report(&self.plan, obj, self.stop, self.debug)?;
        self.marks.get_mut().attach_end();
        let n = attached.probes_attached();
        self.attached = Some(attached);
        if let Some(pid) = self.pid {
            self.stop.watch_pid(pid)?;
        }
        self.stop.watch_output();
        Ok(n)
    }

    /// The attached probes (after [`Session::attach`]).
    pub fn attached(&self) -> Option<&Attached> {
        self.attached.as_ref()
    }

    /// BCC's start line for `patterns`; a sampling source is shown with its
    /// event's name and its period or rate (`software:context-switches:1000
    /// (every 1000 events)` for `software:cs`).
    pub fn announce<S: AsRef<str>>(&self, patterns: &[S]) -> Result<()> {
        let n = self.attached.as_ref().map_or(0, Attached::probes_attached);
        if !self.begins() {
            return Ok(());
        }
        let shown: Vec<String> = patterns
            .iter()
            .map(|p| {
                let p = p.as_ref();
                let parts: Vec<&str> = p.split(':').collect();
                match crate::probe::perf::is_perf(parts[0]) {
                    true => crate::probe::perf::parse(&parts)
                        .map_or(p.to_string(), |s| format!("{} ({})", s.name, s.rate())),
                    false => p.to_string(),
                }
            })
            .collect();
        self.status(&output::banner(n, &shown))
    }

    /// A status line: stdout with text output, stderr beside JSON.
    pub fn status(&self, line: &str) -> Result<()> {
        output::status(self.json, line)
    }

    /// When tracing began: the end of attaching (now, before it), which the
    /// duration and intervals count from.
    pub fn tracing_since(&self) -> Instant {
        self.marks
            .borrow()
            .attached_at()
            .unwrap_or_else(Instant::now)
    }

    /// The run: summaries on `schedule` (`-i`, `-d`) printed by `tool` until a
    /// signal, the duration's end, the `-p` process's exit or `POST /stop`. While
    /// it waits it reads the tool's ring buffer, if it has one, and builds the
    /// answers to `--listen` requests, on this thread, so map reads stay with
    /// the tool; connection threads write them (no socket I/O here). Then the
    /// tool drains what is still buffered. An error of the tool's (a closed
    /// stdout) ends the run with it.
    pub fn run(&self, schedule: Schedule, tool: &mut dyn Served) -> Result<StopReason> {
        let tool = RefCell::new(tool);
        let why = schedule::run_loop_with(
            self.tracing_since(),
            schedule,
            |deadline| self.wait(deadline, &tool),
            |last| {
                let mut tool = tool.borrow_mut();
                // The final counts are of one window (bpf/armed.h).
                if let (true, Some(a)) = (last, &self.attached) {
                    a.disarm();
                }
                if !tool.prints_summaries() {
                    return Ok(());
                }
                self.marks.borrow_mut().summary(|| tool.print(last))
            },
        )?;
        tool.borrow_mut().drain()?;
        // Profiles asked for and not yet due: what the run counted until now.
        self.answer_profiles(&mut **tool.borrow_mut(), true);
        Ok(why)
    }

    /// Waits until `deadline` or a stop request, reading the tool's ring buffer
    /// and answering `--listen` requests meanwhile.
    fn wait(
        &self,
        deadline: Option<Instant>,
        tool: &RefCell<&mut dyn Served>,
    ) -> Result<Option<StopReason>> {
        let polls = tool.borrow().polls();
        let Some(server) = self.server.as_ref() else {
            if !polls {
                return Ok(self.stop.wait_until(deadline));
            }
            return self
                .stop
                .poll_until(deadline, |t| tool.borrow_mut().poll(t));
        };
        let slice = crate::run::listen::SLICE;
        self.stop.poll_until(deadline, |t| {
            let mut tool = tool.borrow_mut();
            if !polls {
                if let Some(rq) = server.next(Some(t.min(slice))) {
                    let lost = tool.lost();
                    self.handle(rq, &mut **tool, lost);
                }
                self.answer_profiles(&mut **tool, false);
                return Ok(());
            }
            tool.poll(t.min(slice))?;
            // Queued requests one at a time, the ring read after each: a burst
            // of scrapes delays answers, never the reading.
            while !self.stop.is_set() {
                let Some(rq) = server.next(None) else { break };
                let lost = tool.lost();
                self.handle(rq, &mut **tool, lost);
                tool.poll(Duration::ZERO)?;
            }
            self.answer_profiles(&mut **tool, false);
            Ok(())
        })
    }

    /// Prints `Detaching...` (unless `quiet`) and detaches everything; then,
    /// with `--debug` or TRACEKIT_TIMING=1, the `timing:` line (stderr).
    pub fn finish(mut self, quiet: bool) -> Result<()> {
        // From the "Detaching..." line on, a signal is told the detach is
        // under way (it was taken as a stop request when it came before the
        // detach began).
        if self.attached.is_some() || !self.links.is_empty() {
            self.stop.set_phase(Phase::Detaching);
        }
        let printed = if quiet {
            Ok(())
        } else {
            self.status("Detaching...")
        };
        let t = Instant::now();
        drop(self.attached.take());
        if !self.links.is_empty() {
            let stop = self.stop;
            stop.detaching(|| self.links.clear());
        }
        let marks = self.marks.get_mut();
        marks.detached(t.elapsed());
        if self.debug || timing::requested() {
            crate::diag::stderr(&marks.line());
        }
        // POST /stop is answered when nothing is attached any more, and
        // written before the process exits.
        for rq in self.stopping.take() {
            rq.answer(stopped());
        }
        if let Some(server) = &self.server {
            // Requests that came as the run ended (a POST /stop that ended it
            // while the loop was held, say) are answered, not left waiting.
            while let Some(rq) = server.next(None) {
                let reply = match rq.route {
                    Route::Stop => stopped(),
                    _ => Reply::error(503, "stopping"),
                };
                rq.answer(reply);
            }
            server.settle(Duration::from_secs(2));
        }
        printed
    }
}

/// POST /stop's answer, once nothing is attached.
fn stopped() -> Reply {
    Reply::json(&serde_json::json!({ "stopped": true }))
}

/// Tools with fixed programs (no probe pattern; see [`crate::object::trials`]).
///
/// ```text
/// let mut s = Session::fixed(&mut args.common, debug)?;
/// let ((skel, links), choice) = trials::choose(GROUPS, |sel| { ... })?;
/// s.adopt(links)?;
/// let mut ev = Events::new(...)?;
/// s.run(Schedule { interval: None, duration }, &mut Streamed { events: &mut ev, tool })?;
/// s.finish(true)
/// ```
impl Session {
    /// The checks of [`Session::prepare`] (privileges, flags, `-p`), the signal
    /// handlers, and tracefs mounted for classic tracepoints; the plan is empty.
    pub fn fixed(common: &mut CommonArgs, debug: bool) -> Result<Session> {
        let marks = Marks::start();
        process::require_root()?;
        common.check()?;
        if common.attach_mode != crate::probe::mode::AttachMode::Auto {
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
        crate::attach::sweep_stale_groups();
        Session::new(plan, stop, common, debug, marks)
    }

    fn new(
        plan: Plan,
        stop: &'static Stop,
        common: &CommonArgs,
        debug: bool,
        marks: Marks,
    ) -> Result<Session> {
        // A stdout nobody reads holds the run only until a stop is asked for.
        output::give_up_when(Stop::requested);
        Ok(Session {
            plan,
            stop,
            json: common.json,
            debug,
            pid: common.pid,
            attached: None,
            links: Vec::new(),
            server: crate::run::listen::bind(common)?,
            stopping: RefCell::new(Vec::new()),
            stacks_cache: RefCell::new(None),
            profiles: RefCell::new(Vec::new()),
            marks: RefCell::new(marks),
        })
    }

    /// Takes the links of the programs a tool attached itself (detached by
    /// [`Session::finish`], or when the session is dropped on an error) and, with
    /// `-p`, ends the run when that process exits.
    pub fn adopt(&mut self, links: Vec<Link>) -> Result<()> {
        self.marks
            .get_mut()
            .attached_within(timing::total("attach"));
        self.links.extend(links);
        // A second signal now waits for the detach (see run::Phase).
        self.stop.set_phase(Phase::Tracing);
        if let Some(pid) = self.pid {
            self.stop.watch_pid(pid)?;
        }
        self.stop.watch_output();
        Ok(())
    }

    /// Whether `--debug` was given.
    pub fn debug(&self) -> bool {
        self.debug
    }
}
