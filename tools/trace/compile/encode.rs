//! A compiled probe as the BPF side's tables: `struct spec` per program and
//! `struct specs_of` per probe (bpf/trace.bpf.c), with the flags only the
//! encoding adds (F_IDS, F_FAST_*, F_GATE, F_ENTRY_ARGS).

use super::isa::*;

/// Bytes of `struct spec` in bpf/trace.bpf.c.
pub const SPEC_BYTES: usize = 32 + 8 + 8 + 16 + MAX_VALS * 8 + MAX_INSNS * 16 + LITS + LIT_MAX;

/// Bytes of `struct specs_of` in bpf/trace.bpf.c (its `struct gate` last).
pub const SPECS_OF_BYTES: usize = 32 + 24;

impl Operand {
    fn to_bytes(self, b: &mut Vec<u8>) {
        b.extend_from_slice(&[self.src, self.size, self.sign, self.val]);
        b.extend_from_slice(&self.a.to_ne_bytes());
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::testing::user;

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
}
