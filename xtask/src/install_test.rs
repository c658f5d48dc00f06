//! The install test, run by `cargo xtask test` after the host tests (alone:
//! `cargo xtask install-test`):
//!
//! 1. `cargo xtask install --prefix` into a temporary prefix that already holds
//!    someone else's files: every tool runs `--version`, every man page renders
//!    with `man -l` (tracekit.7 too), no binary has debug info, every binary is static (it runs
//!    chrooted into an empty directory), the installed funccount counts a
//!    workload's calls into libc exactly (an IFUNC among them), the bash, zsh and
//!    fish completions load from where they were installed and complete `--help`;
//!    run as nobody into a root-owned prefix it refuses and says what to do;
//!    `--uninstall` leaves the prefix exactly as it was (every path and file
//!    content compared).
//! 2. `cargo xtask deb` (compressed fast): the package's fields, changelog and
//!    Depends (every library the tools link against, by its Debian package: none),
//!    no lintian error or warning (`packaging/lintian-overrides` says why the tags
//!    static binaries get are expected), then `dpkg -i` on this host: files,
//!    stripped binaries, `--version`, `man -w` (tracekit(7) too), the completions; `dpkg --purge`
//!    leaves every directory it touched as it was.
//!
//! Both use the same release build (cargo builds it once).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};

use crate::install::{self, Package};

pub fn run() -> Result<()> {
    let start = Instant::now();
    let pkg = install::package()?;
    prefix_round_trip(&pkg).context("install test (prefix)")?;
    let prefix_secs = start.elapsed().as_secs_f64();
    deb_round_trip(&pkg).context("install test (.deb)")?;
    eprintln!(
        "xtask: install test passed for {} ({:.0} s: prefix {prefix_secs:.0} s, .deb {:.0} s)",
        pkg.tools.join(" "),
        start.elapsed().as_secs_f64(),
        start.elapsed().as_secs_f64() - prefix_secs
    );
    Ok(())
}

fn run_cmd(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

fn stdout(cmd: &mut Command) -> Result<String> {
    Ok(String::from_utf8(run_cmd(cmd)?.stdout)?)
}

/// Every path under a directory (itself included) with its mode, owner and, for
/// files, content: what "left as it was" compares.
type Snapshot = BTreeMap<PathBuf, (u32, u32, Option<Vec<u8>>)>;

fn snapshot(dir: &Path) -> Result<Snapshot> {
    let mut all = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let meta = match fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", p.display())),
        };
        let content = if meta.is_file() {
            Some(fs::read(&p)?)
        } else {
            None
        };
        if meta.is_dir() {
            for e in fs::read_dir(&p)? {
                todo.push(e?.path());
            }
        }
        all.insert(p, (meta.mode(), meta.uid(), content));
    }
    Ok(all)
}

fn assert_same(what: &str, before: &Snapshot, after: &Snapshot) -> Result<()> {
    let changed: Vec<_> = before
        .keys()
        .chain(after.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|p| before.get(*p) != after.get(*p))
        .map(|p| {
            let how = match (before.contains_key(p), after.contains_key(p)) {
                (true, false) => "removed",
                (false, true) => "left behind",
                _ => "changed",
            };
            format!("  {how}: {}", p.display())
        })
        .collect();
    ensure!(
        changed.is_empty(),
        "{what} did not leave things as they were:\n{}",
        changed.join("\n")
    );
    Ok(())
}

/// `TOOL --version` prints exactly the package's version.
fn check_version(bin: &Path, tool: &str, pkg: &Package) -> Result<()> {
    let out = stdout(Command::new(bin).arg("--version"))?;
    ensure!(
        out == format!("{tool} {}\n", pkg.version),
        "{} --version printed {out:?}",
        bin.display()
    );
    Ok(())
}

/// The ELF sections of `bin`: release binaries carry no debug info; the
/// installed ones keep their symbol table (function names in backtraces), the
/// .deb's do not (Debian policy, as dh_strip).
fn check_sections(bin: &Path, symtab: bool) -> Result<()> {
    let sections = stdout(Command::new("readelf").args(["-S", "-W"]).arg(bin))?;
    let names: Vec<&str> = sections
        .lines()
        .filter_map(|l| l.split(']').nth(1)?.split_whitespace().next())
        .collect();
    ensure!(
        !names.iter().any(|n| n.starts_with(".debug_")),
        "{} has debug sections: {names:?}",
        bin.display()
    );
    ensure!(
        names.contains(&".symtab") == symtab,
        "{}: .symtab {}expected, sections {names:?}",
        bin.display(),
        if symtab { "" } else { "not " }
    );
    Ok(())
}

/// The release tools are static (see `build_tools`): no program interpreter, no
/// shared library; and so `TOOL --version` runs chrooted into a directory that
/// holds nothing but the binary.
fn check_static(bin: &Path, tool: &str, pkg: &Package) -> Result<()> {
    let headers = stdout(Command::new("readelf").args(["-l", "-d", "-W"]).arg(bin))?;
    let dynamic: Vec<&str> = headers
        .lines()
        .filter(|l| l.contains("INTERP") || l.contains("(NEEDED)"))
        .collect();
    ensure!(
        dynamic.is_empty(),
        "{} is not linked statically: {dynamic:?}",
        bin.display()
    );
    let root = crate::workspace_root().join("target/tmp/static-root");
    if root.exists() {
        fs::remove_dir_all(&root)?;
    }
    fs::create_dir_all(&root)?;
    fs::copy(bin, root.join(tool))?;
    let out = stdout(
        Command::new("chroot")
            .arg(&root)
            .arg(format!("/{tool}"))
            .arg("--version"),
    )?;
    ensure!(
        out == format!("{tool} {}\n", pkg.version),
        "chrooted into an empty directory, {tool} --version printed {out:?}"
    );
    fs::remove_dir_all(&root)?;
    Ok(())
}

/// The installed funccount (the release build users get) counts exactly: a
/// workload's 345 malloc and 690 strlen calls into the system's libc, with
/// `-p`, ending with the summary when the workload exits. strlen is an IFUNC,
/// which the static funccount resolves to this CPU's implementation by asking
/// the dynamic helper it embeds (common/src/user/ifunc.rs).
fn check_counts(funccount: &Path) -> Result<()> {
    use crate::bench::harness::{lines_of, wait_for, Workload};
    let root = crate::workspace_root();
    // The debug build `cargo test` made (and the host tests count with): a
    // release one would compile all the package's dependencies once more for
    // target/release, which the tools' `--target` build does not share (90 s).
    let mut c = crate::cargo();
    c.args(["build", "--quiet", "--example", "workload"]);
    crate::status(c)?;
    let w = Workload::start(
        &root.join("target/debug/examples/workload"),
        &["libc".into(), "345".into()],
    )?;
    let mut tool = Command::new(funccount)
        .args(["-p", &w.pid().to_string(), "c:malloc", "c:strlen"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", funccount.display()))?;
    let lines = lines_of(&mut tool);
    let ended = (|| {
        wait_for(
            &lines,
            |l| l.starts_with("Tracing "),
            "funccount's Tracing line",
        )?;
        w.run()?;
        for _ in 0..300 {
            if let Some(status) = tool.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bail!("funccount -p did not end within 30 s of its process's exit")
    })();
    if ended.is_err() {
        let _ = tool.kill();
        let _ = tool.wait();
    }
    // Its stdout and stderr are closed now: this takes every line left.
    let out: Vec<String> = lines.iter().collect();
    let status = ended.with_context(|| format!("funccount printed {out:?}"))?;
    ensure!(
        status.success(),
        "funccount -p ended with {status}: {out:?}"
    );
    let mut rows: Vec<(&str, &str)> = out
        .iter()
        .skip_while(|l| !l.starts_with("FUNC"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Detaching"))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(name, count)| (name.trim(), count.trim()))
        .collect();
    rows.sort();
    ensure!(
        rows == [("malloc", "345"), ("strlen", "690")],
        "the installed funccount counted {out:?}, not 345 malloc and 690 strlen"
    );
    Ok(())
}

/// `man -l PAGE` renders the page: exit 0, the header names the tool and
/// section 8, a NAME section introduces it, and groff says nothing (lintian
/// reports its warnings).
fn check_man(page: &Path, tool: &str) -> Result<()> {
    check_man_page(page, tool, 8)
}

/// tracekit.7, as [`check_man`] checks a tool's page: header `tracekit(7)`.
fn check_overview(page: &Path) -> Result<()> {
    check_man_page(page, "tracekit", 7)
}

fn check_man_page(page: &Path, tool: &str, section: u8) -> Result<()> {
    let out = run_cmd(
        Command::new("man")
            .arg("-l")
            .arg(page)
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "80")
            .env("LC_ALL", "C.UTF-8"),
    )?;
    let text = String::from_utf8(out.stdout)?;
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    ensure!(
        first.starts_with(&format!("{tool}({section})"))
            && first.ends_with(&format!("{tool}({section})")),
        "man -l {}: header {first:?}",
        page.display()
    );
    let name = text
        .lines()
        .skip_while(|l| *l != "NAME")
        .nth(1)
        .unwrap_or("");
    ensure!(
        name.split_whitespace().take(2).eq([tool, "-"]),
        "man -l {}: NAME line {name:?}",
        page.display()
    );
    let stderr = String::from_utf8(out.stderr)?;
    ensure!(
        stderr.is_empty(),
        "man -l {} warned:\n{stderr}",
        page.display()
    );
    Ok(())
}

/// The bash completion loads, registers a function for the tool, and that
/// function completes `TOOL --he` to `--help`.
fn check_bash(script: &Path, tool: &str) -> Result<()> {
    let func = format!("_{tool}");
    let out = stdout(
        Command::new("bash")
            .args(["--norc", "--noprofile", "-c"])
            .arg(format!(
                "source \"$1\" && complete -p {tool} && \
                 COMP_WORDS=({tool} --he) COMP_CWORD=1 COMP_LINE='{tool} --he' && COMP_POINT=${{#COMP_LINE}} && \
                 {func} {tool} --he {tool} && printf 'reply %s\\n' \"${{COMPREPLY[@]}}\""
            ))
            .arg("bash")
            .arg(script),
    )?;
    let mut lines = out.lines();
    let complete = lines.next().unwrap_or("");
    ensure!(
        complete.starts_with("complete ")
            && complete.contains(&format!(" -F {func} "))
            && complete.ends_with(&format!(" {tool}")),
        "bash: complete -p {tool} printed {complete:?}"
    );
    let replies: Vec<&str> = lines.collect();
    ensure!(
        replies == ["reply --help"],
        "bash: {tool} --he<Tab> gave {replies:?}"
    );
    Ok(())
}

/// A HOME without a user's shell configuration.
fn empty_home() -> Result<PathBuf> {
    let home = crate::workspace_root().join("target/tmp/install-test-home");
    fs::create_dir_all(&home)?;
    Ok(home)
}

/// zsh's compinit finds `_TOOL` in `dir` and binds it to the tool.
fn check_zsh(dir: &Path, tool: &str) -> Result<()> {
    let out = stdout(
        Command::new("zsh")
            .args(["-f", "-c"])
            .arg(format!(
                "fpath=(\"$1\" $fpath); autoload -Uz compinit; compinit -u -D; \
                 print -r -- \"$_comps[{tool}]\""
            ))
            .arg("zsh")
            .arg(dir)
            .env("HOME", empty_home()?),
    )?;
    ensure!(
        out == format!("_{tool}\n"),
        "zsh: $_comps[{tool}] is {out:?}"
    );
    Ok(())
}

/// fish autoloads the tool's completions from `dir` and completes `--he` (fish
/// completes only commands on the PATH, so `sbin` is put on it).
fn check_fish(dir: &Path, sbin: &Path, tool: &str) -> Result<()> {
    let path = std::env::join_paths(std::iter::once(sbin.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;
    let out = stdout(
        Command::new("fish")
            .arg("-c")
            .arg(format!(
                "set -p fish_complete_path $argv[1]; complete -C '{tool} --he'"
            ))
            .arg(dir)
            .env("PATH", path)
            .env("HOME", empty_home()?),
    )?;
    let first: Vec<&str> = out
        .lines()
        .map(|l| l.split('\t').next().unwrap_or(""))
        .collect();
    ensure!(first == ["--help"], "fish: {tool} --he<Tab> gave {out:?}");
    Ok(())
}

fn prefix_round_trip(pkg: &Package) -> Result<()> {
    let root = crate::workspace_root();
    let prefix = root.join("target/tmp/install-test");
    if prefix.exists() {
        fs::remove_dir_all(&prefix)?;
    }
    // Someone else's files, in directories the install shares: they must stay.
    fs::create_dir_all(prefix.join("sbin"))?;
    fs::create_dir_all(prefix.join("share/man/man1"))?;
    fs::write(prefix.join("sbin/other-tool"), "#!/bin/sh\n")?;
    fs::write(prefix.join("share/man/man1/other.1"), ".TH OTHER 1\n")?;
    let before = snapshot(&prefix)?;

    let xtask = std::env::current_exe()?;
    run_cmd(
        Command::new(&xtask)
            .arg("install")
            .arg("--prefix")
            .arg(&prefix),
    )?;
    let manifest = fs::read_to_string(prefix.join(install::MANIFEST))?;
    for tool in &pkg.tools {
        check_version(&prefix.join("sbin").join(tool), tool, pkg)?;
        check_sections(&prefix.join("sbin").join(tool), true)?;
        check_static(&prefix.join("sbin").join(tool), tool, pkg)?;
        check_man(&prefix.join(format!("share/man/man8/{tool}.8")), tool)?;
        check_bash(
            &prefix.join(format!("share/bash-completion/completions/{tool}")),
            tool,
        )?;
        check_zsh(&prefix.join("share/zsh/site-functions"), tool)?;
        check_fish(
            &prefix.join("share/fish/vendor_completions.d"),
            &prefix.join("sbin"),
            tool,
        )?;
        ensure!(
            manifest.contains(&format!("file sbin/{tool}\n")),
            "the manifest does not list sbin/{tool}:\n{manifest}"
        );
    }
    let overview = format!("share/man/man7/{}", install::OVERVIEW_PAGE);
    check_overview(&prefix.join(&overview))?;
    ensure!(
        manifest.contains(&format!("file {overview}\n")),
        "the manifest does not list {overview}:\n{manifest}"
    );
    // The manifest lists the installed files and nothing of the other ones.
    let installed = snapshot(&prefix)?;
    let files = manifest.lines().filter(|l| l.starts_with("file ")).count();
    let new_files = installed
        .iter()
        .filter(|(p, (_, _, c))| c.is_some() && !before.contains_key(*p))
        .count();
    ensure!(
        files + 1 == new_files && files == 5 * pkg.tools.len() + 1,
        "{files} files in the manifest, {new_files} new files (the manifest included), \
         {} tools",
        pkg.tools.len()
    );

    check_counts(&prefix.join("sbin/funccount"))?;
    check_refuses_without_root(&xtask, &prefix)?;

    run_cmd(
        Command::new(&xtask)
            .arg("install")
            .arg("--uninstall")
            .arg("--prefix")
            .arg(&prefix),
    )?;
    assert_same(
        "cargo xtask install --uninstall",
        &before,
        &snapshot(&prefix)?,
    )?;
    fs::remove_dir_all(&prefix)?;
    Ok(())
}

/// As nobody, into a root-owned prefix, `cargo xtask install` and `--uninstall`
/// fail at once with what to do, and change nothing. xtask is copied where
/// nobody can run it (the checkout may be in root's home).
fn check_refuses_without_root(xtask: &Path, prefix: &Path) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Not root: the refusal is what the user just saw for real prefixes;
        // nothing here is root-owned and writable to test it with.
        eprintln!("xtask: install test: not root, so the non-root message is not checked");
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("tracekit-xtask-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let copy = dir.join("xtask");
    fs::copy(xtask, &copy)?;
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let before = snapshot(prefix)?;
    let result = (|| -> Result<()> {
        for extra in [&[][..], &["--uninstall"][..]] {
            let out = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(&copy)
                .arg("install")
                .args(extra)
                .arg("--prefix")
                .arg(prefix)
                .current_dir("/")
                .output()
                .context("running setpriv")?;
            let err = String::from_utf8_lossy(&out.stderr);
            ensure!(
                out.status.code() == Some(1)
                    && err.starts_with(&format!(
                        "xtask: error: cannot write to {}",
                        prefix.display()
                    ))
                    && err
                        .contains("Run it as root: sudo -E env \"PATH=$PATH\" cargo xtask install")
                    && err.contains("--prefix ~/.local"),
                "as nobody, install {extra:?} exited {} with:\n{err}",
                out.status
            );
        }
        Ok(())
    })();
    fs::remove_dir_all(&dir)?;
    result?;
    assert_same("install as nobody", &before, &snapshot(prefix)?)
}

/// Directories the package puts files in (and dpkg's own records of it).
const DEB_DIRS: &[&str] = &[
    "/usr/sbin",
    "/usr/share/man/man8",
    "/usr/share/man/man7",
    "/usr/share/bash-completion/completions",
    "/usr/share/zsh/vendor-completions",
    "/usr/share/fish/vendor_completions.d",
    "/usr/share/doc/tracekit",
    "/var/lib/dpkg/info",
];

fn deb_status() -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", "tracekit"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        .filter(|s| s != "not-installed")
}

/// Purges the package if a check failed after `dpkg -i`.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        if deb_status().is_some() {
            let _ = Command::new("dpkg").args(["--purge", "tracekit"]).status();
        }
    }
}

/// The Debian packages of the shared libraries `bin` links against directly.
fn library_packages(bin: &Path) -> Result<BTreeSet<String>> {
    let dynamic = stdout(Command::new("readelf").arg("-d").arg(bin))?;
    let mut pkgs = BTreeSet::new();
    for soname in dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
    {
        let found = stdout(Command::new("dpkg").args(["-S", &format!("*/{soname}")]))?;
        let mut owners: BTreeSet<String> = found
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter(|(_, path)| !path.starts_with("/usr/lib/debug/"))
            .flat_map(|(owners, _)| owners.split(", "))
            .map(|o| o.split(':').next().unwrap_or(o).to_string())
            .collect();
        // cargo-deb leaves libgcc-s1 out of Depends (dpkg-shlibdeps -xlibgcc): it is
        // a required package, on every Debian system.
        owners.retain(|o| o != "libgcc-s1");
        if soname.starts_with("libgcc_s.") {
            continue;
        }
        ensure!(
            owners.len() == 1,
            "{soname} ({}) belongs to {owners:?}, not one package",
            bin.display()
        );
        pkgs.extend(owners);
    }
    Ok(pkgs)
}

fn deb_round_trip(pkg: &Package) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the .deb test installs the package on this host: run it as root");
    }
    if let Some(status) = deb_status() {
        bail!(
            "tracekit is already on this host as a package ({status}); the test installs \
             and purges its own: remove it first with dpkg --purge tracekit"
        );
    }
    let deb = install::deb(true)?;
    // After the build, which may install build dependencies.
    let before: Vec<_> = DEB_DIRS
        .iter()
        .map(|d| snapshot(Path::new(d)))
        .collect::<Result<_>>()?;
    let arch = stdout(Command::new("dpkg").arg("--print-architecture"))?;
    ensure!(
        deb.file_name().and_then(|n| n.to_str())
            == Some(&format!("tracekit_{}_{}.deb", pkg.version, arch.trim())),
        "the package is {}",
        deb.display()
    );
    let field = |name: &str| -> Result<String> {
        Ok(
            stdout(Command::new("dpkg-deb").arg("--field").arg(&deb).arg(name))?
                .trim()
                .to_string(),
        )
    };
    ensure!(
        field("Package")? == "tracekit",
        "Package: {}",
        field("Package")?
    );
    ensure!(
        field("Version")? == pkg.version,
        "Version: {}",
        field("Version")?
    );
    ensure!(
        field("Architecture")? == arch.trim(),
        "Architecture: {}",
        field("Architecture")?
    );
    let depends = field("Depends")?;
    let named: BTreeSet<&str> = depends
        .split(',')
        .filter_map(|d| d.split_whitespace().next())
        .collect();
    let mut libs = BTreeSet::new();
    for tool in &pkg.tools {
        libs.extend(library_packages(
            &pkg.target_dir.join("release").join(tool),
        )?);
    }
    ensure!(
        libs.iter().all(|l| named.contains(l.as_str())) && named.len() == libs.len(),
        "Depends: {depends}, but the tools link against libraries of {libs:?}"
    );

    // lintian: no error or warning, and no override that matched nothing.
    let lint = Command::new("lintian")
        .args([
            "--fail-on",
            "error,warning",
            "--display-info",
            "--tag-display-limit",
            "0",
        ])
        .arg(&deb)
        .output()
        .context("running lintian")?;
    let tags = String::from_utf8_lossy(&lint.stdout);
    ensure!(
        lint.status.success() && !tags.contains("unused-override"),
        "lintian {} ({}):\n{tags}",
        deb.display(),
        lint.status
    );

    let _purge = Purge;
    run_cmd(Command::new("dpkg").arg("-i").arg(&deb))?;
    let listed: BTreeSet<PathBuf> = stdout(Command::new("dpkg").args(["-L", "tracekit"]))?
        .lines()
        .map(PathBuf::from)
        .collect();
    let mut expected = vec![
        PathBuf::from("/usr/share/doc/tracekit/copyright"),
        PathBuf::from("/usr/share/doc/tracekit/README.md"),
        PathBuf::from("/usr/share/doc/tracekit/changelog.gz"),
        PathBuf::from("/usr/share/lintian/overrides/tracekit"),
        PathBuf::from(format!("/usr/share/man/man7/{}.gz", install::OVERVIEW_PAGE)),
    ];
    for tool in &pkg.tools {
        expected.extend(
            [
                format!("/usr/sbin/{tool}"),
                format!("/usr/share/man/man8/{tool}.8.gz"),
                format!("/usr/share/bash-completion/completions/{tool}"),
                format!("/usr/share/zsh/vendor-completions/_{tool}"),
                format!("/usr/share/fish/vendor_completions.d/{tool}.fish"),
            ]
            .map(PathBuf::from),
        );
    }
    for f in &expected {
        ensure!(
            listed.contains(f) && f.is_file(),
            "{} is not installed by the package; dpkg -L:\n{listed:#?}",
            f.display()
        );
    }
    for tool in &pkg.tools {
        check_version(&Path::new("/usr/sbin").join(tool), tool, pkg)?;
        check_sections(&Path::new("/usr/sbin").join(tool), false)?;
        let page = stdout(Command::new("man").args(["-w", tool]).env_remove("MANPATH"))?;
        ensure!(
            page == format!("/usr/share/man/man8/{tool}.8.gz\n"),
            "man -w {tool}: {page:?}"
        );
        check_man(Path::new(page.trim()), tool)?;
        check_bash(
            &Path::new("/usr/share/bash-completion/completions").join(tool),
            tool,
        )?;
        check_zsh(Path::new("/usr/share/zsh/vendor-completions"), tool)?;
        check_fish(
            Path::new("/usr/share/fish/vendor_completions.d"),
            Path::new("/usr/sbin"),
            tool,
        )?;
    }

    let page = stdout(
        Command::new("man")
            .args(["-w", "7", "tracekit"])
            .env_remove("MANPATH"),
    )?;
    ensure!(
        page == format!("/usr/share/man/man7/{}.gz\n", install::OVERVIEW_PAGE),
        "man -w 7 tracekit: {page:?}"
    );
    check_overview(Path::new(page.trim()))?;

    run_cmd(Command::new("dpkg").args(["--purge", "tracekit"]))?;
    ensure!(
        deb_status().is_none(),
        "tracekit is still {:?}",
        deb_status()
    );
    for (dir, before) in DEB_DIRS.iter().zip(&before) {
        assert_same(
            &format!("dpkg --purge ({dir})"),
            before,
            &snapshot(Path::new(dir))?,
        )?;
    }
    Ok(())
}
