//! The run's output: the renderer set up (-s files, the traced process's map,
//! the probed binaries), the header, the run through the session's loop (records rendered,
//! filtered by -n/-f, printed or counted for -A, -M), then -A's counts, the final
//! JSON line, -v's counts per program and the returns not printed.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::Result;
use common::counters::PerCpuCounters;
use common::escape;
use common::events::Events;
use common::session::Session;
use common::unwind::{self, Tables};
use common::Site;
use common::{Schedule, StopReason, Streamed, Unserved};
use libbpf_rs::MapCore;
use serde_json::json;

use crate::compile::{self, Compiled};
use crate::placement::Placement;
use crate::render::{self, Renderer};
use crate::{skel, uses_u, Args};

/// Renders and prints the run's records until it stops, then what ends it.
pub fn run(
    session: &mut Session,
    skel: &skel::TraceSkel,
    args: &Args,
    compiled: &[Compiled],
    placed: &Placement,
    tables: Option<&RefCell<Tables>>,
) -> Result<()> {
    let (all, nprobes) = (&placed.all, placed.all.len());
    let labels: Vec<String> = all
        .iter()
        .map(|p| match &p.site {
            Site::Tracepoint(t) => t.event.clone(),
            _ => p.label.clone(),
        })
        .collect();
    let with_format = compiled.iter().any(|c| c.parsed.format.is_some());
    let json = session.json;
    let mut r = render::Renderer::new(render::Options {
        timestamp: args.timestamp,
        unix: args.unix_timestamp,
        time: args.time,
        cpu: args.print_cpu,
        address: args.address,
        kernel_stack: args.kernel_stack,
        user_stack: args.user_stack,
        json,
        str_size: args.string_size as usize,
    });
    // Files named with -s come first among those build IDs are looked up in.
    for f in &args.sym_files {
        r.add_file(f);
    }
    // The traced process's map is taken now: its records may arrive after it
    // exited (BCC #2014), and then /proc no longer has it.
    if let (Some(pid), true) = (args.common.pid, args.user_stack || uses_u(compiled)) {
        r.remember(pid);
    }
    // Build-ID stack frames are looked for first in the binaries probed.
    for p in &session.plan.probes {
        if let Site::User { binary, .. } | Site::Usdt { binary, .. } = &p.site {
            r.add_file(binary);
        }
    }
    if !session.begins() {
        // Stopped while attaching: no start line for a run that is ending.
    } else if json {
        session.status(&format!(
            "Tracing {nprobes} probe{}... Hit Ctrl-C to end.",
            if nprobes == 1 { "" } else { "s" }
        ))?;
    } else {
        common::emit(&r.header(with_format))?;
    }
    let Seen {
        printed,
        received,
        lost: lost_total,
        aggregate,
    } = event_loop(session, skel, &mut r, args, compiled, &labels, tables)?;
    if tables.is_some() {
        let stats = PerCpuCounters::new(&skel.maps.unwind_stats, unwind::STATS)?.totals()?;
        unwind::report(&stats, args.verbose);
    }
    if args.aggregate {
        let mut rows: Vec<(String, u64)> = aggregate.into_iter().collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut s = String::new();
        for (text, n) in rows {
            if json {
                let event: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                let _ = writeln!(s, "{}", json!({"event": event, "count": n}));
            } else {
                let _ = write!(s, "{text}-->COUNT {n}\n\n");
            }
        }
        common::emit(&s)?;
    }
    if json {
        // Last, so a script knows the run ended and whether anything was lost.
        let v = json!({"final": true, "events": printed, "records": received, "lost": lost_total});
        common::emit(&format!("{v}\n"))?;
    }
    if args.verbose {
        report_stats(&skel.maps.stats, compiled, received)?;
    }
    report_unpaired(&skel.maps.pairing_lost, args.verbose)?;
    Ok(())
}

/// What the event loop saw.
struct Seen {
    /// Events printed (or counted, -A).
    printed: u64,
    /// Records that reached user space.
    received: u64,
    /// Records the kernel could not send.
    lost: u64,
    /// -A: each event's text, and how often it came.
    aggregate: HashMap<String, u64>,
}

/// The run, through the session's one loop, until it stops: each record
/// rendered, kept or not (-n, -f), printed or counted (-A) until -M's count
/// (which ends the run as a signal would); lost records reported at most once
/// a second, in BCC's trace's words.
fn event_loop(
    session: &Session,
    skel: &skel::TraceSkel,
    r: &mut Renderer,
    args: &Args,
    compiled: &[Compiled],
    labels: &[String],
    tables: Option<&RefCell<Tables>>,
) -> Result<Seen> {
    let json = session.json;
    let mut printed = 0u64;
    let mut received = 0u64;
    let mut aggregate: HashMap<String, u64> = HashMap::new();
    let mut done = false;
    let stop = session.stop;
    let lost_total;
    {
        // BPF asks for the tables of processes it meets (bpf/unwind.h); a
        // process that mapped code since its first record is named anew.
        let remapped = RefCell::new(Vec::<u32>::new());
        let side = tables.map(|t| {
            let remapped = &remapped;
            let load = move |data: &[u8]| {
                if let Some(pid) = data.get(..4).and_then(|b| b.try_into().ok()) {
                    let pid = u32::from_ne_bytes(pid);
                    match t.borrow_mut().load_process(pid) {
                        Ok(true) => remapped.borrow_mut().push(pid),
                        Ok(false) => {}
                        Err(e) => common::warn(&format!("{e:#}")),
                    }
                }
            };
            (
                &skel.maps.unwind_requests as &dyn MapCore,
                Box::new(load) as Box<dyn FnMut(&[u8])>,
            )
        });
        let mut ev = Events::new_raw_with(
            &skel.maps.events,
            &skel.maps.events_lost,
            |data, out| {
                received += 1;
                // Records without strings or stacks end after their last value.
                if done || data.len() < render::VALS_AT {
                    return Ok(());
                }
                for pid in remapped.borrow_mut().drain(..) {
                    r.refresh(pid);
                }
                let h = render::Header::decode(data);
                let Some(c) = compiled.get(h.spec as usize) else {
                    return Ok(());
                };
                if let Some(n) = &args.name {
                    if !h.comm.contains(n.as_str()) {
                        return Ok(());
                    }
                }
                let mut vals = [0u64; compile::MAX_VALS];
                for (k, v) in data[render::VALS_AT..data.len().min(render::TAIL_AT)]
                    .chunks_exact(8)
                    .enumerate()
                {
                    vals[k] = u64::from_ne_bytes(v.try_into().expect("8 bytes"));
                }
                let tail = data.get(render::TAIL_AT..).unwrap_or(&[]);
                let msg = r.message(&c.parsed, &c.prog, &h, &vals, tail);
                if let Some(f) = &args.msg_filter {
                    if !msg.text.contains(f.as_str()) {
                        return Ok(());
                    }
                }
                let text = r.event(&h, &labels[c.probe], &c.parsed, &msg, tail);
                if args.aggregate {
                    let key = if json {
                        json_aggregate_key(&text, args.print_cpu)
                    } else {
                        text
                    };
                    *aggregate.entry(key).or_default() += 1;
                } else {
                    out.push_str(&text);
                }
                printed += 1;
                if args.max_events.is_some_and(|m| printed >= m) {
                    done = true;
                    stop.trigger(StopReason::Signal);
                }
                Ok(())
            },
            side,
        )?
        // trace reports lost records in BCC's trace's words.
        .in_bccs_words();
        session.run(
            Schedule::default(),
            &mut Streamed {
                events: &mut ev,
                tool: &mut Unserved,
            },
        )?;
        lost_total = ev.lost_total();
    }
    Ok(Seen {
        printed,
        received,
        lost: lost_total,
        aggregate,
    })
}

/// What makes two --json events identical for -A: the event without its time
/// (and CPU, unless -C asks for it), as text does.
fn json_aggregate_key(event: &str, with_cpu: bool) -> String {
    let Ok(serde_json::Value::Object(mut o)) = serde_json::from_str(event) else {
        return event.to_string();
    };
    o.remove("time_s");
    o.remove("unix_time");
    if !with_cpu {
        o.remove("cpu");
    }
    serde_json::Value::Object(o).to_string()
}

/// -v: per program, hits seen in the kernel and dropped by the predicate, and
/// the records that reached user space.
fn report_stats(map: &dyn MapCore, compiled: &[Compiled], received: u64) -> Result<()> {
    let mut c = PerCpuCounters::new(map, compile::STATS * compiled.len().max(1))?;
    let t = c.totals()?;
    let mut s = format!("trace: {received} records reached user space\n");
    // Each spec's counters: [0] hits kept, [1] hits its predicate dropped.
    for (id, p) in compiled.iter().enumerate() {
        let (kept, dropped) = (t[compile::STATS * id], t[compile::STATS * id + 1]);
        let _ = writeln!(
            s,
            "trace: program {id} (\"{}\"): {} hits, {dropped} dropped by the predicate in the kernel",
            escape(&p.parsed.text),
            kept + dropped,
        );
    }
    common::stderr(&s);
    Ok(())
}

/// Returns of `r:` probes not printed, from pairing_lost (bpf/pairing.h): a
/// warning when calls were too deep, left, or never returned; with -v always.
fn report_unpaired(map: &dyn MapCore, verbose: bool) -> Result<()> {
    // Slots of bpf/pairing.h's enum pairing_stat.
    let lost = PerCpuCounters::new(map, 6)?.totals()?;
    let (entered, returned) = (lost[3], lost[4]);
    // Awaited returns that did not come and that no other slot explains.
    let unreturned = entered.saturating_sub(returned + lost[1] + lost[5]);
    let what = [
        (lost[0], format!("calls nested deeper than {PAIR_DEPTH} on their thread (their entries could not be saved)")),
        (lost[1], "calls that never returned (left by longjmp or an exception) or whose return was missed".to_string()),
        (lost[2], "no memory for their thread's call stack".to_string()),
        (unreturned, "the return never came (nested deeper than the kernel's 64 return probes, left by longjmp or an exception, the thread exited, or still running)".to_string()),
    ];
    for (n, w) in &what {
        if *n > 0 || verbose {
            common::warn(&format!("{n} returns not printed: {w}"));
        }
    }
    Ok(())
}

/// bpf/trace.bpf.c's PAIR_DEPTH: the calls of one thread whose entries are kept
/// for their returns, as many as bpf/pairing.h's `thread_calls` has frames.
const PAIR_DEPTH: usize = frames_of(|t| t.frames);

/// The length of the skeleton's `thread_calls.frames`.
const fn frames_of<const N: usize>(
    _: fn(skel::types::thread_calls) -> [skel::types::frame; N],
) -> usize {
    N
}
