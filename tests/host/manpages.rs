//! Each tool's man page and its `--help` name the same options: every option
//! `--help` offers (aliases too) has its entry in man/TOOL.8, and every entry there
//! is an option the tool takes. Both are written by hand; this keeps them in step.
//! man/tracekit.7, what the tools share, has no tool of its own: its options must
//! be ones the tools take, its sections must be there, and every tool page must
//! refer to it.

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

/// Every page: the tools' and tracekit.7.
fn pages() -> Vec<String> {
    let mut all: Vec<String> = TOOLS.iter().map(|t| format!("{t}.8")).collect();
    all.push("tracekit.7".to_string());
    all
}

fn read_page(page: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join("man").join(page)).unwrap()
}

/// The section names of a page, in order (`.SH NAME` -> `NAME`).
fn sections(page: &str) -> Vec<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix(".SH "))
        .map(|h| h.trim_matches('"').to_string())
        .collect()
}

/// The lines of one section, without its `.SH` line.
fn section<'a>(page: &'a str, name: &str) -> Vec<&'a str> {
    page.lines()
        .skip_while(|l| l.strip_prefix(".SH ").map(|h| h.trim_matches('"')) != Some(name))
        .skip(1)
        .take_while(|l| !l.starts_with(".SH "))
        .collect()
}

/// The variables an ENVIRONMENT section documents: the first word of each `.TP`
/// entry's tag line (`TRACEKIT_TIMING=1` -> `TRACEKIT_TIMING`).
fn env_vars(lines: &[&str]) -> BTreeSet<String> {
    lines
        .windows(2)
        .filter(|pair| pair[0] == ".TP")
        .filter_map(|pair| pair[1].split(['=', ' ']).next())
        .filter(|v| v.starts_with("TRACEKIT_"))
        .map(str::to_string)
        .collect()
}

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
    for name in pages() {
        let page = read_page(&name);
        for (n, line) in page.lines().enumerate() {
            let is_macro = [".B ", ".I ", ".BR ", ".IR ", ".BI "]
                .iter()
                .any(|m| line.starts_with(m));
            assert!(
                !(is_macro && line.contains('"')),
                "man/{name}:{}: {line}",
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
    let mut problems = Vec::new();
    for name in pages() {
        let page = read_page(&name);
        for (n, line) in page.lines().enumerate() {
            let Some(rest) = line.strip_prefix('.').or_else(|| line.strip_prefix('\'')) else {
                continue;
            };
            let request = rest.split_whitespace().next().unwrap_or("");
            // `.` alone is an empty request; `.\"` a comment.
            if !(request.is_empty() || request.starts_with("\\\"") || KNOWN.contains(&request)) {
                problems.push(format!("man/{name}:{}: {line}", n + 1));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn tracekit_7_has_the_shared_sections() {
    let page = read_page("tracekit.7");
    assert!(
        page.starts_with(".TH tracekit 7 "),
        "man/tracekit.7 must begin with .TH tracekit 7"
    );
    let have = sections(&page);
    for want in [
        "NAME",
        "DESCRIPTION",
        "SERVICE MODE",
        "TIMING",
        "ATTACH MODES",
        "ENVIRONMENT",
        "FILES",
        "SEE ALSO",
    ] {
        assert!(
            have.iter().any(|h| h == want),
            "man/tracekit.7 has no {want} section: {have:?}"
        );
    }
    // Its SEE ALSO names every tool's page.
    let see_also = section(&page, "SEE ALSO").join(" ");
    for name in TOOLS {
        assert!(
            see_also.contains(&format!("{name}(8)")),
            "man/tracekit.7's SEE ALSO does not name {name}(8)"
        );
    }
}

#[test]
fn every_tool_page_refers_to_tracekit_7() {
    // What the tools share is written once, in tracekit.7; each page points there
    // from its SEE ALSO, and from every shared section it keeps short.
    let shared = ["SERVICE MODE", "TIMING", "ENVIRONMENT", "FILES"];
    let mut problems = Vec::new();
    for name in TOOLS {
        let page = read_page(&format!("{name}.8"));
        if !section(&page, "SEE ALSO").join(" ").contains("tracekit(7)") {
            problems.push(format!("man/{name}.8: SEE ALSO does not name tracekit(7)"));
        }
        for s in shared {
            let body = section(&page, s);
            if sections(&page).iter().any(|h| h == s) && !body.join(" ").contains("tracekit(7)") {
                problems.push(format!("man/{name}.8: {s} does not refer to tracekit(7)"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn tracekit_7_documents_what_the_tools_take() {
    // tracekit.7 has no --help of its own: every option it documents must be one
    // that some tool's --help offers, and every variable a tool page lists must
    // be in its ENVIRONMENT, which must name only variables the code reads.
    let page = read_page("tracekit.7");
    let mut offered = BTreeSet::new();
    for name in TOOLS {
        let out = run(&tool(name), &["--help"], Duration::from_secs(30));
        assert_eq!(out.code(), 0, "{name} --help: {}", out.stderr);
        offered.extend(help_options(&out.stdout));
    }
    let documented = man_options(&page);
    assert!(
        documented.contains("--listen") && documented.contains("--listen-token"),
        "man/tracekit.7 documents {documented:?}"
    );
    let mut problems: Vec<String> = documented
        .difference(&offered)
        .map(|o| format!("man/tracekit.7 documents {o}, which no tool's --help offers"))
        .collect();

    let shared = env_vars(&section(&page, "ENVIRONMENT"));
    assert!(
        shared.len() > 5,
        "man/tracekit.7: ENVIRONMENT lists {shared:?}"
    );
    for name in TOOLS {
        let own = read_page(&format!("{name}.8"));
        for v in env_vars(&section(&own, "ENVIRONMENT")).difference(&shared) {
            problems.push(format!("man/{name}.8 lists {v}, man/tracekit.7 does not"));
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut code = String::new();
    for dir in ["common", "tools"] {
        read_sources(&root.join(dir), &mut code);
    }
    for v in &shared {
        if !code.contains(v.as_str()) {
            problems.push(format!(
                "man/tracekit.7 lists {v}, which no code in common/ or tools/ reads"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Appends every `.rs` file under `dir` to `out`.
fn read_sources(dir: &std::path::Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            read_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[test]
fn the_parsers_read_both_forms() {
    let help = "Options:\n  -p, --pid <PID>      Trace this\n      --json  x [alias: --j-s]\n  -h, --help  Print help\n";
    let want = ["--j-s", "--json", "--pid", "-p"].map(String::from);
    assert_eq!(help_options(help), BTreeSet::from(want.clone()));
    let man =
        ".TP\n\\-p PID, \\-\\-pid PID\nText \\-x.\n.TP\n\\-\\-json, \\-\\-j\\-s\n.TP\nPATTERN\n";
    assert_eq!(man_options(man), BTreeSet::from(want));
    let page = ".TH x 7\n.SH NAME\nx\n.SH ENVIRONMENT\n.TP\nTRACEKIT_A=1\nText.\n.TP\nTRACEKIT_B\nText.\n.SH \"SEE ALSO\"\ny(8)\n";
    assert_eq!(sections(page), ["NAME", "ENVIRONMENT", "SEE ALSO"]);
    assert_eq!(section(page, "SEE ALSO"), ["y(8)"]);
    let vars = env_vars(&section(page, "ENVIRONMENT"));
    assert_eq!(
        vars,
        BTreeSet::from(["TRACEKIT_A", "TRACEKIT_B"].map(String::from))
    );
}
