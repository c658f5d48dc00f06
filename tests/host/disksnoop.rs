//! disksnoop on the host: O_DIRECT requests of known count and size to a loop
//! device, each reported once with the right type and size, by every program set
//! this kernel accepts (tp_btf and raw_tp need kernel memory reads, which
//! lockdown=confidentiality refuses; classic tracepoints always work).

use std::path::PathBuf;
use std::time::Duration;

use crate::util::*;

const T: Duration = Duration::from_secs(120);
/// The requests the workload makes: 37 writes of 8 KiB, then 13 reads of 4 KiB.
const OPS: [&str; 2] = ["w:37:8192", "r:13:4096"];

fn disksnoop() -> PathBuf {
    tool("disksnoop")
}

/// (type, bytes, latency in ms) of each text row after the header.
fn rows_of(stdout: &str) -> Vec<(String, u64, f64)> {
    let mut lines = stdout.lines();
    let header = lines.next().expect("header");
    assert_eq!(header, "TIME(s)            T  BYTES    LAT(ms)");
    lines
        .map(|l| {
            // "%-18.9f %-2s %-7s %8.2f", as BCC prints.
            assert!(l.len() >= 38, "short row {l:?}");
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "row {l:?}");
            let secs: f64 = f[0].parse().unwrap();
            assert!(secs > 0.0);
            assert_eq!(f[0].split_once('.').unwrap().1.len(), 9, "{l:?}");
            (
                f[1].to_string(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect()
}

/// The rows the workload's requests must give, in order.
fn expected() -> Vec<(String, u64)> {
    let mut v = vec![("W".to_string(), 8192); 37];
    v.extend(vec![("R".to_string(), 4096); 13]);
    v
}

/// disksnoop (with `env` settings) -d LOOP -p WORKLOAD `args` over the workload.
fn snoop(env: &[&str], args: &[&str]) -> (Output, LoopDev, u32) {
    snoop_disk(|lo| lo.name().to_string(), env, args)
}

/// [`snoop`] with the loop device given to -d as `disk` names it.
fn snoop_disk(
    disk: impl Fn(&LoopDev) -> String,
    env: &[&str],
    args: &[&str],
) -> (Output, LoopDev, u32) {
    let lo = LoopDev::new(16);
    let disk = disk(&lo);
    let w = Workload::start(&prog("direct_io"), &[&lo.dev, OPS[0], OPS[1]]);
    let pid = w.pid;
    let bin = disksnoop();
    let mut cmd = vec!["env"];
    cmd.extend_from_slice(env);
    cmd.push(bin.to_str().unwrap());
    let mut all = vec!["-d", disk.as_str()];
    all.extend_from_slice(args);
    let out = trace_workload_until(&cmd, w, &all, header_or_tracing, T);
    (out, lo, pid)
}

#[test]
fn direct_io_requests_exactly() {
    let (out, _lo, _) = snoop(&[], &[]);
    let rows = rows_of(&out.stdout);
    let got: Vec<(String, u64)> = rows.iter().map(|(t, b, _)| (t.clone(), *b)).collect();
    assert_eq!(got, expected(), "stdout:\n{}", out.stdout);
    for (_, _, lat) in &rows {
        assert!(*lat >= 0.0 && *lat < 10_000.0, "latency {lat} ms");
    }
}

/// JSON, one object per request: exact sizes, sectors, issuer and positive latency.
fn check_json(out: &Output, disk: &str, pid: u32) {
    let recs = json_lines(&out.stdout);
    let got = disksnoop_sizes(&recs);
    assert_eq!(got, expected(), "stdout:\n{}", out.stdout);
    let mut sector = 0;
    for r in &recs {
        assert_eq!(r["disk"], disk);
        assert_eq!(r["pid"], pid, "{r}");
        assert_eq!(r["comm"], "direct_io");
        assert_eq!(r["sector"], sector, "{r}");
        sector += r["bytes"].as_u64().unwrap() / 512;
        let ns = r["lat_ns"].as_u64().unwrap();
        assert!(ns > 0 && ns < 10_000_000_000, "latency {ns} ns");
        assert!(r["unix_time"].as_f64().unwrap() > 1.6e9);
    }
}

#[test]
fn json_has_issuer_disk_sector_and_latency() {
    let (out, lo, pid) = snoop(&[], &["--json", "--debug"]);
    check_json(&out, lo.name(), pid);
    assert_contains(&out.stderr, "block requests: ");
}

/// Whether this kernel accepts a program set (lockdown=confidentiality refuses
/// tp_btf and raw_tp; classic tracepoints must always work).
fn works_here(variant: &str) -> bool {
    let var = format!("TRACEKIT_PROGRAMS={variant}");
    let out = run(
        std::path::Path::new("env"),
        &[&var, disksnoop().to_str().unwrap(), "--duration", "0.1"],
        T,
    );
    out.code() == 0
}

#[test]
fn every_program_set_gives_the_same_lines() {
    for variant in ["tp_btf", "raw_tp", "tracepoint"] {
        if variant != "tracepoint" && !works_here(variant) {
            eprintln!("{variant}: not available on this kernel, skipped");
            continue;
        }
        let var = format!("TRACEKIT_PROGRAMS={variant}");
        let (out, lo, pid) = snoop(&[&var], &["--json", "--debug"]);
        check_json(&out, lo.name(), pid);
        assert_contains(&out.stderr, &format!("block requests: {variant} ("));
        let approximate = out.stderr.contains("paired by (device, sector)");
        assert_eq!(approximate, variant == "tracepoint", "{}", out.stderr);
        // The note is said once.
        assert!(out.stderr.matches("approximate").count() <= 1);
    }
}

/// A request the device completes in parts is one line with its full size: a
/// loop device doing direct I/O on a file cut short after setup reads the part
/// before the end (block_rq_complete for 2 KiB), puts the rest back on the queue
/// (block_rq_requeue), issues it again, and fails it (block_rq_complete for the
/// remaining 6 KiB).
#[test]
fn partial_completion_is_one_request_with_its_full_size() {
    for variant in ["tp_btf", "raw_tp", "tracepoint"] {
        if variant != "tracepoint" && !works_here(variant) {
            continue;
        }
        let lo = LoopDev::with_flags(16, &["--direct-io=on"]);
        let dio = std::fs::read_to_string(format!("/sys/block/{}/loop/dio", lo.name()))
            .unwrap_or_default();
        if dio.trim() != "1" {
            eprintln!(
                "{}: the backing file system has no direct I/O, skipped",
                lo.dev
            );
            return;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&lo.file)
            .unwrap()
            .set_len((8 << 20) + 2048)
            .unwrap();
        let w = Workload::start(
            &prog("direct_io"),
            &[&lo.dev, "R:1:8192@8388608", "r:2:4096@0"],
        );
        let bin = disksnoop();
        let var = format!("TRACEKIT_PROGRAMS={variant}");
        let out = trace_workload_until(
            &["env", &var, bin.to_str().unwrap()],
            w,
            &["-d", lo.name(), "-w"],
            header_or_tracing,
            T,
        );
        let rows: Vec<(String, String, String)> = out
            .stdout
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[4].to_string(), f[5].to_string(), f[6].to_string())
            })
            .collect();
        let want = [
            ("R", "16384", "8192"),
            ("R", "0", "4096"),
            ("R", "8", "4096"),
        ]
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
        assert_eq!(rows, want, "{variant}: stdout:\n{}", out.stdout);
    }
}

#[test]
fn wide_columns() {
    let (out, lo, pid) = snoop(&[], &["-w"]);
    let mut lines = out.stdout.lines();
    assert_eq!(
        lines.next().unwrap(),
        "TIME(s)            COMM             PID     DISK    T  SECTOR     BYTES    LAT(ms)"
    );
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(rows.len(), 50);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[1], "direct_io");
        assert_eq!(r[2], pid.to_string());
        assert_eq!(r[3], lo.name());
        let (t, bytes, sector) = if i < 37 {
            ("W", 8192, i * 16)
        } else {
            ("R", 4096, 37 * 16 + (i - 37) * 8)
        };
        assert_eq!(r[4], t);
        assert_eq!(r[5], sector.to_string());
        assert_eq!(r[6], bytes.to_string());
    }
}

#[test]
fn wall_clock_times() {
    let (out, _lo, _) = snoop(&[], &["-T"]);
    let mut lines = out.stdout.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("TIME               T  BYTES"));
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 50);
    for r in rows {
        let t = r.split_whitespace().next().unwrap();
        // HH:MM:SS.micros
        assert_eq!(t.len(), 15, "{r}");
        assert_eq!(&t[2..3], ":");
        assert_eq!(&t[8..9], ".");
    }
}

/// How a test names its loop device to -d.
type DiskForm<'a> = Box<dyn Fn(&LoopDev) -> String + 'a>;

#[test]
fn disks_are_given_by_number_and_by_path() {
    // Sweep bug 16: -d took only names ("no disk named '7:0'"). A disk's
    // MAJOR:MINOR, a path with .. in it and a symlink to its node (as
    // /dev/disk/by-id/ holds) all give exactly the workload's requests.
    let links = Scratch::new();
    let forms: [(&str, DiskForm); 3] = [
        (
            "MAJOR:MINOR",
            Box::new(|lo| {
                std::fs::read_to_string(format!("/sys/class/block/{}/dev", lo.name()))
                    .unwrap()
                    .trim()
                    .to_string()
            }),
        ),
        ("..", Box::new(|lo| format!("/dev/../dev/{}", lo.name()))),
        (
            "symlink",
            Box::new(|lo| {
                let link = links.0.join(format!("by-id-{}", lo.name()));
                std::os::unix::fs::symlink(&lo.dev, &link).unwrap();
                link.to_str().unwrap().to_string()
            }),
        ),
    ];
    for (form, disk) in forms {
        let (out, _lo, _) = snoop_disk(disk, &[], &[]);
        let rows = rows_of(&out.stdout);
        let got: Vec<(String, u64)> = rows.iter().map(|(t, b, _)| (t.clone(), *b)).collect();
        assert_eq!(got, expected(), "{form}: {}", out.stderr);
    }
    // Numbers and paths that are no disk: one line each (the list of disks
    // may change while other tests make loop devices).
    let out = run(&disksnoop(), &["-d", "4095:1048575"], T);
    assert_eq!(
        (out.code(), out.stderr.lines().count()),
        (1, 1),
        "{}",
        out.stderr
    );
    assert_starts_with(
        &out.stderr,
        "disksnoop: error: no block device 4095:1048575 (disks: ",
    );
    fails_with(
        &disksnoop(),
        &["-d", "/etc/passwd"],
        "-d '/etc/passwd' is not a block device; give a disk's name, MAJOR:MINOR or device node",
    );
}

#[test]
fn bad_disk_names_are_one_line_errors() {
    for bad in ["nosuchdisk", "/dev/nosuchdisk", "../vda", ""] {
        let out = run(&disksnoop(), &["-d", bad], T);
        assert_eq!(out.code(), 1, "{bad}: {}", out.stderr);
        assert_eq!(out.stdout, "");
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
        assert_starts_with(
            &out.stderr,
            &format!("disksnoop: error: no disk named '{bad}' (disks: "),
        );
    }
}

#[test]
fn bad_flags_are_one_line_errors() {
    fails_with(
        &disksnoop(),
        &["--attach-mode", "single"],
        "--attach-mode is for tools that trace patterns of functions; this tool picks its programs itself (--debug shows them)",
    );
    let out = run(&disksnoop(), &["--duration", "0"], T);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    let out = run(
        std::path::Path::new("env"),
        &["TRACEKIT_RING_BYTES=1000", disksnoop().to_str().unwrap()],
        T,
    );
    assert_eq!(out.code(), 1);
    assert_eq!(
        out.stderr,
        "disksnoop: error: TRACEKIT_RING_BYTES=1000: the ring buffer size must be a power of two of at least 4096 bytes\n"
    );
}

#[test]
fn duration_and_signals_end_the_run_cleanly() {
    let out = run(&disksnoop(), &["--duration", "0.3"], T);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("TIME(s)"));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let mut t = spawn(&disksnoop(), &[]);
        t.wait_line(header_or_tracing, Duration::from_secs(60));
        t.signal(sig);
        let out = t.finish(T);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
}
