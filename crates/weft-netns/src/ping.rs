//! A minimal ICMP echo ("ping") over a raw socket, for hosts without `ping(8)` installed.
//!
//! Must run on a thread that has already entered the target network namespace.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, recvfrom, sendto,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

static NEXT_ID: AtomicU16 = AtomicU16::new(1);

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

fn set_pmtudisc(fd: &OwnedFd, dont_fragment: bool) -> io::Result<()> {
    let val: libc::c_int = if dont_fragment {
        libc::IP_PMTUDISC_DO
    } else {
        libc::IP_PMTUDISC_DONT
    };
    // SAFETY: `fd` is a valid, open socket owned by the caller for the duration of the call;
    // `optval` points to a live `c_int` and `optlen` is exactly its size, as IP_MTU_DISCOVER
    // expects.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends one echo request with `payload` bytes of data to `dst` and waits up to `timeout` for
/// the matching reply. `Ok(Some(rtt))` on a reply; `Ok(None)` when no reply came, or when the
/// local stack refused to send (message too long for a DF packet, network unreachable,
/// interface down) — the cases where `ping(8)` reports failure too.
pub(crate) fn ping(
    dst: Ipv4Addr,
    payload: usize,
    dont_fragment: bool,
    timeout: Duration,
) -> io::Result<Option<Duration>> {
    if payload > 65_507 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "ICMP payload larger than 65507 bytes",
        ));
    }
    let fd = socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Icmp,
    )?;
    set_pmtudisc(&fd, dont_fragment)?;

    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) ^ (std::process::id() as u16);
    let seq: u16 = 1;
    let mut pkt = vec![0u8; 8 + payload];
    pkt[0] = 8; // echo request
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in pkt[8..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let sum = checksum(&pkt);
    pkt[2..4].copy_from_slice(&sum.to_be_bytes());

    let to = SockaddrIn::from(std::net::SocketAddrV4::new(dst, 0));
    let start = Instant::now();
    match sendto(fd.as_raw_fd(), &pkt, &to, MsgFlags::empty()) {
        Ok(_) => {}
        Err(
            Errno::EMSGSIZE
            | Errno::ENETUNREACH
            | Errno::EHOSTUNREACH
            | Errno::ENETDOWN
            | Errno::EHOSTDOWN,
        ) => return Ok(None),
        Err(e) => return Err(e.into()),
    }

    let deadline = start + timeout;
    let mut buf = vec![0u8; 65_536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        // SO_RCVTIMEO of zero means "forever"; `left` is non-zero here.
        let tv = TimeVal::new(
            left.as_secs() as libc::time_t,
            left.subsec_micros().max(1) as libc::suseconds_t,
        );
        setsockopt(&fd.as_fd(), sockopt::ReceiveTimeout, &tv)?;
        let (n, from) = match recvfrom::<SockaddrIn>(fd.as_raw_fd(), &mut buf) {
            Ok(r) => r,
            Err(Errno::EAGAIN | Errno::EINTR) => continue,
            // An ICMP error (e.g. host unreachable) reported on the socket.
            Err(Errno::EHOSTUNREACH | Errno::ENETUNREACH | Errno::EMSGSIZE) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        // Raw IPv4 sockets deliver the IP header too.
        let pkt = &buf[..n];
        if pkt.len() < 20 {
            continue;
        }
        let ihl = usize::from(pkt[0] & 0x0f) * 4;
        if pkt.len() < ihl + 8 {
            continue;
        }
        let icmp = &pkt[ihl..];
        let from_ok = from.map(|a| a.ip() == dst).unwrap_or(false);
        if from_ok
            && icmp[0] == 0
            && icmp[4..6] == id.to_be_bytes()
            && icmp[6..8] == seq.to_be_bytes()
        {
            return Ok(Some(start.elapsed()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::checksum;

    #[test]
    fn checksum_known_vector() {
        // RFC 1071 example words 0001 f203 f4f5 f6f7 -> sum ddf2, checksum 220d.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&data), 0x220d);
        // Odd length pads with a zero byte.
        assert_eq!(checksum(&[0xff]), !0xff00u16);
    }
}
