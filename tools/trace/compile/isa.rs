//! The bytecode bpf/trace/vm.h interprets, as user space builds it: limits,
//! opcodes, operand spaces and flags; an instruction (`Insn`), a plain operand
//! (`Operand`), the fast predicate and gate descriptions, and one compiled probe
//! (`Program`), with its -v listing.
//!
//! The numbers are bpf/trace/abi.h's, read from the skeleton (skel::types):
//! none is written here.

use crate::skel::types as abi;

/// Constants of bpf/trace/abi.h as the skeleton has them (`abi::<enum>::<NAME>`),
/// narrowed to the width user space stores them in: a name the header no longer
/// has, or a value that does not fit, fails to compile.
macro_rules! from_abi {
    ($vis:vis $enum:ident as $t:ty: $($name:ident),+ $(,)?) => {
        $($vis const $name: $t = {
            let v = abi::$enum::$name.0;
            assert!(
                v as u64 <= <$t>::MAX as u64,
                concat!("bpf/trace/abi.h: ", stringify!($name), " does not fit")
            );
            v as $t
        };)+
    };
}

from_abi!(pub tk_limit as usize: MAX_INSNS, MAX_VALS, MAX_SPECS, EVAL_STACK, LIT_MAX, LITS, STATS);
from_abi!(pub tk_limit as u32: REC_MAX, STR_AREA);

// Inputs: the argument registers 0..5, then these.
from_abi!(pub(super) input as u32: IN_RETVAL, IN_TID, IN_TGID, IN_UID, IN_GID, IN_CPU, IN_USDT0);
pub(super) const USDT_ARGS: u32 = abi::input::IN_USDT_LAST.0 - IN_USDT0 + 1;

from_abi!(pub(super) op as u8: OP_CONST, OP_IN, OP_REC, OP_LOAD, OP_BIN, OP_UN, OP_CAST,
    OP_FILTER, OP_VAL, OP_STR, OP_STRCMP);

from_abi!(pub(super) space as u8: SPACE_USER, SPACE_KERNEL, SPACE_REC, SPACE_DATALOC);
// Or-ed with a space in an instruction's `b`; RAW: OP_STRCMP under -B, the
// literal's bytes against the bytes read, as they are.
from_abi!(pub(super) insn_flag as u8: SIGNED, RAW);

from_abi!(pub(super) bin as u32: B_ADD, B_SUB, B_MUL, B_DIV, B_MOD, B_SDIV, B_SMOD, B_AND,
    B_OR, B_XOR, B_SHL, B_SHR, B_SAR, B_EQ, B_NE, B_LTU, B_LEU, B_GTU, B_GEU, B_LTS, B_LES,
    B_GTS, B_GES, B_LAND, B_LOR);
from_abi!(pub(super) un as u32: U_NOT, U_NEG, U_BNOT);

// Spec flags. F_GATE and F_ENTRY_ARGS are `struct specs_of`'s only: its `gate`
// decides a function hit before anything else; a return spec reads the entry's
// arguments, so the entry is kept for its return (else the return is not
// paired with it).
from_abi!(pub spec_flag as u32: F_RETURN, F_SYSCALL, F_IDS, F_FAST_PRED, F_FAST_VALS, F_GATE,
    F_ENTRY_ARGS, F_USER_ENTRY);

from_abi!(pub(super) operand_src as u8: OPD_IN, OPD_REC);
// A fast predicate's arithmetic step: none.
from_abi!(pub(super) fast_op as u8: NO_OP);
// Outcomes a fast comparison keeps (bpf/trace/vm.h keeps()).
from_abi!(pub(super) cmp_keep as u8: CMP_LT, CMP_EQ, CMP_GT, CMP_SIGNED);
// Where a one-probe run's gate applies (the_gate in .rodata).
from_abi!(pub gate_site as u8: GATE_ENTRY, GATE_RETURN);

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

/// `struct gate`, as the skeleton has it: a fast predicate on one register
/// (`reg`: argument 0..5, or IN_RETVAL), the operand's narrowing as a shift
/// (`shift`: 64 - 8 * size for a narrowing cast, else 0).
pub type Gate = abi::gate;

/// Inputs only gathered for a hit the predicate keeps (bpf/trace/vm.h spec_run()).
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
        // What runs without the interpreter (bpf/trace/vm.h spec_run()).
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
