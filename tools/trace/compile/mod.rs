//! From a parsed probe to the bytecode bpf/trace/vm.h interprets: names bound
//! to registers, BTF types, tracepoint fields or USDT arguments; member paths
//! resolved to offsets; the predicate, then one store per format argument.
//!
//! Limits (bpf/trace/abi.h): 128 instructions and a
//! 16-deep value stack per probe, 16 arguments, 4096 bytes of strings per record.
//! Every refusal names the part of the expression it cannot do.
//!
//! By stage: isa.rs (the bytecode), gen.rs (the one pass that binds, checks and
//! emits), types.rs (C's typing), fast.rs (the straight-line shapes), encode.rs
//! (the BPF side's tables).

use common::btf::{Kbtf, Proto, Ty};

use std::collections::HashMap;

use anyhow::{anyhow, Result};
use common::Site;
use common::{escape, warn};

use crate::grammar::{Kind, Probe};
use crate::tp_format::{format_of, TpField};

mod encode;
mod fast;
mod gen;
mod isa;
pub(crate) mod types;

pub use encode::specs_of;
pub use isa::*;

use gen::Gen;

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
    /// A sampling or counter source: no arguments.
    Perf,
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

/// One compiled program and what renders its records.
pub struct Compiled {
    pub probe: usize,
    pub prog: Program,
    /// The probe as compiled (with --args' format).
    pub parsed: Probe,
}

/// Compiles every (site, probe) pair; identical programs of one probe share.
pub fn compile_all(
    all: &[common::Probe],
    per_probe: &[Vec<usize>],
    parsed: &[Probe],
    args: &crate::Args,
    kernel_reads: bool,
    formats: &mut HashMap<String, Vec<TpField>>,
) -> Result<Vec<Compiled>> {
    let needs_btf = all.iter().any(|p| matches!(p.site, Site::Kernel(_)));
    let kbtf = if needs_btf {
        match common::btf::Kbtf::load() {
            Ok(b) => Some(b),
            Err(e) => {
                warn(&format!("{e:#}: only arg1..arg6 are known"));
                None
            }
        }
    } else {
        None
    };
    let mut out = Vec::new();
    for (i, specs) in per_probe.iter().enumerate() {
        let probe = &all[i];
        for &s in specs {
            let mut p = parsed[s].clone();
            let text = p.text.clone();
            let bad = |e: String| anyhow!("bad probe \"{}\": {}: {e}", escape(&text), probe.label);
            let site = match &probe.site {
                Site::Kernel(f) => {
                    let syscall = f.name.starts_with("__x64_sys_");
                    let proto = kbtf.as_ref().and_then(|b| {
                        if syscall {
                            let n = &f.name["__x64_sys_".len()..];
                            b.func(&format!("__do_sys_{n}"))
                                .or_else(|| b.func(&format!("__se_sys_{n}")))
                        } else {
                            b.func(&f.name)
                        }
                    });
                    SiteCtx::Kernel {
                        func: &f.name,
                        proto,
                        syscall,
                    }
                }
                Site::User { .. } => SiteCtx::User,
                Site::Tracepoint(t) => {
                    format_of(t, formats)?;
                    SiteCtx::Tracepoint {
                        fields: &formats[&t.name()],
                        syscalls: t.category == "syscalls",
                    }
                }
                Site::Usdt { probe, .. } => SiteCtx::Usdt {
                    args: probe.args,
                    types: &probe.types,
                },
                Site::Perf(_) => SiteCtx::Perf,
            };
            if args.all_args && p.format.is_none() {
                crate::desugar::all_args(&mut p, &site, kbtf.as_ref());
            }
            let ctx = Ctx {
                site,
                btf: kbtf.as_ref(),
                kernel_reads,
                str_size: args.string_size,
                bin_cmp: args.bin_cmp,
            };
            let prog = compile(&p, &ctx).map_err(bad)?;
            out.push(Compiled {
                probe: i,
                prog,
                parsed: p,
            });
        }
    }
    Ok(out)
}

/// Compiles `probe` for one site.
pub fn compile(probe: &Probe, ctx: &Ctx) -> Result<Program, String> {
    let mut g = Gen::new(ctx, probe);
    g.bind_params()?;
    if probe.kind == Kind::Return {
        g.prog.flags |= F_RETURN;
    }
    // At a user function's first instruction the caller is only at the stack
    // pointer: -U adds it there (bpf/trace/vm.h entry_ustack()), not past it.
    if probe.kind == Kind::Entry && probe.offset == 0 && matches!(ctx.site, SiteCtx::User) {
        g.prog.flags |= F_USER_ENTRY;
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
                return Err(format!("'{}' is a string: print it with %s", arg));
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

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// `text` compiled for a user function: no BTF, no kernel reads, -Z 80.
    pub fn user(text: &str) -> Result<Program, String> {
        let p = crate::grammar::parse(text)?;
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
}

#[cfg(test)]
mod tests {
    use super::testing::user;
    use super::*;

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
}
