//! Stacks stored by bpf/stacks.h (a hash map from the 64-bit hash of a stack to
//! `struct stack { u32 depth; u32 first; u64 ip[127]; }`, the stack being
//! `depth` addresses from `ip[first]`), resolved in batches (each
//! distinct address once per summary), and rendered as folded lines or a flame
//! graph SVG.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use crate::data::symbolize::{frame_at, lookup_addrs, Frame, Symbols, CUT};

/// The addresses of stack `hash`, leaf first; `None` when it is gone from the map.
/// A zero address ends the stack: it is the end of the frame chain (the outermost
/// frame's zero return address), not a frame, as BCC's stack walk treats it.
pub fn read(map: &dyn MapCore, hash: u64) -> Option<Vec<u64>> {
    let raw = map.lookup(&hash.to_ne_bytes(), MapFlags::ANY).ok()??;
    let depth = u32::from_ne_bytes(raw.get(..4)?.try_into().ok()?) as usize;
    let first = u32::from_ne_bytes(raw.get(4..8)?.try_into().ok()?) as usize;
    Some(
        raw.get(8 + 8 * first..)?
            .chunks_exact(8)
            .take(depth)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
            .take_while(|&a| a != 0)
            .collect(),
    )
}

/// Frees stacks after their summary so long runs do not fill the map (an event
/// that needs a freed stack again stores it again).
pub fn forget(map: &dyn MapCore, hashes: impl IntoIterator<Item = u64>) {
    for h in hashes {
        let _ = map.delete(&h.to_ne_bytes());
    }
}

/// Addresses gathered for one summary, to resolve together.
#[derive(Default)]
pub struct Batch {
    kernel: HashSet<u64>,
    user: HashMap<u32, HashSet<u64>>,
}

impl Batch {
    pub fn kernel(&mut self, addrs: &[u64]) {
        let at = addrs
            .iter()
            .enumerate()
            .flat_map(|(i, &a)| lookup_addrs(i, a));
        self.kernel.extend(at);
    }

    pub fn user(&mut self, pid: u32, addrs: &[u64]) {
        let at = addrs
            .iter()
            .enumerate()
            .flat_map(|(i, &a)| lookup_addrs(i, a));
        self.user
            .entry(pid)
            .or_default()
            .extend(at.filter(|&a| a != CUT));
    }

    /// One symbolizer call for all kernel addresses and one per process.
    pub fn resolve(self, symbols: &Symbols) -> Resolved {
        let kernel: Vec<u64> = self.kernel.into_iter().collect();
        let kernel = if kernel.is_empty() {
            HashMap::new()
        } else {
            symbols.kernel(&kernel)
        };
        let user = self
            .user
            .into_iter()
            .map(|(pid, addrs)| {
                let addrs: Vec<u64> = addrs.into_iter().collect();
                (pid, symbols.user(pid, &addrs))
            })
            .collect();
        Resolved { kernel, user }
    }
}

pub struct Resolved {
    kernel: HashMap<u64, Frame>,
    user: HashMap<u32, HashMap<u64, Frame>>,
}

impl Resolved {
    /// A kernel stack's frames, innermost first. A stack taken in a raw
    /// tracepoint program begins inside that program and the kernel code that
    /// runs it (`bpf_prog_<tag>_<name>`, `bpf_trace_run2`, and on some kernels
    /// `__bpf_trace_<event>` and `__traceiter_<event>`): those frames are left
    /// out, so that it begins where the tracepoint fired, as one taken in a
    /// perf-event tracepoint program does.
    pub fn kernel(&self, addrs: &[u64]) -> Vec<Frame> {
        let mut frames: Vec<Frame> = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| frame_at(i, a, |x| self.kernel.get(&x).cloned()))
            .collect();
        frames.drain(..raw_tracepoint_frames(&frames));
        frames
    }

    pub fn user(&self, pid: u32, addrs: &[u64]) -> Vec<Frame> {
        let m = self.user.get(&pid);
        addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| match a {
                CUT => Frame::truncated(),
                a => frame_at(i, a, |x| m.and_then(|m| m.get(&x)).cloned()),
            })
            .collect()
    }
}

/// How many of a kernel stack's innermost frames are a raw tracepoint program's
/// and its caller's (see [`Resolved::kernel`]): none unless the stack begins in
/// a BPF program (named, or unnamed where JIT images are not in kallsyms but
/// called by `bpf_trace_run*`). A probe on `bpf_trace_run2` itself begins there,
/// not in a program, and keeps its frames.
pub fn raw_tracepoint_frames(frames: &[Frame]) -> usize {
    let name = |i: usize| frames.get(i).and_then(|f| f.name.as_deref());
    let runner = |n: &str| n.starts_with("bpf_trace_run");
    let in_program = match name(0) {
        Some(n) => n.starts_with("bpf_prog_"),
        None => name(1).is_some_and(runner),
    };
    if !in_program {
        return 0;
    }
    1 + frames[1..]
        .iter()
        .take_while(|f| {
            f.name.as_deref().is_some_and(|n| {
                runner(n) || n.starts_with("__bpf_trace_") || n.starts_with("__traceiter_")
            })
        })
        .count()
}

/// A folded stack line (flamegraph.pl / inferno input): `[prefix;]` user frames then
/// kernel frames, each outermost first, separated by `;`, then ` count`. `delimit`
/// puts a `-` frame between user and kernel frames, even when one side is empty
/// (as BCC does, so a split on `-` always finds both sides).
pub fn folded(
    prefix: Option<&str>,
    user: &[Frame],
    kernel: &[Frame],
    delimit: bool,
    count: u64,
) -> String {
    let mut parts: Vec<&str> = Vec::new();
    // The process name is the one part a user sets: control bytes and `;` (the
    // frame separator) in it would break the line or add a frame.
    let prefix = prefix.map(|p| crate::diag::escape(p.as_bytes()).replace(';', "\\x3b"));
    if let Some(p) = &prefix {
        parts.push(p);
    }
    let leaf_first = |frames: &'_ [Frame]| -> Vec<String> {
        frames
            .iter()
            .flat_map(|f| f.names().map(str::to_string).collect::<Vec<_>>())
            .collect()
    };
    let user: Vec<String> = leaf_first(user);
    let kernel: Vec<String> = leaf_first(kernel);
    parts.extend(user.iter().rev().map(String::as_str));
    if delimit {
        parts.push("-");
    }
    parts.extend(kernel.iter().rev().map(String::as_str));
    format!("{} {count}", parts.join(";"))
}

/// Writes an interactive flame graph SVG of `lines` (folded stacks) to `file`,
/// created beforehand (at `path`) so that a bad path fails before tracing.
pub fn write_svg(
    file: File,
    path: &Path,
    title: &str,
    count_name: &str,
    lines: &[String],
) -> Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = count_name.to_string();
    inferno::flamegraph::from_lines(
        &mut opts,
        lines.iter().map(String::as_str),
        BufWriter::new(file),
    )
    .with_context(|| format!("writing flame graph {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> Frame {
        Frame {
            addr: 1,
            name: Some(name.into()),
            offset: 0,
            inlined: Vec::new(),
        }
    }

    #[test]
    fn raw_tracepoint_program_frames_are_left_out() {
        let names = |fs: &[Frame]| -> Vec<String> {
            fs[raw_tracepoint_frames(fs)..]
                .iter()
                .map(|f| f.name.clone().unwrap_or_default())
                .collect()
        };
        let fired = ["__set_task_comm", "__do_sys_prctl"].map(f);
        let raw = [
            f("bpf_prog_84f9cd2868a98e44_stack_raw_tp"),
            f("bpf_trace_run2"),
            f("__bpf_trace_task_rename"),
            f("__traceiter_task_rename"),
        ];
        let want = vec!["__set_task_comm", "__do_sys_prctl"];
        assert_eq!(names(&[&raw[..], &fired].concat()), want);
        assert_eq!(names(&[&raw[..2], &fired].concat()), want);
        // The program's image not in kallsyms.
        let mut unnamed = raw.clone();
        unnamed[0].name = None;
        assert_eq!(names(&[&unnamed[..], &fired].concat()), want);
        // Stacks of other programs, and a probe on the runner itself, are whole.
        assert_eq!(names(&fired), want);
        let on_runner = [f("bpf_trace_run2"), f("__bpf_trace_task_rename")];
        assert_eq!(names(&on_runner).len(), 2);
        let mut unknown_top = fired.clone();
        unknown_top[0].name = None;
        assert_eq!(names(&unknown_top).len(), 2);
        assert!(names(&[]).is_empty());
    }

    #[test]
    fn folded_is_outermost_first() {
        let user = [f("target"), f("a"), f("main")];
        let kernel = [f("vfs_read"), f("ksys_read")];
        assert_eq!(
            folded(Some("prog"), &user, &kernel, false, 7),
            "prog;main;a;target;ksys_read;vfs_read 7"
        );
        assert_eq!(
            folded(Some("p"), &user, &[], true, 2),
            "p;main;a;target;- 2"
        );
        assert_eq!(
            folded(Some("k"), &[], &kernel, true, 2),
            "k;-;ksys_read;vfs_read 2"
        );
        assert_eq!(
            folded(None, &user, &kernel, true, 1),
            "main;a;target;-;ksys_read;vfs_read 1"
        );
        let mut inl = f("outer");
        inl.inlined = vec!["inner".into()];
        assert_eq!(folded(None, &[inl], &[], false, 3), "outer;inner 3");
    }
}
