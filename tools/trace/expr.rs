//! Expressions of trace's predicates and format arguments: C's operators on
//! integers, `argN`, `retval`, `$pid`-style variables, `args->field`, member
//! paths (`sk->__sk_common.skc_rcv_saddr`), casts, `argN@user`, `STRCMP`.
//!
//! Parsed by precedence climbing into an [`Expr`]; every error names the part of
//! the text it could not read.

use std::fmt;

/// A C type named in a cast or a signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeName {
    /// `int`, `unsigned long`, `struct sock`, `u32`, ... (words joined by a space).
    pub base: String,
    /// Levels of `*`.
    pub ptr: u32,
}

impl fmt::Display for TypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.base)?;
        if self.ptr > 0 {
            write!(f, " {}", "*".repeat(self.ptr as usize))?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    LAnd,
    LOr,
}

/// The binary operators as C spells them, with their precedence (higher binds
/// tighter): what the parser reads and what messages print.
const BINOPS: &[(&str, BinOp, u8)] = &[
    ("||", BinOp::LOr, 1),
    ("&&", BinOp::LAnd, 2),
    ("|", BinOp::Or, 3),
    ("^", BinOp::Xor, 4),
    ("&", BinOp::And, 5),
    ("==", BinOp::Eq, 6),
    ("!=", BinOp::Ne, 6),
    ("<", BinOp::Lt, 7),
    ("<=", BinOp::Le, 7),
    (">", BinOp::Gt, 7),
    (">=", BinOp::Ge, 7),
    ("<<", BinOp::Shl, 8),
    (">>", BinOp::Shr, 8),
    ("+", BinOp::Add, 9),
    ("-", BinOp::Sub, 9),
    ("*", BinOp::Mul, 10),
    ("/", BinOp::Div, 10),
    ("%", BinOp::Mod, 10),
];

impl BinOp {
    /// How C spells it.
    pub fn symbol(self) -> &'static str {
        BINOPS
            .iter()
            .find(|(_, op, _)| *op == self)
            .map_or("?", |(text, ..)| text)
    }

    /// How tightly it binds (higher: tighter), as the parser reads it.
    pub fn precedence(self) -> u8 {
        BINOPS
            .iter()
            .find(|(_, op, _)| *op == self)
            .map_or(0, |&(.., prec)| prec)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnOp {
    Not,
    Neg,
    BitNot,
    Deref,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Num(u64),
    Str(Vec<u8>),
    /// `arg1`, `retval`, `args`, a parameter name.
    Ident(String),
    /// `$pid`, `$tgid`, ...
    Var(String),
    /// `base->name` (arrow) or `base.name`.
    Member {
        base: Box<Expr>,
        name: String,
        arrow: bool,
    },
    Index(Box<Expr>, Box<Expr>),
    /// `expr@user`: a pointer to user memory.
    User(Box<Expr>),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Cast(TypeName, Box<Expr>),
    Call(String, Vec<Expr>),
}

/// An expression as the user wrote it (approximately), for messages.
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Num(v) => write!(f, "{v}"),
            Expr::Str(s) => write!(f, "\"{}\"", String::from_utf8_lossy(s)),
            Expr::Ident(n) => f.write_str(n),
            Expr::Var(v) => write!(f, "${v}"),
            Expr::Member { base, name, arrow } => {
                write!(f, "{base}{}{name}", if *arrow { "->" } else { "." })
            }
            Expr::Index(b, i) => write!(f, "{b}[{i}]"),
            Expr::User(b) => write!(f, "{b}@user"),
            Expr::Unary(op, x) => write!(
                f,
                "{}{}",
                match op {
                    UnOp::Not => "!",
                    UnOp::Neg => "-",
                    UnOp::BitNot => "~",
                    UnOp::Deref => "*",
                },
                Operand(x, u8::MAX)
            ),
            // Operands in parentheses where the parser would group them otherwise
            // (it groups equal operators from the left).
            Expr::Binary(op, l, r) => {
                let prec = op.precedence();
                write!(
                    f,
                    "{} {} {}",
                    Operand(l, prec),
                    op.symbol(),
                    Operand(r, prec + 1)
                )
            }
            Expr::Cast(t, x) => write!(f, "({t}){}", Operand(x, u8::MAX)),
            Expr::Call(n, a) => write!(
                f,
                "{n}({})",
                a.iter().map(Expr::to_string).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// An operand of an operator binding at the given precedence, as shown: a
/// binary expression binding less tightly goes in parentheses.
struct Operand<'a>(&'a Expr, u8);

impl fmt::Display for Operand<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Expr::Binary(op, ..) if op.precedence() < self.1 => write!(f, "({})", self.0),
            e => write!(f, "{e}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(u64),
    Str(Vec<u8>),
    Char(u8),
    Ident(String),
    Var(String),
    AtUser,
    Punct(&'static str),
}

const PUNCT: &[&str] = &[
    "->", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+", "-", "*", "/", "%", "&", "|", "^",
    "~", "!", "<", ">", "(", ")", "[", "]", ".", ",",
];

fn lex(s: &str) -> Result<Vec<(Tok, usize)>, String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        if c.is_ascii_digit() {
            let (v, n) = number(&s[i..])?;
            out.push((Tok::Num(v), start));
            i += n;
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b'$' {
            i += 1;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let w = &s[start..i];
            if let Some(v) = w.strip_prefix('$') {
                if v.is_empty() {
                    return Err("'$' without a variable name".into());
                }
                out.push((Tok::Var(v.to_string()), start));
            } else {
                out.push((Tok::Ident(w.to_string()), start));
            }
        } else if c == b'@' {
            let rest = &s[i + 1..];
            if rest.starts_with("user")
                && !rest[4..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            {
                out.push((Tok::AtUser, start));
                i += 5;
            } else {
                return Err(format!(
                    "unknown '@' suffix at '{}' (only @user)",
                    excerpt(&s[i..])
                ));
            }
        } else if c == b'"' {
            let (v, n) = string(&s[i..])?;
            out.push((Tok::Str(v), start));
            i += n;
        } else if c == b'\'' {
            let (v, n) = string(&s[i..])?;
            if v.len() != 1 {
                return Err(format!("bad character constant {}", excerpt(&s[i..])));
            }
            out.push((Tok::Char(v[0]), start));
            i += n;
        } else if let Some(p) = PUNCT.iter().find(|p| s[i..].starts_with(**p)) {
            out.push((Tok::Punct(p), start));
            i += p.len();
        } else {
            let ch = s[i..].chars().next().unwrap_or('?');
            return Err(format!("unexpected '{}'", ch.escape_default()));
        }
    }
    Ok(out)
}

/// A few characters of `s`, for messages.
pub fn excerpt(s: &str) -> String {
    let e: String = s.chars().take(24).collect();
    if e.len() < s.len() {
        format!("{e}...")
    } else {
        e
    }
}

/// A C integer literal at the start of `s` (decimal, 0x hex, 0 octal, 0b binary,
/// with u/l suffixes): its value and length.
fn number(s: &str) -> Result<(u64, usize), String> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
        i += 1;
    }
    let word = &s[..i];
    let lower = word.to_ascii_lowercase();
    let digits = lower.trim_end_matches(['u', 'l']);
    let v = if let Some(h) = digits.strip_prefix("0x") {
        u64::from_str_radix(h, 16)
    } else if let Some(bn) = digits.strip_prefix("0b") {
        u64::from_str_radix(bn, 2)
    } else if digits.len() > 1 && digits.starts_with('0') {
        u64::from_str_radix(&digits[1..], 8)
    } else {
        digits.parse()
    };
    v.map(|v| (v, i))
        .map_err(|_| format!("bad number '{}'", excerpt(word)))
}

/// The value of `s`, all of it a C integer literal (as [`number`] reads one).
pub fn parse_number(s: &str) -> Option<i64> {
    match number(s) {
        Ok((v, n)) if n == s.len() && n > 0 => i64::try_from(v).ok(),
        _ => None,
    }
}

/// A quoted string at the start of `s`, with C's escapes (\n \t \r \a \b \f
/// \v \\ \" \' \? \ooo octal, \xHH hex): its bytes (an escape is the byte it
/// names, \xff one byte, not a character's UTF-8) and its length with the quotes.
pub fn string(s: &str) -> Result<(Vec<u8>, usize), String> {
    let b = s.as_bytes();
    let q = b[0];
    let mut out = Vec::new();
    let mut i = 1;
    while i < b.len() {
        let c = b[i];
        if c == q {
            return Ok((out, i + 1));
        }
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = b.get(i) else { break };
        i += 1;
        out.push(match e {
            b'n' => b'\n',
            b't' => b'\t',
            b'r' => b'\r',
            b'a' => 0x07,
            b'b' => 0x08,
            b'f' => 0x0c,
            b'v' => 0x0b,
            b'\\' | b'"' | b'\'' | b'?' => e,
            b'0'..=b'7' => {
                // Up to three octal digits, as in C: \0, \33, \033.
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match b.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                u8::try_from(v)
                    .map_err(|_| format!("octal escape above \\377 in {}", excerpt(s)))?
            }
            b'x' => {
                let hex: String = b[i..]
                    .iter()
                    .take(2)
                    .take_while(|d| d.is_ascii_hexdigit())
                    .map(|&d| d as char)
                    .collect();
                i += hex.len();
                u8::from_str_radix(&hex, 16)
                    .map_err(|_| format!("bad escape '\\x{hex}' in {}", excerpt(s)))?
            }
            _ => {
                let other = s[i - 1..].chars().next().unwrap_or('?');
                return Err(format!("unknown escape '\\{other}' in {}", excerpt(s)));
            }
        });
    }
    Err(format!("unterminated string {}", excerpt(s)))
}

/// Words that start a type in a cast.
const TYPE_WORDS: &[&str] = &[
    "struct",
    "union",
    "enum",
    "const",
    "volatile",
    "unsigned",
    "signed",
    "int",
    "long",
    "short",
    "char",
    "bool",
    "_Bool",
    "void",
    "u8",
    "u16",
    "u32",
    "u64",
    "s8",
    "s16",
    "s32",
    "s64",
    "__u8",
    "__u16",
    "__u32",
    "__u64",
    "__s8",
    "__s16",
    "__s32",
    "__s64",
    "size_t",
    "ssize_t",
    "pid_t",
    "uid_t",
    "gid_t",
    "loff_t",
    "off_t",
    "uint8_t",
    "uint16_t",
    "uint32_t",
    "uint64_t",
    "int8_t",
    "int16_t",
    "int32_t",
    "int64_t",
    "uintptr_t",
];

struct Parser<'a> {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    text: &'a str,
    depth: u32,
}

/// Nesting deeper than this is refused (a fuzzer's `((((...` must not overflow).
const MAX_DEPTH: u32 = 64;

/// Parses one whole expression.
pub fn parse(text: &str) -> Result<Expr, String> {
    let mut p = Parser {
        toks: lex(text)?,
        pos: 0,
        text,
        depth: 0,
    };
    if p.toks.is_empty() {
        return Err("empty expression".into());
    }
    let e = p.expr()?;
    if p.pos < p.toks.len() {
        return Err(format!("unexpected '{}'", p.rest()));
    }
    Ok(e)
}

/// Parses a function signature's parameter list (without the parentheses):
/// `struct sock *sk, int len` → [(type, name)].
pub fn parse_signature(text: &str) -> Result<Vec<(TypeName, String)>, String> {
    let mut out = Vec::new();
    if text.trim().is_empty() || text.trim() == "void" {
        return Ok(out);
    }
    for part in text.split(',') {
        let toks = lex(part)?;
        let mut words = Vec::new();
        let mut ptr = 0;
        for (t, _) in &toks {
            match t {
                Tok::Ident(w) => words.push(w.clone()),
                Tok::Punct("*") => ptr += 1,
                _ => return Err(format!("bad parameter '{}'", part.trim())),
            }
        }
        let Some(name) = words.pop() else {
            return Err(format!("bad parameter '{}'", part.trim()));
        };
        if words.is_empty() {
            return Err(format!(
                "parameter '{}' has no type (write it as in C: 'struct sock *sk')",
                part.trim()
            ));
        }
        words.retain(|w| w != "const" && w != "volatile");
        if out.iter().any(|(_, n)| *n == name) {
            return Err(format!("parameter name '{name}' is used twice"));
        }
        out.push((
            TypeName {
                base: words.join(" "),
                ptr,
            },
            name,
        ));
    }
    Ok(out)
}

impl Parser<'_> {
    fn rest(&self) -> String {
        match self.toks.get(self.pos) {
            Some((_, at)) => excerpt(self.text[*at..].trim_end()),
            None => "end".into(),
        }
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(t, _)| t)
    }

    fn punct(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Punct(q)) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, p: &str) -> Result<(), String> {
        if self.punct(p) {
            Ok(())
        } else if self.pos >= self.toks.len() {
            Err(format!("expected '{p}' at the end"))
        } else {
            Err(format!("expected '{p}' at '{}'", self.rest()))
        }
    }

    fn expr(&mut self) -> Result<Expr, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("expression nested too deeply".into());
        }
        let e = self.binary(0);
        self.depth -= 1;
        e
    }

    fn binop(&self) -> Option<(BinOp, u8)> {
        let Some(Tok::Punct(p)) = self.peek() else {
            return None;
        };
        BINOPS
            .iter()
            .find(|(text, ..)| text == p)
            .map(|&(_, op, prec)| (op, prec))
    }

    fn binary(&mut self, min: u8) -> Result<Expr, String> {
        let mut lhs = self.unary()?;
        while let Some((op, prec)) = self.binop() {
            if prec <= min {
                break;
            }
            self.pos += 1;
            let rhs = self.binary(prec)?;
            lhs = Expr::Binary(op, Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("expression nested too deeply".into());
        }
        let r = self.unary_inner();
        self.depth -= 1;
        r
    }

    fn unary_inner(&mut self) -> Result<Expr, String> {
        for (p, op) in [
            ("!", UnOp::Not),
            ("-", UnOp::Neg),
            ("~", UnOp::BitNot),
            ("*", UnOp::Deref),
        ] {
            if self.punct(p) {
                return Ok(Expr::Unary(op, Box::new(self.unary()?)));
            }
        }
        if self.punct("+") {
            return self.unary();
        }
        // A cast: '(' followed by a type word.
        if matches!(self.peek(), Some(Tok::Punct("(")))
            && matches!(self.toks.get(self.pos + 1), Some((Tok::Ident(w), _)) if TYPE_WORDS.contains(&w.as_str()))
        {
            self.pos += 1;
            let ty = self.type_name()?;
            self.expect(")")?;
            return Ok(Expr::Cast(ty, Box::new(self.unary()?)));
        }
        self.postfix()
    }

    fn type_name(&mut self) -> Result<TypeName, String> {
        let mut words = Vec::new();
        while let Some(Tok::Ident(w)) = self.peek() {
            let w = w.clone();
            self.pos += 1;
            let tagged = matches!(w.as_str(), "struct" | "union" | "enum");
            if w != "const" && w != "volatile" {
                words.push(w);
            }
            if tagged {
                match self.peek() {
                    Some(Tok::Ident(n)) => {
                        words.push(n.clone());
                        self.pos += 1;
                    }
                    _ => return Err(format!("expected a name after '{}'", words.join(" "))),
                }
            }
        }
        let mut ptr = 0;
        while self.punct("*") {
            ptr += 1;
        }
        if words.is_empty() {
            return Err(format!("expected a type at '{}'", self.rest()));
        }
        Ok(TypeName {
            base: words.join(" "),
            ptr,
        })
    }

    fn postfix(&mut self) -> Result<Expr, String> {
        let mut e = self.primary()?;
        loop {
            if self.punct("->") || self.punct(".") {
                let arrow = matches!(self.toks[self.pos - 1].0, Tok::Punct("->"));
                let Some(Tok::Ident(name)) = self.peek().cloned() else {
                    return Err(format!(
                        "expected a member name after '{}'",
                        if arrow { "->" } else { "." }
                    ));
                };
                self.pos += 1;
                e = Expr::Member {
                    base: Box::new(e),
                    name,
                    arrow,
                };
            } else if self.punct("[") {
                let i = self.expr()?;
                self.expect("]")?;
                e = Expr::Index(Box::new(e), Box::new(i));
            } else if matches!(self.peek(), Some(Tok::AtUser)) {
                self.pos += 1;
                if matches!(e, Expr::User(_)) {
                    return Err("'@user' twice".into());
                }
                e = Expr::User(Box::new(e));
            } else {
                return Ok(e);
            }
        }
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let Some((tok, _)) = self.toks.get(self.pos).cloned() else {
            return Err("expression ends too early".into());
        };
        self.pos += 1;
        match tok {
            Tok::Num(v) => Ok(Expr::Num(v)),
            Tok::Char(c) => Ok(Expr::Num(c as u64)),
            Tok::Str(s) => Ok(Expr::Str(s)),
            Tok::Var(v) => Ok(Expr::Var(v)),
            Tok::Ident(name) => {
                if self.punct("(") {
                    let mut args = Vec::new();
                    if !self.punct(")") {
                        loop {
                            args.push(self.expr()?);
                            if self.punct(")") {
                                break;
                            }
                            self.expect(",")?;
                        }
                    }
                    return Ok(Expr::Call(name, args));
                }
                Ok(Expr::Ident(name))
            }
            Tok::Punct("(") => {
                let e = self.expr()?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::AtUser => Err("'@user' must follow a value (arg2@user)".into()),
            Tok::Punct(p) => {
                self.pos -= 1;
                Err(format!("unexpected '{p}' at '{}'", self.rest()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_take_c_escapes_as_bytes() {
        let (v, n) = string(r#""A\101\33\0339\a\b\f\v\?\'\"\\\xff\x4g\n" rest"#).unwrap();
        assert_eq!(
            v,
            [
                b'A', b'A', 0x1b, 0x1b, b'9', 7, 8, 0x0c, 0x0b, b'?', b'\'', b'"', b'\\', 0xff,
                0x04, b'g', b'\n'
            ]
        );
        assert_eq!(n, 41);
        // UTF-8 text is its bytes.
        assert_eq!(string("\"é\"").unwrap().0, "é".as_bytes());
        assert!(string(r#""\400""#)
            .unwrap_err()
            .contains("octal escape above \\377"));
        assert!(string(r#""\q""#)
            .unwrap_err()
            .contains("unknown escape '\\q'"));
        assert!(string(r#""\xzz""#)
            .unwrap_err()
            .contains("bad escape '\\x'"));
    }

    #[test]
    fn precedence() {
        let e = parse("arg1 > 2 && arg2 == 3 || !retval").unwrap();
        let Expr::Binary(BinOp::LOr, l, _) = e else {
            panic!()
        };
        assert!(matches!(*l, Expr::Binary(BinOp::LAnd, _, _)));
        assert_eq!(
            parse("1 + 2 * 3").unwrap(),
            Expr::Binary(
                BinOp::Add,
                Box::new(Expr::Num(1)),
                Box::new(Expr::Binary(
                    BinOp::Mul,
                    Box::new(Expr::Num(2)),
                    Box::new(Expr::Num(3))
                ))
            )
        );
    }

    #[test]
    fn postfix_and_casts() {
        let e = parse("sk->__sk_common.skc_rcv_saddr").unwrap();
        assert!(matches!(e, Expr::Member { arrow: false, .. }));
        let e = parse("(int)retval < 0").unwrap();
        assert!(matches!(e, Expr::Binary(BinOp::Lt, _, _)));
        assert_eq!(
            parse("arg2@user").unwrap(),
            Expr::User(Box::new(Expr::Ident("arg2".into())))
        );
        assert_eq!(parse("arg2@user@user").unwrap_err(), "'@user' twice");
        assert_eq!(
            parse("STRCMP(\"a\\\"b\", arg1)").unwrap(),
            Expr::Call(
                "STRCMP".into(),
                vec![Expr::Str(b"a\"b".to_vec()), Expr::Ident("arg1".into())]
            )
        );
        assert_eq!(parse("0x10").unwrap(), Expr::Num(16));
        assert_eq!(parse("'a'").unwrap(), Expr::Num(97));
        assert!(parse("(struct sock *)arg1").is_ok());
    }

    #[test]
    fn errors() {
        assert_eq!(parse("arg1 >").unwrap_err(), "expression ends too early");
        assert_eq!(parse("arg1 ) ").unwrap_err(), "unexpected ')'");
        assert!(parse("arg1 # 2").unwrap_err().contains("unexpected '#'"));
        assert!(parse(&"(".repeat(10000)).is_err());
        assert!(parse("\"abc").unwrap_err().contains("unterminated"));
        assert!(parse("99999999999999999999999").is_err());
    }

    #[test]
    fn signatures() {
        let s = parse_signature("struct sock *sk, const char *name, int len").unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].0.base, "struct sock");
        assert_eq!(s[0].0.ptr, 1);
        assert_eq!(s[1].0.base, "char");
        assert_eq!(s[2].1, "len");
        assert!(parse_signature("sk").is_err());
    }

    #[test]
    fn shown_expressions_group_as_parsed() {
        for text in [
            "arg1 - (arg2 - arg3)",
            "arg1 - arg2 - arg3",
            "(arg1 + 1) * -(arg2 | 4) == ~(u32)(arg3 >> 2)",
            "arg1 == 1 && (arg2 == 2 || arg3)",
        ] {
            let e = parse(text).unwrap();
            assert_eq!(e.to_string(), text);
            assert_eq!(parse(&e.to_string()).unwrap(), e);
        }
    }
}
