//! trace on user functions and USDT probes of the `traced` test program: every
//! argument, returns paired with their entries (recursion, threads, deep
//! nesting, longjmp), offsets, %U, -U stacks named after the process exits,
//! -s, and the kernel BTF read only for session programs.

use super::*;

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
    assert_starts_with(
        &out.stdout,
        &format!(
            "{:<7} {:<7} {:<15} {:<16} -\n",
            "PID", "TID", "COMM", "FUNC"
        ),
    );
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
        // auto: uprobe.session on this kernel (funclatency.rs checks it).
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

/// The callers of tt_args in a -U stack of `traced` are named: its fourth line
/// is tt_caller, and the frame below `main` is libc's (the static release tool,
/// which maps no libc of its own, left that one unknown once the process had
/// exited).
fn assert_callers_named(stdout: &str) {
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[3].starts_with("        tt_caller+0x") && lines[3].ends_with(" [traced]"),
        "{stdout}"
    );
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
    assert_callers_named(&out.stdout);
}

#[test]
fn sym_file_list_names_frames_of_a_stripped_program() {
    // BCC's -s: a stripped program's frames get their names from the unstripped
    // build, found by build ID. No inlining, so that snprintf's caller is a
    // function of the program: victim (the unwind tables find a caller at its
    // callee's entry; a frame-pointer walk skipped it, for main).
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
        let out = t.finish_after(w, T);
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
        named.starts_with("        victim+0x") && named.ends_with(" [uf]"),
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
fn user_stack_named_when_the_process_exited_before_its_record_was_read() {
    // No -p: nothing is known of the process before its record. trace is
    // stopped while the program calls tt_args once and exits, so the record is
    // read only once the process is gone (BCC #2014): the frames, taken as
    // build ID and file offset, still get their names. A private copy: other
    // tests' processes call tt_args too.
    let dir = Scratch::new();
    let (w, spec) = private_workload(&dir, &traced(), &["calls", "1"], "tt_args");
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
    assert_callers_named(&out.stdout);
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
fn bad_path_is_one_line() {
    let out = run(&trace(), &["p:/nonexistent/lib:f"], T);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert_starts_with(&out.stderr, "trace: error: ");
}

#[test]
fn user_stack_at_an_entry_has_the_caller() {
    // At a function's first instruction its caller is only at the stack
    // pointer: tk_leaf (no frame of its own) lost via_one, as stackcount once
    // did. via_one begins with push %rbp, for which this kernel adds the caller
    // itself: it is not repeated.
    let dir = Scratch::new();
    let bin = crate::stackcount::build_leaf(&dir);
    let w = Workload::start(&bin, &["1"]);
    let pid = w.pid.to_string();
    let (leaf, via) = (
        format!("{}:tk_leaf", bin.display()),
        format!("{}:via_one", bin.display()),
    );
    let mut t = spawn(&trace(), &["-p", &pid, "-U", &leaf, &via]);
    t.wait_line(|l| l.starts_with("PID "), T);
    let out = t.finish_after(w, T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // Each event's frames by name, to the first of libc's.
    let stacks: Vec<Vec<String>> = out
        .stdout
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.lines()
                .filter_map(|l| l.strip_prefix("        "))
                .map(|f| match f.split_once("+0x") {
                    Some((name, rest)) => format!("{name} {}", rest.split_once(' ').unwrap().1),
                    None => f.to_string(),
                })
                .take_while(|f| !f.ends_with("[libc.so.6]"))
                .collect()
        })
        .collect();
    assert_eq!(
        stacks,
        [
            vec!["via_one [leaf]", "main [leaf]"],
            vec!["tk_leaf [leaf]", "via_one [leaf]", "main [leaf]"],
        ],
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("        tk_leaf+0x0 [leaf]\n"),
        "{}",
        out.stdout
    );
}

#[test]
fn returns_nested_deeper_than_the_kernels_64_return_hooks_are_reported() {
    // 10 chains of tk_rec (tests/progs/pairing.c) 101 calls deep: 1,010 calls.
    // The kernel gives a thread at most 64 nested return hooks, so an r: probe
    // prints 640 returns; the other 370 are reported (they went unsaid). With an
    // entry argument the 16 outermost of each chain are printed (returns pass
    // the saved entries by stack pointer; before, multi and single mode printed
    // none) and the 850 deeper reported.
    let dir = Scratch::new();
    let bin = build_c(&dir, "pairing");
    let plain = format!("r:{}:tk_rec", bin.display());
    let with_arg = format!("r:{}:tk_rec \"%d\", arg1", bin.display());
    let never = "trace: 370 returns not printed: the return never came (nested deeper than the \
                 kernel's 64 return probes, left by longjmp or an exception, the thread exited, \
                 or still running)\n";
    let deep = "trace: 850 returns not printed: calls nested deeper than 16 on their thread \
                (their entries could not be saved)\n";
    for mode in ["auto", "multi", "single"] {
        for (spec, printed, stderr) in [(&plain, 640, never), (&with_arg, 160, deep)] {
            let out = trace_cprog(
                &trace(),
                &bin,
                &["rec", "10", "101"],
                &["--attach-mode", mode, spec],
                |l| l.starts_with("PID"),
            );
            let lines = out.stdout.lines().filter(|l| l.contains("tk_rec")).count();
            assert_eq!(lines, printed, "{mode} {spec}: {}", out.stdout);
            assert_eq!(out.stderr, stderr, "{mode} {spec}");
        }
    }
}

#[test]
fn shift_counts_of_64_or_more_at_run_time_leave_nothing() {
    // Counts 0, 10, ..., 490 from tt_args's second argument: as if shifted a
    // bit at a time (the sweep saw them taken mod 64: 70 shifted by 6).
    let spec = format!(
        "{}:tt_args \"%lx %lx %ld\", 0x7fffffffffffffff >> arg2, 0x4000000000000000 << arg2 >> arg2, ((s64)arg2 - 1000) >> arg2",
        bin()
    );
    let out = run_on("calls", 50, &[&spec]);
    let ev = events(&out.stdout);
    assert_eq!(ev.len(), 50, "{}", out.stdout);
    for (i, (.., msg)) in ev.iter().enumerate() {
        let c = 10 * i as u32;
        let want = |v: u64| if c > 63 { 0 } else { v };
        let shr = want(0x7fff_ffff_ffff_ffff_u64 >> c.min(63));
        let round = want(want(0x4000_0000_0000_0000_u64 << c.min(63)) >> c.min(63));
        let sar = (10 * i as i64 - 1000) >> c.min(63);
        assert_eq!(msg, &format!("{shr:x} {round:x} {sar}"), "count {c}");
    }
}
