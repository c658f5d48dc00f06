//! HTTP for the `--listen` tests (tests/host/serve.rs and the guest): a tool started
//! with `--listen` and requests written by hand on a std TcpStream, so that
//! malformed ones can be sent too and the guest needs no HTTP client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::{spawn, Output, Running};

const T: Duration = Duration::from_secs(300);

/// A tool started with `--listen`, and the address it reported.
pub struct Served {
    pub run: Running,
    pub addr: SocketAddr,
}

impl Served {
    /// Starts `tool args` (which include a --listen) and waits until it is attached.
    pub fn start(tool: &str, args: &[&str]) -> Served {
        let mut run = spawn(&super::tool(tool), args);
        // The address (stderr) and the start line (stdout, or stderr beside
        // JSON) come through two pipes: either may be read first.
        let (mut addr, mut ready) = (None, false);
        while addr.is_none() || !ready {
            let line = run.wait_line(
                |l| l.contains(": serving http://") || super::header_or_tracing(l),
                T,
            );
            if super::header_or_tracing(&line) {
                ready = true;
                continue;
            }
            addr = Some(
                line.split("http://")
                    .nth(1)
                    .and_then(|r| r.split('/').next())
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_else(|| panic!("no address in {line:?}")),
            );
        }
        Served {
            run,
            addr: addr.expect("an address"),
        }
    }

    /// The address for a client on this machine (0.0.0.0 → 127.0.0.1).
    pub fn local(&self) -> SocketAddr {
        let mut a = self.addr;
        if a.ip().is_unspecified() {
            a.set_ip([127, 0, 0, 1].into());
        }
        a
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        request(
            self.local(),
            &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n"),
        )
    }

    pub fn post(&self, path: &str) -> (u16, String) {
        request(
            self.local(),
            &format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"),
        )
    }

    /// Ends the run by POST /stop, as a client would, and returns the tool's
    /// output once it exited with success.
    pub fn stop(self, timeout: Duration) -> Output {
        assert_eq!(self.post("/stop").0, 200);
        let out = self.run.finish(timeout);
        assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
        out
    }
}

/// Sends `raw` and returns the status and body of the answer.
pub fn request(addr: SocketAddr, raw: &str) -> (u16, String) {
    try_request(addr, raw).expect("connect")
}

pub fn try_request(addr: SocketAddr, raw: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let _ = s.write_all(raw.as_bytes());
    Ok(read_answer(&mut s))
}

pub fn read_answer(s: &mut TcpStream) -> (u16, String) {
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |b| b.1).to_string();
    (status, body)
}

/// The value of the sample `name{labels}` (labels as printed) in a scrape.
pub fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{metrics}"))
}
