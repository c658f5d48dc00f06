//! Test program: O_DIRECT reads and writes of a block device, of exact count and size.
//!
//! `direct_io DEVICE OP...` opens DEVICE with O_DIRECT, prints `ready` once SIGUSR1
//! is blocked, waits for it, then runs each OP in order: `w:COUNT:SIZE` writes and
//! `r:COUNT:SIZE` reads COUNT blocks of SIZE bytes (a multiple of 512), one after
//! another from offset 0, each waited for (one block request each), and exits.
//! `@OFFSET` after an op starts it at that byte offset; `R` reads and accepts a
//! failed or short read (a device that fails part of a request).
//!
//! `direct_io DEVICE --bench SECS SIZE` does not wait: it writes SIZE-byte blocks
//! for SECS seconds, cycling over the first 64 MiB, and prints `ops N secs S`.

use std::time::{Duration, Instant};

#[path = "ready.rs"]
mod ready;

const ALIGN: usize = 4096;

struct Buf(*mut u8, usize);

impl Buf {
    fn new(size: usize) -> Buf {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer, power-of-two alignment.
        assert_eq!(
            unsafe { libc::posix_memalign(&mut p, ALIGN, size.max(ALIGN)) },
            0
        );
        // SAFETY: p has room for size bytes.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x5a, size) };
        Buf(p.cast(), size)
    }
}

fn open(dev: &str) -> i32 {
    let path = std::ffi::CString::new(dev).unwrap();
    // SAFETY: valid path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_DIRECT) };
    assert!(fd >= 0, "open {dev}: {}", std::io::Error::last_os_error());
    fd
}

fn io(fd: i32, write: bool, buf: &Buf, off: u64) {
    io_as(fd, write, buf, off, true)
}

fn io_as(fd: i32, write: bool, buf: &Buf, off: u64, strict: bool) {
    // SAFETY: buf holds buf.1 bytes, aligned for O_DIRECT.
    let n = unsafe {
        if write {
            libc::pwrite(fd, buf.0.cast(), buf.1, off as libc::off_t)
        } else {
            libc::pread(fd, buf.0.cast(), buf.1, off as libc::off_t)
        }
    };
    if !strict {
        return;
    }
    assert_eq!(
        n,
        buf.1 as isize,
        "{} at {off}: {}",
        if write { "write" } else { "read" },
        std::io::Error::last_os_error()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = args.first().expect("usage: direct_io DEVICE OP...");
    let fd = open(dev);
    if args.get(1).map(String::as_str) == Some("--bench") {
        let secs: f64 = args[2].parse().expect("SECS");
        let size: usize = args[3].parse().expect("SIZE");
        let buf = Buf::new(size);
        let span = (64 << 20) / size as u64;
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(secs);
        let mut ops = 0u64;
        while Instant::now() < end {
            for _ in 0..64 {
                io(fd, true, &buf, (ops % span) * size as u64);
                ops += 1;
            }
        }
        println!("ops {ops} secs {}", start.elapsed().as_secs_f64());
        return;
    }
    struct Op {
        kind: char,
        count: u64,
        size: usize,
        at: Option<u64>,
    }
    let ops: Vec<Op> = args[1..]
        .iter()
        .map(|op| {
            let (op, at) = match op.split_once('@') {
                Some((o, a)) => (o, Some(a.parse().expect("offset"))),
                None => (op.as_str(), None),
            };
            let f: Vec<&str> = op.split(':').collect();
            assert!(
                f.len() == 3 && matches!(f[0], "w" | "r" | "R"),
                "bad op {op}"
            );
            Op {
                kind: f[0].chars().next().unwrap(),
                count: f[1].parse().unwrap(),
                size: f[2].parse().unwrap(),
                at,
            }
        })
        .collect();
    let bufs: Vec<Buf> = ops.iter().map(|op| Buf::new(op.size)).collect();
    let r = ready::Ready::announce();
    r.wait();
    let mut off = 0u64;
    for (op, buf) in ops.iter().zip(&bufs) {
        if let Some(at) = op.at {
            off = at;
        }
        for _ in 0..op.count {
            io_as(fd, op.kind == 'w', buf, off, op.kind != 'R');
            off += op.size as u64;
        }
    }
}
