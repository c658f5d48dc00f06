//! Stack test program: calls `tk_target` exactly N times through
//! `main -> tk_a -> tk_target` and M times through
//! `main -> tk_b -> tk_c -> stacks::via_helper (inlined) -> tk_target`.
//!
//! `stacks N M [--hold]`: prints `ready` once SIGUSR1 is blocked, waits for SIGUSR1,
//! makes the calls and exits (with `--hold`, only after a second SIGUSR1). `main`
//! is the C entry point, so stacks end in libc's start code, not Rust's runtime.
//!
//! `stacks tree K [--hold]` (benchmarks): calls `tk_target` once through each of K
//! distinct paths of a binary tree of `tk_l`/`tk_r` calls, 14 levels deep: K
//! distinct stacks (K <= 16384).
#![no_main]

use std::hint::black_box;
use std::os::raw::{c_char, c_int};

#[path = "ready.rs"]
mod ready;

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_target(x: u64) -> u64 {
    black_box(x ^ 0x5a)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_a(x: u64) -> u64 {
    // Work after the call keeps it from becoming a tail call.
    black_box(tk_target(x)).wrapping_add(1)
}

/// Inlined into tk_c; debug info records it as an inlined frame.
#[inline(always)]
fn via_helper(x: u64) -> u64 {
    black_box(tk_target(x)).wrapping_mul(5)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_c(x: u64) -> u64 {
    black_box(via_helper(x)).wrapping_add(3)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_b(x: u64) -> u64 {
    black_box(tk_c(x)).wrapping_add(2)
}

const TREE_DEPTH: u32 = 14;

#[inline(always)]
fn step(depth: u32, bits: u64) -> u64 {
    if depth == 0 {
        tk_target(bits)
    } else if bits & 1 == 0 {
        tk_l(depth - 1, bits >> 1)
    } else {
        tk_r(depth - 1, bits >> 1)
    }
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_l(depth: u32, bits: u64) -> u64 {
    black_box(step(depth, bits)).wrapping_add(1)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn tk_r(depth: u32, bits: u64) -> u64 {
    black_box(step(depth, bits)).wrapping_add(2)
}

#[no_mangle]
pub extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    let args: Vec<String> = std::env::args().collect();
    let hold = args.iter().any(|a| a == "--hold");
    let tree = args.get(1).is_some_and(|a| a == "tree");
    let args = if tree { &args[1..] } else { &args[..] };
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let m: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    let ready = ready::Ready::announce();
    ready.wait();
    let mut sink = 0;
    if tree {
        for path in 0..n.min(1 << TREE_DEPTH) {
            sink ^= step(TREE_DEPTH, path);
        }
    } else {
        for i in 0..n {
            sink ^= tk_a(i);
        }
        for i in 0..m {
            sink ^= tk_b(i);
        }
    }
    black_box(sink);
    if hold {
        ready.wait();
    }
    0
}
