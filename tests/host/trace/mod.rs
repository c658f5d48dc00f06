//! trace on the host kernel: user functions (entries and returns), tracepoints and
//! USDT probes of the `traced` test program, whose calls have known arguments, so
//! every line is checked; -M, -A, -U, --json, and the grammar's errors. Kernel
//! functions (BTF names, members, globs, -K) are tested in the guest (tests/guest.rs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::*;

const T: Duration = Duration::from_secs(60);

fn trace() -> PathBuf {
    tool("trace")
}

fn traced() -> PathBuf {
    prog("traced")
}

/// `traced`'s path in a spec (`PATH:FUNC`).
fn bin() -> String {
    traced().display().to_string()
}

/// Runs `trace -p PID args` on `traced MODE N`: waits until trace has attached (its
/// header, or the status line with --json), lets the program run, and returns
/// trace's output once both have exited with success (trace ends by itself when
/// the traced process exits, or at -M).
fn run_on(mode: &str, n: u64, args: &[&str]) -> Output {
    run_on_prog(&traced(), mode, n, args)
}

/// [`run_on`] for another test program with the same protocol (`ready`, then
/// SIGUSR1): tests/progs/userfuncs.c, say.
fn run_on_prog(prog: &Path, mode: &str, n: u64, args: &[&str]) -> Output {
    run_on_env(prog, mode, n, &[], args)
}

/// [`run_on_prog`] with settings in trace's environment.
fn run_on_env(prog: &Path, mode: &str, n: u64, env: &[(&str, &str)], args: &[&str]) -> Output {
    let trace = trace();
    run_on_via(&[trace.to_str().unwrap()], prog, mode, n, env, args)
}

/// [`run_on_env`] with trace started by a command prefix (`via[0]` runs
/// `via[1..]`, the last of which is trace), e.g. [`without_kernel_btf`].
fn run_on_via(
    via: &[&str],
    prog: &Path,
    mode: &str,
    n: u64,
    env: &[(&str, &str)],
    args: &[&str],
) -> Output {
    let w = Workload::start(prog, &[mode, &n.to_string()]);
    let pid = w.pid.to_string();
    let mut all = via[1..].to_vec();
    all.extend(["-p", pid.as_str()]);
    all.extend_from_slice(args);
    let mut cmd = Command::new(via[0]);
    cmd.envs(env.iter().copied()).args(&all);
    let mut t = spawn_cmd(cmd);
    t.wait_line(
        |l| l.starts_with("PID ") || l.starts_with("TIME ") || l.starts_with("Tracing "),
        T,
    );
    w.go();
    let out = t.finish(T);
    assert!(w.wait().success(), "the traced program failed");
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    out
}

/// The event lines of BCC's layout (after the header), as (pid, tid, comm, func,
/// message); stack lines (indented) are left out.
fn events(stdout: &str) -> Vec<(u32, u32, String, String, String)> {
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert!(header.starts_with("PID     TID     COMM"), "{stdout}");
    lines
        .filter(|l| !l.is_empty() && !l.starts_with(' '))
        .map(|l| {
            let f: Vec<&str> = l.splitn(5, char::is_whitespace).collect();
            let mut it = l.split_whitespace();
            let pid = it.next().unwrap().parse().expect("pid");
            let tid = it.next().unwrap().parse().expect("tid");
            let comm = it.next().unwrap().to_string();
            let func = it.next().unwrap().to_string();
            assert!(f.len() >= 4, "{l}");
            // The message starts at column 49 (7+1+7+1+15+1+16+1).
            let msg = l.get(49..).unwrap_or("").to_string();
            (pid, tid, comm, func, msg)
        })
        .collect()
}

fn messages(stdout: &str) -> Vec<String> {
    events(stdout).into_iter().map(|e| e.4).collect()
}

/// -v's count of the records that reached user space.
fn records_received(stderr: &str) -> u64 {
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

#[test]
fn every_call_with_its_arguments() {
    let spec = format!("{}:tt_args \"a=%d b=%ld name=%s\", arg1, arg2, arg3", bin());
    let out = run_on("calls", 50, &[&spec]);
    let ev = events(&out.stdout);
    assert_eq!(ev.len(), 50, "{}", out.stdout);
    for (i, (pid, tid, comm, func, msg)) in ev.iter().enumerate() {
        assert_eq!(pid, tid);
        assert_eq!(comm, "traced");
        assert_eq!(func, "tt_args");
        assert_eq!(msg, &format!("a={i} b={} name=name-{i}", 10 * i));
    }
    assert!(
        out.stdout.starts_with(&format!(
            "{:<7} {:<7} {:<15} {:<16} -\n",
            "PID", "TID", "COMM", "FUNC"
        )),
        "{}",
        out.stdout
    );
}

#[test]
fn predicate_in_the_kernel_passes_exactly_k() {
    // 10 of 50 calls pass; the 40 others never reach user space.
    let spec = format!(
        "{}:tt_args (arg1 % 5 == 0 && arg2 >= 0) \"%d\", arg1",
        bin()
    );
    let out = run_on("calls", 50, &["-v", &spec]);
    let want: Vec<String> = (0..50).step_by(5).map(|i| i.to_string()).collect();
    assert_eq!(messages(&out.stdout), want);
    assert_kept_in_kernel(&out.stderr, 10, 50, 40);
}

/// Asserts what -v says reached user space: `records` records, of `hits` hits
/// with `dropped` dropped by the predicate in the kernel (and every return
/// paired with its entry).
fn assert_kept_in_kernel(stderr: &str, records: u64, hits: u64, dropped: u64) {
    assert_eq!(records_received(stderr), records, "{stderr}");
    assert!(
        stderr.contains(&format!(
            ": {hits} hits, {dropped} dropped by the predicate in the kernel\n"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("trace: 0 returns not printed: calls that never returned"));
}

/// -v's note that a program's predicate is its probe's gate (bpf/trace.bpf.c
/// F_GATE): decided on one register before anything else is read.
const GATE: &str = "    gate: decided on its register before anything else is read";

#[test]
fn gate_on_one_argument_passes_exactly_k() {
    // One probe, one spec whose predicate is one register (the second
    // argument, a signed long) with one step and a signed comparison: the
    // gate set before load. b = 10 i: 10 of 50 calls pass.
    let spec = format!(
        "{}:tt_args(u64 a, long b, char *name) (b - 100 < 0) \"%d %s\", a, name",
        bin()
    );
    let out = run_on("calls", 50, &["-v", &spec]);
    assert!(out.stderr.lines().any(|l| l == GATE), "{}", out.stderr);
    let want: Vec<String> = (0..10).map(|i| format!("{i} name-{i}")).collect();
    assert_eq!(messages(&out.stdout), want);
    assert_kept_in_kernel(&out.stderr, 10, 50, 40);
}

#[test]
fn gate_narrows_its_register_as_the_cast_says() {
    // (s8)arg2 < 0: b = 10 i as a signed byte is negative for i in 13..=25
    // (130..250) and 39..=49 (390..490, less 256): 24 of 50 pass.
    let spec = format!("{}:tt_args ((s8)arg2 < 0) \"%d\", arg1", bin());
    let out = run_on("calls", 50, &["-v", &spec]);
    assert!(out.stderr.lines().any(|l| l == GATE), "{}", out.stderr);
    let want: Vec<String> = (13..=25).chain(39..=49).map(|i| i.to_string()).collect();
    assert_eq!(messages(&out.stdout), want);
    assert_kept_in_kernel(&out.stderr, 24, 50, 26);
}

#[test]
fn gate_on_retval_at_a_return_passes_exactly_k() {
    // 12 returns (4 calls of depth 3), 4 with retval 207: 8 never reach user space.
    let spec = format!("r:{}:tt_recurse (retval == 207) \"%d\", arg1", bin());
    let out = run_on("recurse", 4, &["-v", &spec]);
    assert!(out.stderr.lines().any(|l| l == GATE), "{}", out.stderr);
    assert_eq!(messages(&out.stdout), ["2", "2", "2", "2"]);
    assert_kept_in_kernel(&out.stderr, 4, 12, 8);
}

#[test]
fn gates_of_several_probes_entry_and_return() {
    // Two probes: each gate is in the probe table, not set before load. The
    // return's gate reads the entry's argument saved for it.
    let r = format!("r:{}:tt_args (arg1 % 5 == 0) \"ret %d\", arg2", bin());
    let c = format!("{}:tt_caller (arg1 < 2) \"caller %d\", arg1", bin());
    let out = run_on("calls", 20, &["-v", &r, &c]);
    assert_eq!(
        out.stderr.lines().filter(|l| *l == GATE).count(),
        2,
        "{}",
        out.stderr
    );
    assert_eq!(
        messages(&out.stdout),
        ["caller 0", "ret 0", "caller 1", "ret 50", "ret 100", "ret 150"]
    );
    assert_eq!(records_received(&out.stderr), 6, "{}", out.stderr);
    for counts in [": 20 hits, 16 dropped", ": 20 hits, 18 dropped"] {
        assert!(out.stderr.contains(counts), "{counts}: {}", out.stderr);
    }
}

#[test]
fn strcmp_and_signature_names() {
    let spec = format!(
        "{}:tt_args(u64 a, long b, char *name) (STRCMP(\"name-7\", name) || b == 120) \"%s %d\", name, a",
        bin()
    );
    let out = run_on("calls", 20, &[&spec]);
    assert_eq!(messages(&out.stdout), ["name-7 7", "name-12 12"]);
    // C's escapes name bytes: "\x2d" and "\055" are '-' (an octal escape was
    // read as \0 and digits, "a NUL byte"); "\x31\63" is "13".
    let spec = format!(
        r#"{}:tt_args(u64 a, long b, char *name) (STRCMP("name\x2d7", name) || STRCMP("name\055\x31\63", name)) "%s", name"#,
        bin()
    );
    let out = run_on("calls", 20, &[&spec]);
    assert_eq!(messages(&out.stdout), ["name-7", "name-13"]);
}

#[test]
fn bin_cmp_compares_bytes_past_the_nul() {
    // tt_bytes(buf, i): buf is 'A', 0, i, 0xff. As strings the 8 buffers are
    // all "A"; with -B the literal's 4 bytes (in every C spelling) pick one.
    let spec = |lit: &str| format!("{}:tt_bytes (STRCMP(\"{lit}\", arg1)) \"%d\", arg2", bin());
    let out = run_on("bytes", 8, &[&spec("A")]);
    assert_eq!(
        messages(&out.stdout),
        ["0", "1", "2", "3", "4", "5", "6", "7"]
    );
    let out = run_on(
        "bytes",
        8,
        &[
            "-B",
            &spec("{0x41, 0x00, 0x05, 0xff}"),
            &spec("{'A', 0, 06, -1,}"),
        ],
    );
    assert_eq!(messages(&out.stdout), ["5", "6"]);
    // One byte: every buffer starts with it.
    let out = run_on("bytes", 3, &["--bin_cmp", &spec("{65}")]);
    assert_eq!(messages(&out.stdout), ["0", "1", "2"]);
    // A char array in a tracepoint's record: the program's name, "traced", NUL.
    let tp = |lit: &str| {
        format!("t:sched:sched_switch (STRCMP(\"{lit}\", args->prev_comm)) \"%s\", args->prev_comm")
    };
    let name = "{0x74, 0x72, 0x61, 0x63, 0x65, 0x64, 0}";
    let out = run_on("bytes", 1, &["-B", "-M", "1", &tp(name)]);
    assert_eq!(messages(&out.stdout), ["traced"]);
    let out = run_on(
        "bytes",
        1,
        &["-B", &tp("{0x74, 0x72, 0x61, 0x63, 0x65, 0}")],
    );
    assert_eq!(messages(&out.stdout), Vec::<String>::new());
}

#[test]
fn return_value_with_entry_argument_under_recursion() {
    // tt_recurse(d) returns 100 d + 7; each return must be paired with its own
    // call's argument (d = 1, 2, 3 from the innermost out), not the last entry's.
    let spec = format!("r:{}:tt_recurse \"%d -> %d\", arg1, retval", bin());
    let out = run_on("recurse", 5, &[&spec]);
    let one = ["1 -> 107", "2 -> 207", "3 -> 307"];
    let want: Vec<&str> = (0..5).flat_map(|_| one).collect();
    assert_eq!(messages(&out.stdout), want);
}

#[test]
fn the_kernel_btf_is_read_only_for_session_programs_and_not_needed() {
    // Only session programs call kfuncs, which libbpf resolves in the kernel's
    // BTF (5 MB; a quarter of a second under emulation) whether they load or
    // not: a run without them opens the object's lean build and reads none. The
    // line is libbpf's own (TRACEKIT_DEBUG=1 shows libbpf's messages).
    const READ: &str = "loaded kernel BTF from";
    let entry = format!("{}:tt_recurse \"%d\", arg1", bin());
    let ret = format!("r:{}:tt_recurse \"%d -> %d\", arg1, retval", bin());
    let entries = ["3", "2", "1"];
    let returns = ["1 -> 107", "2 -> 207", "3 -> 307"];
    let trace = trace();
    let plain = vec![trace.to_str().unwrap().to_string()];
    // On a kernel without BTF (hidden here), a return probe takes uprobe_multi:
    // before, every trace run failed to load ("No such process").
    let no_btf = without_kernel_btf(&trace);
    for (via, args, want, reads) in [
        (&plain, vec![entry.as_str()], entries, false),
        (
            &plain,
            vec!["--attach-mode", "multi", ret.as_str()],
            returns,
            false,
        ),
        // auto: uprobe.session on this kernel (tests/funclatency.rs checks it).
        (&plain, vec![ret.as_str()], returns, true),
        (&no_btf, vec![ret.as_str()], returns, false),
    ] {
        let via: Vec<&str> = via.iter().map(String::as_str).collect();
        let env = [("TRACEKIT_DEBUG", "1")];
        let out = run_on_via(&via, &traced(), "recurse", 2, &env, &args);
        let want: Vec<&str> = (0..2).flat_map(|_| want).collect();
        assert_eq!(messages(&out.stdout), want, "{args:?}");
        assert_eq!(out.stderr.contains(READ), reads, "{args:?}: {}", out.stderr);
    }
}

#[test]
fn returns_with_entry_arguments_of_threads_in_calls_at_once() {
    // One thread stays inside tt_hold while the other makes 30 calls: each
    // thread keeps its own entries (a per-thread stack in a map, which session
    // programs use too, to save arguments), in every attach mode.
    let hold = format!("r:{}:tt_hold \"hold %d -> %d\", arg1, retval", bin());
    let args = format!("r:{}:tt_args \"%d %d\", arg1, arg2", bin());
    let mut want: Vec<String> = (0..30).map(|i| format!("{i} {}", 10 * i)).collect();
    want.push("hold 5 -> 12".into());
    for mode in ["auto", "multi", "single"] {
        let out = run_on("threads", 30, &["--attach-mode", mode, &hold, &args]);
        assert_eq!(messages(&out.stdout), want, "{mode}: {}", out.stderr);
    }
}

#[test]
fn returns_deeper_than_the_pairing_stack_are_counted_not_mispaired() {
    // tt_recurse(20): 20 nested calls. The entries of the outer 16 are kept, so
    // their returns print with their own argument; the inner 4 are counted. The
    // thread's stack is then as before: tt_recurse(3) prints all 3. Sessions
    // (the default here) skip the returns of the calls not kept; separate
    // return probes see them and must not pair them.
    let spec = format!("r:{}:tt_recurse \"%d -> %d\", arg1, retval", bin());
    let mut want: Vec<String> = (5..=20)
        .map(|d| format!("{d} -> {}", 100 * d + 7))
        .collect();
    want.extend(["1 -> 107", "2 -> 207", "3 -> 307"].map(String::from));
    for mode in ["auto", "single"] {
        let out = run_on("deep", 20, &["--attach-mode", mode, &spec]);
        assert_eq!(messages(&out.stdout), want, "{mode}");
        assert!(
            out.stderr.contains(
                "trace: 4 returns not printed: calls nested deeper than 16 on their thread"
            ),
            "{mode}: {}",
            out.stderr
        );
    }
}

#[test]
fn returns_that_read_no_argument_print_at_any_depth() {
    // A return spec that reads no entry argument keeps no entry: its hook's
    // cookie names the function. So no depth limits it: all 20 nested returns
    // of tt_recurse(20) print, then tt_recurse(3)'s 3, in every attach mode,
    // and nothing is reported lost.
    let spec = format!("r:{}:tt_recurse \"%d\", retval", bin());
    let mut want: Vec<String> = (1..=20).map(|d| (100 * d + 7).to_string()).collect();
    want.extend(["107", "207", "307"].map(String::from));
    for mode in ["auto", "multi", "single"] {
        let out = run_on("deep", 20, &["--attach-mode", mode, &spec]);
        assert_eq!(messages(&out.stdout), want, "{mode}: {}", out.stderr);
        assert!(
            !out.stderr.contains("not printed"),
            "{mode}: {}",
            out.stderr
        );
    }
}

#[test]
fn offsets_must_begin_an_instruction_inside_the_function() {
    // tt_asm: mov (5 bytes) at +0, add (3) at +5, ret at +8; 9 bytes in all.
    let spec = |off: &str| format!("{}:tt_asm+{off} \"%d\", arg1", bin());
    // -v's plan gives the offset probed in the file.
    let planned = |stderr: &str| -> (String, u64) {
        let l = stderr
            .lines()
            .find_map(|l| l.strip_prefix("  probe 0: "))
            .unwrap_or_else(|| panic!("no plan in {stderr}"));
        let (name, at) = l.split_once(" (").unwrap();
        let at = at.rsplit_once(" +0x").unwrap().1.trim_end_matches(')');
        (name.to_string(), u64::from_str_radix(at, 16).unwrap())
    };
    let (_, entry) = planned(&run_on("asm", 0, &["-v", &spec("0")]).stderr);
    for (off, n) in [("5", 5), ("0x8", 8)] {
        let out = run_on("asm", 3, &["-v", &spec(off)]);
        assert_eq!(messages(&out.stdout), ["-1", "0", "1"], "+{off}");
        // Named by where it is probed, in the plan and in FUNC.
        let name = format!("tt_asm+{n:#x}");
        assert_eq!(planned(&out.stderr), (name.clone(), entry + n));
        let funcs: Vec<String> = events(&out.stdout).into_iter().map(|e| e.3).collect();
        assert_eq!(funcs, [name.as_str(); 3], "+{off}");
    }
    for (off, why) in [
        (
            "2",
            "it is inside the instruction at +0x0 (the next one begins at +0x5)",
        ),
        ("9", "it is past the function's end (9 bytes)"),
        (
            "18446744073709551615",
            "it is past the function's end (9 bytes)",
        ),
    ] {
        let s = spec(off);
        let shown = format!("{:#x}", off.parse::<u64>().unwrap());
        fails_with(
            &trace(),
            &[&s],
            &format!("bad probe \"{s}\": tt_asm+{shown} cannot be traced: {why}"),
        );
    }
}

#[test]
fn signature_types_truncate_and_extend_the_register() {
    // tt_asm's argument is the int i - 1, with 0x7777 in the register's upper half.
    let spec = |sig: &str, rest: &str| format!("{}:tt_asm({sig}) {rest}", bin());
    // int: signed, the upper half not part of it.
    let out = run_on("asm", 3, &[&spec("int x", "(x < 0) \"%ld\", x")]);
    assert_eq!(messages(&out.stdout), ["-1"]);
    let out = run_on("asm", 3, &[&spec("unsigned char x", "\"%d\", x")]);
    assert_eq!(messages(&out.stdout), ["255", "0", "1"]);
    let out = run_on("asm", 1, &[&spec("long x", "\"%lx\", x")]);
    assert_eq!(messages(&out.stdout), ["7777ffffffff"]);
    // C's conversions: -1 and -2 become unsigned int (0xffffffff, 0xfffffffe);
    // 4294967295 is a long, which holds every int: a signed comparison.
    for (sig, pred, want) in [
        ("unsigned int x", "(x == -1)", &["4294967295"][..]),
        ("unsigned int x", "(x > -2)", &["4294967295"]),
        ("int x", "(x < 4294967295)", &["-1", "0", "1"]),
    ] {
        let fmt = if sig.starts_with("int") { "%d" } else { "%u" };
        let out = run_on("asm", 3, &[&spec(sig, &format!("{pred} \"{fmt}\", x"))]);
        assert_eq!(messages(&out.stdout), want, "{sig}: {pred}");
    }
}

#[test]
fn percent_u_names_libc_functions_from_their_symbol() {
    // glibc's puts has a .cold part: its DWARF entry (with libc6-dbg) has only
    // ranges, which blazesym reports at address 0. Named from the symbol table.
    let spec = format!("{}:tt_ptr \"%U\", arg1", bin());
    let out = run_on("fnptr", 2, &[&spec]);
    let want = ["puts+0x0 [libc.so.6]", "puts+0x5 [libc.so.6]"];
    assert_eq!(messages(&out.stdout), [want, want].concat());
}

#[test]
fn returns_after_calls_left_by_longjmp() {
    // 40 calls of uf_jumper longjmp out (no return), more than the 16 entries a
    // thread keeps; the returns of the 40 uf_target calls after them all print.
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "uf", &[]);
    let spec = format!("r:{}:uf_target \"%d %d\", arg1, retval", bin.display());
    let jumper = format!("r:{}:uf_jumper", bin.display());
    let want: Vec<String> = (0..40).map(|i| format!("{i} {}", 3 * i + 1)).collect();
    for mode in ["auto", "multi", "single"] {
        let out = run_on_prog(&bin, "jump", 40, &["--attach-mode", mode, &jumper, &spec]);
        assert_eq!(messages(&out.stdout), want, "{mode}: {}", out.stderr);
    }
}

#[test]
fn syscall_fields_are_signed_as_declared() {
    // sys_enter_lseek's `off_t offset` is 8 bytes marked unsigned in its format
    // file; as C (and BCC) read it, -1 is below 0.
    let out = run_on(
        "back",
        3,
        &["t:syscalls:sys_enter_lseek (args->offset < 0) \"%ld\", args->offset"],
    );
    assert_eq!(messages(&out.stdout), ["-1", "-2", "-3"]);
    let out = run_on("back", 1, &["--args", "t:syscalls:sys_enter_lseek"]);
    let m = messages(&out.stdout);
    assert!(m.len() == 1 && m[0].contains("offset=-1 "), "{m:?}");
}

#[test]
fn return_predicate_on_retval() {
    let spec = format!("r:{}:tt_recurse (retval == 207) \"%d\", arg1", bin());
    let out = run_on("recurse", 4, &[&spec]);
    assert_eq!(messages(&out.stdout), ["2", "2", "2", "2"]);
}

#[test]
fn max_events_stops_after_m() {
    let spec = format!("{}:tt_args \"%d\", arg1", bin());
    let out = run_on("calls", 100, &["-M", "7", &spec]);
    assert_eq!(messages(&out.stdout), ["0", "1", "2", "3", "4", "5", "6"]);
}

#[test]
fn aggregate_counts_identical_events() {
    let spec = format!("r:{}:tt_recurse \"%d\", retval", bin());
    let out = run_on("recurse", 9, &["-A", &spec]);
    let mut counts: Vec<(String, u64)> = Vec::new();
    let mut last = String::new();
    for l in out.stdout.lines().skip(1) {
        if let Some(n) = l.strip_prefix("-->COUNT ") {
            let msg = last.get(49..).unwrap_or("").to_string();
            counts.push((msg, n.parse().unwrap()));
        } else if !l.is_empty() {
            last = l.to_string();
        }
    }
    counts.sort();
    let want: Vec<(String, u64)> = [("107".into(), 9), ("207".into(), 9), ("307".into(), 9)].into();
    assert_eq!(counts, want, "{}", out.stdout);
    // --json: one object per distinct event, the event an object without its time.
    let out = run_on("recurse", 9, &["-A", "--json", &spec]);
    let objs: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .filter(|l| l.contains("\"count\""))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let mut counts: Vec<(String, u64)> = objs
        .iter()
        .map(|o| {
            assert!(
                o["event"]["time_s"].is_null() && o["event"]["cpu"].is_null(),
                "{o}"
            );
            let msg = o["event"]["message"].as_str().unwrap().to_string();
            (msg, o["count"].as_u64().unwrap())
        })
        .collect();
    counts.sort();
    assert_eq!(counts, want, "{}", out.stdout);
}

/// The frame below `main` in a -U stack of `traced` is libc's, named: the
/// static release tool, which maps no libc of its own, left it unknown once
/// the process had exited.
fn assert_libc_frame_named(stdout: &str) {
    let lines: Vec<&str> = stdout.lines().collect();
    let after_main = lines
        .iter()
        .position(|l| l.starts_with("        main+0x"))
        .and_then(|i| lines.get(i + 1));
    assert!(
        after_main
            .is_some_and(|l| l.starts_with("        __libc_start_call_main+0x")
                && l.ends_with(" [libc.so.6]")),
        "{stdout}"
    );
}

#[test]
fn user_stack_named_after_the_process_exits() {
    // traced exits right after its call; the stack still names the caller.
    let spec = format!("{}:tt_args", bin());
    let out = run_on("calls", 1, &["-U", &spec]);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(events(&out.stdout).len(), 1, "{}", out.stdout);
    assert!(lines[1].contains(" tt_args"), "{}", out.stdout);
    assert!(
        lines[2].starts_with("        tt_args+0x0 [traced]"),
        "{}",
        out.stdout
    );
    assert!(
        lines[3].starts_with("        tt_caller+0x") && lines[3].ends_with(" [traced]"),
        "{}",
        out.stdout
    );
    assert_libc_frame_named(&out.stdout);
}

#[test]
fn sym_file_list_names_frames_of_a_stripped_program() {
    // BCC's -s: a stripped program's frames get their names from the unstripped
    // build, found by build ID. Frame pointers, and no inlining, so that a
    // frame of the program is in the stack at snprintf's entry.
    let dir = Scratch::new();
    let full = build_userfuncs(&dir, "uf", &["-fno-omit-frame-pointer", "-fno-inline"]);
    let stripped = stripped_copy(&dir, &full, "uf-stripped");
    let frame = |extra: &[&str]| -> String {
        let w = Workload::start(&stripped, &["victim", "1"]);
        let pid = w.pid.to_string();
        let mut args = vec!["-U", "-M", "1", "-p", &pid];
        args.extend_from_slice(extra);
        args.push("c:snprintf");
        let mut t = spawn(&trace(), &args);
        t.wait_line(|l| l.starts_with("PID "), T);
        w.go();
        let out = t.finish(T);
        assert!(w.wait().success(), "the program failed");
        assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            lines[2], "        snprintf+0x0 [libc.so.6]",
            "{}",
            out.stdout
        );
        lines[3].to_string()
    };
    assert_eq!(frame(&[]), "        [unknown] [uf-stripped]");
    let named = frame(&["-s", full.to_str().unwrap()]);
    assert!(
        named.starts_with("        main+0x") && named.ends_with(" [uf]"),
        "{named}"
    );
    let text = dir.0.join("notes.txt");
    std::fs::write(&text, "not an ELF file\n").unwrap();
    let text = text.to_str().unwrap();
    let out = run(&trace(), &["-s", text, "c:snprintf"], T);
    assert_eq!(out.code(), 1);
    assert_eq!(
        out.stderr,
        format!("trace: error: -s {text}: the file has no build ID (.note.gnu.build-id), by which user stack frames name their files\n")
    );
    let d = dir.0.to_str().unwrap();
    fails_with(
        &trace(),
        &["-s", d, "c:snprintf"],
        &format!("-s {d}: a directory; give the files (comma-separated)"),
    );
}

#[test]
fn dash_l_of_no_thread() {
    // Above PID_MAX_LIMIT (4194304): no task has this ID.
    fails_with(
        &trace(),
        &["-L", "4194305", "c:snprintf"],
        "-L 4194305: no thread with that ID",
    );
}

#[test]
fn dash_c_is_bcc_cgroup_path() {
    // BCC's `trace -c CGROUP_PATH`: only the process in the cgroup is traced,
    // as in the man page's example with a path below the cgroup2 mount.
    let cg = Cgroup::new("cg-trace");
    let inside = Workload::start(&traced(), &["calls", "3"]);
    let outside = Workload::start(&traced(), &["calls", "2"]);
    cg.adopt(inside.pid);
    let spec = format!(r#"{}:tt_args "%d", arg1"#, bin());
    let mut t = spawn(&trace(), &["-c", &cg.path.display().to_string(), &spec]);
    t.wait_line(|l| l.starts_with("PID "), T);
    outside.go();
    inside.go();
    let pid = inside.pid;
    assert!(outside.wait().success() && inside.wait().success());
    t.signal(libc::SIGINT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    let seen: Vec<(u32, String)> = events(&out.stdout)
        .into_iter()
        .map(|e| (e.0, e.4))
        .collect();
    let want: Vec<(u32, String)> = (0..3).map(|i| (pid, i.to_string())).collect();
    assert_eq!(seen, want, "{}", out.stdout);
}

#[test]
fn user_stack_named_when_the_process_exited_before_its_record_was_read() {
    // No -p: nothing is known of the process before its record. trace is
    // stopped while the program calls tt_args once and exits, so the record is
    // read only once the process is gone (BCC #2014): the frames, taken as
    // build ID and file offset, still get their names. A private copy: other
    // tests' processes call tt_args too.
    let dir = Scratch::new();
    let copy = dir.copy(&traced());
    let w = Workload::start(&copy, &["calls", "1"]);
    let spec = format!("{}:tt_args", copy.display());
    let mut t = spawn(&trace(), &["-U", "-M", "1", &spec]);
    t.wait_line(|l| l.starts_with("PID "), T);
    t.signal(libc::SIGSTOP);
    wait_stopped(t.pid(), T);
    let pid = w.pid;
    w.go();
    assert!(w.wait().success(), "the traced program failed");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    t.signal(libc::SIGCONT);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(events(&out.stdout).len(), 1, "{}", out.stdout);
    assert!(
        lines[1].starts_with(&format!("{pid:<7} ")),
        "{}",
        out.stdout
    );
    assert_eq!(lines[2], "        tt_args+0x0 [traced]", "{}", out.stdout);
    assert!(
        lines[3].starts_with("        tt_caller+0x") && lines[3].ends_with(" [traced]"),
        "{}",
        out.stdout
    );
    assert_libc_frame_named(&out.stdout);
}

#[test]
fn tracepoint_fields_of_a_syscall() {
    let out = run_on(
        "lseek",
        20,
        &["t:syscalls:sys_enter_lseek \"off=%d whence=%d\", args->offset, args->whence"],
    );
    let want: Vec<String> = (0..20)
        .map(|i| format!("off={} whence=0", 1000 + i))
        .collect();
    assert_eq!(messages(&out.stdout), want);
    assert!(events(&out.stdout).iter().all(|e| e.3 == "sys_enter_lseek"));
}

#[test]
fn syscall_events_on_raw_links_read_as_perf_events_do() {
    // With kernel reads, syscall events are served by one raw link on sys_enter
    // and one on sys_exit, whose programs rebuild each event's record from the
    // registers; without them (lockdown), or with TRACEKIT_PERF_SYSCALLS=1, by
    // the kernel's perf events. The workload's 8 writes of 100..107 bytes read the same both ways: argument,
    // predicate, return value, and no hit for a syscall it does not make.
    let specs = [
        "t:syscalls:sys_enter_write \"count=%d\", args->count",
        "t:syscalls:sys_enter_write (args->count > 104) \"big %d\", args->count",
        "t:syscalls:sys_exit_write (args->ret != 101) \"ret=%ld\", args->ret",
        "t:syscalls:sys_enter_lseek",
    ];
    let mut want = Vec::new();
    for n in 100..108 {
        want.push(format!("count={n}"));
        if n > 104 {
            want.push(format!("big {n}"));
        }
        if n != 101 {
            want.push(format!("ret={n}"));
        }
    }
    let mut args = vec!["-v"];
    args.extend(specs);
    for (env, how) in [
        (
            ("TRACEKIT_NO_KERNEL_READS", "0"),
            "tracepoints: 0 as raw tracepoint links, 3 syscall events through 2 raw sys_enter/sys_exit links, 0 as perf events",
        ),
        (
            ("TRACEKIT_NO_KERNEL_READS", "1"),
            "tracepoint syscalls:sys_exit_write: program trace_tp_24",
        ),
        // Perf events on request, with kernel reads.
        (
            ("TRACEKIT_PERF_SYSCALLS", "1"),
            "tracepoint syscalls:sys_exit_write: program trace_tp_read",
        ),
    ] {
        let reads = format!("{}={}", env.0, env.1);
        let out = run_on_env(&traced(), "write", 8, &[env], &args);
        assert_eq!(messages(&out.stdout), want, "{reads}: {}", out.stderr);
        assert!(out.stderr.lines().any(|l| l == how), "{reads}: {}", out.stderr);
        let hits: Vec<&str> = out
            .stderr
            .lines()
            .filter_map(|l| l.split_once("\"): ").map(|(_, h)| h))
            .collect();
        assert_eq!(
            hits,
            [
                "8 hits, 0 dropped by the predicate in the kernel",
                "8 hits, 5 dropped by the predicate in the kernel",
                "8 hits, 1 dropped by the predicate in the kernel",
                "0 hits, 0 dropped by the predicate in the kernel",
            ],
            "reads {reads}"
        );
    }
}

#[test]
fn tracepoints_that_read_no_field_on_raw_links() {
    // A tracepoint whose specs read no field of its record needs no record: a
    // raw tracepoint link serves it (detached at once, where a perf event
    // waits out RCU grace periods, about 70 ms each), its probe in the link's
    // cookie, or without raw tracepoint cookies (before Linux 6.10) when it is
    // the run's only probe. One whose spec reads a field stays a perf event,
    // as do several without cookies. The workload's 6 renames (its comm tk0,
    // tk1 in turn) are seen all four ways, with the same kernel stacks, which
    // begin where the tracepoint fired.
    // Raw links are expected: raw_tracepoint_counted_exactly, which runs in this
    // binary too, must not add its event named task_rename meanwhile.
    let _lock = rename_event_lock(false);
    let workload = prog("workload");
    let raw = "tracepoint task:task_rename: program trace_raw_tp on a raw tracepoint link (no field of the record is read)";
    // trace_tp_read, or trace_tp_12 without kernel reads.
    let perf = "tracepoint task:task_rename: program trace_tp_";
    let no_cookie = Some(("TRACEKIT_NO_RAW_TP_COOKIE", "1"));
    for (env, specs, how) in [
        (None, &["t:task:task_rename"][..], raw),
        (no_cookie, &["t:task:task_rename"], raw),
        (
            no_cookie,
            &["t:task:task_rename", "t:task:task_newtask"],
            perf,
        ),
        (None, &["t:task:task_rename \"%s\", args->newcomm"], perf),
    ] {
        let env: Vec<(&str, &str)> = env.into_iter().collect();
        let mut args = vec!["-v", "-K"];
        args.extend(specs);
        let spec = specs.join(" ");
        let out = run_on_env(&workload, "rename", 6, &env, &args);
        let ctx = format!("{env:?} {spec}: {}", out.stderr);
        assert!(out.stderr.lines().any(|l| l.starts_with(how)), "{ctx}");
        let raw = how.contains("raw tracepoint link");
        let tally = format!(
            "tracepoints: {} as raw tracepoint links, 0 syscall events through 0 raw sys_enter/sys_exit links, 0 as perf events",
            u8::from(raw)
        );
        assert_eq!(out.stderr.contains(&tally), raw, "{ctx}");
        let ev = events(&out.stdout);
        let comms: Vec<&str> = ev.iter().map(|e| e.2.as_str()).collect();
        assert_eq!(
            comms,
            ["workload", "tk0", "tk1", "tk0", "tk1", "tk0"],
            "{ctx}"
        );
        if spec.contains("newcomm") {
            let m: Vec<&str> = ev.iter().map(|e| e.4.as_str()).collect();
            assert_eq!(m, ["tk0", "tk1", "tk0", "tk1", "tk0", "tk1"], "{ctx}");
        }
        // Each event's stack: its first frame, then the prctl that renamed.
        let stacks: Vec<&str> = out
            .stdout
            .split("task_rename")
            .skip(1)
            .map(|s| s.lines().nth(1).unwrap_or("").trim())
            .collect();
        assert_eq!(stacks.len(), 6, "{ctx}");
        assert!(
            stacks.iter().all(|f| f.starts_with("__set_task_comm+")),
            "{ctx}\n{}",
            out.stdout
        );
    }
}

#[test]
fn every_syscall_event_on_two_raw_links() {
    // All of them, entries and exits: two raw links, no perf event (each would
    // take an RCU grace period, about 70 ms, to close). The workload's writes are
    // all there, each entry followed by its exit.
    let out = run_on(
        "write",
        5,
        &["-v", "t:syscalls:sys_enter_*", "t:syscalls:sys_exit_*"],
    );
    let how = out.stderr.lines().find(|l| l.starts_with("tracepoints: "));
    let how = how.unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(
        how.starts_with("tracepoints: 0 as raw tracepoint links, ")
            && how.ends_with(
                " syscall events through 2 raw sys_enter/sys_exit links, 0 as perf events"
            ),
        "{how}"
    );
    let writes: Vec<String> = events(&out.stdout)
        .into_iter()
        .map(|e| e.3)
        .filter(|f| f.ends_with("_write"))
        .collect();
    assert_eq!(writes, ["sys_enter_write", "sys_exit_write"].repeat(5));
}

#[test]
fn tracepoint_predicate_on_a_field() {
    let out = run_on(
        "lseek",
        20,
        &["t:syscalls:sys_enter_lseek (args->offset > 1016) \"%d\", args->offset"],
    );
    assert_eq!(messages(&out.stdout), ["1017", "1018", "1019"]);
}

#[test]
fn usdt_arguments() {
    let spec = format!("u:{}:pair \"%d %d\", arg1, arg2", bin());
    let out = run_on("usdt", 30, &[&spec]);
    let want: Vec<String> = (0..30).map(|i| format!("{i} {}", 2 * i)).collect();
    assert_eq!(messages(&out.stdout), want);
    // --args: the probe's 2 arguments, from its note.
    let out = run_on("usdt", 3, &["--args", &format!("u:{}:pair", bin())]);
    assert_eq!(
        messages(&out.stdout),
        ["arg1=0 arg2=0", "arg1=1 arg2=2", "arg1=2 arg2=4"]
    );
    // It has no third.
    let spec = format!("u:{}:pair \"%d\", arg3", bin());
    fails_with(
        &trace(),
        &[&spec],
        &format!(
            "bad probe \"{spec}\": pair: this USDT probe has 2 arguments (arg1..arg2), not arg3"
        ),
    );
}

#[test]
fn json_one_typed_object_per_event() {
    let spec = format!("{}:tt_args \"%d %s\", arg1, arg3", bin());
    let out = run_on("calls", 5, &["--json", &spec]);
    let objs: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(objs.len(), 6, "{}", out.stdout);
    // The last one says the run ended, and that nothing was lost.
    assert_eq!(
        objs[5],
        serde_json::json!({"final": true, "events": 5, "records": 5, "lost": 0})
    );
    for (i, o) in objs[..5].iter().enumerate() {
        assert_eq!(o["func"], "tt_args");
        assert_eq!(o["comm"], "traced");
        assert_eq!(o["probe"], spec.as_str());
        assert_eq!(o["message"], format!("{i} name-{i}"));
        assert_eq!(o["values"], serde_json::json!([i, format!("name-{i}")]));
        assert_eq!(o["pid"], o["tid"]);
    }
}

#[test]
fn several_probes_in_one_run() {
    let a = format!("{}:tt_args (arg1 < 2) \"args %d\", arg1", bin());
    let c = format!("{}:tt_caller (arg1 < 2) \"caller %d\", arg1", bin());
    let out = run_on("calls", 10, &[&a, &c]);
    assert_eq!(
        messages(&out.stdout),
        ["caller 0", "args 0", "caller 1", "args 1"]
    );
}

/// Specs that must fail, each with the one line that names what is wrong.
const BAD: &[(&str, &str)] = &[
    ("p::", "the function name is empty"),
    ("x:foo:bar", "probe type must be '', 'p', 'r', 't' or 'u', not 'x'"),
    ("p:c:malloc \"%d\"", "the format has 1 conversion but 0 arguments follow"),
    ("p:c:malloc \"%d\", arg1, arg2", "the format has 1 conversion but 2 arguments follow"),
    ("p:c:malloc (arg1 >) \"x\"", "in the predicate: expression ends too early"),
    ("p:c:malloc (arg1 > 1", "unmatched end of predicate: a '(' is never closed"),
    ("p:c:malloc \"unterminated", "in the format: unterminated string \"unterminated"),
    ("p:c:malloc \"%q\", arg1", "in the format: unsupported conversion '%q' (use %d %u %x %o %c %s %p %K %U, with h, hh, l, ll)"),
    ("p:c:malloc (arg9 == 1)", "malloc: only arg1..arg6 are in registers, not arg9"),
    ("r:c:malloc \"%s\", foo", "malloc: unknown name 'foo' (user functions have arg1..arg6, or names from a signature: func(int foo))"),
    ("t:sched", "'t:' needs three parts: t:CATEGORY:EVENT"),
    ("p:c:malloc (STRCMP(arg1, arg2))", "malloc: STRCMP takes a string literal and a value: STRCMP(\"text\", arg1)"),
    ("p:c:malloc \"%d\", retval", "malloc: retval is only available in return probes (r:)"),
    ("p:c:malloc+zz", "invalid offset 'zz': must be decimal or hexadecimal (0x..)"),
    ("u:c:", "the USDT probe name is empty"),
    ("p:c:malloc(int x", "unmatched '(' in the signature (int x"),
    ("p:c:malloc \"%d\" arg1", "expected ',' after the format, not 'arg1'"),
    ("", "no probe before the predicate or format"),
    ("p:c:malloc \"%d\", arg1 +", "in argument 'arg1 +': expression ends too early"),
    ("p:c:malloc \"%d\", $nosuch", "malloc: unknown variable '$nosuch' (there are $pid, $tgid, $uid, $gid, $cpu)"),
    ("p:c:malloc \"%d\", arg1@kernel", "in argument 'arg1@kernel': unknown '@' suffix at '@kernel' (only @user)"),
    ("p:c:malloc (\"x\" == 1)", "malloc: the string \"x\" can only be used in STRCMP(\"...\", value)"),
    ("p:c:malloc \"%d %d\", arg1", "the format has 2 conversions but 1 argument follows"),
    ("p:c:malloc \"%\", arg1", "in the format: '%' at the end has no conversion"),
    ("p:c:malloc \"%d\", arg1)", "unmatched ')' in the arguments"),
    ("p:c:malloc (arg1) (arg2)", "expected a predicate in parentheses or a \"format\", not '(arg2)'"),
    ("p:c:malloc \"a\" \"b\"", "expected ',' after the format, not '\"b\"'"),
    ("p:c:malloc \"%d\", 99999999999999999999999", "in argument '99999999999999999999999': bad number '99999999999999999999999'"),
    ("r:c:malloc+4", "an offset is for entry probes (p:), not returns (r:)"),
    ("p:c:malloc(int, int)", "in the signature: parameter 'int' has no type (write it as in C: 'struct sock *sk')"),
    ("p:c:malloc(struct nosuch *x) \"%d\", x->y", "malloc: 'struct nosuch' is not known here: struct layouts come from the kernel's BTF, for kernel functions only"),
    ("t:a:b:c", "a tracepoint is t:CATEGORY:EVENT"),
    ("u:c", "'u:' needs three parts: u:LIBRARY:PROBE"),
    ("u::probe", "a USDT probe is u:LIBRARY:[PROVIDER:]PROBE"),
    ("p:c:malloc \"%d\", args->x", "malloc: unknown name 'args' (user functions have arg1..arg6, or names from a signature: func(int args))"),
    ("p:c:malloc (arg1 ==== 2)", "in the predicate: unexpected '==' at '== 2'"),
    ("p:c:malloc \"%s\", 1", "malloc: '1' is a 4-byte integer, not a pointer to a string"),
    ("p:c:malloc \"%s\", arg1 == 0", "malloc: 'arg1 == 0' is a 4-byte integer, not a pointer to a string"),
    ("p:c:malloc(int a, long a) \"%d\", a", "in the signature: parameter name 'a' is used twice"),
    ("p:c:malloc(char **v) \"%s\", v", "malloc: 'v' points to a pointer, not to a string: print *v or v[N]"),
    ("p:c:malloc [arg1]", "expected a predicate in parentheses or a \"format\", not '[arg1]'"),
    ("p:c:malloc (arg1 ? 1 : 2)", "in the predicate: unexpected '?'"),
    ("p:c:malloc \"%d\", arg1 = 2", "in argument 'arg1 = 2': unexpected '='"),
    ("p:c:malloc \"%d\", ((arg1)", "unmatched '(' in the arguments"),
    ("p:c:malloc \"%c\", \"x\"", "malloc: the string \"x\" can only be used in STRCMP(\"...\", value)"),
    ("r::", "the function name is empty"),
    (":::", "the function name is empty"),
    ("p:c:malloc \"%d\",", "empty argument after the format"),
];

#[test]
fn grammar_errors_name_the_offending_part() {
    for (spec, msg) in BAD {
        fails_with(&trace(), &[spec], &format!("bad probe \"{spec}\": {msg}"));
    }
}

#[test]
fn bin_cmp_literal_that_is_not_a_byte_list() {
    for (lit, msg) in [
        (
            "abc",
            "-B: the STRCMP literal \"abc\" is not a list of bytes such as \"{0x6C, 0x00}\"",
        ),
        (
            "{0x41, zz}",
            "-B: the STRCMP literal \"{0x41, zz}\" is not a list of bytes such as \"{0x6C, 0x00}\"",
        ),
        (
            "{}",
            "-B: the STRCMP literal \"{}\" is not a list of bytes such as \"{0x6C, 0x00}\"",
        ),
        ("{0x41, 256}", "-B: 256 in \"{0x41, 256}\" is not a byte"),
    ] {
        let spec = format!("p:c:malloc (STRCMP(\"{lit}\", arg1))");
        fails_with(
            &trace(),
            &["-B", &spec],
            &format!("bad probe \"{spec}\": malloc: {msg}"),
        );
    }
}

#[test]
fn tracepoint_errors_name_the_field() {
    fails_with(
        &trace(),
        &["t:sched:sched_switch \"%d\", args->nosuch"],
        "bad probe \"t:sched:sched_switch \"%d\", args->nosuch\": sched:sched_switch: the tracepoint has no field 'nosuch' (fields: prev_comm, prev_pid, prev_prio, prev_state, next_comm, next_pid, next_prio)",
    );
    fails_with(
        &trace(),
        &["t:sched:sched_switch (args->prev_comm == 1)"],
        "bad probe \"t:sched:sched_switch (args->prev_comm == 1)\": sched:sched_switch: a tracepoint field of type u8[16] has no numeric value: print it with %s",
    );
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    let deep = format!("p:c:malloc ({}1{})", "(".repeat(5000), ")".repeat(5000));
    let out = run(&trace(), &[&deep], T);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr
            .ends_with("in the predicate: expression nested too deeply\n"),
        "{}",
        out.stderr
    );
}

#[test]
fn bad_path_is_one_line() {
    let out = run(&trace(), &["p:/nonexistent/lib:f"], T);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.starts_with("trace: error: "), "{}", out.stderr);
}

#[test]
fn aggregate_flushed_on_sigterm() {
    // The traced process lives on; SIGTERM ends trace, which prints its counts
    // and exits 0.
    let w = Workload::start(&traced(), &["recurse", "4", "--hold"]);
    let spec = format!("r:{}:tt_recurse (arg1 == 3) \"%d\", retval", bin());
    let pid = w.pid.to_string();
    let mut t = spawn(&trace(), &["-A", "-p", &pid, &spec]);
    t.wait_line(|l| l.starts_with("PID "), T);
    w.go();
    std::thread::sleep(Duration::from_millis(500));
    t.signal(libc::SIGTERM);
    let out = t.finish(T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", out.stdout);
    assert_eq!(lines[1].get(49..), Some("307"), "{}", out.stdout);
    assert_eq!(lines[2], "-->COUNT 4");
    w.go();
    assert!(w.wait().success());
}

#[test]
fn tracepoints_the_kernel_refuses_are_skipped_with_the_reason() {
    // ftrace:print takes no BPF program (EINVAL), as t:*:* always matches it:
    // trace ran nothing ("attaching tracepoint ftrace:print: failed to attach").
    let ftrace_print = "ftrace:print (the kernel refused it (EINVAL): BPF cannot attach to \
                        ftrace's own events or to events defined in tracefs (kprobe, uprobe, \
                        synthetic))";
    let out = run(
        &trace(),
        &[
            "-M",
            "1",
            r#"t:ftrace:print "%d", args->ip"#,
            "t:sched:sched_switch",
        ],
        T,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "trace: skipped 1 tracepoint that could not be attached: {ftrace_print}\n"
        )),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.stdout);
    // -v, which the warning's "and N more" names, says so of each.
    let out = run(
        &trace(),
        &[
            "-v",
            "-M",
            "1",
            r#"t:ftrace:print "%d", args->ip"#,
            "t:sched:sched_switch",
        ],
        T,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("tracepoint ftrace:print: program "))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    let reason = ftrace_print
        .strip_prefix("ftrace:print (")
        .and_then(|r| r.strip_suffix(')'))
        .expect("a reason");
    assert!(line.ends_with(&format!(", skipped: {reason}")), "{line}");
    // Alone, it is an error that says why.
    fails_with(
        &trace(),
        &[r#"t:ftrace:print "%d", args->ip"#],
        &format!("nothing could be attached: {ftrace_print}"),
    );
}

#[test]
fn a_closed_pipe_ends_the_run_with_no_event_to_write() {
    // `trace ... | head -1` ran on after the header until the next event: with
    // none coming (no program calls acct), forever.
    let (code, err) = exit_after_head_1(&trace(), &["t:syscalls:sys_enter_acct"], T);
    assert_eq!((code, err.as_str()), (0, ""));
}

#[test]
fn control_bytes_in_strings_are_escaped() {
    // The workload renames itself `a;b\nc\x1b[1m`: %s printed the newline and
    // the escape sequence raw, splitting the event over two lines and sending
    // the terminal an escape; COMM was already escaped.
    let out = run_on_env(
        &prog("workload"),
        "oddname",
        1,
        &[],
        &[r#"t:task:task_rename "%s", args->newcomm"#],
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(lines[1].ends_with(r" a;b\x0ac\x1b[1m"), "{}", out.stdout);
}
