//! Test program: reads random bytes an exact number of times when told to.
//!
//! `random MODE N SIZE` prints `ready` once SIGUSR1 is blocked, waits for it, then
//! makes N reads of SIZE bytes each and exits. Modes: `getrandom` (the syscall),
//! `urandom` and `random` (read(2) of /dev/urandom or /dev/random, opened before
//! `ready`). Each read must deliver SIZE bytes (checked), so a tracer sees exactly
//! N events of 8 x SIZE bits. `--rate R` paces the reads at R per second
//! (benchmarks).

#[path = "ready.rs"]
mod ready;

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let rate: Option<f64> = args.iter().position(|a| a == "--rate").map(|i| {
        let r = args
            .get(i + 1)
            .and_then(|s| s.parse().ok())
            .expect("--rate R");
        args.drain(i..i + 2);
        r
    });
    let usage = || -> ! {
        eprintln!("usage: random getrandom|urandom|random N SIZE");
        std::process::exit(2)
    };
    let mode = args.get(1).map(String::as_str).unwrap_or_else(|| usage());
    let n: u64 = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| usage());
    let size: usize = args
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| usage());
    let fd = match mode {
        "getrandom" => -1,
        // SAFETY: valid NUL-terminated paths.
        "urandom" => unsafe { libc::open(c"/dev/urandom".as_ptr(), libc::O_RDONLY) },
        "random" => unsafe { libc::open(c"/dev/random".as_ptr(), libc::O_RDONLY) },
        _ => usage(),
    };
    if mode != "getrandom" {
        assert!(fd >= 0, "open /dev/{mode}");
    }
    let mut buf = vec![0u8; size];
    let r = ready::Ready::announce();
    r.wait();
    let start = std::time::Instant::now();
    for i in 0..n {
        if let Some(rate) = rate {
            // Busy-wait to the i-th slot: sleeps are too coarse at these rates.
            let due = std::time::Duration::from_secs_f64(i as f64 / rate);
            while start.elapsed() < due {
                std::hint::spin_loop();
            }
        }
        // SAFETY: buf has room for size bytes.
        let got = unsafe {
            if fd < 0 {
                libc::getrandom(buf.as_mut_ptr().cast(), size, 0)
            } else {
                libc::read(fd, buf.as_mut_ptr().cast(), size)
            }
        };
        assert_eq!(got, size as isize, "short read of random bytes");
    }
}
