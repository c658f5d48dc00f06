//! Whole user stacks of code built without frame pointers (issue 39): walked in
//! the kernel by the binaries' unwind tables, through a chain of functions that
//! clobber rbp, libc's qsort, a signal handler, a thread, a dlopen()ed library,
//! a stripped program and Debian's python3; frames a walk could not reach are
//! said ([truncated]) and counted, never a wrong caller; PLT stubs are named.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::*;

const T: Duration = Duration::from_secs(60);

/// tests/progs/nofp.c built as distributions build: `-O2 -fomit-frame-pointer`,
/// no -g; with `lib`, as the shared library its dlopen mode loads.
fn build_nofp(dir: &Scratch, lib: bool) -> PathBuf {
    match lib {
        true => gcc(
            dir,
            "nofp",
            "libnofp.so",
            &[
                "-O2",
                "-fomit-frame-pointer",
                "-shared",
                "-fPIC",
                "-DTK_LIB",
            ],
        ),
        false => gcc(
            dir,
            "nofp",
            "nofp",
            &["-O2", "-fomit-frame-pointer", "-lpthread", "-ldl"],
        ),
    }
}

/// The chain's frames, leaf first, as nofp's `chain` mode makes them.
const CHAIN: [&str; 7] = [
    "tk_leaf", "tk_c6", "tk_c5", "tk_c4", "tk_c3", "tk_c2", "tk_c1",
];

/// `tool -U ARGS` on nofp `MODE N` (with -p, whose tables are loaded before
/// tracing): its stacks, leaf first, with their counts; and stderr.
fn stacks_of(bin: &Path, prog: &[&str], args: &[&str]) -> (Vec<(Vec<String>, u64)>, String) {
    let mut all = vec!["-U"];
    all.extend_from_slice(args);
    let out = trace_cprog(&tool("stackcount"), bin, prog, &all, |l| {
        l.starts_with("Tracing")
    });
    assert_eq!(out.code(), 0, "{}", out.stderr);
    (parse_stacks(&out.stdout), out.stderr)
}

/// Asserts that `frames` end in glibc's start code below `main` (or, for a
/// thread, in its start), the outermost frame: nothing was cut.
fn assert_reaches_start(frames: &[String]) {
    let last = frames.last().map(String::as_str);
    assert!(
        last == Some("_start") || last == Some("clone3") || last == Some("clone"),
        "not whole: {frames:?}"
    );
    assert!(!frames.iter().any(|f| f == "[truncated]"), "{frames:?}");
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_chain_without_frame_pointers_is_whole_at_a_uprobe_and_a_tracepoint() {
    let dir = Scratch::new();
    let bin = build_nofp(&dir, false);
    let leaf = format!("{}:tk_leaf", bin.display());
    for (probe, top) in [
        (leaf.as_str(), &[][..]),
        // tk_leaf's getppid() goes through libc's syscall().
        ("t:syscalls:sys_enter_getppid", &["syscall"][..]),
    ] {
        let (stacks, stderr) = stacks_of(&bin, &["chain", "100"], &[probe]);
        assert_eq!(stacks.len(), 1, "{probe}: {stacks:?}\n{stderr}");
        let (frames, count) = &stacks[0];
        assert_eq!(*count, 100, "{probe}");
        let mut want = strings(top);
        want.extend(strings(&CHAIN));
        want.push("main".into());
        assert_eq!(frames[..want.len()], want[..], "{probe}: {frames:?}");
        assert_reaches_start(frames);
    }
    // The kernel's frame-pointer walk, asked for, stops in the chain.
    let (stacks, _) = stacks_of(&bin, &["chain", "100"], &["--user-stacks", "fp", &leaf]);
    let all: u64 = stacks.iter().map(|s| s.1).sum();
    assert_eq!(all, 100);
    assert!(
        stacks.iter().all(|(f, _)| !f.iter().any(|f| f == "main")),
        "frame pointers reached main through rbp garbage: {stacks:?}"
    );
}

#[test]
fn a_stripped_program_is_walked_by_its_eh_frame() {
    // objcopy --strip-all keeps .eh_frame: every frame is there, unnamed.
    let dir = Scratch::new();
    let bin = stripped_copy(&dir, &build_nofp(&dir, false), "nofp-stripped");
    let (stacks, stderr) = stacks_of(&bin, &["chain", "50"], &["t:syscalls:sys_enter_getppid"]);
    assert_eq!(stacks.len(), 1, "{stacks:?}\n{stderr}");
    let (frames, count) = &stacks[0];
    assert_eq!(*count, 50);
    assert_eq!(frames[0], "syscall");
    // tk_leaf, tk_c6..tk_c1 and main: eight frames of the program, then
    // libc's start and the program's own _start, unnamed too.
    assert_eq!(
        frames[1..9],
        vec!["[unknown]".to_string(); 8][..],
        "{frames:?}"
    );
    assert_eq!(
        frames[9..],
        strings(&["__libc_start_call_main", "__libc_start_main", "[unknown]"])[..],
        "{frames:?}"
    );
}

#[test]
fn qsort_s_comparator_through_libc() {
    let dir = Scratch::new();
    let bin = build_nofp(&dir, false);
    // The same sort untraced says how many comparisons it makes.
    let mut child = Command::new(&bin)
        .args(["qsort", "500"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let compared: u64 = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("compared ")?.parse().ok())
        .expect("compared K");
    let leaf = format!("{}:tk_leaf", bin.display());
    let (stacks, stderr) = stacks_of(&bin, &["qsort", "500"], &[&leaf]);
    let all: u64 = stacks.iter().map(|s| s.1).sum();
    assert_eq!(all, compared, "{stderr}");
    for (frames, _) in &stacks {
        assert_eq!(
            frames[..2],
            strings(&["tk_leaf", "tk_cmp"])[..],
            "{frames:?}"
        );
        // glibc's merge sort, recursing, then qsort itself, then main. Its
        // name is its symbol's in libc's debug file, as perf and BCC show it
        // (DWARF, read only for --inline, names the clone by its source).
        let q = frames
            .iter()
            .position(|f| f.starts_with("qsort"))
            .expect("qsort");
        assert!(
            frames[2..q].iter().all(|f| f == "msort_with_tmp.part.0"),
            "{frames:?}"
        );
        assert_eq!(frames[q + 1], "main", "{frames:?}");
        assert_reaches_start(frames);
    }
}

#[test]
fn a_signal_handler_continues_into_the_interrupted_code() {
    let dir = Scratch::new();
    let bin = build_nofp(&dir, false);
    let leaf = format!("{}:tk_leaf", bin.display());
    let (stacks, stderr) = stacks_of(&bin, &["signal", "40"], &[&leaf]);
    assert_eq!(stacks.len(), 1, "{stacks:?}\n{stderr}");
    let (frames, count) = &stacks[0];
    assert_eq!(*count, 40);
    // The handler, the kernel's return trampoline, then where the signal came:
    // the kill() wrapper, called by tk_s3.
    let want = strings(&[
        "tk_leaf",
        "tk_handler",
        "__restore_rt",
        "kill",
        "tk_s3",
        "tk_s2",
        "main",
    ]);
    assert_eq!(frames[..want.len()], want[..], "{frames:?}");
    assert_reaches_start(frames);
}

#[test]
fn a_thread_s_stack_ends_at_its_start() {
    let dir = Scratch::new();
    let bin = build_nofp(&dir, false);
    let leaf = format!("{}:tk_leaf", bin.display());
    let (stacks, stderr) = stacks_of(&bin, &["thread", "30"], &[&leaf]);
    assert_eq!(stacks.len(), 1, "{stacks:?}\n{stderr}");
    let (frames, count) = &stacks[0];
    assert_eq!(*count, 30);
    let mut want = strings(&CHAIN);
    want.extend(strings(&["tk_thread", "start_thread"]));
    assert_eq!(frames[..want.len()], want[..], "{frames:?}");
    assert_reaches_start(frames);
}

#[test]
fn a_dlopened_library_is_walked_once_its_mapping_is_read() {
    // The first call comes as the library is mapped, before the tool can have
    // read the mapping: said as cut short. The next, 300 ms later, are whole.
    let dir = Scratch::new();
    let bin = build_nofp(&dir, false);
    let lib = build_nofp(&dir, true);
    let (stacks, stderr) = stacks_of(
        &bin,
        &["dlopen", "25", lib.to_str().unwrap()],
        &["t:syscalls:sys_enter_getppid"],
    );
    let whole: Vec<&(Vec<String>, u64)> = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "main"))
        .collect();
    assert_eq!(whole.len(), 1, "{stacks:?}\n{stderr}");
    let (frames, count) = whole[0];
    assert_eq!(*count, 25, "{stacks:?}");
    let mut want = strings(&["syscall"]);
    want.extend(strings(&CHAIN));
    want.extend(strings(&["tk_lib_entry", "main"]));
    assert_eq!(frames[..want.len()], want[..], "{frames:?}");
    assert_reaches_start(frames);
    let cut: Vec<&(Vec<String>, u64)> = stacks.iter().filter(|s| !whole.contains(s)).collect();
    assert_eq!(cut.iter().map(|s| s.1).sum::<u64>(), 1, "{stacks:?}");
    assert_eq!(cut[0].0.last().map(String::as_str), Some("[truncated]"));
}

#[test]
fn a_process_met_before_its_tables_says_how_many_stacks_were_cut() {
    // System-wide, a process started after the tool: its first stacks come
    // before its tables can be read. Each ends in [truncated], and the run
    // says how many there were.
    let dir = Scratch::new();
    let bin = build_nofp(&dir, false);
    let mut t = spawn(
        &tool("stackcount"),
        &["-U", "-P", "t:syscalls:sys_enter_getppid"],
    );
    t.wait_ready();
    let mut p = CProg::start_with(&bin, &["slow", "1000"]);
    let pid = p.pid;
    p.go();
    let status = p.wait();
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(300));
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // -P: each stack's frames, then "comm [pid]", then its count.
    let ours: Vec<(Vec<String>, u64)> = out
        .stdout
        .split("\n\n")
        .filter(|b| b.contains(&format!("    nofp [{pid}]\n")))
        .flat_map(|b| parse_stacks(&format!("{b}\n")))
        .collect();
    let whole: u64 = ours
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "main") && f.last().is_some_and(|l| l == "_start"))
        .map(|s| s.1)
        .sum();
    let said: u64 = out
        .stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("stackcount: ")?
                .split_once(" user stacks end in [truncated]: their process was seen before")?
                .0
                .parse()
                .ok()
        })
        .unwrap_or(0);
    // Every call is counted: whole, or cut and said (other processes' early
    // stacks may be among those said, never fewer than ours). The first
    // comes before the tables can be read; 1 ms apart, most after.
    let cut: u64 = ours
        .iter()
        .filter(|(f, _)| f.last().is_some_and(|l| l == "[truncated]"))
        .map(|s| s.1)
        .sum();
    assert_eq!(
        whole + cut,
        1000,
        "{whole} whole, {cut} cut\n{}",
        out.stdout
    );
    // Its tables were read within half a second (a debug build, busy CI).
    assert!(cut >= 1 && whole >= 500, "{whole} whole, {cut} cut");
    assert!(said >= cut, "{said} said, {cut} cut:\n{}", out.stderr);
}

#[test]
fn python3_reaches_py_bytes_main_and_main() {
    // Debian's python3, built without frame pointers and stripped: the kernel's
    // walk gives two frames; the tables give the interpreter down to _start
    // (its static functions unnamed; main tail-calls Py_BytesMain).
    let script = "import os,sys\nsys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()\nfor i in range(300): os.getppid()\n";
    let (stacks, stderr) = stacks_of(
        Path::new("/usr/bin/python3"),
        &["-c", script],
        &["t:syscalls:sys_enter_getppid"],
    );
    let all: u64 = stacks.iter().map(|s| s.1).sum();
    assert_eq!(all, 300, "{stacks:?}\n{stderr}");
    for (frames, _) in &stacks {
        for f in [
            "getppid",
            "_PyEval_EvalFrameDefault",
            "PyEval_EvalCode",
            "Py_RunMain",
            "Py_BytesMain",
            "__libc_start_call_main",
        ] {
            assert!(frames.iter().any(|x| x == f), "no {f}: {frames:?}");
        }
        assert_reaches_start(frames);
    }
}

#[test]
fn trace_prints_the_whole_chain() {
    let dir = Scratch::new();
    let bin = build_nofp(&dir, false);
    let leaf = format!("{}:tk_leaf", bin.display());
    let out = trace_cprog(&tool("trace"), &bin, &["chain", "3"], &["-U", &leaf], |l| {
        l.starts_with("PID")
    });
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let frames: Vec<String> = out
        .stdout
        .lines()
        .skip(2)
        .take_while(|l| !l.is_empty())
        .map(|l| l.trim().split('+').next().unwrap().to_string())
        .collect();
    let mut want = strings(&CHAIN);
    want.push("main".into());
    assert_eq!(frames[..want.len()], want[..], "{}", out.stdout);
    assert_eq!(
        frames.last().map(String::as_str),
        Some("_start"),
        "{}",
        out.stdout
    );
    assert_eq!(
        out.stdout.matches("    tk_c1+").count(),
        3,
        "{}",
        out.stdout
    );
}

#[test]
fn where_the_kernel_cannot_one_line_says_which_walk_is_used() {
    // TRACEKIT_NO_UNWIND=1 answers as a kernel without bpf_loop would.
    let dir = Scratch::new();
    let bin = build_nofp(&dir, false);
    let p = CProg::start_with(&bin, &["chain", "100"]);
    let pid = p.pid.to_string();
    let mut cmd = Command::new(tool("stackcount"));
    cmd.env("TRACEKIT_NO_UNWIND", "1")
        .args(["-U", "-p", &pid, "t:syscalls:sys_enter_getppid"]);
    let mut t = spawn_cmd(cmd);
    t.wait_ready();
    let out = t.finish_after(p, T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(
        out.stderr,
        "stackcount: user stacks are walked by frame pointers: TRACEKIT_NO_UNWIND is set\n"
    );
    let stacks = parse_stacks(&out.stdout);
    assert_eq!(
        stacks.iter().map(|s| s.1).sum::<u64>(),
        100,
        "{}",
        out.stdout
    );
    // Asked for by name, the walk the kernel cannot do is an error.
    let me = std::process::id().to_string();
    let mut cmd = Command::new(tool("stackcount"));
    cmd.env("TRACEKIT_NO_UNWIND", "1").args([
        "-U",
        "--user-stacks",
        "dwarf",
        "-p",
        &me,
        "t:syscalls:sys_enter_getppid",
    ]);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "stackcount: error: --user-stacks dwarf cannot be used: TRACEKIT_NO_UNWIND is set; \
         use --user-stacks fp (frame pointers)\n"
    );
}

#[test]
fn trace_loads_the_tables_of_a_new_process_that_floods() {
    // Our sweep: `trace -U` (no -p) met a new process that made getppid()
    // as fast as it could; the tables' request ring came after the events'
    // in each read, and a flood kept the reads full of events: every stack
    // of that process ended in [truncated], and most were not counted (its
    // walks after the first load, met stale, were not "early"). Now the
    // request is read first, whole stacks come during the flood, and every
    // cut one is counted.
    let mut t = spawn(
        &tool("trace"),
        &["-v", "-U", "t:syscalls:sys_enter_getppid"],
    );
    t.wait_line(|l| l.starts_with("PID"), Duration::from_secs(60));
    let flood = Command::new("/usr/bin/python3")
        .args(["-c", "import os\nwhile 1: os.getppid()\n"])
        .spawn()
        .unwrap();
    let pid = flood.id();
    let mut flood = Reaped(flood);
    // Whole stacks come while it floods (its first records, and those met
    // while a debug build first reads python3's symbols, can be cut).
    t.wait_line(|l| l.contains("Py_BytesMain"), Duration::from_secs(60));
    let _ = flood.0.kill();
    let _ = flood.0.wait();
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // Its records: a line "PID TID COMM ..." and the stack under it.
    let mine = format!("{pid} ");
    let (mut whole, mut cut) = (0u64, 0u64);
    for rec in out.stdout.split("\n\n") {
        if !rec.trim_start().starts_with(&mine) {
            continue;
        }
        if rec.contains("Py_BytesMain") && rec.contains("_start") {
            whole += 1;
        } else {
            // Cut, and said so on a line of its own (no offset: it is no code).
            assert!(rec.lines().any(|l| l.trim() == "[truncated]"), "{rec}");
            cut += 1;
        }
    }
    // "N user stacks end in [truncated]: ..." and -v's "... M of them cut short".
    let number_before = |what: &str| -> u64 {
        out.stderr
            .lines()
            .find(|l| l.contains(what))
            .and_then(|l| {
                l.split(what)
                    .next()?
                    .split_whitespace()
                    .last()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    };
    let early =
        number_before(" user stacks end in [truncated]") + number_before(" of them cut short");
    assert!(whole >= 1, "{whole} whole, {cut} cut:\n{}", out.stderr);
    assert!(
        cut <= early,
        "{cut} cut printed, {early} said:\n{}",
        out.stderr
    );
}

#[test]
fn samples_in_a_plt_stub_are_named_as_perf_names_them() {
    // No symbol covers a PLT stub: blazesym named a sample there by the
    // symbol before the section (`_init`) and BCC leaves it unknown; perf and
    // objdump say `tk_one@plt`. tests/progs/plt.c calls a two-instruction
    // library function in a loop, so about a tenth of its samples fall in the
    // stub (over 100 of ~1,000 here; 5 is the bound).
    let dir = Scratch::new();
    gcc(
        &dir,
        "plt",
        "libtkplt.so",
        &["-O2", "-shared", "-fPIC", "-DTK_LIB"],
    );
    let d = dir.0.to_str().unwrap();
    let rpath = format!("-Wl,-rpath,{d}");
    let bin = gcc(&dir, "plt", "plt", &["-O2", "-L", d, "-ltkplt", &rpath]);
    let (stacks, stderr) = stacks_of(&bin, &["plt", "1000"], &["profile:hz:999"]);
    let in_stub: u64 = stacks
        .iter()
        .filter(|(f, _)| f.first().is_some_and(|f| f == "tk_one@plt"))
        .map(|(f, n)| {
            assert_eq!(f[1..3], strings(&["tk_calls", "main"]), "{f:?}");
            assert_reaches_start(f);
            n
        })
        .sum();
    assert!(
        in_stub >= 5,
        "{in_stub} samples in tk_one@plt:\n{stacks:?}\n{stderr}"
    );
    for (f, _) in &stacks {
        assert!(!f.iter().any(|f| f == "_init"), "{f:?}");
    }
}

#[test]
fn auto_walks_by_frame_pointers_only_where_every_file_keeps_them_and_no_sample_comes() {
    // tests/progs/fponly.c keeps frame pointers in all its code, as a Go
    // program does; gcc sets up none in its leaf tk_inner. At a uprobe there,
    // auto walks by frame pointers (they cost less; the entry's caller comes
    // from the stack): the vDSO it maps, code of no file, had made every
    // process look frameless. A sample may come inside that leaf, whose
    // caller a frame-pointer walk skips: runs that sample walk by tables.
    let dir = Scratch::new();
    let bin = gcc(
        &dir,
        "fponly",
        "fponly",
        &["-O2", "-fno-omit-frame-pointer", "-static", "-nostdlib"],
    );
    let whole = strings(&["tk_inner", "tk_outer", "tk_main", "_start"]);
    let by_tables = "walked by unwind tables";
    // -v puts each frame's address before its name.
    let stacks_of = |args: &[&str]| {
        let (stacks, stderr) = stacks_of(&bin, &[], args);
        let named = |f: &Vec<String>| -> Vec<String> {
            f.iter()
                .map(|f| f.split_whitespace().last().unwrap_or("").to_string())
                .collect()
        };
        let stacks: Vec<(Vec<String>, u64)> = stacks.iter().map(|(f, n)| (named(f), *n)).collect();
        (stacks, stderr)
    };

    let probe = format!("{}:tk_inner", bin.display());
    let (stacks, stderr) = stacks_of(&["-v", &probe]);
    assert_eq!(stacks, vec![(whole.clone(), 100)], "{stderr}");
    assert!(!stderr.contains(by_tables), "{stderr}");

    let (stacks, stderr) = stacks_of(&["-v", "profile:hz:999"]);
    assert!(stderr.contains(by_tables), "{stderr}");
    let mut in_leaf = 0;
    for (frames, n) in &stacks {
        if frames.first().is_some_and(|f| f == "tk_inner") {
            assert_eq!(frames, &whole, "{stacks:?}");
            in_leaf += n;
        }
    }
    assert!(in_leaf >= 100, "{in_leaf} samples in tk_inner: {stacks:?}");
}
