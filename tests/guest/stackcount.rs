//! stackcount's kernel stacks: the caller of vfs_read, and a raw tracepoint's
//! stacks beginning where it fired.

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
