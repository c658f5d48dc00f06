//! Every example in the man pages (man/*.8, EXAMPLES) runs on this guest kernel:
//! each is started as written (the tool's path put in, a PID replaced by a
//! running python3's, what follows a `>` or `;` left out), stopped with SIGINT
//! once it printed its first line, and must exit 0 with no error.

use std::process::Command;
use std::time::{Duration, Instant};

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
    // Up to the first '>' or ';' outside quotes: a probe's text may hold them.
    let mut quoted = false;
    let end = cmd
        .char_indices()
        .find(|&(_, c)| {
            quoted ^= c == '\'';
            !quoted && (c == '>' || c == ';')
        })
        .map_or(cmd.len(), |(i, _)| i);
    let cmd = cmd[..end].trim();
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

/// Runs `line` (sh) in `dir` until its first line that is not a warning of
/// `tool` (attached), or its exit (stackcount -f prints nothing before its
/// stacks); then 1 s more and SIGINT. The error says what went wrong.
fn run_example(line: &str, tool: &str, dir: &std::path::Path) -> Result<(), String> {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::sync::mpsc;
    let mut child = Command::new("sh")
        .args(["-c", line])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel();
    let err_tx = tx.clone();
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let readers = [
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((false, l));
            }
        }),
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = err_tx.send((true, l));
            }
        }),
    ];
    let prefix = format!("{tool}:");
    let mut stderr = Vec::new();
    let end = Instant::now() + Duration::from_secs(240);
    let mut ready = false;
    while Instant::now() < end {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((is_err, l)) => {
                if is_err {
                    stderr.push(l.clone());
                }
                if !l.starts_with(&prefix) {
                    ready = true;
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if child.try_wait().map_err(|e| e.to_string())?.is_some() {
                    break;
                }
            }
        }
    }
    if ready {
        std::thread::sleep(Duration::from_secs(1));
    }
    kill(child.id(), libc::SIGINT);
    let stop = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        if Instant::now() > stop {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for r in readers {
        let _ = r.join();
    }
    stderr.extend(rx.try_iter().filter(|(e, _)| *e).map(|(_, l)| l));
    let stderr = stderr.join("\n");
    match status {
        None => Err(format!("no exit within 120 s of SIGINT: {stderr}")),
        Some(st) if st.code() != Some(0) || stderr.contains(" error: ") => {
            Err(format!("{st}: {stderr}"))
        }
        Some(_) if !ready => Err(format!("exited before it was ready: {stderr}")).or_else(|e| {
            // stackcount -f and -D print nothing until they end.
            if line.contains(" -f ") {
                Ok(())
            } else {
                Err(e)
            }
        }),
        Some(_) => Ok(()),
    }
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn every_man_page_example_runs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = Scratch::new();
    // The process the -p examples trace: a python3 (libc's malloc and read,
    // Python's USDT probes) slow enough that a traced malloc with -U does not
    // flood a debug build under emulation.
    let mut py = Command::new("python3")
        .args([
            "-c",
            "import time\nwhile True:\n  open('/dev/null').read()\n  time.sleep(0.5)",
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
            let tool = example.split(' ').next().unwrap();
            eprintln!("example: {example}");
            ran += 1;
            if let Err(why) = run_example(&line, tool, &dir.0) {
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
    // '>' and ';' inside a probe's text stay.
    let probe = "'r::f \"%s -> %d\", arg2; x'";
    assert_eq!(
        runnable(&format!("trace {probe} > out"), 7),
        format!("exec {} {probe}", tool("trace").display())
    );
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
