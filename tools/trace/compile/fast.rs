//! The straight-line shapes: a predicate that is one operand and at most two
//! operations with a constant (`FastPred`), values that are plain copies, and
//! the gate a lone spec's fast predicate on one register makes. The BPF side
//! runs these without its interpreter (bpf/trace/vm.h fast_pred(), fast_val(),
//! gate_keeps()): a few branches, where the interpreter's 25-way operation would
//! multiply the paths the verifier walks.

use super::isa::*;

impl Operand {
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

/// The fast form of the predicate `insns` (its FILTER last), if it has one:
/// an operand, then at most two operations with a constant.
pub(super) fn fast_pred(insns: &[Insn]) -> Option<FastPred> {
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
pub(super) fn fast_vals(mut insns: &[Insn]) -> Option<Vec<Operand>> {
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
    /// The fast predicate, when a hit can be decided on one register read from
    /// the context before anything else (bpf/trace/abi.h F_GATE): an
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
            pad: [0; 3],
            imm: [p.ops[0].1, p.ops[1].1],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::encode::specs_of;
    use crate::compile::testing::user;

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
        assert_ne!(p.to_spec().flags & F_IDS, 0);
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
    }

    #[test]
    fn gate_for_a_lone_spec_on_one_register() {
        let gate = |g: Gate| [g.reg, g.shift, g.sign, g.op, g.keep];
        let p = user("c:read (arg2 % 1000 == 0) \"%d\", arg1").unwrap();
        let b = specs_of(&[3], &[&p]);
        assert_eq!((b.n, b.spec), (1, [3, 0, 0, 0]));
        assert_eq!(b.flags & F_GATE, F_GATE);
        assert_eq!(gate(b.gate), [1, 0, 0, B_MOD as u8, CMP_EQ]);
        assert_eq!(b.gate.imm[0], 1000);
        // A signed narrowing cast is the gate's too.
        let p = user("c:read ((short)arg1 < 0)").unwrap();
        assert_eq!(
            gate(specs_of(&[0], &[&p]).gate),
            [0, 48, 1, NO_OP, CMP_SIGNED | CMP_LT]
        );
        // retval at a return; an entry argument at a return (saved at entry).
        let r = user("r:c:read (retval == 7)").unwrap();
        assert_eq!(r.gate().map(|g| g.reg), Some(IN_RETVAL as u8));
        let r = user("r:c:read (arg1 == 7)").unwrap();
        assert_eq!(r.gate().map(|g| g.reg), Some(0));
        // Not for two specs, a predicate off the fast shape, or ids.
        assert_eq!(specs_of(&[0, 1], &[&p, &p]).flags & F_GATE, 0);
        for spec in [
            "c:read (arg1 == 1 && arg2 == 2)",
            "c:read ($pid == 1)",
            "c:read",
        ] {
            let q = user(spec).unwrap();
            assert_eq!(specs_of(&[0], &[&q]).flags & F_GATE, 0, "{spec}");
        }
    }
}
