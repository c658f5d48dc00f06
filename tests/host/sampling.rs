//! Sampling and counter sources (issue 40): `profile:` samples of a program
//! that burns a known amount of CPU in a known function, `software:` events a
//! program makes a known number of (page faults, voluntary context switches),
//! `-c` and `-p`, a mixed run, and the hardware error on a machine without
//! counters (this one).

use std::path::{Path, PathBuf};

use crate::util::*;

/// tests/progs/sampled.c, built `-O2`.
pub fn build_sampled(dir: &Scratch) -> PathBuf {
    gcc(dir, "sampled", "sampled", &["-O2", "-lpthread"])
}

/// `funccount -p PID ARGS` over `sampled MODE N`: its table.
fn counted(bin: &Path, prog: &[&str], args: &[&str]) -> Vec<(String, u64)> {
    let out = trace_cprog(&tool("funccount"), bin, prog, args, |l| {
        l.starts_with("Tracing")
    });
    assert_eq!(out.code(), 0, "{}", out.stderr);
    last_table(&out.stdout)
}

fn count_of(table: &[(String, u64)], name: &str) -> u64 {
    table.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c)
}

#[test]
fn software_events_with_period_1_count_every_event() {
    let dir = Scratch::new();
    let bin = build_sampled(&dir);
    // 5,000 fresh pages touched: as many page faults (and one more, of the
    // program's own exit path at most a few).
    let t = counted(&bin, &["faults", "5000"], &["software:page-faults:1"]);
    let faults = count_of(&t, "software:page-faults:1");
    assert!((5000..=5050).contains(&faults), "{t:?}");
    // 200 sleeps of 1 ms: as many voluntary switches (and the exit's).
    let t = counted(&bin, &["sleeps", "200"], &["software:cs:1"]);
    let cs = count_of(&t, "software:context-switches:1");
    assert!((200..=210).contains(&cs), "{t:?}");
}

#[test]
fn a_mixed_run_counts_samples_and_calls() {
    // funccount 'software:cs:1' 'c:nanosleep': 200 of each.
    let dir = Scratch::new();
    let bin = build_sampled(&dir);
    let t = counted(
        &bin,
        &["sleeps", "200"],
        &["software:cs:1", "c:clock_nanosleep"],
    );
    assert_eq!(count_of(&t, "clock_nanosleep"), 200, "{t:?}");
    let cs = count_of(&t, "software:context-switches:1");
    assert!((200..=210).contains(&cs), "{t:?}");
}

#[test]
fn profile_samples_a_busy_function_at_its_rate() {
    // 2 s of CPU in tk_burn, sampled at 99 Hz: 198 samples +-10%, and at
    // least 95% of them with tk_burn in their stack (whole, by unwind tables:
    // the program keeps no frame pointers).
    let dir = Scratch::new();
    let bin = build_sampled(&dir);
    let out = trace_cprog(
        &tool("stackcount"),
        &bin,
        &["burn", "2000"],
        &["profile:hz:99"],
        |l| l.starts_with("Tracing"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let stacks = parse_stacks(&out.stdout);
    let all: u64 = stacks.iter().map(|s| s.1).sum();
    assert!((178..=218).contains(&all), "{all} samples:\n{}", out.stdout);
    let burning: u64 = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "tk_burn"))
        .map(|s| s.1)
        .sum();
    assert!(
        burning * 100 >= all * 95,
        "{burning} of {all} in tk_burn:\n{}",
        out.stdout
    );
    // Whole user stacks: down to main and _start.
    let (top, _) = stacks.iter().max_by_key(|s| s.1).unwrap();
    let at = top.iter().position(|f| f == "tk_burn").unwrap();
    assert_eq!(top[at + 1], "main", "{top:?}");
    assert_eq!(top.last().map(String::as_str), Some("_start"), "{top:?}");
}

#[test]
fn samples_in_the_vdso_are_walked_whole_without_reloading_tables() {
    // A second of CPU reading the clock in the vDSO, code of no file, sampled
    // at 999 Hz with -p (tables loaded before tracing). A walk through code
    // the process's table did not hold asked for the process again, and its
    // next samples were cut short while it was reloaded: hundreds of times a
    // second here. Then the vDSO was a mapping known to have no table, walked
    // by frame pointers, and 1% of its stacks were cut where its code had none
    // set up. Now it has a table (the kernel's one image, copied from the
    // tracer's own vDSO): every stack is whole.
    let dir = Scratch::new();
    let bin = build_sampled(&dir);
    let out = trace_cprog(
        &tool("stackcount"),
        &bin,
        &["vdso", "1000"],
        &["-U", "profile:hz:999"],
        |l| l.starts_with("Tracing"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        !out.stderr.contains("before its unwind tables were loaded"),
        "{}",
        out.stderr
    );
    let stacks = parse_stacks(&out.stdout);
    let all: u64 = stacks.iter().map(|s| s.1).sum();
    assert!(
        (900..=1100).contains(&all),
        "{all} samples:\n{}",
        out.stdout
    );
    // In the vDSO (or libc's clock_gettime calling it), called by tk_vdso.
    let in_vdso: u64 = stacks
        .iter()
        .filter(|(f, _)| f.first().is_some_and(|f| f == "clock_gettime"))
        .map(|(f, n)| {
            assert!(f.contains(&"tk_vdso".into()), "{f:?}");
            n
        })
        .sum();
    assert!(
        in_vdso * 2 >= all,
        "{in_vdso} of {all} in the vDSO:\n{}",
        out.stdout
    );
    // Every stack of tk_vdso is whole; the rest is the process's exit (its
    // exit_group may be sampled after its memory is gone: cut, rightly).
    for (f, _) in &stacks {
        let has = |name: &str| f.iter().any(|x| x == name);
        if has("tk_vdso") {
            assert!(
                f.last().is_some_and(|x| x == "_start") && !has("[truncated]"),
                "not whole: {f:?}\n{}",
                out.stdout
            );
        } else {
            assert!(has("_Exit") || has("exit"), "{f:?}\n{}", out.stdout);
        }
    }
}

#[test]
fn trace_names_the_vdso_as_perf_does() {
    // trace -U printed a vDSO frame with no module (code of no file); perf
    // says [vdso]. Its caller is libc's clock_gettime, then tk_vdso.
    let dir = Scratch::new();
    let bin = build_sampled(&dir);
    let out = trace_cprog(
        &tool("trace"),
        &bin,
        &["vdso", "500"],
        &["-U", "profile:hz:99"],
        |l| l.starts_with("PID"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let frames = |rec: &str| -> Vec<String> {
        rec.lines()
            .skip(1)
            .map(|l| {
                let l = l.trim();
                // name+0xOFF [module]: the offset varies.
                match (l.split_once('+'), l.rsplit_once(' ')) {
                    (Some((name, _)), Some((_, module))) => format!("{name} {module}"),
                    _ => l.to_string(),
                }
            })
            .collect()
    };
    let in_vdso: Vec<Vec<String>> = out
        .stdout
        .split("\n\n")
        .map(frames)
        .filter(|f| f.first().is_some_and(|f| f.ends_with("[vdso]")))
        .collect();
    assert!(
        in_vdso.len() >= 10,
        "{} in the vDSO:\n{}",
        in_vdso.len(),
        out.stdout
    );
    for f in &in_vdso {
        assert_eq!(
            f[..3],
            [
                "clock_gettime [vdso]",
                "clock_gettime [libc.so.6]",
                "tk_vdso [sampled]"
            ],
            "{f:?}"
        );
    }
}

#[test]
fn profile_on_one_cpu_samples_that_cpu_only() {
    // -c 0 for 2 s at 99 Hz: one CPU's timer, busy or idle, 198 times.
    let out = run(
        &tool("funccount"),
        &["-c", "0", "-d", "2", "profile:hz:99"],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let n = count_of(&last_table(&out.stdout), "profile:hz:99");
    assert!((188..=208).contains(&n), "{}", out.stdout);
}

#[test]
fn hardware_sources_without_counters_say_why() {
    // This machine (a VM) has no PMU: one line naming the event and why.
    let out = run(
        &tool("funccount"),
        &["-d", "1", "hardware:cache-misses"],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code(), 1);
    assert_eq!(
        out.stderr,
        "funccount: error: hardware:cache-misses:1000000: this machine has no hardware \
         performance counters (no cpu PMU under /sys/bus/event_source/devices: most virtual \
         machines expose none); software: and profile: sources work\n"
    );
    let out = run(
        &tool("funccount"),
        &["-d", "1", "software:nope"],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code(), 1);
    assert!(
        out.stderr
            .starts_with("funccount: error: bad probe \"software:nope\": unknown software event 'nope': use cpu-clock, task-clock, page-faults"),
        "{}",
        out.stderr
    );
}

#[test]
fn trace_prints_one_line_per_sample_with_its_stack() {
    // 50 sleeps of 1 ms: 50 context switches (and a few of the exit's), each
    // a line with the whole user stack where the process switched.
    let dir = Scratch::new();
    let bin = build_sampled(&dir);
    let out = trace_cprog(
        &tool("trace"),
        &bin,
        &["sleeps", "50"],
        &["-U", "software:cs:1"],
        |l| l.starts_with("PID"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let events = out
        .stdout
        .lines()
        .filter(|l| l.ends_with("software:context-switches:1 "))
        .count();
    assert!((50..=55).contains(&events), "{}", out.stdout);
    // Each sleep is a switch in tk_sleeps; a preemption there (CI's load:
    // once, on the way back from a sleep) is one more, a real switch too.
    let sleeping = out.stdout.matches("        tk_sleeps+").count();
    assert!(
        (50..=events).contains(&sleeping),
        "{sleeping} of {events}: {}",
        out.stdout
    );
    // A sampling source has no arguments.
    let out = run(
        &tool("trace"),
        &["profile:hz:99 \"%d\", arg1"],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code(), 1);
    assert_eq!(
        out.stderr,
        "trace: error: bad probe \"profile:hz:99 \"%d\", arg1\": profile:hz:99: a sampling \
         source has no arguments, so no arg1\n"
    );
}

#[test]
fn stackcount_counts_a_sampling_source_beside_a_tracepoint() {
    // 100 sleeps: 100 clock_nanosleep syscalls and 100 switches away, both
    // with tk_sleeps in their user stacks, in one run.
    let dir = Scratch::new();
    let bin = build_sampled(&dir);
    let out = trace_cprog(
        &tool("stackcount"),
        &bin,
        &["sleeps", "100"],
        &[
            "-U",
            "software:cs:1",
            "t:syscalls:sys_enter_clock_nanosleep",
        ],
        |l| l.starts_with("Tracing"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with(
            "Tracing 2 functions for \"software:context-switches:1 (every event)\", \"t:syscalls:sys_enter_clock_nanosleep\""
        ),
        "{}",
        out.stdout
    );
    let sleeping: u64 = parse_stacks(&out.stdout)
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "tk_sleeps"))
        .map(|s| s.1)
        .sum();
    assert!((200..=205).contains(&sleeping), "{}", out.stdout);
}

#[test]
fn profile_with_p_covers_threads_created_during_the_run() {
    // Two threads started after the tool attached burn 2 s of the process's
    // CPU between them: 198 samples +-10%, all in tk_burn, through
    // start_thread (the events are per CPU, filtered by process in BPF).
    let dir = Scratch::new();
    let bin = build_sampled(&dir);
    let out = trace_cprog(
        &tool("stackcount"),
        &bin,
        &["threads", "1000"],
        &["-U", "profile:hz:99"],
        |l| l.starts_with("Tracing"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let stacks = parse_stacks(&out.stdout);
    let all: u64 = stacks.iter().map(|s| s.1).sum();
    assert!((178..=218).contains(&all), "{all} samples:\n{}", out.stdout);
    let threads: u64 = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "tk_burn") && f.iter().any(|f| f == "start_thread"))
        .map(|s| s.1)
        .sum();
    assert!(
        threads * 100 >= all * 95,
        "{threads} of {all}:\n{}",
        out.stdout
    );
}

#[test]
fn one_link_per_cpu_and_none_left_after_the_run() {
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let online: usize = cpus
        .trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum();
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let mut t = spawn(&tool("funccount"), &["profile:hz:99", "software:cs"]);
        t.wait_ready();
        let links = bpf_link_ids_of(t.pid());
        assert_eq!(links.len(), 2 * online, "{links:?}");
        t.signal(sig);
        let out = t.finish(std::time::Duration::from_secs(30));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        assert_links_gone(links);
    }
}

#[test]
fn a_rate_above_the_kernel_s_limit_is_said() {
    // perf_event_max_sample_rate is at most 100,000 (the kernel lowers it
    // when sampling takes too long): 1,000,000 per second is refused.
    let max = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate").unwrap();
    let out = run(
        &tool("funccount"),
        &["-d", "1", "profile:hz:1000000"],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code(), 1);
    assert_eq!(
        out.stderr,
        format!(
            "funccount: error: profile:hz:1000000: the kernel refused the rate: it samples at \
             most {} times a second (kernel.perf_event_max_sample_rate, which the kernel lowers \
             when sampling takes too long); lower the rate or raise that sysctl\n",
            max.trim()
        )
    );
}

#[test]
fn cgroup_filters_samples_as_it_filters_probes() {
    // Two programs touching fresh pages, one in a cgroup below the one
    // filtered (5,000 faults) and one beside it (3,000): funccount --cgroup
    // counts the first one's page faults only (each event of every CPU is
    // sampled, and filtered in BPF like any probe's hit).
    let dir = Scratch::new();
    let bin = build_sampled(&dir);
    let top = Cgroup::new("cg-sampled");
    let below = Cgroup::new("cg-sampled/below");
    let sibling = Cgroup::new("cg-sampled-sibling");
    let mut inside = CProg::start_with(&bin, &["faults", "5000"]);
    let mut beside = CProg::start_with(&bin, &["faults", "3000"]);
    below.adopt(inside.pid);
    sibling.adopt(beside.pid);
    let mut t = spawn(
        &tool("funccount"),
        &["--cgroup", &top.rel, "software:page-faults:1"],
    );
    t.wait_ready();
    beside.go();
    inside.go();
    assert!(beside.wait().success());
    assert!(inside.wait().success());
    t.signal(libc::SIGINT);
    let out = t.finish(std::time::Duration::from_secs(60));
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    let t = last_table(&out.stdout);
    let faults = count_of(&t, "software:page-faults:1");
    assert!((5000..=5050).contains(&faults), "{t:?}");
}
