//! Compiles every `bpf/*.bpf.c` into a libbpf-rs skeleton `$OUT_DIR/<name>.skel.rs`.
//!
//! clang is taken from `$CLANG`, else `clang`, else the newest `clang-NN` on `PATH`.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let bpf_dir = Path::new("bpf");
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    println!("cargo:rerun-if-env-changed=CLANG");

    let clang = find_clang().unwrap_or_else(|| {
        // One line, naming the package: cargo shows it under "--- stderr".
        eprintln!(
            "error: no clang found ($CLANG unset, no `clang` or `clang-NN` on PATH); \
             install it with: apt-get install clang"
        );
        std::process::exit(1);
    });

    // usdt.bpf.h includes <linux/errno.h>, which needs the multiarch <asm/...> headers
    // (Debian's linux-libc-dev) that `-target bpf` does not search by itself.
    let multiarch = format!(
        "/usr/include/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").expect("target arch")
    );

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let mut sources: Vec<PathBuf> = fs::read_dir(bpf_dir)
        .expect("bpf/ directory")
        .map(|e| e.expect("readable bpf/ entry").path())
        .collect();
    sources.sort();
    for src in sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let Some(name) = src
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".bpf.c"))
        else {
            continue;
        };
        let skel = out_dir.join(format!("{name}.skel.rs"));
        if let Err(e) = SkeletonBuilder::new()
            .source(&src)
            .clang(&clang)
            .clang_args([
                OsString::from("-I"),
                bpf_dir.as_os_str().to_owned(),
                OsString::from("-idirafter"),
                OsString::from(&multiarch),
                OsString::from("-Wall"),
                OsString::from("-Werror"),
            ])
            .build_and_generate(&skel)
        {
            eprintln!("error: compiling {}: {e:#}", src.display());
            std::process::exit(1);
        }
    }
}

fn find_clang() -> Option<OsString> {
    if let Some(c) = env::var_os("CLANG").filter(|c| !c.is_empty()) {
        return Some(c);
    }
    if runs(Path::new("clang")) {
        return Some("clang".into());
    }
    // Debian installs versioned binaries (clang-14 … clang-19) without a plain `clang`.
    let mut best: Option<(u32, PathBuf)> = None;
    for dir in env::split_paths(&env::var_os("PATH").unwrap_or_default()) {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(ver) = name
                .to_str()
                .and_then(|n| n.strip_prefix("clang-"))
                .and_then(|v| v.parse::<u32>().ok())
            else {
                continue;
            };
            if best.as_ref().is_none_or(|(b, _)| ver > *b) && runs(&entry.path()) {
                best = Some((ver, entry.path()));
            }
        }
    }
    best.map(|(_, p)| p.into_os_string())
}

fn runs(clang: &Path) -> bool {
    Command::new(clang)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}
