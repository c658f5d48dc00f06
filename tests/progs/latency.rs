//! Latency test program: calls whose durations are known.
//!
//! `latency MODE N [--hold]` prints `ready` once SIGUSR1 is blocked, waits for
//! SIGUSR1, makes the calls and exits (with `--hold`, only after a second SIGUSR1).
//!
//! Modes:
//! - `recurse N`: N calls of tk_recurse(3), which calls itself down to depth 1,
//!   where it sleeps 70 ms: 3N calls of tk_recurse, each lasting 70 ms and a bit.
//! - `sleep N`: N calls of tk_sleep, each sleeping 70 ms.
//! - `two N`: N calls of tk_fast (no sleep) and N of tk_slow (70 ms each).
//!
//! 70 ms is just above 2^26 ns (67.1 ms), so a call lands in the
//! [67108864, 134217727] ns bucket even when a loaded machine oversleeps by 60 ms.

use std::hint::black_box;
use std::time::Duration;

#[path = "ready.rs"]
mod ready;

const SLEEP: Duration = Duration::from_millis(70);

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_recurse(depth: u64) -> u64 {
    if depth <= 1 {
        std::thread::sleep(SLEEP);
        return black_box(1);
    }
    // Work after the call keeps it from becoming a tail call.
    black_box(tk_recurse(depth - 1)).wrapping_add(1)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_sleep(x: u64) -> u64 {
    std::thread::sleep(SLEEP);
    black_box(x)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_fast(x: u64) -> u64 {
    black_box(x.wrapping_mul(7))
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_slow(x: u64) -> u64 {
    std::thread::sleep(SLEEP);
    black_box(x)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let hold = args.iter().any(|a| a == "--hold");
    let args: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let mode = args.get(1).map(|s| s.as_str()).unwrap_or("");
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    if !matches!(mode, "recurse" | "sleep" | "two") {
        eprintln!("usage: latency recurse|sleep|two N [--hold]");
        std::process::exit(2);
    }
    let ready = ready::Ready::announce();
    ready.wait();
    let mut sink = 0u64;
    for i in 0..n {
        match mode {
            "recurse" => sink ^= tk_recurse(3),
            "sleep" => sink ^= tk_sleep(i),
            _ => sink ^= tk_fast(i) ^ tk_slow(i),
        }
    }
    black_box(sink);
    if hold {
        ready.wait();
    }
}
