//! `--listen`: a small blocking HTTP server beside a tool's run loop.
//!
//! `GET /metrics` (Prometheus / OpenMetrics), `GET /summary` (the `--json`
//! object of the next summary), `POST /stop` (final summary, detach, exit 0) and
//! `POST /reset` (zero what the next summary counts from).
//!
//! Connections are read and written by their own threads; only a well-formed,
//! authorised request reaches the tool's thread, which builds its answer (a
//! snapshot of the maps) between reads of its ring buffer, hands it to the
//! connection's thread and goes on: the tracing loop never reads, writes or
//! waits for a socket, so no client, however slow, slows the tracing.
//!
//! The trust model (also in tracekit(7)): `GET` is open to whoever reaches the
//! address. `POST` needs the `--listen-token` when one is given; without one,
//! it is accepted only from root or the tool's own user on this machine (the
//! owner of the client's socket, asked of the kernel: [`crate::sys::sockets`]),
//! so another local account cannot stop or reset the tracing. A request from
//! a web page (any `Origin`) is refused, and so, on a loopback address, is a
//! `Host` that is not a loopback name: a page in the administrator's browser
//! can neither post to the tool (CSRF) nor read it through a rebound DNS name.
//!
//! Slots cannot be hoarded: at most [`MAX_CONNECTIONS`] at once, of which
//! [`TRUSTED_ONLY`] are kept for root on this machine, at most [`PER_PEER`] per
//! address (per user on loopback), and a client has [`FIRST_BYTE`] to begin its
//! request and [`HEAD_TIMEOUT`] to finish its head: a slowloris holds few slots,
//! briefly, and the administrator's scrape or `POST /stop` still gets through.
//! A client that finds every slot it may take held still gets a chance (the
//! waiting room, one per peer): if its whole head comes within [`WAITING`],
//! it takes the slot of the oldest connection still sending its head. So
//! slow or silent clients, however fast they reconnect and from however many
//! addresses, cannot keep out a client that asks at once (a scraper, an
//! authenticated `POST /stop` through a `0.0.0.0` bind), which a reserved slot
//! alone could not promise: whether a request is authenticated is known only
//! once its head is read.
//!
//! The parser is `httparse` (hyper's); tiny_http 0.12 was not used: it has no
//! read timeouts, no bound on a header line, and a thread per connection
//! without a cap.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::diag::{escape, warn};
use crate::serve::metrics::Metrics;

/// Connections served at once; more are answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 16;
/// Of [`MAX_CONNECTIONS`], how many only root (or the tool's user) on this
/// machine may take: other clients, however many, leave them free.
pub const TRUSTED_ONLY: usize = 4;
/// Connections one peer holds at once: an address, or a user on loopback.
pub const PER_PEER: usize = 4;
/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 8192;
/// Time a client has to send the first byte of its request: clients send it as
/// they connect; an idle connection only holds a slot.
pub const FIRST_BYTE: Duration = Duration::from_secs(1);
/// Time a client has to send its whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a client that found no slot has to send its whole head, to take the
/// slot of a connection still sending one.
pub const WAITING: Duration = Duration::from_millis(200);
/// Clients in the waiting room at once (and one per peer).
const WAITING_ROOM: usize = 16;
/// Time a client has to take each part of the answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests waiting for the tool's thread; more are answered 503.
const QUEUE: usize = 8;
/// Longest wait for the tool's answer (a /stop answers after detaching).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// The tools that serve `--listen` (the flag is common; others refuse it).
const SERVING: &[&str] = &[
    "funccount",
    "funclatency",
    "vfsreadlat",
    "disksnoop",
    "urandomread",
    "stackcount",
];

/// What a tool gives its server: its metrics and summaries, read when asked.
pub trait Served {
    /// Prints the summary of an interval, or the final one (`last`), as the tool
    /// does without `--listen`; it then counts from zero.
    fn print(&mut self, last: bool) -> Result<()>;
    /// The tool's metrics, cumulative since start (never reset by `-i` or
    /// `/reset`), read now.
    fn metrics(&mut self, m: &mut Metrics) -> Result<()>;
    /// The `--json` object the next summary would print, without consuming it.
    fn summary(&mut self) -> Result<serde_json::Value>;
    /// Zeroes what the next summary counts from.
    fn reset(&mut self) -> Result<()>;
    /// `GET /stacks`: folded stacks since the start (stackcount); None: 404.
    fn folded(&mut self) -> Option<Result<String>> {
        None
    }
    /// `GET /debug/pprof/profile`: marks what was counted so far, as a mark
    /// the tool keeps until [`Served::profile_since`] takes it (stackcount);
    /// None: 404.
    fn profile_mark(&mut self) -> Option<Result<u64>> {
        None
    }
    /// The gzipped pprof profile of what was counted since `mark`, over
    /// `duration` from `start`; the mark is dropped.
    fn profile_since(
        &mut self,
        _mark: u64,
        _start: std::time::SystemTime,
        _duration: Duration,
    ) -> Result<Vec<u8>> {
        anyhow::bail!("this tool has no stacks")
    }
    /// Whether the tool reads a ring buffer ([`Served::poll`]) while the run
    /// waits; without one the run sleeps until its next summary or a stop.
    fn polls(&self) -> bool {
        false
    }
    /// Reads what BPF sent for at most `timeout`. An error (a closed stdout)
    /// ends the run with it.
    fn poll(&mut self, _timeout: Duration) -> Result<()> {
        Ok(())
    }
    /// After the run: what is still buffered, and the final report of losses.
    fn drain(&mut self) -> Result<()> {
        Ok(())
    }
    /// Records lost so far (a ring buffer's), added to `/metrics`' lost records.
    fn lost(&self) -> Option<u64> {
        None
    }
    /// Whether the tool prints summaries; a per-event tool prints each event as
    /// it comes, and its run has no summary to time or print.
    fn prints_summaries(&self) -> bool {
        true
    }
}

/// The [`Served`] side of a tool that does not serve `--listen` (refused by
/// [`check_tool`]) and prints each event as it comes (trace).
pub struct Unserved;

impl Served for Unserved {
    fn print(&mut self, _last: bool) -> Result<()> {
        Ok(())
    }
    fn metrics(&mut self, _m: &mut Metrics) -> Result<()> {
        Ok(())
    }
    fn summary(&mut self) -> Result<serde_json::Value> {
        Ok(serde_json::Value::Null)
    }
    fn reset(&mut self) -> Result<()> {
        Ok(())
    }
    fn prints_summaries(&self) -> bool {
        false
    }
}

/// `--listen ADDR:PORT`: `:PORT` binds 127.0.0.1; ADDR may be a name
/// (`localhost:9435`) or an IPv6 address in brackets (`[::1]:9435`).
pub fn parse_listen(s: &str) -> std::result::Result<SocketAddr, String> {
    let bad = |why: &str| format!("'{}' is not ADDR:PORT or :PORT ({why})", escape(s));
    let t = s.trim();
    if let Some(port) = t.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    if !t.contains(':') {
        return Err(bad("no port"));
    }
    match t.to_socket_addrs() {
        Ok(mut addrs) => addrs.next().ok_or_else(|| bad("the name has no address")),
        Err(e) => Err(bad(&e.to_string())),
    }
}

/// Reads `--listen-token FILE`: its content without surrounding whitespace. Only
/// a regular file of at most [`TOKEN_MAX`] bytes: a FIFO would block the start,
/// /dev/zero would fill the memory.
pub fn read_token(path: &Path) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let what = || format!("reading the --listen-token file {}", path.display());
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .with_context(what)?;
    if !file.metadata().with_context(what)?.is_file() {
        bail!(
            "the --listen-token file {} is not a regular file",
            path.display()
        );
    }
    let mut bytes = Vec::new();
    file.take(TOKEN_MAX + 1)
        .read_to_end(&mut bytes)
        .with_context(what)?;
    if bytes.len() as u64 > TOKEN_MAX {
        bail!(
            "the --listen-token file {} is over {TOKEN_MAX} bytes: it holds one token",
            path.display()
        );
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("the --listen-token file {} is not text", path.display()))?;
    let token = text.trim().to_string();
    if token.is_empty() {
        bail!("the --listen-token file {} is empty", path.display());
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!(
            "the --listen-token file {} must hold one token (no spaces inside)",
            path.display()
        );
    }
    use std::os::unix::fs::PermissionsExt;
    if let Ok(md) = std::fs::metadata(path) {
        if md.permissions().mode() & 0o077 != 0 {
            warn(&format!(
                "the --listen-token file {} is readable by other users (chmod 600 it)",
                path.display()
            ));
        }
    }
    Ok(token)
}

/// The largest --listen-token file read.
const TOKEN_MAX: u64 = 4096;

/// Refuses `--listen` in a tool that does not serve it.
pub fn check_tool(tool: &str) -> Result<()> {
    if !SERVING.contains(&tool) {
        bail!(
            "--listen is not supported by {tool} (it is by {})",
            SERVING.join(", ")
        );
    }
    Ok(())
}

/// The endpoints the tool's thread answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Metrics,
    Summary,
    Stop,
    Reset,
    Stacks,
    /// `GET /debug/pprof/profile?seconds=N`: the stacks of the next N seconds.
    Profile(u32),
}

/// `seconds` of `/debug/pprof/profile` when none is given (Go's default).
pub const PROFILE_SECONDS: u32 = 30;
/// The longest profile asked for (a connection is held that long).
pub const MAX_PROFILE_SECONDS: u32 = 300;

/// An answer: status, content type, body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn ok(content_type: &'static str, body: String) -> Reply {
        Reply::bytes(content_type, body.into_bytes())
    }

    pub fn bytes(content_type: &'static str, body: Vec<u8>) -> Reply {
        Reply {
            status: 200,
            content_type,
            body,
        }
    }

    pub fn json(v: &serde_json::Value) -> Reply {
        Reply::ok("application/json", format!("{v}\n"))
    }

    pub fn error(status: u16, msg: &str) -> Reply {
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{msg}\n").into_bytes(),
        }
    }
}

/// A request for the tool's thread, answered with [`Request::answer`].
pub struct Request {
    pub route: Route,
    reply: SyncSender<Reply>,
    pending: Arc<Pending>,
}

impl Request {
    /// Hands the answer to the connection's thread, which writes it; this
    /// returns at once, whatever the client does.
    pub fn answer(self, reply: Reply) {
        self.pending.add(1);
        if self.reply.try_send(reply).is_err() {
            // The connection's thread gave up waiting (the client is gone).
            self.pending.add(-1);
        }
    }
}

/// Answers handed to connection threads and not yet written: the end of the
/// run waits for them ([`Server::settle`]), so that the answer to `POST /stop`
/// reaches its client before the process exits.
#[derive(Default)]
struct Pending {
    n: Mutex<isize>,
    cv: Condvar,
}

impl Pending {
    fn add(&self, d: isize) {
        let mut n = self.n.lock().expect("pending lock");
        *n += d;
        self.cv.notify_all();
    }
}

/// The listening server; requests arrive through [`Server::next`].
pub struct Server {
    rx: Receiver<Request>,
    addr: SocketAddr,
    pending: Arc<Pending>,
}

impl Server {
    /// Binds `addr` and starts accepting. Without `token`, POST answers only
    /// root or the tool's user on this machine. A non-loopback address gets a
    /// one-line warning.
    pub fn start(addr: SocketAddr, token: Option<String>) -> Result<Server> {
        let listener =
            TcpListener::bind(addr).with_context(|| format!("--listen {addr}: binding"))?;
        let addr = listener.local_addr().context("--listen: local address")?;
        if !addr.ip().is_loopback() {
            warn(&format!(
                "--listen {addr} is not a loopback address: /metrics and /summary are open to the network; \
                 POST /stop and /reset {}",
                if token.is_some() {
                    "need the --listen-token"
                } else {
                    "are refused from other hosts (give --listen-token FILE to allow them)"
                }
            ));
        }
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let pending = Arc::new(Pending::default());
        let ctx = Arc::new(Shared {
            token: token.map(Into::into),
            bound: addr,
            slots: Mutex::new(Slots::default()),
            pending: pending.clone(),
            // SAFETY: geteuid has no preconditions.
            euid: unsafe { libc::geteuid() },
            heads: Mutex::new(Heads::default()),
        });
        thread::Builder::new()
            .name("listen".into())
            .spawn(move || accept(listener, tx, ctx))
            .context("--listen: starting the server thread")?;
        Ok(Server { rx, addr, pending })
    }

    /// The bound address (the port, when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next request, waiting up to `timeout` (none: do not wait).
    pub fn next(&self, timeout: Option<Duration>) -> Option<Request> {
        match timeout {
            Some(t) => self.rx.recv_timeout(t).ok(),
            None => self.rx.try_recv().ok(),
        }
    }

    /// Waits up to `timeout` until every answer given is written.
    pub fn settle(&self, timeout: Duration) {
        let n = self.pending.n.lock().expect("pending lock");
        let _ = self
            .pending
            .cv
            .wait_timeout_while(n, timeout, |n| *n > 0)
            .expect("pending lock");
    }
}

/// What the connection threads share.
struct Shared {
    token: Option<Arc<str>>,
    bound: SocketAddr,
    slots: Mutex<Slots>,
    pending: Arc<Pending>,
    euid: u32,
    /// Connections still sending their head, and the waiting room.
    heads: Mutex<Heads>,
}

/// Connections whose head has not all come: those a client in the waiting
/// room may push out; and the peers in the waiting room.
#[derive(Default)]
struct Heads {
    next: u64,
    open: Vec<OpenHead>,
    waiting: Vec<Peer>,
}

struct OpenHead {
    id: u64,
    caller: Caller,
    /// A handle on the connection, to shut it down.
    stream: TcpStream,
}

/// A connection's place among [`Heads::open`] while its head is read (None:
/// not listed, as its stream could not be cloned; it cannot be pushed out).
struct Reading<'a> {
    ctx: &'a Shared,
    id: Option<u64>,
}

impl<'a> Reading<'a> {
    fn new(ctx: &'a Shared, s: &TcpStream, caller: Caller) -> Reading<'a> {
        let mut h = ctx.heads.lock().expect("heads lock");
        let id = h.next;
        h.next += 1;
        let id = s.try_clone().ok().map(|stream| {
            h.open.push(OpenHead { id, caller, stream });
            id
        });
        Reading { ctx, id }
    }

    /// Leaves [`Heads::open`]; whether the connection was pushed out first
    /// (its slot is then a waiting client's: [`push_out`]).
    fn pushed_out(mut self) -> bool {
        self.leave().is_none()
    }

    /// Found and removed under one lock: once out of the list, no push can
    /// take the slot. Some(()): it was there, or was never listed.
    fn leave(&mut self) -> Option<()> {
        let Some(id) = self.id.take() else {
            return Some(());
        };
        let mut h = self.ctx.heads.lock().expect("heads lock");
        let i = h.open.iter().position(|o| o.id == id)?;
        // In order: the oldest is pushed out first.
        h.open.remove(i);
        Some(())
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Ends the oldest connection still sending its head that `caller` may take
/// the slot of (an untrusted client only an untrusted one's), and gives its
/// slot to `caller` there and then: had it been freed, a client reconnecting
/// in a loop would take it first. None: no such connection, or `caller`
/// holds its [`PER_PEER`] already.
fn push_out(ctx: &Arc<Shared>, caller: Caller) -> Option<Slot> {
    let mut h = ctx.heads.lock().expect("heads lock");
    let i = h
        .open
        .iter()
        .position(|o| caller.trusted || !o.caller.trusted)?;
    let mut s = ctx.slots.lock().expect("slots lock");
    let mine = s.per_peer.get(&caller.peer).copied().unwrap_or(0);
    if !caller.trusted && mine >= PER_PEER {
        return None;
    }
    let victim = h.open.remove(i);
    // The victim's thread finds itself pushed out (Reading::pushed_out) and
    // gives back nothing: its slot is counted as the caller's from now.
    s.release(victim.caller);
    s.hold(caller);
    drop(s);
    // Its read ends at once; its thread answers nobody.
    let _ = victim.stream.shutdown(Shutdown::Both);
    Some(Slot {
        ctx: ctx.clone(),
        caller,
        given: false,
    })
}

/// Who a client is, as far as the server can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Peer {
    /// Another machine, by address.
    Remote(IpAddr),
    /// This machine, by the user owning the client's socket (None: unknown).
    Local(Option<u32>),
}

/// A client: who, and whether it is root or the tool's user on this machine.
#[derive(Debug, Clone, Copy)]
struct Caller {
    peer: Peer,
    trusted: bool,
}

impl Caller {
    /// The client at `peer` of our socket at `local` (the address it connected
    /// to). A client on this machine is known by its user, whatever address
    /// it came from (one of the machine's own: loopback or not).
    fn of(peer: SocketAddr, local: SocketAddr, ctx: &Shared) -> Caller {
        let uid = crate::sys::sockets::tcp_socket_owner(peer, local);
        if uid.is_none() && !is_loopback(peer.ip()) {
            return Caller {
                peer: Peer::Remote(peer.ip()),
                trusted: false,
            };
        }
        Caller {
            peer: Peer::Local(uid),
            trusted: uid.is_some_and(|u| u == 0 || u == ctx.euid),
        }
    }
}

/// Connections held now: in all, by untrusted clients, and per peer.
#[derive(Default)]
struct Slots {
    total: usize,
    untrusted: usize,
    per_peer: HashMap<Peer, usize>,
}

impl Slots {
    fn hold(&mut self, caller: Caller) {
        self.total += 1;
        if !caller.trusted {
            self.untrusted += 1;
        }
        *self.per_peer.entry(caller.peer).or_default() += 1;
    }

    fn release(&mut self, caller: Caller) {
        self.total -= 1;
        if !caller.trusted {
            self.untrusted -= 1;
        }
        if let Some(n) = self.per_peer.get_mut(&caller.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&caller.peer);
            }
        }
    }
}

/// The refusal of a peer holding its [`PER_PEER`] slots: no waiting room
/// for it (what it would push out is not its own).
const TOO_MANY_FROM_YOU: &str = "too many connections from you\n";

/// One connection's slot, given back when dropped (unless it was given to
/// a waiting client: [`push_out`]).
struct Slot {
    ctx: Arc<Shared>,
    caller: Caller,
    given: bool,
}

impl Slot {
    /// A slot for `caller`, or the reason there is none.
    fn take(ctx: &Arc<Shared>, caller: Caller) -> std::result::Result<Slot, &'static str> {
        let mut s = ctx.slots.lock().expect("slots lock");
        let mine = s.per_peer.get(&caller.peer).copied().unwrap_or(0);
        if s.total >= MAX_CONNECTIONS {
            return Err("too many connections\n");
        }
        if !caller.trusted {
            if s.untrusted >= MAX_CONNECTIONS - TRUSTED_ONLY {
                return Err("too many connections\n");
            }
            if mine >= PER_PEER {
                return Err(TOO_MANY_FROM_YOU);
            }
        }
        s.hold(caller);
        Ok(Slot {
            ctx: ctx.clone(),
            caller,
            given: false,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.given {
            self.ctx
                .slots
                .lock()
                .expect("slots lock")
                .release(self.caller);
        }
    }
}

fn accept(listener: TcpListener, tx: SyncSender<Request>, ctx: Arc<Shared>) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else {
            // EMFILE and the like: give the system a moment rather than spin.
            thread::sleep(Duration::from_millis(10));
            continue;
        };
        let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
            continue;
        };
        let caller = Caller::of(peer, local, &ctx);
        let tx = tx.clone();
        let spawned = match Slot::take(&ctx, caller) {
            Ok(slot) => thread::Builder::new()
                .name("listen-conn".into())
                .spawn(move || connection(stream, &tx, slot)),
            Err(why) => {
                let seat = (why != TOO_MANY_FROM_YOU)
                    .then(|| Seat::take(&ctx, caller))
                    .flatten();
                let Some(seat) = seat else {
                    refuse(&mut stream, why);
                    continue;
                };
                let ctx = ctx.clone();
                thread::Builder::new()
                    .name("listen-wait".into())
                    .spawn(move || waiting(stream, &tx, &ctx, caller, seat, why))
            }
        };
        if spawned.is_err() {
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A place in the waiting room, given back when dropped.
struct Seat {
    ctx: Arc<Shared>,
    peer: Peer,
}

impl Seat {
    fn take(ctx: &Arc<Shared>, caller: Caller) -> Option<Seat> {
        let mut h = ctx.heads.lock().expect("heads lock");
        if h.waiting.len() >= WAITING_ROOM || h.waiting.contains(&caller.peer) {
            return None;
        }
        h.waiting.push(caller.peer);
        Some(Seat {
            ctx: ctx.clone(),
            peer: caller.peer,
        })
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut h = self.ctx.heads.lock().expect("heads lock");
        if let Some(i) = h.waiting.iter().position(|p| *p == self.peer) {
            h.waiting.swap_remove(i);
        }
    }
}

/// A client that found no slot: served if its whole head comes within
/// [`WAITING`] and a connection still sending its head can be pushed out for
/// it; else refused as it would have been.
fn waiting(
    mut s: TcpStream,
    tx: &SyncSender<Request>,
    ctx: &Arc<Shared>,
    caller: Caller,
    seat: Seat,
    why: &str,
) {
    let head = match read_head_within(&mut s, WAITING, WAITING) {
        Ok(head) => head,
        Err(None) => return,
        Err(Some(_)) => return refuse(&mut s, why),
    };
    // A slot that is free, or one pushed out for us; else wait for one while
    // the slots are held by requests being answered.
    let until = Instant::now() + WAITING;
    let slot = loop {
        if let Some(slot) = Slot::take(ctx, caller)
            .ok()
            .or_else(|| push_out(ctx, caller))
        {
            break slot;
        }
        if Instant::now() >= until {
            return refuse(&mut s, why);
        }
        thread::sleep(Duration::from_millis(2));
    };
    drop(seat);
    answer_head(s, tx, slot, Ok(head));
}

/// A 503 written without waiting: the accept thread must not block on it.
fn refuse(stream: &mut TcpStream, why: &str) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = stream.write_all(
        format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{why}",
            why.len()
        )
        .as_bytes(),
    );
    // What the client sends is read before the close: closing with unread
    // data sends a reset, and the client saw ECONNRESET, not the 503 (also
    // when its request came just after the refusal, or in pieces: bash writes
    // a line at a time). The accept thread does not wait for it: refused
    // connections are drained side by side by a thread of their own, each
    // for up to REFUSED_LINGER, at most LINGERING at once (more are closed
    // at once).
    let _ = stream.shutdown(std::net::Shutdown::Write);
    if let Ok(s) = stream.try_clone() {
        drain_refused(s);
    }
}

/// How long a refused connection is drained before it is closed.
const REFUSED_LINGER: Duration = Duration::from_secs(1);
/// Refused connections drained at once.
const LINGERING: usize = 256;

/// Hands a refused connection to the thread that drains and closes them.
fn drain_refused(stream: TcpStream) {
    static TX: std::sync::OnceLock<Option<SyncSender<(TcpStream, Instant)>>> =
        std::sync::OnceLock::new();
    let tx = TX.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel::<(TcpStream, Instant)>(LINGERING);
        thread::Builder::new()
            .name("linger".into())
            .spawn(move || linger_refused(rx))
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = tx {
        let _ = tx.try_send((stream, Instant::now() + REFUSED_LINGER));
    }
}

/// Drains refused connections until their clients close them or their time
/// is up, all of them at once: drained one after another, one slow client
/// held the rest past their time, and their clients saw resets (our test's
/// 503 came back empty under load).
fn linger_refused(rx: Receiver<(TcpStream, Instant)>) {
    use std::os::fd::AsRawFd;
    let mut held: Vec<(TcpStream, Instant)> = Vec::new();
    let mut sink = [0u8; 4096];
    loop {
        if held.is_empty() {
            match rx.recv() {
                Ok(c) => held.push(c),
                Err(_) => return,
            }
        }
        while held.len() < LINGERING {
            match rx.try_recv() {
                Ok(c) => held.push(c),
                Err(_) => break,
            }
        }
        // New refusals are taken at least every 10 ms.
        let now = Instant::now();
        let wait = held
            .iter()
            .map(|(_, end)| end.saturating_duration_since(now))
            .min()
            .unwrap_or_default()
            .min(Duration::from_millis(10));
        let mut fds: Vec<libc::pollfd> = held
            .iter()
            .map(|(s, _)| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of fds.len() pollfds, and every fd
        // stays open (held) for the call.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis() as i32,
            )
        };
        let now = Instant::now();
        let mut i = 0;
        held.retain_mut(|(s, end)| {
            let revents = fds[i].revents;
            i += 1;
            if n > 0 && revents != 0 {
                // Readable, closed or failed: one read tells which, without
                // blocking (poll said so).
                match s.read(&mut sink) {
                    Ok(0) => return false,
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            now < *end
        });
    }
}

/// Go's path for a CPU profile, which Pyroscope's and Parca's scrapers ask.
const PROFILE_PATH: &str = "/debug/pprof/profile";

/// `seconds` of a profile request's query: [`PROFILE_SECONDS`] when absent,
/// else a whole number from 1 to [`MAX_PROFILE_SECONDS`] (Go's handler takes
/// the first `seconds`; so does this).
fn profile_seconds(target: &str) -> std::result::Result<u32, String> {
    let query = target.split_once('?').map_or("", |q| q.1);
    let query = query.split('#').next().unwrap_or("");
    let Some(v) = query.split('&').find_map(|kv| kv.strip_prefix("seconds=")) else {
        return Ok(PROFILE_SECONDS);
    };
    match v.parse::<u32>() {
        Ok(n)
            if (1..=MAX_PROFILE_SECONDS).contains(&n) && v.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Ok(n)
        }
        _ => Err(format!(
            "seconds={}: give a whole number of seconds from 1 to {MAX_PROFILE_SECONDS}",
            escape(v.as_bytes())
        )),
    }
}

/// What the connection thread decided about a request head.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// For the tool's thread; `head`: a HEAD request (no body in the answer).
    Forward(Route, bool),
    /// Answered here.
    Answer(u16, String, Vec<(&'static str, &'static str)>),
}

fn connection(mut s: TcpStream, tx: &SyncSender<Request>, mut slot: Slot) {
    let reading = Reading::new(&slot.ctx, &s, slot.caller);
    let head = read_head_within(&mut s, FIRST_BYTE, HEAD_TIMEOUT);
    if reading.pushed_out() {
        // Its slot is the waiting client's now; even a head that came whole
        // as it was pushed out is not answered.
        slot.given = true;
        return;
    }
    answer_head(s, tx, slot, head);
}

/// Answers a connection whose head was read (or found wanting).
fn answer_head(
    mut s: TcpStream,
    tx: &SyncSender<Request>,
    slot: Slot,
    head: std::result::Result<Vec<u8>, Option<Verdict>>,
) {
    let ctx = &slot.ctx;
    let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
    let verdict = match head {
        Ok(head) => judge(&head, &slot.caller, ctx.bound, ctx.token.as_deref()),
        Err(Some(v)) => v,
        Err(None) => return, // closed before sending anything
    };
    match verdict {
        Verdict::Answer(status, msg, headers) => {
            write_reply(&mut s, &Reply::error(status, &msg), &headers, false);
            linger(&mut s);
        }
        Verdict::Forward(route, head) => {
            let (reply_tx, reply_rx) = mpsc::sync_channel(1);
            let stops = route == Route::Stop;
            let route_seconds = match route {
                Route::Profile(n) => Some(n),
                _ => None,
            };
            let rq = Request {
                route,
                reply: reply_tx,
                pending: ctx.pending.clone(),
            };
            let refused = match tx.try_send(rq) {
                Ok(()) => None,
                Err(TrySendError::Full(_)) => Some("busy: try again"),
                Err(TrySendError::Disconnected(_)) => Some("stopping"),
            };
            if let Some(why) = refused {
                write_reply(&mut s, &Reply::error(503, why), &[], false);
                linger(&mut s);
                return;
            }
            // The stop is asked for here too, once the request is queued (the
            // end of the run answers it): the tool's thread may be held by a
            // stdout nobody reads, which gives up only on a stop request.
            if stops {
                if let Some(stop) = crate::stop::Stop::global() {
                    stop.trigger(crate::stop::StopReason::Requested);
                }
            }
            let wait = match route_seconds {
                Some(n) => ANSWER_TIMEOUT + Duration::from_secs(n.into()),
                None => ANSWER_TIMEOUT,
            };
            match reply_rx.recv_timeout(wait) {
                Ok(reply) => {
                    write_reply(&mut s, &reply, &[], head);
                    ctx.pending.add(-1);
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    write_reply(&mut s, &Reply::error(503, "no answer"), &[], false);
                }
            }
            linger(&mut s);
        }
    }
}

/// Reads the request head (up to the blank line): its first byte within
/// `first` ([`FIRST_BYTE`]), all of it within `whole` ([`HEAD_TIMEOUT`]) and
/// [`MAX_HEAD`] bytes. Err(Some(answer)) for a client that is too slow or too
/// big; Err(None) for one that closed (or never spoke, or was pushed out)
/// without a request.
fn read_head_within(
    s: &mut TcpStream,
    first: Duration,
    whole: Duration,
) -> std::result::Result<Vec<u8>, Option<Verdict>> {
    let start = Instant::now();
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = find_blank_line(&buf) {
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() >= MAX_HEAD {
            return Err(Some(answer(431, "request head too large")));
        }
        let limit = if buf.is_empty() { first } else { whole };
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(Some(answer(408, "request not received in time")));
        }
        let _ = s.set_read_timeout(Some(left));
        let room = (MAX_HEAD + 4 - buf.len()).min(chunk.len());
        match s.read(&mut chunk[..room]) {
            Ok(0) if buf.is_empty() => return Err(None),
            Ok(0) => return Err(Some(answer(400, "incomplete request"))),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(Some(answer(408, "request not received in time")))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(None),
        }
    }
}

/// The end of the head: its blank line, CRLF or a bare LF (RFC 9112 2.2: a
/// recipient may take LF alone as a line end; httparse does).
fn find_blank_line(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether the request line ends in a well-formed version other than 1.0 and
/// 1.1 (HTTP/2.0, HTTP/9.9): a 505, where garbage there is a 400.
fn is_other_http_version(head: &[u8]) -> bool {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let version = line.rsplit(|&b| b == b' ').next().unwrap_or_default();
    match version.strip_prefix(b"HTTP/") {
        Some([major, b'.', minor]) => major.is_ascii_digit() && minor.is_ascii_digit(),
        Some([major]) => major.is_ascii_digit(),
        _ => false,
    }
}

fn answer(status: u16, msg: &str) -> Verdict {
    Verdict::Answer(status, msg.to_string(), Vec::new())
}

/// Routes a request head and checks its authority (see the module's trust
/// model). Every refusal is a 4xx.
fn judge(head: &[u8], caller: &Caller, bound: SocketAddr, token: Option<&str>) -> Verdict {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return answer(400, "malformed request"),
        Err(httparse::Error::TooManyHeaders) => return answer(431, "too many headers"),
        Err(httparse::Error::Version) if is_other_http_version(head) => {
            return answer(505, "only HTTP/1.0 and HTTP/1.1 are served")
        }
        Err(_) => return answer(400, "malformed request"),
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return answer(400, "malformed request");
    };
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    // No endpoint takes a body; refusing them keeps the reading bounded.
    if header("transfer-encoding").is_some() {
        return answer(411, "no request body is accepted");
    }
    let lengths: Vec<&[u8]> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| h.value)
        .collect();
    if lengths.len() > 1 {
        // Two lengths are how requests are smuggled (RFC 9112 6.3).
        return answer(400, "more than one Content-Length");
    }
    if let Some(len) = lengths.first() {
        // Digits only (RFC 9110 8.6): "-5" or "+5" is a malformed request, not
        // a body too large.
        let len = std::str::from_utf8(len).ok().map(str::trim);
        match len.filter(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit())) {
            None => return answer(400, "malformed Content-Length"),
            Some(l) if l.bytes().any(|b| b != b'0') => {
                return answer(413, "no request body is accepted")
            }
            Some(_) => {}
        }
    }
    // The absolute form (http://host:port/metrics) names the same resource.
    let target = match target.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => {
            rest.find('/').map_or("/", |i| &rest[i..])
        }
        _ => target,
    };
    let path = target.split(['?', '#']).next().unwrap_or("");
    let get = matches!(method, "GET" | "HEAD");
    let allow = |allowed: &'static str| {
        Verdict::Answer(
            405,
            format!("{path} answers {allowed} only"),
            vec![("Allow", allowed)],
        )
    };
    let route = match path {
        "/metrics" | "/summary" | "/stacks" | PROFILE_PATH if !get => return allow("GET, HEAD"),
        "/metrics" => Route::Metrics,
        "/summary" => Route::Summary,
        "/stacks" => Route::Stacks,
        PROFILE_PATH => match profile_seconds(target) {
            Ok(n) => Route::Profile(n),
            Err(why) => return answer(400, &why),
        },
        "/stop" | "/reset" if method != "POST" => return allow("POST"),
        "/stop" => Route::Stop,
        "/reset" => Route::Reset,
        "/" if get => {
            return Verdict::Answer(
                200,
                "tracekit: GET /metrics, GET /summary, POST /stop, POST /reset".to_string(),
                Vec::new(),
            )
        }
        _ => {
            return answer(
                404,
                "no such endpoint (GET /metrics, GET /summary, POST /stop, POST /reset)",
            )
        }
    };
    // A browser names the page that sent a request; no page of ours exists,
    // so any Origin is a foreign page's (CSRF, or a rebound DNS name).
    if let Some(origin) = header("origin") {
        return answer(
            403,
            &format!(
                "requests from web pages are refused (Origin: {})",
                escape(origin)
            ),
        );
    }
    // HTTP/1.1 needs one Host (RFC 9112 3.2); two are how a name is smuggled.
    let hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .count();
    if hosts > 1 || (hosts == 0 && req.version == Some(1)) {
        return answer(400, "an HTTP/1.1 request needs one Host header");
    }
    // On loopback, the name asked for must be a loopback one: a page whose
    // DNS name was rebound to 127.0.0.1 sends its own name.
    let host = header("host");
    let host_ok = host.is_none_or(|h| host_is_local(h, bound));
    if !host_ok && bound.ip().is_loopback() {
        return answer(
            403,
            &format!(
                "Host {} is not a name of this server (ask for localhost or {})",
                escape(host.unwrap_or_default()),
                bound.ip()
            ),
        );
    }
    if matches!(route, Route::Stop | Route::Reset) {
        match token {
            Some(t) => {
                if !bearer_matches(header("authorization"), t) {
                    return Verdict::Answer(
                        401,
                        "POST needs Authorization: Bearer <token>".to_string(),
                        vec![("WWW-Authenticate", "Bearer")],
                    );
                }
            }
            None => {
                let local = match caller.peer {
                    Peer::Local(uid) => uid,
                    Peer::Remote(_) => return answer(
                        403,
                        "POST is accepted only from this machine (the tool has no --listen-token)",
                    ),
                };
                if !caller.trusted {
                    return answer(
                        403,
                        &format!(
                            "POST is accepted only from root or the tool's user on this machine \
                             (this came from {}; the tool has no --listen-token)",
                            local.map_or("an unknown user".to_string(), |u| format!("uid {u}"))
                        ),
                    );
                }
                if !host_ok {
                    return answer(
                        403,
                        "POST without a token needs a Host of this machine: localhost or an address",
                    );
                }
            }
        }
    }
    Verdict::Forward(route, method == "HEAD")
}

/// Whether a Host header's value names this machine without DNS: a loopback
/// name, or an address (a port may follow). A rebinding page can only send a
/// DNS name of its own; an address it could send is the page's own origin,
/// and pages are refused by their Origin.
fn host_is_local(host: &[u8], bound: SocketAddr) -> bool {
    let Ok(h) = std::str::from_utf8(host) else {
        return false;
    };
    let h = h.trim();
    let port_ok = |p: &str| {
        p.is_empty()
            || p.strip_prefix(':')
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    };
    let name = match h.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, rest)) if port_ok(rest) => addr,
            _ => return false,
        },
        None => match h.rsplit_once(':') {
            Some((name, port)) if port_ok(&format!(":{port}")) => name,
            Some(_) => return false,
            None => h,
        },
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    name.parse::<IpAddr>()
        .is_ok_and(|ip| is_loopback(ip) || ip == bound.ip() || !bound.ip().is_loopback())
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// `Authorization: Bearer <token>`, compared in constant time.
fn bearer_matches(value: Option<&[u8]>, token: &str) -> bool {
    let Some(v) = value else { return false };
    let v = v.trim_ascii();
    if v.len() < 7 || !v[..7].eq_ignore_ascii_case(b"bearer ") {
        return false;
    }
    let given = v[7..].trim_ascii();
    let want = token.as_bytes();
    given.len() == want.len() && given.iter().zip(want).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        505 => "HTTP Version Not Supported",
        _ => "Service Unavailable",
    }
}

/// Writes the answer (one request per connection) and ends the sending side.
fn write_reply(s: &mut TcpStream, r: &Reply, extra: &[(&str, &str)], head_only: bool) {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(&r.body);
    }
    let _ = s.write_all(&out);
    let _ = s.flush();
    let _ = s.shutdown(Shutdown::Write);
}

/// Lets the client read the answer before the close resets the connection (it
/// may still be sending an oversized head): drains what it sends, briefly.
fn linger(s: &mut TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller at `peer`: root when on loopback.
    fn caller(peer: &str) -> Caller {
        let ip: IpAddr = peer.parse().unwrap();
        match is_loopback(ip) {
            true => Caller {
                peer: Peer::Local(Some(0)),
                trusted: true,
            },
            false => Caller {
                peer: Peer::Remote(ip),
                trusted: false,
            },
        }
    }

    /// Judged by a server bound to all addresses.
    fn j(head: &str, peer: &str, token: Option<&str>) -> Verdict {
        judge(
            head.as_bytes(),
            &caller(peer),
            "0.0.0.0:9435".parse().unwrap(),
            token,
        )
    }

    #[test]
    fn heads_as_clients_send_them() {
        // A head ended by bare LFs is complete (it waited 5 s for a CRLF, then 408).
        let lf = b"GET /metrics HTTP/1.1\nHost: x\n\n";
        assert_eq!(find_blank_line(lf), Some(lf.len()));
        assert_eq!(find_blank_line(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(find_blank_line(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
        assert_eq!(
            j("GET /metrics HTTP/1.1\nHost: x\n\n", "127.0.0.1", None),
            Verdict::Forward(Route::Metrics, false)
        );
        // The absolute form names the same endpoint (it was a 404).
        assert_eq!(
            j(
                "GET http://x:9435/summary?y HTTP/1.1\r\nHost: x\r\n\r\n",
                "127.0.0.1",
                None
            ),
            Verdict::Forward(Route::Summary, false)
        );
        // Two lengths are refused, even if one is 0 (POST /reset took them).
        assert!(matches!(
            j(
                "POST /reset HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n",
                "127.0.0.1",
                None
            ),
            Verdict::Answer(400, ..)
        ));
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen(":9435").unwrap(),
            "127.0.0.1:9435".parse().unwrap()
        );
        assert_eq!(
            parse_listen("0.0.0.0:80").unwrap(),
            "0.0.0.0:80".parse().unwrap()
        );
        assert_eq!(parse_listen("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert!(parse_listen("9435").is_err());
        assert!(parse_listen(":x").is_err());
        assert!(parse_listen(":70000").is_err());
    }

    #[test]
    fn routes_and_refusals() {
        let get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(
            j(get, "10.0.0.1", None),
            Verdict::Forward(Route::Metrics, false)
        );
        let stop = "POST /stop HTTP/1.1\r\nHost: localhost:9435\r\n\r\n";
        assert_eq!(
            j(stop, "127.0.0.1", None),
            Verdict::Forward(Route::Stop, false)
        );
        assert!(matches!(
            j(stop, "10.0.0.1", None),
            Verdict::Answer(403, ..)
        ));
        assert!(matches!(
            j(stop, "127.0.0.1", Some("s3")),
            Verdict::Answer(401, ..)
        ));
        let authed = "POST /reset?x HTTP/1.1\r\nHost: x\r\nauthorization: Bearer s3\r\n\r\n";
        assert_eq!(
            j(authed, "10.0.0.1", Some("s3")),
            Verdict::Forward(Route::Reset, false)
        );
        let wrong = "POST /reset HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s4\r\n\r\n";
        assert!(matches!(
            j(wrong, "127.0.0.1", Some("s3")),
            Verdict::Answer(401, ..)
        ));
        assert!(matches!(
            j("GET /stop HTTP/1.1\r\n\r\n", "127.0.0.1", None),
            Verdict::Answer(405, ..)
        ));
        assert!(matches!(
            j("GET /x HTTP/1.1\r\n\r\n", "127.0.0.1", None),
            Verdict::Answer(404, ..)
        ));
        assert!(matches!(
            j("BLAH\r\n\r\n", "127.0.0.1", None),
            Verdict::Answer(400, ..)
        ));
        let body = "POST /stop HTTP/1.1\r\nContent-Length: 5\r\n\r\n";
        assert!(matches!(
            j(body, "127.0.0.1", None),
            Verdict::Answer(413, ..)
        ));
        for bad in ["-5", "+5", "5x", ""] {
            let head = format!("POST /stop HTTP/1.1\r\nContent-Length: {bad}\r\n\r\n");
            assert!(
                matches!(j(&head, "127.0.0.1", None), Verdict::Answer(400, ..)),
                "{bad}"
            );
        }
        let none = "POST /stop HTTP/1.1\r\nHost: localhost\r\nContent-Length: 00\r\n\r\n";
        assert_eq!(
            j(none, "127.0.0.1", None),
            Verdict::Forward(Route::Stop, false)
        );
        for (version, status) in [("HTTP/9.9", 505), ("HTTP/2", 505), ("HTTQ/1.1", 400)] {
            let head = format!("GET /metrics {version}\r\n\r\n");
            assert!(
                matches!(j(&head, "127.0.0.1", None), Verdict::Answer(s, ..) if s == status),
                "{version}"
            );
        }
        assert!(is_loopback("::ffff:127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn web_pages_and_other_local_users_cannot_control_the_tool() {
        let lo: SocketAddr = "127.0.0.1:9435".parse().unwrap();
        let on_lo = |head: &str, c: Caller| judge(head.as_bytes(), &c, lo, None);
        let root = caller("127.0.0.1");
        let stop = |extra: &str| format!("POST /stop HTTP/1.1\r\n{extra}\r\n");
        assert_eq!(
            on_lo(&stop("Host: 127.0.0.1:9435\r\n"), root),
            Verdict::Forward(Route::Stop, false)
        );
        // HTTP/1.1 needs one Host; 1.0 may go without.
        assert!(matches!(on_lo(&stop(""), root), Verdict::Answer(400, ..)));
        let twice = stop("Host: localhost\r\nHost: evil.example\r\n");
        assert!(matches!(on_lo(&twice, root), Verdict::Answer(400, ..)));
        assert_eq!(
            on_lo("POST /stop HTTP/1.0\r\n\r\n", root),
            Verdict::Forward(Route::Stop, false)
        );
        for host in [
            "localhost",
            "LOCALHOST.:1",
            "[::1]:9435",
            "127.1.2.3",
            "a.localhost",
        ] {
            assert_eq!(
                on_lo(&stop(&format!("Host: {host}\r\n")), root),
                Verdict::Forward(Route::Stop, false),
                "{host}"
            );
        }
        // CSRF: a page's POST carries its Origin, whatever the Host.
        for origin in ["http://evil.example", "null", "http://localhost:9435"] {
            let head = stop(&format!("Host: localhost\r\nOrigin: {origin}\r\n"));
            assert!(
                matches!(on_lo(&head, root), Verdict::Answer(403, ..)),
                "{origin}"
            );
        }
        // Anything after an address but a port is another name.
        for host in [
            "[::1]evil.example",
            "[::1]:9520@evil",
            "127.0.0.1:x",
            "[::1",
        ] {
            assert!(
                matches!(
                    on_lo(&stop(&format!("Host: {host}\r\n")), root),
                    Verdict::Answer(403, ..)
                ),
                "{host}"
            );
        }
        // DNS rebinding: a page's own name, even for a GET.
        let get = "GET /metrics HTTP/1.1\r\nHost: attacker.example\r\n\r\n";
        assert!(matches!(on_lo(get, root), Verdict::Answer(403, ..)));
        assert!(matches!(
            on_lo(&stop("Host: attacker.example:9435\r\n"), root),
            Verdict::Answer(403, ..)
        ));
        // Another local account, or one the kernel did not name.
        for peer in [Peer::Local(Some(65534)), Peer::Local(None)] {
            let other = Caller {
                peer,
                trusted: false,
            };
            assert!(matches!(
                on_lo(&stop("Host: localhost\r\n"), other),
                Verdict::Answer(403, ..)
            ));
            // It may read, as anyone reaching the address may.
            let get = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
            assert_eq!(on_lo(get, other), Verdict::Forward(Route::Metrics, false));
        }
        // Bound to all addresses, a fleet scrapes by the node's name; POST
        // from this machine still needs a loopback Host.
        let any: SocketAddr = "0.0.0.0:9435".parse().unwrap();
        let get = "GET /metrics HTTP/1.1\r\nHost: node7.example:9435\r\n\r\n";
        let remote = caller("10.0.0.1");
        assert_eq!(
            judge(get.as_bytes(), &remote, any, None),
            Verdict::Forward(Route::Metrics, false)
        );
        assert!(matches!(
            judge(stop("Host: node7.example\r\n").as_bytes(), &root, any, None),
            Verdict::Answer(403, ..)
        ));
        // Root on this machine by one of its own addresses.
        assert_eq!(
            judge(
                stop("Host: 192.0.2.2:9435\r\n").as_bytes(),
                &root,
                any,
                None
            ),
            Verdict::Forward(Route::Stop, false)
        );
    }

    #[test]
    fn profile_seconds_as_go_takes_them_and_bounded() {
        let p = |t: &str| profile_seconds(t);
        assert_eq!(p("/debug/pprof/profile"), Ok(PROFILE_SECONDS));
        assert_eq!(p("/debug/pprof/profile?seconds=5"), Ok(5));
        assert_eq!(p("/debug/pprof/profile?debug=1&seconds=300#x"), Ok(300));
        assert_eq!(p("/debug/pprof/profile?seconds=7&seconds=9"), Ok(7));
        for bad in ["0", "301", "-1", "+5", "5s", "", "1e3", "99999999999"] {
            assert!(
                p(&format!("/debug/pprof/profile?seconds={bad}")).is_err(),
                "{bad}"
            );
        }
    }

    /// What a server run by root shares between its connections.
    fn server_run_by_root() -> Arc<Shared> {
        Arc::new(Shared {
            token: None,
            bound: "127.0.0.1:1".parse().unwrap(),
            slots: Mutex::new(Slots::default()),
            pending: Arc::new(Pending::default()),
            euid: 0,
            heads: Mutex::new(Heads::default()),
        })
    }

    /// A client on this machine, as user `uid`.
    fn user(uid: u32) -> Caller {
        Caller {
            peer: Peer::Local(Some(uid)),
            trusted: uid == 0,
        }
    }

    #[test]
    fn slots_are_kept_for_root_and_shared_between_peers() {
        let ctx = server_run_by_root();
        let mut held = Vec::new();
        // One user: PER_PEER slots, then refused.
        for _ in 0..PER_PEER {
            held.push(Slot::take(&ctx, user(1000)).unwrap());
        }
        assert!(Slot::take(&ctx, user(1000)).is_err());
        // Other users and hosts fill the untrusted slots.
        let mut others = (1001..).map(user).chain((1..=255u8).map(|i| Caller {
            peer: Peer::Remote(IpAddr::from([10, 0, 0, i])),
            trusted: false,
        }));
        while held.len() < MAX_CONNECTIONS - TRUSTED_ONLY {
            held.push(Slot::take(&ctx, others.next().unwrap()).unwrap());
        }
        assert!(Slot::take(&ctx, others.next().unwrap()).is_err());
        // Root still gets the kept ones.
        for _ in 0..TRUSTED_ONLY {
            held.push(Slot::take(&ctx, user(0)).unwrap());
        }
        assert!(Slot::take(&ctx, user(0)).is_err());
        // Slots come back when connections end.
        held.clear();
        let s = ctx.slots.lock().unwrap();
        assert_eq!((s.total, s.untrusted, s.per_peer.len()), (0, 0, 0));
    }

    #[test]
    fn a_pushed_out_slot_goes_to_the_waiting_client_not_to_a_newcomer() {
        let ctx = server_run_by_root();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Three users hold every untrusted slot, each still sending its head.
        let mut conns = Vec::new();
        for uid in [
            1001, 1001, 1001, 1001, 1002, 1002, 1002, 1002, 1003, 1003, 1003, 1003,
        ] {
            let client = TcpStream::connect(addr).unwrap();
            let server = listener.accept().unwrap().0;
            let slot = Slot::take(&ctx, user(uid)).unwrap();
            conns.push((client, server, slot));
        }
        let mut reading: Vec<Reading> = conns
            .iter()
            .map(|(_, server, slot)| Reading::new(&ctx, server, slot.caller))
            .collect();
        let newcomer = user(1004);
        assert!(Slot::take(&ctx, newcomer).is_err());
        // The waiting client gets the oldest one's slot at once.
        let mine = push_out(&ctx, newcomer).expect("a slot pushed out");
        let counts = |ctx: &Shared| {
            let s = ctx.slots.lock().unwrap();
            let of = |uid| {
                s.per_peer
                    .get(&Peer::Local(Some(uid)))
                    .copied()
                    .unwrap_or(0)
            };
            (s.total, s.untrusted, of(1001), of(1004))
        };
        assert_eq!(counts(&ctx), (12, 12, 3, 1));
        // Its user reconnecting at once finds no slot: it was not freed.
        assert!(Slot::take(&ctx, user(1001)).is_err());
        // The pushed-out connection was shut down, and finds itself pushed out.
        let mut byte = [0u8; 1];
        assert_eq!(conns[0].0.read(&mut byte).unwrap(), 0);
        assert!(reading.remove(0).pushed_out());
        assert!(!reading.remove(0).pushed_out());
        let (_, _, mut gone) = conns.remove(0);
        gone.given = true;
        drop(gone);
        assert_eq!(counts(&ctx), (12, 12, 3, 1));
        // Everything comes back once.
        drop(reading);
        drop(mine);
        conns.clear();
        let s = ctx.slots.lock().unwrap();
        assert_eq!((s.total, s.untrusted, s.per_peer.len()), (0, 0, 0));
    }
}
