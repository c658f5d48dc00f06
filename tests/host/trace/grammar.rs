//! trace's probe language: predicates decided in the kernel (and gates, decided
//! on one register before anything else is read), STRCMP and -B byte lists,
//! signatures and casts, retval in return predicates, and the one-line errors
//! that name the offending part of a spec.

use super::*;

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
    assert_eq!(trace_records(stderr), records, "{stderr}");
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
    assert_eq!(trace_records(&out.stderr), 6, "{}", out.stderr);
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
fn return_predicate_on_retval() {
    let spec = format!("r:{}:tt_recurse (retval == 207) \"%d\", arg1", bin());
    let out = run_on("recurse", 4, &[&spec]);
    assert_eq!(messages(&out.stdout), ["2", "2", "2", "2"]);
}

/// Specs that must fail, each with the one line that names what is wrong.
const BAD: &[(&str, &str)] = &[
    ("p::", "the function name is empty"),
    ("x:foo:bar", "probe type must be '', 'p', 'r', 't', 'u', 'profile', 'software' or 'hardware', not 'x'"),
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
    // Sweep bug 10: a declared integer is not an address (an undeclared
    // register argument still is, as in BCC).
    ("p:c:malloc(int n) \"%d\", *n", "malloc: 'n' is an integer (s32), not a pointer, so '*n' cannot be read (if it holds an address, cast it: *(int *)n)"),
    ("p:c:malloc(int n) (STRCMP(\"hello\", *n))", "malloc: 'n' is an integer (s32), not a pointer, so '*n' cannot be read (if it holds an address, cast it: *(int *)n)"),
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
fn deep_nesting_is_refused_not_overflowed() {
    let deep = format!("p:c:malloc ({}1{})", "(".repeat(5000), ")".repeat(5000));
    let out = run(&trace(), &[&deep], T);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert_ends_with(
        &out.stderr,
        "in the predicate: expression nested too deeply\n",
    );
}

#[test]
fn spec_errors_quote_the_spec_alone() {
    // Sweep bug 16: a spec that matched nothing was quoted with its filter,
    // format and arguments ("u:pthread:pthread_create "%d", arg99"), its quotes
    // nested in the message's. Only the part that matched nothing is quoted.
    let b = bin();
    fails_with(
        &trace(),
        &[&format!("u:{b}:nosuchprobe (arg1 != 0) \"%d\", arg99")],
        &format!("no USDT probe in {b} matches \"u:{b}:nosuchprobe\""),
    );
    fails_with(
        &trace(),
        &[&format!("p:{b}:no_such_fn(int a) \"%d\", a")],
        &format!("no function in {b} matches \"p:{b}:no_such_fn\""),
    );
    fails_with(
        &trace(),
        &["t:sched:no_such_event \"%d\", arg1"],
        "no tracepoint matches \"t:sched:no_such_event\" (tracepoints are listed under events/ in tracefs)",
    );
}
