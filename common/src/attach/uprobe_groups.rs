//! User functions as tracefs uprobe events, many to a perf event, for kernels
//! without uprobe_multi: one perf event (and its costly removal) per group
//! instead of per function; the groups' names, and the judgement of which
//! groups dead runs left (their guardian is guardian.rs).

use std::path::Path;

use libbpf_rs::ProgramMut as Program;
use libbpf_sys as sys;

use super::links::{take_link, Attached, Prog, UserSite};
use crate::probe::mode::Hook;
use crate::stop::Stop;
use crate::sys::process::INIT_PIDNS_INO;

/// The PID namespace this process is in, by its nsfs inode (0 where /proc
/// cannot tell).
fn pid_namespace() -> u64 {
    crate::sys::process::pidns().map_or(0, |ns| ns.ino)
}

/// The tracefs group of this process' uprobe events, named by PID namespace and
/// PID: a PID names a process only in its namespace, and two runs that are PID 1
/// of two containers must not share a group (the kernel appends a probe to an
/// existing event of the same name; two runs sharing one oopsed 6.12 and 6.18
/// when they closed it).
fn uprobe_event_group() -> String {
    format!("tracekit_{}_{}", pid_namespace(), std::process::id())
}

/// Who judges groups: this process, and whether /proc shows its own namespace's
/// PIDs (in a container that kept the host's /proc it does not).
struct Judge {
    ns: u64,
    pid: u32,
    proc_is_ours: bool,
}

/// Whether the group (`tracekit_<ns>_<pid>`, or an older version's
/// `tracekit_<pid>`) was left by a process that is gone, as far as this process
/// can see: its own namespace's PIDs in /proc, other namespaces' only from the
/// initial one. Its own name is stale: an earlier process of this PID left it,
/// and this run would append to it. `alive_there(ns, pid)` is asked only from
/// the initial namespace.
fn stale_group(
    group: &str,
    me: &Judge,
    alive_here: impl Fn(u32) -> bool,
    alive_there: impl Fn(u64, u32) -> bool,
) -> bool {
    let Some(rest) = group.strip_prefix("tracekit_") else {
        return false;
    };
    let (ns, pid) = match rest.split_once('_') {
        Some((ns, pid)) => match (ns.parse::<u64>(), pid.parse::<u32>()) {
            (Ok(ns), Ok(pid)) => (Some(ns), pid),
            _ => return false,
        },
        None => match rest.parse::<u32>() {
            Ok(pid) => (None, pid),
            Err(_) => return false,
        },
    };
    match ns {
        Some(ns) if ns == me.ns && pid == me.pid => true,
        Some(ns) if ns == me.ns => me.proc_is_ours && !alive_here(pid),
        // Older versions named groups by PID alone, in the writer's namespace:
        // judged as they did, but only from the initial namespace.
        None => me.ns == INIT_PIDNS_INO && me.proc_is_ours && !alive_here(pid),
        Some(ns) => me.ns == INIT_PIDNS_INO && me.proc_is_ours && !alive_there(ns, pid),
    }
}

/// The processes of every PID namespace, by namespace: each process's PID in
/// its own namespace, the last of its NSpid.
fn processes_by_namespace() -> std::collections::HashMap<u64, std::collections::HashSet<u32>> {
    use std::os::unix::fs::MetadataExt;
    let mut by_ns: std::collections::HashMap<u64, std::collections::HashSet<u32>> =
        Default::default();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return by_ns;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(ns) = std::fs::metadata(format!("/proc/{pid}/ns/pid")).map(|m| m.ino()) else {
            continue;
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let inner = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_whitespace().last()?.parse::<u32>().ok());
        if let Some(inner) = inner {
            by_ns.entry(ns).or_default().insert(inner);
        }
    }
    by_ns
}

/// Writes commands (lines) to tracefs `uprobe_events` in one write: the kernel
/// does not join a line split across writes.
fn uprobe_events_command(cmd: &str) -> Result<(), i32> {
    use std::io::Write;
    let path = crate::kernel::tracefs::tracefs()
        .map_err(|_| libc::ENOENT)?
        .join("uprobe_events");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let line = format!("{cmd}\n");
    match f.write(line.as_bytes()) {
        Ok(n) if n == line.len() => Ok(()),
        Ok(_) => Err(libc::EIO),
        Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

pub(super) fn remove_uprobe_events(events: &[String]) {
    for e in events {
        let _ = uprobe_events_command(&format!("-:{e}"));
    }
}

/// Removes the uprobe events left by tracekit processes that are gone (killed
/// with their guardian before either could remove them; such events are inert,
/// no breakpoint is armed). Runs that make tracefs groups call it before they
/// make theirs; every other run on a thread of its own (`sweep_stale_groups`).
pub(crate) fn remove_stale_uprobe_events() {
    let Ok(dir) = crate::kernel::tracefs::tracefs() else {
        return;
    };
    let Ok(list) = crate::kernel::tracefs::read_list(&dir.join("uprobe_events")) else {
        return;
    };
    let pid = std::process::id();
    let me = Judge {
        ns: pid_namespace(),
        pid,
        proc_is_ours: std::fs::read_link("/proc/self")
            .is_ok_and(|l| l.as_os_str() == pid.to_string().as_str()),
    };
    let others = std::cell::OnceCell::new();
    let others = || others.get_or_init(processes_by_namespace);
    let mut stale: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.split_once(':').map(|d| d.1))
        .filter(|event| {
            let group = event.split('/').next().unwrap_or_default();
            stale_group(
                group,
                &me,
                |p| Path::new(&format!("/proc/{p}")).exists(),
                |ns, p| others().get(&ns).is_some_and(|s| s.contains(&p)),
            )
        })
        .collect();
    stale.dedup();
    let stale: Vec<String> = stale.into_iter().map(str::to_string).collect();
    remove_uprobe_events(&stale);
}

fn perf_event_open_tracepoint(id: u64, pid: Option<u32>) -> Result<i32, i32> {
    // SAFETY: perf_event_attr is plain data; all-zero is a valid start.
    let mut attr: sys::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = sys::PERF_TYPE_TRACEPOINT;
    attr.size = size_of::<sys::perf_event_attr>() as u32;
    attr.config = id;
    attr.__bindgen_anon_1.sample_period = 1;
    attr.__bindgen_anon_2.wakeup_events = 1;
    // With a PID, the kernel arms the breakpoints in that process only.
    let (pid, cpu) = match pid {
        Some(p) => (p as libc::c_int, -1),
        None => (-1, 0),
    };
    crate::sys::perf::perf_event_open(&attr, pid, cpu)
}

/// Without uprobe_multi: the functions of one binary as tracefs uprobe events,
/// many functions appended to one event, each event opened as one perf event with
/// the BPF program attached. A perf-event uprobe costs the kernel several RCU
/// grace periods to remove, one at a time under its event_mutex (about 100 ms
/// each: 1,000 functions took 107 s); a group costs that once for all its
/// functions. With `index` (the BPF object's `uprobe_groups` map) entries are
/// told apart by group and page offset (see bpf/uprobe_groups.h), so a group
/// holds functions with distinct page offsets; without it (a tool that does not
/// need to know which function fired) one group holds them all, as it does for
/// returns (`Hook::Return`), which the BPF side pairs with their entries by
/// stack pointer. A group the kernel refuses is bisected. Returns the sites
/// tracefs would not take (no tracefs, a path it cannot parse), for single
/// uprobes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn uprobe_groups<'a>(
    prog: &Program,
    hook: Hook,
    index: Option<&libbpf_rs::Map>,
    pid: Option<u32>,
    binary: &Path,
    sites: &[UserSite<'a>],
    stop: &Stop,
    out: &mut Attached,
) -> Vec<UserSite<'a>> {
    // Absolute, so that uprobe_events tells other readers which file it is.
    let binary = std::path::absolute(binary).unwrap_or_else(|_| binary.to_path_buf());
    let Some(path) = binary.to_str().filter(|p| !p.contains(char::is_whitespace)) else {
        return sites.to_vec();
    };
    let index = index.filter(|_| hook == Hook::Entry);
    let groups: Vec<Vec<UserSite>> = if index.is_some() {
        let mut groups: Vec<Vec<UserSite>> = Vec::new();
        let mut depth: std::collections::HashMap<u64, usize> = Default::default();
        for s in sites {
            let d = depth.entry(s.2 & 0xfff).or_default();
            if groups.len() <= *d {
                groups.push(Vec::new());
            }
            groups[*d].push(*s);
            *d += 1;
        }
        groups
    } else {
        vec![sites.to_vec()]
    };
    // Before the first event is made: a kill -9 from now on leaves nothing.
    if let Ok(dir) = crate::kernel::tracefs::tracefs() {
        super::guardian::guard(&dir.join("uprobe_events"), &uprobe_event_group());
    }
    let prog = Prog::of(prog);
    let mut fallback = Vec::new();
    for g in groups {
        // An error is tracefs itself refusing (not the kernel's uprobe checks).
        if uprobe_group(prog, hook, index, pid, path, &g, stop, out).is_err() {
            fallback.extend(g);
        }
    }
    fallback
}

/// Attaches one group, bisecting it when the kernel refuses it. Fails only when
/// tracefs will not create the event at all.
#[allow(clippy::too_many_arguments)]
fn uprobe_group(
    prog: Prog,
    hook: Hook,
    index: Option<&libbpf_rs::Map>,
    pid: Option<u32>,
    path: &str,
    sites: &[UserSite<'_>],
    stop: &Stop,
    out: &mut Attached,
) -> Result<(), i32> {
    use libbpf_rs::MapCore;
    if stop.is_set() || sites.is_empty() {
        return Ok(());
    }
    let group = out.next_group;
    out.next_group += 1;
    let event = format!("{}/g{group}", uprobe_event_group());
    let kind = if hook == Hook::Return { "r" } else { "p" };
    // Complete lines, many per write (the kernel splits them; a line must not be
    // split across writes).
    let lines: Vec<String> = sites
        .iter()
        .map(|s| format!("{kind}:{event} {path}:0x{:x}", s.2))
        .collect();
    for (k, batch) in lines.chunks(256).enumerate() {
        if let Err(e) = uprobe_events_command(&batch.join("\n")) {
            if k > 0 || batch.len() > 1 {
                remove_uprobe_events(std::slice::from_ref(&event));
            }
            return Err(e);
        }
    }
    let id = crate::kernel::tracefs::tracefs()
        .ok()
        .and_then(|d| std::fs::read_to_string(d.join("events").join(&event).join("id")).ok())
        .and_then(|s| s.trim().parse::<u64>().ok());
    let attached = id.ok_or(libc::ENOENT).and_then(|id| {
        if let Some(map) = index {
            for s in sites {
                let key = group << 12 | (s.2 & 0xfff);
                map.update(
                    &key.to_ne_bytes(),
                    &(s.0 as u32).to_ne_bytes(),
                    libbpf_rs::MapFlags::ANY,
                )
                .map_err(|_| libc::ENOMEM)?;
            }
        }
        let fd = perf_event_open_tracepoint(id, pid)?;
        let opts = sys::bpf_perf_event_opts {
            sz: size_of::<sys::bpf_perf_event_opts>() as _,
            bpf_cookie: UPROBE_GROUP | group << 12,
            ..Default::default()
        };
        // SAFETY: fd is our perf event; on success the link owns it.
        let link =
            take_link(unsafe { sys::bpf_program__attach_perf_event_opts(prog.ptr(), fd, &opts) });
        if link.is_err() {
            // SAFETY: fd is ours and not owned by any link.
            unsafe { libc::close(fd) };
        }
        link
    });
    match attached {
        Ok(link) => {
            out.add(link, sites.iter().map(|s| s.0 as u64));
            out.tracefs_events.push(event);
            out.uprobe_groups += 1;
            out.grouped_uprobes += sites.len();
        }
        Err(e) => {
            remove_uprobe_events(std::slice::from_ref(&event));
            if let Some(map) = index {
                for s in sites {
                    let _ = map.delete(&(group << 12 | (s.2 & 0xfff)).to_ne_bytes());
                }
            }
            if sites.len() == 1 {
                out.skip_user(sites[0].1, e);
            } else {
                let (a, b) = sites.split_at(sites.len() / 2);
                // The event was created before: tracefs takes these paths.
                let _ = uprobe_group(prog, hook, index, pid, path, a, stop, out);
                let _ = uprobe_group(prog, hook, index, pid, path, b, stop, out);
            }
        }
    }
    Ok(())
}

/// The cookie bit marking a uprobe group (bpf/funccount.bpf.c).
const UPROBE_GROUP: u64 = 1 << 63;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_judged_stale_where_their_pid_can_be_seen() {
        let alive_here = |p| p == 10;
        let alive_there = |ns, p| ns == 7 && p == 1;
        let stale = |group: &str, me: &Judge| stale_group(group, me, alive_here, alive_there);
        let host = Judge {
            ns: INIT_PIDNS_INO,
            pid: 500,
            proc_is_ours: true,
        };
        let init = format!("tracekit_{INIT_PIDNS_INO}");
        // Its own namespace: by /proc; its own name is an earlier process's.
        assert!(!stale(&format!("{init}_10"), &host));
        assert!(stale(&format!("{init}_11"), &host));
        assert!(stale(&format!("{init}_500"), &host));
        // Another namespace, from the initial one: by the PIDs live there.
        assert!(!stale("tracekit_7_1", &host));
        assert!(stale("tracekit_7_2", &host));
        assert!(stale("tracekit_8_1", &host));
        // An older version's name: by /proc.
        assert!(!stale("tracekit_10", &host));
        assert!(stale("tracekit_11", &host));
        // Not tracekit's, or not its form: left alone.
        assert!(!stale("tracekit_dup_test", &host));
        assert!(!stale("other_11", &host));
        assert!(!stale("tracekit_7_x", &host));

        // In a container: the host's and other containers' groups are left alone.
        let container = Judge {
            ns: 7,
            pid: 1,
            proc_is_ours: true,
        };
        assert!(!stale(&format!("{init}_11"), &container));
        assert!(!stale("tracekit_8_1", &container));
        assert!(stale("tracekit_7_11", &container));
        assert!(stale("tracekit_7_1", &container));
        assert!(!stale("tracekit_11", &container));
        // A container that kept the host's /proc cannot judge its own PIDs.
        let blind = Judge {
            proc_is_ours: false,
            ..container
        };
        assert!(!stale("tracekit_7_11", &blind));
        assert!(!stale("tracekit_11", &blind));
        assert!(stale("tracekit_7_1", &blind));
    }
}
