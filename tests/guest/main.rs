//! Kernel-function tests. The host kernel cannot trace kernel functions, so these
//! are ignored there; `cargo xtask test` boots Debian 6.12 and 6.1 kernels under qemu
//! and runs this binary (`guest`) inside each with `--ignored`. A module per tool,
//! and one for the attach machinery they share; here, the checks every module
//! makes of the guest kernel (what it has, and that nothing is left behind).

// The guest runs only kernel-function tests, which use a part of the helpers
// (no C programs built at test time, loop devices, uprobe events or code
// checks): the rest is for the host tests, where all of util is used.
#[allow(dead_code)]
#[path = "../util/mod.rs"]
mod util;

// funccount: vfs_read counts, thousands of functions, leftovers, errors.
mod funccount;
// stackcount: kernel stacks at a function and at a raw tracepoint.
mod stackcount;
// funclatency and vfsreadlat: kernel functions timed by every mechanism.
mod funclatency;
// disksnoop: the guest's virtio disk, request by request.
mod disksnoop;
// urandomread: device reads and getrandom() calls.
mod urandomread;
// trace: kernel functions by BTF names, members, predicates, stacks, globs.
mod trace;
// The kernel function table cache.
mod cache;
// Every example of the man pages, as written.
mod examples;
// Attach machinery the tools share: the cgroup filter in every kernel program,
// older kernels' uprobe groups and raw syscall links, compat syscalls.
mod attach;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use util::*;

const T: Duration = Duration::from_secs(300);

/// Whether this guest kernel has kprobe_multi (CONFIG_FPROBE), as the guest runner
/// read it from the kernel's config: tests assert the path the kernel should take.
fn expect_kprobe_multi() -> bool {
    match std::env::var("TRACEKIT_EXPECT_KPROBE_MULTI").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => panic!("run these tests in a guest kernel: cargo xtask guest"),
    }
}

/// A file in the guest's tmpfs for the workload to read.
fn data_file(dir: &Scratch) -> PathBuf {
    let f = dir.0.join("data");
    std::fs::write(&f, vec![b'x'; 4096]).unwrap();
    f
}

/// The workload reading a file of the guest's tmpfs (made in `dir`) `n` times,
/// `extra` after: the vfs_read calls the guest tests count and time.
fn read_data(dir: &Scratch, n: u64, extra: &[&str]) -> Workload {
    let file = data_file(dir);
    let n = n.to_string();
    let mut args = vec!["read", n.as_str(), file.to_str().unwrap()];
    args.extend_from_slice(extra);
    Workload::start(&prog("workload"), &args)
}

/// The type (`BPF_LINK_TYPE_*`) of every BPF link in the system. Only the type is
/// asked for, which every kernel fills (fuller queries fail on older kernels).
fn bpf_link_types() -> Vec<u32> {
    use libbpf_sys as sys;
    let mut types = Vec::new();
    let mut id = 0u32;
    // SAFETY: plain bpf(2) wrappers with valid out-pointers; fds are closed here.
    unsafe {
        while sys::bpf_link_get_next_id(id, &mut id) == 0 {
            let fd = sys::bpf_link_get_fd_by_id(id);
            if fd < 0 {
                continue; // gone meanwhile
            }
            let mut info: sys::bpf_link_info = std::mem::zeroed();
            let mut len = std::mem::size_of_val(&info.type_) as u32 + 8; // type, id, prog_id
            if sys::bpf_link_get_info_by_fd(fd, &mut info, &mut len) == 0 {
                types.push(info.type_);
            }
            libc::close(fd);
        }
    }
    types
}

/// (all BPF links, kprobe_multi links) in the system right now.
fn bpf_links() -> (usize, usize) {
    let types = bpf_link_types();
    let multi = types
        .iter()
        .filter(|t| **t == libbpf_sys::BPF_LINK_TYPE_KPROBE_MULTI)
        .count();
    (types.len(), multi)
}

fn tracefs_file(name: &str) -> String {
    std::fs::read_to_string(tracefs().join(name)).unwrap_or_default()
}

/// Waits until no BPF link, no kprobe event and no ftrace-enabled function is left.
fn assert_nothing_left(what: &str) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let links = bpf_links().0;
        let kprobes = tracefs_file("kprobe_events");
        let enabled = tracefs_file("enabled_functions");
        if links == 0 && kprobes.trim().is_empty() && enabled.trim().is_empty() {
            return;
        }
        if Instant::now() > end {
            panic!(
                "after {what}: {links} BPF links, kprobe_events {:?}, enabled_functions: {} lines",
                kprobes,
                enabled.lines().count()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `tool` run with `env` settings (`VAR=value`) on workload `w`, as [`trace_workload_until`].
fn trace_with_env(tool: &str, env: &[&str], w: Workload, args: &[&str]) -> Output {
    let bin = util::tool(tool);
    let mut cmd = vec!["env"];
    cmd.extend_from_slice(env);
    cmd.push(bin.to_str().unwrap());
    trace_workload_until(&cmd, w, args, header_or_tracing, T)
}
