//! Who is at the other end of a TCP connection on this machine: the user owning
//! the client's socket, asked of the kernel by its four addresses through
//! sock_diag (the netlink interface `ss` uses). TCP has no SO_PEERCRED; for a
//! loopback connection both ends are in this network namespace, so the kernel
//! knows the client socket and its owner. Where sock_diag cannot answer (no
//! inet_diag module), /proc/net/tcp does, for loopback clients.

use std::mem::size_of;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_NOCOOKIE: u32 = !0;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct NlMsgHdr {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
}

/// `struct inet_diag_sockid`: ports and addresses in network byte order.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct SockId {
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    interface: u32,
    cookie: [u32; 2],
}

/// `struct inet_diag_req_v2`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Request {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

/// `struct inet_diag_msg`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Answer {
    family: u8,
    state: u8,
    timer: u8,
    retrans: u8,
    id: SockId,
    expires: u32,
    rqueue: u32,
    wqueue: u32,
    uid: u32,
    inode: u32,
}

/// [`tcp_socket_owner`] from /proc/net/tcp or tcp6: the line whose local
/// address is `from` and remote `to`, held by a process (non-zero inode).
fn proc_net_tcp(from: SocketAddr, to: SocketAddr) -> Option<u32> {
    // Addresses as the kernel prints them: each 32-bit word of the address
    // as stored (network order) printed as a native integer, then the port.
    let hex = |a: SocketAddr| {
        let words: Vec<u8> = match a.ip() {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => v6.octets().to_vec(),
        };
        let mut s: String = words
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        s.push_str(&format!(":{:04X}", a.port()));
        s
    };
    let file = match from.ip() {
        IpAddr::V4(_) => "/proc/net/tcp",
        IpAddr::V6(_) => "/proc/net/tcp6",
    };
    let (local, remote) = (hex(from), hex(to));
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (uid, inode) = (f.get(7)?, f.get(9)?);
        (f.get(1) == Some(&local.as_str()) && f.get(2) == Some(&remote.as_str()) && *inode != "0")
            .then(|| uid.parse().ok())
            .flatten()
    })
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

fn put(a: IpAddr, out: &mut [u8; 16]) {
    match a {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => *out = v6.octets(),
    }
}

/// The uid owning the TCP socket bound to `from` and connected to `to`, both on
/// this machine (a client of our server: `from` is its address as our accepted
/// socket sees the peer, `to` our socket's address). None when the kernel does
/// not say (no sock_diag), the client is not on this machine (or in another
/// network namespace), or its socket was closed (no process holds it).
pub fn tcp_socket_owner(from: SocketAddr, to: SocketAddr) -> Option<u32> {
    let (from, to) = (canonical(from), canonical(to));
    // Without the inet_diag module (a kernel without modules, a container
    // that may not load one) the kernel's table of sockets in /proc answers,
    // more slowly: only for loopback clients, whose socket must be here.
    sock_diag(from, to).or_else(|| {
        from.ip()
            .is_loopback()
            .then(|| proc_net_tcp(from, to))
            .flatten()
    })
}

/// [`tcp_socket_owner`] by sock_diag.
fn sock_diag(from: SocketAddr, to: SocketAddr) -> Option<u32> {
    // (A v4 client of a v6 socket bound to :: shows as ::ffff:a.b.c.d on our
    // side; its own socket is a v4 one: the callers pass canonical addresses.)
    let family = match (from.ip(), to.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
        _ => return None,
    };
    // SAFETY: plain socket(2); a non-negative result is a new fd we own.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd is fresh and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: Duration::from_millis(200).as_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid timeval for SO_RCVTIMEO.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    #[repr(C)]
    struct Message {
        hdr: NlMsgHdr,
        req: Request,
    }
    let mut id = SockId {
        sport: from.port().to_be_bytes(),
        dport: to.port().to_be_bytes(),
        cookie: [INET_DIAG_NOCOOKIE; 2],
        ..Default::default()
    };
    put(from.ip(), &mut id.src);
    put(to.ip(), &mut id.dst);
    let msg = Message {
        hdr: NlMsgHdr {
            len: size_of::<Message>() as u32,
            kind: SOCK_DIAG_BY_FAMILY,
            flags: libc::NLM_F_REQUEST as u16,
            seq: 1,
            pid: 0,
        },
        req: Request {
            family: family as u8,
            protocol: libc::IPPROTO_TCP as u8,
            states: !0,
            id,
            ..Default::default()
        },
    };
    // SAFETY: the kernel's netlink address, all zero but the family.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: msg and kernel are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            (&msg as *const Message).cast(),
            size_of::<Message>(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return None;
    }
    let mut buf = [0u64; 128];
    // SAFETY: buf is writable for its size.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            size_of::<[u64; 128]>(),
            0,
        )
    };
    let hdr_len = size_of::<NlMsgHdr>();
    if n < (hdr_len + size_of::<Answer>()) as isize {
        return None; // NLMSG_ERROR (no such socket) is shorter
    }
    // SAFETY: buf is 8-aligned and holds at least a header and an answer.
    let (hdr, ans) = unsafe {
        let p = buf.as_ptr().cast::<u8>();
        (
            std::ptr::read_unaligned(p.cast::<NlMsgHdr>()),
            std::ptr::read_unaligned(p.add(hdr_len).cast::<Answer>()),
        )
    };
    // A socket no process holds (closed: TIME_WAIT, an orphan in FIN_WAIT)
    // has no owner to speak of; the kernel reports uid 0 for TIME_WAIT ones.
    (hdr.kind == SOCK_DIAG_BY_FAMILY && ans.inode != 0).then_some(ans.uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn the_owner_of_a_loopback_client_is_this_process_user() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(tcp_socket_owner(peer, s.local_addr().unwrap()), Some(me));
        // The same from /proc, where sock_diag is missing.
        assert_eq!(proc_net_tcp(peer, s.local_addr().unwrap()), Some(me));
        // A v4 client of a socket bound to ::, as that socket sees it.
        let l6 = TcpListener::bind("[::]:0").unwrap();
        let port = l6.local_addr().unwrap().port();
        let c4 = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s6, peer6) = l6.accept().unwrap();
        assert_eq!(peer6.ip().to_canonical(), c4.local_addr().unwrap().ip());
        assert_eq!(tcp_socket_owner(peer6, s6.local_addr().unwrap()), Some(me));
        let v6 = TcpListener::bind("[::1]:0").unwrap();
        let c6 = TcpStream::connect(v6.local_addr().unwrap()).unwrap();
        let (s6b, p6) = v6.accept().unwrap();
        assert_eq!(p6, c6.local_addr().unwrap());
        assert_eq!(proc_net_tcp(p6, s6b.local_addr().unwrap()), Some(me));
        // A client that closed its socket at once (TIME_WAIT on loopback) has
        // no owner: the kernel says uid 0 for it, which must not pass for root.
        let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
        let c2 = TcpStream::connect(l2.local_addr().unwrap()).unwrap();
        let (s2, peer2) = l2.accept().unwrap();
        drop(c2);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(tcp_socket_owner(peer2, s2.local_addr().unwrap()), None);
        assert_eq!(proc_net_tcp(peer2, s2.local_addr().unwrap()), None);
        // No socket has these addresses.
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(tcp_socket_owner(nobody, s.local_addr().unwrap()), None);
    }
}
