//! Each tool's man page and its `--help` name the same options: every option
//! `--help` offers (aliases too) has its entry in man/TOOL.8, and every entry there
//! is an option the tool takes. Both are written by hand; this keeps them in step.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::util::*;

const TOOLS: &[&str] = &[
    "funccount",
    "stackcount",
    "funclatency",
    "vfsreadlat",
    "disksnoop",
    "urandomread",
    "trace",
];

/// The options a `--help` text lists: `-x` and `--long`, aliases included,
/// without -h/--help and -V/--version (which man pages put in the synopsis).
fn help_options(help: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in help.lines() {
        let t = line.trim_start();
        // An option's line: "-p, --pid <PID>  ..." or "--json  ...".
        if t.starts_with('-') && line.starts_with("  ") {
            let head = t.split("  ").next().unwrap_or_default();
            for word in head.split([',', ' ']) {
                if word.starts_with('-') {
                    out.insert(word.to_string());
                }
            }
        }
        // "[alias: --cgroup-path]" and "[aliases: --a, --b]".
        if let Some(rest) = t.split("[alias").nth(1) {
            let list = rest.split(']').next().unwrap_or_default();
            for word in list.split([',', ' ', ':']) {
                if word.starts_with("--") {
                    out.insert(word.to_string());
                }
            }
        }
    }
    for builtin in ["-h", "--help", "-V", "--version"] {
        out.remove(builtin);
    }
    out
}

/// The options a man page documents: the words of each `.TP` entry's tag line
/// that begin with `\-`.
fn man_options(man: &str) -> BTreeSet<String> {
    let lines: Vec<&str> = man.lines().collect();
    let mut out = BTreeSet::new();
    for pair in lines.windows(2) {
        if pair[0] != ".TP" || !pair[1].starts_with("\\-") {
            continue;
        }
        let tag = pair[1].replace("\\-", "-");
        for word in tag.split([',', ' ']) {
            if word.starts_with('-') {
                out.insert(word.to_string());
            }
        }
    }
    for builtin in ["-h", "--help", "-V", "--version"] {
        out.remove(builtin);
    }
    out
}

#[test]
fn help_and_man_page_name_the_same_options() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    for name in TOOLS {
        let out = run(&tool(name), &["--help"], Duration::from_secs(30));
        assert_eq!(out.code(), 0, "{name} --help: {}", out.stderr);
        let help = help_options(&out.stdout);
        assert!(help.len() > 5, "{name}: options not found in --help");
        let page = std::fs::read_to_string(root.join("man").join(format!("{name}.8"))).unwrap();
        let man = man_options(&page);
        for o in help.difference(&man) {
            problems.push(format!("{name}: {o} is in --help, not in man/{name}.8"));
        }
        for o in man.difference(&help) {
            problems.push(format!("{name}: {o} is in man/{name}.8, not in --help"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_macro_argument_loses_its_double_quotes() {
    // troff takes `"` in a macro's arguments as quoting: `.B trace 'f "%d", x'`
    // renders as `trace 'f %d , x'`, which pasted is a bad probe. Such lines are
    // written with \fB...\fR and \(dq.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in TOOLS {
        let page = std::fs::read_to_string(root.join("man").join(format!("{name}.8"))).unwrap();
        for (n, line) in page.lines().enumerate() {
            let is_macro = [".B ", ".I ", ".BR ", ".IR ", ".BI "]
                .iter()
                .any(|m| line.starts_with(m));
            assert!(
                !(is_macro && line.contains('"')),
                "man/{name}.8:{}: {line}",
                n + 1
            );
        }
    }
}

#[test]
fn every_control_line_is_a_known_macro() {
    // troff takes a line that begins with `.` or `'` as a request: text wrapped
    // so that `.gopclntab` began a line vanished from the page (lintian: "macro
    // 'gopclntab' not defined"). Such text is written \&.gopclntab.
    const KNOWN: [&str; 12] = [
        "TH", "SH", "SS", "PP", "TP", "IP", "B", "I", "BR", "nf", "fi", "ad",
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    for name in TOOLS {
        let page = std::fs::read_to_string(root.join("man").join(format!("{name}.8"))).unwrap();
        for (n, line) in page.lines().enumerate() {
            let Some(rest) = line.strip_prefix('.').or_else(|| line.strip_prefix('\'')) else {
                continue;
            };
            let request = rest.split_whitespace().next().unwrap_or("");
            // `.` alone is an empty request; `.\"` a comment.
            if !(request.is_empty() || request.starts_with("\\\"") || KNOWN.contains(&request)) {
                problems.push(format!("man/{name}.8:{}: {line}", n + 1));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_parsers_read_both_forms() {
    let help = "Options:\n  -p, --pid <PID>      Trace this\n      --json  x [alias: --j-s]\n  -h, --help  Print help\n";
    let want = ["--j-s", "--json", "--pid", "-p"].map(String::from);
    assert_eq!(help_options(help), BTreeSet::from(want.clone()));
    let man =
        ".TP\n\\-p PID, \\-\\-pid PID\nText \\-x.\n.TP\n\\-\\-json, \\-\\-j\\-s\n.TP\nPATTERN\n";
    assert_eq!(man_options(man), BTreeSet::from(want));
}
