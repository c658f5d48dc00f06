//! Compiles every `bpf/*.bpf.c` into a libbpf-rs skeleton `$OUT_DIR/<name>.skel.rs`,
//! to which it adds `CORE_SECTIONS`: the program sections whose code carries CO-RE
//! relocations (read from the object's .BTF.ext). A run that loads none of them
//! needs no kernel BTF (common::object::Plan::core_target); and `LIBBPF_WARMUP`,
//! the bytes of `bpf/warmup.bpf.c`'s object (common::ahead loads it).
//!
//! clang is taken from `$CLANG`, else `clang`, else the newest `clang-NN` on `PATH`.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

fn main() {
    pack_relative_relocs();
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
        let obj = out_dir.join(format!("{name}.bpf.o"));
        compile(&clang, &multiarch, &src, &obj, &skel, &[]);
        let sections = core_sections(&obj).unwrap_or_else(|e| {
            eprintln!("error: reading {}'s CO-RE relocations: {e}", obj.display());
            std::process::exit(1);
        });
        let mut code = fs::read_to_string(&skel).expect("generated skeleton");
        code.push_str(&format!(
            "\n/// Program sections of this object whose code has CO-RE relocations.\n\
             #[allow(dead_code)]\n\
             pub const CORE_SECTIONS: &[&str] = &{sections:?};\n\n\
             /// bpf/warmup.bpf.c's object, which common::ahead loads to answer libbpf's\n\
             /// feature probes before this object's load asks them.\n\
             #[allow(dead_code)]\n\
             pub const LIBBPF_WARMUP: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/warmup.bpf.o\"));\n"
        ));
        if LEAN.contains(&name) {
            code = with_lean_build(&clang, &multiarch, &src, name, &out_dir, code);
        }
        fs::write(&skel, code).expect("writing the skeleton");
    }
}

/// Objects that also get a lean build, without their session kfunc externs
/// (`TRACEKIT_LEAN`, bpf/pairing.h): libbpf reads the kernel's BTF to resolve
/// any kfunc, whether the programs calling it load or not. A plan without
/// session programs opens the lean build (common::ahead::object_bytes).
const LEAN: &[&str] = &["trace", "funclatency"];

/// Compiles `src` into `obj` and its skeleton `skel`, exiting on failure.
fn compile(
    clang: &std::ffi::OsStr,
    multiarch: &str,
    src: &Path,
    obj: &Path,
    skel: &Path,
    defines: &[&str],
) {
    let mut args = vec![
        OsString::from("-I"),
        OsString::from("bpf"),
        OsString::from("-idirafter"),
        OsString::from(multiarch),
        OsString::from("-Wall"),
        OsString::from("-Werror"),
    ];
    args.extend(defines.iter().map(|d| OsString::from(format!("-D{d}"))));
    if let Err(e) = SkeletonBuilder::new()
        .source(src)
        .obj(obj)
        .clang(clang)
        .clang_args(args)
        .build_and_generate(skel)
    {
        eprintln!("error: compiling {}: {e:#}", src.display());
        std::process::exit(1);
    }
}

/// Builds `name`'s lean object and returns its skeleton `code` opening either
/// build. The two must differ in their bytes only: the skeleton names maps and
/// programs and lays out the globals for both, so the lean build's own skeleton,
/// but for the embedded object, must be the same text.
fn with_lean_build(
    clang: &std::ffi::OsStr,
    multiarch: &str,
    src: &Path,
    name: &str,
    out_dir: &Path,
    code: String,
) -> String {
    let obj = out_dir.join(format!("{name}.lean.bpf.o"));
    let skel = out_dir.join(format!("{name}.lean.skel.rs"));
    compile(clang, multiarch, src, &obj, &skel, &["TRACEKIT_LEAN"]);
    let lean = fs::read_to_string(&skel).expect("generated lean skeleton");
    // The full build's skeleton as generated, before build.rs added to it.
    let generated =
        fs::read_to_string(out_dir.join(format!("{name}.skel.rs"))).expect("generated skeleton");
    if without_data(&lean) != without_data(&generated) {
        eprintln!(
            "error: {}'s lean build (-DTRACEKIT_LEAN) differs from its full build in more \
             than its code: keep its maps, programs and globals the same",
            src.display()
        );
        std::process::exit(1);
    }
    let full = "ObjectSkeletonConfigBuilder::new(&DATA)";
    if !code.contains(full) {
        eprintln!("error: {name}'s skeleton does not open `&DATA` as this build.rs expects");
        std::process::exit(1);
    }
    let mut code = code.replacen(
        full,
        "ObjectSkeletonConfigBuilder::new(common::ahead::object_bytes(&DATA, super::LEAN_DATA))",
        1,
    );
    code.push_str(&format!(
        "\n/// The object built without its session kfunc externs (build.rs's LEAN).\n\
         #[allow(dead_code)]\n\
         pub const LEAN_DATA: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{name}.lean.bpf.o\"));\n"
    ));
    code
}

/// A skeleton's text without its embedded object (`static DATA: [u8; N] = [...];`).
fn without_data(code: &str) -> String {
    let Some(start) = code.find("static DATA: [u8;") else {
        return code.to_string();
    };
    match code[start..].find("];") {
        Some(end) => format!("{}{}", &code[..start], &code[start + end + 2..]),
        None => code.to_string(),
    }
}

/// The ELF sections named by the CO-RE relocation records of a BPF object's
/// .BTF.ext (layouts: include/uapi/linux/btf.h, libbpf's libbpf_internal.h).
fn core_sections(obj: &Path) -> Result<Vec<String>, String> {
    use object::{Object, ObjectSection};

    let data = fs::read(obj).map_err(|e| e.to_string())?;
    let file = object::File::parse(&*data).map_err(|e| e.to_string())?;
    let section = |name: &str| -> Result<Option<Vec<u8>>, String> {
        match file.section_by_name(name) {
            Some(s) => Ok(Some(s.data().map_err(|e| e.to_string())?.to_vec())),
            None => Ok(None),
        }
    };
    let (Some(btf), Some(ext)) = (section(".BTF")?, section(".BTF.ext")?) else {
        return Ok(Vec::new());
    };
    let u32_at = |b: &[u8], at: usize| -> Result<usize, String> {
        b.get(at..at + 4)
            .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| format!("truncated at byte {at}"))
    };
    // btf_ext_header: magic, version, flags, hdr_len, func_info (off, len),
    // line_info (off, len), then core_relo (off, len) when hdr_len reaches it.
    let hdr_len = u32_at(&ext, 4)?;
    if hdr_len < 32 {
        return Ok(Vec::new());
    }
    let (relo_off, relo_len) = (u32_at(&ext, 24)?, u32_at(&ext, 28)?);
    // btf_header: magic, version, flags, hdr_len, type (off, len), str (off, len).
    let strings = u32_at(&btf, 4)? + u32_at(&btf, 16)?;
    let name = |off: usize| -> Result<String, String> {
        let tail = btf
            .get(strings + off..)
            .ok_or("string offset out of range")?;
        let end = tail
            .iter()
            .position(|&c| c == 0)
            .ok_or("unterminated string")?;
        Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
    };
    let mut sections = Vec::new();
    if relo_len == 0 {
        return Ok(sections);
    }
    // A record size, then per section: name offset, record count, records.
    let start = hdr_len + relo_off;
    let end = start + relo_len;
    let rec_size = u32_at(&ext, start)?;
    let mut at = start + 4;
    while at < end {
        let (sec, n) = (u32_at(&ext, at)?, u32_at(&ext, at + 4)?);
        sections.push(name(sec)?);
        at += 8 + n * rec_size;
    }
    sections.sort();
    sections.dedup();
    Ok(sections)
}

/// Links the tools with their relative relocations packed as DT_RELR
/// (`-z pack-relative-relocs`) when the linker can and the C library linked
/// against can load them (glibc 2.36+ defines the GLIBC_ABI_DT_RELR version,
/// which the linker makes such a binary need, so an older glibc refuses it by
/// name instead of crashing). A tool has about 15,000 R_X86_64_RELATIVE
/// entries (364 KB) that the dynamic loader applies one by one at every start;
/// packed, they are 5 KB of bitmaps applied in a tight loop (the loader's
/// start-up: 598,000 -> 232,000 cycles on the host, LD_DEBUG=statistics).
fn pack_relative_relocs() {
    println!("cargo:rerun-if-env-changed=CC");
    let cc = env::var_os("CC").unwrap_or_else(|| "cc".into());
    let linker_can = Command::new(&cc)
        .arg("-Wl,--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("pack-relative-relocs"));
    let libc = Command::new(&cc)
        .arg("-print-file-name=libc.so.6")
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let libc_can = libc
        .and_then(|p| fs::read(p).ok())
        .is_some_and(|b| b.windows(18).any(|w| w == b"GLIBC_ABI_DT_RELR\0"));
    if linker_can && libc_can {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
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
