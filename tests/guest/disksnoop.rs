//! disksnoop on the guest's virtio disk: each request once, exactly, by every
//! program set.

use crate::util::*;
use crate::{assert_nothing_left, trace_with_env};

/// The guest's scratch virtio disk (`vda`), attached by the guest runner.
fn guest_disk() -> String {
    std::env::var("TRACEKIT_GUEST_DISK")
        .unwrap_or_else(|_| panic!("no scratch disk: run in a guest kernel (cargo xtask guest)"))
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn disksnoop_virtio_disk_exactly_by_request() {
    let disk = guest_disk();
    let dev = format!("/dev/{disk}");
    // Auto picks tp_btf (keyed by request) in these kernels; the fallbacks are
    // checked to give the same lines.
    for variant in ["", "raw_tp", "tracepoint"] {
        let w = Workload::start(&prog("direct_io"), &[&dev, "w:37:8192", "r:13:4096"]);
        let pid = w.pid;
        let env = format!("TRACEKIT_PROGRAMS={variant}");
        let env: Vec<&str> = if variant.is_empty() {
            vec![]
        } else {
            vec![&env]
        };
        let out = trace_with_env("disksnoop", &env, w, &["-d", &disk, "--json", "--debug"]);
        let recs = json_lines(&out.stdout);
        let got = disksnoop_sizes(&recs);
        let mut want = vec![("W".to_string(), 8192); 37];
        want.extend(vec![("R".to_string(), 4096); 13]);
        assert_eq!(
            got, want,
            "{variant}: stdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        );
        let mut sector = 0;
        for r in &recs {
            assert_eq!(r["disk"], disk.as_str());
            assert_eq!(r["pid"], pid, "{r}");
            assert_eq!(r["comm"], "direct_io");
            assert_eq!(r["sector"], sector);
            sector += r["bytes"].as_u64().unwrap() / 512;
            assert!(r["lat_ns"].as_u64().unwrap() > 0);
        }
        let expect = if variant.is_empty() {
            "tp_btf"
        } else {
            variant
        };
        assert_contains(&out.stderr, &format!("block requests: {expect} ("));
        assert_eq!(
            out.stderr.contains("paired by (device, sector)"),
            expect == "tracepoint",
            "{}",
            out.stderr
        );
    }
    assert_nothing_left("disksnoop");
}
