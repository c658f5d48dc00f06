//! A tracepoint's fields, typed for trace's expressions, from its tracefs
//! `format` file (parsed by common's one parser, read once per run), and
//! whether a syscall event's record is laid out as the raw sys_enter/sys_exit
//! programs rebuild it.

use std::collections::HashMap;

use anyhow::Result;
use common::btf::Ty;
use common::tracepoints::{Field, Format, Tracepoint};

use crate::compile::types::int_type;

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

/// Parses a tracefs `format` file into its fields (the common_ ones included),
/// typed: the parse is common's one ([`Format`]), the C types are trace's.
#[cfg(test)]
pub fn tp_fields(text: &str) -> Vec<TpField> {
    typed(&Format::parse(text))
}

fn typed(format: &Format) -> Vec<TpField> {
    format
        .fields
        .iter()
        .map(|f| TpField {
            name: f.name.clone(),
            offset: f.offset,
            size: f.size,
            ty: type_of(f),
        })
        .collect()
}

/// A field's type from its declaration, size and signed flag.
fn type_of(f: &Field) -> Ty {
    let (decl, size, signed) = (f.decl.as_str(), f.size, f.signed);
    let last = decl.split_whitespace().last().unwrap_or("");
    if decl.starts_with("__data_loc") {
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
    }
}

/// A tracepoint's fields, from its format file (read once per run).
pub fn format_of<'a>(
    t: &Tracepoint,
    formats: &'a mut HashMap<String, Vec<TpField>>,
) -> Result<&'a [TpField]> {
    let key = t.name();
    if !formats.contains_key(&key) {
        let format = Format::read(&t.category, &t.event)?;
        formats.insert(key.clone(), typed(&format));
    }
    Ok(&formats[&key])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{compile, Ctx, SiteCtx};
    use crate::grammar;

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
