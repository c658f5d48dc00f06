//! trace's printf subset: `%d %i %u %x %X %o %c %s %p %K %U` with the length
//! modifiers `hh h l ll z j t` (BCC's `%d %u %ld %lu %lld %llu %hd %hu %x %lx %llx
//! %c %s %K %U`, and more), flags `- 0 + space #`, width and precision, `%%`.

use serde_json::Value as Json;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conv {
    pub left: bool,
    pub zero: bool,
    pub plus: bool,
    pub space: bool,
    pub alt: bool,
    pub width: Option<usize>,
    pub prec: Option<usize>,
    /// Bytes of the value: 1, 2, 4 or 8.
    pub bytes: u8,
    /// d i u x X o c s p K U
    pub ty: char,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Lit(String),
    Conv(Conv),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    pub pieces: Vec<Piece>,
}

/// A value for a conversion: a number, or text (a string, a resolved symbol).
#[derive(Debug, Clone)]
pub enum Value {
    Num(u64),
    Text(String),
}

/// Widths and precisions above this are refused (they only allocate).
const MAX_WIDTH: usize = 4096;

impl Format {
    pub fn parse(s: &str) -> Result<Format, String> {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut it = s.chars().peekable();
        while let Some(c) = it.next() {
            if c != '%' {
                lit.push(c);
                continue;
            }
            if it.peek() == Some(&'%') {
                it.next();
                lit.push('%');
                continue;
            }
            let mut spec = String::from("%");
            let mut conv = Conv {
                left: false,
                zero: false,
                plus: false,
                space: false,
                alt: false,
                width: None,
                prec: None,
                bytes: 4,
                ty: 'd',
            };
            while let Some(&f) = it.peek() {
                match f {
                    '-' => conv.left = true,
                    '0' => conv.zero = true,
                    '+' => conv.plus = true,
                    ' ' => conv.space = true,
                    '#' => conv.alt = true,
                    _ => break,
                }
                spec.push(f);
                it.next();
            }
            let num = |it: &mut std::iter::Peekable<std::str::Chars>,
                       spec: &mut String|
             -> Result<Option<usize>, String> {
                let mut d = String::new();
                while let Some(&c) = it.peek().filter(|c| c.is_ascii_digit()) {
                    d.push(c);
                    spec.push(c);
                    it.next();
                }
                if d.is_empty() {
                    return Ok(None);
                }
                match d.parse::<usize>() {
                    Ok(v) if v <= MAX_WIDTH => Ok(Some(v)),
                    _ => Err(format!("width or precision over {MAX_WIDTH} in '{spec}'")),
                }
            };
            conv.width = num(&mut it, &mut spec)?;
            if it.peek() == Some(&'.') {
                it.next();
                spec.push('.');
                conv.prec = Some(num(&mut it, &mut spec)?.unwrap_or(0));
            }
            let mut len = String::new();
            while let Some(&l) = it.peek().filter(|c| "hlzjtL".contains(**c)) {
                len.push(l);
                spec.push(l);
                it.next();
            }
            let Some(ty) = it.next() else {
                return Err(format!("'{spec}' at the end has no conversion"));
            };
            spec.push(ty);
            conv.bytes = match len.as_str() {
                "" => 4,
                "hh" => 1,
                "h" => 2,
                "l" | "ll" | "z" | "j" | "t" | "L" => 8,
                _ => return Err(format!("unsupported length modifier in '{spec}'")),
            };
            match ty {
                'd' | 'i' | 'u' | 'x' | 'X' | 'o' => {}
                'c' | 's' | 'p' | 'K' | 'U' if len.is_empty() => conv.bytes = 8,
                _ => {
                    return Err(format!(
                        "unsupported conversion '{}' (use %d %u %x %o %c %s %p %K %U, with h, hh, l, ll)",
                        spec.escape_default()
                    ))
                }
            }
            conv.ty = ty;
            if !lit.is_empty() {
                pieces.push(Piece::Lit(std::mem::take(&mut lit)));
            }
            pieces.push(Piece::Conv(conv));
        }
        if !lit.is_empty() {
            pieces.push(Piece::Lit(lit));
        }
        Ok(Format { pieces })
    }

    pub fn convs(&self) -> impl Iterator<Item = &Conv> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Conv(c) => Some(c),
            Piece::Lit(_) => None,
        })
    }

    pub fn conversions(&self) -> usize {
        self.convs().count()
    }

    /// The message for `values` (one per conversion).
    pub fn render(&self, values: &[Value]) -> String {
        let mut out = String::with_capacity(64);
        let mut vals = values.iter();
        for p in &self.pieces {
            match p {
                Piece::Lit(l) => out.push_str(l),
                Piece::Conv(c) => c.render_into(&mut out, vals.next().unwrap_or(&Value::Num(0))),
            }
        }
        out
    }
}

impl Conv {
    fn signed(&self) -> bool {
        matches!(self.ty, 'd' | 'i')
    }

    /// The number as the C type the conversion names.
    fn typed(&self, v: u64) -> (bool, u64) {
        let bits = self.bytes as u32 * 8;
        let masked = if bits >= 64 {
            v
        } else {
            v & ((1u64 << bits) - 1)
        };
        if self.signed() {
            let shift = 64 - bits;
            let s = ((masked << shift) as i64) >> shift;
            (s < 0, s.unsigned_abs())
        } else {
            (false, masked)
        }
    }

    /// The value as JSON: a number for numeric conversions, else text.
    pub fn json(&self, v: &Value) -> Json {
        match (v, self.ty) {
            (Value::Text(t), _) => Json::from(t.clone()),
            (Value::Num(n), 'c') => Json::from(char::from(*n as u8).to_string()),
            (Value::Num(n), _) => {
                let (neg, mag) = self.typed(*n);
                if neg {
                    Json::from((mag as i128).wrapping_neg() as i64)
                } else {
                    Json::from(mag)
                }
            }
        }
    }

    /// Appends the value to `out`: a plain `%d %u %x` (most formats) without the
    /// intermediate strings of [`Conv::render`], which does the rest.
    pub fn render_into(&self, out: &mut String, v: &Value) {
        use std::fmt::Write as _;
        let plain = !(self.left || self.zero || self.plus || self.space || self.alt)
            && self.width.is_none()
            && self.prec.is_none();
        match (v, self.ty) {
            (Value::Num(n), 'd' | 'i' | 'u' | 'x') if plain => {
                let (neg, mag) = self.typed(*n);
                if neg {
                    out.push('-');
                }
                let _ = if self.ty == 'x' {
                    write!(out, "{mag:x}")
                } else {
                    write!(out, "{mag}")
                };
            }
            _ => out.push_str(&self.render(v)),
        }
    }

    pub fn render(&self, v: &Value) -> String {
        let (sign, body) = match (v, self.ty) {
            (Value::Text(t), _) => {
                let t = match self.prec {
                    Some(p) => t.chars().take(p).collect(),
                    None => t.clone(),
                };
                (String::new(), t)
            }
            // Escaped as %s text is: a traced process must not print a newline
            // (a fake event line) or an ESC (terminal control) through %c.
            (Value::Num(n), 'c') => (String::new(), common::escape([*n as u8])),
            (Value::Num(n), 'p') => (String::new(), format!("0x{n:x}")),
            (Value::Num(n), ty) => {
                let (neg, mag) = self.typed(*n);
                let mut digits = match ty {
                    'x' => format!("{mag:x}"),
                    'X' => format!("{mag:X}"),
                    'o' => format!("{mag:o}"),
                    _ => mag.to_string(),
                };
                if let Some(p) = self.prec {
                    while digits.len() < p {
                        digits.insert(0, '0');
                    }
                }
                let sign = if neg {
                    "-"
                } else if self.plus && self.signed() {
                    "+"
                } else if self.space && self.signed() {
                    " "
                } else {
                    ""
                };
                let prefix = match (self.alt, ty) {
                    (true, 'x') if mag != 0 => "0x",
                    (true, 'X') if mag != 0 => "0X",
                    (true, 'o') if !digits.starts_with('0') => "0",
                    _ => "",
                };
                (format!("{sign}{prefix}"), digits)
            }
        };
        let len = sign.chars().count() + body.chars().count();
        let width = self.width.unwrap_or(0);
        if len >= width {
            return format!("{sign}{body}");
        }
        let pad = width - len;
        let numeric = matches!(v, Value::Num(_)) && !matches!(self.ty, 'c' | 's');
        if self.left {
            format!("{sign}{body}{}", " ".repeat(pad))
        } else if self.zero && numeric && self.prec.is_none() {
            format!("{sign}{}{body}", "0".repeat(pad))
        } else {
            format!("{}{sign}{body}", " ".repeat(pad))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(f: &str, v: &[Value]) -> String {
        Format::parse(f).unwrap().render(v)
    }

    #[test]
    fn bcc_conversions() {
        use Value::*;
        let neg = (-5i64) as u64;
        assert_eq!(r("%d", &[Num(neg)]), "-5");
        assert_eq!(r("%u", &[Num(neg)]), "4294967291");
        assert_eq!(r("%ld", &[Num(neg)]), "-5");
        assert_eq!(r("%lu", &[Num(neg)]), "18446744073709551611");
        assert_eq!(r("%lld %llu", &[Num(neg), Num(7)]), "-5 7");
        assert_eq!(r("%hd %hu", &[Num(0xffff), Num(0x1ffff)]), "-1 65535");
        assert_eq!(
            r("%x %lx %llx", &[Num(neg), Num(255), Num(16)]),
            "fffffffb ff 10"
        );
        assert_eq!(r("%c%s", &[Num(65), Text("bc".into())]), "Abc");
        // Control bytes and bytes that are no character alone are escaped, as
        // %s escapes them.
        assert_eq!(r("[%c]", &[Num(10)]), "[\\x0a]");
        assert_eq!(r("[%c]", &[Num(27)]), "[\\x1b]");
        assert_eq!(r("[%c]", &[Num(0)]), "[\\x00]");
        assert_eq!(r("[%c]", &[Num(0xe9)]), "[\\xe9]");
        assert_eq!(
            r("100%% %K", &[Text("vfs_read+0x5".into())]),
            "100% vfs_read+0x5"
        );
        assert_eq!(
            r(
                "[%5d|%-4s|%08x|%#x]",
                &[Num(42), Text("a".into()), Num(255), Num(255)]
            ),
            "[   42|a   |000000ff|0xff]"
        );
    }

    #[test]
    fn errors() {
        assert!(Format::parse("%q").is_err());
        assert!(Format::parse("%").is_err());
        assert!(Format::parse("%lls").is_err());
        assert!(Format::parse("%99999d").is_err());
        assert_eq!(Format::parse("a %d b %s").unwrap().conversions(), 2);
    }
}
