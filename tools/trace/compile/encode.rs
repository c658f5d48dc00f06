//! A compiled probe as the BPF side's tables, in the skeleton's types
//! (bpf/trace/abi.h): `struct spec` per program and `struct specs_of` per
//! probe, with the flags only the encoding adds (F_IDS, F_FAST_*, F_GATE,
//! F_ENTRY_ARGS).

use super::isa::*;
use crate::skel::types as abi;

impl Operand {
    fn to_abi(self) -> abi::tk_operand {
        abi::tk_operand {
            src: self.src,
            size: self.size,
            sign: self.sign,
            val: self.val,
            a: self.a,
        }
    }
}

impl Insn {
    fn to_abi(self) -> abi::tk_insn {
        abi::tk_insn {
            op: self.op,
            size: self.size,
            b: self.b,
            pad: 0,
            a: self.a,
            imm: self.imm,
        }
    }
}

impl Program {
    /// The program as the BPF side's `struct spec`.
    pub fn to_spec(&self) -> abi::spec {
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
        let p = self.fast_pred.unwrap_or(FastPred {
            x: Operand::default(),
            ops: [(NO_OP, 0); 2],
        });
        let mut s = abi::spec {
            flags,
            ninsns: self.insns.len() as u32,
            usdt_mask: self.usdt_mask,
            rec_words: self.rec_words,
            str_bytes: self.str_bytes,
            body: self.pred_len as u32,
            nvals: nvals as u32,
            nfast: fast.len() as u32,
            pred: p.x.to_abi(),
            pop: [p.ops[0].0, p.ops[1].0],
            pimm: [p.ops[0].1, p.ops[1].1],
            ..abi::spec::default()
        };
        // Each at most its array's length: gen.rs's limits.
        for (to, o) in s.fast.iter_mut().zip(fast) {
            *to = o.to_abi();
        }
        for (to, i) in s.insns.iter_mut().zip(&self.insns) {
            *to = i.to_abi();
        }
        for (to, &b) in s.lits.iter_mut().zip(&self.lits) {
            *to = b as i8;
        }
        s
    }
}

/// The BPF side's `struct specs_of` for a probe served by the specs `ids`
/// (their programs `progs`): what a hit must gather for them, and the gate of
/// a lone spec whose predicate is decided on one register.
pub fn specs_of(ids: &[u32], progs: &[&Program]) -> abi::specs_of {
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
    let mut s = abi::specs_of {
        n: ids.len() as u32,
        flags,
        usdt_mask: usdt,
        rec_words: words,
        gate: gate.unwrap_or_default(),
        ..abi::specs_of::default()
    };
    // At most MAX_SPECS: main.rs refuses more.
    for (to, &id) in s.spec.iter_mut().zip(ids) {
        *to = id;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::testing::user;

    #[test]
    fn returns_keep_their_entry_only_to_read_its_arguments() {
        let flags = |spec: &str| {
            let p = user(spec).unwrap();
            specs_of(&[0], &[&p]).flags & F_ENTRY_ARGS
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
        assert_eq!(both.flags & F_ENTRY_ARGS, F_ENTRY_ARGS);
    }
}
