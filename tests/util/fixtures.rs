//! What a test traces or runs in: private scratch directories, cgroups, loop
//! devices, C programs compiled at test time (and stripped copies), and command
//! prefixes that hide debug files or the kernel's BTF.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use super::{Reaped, Traced};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

/// A private directory removed on drop, for files no other test touches.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tracekit-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// A private copy of `bin`: uprobes on it see only the processes of this test.
    pub fn copy(&self, bin: &Path) -> PathBuf {
        let dst = self.0.join(bin.file_name().unwrap());
        std::fs::copy(bin, &dst).unwrap();
        dst
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A cgroup v2 made for one test under the cgroup2 mount (`name` relative to
/// it, parents first), removed on drop once its processes are gone.
pub struct Cgroup {
    /// Its path below the cgroup2 mount, as `--cgroup` takes it.
    pub rel: String,
    pub path: PathBuf,
}

/// Where the cgroup v2 file system is mounted.
pub fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .expect("no cgroup2 mount")
}

impl Cgroup {
    pub fn new(name: &str) -> Cgroup {
        let mount = cgroup2_mount();
        let rel = format!("tracekit-test-{}/{name}", std::process::id());
        let path = mount.join(&rel);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Cgroup { rel, path }
    }

    /// Moves process `pid` into this cgroup.
    pub fn adopt(&self, pid: u32) {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // A just-reaped process can take a moment to leave the cgroup.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.path).is_ok() {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        if let Some(parent) = self.path.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// A command prefix that runs `tool` as on a machine without debug packages: in a
/// private mount namespace with an empty tmpfs over /usr/lib/debug (libc6-dbg and
/// every other debug file hidden). For [`trace_workload_via`] and [`spawn`].
pub fn without_debug_files(tool: &Path) -> Vec<String> {
    with_empty_dir("/usr/lib/debug", tool)
}

/// A command prefix that runs `tool` as on a kernel without BTF: an empty tmpfs
/// over /sys/kernel/btf, as [`without_debug_files`].
pub fn without_kernel_btf(tool: &Path) -> Vec<String> {
    with_empty_dir("/sys/kernel/btf", tool)
}

/// A command prefix that runs `tool` in a private mount namespace with an empty
/// tmpfs over `dir`.
fn with_empty_dir(dir: &str, tool: &Path) -> Vec<String> {
    [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        &format!("mount -t tmpfs none {dir} && exec \"$0\" \"$@\""),
        tool.to_str().unwrap(),
    ]
    .map(str::to_string)
    .to_vec()
}

/// Compiles tests/progs/userfuncs.c with gcc and `flags` (no -g unless given) into
/// `dir` as `name`: a C binary built at test time, as distributions build them.
pub fn build_userfuncs(dir: &Scratch, name: &str, flags: &[&str]) -> PathBuf {
    let args: Vec<&str> = std::iter::once("-O1")
        .chain(flags.iter().copied())
        .collect();
    gcc(dir, "userfuncs", name, &args)
}

/// `gcc -o DIR/OUT tests/progs/PROG.c ARGS`, asserted: a test program built
/// with the flags a case needs (-O2, -shared, -static, libraries).
pub fn gcc(dir: &Scratch, prog: &str, out: &str, args: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/progs")
        .join(format!("{prog}.c"));
    let out = dir.0.join(out);
    let st = Command::new("gcc")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .args(args)
        .status()
        .expect("gcc");
    assert!(st.success(), "gcc {} {args:?} failed", src.display());
    out
}

/// A copy of `bin` without .symtab or debug sections (`objcopy --strip-all`), as
/// distributions ship binaries: only .dynsym is left.
pub fn stripped_copy(dir: &Scratch, bin: &Path, name: &str) -> PathBuf {
    let out = dir.0.join(name);
    let st = Command::new("objcopy")
        .arg("--strip-all")
        .arg(bin)
        .arg(&out)
        .status()
        .expect("objcopy");
    assert!(st.success(), "objcopy failed");
    out
}

/// Compiles the C test program `tests/progs/NAME.c` with the system compiler
/// (`cc -g -O1`) into `dir`.
pub fn build_c(dir: &Scratch, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/progs")
        .join(format!("{name}.c"));
    cc(&src, dir.0.join(name))
}

/// `cc -g -O1 -o out src`, asserted: how every C test program but userfuncs is built.
fn cc(src: &Path, out: PathBuf) -> PathBuf {
    let st = Command::new("cc")
        .args(["-g", "-O1", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .expect("running cc (package gcc)");
    assert!(st.success(), "cc {} failed", src.display());
    out
}

/// A C test program started with a piped stdin, past its "ready" line; `go`
/// writes the line it waits for.
pub struct CProg {
    child: Reaped,
    pub pid: u32,
}

impl CProg {
    pub fn start(bin: &Path) -> CProg {
        CProg::start_with(bin, &[])
    }

    /// [`CProg::start`] with arguments.
    pub fn start_with(bin: &Path, args: &[&str]) -> CProg {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{} did not start", bin.display());
        let pid = child.id();
        CProg {
            child: Reaped(child),
            pid,
        }
    }
}

impl Traced for CProg {
    fn go(&mut self) {
        use std::io::Write;
        let mut stdin = self.child.0.stdin.take().expect("go once");
        stdin.write_all(b"go\n").unwrap();
    }

    fn wait(self) -> ExitStatus {
        self.child.wait()
    }
}

/// Writes a C program with `n` functions `fn_0000`.. (a few instructions each, so
/// thousands share page offsets) and compiles it. It prints "ready", then calls
/// every function once per line read from stdin, and exits at end of input.
pub fn build_many_functions(dir: &Scratch, n: usize) -> PathBuf {
    let mut src = String::from("#include <stdio.h>\n");
    for i in 0..n {
        src.push_str(&format!(
            "__attribute__((noinline, used)) int fn_{i:04}(int x) {{ __asm__ volatile(\"\"); return x + {i}; }}\n"
        ));
    }
    src.push_str("int (*const fns[])(int) = {");
    for i in 0..n {
        src.push_str(&format!("fn_{i:04},"));
    }
    src.push_str(
        "};\nint main(void) { char b[8]; volatile int s = 0; printf(\"ready\\n\"); fflush(stdout);\n\
         while (fgets(b, sizeof b, stdin)) for (unsigned i = 0; i < sizeof fns / sizeof *fns; i++) s += fns[i](i);\n\
         return 0; }\n",
    );
    let c = dir.0.join("many.c");
    std::fs::write(&c, src).unwrap();
    cc(&c, dir.0.join("many"))
}

/// A loop device over a fresh file of `mib` MiB (`losetup`), detached on drop.
pub struct LoopDev {
    pub dev: String,
    /// The backing file.
    pub file: PathBuf,
    _dir: Scratch,
}

impl LoopDev {
    pub fn new(mib: u64) -> LoopDev {
        Self::with_flags(mib, &[])
    }

    /// With `losetup` flags, e.g. `--direct-io=on`.
    pub fn with_flags(mib: u64, flags: &[&str]) -> LoopDev {
        let dir = Scratch::new();
        let file = dir.0.join("disk.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .args(flags)
            .arg(&file)
            .output()
            .expect("losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
        LoopDev {
            dev,
            file,
            _dir: dir,
        }
    }

    /// `loopN`, as `-d` takes it.
    pub fn name(&self) -> &str {
        self.dev.trim_start_matches("/dev/")
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// Runs `tool -p PID args` on the C test program `bin prog_args` (a [`CProg`]):
/// waits for the tool's line that `ready` accepts, lets the program run, and
/// returns the tool's output once both have exited with success.
pub fn trace_cprog(
    tool: &Path,
    bin: &Path,
    prog_args: &[&str],
    args: &[&str],
    ready: impl Fn(&str) -> bool,
) -> super::Output {
    let p = CProg::start_with(bin, prog_args);
    let pid = p.pid.to_string();
    let mut all = vec!["-p", pid.as_str()];
    all.extend_from_slice(args);
    let mut t = super::spawn(tool, &all);
    t.wait_line(ready, Duration::from_secs(60));
    t.finish_after(p, Duration::from_secs(120))
}
