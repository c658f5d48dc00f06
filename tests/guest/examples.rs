//! Every example in the man pages (man/*.8, EXAMPLES) runs on this guest kernel:
//! each is started as written (the tool's path put in, a PID replaced by a
//! running python3's, what follows a `>` or `;` left out), stopped with SIGINT
//! once it printed its first line, and must exit 0 with no error.

use std::process::Command;
use std::time::Duration;

use crate::util::*;

/// The examples of one page: the command lines of its EXAMPLES section, in
/// groff's two forms (`.B cmd`, `# \fBcmd\fR`), as a shell reads them.
fn examples(page: &str) -> Vec<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let Some((_, after)) = text.split_once("\n.SH EXAMPLES\n") else {
        return Vec::new();
    };
    let section = after.split("\n.SH ").next().unwrap();
    section
        .lines()
        .filter_map(|l| {
            l.strip_prefix(".B ").or_else(|| {
                l.strip_prefix("# \\fB")
                    .map(|c| c.strip_suffix("\\fR").unwrap_or(c))
            })
        })
        .map(|c| {
            c.replace("\\-", "-")
                .replace("\\(dq", "\"")
                .replace("\\(aq", "'")
                .replace("\\e", "\\")
                .replace("\\fB", "")
                .replace("\\fR", "")
        })
        .collect()
}

/// `cmd` as run here: the tool by its path, `-p N` of `pid`, no redirection
/// or second command.
fn runnable(cmd: &str, pid: u32) -> String {
    let cmd = cmd.split([';', '>']).next().unwrap().trim();
    let (tool_name, rest) = cmd.split_once(' ').unwrap_or((cmd, ""));
    let mut words: Vec<String> = Vec::new();
    let mut it = rest.split(' ').peekable();
    while let Some(w) = it.next() {
        words.push(w.to_string());
        if w == "-p" && it.peek().is_some_and(|n| n.parse::<u32>().is_ok()) {
            it.next();
            words.push(pid.to_string());
        }
    }
    format!("exec {} {}", tool(tool_name).display(), words.join(" "))
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn every_man_page_example_runs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = Scratch::new();
    // The process the -p examples trace: libc's malloc and read, Python's USDT.
    let mut py = Command::new("python3")
        .args([
            "-c",
            "import time\nwhile True:\n  open('/dev/null').read()\n  time.sleep(0.05)",
        ])
        .spawn()
        .unwrap();
    let pid = py.id();
    let mut failed = Vec::new();
    let mut ran = 0;
    let mut pages: Vec<_> = std::fs::read_dir(format!("{root}/man"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "8"))
        .collect();
    pages.sort();
    for page in pages {
        for example in examples(page.to_str().unwrap()) {
            let line = runnable(&example, pid);
            let tool = example.split(' ').next().unwrap().to_string();
            eprintln!("example: {example}");
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut cmd = Command::new("sh");
                cmd.args(["-c", &line]).current_dir(&dir.0);
                let mut t = spawn_cmd(cmd);
                // Its first line that is not a warning: attached.
                let prefix = format!("{tool}:");
                t.wait_line(|l| !l.starts_with(&prefix), Duration::from_secs(240));
                std::thread::sleep(Duration::from_secs(1));
                t.signal(libc::SIGINT);
                let out = t.finish(Duration::from_secs(240));
                assert!(
                    out.code() == 0 && !out.stderr.contains(" error: "),
                    "exit {}: {}",
                    out.code(),
                    out.stderr
                );
            }));
            ran += 1;
            if let Err(e) = result {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failed.push(format!("{example}: {why}"));
            }
        }
    }
    let _ = py.kill();
    let _ = py.wait();
    assert!(ran >= 30, "only {ran} examples found");
    assert!(
        failed.is_empty(),
        "{} of {ran} examples failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn examples_are_read_as_a_shell_reads_them() {
    assert_eq!(
        runnable("funccount -Ti 1 -p 185 'vfs_*'", 7),
        format!("exec {} -Ti 1 -p 7 'vfs_*'", tool("funccount").display())
    );
    assert_eq!(
        runnable(
            "stackcount -f -D 10 'tcp_send*' > out.folded; flamegraph.pl out.folded",
            7
        ),
        format!("exec {} -f -D 10 'tcp_send*'", tool("stackcount").display())
    );
    let trace = examples(concat!(env!("CARGO_MANIFEST_DIR"), "/man/trace.8"));
    assert!(
        trace.contains(
            &"trace -t 'do_sys_open \"%s\", arg2@user' 'r::do_sys_open \"ret %d\", retval'"
                .to_string()
        ),
        "{trace:?}"
    );
}
