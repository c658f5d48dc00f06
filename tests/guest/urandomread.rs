//! urandomread in the guest: /dev/urandom and /dev/random reads (kernel
//! functions) and getrandom() calls, exactly, through fexit and kretprobe.

use crate::util::*;
use crate::{assert_nothing_left, trace_with_env};

/// urandomread on workload `random OPS...`: (source, bits) of every line.
fn random_reads(env: &[&str], ops: &[&str]) -> (Vec<(String, u64)>, Output) {
    let w = Workload::start(&prog("random"), ops);
    let pid = w.pid;
    let out = trace_with_env("urandomread", env, w, &["--json", "--debug"]);
    let rows = out
        .stdout
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(r["pid"], pid);
            assert_eq!(r["comm"], "random");
            (
                r["source"].as_str().unwrap().to_string(),
                r["bits"].as_u64().unwrap(),
            )
        })
        .collect();
    (rows, out)
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn urandomread_device_reads_and_getrandom_exactly() {
    // 23 reads of /dev/urandom, 5 of /dev/random, 11 getrandom() calls, in order.
    let mut want = vec![("urandom".to_string(), 64 * 8); 23];
    want.extend(vec![("random".to_string(), 16 * 8); 5]);
    want.extend(vec![("getrandom".to_string(), 32 * 8); 11]);
    // fexit where tracing programs are allowed (these kernels), and kretprobe.
    for (env, via) in [
        ("", "fexit"),
        (
            "TRACEKIT_PROGRAMS=kretprobe,tracepoint syscalls:sys_exit_getrandom",
            "kretprobe",
        ),
    ] {
        let env: Vec<&str> = if env.is_empty() { vec![] } else { vec![env] };
        let (rows, out) = random_reads(&env, &["urandom:23:64", "random:5:16", "getrandom:11:32"]);
        assert_eq!(rows, want, "{via}: stderr:\n{}", out.stderr);
        assert_contains(
            &out.stderr,
            &format!("reads of /dev/urandom and /dev/random: {via} ("),
        );
        assert!(!out.stderr.contains("are not traced"), "{}", out.stderr);
    }
    assert_nothing_left("urandomread");
}
