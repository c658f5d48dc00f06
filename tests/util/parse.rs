//! Reading the tools' output: funccount tables, stackcount stacks, `--debug`
//! and `-v` lines, JSON lines, lost-event warnings and ready lines; and the
//! assertions on a part of it that show all of it when they fail.

use super::Output;

/// The rows (name, count) of the last funccount table in `stdout`.
pub fn last_table(stdout: &str) -> Vec<(String, u64)> {
    let lines: Vec<&str> = stdout.lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.starts_with("FUNC ") && l.trim_end().ends_with("COUNT"))
        .unwrap_or_else(|| panic!("no summary table in:\n{stdout}"));
    lines[start + 1..]
        .iter()
        .take_while(|l| !l.is_empty() && !l.starts_with("Detaching"))
        .map(|l| {
            let (name, count) = l.rsplit_once(' ').expect("row");
            (
                name.trim().to_string(),
                count.trim().parse().expect("count"),
            )
        })
        .collect()
}

pub fn rows(expected: &[(&str, u64)]) -> Vec<(String, u64)> {
    expected.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// N of the banner `Tracing N functions for ...`: how many probes a pattern
/// matched.
pub fn traced_count(stdout: &str) -> usize {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("Tracing ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no Tracing line in:\n{stdout}"))
}

/// Stacks of a stackcount text summary: (frames leaf first, count).
pub fn parse_stacks(stdout: &str) -> Vec<(Vec<String>, u64)> {
    let mut out = Vec::new();
    let mut frames = Vec::new();
    for line in stdout.lines() {
        if let Some(f) = line.strip_prefix("  ").filter(|f| !f.starts_with("  ")) {
            frames.push(f.to_string());
        } else if let Some(c) = line
            .strip_prefix("    ")
            .and_then(|c| c.parse::<u64>().ok())
        {
            out.push((std::mem::take(&mut frames), c));
        }
    }
    out
}

/// The `--debug` line saying how tracepoints were attached.
pub fn tracepoint_mechanisms(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("tracepoints: "))
        .unwrap_or_else(|| panic!("no tracepoints line in:\n{stderr}"))
}

/// The kernel stack of `stackcount --debug -K t:task:task_rename` over the
/// workload's `rename N`, asserted: the tracepoint on a raw link, and one stack
/// (counted per command name, which the workload changes: -p keys stacks per
/// process, as -P) beginning where the tracepoint fired, `count` times in all.
pub fn rename_stack(out: &Output, count: u64) -> Vec<String> {
    assert_eq!(
        tracepoint_mechanisms(&out.stderr),
        "tracepoints: 1 as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 0 as perf events"
    );
    let stacks = parse_stacks(&out.stdout);
    let frames = stacks.first().expect("a stack").0.clone();
    assert!(stacks.iter().all(|(f, _)| *f == frames), "{}", out.stdout);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    assert_eq!(total, count, "{}", out.stdout);
    assert_eq!(frames[0], "__set_task_comm", "{frames:?}");
    frames
}

/// Whether `line` says a per-event tool is ready: BCC's examples print their
/// column header (`TIME(s) ...`), JSON runs a `Tracing ...` line on stderr.
pub fn header_or_tracing(line: &str) -> bool {
    line.starts_with("TIME") || line.starts_with("Tracing")
}

/// The numbers in stderr warnings `... lost N events: ...` (per report), summed.
pub fn lost_reported(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split_once(": lost ")?.1;
            let (n, tail) = rest.split_once(' ')?;
            (tail.starts_with("event: ") || tail.starts_with("events: "))
                .then(|| n.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

/// `-v`'s count of the records that reached user space (trace).
pub fn trace_records(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("trace: ")?
                .strip_suffix(" records reached user space")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no record count in:\n{stderr}"))
}

/// The `--debug` line `attached: N probes, M links (...)`.
pub fn attached_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("attached: "))
        .unwrap_or_else(|| panic!("no attached line in:\n{stderr}"))
}

/// The objects of a `--json` run's stdout, one a line (a line that is not JSON
/// fails the test).
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// disksnoop's JSON records as (type, bytes), in order: what its tests on both
/// kernels compare with the requests they made.
pub fn disksnoop_sizes(recs: &[serde_json::Value]) -> Vec<(String, u64)> {
    recs.iter()
        .map(|r| {
            (
                r["type"].as_str().unwrap().to_string(),
                r["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Asserts that `text` (a tool's stdout or stderr) contains `part`; a failure
/// shows all of it, as the tests' own `assert!`s did one by one.
#[track_caller]
pub fn assert_contains(text: &str, part: &str) {
    assert!(text.contains(part), "no {part:?} in:\n{text}");
}

/// [`assert_contains`] for the beginning of `text`.
#[track_caller]
pub fn assert_starts_with(text: &str, start: &str) {
    assert!(
        text.starts_with(start),
        "not starting with {start:?}:\n{text}"
    );
}

/// [`assert_contains`] for the end of `text`.
#[track_caller]
pub fn assert_ends_with(text: &str, end: &str) {
    assert!(text.ends_with(end), "not ending with {end:?}:\n{text}");
}
