//! C's typing of trace's expressions: integer types by name, the integer
//! promotions and usual arithmetic conversions, whether a signature's type
//! matches the kernel's, and a prototype as C.

use common::btf::{Kbtf, Proto, Ty};

/// A C integer type by name.
pub(crate) fn int_type(name: &str) -> Option<Ty> {
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

/// C's usual arithmetic conversions of two promoted operand types: the
/// common type's (bytes, signed). Unsigned wins at equal or greater width; a
/// wider signed type holds every value of a narrower unsigned one.
pub(super) fn usual_conversions(a: &Ty, b: &Ty) -> (u8, bool) {
    let (wa, wb) = (a.bytes() as u8, b.bytes() as u8);
    let signed = match (a.signed(), b.signed()) {
        (true, true) => true,
        (false, false) => false,
        (true, false) => wa > wb,
        (false, true) => wb > wa,
    };
    (wa.max(wb), signed)
}

/// C's integer promotion (to int), pointers as unsigned 64-bit.
pub(super) fn promote(t: &Ty) -> Ty {
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
pub(super) fn compatible(user: &Ty, real: &Ty) -> bool {
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
    use crate::compile::isa::*;
    use crate::compile::testing::user;

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
}
