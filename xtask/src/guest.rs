//! Boots real Debian kernels under qemu (TCG) and runs the kernel-function tests
//! inside them. The host root is shared read-only over 9p, so the binaries built on
//! the host run unchanged in the guest; the guest gets a tmpfs /tmp.
//!
//! Kernels are fetched with `apt-get download` and unpacked with `dpkg-deb -x` into
//! target/guest/ (cached). The initramfs holds busybox, the 9p/virtio modules in
//! dependency order and an init that mounts the host root, chroots and runs a
//! script written to target/guest/. The console is streamed; the verdict line the
//! script prints becomes the result, and a panic, kernel splat, hang or timeout is
//! a failure with the console tail shown.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A kernel to boot: a label and the apt package that names its current version.
pub struct KernelSpec {
    pub label: &'static str,
    /// A meta package depending on the current versioned image package.
    pub meta: &'static str,
}

/// The current 6.12 kernel and bookworm's default 6.1 kernel.
pub const KERNELS: &[KernelSpec] = &[
    KernelSpec {
        label: "6.12",
        meta: "linux-image-6.12-amd64",
    },
    KernelSpec {
        label: "6.1",
        meta: "linux-image-amd64",
    },
];

/// Modules needed to mount the host root over virtio-9p, and virtio_blk for the
/// scratch disk; whichever are built into a kernel are simply not found and skipped.
const ROOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "virtio_blk"];

/// Size of the raw scratch disk each guest gets as a virtio disk (`vda`), for
/// block-device tests (disksnoop); tests find it in $TRACEKIT_GUEST_DISK.
const SCRATCH_DISK_BYTES: u64 = 64 << 20;

const EXIT_MARK: &str = "TRACEKIT-GUEST-EXIT";
const BEGIN_MARK: &str = "TRACEKIT-GUEST-BEGIN";

/// Console lines that mean the kernel is broken, whatever the tests say.
const SPLATS: &[&str] = &[
    "Kernel panic",
    "BUG: ",
    "Oops",
    "general protection fault",
    "soft lockup",
    "hard LOCKUP",
    "detected stall",
    "self-detected stall",
    "WARNING: CPU:",
    "WARNING: suspicious RCU usage",
];

pub struct Kernel {
    pub label: String,
    pub version: String,
    root: PathBuf,
}

impl Kernel {
    fn vmlinuz(&self) -> PathBuf {
        self.root.join(format!("boot/vmlinuz-{}", self.version))
    }

    fn modules(&self) -> PathBuf {
        self.root.join(format!("lib/modules/{}", self.version))
    }

    /// Whether the kernel's config sets `option=y`.
    fn config_has(&self, option: &str) -> bool {
        fs::read_to_string(self.root.join(format!("boot/config-{}", self.version)))
            .is_ok_and(|c| c.lines().any(|l| l == format!("{option}=y")))
    }
}

fn guest_dir() -> PathBuf {
    PathBuf::from("target/guest")
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The versioned image package a meta package currently depends on.
fn resolve_package(meta: &str) -> Result<String> {
    let find = || -> Option<String> {
        let out = Command::new("apt-cache")
            .args(["depends", meta])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let dep = l.trim().strip_prefix("Depends: ")?;
            dep.starts_with("linux-image-").then(|| dep.to_string())
        })
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    // Fresh machines may have no package lists yet.
    output(Command::new("apt-get").args(["update", "-q"]))?;
    find().with_context(|| format!("apt knows no kernel package behind {meta}"))
}

/// Downloads and unpacks a kernel image package (cached under target/guest/).
pub fn fetch(spec: &KernelSpec) -> Result<Kernel> {
    let dir = guest_dir();
    let pkg = match resolve_package(spec.meta) {
        Ok(p) => p,
        Err(e) => {
            // Offline with a cached kernel of this series: use it.
            let cached = cached_package(&dir, spec.label);
            match cached {
                Some(p) => {
                    eprintln!("xtask: {e:#}; using cached {p}");
                    p
                }
                None => return Err(e),
            }
        }
    };
    let root = dir.join(&pkg);
    let version = pkg.trim_start_matches("linux-image-").to_string();
    let kernel = Kernel {
        label: spec.label.to_string(),
        version,
        root: root.clone(),
    };
    if kernel.vmlinuz().exists() && kernel.modules().exists() {
        return Ok(kernel);
    }
    let debs = dir.join("debs");
    fs::create_dir_all(&debs)?;
    eprintln!("xtask: downloading {pkg}");
    output(
        Command::new("apt-get")
            .args(["download", "-q", &pkg])
            .current_dir(&debs),
    )?;
    let deb = fs::read_dir(&debs)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{pkg}_")) && n.ends_with(".deb"))
        })
        .with_context(|| format!("apt-get download left no {pkg}_*.deb"))?;
    let tmp = dir.join(format!("{pkg}.partial"));
    let _ = fs::remove_dir_all(&tmp);
    output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
    let _ = fs::remove_dir_all(&root);
    fs::rename(&tmp, &root)?;
    let _ = fs::remove_file(&deb);
    Ok(kernel)
}

fn cached_package(dir: &Path, label: &str) -> Option<String> {
    let prefix = format!("linux-image-{label}");
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix) && !n.ends_with(".partial"))
        .max()
}

/// Index of module name (`-` as `_`) to its file under lib/modules/<v>/kernel.
fn module_index(kernel: &Kernel) -> Result<HashMap<String, PathBuf>> {
    let mut index = HashMap::new();
    let mut stack = vec![kernel.modules().join("kernel")];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(name) = p.file_name().and_then(|n| n.to_str()) {
                if let Some(stem) = name
                    .strip_suffix(".ko")
                    .or_else(|| name.strip_suffix(".ko.xz"))
                {
                    index.insert(stem.replace('-', "_"), p.clone());
                }
            }
        }
    }
    Ok(index)
}

/// A module's bytes, decompressed if it ships as .ko.xz.
fn module_bytes(path: &Path) -> Result<Vec<u8>> {
    if path.extension().is_some_and(|e| e == "xz") {
        let out = Command::new("xz")
            .arg("-dc")
            .arg(path)
            .output()
            .context("running xz (package xz-utils)")?;
        if !out.status.success() {
            bail!("xz -dc {} failed", path.display());
        }
        Ok(out.stdout)
    } else {
        Ok(fs::read(path)?)
    }
}

/// The `depends=` entry of a module's .modinfo section.
fn module_depends(ko: &[u8]) -> Result<Vec<String>> {
    use object::{Object, ObjectSection};
    let obj = object::File::parse(ko)?;
    let Some(sec) = obj.section_by_name(".modinfo") else {
        return Ok(Vec::new());
    };
    Ok(sec
        .data()?
        .split(|&b| b == 0)
        .filter_map(|kv| kv.strip_prefix(b"depends="))
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect())
}

/// Loads `name` and its dependencies (dependencies first) into `order`.
fn add_module(
    name: &str,
    index: &HashMap<String, PathBuf>,
    order: &mut Vec<(String, Vec<u8>)>,
) -> Result<()> {
    if order.iter().any(|(n, _)| n == name) {
        return Ok(());
    }
    let Some(path) = index.get(name) else {
        return Ok(()); // built in
    };
    let bytes = module_bytes(path)?;
    for dep in module_depends(&bytes)? {
        add_module(&dep, index, order)?;
    }
    order.push((name.to_string(), bytes));
    Ok(())
}

/// Builds the initramfs for `kernel` that runs `script` (a host path) in the guest.
fn initramfs(kernel: &Kernel, script: &Path) -> Result<PathBuf> {
    let stage = guest_dir().join(format!("initramfs-{}", kernel.label));
    let _ = fs::remove_dir_all(&stage);
    for d in [
        "bin",
        "lib/modules",
        "hostroot",
        "newroot",
        "proc",
        "sys",
        "dev",
    ] {
        fs::create_dir_all(stage.join(d))?;
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .context("no busybox (package busybox-static)")?;
    fs::copy(busybox, stage.join("bin/busybox"))?;

    let index = module_index(kernel)?;
    let mut order = Vec::new();
    for m in ROOT_MODULES {
        add_module(m, &index, &mut order)?;
    }
    let mut insmods = String::new();
    for (name, bytes) in &order {
        fs::write(stage.join(format!("lib/modules/{name}.ko")), bytes)?;
        insmods.push_str(&format!(
            "insmod /lib/modules/{name}.ko || echo 'insmod {name} failed'\n"
        ));
    }
    let script = fs::canonicalize(script)?;
    let init = format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
{insmods}
# cache=loose: the guest keeps what it reads in its page cache, as a machine with
# a local disk does (the share is read-only and the host does not change it during
# a boot). Without it every exec pages the binary in over 9p again, which slowed
# each run of a tool (and bpftrace's 100 MB of libraries most) by up to 10x.
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /hostroot; then
    echo "{EXIT_MARK} 97 (cannot mount the host root over 9p)"
    poweroff -f
fi
mount -o bind /hostroot /newroot
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mount -t tmpfs tmp /newroot/tmp
mount -t tmpfs run /newroot/run
mount -t tracefs nodev /newroot/sys/kernel/tracing
mount -t debugfs nodev /newroot/sys/kernel/debug
mount -t bpf bpf /newroot/sys/fs/bpf
# As systemd mounts it (the --cgroup tests make cgroups in it).
mount -t cgroup2 nodev /newroot/sys/fs/cgroup
# The workspace may lie under a directory masked above (a CI clone in /tmp): show
# the host's copy again at the same path.
mkdir -p '/newroot{workspace}' && mount -o bind '/hostroot{workspace}' '/newroot{workspace}'
echo 1 > /proc/sys/kernel/panic_on_oops
# Loopback up: the --listen tests scrape the tools from inside the guest.
ifconfig lo 127.0.0.1 up
# The scratch virtio disk, when the kernel found it.
[ -e /sys/class/block/vda ] && export TRACEKIT_GUEST_DISK=vda
# What this kernel can do, from its config, for tests to assert the right path.
export TRACEKIT_GUEST_KERNEL={label} TRACEKIT_EXPECT_KPROBE_MULTI={multi}
echo "{BEGIN_MARK} $(uname -r)"
chroot /newroot /bin/sh {script}
echo "{EXIT_MARK} $?"
poweroff -f
"#,
        script = script.display(),
        workspace = std::env::current_dir()?.canonicalize()?.display(),
        label = kernel.label,
        multi = u8::from(kernel.config_has("CONFIG_FPROBE")),
    );
    fs::write(stage.join("init"), init)?;
    fs::set_permissions(stage.join("init"), fs::Permissions::from_mode(0o755))?;

    let out = guest_dir().join(format!("initramfs-{}.cpio.gz", kernel.label));
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && find . | cpio -o -H newc --quiet | gzip -1 > '{}'",
            stage.display(),
            fs::canonicalize(guest_dir())?
                .join(out.file_name().expect("file name"))
                .display()
        ))
        .status()
        .context("running cpio (package cpio)")?;
    if !st.success() {
        bail!("building the initramfs failed");
    }
    Ok(out)
}

pub struct Verdict {
    pub passed: bool,
    pub summary: String,
    /// The first kernel splat line (oops, panic, BUG...) if the kernel crashed.
    pub splat: Option<String>,
    /// Console lines after the guest started its script.
    pub lines: Vec<String>,
    /// Each finished test and how long it took, as seen on the console: libtest
    /// (one thread) prints a test's line when it ends, so a test took from the
    /// previous such line (or "running N tests") to its own.
    pub test_times: Vec<(String, Duration)>,
}

/// How QEMU's TCG runs the guest's two vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tcg {
    /// One host thread takes turns between the vCPUs. For the tests: with a
    /// thread per vCPU, a vCPU can run code translated while another was
    /// patching it (text_poke_bp's int3) after the patch is done: an "Oops:
    /// int3" in ftrace's text patching (CI, and 4 of 4 benchmark runs attaching
    /// all 42,000 functions), in `__schedule` when the sched_switch tracepoint's
    /// jump label flipped (a start-up benchmark run), a NULL call on 6.1. With
    /// turns, no vCPU runs while another writes code. The guest tests took 8.0
    /// min against 7.6 with a thread per vCPU (6.12 slower, 6.1 faster).
    Single,
    /// A host thread per vCPU: the benchmarks, whose tool and workload run side
    /// by side as on a real machine (they reboot and go on after such a crash).
    Multi,
}

/// QEMU's accelerator option (`TRACEKIT_GUEST_ACCEL` overrides it).
fn accel(tcg: Tcg) -> String {
    std::env::var("TRACEKIT_GUEST_ACCEL").unwrap_or_else(|_| {
        match tcg {
            Tcg::Single => "tcg,thread=single",
            Tcg::Multi => "tcg,thread=multi",
        }
        .to_string()
    })
}

/// Boots `kernel`, runs `script` inside, streams the console with `prefix`.
pub fn boot(kernel: &Kernel, script: &Path, timeout: Duration, tcg: Tcg) -> Result<Verdict> {
    let initrd = initramfs(kernel, script)?;
    // A fresh, sparse, zeroed image each boot: tests write to it.
    let disk = guest_dir().join(format!("disk-{}.img", kernel.label));
    let f = fs::File::create(&disk).with_context(|| format!("creating {}", disk.display()))?;
    f.set_len(SCRATCH_DISK_BYTES)?;
    drop(f);
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            &accel(tcg),
            "-cpu",
            "max",
            "-smp",
            "2",
            "-m",
            "2G",
        ])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(kernel.vmlinuz())
        .arg("-initrd")
        .arg(&initrd)
        .args([
            "-append",
            "console=ttyS0 panic=-1 loglevel=4 mitigations=off",
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ])
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio", disk.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting qemu-system-x86_64 (package qemu-system-x86)")?;
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let tx2 = tx.clone();
    thread::spawn(move || {
        for l in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
            let _ = tx.send(clean(&l));
        }
    });
    thread::spawn(move || {
        for l in BufReader::new(stderr).split(b'\n').map_while(Result::ok) {
            let _ = tx2.send(format!("qemu: {}", clean(&l)));
        }
    });

    let prefix = format!("[guest {}]", kernel.label);
    let log_path = guest_dir().join(format!("console-{}.log", kernel.label));
    let mut log = fs::File::create(&log_path)?;
    let start = Instant::now();
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut began = false;
    let mut lines = Vec::new();
    let mut exit: Option<i32> = None;
    let mut splat: Option<String> = None;
    let mut timed_out = false;
    let mut test_times = Vec::new();
    let mut since: Option<Instant> = None;
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(line) => {
                use std::io::Write;
                let _ = writeln!(log, "{line}");
                if line.contains(BEGIN_MARK) {
                    began = true;
                }
                if let Some(rest) = line.trim().strip_prefix(EXIT_MARK) {
                    exit = rest.split_whitespace().next().and_then(|c| c.parse().ok());
                }
                if splat.is_none() && SPLATS.iter().any(|s| line.contains(s)) {
                    splat = Some(line.clone());
                }
                if began {
                    let l = line.trim();
                    if l.starts_with("running ") && (l.ends_with(" test") || l.ends_with(" tests"))
                    {
                        since = Some(Instant::now());
                    } else if let (Some(t0), Some(name)) = (since, finished_test(l)) {
                        test_times.push((name.to_string(), t0.elapsed()));
                        since = Some(Instant::now());
                    }
                }
                if began && !line.trim().is_empty() {
                    println!("{prefix} {line}");
                    lines.push(line.clone());
                }
                tail.push_back(line);
                if tail.len() > 60 {
                    tail.pop_front();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                let _ = child.kill();
                break;
            }
        }
    }
    let _ = child.wait();
    let took = start.elapsed().as_secs();
    let show_tail = |why: &str| {
        eprintln!(
            "{prefix} {why}; last console lines (all in {}):",
            log_path.display()
        );
        for l in &tail {
            eprintln!("{prefix} | {l}");
        }
    };
    let (passed, summary) = if timed_out {
        show_tail(&format!("timed out after {}s", timeout.as_secs()));
        (false, format!("{}: TIMEOUT after {took}s", kernel.label))
    } else if let Some(s) = splat.clone() {
        show_tail(&format!("kernel splat: {s}"));
        (
            false,
            format!("{}: kernel splat ({s}) after {took}s", kernel.label),
        )
    } else {
        let k = format!("{} ({})", kernel.label, kernel.version);
        match exit {
            Some(0) => (true, format!("{k}: passed in {took}s")),
            Some(c) => (false, format!("{k}: FAILED (exit {c}) in {took}s")),
            None => {
                show_tail("the guest stopped without a verdict");
                (
                    false,
                    format!("{k}: no verdict (crash or early power-off) after {took}s"),
                )
            }
        }
    };
    Ok(Verdict {
        passed,
        summary,
        splat,
        lines,
        test_times,
    })
}

/// The name of the test a libtest line reports finished ("test NAME ... ok").
fn finished_test(line: &str) -> Option<&str> {
    let (name, result) = line.strip_prefix("test ")?.split_once(" ... ")?;
    // Colour codes left over from the console, should a run have them.
    let result = result.trim_matches(|c: char| c.is_control());
    matches!(result, "ok" | "FAILED").then_some(name)
}

/// Console bytes as text, without carriage returns and terminal escapes.
fn clean(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {}
            '\u{1b}' => {
                // CSI sequence: ESC [ params final-byte
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for d in chars.by_ref() {
                        if d.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Runs `script` in every kernel; fails unless all pass.
/// `TRACEKIT_GUEST_KERNELS=6.1` (comma-separated labels) limits a local run.
pub fn run_all(script: &Path, timeout: Duration) -> Result<()> {
    let only = std::env::var("TRACEKIT_GUEST_KERNELS").ok();
    let mut verdicts = Vec::new();
    for spec in KERNELS {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|l| l == spec.label))
        {
            continue;
        }
        let kernel = fetch(spec)?;
        eprintln!("xtask: booting {} ({})", kernel.label, kernel.version);
        verdicts.push(boot(&kernel, script, timeout, Tcg::Single)?);
    }
    eprintln!("xtask: guest results:");
    for v in &verdicts {
        eprintln!("xtask:   {}", v.summary);
        // Where a guest's time goes, so CI time growth can be traced to a test.
        let mut times = v.test_times.clone();
        times.sort_by_key(|t| std::cmp::Reverse(t.1));
        for (name, took) in times.iter().take(5) {
            eprintln!("xtask:     {:>6.1}s {name}", took.as_secs_f64());
        }
    }
    if verdicts.iter().any(|v| !v.passed) {
        bail!("guest kernel tests failed");
    }
    Ok(())
}

/// The test executable cargo built for integration test `name`.
pub fn test_executable(name: &str, release: bool) -> Result<PathBuf> {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["test", "--no-run", "--message-format=json", "--test", name]);
    if release {
        cmd.arg("--release");
    }
    let out = cmd.stderr(Stdio::inherit()).output()?;
    if !out.status.success() {
        bail!("building test {name} failed");
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact"
            && v["target"]["name"] == name
            && v["profile"]["test"] == true
        {
            if let Some(exe) = v["executable"].as_str() {
                return Ok(PathBuf::from(exe));
            }
        }
    }
    bail!("cargo did not report an executable for test {name}")
}

/// Writes a script for the guest that runs `body` in the workspace root.
pub fn write_script(name: &str, body: &str) -> Result<PathBuf> {
    fs::create_dir_all(guest_dir())?;
    let path = guest_dir().join(name);
    fs::write(
        &path,
        format!(
            "#!/bin/sh\n# Written by cargo xtask; runs inside the guest.\n\
             cd '{}' || exit 98\n\
             export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
             export RUST_BACKTRACE=1 TMPDIR=/tmp\n\
             # Our init leaves the open-file limit at 4096, not a distribution's\n\
             # 524288: single kprobes on thousands of functions hold two each.\n\
             ulimit -n 1048576 2>/dev/null || ulimit -n 65536\n{body}\n",
            std::env::current_dir()?.display()
        ),
    )?;
    Ok(path)
}

/// Writes the script the guest runs: the guest test list (its exit status is the verdict).
pub fn write_test_script(test_exe: &Path, filter: &[String]) -> Result<PathBuf> {
    let filters = filter
        .iter()
        .map(|f| format!("'{}'", f.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let exe = fs::canonicalize(test_exe)?;
    write_script(
        "run-tests.sh",
        &format!(
            "'{}' --ignored --test-threads=1 --color never {filters}",
            exe.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_tests_are_recognised() {
        assert_eq!(finished_test("test vfs_read ... ok"), Some("vfs_read"));
        assert_eq!(finished_test("test a ... FAILED\x0f"), Some("a"));
        assert_eq!(finished_test("test a ... ignored"), None);
        assert_eq!(finished_test("test result: ok. 1 passed"), None);
    }
}
