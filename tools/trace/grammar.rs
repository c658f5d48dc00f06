//! BCC trace's probe grammar, as a strict superset:
//!
//! ```text
//! [{p,r}]:[library]:function[+offset][(signature)] [(predicate)] ["format", args...]
//! t:category:event [(predicate)] ["format", args...]
//! u:library:[provider:]probe [(predicate)] ["format", args...]
//! ```
//! Function, event and probe names may be globs. Every error is one line naming
//! the part it cannot read.

use crate::expr::{self, excerpt, Expr, TypeName};
use crate::format::Format;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `p:` a function's entry.
    Entry,
    /// `r:` a function's return.
    Return,
    /// `t:` a tracepoint.
    Tracepoint,
    /// `u:` a USDT probe.
    Usdt,
    /// `profile:`, `software:`, `hardware:` a sampling or counter source: one
    /// line per sample, with no arguments.
    Perf,
}

#[derive(Debug, Clone)]
pub struct Probe {
    /// As written, for messages.
    pub text: String,
    pub kind: Kind,
    /// Library or executable (`p`/`r`: empty for the kernel; `u`: required).
    pub library: String,
    /// Function (glob), `category:event` for tracepoints, probe name for USDT.
    pub name: String,
    /// USDT provider, when written as `u:lib:provider:probe`.
    pub provider: Option<String>,
    /// `func+offset`.
    pub offset: u64,
    pub signature: Option<Vec<(TypeName, String)>>,
    pub predicate: Option<Expr>,
    pub format: Option<Format>,
    pub args: Vec<Expr>,
}

impl Probe {
    /// What BCC prints in the FUNC column for this probe (the matched function
    /// for functions; the event or USDT name otherwise).
    pub fn is_function(&self) -> bool {
        matches!(self.kind, Kind::Entry | Kind::Return)
    }
}

/// Parses one probe; the error is one line (without the probe's text, which the
/// caller adds).
pub fn parse(text: &str) -> Result<Probe, String> {
    let t = text.trim_start();
    // The spec runs to the first blank or '(' (BCC's regex).
    let end = t.find([' ', '\t', '(']).unwrap_or(t.len());
    let (spec, mut rest) = t.split_at(end);
    if spec.is_empty() {
        return Err("no probe before the predicate or format".into());
    }
    let mut p = parse_spec(spec, text)?;
    // A signature is glued to the spec: "func(int a, char *b)".
    if rest.starts_with('(') {
        let close = rest
            .find(')')
            .ok_or_else(|| format!("unmatched '(' in the signature {}", excerpt(rest)))?;
        let inner = &rest[1..close];
        if inner.contains('(') {
            return Err(format!(
                "the signature {} cannot contain '(' (write a predicate after a blank)",
                excerpt(rest)
            ));
        }
        if !p.is_function() {
            return Err(
                "USDT and tracepoint probes can't have a function signature; use arg1, arg2, ... instead"
                    .into(),
            );
        }
        p.signature =
            Some(expr::parse_signature(inner).map_err(|e| format!("in the signature: {e}"))?);
        rest = &rest[close + 1..];
    }
    let mut rest = rest.trim_start();
    if rest.starts_with('(') {
        let close = balanced(rest)?;
        let pred = &rest[1..close];
        p.predicate = Some(expr::parse(pred).map_err(|e| format!("in the predicate: {e}"))?);
        rest = rest[close + 1..].trim_start();
    }
    if rest.is_empty() {
        return Ok(p);
    }
    if !rest.starts_with('"') {
        return Err(format!(
            "expected a predicate in parentheses or a \"format\", not '{}'",
            excerpt(rest)
        ));
    }
    let (fmt, n) = expr::string(rest).map_err(|e| format!("in the format: {e}"))?;
    let fmt = String::from_utf8(fmt).map_err(|_| {
        "in the format: an escape above \\x7f makes it other than UTF-8 text, which the \
         output is; write the character itself"
            .to_string()
    })?;
    let format = Format::parse(&fmt).map_err(|e| format!("in the format: {e}"))?;
    let mut after = rest[n..].trim_start();
    let mut args = Vec::new();
    if !after.is_empty() {
        after = after
            .strip_prefix(',')
            .ok_or_else(|| format!("expected ',' after the format, not '{}'", excerpt(after)))?;
        for a in split_args(after)? {
            if a.trim().is_empty() {
                return Err("empty argument after the format".into());
            }
            args.push(expr::parse(a).map_err(|e| format!("in argument '{}': {e}", a.trim()))?);
        }
    }
    if args.len() != format.conversions() {
        return Err(format!(
            "the format has {} conversion{} but {} argument{} follow{}",
            format.conversions(),
            if format.conversions() == 1 { "" } else { "s" },
            args.len(),
            if args.len() == 1 { "" } else { "s" },
            if args.len() == 1 { "s" } else { "" },
        ));
    }
    p.format = Some(format);
    p.args = args;
    Ok(p)
}

/// The characters of `s` outside '...' and "..." literals (backslash escapes
/// respected), with their byte indexes; the quotes themselves are not yielded.
struct Unquoted<'a> {
    chars: std::str::CharIndices<'a>,
    quote: Option<char>,
}

impl<'a> Unquoted<'a> {
    fn new(s: &'a str) -> Self {
        Unquoted {
            chars: s.char_indices(),
            quote: None,
        }
    }

    /// Whether the text ended inside a literal.
    fn in_quote(&self) -> bool {
        self.quote.is_some()
    }
}

impl Iterator for Unquoted<'_> {
    type Item = (usize, char);

    fn next(&mut self) -> Option<(usize, char)> {
        let mut escaped = false;
        loop {
            let (i, c) = self.chars.next()?;
            match self.quote {
                Some(_) if escaped => escaped = false,
                Some(_) if c == '\\' => escaped = true,
                Some(q) if c == q => self.quote = None,
                Some(_) => {}
                None if c == '"' || c == '\'' => self.quote = Some(c),
                None => return Some((i, c)),
            }
        }
    }
}

/// The index of the ')' closing the '(' at the start of `s` (quotes respected).
fn balanced(s: &str) -> Result<usize, String> {
    let mut depth = 0;
    for (i, c) in Unquoted::new(s) {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => {}
        }
    }
    Err("unmatched end of predicate: a '(' is never closed".into())
}

/// Splits the format's arguments on the commas outside parentheses and quotes.
fn split_args(s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    let mut chars = Unquoted::new(s);
    for (i, c) in chars.by_ref() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unmatched '{c}' in the arguments"));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if chars.in_quote() {
        return Err("unterminated string in the arguments".into());
    }
    if depth != 0 {
        return Err("unmatched '(' in the arguments".into());
    }
    out.push(&s[start..]);
    Ok(out)
}

fn parse_spec(spec: &str, text: &str) -> Result<Probe, String> {
    let parts: Vec<&str> = spec.split(':').collect();
    if parts.first().is_some_and(|p| common::perf::is_perf(p)) {
        // Checked here, for the error's words; expanded from the text.
        common::perf::parse(&parts).map_err(|e| e.to_string())?;
        return Ok(Probe {
            text: text.to_string(),
            kind: Kind::Perf,
            library: String::new(),
            name: spec.to_string(),
            provider: None,
            offset: 0,
            signature: None,
            predicate: None,
            format: None,
            args: Vec::new(),
        });
    }
    let (kind, library, mut name, provider) = match parts.as_slice() {
        [f] => (Kind::Entry, String::new(), f.to_string(), None),
        [ty @ ("p" | "r" | "t" | "u"), _] => {
            return Err(format!(
                "'{ty}:' needs three parts: {}",
                match *ty {
                    "t" => "t:CATEGORY:EVENT",
                    "u" => "u:LIBRARY:PROBE",
                    _ => "p::FUNCTION or p:LIBRARY:FUNCTION",
                }
            ))
        }
        [lib, f] => (Kind::Entry, lib.to_string(), f.to_string(), None),
        [ty, rest @ ..] => match *ty {
            "" | "p" | "r" => {
                let (f, lib) = rest.split_last().expect("two or more parts");
                let kind = if *ty == "r" {
                    Kind::Return
                } else {
                    Kind::Entry
                };
                (kind, lib.join(":"), f.to_string(), None)
            }
            "t" => match rest {
                [cat, ev] if !cat.is_empty() && !ev.is_empty() => {
                    (Kind::Tracepoint, String::new(), format!("{cat}:{ev}"), None)
                }
                _ => return Err("a tracepoint is t:CATEGORY:EVENT".into()),
            },
            "u" => match rest {
                [lib, probe] if !lib.is_empty() => {
                    (Kind::Usdt, lib.to_string(), probe.to_string(), None)
                }
                [lib, prov, probe] if !lib.is_empty() && !prov.is_empty() => (
                    Kind::Usdt,
                    lib.to_string(),
                    probe.to_string(),
                    Some(prov.to_string()),
                ),
                _ => return Err("a USDT probe is u:LIBRARY:[PROVIDER:]PROBE".into()),
            },
            other => {
                return Err(format!(
                    "probe type must be '', 'p', 'r', 't', 'u', 'profile', 'software' or 'hardware', not '{other}'"
                ))
            }
        },
        [] => unreachable!("split yields one part"),
    };
    let mut offset = 0;
    if matches!(kind, Kind::Entry | Kind::Return) {
        if let Some((f, off)) = name.split_once('+') {
            let o = off.to_ascii_lowercase();
            let v = match o.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None if o.contains('x') => u64::from_str_radix(&o.replace('x', ""), 16),
                None => o.parse(),
            };
            offset = v.map_err(|_| {
                format!("invalid offset '{off}': must be decimal or hexadecimal (0x..)")
            })?;
            if kind == Kind::Return && offset != 0 {
                return Err("an offset is for entry probes (p:), not returns (r:)".into());
            }
            name = f.to_string();
        }
    }
    if name.is_empty() {
        return Err(match kind {
            Kind::Usdt => "the USDT probe name is empty".into(),
            _ => "the function name is empty".into(),
        });
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_alphanumeric() || "_.*?[]!-$@:".contains(*c)))
    {
        return Err(format!(
            "'{}' is not a function, event or probe name ('{}' is not allowed)",
            excerpt(&name),
            c.escape_default()
        ));
    }
    Ok(Probe {
        text: text.to_string(),
        kind,
        library,
        name,
        provider,
        offset,
        signature: None,
        predicate: None,
        format: None,
        args: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let p = parse("do_sys_open").unwrap();
        assert_eq!(
            (p.kind, p.library.as_str(), p.name.as_str()),
            (Kind::Entry, "", "do_sys_open")
        );
        let p = parse("r::do_sys_open").unwrap();
        assert_eq!(p.kind, Kind::Return);
        let p = parse("c:malloc").unwrap();
        assert_eq!((p.library.as_str(), p.name.as_str()), ("c", "malloc"));
        let p = parse("p:/tmp/a:b:func").unwrap();
        assert_eq!((p.library.as_str(), p.name.as_str()), ("/tmp/a:b", "func"));
        let p = parse("p:/tmp/a.out:main+0xd").unwrap();
        assert_eq!((p.name.as_str(), p.offset), ("main", 13));
        let p = parse("kfree_skb+12").unwrap();
        assert_eq!(p.offset, 12);
        let p = parse("t:block:block_rq_complete \"sectors=%d\", args->nr_sector").unwrap();
        assert_eq!(
            (p.kind, p.name.as_str()),
            (Kind::Tracepoint, "block:block_rq_complete")
        );
        assert_eq!(p.args.len(), 1);
        let p = parse("u:pthread:libpthread:pthread_create (arg4 != 0)").unwrap();
        assert_eq!(p.provider.as_deref(), Some("libpthread"));
        assert!(p.predicate.is_some());
    }

    #[test]
    fn full_probe() {
        let p = parse(
            "p:c:open (STRCMP(\"test.txt\", arg1)) \"opening %s, flags %x\", arg1, (arg2 & 0x3)",
        )
        .unwrap();
        assert!(p.predicate.is_some());
        assert_eq!(p.args.len(), 2);
        let p = parse("udpv6_sendmsg(struct sock *sk) (sk->sk_dport == 13568)").unwrap();
        assert_eq!(p.signature.as_ref().unwrap()[0].1, "sk");
        let p = parse("r::__kmalloc (retval == 0) \"kmalloc failed!\"").unwrap();
        assert_eq!(p.args.len(), 0);
        let p = parse("'p:c:write \"a, b: %d\", arg3'".trim_matches('\'')).unwrap();
        assert_eq!(p.args.len(), 1);
    }

    #[test]
    fn errors() {
        let e = |s: &str| parse(s).unwrap_err();
        assert_eq!(
            e("x:a:b"),
            "probe type must be '', 'p', 'r', 't', 'u', 'profile', 'software' or 'hardware', not 'x'"
        );
        assert!(e("do_sys_open (arg1 > 2").contains("unmatched end of predicate"));
        assert!(e("do_sys_open \"%d %d\", arg1").contains("2 conversions but 1 argument"));
        assert!(e("t:sched").contains("t:CATEGORY:EVENT"));
        assert!(e("t:a:b(int x)").contains("can't have a function signature"));
        assert!(e("f+zz").contains("invalid offset"));
        assert!(e("f \"%q\", arg1").contains("in the format"));
        assert!(e("f arg1").contains("expected a predicate"));
        assert!(e("f \"%d\" arg1").contains("expected ','"));
        assert!(e("p::").contains("empty"));
    }
}

/// Malformed specs, generated by mutating valid ones: the parser and the compiler
/// answer every one with a one-line error or a program, never a panic or a hang.
#[cfg(test)]
mod fuzz {
    use crate::compile::{compile, Ctx, SiteCtx};
    use crate::tp_format::tp_fields;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    const SEEDS: &[&str] = &[
        r#"p:c:malloc (arg1 > 4096 && arg2 != 0) "%d bytes %s", arg1, arg2@user"#,
        r#"r:/bin/ls:main(int argc, char **argv) (retval == 0 || !(argc & 3)) "%d %lx", argc, retval"#,
        r#"t:syscalls:sys_enter_lseek (args->offset > 1016) "%d %u", args->offset, args->whence"#,
        r#"u:/usr/bin/python3:python:function__entry (STRCMP("x", arg2)) "%s:%d", arg2, arg3"#,
        r#"p:c:write+0x10 ((arg3 * 2 + 1) % 7 <= $pid - $tgid) "%c%%%hd %llu %K %U", arg1, arg2, arg3, arg1, arg2"#,
        r#"c:strlen "%s", arg1"#,
    ];
    const PIECES: &[&str] = &[
        "(",
        ")",
        "\"",
        ",",
        ":",
        "%",
        "%s",
        "%d",
        "->",
        "arg",
        "arg0",
        "arg7",
        "retval",
        "$",
        "$pid",
        "@user",
        "&&",
        "||",
        "!",
        "==",
        "<<",
        ">>",
        "/",
        "*",
        "+",
        "-",
        "~",
        "0x",
        "99999999999999999999999",
        "STRCMP(",
        "args->",
        "args->nosuch",
        " ",
        "\\",
        "'",
        "\u{0}",
        "é",
        "[",
        "]",
        "(((",
        ")))",
        "1/0",
        "int",
        "char *",
        ".",
        "p:",
        "r:",
        "t:",
        "u:",
    ];

    /// A small deterministic PRNG (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn mutate(r: &mut Rng, s: &str) -> String {
        let mut c: Vec<char> = s.chars().collect();
        for _ in 0..1 + r.below(4) {
            let at = r.below(c.len() + 1);
            match r.below(4) {
                0 if at < c.len() => {
                    c.remove(at);
                }
                1 => {
                    let end = (at + r.below(8)).min(c.len());
                    c.drain(at..end);
                }
                2 if at < c.len() => c[at] = char::from(r.below(95) as u8 + 32),
                _ => {
                    let p = PIECES[r.below(PIECES.len())];
                    c.splice(at..at, p.chars());
                }
            }
        }
        c.into_iter().collect()
    }

    fn check(spec: &str) {
        let fields = tp_fields(
            "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
             \tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;\n\
             \tfield:unsigned int fd;\toffset:16;\tsize:8;\tsigned:0;\n\
             \tfield:off_t offset;\toffset:24;\tsize:8;\tsigned:0;\n\
             \tfield:unsigned int whence;\toffset:32;\tsize:8;\tsigned:0;\n\
             \tfield:char comm[16];\toffset:40;\tsize:16;\tsigned:1;\n\
             \tfield:__data_loc char[] name;\toffset:56;\tsize:4;\tsigned:1;\n",
        );
        let p = match super::parse(spec) {
            Ok(p) => p,
            Err(e) => {
                assert!(!e.is_empty() && !e.contains('\n'), "{spec:?}: {e:?}");
                return;
            }
        };
        for site in [
            SiteCtx::User,
            SiteCtx::Usdt {
                args: 12,
                types: &[],
            },
            SiteCtx::Tracepoint {
                fields: &fields,
                syscalls: true,
            },
            SiteCtx::Kernel {
                func: "f",
                proto: None,
                syscall: false,
            },
        ] {
            for kernel_reads in [false, true] {
                let ctx = Ctx {
                    site: site.clone(),
                    btf: None,
                    kernel_reads,
                    str_size: 80,
                    bin_cmp: false,
                };
                if let Err(e) = compile(&p, &ctx) {
                    assert!(!e.is_empty() && !e.contains('\n'), "{spec:?}: {e:?}");
                }
            }
        }
    }

    #[test]
    fn mutated_specs_error_in_one_line_without_panic_or_hang() {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut r = Rng(0x9e37_79b9_7f4a_7c15);
            for seed in SEEDS {
                check(seed);
                for _ in 0..3000 {
                    let m = mutate(&mut r, seed);
                    check(&m);
                    // Mutants of mutants reach further from the valid form.
                    check(&mutate(&mut r, &m));
                }
            }
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(120))
            .expect("the parser hung (or panicked) on a mutated spec");
    }
}
