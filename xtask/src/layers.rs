//! `cargo xtask check-layers`: common/src's stage layering, enforced.
//!
//! A room is a top-level entry of common/src: a folder (`plan/`) or a file
//! (`diag.rs`), except `lib.rs`, the facade, which may use everything. A file in
//! room R may name `crate::X...` only when X is R itself or a room on a lower
//! floor of [`FLOORS`]: rooms on one floor do not use each other, and no room
//! uses one above it. A room the table does not list is an error too, so a new
//! folder is placed on purpose.
//!
//! References are found in code, not comments: `//` and `/* */` comments (doc
//! comments with them) are skipped; `use crate::{a::b, c}` counts the first
//! segment of each element; `crate::x::y` counts anywhere in code; `$crate::`
//! (macros, expanded in the caller) does not count. String literals are read
//! as code, so a string holding `crate::x` counts (none does today). Not seen:
//! `super::` paths, and `crate::m!` macro calls (exported at the crate root,
//! whichever room defines them).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// common/src's rooms by floor, bottom up (docs: layout.md §c). A room may use
/// rooms on the floors below its own. A new room goes on the lowest floor above
/// every room it uses.
const FLOORS: &[&[&str]] = &[
    &["diag", "timing", "sys"],
    &["stop", "probe", "output"],
    &["kernel", "user", "serve"],
    &["plan", "data"],
    &["object"],
    &["attach"],
    &["run"],
];

/// The floor of `room` (1 = bottom), if the table lists it.
fn floor(room: &str) -> Option<usize> {
    FLOORS
        .iter()
        .position(|rooms| rooms.contains(&room))
        .map(|i| i + 1)
}

/// Checks the workspace at `root`: prints one line per forbidden edge and fails
/// if there is one, else prints a summary line.
pub fn main(root: &Path) -> Result<()> {
    let c = check(root)?;
    for p in &c.problems {
        println!("{p}");
    }
    if !c.problems.is_empty() {
        bail!(
            "check-layers: {} problems in common/src (the floors are in xtask/src/layers.rs)",
            c.problems.len()
        );
    }
    println!(
        "check-layers: {} rooms, {} files, no forbidden edge",
        c.rooms, c.files
    );
    Ok(())
}

struct Checked {
    rooms: usize,
    files: usize,
    /// `path:line: message` lines, in path order.
    problems: Vec<String>,
}

fn check(root: &Path) -> Result<Checked> {
    let rel = Path::new("common/src");
    let src = root.join(rel);
    let mut entries: Vec<_> = fs::read_dir(&src)
        .with_context(|| src.display().to_string())?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    let mut rooms = 0;
    let mut files = 0;
    let mut problems = Vec::new();
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let dir = e.file_type()?.is_dir();
        let room = match name.strip_suffix(".rs") {
            _ if dir => name.clone(),
            Some("lib") | None => continue,
            Some(stem) => stem.to_string(),
        };
        let Some(own) = floor(&room) else {
            problems.push(format!(
                "{}: room {room} is on no floor: add it to the table in xtask/src/layers.rs",
                rel.join(&name).display()
            ));
            continue;
        };
        rooms += 1;
        let mut paths = Vec::new();
        rust_files(&e.path(), &mut paths)?;
        for path in paths {
            files += 1;
            let text = fs::read_to_string(&path).with_context(|| path.display().to_string())?;
            let shown = rel.join(path.strip_prefix(&src).unwrap_or(&path));
            for (line, to) in references(&text) {
                if to == room {
                    continue;
                }
                let why = match floor(&to) {
                    Some(f) if f < own => continue,
                    Some(f) => format!("{to} (floor {f})"),
                    // Its own "on no floor" line says what to do.
                    None if src.join(&to).is_dir() || src.join(format!("{to}.rs")).is_file() => {
                        continue
                    }
                    None => format!("{to}, which is no room (go to its room, not through lib.rs)"),
                };
                problems.push(format!(
                    "{}:{line}: {room} (floor {own}) imports {why}",
                    shown.display()
                ));
            }
        }
    }
    Ok(Checked {
        rooms,
        files,
        problems,
    })
}

/// `path` if it is a .rs file, else every .rs file under it, sorted.
fn rust_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    if !path.is_dir() {
        if path.extension().is_some_and(|x| x == "rs") {
            out.push(path.to_path_buf());
        }
        return Ok(());
    }
    let mut children: Vec<PathBuf> = fs::read_dir(path)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    children.sort();
    for c in children {
        rust_files(&c, out)?;
    }
    Ok(())
}

/// `text` with every comment blanked (newlines kept, so lines still count).
fn code_of(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        match (b[i], b.get(i + 1).copied()) {
            ('/', Some('/')) => {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
            }
            ('/', Some('*')) => {
                // Block comments nest in Rust.
                let mut depth = 0;
                while i < b.len() {
                    match (b[i], b.get(i + 1).copied()) {
                        ('/', Some('*')) => {
                            depth += 1;
                            out.push_str("  ");
                            i += 2;
                        }
                        ('*', Some('/')) => {
                            depth -= 1;
                            out.push_str("  ");
                            i += 2;
                            if depth == 0 {
                                break;
                            }
                        }
                        (c, _) => {
                            out.push(blank(c));
                            i += 1;
                        }
                    }
                }
            }
            ('"', _) => {
                // Copied as it is, but read past: a "//" inside is no comment.
                out.push('"');
                i += 1;
                while i < b.len() && b[i] != '"' {
                    if b[i] == '\\' && i + 1 < b.len() {
                        out.push(b[i]);
                        i += 1;
                    }
                    out.push(b[i]);
                    i += 1;
                }
                if i < b.len() {
                    out.push('"');
                    i += 1;
                }
            }
            ('r', Some('"' | '#')) if i == 0 || !is_ident(b[i - 1]) => {
                // A raw string r"..." or r#"..."#: no escapes, ends at "#...
                let hashes = b[i + 1..].iter().take_while(|&&c| c == '#').count();
                if b.get(i + 1 + hashes) != Some(&'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close: Vec<char> = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let start = i;
                i += 2 + hashes;
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i = (i + close.len()).min(b.len());
                out.extend(&b[start..i]);
            }
            ('\'', _) => {
                // A char literal ('"', '\'', '/') is copied whole; a lifetime
                // ('a) is just a quote.
                let end = match (b.get(i + 1), b.get(i + 2)) {
                    (Some('\\'), _) => b
                        .get(i + 3..)
                        .and_then(|rest| rest.iter().position(|&c| c == '\''))
                        .map(|p| i + 3 + p + 1),
                    (Some(_), Some('\'')) => Some(i + 3),
                    _ => None,
                };
                let end = end.unwrap_or(i + 1).min(b.len());
                out.extend(&b[i..end]);
                i = end;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every (line, first segment) of a `crate::` path in `text`'s code.
fn references(text: &str) -> Vec<(usize, String)> {
    let code: Vec<char> = code_of(text).chars().collect();
    let line_at = |i: usize| 1 + code[..i].iter().filter(|&&c| c == '\n').count();
    let word = |i: usize| -> (String, usize) {
        let end = code[i..]
            .iter()
            .position(|&c| !is_ident(c))
            .map_or(code.len(), |p| i + p);
        (code[i..end].iter().collect(), end)
    };
    let skip_space = |mut i: usize| {
        while i < code.len() && code[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let pat: Vec<char> = "crate::".chars().collect();
    let mut refs = Vec::new();
    let mut i = 0;
    while i + pat.len() <= code.len() {
        if !code[i..].starts_with(&pat) || (i > 0 && (is_ident(code[i - 1]) || code[i - 1] == '$'))
        {
            i += 1;
            continue;
        }
        let mut j = skip_space(i + pat.len());
        if code.get(j) == Some(&'{') {
            // A group: the first segment of each element at its top level.
            let mut depth = 0;
            let mut expect = true;
            while j < code.len() {
                match code[j] {
                    '{' => {
                        depth += 1;
                        expect = depth == 1;
                        j += 1;
                    }
                    '}' => {
                        depth -= 1;
                        j += 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' => {
                        expect = depth == 1;
                        j += 1;
                    }
                    c if expect && (is_ident(c) || c == '*') => {
                        let (w, end) = if c == '*' {
                            ("*".to_string(), j + 1)
                        } else {
                            word(j)
                        };
                        refs.push((line_at(j), w));
                        expect = false;
                        j = end;
                    }
                    _ => j += 1,
                }
            }
        } else if j < code.len() && (is_ident(code[j]) || code[j] == '*') {
            let (w, end) = if code[j] == '*' {
                ("*".to_string(), j + 1)
            } else {
                word(j)
            };
            // `crate::m!`: a macro, exported at the root whichever room has it.
            if code.get(skip_space(end)) != Some(&'!') {
                refs.push((line_at(j), w));
            }
            j = end;
        }
        i = j.max(i + 1);
    }
    // `crate::self` and `crate::{self, ..}` name lib.rs: counted as no room.
    refs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace in a temporary directory with these files under common/src,
    /// removed on drop.
    struct Tree(PathBuf);

    impl Tree {
        fn new(name: &str, files: &[(&str, &str)]) -> Tree {
            let root =
                std::env::temp_dir().join(format!("xtask-layers-{}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            for (path, text) in files {
                let p = root.join("common/src").join(path);
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                fs::write(p, text).unwrap();
            }
            Tree(root)
        }

        fn problems(&self) -> Vec<String> {
            check(&self.0).unwrap().problems
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A small tree that keeps the rule, with the forms the check reads.
    const CLEAN: &[(&str, &str)] = &[
        (
            "lib.rs",
            "mod diag;\nmod run;\npub use run::cli::main;\nuse crate::plan::Plan;\n",
        ),
        ("diag.rs", "pub fn warn() {}\n"),
        ("sys/mod.rs", "pub mod process;\n"),
        ("sys/process.rs", "use crate::sys::mod_fn;\n"),
        (
            "plan/mod.rs",
            "use crate::{diag::warn, sys::process::{self, pidns}};\n",
        ),
        (
            "run/cli.rs",
            "use crate::plan::Plan;\nfn f() { crate::attach::attach(); }\n",
        ),
        (
            "attach/mod.rs",
            "use crate::{\n    object::Obj,\n    plan,\n};\n",
        ),
        ("object/mod.rs", "use crate::plan::Plan;\n"),
    ];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v = CLEAN.to_vec();
        v.extend(extra);
        v
    }

    #[test]
    fn a_clean_tree_passes() {
        let t = Tree::new("clean", CLEAN);
        assert_eq!(t.problems(), Vec::<String>::new());
        let c = check(&t.0).unwrap();
        assert_eq!((c.rooms, c.files), (6, 7));
        main(&t.0).unwrap();
    }

    #[test]
    fn a_planted_upward_edge_fails_with_its_file_and_line() {
        let t = Tree::new(
            "upward",
            &with(&[(
                "plan/build.rs",
                "use std::fs;\n\npub fn build() {\n    crate::run::stop();\n}\n",
            )]),
        );
        assert_eq!(
            t.problems(),
            ["common/src/plan/build.rs:4: plan (floor 4) imports run (floor 7)"]
        );
        assert!(main(&t.0).is_err());
    }

    #[test]
    fn a_same_floor_edge_fails() {
        let t = Tree::new(
            "same-floor",
            &with(&[("timing.rs", "use crate::diag::warn;\n")]),
        );
        assert_eq!(
            t.problems(),
            ["common/src/timing.rs:1: timing (floor 1) imports diag (floor 1)"]
        );
    }

    #[test]
    fn group_imports_are_read_element_by_element() {
        let t = Tree::new(
            "group",
            &with(&[(
                "kernel/access.rs",
                "use crate::{\n    diag::warn,\n    stop::{Stop, Phase},\n    plan::Plan,\n    sys,\n};\n",
            )]),
        );
        assert_eq!(
            t.problems(),
            ["common/src/kernel/access.rs:4: kernel (floor 3) imports plan (floor 4)"]
        );
        assert_eq!(
            references("use crate::{a::{b, c::d}, e, f::*};"),
            [(1, "a".into()), (1, "e".into()), (1, "f".into())]
        );
    }

    #[test]
    fn comments_strings_and_dollar_crate_are_not_references() {
        let text = "//! Uses [`crate::run`].\n\
                    /// See crate::run::Stop.\n\
                    /* crate::run /* nested crate::run */ crate::run */\n\
                    macro_rules! m { () => { $crate::run::go() }; }\n\
                    fn f() { let _ = \"http://x\"; crate::diag::warn(); } // crate::run\n\
                    fn g() -> char { '\"' } fn h<'a>(_: &'a str) { crate::sys::x(); }\n\
                    fn i() { let _ = r#\"a \" // b\"#; crate::timing::now(); }\n";
        assert_eq!(
            references(text),
            [(5, "diag".into()), (6, "sys".into()), (7, "timing".into())]
        );
        let t = Tree::new(
            "comments",
            &with(&[(
                "sys/bpf.rs",
                "//! Called from [`crate::run`].\n// crate::plan is above us\n\
                 macro_rules! load { () => { $crate::object::load() }; }\n",
            )]),
        );
        assert_eq!(t.problems(), Vec::<String>::new());
    }

    #[test]
    fn an_unknown_room_fails() {
        let t = Tree::new(
            "unknown",
            &with(&[("cli.rs", "use crate::run::Stop;\n"), ("extra/mod.rs", "")]),
        );
        assert_eq!(
            t.problems(),
            [
                "common/src/cli.rs: room cli is on no floor: add it to the table in xtask/src/layers.rs",
                "common/src/extra: room extra is on no floor: add it to the table in xtask/src/layers.rs",
            ]
        );
    }

    #[test]
    fn names_through_the_facade_are_no_room() {
        let t = Tree::new(
            "facade",
            &with(&[(
                "run/session.rs",
                "fn f() { crate::AttachMode::Auto; crate::entry!(main); }\n",
            )]),
        );
        assert_eq!(
            t.problems(),
            ["common/src/run/session.rs:1: run (floor 7) imports AttachMode, which is no room (go to its room, not through lib.rs)"]
        );
    }
}
