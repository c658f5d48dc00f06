//! `--args`: a probe without a format gets one naming every argument of its
//! kernel function (from BTF), every field of its tracepoint, or its USDT
//! arguments, and `retval` for returns. A rewrite of the parsed probe before it
//! is compiled, per site.

use common::btf::{Kbtf, Ty};

use crate::compile::{self, SiteCtx};
use crate::expr::Expr;
use crate::format::Format;
use crate::grammar::{Kind, Probe};

/// `--args`: a format naming every argument of a kernel function (from BTF) or
/// every field of a tracepoint, and `retval` for returns.
pub fn all_args(p: &mut Probe, site: &SiteCtx, btf: Option<&Kbtf>) {
    let mut fmt = Vec::new();
    let mut args = Vec::new();
    let conv = |ty: &Ty| -> &'static str {
        match ty {
            Ty::Int {
                bytes: 8,
                signed: true,
            } => "%ld",
            Ty::Int {
                bytes: 8,
                signed: false,
            } => "%lu",
            Ty::Int { signed: true, .. } => "%d",
            Ty::Int { signed: false, .. } => "%u",
            _ => "0x%lx",
        }
    };
    match site {
        SiteCtx::Kernel {
            proto: Some(proto), ..
        } => {
            let Some(b) = btf else { return };
            for (name, id) in proto.params.iter().take(6) {
                if name.is_empty() {
                    continue;
                }
                fmt.push(format!("{name}={}", conv(&b.ty(*id))));
                args.push(Expr::Ident(name.clone()));
            }
            if p.kind == Kind::Return {
                fmt.push(format!("retval={}", conv(&b.ty(proto.ret))));
                args.push(Expr::Ident("retval".into()));
            }
        }
        SiteCtx::Tracepoint { fields, .. } => {
            for f in fields.iter() {
                if f.name.starts_with("common_") || f.offset + f.size > compile::REC_MAX {
                    continue;
                }
                let c = if f.ty.is_char_array() || f.ty == Ty::DataLoc {
                    "%s"
                } else {
                    conv(&f.ty)
                };
                fmt.push(format!("{}={c}", f.name));
                args.push(Expr::Member {
                    base: Box::new(Expr::Ident("args".into())),
                    name: f.name.clone(),
                    arrow: true,
                });
            }
        }
        SiteCtx::Usdt { args: count, .. } => {
            // The probe's own arguments, from its note.
            for n in 1..=*count {
                fmt.push(format!("arg{n}=%ld"));
                args.push(Expr::Ident(format!("arg{n}")));
            }
        }
        _ => {
            for n in 1..=6 {
                fmt.push(format!("arg{n}=0x%lx"));
                args.push(Expr::Ident(format!("arg{n}")));
            }
            if p.kind == Kind::Return {
                fmt.push("retval=0x%lx".into());
                args.push(Expr::Ident("retval".into()));
            }
        }
    }
    if let Ok(f) = Format::parse(&fmt.join(" ")) {
        p.format = Some(f);
        p.args = args;
    }
}
