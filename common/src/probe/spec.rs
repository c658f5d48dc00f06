//! Probe specifications in BCC's grammar.
//!
//! ```text
//! func | p::func                 kernel function
//! lib:func | p:lib:func          user function in a library (`c` = libc) or executable
//! /path:func                     user function in the binary at path
//! t:category:event               kernel tracepoint
//! u:lib:probe                    USDT probe
//! ```
//! Function, event and probe names are globs (`*`, `?`), or regular expressions with `-r`.

use std::fmt;

use anyhow::{anyhow, bail, Result};

use crate::probe::pattern::Matcher;
use crate::probe::perf::{self, PerfSource};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Kernel,
    /// A user function; `target` is a library name, executable name or path.
    User {
        target: String,
    },
    Tracepoint,
    /// A USDT probe in `target`.
    Usdt {
        target: String,
    },
    /// A sampling or counter source: `profile:`, `software:`, `hardware:`.
    Perf(PerfSource),
}

#[derive(Debug, Clone)]
pub struct ProbeSpec {
    /// The spec as the user wrote it, for messages.
    pub raw: String,
    pub source: Source,
    /// Matches function names, `category:event` for tracepoints, or USDT probe names.
    pub matcher: Matcher,
}

impl fmt::Display for ProbeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Specs are echoed in messages: never raw control bytes.
        f.write_str(&crate::diag::escape(&self.raw))
    }
}

impl ProbeSpec {
    pub fn parse(raw: &str, regex: bool) -> Result<Self> {
        parse(raw, regex).map_err(|e| {
            anyhow!(
                "{}",
                crate::diag::escape(format!("bad probe \"{raw}\": {e}"))
            )
        })
    }

    /// A kernel or user function (what entry and return hooks apply to).
    pub fn is_function(&self) -> bool {
        matches!(self.source, Source::Kernel | Source::User { .. })
    }

    /// Parses every pattern, failing on the first bad one.
    pub fn parse_all<S: AsRef<str>>(raws: &[S], regex: bool) -> Result<Vec<Self>> {
        raws.iter()
            .map(|r| Self::parse(r.as_ref(), regex))
            .collect()
    }
}

fn parse(raw: &str, regex: bool) -> Result<ProbeSpec> {
    let matcher = |p: &str| {
        if p.is_empty() {
            bail!("the name to match is empty");
        }
        if regex {
            Matcher::regex(p)
        } else {
            Matcher::glob(p)
        }
    };
    let parts: Vec<&str> = raw.split(':').collect();
    if parts.first().is_some_and(|p| perf::is_perf(p)) {
        let source = perf::parse(&parts)?;
        return Ok(ProbeSpec {
            raw: raw.to_string(),
            matcher: Matcher::glob(&source.name)?,
            source: Source::Perf(source),
        });
    }
    let (source, pattern) = match parts.as_slice() {
        [func] => (Source::Kernel, *func),
        [kind @ ("p" | "t" | "u"), _] => bail!(
            "'{kind}:' needs three parts: {}",
            match *kind {
                "t" => "t:CATEGORY:EVENT",
                "u" => "u:LIBRARY:PROBE",
                _ => "p::FUNCTION or p:LIBRARY:FUNCTION",
            }
        ),
        ["", _] => {
            bail!("missing library or executable before ':' (use p::FUNC for kernel functions)")
        }
        [lib, func] => (Source::user(lib), *func),
        ["p", "", func] => (Source::Kernel, *func),
        ["p", lib, func] => (Source::user(lib), *func),
        ["t", cat, event] => {
            if cat.is_empty() || event.is_empty() {
                bail!("a tracepoint needs both parts: t:CATEGORY:EVENT");
            }
            // Tracepoints match "category:event" as one name.
            return Ok(ProbeSpec {
                raw: raw.to_string(),
                source: Source::Tracepoint,
                matcher: matcher(&format!("{cat}:{event}"))?,
            });
        }
        ["u", "", _] => bail!("a USDT probe needs a library or executable: u:LIBRARY:PROBE"),
        ["u", lib, probe] => (
            Source::Usdt {
                target: lib.to_string(),
            },
            *probe,
        ),
        [kind, _, _] => bail!(
            "probe type must be 'p', 't', 'u', 'profile', 'software' or 'hardware', not '{kind}'"
        ),
        _ => bail!("too many ':'-separated parts (at most 3: TYPE:LIBRARY:NAME)"),
    };
    Ok(ProbeSpec {
        raw: raw.to_string(),
        source,
        matcher: matcher(pattern)?,
    })
}

impl Source {
    /// A user-space source: functions of `lib` (a path or a library name).
    pub fn user(lib: &str) -> Source {
        Source::User {
            target: lib.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ProbeSpec {
        ProbeSpec::parse(s, false).unwrap()
    }

    fn err(s: &str) -> String {
        ProbeSpec::parse(s, false).unwrap_err().to_string()
    }

    #[test]
    fn kernel_forms() {
        assert_eq!(p("vfs_*").source, Source::Kernel);
        assert_eq!(p("p::vfs_read").source, Source::Kernel);
        assert!(p("p::vfs_read").matcher.is_match("vfs_read"));
    }

    #[test]
    fn user_forms() {
        let s = p("c:malloc");
        assert_eq!(s.source, Source::user("c"));
        assert!(s.matcher.is_match("malloc"));
        assert_eq!(p("p:c:malloc").source, Source::user("c"));
        assert_eq!(
            p("/usr/bin/bash:readline").source,
            Source::user("/usr/bin/bash")
        );
        assert_eq!(p("./test:read*").source, Source::user("./test"));
    }

    #[test]
    fn tracepoint_and_usdt() {
        let s = p("t:syscalls:sys_enter_*");
        assert_eq!(s.source, Source::Tracepoint);
        assert!(s.matcher.is_match("syscalls:sys_enter_read"));
        assert!(!s.matcher.is_match("syscalls:sys_exit_read"));
        let s = p("u:pthread:*mutex*");
        assert_eq!(
            s.source,
            Source::Usdt {
                target: "pthread".into()
            }
        );
        let s = ProbeSpec::parse("t:sched:sched_(switch|wakeup)", true).unwrap();
        assert!(s.matcher.is_match("sched:sched_wakeup"));
    }

    #[test]
    fn errors_quote_the_spec() {
        assert_eq!(
            err("x:a:b"),
            "bad probe \"x:a:b\": probe type must be 'p', 't', 'u', 'profile', 'software' or 'hardware', not 'x'"
        );
        assert!(err("a:b:c:d").contains("too many ':'-separated parts"));
        assert!(err("t:sched").contains("t:CATEGORY:EVENT"));
        assert!(err("t::x").contains("t:CATEGORY:EVENT"));
        assert!(err("u::probe").contains("u:LIBRARY:PROBE"));
        assert!(err(":read").contains("missing library"));
        assert!(err("c:").contains("empty"));
        assert_eq!(
            err("x\x1b[2J:a:b"),
            "bad probe \"x\\x1b[2J:a:b\": probe type must be 'p', 't', 'u', 'profile', 'software' or 'hardware', not 'x\\x1b[2J'"
        );
        let e = ProbeSpec::parse("c:(", true).unwrap_err().to_string();
        assert!(
            e.starts_with("bad probe \"c:(\": invalid regular expression"),
            "{e}"
        );
    }
}
