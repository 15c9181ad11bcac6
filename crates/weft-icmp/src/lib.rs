//! One ICMP echo over a raw socket (root or CAP_NET_RAW), with or without the DF bit: weft's
//! one pinger. `weft doctor` sends its jumbo-frame probes with it on every host (so no
//! `ping(8)` is needed there), and the namespace test bed pings between its hosts with it.
//!
//! It is not a `ping(8)`: one request, one bounded wait for the matching reply, IPv4 only;
//! [`echo_train`] sends a paced train on one socket and counts the answers, for packet loss.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// What one echo found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// The matching reply came back after this long.
    Reply(Duration),
    /// The local stack refused to send a DF packet that large (interface MTU too small).
    TooBigHere,
    /// No reply within the bound, or the local stack cannot reach `dst` (network or host
    /// unreachable, interface down).
    NoReply,
}

static SEQ: AtomicU16 = AtomicU16::new(1);

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

struct Fd(libc::c_int);
impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor and close it once.
        unsafe {
            libc::close(self.0);
        }
    }
}

fn setopt<T>(fd: &Fd, level: libc::c_int, name: libc::c_int, val: &T) -> io::Result<()> {
    // SAFETY: `val` is a live value of the type the option expects, `len` its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd.0,
            level,
            name,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A raw ICMP socket (root or CAP_NET_RAW).
fn icmp_socket() -> io::Result<Fd> {
    // SAFETY: plain socket(2); the result is checked and owned by `Fd`.
    let raw = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_ICMP,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Fd(raw))
}

/// An ICMP echo request (type 8) with identifier `id`, sequence number `seq` and `payload`
/// bytes of a fixed pattern, checksummed.
fn echo_request(id: u16, seq: u16, payload: usize) -> Vec<u8> {
    let mut pkt = vec![0u8; 8 + payload];
    pkt[0] = 8;
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in pkt[8..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let sum = checksum(&pkt);
    pkt[2..4].copy_from_slice(&sum.to_be_bytes());
    pkt
}

/// `dst` as a socket address (port 0: raw sockets have none).
fn sockaddr(dst: Ipv4Addr) -> libc::sockaddr_in {
    // SAFETY: zeroed sockaddr_in is valid; fields set below.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_addr.s_addr = u32::from(dst).to_be();
    sa
}

/// sendto(2) of `pkt` to `sa`; the error is the OS's, for the caller to sort.
fn send_to(fd: &Fd, pkt: &[u8], sa: &libc::sockaddr_in) -> io::Result<()> {
    // SAFETY: `pkt` and `sa` are live for the call; lengths are theirs.
    let rc = unsafe {
        libc::sendto(
            fd.0,
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One ICMP echo of `payload` bytes to `dst` over a raw socket (needs root or CAP_NET_RAW),
/// with the DF bit set when `df` (the interface's MTU, not a cached path MTU, decides what
/// may be sent); waits at most `timeout` for the matching reply.
pub fn echo(dst: Ipv4Addr, payload: usize, df: bool, timeout: Duration) -> io::Result<Echo> {
    if payload > 65_507 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "payload over 65507 bytes",
        ));
    }
    let fd = icmp_socket()?;
    let pmtu: libc::c_int = if df {
        libc::IP_PMTUDISC_PROBE
    } else {
        libc::IP_PMTUDISC_DONT
    };
    setopt(&fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, &pmtu)?;
    let id = (std::process::id() as u16) ^ SEQ.fetch_add(1, Ordering::Relaxed);
    let pkt = echo_request(id, 1, payload);
    let sa = sockaddr(dst);
    if let Err(e) = send_to(&fd, &pkt, &sa) {
        return match e.raw_os_error() {
            Some(libc::EMSGSIZE) => Ok(Echo::TooBigHere),
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ENETDOWN | libc::EHOSTDOWN) => {
                Ok(Echo::NoReply)
            }
            _ => Err(e),
        };
    }
    let start = Instant::now();
    let deadline = start + timeout;
    let mut buf = vec![0u8; 65_536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Echo::NoReply);
        }
        match recv_reply(&fd, &mut buf, left, dst, id)? {
            Received::Reply(_) => return Ok(Echo::Reply(start.elapsed())),
            Received::Other => continue,
            Received::Unreachable => return Ok(Echo::NoReply),
        }
    }
}

/// What one wait for a datagram on an ICMP socket gave.
enum Received<'a> {
    /// An echo reply from the destination with our id: its ICMP message.
    Reply(&'a [u8]),
    /// Nothing within the wait, an interrupted wait, or a datagram that is not our reply.
    Other,
    /// The kernel reported the destination unreachable (or the message too big).
    Unreachable,
}

/// Waits up to `left` (bounded by SO_RCVTIMEO) for one datagram on `fd` and says whether it
/// is an echo reply from `dst` with identifier `id`.
fn recv_reply<'a>(
    fd: &Fd,
    buf: &'a mut [u8],
    left: Duration,
    dst: Ipv4Addr,
    id: u16,
) -> io::Result<Received<'a>> {
    let tv = libc::timeval {
        tv_sec: left.as_secs() as libc::time_t,
        tv_usec: left.subsec_micros().max(1) as libc::suseconds_t,
    };
    setopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
    // SAFETY: zeroed sockaddr_in is valid as an out parameter.
    let mut from: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut flen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `buf`, `from` and `flen` are live and sized for the call.
    let n = unsafe {
        libc::recvfrom(
            fd.0,
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&mut from as *mut libc::sockaddr_in).cast(),
            &mut flen,
        )
    };
    if n < 0 {
        return match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => Ok(Received::Other),
            Some(libc::EMSGSIZE | libc::EHOSTUNREACH | libc::ENETUNREACH) => {
                Ok(Received::Unreachable)
            }
            _ => Err(io::Error::last_os_error()),
        };
    }
    let p = &buf[..n as usize];
    if p.len() < 20 {
        return Ok(Received::Other);
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    if p.len() < ihl + 8 || u32::from_be(from.sin_addr.s_addr) != u32::from(dst) {
        return Ok(Received::Other);
    }
    let icmp = &p[ihl..];
    if icmp[0] != 0 || icmp[4..6] != id.to_be_bytes() {
        return Ok(Received::Other);
    }
    Ok(Received::Reply(icmp))
}

/// What a train of echoes found ([`echo_train`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Train {
    /// Echo requests handed to the kernel.
    pub sent: u32,
    /// Distinct requests answered.
    pub received: u32,
    /// Round trips of the answered requests, in arrival order.
    pub rtts: Vec<Duration>,
}

impl Train {
    /// Percent of the sent requests that got no answer.
    pub fn loss_pct(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        100.0 * f64::from(self.sent - self.received.min(self.sent)) / f64::from(self.sent)
    }
}

/// `count` echoes of 56 bytes to `dst` on one raw socket (root or CAP_NET_RAW), one every
/// `interval`, answers read in between; after the last one waits at most `linger` for late
/// answers (at most 65535 echoes). Packet loss on the path shows as `sent - received`. A local refusal to send
/// (network unreachable, interface down) counts as sent and unanswered.
pub fn echo_train(
    dst: Ipv4Addr,
    count: u32,
    interval: Duration,
    linger: Duration,
) -> io::Result<Train> {
    let fd = icmp_socket()?;
    // Sequence numbers are 16 bits.
    let count = count.min(u32::from(u16::MAX));
    let id = (std::process::id() as u16) ^ SEQ.fetch_add(1, Ordering::Relaxed);
    let sa = sockaddr(dst);
    let mut sent_at: Vec<Option<Instant>> = vec![None; count as usize];
    let mut answered = vec![false; count as usize];
    let mut train = Train {
        sent: 0,
        received: 0,
        rtts: Vec::new(),
    };
    let mut buf = vec![0u8; 4096];
    let start = Instant::now();
    let mut next = 0u32;
    loop {
        let now = Instant::now();
        if next >= count && train.received >= train.sent {
            return Ok(train);
        }
        if next < count && now >= start + interval * next {
            let seq = next as u16;
            let pkt = echo_request(id, seq, 56);
            if let Err(e) = send_to(&fd, &pkt, &sa)
                && !matches!(
                    e.raw_os_error(),
                    Some(
                        libc::ENETUNREACH
                            | libc::EHOSTUNREACH
                            | libc::ENETDOWN
                            | libc::EHOSTDOWN
                            | libc::ENOBUFS
                    )
                )
            {
                return Err(e);
            }
            sent_at[next as usize] = Some(Instant::now());
            train.sent += 1;
            next += 1;
            continue;
        }
        let until = if next < count {
            start + interval * next
        } else {
            start + interval * count.saturating_sub(1) + linger
        };
        let left = until.saturating_duration_since(now);
        if left.is_zero() {
            if next >= count {
                return Ok(train);
            }
            continue;
        }
        let icmp = match recv_reply(&fd, &mut buf, left, dst, id)? {
            Received::Reply(icmp) => icmp,
            Received::Other | Received::Unreachable => continue,
        };
        let seq = usize::from(u16::from_be_bytes([icmp[6], icmp[7]]));
        if let (Some(false), Some(Some(t))) = (answered.get(seq).copied(), sent_at.get(seq)) {
            answered[seq] = true;
            train.received += 1;
            train.rtts.push(t.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_known_vector() {
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0x220d
        );
    }

    #[test]
    fn an_echo_request_carries_its_id_and_sequence_and_checks_out() {
        let pkt = echo_request(0xbeef, 7, 5);
        assert_eq!(pkt.len(), 13);
        assert_eq!((pkt[0], pkt[1]), (8, 0));
        assert_eq!(pkt[4..8], [0xbe, 0xef, 0, 7]);
        assert_eq!(pkt[8..], [0, 1, 2, 3, 4]);
        // A correct ICMP checksum makes the sum over the whole message come out as zero.
        assert_eq!(checksum(&pkt), 0);
    }

    /// Loopback answers (the tests run as root, as weft's namespace tests do); an oversized
    /// payload is refused before anything is sent.
    #[test]
    fn loopback_answers_and_oversized_payloads_are_refused() {
        match echo(Ipv4Addr::LOCALHOST, 56, true, Duration::from_secs(2)) {
            Ok(Echo::Reply(rtt)) => assert!(rtt < Duration::from_secs(2)),
            other => panic!("no echo reply from 127.0.0.1 (needs root or CAP_NET_RAW): {other:?}"),
        }
        assert!(echo(Ipv4Addr::LOCALHOST, 70_000, false, Duration::from_secs(1)).is_err());
    }

    /// A train to loopback loses nothing; to an address nobody answers it loses everything,
    /// and both end within their bound.
    #[test]
    fn a_train_counts_what_came_back() {
        let t = Instant::now();
        let tr = echo_train(
            Ipv4Addr::LOCALHOST,
            50,
            Duration::from_millis(1),
            Duration::from_millis(200),
        )
        .expect("raw socket (needs root or CAP_NET_RAW)");
        assert_eq!((tr.sent, tr.received), (50, 50), "{tr:?}");
        assert_eq!(tr.loss_pct(), 0.0);
        assert_eq!(tr.rtts.len(), 50);
        // TEST-NET-1 is never routed anywhere that answers.
        let tr = echo_train(
            Ipv4Addr::new(192, 0, 2, 77),
            5,
            Duration::from_millis(1),
            Duration::from_millis(100),
        )
        .expect("raw socket");
        assert_eq!((tr.sent, tr.received), (5, 0), "{tr:?}");
        assert_eq!(tr.loss_pct(), 100.0);
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }
}
