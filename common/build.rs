//! Builds the IFUNC helper (`helpers/ifunc.c`), a small dynamically linked
//! program that `ifunc.rs` embeds and runs: see there.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "helpers/ifunc.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("ifunc-helper");
    // The target's C compiler (CC, CC_<target>, or cc), found as the cc crate finds it.
    // Dynamic, whatever the tools are: its whole point is a dynamic linker. So
    // not the -static cc adds when the tools are built with crt-static (`cargo
    // xtask` builds them so). -ldl for glibc before 2.34, where dlopen lived in
    // libdl.
    let compiler = cc::Build::new().opt_level(2).get_compiler();
    let mut cmd = Command::new(compiler.path());
    cmd.args(compiler.args().iter().filter(|a| *a != "-static"))
        .envs(compiler.get_envs());
    cmd.args(["-s", "-o"]).arg(&out).arg(src).arg("-ldl");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed ({status})");
}
