//! `cargo xtask install [--prefix DIR] [--uninstall]` and `cargo xtask deb`.
//!
//! Both put the same files in place, from one list ([`files`]):
//!
//! | what | where (under the prefix) |
//! |---|---|
//! | every `[[bin]]` of the `tracekit` package, release (the profile strips debug info; the .deb's also lose their symbol table, as dh_strip does) | `sbin/` |
//! | its man page, `man/<tool>.8` | `share/man/man8/` (gzipped in the .deb) |
//! | `man/tracekit.7`, what the tools share (once, not per tool) | `share/man/man7/` (gzipped in the .deb) |
//! | bash completion | `share/bash-completion/completions/<tool>` |
//! | zsh completion | `share/zsh/site-functions/_<tool>` (.deb: `vendor-completions`, Debian's place) |
//! | fish completion | `share/fish/vendor_completions.d/<tool>.fish` |
//!
//! The tools come from `cargo metadata`, so a new `[[bin]]` is installed without
//! touching this file; it needs a man page and must parse its command line with
//! `common::cli::parse`, which gives it the hidden `--completions SHELL` flag the
//! completion scripts are generated with (from the tool's own clap definition).
//!
//! `install` records what it created, files and directories, in
//! `<prefix>/share/tracekit/install-manifest`; `--uninstall` removes exactly those
//! (directories only when empty), so the prefix is left as it was.
//!
//! `deb` stages the files under `target/deb/root/usr` and has `cargo-deb` (installed
//! with `cargo install --locked` when missing) package them with the metadata in
//! the root Cargo.toml's `[package.metadata.deb]`: Depends from `dpkg-shlibdeps`,
//! copyright, man pages gzipped, `packaging/changelog` as changelog.gz,
//! `packaging/lintian-overrides`.
//!
//! `cargo xtask test` checks both (install_test.rs): it installs into a temporary
//! prefix and uninstalls, then builds the .deb, installs it on the host and purges it.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use crate::{cargo, deps, status};

/// The package whose binaries are the tools.
pub const PACKAGE: &str = "tracekit";
/// Where `install` records what it created, relative to the prefix.
pub const MANIFEST: &str = "share/tracekit/install-manifest";
/// cargo-deb, pinned: `cargo xtask deb` installs this version when cargo has none.
const CARGO_DEB_VERSION: &str = "3.8.0";
/// The package's changelog, in Debian's format; its newest entry is the version
/// (the install test checks).
pub const CHANGELOG: &str = "packaging/changelog";
/// Where `deb` stages the package's tree, in the target directory; the `assets`
/// of `[package.metadata.deb]` in Cargo.toml point here (`target/deb/root`:
/// cargo-deb reads `target/` there as the target directory, wherever it is).
const DEB_ROOT: &str = "deb/root";

/// Where files go under the prefix.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layout {
    /// `cargo xtask install`: zsh's own default `site-functions`.
    Prefix,
    /// The .deb: zsh completions where Debian's zsh looks for packaged ones.
    Debian,
}

/// One file to put in place.
pub struct File {
    /// Relative to the prefix.
    pub rel: PathBuf,
    pub content: Content,
    pub mode: u32,
}

pub enum Content {
    Copy(PathBuf),
    /// A release binary, stripped as Debian's dh_strip does (symbol table too), for
    /// the .deb: Debian policy wants no symbols in a package's binaries.
    Stripped(PathBuf),
    Bytes(Vec<u8>),
}

/// The tools and the package version, from `cargo metadata`.
pub struct Package {
    pub version: String,
    pub tools: Vec<String>,
    pub target_dir: PathBuf,
}

pub fn package() -> Result<Package> {
    let mut c = cargo();
    c.args(["metadata", "--no-deps", "--format-version", "1"]);
    let out = c.output().context("running cargo metadata")?;
    ensure!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let pkg = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == PACKAGE))
        .context("no tracekit package in cargo metadata")?;
    let mut tools: Vec<String> = pkg["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect();
    tools.sort();
    ensure!(!tools.is_empty(), "the tracekit package has no [[bin]]");
    Ok(Package {
        version: pkg["version"].as_str().context("no version")?.to_string(),
        tools,
        target_dir: meta["target_directory"]
            .as_str()
            .context("no target_directory")?
            .into(),
    })
}

/// The man page of what the tools share, in section 7 (`man/tracekit.7`).
pub const OVERVIEW_PAGE: &str = "tracekit.7";

/// Directories the files go into, relative to the prefix.
fn dirs(layout: Layout) -> [&'static str; 6] {
    [
        "sbin",
        "share/man/man8",
        "share/man/man7",
        "share/bash-completion/completions",
        match layout {
            Layout::Prefix => "share/zsh/site-functions",
            Layout::Debian => "share/zsh/vendor-completions",
        },
        "share/fish/vendor_completions.d",
    ]
}

/// Builds the release binaries and lists every file to install.
pub fn files(pkg: &Package, layout: Layout) -> Result<Vec<File>> {
    let root = crate::workspace_root();
    for tool in &pkg.tools {
        let page = root.join(format!("man/{tool}.8"));
        ensure!(
            page.is_file(),
            "{tool} has no man page: add man/{tool}.8 (every installed tool has one)"
        );
    }
    let overview = root.join("man").join(OVERVIEW_PAGE);
    ensure!(overview.is_file(), "man/{OVERVIEW_PAGE} is missing");
    let tools: Vec<&str> = pkg.tools.iter().map(String::as_str).collect();
    crate::build_tools(&tools)?;
    let [sbin, man8, man7, bash, zsh, fish] = dirs(layout);
    let mut files = vec![File {
        rel: Path::new(man7).join(OVERVIEW_PAGE),
        content: Content::Copy(overview),
        mode: 0o644,
    }];
    for tool in &pkg.tools {
        let bin = pkg.target_dir.join("release").join(tool);
        let script = |shell: &str| completions(&bin, tool, shell);
        files.push(File {
            rel: Path::new(sbin).join(tool),
            content: match layout {
                // The release profile already leaves out debug info; the symbol
                // table stays, so RUST_BACKTRACE=1 names functions.
                Layout::Prefix => Content::Copy(bin.clone()),
                Layout::Debian => Content::Stripped(bin.clone()),
            },
            mode: 0o755,
        });
        files.push(File {
            rel: Path::new(man8).join(format!("{tool}.8")),
            content: Content::Copy(root.join(format!("man/{tool}.8"))),
            mode: 0o644,
        });
        files.push(File {
            rel: Path::new(bash).join(tool),
            content: Content::Bytes(script("bash")?),
            mode: 0o644,
        });
        files.push(File {
            rel: Path::new(zsh).join(format!("_{tool}")),
            content: Content::Bytes(script("zsh")?),
            mode: 0o644,
        });
        files.push(File {
            rel: Path::new(fish).join(format!("{tool}.fish")),
            content: Content::Bytes(script("fish")?),
            mode: 0o644,
        });
    }
    Ok(files)
}

/// A tool's completion script for `shell`, from its hidden `--completions` flag.
fn completions(bin: &Path, tool: &str, shell: &str) -> Result<Vec<u8>> {
    let out = Command::new(bin)
        .args(["--completions", shell])
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    ensure!(
        out.status.success() && !out.stdout.is_empty(),
        "`{tool} --completions {shell}` failed ({}): {}\n\
         every tool must parse its arguments with `common::cli::parse::<Args>()`, \
         which provides that hidden flag",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(out.stdout)
}

/// Writes `file` under `root` through a temporary file and a rename, so a binary
/// that is running is replaced, not rewritten in place (ETXTBSY).
fn put(root: &Path, file: &File) -> Result<()> {
    let dest = root.join(&file.rel);
    let tmp = dest.with_file_name(format!(
        ".{}.xtask-tmp",
        dest.file_name().and_then(OsStr::to_str).unwrap_or("file")
    ));
    let _ = fs::remove_file(&tmp);
    match &file.content {
        Content::Copy(src) => {
            fs::copy(src, &tmp).with_context(|| format!("copying {}", src.display()))?;
        }
        Content::Stripped(src) => {
            let mut strip = Command::new("strip");
            strip
                .args([
                    "--strip-unneeded",
                    "--remove-section=.comment",
                    "--remove-section=.note",
                    "-o",
                ])
                .arg(&tmp)
                .arg(src);
            status(strip)?;
        }
        Content::Bytes(bytes) => fs::write(&tmp, bytes)?,
    }
    fs::set_permissions(&tmp, fs::Permissions::from_mode(file.mode))?;
    fs::rename(&tmp, &dest).with_context(|| format!("installing {}", dest.display()))
}

/// Creates `dir` and its missing parents, returning those it created, outermost
/// first.
fn create_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut d = dir;
    while !d.exists() {
        missing.push(d.to_path_buf());
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    missing.reverse();
    for m in &missing {
        fs::create_dir(m).with_context(|| format!("creating {}", m.display()))?;
    }
    Ok(missing)
}

/// Writes `files` under `root` (a staging tree: nothing is recorded).
pub fn stage(root: &Path, files: &[File]) -> Result<()> {
    for f in files {
        create_dirs(
            root.join(&f.rel)
                .parent()
                .expect("files are in a directory"),
        )?;
        put(root, f)?;
    }
    Ok(())
}

/// What `install` created under a prefix: files and directories, relative paths.
#[derive(Default, Debug, PartialEq)]
struct Manifest {
    files: BTreeSet<PathBuf>,
    dirs: BTreeSet<PathBuf>,
}

impl Manifest {
    fn read(prefix: &Path) -> Result<Option<Self>> {
        let path = prefix.join(MANIFEST);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let mut m = Manifest::default();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (kind, rel) = line
                .split_once(' ')
                .with_context(|| format!("{}: bad line {line:?}", path.display()))?;
            let rel = PathBuf::from(rel);
            // Never let a damaged manifest point outside the prefix.
            ensure!(
                rel.components().all(|c| matches!(c, Component::Normal(_))),
                "{}: bad path {line:?}",
                path.display()
            );
            match kind {
                "file" => m.files.insert(rel),
                "dir" => m.dirs.insert(rel),
                _ => bail!("{}: bad line {line:?}", path.display()),
            };
        }
        Ok(Some(m))
    }

    fn write(&self, prefix: &Path) -> Result<()> {
        let mut text = String::from(
            "# Written by `cargo xtask install`; `cargo xtask install --uninstall` removes\n\
             # these files, then these directories when empty.\n",
        );
        for f in &self.files {
            text += &format!("file {}\n", f.display());
        }
        for d in &self.dirs {
            text += &format!("dir {}\n", d.display());
        }
        let path = prefix.join(MANIFEST);
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, text)?;
        fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }
}

/// Fails with what to do when the user cannot write where the files go.
fn check_writable(prefix: &Path, layout: Layout, args: &str) -> Result<()> {
    let mut dirs: Vec<PathBuf> = dirs(layout).iter().map(|d| prefix.join(d)).collect();
    dirs.push(prefix.join(MANIFEST).parent().unwrap().to_path_buf());
    for dir in dirs {
        let mut d = dir.as_path();
        while !d.exists() {
            d = d.parent().unwrap_or(Path::new("/"));
        }
        let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes())?;
        // SAFETY: c is a valid NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
            let err = std::io::Error::last_os_error();
            let root = unsafe { libc::geteuid() } == 0;
            bail!(
                "cannot write to {} ({err}).\n{}",
                d.display(),
                if root {
                    "Choose a writable prefix with --prefix DIR.".to_string()
                } else {
                    format!(
                        "Run it as root: sudo -E env \"PATH=$PATH\" cargo xtask install{args}\n\
                         or install into a prefix of yours: cargo xtask install --prefix ~/.local \
                         (then add ~/.local/sbin to PATH)"
                    )
                }
            );
        }
    }
    Ok(())
}

/// `cargo xtask install [--prefix DIR] [--uninstall]`, run from where the user ran
/// cargo (a relative prefix is relative to it).
pub fn main(args: &[String]) -> Result<()> {
    let mut prefix = PathBuf::from("/usr/local");
    let mut uninstall = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--prefix" => prefix = it.next().context("--prefix needs a directory")?.into(),
            s if s.starts_with("--prefix=") => prefix = s["--prefix=".len()..].into(),
            "--uninstall" => uninstall = true,
            _ => bail!("usage: cargo xtask install [--prefix DIR] [--uninstall]"),
        }
    }
    let prefix = std::env::current_dir()?.join(prefix);
    let shown = args.iter().map(|a| format!(" {a}")).collect::<String>();
    if uninstall {
        let removed = self::uninstall(&prefix, &shown)?;
        eprintln!("xtask: removed {removed} files from {}", prefix.display());
        return Ok(());
    }
    check_writable(&prefix, Layout::Prefix, &shown)?;
    std::env::set_current_dir(crate::workspace_root())?;
    deps::ensure(deps::BUILD)?;
    let pkg = package()?;
    let files = files(&pkg, Layout::Prefix)?;
    install(&prefix, &files)?;
    eprintln!(
        "xtask: installed {} ({} files) under {}",
        pkg.tools.join(" "),
        files.len(),
        prefix.display()
    );
    let sbin = prefix.join("sbin");
    let on_path =
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d == sbin));
    if !on_path {
        eprintln!("xtask: note: {} is not on your PATH", sbin.display());
    }
    Ok(())
}

/// Installs `files` under `prefix` and records them in the manifest.
pub fn install(prefix: &Path, files: &[File]) -> Result<()> {
    let old = Manifest::read(prefix)?.unwrap_or_default();
    let mut new = Manifest {
        files: files.iter().map(|f| f.rel.clone()).collect(),
        // Directories an earlier install created are still ours to remove.
        dirs: old.dirs.clone(),
    };
    let manifest_dir = Path::new(MANIFEST).parent().unwrap();
    let all_dirs = files
        .iter()
        .map(|f| f.rel.parent().unwrap())
        .chain([manifest_dir]);
    for dir in all_dirs {
        for created in create_dirs(&prefix.join(dir))? {
            let rel = created.strip_prefix(prefix).expect("under the prefix");
            new.dirs.insert(rel.to_path_buf());
        }
    }
    // Recorded before any file is written: an interrupted install can still be
    // uninstalled.
    let mut both = new.files.clone();
    both.extend(old.files.iter().cloned());
    Manifest {
        files: both,
        dirs: new.dirs.clone(),
    }
    .write(prefix)?;
    for f in files {
        put(prefix, f)?;
    }
    // Files an earlier install put there that this one does not (a tool removed).
    for stale in old.files.difference(&new.files) {
        remove_file(&prefix.join(stale))?;
    }
    new.write(prefix)
}

fn remove_file(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// Removes what the manifest lists; returns how many files were removed.
pub fn uninstall(prefix: &Path, args: &str) -> Result<usize> {
    let Some(m) = Manifest::read(prefix)? else {
        bail!(
            "nothing to uninstall: {} does not exist (cargo xtask install writes it)",
            prefix.join(MANIFEST).display()
        );
    };
    check_writable(prefix, Layout::Prefix, args)?;
    let mut removed = 0;
    for f in &m.files {
        removed += usize::from(remove_file(&prefix.join(f))?);
    }
    remove_file(&prefix.join(MANIFEST))?;
    // Deepest first; a directory someone else has put files in stays.
    for d in m.dirs.iter().rev() {
        let path = prefix.join(d);
        match fs::remove_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
                eprintln!("xtask: kept {}: not empty", path.display());
            }
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }
    Ok(removed)
}

/// `cargo xtask deb`: builds `target/debian/tracekit_<version>_<arch>.deb` (in the
/// target directory) and returns its path. `fast` compresses less (xz -1 instead
/// of -9: 6 s instead of 20 s, twice the size), same contents: for the test.
pub fn deb(fast: bool) -> Result<PathBuf> {
    deps::ensure(&[deps::BUILD, deps::DEB].concat())?;
    let root = crate::workspace_root();
    let pkg = package()?;
    let files = files(&pkg, Layout::Debian)?;
    let stage_root = pkg.target_dir.join(DEB_ROOT);
    if stage_root.exists() {
        fs::remove_dir_all(&stage_root)?;
    }
    stage(&stage_root.join("usr"), &files)?;
    // A native package's changelog (Debian's format, `gzip -9n` as dh_compress).
    let doc = stage_root.join("usr/share/doc").join(PACKAGE);
    fs::create_dir_all(&doc)?;
    let gz = Command::new("gzip")
        .args(["-9n", "-c"])
        .arg(root.join(CHANGELOG))
        .output()
        .context("running gzip")?;
    ensure!(
        gz.status.success(),
        "gzip {CHANGELOG} failed ({})",
        gz.status
    );
    fs::write(doc.join("changelog.gz"), gz.stdout)?;

    cargo_deb()?;
    let arch = String::from_utf8(
        Command::new("dpkg")
            .arg("--print-architecture")
            .output()
            .context("running dpkg --print-architecture")?
            .stdout,
    )?;
    let out_dir = pkg.target_dir.join("debian");
    fs::create_dir_all(&out_dir)?;
    let deb = out_dir.join(format!("{PACKAGE}_{}_{}.deb", pkg.version, arch.trim()));
    let mut c = cargo();
    c.arg("deb")
        .args(["--no-build", "--quiet", "-p", PACKAGE, "--output"])
        .arg(&deb)
        .args(fast.then_some("--fast"))
        .current_dir(&root);
    status(c)?;
    let mut w = std::io::stderr().lock();
    writeln!(w, "xtask: built {}", deb.display())?;
    Ok(deb)
}

/// cargo-deb: the one cargo finds (`cargo deb`), installed with `cargo install
/// --locked` (pinned version, into cargo's bin directory) when missing or older
/// than 3, whose `$auto` Depends and asset handling this metadata is written for.
fn cargo_deb() -> Result<()> {
    let mut c = cargo();
    c.args(["deb", "--version"]);
    let version = c
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let major = version
        .as_deref()
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    if major.is_some_and(|m| m >= 3) {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-deb {CARGO_DEB_VERSION} (cargo install --locked)");
    let mut c = cargo();
    c.args(["install", "--quiet", "--locked", "cargo-deb", "--version"])
        .arg(CARGO_DEB_VERSION);
    status(c).context("installing cargo-deb")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trip_and_refuses_escapes() {
        let dir = std::env::temp_dir().join(format!("xtask-manifest-{}", std::process::id()));
        fs::create_dir_all(dir.join("share/tracekit")).unwrap();
        let m = Manifest {
            files: ["sbin/funccount", "share/man/man8/funccount.8"]
                .map(PathBuf::from)
                .into(),
            dirs: ["share/tracekit", "sbin"].map(PathBuf::from).into(),
        };
        m.write(&dir).unwrap();
        assert_eq!(Manifest::read(&dir).unwrap(), Some(m));
        fs::write(dir.join(MANIFEST), "file ../../etc/passwd\n").unwrap();
        assert!(Manifest::read(&dir).is_err());
        fs::write(dir.join(MANIFEST), "file /etc/passwd\n").unwrap();
        assert!(Manifest::read(&dir).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_bin_is_a_tool() {
        let pkg = package().unwrap();
        for tool in ["funccount", "stackcount", "funclatency"] {
            assert!(pkg.tools.iter().any(|t| t == tool), "{:?}", pkg.tools);
        }
        assert!(!pkg.tools.iter().any(|t| t == "xtask" || t == "workload"));
    }
}
