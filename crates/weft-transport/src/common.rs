//! What both backends share and neither owns: request ids, devices and rails, receive
//! buffers and completions, the limits of requests in flight, and the plumbing of outgoing
//! TCP sockets (a non-blocking connect with retry and its opening message, bounded writes,
//! a zero-wait `poll`). The TCP backend (`tcp`) and the libfabric backend (`ofi`) both import
//! from here; neither imports from the other.

use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::config::Config;
use crate::error::{Error, Link, Result, Stage};

/// Most buffers one grouped receive may have.
pub const MAX_RECVS: usize = 8;
/// Refuses a grouped receive of `bufs` buffers outside 1..=[`MAX_RECVS`] (both backends).
pub(crate) fn check_recv_count(bufs: &[RecvBuf]) -> Result<()> {
    if bufs.is_empty() || bufs.len() > MAX_RECVS {
        return Err(Error::Usage(format!(
            "irecv with {} buffers (1..={MAX_RECVS})",
            bufs.len()
        )));
    }
    Ok(())
}

/// Requests one receive connection keeps in flight.
pub const MAX_RECV_REQUESTS: usize = 64;
/// Requests one send connection keeps in flight (NCCL: 32 x maxRecvs).
pub const MAX_SEND_REQUESTS: usize = 32 * MAX_RECVS;

/// One data interface of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rail {
    /// Interface name.
    pub iface: String,
    /// Address weft binds on it.
    pub addr: IpAddr,
}

/// A device as NCCL sees it: one data interface, or all of them when rails are merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Name shown in logs (`eth1`, or `eth1+eth2` for merged rails).
    pub name: String,
    /// Data interfaces.
    pub rails: Vec<Rail>,
    /// Sum of the rails' link speeds in Mbit/s; 10000 per rail whose speed is unknown.
    pub speed_mbps: u32,
    /// PCI path of the first rail, if it is a PCI device.
    pub pci_path: Option<String>,
    /// Port identity of the first rail.
    pub guid: u64,
}

/// Request handle returned by `isend` / `irecv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId(u64);

impl RequestId {
    /// The raw value (index and generation).
    pub fn raw(self) -> u64 {
        self.0
    }
    /// Rebuilds an id from [`RequestId::raw`].
    pub fn from_raw(v: u64) -> RequestId {
        RequestId(v)
    }
    /// Slot index: unique among the requests in flight on one connection.
    pub fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }
}

pub(crate) fn random_u64() -> u64 {
    let mut v = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into the live array.
    let n = unsafe { libc::getrandom(v.as_mut_ptr().cast(), 8, 0) };
    if n != 8 {
        // Fallback: time and address entropy; only uniqueness matters, not secrecy.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        return (t as u64)
            ^ ((&v as *const _ as u64).rotate_left(32))
            ^ u64::from(std::process::id());
    }
    u64::from_ne_bytes(v)
}

/// The `poll(2)` events of `fd` now (no wait); 0 when none or on error.
pub(crate) fn poll_fd(fd: i32, events: i16) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one live pollfd, zero timeout.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    if r > 0 { p.revents } else { 0 }
}

/// Socket options applied to a socket before it connects (per role).
pub(crate) type Tune = fn(&Socket, &Config) -> io::Result<()>;

/// A socket the sender opens: a non-blocking connect that retries while the listener refuses
/// (it may not be up yet, until the caller's deadline), then writes `out`, the opening
/// message. Every outgoing connection of both backends starts with one (the ofi backend's
/// side channel too).
pub(crate) struct PendingSock {
    pub(crate) sock: Socket,
    remote: SocketAddr,
    local: Option<IpAddr>,
    tune: Tune,
    pub(crate) link: Link,
    pub(crate) connected: bool,
    retry_at: Option<Instant>,
    pub(crate) out: Vec<u8>,
    out_pos: usize,
}

impl std::fmt::Debug for PendingSock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PendingSock({}, connected: {})",
            self.remote, self.connected
        )
    }
}

impl PendingSock {
    fn open(
        remote: SocketAddr,
        local: Option<IpAddr>,
        cfg: &Config,
        link: &Link,
        tune: Tune,
    ) -> Result<Socket> {
        let s = Socket::new(
            Domain::for_address(remote),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| link.io("socket", Stage::Connect, &e))?;
        s.set_nonblocking(true)
            .map_err(|e| link.io("set_nonblocking", Stage::Connect, &e))?;
        tune(&s, cfg).map_err(|e| link.io("setsockopt", Stage::Connect, &e))?;
        if let Some(l) = local {
            s.bind(&SocketAddr::new(l, 0).into())
                .map_err(|e| link.io("bind", Stage::Connect, &e))?;
        }
        match s.connect(&SockAddr::from(remote)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(link.io("connect", Stage::Connect, &e)),
        }
        Ok(s)
    }

    pub(crate) fn new(
        remote: SocketAddr,
        local: Option<IpAddr>,
        iface: String,
        tune: Tune,
        cfg: &Config,
    ) -> Result<PendingSock> {
        let link = Link {
            peer: remote,
            iface,
        };
        let sock = PendingSock::open(remote, local, cfg, &link, tune)?;
        Ok(PendingSock {
            sock,
            remote,
            local,
            tune,
            link,
            connected: false,
            retry_at: None,
            out: Vec::new(),
            out_pos: 0,
        })
    }

    /// Advances connect + hello write. Returns true when connected and the hello is written.
    pub(crate) fn poll(&mut self, now: Instant, cfg: &Config) -> Result<bool> {
        if let Some(t) = self.retry_at {
            if now < t {
                return Ok(false);
            }
            self.retry_at = None;
            self.sock = PendingSock::open(self.remote, self.local, cfg, &self.link, self.tune)?;
        }
        if !self.connected {
            let rev = poll_fd(self.sock.as_raw_fd(), libc::POLLOUT);
            if rev == 0 {
                return Ok(false);
            }
            match self.sock.take_error() {
                Ok(None) => self.connected = true,
                Ok(Some(e)) | Err(e) => {
                    if e.kind() == io::ErrorKind::ConnectionRefused {
                        // The listener may not be up yet (or a stale handle): retry until the deadline.
                        self.retry_at = Some(now + Duration::from_millis(100));
                        return Ok(false);
                    }
                    return Err(self.link.io("connect", Stage::Connect, &e));
                }
            }
        }
        while self.out_pos < self.out.len() {
            match (&self.sock).write(&self.out[self.out_pos..]) {
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.link.io("send hello", Stage::Handshake, &e)),
            }
        }
        Ok(true)
    }
}

/// Writes all of `b` on the non-blocking `s`, retrying until `deadline` (then `TimedOut`).
pub(crate) fn write_all_until(
    mut s: &TcpStream,
    mut b: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    while !b.is_empty() {
        match s.write(b) {
            Ok(n) => b = &b[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "write timed out"));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One buffer of a receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvBuf {
    /// Start.
    pub ptr: *mut u8,
    /// Capacity.
    pub len: usize,
    /// Tag this buffer accepts.
    pub tag: i32,
}

/// A finished receive: the byte count that landed in each buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    /// Number of buffers.
    pub n: usize,
    /// Bytes per buffer (first `n` valid).
    pub sizes: [usize; MAX_RECVS],
}

impl Completed {
    /// The valid sizes.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes[..self.n]
    }
}
