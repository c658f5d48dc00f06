//! Unwind tables for user stacks: an x86-64 ELF file's call frame information
//! (`.eh_frame`, and `.debug_frame` in the file or in its separate debug file)
//! turned into one compact table sorted by address, a [`Row`] wherever the rule
//! changes, that the BPF side (bpf/unwind.h) binary-searches to unwind stacks
//! without frame pointers ("stack deltas", as the OpenTelemetry eBPF profiler
//! calls them).
//!
//! gimli parses the CFI and evaluates every FDE's rows; this module only sorts
//! each row into the few rules the BPF side can follow, merges the rows and
//! fills the gaps between FDEs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, Encoding,
    EndianSlice, FrameDescriptionEntry, LittleEndian, Operation, Register, RegisterRule,
    UnwindContext, UnwindExpression, UnwindOffset, UnwindSection, UnwindTableRow,
};
use object::read::elf::{ElfFile64, FileHeader};
use object::{elf, CompressionFormat, Endianness, Object, ObjectSection, ReadCache, ReadRef};

use super::elf::{find_debug_file, open_binary, shown};

/// How a row finds the canonical frame address (CFA). Shared with bpf/unwind.h.
/// No usable rule here (gap between FDEs, r10-based CFA, unsupported expression):
/// the BPF side falls back to the frame-pointer walk.
pub const CFA_UNKNOWN: u8 = 0;
/// cfa = rsp + cfa_off
pub const CFA_RSP: u8 = 1;
/// cfa = rbp + cfa_off
pub const CFA_RBP: u8 = 2;
/// Lazy-binding PLT stub: cfa = rsp + 8 + ((pc & 15) >= cfa_off ? 8 : 0) (the
/// standard .plt DW_CFA_def_cfa_expression: breg7 8; breg16 0; lit15; and; lit10
/// or lit11; ge; lit3; shl; plus — cfa_off is that 10 or 11).
pub const CFA_PLT: u8 = 3;
/// Signal trampoline (__restore_rt; CIE augmentation 'S' or the CFA expression
/// "breg7 160; deref"): rbp=[rsp+120], rsp=[rsp+160], rip=[rsp+168].
pub const CFA_SIGNAL: u8 = 4;
/// Outermost frame: the return address is undefined (DW_CFA_undefined rip, as in
/// _start, clone, start_thread's callers).
pub const CFA_END: u8 = 5;
/// cfa = *(rbp + cfa_off) (gcc's stack-realigning functions:
/// DW_CFA_def_cfa_expression breg6 N; deref).
pub const CFA_RBP_DEREF: u8 = 6;

/// How a row recovers the caller's rbp.
/// Unchanged (SameValue, or no rule).
pub const RBP_SAME: u8 = 0;
/// rbp = *(cfa + rbp_off) (DW_CFA_offset rbp).
pub const RBP_AT_CFA: u8 = 1;
/// Any other rule: unknown after this frame.
pub const RBP_UNDEFINED: u8 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Row {
    /// First address (the ELF's virtual address, as in its symbol table) the row
    /// applies to; up to the next row's pc.
    pub pc: u32,
    pub cfa: u8,
    pub rbp: u8,
    pub _pad: u16,
    pub cfa_off: i32,
    pub rbp_off: i32,
}

// The BPF side reads the rows as an array of 16-byte structs.
const _: () = assert!(std::mem::size_of::<Row>() == 16);

pub struct Table {
    /// Sorted by pc, strictly increasing; consecutive rows never equal but for pc
    /// (merged); a gap between FDEs is a CFA_UNKNOWN row at the end of the earlier
    /// FDE; the last row is CFA_UNKNOWN at the end of the last FDE.
    pub rows: Vec<Row>,
    /// Where the rows came from, for --debug: "eh_frame", "debug_frame",
    /// "eh_frame+debug_frame" (a .debug_frame FDE covers what .eh_frame lacks;
    /// .eh_frame wins where both cover), with the debug file's path noted when its
    /// .debug_frame gave rows, and a .debug_frame that could not be read noted.
    pub source: String,
}

impl Table {
    /// The row that applies at `pc`, as the BPF side finds it: the last row whose
    /// pc is not above it.
    pub fn row_at(&self, pc: u64) -> Option<&Row> {
        let i = self.rows.partition_point(|r| u64::from(r.pc) <= pc);
        i.checked_sub(1).map(|i| &self.rows[i])
    }
}

/// The unwind table of the ELF file at `path` (an executable or shared library,
/// PIE or not, stripped or not). Reads `.eh_frame` (.eh_frame_hdr is not needed)
/// and `.debug_frame`, both in the file and in its separate debug file (by build
/// ID under /usr/lib/debug/.build-id, or .gnu_debuglink). Files whose addresses
/// do not fit u32 are an error naming that.
pub fn table_of(path: &Path) -> Result<Table> {
    build(path).map(|(t, _)| t)
}

/// Whether the table says the code keeps frame pointers, for choosing the
/// frame-pointer walk in an "auto" mode.
///
/// The heuristic weighs code bytes by address range: bytes under CFA_RBP (or
/// CFA_RBP_DEREF) rows are frame-pointer code, bytes under CFA_RSP rows with a
/// CFA offset above 8 are code that pushed or reserved stack without setting up
/// rbp. Bytes at CFA_RSP 8 say nothing either way (leaf functions without any
/// push, and the entry and `ret` of every function), nor do gaps, PLT stubs,
/// signal trampolines and outermost frames. The code keeps frame pointers when
/// the frame-pointer bytes are more than half of the two counted kinds: with
/// -fno-omit-frame-pointer only the 3-byte `mov %rsp,%rbp` of each prologue is
/// counted against it; without, only functions using alloca, VLAs or stack
/// realignment (and some assembly) count for it.
pub fn keeps_frame_pointers(t: &Table) -> bool {
    let (fp, no_fp) = frame_pointer_bytes(t);
    fp > no_fp
}

/// The code bytes [`keeps_frame_pointers`] counts: (with rbp as the frame's
/// base, with a grown stack but rsp as the base).
fn frame_pointer_bytes(t: &Table) -> (u64, u64) {
    let (mut fp, mut no_fp) = (0u64, 0u64);
    for w in t.rows.windows(2) {
        let len = u64::from(w[1].pc - w[0].pc);
        match w[0].cfa {
            CFA_RBP | CFA_RBP_DEREF => fp += len,
            CFA_RSP if w[0].cfa_off > 8 => no_fp += len,
            _ => {}
        }
    }
    (fp, no_fp)
}

/// What building a table found beyond its rows: for measuring and for tests.
#[derive(Debug, Default)]
struct Stats {
    /// FDEs read (of all sections, before merging).
    fdes: usize,
    /// FDEs gimli could not parse or evaluate: left as gaps.
    bad_fdes: usize,
    /// FDE rows (before merging) the BPF side cannot follow, by why.
    unknown: BTreeMap<&'static str, usize>,
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// An address range under one rule, before merging.
struct Seg {
    start: u64,
    end: u64,
    row: Row,
    from: Origin,
}

/// Which section a [`Seg`] came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    Eh,
    Debug,
    DebugFile,
}

const RSP: Register = gimli::X86_64::RSP;
const RBP: Register = gimli::X86_64::RBP;
const RA: Register = gimli::X86_64::RA;

fn build(path: &Path) -> Result<(Table, Stats)> {
    let p = shown(path);
    let opened = open_binary(path)?;
    let cache = ReadCache::new(&opened.file);
    let file = ElfFile64::<Endianness, _>::parse(&cache)
        .map_err(|e| anyhow!("{p} is a truncated or corrupt ELF file ({e})"))?;
    if file.elf_header().e_machine(file.endian()) != elf::EM_X86_64 {
        bail!("{p} is not an x86-64 ELF file; unwind tables are built for x86-64 only");
    }
    let mut stats = Stats::default();
    let mut segs = Vec::new();

    // A debug file's .eh_frame is NOBITS: data() is then empty and adds nothing.
    if let Some(s) = file.section_by_name(".eh_frame") {
        let data = s
            .data()
            .map_err(|e| anyhow!("{p}: reading .eh_frame: {e}"))?;
        let mut eh = EhFrame::new(data, LittleEndian);
        eh.set_address_size(8);
        // Pointers in .eh_frame are pc-relative on x86-64; text and data bases
        // for the rare other encodings.
        let mut bases = BaseAddresses::default().set_eh_frame(s.address());
        if let Some(t) = file.section_by_name(".text") {
            bases = bases.set_text(t.address());
        }
        if let Some(g) = file.section_by_name(".got") {
            bases = bases.set_got(g.address());
        }
        collect(&eh, &bases, Origin::Eh, &mut segs, &mut stats)
            .map_err(|e| anyhow!("{p}: reading .eh_frame: {e}"))?;
    }
    // .debug_frame only adds to .eh_frame, and may be compressed (unsupported
    // here): one that cannot be read is noted in the source, not an error.
    let mut debug_note = String::new();
    let mut own = Vec::new();
    match debug_frame(&file, Origin::Debug, &mut own, &mut stats) {
        Ok(()) => segs.extend(own),
        Err(e) => debug_note = format!(" (.debug_frame unread: {e})"),
    }

    let mut debug_path: Option<PathBuf> = None;
    if let Some(dbg) = find_debug_file(path, &file) {
        // The debug file only adds to what the binary has: one that cannot be
        // read is noted, not an error.
        let more = (|| -> Result<()> {
            let d = open_binary(&dbg)?;
            let cache = ReadCache::new(&d.file);
            let df = ElfFile64::<Endianness, _>::parse(&cache)?;
            let mut more = Vec::new();
            let mut st = Stats::default();
            debug_frame(&df, Origin::DebugFile, &mut more, &mut st)?;
            segs.extend(more);
            stats.fdes += st.fdes;
            stats.bad_fdes += st.bad_fdes;
            for (k, v) in st.unknown {
                *stats.unknown.entry(k).or_default() += v;
            }
            Ok(())
        })();
        match more {
            Ok(()) => debug_path = Some(dbg),
            Err(e) => debug_note += &format!(" (debug file {} unread: {e})", shown(&dbg)),
        }
    }

    let merged = merge(segs);
    let rows = rows_of(&merged).map_err(|end| {
        anyhow!("{p}: code at {end:#x} is above 4 GiB, beyond the unwind table's 32-bit addresses")
    })?;
    if rows.is_empty() {
        bail!(
            "{p} has no call frame information (no FDE in .eh_frame or .debug_frame){debug_note}"
        );
    }
    let has = |f: Origin| merged.iter().any(|s| s.from == f);
    let eh = has(Origin::Eh);
    let from_debug_file = has(Origin::DebugFile);
    let df = has(Origin::Debug) || from_debug_file;
    let mut source = match (eh, df) {
        (true, true) => "eh_frame+debug_frame".to_string(),
        (true, false) => "eh_frame".to_string(),
        _ => "debug_frame".to_string(),
    };
    if let (true, Some(d)) = (from_debug_file, &debug_path) {
        source += &format!(" (.debug_frame of {})", shown(d));
    }
    source += &debug_note;
    Ok((Table { rows, source }, stats))
}

/// Adds the rows of the `.debug_frame` of `file`, if it has one.
fn debug_frame<'data, R: ReadRef<'data>>(
    file: &ElfFile64<'data, Endianness, R>,
    from: Origin,
    segs: &mut Vec<Seg>,
    stats: &mut Stats,
) -> Result<()> {
    let Some(s) = file.section_by_name(".debug_frame") else {
        return Ok(());
    };
    // Compressed debug sections (objcopy --compress-debug-sections) are
    // decompressed by object only with its compression feature, which this
    // build does not enable: such a section is an error here, noted by callers.
    if s.compressed_file_range()?.format != CompressionFormat::None {
        bail!("compressed, which this build does not read");
    }
    let data = s.data()?;
    let mut df = DebugFrame::new(data, LittleEndian);
    df.set_address_size(8);
    collect(&df, &BaseAddresses::default(), from, segs, stats)?;
    Ok(())
}

/// Adds the rows of every FDE of `section` to `segs`. An FDE that gimli cannot
/// parse or evaluate is left out (a gap, so CFA_UNKNOWN), and counted; a broken
/// section (an entry whose length cannot be read) is an error.
fn collect<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    from: Origin,
    segs: &mut Vec<Seg>,
    stats: &mut Stats,
) -> gimli::Result<()> {
    // Many FDEs share a few CIEs: parse each once.
    let mut cies: HashMap<usize, gimli::Result<CommonInformationEntry<Slice<'a>>>> = HashMap::new();
    let mut ctx = Box::new(UnwindContext::new());
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        stats.fdes += 1;
        let fde = partial.parse(|s, b, o| {
            cies.entry(UnwindOffset::into(o))
                .or_insert_with(|| s.cie_from_offset(b, o))
                .clone()
        });
        let mark = segs.len();
        let done = fde.and_then(|fde| fde_rows(section, bases, &mut ctx, &fde, from, segs, stats));
        if done.is_err() {
            segs.truncate(mark);
            stats.bad_fdes += 1;
        }
    }
    Ok(())
}

fn fde_rows<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    fde: &FrameDescriptionEntry<Slice<'a>>,
    from: Origin,
    segs: &mut Vec<Seg>,
    stats: &mut Stats,
) -> gimli::Result<()> {
    let (lo, hi) = (fde.initial_address(), fde.end_address());
    if lo >= hi {
        return Ok(());
    }
    let signal = fde.is_signal_trampoline();
    let encoding = fde.cie().encoding();
    let mut rows = fde.rows(section, bases, ctx)?;
    while let Some(r) = rows.next_row()? {
        // Rows past the FDE's range (an advance beyond its end) are not its code.
        let (start, end) = (r.start_address().max(lo), r.end_address().min(hi));
        if start >= end {
            continue;
        }
        let row = classify(section, encoding, signal, r).unwrap_or_else(|why| {
            *stats.unknown.entry(why).or_default() += 1;
            Row::default()
        });
        segs.push(Seg {
            start,
            end,
            row,
            from,
        });
    }
    Ok(())
}

/// The table row for one evaluated CFI row (its pc left 0), or why the BPF side
/// cannot follow it.
fn classify<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    encoding: Encoding,
    signal: bool,
    r: &UnwindTableRow<usize>,
) -> std::result::Result<Row, &'static str> {
    let only = |cfa| Row {
        cfa,
        ..Row::default()
    };
    if signal {
        return Ok(only(CFA_SIGNAL));
    }
    let (cfa, off) = match r.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => match *register {
            RSP => (CFA_RSP, *offset),
            RBP => (CFA_RBP, *offset),
            _ if matches!(r.register(RA), Some(RegisterRule::Undefined)) => {
                return Ok(only(CFA_END))
            }
            _ => return Err("CFA based on a register other than rsp or rbp"),
        },
        CfaRule::Expression(e) => match known_expression(section, encoding, e) {
            Some(Expr::Signal) => return Ok(only(CFA_SIGNAL)),
            Some(Expr::Plt(n)) => (CFA_PLT, n),
            Some(Expr::RbpDeref(n)) => (CFA_RBP_DEREF, n),
            None if matches!(r.register(RA), Some(RegisterRule::Undefined)) => {
                return Ok(only(CFA_END))
            }
            None => return Err("unsupported CFA expression"),
        },
    };
    match r.register(RA) {
        Some(RegisterRule::Undefined) => return Ok(only(CFA_END)),
        Some(RegisterRule::Offset(-8)) => {}
        // The PLT expression's rows keep the CIE's return address rule; the BPF
        // side knows where a PLT stub's return address is.
        _ if cfa == CFA_PLT => {}
        _ => return Err("return address not at cfa-8"),
    }
    let Ok(cfa_off) = i32::try_from(off) else {
        return Err("CFA offset beyond i32");
    };
    let (rbp, rbp_off) = match r.register(RBP) {
        None | Some(RegisterRule::Undefined) | Some(RegisterRule::SameValue) => (RBP_SAME, 0),
        Some(RegisterRule::Offset(n)) => match i32::try_from(n) {
            Ok(n) => (RBP_AT_CFA, n),
            Err(_) => (RBP_UNDEFINED, 0),
        },
        Some(_) => (RBP_UNDEFINED, 0),
    };
    Ok(Row {
        pc: 0,
        cfa,
        rbp,
        _pad: 0,
        cfa_off,
        rbp_off,
    })
}

/// The CFA expressions the BPF side evaluates as fixed rules.
enum Expr {
    /// The lazy-binding PLT stub's; the constant compared with `pc & 15`.
    Plt(i64),
    /// glibc's __restore_rt: the CFA is the interrupted rsp saved in the ucontext.
    Signal,
    /// gcc's stack realignment: the CFA is saved at rbp + offset.
    RbpDeref(i64),
}

fn known_expression<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    encoding: Encoding,
    e: &UnwindExpression<usize>,
) -> Option<Expr> {
    let mut ops = Vec::with_capacity(9);
    let mut it = e.get(section).ok()?.operations(encoding);
    while let Some(op) = it.next().ok()? {
        // Longer than any known one.
        if ops.len() == 9 {
            return None;
        }
        ops.push(op);
    }
    use Operation as O;
    const RIP: Register = RA;
    const DEREF: u8 = 8;
    match ops.as_slice() {
        [O::RegisterOffset {
            register: RSP,
            offset: 8,
            ..
        }, O::RegisterOffset {
            register: RIP,
            offset: 0,
            ..
        }, O::UnsignedConstant { value: 15 }, O::And, O::UnsignedConstant {
            value: n @ (10 | 11),
        }, O::Ge, O::UnsignedConstant { value: 3 }, O::Shl, O::Plus] => Some(Expr::Plt(*n as i64)),
        [O::RegisterOffset {
            register: RSP,
            offset: 160,
            ..
        }, O::Deref {
            size: DEREF,
            space: false,
            ..
        }] => Some(Expr::Signal),
        [O::RegisterOffset {
            register: RBP,
            offset,
            ..
        }, O::Deref {
            size: DEREF,
            space: false,
            ..
        }] => Some(Expr::RbpDeref(*offset)),
        _ => None,
    }
}

/// Disjoint segments sorted by start: where .eh_frame FDEs overlap, the first
/// (lowest start, then first in the section) wins; .debug_frame segments only
/// fill what .eh_frame leaves uncovered.
fn merge(segs: Vec<Seg>) -> Vec<Seg> {
    let (eh, dbg): (Vec<Seg>, Vec<Seg>) = segs.into_iter().partition(|s| s.from == Origin::Eh);
    let eh = first_wins(eh);
    if dbg.is_empty() {
        return eh;
    }
    let dbg = first_wins(dbg);
    let mut out = Vec::with_capacity(eh.len() + dbg.len());
    for s in dbg {
        let mut cur = s.start;
        let mut i = eh.partition_point(|e| e.end <= s.start);
        while cur < s.end {
            let next = eh.get(i).filter(|e| e.start < s.end);
            let until = next.map_or(s.end, |e| e.start);
            if cur < until {
                out.push(Seg {
                    start: cur,
                    end: until,
                    ..s
                });
            }
            match next {
                Some(e) => cur = cur.max(e.end),
                None => break,
            }
            i += 1;
        }
    }
    out.extend(eh);
    out.sort_unstable_by_key(|s| s.start);
    out
}

/// Sorts by start (stably: among equal starts the first read wins) and clips
/// each segment to what the ones before it leave.
fn first_wins(mut segs: Vec<Seg>) -> Vec<Seg> {
    segs.sort_by_key(|s| s.start);
    let mut covered = 0;
    segs.retain_mut(|s| {
        if s.end <= covered {
            return false;
        }
        s.start = s.start.max(covered);
        covered = s.end;
        true
    });
    segs
}

/// The table rows of disjoint sorted segments: equal neighbours merged, a
/// CFA_UNKNOWN row at each gap and at the end. Err(address) when an address does
/// not fit u32.
fn rows_of(segs: &[Seg]) -> std::result::Result<Vec<Row>, u64> {
    let mut rows: Vec<Row> = Vec::with_capacity(segs.len() / 2 + 1);
    let mut push = |pc: u64, row: Row| -> std::result::Result<(), u64> {
        let pc = u32::try_from(pc).map_err(|_| pc)?;
        let row = Row { pc, ..row };
        match rows.last() {
            Some(last) if Row { pc, ..*last } == row => {}
            _ => rows.push(row),
        }
        Ok(())
    };
    let mut end: Option<u64> = None;
    for s in segs {
        if let Some(e) = end.filter(|&e| e < s.start) {
            push(e, Row::default())?;
        }
        push(s.start, s.row)?;
        end = Some(s.end);
    }
    if let Some(e) = end {
        push(e, Row::default())?;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::process::Command;
    use std::time::Instant;

    /// A directory of its own for one test's compiled programs, removed after.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let d =
                std::env::temp_dir().join(format!("tracekit-cfi-{}-{name}", std::process::id()));
            fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A function that keeps four values across calls (four pushes, rbp among
    /// them) and reserves a buffer.
    const PROG: &str = r#"
#include <stdio.h>
__attribute__((noipa)) void sink(long *p) { __asm__ volatile("" :: "r"(p) : "memory"); }
__attribute__((noinline)) long pushes(long a, long b, long c, long d) {
    long buf[32];
    for (int i = 0; i < 32; i++) buf[i] = a * i + b;
    sink(buf);
    sink(buf + 1);
    return buf[3] + a + b + c + d;
}
int main(int argc, char **argv) { printf("%ld\n", pushes(argc, 2, 3, 4)); return 0; }
"#;

    /// `cc FLAGS -o DIR/NAME` of `src`, asserted.
    fn cc(dir: &Scratch, name: &str, src: &str, flags: &[&str]) -> PathBuf {
        let c = dir.0.join(format!("{name}.c"));
        fs::write(&c, src).unwrap();
        let out = dir.0.join(name);
        let st = Command::new("cc")
            .args(flags)
            .arg("-o")
            .arg(&out)
            .arg(&c)
            .status()
            .expect("running cc (package gcc)");
        assert!(st.success(), "cc {flags:?} {name}.c failed");
        out
    }

    /// The address of symbol `name` in the symbol tables of `path`.
    fn sym(path: &Path, name: &str) -> Option<u64> {
        sym_range(path, name).map(|(a, _)| a)
    }

    /// The address range of symbol `name` in the symbol tables of `path`.
    fn sym_range(path: &Path, name: &str) -> Option<(u64, u64)> {
        use object::ObjectSymbol;
        let data = fs::read(path).unwrap();
        let f = object::File::parse(&*data).unwrap();
        f.symbols()
            .chain(f.dynamic_symbols())
            .find(|s| s.name() == Ok(name))
            .map(|s| (s.address(), s.address() + s.size()))
    }

    fn entry(path: &Path) -> u64 {
        let data = fs::read(path).unwrap();
        object::File::parse(&*data).unwrap().entry()
    }

    /// What a table promises the BPF side.
    fn check(t: &Table) {
        assert!(t.rows.len() >= 2);
        for w in t.rows.windows(2) {
            assert!(w[0].pc < w[1].pc, "{:?} then {:?}", w[0], w[1]);
            assert_ne!(Row { pc: 0, ..w[0] }, Row { pc: 0, ..w[1] }, "not merged");
        }
        let last = t.rows.last().unwrap();
        assert_eq!(
            *last,
            Row {
                pc: last.pc,
                ..Row::default()
            }
        );
    }

    /// The rows from `lo` (the one that applies there first) below `hi`.
    fn rows_in(t: &Table, lo: u64, hi: u64) -> Vec<Row> {
        let mut v = vec![*t.row_at(lo).unwrap()];
        v.extend(
            t.rows
                .iter()
                .filter(|r| u64::from(r.pc) > lo && u64::from(r.pc) < hi),
        );
        v
    }

    fn row(cfa: u8, cfa_off: i32, rbp: u8, rbp_off: i32) -> Row {
        Row {
            pc: 0,
            cfa,
            rbp,
            _pad: 0,
            cfa_off,
            rbp_off,
        }
    }

    fn unpc(rows: &[Row]) -> Vec<Row> {
        rows.iter().map(|r| Row { pc: 0, ..*r }).collect()
    }

    #[test]
    fn cfi_without_frame_pointers() {
        let d = Scratch::new("omit");
        let bin = cc(&d, "omit", PROG, &["-O2", "-fomit-frame-pointer"]);
        let t = table_of(&bin).unwrap();
        check(&t);
        assert_eq!(t.source, "eh_frame");
        let lo = sym(&bin, "pushes").unwrap();
        let rows = rows_in(&t, lo, lo + 40);
        assert_eq!(rows[0].pc as u64, lo);
        // push r13; push r12; push rbp; push rbx; sub $0x108,%rsp.
        assert_eq!(
            unpc(&rows[..6]),
            [
                row(CFA_RSP, 8, RBP_SAME, 0),
                row(CFA_RSP, 16, RBP_SAME, 0),
                row(CFA_RSP, 24, RBP_SAME, 0),
                row(CFA_RSP, 32, RBP_AT_CFA, -32),
                row(CFA_RSP, 40, RBP_AT_CFA, -32),
                row(CFA_RSP, 40 + 0x108, RBP_AT_CFA, -32),
            ]
        );
        // The entry of a glibc program is its outermost frame.
        assert_eq!(t.row_at(entry(&bin)).unwrap().cfa, CFA_END);
        assert_eq!(sym(&bin, "_start"), Some(entry(&bin)));
    }

    #[test]
    fn cfi_with_frame_pointers_and_stripped() {
        let d = Scratch::new("fp");
        let flags = [
            "-O2",
            "-fno-omit-frame-pointer",
            "-mno-omit-leaf-frame-pointer",
        ];
        let bin = cc(&d, "fp", PROG, &flags);
        let t = table_of(&bin).unwrap();
        check(&t);
        let lo = sym(&bin, "pushes").unwrap();
        let rows = rows_in(&t, lo, lo + 16);
        // push %rbp (after an endbr64 when the compiler adds one); mov %rsp,%rbp.
        assert_eq!(
            rows[0],
            Row {
                pc: lo as u32,
                ..row(CFA_RSP, 8, RBP_SAME, 0)
            }
        );
        assert!(rows[1].pc as u64 - lo <= 4 + 1, "{rows:?}");
        assert_eq!(
            rows[1],
            Row {
                pc: rows[1].pc,
                ..row(CFA_RSP, 16, RBP_AT_CFA, -16)
            }
        );
        assert_eq!(
            rows[2],
            Row {
                pc: rows[1].pc + 3,
                ..row(CFA_RBP, 16, RBP_AT_CFA, -16)
            }
        );
        assert!(keeps_frame_pointers(&t));

        let stripped = d.0.join("fp.stripped");
        let st = Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(&bin)
            .status()
            .expect("running strip (package binutils)");
        assert!(st.success());
        assert_eq!(sym(&stripped, "pushes"), None);
        let s = table_of(&stripped).unwrap();
        assert_eq!(s.rows, t.rows);
        assert_eq!(s.source, "eh_frame");
    }

    #[test]
    fn cfi_plt_stubs() {
        let d = Scratch::new("plt");
        let bin = cc(&d, "plt", PROG, &["-O2", "-Wl,-z,lazy"]);
        let t = table_of(&bin).unwrap();
        check(&t);
        let data = fs::read(&bin).unwrap();
        let f = object::File::parse(&*data).unwrap();
        let plt = f.section_by_name(".plt").expect(".plt").address();
        // PLT0 pushes the link map: rsp + 16, then 24 before its jmp.
        assert_eq!(t.row_at(plt).unwrap().cfa, CFA_RSP);
        assert_eq!(t.row_at(plt).unwrap().cfa_off, 16);
        let stub = t.row_at(plt + 16).unwrap();
        assert_eq!(stub.cfa, CFA_PLT, "{stub:?}");
        assert!(matches!(stub.cfa_off, 10 | 11), "{stub:?}");
    }

    /// gcc's dynamic realignment pointer (DRAP): alloca or a VLA in a function
    /// that realigns its stack. The CFA is first r10-based, then saved at rbp-16.
    #[test]
    fn cfi_realigned_stack() {
        let d = Scratch::new("realign");
        let src = r#"
__attribute__((noipa)) void sinkv(void *p) { __asm__ volatile("" :: "r"(p) : "memory"); }
__attribute__((noinline)) long realign(long n) {
    _Alignas(64) long buf[8];
    long vla[n];
    buf[0] = n; vla[0] = n;
    sinkv(buf); sinkv(vla);
    return buf[1] + vla[1];
}
int main(int argc, char **argv) { return (int)realign(argc); }
"#;
        let bin = cc(&d, "realign", src, &["-O2"]);
        let t = table_of(&bin).unwrap();
        check(&t);
        let (lo, hi) = sym_range(&bin, "realign").unwrap();
        let rows = rows_in(&t, lo, hi);
        assert_eq!(rows[0].pc as u64, lo);
        // The saved rbp is at [rbp] (DW_CFA_expression rbp: breg6 0), not at a
        // fixed distance from the CFA: unknown after this frame.
        assert_eq!(
            unpc(&rows),
            [
                row(CFA_RSP, 8, RBP_SAME, 0),
                Row::default(),
                row(CFA_RBP_DEREF, -16, RBP_UNDEFINED, 0),
                Row::default(),
                // At its `ret`: rsp-based again, rbp's rule still the expression.
                row(CFA_RSP, 8, RBP_UNDEFINED, 0),
            ]
        );
    }

    /// Code built without unwind tables but with -g has only .debug_frame, in the
    /// file or, once split off, in its debug file (found by .gnu_debuglink).
    #[test]
    fn cfi_debug_frame_and_debug_file() {
        let d = Scratch::new("dbg");
        let flags = [
            "-O2",
            "-g",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ];
        let bin = cc(&d, "dbg", PROG, &flags);
        let t = table_of(&bin).unwrap();
        check(&t);
        assert_eq!(t.source, "eh_frame+debug_frame");
        let lo = sym(&bin, "pushes").unwrap();
        let rows = rows_in(&t, lo, lo + 40);
        assert_eq!(
            rows[0],
            Row {
                pc: lo as u32,
                ..row(CFA_RSP, 8, RBP_SAME, 0)
            }
        );
        assert_eq!(
            rows[5],
            Row {
                pc: rows[5].pc,
                ..row(CFA_RSP, 40 + 0x108, RBP_AT_CFA, -32)
            }
        );

        let run = |args: &[&str]| {
            let st = Command::new("objcopy")
                .args(args)
                .current_dir(&d.0)
                .status()
                .expect("running objcopy (package binutils)");
            assert!(st.success(), "objcopy {args:?}");
        };
        run(&["--only-keep-debug", "dbg", "dbg.debug"]);
        run(&[
            "--strip-debug",
            "--add-gnu-debuglink=dbg.debug",
            "dbg",
            "dbg.split",
        ]);
        let split = d.0.join("dbg.split");
        let s = table_of(&split).unwrap();
        assert_eq!(s.rows, t.rows);
        let debug = d.0.join("dbg.debug");
        assert_eq!(
            s.source,
            format!("eh_frame+debug_frame (.debug_frame of {})", debug.display())
        );
        // Without its debug file the function is a gap.
        fs::remove_file(&debug).unwrap();
        let s = table_of(&split).unwrap();
        check(&s);
        assert_eq!(s.source, "eh_frame");
        assert_eq!(
            *s.row_at(lo).unwrap(),
            Row {
                pc: s.row_at(lo).unwrap().pc,
                ..Row::default()
            }
        );
    }

    /// Compressed debug sections need object's compression feature, not
    /// enabled: the section is noted, the rest of the table stands.
    #[test]
    fn cfi_compressed_debug_frame_is_noted() {
        let d = Scratch::new("gz");
        let flags = [
            "-O2",
            "-g",
            "-gz",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ];
        let bin = cc(&d, "gz", PROG, &flags);
        let t = table_of(&bin).unwrap();
        check(&t);
        assert!(
            t.source
                .starts_with("eh_frame (.debug_frame unread: compressed"),
            "{}",
            t.source
        );
        let lo = sym(&bin, "pushes").unwrap();
        assert_eq!(t.row_at(lo).unwrap().cfa, CFA_UNKNOWN);
    }

    fn libc() -> PathBuf {
        crate::user::targets::resolve("c", None).unwrap()
    }

    /// `__restore_rt` of libc: a local symbol, often only in the debug file.
    fn restore_rt(path: &Path) -> Option<u64> {
        if let Some(a) = sym(path, "__restore_rt") {
            return Some(a);
        }
        let data = fs::read(path).unwrap();
        let f = ElfFile64::<Endianness>::parse(&*data).unwrap();
        sym(&find_debug_file(path, &f)?, "__restore_rt")
    }

    #[test]
    fn cfi_libc() {
        let path = libc();
        let (t, stats) = build(&path).unwrap();
        check(&t);
        assert_eq!(stats.bad_fdes, 0, "{stats:?}");
        match restore_rt(&path) {
            Some(a) => assert_eq!(t.row_at(a).unwrap().cfa, CFA_SIGNAL),
            // Without symbols: the one FDE with augmentation 'S'.
            None => assert!(t.rows.iter().any(|r| r.cfa == CFA_SIGNAL)),
        }
        assert!(!keeps_frame_pointers(&t));
        // /usr/bin/true is stripped: its entry, _start, by e_entry.
        let tru = Path::new("/usr/bin/true");
        if tru.exists() {
            let t = table_of(tru).unwrap();
            check(&t);
            assert_eq!(t.row_at(entry(tru)).unwrap().cfa, CFA_END);
        }
    }

    #[test]
    fn cfi_errors_name_the_file() {
        let e = table_of(Path::new("/nonexistent/cfi"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/nonexistent/cfi"), "{e}");
        let d = Scratch::new("err");
        let txt = d.0.join("text");
        fs::write(&txt, "not an ELF file").unwrap();
        let e = table_of(&txt).err().unwrap().to_string();
        assert!(e.contains("text") && e.contains("not an ELF file"), "{e}");
    }

    #[test]
    fn cfi_merge_prefers_eh_frame() {
        let seg = |start, end, off, from| Seg {
            start,
            end,
            row: row(CFA_RSP, off, RBP_SAME, 0),
            from,
        };
        let segs = vec![
            seg(0x1000, 0x1010, 8, Origin::Eh),
            seg(0x1020, 0x1030, 16, Origin::Eh),
            // Covers both and the gap between: only the gap and after is used.
            seg(0x1008, 0x1040, 24, Origin::Debug),
            // Overlaps the first eh_frame FDE: that one wins.
            seg(0x1004, 0x100c, 32, Origin::Eh),
        ];
        let rows = rows_of(&merge(segs)).unwrap();
        let at = |pc, off| Row {
            pc,
            ..row(CFA_RSP, off, RBP_SAME, 0)
        };
        assert_eq!(
            rows,
            [
                at(0x1000, 8),
                at(0x1010, 24),
                at(0x1020, 16),
                at(0x1030, 24),
                Row {
                    pc: 0x1040,
                    ..Row::default()
                },
            ]
        );
        assert_eq!(
            rows_of(&[seg(0xffff_fff0, 0x1_0000_0000, 8, Origin::Eh)]),
            Err(0x1_0000_0000)
        );
    }

    /// Sizes and times for the report: `cargo test --release -p tracekit-common
    /// cfi_measure -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn cfi_measure() {
        for p in [Path::new("/usr/bin/python3"), &libc()] {
            let start = Instant::now();
            let (t, stats) = build(p).unwrap();
            let took = start.elapsed();
            let mut kinds = [0usize; 7];
            for r in &t.rows {
                kinds[r.cfa as usize] += 1;
            }
            println!(
                "{}: {} rows ({} bytes) in {took:?}; source {}; rows by cfa kind {kinds:?}; {stats:?}; keeps frame pointers: {} (bytes {:?})",
                p.display(),
                t.rows.len(),
                t.rows.len() * 16,
                t.source,
                keeps_frame_pointers(&t),
                frame_pointer_bytes(&t),
            );
        }
    }
}
