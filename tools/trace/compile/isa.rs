//! The bytecode bpf/trace.bpf.c interprets, as user space builds it: limits,
//! opcodes, operand spaces and flags; an instruction (`Insn`), a plain operand
//! (`Operand`), the fast predicate and gate descriptions, and one compiled probe
//! (`Program`), with its -v listing.
//!
//! The numbers are the BPF side's (bpf/trace.bpf.c): keep them in step.

pub const MAX_INSNS: usize = 128;
pub const MAX_VALS: usize = 16;
pub const EVAL_STACK: usize = 16;
pub const REC_MAX: u32 = 512;
pub const LIT_MAX: usize = 128;
pub const LITS: usize = 256;
pub const STR_AREA: u32 = 4096;

pub(super) const IN_RETVAL: u32 = 6;
pub(super) const IN_TID: u32 = 7;
pub(super) const IN_TGID: u32 = 8;
pub(super) const IN_UID: u32 = 9;
pub(super) const IN_GID: u32 = 10;
pub(super) const IN_CPU: u32 = 11;
pub(super) const IN_USDT0: u32 = 12;
pub(super) const USDT_ARGS: u32 = 12;

pub(super) const OP_CONST: u8 = 1;
pub(super) const OP_IN: u8 = 2;
pub(super) const OP_REC: u8 = 3;
pub(super) const OP_LOAD: u8 = 4;
pub(super) const OP_BIN: u8 = 5;
pub(super) const OP_UN: u8 = 6;
pub(super) const OP_CAST: u8 = 7;
pub(super) const OP_FILTER: u8 = 8;
pub(super) const OP_VAL: u8 = 9;
pub(super) const OP_STR: u8 = 10;
pub(super) const OP_STRCMP: u8 = 11;

pub(super) const SPACE_USER: u8 = 0;
pub(super) const SPACE_KERNEL: u8 = 1;
pub(super) const SPACE_REC: u8 = 2;
pub(super) const SPACE_DATALOC: u8 = 3;
pub(super) const SIGNED: u8 = 0x10;
/// OP_STRCMP under -B: the literal's bytes against the bytes read, as they are.
pub(super) const RAW: u8 = 0x20;

pub(super) const B_ADD: u32 = 0;
pub(super) const B_SUB: u32 = 1;
pub(super) const B_MUL: u32 = 2;
pub(super) const B_DIV: u32 = 3;
pub(super) const B_MOD: u32 = 4;
pub(super) const B_SDIV: u32 = 5;
pub(super) const B_SMOD: u32 = 6;
pub(super) const B_AND: u32 = 7;
pub(super) const B_OR: u32 = 8;
pub(super) const B_XOR: u32 = 9;
pub(super) const B_SHL: u32 = 10;
pub(super) const B_SHR: u32 = 11;
pub(super) const B_SAR: u32 = 12;
pub(super) const B_EQ: u32 = 13;
pub(super) const B_NE: u32 = 14;
pub(super) const B_LTU: u32 = 15;
pub(super) const B_LEU: u32 = 16;
pub(super) const B_GTU: u32 = 17;
pub(super) const B_GEU: u32 = 18;
pub(super) const B_LTS: u32 = 19;
pub(super) const B_LES: u32 = 20;
pub(super) const B_GTS: u32 = 21;
pub(super) const B_GES: u32 = 22;
pub(super) const B_LAND: u32 = 23;
pub(super) const B_LOR: u32 = 24;

pub(super) const U_NOT: u32 = 0;
pub(super) const U_NEG: u32 = 1;
pub(super) const U_BNOT: u32 = 2;

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

pub(super) const OPD_IN: u8 = 1;
pub(super) const OPD_REC: u8 = 2;
pub(super) const NO_OP: u8 = 0xff;

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

/// One instruction (`struct tk_insn`).
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

/// Outcomes of a fast comparison (bpf/trace.bpf.c fast_pred()).
pub(super) const CMP_LT: u8 = 1;
pub(super) const CMP_EQ: u8 = 2;
pub(super) const CMP_GT: u8 = 4;
pub(super) const CMP_SIGNED: u8 = 8;

/// Inputs only gathered for a hit the predicate keeps (bpf/trace.bpf.c emit()).
pub(super) fn late_input(a: u32) -> bool {
    (IN_TID..=IN_CPU).contains(&a)
}

impl Program {
    /// Whether it runs at a return and reads an argument (arg1-arg6), which
    /// only its entry has.
    pub fn reads_entry_args(&self) -> bool {
        self.flags & F_RETURN != 0 && self.insns.iter().any(|i| i.op == OP_IN && i.a < 6)
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
