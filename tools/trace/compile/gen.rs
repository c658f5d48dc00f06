//! The single pass from an expression to bytecode: it binds names (registers,
//! BTF parameters, tracepoint fields, USDT arguments), types them as C does
//! (types.rs), resolves member paths to offsets, and emits the instructions.
//! One expression per probe and at most MAX_INSNS instructions fit one pass.

use common::btf::Ty;

use super::fast::{fast_pred, fast_vals};
use super::isa::*;
use super::types::{compatible, describe_proto, int_type, promote, usual_conversions};
use super::{Ctx, SiteCtx};
use crate::expr::{BinOp, Expr, TypeName, UnOp};
use crate::grammar::{Kind, Probe};

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

/// A value's C type and where it is: on the value stack, at an address on
/// it, or in the tracepoint record.
#[derive(Debug, Clone)]
pub(super) struct Val {
    pub(super) ty: Ty,
    loc: Loc,
    space: Space,
    /// A register's bits whose C type nothing declares (argN at a kernel or
    /// user function, an 8-byte or unsized USDT argument, retval without
    /// BTF, constants and arithmetic on them): BCC reads these as u64 and
    /// lets `*` take them as an address. A declared integer cannot be.
    raw: bool,
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

/// The pass over one probe at one site: what it has emitted so far, and the
/// names and value-stack depth it tracks.
pub(super) struct Gen<'a> {
    ctx: &'a Ctx<'a>,
    probe: &'a Probe,
    pub(super) prog: Program,
    params: Vec<Param>,
    ret_ty: Ty,
    /// No prototype gives retval's type.
    ret_raw: bool,
    depth: usize,
    max_depth: usize,
}

impl<'a> Gen<'a> {
    pub(super) fn new(ctx: &'a Ctx<'a>, probe: &'a Probe) -> Gen<'a> {
        Gen {
            ctx,
            probe,
            prog: Program::default(),
            params: Vec::new(),
            ret_ty: Ty::U64,
            ret_raw: true,
            depth: 0,
            max_depth: 0,
        }
    }
    pub(super) fn finish(mut self) -> Result<Program, String> {
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

    pub(super) fn emit(&mut self, op: u8, size: u8, b: u8, a: u32, imm: i64, stack: i32) {
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
            SiteCtx::User | SiteCtx::Usdt { .. } | SiteCtx::Perf => Space::User,
        }
    }

    /// Names for the arguments: the signature written in the probe (checked
    /// against BTF for kernel functions), else the kernel's BTF prototype.
    pub(super) fn bind_params(&mut self) -> Result<(), String> {
        let proto = match &self.ctx.site {
            SiteCtx::Kernel { proto, .. } => proto.as_ref(),
            _ => None,
        };
        let btf = self.ctx.btf;
        if let (Some(p), Some(b)) = (proto, btf) {
            self.ret_ty = b.ty(p.ret);
            self.ret_raw = false;
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
    pub(super) fn rvalue(&mut self, v: Val) -> Result<Val, String> {
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
                    raw: false,
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
    pub(super) fn string_source(&mut self, v: Val, e: &Expr) -> Result<u8, String> {
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
                self.space_code(v.space, &format!("the string '{}'", e))
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
                            e
                        ));
                    }
                    Ty::Ptr(t) if matches!(**t, Ty::Record(..)) => {
                        return Err(format!(
                            "'{}' points to a {}, not to a string: print one of its fields",
                            e,
                            t.name()
                        ));
                    }
                    _ => {}
                }
                if matches!(v.ty, Ty::Int { bytes, .. } if bytes < 8) {
                    return Err(format!(
                        "'{}' is a {}-byte integer, not a pointer to a string",
                        e,
                        v.ty.bytes()
                    ));
                }
                self.space_code(space, &format!("the string '{}'", e))
            }
        }
    }

    /// Register `input` as a value of type `ty`: an integer narrower than the
    /// register is truncated to it (and sign-extended when signed), as C reads
    /// an `int` argument: the register's upper bits are not part of it.
    fn value(&mut self, ty: Ty, input: u32, raw: bool) -> Val {
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
            raw,
        }
    }

    pub(super) fn expr(&mut self, e: &Expr) -> Result<Val, String> {
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
                    // An address, as BCC takes `*0x...`.
                    raw: true,
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
                    false,
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
                    _ => return Err(format!("'{}' is not an array or pointer", base)),
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
                    raw: false,
                })
            }
            Expr::Unary(UnOp::Deref, x) => {
                let v = self.expr(x)?;
                let v = self.rvalue(v)?;
                let (pointee, raw) = match &v.ty {
                    Ty::Ptr(t) => ((**t).clone(), false),
                    // BCC's values are u64: *(arg1) reads 8 bytes, which may
                    // be an address again (**arg1).
                    _ if v.raw => (Ty::U64, true),
                    // An integer whose type is declared (a signature, BTF, a
                    // tracepoint field, a 4-byte USDT argument, a cast) holds
                    // no address: reading at it is a mistake that yields 0.
                    t => {
                        let operand = match **x {
                            Expr::Binary(..) => format!("({x})"),
                            _ => x.to_string(),
                        };
                        return Err(format!(
                            "'{x}' is an integer ({}), not a pointer, so '*{operand}' cannot be read (if it holds an address, cast it: *(int *){operand})",
                            t.name()
                        ));
                    }
                };
                Ok(Val {
                    ty: pointee,
                    loc: Loc::Addr,
                    space: v.space,
                    raw,
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
                // A cast declares the type.
                let v = Val { raw: false, ..v };
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
                    return Err(format!("'{}' divides by zero", e));
                }
                // The kernel takes a shift count mod 64, C leaves a count of
                // the width or more undefined: a constant one is a mistake too.
                let count = match &**r {
                    Expr::Num(n) => Some(*n),
                    Expr::Unary(UnOp::Neg, n) => match **n {
                        Expr::Num(n) if n > 0 => Some(n.wrapping_neg()),
                        _ => None,
                    },
                    _ => None,
                };
                if matches!(op, BinOp::Shl | BinOp::Shr) && count.is_some_and(|n| n >= 64) {
                    return Err(format!("'{}' shifts by 64 bits or more", e));
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
                    // arg1 + 8 is still an address; a declared operand is not.
                    raw: !cmp && a.raw && b.raw,
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
                    raw: false,
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
                // Read extended as the note says (bpf/trace/vm.h usdt_arg()),
                // typed so: a signed argument compares signed.
                let ty = match types.get(n as usize - 1) {
                    Some(Some((bytes, signed))) => Ty::Int {
                        bytes: *bytes,
                        signed: *signed,
                    },
                    _ => Ty::U64,
                };
                // An 8-byte argument may be a pointer (the note does not
                // say); a narrower one is an integer.
                let raw = ty.bytes() == 8;
                return Ok(self.value(ty, IN_USDT0 + n - 1, raw));
            }
            if let SiteCtx::Tracepoint { .. } = self.ctx.site {
                return Err(format!(
                    "tracepoints have no {name}: use args->FIELD ({})",
                    self.tp_field_names()
                ));
            }
            if let SiteCtx::Perf = self.ctx.site {
                return Err(format!("a sampling source has no arguments, so no {name}"));
            }
            if n == 0 || n > 6 {
                return Err(format!("only arg1..arg6 are in registers, not {name}"));
            }
            return Ok(self.value(Ty::U64, n - 1, true));
        }
        if name == "retval" {
            if self.probe.kind != Kind::Return {
                return Err("retval is only available in return probes (r:)".into());
            }
            let (ty, raw) = (self.ret_ty.clone(), self.ret_raw);
            return Ok(self.value(ty, IN_RETVAL, raw));
        }
        if name == "args" {
            if let SiteCtx::Tracepoint { .. } = self.ctx.site {
                return Err("args is the tracepoint's record: name a field, args->FIELD".into());
            }
        }
        if let Some(p) = self.params.iter().find(|p| p.name == name) {
            let (ty, index) = (p.ty.clone(), p.index);
            return Ok(self.value(ty, index, false));
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
                    raw: false,
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
                    raw: false,
                },
                other => {
                    return Err(format!(
                        "'{}' is not a pointer to a struct ({}), so '->{name}' cannot be read{}",
                        base,
                        other.name(),
                        self.cast_hint()
                    ))
                }
            }
        } else {
            if b.loc != Loc::Addr {
                return Err(format!(
                    "'{}' is not a struct in memory: use '->' on pointers",
                    base
                ));
            }
            b
        };
        let Ty::Record(id, rname) = &b.ty else {
            return Err(format!(
                "'{}' is not a struct ({}): '{}' has no members{}",
                base,
                b.ty.name(),
                whole,
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
            raw: false,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{compile, testing::user};
    use crate::grammar;

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
    fn declared_integers_are_not_addresses() {
        let usdt = |text: &str| {
            let p = grammar::parse(text).unwrap();
            let ctx = Ctx {
                site: SiteCtx::Usdt {
                    args: 3,
                    types: &[Some((8, true)), Some((4, true)), None],
                },
                btf: None,
                kernel_reads: false,
                str_size: 80,
                bin_cmp: false,
            };
            compile(&p, &ctx)
        };
        // "-4@...": an int, which no read at it can make a string or a value.
        assert_eq!(
            usdt("u:x:p (STRCMP(\"hello\", *arg2))").unwrap_err(),
            "'arg2' is an integer (s32), not a pointer, so '*arg2' cannot be read (if it holds an address, cast it: *(int *)arg2)"
        );
        assert_eq!(
            usdt("u:x:p \"%d\", *arg2").unwrap_err(),
            "'arg2' is an integer (s32), not a pointer, so '*arg2' cannot be read (if it holds an address, cast it: *(int *)arg2)"
        );
        // "-8@..." may be a pointer and an unsized one may be anything: read
        // as BCC reads them.
        assert!(usdt("u:x:p \"%d\", *arg1").is_ok());
        assert!(usdt("u:x:p (STRCMP(\"hello\", *arg3))").is_ok());
        assert!(usdt("u:x:p \"%d\", *(int *)arg2").is_ok());
        // A signature's integer, a cast's, and arithmetic on one are declared.
        assert_eq!(
            user("c:read(int fd) \"%d\", *fd").unwrap_err(),
            "'fd' is an integer (s32), not a pointer, so '*fd' cannot be read (if it holds an address, cast it: *(int *)fd)"
        );
        assert_eq!(
            user("c:read(long n) \"%d\", *(n + 8)").unwrap_err(),
            "'n + 8' is an integer (s64), not a pointer, so '*(n + 8)' cannot be read (if it holds an address, cast it: *(int *)(n + 8))"
        );
        assert!(user("c:read \"%d\", *(u32)arg1")
            .unwrap_err()
            .starts_with("'(u32)arg1' is an integer (u32)"));
        // A register argument's type is unknown at a user or kernel function
        // (BCC's u64): its bits, and arithmetic on them, are an address.
        for ok in [
            "c:read \"%d\", *arg1",
            "c:read \"%d\", **arg1",
            "c:read \"%d\", *(arg1 + 8)",
            "r:c:read \"%d\", *retval",
            "c:read(int *p) \"%d\", *p",
        ] {
            assert!(user(ok).is_ok(), "{ok}");
        }
        // A tracepoint field's type is its format's.
        let fields = crate::tp_format::tp_fields(
            "\tfield:int fd;\toffset:16;\tsize:4;\tsigned:1;\n\tfield:char * buf;\toffset:24;\tsize:8;\tsigned:0;\n",
        );
        let tp = |text: &str| {
            let p = grammar::parse(text).unwrap();
            let ctx = Ctx {
                site: SiteCtx::Tracepoint {
                    fields: &fields,
                    syscalls: false,
                },
                btf: None,
                kernel_reads: true,
                str_size: 80,
                bin_cmp: false,
            };
            compile(&p, &ctx)
        };
        assert_eq!(
            tp("t:a:b \"%d\", *args->fd").unwrap_err(),
            "'args->fd' is an integer (s32), not a pointer, so '*args->fd' cannot be read (if it holds an address, cast it: *(int *)args->fd)"
        );
        assert!(tp("t:a:b \"%d\", *args->buf").is_ok());
    }

    #[test]
    fn strcmp_takes_its_literal_on_either_side() {
        // Equality is symmetric: STRCMP(arg1, "a") is STRCMP("a", arg1).
        let a = user("c:open (STRCMP(\"a.txt\", arg1))").unwrap();
        let b = user("c:open (STRCMP(arg1, \"a.txt\"))").unwrap();
        assert_eq!(format!("{:?}", a.insns), format!("{:?}", b.insns));
        assert_eq!(a.lits, b"a.txt\0");
        assert_eq!(
            user("c:open (STRCMP(arg1, arg2))").unwrap_err(),
            "STRCMP takes a string literal and a value: STRCMP(\"text\", arg1)"
        );
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
        assert_eq!(
            user("c:read \"%llx\", arg2 << 64").unwrap_err(),
            "'arg2 << 64' shifts by 64 bits or more"
        );
        assert_eq!(
            user("c:read (arg2 >> 1000000000000 == 0)").unwrap_err(),
            "'arg2 >> 1000000000000' shifts by 64 bits or more"
        );
        assert_eq!(
            user("c:read (arg2 << -1 == 0)").unwrap_err(),
            "'arg2 << -1' shifts by 64 bits or more"
        );
        assert!(user("c:read \"%llx\", arg2 << 63").is_ok());
        // A divisor known only at run time divides as the kernel does.
        assert!(user("c:read \"%d\", arg1 / arg2").is_ok());
        let deep = format!("c:read ({})", vec!["arg1"; 200].join(" + "));
        assert!(user(&deep).unwrap_err().contains("instructions"));
        let kernel = grammar::parse("c:read \"%s\", *(u64 *)arg1").unwrap();
        let _ = kernel;
    }
}
