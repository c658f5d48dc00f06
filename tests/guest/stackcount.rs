//! stackcount's kernel stacks: the caller of vfs_read, and a raw tracepoint's
//! stacks beginning where it fired.

use crate::util::pprof::*;
use crate::util::*;
use crate::{assert_nothing_left, read_data, T};

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn stackcount_shows_the_caller_of_vfs_read() {
    let dir = Scratch::new();
    let w = read_data(&dir, 700, &[]);
    let out = trace_workload(&tool("stackcount"), w, &["-K", "vfs_read"], T);
    let stacks = parse_stacks(&out.stdout);
    assert_eq!(stacks.len(), 1, "{}", out.stdout);
    let (frames, count) = &stacks[0];
    assert_eq!(*count, 700, "{}", out.stdout);
    assert_eq!(frames[0], "vfs_read", "{frames:?}");
    // pread(2) reaches vfs_read through ksys_pread64 (inlined into the syscall
    // wrapper on some builds).
    assert!(
        ["ksys_pread64", "__x64_sys_pread64"].contains(&frames[1].as_str()),
        "caller of vfs_read: {frames:?}"
    );
    let names = kernel_symbols();
    for f in frames {
        assert!(names.contains(f), "{f} is not a kernel symbol");
    }
    assert_nothing_left("stackcount");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn stackcount_raw_tracepoint_stacks_begin_where_it_fired() {
    // A raw tracepoint link on every kernel (6.1: without a cookie), whose
    // program's own frames (and those of the kernel code running it, which
    // differ between kernels) are left out of its stacks.
    let w = Workload::start(&prog("workload"), &["rename", "60"]);
    let out = trace_workload(
        &tool("stackcount"),
        w,
        &["--debug", "-K", "t:task:task_rename"],
        T,
    );
    let frames = rename_stack(&out, 60);
    let names = kernel_symbols();
    for f in &frames {
        assert!(names.contains(f), "{f} is not a kernel symbol");
    }
    assert_nothing_left("stackcount");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn user_stacks_of_a_kernel_function_are_whole_without_frame_pointers() {
    // The guest's Debian python3, built without frame pointers, reads /dev/zero
    // 300 times: at vfs_read, the user part of the stack (from the registers
    // saved at kernel entry) is walked by python3's and libc's unwind tables
    // down to _start, in stackcount and in trace.
    let script = "import os,sys\nfd = os.open('/dev/zero', os.O_RDONLY)\nsys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()\nfor i in range(300): os.read(fd, 1)\n";
    let out = trace_cprog(
        &tool("stackcount"),
        std::path::Path::new("/usr/bin/python3"),
        &["-c", script],
        &["-U", "vfs_read"],
        |l| l.starts_with("Tracing"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let stacks = parse_stacks(&out.stdout);
    assert_eq!(
        stacks.iter().map(|s| s.1).sum::<u64>(),
        300,
        "{}",
        out.stdout
    );
    for (frames, _) in &stacks {
        for f in [
            "read",
            "_PyEval_EvalFrameDefault",
            "Py_BytesMain",
            "__libc_start_call_main",
        ] {
            assert!(frames.iter().any(|x| x == f), "no {f}: {frames:?}");
        }
        assert_eq!(
            frames.last().map(String::as_str),
            Some("_start"),
            "{frames:?}"
        );
    }
    let out = trace_cprog(
        &tool("trace"),
        std::path::Path::new("/usr/bin/python3"),
        &["-c", script],
        &["-U", "-M", "1", "vfs_read"],
        |l| l.starts_with("PID"),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let frames: Vec<&str> = out.stdout.lines().skip(2).map(str::trim).collect();
    assert!(
        frames.iter().any(|f| f.starts_with("Py_BytesMain+")),
        "{}",
        out.stdout
    );
    assert!(
        frames.iter().any(|f| f.starts_with("_start+")),
        "{}",
        out.stdout
    );
    assert_nothing_left("stackcount");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn a_pprof_profile_of_kernel_stacks_reads_back_in_go_tool_pprof() {
    // 700 vfs_read calls through pread(2): one stack of 700 in go tool pprof
    // (Debian's golang-go, from the host root the guest runs on), its
    // frames in the [kernel.kallsyms] mapping.
    let dir = Scratch::new();
    let file = dir.0.join("vfs.pb.gz");
    let w = read_data(&dir, 700, &[]);
    let out = trace_workload(
        &tool("stackcount"),
        w,
        &["-K", "--pprof", file.to_str().unwrap(), "vfs_read"],
        T,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let traces = go_pprof(&["-traces"], &file);
    let lines: Vec<&str> = traces.lines().map(str::trim).collect();
    let at = lines
        .iter()
        .position(|l| l.split_whitespace().collect::<Vec<_>>() == ["700", "vfs_read"])
        .unwrap_or_else(|| panic!("no stack of 700 at vfs_read:\n{traces}"));
    assert!(
        ["ksys_pread64", "__x64_sys_pread64"].contains(&lines[at + 1]),
        "caller of vfs_read:\n{traces}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("-----------+"))
            .count(),
        2,
        "one stack:\n{traces}"
    );
    let raw = go_pprof(&["-raw"], &file);
    assert!(raw.contains("[kernel.kallsyms]"), "{raw}");
    assert_nothing_left("stackcount");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn a_pprof_profile_of_two_kernel_functions_labels_each_sample_with_its_probe() {
    // 700 preads: each enters __x64_sys_pread64 and vfs_read. Every sample
    // has its function as its probe label, whether the kprobes are one
    // kprobe_multi link (auto, where the kernel has them) or a kprobe each
    // (both carry the probe's cookie).
    for mode in ["auto", "single"] {
        let dir = Scratch::new();
        let file = dir.0.join("two.pb.gz");
        let w = read_data(&dir, 700, &[]);
        let args = [
            "-K",
            "--attach-mode",
            mode,
            "--pprof",
            file.to_str().unwrap(),
            "vfs_read",
            "__x64_sys_pread64",
        ];
        let out = trace_workload(&tool("stackcount"), w, &args, T);
        assert_eq!(out.code(), 0, "{mode}: {}", out.stderr);
        let text = go_pprof(&["-traces"], &file);
        let want = probe_stacks(&[
            ("__x64_sys_pread64", 700, "__x64_sys_pread64"),
            ("vfs_read", 700, "vfs_read"),
        ]);
        assert_eq!(by_probe(&text, 0), want, "{mode}: {text}");
        assert_nothing_left("stackcount");
    }
}
