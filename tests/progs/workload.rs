//! Test workload: makes an exact, known number of calls when told to.
//!
//! `workload MODE N [FILE] [--hold] [--time]` prints `ready` once SIGUSR1 is blocked,
//! waits for SIGUSR1, does the work, and exits (with `--hold`, only after a second
//! SIGUSR1). `--time` prints `ns_per_call X` for the work (benchmarks).
//! Nothing else runs between the signal and the work, so counts are exact.
//!
//! Modes: `funcs` calls tk_alpha N, tk_beta 2N and tk_gamma 3N times; `getpid` and
//! `getppid` call those libc functions N times; `usdt` fires USDT tracekit:tick N
//! times; `read` reads one byte of FILE N times with pread(2) (N vfs_read calls);
//! `rename` renames its thread N times with prctl(PR_SET_NAME) (N task:task_rename).

use std::ffi::CString;
use std::hint::black_box;
use std::io::Write;

#[path = "ready.rs"]
mod ready;

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
        "funcs" | "getpid" | "getppid" | "usdt" | "rename" => -1,
        _ => {
            eprintln!("usage: workload funcs|getpid|getppid|usdt|read|rename N [FILE] [--hold]");
            std::process::exit(2);
        }
    };
    let ready = ready::Ready::announce();
    ready.wait();

    let mut sink = 0u64;
    let start = std::time::Instant::now();
    let calls = match mode {
        "funcs" => 6 * n,
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
        "usdt" => (0..n).for_each(|i| probe::probe!(tracekit, tick, i)),
        "rename" => {
            for i in 0..n {
                let name = CString::new(format!("tk{}", i % 2)).unwrap();
                // SAFETY: PR_SET_NAME with a valid NUL-terminated string.
                let r = unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
                assert_eq!(r, 0, "prctl");
            }
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
}
