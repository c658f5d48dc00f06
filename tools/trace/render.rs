//! Records to text as BCC's trace prints them (or JSON): the TIME/CPU/PID/TID/
//! COMM/FUNC columns, the message, stacks under the line. `%K`, `%U` and stacks
//! are symbolized when the record arrives, with the process's memory map kept
//! from its first record on, so a process that exits right away keeps its names.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::mem::offset_of;

use common::events::Clock;
use common::symbolize::{Frame, Symbols, UserFrame};
use serde_json::{json, Value as Json};

use plain::Plain;

use crate::compile::{Program, Slot, MAX_VALS};
use crate::format::Value;
use crate::grammar::Probe;
use crate::skel::types as abi;

/// Where a record's values start (`struct tk_event`): after its header.
pub const VALS_AT: usize = offset_of!(abi::tk_event, vals);
/// Where its strings and stacks start, after MAX_VALS values.
pub const TAIL_AT: usize = offset_of!(abi::tk_event, tail);
const _: () = assert!(VALS_AT == size_of::<abi::tk_event_head>());
const _: () = assert!(TAIL_AT - VALS_AT == 8 * MAX_VALS);

/// The header of a record (`struct tk_event_head`).
pub struct Header {
    pub ts: u64,
    pub tgid: u32,
    pub tid: u32,
    pub uid: u32,
    pub cpu: u32,
    pub spec: u32,
    pub str_bytes: u32,
    pub kstack: i32,
    pub ustack: i32,
    /// The user stack's frame 1 is the caller, added at the entry (bpf/trace/vm.h
    /// entry_ustack()).
    pub ucaller: bool,
    /// Bytes unused before the user stack.
    pub ustack_skip: u32,
    pub comm: String,
}

impl Header {
    /// Decodes a record of at least the header's size.
    pub fn decode(d: &[u8]) -> Header {
        let mut h = abi::tk_event_head::default();
        h.copy_from_bytes(d).expect("a record holds its header");
        let comm: Vec<u8> = h.comm.iter().map(|&c| c as u8).collect();
        let comm = &comm[..comm.iter().position(|&c| c == 0).unwrap_or(16)];
        Header {
            ts: h.ts,
            spec: h.spec,
            tgid: h.tgid,
            tid: h.tid,
            uid: h.uid,
            cpu: h.cpu,
            str_bytes: h.str_bytes,
            kstack: h.kstack,
            ustack: h.ustack,
            ucaller: h.ucaller != 0,
            ustack_skip: h.ustack_skip as u32,
            comm: String::from_utf8_lossy(comm).into_owned(),
        }
    }
}

/// The caller a user function's entry added as frame 1 (bpf/trace/vm.h
/// entry_ustack()), dropped where the kernel's walk has it already (frame 2
/// names the same place; kernels since 6.12 add it for functions that begin
/// with push %rbp) or where it has no name (its process's map was not read
/// before it exited, or its file is stripped: the kernel's own frames, by
/// build ID, stay, and -s names those). As
/// stackcount's, a caller that is its own caller's caller at the same place
/// (recursion from one call site) is taken for the kernel's.
fn drop_repeated_caller(frames: &mut Vec<(u64, String)>) {
    let repeated = match (frames.get(1), frames.get(2)) {
        (Some((_, one)), Some((_, two))) => one == two,
        _ => false,
    };
    // No name: no map of the process was read, or its file has no symbols,
    // where -s names the kernel's frame by build ID but not this address:
    // frame 2 may be the same place, which only a name could tell.
    let unnamed = frames
        .get(1)
        .is_some_and(|(_, name)| name.starts_with(Frame::UNKNOWN));
    if repeated || unnamed {
        frames.remove(1);
    }
}

pub struct Options {
    pub timestamp: bool,
    pub unix: bool,
    pub time: bool,
    pub cpu: bool,
    pub address: bool,
    pub kernel_stack: bool,
    pub user_stack: bool,
    pub json: bool,
    pub str_size: usize,
}

/// A rendered message: text and, for JSON, its typed values.
pub struct Message {
    pub text: String,
    pub values: Vec<Json>,
}

pub struct Renderer {
    o: Options,
    clock: Clock,
    start_ns: u64,
    symbols: Symbols,
    /// Executable mappings per process (start, end, file), from its first record.
    /// Processes whose maps were snapshotted (or found gone).
    remembered: HashSet<u32>,
}

impl Renderer {
    pub fn new(o: Options) -> Renderer {
        Renderer {
            o,
            clock: Clock::new(),
            start_ns: monotonic_ns(),
            symbols: Symbols::new(),
            remembered: Default::default(),
        }
    }

    /// BCC's header line.
    pub fn header(&self, with_format: bool) -> String {
        let mut s = String::new();
        if self.o.timestamp || self.o.time {
            if self.o.timestamp && self.o.unix {
                let _ = write!(s, "{:<17} ", "TIME");
            } else {
                let _ = write!(s, "{:<8} ", "TIME");
            }
        }
        if self.o.cpu {
            let _ = write!(s, "{:<3} ", "CPU");
        }
        let _ = writeln!(
            s,
            "{:<7} {:<7} {:<15} {:<16} {}",
            "PID",
            "TID",
            "COMM",
            "FUNC",
            if with_format { "-" } else { "" }
        );
        s
    }

    /// A binary whose frames user stacks may show (a probe's binary).
    pub fn add_file(&self, path: &std::path::Path) {
        self.symbols.add_file(path);
    }

    /// Snapshots a process's mappings (once) so its addresses keep their names.
    pub fn remember(&mut self, pid: u32) {
        if self.remembered.insert(pid) {
            self.symbols.remember(pid);
        }
    }

    /// Takes a process's mappings again: it mapped code since (dlopen).
    pub fn refresh(&mut self, pid: u32) {
        self.remembered.insert(pid);
        self.symbols.refresh(pid);
    }

    fn ksym(&self, addr: u64) -> String {
        let f = self.symbols.kernel(&[addr]).remove(&addr);
        ksym_text(&f.unwrap_or(Frame::unknown(addr)))
    }

    fn usyms(&mut self, pid: u32, comm: &str, frames: &[UserFrame]) -> Vec<(u64, String)> {
        self.remember(pid);
        self.symbols
            .user_frames(pid, comm, frames)
            .into_iter()
            .map(|(f, module)| {
                // The function's line as stacks print it (name+0x.., [unknown]
                // or [truncated]), and its file.
                let line = f.lines(true).pop().unwrap_or_default();
                let name = match module {
                    Some(m) => format!("{line} [{m}]"),
                    None => line,
                };
                (f.addr, name)
            })
            .collect()
    }

    /// The message of a record of `prog` (with `vals` and the strings in `tail`).
    pub fn message(
        &mut self,
        probe: &Probe,
        prog: &Program,
        h: &Header,
        vals: &[u64],
        tail: &[u8],
    ) -> Message {
        // A process's map is taken at its first record, whatever it prints.
        if self.o.user_stack {
            self.remember(h.tgid);
        }
        let Some(format) = &probe.format else {
            return Message {
                text: String::new(),
                values: Vec::new(),
            };
        };
        let mut values = Vec::with_capacity(prog.slots.len());
        let mut json = Vec::new();
        for (conv, slot) in format.convs().zip(&prog.slots) {
            let v = match *slot {
                Slot::Val(k) => {
                    let n = vals.get(k).copied().unwrap_or(0);
                    match conv.ty {
                        'K' => Value::Text(self.ksym(n)),
                        'U' => Value::Text(
                            self.usyms(h.tgid, &h.comm, &[UserFrame::Addr(n)])
                                .remove(0)
                                .1,
                        ),
                        _ => Value::Num(n),
                    }
                }
                Slot::Str(off) => {
                    let off = off as usize;
                    let end = (off + self.o.str_size).min(tail.len());
                    let bytes = tail.get(off..end).unwrap_or(&[]);
                    let s: Vec<u8> = bytes.iter().copied().take_while(|&c| c != 0).collect();
                    // Text keeps an event on its line and the terminal's state
                    // its own: control bytes (a newline or escape sequence in
                    // a process name, say) print as \xNN, as COMM does. JSON
                    // encodes them itself.
                    Value::Text(if self.o.json {
                        String::from_utf8_lossy(&s).into_owned()
                    } else {
                        common::escape(&s)
                    })
                }
            };
            // Typed values are only printed by --json.
            if self.o.json {
                json.push(conv.json(&v));
            }
            values.push(v);
        }
        Message {
            text: format.render(&values),
            values: json,
        }
    }

    /// The event's line (and stacks), or its JSON object.
    pub fn event(
        &mut self,
        h: &Header,
        func: &str,
        probe: &Probe,
        msg: &Message,
        tail: &[u8],
    ) -> String {
        let stack_at = h.str_bytes as usize;
        let kbytes = h.kstack.max(0) as usize;
        let frames = |from: usize, n: usize| -> Vec<u64> {
            tail.get(from..from + n)
                .unwrap_or(&[])
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
                .take_while(|&a| a != 0)
                .collect()
        };
        let kstack = self.o.kernel_stack.then(|| frames(stack_at, kbytes));
        // User stacks come as build ID and file offset per frame.
        let ustack = self.o.user_stack.then(|| {
            let from = stack_at + kbytes + h.ustack_skip as usize;
            UserFrame::decode(
                tail.get(from..from + h.ustack.max(0) as usize)
                    .unwrap_or(&[]),
            )
        });
        let kframes: Option<Vec<(u64, String)>> = kstack.map(|a| {
            let at: Vec<u64> = (a.iter().enumerate())
                .flat_map(|(i, &x)| common::symbolize::lookup_addrs(i, x))
                .collect();
            let named = self.symbols.kernel(&at);
            let frames: Vec<Frame> = (a.iter().enumerate())
                .map(|(i, &x)| common::symbolize::frame_at(i, x, |y| named.get(&y).cloned()))
                .collect();
            // A syscall event's stack, taken in the raw sys_enter/sys_exit
            // program, begins where the tracepoint fired.
            let skip = common::stacks::raw_tracepoint_frames(&frames);
            frames[skip..]
                .iter()
                .map(|f| (f.addr, format!("{} [kernel]", ksym_text(f))))
                .collect()
        });
        let uframes: Option<Vec<(u64, String)>> = ustack.map(|f| {
            let mut named = self.usyms(h.tgid, &h.comm, &f);
            if h.ucaller {
                drop_repeated_caller(&mut named);
            }
            named
        });
        let secs = h.ts.saturating_sub(self.start_ns) as f64 / 1e9;
        if self.o.json {
            let mut v = json!({
                "time_s": secs,
                "unix_time": self.clock.unix(h.ts),
                "cpu": h.cpu,
                "pid": h.tgid,
                "tid": h.tid,
                "uid": h.uid,
                "comm": h.comm,
                "func": func,
                "probe": probe.text,
                "message": msg.text,
                "values": msg.values,
            });
            let names = |f: &Option<Vec<(u64, String)>>| {
                f.as_ref().map(|f| {
                    f.iter()
                        .map(|(_, n)| Json::from(n.clone()))
                        .collect::<Vec<_>>()
                })
            };
            if let Some(k) = names(&kframes) {
                v["kernel_stack"] = Json::from(k);
                if h.kstack < 0 {
                    v["kernel_stack_error"] = Json::from(h.kstack);
                }
            }
            if let Some(u) = names(&uframes) {
                v["user_stack"] = Json::from(u);
                if h.ustack < 0 {
                    v["user_stack_error"] = Json::from(h.ustack);
                }
            }
            return format!("{v}\n");
        }
        let mut s = String::with_capacity(64 + msg.text.len());
        if self.o.timestamp || self.o.time {
            let t = if self.o.timestamp {
                if self.o.unix {
                    format!("{:.6}", self.clock.unix(h.ts))
                } else {
                    format!("{secs:.6}")
                }
            } else {
                common::timestamp()
            };
            let w = if self.o.timestamp && self.o.unix {
                17
            } else {
                8
            };
            let t: String = t.chars().take(w).collect();
            let _ = write!(s, "{t:<w$} ");
        }
        if self.o.cpu {
            let _ = write!(s, "{:<3} ", h.cpu);
        }
        let _ = writeln!(
            s,
            "{:<7} {:<7} {:<15} {:<16} {}",
            h.tgid,
            h.tid,
            // Names are rarely escaped: no copy for those that are not.
            if h.comm.contains(char::is_control) {
                std::borrow::Cow::Owned(common::escape(h.comm.as_bytes()))
            } else {
                std::borrow::Cow::Borrowed(h.comm.as_str())
            },
            func,
            msg.text
        );
        for (frames, err) in [(&kframes, h.kstack), (&uframes, h.ustack)] {
            let Some(frames) = frames else { continue };
            if err < 0 {
                let _ = writeln!(s, "        {err}");
                continue;
            }
            for (addr, name) in frames {
                if self.o.address && *addr == 0 {
                    // A frame of a process gone before its map was read.
                    let _ = writeln!(s, "        {:>16} {name}", "?");
                } else if self.o.address {
                    let _ = writeln!(s, "        {addr:16x} {name}");
                } else {
                    let _ = writeln!(s, "        {name}");
                }
            }
        }
        if self.o.kernel_stack || self.o.user_stack {
            s.push('\n');
        }
        s
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A kernel frame as `%K` and stacks print it.
fn ksym_text(f: &Frame) -> String {
    match &f.name {
        Some(n) => format!("{n}+0x{:x}", f.offset),
        None => Frame::UNKNOWN.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(names: &[&str]) -> Vec<(u64, String)> {
        names.iter().map(|n| (0, n.to_string())).collect()
    }

    #[test]
    fn the_added_caller_is_dropped_when_repeated_or_unnamed() {
        let mut f = frames(&["leaf+0x0 [a]", "mid+0x9 [a]", "main+0xa0 [a]"]);
        drop_repeated_caller(&mut f);
        assert_eq!(f, frames(&["leaf+0x0 [a]", "mid+0x9 [a]", "main+0xa0 [a]"]));
        // The kernel's walk had it (push %rbp, 6.12+).
        let mut f = frames(&["mid+0x0 [a]", "main+0xa0 [a]", "main+0xa0 [a]", "x [b]"]);
        drop_repeated_caller(&mut f);
        assert_eq!(f, frames(&["mid+0x0 [a]", "main+0xa0 [a]", "x [b]"]));
        // No map read: not even its file is known.
        let mut f = frames(&["leaf+0x0 [a]", "[unknown]", "main+0xa0 [a]"]);
        drop_repeated_caller(&mut f);
        assert_eq!(f, frames(&["leaf+0x0 [a]", "main+0xa0 [a]"]));
        // A stripped file's: -s may name frame 2, the same place.
        let mut f = frames(&["snprintf+0x0 [c]", "[unknown] [s]", "main+0x1a [s]"]);
        drop_repeated_caller(&mut f);
        assert_eq!(f, frames(&["snprintf+0x0 [c]", "main+0x1a [s]"]));
    }
}
