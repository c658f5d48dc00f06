//! trace on kernel functions: arguments by BTF name and member paths, retval,
//! -B on kernel bytes, predicates and gates decided in the kernel, -K stacks,
//! and a glob in one link.

use std::path::PathBuf;

use crate::util::*;
use crate::{assert_nothing_left, expect_kprobe_multi, T};

pub(crate) fn trace_tool() -> PathBuf {
    tool("trace")
}

/// Runs `trace -p PID args` on `traced write N` (write(2) of 100 + i bytes to
/// /dev/null for i in 0..N) and returns its output; the messages are the text after
/// BCC's PID/TID/COMM/FUNC columns, as (func, message).
fn trace_writes(n: u64, args: &[&str]) -> (Output, Vec<(String, String)>) {
    let w = Workload::start(&prog("traced"), &["write", &n.to_string()]);
    let pid = w.pid.to_string();
    let mut all = vec!["-p", pid.as_str()];
    all.extend_from_slice(args);
    let mut t = spawn(&trace_tool(), &all);
    t.wait_line(|l| l.starts_with("PID "), T);
    let out = t.finish_after(w, T);
    let events = out
        .stdout
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty() && !l.starts_with(' '))
        .map(|l| {
            let func = l.split_whitespace().nth(3).unwrap_or_default().to_string();
            (func, l.get(49..).unwrap_or_default().to_string())
        })
        .collect();
    (out, events)
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn trace_kernel_arguments_by_btf_name_members_and_retval() {
    // vfs_write(file, buf, count, pos): count by its BTF name, the file's name
    // through a member path, and in the return probe both retval and the entry's
    // count; the syscall wrapper's arguments are read through its inner pt_regs.
    let (out, ev) = trace_writes(
        20,
        &[
            "p::__x64_sys_write \"w %d\", arg3",
            "p::vfs_write \"%d %s\", count, file->f_path.dentry->d_name.name",
            "r::vfs_write \"ret %d cnt %d\", retval, count",
        ],
    );
    let want: Vec<(String, String)> = (100..120)
        .flat_map(|n| {
            [
                ("__x64_sys_write".to_string(), format!("w {n}")),
                ("vfs_write".to_string(), format!("{n} null")),
                ("vfs_write".to_string(), format!("ret {n} cnt {n}")),
            ]
        })
        .collect();
    assert_eq!(ev, want, "{}", out.stdout);
    // A struct's bytes are not a string (BCC prints them as such).
    let spec = "p::vfs_write \"%s\", file";
    crate::util::fails_with(
        &trace_tool(),
        &[spec],
        &format!(
            "bad probe \"{spec}\": vfs_write: 'file' points to a struct file, not to a \
             string: print one of its fields"
        ),
    );
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn trace_kernel_bin_cmp_reads_kernel_bytes() {
    // -B: the file's name ("null") read as bytes from kernel memory; a literal
    // one byte short of it ("nul", NUL) matches nothing.
    let name = "file->f_path.dentry->d_name.name";
    let (out, ev) = trace_writes(
        3,
        &[
            "-B",
            &format!(
                "p::vfs_write (STRCMP(\"{{0x6e, 0x75, 0x6c, 0x6c, 0}}\", {name})) \"%d\", count"
            ),
            &format!(
                "p::vfs_write (STRCMP(\"{{0x6e, 0x75, 0x6c, 0}}\", {name})) \"nul %d\", count"
            ),
        ],
    );
    let want: Vec<(String, String)> = (100..103)
        .map(|n| ("vfs_write".to_string(), n.to_string()))
        .collect();
    assert_eq!(ev, want, "{}", out.stdout);
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn trace_kernel_predicate_filters_in_the_kernel_with_stacks() {
    // 2 of 10 writes pass; the 8 others are dropped before the ring buffer: -v
    // counts the records user space received, not only the lines printed.
    let (out, ev) = trace_writes(
        10,
        &[
            "-v",
            "-K",
            "p::vfs_write (count == 102 || count == 107) \"%d\", count",
        ],
    );
    assert_eq!(
        ev,
        [
            ("vfs_write".to_string(), "102".to_string()),
            ("vfs_write".to_string(), "107".to_string())
        ],
        "{}",
        out.stdout
    );
    assert_eq!(trace_records(&out.stderr), 2, "{}", out.stderr);
    assert_contains(
        &out.stderr,
        ": 10 hits, 8 dropped by the predicate in the kernel",
    );
    // -K: each event's kernel stack, from the probed function to the syscall entry.
    let stack: Vec<&str> = out
        .stdout
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with("        "))
        .map(str::trim)
        .collect();
    assert!(stack[0].starts_with("vfs_write+0x"), "{}", out.stdout);
    assert!(stack[1].starts_with("ksys_write+0x"), "{}", out.stdout);
    assert!(
        stack.iter().all(|f| f.ends_with(" [kernel]")),
        "{}",
        out.stdout
    );
    assert_nothing_left("trace");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn trace_kernel_gate_on_a_btf_argument_and_on_retval() {
    // A lone predicate on one register is decided before anything else is read
    // (set before load: each kernel's verifier must take the program so), at the
    // entry on count, at the return on retval; other processes' writes are not
    // counted as dropped.
    let gate = "    gate: decided on its register before anything else is read";
    for (spec, want, dropped) in [
        (
            "p::vfs_write (count % 2 == 1) \"%d\", count",
            &[101, 103, 105, 107, 109][..],
            5,
        ),
        (
            "r::vfs_write (retval > 107) \"%d\", count",
            &[108, 109][..],
            8,
        ),
    ] {
        let (out, ev) = trace_writes(10, &["-v", spec]);
        assert!(out.stderr.lines().any(|l| l == gate), "{}", out.stderr);
        let want: Vec<(String, String)> = want
            .iter()
            .map(|n| ("vfs_write".to_string(), n.to_string()))
            .collect();
        assert_eq!(ev, want, "{spec}: {}", out.stdout);
        assert_eq!(
            trace_records(&out.stderr),
            want.len() as u64,
            "{}",
            out.stderr
        );
        let counts = format!(": 10 hits, {dropped} dropped by the predicate in the kernel");
        assert!(out.stderr.contains(&counts), "{spec}: {}", out.stderr);
    }
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn trace_kernel_glob_in_one_link() {
    // 'p::vfs_*' matches dozens of functions: one kprobe_multi link where the
    // kernel has it, else one kprobe each; every write is seen once, in vfs_write.
    let (out, ev) = trace_writes(5, &["-v", "p::vfs_* \"%d\", arg3"]);
    let writes: Vec<&(String, String)> = ev.iter().filter(|e| e.0 == "vfs_write").collect();
    let want: Vec<String> = (100..105).map(|n| n.to_string()).collect();
    assert_eq!(
        writes.iter().map(|e| e.1.clone()).collect::<Vec<_>>(),
        want,
        "{}",
        out.stdout
    );
    let attached = attached_line(&out.stderr);
    let probes: usize = attached
        .strip_prefix("attached: ")
        .and_then(|r| r.split(' ').next()?.parse().ok())
        .unwrap();
    assert!(probes > 30, "{attached}");
    if expect_kprobe_multi() {
        assert!(
            attached.contains(" probes, 1 links (1 kprobe_multi, 0 uprobe_multi)"),
            "{attached}"
        );
    } else {
        assert!(
            attached.contains(&format!(" probes, {probes} links (0 kprobe_multi")),
            "{attached}"
        );
    }
}
