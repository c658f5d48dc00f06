//! Debian packages the build, the tests and the benchmarks need, installed when
//! missing (as root on Debian/Ubuntu), or the exact command printed otherwise.

use std::process::Command;

use anyhow::{bail, Context, Result};

/// Compiling BPF C and the vendored libbpf; libc6-dev has the libc.a the tools
/// link statically.
pub const BUILD: &[&str] = &[
    "clang",
    "gcc",
    "libc6-dev",
    "make",
    "pkg-config",
    "libelf-dev",
    "zlib1g-dev",
    "linux-libc-dev",
];

/// Host tests (setpriv, unshare and taskset are in util-linux; libc6-dbg gives libc's
/// local function names, which user-function tests check with and without; binutils'
/// objcopy strips a test binary; zlib1g is the Debian library the tests trace;
/// iproute2 makes the network namespace and prometheus the server that scrape
/// --listen in tests/host/serve.rs; g++ builds the C++ program whose exceptions
/// funclatency warns of; golang-go's `go tool pprof` reads the profiles
/// stackcount --pprof writes, in tests/host/pprof.rs).
pub const TEST: &[&str] = &[
    "util-linux",
    "g++",
    "libc6-dbg",
    "binutils",
    "zlib1g",
    "iproute2",
    "prometheus",
    "golang-go",
];

/// The install test (install_test.rs): man-db renders the man pages; bash, zsh and
/// fish load the completions; readelf (binutils) lists sections and libraries;
/// setpriv (util-linux) runs xtask as nobody; lintian checks the .deb.
pub const INSTALL_TEST: &[&str] = &[
    "man-db",
    "bash",
    "zsh",
    "fish",
    "binutils",
    "util-linux",
    "lintian",
];

/// `cargo xtask deb`: dpkg-shlibdeps, which cargo-deb runs for Depends; strip.
pub const DEB: &[&str] = &["dpkg-dev", "binutils"];

/// Booting guest kernels.
pub const GUEST: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "xz-utils",
    "gzip",
];

/// Peers the benchmarks compare against.
pub const BENCH: &[&str] = &["bpftrace", "bpfcc-tools"];

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", pkg])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout == b"installed")
}

/// Installs whichever of `pkgs` are missing.
pub fn ensure(pkgs: &[&str]) -> Result<()> {
    if !std::path::Path::new("/usr/bin/dpkg-query").exists() {
        // Not Debian-like: we cannot check; the build will say what is missing.
        eprintln!(
            "xtask: not a Debian/Ubuntu system; make sure these (Debian names) are installed: {}",
            pkgs.join(" ")
        );
        return Ok(());
    }
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let cmd = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "missing Debian packages: {}; install them with: sudo {cmd}",
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    run_apt(&["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend(&missing);
    run_apt(&args).with_context(|| format!("running: {cmd}"))
}

fn run_apt(args: &[&str]) -> Result<()> {
    let st = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    if !st.success() {
        bail!("apt-get {} failed ({st})", args.join(" "));
    }
    Ok(())
}
