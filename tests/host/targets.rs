//! Finding what to probe in user binaries this project did not build: the
//! system libc (with and without libc6-dbg's debug files), zlib from its Debian
//! package, a C program built without -g, stripped copies (with a debug file
//! by debuglink, or exports only), IFUNCs, cold parts, entries a uprobe cannot
//! step, one file by two paths, one name in two binaries, and files that are
//! not binaries at all. Driven by funccount.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::funccount::{fails_with, funccount, workload};
use crate::util::*;

const T: Duration = Duration::from_secs(60);

const LIBC_N: u64 = 1000;

/// The workload's `libc` mode: exported libc functions, each called an exact number
/// of times (strlen is an IFUNC: the count is its implementation's on this CPU).
fn libc_rows(n: u64) -> Vec<(String, u64)> {
    rows(&[
        ("free", n),
        ("malloc", n),
        ("strlen", 2 * n),
        ("read", 3 * n),
        ("pthread_mutex_lock", 4 * n),
        ("pthread_mutex_unlock", 4 * n),
    ])
}

const LIBC_SPECS: [&str; 6] = [
    "c:malloc",
    "c:free",
    "c:strlen",
    "c:read",
    "c:pthread_mutex_lock",
    "c:pthread_mutex_unlock",
];

fn libc_workload() -> Workload {
    Workload::start(&workload(), &["libc", &LIBC_N.to_string()])
}

/// funccount's table for `BIN:FUNC` over `BIN WARGS`, with -p: how the tests
/// count the calls of a binary made here (built, stripped or split).
fn count_in(bin: &Path, wargs: &[&str], func: &str) -> Vec<(String, u64)> {
    let w = Workload::start(bin, wargs);
    let spec = format!("{}:{func}", bin.display());
    last_table(&trace_workload(&funccount(), w, &[&spec], T).stdout)
}

#[test]
fn libc_exported_functions_count_exactly() {
    let out = trace_workload(&funccount(), libc_workload(), &LIBC_SPECS, T);
    assert_eq!(last_table(&out.stdout), libc_rows(LIBC_N), "{}", out.stderr);
    assert_eq!(out.stderr, "");
}

#[test]
fn libc_debug_file_adds_internal_names() {
    // libc6-dbg's symtab names malloc's entry __GI___libc_malloc too: asked for by
    // that name, it is counted and shown by it.
    let out = trace_workload(
        &funccount(),
        libc_workload(),
        &["c:__GI___libc_malloc", "c:__libc_malloc"],
        T,
    );
    // Both names are one address: one probe, shown by the exported name asked for.
    assert_eq!(last_table(&out.stdout), rows(&[("__libc_malloc", LIBC_N)]));
}

#[test]
fn libc_without_debug_files_counts_the_same() {
    let cmd = without_debug_files(&funccount());
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let out = trace_workload_via(&cmd, libc_workload(), &LIBC_SPECS, T);
    assert_eq!(last_table(&out.stdout), libc_rows(LIBC_N), "{}", out.stderr);
    // The internal name exists only in the (now hidden) debug file.
    let mut args = cmd[1..].to_vec();
    args.push("c:__GI___libc_malloc");
    let out = run(Path::new(cmd[0]), &args, T);
    assert_eq!(out.code(), 1);
    // Debian's libc.so.6 is stripped: without its debug file only .dynsym is left.
    assert!(
        out.stderr.starts_with("funccount: error: no function in /")
            && out.stderr.contains(
                "/libc.so.6 matches \"c:__GI___libc_malloc\": /lib/x86_64-linux-gnu/libc.so.6 \
                 has no symbol table (it is stripped, and only its "
            )
            && out.stderr.ends_with(
                " exported functions are visible); install its debug symbols (the -dbgsym or \
                 -dbg package) or trace an unstripped build\n"
            ),
        "{}",
        out.stderr
    );
}

#[test]
fn libc_glob_shows_each_address_by_its_exported_name() {
    let out = trace_workload(&funccount(), libc_workload(), &["c:*malloc*"], T);
    let table = last_table(&out.stdout);
    assert!(table.contains(&("malloc".to_string(), LIBC_N)), "{table:?}");
    // Not again under its aliases at the same address.
    for alias in ["__libc_malloc", "__malloc", "__GI___libc_malloc"] {
        assert!(table.iter().all(|(n, _)| n != alias), "{table:?}");
    }
}

#[test]
fn zlib_from_its_debian_package() {
    // libz.so.1 has no symtab and no DWARF: only .dynsym. crc32 tail-calls crc32_z.
    let w = Workload::start(&workload(), &["zlib", "700"]);
    let out = trace_workload(&funccount(), w, &["z:crc32", "z:crc32_z"], T);
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("crc32", 700), ("crc32_z", 700)])
    );
}

#[test]
fn c_binary_without_debug_info() {
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "nodebug", &[]);
    assert_eq!(
        count_in(&bin, &["plain", "2345"], "uf_target"),
        rows(&[("uf_target", 2345)])
    );
}

#[test]
fn one_name_in_two_binaries_is_told_apart() {
    // Two rows of one name said nothing of which was which: each is labelled
    // with its binary where the name is shared; a name of one binary is not.
    let out = trace_two_copies(
        &funccount(),
        ("ufa", 30),
        ("ufb", 70),
        &["{a}:uf_target", "{b}:uf_target", "{a}:uf_tail"],
    );
    assert_eq!(
        last_table(&out.stdout),
        rows(&[("ufa:uf_target", 30), ("ufb:uf_target", 70)])
    );
}

#[test]
fn ifuncs_sharing_their_code_are_said_to() {
    // On x86-64 glibc picks one implementation for memmove and memcpy: a probe
    // on it sees the calls of both, and funccount says so. Where the program
    // finds them apart, each counts its own calls and nothing is said.
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "copies", &[]);
    let how = Command::new(&bin).arg("ifuncs").output().unwrap();
    let shared = String::from_utf8_lossy(&how.stdout).trim() == "shared";
    let w = Workload::start(&bin, &["copies", "40"]);
    let out = trace_workload(&funccount(), w, &["c:memmove"], T);
    let note = "funccount: memmove runs the same code as memcpy on this CPU";
    if shared {
        assert_eq!(last_table(&out.stdout), rows(&[("memmove", 120)]));
        assert!(
            out.stderr.contains(note) && out.stderr.contains("also counts the calls of memcpy"),
            "{}",
            out.stderr
        );
    } else {
        assert_eq!(last_table(&out.stdout), rows(&[("memmove", 40)]));
        assert!(!out.stderr.contains(note), "{}", out.stderr);
    }
}

#[test]
fn cold_parts_are_counted() {
    // Only return hooks are refused on a cold part (funclatency.rs): an
    // entry counts the jumps into it, and the workload checks its results.
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "cold", &[]);
    assert_eq!(
        count_in(&bin, &["cold", "60"], "uf_split*"),
        rows(&[("uf_split.cold", 60), ("uf_split", 120)])
    );
}

#[test]
fn stripped_binary_exports_only() {
    let dir = Scratch::new();
    // Stripped, its functions are gone, and the message says why.
    let bin = build_userfuncs(&dir, "built", &[]);
    let stripped = stripped_copy(&dir, &bin, "stripped");
    let spec = format!("{}:uf_target", stripped.display());
    let p = stripped.display();
    fails_with(
        &[&spec],
        &format!(
            "no function in {p} matches \"{spec}\": {p} has no symbol table (it is stripped, \
             and exports no functions); install its debug symbols (the -dbgsym or -dbg \
             package) or trace an unstripped build"
        ),
    );
    // Functions it exports (-rdynamic) are still there.
    let bin = build_userfuncs(&dir, "exports", &["-rdynamic"]);
    let stripped = stripped_copy(&dir, &bin, "exports-stripped");
    assert_eq!(
        count_in(&stripped, &["plain", "432"], "uf_target"),
        rows(&[("uf_target", 432)])
    );
}

#[test]
fn stripped_binary_with_its_debug_file_by_debuglink() {
    // As distributions split them: the symbols in a .debug file, found through the
    // binary's .gnu_debuglink in <dir>/.debug/ (its build ID is in no debug root).
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "split", &["-g"]);
    std::fs::create_dir(dir.0.join(".debug")).unwrap();
    let debug = dir.0.join(".debug").join("split.debug");
    let stripped = dir.0.join("split-stripped");
    for args in [
        vec!["--only-keep-debug".into(), bin.clone(), debug.clone()],
        vec![
            "--strip-all".into(),
            format!("--add-gnu-debuglink={}", debug.display()).into(),
            bin.clone(),
            stripped.clone(),
        ],
    ] {
        let st = Command::new("objcopy").args(&args).status().unwrap();
        assert!(st.success());
    }
    assert_eq!(
        count_in(&stripped, &["plain", "321"], "uf_target"),
        rows(&[("uf_target", 321)])
    );
}

#[test]
fn entries_a_uprobe_cannot_step_are_skipped_with_the_reason() {
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "entries", &[]);
    let p = bin.display();
    fails_with(
        &[&format!("{p}:uf_evex")],
        &format!(
            "uf_evex in {p} cannot be traced: its first instruction (`vpbroadcastb %esi,%ymm17`) \
             is AVX-512 (EVEX-encoded), which a uprobe's out-of-line single step does not \
             execute correctly: the traced program would compute wrong results"
        ),
    );
    // The program checks every result (and runs the AVX ones where the CPU has them):
    // it exits 0 only when nothing corrupted it.
    let w = Workload::start(&bin, &["entries", "5000"]);
    let out = trace_workload(&funccount(), w, &["-D", &format!("{p}:uf_*")], T);
    assert_eq!(last_table(&out.stdout), rows(&[("uf_sse", 5000)]));
    assert_contains(
        &out.stderr,
        "  skipped uf_vex: its first instruction (`vmovd %esi,%xmm0`) is AVX (VEX-encoded) \
             on vector registers",
    );
    assert_contains(&out.stderr, "  skipped uf_evex: its first instruction");
}

#[test]
fn all_of_libc_leaves_the_traced_process_correct() {
    let _turn = event_mutex_turn();
    // The sweep's victim: with a probe on every libc function, its own snprintf,
    // strchr, strlen... results are checked on every round.
    let dir = Scratch::new();
    let bin = build_userfuncs(&dir, "victim", &[]);
    let w = Workload::start(&bin, &["victim", "3000"]);
    let out = trace_workload(&funccount(), w, &["c:*"], Duration::from_secs(240));
    let table = last_table(&out.stdout);
    assert!(table.contains(&("snprintf".to_string(), 3000)), "{table:?}");
}

/// A 32-bit ELF header (i386 executable), as `gcc -m32` would start a file.
fn elf32_header() -> Vec<u8> {
    let mut h = vec![0x7f, b'E', b'L', b'F', 1, 1, 1];
    h.resize(16, 0);
    for v in [2u16, 3] {
        h.extend(v.to_le_bytes()); // e_type EXEC, e_machine 386
    }
    h.extend(1u32.to_le_bytes()); // e_version
    h.extend([0u8; 16]); // e_entry, e_phoff, e_shoff, e_flags
    for v in [52u16, 32, 0, 40, 0, 0] {
        h.extend(v.to_le_bytes()); // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
    }
    h
}

#[test]
fn files_that_are_not_binaries_say_what_they_are() {
    let dir = Scratch::new();
    let file = |name: &str, data: &[u8]| {
        let p = dir.0.join(name);
        std::fs::write(&p, data).unwrap();
        p.display().to_string()
    };
    let script = file("script", b"#!/bin/sh\necho hi\n");
    let elf32 = file("elf32", &elf32_header());
    let elf = std::fs::read(workload()).unwrap();
    let truncated = file("truncated", &elf[..100]);
    let empty = file("empty", b"");
    let magic_only = file("magic-only", b"\x7fELF");
    let cases: Vec<(String, String)> = vec![
        (
            "/etc".into(),
            "/etc is a directory, not an executable or library".into(),
        ),
        (
            "/dev/null".into(),
            "/dev/null is a character device, not an executable or library".into(),
        ),
        (
            "/etc/passwd".into(),
            "/etc/passwd is not an ELF file".into(),
        ),
        (
            script.clone(),
            format!("{script} is not an ELF file (it is a script: trace its interpreter)"),
        ),
        (
            elf32.clone(),
            format!("{elf32} is a 32-bit ELF file; only 64-bit binaries can be traced"),
        ),
        (
            empty.clone(),
            format!("{empty} is an empty file, not an ELF file"),
        ),
        (
            magic_only.clone(),
            format!("{magic_only} is a truncated or corrupt ELF file (no valid ELF class)"),
        ),
        (
            "/no/such/dir/x".into(),
            "/no/such/dir/x: no such file".into(),
        ),
        (
            "/etc/passwd/x".into(),
            "/etc/passwd/x: a component of the path is not a directory".into(),
        ),
    ];
    for (path, why) in &cases {
        for spec in [format!("{path}:foo"), format!("u:{path}:probe")] {
            fails_with(&[&spec], &format!("probe \"{spec}\": {why}"));
        }
    }
    // A truncated ELF file: the header parses, the tables it points to are missing.
    for spec in [format!("{truncated}:foo"), format!("u:{truncated}:probe")] {
        let out = run(&funccount(), &[&spec], T);
        assert_eq!(out.code(), 1);
        assert_starts_with(&out.stderr, &format!(
                "funccount: error: probe \"{spec}\": {truncated} is a truncated or corrupt ELF file ("
            ));
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    }
}

#[test]
fn unreadable_paths_are_shown_escaped_and_short() {
    // A 5,000-byte path: one line, its start and its length.
    let long = format!("/tmp/{}", "x".repeat(4995));
    let spec = format!("{long}:foo");
    let short = format!("{}... (5000 bytes)", &long[..80]);
    fails_with(
        &[&spec],
        &format!(
            "probe \"{}... (5004 bytes)\": {short}: file name too long",
            &spec[..80]
        ),
    );
    // Control bytes (a terminal escape, a newline) are escaped, never echoed raw.
    fails_with(
        &["/tmp/a\x1b[31mb\nc:foo"],
        "probe \"/tmp/a\\x1b[31mb\\x0ac:foo\": /tmp/a\\x1b[31mb\\x0ac: no such file",
    );
}

#[test]
fn fifo_as_the_binary_fails_at_once() {
    let dir = Scratch::new();
    let fifo = dir.0.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid path string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let p = fifo.display();
    for spec in [format!("{p}:foo"), format!("u:{p}:probe")] {
        let start = std::time::Instant::now();
        let out = run(&funccount(), &[&spec], Duration::from_secs(20));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        assert_eq!(out.code(), 1);
        assert_eq!(
            out.stderr,
            format!(
                "funccount: error: probe \"{spec}\": {p} is a FIFO (named pipe), not an executable or library\n"
            )
        );
    }
}

/// The libc this test process runs with, from its own memory map.
fn own_libc() -> PathBuf {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .map(PathBuf::from)
        .expect("libc in /proc/self/maps")
}

#[test]
fn one_file_by_two_paths_is_one_probe() {
    let dir = Scratch::new();
    let link = dir.0.join("libc-link.so");
    std::os::unix::fs::symlink(own_libc(), &link).unwrap();
    let spec = format!("{}:malloc", link.display());
    let out = trace_workload(&funccount(), libc_workload(), &["c:malloc", &spec], T);
    assert_eq!(last_table(&out.stdout), rows(&[("malloc", LIBC_N)]));
}
