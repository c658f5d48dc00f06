//! Test workload: makes an exact, known number of calls when told to.
//!
//! `workload MODE N [FILE] [--hold] [--time]` prints `ready` once SIGUSR1 is blocked,
//! waits for SIGUSR1, does the work, and exits (with `--hold`, only after a second
//! SIGUSR1). `--time` prints `ns_per_call X` for the work (benchmarks).
//! Nothing else runs between the signal and the work, so counts are exact.
//!
//! Modes: `funcs` calls tk_alpha N, tk_beta 2N and tk_gamma 3N times; `getpid` and
//! `getppid` call those libc functions N times; `thread-getppid` calls getppid N
//! times from a second thread, started before `ready`; `usdt` fires USDT tracekit:tick N
//! times; `read` reads one byte of FILE N times with pread(2) (N vfs_read calls);
//! `libc` calls libc's malloc N, free N, strlen 2N, read 3N (one byte of /dev/zero),
//! pthread_mutex_lock 4N and pthread_mutex_unlock 4N times, through their exported
//! names as any C program does (strlen is an IFUNC); `zlib` calls zlib's crc32 N
//! times (libz.so.1 opened with dlopen before `ready`; crc32 tail-calls crc32_z).
//! `rename` renames its thread N times with prctl(PR_SET_NAME) (N task:task_rename).
//! `oddname` renames its thread once to `a;b\nc\x1b[1m` (a name with a
//! semicolon, a newline and an escape sequence), then calls getppid() N times.
//! `int80` makes N native getppid calls, then N compat (ia32) ones with `int 0x80`,
//! whose number, 64, is semget's in the native table.

use std::ffi::CString;
use std::hint::black_box;
use std::io::Write;

#[path = "ready.rs"]
mod ready;

/// getppid through the ia32 syscall table (`int 0x80`, number 64): a compat
/// syscall, as a 32-bit program makes, from this 64-bit one.
fn ia32_getppid() -> i64 {
    let ret: i64;
    // SAFETY: getppid has no arguments and no effects; the kernel may clobber
    // r8-r11 on this entry.
    unsafe {
        std::arch::asm!(
            "int 0x80",
            inlateout("rax") 64i64 => ret,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            options(nostack),
        );
    }
    ret
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_alpha(x: u64) -> u64 {
    black_box(x.wrapping_add(1))
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_beta(x: u64) -> u64 {
    black_box(x.wrapping_mul(3))
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_gamma(x: u64) -> u64 {
    black_box(x ^ 0x55)
}

/// zlib's `uLong crc32(uLong crc, const Bytef *buf, uInt len)`.
type Crc32 = unsafe extern "C" fn(u64, *const u8, u32) -> u64;

/// Opens the system's libz.so.1 (a Debian library nobody here built) and finds crc32.
fn zlib_crc32() -> Crc32 {
    // SAFETY: dlopen/dlsym with valid strings; the library stays loaded; crc32 has
    // the signature of `Crc32`.
    unsafe {
        let h = libc::dlopen(c"libz.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null(), "dlopen libz.so.1");
        let f = libc::dlsym(h, c"crc32".as_ptr());
        assert!(!f.is_null(), "dlsym crc32");
        std::mem::transmute::<*mut libc::c_void, Crc32>(f)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let hold = args.iter().any(|a| a == "--hold");
    let time = args.iter().any(|a| a == "--time");
    let args: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let mode = args.get(1).map(|s| s.as_str()).unwrap_or("");
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);

    // Open the file before signalling readiness so the work is only the reads.
    let fd = match mode {
        "read" => {
            let path = CString::new(args.get(3).expect("read needs FILE").as_str()).unwrap();
            // SAFETY: valid path string.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
            assert!(fd >= 0, "open failed");
            fd
        }
        // SAFETY: valid path string.
        "libc" => unsafe { libc::open(c"/dev/zero".as_ptr(), libc::O_RDONLY) },
        "funcs" | "getpid" | "getppid" | "thread-getppid" | "usdt" | "zlib" | "rename"
        | "int80" | "oddname" => -1,
        _ => {
            eprintln!(
                "usage: workload funcs|getpid|getppid|thread-getppid|usdt|read|libc|zlib|rename|oddname|int80 N [FILE] [--hold]"
            );
            std::process::exit(2);
        }
    };
    let crc32 = (mode == "zlib").then(zlib_crc32);
    let mut mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    let text = c"tracekit";
    let ready = ready::Ready::blocked();
    // The thread exists (and inherits the blocked SIGUSR1) before `ready` is read.
    let (go, gate) = std::sync::mpsc::channel::<()>();
    let worker = (mode == "thread-getppid").then(|| {
        std::thread::spawn(move || {
            gate.recv().unwrap();
            // SAFETY: getppid has no preconditions.
            (0..n).fold(0u64, |s, _| s ^ unsafe { libc::getppid() } as u64)
        })
    });
    ready.print();
    ready.wait();

    let mut sink = 0u64;
    let start = std::time::Instant::now();
    let calls = match mode {
        "funcs" => 6 * n,
        "libc" => 18 * n,
        "int80" => 2 * n,
        _ => n,
    };
    match mode {
        "funcs" => {
            for i in 0..n {
                sink ^= tk_alpha(i);
            }
            for i in 0..2 * n {
                sink ^= tk_beta(i);
            }
            for i in 0..3 * n {
                sink ^= tk_gamma(i);
            }
        }
        // SAFETY: getpid/getppid have no preconditions.
        "getpid" => (0..n).for_each(|_| sink ^= unsafe { libc::getpid() } as u64),
        "getppid" => (0..n).for_each(|_| sink ^= unsafe { libc::getppid() } as u64),
        "thread-getppid" => {
            go.send(()).unwrap();
            sink ^= worker.expect("started above").join().unwrap();
        }
        "usdt" => (0..n).for_each(|i| probe::probe!(tracekit, tick, i)),
        "libc" => {
            let mut b = [0u8; 1];
            // SAFETY: plain libc calls on valid pointers; every allocation is freed.
            unsafe {
                for _ in 0..n {
                    let p = libc::malloc(black_box(16));
                    black_box(p);
                    libc::free(p);
                }
                for _ in 0..2 * n {
                    sink ^= libc::strlen(black_box(text.as_ptr())) as u64;
                }
                for _ in 0..3 * n {
                    assert_eq!(libc::read(fd, b.as_mut_ptr().cast(), 1), 1, "read");
                }
                for _ in 0..4 * n {
                    libc::pthread_mutex_lock(&mut mutex);
                    libc::pthread_mutex_unlock(&mut mutex);
                }
            }
        }
        "zlib" => {
            let crc32 = crc32.expect("zlib's crc32");
            let data = b"tracekit";
            for _ in 0..n {
                // SAFETY: crc32(crc, buf, len) reads len bytes of buf.
                sink ^= unsafe { crc32(sink, data.as_ptr(), data.len() as u32) };
            }
        }
        "rename" => {
            for i in 0..n {
                let name = CString::new(format!("tk{}", i % 2)).unwrap();
                // SAFETY: PR_SET_NAME with a valid NUL-terminated string.
                let r = unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
                assert_eq!(r, 0, "prctl");
            }
        }
        "oddname" => {
            // SAFETY: PR_SET_NAME with a valid NUL-terminated string.
            let r = unsafe { libc::prctl(libc::PR_SET_NAME, c"a;b\nc\x1b[1m".as_ptr()) };
            assert_eq!(r, 0, "prctl");
            // SAFETY: getppid has no preconditions.
            (0..n).for_each(|_| sink ^= unsafe { libc::getppid() } as u64);
        }
        "int80" => {
            let mut ppid = 0;
            for _ in 0..n {
                // SAFETY: getppid has no preconditions.
                ppid = unsafe { libc::getppid() } as i64;
            }
            for _ in 0..n {
                assert_eq!(ia32_getppid(), ppid, "int 0x80 getppid");
            }
            sink ^= ppid as u64;
        }
        "read" => {
            let mut b = [0u8; 1];
            for _ in 0..n {
                // SAFETY: fd is open, b is a valid 1-byte buffer.
                let r = unsafe { libc::pread(fd, b.as_mut_ptr().cast(), 1, 0) };
                assert_eq!(r, 1, "pread");
            }
        }
        _ => unreachable!(),
    }
    black_box(sink);
    if time {
        let ns = start.elapsed().as_nanos() as f64 / calls.max(1) as f64;
        println!("ns_per_call {ns:.2}");
        std::io::stdout().flush().unwrap();
    }
    if hold {
        ready.wait();
    }
    // Leave without exit-time cleanup (Rust's drops, glibc's _dl_fini), which calls
    // malloc, free and pthread_mutex_lock itself: the counts are the work's alone.
    // SAFETY: nothing is left to flush (stdout was flushed above).
    unsafe { libc::_exit(0) }
}
