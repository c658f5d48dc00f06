//! Name matching for probe patterns: BCC-style globs (`*`, `?`) or regular expressions.
//!
//! Both forms match the whole name, so `-r 'vfs_.*'` and `'vfs_*'` select the same
//! functions and `-r '(read|write)'` does not also pick `readv`.

use anyhow::{bail, Result};
use regex::Regex;

#[derive(Debug, Clone)]
pub struct Matcher {
    text: String,
    how: How,
}

/// Compiled once per pattern, at start-up: a literal or a glob need no regex,
/// whose compilation is the slowest part of parsing a command line (2 ms on
/// hardware, 40 ms under emulation, for `vfs_read`).
#[derive(Debug, Clone)]
enum How {
    Literal,
    /// `PREFIX*`, the commonest glob (`tcp_*`): a prefix test, where glob's
    /// general matcher took about 2,000 instructions a name (a fifth of a
    /// cached `tcp_*` run's start-up work).
    Prefix,
    Glob(glob::Pattern),
    Regex(Regex),
}

impl Matcher {
    /// A glob: `*` matches any run of characters, `?` one character, all else is literal.
    pub fn glob(pattern: &str) -> Result<Self> {
        if pattern.is_empty() {
            bail!("empty pattern");
        }
        if !pattern.contains(['*', '?']) {
            return Ok(Matcher {
                text: pattern.to_string(),
                how: How::Literal,
            });
        }
        if let Some(prefix) = pattern.strip_suffix('*') {
            if !prefix.contains(['*', '?']) {
                return Ok(Matcher {
                    text: pattern.to_string(),
                    how: How::Prefix,
                });
            }
        }
        // Brackets and all else literal (glob::Pattern would read `[..]` as a class).
        let mut escaped = String::with_capacity(pattern.len() + 8);
        let mut buf = [0u8; 4];
        for c in pattern.chars() {
            match c {
                '*' | '?' => escaped.push(c),
                c => escaped.push_str(&glob::Pattern::escape(c.encode_utf8(&mut buf))),
            }
        }
        Ok(Matcher {
            text: pattern.to_string(),
            how: How::Glob(glob::Pattern::new(&escaped).expect("escaped glob is valid")),
        })
    }

    /// A regular expression that must match the whole name.
    pub fn regex(pattern: &str) -> Result<Self> {
        if pattern.is_empty() {
            bail!("empty pattern");
        }
        let re = Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
            // regex's message spans several lines with a caret diagram; keep the cause.
            let msg = e.to_string();
            let cause = msg
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid syntax")
                .trim()
                .trim_start_matches("error: ")
                .to_string();
            anyhow::anyhow!("invalid regular expression: {cause}")
        })?;
        Ok(Matcher {
            text: pattern.to_string(),
            how: How::Regex(re),
        })
    }

    /// For a regular expression, the matcher BCC's `-r` is: Python's
    /// `re.match`, anchored at the start of the name only, so that `vfs_read`
    /// also takes `vfs_readv`. Used only to say what BCC would have taken.
    pub fn bcc_prefix(&self) -> Option<Matcher> {
        match self.how {
            How::Regex(_) => Some(Matcher {
                text: self.text.clone(),
                how: How::Regex(Regex::new(&format!("^(?:{})", self.text)).ok()?),
            }),
            _ => None,
        }
    }

    pub fn is_match(&self, name: &str) -> bool {
        match &self.how {
            How::Literal => name == self.text,
            How::Prefix => name.starts_with(&self.text[..self.text.len() - 1]),
            How::Glob(g) => g.matches(name),
            How::Regex(re) => re.is_match(name),
        }
    }

    /// The exact name when the pattern has no wildcard (a glob without `*`/`?`).
    pub fn literal(&self) -> Option<&str> {
        matches!(self.how, How::Literal).then_some(self.text.as_str())
    }

    /// A non-empty literal prefix of every name this matches (`tcp_` for
    /// `tcp_*`, the name itself for a literal), if the pattern has one.
    pub fn prefix(&self) -> Option<&str> {
        let p = match self.how {
            How::Literal => self.text.as_str(),
            How::Prefix | How::Glob(_) => {
                &self.text[..self.text.find(['*', '?']).unwrap_or(self.text.len())]
            }
            How::Regex(_) => "",
        };
        (!p.is_empty()).then_some(p)
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bcc_prefix_is_anchored_at_the_start_only() {
        let m = Matcher::regex("vfs_read").unwrap().bcc_prefix().unwrap();
        assert!(m.is_match("vfs_readv"));
        assert!(!m.is_match("do_vfs_read"));
        assert!(Matcher::glob("vfs_*").unwrap().bcc_prefix().is_none());
    }

    #[test]
    fn glob_matches_whole_name() {
        let m = Matcher::glob("vfs_*").unwrap();
        assert!(m.is_match("vfs_read"));
        assert!(!m.is_match("do_vfs_read"));
        let m = Matcher::glob("*tcp*send?").unwrap();
        assert!(m.is_match("x_tcp_sendx"));
        assert!(!m.is_match("tcp_send"));
        let m = Matcher::glob("a.b").unwrap();
        assert!(m.is_match("a.b"));
        assert!(!m.is_match("axb"));
        assert_eq!(m.literal(), Some("a.b"));
        assert_eq!(Matcher::glob("a*").unwrap().literal(), None);
        let m = Matcher::glob("[ab]*").unwrap();
        assert!(m.is_match("[ab]x"));
        assert!(!m.is_match("ax"));
        assert_eq!(Matcher::glob("tcp_*v?").unwrap().prefix(), Some("tcp_"));
        assert_eq!(Matcher::glob("a.b").unwrap().prefix(), Some("a.b"));
        assert_eq!(Matcher::glob("*x").unwrap().prefix(), None);
        assert_eq!(Matcher::regex("tcp_.*").unwrap().prefix(), None);
        let m = Matcher::glob("tcp_*").unwrap();
        assert!(m.is_match("tcp_v4_rcv"));
        assert!(m.is_match("tcp_"));
        assert!(!m.is_match("tcp"));
        assert!(!m.is_match("__tcp_v4_rcv"));
        assert!(Matcher::glob("*").unwrap().is_match("anything"));
        let m = Matcher::glob("*.isra.*").unwrap();
        assert!(m.is_match("f.isra.0"));
        assert!(!m.is_match("f_isra_0"));
    }

    #[test]
    fn regex_is_anchored() {
        let m = Matcher::regex("(write|read)").unwrap();
        assert!(m.is_match("read"));
        assert!(!m.is_match("readv"));
        assert!(!m.is_match("pread"));
        assert!(Matcher::regex("^vfs.*$").unwrap().is_match("vfs_read"));
    }

    #[test]
    fn bad_regex_is_one_line() {
        let e = Matcher::regex("(").unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        assert!(e.starts_with("invalid regular expression: "), "{e}");
        assert!(Matcher::glob("").is_err());
    }
}
