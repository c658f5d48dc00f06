//! Reading pprof profiles with the real consumer, Go's `go tool pprof`
//! (package golang-go): running it, and parsing its `-traces` text.

use std::path::Path;
use std::process::Command;

/// `go tool pprof ARGS FILE`'s stdout, asserted successful. Go's caches go
/// beside FILE (a guest's HOME may not be writable).
pub fn go_pprof(args: &[&str], file: &Path) -> String {
    let dir = file.parent().expect("a profile in a directory");
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", dir)
        .env("GOCACHE", dir.join("go-cache"))
        .output()
        .expect("running go tool pprof (package golang-go)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof {args:?} {}: {}\n{stdout}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// One stack of `go tool pprof -traces`: its labels, its count, its frames
/// (leaf first).
#[derive(Debug)]
pub struct Trace {
    pub labels: Vec<(String, String)>,
    pub count: u64,
    pub frames: Vec<String>,
}

/// Parses `-traces` output: blocks between `-----------+---` lines; label
/// lines `key:  value`, then `COUNT   leaf`, then one frame a line (with
/// `-lines`, a frame is "name file:line").
pub fn traces(text: &str) -> Vec<Trace> {
    let mut out = Vec::new();
    for block in text.split("-----------+").skip(1) {
        let mut t = Trace {
            labels: Vec::new(),
            count: 0,
            frames: Vec::new(),
        };
        for line in block.lines().skip(1) {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [] => {}
                [key, value] if key.ends_with(':') && t.frames.is_empty() => t
                    .labels
                    .push((key.trim_end_matches(':').to_string(), value.to_string())),
                [n, leaf @ ..] if t.frames.is_empty() && n.parse::<u64>().is_ok() => {
                    t.count = n.parse().unwrap();
                    t.frames.push(leaf.join(" "));
                }
                // A frame: one word, or a call inlined there, "name (inline)".
                _ if !t.frames.is_empty() => t.frames.push(line.trim().to_string()),
                w => panic!("unexpected -traces line {w:?} in\n{text}"),
            }
        }
        if !t.frames.is_empty() {
            out.push(t);
        }
    }
    out
}

/// Each stack of `-traces` text as (its `probe` label, its count, its frame
/// `frame`, leaf first), sorted: "(none)" for a stack without the label.
pub fn by_probe(text: &str, frame: usize) -> Vec<(String, u64, String)> {
    let mut out: Vec<(String, u64, String)> = traces(text)
        .iter()
        .map(|t| {
            let probe = t.labels.iter().find(|(k, _)| k == "probe");
            let probe = probe.map_or("(none)", |(_, v)| v.as_str()).to_string();
            (
                probe,
                t.count,
                t.frames.get(frame).cloned().unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

/// `want` as [`by_probe`] gives it, for comparing.
pub fn probe_stacks(want: &[(&str, u64, &str)]) -> Vec<(String, u64, String)> {
    want.iter()
        .map(|(p, n, f)| (p.to_string(), *n, f.to_string()))
        .collect()
}
