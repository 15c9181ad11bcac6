//! The libfabric backend: the RDMA data path. The same code runs on `verbs;ofi_rxm`
//! (InfiniBand, RoCE), `tcp;ofi_rxm` and `shm`: reliable-datagram endpoints (FI_EP_RDM), memory
//! registration with remote keys, RMA writes with remote CQ data, completion queues polled by
//! `test` (which is also what drives manual-progress providers).
//!
//! libfabric is opened at run time (see [`sys`]); without it the backend is "unavailable" and
//! [`crate::Transport`] uses the TCP backend.
//!
//! # Connection set-up (management network)
//!
//! The listen handle is the TCP backend's (nonce and management address, no data address). The
//! sender opens its endpoint, connects a TCP stream to the management address and writes HELLO
//! (`nstreams = 0`) followed by a MSG frame whose inline payload is its *address record*
//! (provider, `fi_getname` address, eager slots); the receiver checks the nonce, opens an
//! endpoint for the connection, `fi_av_insert`s the sender's address and answers ACK plus its
//! own record. From then on the TCP stream is the side channel, as in the TCP backend: silent
//! except for one ABORT when a side gives up, and EOF when the peer process dies. It is also
//! the liveness watch of a dead peer *host* (keepalive, `TCP_USER_TIMEOUT = timeout`), since an
//! RDM endpoint has no connection whose death the application would see.
//!
//! # Data path (data network), receiver-driven
//!
//! Every message has a sequence number (sends and receive buffers match in posting order).
//! * **CTS**: each `irecv` of `n` buffers sends the sender one clear-to-send message (`fi_send`
//!   into buffers the sender pre-posted): the first sequence number it covers, and per buffer
//!   address (virtual, or offset without FI_MR_VIRT_ADDR), remote key, capacity and tag, plus
//!   the number of eager messages the receiver has consumed (eager credit).
//! * **RMA**: a send whose CTS is there is one `fi_writedata` straight into the receive buffer;
//!   the remote CQ data (`size << 32 | request index << 8 | buffer index`) completes it on the
//!   receiver. Tags pick the buffer with [`crate::proto::select_slot`], the sender choosing.
//! * **Eager**: a send of at most [`EAGER_MAX`] bytes whose CTS is not there yet, with credit
//!   left, is copied into a registered bounce buffer and `fi_send`'s into one of the
//!   [`EAGER_SLOTS`] buffers the receiver keeps posted; the receiver copies it into the matching
//!   buffer (or keeps it until the receive is posted). Eager sends are complete once copied.
//!   Within one grouped receive eager sends are always a prefix (a sender that has the CTS
//!   uses RMA), so both sides choose the same buffers.
//!
//! # Limits
//! Requires remote CQ data of 8 bytes (`tcp;ofi_rxm`, `shm`; `verbs;ofi_rxm` offers 4 and is
//! refused for now) and messages up to 4 GiB - 1 and `max_msg_size`. Host memory only.

pub mod fabric;
pub mod sys;

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain as SockDomain, Protocol, SockAddr, Socket, TcpKeepalive, Type};

use crate::config::Config;
use crate::error::{Error, Link, Result, Stage};
use crate::proto::{self, AbortReason, Frame, FrameDecoder, ListenHandle, RejectReason};
use crate::tcp::{Completed, Device, MAX_RECVS, RecvBuf, RequestId, poll_fd, write_all_until};
use fabric::{Domain, DomainInfo, Endpoint, Mr, MrCache};

/// Largest message sent eagerly (copied into a bounce buffer, no CTS wait).
pub const EAGER_MAX: usize = 8192;
/// Eager receive buffers a receiver keeps posted (= the sender's eager credit).
pub const EAGER_SLOTS: usize = 64;
/// Requests one receive connection keeps in flight.
pub const MAX_RECV_REQUESTS: usize = 64;
/// Requests one send connection keeps in flight (NCCL: 32 x maxRecvs).
pub const MAX_SEND_REQUESTS: usize = 32 * MAX_RECVS;
const CTS_RX_SLOTS: usize = 2 * MAX_RECV_REQUESTS;
const CTS_TX_SLOTS: usize = MAX_RECV_REQUESTS;
const HDR: usize = 24;
const EAGER_BUF: usize = HDR + EAGER_MAX;
const CTS_ENTRY: usize = 32;
const CTS_BUF: usize = 32 + CTS_ENTRY * MAX_RECVS;
const K_EAGER: u32 = 1;
const K_CTS: u32 = 2;
/// Tag of the MSG frame that carries an address record in the handshake.
const ADDR_TAG: i32 = 0x4f46_4931; // "OFI1"
/// Reject code: the sender is not an ofi sender (TCP backend on the other side).
const REJECT_NOT_OFI: u16 = 100;

/// Default provider preference when `WEFT_OFI_PROVIDER` is unset.
pub const DEFAULT_PROVIDERS: &[&str] = &["verbs;ofi_rxm", "tcp;ofi_rxm"];

/// The libfabric backend of a host: one opened domain per data device.
#[derive(Debug)]
pub struct Backend {
    domains: Vec<Arc<Domain>>,
}

impl Backend {
    /// Opens libfabric and, per device, a domain of the configured provider; `Err` says why the
    /// backend is unavailable.
    pub fn open(cfg: &Config, devices: &[Device]) -> std::result::Result<Backend, String> {
        let lib = fabric::lib()?;
        let wanted: Vec<String> = match &cfg.ofi_provider {
            Some(p) => vec![p.clone()],
            None => DEFAULT_PROVIDERS.iter().map(|s| s.to_string()).collect(),
        };
        let mut why = Vec::new();
        for prov in &wanted {
            let infos = match fabric::query(&lib, prov) {
                Ok(v) if !v.is_empty() => v,
                Ok(_) => {
                    why.push(format!("{prov}: no domain"));
                    continue;
                }
                Err(e) => {
                    why.push(e);
                    continue;
                }
            };
            let usable: Vec<_> = infos
                .into_iter()
                .filter(|(i, _)| {
                    let ok = i.cq_data_size >= 8;
                    if !ok {
                        why.push(format!(
                            "{}/{}: {}-byte remote CQ data (8 needed)",
                            i.provider, i.domain, i.cq_data_size
                        ));
                    }
                    ok
                })
                .collect();
            if usable.is_empty() {
                continue;
            }
            let mut domains = Vec::new();
            let mut opened: Vec<(String, Arc<Domain>)> = Vec::new();
            let mut infos = usable;
            for d in devices {
                // Domain: WEFT_OFI_DOMAIN, else the one named like the device's first data
                // interface (tcp names domains after interfaces), else the provider's first.
                let name = cfg
                    .ofi_domain
                    .clone()
                    .unwrap_or_else(|| d.rails.first().map_or(String::new(), |r| r.iface.clone()));
                let pick = infos
                    .iter()
                    .position(|(i, _)| i.domain == name)
                    .or_else(|| {
                        opened
                            .iter()
                            .position(|(n, _)| *n == name)
                            .map(|_| usize::MAX)
                    });
                let dom = match pick {
                    Some(usize::MAX) => opened
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, d)| d.clone()),
                    Some(i) => {
                        let (info, fi) = infos.remove(i);
                        let n = info.domain.clone();
                        let dom = Arc::new(Domain::open(info, fi)?);
                        opened.push((n, dom.clone()));
                        Some(dom)
                    }
                    None if cfg.ofi_domain.is_some() => {
                        return Err(format!(
                            "{prov}: no domain named {name:?} (WEFT_OFI_DOMAIN)"
                        ));
                    }
                    None => match opened.first() {
                        Some((_, d)) => Some(d.clone()),
                        None if !infos.is_empty() => {
                            let (info, fi) = infos.remove(0);
                            let n = info.domain.clone();
                            let dom = Arc::new(Domain::open(info, fi)?);
                            opened.push((n, dom.clone()));
                            Some(dom)
                        }
                        None => None,
                    },
                };
                match dom {
                    Some(d) => domains.push(d),
                    None => return Err(format!("{prov}: no domain for device {}", d.name)),
                }
            }
            return Ok(Backend { domains });
        }
        Err(format!("no usable libfabric provider: {}", why.join("; ")))
    }

    /// `provider/domain` of device `dev`.
    pub fn describe(&self, dev: usize) -> String {
        self.domains.get(dev).map_or_else(String::new, |d| {
            format!("{}/{}", d.info.provider, d.info.domain)
        })
    }

    /// What the provider of device `dev` reported.
    pub fn info(&self, dev: usize) -> Option<&DomainInfo> {
        self.domains.get(dev).map(|d| &d.info)
    }

    fn domain(&self, dev: usize) -> Result<&Arc<Domain>> {
        self.domains
            .get(dev)
            .ok_or_else(|| Error::Usage(format!("device {dev} does not exist")))
    }

    /// Opens the management listener of device `dev`.
    pub fn listen(
        self: &Arc<Self>,
        cfg: &Config,
        mgmt: (IpAddr, &str),
        dev: usize,
    ) -> Result<Listener> {
        self.domain(dev)?;
        let sa = SocketAddr::new(mgmt.0, 0);
        let op = || format!("management listener on {sa}");
        let s = Socket::new(
            SockDomain::for_address(sa),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| Error::local(op(), &e))?;
        s.bind(&sa.into()).map_err(|e| Error::local(op(), &e))?;
        s.listen(1024).map_err(|e| Error::local(op(), &e))?;
        s.set_nonblocking(true)
            .map_err(|e| Error::local(op(), &e))?;
        let l: TcpListener = s.into();
        let addr = l.local_addr().map_err(|e| Error::local("local_addr", &e))?;
        Ok(Listener {
            cfg: cfg.clone(),
            backend: self.clone(),
            dev,
            iface: mgmt.1.to_string(),
            handle: ListenHandle {
                nonce: crate::tcp::random_u64(),
                mgmt: addr,
                data: Vec::new(),
            },
            listener: l,
            pending: Vec::new(),
            idle_since: None,
        })
    }

    /// Starts connecting device `dev` to the listener of `handle`.
    pub fn connect(
        self: &Arc<Self>,
        cfg: &Config,
        mgmt: (IpAddr, &str),
        dev: usize,
        handle: &[u8],
    ) -> Result<Connecting> {
        let h = ListenHandle::decode(handle)?;
        let dom = self.domain(dev)?.clone();
        let link = Link {
            peer: h.mgmt,
            iface: mgmt.1.to_string(),
        };
        let ep = Endpoint::open(&dom, 4096)
            .map_err(|e| ofi_err(&link, "fi_endpoint", Stage::Connect, e))?;
        let rec = AddrRecord {
            provider: dom.info.provider.clone(),
            addr: ep
                .name()
                .map_err(|e| ofi_err(&link, "fi_getname", Stage::Connect, e))?,
            eager_slots: EAGER_SLOTS as u32,
        };
        let conn_id = crate::tcp::random_u64();
        let mut out = Vec::new();
        Frame::Hello {
            nonce: h.nonce,
            conn_id,
            nstreams: 0,
        }
        .encode(&mut out);
        rec.encode(&mut out);
        let local = (mgmt.0.is_ipv4() == h.mgmt.ip().is_ipv4()
            && mgmt.0.is_loopback() == h.mgmt.ip().is_loopback())
        .then_some(mgmt.0);
        let sock = open_side(h.mgmt, local, cfg, &link)?;
        Ok(Connecting {
            cfg: cfg.clone(),
            link,
            local,
            sock,
            connected: false,
            retry_at: None,
            out,
            out_pos: 0,
            dec: FrameDecoder::new(),
            acked: false,
            nonce: h.nonce,
            conn_id,
            deadline: Instant::now() + cfg.timeout,
            ep: Some(ep),
        })
    }
}

fn ofi_err(link: &Link, op: &'static str, stage: Stage, message: String) -> Error {
    Error::Io {
        op,
        peer: link.peer,
        iface: link.iface.clone(),
        stage,
        kind: io::ErrorKind::Other,
        message,
    }
}

/// The side channel's socket options: the liveness watch of the peer host (see module docs).
fn tune_side(s: &Socket, cfg: &Config) -> io::Result<()> {
    s.set_tcp_nodelay(true)?;
    s.set_keepalive(true)?;
    let idle = (cfg.timeout / 3).max(Duration::from_secs(1));
    s.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(idle)
            .with_interval(Duration::from_secs(1))
            .with_retries(3),
    )?;
    s.set_tcp_user_timeout(Some(cfg.timeout))
}

fn open_side(
    remote: SocketAddr,
    local: Option<IpAddr>,
    cfg: &Config,
    link: &Link,
) -> Result<Socket> {
    let s = Socket::new(
        SockDomain::for_address(remote),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(|e| link.io("socket", Stage::Connect, &e))?;
    s.set_nonblocking(true)
        .map_err(|e| link.io("set_nonblocking", Stage::Connect, &e))?;
    tune_side(&s, cfg).map_err(|e| link.io("setsockopt", Stage::Connect, &e))?;
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

/// What each side tells the other in the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AddrRecord {
    provider: String,
    addr: Vec<u8>,
    eager_slots: u32,
}

impl AddrRecord {
    fn encode(&self, out: &mut Vec<u8>) {
        let mut p = Vec::new();
        p.extend_from_slice(b"WOFI");
        p.push(1);
        p.push(self.provider.len().min(255) as u8);
        p.extend_from_slice(&self.provider.as_bytes()[..self.provider.len().min(255)]);
        p.extend_from_slice(&(self.addr.len() as u16).to_be_bytes());
        p.extend_from_slice(&self.addr);
        p.extend_from_slice(&self.eager_slots.to_be_bytes());
        Frame::encode_msg(out, ADDR_TAG, Some(&p), p.len() as u64, 0);
    }

    fn decode(p: &[u8]) -> Option<AddrRecord> {
        if p.len() < 6 || &p[..4] != b"WOFI" || p[4] != 1 {
            return None;
        }
        let pl = p[5] as usize;
        let provider = String::from_utf8(p.get(6..6 + pl)?.to_vec()).ok()?;
        let at = 6 + pl;
        let al = u16::from_be_bytes(p.get(at..at + 2)?.try_into().ok()?) as usize;
        let addr = p.get(at + 2..at + 2 + al)?.to_vec();
        let at = at + 2 + al;
        let eager_slots = u32::from_be_bytes(p.get(at..at + 4)?.try_into().ok()?);
        Some(AddrRecord {
            provider,
            addr,
            eager_slots,
        })
    }
}

/// A connection being set up by the sender.
pub struct Connecting {
    cfg: Config,
    link: Link,
    local: Option<IpAddr>,
    sock: Socket,
    connected: bool,
    retry_at: Option<Instant>,
    out: Vec<u8>,
    out_pos: usize,
    dec: FrameDecoder,
    acked: bool,
    nonce: u64,
    conn_id: u64,
    deadline: Instant,
    ep: Option<Endpoint>,
}

impl std::fmt::Debug for Connecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ofi::Connecting({})", self.link.peer)
    }
}

impl Connecting {
    /// Advances the handshake without blocking. `Ok(None)`: call again later.
    pub fn poll(&mut self) -> Result<Option<SendConn>> {
        let now = Instant::now();
        if now >= self.deadline {
            let stage = if self.connected {
                Stage::Handshake
            } else {
                Stage::Connect
            };
            return Err(self.link.timeout(stage, self.cfg.timeout));
        }
        if let Some(t) = self.retry_at {
            if now < t {
                return Ok(None);
            }
            self.retry_at = None;
            self.sock = open_side(self.link.peer, self.local, &self.cfg, &self.link)?;
        }
        if !self.connected {
            if poll_fd(self.sock.as_raw_fd(), libc::POLLOUT) == 0 {
                return Ok(None);
            }
            match self.sock.take_error() {
                Ok(None) => self.connected = true,
                Ok(Some(e)) | Err(e) => {
                    if e.kind() == io::ErrorKind::ConnectionRefused {
                        self.retry_at = Some(now + Duration::from_millis(100));
                        return Ok(None);
                    }
                    return Err(self.link.io("connect", Stage::Connect, &e));
                }
            }
        }
        while self.out_pos < self.out.len() {
            match (&self.sock).write(&self.out[self.out_pos..]) {
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.link.io("send hello", Stage::Handshake, &e)),
            }
        }
        let mut buf = [0u8; 1024];
        loop {
            let want = self.dec.wanted().min(buf.len());
            match (&self.sock).read(&mut buf[..want.max(1)]) {
                Ok(0) => return Err(self.link.closed(Stage::Handshake)),
                Ok(n) => self.dec.handle_bytes(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.link.io("recv ack", Stage::Handshake, &e)),
            }
            loop {
                let f = match self.dec.poll_frame() {
                    Ok(None) => break,
                    Ok(Some(f)) => f,
                    Err(e) => return Err(self.link.protocol(Stage::Handshake, e)),
                };
                match f {
                    Frame::Ack { nonce, conn_id }
                        if !self.acked && nonce == self.nonce && conn_id == self.conn_id =>
                    {
                        self.acked = true;
                    }
                    Frame::Reject { reason, .. } => {
                        return Err(Error::Rejected {
                            peer: self.link.peer,
                            iface: self.link.iface.clone(),
                            reason: match reason {
                                RejectReason::Other(REJECT_NOT_OFI) => {
                                    "the listener's libfabric provider differs from ours".into()
                                }
                                r => r.to_string(),
                            },
                        });
                    }
                    Frame::Msg(h) if self.acked && h.tag == ADDR_TAG => {
                        let rec = h
                            .inline
                            .as_deref()
                            .and_then(AddrRecord::decode)
                            .ok_or_else(|| self.bad("address record"))?;
                        return self.establish(rec).map(Some);
                    }
                    f => {
                        return Err(self.link.protocol(
                            Stage::Handshake,
                            proto::FrameError::Unexpected {
                                got: f.name(),
                                expected: "ACK and address record",
                            },
                        ));
                    }
                }
            }
        }
    }

    fn bad(&self, what: &'static str) -> Error {
        self.link.protocol(
            Stage::Handshake,
            proto::FrameError::Unexpected {
                got: "malformed MSG",
                expected: what,
            },
        )
    }

    fn establish(&mut self, rec: AddrRecord) -> Result<SendConn> {
        let Some(mut ep) = self.ep.take() else {
            return Err(Error::Usage("connection already established".into()));
        };
        if rec.provider != ep.dom.info.provider {
            return Err(Error::Rejected {
                peer: self.link.peer,
                iface: self.link.iface.clone(),
                reason: format!(
                    "the listener uses provider {}, this side {}",
                    rec.provider, ep.dom.info.provider
                ),
            });
        }
        ep.set_peer(&rec.addr)
            .map_err(|e| ofi_err(&self.link, "fi_av_insert", Stage::Handshake, e))?;
        let sock: TcpStream = self
            .sock
            .try_clone()
            .map_err(|e| Error::local("dup", &e))?
            .into();
        let link = Link {
            peer: self.link.peer,
            iface: format!("{} ({})", self.link.iface, describe(&ep)),
        };
        SendConn::new(ep, link, sock, rec.eager_slots)
    }

    /// Polls until connected or failed (at most the configured timeout).
    pub fn wait(mut self) -> Result<SendConn> {
        loop {
            if let Some(c) = self.poll()? {
                return Ok(c);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

fn describe(ep: &Endpoint) -> String {
    format!("ofi {}/{}", ep.dom.info.provider, ep.dom.info.domain)
}

struct PendingAccept {
    sock: TcpStream,
    link: Link,
    dec: FrameDecoder,
    since: Instant,
    hello: Option<(u64, u64)>,
}

/// The receiver's listening side of a device.
pub struct Listener {
    cfg: Config,
    backend: Arc<Backend>,
    dev: usize,
    iface: String,
    handle: ListenHandle,
    listener: TcpListener,
    pending: Vec<PendingAccept>,
    idle_since: Option<Instant>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ofi::Listener({})", self.handle.mgmt)
    }
}

impl Listener {
    /// The handle to give the sender.
    pub fn handle(&self) -> [u8; proto::HANDLE_SIZE] {
        self.handle.encode()
    }

    /// The decoded handle.
    pub fn handle_info(&self) -> &ListenHandle {
        &self.handle
    }

    /// Accepts without blocking. `Ok(None)`: nothing complete yet.
    pub fn accept(&mut self) -> Result<Option<RecvConn>> {
        let now = Instant::now();
        let idle_since = *self.idle_since.get_or_insert(now);
        loop {
            match self.listener.accept() {
                Ok((s, peer)) => {
                    let link = Link {
                        peer,
                        iface: self.iface.clone(),
                    };
                    let sock = Socket::from(s);
                    sock.set_nonblocking(true)
                        .and_then(|()| tune_side(&sock, &self.cfg))
                        .map_err(|e| link.io("setsockopt", Stage::Accept, &e))?;
                    self.pending.push(PendingAccept {
                        sock: sock.into(),
                        link,
                        dec: FrameDecoder::new(),
                        since: now,
                        hello: None,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::local(format!("accept on {}", self.iface), &e)),
            }
        }
        if !self.pending.is_empty() {
            self.idle_since = Some(now);
        }
        let mut i = 0;
        while i < self.pending.len() {
            match self.step(i, now) {
                Ok(None) => i += 1,
                Ok(Some((nonce, conn_id, rec))) => {
                    let r = self.finish(i, nonce, conn_id, rec);
                    self.pending.swap_remove(i);
                    return r.map(Some);
                }
                Err(e) => {
                    self.pending.swap_remove(i);
                    return Err(e);
                }
            }
        }
        if self.pending.is_empty() && now.duration_since(idle_since) >= self.cfg.accept_timeout {
            return Err(Error::Timeout {
                peer: self.handle.mgmt,
                iface: self.iface.clone(),
                stage: Stage::Accept,
                after: self.cfg.accept_timeout,
            });
        }
        Ok(None)
    }

    fn step(&mut self, i: usize, now: Instant) -> Result<Option<(u64, u64, AddrRecord)>> {
        let p = &mut self.pending[i];
        let mut buf = [0u8; 1024];
        loop {
            let want = p.dec.wanted().min(buf.len()).max(1);
            match (&p.sock).read(&mut buf[..want]) {
                Ok(0) => return Err(p.link.closed(Stage::Accept)),
                Ok(n) => p.dec.handle_bytes(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(p.link.io("recv hello", Stage::Accept, &e)),
            }
            let f = match p.dec.poll_frame() {
                Ok(None) => continue,
                Ok(Some(f)) => f,
                Err(e) => return Err(p.link.protocol(Stage::Accept, e)),
            };
            match (f, p.hello) {
                (
                    Frame::Hello {
                        nonce,
                        conn_id,
                        nstreams,
                    },
                    None,
                ) => {
                    let reason = if nonce != self.handle.nonce {
                        Some(RejectReason::WrongNonce)
                    } else if nstreams != 0 {
                        Some(RejectReason::Other(REJECT_NOT_OFI))
                    } else {
                        None
                    };
                    if let Some(reason) = reason {
                        let mut v = Vec::new();
                        Frame::Reject {
                            nonce,
                            conn_id,
                            reason,
                        }
                        .encode(&mut v);
                        let _ = (&p.sock).write(&v);
                        return Err(Error::Rejected {
                            peer: p.link.peer,
                            iface: p.link.iface.clone(),
                            reason: format!("refused: {reason}"),
                        });
                    }
                    p.hello = Some((nonce, conn_id));
                }
                (Frame::Msg(h), Some((nonce, conn_id))) if h.tag == ADDR_TAG => {
                    let rec = h
                        .inline
                        .as_deref()
                        .and_then(AddrRecord::decode)
                        .ok_or_else(|| {
                            p.link.protocol(
                                Stage::Accept,
                                proto::FrameError::Unexpected {
                                    got: "malformed MSG",
                                    expected: "address record",
                                },
                            )
                        })?;
                    return Ok(Some((nonce, conn_id, rec)));
                }
                (f, _) => {
                    return Err(p.link.protocol(
                        Stage::Accept,
                        proto::FrameError::Unexpected {
                            got: f.name(),
                            expected: "HELLO and address record",
                        },
                    ));
                }
            }
        }
        if now.duration_since(p.since) >= self.cfg.timeout {
            return Err(p.link.timeout(Stage::Accept, self.cfg.timeout));
        }
        Ok(None)
    }

    fn finish(&mut self, i: usize, nonce: u64, conn_id: u64, rec: AddrRecord) -> Result<RecvConn> {
        let dom = self.backend.domain(self.dev)?.clone();
        let p = &self.pending[i];
        if rec.provider != dom.info.provider {
            let mut v = Vec::new();
            Frame::Reject {
                nonce,
                conn_id,
                reason: RejectReason::Other(REJECT_NOT_OFI),
            }
            .encode(&mut v);
            let _ = (&p.sock).write(&v);
            return Err(Error::Rejected {
                peer: p.link.peer,
                iface: p.link.iface.clone(),
                reason: format!(
                    "refused: the sender uses provider {}, this side {}",
                    rec.provider, dom.info.provider
                ),
            });
        }
        let mut ep = Endpoint::open(&dom, 4096)
            .map_err(|e| ofi_err(&p.link, "fi_endpoint", Stage::Accept, e))?;
        ep.set_peer(&rec.addr)
            .map_err(|e| ofi_err(&p.link, "fi_av_insert", Stage::Accept, e))?;
        let mine = AddrRecord {
            provider: dom.info.provider.clone(),
            addr: ep
                .name()
                .map_err(|e| ofi_err(&p.link, "fi_getname", Stage::Accept, e))?,
            eager_slots: EAGER_SLOTS as u32,
        };
        let link = Link {
            peer: p.link.peer,
            iface: format!("{} ({})", p.link.iface, describe(&ep)),
        };
        let sock = p.sock.try_clone().map_err(|e| Error::local("dup", &e))?;
        // Post the eager buffers before the sender can learn our address.
        let conn = RecvConn::new(ep, link.clone(), sock)?;
        let mut v = Vec::new();
        Frame::Ack { nonce, conn_id }.encode(&mut v);
        mine.encode(&mut v);
        write_all_until(&conn.side.sock, &v, Instant::now() + self.cfg.timeout)
            .map_err(|e| link.io("send ack", Stage::Accept, &e))?;
        Ok(conn)
    }

    /// Polls until a connection arrives or the accept timeout passes.
    pub fn wait(&mut self) -> Result<RecvConn> {
        loop {
            if let Some(c) = self.accept()? {
                return Ok(c);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The management side channel of an established connection: ABORT and EOF.
struct Side {
    sock: TcpStream,
    dec: FrameDecoder,
    eof: bool,
    next_check: Instant,
}

impl Side {
    fn new(sock: TcpStream) -> Side {
        Side {
            sock,
            dec: FrameDecoder::new(),
            eof: false,
            next_check: Instant::now(),
        }
    }

    /// At most every millisecond: the peer's ABORT as an error.
    fn poll(&mut self, link: &Link, who: &str) -> Option<Error> {
        let now = Instant::now();
        if now < self.next_check {
            return None;
        }
        self.next_check = now + Duration::from_millis(1);
        let mut buf = [0u8; 64];
        while !self.eof {
            match (&self.sock).read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.dec.handle_bytes(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.eof = true,
            }
        }
        match self.dec.poll_frame() {
            Ok(Some(Frame::Abort { reason, detail })) => {
                Some(link.aborted(format!("the {who} gave up: {}", reason.describe(detail))))
            }
            Ok(_) => None,
            Err(e) => Some(link.protocol(Stage::Data, e)),
        }
    }

    fn send_abort(&mut self, e: &Error) {
        if matches!(e, Error::Aborted { .. }) {
            return;
        }
        let reason = match e {
            Error::Protocol { .. } | Error::TagMismatch { .. } | Error::Truncated { .. } => {
                AbortReason::Protocol
            }
            Error::Io { .. } | Error::Closed { .. } | Error::Timeout { .. } => {
                AbortReason::StreamFailed
            }
            _ => AbortReason::Local,
        };
        let mut b = Vec::new();
        Frame::Abort { reason, detail: 0 }.encode(&mut b);
        let _ = (&self.sock).write(&b);
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }
}

/// Context of one posted operation: the provider's `fi_context2` first, then ours.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Ctx {
    prov: sys::fi_context2,
    id: u64,
}

const C_EAGER_RX: u64 = 1;
const C_CTS_TX: u64 = 2;
const C_CTS_RX: u64 = 3;
const C_EAGER_TX: u64 = 4;
const C_WRITE: u64 = 5;

fn ctx_array(n: usize) -> Box<[Ctx]> {
    vec![Ctx::default(); n].into_boxed_slice()
}

/// Fixed-capacity slots with generation-tagged ids (index < capacity, as the plugin needs).
struct Slab<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<usize>,
}

impl<T> Slab<T> {
    fn new(cap: usize) -> Slab<T> {
        Slab {
            slots: (0..cap).map(|_| (0, None)).collect(),
            free: (0..cap).rev().collect(),
        }
    }
    fn insert(&mut self, v: T) -> Option<RequestId> {
        let i = self.free.pop()?;
        let slot = &mut self.slots[i];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(v);
        Some(RequestId::from_raw((u64::from(slot.0) << 32) | i as u64))
    }
    fn get_mut(&mut self, id: RequestId) -> Option<&mut T> {
        let (g, v) = self.slots.get_mut(id.index())?;
        if u64::from(*g) != id.raw() >> 32 {
            return None;
        }
        v.as_mut()
    }
    fn at(&mut self, i: usize) -> Option<&mut T> {
        self.slots.get_mut(i)?.1.as_mut()
    }
    fn remove(&mut self, id: RequestId) -> Option<T> {
        let i = id.index();
        let (g, v) = self.slots.get_mut(i)?;
        if u64::from(*g) != id.raw() >> 32 {
            return None;
        }
        let out = v.take();
        if out.is_some() {
            self.free.push(i);
        }
        out
    }
    fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
    fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|(_, v)| v.as_ref())
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// Registered bounce memory of `n` slots of `size` bytes.
struct Pool {
    buf: Box<[u8]>,
    mr: Mr,
    size: usize,
}

impl Pool {
    fn new(ep: &Endpoint, n: usize, size: usize) -> std::result::Result<Pool, String> {
        let buf = vec![0u8; n * size].into_boxed_slice();
        let mr = ep.register(buf.as_ptr(), buf.len())?;
        Ok(Pool { buf, mr, size })
    }
    fn slot(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf[i * self.size..(i + 1) * self.size]
    }
    fn ptr(&mut self, i: usize) -> *mut u8 {
        self.slot(i).as_mut_ptr()
    }
}

/// How long a side whose peer's process ended (side channel EOF) keeps reading completions
/// before it calls the connection closed: what the peer sent before dying still lands.
const EOF_GRACE: Duration = Duration::from_millis(500);

// ------------------------------------------------------------------------------------------
// Sender

#[derive(Debug, Clone, Copy)]
struct CtsEntry {
    addr: u64,
    key: u64,
    len: u64,
    tag: i32,
}

struct Group {
    first: u64,
    n: usize,
    rreq: u32,
    entries: [CtsEntry; MAX_RECVS],
    filled: [bool; MAX_RECVS],
    assigned: usize,
}

struct Unassigned {
    seq: u64,
    tag: i32,
    ptr: usize,
    len: usize,
    req: RequestId,
    /// Sent eagerly: only its buffer choice is left to account (no write).
    eager: bool,
}

struct WriteOp {
    req: RequestId,
    ptr: usize,
    len: usize,
    addr: u64,
    key: u64,
    data: u64,
}

struct SendReq {
    size: usize,
    done: bool,
    posted: bool,
    _mr: Option<Arc<Mr>>,
}

/// The sending end of an ofi connection.
pub struct SendConn {
    ep: Endpoint,
    link: Link,
    side: Side,
    ctx: Box<[Ctx]>,
    cts: Pool,
    eager: Pool,
    eager_free: Vec<usize>,
    eager_busy: usize,
    /// Eager sends copied but not yet accepted by the provider: (slot, bytes, request).
    eager_queue: VecDeque<(usize, usize, RequestId)>,
    cache: MrCache,
    reqs: Slab<SendReq>,
    next_seq: u64,
    unassigned: VecDeque<Unassigned>,
    groups: BTreeMap<u64, Group>,
    writes: VecDeque<WriteOp>,
    reposts: Vec<usize>,
    eager_sent: u64,
    eager_consumed: u64,
    peer_slots: u64,
    mr_local: bool,
    max_msg: usize,
    eof_at: Option<Instant>,
    error: Option<Error>,
}

impl std::fmt::Debug for SendConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ofi::SendConn({} via {})",
            self.link.peer, self.link.iface
        )
    }
}

impl SendConn {
    fn new(ep: Endpoint, link: Link, sock: TcpStream, peer_slots: u32) -> Result<SendConn> {
        let e = |m: String| ofi_err(&link, "fi_mr_reg", Stage::Handshake, m);
        let cts = Pool::new(&ep, CTS_RX_SLOTS, CTS_BUF).map_err(e)?;
        let eager = Pool::new(&ep, EAGER_SLOTS, EAGER_BUF).map_err(e)?;
        let mut ctx = ctx_array(CTS_RX_SLOTS + EAGER_SLOTS + MAX_SEND_REQUESTS);
        for (i, c) in ctx.iter_mut().enumerate() {
            c.id = if i < CTS_RX_SLOTS {
                (C_CTS_RX << 32) | i as u64
            } else if i < CTS_RX_SLOTS + EAGER_SLOTS {
                (C_EAGER_TX << 32) | (i - CTS_RX_SLOTS) as u64
            } else {
                (C_WRITE << 32) | (i - CTS_RX_SLOTS - EAGER_SLOTS) as u64
            };
        }
        let info = ep.dom.info.clone();
        let mut s = SendConn {
            ep,
            link,
            side: Side::new(sock),
            ctx,
            cts,
            eager,
            eager_free: (0..EAGER_SLOTS).rev().collect(),
            eager_busy: 0,
            eager_queue: VecDeque::new(),
            cache: MrCache::default(),
            reqs: Slab::new(MAX_SEND_REQUESTS),
            next_seq: 0,
            unassigned: VecDeque::new(),
            groups: BTreeMap::new(),
            writes: VecDeque::new(),
            reposts: (0..CTS_RX_SLOTS).collect(),
            eager_sent: 0,
            eager_consumed: 0,
            peer_slots: u64::from(peer_slots),
            mr_local: info.mr_mode & sys::FI_MR_LOCAL != 0,
            max_msg: info.max_msg_size,
            eof_at: None,
            error: None,
        };
        s.repost().map_err(|e| s.fail(e))?;
        Ok(s)
    }

    /// Remote management address and "interface (ofi provider/domain)".
    pub fn peer(&self) -> (SocketAddr, &str) {
        (self.link.peer, &self.link.iface)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.reqs.live()
    }

    /// Registration cache statistics: (hits, misses).
    pub fn mr_stats(&self) -> (u64, u64) {
        (self.cache.hits, self.cache.misses)
    }

    fn fi(&self, op: &'static str, m: String) -> Error {
        ofi_err(&self.link, op, Stage::Data, m)
    }

    fn fail(&mut self, e: Error) -> Error {
        if self.error.is_none() {
            self.side.send_abort(&e);
        }
        self.error.get_or_insert(e).clone()
    }

    fn repost(&mut self) -> Result<()> {
        while let Some(&i) = self.reposts.last() {
            let p = self.cts.ptr(i);
            let desc = self.cts.mr.desc();
            let c: *mut Ctx = &mut self.ctx[i];
            // SAFETY: slot `i` of the registered CTS pool and its context live as long as the
            // endpoint (closed first in Drop); nothing else uses them until the completion.
            let ok = unsafe { self.ep.recv(p, CTS_BUF, desc, c.cast()) }
                .map_err(|m| self.fi("fi_recv", m))?;
            if !ok {
                break;
            }
            self.reposts.pop();
        }
        Ok(())
    }

    fn on_cts(&mut self, slot: usize) -> Result<()> {
        let b = self.cts.slot(slot);
        if get_u32(b, 0) != K_CTS {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "unknown message",
                    expected: "CTS",
                },
            ));
        }
        let n = (get_u32(b, 4) as usize).clamp(1, MAX_RECVS);
        let first = get_u64(b, 8);
        let consumed = get_u64(b, 16);
        let rreq = get_u32(b, 24);
        let mut entries = [CtsEntry {
            addr: 0,
            key: 0,
            len: 0,
            tag: 0,
        }; MAX_RECVS];
        for (k, e) in entries.iter_mut().enumerate().take(n) {
            let at = 32 + k * CTS_ENTRY;
            *e = CtsEntry {
                addr: get_u64(b, at),
                key: get_u64(b, at + 8),
                len: get_u64(b, at + 16),
                tag: get_u32(b, at + 24) as i32,
            };
        }
        self.eager_consumed = self.eager_consumed.max(consumed);
        self.groups.insert(
            first,
            Group {
                first,
                n,
                rreq,
                entries,
                filled: [false; MAX_RECVS],
                assigned: 0,
            },
        );
        self.reposts.push(slot);
        Ok(())
    }

    /// Gives each send whose CTS is known its buffer, in sequence order; queues the writes.
    fn assign(&mut self) -> Result<()> {
        while let Some(u) = self.unassigned.front() {
            let Some((&first, g)) = self.groups.range_mut(..=u.seq).next_back() else {
                break;
            };
            if u.seq >= g.first + g.n as u64 {
                break;
            }
            let tags: Vec<i32> = g.entries[..g.n].iter().map(|e| e.tag).collect();
            let peer = self.link.peer;
            let slot = proto::select_slot(&tags, &g.filled[..g.n], u.tag)
                .ok_or(Error::TagMismatch { peer, tag: u.tag })?;
            g.filled[slot] = true;
            g.assigned += 1;
            let e = g.entries[slot];
            if !u.eager {
                let req = u.req;
                if u.len as u64 > e.len {
                    return Err(Error::Truncated {
                        peer,
                        sent: u.len as u64,
                        posted: e.len as usize,
                        tag: u.tag,
                    });
                }
                self.writes.push_back(WriteOp {
                    req,
                    ptr: u.ptr,
                    len: u.len,
                    addr: e.addr,
                    key: e.key,
                    data: ((u.len as u64) << 32) | (u64::from(g.rreq) << 8) | slot as u64,
                });
            }
            if g.assigned == g.n {
                self.groups.remove(&first);
            }
            self.unassigned.pop_front();
        }
        Ok(())
    }

    /// Hands queued eager sends to the provider, in order; each is complete once accepted
    /// (its bytes are in the bounce buffer).
    fn post_eager(&mut self) -> Result<()> {
        while let Some(&(slot, len, id)) = self.eager_queue.front() {
            let p = self.eager.ptr(slot);
            let desc = self.eager.mr.desc();
            let c: *mut Ctx = &mut self.ctx[CTS_RX_SLOTS + slot];
            // SAFETY: bounce slot and context stay untouched until this send's completion
            // returns the slot to `eager_free`; both live as long as the endpoint.
            let ok = unsafe { self.ep.send(p, HDR + len, desc, c.cast()) }
                .map_err(|m| self.fi("fi_send", m))?;
            if !ok {
                break;
            }
            if let Some(r) = self.reqs.get_mut(id) {
                r.done = true;
                r.posted = true;
            }
            self.eager_queue.pop_front();
        }
        Ok(())
    }

    fn post_writes(&mut self) -> Result<()> {
        while let Some(w) = self.writes.front() {
            let (req, ptr, len, addr, key, data) = (w.req, w.ptr, w.len, w.addr, w.key, w.data);
            let mr = if self.mr_local {
                Some(
                    self.cache
                        .get(&self.ep, ptr, len)
                        .map_err(|m| self.fi("fi_mr_reg", m))?,
                )
            } else {
                None
            };
            let desc = mr.as_ref().map_or(std::ptr::null_mut(), |m| m.desc());
            let c: *mut Ctx = &mut self.ctx[CTS_RX_SLOTS + EAGER_SLOTS + req.index()];
            // SAFETY: the caller of isend keeps `ptr..ptr+len` valid until test reports done,
            // which is after this write's completion; the context lives with the endpoint; the
            // remote range was announced by the receiver's CTS for this very message.
            let ok = unsafe {
                self.ep
                    .write_data(ptr as *const u8, len, desc, data, addr, key, c.cast())
            }
            .map_err(|m| self.fi("fi_writedata", m))?;
            if !ok {
                break;
            }
            if let Some(r) = self.reqs.get_mut(req) {
                r.posted = true;
                r._mr = mr;
            }
            self.writes.pop_front();
        }
        Ok(())
    }

    fn poll_cq(&mut self) -> Result<()> {
        let mut ents = [sys::fi_cq_data_entry {
            op_context: std::ptr::null_mut(),
            flags: 0,
            len: 0,
            buf: std::ptr::null_mut(),
            data: 0,
        }; 16];
        loop {
            let n = self
                .ep
                .poll(&mut ents)
                .map_err(|m| self.fi("fi_cq_read", m))?;
            for e in &ents[..n] {
                if e.op_context.is_null() {
                    continue;
                }
                // SAFETY: every context we post is an element of `self.ctx`.
                let id = unsafe { (*e.op_context.cast::<Ctx>()).id };
                let i = (id & 0xffff_ffff) as usize;
                match id >> 32 {
                    C_CTS_RX => self.on_cts(i)?,
                    C_EAGER_TX => {
                        self.eager_free.push(i);
                        self.eager_busy -= 1;
                    }
                    C_WRITE => {
                        if let Some(r) = self.reqs.at(i) {
                            r.done = true;
                            r._mr = None;
                        }
                    }
                    _ => {}
                }
            }
            if n < ents.len() {
                return Ok(());
            }
        }
    }

    fn work_pending(&self) -> bool {
        self.reqs.values().any(|r| !r.done)
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let r = self
            .poll_cq()
            .and_then(|()| self.repost())
            .and_then(|()| self.post_eager())
            .and_then(|()| self.assign())
            .and_then(|()| self.post_writes());
        if let Err(e) = r {
            return Err(self.fail(e));
        }
        if let Some(e) = self.side.poll(&self.link, "receiver") {
            return Err(self.fail(e));
        }
        if self.side.eof && self.work_pending() {
            let at = *self.eof_at.get_or_insert_with(Instant::now);
            if at.elapsed() >= EOF_GRACE {
                let e = self.link.closed(Stage::Data);
                return Err(self.fail(e));
            }
        }
        Ok(())
    }

    /// Starts sending `len` bytes at `data` with `tag`. `Ok(None)`: busy, retry later.
    ///
    /// # Safety
    /// `data..data+len` must be readable and unchanged until [`SendConn::test`] reports the
    /// request done or the connection is dropped.
    pub unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: i32,
    ) -> Result<Option<RequestId>> {
        self.progress()?;
        if len > u32::MAX as usize || len > self.max_msg {
            return Err(Error::Usage(format!(
                "message of {len} bytes exceeds the ofi backend's limit ({} bytes)",
                self.max_msg.min(u32::MAX as usize)
            )));
        }
        if self.reqs.live() >= MAX_SEND_REQUESTS {
            return Ok(None);
        }
        let seq = self.next_seq;
        let cts_known = self
            .groups
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, g)| seq < g.first + g.n as u64);
        let eager = len <= EAGER_MAX
            && !cts_known
            && self.unassigned.iter().all(|u| u.eager)
            && self.eager_sent - self.eager_consumed < self.peer_slots
            && !self.eager_free.is_empty();
        if eager && let Some(slot) = self.eager_free.pop() {
            let Some(id) = self.reqs.insert(SendReq {
                size: len,
                done: false,
                posted: false,
                _mr: None,
            }) else {
                self.eager_free.push(slot);
                return Ok(None);
            };
            let b = self.eager.slot(slot);
            put_u32(b, 0, K_EAGER);
            put_u32(b, 4, tag as u32);
            put_u64(b, 8, seq);
            put_u64(b, 16, len as u64);
            if len > 0 {
                // SAFETY: the caller guarantees `data..data+len` is readable; len <= EAGER_MAX.
                let src = unsafe { std::slice::from_raw_parts(data, len) };
                b[HDR..HDR + len].copy_from_slice(src);
            }
            self.eager_busy += 1;
            self.eager_sent += 1;
            self.next_seq += 1;
            self.eager_queue.push_back((slot, len, id));
            self.unassigned.push_back(Unassigned {
                seq,
                tag,
                ptr: data as usize,
                len,
                req: id,
                eager: true,
            });
            self.progress()?;
            return Ok(Some(id));
        }
        let Some(id) = self.reqs.insert(SendReq {
            size: len,
            done: false,
            posted: false,
            _mr: None,
        }) else {
            return Ok(None);
        };
        self.next_seq += 1;
        self.unassigned.push_back(Unassigned {
            seq,
            tag,
            ptr: data as usize,
            len,
            req: id,
            eager: false,
        });
        self.progress()?;
        Ok(Some(id))
    }

    /// Whether request `id` is done; `Some(bytes)` once it is (the id is then released).
    pub fn test(&mut self, id: RequestId) -> Result<Option<usize>> {
        self.progress()?;
        let r = self
            .reqs
            .get_mut(id)
            .ok_or_else(|| Error::Usage(format!("unknown send request {id:?}")))?;
        if r.done {
            let size = r.size;
            self.reqs.remove(id);
            return Ok(Some(size));
        }
        Ok(None)
    }

    /// Sends `data` and waits for completion. For tools and tests.
    pub fn send(&mut self, data: &[u8], tag: i32) -> Result<()> {
        let id = loop {
            // SAFETY: `data` is borrowed for the whole call and we wait for completion below.
            if let Some(id) = unsafe { self.isend(data.as_ptr(), data.len(), tag)? } {
                break id;
            }
        };
        while self.test(id)?.is_none() {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

impl Drop for SendConn {
    /// Lets posted operations finish (bounded, 2 s) so that eager messages already reported
    /// complete reach the receiver, then closes the endpoint before its buffers go.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.error.is_none()
            && (self.eager_busy > 0 || self.reqs.values().any(|r| r.posted && !r.done))
            && Instant::now() < deadline
        {
            if self.poll_cq().and_then(|()| self.post_eager()).is_err() {
                break;
            }
        }
        self.cache.clear();
    }
}

// ------------------------------------------------------------------------------------------
// Receiver

struct RecvReq {
    bufs: Vec<RecvBuf>,
    first: u64,
    filled: [bool; MAX_RECVS],
    sizes: [usize; MAX_RECVS],
    nfilled: usize,
    _mrs: Vec<Arc<Mr>>,
}

/// The receiving end of an ofi connection.
pub struct RecvConn {
    ep: Endpoint,
    link: Link,
    side: Side,
    ctx: Box<[Ctx]>,
    eager: Pool,
    cts: Pool,
    cts_free: Vec<usize>,
    cts_queue: VecDeque<(usize, usize)>,
    cache: MrCache,
    reqs: Slab<RecvReq>,
    order: VecDeque<RequestId>,
    next_seq: u64,
    unexpected: BTreeMap<u64, (i32, Vec<u8>)>,
    eager_consumed: u64,
    reposts: Vec<usize>,
    virt_addr: bool,
    eof_at: Option<Instant>,
    error: Option<Error>,
}

impl std::fmt::Debug for RecvConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ofi::RecvConn({} via {})",
            self.link.peer, self.link.iface
        )
    }
}

impl RecvConn {
    fn new(ep: Endpoint, link: Link, sock: TcpStream) -> Result<RecvConn> {
        let e = |m: String| ofi_err(&link, "fi_mr_reg", Stage::Accept, m);
        let eager = Pool::new(&ep, EAGER_SLOTS, EAGER_BUF).map_err(e)?;
        let cts = Pool::new(&ep, CTS_TX_SLOTS, CTS_BUF).map_err(e)?;
        let mut ctx = ctx_array(EAGER_SLOTS + CTS_TX_SLOTS);
        for (i, c) in ctx.iter_mut().enumerate() {
            c.id = if i < EAGER_SLOTS {
                (C_EAGER_RX << 32) | i as u64
            } else {
                (C_CTS_TX << 32) | (i - EAGER_SLOTS) as u64
            };
        }
        let virt_addr = ep.dom.info.mr_mode & (sys::FI_MR_VIRT_ADDR | sys::FI_MR_BASIC) != 0;
        let mut r = RecvConn {
            ep,
            link,
            side: Side::new(sock),
            ctx,
            eager,
            cts,
            cts_free: (0..CTS_TX_SLOTS).rev().collect(),
            cts_queue: VecDeque::new(),
            cache: MrCache::default(),
            reqs: Slab::new(MAX_RECV_REQUESTS),
            order: VecDeque::new(),
            next_seq: 0,
            unexpected: BTreeMap::new(),
            eager_consumed: 0,
            reposts: (0..EAGER_SLOTS).collect(),
            virt_addr,
            eof_at: None,
            error: None,
        };
        r.repost().map_err(|e| r.fail(e))?;
        Ok(r)
    }

    /// Remote management address and "interface (ofi provider/domain)".
    pub fn peer(&self) -> (SocketAddr, &str) {
        (self.link.peer, &self.link.iface)
    }

    /// Registration cache statistics: (hits, misses).
    pub fn mr_stats(&self) -> (u64, u64) {
        (self.cache.hits, self.cache.misses)
    }

    fn fi(&self, op: &'static str, m: String) -> Error {
        ofi_err(&self.link, op, Stage::Data, m)
    }

    fn fail(&mut self, e: Error) -> Error {
        if self.error.is_none() {
            self.side.send_abort(&e);
        }
        self.error.get_or_insert(e).clone()
    }

    fn repost(&mut self) -> Result<()> {
        while let Some(&i) = self.reposts.last() {
            let p = self.eager.ptr(i);
            let desc = self.eager.mr.desc();
            let c: *mut Ctx = &mut self.ctx[i];
            // SAFETY: eager slot `i` and its context live as long as the endpoint (closed first
            // on drop) and are not touched until the receive completes.
            let ok = unsafe { self.ep.recv(p, EAGER_BUF, desc, c.cast()) }
                .map_err(|m| self.fi("fi_recv", m))?;
            if !ok {
                break;
            }
            self.reposts.pop();
        }
        // Nothing new to a peer whose process has ended: with `shm` in one process its memory
        // region is gone with its endpoint.
        while let Some(&(slot, len)) = self.cts_queue.front().filter(|_| !self.side.eof) {
            let p = self.cts.ptr(slot);
            let desc = self.cts.mr.desc();
            let c: *mut Ctx = &mut self.ctx[EAGER_SLOTS + slot];
            // SAFETY: CTS slot and context are reserved for this send until its completion
            // returns the slot to `cts_free`.
            let ok = unsafe { self.ep.send(p, len, desc, c.cast()) }
                .map_err(|m| self.fi("fi_send", m))?;
            if !ok {
                break;
            }
            self.cts_queue.pop_front();
        }
        Ok(())
    }

    /// Lands eager message `seq` in its receive, or keeps it until that receive is posted.
    fn place(&mut self, seq: u64, tag: i32, payload: &[u8]) -> Result<bool> {
        let peer = self.link.peer;
        for &id in &self.order {
            let Some(r) = self.reqs.get_mut(id) else {
                continue;
            };
            if seq < r.first || seq >= r.first + r.bufs.len() as u64 {
                continue;
            }
            let tags: Vec<i32> = r.bufs.iter().map(|b| b.tag).collect();
            let slot = proto::select_slot(&tags, &r.filled[..r.bufs.len()], tag)
                .ok_or(Error::TagMismatch { peer, tag })?;
            let b = r.bufs[slot];
            if payload.len() > b.len {
                return Err(Error::Truncated {
                    peer,
                    sent: payload.len() as u64,
                    posted: b.len,
                    tag,
                });
            }
            if !payload.is_empty() {
                // SAFETY: the caller of irecv guarantees the buffer is writable for `b.len`
                // bytes, and payload.len() <= b.len.
                unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), b.ptr, payload.len()) };
            }
            r.filled[slot] = true;
            r.sizes[slot] = payload.len();
            r.nfilled += 1;
            self.eager_consumed += 1;
            return Ok(true);
        }
        Ok(false)
    }

    fn on_eager(&mut self, slot: usize) -> Result<()> {
        let b = self.eager.slot(slot);
        let (kind, tag, seq, size) = (
            get_u32(b, 0),
            get_u32(b, 4) as i32,
            get_u64(b, 8),
            get_u64(b, 16),
        );
        if kind != K_EAGER || size > EAGER_MAX as u64 {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "unknown message",
                    expected: "EAGER",
                },
            ));
        }
        let payload = b[HDR..HDR + size as usize].to_vec();
        if !self.place(seq, tag, &payload)? {
            self.unexpected.insert(seq, (tag, payload));
        }
        self.reposts.push(slot);
        Ok(())
    }

    fn on_write(&mut self, data: u64) -> Result<()> {
        let idx = ((data >> 8) & 0xff) as usize;
        let slot = (data & 0xff) as usize;
        let size = (data >> 32) as usize;
        let r = self
            .reqs
            .at(idx)
            .filter(|r| slot < r.bufs.len() && !r.filled[slot]);
        let Some(r) = r else {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "write completion",
                    expected: "a posted receive buffer",
                },
            ));
        };
        r.filled[slot] = true;
        r.sizes[slot] = size;
        r.nfilled += 1;
        Ok(())
    }

    fn poll_cq(&mut self) -> Result<()> {
        let mut ents = [sys::fi_cq_data_entry {
            op_context: std::ptr::null_mut(),
            flags: 0,
            len: 0,
            buf: std::ptr::null_mut(),
            data: 0,
        }; 16];
        loop {
            let n = self
                .ep
                .poll(&mut ents)
                .map_err(|m| self.fi("fi_cq_read", m))?;
            for e in &ents[..n] {
                if e.flags & sys::FI_REMOTE_CQ_DATA != 0 {
                    self.on_write(e.data)?;
                    continue;
                }
                if e.op_context.is_null() {
                    continue;
                }
                // SAFETY: every context we post is an element of `self.ctx`.
                let id = unsafe { (*e.op_context.cast::<Ctx>()).id };
                let i = (id & 0xffff_ffff) as usize;
                match id >> 32 {
                    C_EAGER_RX => self.on_eager(i)?,
                    C_CTS_TX => self.cts_free.push(i),
                    _ => {}
                }
            }
            if n < ents.len() {
                return Ok(());
            }
        }
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let r = self.poll_cq().and_then(|()| self.repost());
        if let Err(e) = r {
            return Err(self.fail(e));
        }
        if let Some(e) = self.side.poll(&self.link, "sender") {
            return Err(self.fail(e));
        }
        if self.side.eof && !self.order.is_empty() {
            let at = *self.eof_at.get_or_insert_with(Instant::now);
            if at.elapsed() >= EOF_GRACE {
                let e = self.link.closed(Stage::Data);
                return Err(self.fail(e));
            }
        }
        Ok(())
    }

    /// Posts a receive of up to [`MAX_RECVS`] buffers. `Ok(None)`: busy, retry later.
    ///
    /// # Safety
    /// Every buffer must be writable for its `len` bytes and untouched by anyone else until
    /// [`RecvConn::test`] reports the request done or the connection is dropped.
    pub unsafe fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<RequestId>> {
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::Usage(format!(
                "irecv with {} buffers (1..={MAX_RECVS})",
                bufs.len()
            )));
        }
        self.progress()?;
        if self.reqs.live() >= MAX_RECV_REQUESTS || self.cts_free.is_empty() {
            return Ok(None);
        }
        let mut mrs = Vec::with_capacity(bufs.len());
        for b in bufs {
            let m = self
                .cache
                .get(&self.ep, b.ptr as usize, b.len)
                .map_err(|m| self.fi("fi_mr_reg", m))?;
            mrs.push(m);
        }
        let first = self.next_seq;
        let Some(id) = self.reqs.insert(RecvReq {
            bufs: bufs.to_vec(),
            first,
            filled: [false; MAX_RECVS],
            sizes: [0; MAX_RECVS],
            nfilled: 0,
            _mrs: Vec::new(),
        }) else {
            return Ok(None);
        };
        self.next_seq += bufs.len() as u64;
        self.order.push_back(id);
        // Eager messages that came before this receive.
        let early: Vec<u64> = self
            .unexpected
            .range(first..first + bufs.len() as u64)
            .map(|(s, _)| *s)
            .collect();
        for s in early {
            if let Some((tag, p)) = self.unexpected.remove(&s)
                && let Err(e) = self.place(s, tag, &p)
            {
                return Err(self.fail(e));
            }
        }
        let Some(slot) = self.cts_free.pop() else {
            return Ok(None);
        };
        let consumed = self.eager_consumed;
        let virt = self.virt_addr;
        let b = self.cts.slot(slot);
        put_u32(b, 0, K_CTS);
        put_u32(b, 4, bufs.len() as u32);
        put_u64(b, 8, first);
        put_u64(b, 16, consumed);
        put_u32(b, 24, id.index() as u32);
        put_u32(b, 28, 0);
        for (k, (rb, m)) in bufs.iter().zip(&mrs).enumerate() {
            let at = 32 + k * CTS_ENTRY;
            let addr = if virt {
                rb.ptr as u64
            } else {
                (rb.ptr as usize - m.base) as u64
            };
            put_u64(b, at, addr);
            put_u64(b, at + 8, m.key());
            put_u64(b, at + 16, rb.len as u64);
            put_u32(b, at + 24, rb.tag as u32);
            put_u32(b, at + 28, 0);
        }
        if let Some(r) = self.reqs.get_mut(id) {
            r._mrs = mrs;
        }
        self.cts_queue
            .push_back((slot, 32 + CTS_ENTRY * bufs.len()));
        self.progress()?;
        Ok(Some(id))
    }

    /// Whether request `id` is done; the sizes received once it is (the id is then released).
    pub fn test(&mut self, id: RequestId) -> Result<Option<Completed>> {
        self.progress()?;
        let r = self
            .reqs
            .get_mut(id)
            .ok_or_else(|| Error::Usage(format!("unknown receive request {id:?}")))?;
        if r.nfilled == r.bufs.len() {
            let c = Completed {
                n: r.bufs.len(),
                sizes: r.sizes,
            };
            self.reqs.remove(id);
            self.order.retain(|x| *x != id);
            return Ok(Some(c));
        }
        Ok(None)
    }

    /// Receives one message into `buf` and waits for it. For tools and tests.
    pub fn recv(&mut self, buf: &mut [u8], tag: i32) -> Result<usize> {
        let b = RecvBuf {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            tag,
        };
        let id = loop {
            // SAFETY: `buf` is mutably borrowed for the whole call and we wait for completion.
            if let Some(id) = unsafe { self.irecv(&[b])? } {
                break id;
            }
        };
        loop {
            if let Some(c) = self.test(id)? {
                return Ok(c.sizes[0]);
            }
            std::hint::spin_loop();
        }
    }
}

impl Drop for RecvConn {
    fn drop(&mut self) {
        // Let queued CTS sends finish (bounded) so the endpoint closes with nothing of ours in
        // flight, then drop registrations before the endpoint.
        let deadline = Instant::now() + Duration::from_millis(200);
        while self.error.is_none()
            && self.cts_free.len() + self.cts_queue.len() < CTS_TX_SLOTS
            && Instant::now() < deadline
        {
            if self.poll_cq().is_err() {
                break;
            }
        }
        self.cache.clear();
    }
}

// SAFETY: the raw pointers in RecvBuf are addresses the caller vouched for in irecv, and the
// endpoint is used by one thread at a time (&mut self).
unsafe impl Send for RecvConn {}
// SAFETY: as above: a send connection only holds addresses vouched for in isend.
unsafe impl Send for SendConn {}
