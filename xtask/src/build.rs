//! Building the workspace: where it is, running cargo, and the release tools
//! (static-pie, one cargo build for all of them). Every task that builds goes
//! through here: `run`, `test`, `guest`, `install` and the benchmarks.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::install;

/// The workspace's root directory (xtask is one of its members).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// `cargo`: the one running this task when there is one (`$CARGO`).
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

pub fn status(mut cmd: Command) -> Result<()> {
    let st = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed ({st})");
    }
    Ok(())
}

/// Builds release artifacts quietly (`--bin X` / `--example Y` arguments): the
/// tools as [`build_tools`] does, the test programs as any program is built.
pub fn build_release(targets: &[&str]) -> Result<()> {
    let (mut tools, mut examples) = (Vec::new(), Vec::new());
    for pair in targets.chunks(2) {
        match pair {
            ["--bin", tool] => tools.push(*tool),
            [flag @ "--example", name] => examples.extend([*flag, *name]),
            _ => bail!("build_release: {pair:?} is not --bin X or --example Y"),
        }
    }
    if !examples.is_empty() {
        let mut c = cargo();
        c.args(["build", "--release", "--quiet"]).args(&examples);
        status(c)?;
    }
    build_tools(&tools)
}

/// Builds the release binaries of `tools`, linked statically (static-pie, glibc's
/// `libc.a`): an exec then maps one file and relocates it itself, with no dynamic
/// loader, no libc.so and no libgcc_s to map and bind. That is 20-30 ms of a run
/// under the guest's emulation (`cargo xtask bench-ab`, every row), 0.5 ms on the
/// host; and the tools run in any container or distribution, whatever C library
/// it has, or none.
///
/// `crt-static` goes to the target's crates only (`--target` with target
/// rustflags): cargo then builds build scripts and proc macros for the host
/// without it (it refuses crt-static for proc macros), and it does not touch
/// the test programs, which `cargo test` builds dynamically into target/debug:
/// tests trace their calls into the system's libc.so. One cargo build for all
/// the tools links them in parallel: from a clean target, 285 s on a 2-core
/// machine, against 477 s for one `cargo rustc` per tool (the seven fat-LTO
/// links one after the other) of a 1,355 s `cargo xtask test`. The binaries
/// are copied to target/release, where everything else looks for them. What a
/// static tool cannot do itself, ask a dynamic linker which implementation an
/// IFUNC (libc's strlen) picks, it asks of a small dynamic helper it embeds
/// (common/src/user/ifunc.rs).
pub fn build_tools(tools: &[&str]) -> Result<()> {
    if tools.is_empty() {
        return Ok(());
    }
    let triple = host_triple()?;
    let mut c = cargo();
    c.args([
        "build",
        "--release",
        "--quiet",
        "--package",
        install::PACKAGE,
    ])
    .args(["--target", &triple, "--config"])
    // Target rustflags replace .cargo/config.toml's [build] rustflags, so
    // those (frame pointers) are repeated here.
    .arg(format!(
        "target.{triple}.rustflags=[\"-C\", \"force-frame-pointers=yes\", \
             \"-C\", \"target-feature=+crt-static\"]"
    ));
    for tool in tools {
        c.args(["--bin", tool]);
    }
    status(c)?;
    let built = workspace_root()
        .join("target")
        .join(&triple)
        .join("release");
    let dest = workspace_root().join("target/release");
    fs::create_dir_all(&dest)?;
    for tool in tools {
        // A copy renamed into place: a tool running from target/release keeps
        // its file, where writing over it would fail ("text file busy").
        let tmp = dest.join(format!(".{tool}.new"));
        fs::copy(built.join(tool), &tmp).with_context(|| {
            format!(
                "copying {} to {}",
                built.join(tool).display(),
                tmp.display()
            )
        })?;
        fs::rename(&tmp, dest.join(tool))?;
    }
    Ok(())
}

/// The host's target triple (rustc -vV), which the tools are built for.
fn host_triple() -> Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .with_context(|| format!("running {rustc:?} -vV"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("rustc -vV printed no host triple")
}
