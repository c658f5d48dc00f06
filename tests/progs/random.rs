//! Test program: reads random bytes an exact number of times when told to.
//!
//! `random MODE N SIZE` (or several `MODE:N:SIZE`, run in order) prints `ready`
//! once SIGUSR1 is blocked, waits for it, then makes N reads of SIZE bytes each
//! and exits. Modes: `getrandom` (the syscall), `urandom` and `random` (read(2) of
//! /dev/urandom or /dev/random, opened before `ready`). Each read must deliver
//! SIZE bytes (checked), so a tracer sees exactly N events of 8 x SIZE bits.
//! `--rate R` paces the reads at R per second (benchmarks). `--hold` exits only
//! after a second SIGUSR1 (a tool traces it with -p and is scraped meanwhile).

#[path = "ready.rs"]
mod ready;

struct Reads {
    fd: i32,
    n: u64,
    size: usize,
}

fn usage() -> ! {
    eprintln!("usage: random getrandom|urandom|random N SIZE | MODE:N:SIZE... [--rate R]");
    std::process::exit(2)
}

fn reads(mode: &str, n: &str, size: &str) -> Reads {
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
    Reads {
        fd,
        n: n.parse().unwrap_or_else(|_| usage()),
        size: size.parse().unwrap_or_else(|_| usage()),
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // --hold: exit only after a second SIGUSR1 (a tool's -p run then outlives the work).
    let hold = args.iter().any(|a| a == "--hold");
    args.retain(|a| a != "--hold");
    let rate: Option<f64> = args.iter().position(|a| a == "--rate").map(|i| {
        let r = args
            .get(i + 1)
            .and_then(|s| s.parse().ok())
            .expect("--rate R");
        args.drain(i..i + 2);
        r
    });
    let work: Vec<Reads> = if args.len() == 3 && !args[0].contains(':') {
        vec![reads(&args[0], &args[1], &args[2])]
    } else {
        args.iter()
            .map(|a| match a.split(':').collect::<Vec<_>>().as_slice() {
                [m, n, s] => reads(m, n, s),
                _ => usage(),
            })
            .collect()
    };
    if work.is_empty() {
        usage();
    }
    let mut buf = vec![0u8; work.iter().map(|w| w.size).max().unwrap_or(0)];
    let r = ready::Ready::announce();
    r.wait();
    let start = std::time::Instant::now();
    let mut i = 0u64;
    for w in &work {
        for _ in 0..w.n {
            if let Some(rate) = rate {
                // Busy-wait to the i-th slot: sleeps are too coarse at these rates.
                let due = std::time::Duration::from_secs_f64(i as f64 / rate);
                while start.elapsed() < due {
                    std::hint::spin_loop();
                }
            }
            i += 1;
            // SAFETY: buf has room for w.size bytes.
            let got = unsafe {
                if w.fd < 0 {
                    libc::getrandom(buf.as_mut_ptr().cast(), w.size, 0)
                } else {
                    libc::read(w.fd, buf.as_mut_ptr().cast(), w.size)
                }
            };
            assert_eq!(got, w.size as isize, "short read of random bytes");
        }
    }
    if hold {
        r.wait();
    }
}
