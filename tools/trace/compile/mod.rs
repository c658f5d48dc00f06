//! From a parsed probe to the bytecode bpf/trace.bpf.c interprets: names bound
//! to registers, BTF types, tracepoint fields or USDT arguments; member paths
//! resolved to offsets; the predicate, then one store per format argument.
//!
//! Limits (bpf/trace.bpf.c has the same constants): 128 instructions and a
//! 16-deep value stack per probe, 16 arguments, 4096 bytes of strings per record.
//! Every refusal names the part of the expression it cannot do.

use common::kbtf::{Kbtf, Proto, Ty};

use crate::expr::{BinOp, Expr, TypeName, UnOp};
use crate::grammar::{Kind, Probe};

pub const MAX_INSNS: usize = 128;
pub const MAX_VALS: usize = 16;
pub const EVAL_STACK: usize = 16;
pub const REC_MAX: u32 = 512;
pub const LIT_MAX: usize = 128;
pub const LITS: usize = 256;
pub const STR_AREA: u32 = 4096;

const IN_RETVAL: u32 = 6;
const IN_TID: u32 = 7;
const IN_TGID: u32 = 8;
const IN_UID: u32 = 9;
const IN_GID: u32 = 10;
const IN_CPU: u32 = 11;
const IN_USDT0: u32 = 12;
const USDT_ARGS: u32 = 12;

const OP_CONST: u8 = 1;
const OP_IN: u8 = 2;
const OP_REC: u8 = 3;
const OP_LOAD: u8 = 4;
const OP_BIN: u8 = 5;
const OP_UN: u8 = 6;
const OP_CAST: u8 = 7;
const OP_FILTER: u8 = 8;
const OP_VAL: u8 = 9;
const OP_STR: u8 = 10;
const OP_STRCMP: u8 = 11;

const SPACE_USER: u8 = 0;
const SPACE_KERNEL: u8 = 1;
const SPACE_REC: u8 = 2;
const SPACE_DATALOC: u8 = 3;
const SIGNED: u8 = 0x10;
/// OP_STRCMP under -B: the literal's bytes against the bytes read, as they are.
const RAW: u8 = 0x20;

const B_ADD: u32 = 0;
const B_SUB: u32 = 1;
const B_MUL: u32 = 2;
const B_DIV: u32 = 3;
const B_MOD: u32 = 4;
const B_SDIV: u32 = 5;
const B_SMOD: u32 = 6;
const B_AND: u32 = 7;
const B_OR: u32 = 8;
const B_XOR: u32 = 9;
const B_SHL: u32 = 10;
const B_SHR: u32 = 11;
const B_SAR: u32 = 12;
const B_EQ: u32 = 13;
const B_NE: u32 = 14;
const B_LTU: u32 = 15;
const B_LEU: u32 = 16;
const B_GTU: u32 = 17;
const B_GEU: u32 = 18;
const B_LTS: u32 = 19;
const B_LES: u32 = 20;
const B_GTS: u32 = 21;
const B_GES: u32 = 22;
const B_LAND: u32 = 23;
const B_LOR: u32 = 24;

const U_NOT: u32 = 0;
const U_NEG: u32 = 1;
const U_BNOT: u32 = 2;

/// Spec flags (bpf/trace.bpf.c).
pub const F_RETURN: u32 = 1;
pub const F_SYSCALL: u32 = 2;
pub const F_IDS: u32 = 4;
pub const F_FAST_PRED: u32 = 8;
pub const F_FAST_VALS: u32 = 16;
/// `struct specs_of` only: its `gate` decides a function hit before anything else.
pub const F_GATE: u32 = 32;
/// `struct specs_of` only: a return spec reads the entry's arguments, so the
/// entry is kept for its return (else the return is not paired with it).
pub const F_ENTRY_ARGS: u32 = 64;

const OPD_IN: u8 = 1;
const OPD_REC: u8 = 2;
const NO_OP: u8 = 0xff;

/// A plain value the BPF side reads without its interpreter (`struct tk_operand`):
/// an input or a record field, truncated or extended to `size` bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Operand {
    pub src: u8,
    pub size: u8,
    pub sign: u8,
    /// The value it is stored to (fast values).
    pub val: u8,
    pub a: u32,
}

impl Operand {
    fn to_bytes(self, b: &mut Vec<u8>) {
        b.extend_from_slice(&[self.src, self.size, self.sign, self.val]);
        b.extend_from_slice(&self.a.to_ne_bytes());
    }

    /// The operand the instructions at the start of `insns` push, and how many
    /// they are: `in` (optionally `cast`), or `rec`.
    fn parse(insns: &[Insn]) -> Option<(Operand, usize)> {
        let first = insns.first()?;
        match first.op {
            OP_IN => {
                let mut o = Operand {
                    src: OPD_IN,
                    a: first.a,
                    ..Operand::default()
                };
                if let Some(c) = insns.get(1).filter(|c| c.op == OP_CAST) {
                    o.size = c.size;
                    o.sign = c.b & SIGNED;
                    return Some((o, 2));
                }
                Some((o, 1))
            }
            OP_REC => Some((
                Operand {
                    src: OPD_REC,
                    size: first.size,
                    sign: first.b & SIGNED,
                    val: 0,
                    a: first.a,
                },
                1,
            )),
            _ => None,
        }
    }
}

/// A predicate the BPF side runs straight-line: `x`, then `ops[0]` (an
/// arithmetic operation with a constant, or NO_OP), then `ops[1]`, a comparison
/// with a constant as the outcomes it keeps (CMP_LT | CMP_EQ | CMP_GT, and
/// CMP_SIGNED). A few branches, where the interpreter's 25-way operation would
/// multiply the paths the verifier walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FastPred {
    pub x: Operand,
    pub ops: [(u8, i64); 2],
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Insn {
    pub op: u8,
    pub size: u8,
    pub b: u8,
    pub a: u32,
    pub imm: i64,
}

/// Where a format argument's value is in a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    Val(usize),
    /// A string at this offset of the strings area.
    Str(u32),
}

/// One compiled probe at one site.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Program {
    pub flags: u32,
    pub usdt_mask: u32,
    pub rec_words: u32,
    /// The end of the last tracepoint field read (user space only).
    pub rec_end: u32,
    pub str_bytes: u32,
    pub insns: Vec<Insn>,
    pub lits: Vec<u8>,
    pub slots: Vec<Slot>,
    /// The instructions of the predicate (its FILTER included).
    pub pred_len: usize,
    /// The predicate, when it has the shape the BPF side runs without its
    /// interpreter (then the interpreter starts at `pred_len`).
    pub fast_pred: Option<FastPred>,
    /// The values, when every one is a plain copy (no interpreter at all).
    pub fast_vals: Option<Vec<Operand>>,
}

/// Bytes of `struct spec` in bpf/trace.bpf.c.
pub const SPEC_BYTES: usize = 32 + 8 + 8 + 16 + MAX_VALS * 8 + MAX_INSNS * 16 + LITS + LIT_MAX;

/// `struct gate` (bpf/trace.bpf.c): a fast predicate on one register, the
/// operand's narrowing as a shift.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gate {
    /// Argument 0..5, or IN_RETVAL.
    pub reg: u8,
    /// 64 - 8 * size for a narrowing cast, else 0.
    pub shift: u8,
    pub sign: u8,
    pub op: u8,
    pub keep: u8,
    pub imm: [i64; 2],
}

/// Bytes of `struct specs_of` in bpf/trace.bpf.c (its `struct gate` last).
pub const SPECS_OF_BYTES: usize = 32 + 24;

/// Inputs only gathered for a hit the predicate keeps (bpf/trace.bpf.c emit()).
fn late_input(a: u32) -> bool {
    (IN_TID..=IN_CPU).contains(&a)
}

/// The fast form of the predicate `insns` (its FILTER last), if it has one:
/// an operand, then at most two operations with a constant.
fn fast_pred(insns: &[Insn]) -> Option<FastPred> {
    let (x, mut i) = Operand::parse(insns)?;
    if x.src == OPD_IN && late_input(x.a) {
        return None;
    }
    let mut pairs = Vec::new();
    while let Some([c, b]) = insns.get(i..i + 2) {
        if c.op != OP_CONST || b.op != OP_BIN {
            break;
        }
        pairs.push((b.a, c.imm));
        i += 2;
    }
    if insns.get(i..)
        != Some(
            &[Insn {
                op: OP_FILTER,
                ..Insn::default()
            }][..],
        )
    {
        return None;
    }
    let not_zero = (CMP_LT | CMP_GT, 0);
    let ops = match pairs[..] {
        [] => [(NO_OP, 0), not_zero],
        [(op, imm)] => match cmp_mask(op) {
            Some(m) => [(NO_OP, 0), (m, imm)],
            None => [(arith(op)?, imm), not_zero],
        },
        [(a, aimm), (c, cimm)] => [(arith(a)?, aimm), (cmp_mask(c)?, cimm)],
        _ => return None,
    };
    Some(FastPred { x, ops })
}

/// Outcomes of a fast comparison (bpf/trace.bpf.c fast_pred()).
const CMP_LT: u8 = 1;
const CMP_EQ: u8 = 2;
const CMP_GT: u8 = 4;
const CMP_SIGNED: u8 = 8;

/// The outcomes a comparison operator keeps.
fn cmp_mask(op: u32) -> Option<u8> {
    Some(match op {
        B_EQ => CMP_EQ,
        B_NE => CMP_LT | CMP_GT,
        B_LTU => CMP_LT,
        B_LEU => CMP_LT | CMP_EQ,
        B_GTU => CMP_GT,
        B_GEU => CMP_GT | CMP_EQ,
        B_LTS => CMP_SIGNED | CMP_LT,
        B_LES => CMP_SIGNED | CMP_LT | CMP_EQ,
        B_GTS => CMP_SIGNED | CMP_GT,
        B_GES => CMP_SIGNED | CMP_GT | CMP_EQ,
        _ => return None,
    })
}

/// The arithmetic operations fast_pred() does.
fn arith(op: u32) -> Option<u8> {
    matches!(
        op,
        B_ADD | B_SUB | B_MUL | B_DIV | B_MOD | B_AND | B_OR | B_XOR | B_SHL | B_SHR | B_SAR
    )
    .then_some(op as u8)
}

/// The values `insns` store, if each is an operand stored as it is.
fn fast_vals(mut insns: &[Insn]) -> Option<Vec<Operand>> {
    let mut vals = Vec::new();
    while !insns.is_empty() {
        let (mut o, n) = Operand::parse(insns)?;
        let st = insns.get(n).filter(|v| v.op == OP_VAL)?;
        o.val = st.a as u8;
        vals.push(o);
        insns = &insns[n + 1..];
    }
    Some(vals)
}

impl Program {
    /// The program as the BPF side's `struct spec`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(SPEC_BYTES);
        let mut flags = self.flags;
        if self
            .insns
            .iter()
            .any(|i| i.op == OP_IN && late_input(i.a) && i.a != IN_TID && i.a != IN_TGID)
        {
            flags |= F_IDS;
        }
        if self.fast_pred.is_some() {
            flags |= F_FAST_PRED;
        }
        if self.fast_vals.is_some() {
            flags |= F_FAST_VALS;
        }
        let nvals = self
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Val(_)))
            .count();
        let fast = self.fast_vals.as_deref().unwrap_or(&[]);
        for v in [
            flags,
            self.insns.len() as u32,
            self.usdt_mask,
            self.rec_words,
            self.str_bytes,
            self.pred_len as u32,
            nvals as u32,
            fast.len() as u32,
        ] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        let p = self.fast_pred.unwrap_or(FastPred {
            x: Operand::default(),
            ops: [(NO_OP, 0); 2],
        });
        p.x.to_bytes(&mut b);
        b.extend_from_slice(&[p.ops[0].0, p.ops[1].0, 0, 0, 0, 0, 0, 0]);
        b.extend_from_slice(&p.ops[0].1.to_ne_bytes());
        b.extend_from_slice(&p.ops[1].1.to_ne_bytes());
        for k in 0..MAX_VALS {
            fast.get(k).copied().unwrap_or_default().to_bytes(&mut b);
        }
        for i in 0..MAX_INSNS {
            let x = self.insns.get(i).copied().unwrap_or_default();
            b.extend_from_slice(&[x.op, x.size, x.b, 0]);
            b.extend_from_slice(&x.a.to_ne_bytes());
            b.extend_from_slice(&x.imm.to_ne_bytes());
        }
        let mut lits = self.lits.clone();
        lits.resize(LITS + LIT_MAX, 0);
        b.extend_from_slice(&lits);
        b
    }

    /// Whether it runs at a return and reads an argument (arg1-arg6), which
    /// only its entry has.
    pub fn reads_entry_args(&self) -> bool {
        self.flags & F_RETURN != 0 && self.insns.iter().any(|i| i.op == OP_IN && i.a < 6)
    }

    /// The fast predicate, when a hit can be decided on one register read from
    /// the context before anything else (bpf/trace.bpf.c's F_GATE): an
    /// argument (not through a syscall wrapper's inner registers), or retval
    /// at a return.
    pub fn gate(&self) -> Option<Gate> {
        let p = self.fast_pred?;
        let reg =
            p.x.src == OPD_IN && (p.x.a < 6 || (p.x.a == IN_RETVAL && self.flags & F_RETURN != 0));
        let size = u32::from(p.x.size);
        (reg && self.flags & F_SYSCALL == 0).then_some(Gate {
            reg: p.x.a as u8,
            shift: if size > 0 && size < 8 {
                (64 - 8 * size) as u8
            } else {
                0
            },
            sign: u8::from(p.x.sign != 0),
            op: p.ops[0].0,
            keep: p.ops[1].0,
            imm: [p.ops[0].1, p.ops[1].1],
        })
    }

    /// The instructions, one per line (for -v).
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (n, i) in self.insns.iter().enumerate() {
            let name = match i.op {
                OP_CONST => "const",
                OP_IN => "in",
                OP_REC => "rec",
                OP_LOAD => "load",
                OP_BIN => "bin",
                OP_UN => "un",
                OP_CAST => "cast",
                OP_FILTER => "filter",
                OP_VAL => "val",
                OP_STR => "str",
                OP_STRCMP => "strcmp",
                _ => "?",
            };
            s.push_str(&format!(
                "    {n:3} {name:<6} a={} size={} b={:#x} imm={}\n",
                i.a, i.size, i.b, i.imm
            ));
        }
        // What runs without the interpreter (bpf/trace.bpf.c emit()).
        let fast: Vec<&str> = [
            self.fast_pred.map(|_| "predicate"),
            self.fast_vals.as_ref().map(|_| "values"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !fast.is_empty() {
            s.push_str(&format!(
                "    straight-line: {}
",
                fast.join(", ")
            ));
        }
        s
    }
}

/// A tracepoint record field (from tracefs `format`).
#[derive(Debug, Clone)]
pub struct TpField {
    pub name: String,
    pub offset: u32,
    pub size: u32,
    pub ty: Ty,
}

/// Whether a syscall event's record (`fields`, from its format) is laid out as
/// bpf/trace.bpf.c's raw sys_enter/sys_exit programs rebuild it from the
/// registers: the common fields in the first 8 bytes, `__syscall_nr` (4 bytes
/// at 8), then 8-byte fields from 16 on, one after the other: at most six (the
/// arguments) for an entry, `ret` alone for an exit.
pub fn syscall_record(fields: &[TpField], exit: bool) -> bool {
    let (common, rest): (Vec<&TpField>, Vec<&TpField>) =
        fields.iter().partition(|f| f.name.starts_with("common_"));
    if common.iter().any(|f| f.offset + f.size > 8) {
        return false;
    }
    let Some((nr, args)) = rest.split_first() else {
        return false;
    };
    if (nr.name.as_str(), nr.offset, nr.size) != ("__syscall_nr", 8, 4) {
        return false;
    }
    let laid_out = args
        .iter()
        .enumerate()
        .all(|(k, f)| f.offset == 16 + 8 * k as u32 && f.size == 8);
    laid_out
        && match exit {
            false => args.len() <= 6,
            true => args.len() == 1 && args[0].name == "ret",
        }
}

/// The BPF side's `struct specs_of` for a probe served by the specs `ids`
/// (their programs `progs`): what a hit must gather for them, and the gate of
/// a lone spec whose predicate is decided on one register.
pub fn specs_of(ids: &[u32], progs: &[&Program]) -> Vec<u8> {
    let mut flags = progs.iter().fold(0, |f, p| f | p.flags);
    let usdt = progs.iter().fold(0, |m, p| m | p.usdt_mask);
    let words = progs.iter().map(|p| p.rec_words).max().unwrap_or(0);
    let gate = match progs {
        [p] => p.gate(),
        _ => None,
    };
    if gate.is_some() {
        flags |= F_GATE;
    }
    if progs.iter().any(|p| p.reads_entry_args()) {
        flags |= F_ENTRY_ARGS;
    }
    let g = gate.unwrap_or_default();
    let mut v = Vec::with_capacity(SPECS_OF_BYTES);
    v.extend_from_slice(&(ids.len() as u32).to_ne_bytes());
    for k in 0..4 {
        v.extend_from_slice(&ids.get(k).copied().unwrap_or(0).to_ne_bytes());
    }
    for x in [flags, usdt, words] {
        v.extend_from_slice(&x.to_ne_bytes());
    }
    // struct gate: reg, shift, sign, op, keep, pad[3], imm[2].
    v.extend_from_slice(&[g.reg, g.shift, g.sign, g.op, g.keep, 0, 0, 0]);
    v.extend_from_slice(&g.imm[0].to_ne_bytes());
    v.extend_from_slice(&g.imm[1].to_ne_bytes());
    v
}

/// Parses a tracefs `format` file into its fields (the common_ ones included).
pub fn tp_fields(text: &str) -> Vec<TpField> {
    let mut out = Vec::new();
    for line in text.lines() {
        let (mut decl, mut off, mut size, mut signed) = (None, None, None, false);
        for part in line.trim().split(';') {
            let part = part.trim();
            if let Some(d) = part.strip_prefix("field:") {
                decl = Some(d.trim().to_string());
            } else if let Some(v) = part.strip_prefix("offset:") {
                off = v.parse::<u32>().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse::<u32>().ok();
            } else if let Some(v) = part.strip_prefix("signed:") {
                signed = v == "1";
            }
        }
        let (Some(decl), Some(offset), Some(size)) = (decl, off, size) else {
            continue;
        };
        let last = decl.split_whitespace().last().unwrap_or("");
        let name = last.split('[').next().unwrap_or(last).to_string();
        let ty = if decl.starts_with("__data_loc") {
            Ty::DataLoc
        } else if let Some(n) = last.find('[') {
            let elems: u32 = last[n + 1..].trim_end_matches(']').parse().unwrap_or(size);
            let each = size.checked_div(elems).unwrap_or(1);
            Ty::Array(
                Box::new(Ty::Int {
                    bytes: each.clamp(1, 8) as u8,
                    signed,
                }),
                elems,
            )
        } else if decl.contains('*') {
            let pointee = if decl.contains("char") {
                Ty::Int {
                    bytes: 1,
                    signed: true,
                }
            } else {
                Ty::Void
            };
            Ty::Ptr(Box::new(pointee))
        } else {
            // The declared C type, where known, over the size and signed flag:
            // syscall events store every argument in 8 unsigned bytes, yet an
            // `int dfd` of -100 or an `off_t offset` of -1 is negative.
            let base = decl[..decl.len() - last.len()].trim();
            match int_type(base) {
                Some(Ty::Int { bytes, signed }) if u32::from(bytes) <= size => {
                    Ty::Int { bytes, signed }
                }
                _ => Ty::Int {
                    bytes: size.clamp(1, 8) as u8,
                    signed,
                },
            }
        };
        out.push(TpField {
            name,
            offset,
            size,
            ty,
        });
    }
    out
}

/// What the probe is attached to.
#[derive(Clone)]
pub enum SiteCtx<'a> {
    /// A kernel function (its BTF prototype when the kernel has one; for a
    /// syscall wrapper, the syscall's).
    Kernel {
        func: &'a str,
        proto: Option<Proto>,
        syscall: bool,
    },
    User,
    Tracepoint {
        fields: &'a [TpField],
        syscalls: bool,
    },
    /// A USDT probe with this many arguments, of these types where known
    /// (bytes, signed).
    Usdt {
        args: u32,
        types: &'a [Option<(u8, bool)>],
    },
}

pub struct Ctx<'a> {
    pub site: SiteCtx<'a>,
    pub btf: Option<&'a Kbtf>,
    pub kernel_reads: bool,
    /// -Z: bytes read per string.
    pub str_size: u32,
    /// -B: STRCMP literals are byte lists (`{0x6C, 0x00}`).
    pub bin_cmp: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Space {
    User,
    Kernel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loc {
    /// On the value stack.
    Value,
    /// Its address is on the value stack.
    Addr,
    /// In the tracepoint record at this offset (nothing on the stack).
    Rec(u32),
}

#[derive(Debug, Clone)]
struct Val {
    ty: Ty,
    loc: Loc,
    space: Space,
}

/// A named parameter: argument register index and type.
struct Param {
    name: String,
    index: u32,
    ty: Ty,
}

/// The bytes of a `-B` STRCMP literal, a C array initializer as BCC's -B takes
/// it: `{0x6C, 0x00}` (hex, octal, decimal or 'c' elements, -128 to 255).
fn byte_list(lit: &str) -> Result<Vec<u8>, String> {
    let bad = || {
        format!(
            "-B: the STRCMP literal \"{lit}\" is not a list of bytes such as \"{{0x6C, 0x00}}\""
        )
    };
    let inner = lit
        .trim()
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .ok_or_else(bad)?;
    let mut items: Vec<&str> = inner.split(',').map(str::trim).collect();
    // C allows a trailing comma.
    if items.len() > 1 && items.last() == Some(&"") {
        items.pop();
    }
    items
        .iter()
        .map(|item| {
            let v: i64 = match item.as_bytes() {
                [b'\'', c, b'\''] => *c as i64,
                [b'-', ..] => -crate::expr::parse_number(&item[1..]).ok_or_else(bad)?,
                _ => crate::expr::parse_number(item).ok_or_else(bad)?,
            };
            match v {
                0..=255 => Ok(v as u8),
                -128..=-1 => Ok(v as i8 as u8),
                _ => Err(format!("-B: {item} in \"{lit}\" is not a byte")),
            }
        })
        .collect()
}

struct Gen<'a> {
    ctx: &'a Ctx<'a>,
    probe: &'a Probe,
    prog: Program,
    params: Vec<Param>,
    ret_ty: Ty,
    depth: usize,
    max_depth: usize,
}

/// Compiles `probe` for one site.
pub fn compile(probe: &Probe, ctx: &Ctx) -> Result<Program, String> {
    let mut g = Gen {
        ctx,
        probe,
        prog: Program::default(),
        params: Vec::new(),
        ret_ty: Ty::U64,
        depth: 0,
        max_depth: 0,
    };
    g.bind_params()?;
    if probe.kind == Kind::Return {
        g.prog.flags |= F_RETURN;
    }
    if let SiteCtx::Kernel { syscall: true, .. } = ctx.site {
        g.prog.flags |= F_SYSCALL;
        if !ctx.kernel_reads {
            return Err("the arguments of a syscall wrapper are read from kernel memory, which this kernel does not allow (lockdown=confidentiality)".into());
        }
    }
    if let Some(pred) = &probe.predicate {
        let v = g.expr(pred)?;
        g.rvalue(v)?;
        g.emit(OP_FILTER, 0, 0, 0, 0, -1);
        g.prog.pred_len = g.prog.insns.len();
    }
    let Some(format) = &probe.format else {
        return g.finish();
    };
    let mut vals = 0;
    let mut strs = 0u32;
    for (conv, arg) in format.convs().zip(&probe.args) {
        if conv.ty == 's' {
            let off = strs * ctx.str_size;
            strs += 1;
            if strs * ctx.str_size > STR_AREA {
                return Err(format!(
                    "{strs} strings of {} bytes (-Z) are more than the {STR_AREA} bytes a record holds",
                    ctx.str_size
                ));
            }
            let v = g.expr(arg)?;
            let space = g.string_source(v, arg)?;
            g.emit(OP_STR, 0, space, 0, 0, -1);
            g.prog.insns.last_mut().expect("just emitted").imm = off as i64;
            g.prog.slots.push(Slot::Str(off));
        } else {
            if vals >= MAX_VALS {
                return Err(format!("more than {MAX_VALS} numeric arguments"));
            }
            let v = g.expr(arg)?;
            if v.ty.is_char_array() || v.ty == Ty::DataLoc {
                return Err(format!("'{}' is a string: print it with %s", show(arg)));
            }
            g.rvalue(v)?;
            g.emit(OP_VAL, 0, 0, vals as u32, 0, -1);
            g.prog.slots.push(Slot::Val(vals));
            vals += 1;
        }
    }
    g.prog.str_bytes = strs * ctx.str_size;
    g.finish()
}

/// An expression as the user wrote it (approximately), for messages.
pub fn show(e: &Expr) -> String {
    match e {
        Expr::Num(v) => v.to_string(),
        Expr::Str(s) => format!("\"{}\"", String::from_utf8_lossy(s)),
        Expr::Ident(n) => n.clone(),
        Expr::Var(v) => format!("${v}"),
        Expr::Member { base, name, arrow } => {
            format!("{}{}{name}", show(base), if *arrow { "->" } else { "." })
        }
        Expr::Index(b, i) => format!("{}[{}]", show(b), show(i)),
        Expr::User(b) => format!("{}@user", show(b)),
        Expr::Unary(op, x) => format!(
            "{}{}",
            match op {
                UnOp::Not => "!",
                UnOp::Neg => "-",
                UnOp::BitNot => "~",
                UnOp::Deref => "*",
            },
            operand(x, u8::MAX)
        ),
        // Operands in parentheses where the parser would group them otherwise
        // (it groups equal operators from the left).
        Expr::Binary(op, l, r) => {
            let prec = op.precedence();
            format!(
                "{} {} {}",
                operand(l, prec),
                op.symbol(),
                operand(r, prec + 1)
            )
        }
        Expr::Cast(t, x) => format!("({t}){}", operand(x, u8::MAX)),
        Expr::Call(n, a) => format!("{n}({})", a.iter().map(show).collect::<Vec<_>>().join(", ")),
    }
}

/// [`show`] of an operand of an operator binding at `prec`: a binary expression
/// binding less tightly goes in parentheses.
fn operand(e: &Expr, prec: u8) -> String {
    match e {
        Expr::Binary(op, ..) if op.precedence() < prec => format!("({})", show(e)),
        _ => show(e),
    }
}

/// A C integer type by name.
fn int_type(name: &str) -> Option<Ty> {
    let (bytes, signed) = match name {
        "char" | "signed char" | "s8" | "__s8" | "int8_t" => (1, true),
        "unsigned char" | "u8" | "__u8" | "uint8_t" | "bool" | "_Bool" => (1, false),
        "short" | "short int" | "signed short" | "s16" | "__s16" | "int16_t" => (2, true),
        "unsigned short" | "unsigned short int" | "u16" | "__u16" | "uint16_t" => (2, false),
        "int" | "signed" | "signed int" | "s32" | "__s32" | "int32_t" | "pid_t" => (4, true),
        "unsigned" | "unsigned int" | "u32" | "__u32" | "uint32_t" | "uid_t" | "gid_t" => {
            (4, false)
        }
        "long" | "long int" | "signed long" | "long long" | "long long int" | "s64" | "__s64"
        | "int64_t" | "ssize_t" | "loff_t" | "off_t" => (8, true),
        "unsigned long"
        | "unsigned long int"
        | "unsigned long long"
        | "unsigned long long int"
        | "u64"
        | "__u64"
        | "uint64_t"
        | "size_t"
        | "uintptr_t" => (8, false),
        _ => return None,
    };
    Some(Ty::Int { bytes, signed })
}

impl Gen<'_> {
    fn finish(mut self) -> Result<Program, String> {
        if self.prog.insns.len() > MAX_INSNS {
            return Err(format!(
                "the predicate and arguments need {} instructions, over the {MAX_INSNS} trace runs per event: simplify them",
                self.prog.insns.len()
            ));
        }
        if self.max_depth > EVAL_STACK {
            return Err(format!(
                "an expression nests {} values deep, over the {EVAL_STACK} trace keeps: simplify it",
                self.max_depth
            ));
        }
        self.prog.rec_words = self.prog.rec_words.min(REC_MAX / 8);
        let (pred, body) = self.prog.insns.split_at(self.prog.pred_len);
        self.prog.fast_pred = if pred.is_empty() {
            None
        } else {
            fast_pred(pred)
        };
        self.prog.fast_vals = fast_vals(body);
        Ok(self.prog)
    }

    fn emit(&mut self, op: u8, size: u8, b: u8, a: u32, imm: i64, stack: i32) {
        self.prog.insns.push(Insn {
            op,
            size,
            b,
            a,
            imm,
        });
        self.depth = (self.depth as i32 + stack).max(0) as usize;
        self.max_depth = self.max_depth.max(self.depth);
    }

    /// Converts an operand of promoted type `from`, whose code is `code`, to the
    /// type (`wide` bytes, `signed`) of C's usual arithmetic conversions. The
    /// stack holds 64-bit values, extended as their types say: only a signed
    /// operand converted to unsigned int changes, its sign extension becoming a
    /// zero extension (-1 is 0xffffffff there). A constant is converted in
    /// place; other code gets a cast after it (the bytecode has no jumps, so an
    /// instruction inserted before the other operand's code moves nothing).
    fn convert(&mut self, code: std::ops::Range<usize>, from: &Ty, wide: u8, signed: bool) {
        if wide != 4 || signed || !from.signed() {
            return;
        }
        match &mut self.prog.insns[code.clone()] {
            [c] if c.op == OP_CONST => c.imm = c.imm as u32 as i64,
            _ => self.prog.insns.insert(
                code.end,
                Insn {
                    op: OP_CAST,
                    size: 4,
                    ..Insn::default()
                },
            ),
        }
    }

    fn push_const(&mut self, v: u64) {
        self.emit(OP_CONST, 0, 0, 0, v as i64, 1);
    }

    fn default_space(&self) -> Space {
        match self.ctx.site {
            SiteCtx::Kernel { .. } => Space::Kernel,
            SiteCtx::Tracepoint { syscalls, .. } => {
                if syscalls {
                    Space::User
                } else {
                    Space::Kernel
                }
            }
            SiteCtx::User | SiteCtx::Usdt { .. } => Space::User,
        }
    }

    /// Names for the arguments: the signature written in the probe (checked
    /// against BTF for kernel functions), else the kernel's BTF prototype.
    fn bind_params(&mut self) -> Result<(), String> {
        let proto = match &self.ctx.site {
            SiteCtx::Kernel { proto, .. } => proto.as_ref(),
            _ => None,
        };
        let btf = self.ctx.btf;
        if let (Some(p), Some(b)) = (proto, btf) {
            self.ret_ty = b.ty(p.ret);
        }
        if let Some(sig) = &self.probe.signature {
            if sig.len() > 6 {
                return Err("a signature names at most 6 arguments (registers)".into());
            }
            for (i, (tn, name)) in sig.iter().enumerate() {
                let ty = self.resolve_type(tn)?;
                if let (Some(p), Some(b), SiteCtx::Kernel { func, .. }) =
                    (proto, btf, &self.ctx.site)
                {
                    let Some((_, id)) = p.params.get(i) else {
                        return Err(format!(
                            "the signature has {} arguments, but {func} takes {} (BTF: {})",
                            sig.len(),
                            p.params.len(),
                            describe_proto(b, p)
                        ));
                    };
                    let real = b.ty(*id);
                    if !compatible(&ty, &real) {
                        return Err(format!(
                            "the signature says argument {} is '{tn}', but {func}'s is '{}' (BTF: {})",
                            i + 1,
                            b.c_name(*id),
                            describe_proto(b, p)
                        ));
                    }
                }
                self.params.push(Param {
                    name: name.clone(),
                    index: i as u32,
                    ty,
                });
            }
            return Ok(());
        }
        if let (Some(p), Some(b)) = (proto, btf) {
            for (i, (name, id)) in p.params.iter().enumerate().take(6) {
                if !name.is_empty() {
                    self.params.push(Param {
                        name: name.clone(),
                        index: i as u32,
                        ty: b.ty(*id),
                    });
                }
            }
        }
        Ok(())
    }

    fn resolve_type(&self, tn: &TypeName) -> Result<Ty, String> {
        let mut ty = if let Some(t) = int_type(&tn.base) {
            t
        } else if tn.base == "void" {
            Ty::Void
        } else if let Some(rest) = tn
            .base
            .strip_prefix("struct ")
            .map(|r| ("struct", r))
            .or_else(|| tn.base.strip_prefix("union ").map(|r| ("union", r)))
        {
            let Some(b) = self
                .ctx
                .btf
                .filter(|_| matches!(self.ctx.site, SiteCtx::Kernel { .. }))
            else {
                return Err(format!(
                    "'{}' is not known here: struct layouts come from the kernel's BTF, for kernel functions only",
                    tn.base
                ));
            };
            match b.record(rest.0, rest.1) {
                Some(id) => Ty::Record(id, tn.base.clone()),
                None => return Err(format!("the kernel's BTF has no '{}'", tn.base)),
            }
        } else if let Some(e) = tn.base.strip_prefix("enum ") {
            let _ = e;
            Ty::Int {
                bytes: 4,
                signed: false,
            }
        } else {
            return Err(format!(
                "unknown type '{}' (integer types, pointers, and kernel structs are supported)",
                tn.base
            ));
        };
        for _ in 0..tn.ptr {
            ty = Ty::Ptr(Box::new(ty));
        }
        Ok(ty)
    }

    /// Makes `v`'s value be on the stack.
    fn rvalue(&mut self, v: Val) -> Result<Val, String> {
        match v.loc {
            Loc::Value => Ok(v),
            Loc::Rec(off) => match &v.ty {
                Ty::Int { bytes, signed } => {
                    let b = if *signed { SIGNED } else { 0 };
                    self.emit(OP_REC, *bytes, b, off, 0, 1);
                    Ok(Val {
                        loc: Loc::Value,
                        ..v
                    })
                }
                Ty::Ptr(_) => {
                    self.emit(OP_REC, 8, 0, off, 0, 1);
                    Ok(Val {
                        loc: Loc::Value,
                        ..v
                    })
                }
                _ => Err(format!(
                    "a tracepoint field of type {} has no numeric value: print it with %s",
                    v.ty.name()
                )),
            },
            Loc::Addr => match &v.ty {
                Ty::Array(e, _) => Ok(Val {
                    ty: Ty::Ptr(e.clone()),
                    loc: Loc::Value,
                    space: v.space,
                }),
                Ty::Record(_, n) => Err(format!(
                    "'{n}' is a struct: name one of its members (->member or .member)"
                )),
                Ty::Void => Err("a void value cannot be read".into()),
                ty => {
                    let bytes = ty.bytes().clamp(1, 8) as u8;
                    let space = self.space_code(v.space, "a member")?;
                    let b = space | if ty.signed() { SIGNED } else { 0 };
                    self.emit(OP_LOAD, bytes, b, 0, 0, 0);
                    Ok(Val {
                        loc: Loc::Value,
                        ..v
                    })
                }
            },
        }
    }

    fn space_code(&self, s: Space, what: &str) -> Result<u8, String> {
        match s {
            Space::User => Ok(SPACE_USER),
            Space::Kernel if self.ctx.kernel_reads => Ok(SPACE_KERNEL),
            Space::Kernel => Err(format!(
                "reading {what} from kernel memory is not allowed on this kernel (lockdown=confidentiality); add @user if it points to user memory"
            )),
        }
    }

    /// Emits what a string read needs on the stack and returns its space.
    fn string_source(&mut self, v: Val, e: &Expr) -> Result<u8, String> {
        match (&v.loc, &v.ty) {
            (Loc::Rec(off), Ty::DataLoc) => {
                self.emit(OP_REC, 4, 0, *off, 0, 1);
                Ok(SPACE_DATALOC)
            }
            (Loc::Rec(off), t) if t.is_char_array() => {
                self.push_const(*off as u64);
                Ok(SPACE_REC)
            }
            (Loc::Addr, t) if t.is_char_array() => {
                self.space_code(v.space, &format!("the string '{}'", show(e)))
            }
            _ => {
                let space = v.space;
                let v = self.rvalue(v)?;
                // The bytes at a pointer to a pointer or to a struct are
                // addresses and fields, not text (BCC prints them as garbage).
                match &v.ty {
                    Ty::Ptr(t) if matches!(**t, Ty::Ptr(_)) => {
                        return Err(format!(
                            "'{0}' points to a pointer, not to a string: print *{0} or {0}[N]",
                            show(e)
                        ));
                    }
                    Ty::Ptr(t) if matches!(**t, Ty::Record(..)) => {
                        return Err(format!(
                            "'{}' points to a {}, not to a string: print one of its fields",
                            show(e),
                            t.name()
                        ));
                    }
                    _ => {}
                }
                if matches!(v.ty, Ty::Int { bytes, .. } if bytes < 8) {
                    return Err(format!(
                        "'{}' is a {}-byte integer, not a pointer to a string",
                        show(e),
                        v.ty.bytes()
                    ));
                }
                self.space_code(space, &format!("the string '{}'", show(e)))
            }
        }
    }

    /// Register `input` as a value of type `ty`: an integer narrower than the
    /// register is truncated to it (and sign-extended when signed), as C reads
    /// an `int` argument: the register's upper bits are not part of it.
    fn value(&mut self, ty: Ty, input: u32) -> Val {
        self.emit(OP_IN, 0, 0, input, 0, 1);
        if let Ty::Int { bytes, signed } = ty {
            if bytes < 8 {
                self.emit(OP_CAST, bytes, if signed { SIGNED } else { 0 }, 0, 0, 0);
            }
        }
        Val {
            ty,
            loc: Loc::Value,
            space: self.default_space(),
        }
    }

    fn expr(&mut self, e: &Expr) -> Result<Val, String> {
        match e {
            Expr::Num(n) => {
                self.push_const(*n);
                Ok(Val {
                    ty: Ty::Int {
                        bytes: if *n <= i32::MAX as u64 { 4 } else { 8 },
                        signed: *n <= i64::MAX as u64,
                    },
                    loc: Loc::Value,
                    space: self.default_space(),
                })
            }
            Expr::Str(s) => Err(format!(
                "the string \"{}\" can only be used in STRCMP(\"...\", value)",
                String::from_utf8_lossy(s)
            )),
            Expr::Var(v) => {
                let (input, ty) = match v.as_str() {
                    "pid" => (IN_TID, 4),
                    "tgid" => (IN_TGID, 4),
                    "uid" => (IN_UID, 4),
                    "gid" => (IN_GID, 4),
                    "cpu" => (IN_CPU, 4),
                    "task" => {
                        return Err(
                            "$task is not supported: use $pid, $tgid, $uid, $gid, $cpu".into()
                        )
                    }
                    other => {
                        return Err(format!(
                            "unknown variable '${other}' (there are $pid, $tgid, $uid, $gid, $cpu)"
                        ))
                    }
                };
                Ok(self.value(
                    Ty::Int {
                        bytes: ty,
                        signed: false,
                    },
                    input,
                ))
            }
            Expr::Ident(name) => self.ident(name),
            Expr::User(inner) => {
                let mut v = self.expr(inner)?;
                v.space = Space::User;
                Ok(v)
            }
            Expr::Member { base, name, arrow } => self.member(base, name, *arrow, e),
            Expr::Index(base, idx) => {
                let b = self.expr(base)?;
                let (elem, b) = match (&b.loc, b.ty.clone()) {
                    (Loc::Addr, Ty::Array(el, _)) => (*el, b),
                    (_, Ty::Ptr(el)) => (*el, self.rvalue(b)?),
                    _ => return Err(format!("'{}' is not an array or pointer", show(base))),
                };
                let size = elem.bytes().max(1);
                let i = self.expr(idx)?;
                self.rvalue(i)?;
                self.push_const(size as u64);
                self.emit(OP_BIN, 0, 0, B_MUL, 0, -1);
                self.emit(OP_BIN, 0, 0, B_ADD, 0, -1);
                Ok(Val {
                    ty: elem,
                    loc: Loc::Addr,
                    space: b.space,
                })
            }
            Expr::Unary(UnOp::Deref, x) => {
                let v = self.expr(x)?;
                let v = self.rvalue(v)?;
                let pointee = match &v.ty {
                    Ty::Ptr(t) => (**t).clone(),
                    // BCC's values are u64: *(arg1) reads 8 bytes.
                    _ => Ty::U64,
                };
                Ok(Val {
                    ty: pointee,
                    loc: Loc::Addr,
                    space: v.space,
                })
            }
            Expr::Unary(op, x) => {
                let v = self.expr(x)?;
                let v = self.rvalue(v)?;
                let (code, ty) = match op {
                    UnOp::Not => (
                        U_NOT,
                        Ty::Int {
                            bytes: 4,
                            signed: true,
                        },
                    ),
                    UnOp::Neg => (U_NEG, promote(&v.ty)),
                    _ => (U_BNOT, promote(&v.ty)),
                };
                // -5 and ~0 are constants: one OP_CONST, as fast_pred() and
                // usual_conversions() recognise.
                let last = self.prog.insns.last_mut();
                match last {
                    Some(c) if matches!(**x, Expr::Num(_)) && code != U_NOT => {
                        c.imm = if code == U_NEG {
                            c.imm.wrapping_neg()
                        } else {
                            !c.imm
                        };
                    }
                    _ => self.emit(OP_UN, 0, 0, code, 0, 0),
                }
                Ok(Val { ty, ..v })
            }
            Expr::Cast(tn, x) => {
                let ty = self.resolve_type(tn)?;
                let v = self.expr(x)?;
                let v = self.rvalue(v)?;
                if let Ty::Int { bytes, signed } = ty {
                    if bytes < 8 || signed != v.ty.signed() {
                        self.emit(OP_CAST, bytes, if signed { SIGNED } else { 0 }, 0, 0, 0);
                    }
                }
                if matches!(ty, Ty::Record(..) | Ty::Void) {
                    return Err(format!(
                        "cannot cast to '{tn}' (cast to a pointer: '{tn} *')"
                    ));
                }
                Ok(Val { ty, ..v })
            }
            Expr::Binary(op, l, r) => {
                // The kernel's division by zero gives 0 (a remainder: x), C's
                // is undefined: a constant divisor of 0 is a mistake.
                if matches!(op, BinOp::Div | BinOp::Mod) && matches!(**r, Expr::Num(0)) {
                    return Err(format!("'{}' divides by zero", show(e)));
                }
                let before_a = self.prog.insns.len();
                let a = self.expr(l)?;
                let a = self.rvalue(a)?;
                let after_a = self.prog.insns.len();
                let b = self.expr(r)?;
                let b = self.rvalue(b)?;
                let (pa, pb) = (promote(&a.ty), promote(&b.ty));
                let (wide, signed) = match op {
                    // The promoted left operand's type; && and || only test.
                    BinOp::Shl | BinOp::Shr | BinOp::LAnd | BinOp::LOr => {
                        (pa.bytes().max(pb.bytes()) as u8, pa.signed() && pb.signed())
                    }
                    _ => {
                        let (wide, signed) = usual_conversions(&pa, &pb);
                        self.convert(before_a..after_a, &pa, wide, signed);
                        let end = self.prog.insns.len();
                        self.convert(after_a..end, &pb, wide, signed);
                        (wide, signed)
                    }
                };
                let code = match op {
                    BinOp::Add => B_ADD,
                    BinOp::Sub => B_SUB,
                    BinOp::Mul => B_MUL,
                    BinOp::Div if signed => B_SDIV,
                    BinOp::Div => B_DIV,
                    BinOp::Mod if signed => B_SMOD,
                    BinOp::Mod => B_MOD,
                    BinOp::And => B_AND,
                    BinOp::Or => B_OR,
                    BinOp::Xor => B_XOR,
                    BinOp::Shl => B_SHL,
                    BinOp::Shr if pa.signed() => B_SAR,
                    BinOp::Shr => B_SHR,
                    BinOp::Eq => B_EQ,
                    BinOp::Ne => B_NE,
                    BinOp::Lt if signed => B_LTS,
                    BinOp::Lt => B_LTU,
                    BinOp::Le if signed => B_LES,
                    BinOp::Le => B_LEU,
                    BinOp::Gt if signed => B_GTS,
                    BinOp::Gt => B_GTU,
                    BinOp::Ge if signed => B_GES,
                    BinOp::Ge => B_GEU,
                    BinOp::LAnd => B_LAND,
                    BinOp::LOr => B_LOR,
                };
                self.emit(OP_BIN, 0, 0, code, 0, -1);
                let cmp = matches!(
                    op,
                    BinOp::Eq
                        | BinOp::Ne
                        | BinOp::Lt
                        | BinOp::Le
                        | BinOp::Gt
                        | BinOp::Ge
                        | BinOp::LAnd
                        | BinOp::LOr
                );
                let ty = if cmp {
                    Ty::Int {
                        bytes: 4,
                        signed: true,
                    }
                } else if matches!(a.ty, Ty::Ptr(_)) && matches!(op, BinOp::Add | BinOp::Sub) {
                    a.ty.clone()
                } else {
                    Ty::Int {
                        bytes: wide,
                        signed,
                    }
                };
                // 32-bit arithmetic wraps as C's does.
                if !cmp && wide == 4 {
                    self.emit(OP_CAST, 4, if signed { SIGNED } else { 0 }, 0, 0, 0);
                }
                Ok(Val {
                    ty,
                    loc: Loc::Value,
                    space: a.space,
                })
            }
            Expr::Call(name, args) => {
                if name != "STRCMP" {
                    return Err(format!(
                        "unknown function '{name}' (trace has STRCMP(\"literal\", value))"
                    ));
                }
                let (lit, other) = match args.as_slice() {
                    [Expr::Str(s), o] | [o, Expr::Str(s)] => (s, o),
                    _ => {
                        return Err(
                            "STRCMP takes a string literal and a value: STRCMP(\"text\", arg1)"
                                .into(),
                        )
                    }
                };
                let (bytes, raw) = if self.ctx.bin_cmp {
                    (byte_list(&String::from_utf8_lossy(lit))?, RAW)
                } else if lit.contains(&0) {
                    return Err("a STRCMP literal cannot hold a NUL byte (-B compares bytes: STRCMP(\"{0x6C, 0x00}\", arg1))".into());
                } else {
                    (lit.clone(), 0)
                };
                if bytes.len() >= LIT_MAX - 2 {
                    return Err(format!(
                        "the STRCMP literal is too long (at most {} bytes)",
                        LIT_MAX - 3
                    ));
                }
                let off = self.prog.lits.len();
                if off + bytes.len() + 1 > LITS {
                    return Err(format!(
                        "the STRCMP literals of a probe are over {LITS} bytes together"
                    ));
                }
                self.prog.lits.extend_from_slice(&bytes);
                self.prog.lits.push(0);
                let v = self.expr(other)?;
                let space = self.string_source(v, other)?;
                self.emit(OP_STRCMP, bytes.len() as u8, space | raw, off as u32, 0, 0);
                Ok(Val {
                    ty: Ty::Int {
                        bytes: 4,
                        signed: true,
                    },
                    loc: Loc::Value,
                    space: self.default_space(),
                })
            }
        }
    }

    fn ident(&mut self, name: &str) -> Result<Val, String> {
        if let Some(n) = name
            .strip_prefix("arg")
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|_| !name.starts_with("arg0"))
        {
            if let SiteCtx::Usdt { args, types } = self.ctx.site {
                if n == 0 || n > USDT_ARGS {
                    return Err(format!("USDT probes have arg1..arg{USDT_ARGS}, not {name}"));
                }
                if n > args {
                    return Err(match args {
                        0 => format!("this USDT probe has no arguments, so no {name}"),
                        1 => format!("this USDT probe has 1 argument (arg1), not {name}"),
                        _ => format!(
                            "this USDT probe has {args} arguments (arg1..arg{args}), not {name}"
                        ),
                    });
                }
                self.prog.usdt_mask |= 1 << (n - 1);
                // Read extended as the note says (bpf/trace.bpf.c usdt_arg()),
                // typed so: a signed argument compares signed.
                let ty = match types.get(n as usize - 1) {
                    Some(Some((bytes, signed))) => Ty::Int {
                        bytes: *bytes,
                        signed: *signed,
                    },
                    _ => Ty::U64,
                };
                return Ok(self.value(ty, IN_USDT0 + n - 1));
            }
            if let SiteCtx::Tracepoint { .. } = self.ctx.site {
                return Err(format!(
                    "tracepoints have no {name}: use args->FIELD ({})",
                    self.tp_field_names()
                ));
            }
            if n == 0 || n > 6 {
                return Err(format!("only arg1..arg6 are in registers, not {name}"));
            }
            return Ok(self.value(Ty::U64, n - 1));
        }
        if name == "retval" {
            if self.probe.kind != Kind::Return {
                return Err("retval is only available in return probes (r:)".into());
            }
            let ty = self.ret_ty.clone();
            return Ok(self.value(ty, IN_RETVAL));
        }
        if name == "args" {
            if let SiteCtx::Tracepoint { .. } = self.ctx.site {
                return Err("args is the tracepoint's record: name a field, args->FIELD".into());
            }
        }
        if let Some(p) = self.params.iter().find(|p| p.name == name) {
            let (ty, index) = (p.ty.clone(), p.index);
            return Ok(self.value(ty, index));
        }
        let mut known = vec!["arg1..arg6".to_string()];
        if self.probe.kind == Kind::Return {
            known.push("retval".into());
        }
        known.extend(self.params.iter().map(|p| p.name.clone()));
        Err(match &self.ctx.site {
            SiteCtx::Tracepoint { .. } => format!(
                "unknown name '{name}' (a tracepoint's fields are args->FIELD: {})",
                self.tp_field_names()
            ),
            SiteCtx::Usdt { .. } => format!("unknown name '{name}' (USDT arguments are arg1..arg{USDT_ARGS})"),
            SiteCtx::Kernel { func, proto: None, .. } => format!(
                "unknown name '{name}': {func} is not in the kernel's BTF, so only arg1..arg6 are known"
            ),
            SiteCtx::User if self.probe.signature.is_none() => format!(
                "unknown name '{name}' (user functions have arg1..arg6, or names from a signature: func(int {name}))"
            ),
            _ => format!("unknown name '{name}' (known: {})", known.join(", ")),
        })
    }

    fn tp_field_names(&self) -> String {
        match &self.ctx.site {
            SiteCtx::Tracepoint { fields, .. } => fields
                .iter()
                .filter(|f| !f.name.starts_with("common_"))
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            _ => String::new(),
        }
    }

    fn member(
        &mut self,
        base: &Expr,
        name: &str,
        arrow: bool,
        whole: &Expr,
    ) -> Result<Val, String> {
        if let (Expr::Ident(b), SiteCtx::Tracepoint { fields, .. }) = (base, &self.ctx.site) {
            if b == "args" {
                if !arrow {
                    return Err(format!("write args->{name}, not args.{name}"));
                }
                let Some(f) = fields.iter().find(|f| f.name == name) else {
                    return Err(format!(
                        "the tracepoint has no field '{name}' (fields: {})",
                        self.tp_field_names()
                    ));
                };
                if f.offset < 8 {
                    return Err(format!(
                        "args->{name} is in the record's common header, which trace cannot read (use $pid, $tgid)"
                    ));
                }
                if f.offset + f.size > REC_MAX {
                    return Err(format!(
                        "args->{name} lies past the first {REC_MAX} bytes of the record, which is all trace reads"
                    ));
                }
                let end = if f.ty == Ty::DataLoc {
                    if !self.ctx.kernel_reads {
                        return Err(format!(
                            "args->{name} is a __data_loc string, stored past the record's fields, which trace cannot read without kernel reads (lockdown=confidentiality)"
                        ));
                    }
                    REC_MAX
                } else {
                    f.offset + f.size
                };
                self.prog.rec_end = self.prog.rec_end.max(f.offset + f.size);
                self.prog.rec_words = self.prog.rec_words.max(end.div_ceil(8));
                return Ok(Val {
                    ty: f.ty.clone(),
                    loc: Loc::Rec(f.offset),
                    space: self.default_space(),
                });
            }
        }
        let b = self.expr(base)?;
        let b = if arrow {
            let v = self.rvalue(b)?;
            match &v.ty {
                Ty::Ptr(t) => Val {
                    ty: (**t).clone(),
                    loc: Loc::Addr,
                    space: v.space,
                },
                other => {
                    return Err(format!(
                        "'{}' is not a pointer to a struct ({}), so '->{name}' cannot be read{}",
                        show(base),
                        other.name(),
                        self.cast_hint()
                    ))
                }
            }
        } else {
            if b.loc != Loc::Addr {
                return Err(format!(
                    "'{}' is not a struct in memory: use '->' on pointers",
                    show(base)
                ));
            }
            b
        };
        let Ty::Record(id, rname) = &b.ty else {
            return Err(format!(
                "'{}' is not a struct ({}): '{}' has no members{}",
                show(base),
                b.ty.name(),
                show(whole),
                self.cast_hint()
            ));
        };
        let Some(btf) = self.ctx.btf else {
            return Err("struct members need the kernel's BTF".into());
        };
        let (off, tid) = btf.member(*id, name).map_err(|e| format!("{rname}: {e}"))?;
        if off > 0 {
            self.push_const(off as u64);
            self.emit(OP_BIN, 0, 0, B_ADD, 0, -1);
        }
        Ok(Val {
            ty: btf.ty(tid),
            loc: Loc::Addr,
            space: b.space,
        })
    }

    fn cast_hint(&self) -> &'static str {
        match self.ctx.site {
            SiteCtx::Kernel { .. } => {
                " (cast it: ((struct NAME *)arg1)->member, or name the argument in a signature)"
            }
            _ => "",
        }
    }
}

/// C's integer promotion (to int), pointers as unsigned 64-bit.
/// C's usual arithmetic conversions of two promoted operand types: the
/// common type's (bytes, signed). Unsigned wins at equal or greater width; a
/// wider signed type holds every value of a narrower unsigned one.
fn usual_conversions(a: &Ty, b: &Ty) -> (u8, bool) {
    let (wa, wb) = (a.bytes() as u8, b.bytes() as u8);
    let signed = match (a.signed(), b.signed()) {
        (true, true) => true,
        (false, false) => false,
        (true, false) => wa > wb,
        (false, true) => wb > wa,
    };
    (wa.max(wb), signed)
}

fn promote(t: &Ty) -> Ty {
    match t {
        Ty::Int { bytes, signed } if *bytes < 4 => {
            let _ = signed;
            Ty::Int {
                bytes: 4,
                signed: true,
            }
        }
        Ty::Int { .. } => t.clone(),
        _ => Ty::U64,
    }
}

/// Whether a signature's type matches the kernel's (same shape and size; any
/// pointer to a struct of the same name).
fn compatible(user: &Ty, real: &Ty) -> bool {
    match (user, real) {
        (Ty::Int { bytes: a, .. }, Ty::Int { bytes: b, .. }) => a == b,
        (Ty::Ptr(a), Ty::Ptr(b)) => match (&**a, &**b) {
            (Ty::Record(_, x), Ty::Record(_, y)) => x == y,
            (Ty::Record(..), _) | (_, Ty::Record(..)) => false,
            _ => true,
        },
        (Ty::Int { bytes: 8, .. }, Ty::Ptr(_)) | (Ty::Ptr(_), Ty::Int { bytes: 8, .. }) => true,
        _ => false,
    }
}

/// A kernel function's prototype as C (`struct file *file, size_t count`).
pub fn describe_proto(b: &Kbtf, p: &Proto) -> String {
    p.params
        .iter()
        .map(|(n, id)| {
            let t = b.c_name(*id);
            if t.ends_with('*') {
                format!("{t}{n}")
            } else {
                format!("{t} {n}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar;

    fn user(text: &str) -> Result<Program, String> {
        let p = grammar::parse(text)?;
        compile(
            &p,
            &Ctx {
                site: SiteCtx::User,
                btf: None,
                kernel_reads: false,
                str_size: 80,
                bin_cmp: false,
            },
        )
    }

    #[test]
    fn compiles_values_and_predicates() {
        let p = user("c:write (arg1 == 1 && arg3 > 2) \"%d %s\", arg3, arg2").unwrap();
        assert_eq!(p.slots, vec![Slot::Val(0), Slot::Str(0)]);
        assert_eq!(p.str_bytes, 80);
        assert!(p.insns.iter().any(|i| i.op == OP_FILTER));
        let p = user("r:c:read \"%d %d\", retval, arg1").unwrap();
        assert_eq!(p.flags & F_RETURN, F_RETURN);
        let p = user("c:open (STRCMP(\"a.txt\", arg1))").unwrap();
        assert_eq!(p.lits, b"a.txt\0");
    }

    #[test]
    fn fast_paths_only_for_their_shapes() {
        let arg = |a, val| Operand {
            src: OPD_IN,
            a,
            val,
            ..Operand::default()
        };
        let p = user("c:read (arg1 % 1000 == 0) \"%d %d\", arg1, arg2").unwrap();
        assert_eq!(
            p.fast_pred,
            Some(FastPred {
                x: arg(0, 0),
                ops: [(B_MOD as u8, 1000), (CMP_EQ, 0)],
            })
        );
        assert_eq!(p.fast_vals, Some(vec![arg(0, 0), arg(1, 1)]));
        assert_eq!(p.pred_len, 6);
        // A plain truth value, and a cast folded into the operand.
        let p = user("c:read (arg2) \"%d\", (short)arg1").unwrap();
        assert_eq!(
            p.fast_pred.map(|f| f.ops),
            Some([(NO_OP, 0), (CMP_LT | CMP_GT, 0)])
        );
        let q = user("c:read (arg1 & 4)").unwrap();
        assert_eq!(
            q.fast_pred.map(|f| f.ops),
            Some([(B_AND as u8, 4), (CMP_LT | CMP_GT, 0)])
        );
        assert_eq!(cmp_mask(B_LES), Some(CMP_SIGNED | CMP_LT | CMP_EQ));
        assert_eq!(cmp_mask(B_LAND), None);
        let v = p.fast_vals.unwrap();
        assert_eq!((v[0].size, v[0].sign), (2, SIGNED));
        // $uid is only gathered for a kept hit: that predicate runs in the
        // interpreter (the values still copy), and the spec says it reads ids.
        let p = user("c:read ($uid == 0) \"%d\", arg1").unwrap();
        assert!(p.fast_pred.is_none() && p.fast_vals.is_some());
        assert_ne!(
            u32::from_ne_bytes(p.to_bytes()[0..4].try_into().unwrap()) & F_IDS,
            0
        );
        // Three operations, STRCMP, strings and arithmetic in values: no fast path.
        assert!(user("c:read (arg1 + 1 + 2 == 3)")
            .unwrap()
            .fast_pred
            .is_none());
        assert!(user("c:open (STRCMP(\"a\", arg1))")
            .unwrap()
            .fast_pred
            .is_none());
        assert!(user("c:read \"%s\", arg2").unwrap().fast_vals.is_none());
        assert!(user("c:read \"%d\", arg2 + 1").unwrap().fast_vals.is_none());
        let p = user("c:read").unwrap();
        assert!(p.fast_pred.is_none());
        assert_eq!(p.fast_vals, Some(vec![]));
        assert_eq!(p.to_bytes().len(), SPEC_BYTES);
    }

    #[test]
    fn gate_for_a_lone_spec_on_one_register() {
        let flags = |b: &[u8]| u32::from_ne_bytes(b[20..24].try_into().unwrap());
        let p = user("c:read (arg2 % 1000 == 0) \"%d\", arg1").unwrap();
        let b = specs_of(&[3], &[&p]);
        assert_eq!(b.len(), SPECS_OF_BYTES);
        assert_eq!(flags(&b) & F_GATE, F_GATE);
        assert_eq!(&b[32..37], &[1, 0, 0, B_MOD as u8, CMP_EQ]);
        assert_eq!(i64::from_ne_bytes(b[40..48].try_into().unwrap()), 1000);
        // A signed narrowing cast is the gate's too.
        let p = user("c:read ((short)arg1 < 0)").unwrap();
        assert_eq!(
            &specs_of(&[0], &[&p])[32..37],
            &[0, 48, 1, NO_OP, CMP_SIGNED | CMP_LT]
        );
        // retval at a return; an entry argument at a return (saved at entry).
        let r = user("r:c:read (retval == 7)").unwrap();
        assert_eq!(r.gate().map(|g| g.reg), Some(IN_RETVAL as u8));
        let r = user("r:c:read (arg1 == 7)").unwrap();
        assert_eq!(r.gate().map(|g| g.reg), Some(0));
        // Not for two specs, a predicate off the fast shape, or ids.
        assert_eq!(flags(&specs_of(&[0, 1], &[&p, &p])) & F_GATE, 0);
        for spec in [
            "c:read (arg1 == 1 && arg2 == 2)",
            "c:read ($pid == 1)",
            "c:read",
        ] {
            let q = user(spec).unwrap();
            assert_eq!(flags(&specs_of(&[0], &[&q])) & F_GATE, 0, "{spec}");
        }
    }

    #[test]
    fn returns_keep_their_entry_only_to_read_its_arguments() {
        let flags = |spec: &str| {
            let p = user(spec).unwrap();
            u32::from_ne_bytes(specs_of(&[0], &[&p])[20..24].try_into().unwrap()) & F_ENTRY_ARGS
        };
        for spec in [
            "r:c:read \"%d\", arg3",
            "r:c:read (arg1 == 7)",
            "r:c:read (retval > arg3)",
            "r:c:read \"%s\", arg2",
        ] {
            assert_eq!(flags(spec), F_ENTRY_ARGS, "{spec}");
        }
        for spec in [
            "r:c:read",
            "r:c:read \"%d\", retval",
            "r:c:read (retval == 7) \"%d %d\", $pid, $cpu",
            "c:read \"%d\", arg3",
        ] {
            assert_eq!(flags(spec), 0, "{spec}");
        }
        // Two specs on one function: the one that reads an argument decides.
        let (a, b) = (
            user("r:c:read").unwrap(),
            user("r:c:read \"%d\", arg1").unwrap(),
        );
        let both = specs_of(&[0, 1], &[&a, &b]);
        assert_eq!(
            u32::from_ne_bytes(both[20..24].try_into().unwrap()) & F_ENTRY_ARGS,
            F_ENTRY_ARGS
        );
    }

    #[test]
    fn byte_lists_as_c_initializers() {
        assert_eq!(byte_list("{0x6C, 0x00}").unwrap(), [0x6c, 0]);
        assert_eq!(
            byte_list(" { 'A', 010, 255, -1, -128, } ").unwrap(),
            [65, 8, 255, 255, 128]
        );
        for bad in [
            "", "{}", "{,}", "0x6C", "{0x6C", "{1 2}", "{'ab'}", "{256}", "{-129}",
        ] {
            assert!(byte_list(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn operands_convert_as_c_converts_them() {
        let ops = |text: &str| -> Vec<(u8, u8, u8, i64)> {
            user(text)
                .unwrap()
                .insns
                .iter()
                .map(|i| (i.op, i.size, i.b, i.imm))
                .collect()
        };
        // unsigned int == -1: the constant becomes 0xffffffff, in place, and the
        // predicate keeps its fast form.
        let p = user("c:read(unsigned int x) (x == -1)").unwrap();
        assert_eq!(p.fast_pred.map(|f| f.ops[1]), Some((CMP_EQ, 0xffff_ffff)));
        // ~0 is -1, folded.
        assert!(ops("c:read(unsigned int x) (x != ~0)").contains(&(OP_CONST, 0, 0, 0xffff_ffff)));
        // A signed int operand that is not a constant gets a cast to unsigned
        // int after its code, left or right (after the signature's own cast).
        let (arg, int, uint) = (
            (OP_IN, 0, 0, 0),
            (OP_CAST, 4, SIGNED, 0),
            (OP_CAST, 4, 0, 0),
        );
        let tail = |v: Vec<(u8, u8, u8, i64)>| v[..5].to_vec();
        assert_eq!(
            tail(ops("c:read(int a, unsigned int b) (a < b)")),
            [arg, int, uint, arg, uint]
        );
        assert_eq!(
            tail(ops("c:read(unsigned int b, int a) (b < a)")),
            [arg, uint, arg, int, uint]
        );
        // A wider signed type holds every unsigned int: a signed comparison,
        // no cast.
        // no cast but the signature's of b.
        let p = user("c:read(long a, unsigned int b) (a < b)").unwrap();
        assert_eq!(p.insns.iter().filter(|i| i.op == OP_CAST).count(), 1);
        assert!(p.insns.iter().any(|i| i.op == OP_BIN && i.a == B_LTS));
        // At equal or greater width, unsigned wins.
        let p = user("c:read(long a, unsigned long b) (a < b)").unwrap();
        assert!(p.insns.iter().any(|i| i.op == OP_BIN && i.a == B_LTU));
    }

    #[test]
    fn usdt_arguments_have_their_notes_types() {
        let usdt = |text: &str| {
            let p = grammar::parse(text).unwrap();
            let ctx = Ctx {
                site: SiteCtx::Usdt {
                    args: 3,
                    types: &[Some((8, true)), Some((2, true)), None],
                },
                btf: None,
                kernel_reads: false,
                str_size: 80,
                bin_cmp: false,
            };
            compile(&p, &ctx).unwrap()
        };
        let cmp = |p: Program| p.insns.iter().find(|i| i.op == OP_BIN).map(|i| i.a);
        // "-8@..." and "-2@...": signed; an argument whose size is unknown is u64.
        assert_eq!(cmp(usdt("u:x:p (arg1 < 0)")), Some(B_LTS));
        assert_eq!(cmp(usdt("u:x:p (arg2 < -1)")), Some(B_LTS));
        assert_eq!(cmp(usdt("u:x:p (arg3 < 0)")), Some(B_LTU));
    }

    #[test]
    fn shown_expressions_group_as_parsed() {
        for text in [
            "arg1 - (arg2 - arg3)",
            "arg1 - arg2 - arg3",
            "(arg1 + 1) * -(arg2 | 4) == ~(u32)(arg3 >> 2)",
            "arg1 == 1 && (arg2 == 2 || arg3)",
        ] {
            let e = crate::expr::parse(text).unwrap();
            assert_eq!(show(&e), text);
            assert_eq!(crate::expr::parse(&show(&e)).unwrap(), e);
        }
    }

    #[test]
    fn refusals_name_the_part() {
        assert_eq!(
            user("c:read \"%d\", retval").unwrap_err(),
            "retval is only available in return probes (r:)"
        );
        assert!(user("c:read \"%d\", foo")
            .unwrap_err()
            .contains("unknown name 'foo'"));
        assert!(user("c:read \"%d\", arg1->x")
            .unwrap_err()
            .contains("not a pointer to a struct"));
        assert!(user("c:read \"%d\", $foo")
            .unwrap_err()
            .contains("unknown variable"));
        assert!(user("c:read \"%d\", arg7")
            .unwrap_err()
            .contains("arg1..arg6"));
        assert!(user("c:read (FOO(arg1))")
            .unwrap_err()
            .contains("unknown function"));
        assert_eq!(
            user("c:read (arg1 % 0 == 1)").unwrap_err(),
            "'arg1 % 0' divides by zero"
        );
        assert_eq!(
            user("c:read \"%d\", (arg1 + 1) / 0").unwrap_err(),
            "'(arg1 + 1) / 0' divides by zero"
        );
        assert_eq!(
            user("c:read (-(arg1 - 1) / 0 == (arg2 - (arg3 - 1)) * 2)").unwrap_err(),
            "'-(arg1 - 1) / 0' divides by zero"
        );
        // A divisor known only at run time divides as the kernel does.
        assert!(user("c:read \"%d\", arg1 / arg2").is_ok());
        let deep = format!("c:read ({})", vec!["arg1"; 200].join(" + "));
        assert!(user(&deep).unwrap_err().contains("instructions"));
        let kernel = grammar::parse("c:read \"%s\", *(u64 *)arg1").unwrap();
        let _ = kernel;
    }

    #[test]
    fn tracepoint_format() {
        let f = tp_fields(
            "name: sys_enter_openat\nID: 1\nformat:\n\
             \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
             \tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;\n\
             \tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;\n\
             \tfield:char comm[16];\toffset:32;\tsize:16;\tsigned:0;\n\
             \tfield:__data_loc char[] name;\toffset:48;\tsize:4;\tsigned:0;\n",
        );
        assert_eq!(f.len(), 5);
        assert!(matches!(f[2].ty, Ty::Ptr(_)));
        assert!(f[3].ty.is_char_array());
        assert_eq!(f[4].ty, Ty::DataLoc);
        let p =
            grammar::parse("t:a:b (args->__syscall_nr == 2) \"%s %s\", args->filename, args->comm")
                .unwrap();
        let prog = compile(
            &p,
            &Ctx {
                site: SiteCtx::Tracepoint {
                    fields: &f,
                    syscalls: true,
                },
                btf: None,
                kernel_reads: false,
                str_size: 16,
                bin_cmp: false,
            },
        )
        .unwrap();
        assert_eq!(prog.rec_words, 6);
    }

    #[test]
    fn syscall_records_the_raw_programs_rebuild() {
        let format = |fields: &[(&str, u32, u32)]| {
            let mut text = String::from(
                "format:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                 \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n",
            );
            for (decl, off, size) in fields {
                text += &format!("\tfield:{decl};\toffset:{off};\tsize:{size};\tsigned:0;\n");
            }
            tp_fields(&text)
        };
        let nr = ("int __syscall_nr", 8, 4);
        let openat = format(&[
            nr,
            ("int dfd", 16, 8),
            ("const char * filename", 24, 8),
            ("int flags", 32, 8),
            ("umode_t mode", 40, 8),
        ]);
        assert!(syscall_record(&openat, false));
        assert!(!syscall_record(&openat, true));
        assert!(syscall_record(&format(&[nr]), false)); // getpid: no argument
        let ret = format(&[nr, ("long ret", 16, 8)]);
        assert!(syscall_record(&ret, true));
        // Not as the raw programs fill it: a gap, a narrow field, a seventh
        // argument, a string copied into the record (a newer kernel's layout
        // could), no syscall number, or an exit with another field.
        assert!(!syscall_record(&format(&[nr, ("int fd", 24, 8)]), false));
        assert!(!syscall_record(&format(&[nr, ("int fd", 16, 4)]), false));
        let seven: Vec<(String, u32, u32)> = (0..7)
            .map(|k| (format!("long a{k}"), 16 + 8 * k, 8))
            .collect();
        let seven: Vec<(&str, u32, u32)> =
            seven.iter().map(|(d, o, s)| (d.as_str(), *o, *s)).collect();
        assert!(!syscall_record(
            &format(&[&[nr][..], &seven].concat()),
            false
        ));
        let with_string = format(&[
            nr,
            ("const char * filename", 16, 8),
            ("__data_loc char[] __filename_val", 24, 4),
        ]);
        assert!(!syscall_record(&with_string, false));
        assert!(!syscall_record(&format(&[("long ret", 16, 8)]), true));
        assert!(!syscall_record(&format(&[nr, ("long value", 16, 8)]), true));
        assert!(!syscall_record(
            &format(&[nr, ("long ret", 16, 8), ("long x", 24, 8)]),
            true
        ));
    }
}
