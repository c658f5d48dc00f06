//! Test program for `trace`: calls with known arguments, a known number of times.
//!
//! `traced MODE N [--hold]` prints `ready`, waits for SIGUSR1, does the work and
//! exits at once (with `--hold`, only after a second SIGUSR1). Modes:
//! - `calls N`: tt_caller(i) for i in 0..N, which calls tt_args(i, 10 * i, "name-i").
//! - `recurse N`: N calls of tt_recurse(3), which calls itself down to depth 1;
//!   tt_recurse(d) returns 100 * d + 7, so every call's retval is known from its arg.
//! - `lseek N`: lseek(fd of /dev/null, 1000 + i, SEEK_SET) for i in 0..N.
//! - `usdt N`: USDT probe traced:pair(i, 2 * i) for i in 0..N.
//! - `write N`: write(fd of /dev/null, buf, 100 + i) for i in 0..N (vfs_write's
//!   count, and its return value, are 100 + i; the file's name is "null").
//! - `asm N`: tt_asm(x) for i in 0..N, x = i - 1 as a 32-bit int in a register
//!   whose upper half is 0x7777 (as C leaves it: not part of an int);
//!   tt_asm's instructions are known (below).
//! - `fnptr N`: tt_ptr(p) for p = puts, then puts + 5, N times.
//! - `back N`: lseek(fd of /dev/null, -1 - i, SEEK_CUR) for i in 0..N.
//! - `deep N`: tt_recurse(N), N calls nested, then tt_recurse(3).
//! - `bytes N`: tt_bytes(buf, i) for i in 0..N, buf = 'A', 0, i, 0xff: as C
//!   strings all the same ("A"), as bytes each its own.
//! - `threads N`: a second thread calls tt_hold(5), which returns 12 only once
//!   the main thread, having waited for it to be inside, has made the N calls of
//!   `calls N`: two threads in traced functions at once, every time.

use std::ffi::CString;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};

#[path = "ready.rs"]
mod ready;

#[no_mangle]
#[inline(never)]
pub extern "C" fn tt_args(a: u64, b: i64, name: *const libc::c_char) -> u64 {
    black_box(a.wrapping_add(b as u64).wrapping_add(name as u64))
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tt_caller(i: u64) -> u64 {
    let name = CString::new(format!("name-{i}")).unwrap();
    black_box(tt_args(i, 10 * i as i64, name.as_ptr()))
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tt_bytes(buf: *const u8, i: u64) -> u64 {
    black_box(buf as u64 ^ i)
}

// tt_asm(x) = x + 0x11223344, 9 bytes whose instructions begin at +0 (mov, 5
// bytes), +5 (add, 3) and +8 (ret): for trace's func+OFFSET checks.
std::arch::global_asm!(
    ".globl tt_asm",
    ".type tt_asm, @function",
    "tt_asm:",
    "mov eax, 0x11223344",
    "add rax, rdi",
    "ret",
    ".size tt_asm, . - tt_asm",
);

extern "C" {
    fn tt_asm(x: u64) -> u64;
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tt_ptr(p: usize) -> u64 {
    black_box(p as u64)
}

static HELD: AtomicBool = AtomicBool::new(false);
static DONE: AtomicBool = AtomicBool::new(false);

#[no_mangle]
#[inline(never)]
pub extern "C" fn tt_hold(x: u64) -> u64 {
    HELD.store(true, Ordering::SeqCst);
    while !DONE.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    black_box(x + 7)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tt_recurse(depth: u64) -> u64 {
    if depth > 1 {
        black_box(tt_recurse(black_box(depth - 1)));
    }
    black_box(100 * depth + 7)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let hold = args.iter().any(|a| a == "--hold");
    let mode = args.get(1).map(String::as_str).unwrap_or("");
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    if !matches!(
        mode,
        "calls"
            | "recurse"
            | "lseek"
            | "usdt"
            | "write"
            | "bytes"
            | "deep"
            | "asm"
            | "fnptr"
            | "back"
            | "threads"
    ) {
        eprintln!(
            "usage: traced calls|recurse|lseek|usdt|write|bytes|deep|asm|fnptr|back|threads N [--hold]"
        );
        std::process::exit(2);
    }
    // SAFETY: valid path string.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
    let buf = [0u8; 256];
    assert!(fd >= 0, "open /dev/null");
    let ready = ready::Ready::announce();
    ready.wait();
    let mut sink = 0u64;
    if mode == "deep" {
        sink ^= tt_recurse(n) ^ tt_recurse(3);
    }
    let holder = (mode == "threads").then(|| {
        let t = std::thread::spawn(|| tt_hold(5));
        while !HELD.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        t
    });
    for i in 0..n {
        match mode {
            "calls" | "threads" => sink ^= tt_caller(i),
            "recurse" => sink ^= tt_recurse(3),
            "deep" => break,
            // SAFETY: lseek on an open descriptor.
            "back" => sink ^= unsafe { libc::lseek(fd, -1 - i as i64, libc::SEEK_CUR) } as u64,
            "fnptr" => {
                let puts = libc::puts as *const () as usize;
                sink ^= tt_ptr(black_box(puts)) ^ tt_ptr(black_box(puts + 5));
            }
            // SAFETY: tt_asm reads only its argument register.
            "asm" => {
                sink ^=
                    unsafe { tt_asm(black_box(0x7777 << 32 | (i as u32).wrapping_sub(1) as u64)) }
            }
            "bytes" => sink ^= tt_bytes(black_box([b'A', 0, i as u8, 0xff]).as_ptr(), i),
            // SAFETY: lseek on an open descriptor.
            "lseek" => sink ^= unsafe { libc::lseek(fd, 1000 + i as i64, libc::SEEK_SET) } as u64,
            // SAFETY: write from a valid buffer of at least 100 + i bytes (N <= 156).
            "write" => {
                sink ^= unsafe { libc::write(fd, buf.as_ptr().cast(), 100 + i as usize) } as u64
            }
            _ => probe::probe!(traced, pair, i, 2 * i),
        }
    }
    if let Some(t) = holder {
        DONE.store(true, Ordering::SeqCst);
        sink ^= t.join().unwrap();
    }
    black_box(sink);
    if hold {
        ready.wait();
    }
    // SAFETY: nothing to flush; exit without exit-time work.
    unsafe { libc::_exit(0) }
}
