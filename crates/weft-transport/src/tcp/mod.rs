//! The TCP backend. Per connection: a handshake stream on the management interface, and on the
//! data rails a control stream plus `n` data streams. After the handshake every per-message
//! byte runs on the data rails: message headers, messages up to `inline_max` bytes (inline) and
//! CREDIT frames on the control stream; larger messages cut into chunks spread round-robin over
//! the data streams. The handshake stream stays open as a side channel that carries nothing
//! unless a side gives up (one ABORT frame), so the peer learns why even when the data network
//! is what died, or a sender's bytes stop moving (PROBE, answered by the receiver's process
//! with ALIVE: a frozen receiver is told from a late one); it has no keepalive, so a connection
//! that makes progress sends no byte on it.
//!
//! Two connections running opposite ways between the same addresses of one [`TcpTransport`] share
//! one control stream (module `ctrl`): the second one's handshake offers it (JOIN).
//!
//! Everything is non-blocking and driven by the caller's polls (`Connecting::poll`,
//! `Listener::accept`, `test`), except chunk I/O, which helper threads do when `nthreads > 0`.

mod ctrl;
mod engine;
mod share;
mod side;
mod tune;

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::alive::{Probe, ProbeStep};
use crate::common::{
    Completed, Device, MAX_RECV_REQUESTS, MAX_RECVS, MAX_SEND_REQUESTS, Rail, RecvBuf, RequestId,
};
use crate::common::{PendingSock, Tune, check_recv_count, random_u64, write_all_until};
use crate::config::{Config, MAX_STREAMS};
use crate::error::{Error, Link, Result, Stage};
use crate::iface::{self, Interface};
use crate::proto::{
    self, AbortReason, AcceptEvent, Acceptor, ConnectEvent, Connector, End, Frame, ListenHandle,
    MAX_DATA_ADDRS,
};
use crate::slab::Slab;
use ctrl::CtrlLink;
use engine::{Dir, Engine, ReqState, Stream, Task};
use side::SideChannel;
use tune::{tune, tune_ctrl, tune_ctrl_stream, tune_data_stream, tune_handshake, tune_side};

/// How often a sender looks at its control stream for CREDIT/ABORT, and either side at its side
/// channel for ABORT, while it is being polled.
const CTRL_CHECK_EVERY: Duration = Duration::from_millis(1);

/// The frame that tells the peer why this side gives up, if any (not after the peer aborted).
fn abort_frame(e: &Error) -> Option<Frame> {
    let (reason, detail) = match e {
        Error::Aborted { .. } => return None,
        Error::Timeout { after, .. } => (
            AbortReason::Stalled,
            u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
        ),
        Error::Io { .. } | Error::Closed { .. } => (AbortReason::StreamFailed, 0),
        Error::Protocol { .. } => (AbortReason::Protocol, 0),
        _ => (AbortReason::Local, 0),
    };
    Some(Frame::Abort { reason, detail })
}

/// Best effort, never blocks: writes `out[*pos..]` on `s`; returns false on a hard error.
pub(super) fn flush_some(mut s: &TcpStream, out: &[u8], pos: &mut usize) -> bool {
    while *pos < out.len() {
        match s.write(&out[*pos..]) {
            Ok(n) => *pos += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return e.kind() == io::ErrorKind::WouldBlock,
        }
    }
    true
}

/// The TCP transport of this host: the management interface and the data devices.
#[derive(Debug, Clone)]
pub struct TcpTransport {
    cfg: Config,
    mgmt: Rail,
    devices: Vec<Device>,
    /// Identifies this transport's control links (see `ctrl`); clones share it.
    instance: u64,
}

impl TcpTransport {
    /// Selects the interfaces named by `cfg` on this host.
    pub fn new(cfg: Config) -> Result<TcpTransport> {
        cfg.validate()?;
        let all = iface::list()?;
        TcpTransport::with_interfaces(cfg, &all)
    }

    /// Like [`TcpTransport::new`] over a given interface list (tests, or a host model).
    pub fn with_interfaces(cfg: Config, all: &[Interface]) -> Result<TcpTransport> {
        let names = || {
            all.iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        let mgmt_if = iface::select(all, cfg.mgmt_ifname.as_ref()).into_iter().next().ok_or_else(|| {
            Error::Config(format!(
                "no usable management interface matches {:?} (WEFT_MGMT_IFNAME); interfaces: {}",
                cfg.mgmt_ifname,
                names()
            ))
        })?;
        let rail = |i: &Interface| Rail {
            iface: i.name.clone(),
            addr: i.best_addr().unwrap_or(IpAddr::from([0u8; 4])),
        };
        let mgmt = rail(&mgmt_if);
        let data_ifs = match &cfg.data_ifname {
            None => vec![mgmt_if.clone()],
            Some(spec) => iface::select(all, Some(spec)),
        };
        if data_ifs.is_empty() {
            return Err(Error::Config(format!(
                "no usable data interface matches {:?} (WEFT_DATA_IFNAME); interfaces: {}",
                cfg.data_ifname,
                names()
            )));
        }
        let dev = |ifs: &[Interface]| Device {
            name: ifs
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join("+"),
            rails: ifs.iter().map(rail).collect(),
            speed_mbps: ifs
                .iter()
                .map(|i| i.speed_mbps().unwrap_or(10_000))
                .fold(0u32, u32::saturating_add),
            pci_path: ifs.first().and_then(Interface::pci_path),
            guid: ifs.first().map_or(0, Interface::guid),
        };
        let devices = if cfg.merge_rails {
            vec![dev(&data_ifs[..data_ifs.len().min(MAX_DATA_ADDRS)])]
        } else {
            data_ifs
                .iter()
                .map(|i| dev(std::slice::from_ref(i)))
                .collect()
        };
        Ok(TcpTransport {
            cfg,
            mgmt,
            devices,
            instance: random_u64(),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The management interface and address.
    pub fn mgmt(&self) -> &Rail {
        &self.mgmt
    }

    /// The data devices.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    fn device(&self, dev: usize) -> Result<&Device> {
        self.devices.get(dev).ok_or_else(|| {
            Error::Usage(format!(
                "device {dev} does not exist ({} devices)",
                self.devices.len()
            ))
        })
    }

    /// Opens the listeners of device `dev` and returns them with the handle to send to the peer.
    pub fn listen(&self, dev: usize) -> Result<Listener> {
        let d = self.device(dev)?;
        let bind = |addr: IpAddr, what: &str| -> Result<TcpListener> {
            let sa = SocketAddr::new(addr, 0);
            let op = || format!("{what} listener on {sa}");
            let s = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))
                .map_err(|e| Error::local(op(), &e))?;
            s.bind(&sa.into()).map_err(|e| Error::local(op(), &e))?;
            s.listen(1024).map_err(|e| Error::local(op(), &e))?;
            s.set_nonblocking(true)
                .map_err(|e| Error::local(op(), &e))?;
            Ok(s.into())
        };
        let mut listeners = vec![(bind(self.mgmt.addr, "management")?, self.mgmt.iface.clone())];
        let only_mgmt = d.rails.len() == 1 && d.rails[0] == self.mgmt;
        let mut data = Vec::new();
        if !only_mgmt {
            for r in d.rails.iter().take(MAX_DATA_ADDRS) {
                let l = bind(r.addr, "data")?;
                data.push(l.local_addr().map_err(|e| Error::local("local_addr", &e))?);
                listeners.push((l, r.iface.clone()));
            }
        }
        let mgmt = listeners[0]
            .0
            .local_addr()
            .map_err(|e| Error::local("local_addr", &e))?;
        let nonce = random_u64();
        let handle = ListenHandle { nonce, mgmt, data };
        Ok(Listener {
            cfg: self.cfg.clone(),
            instance: self.instance,
            handle,
            listeners,
            acceptor: Acceptor::new(nonce, MAX_STREAMS as u16, self.cfg.timeout),
            socks: HashMap::new(),
            next_key: 0,
            idle_since: None,
            discarded: Vec::new(),
        })
    }

    /// Starts connecting device `dev` to the listener described by `handle` (the bytes the
    /// peer's [`Listener::handle`] produced). Non-blocking: drive it with [`Connecting::poll`].
    pub fn connect(&self, dev: usize, handle: &[u8]) -> Result<Connecting> {
        let d = self.device(dev)?;
        let h = ListenHandle::decode(handle)?;
        let now = Instant::now();
        let nstreams = self.cfg.streams();
        let remote_data = if h.data.is_empty() {
            vec![h.mgmt]
        } else {
            h.data.clone()
        };
        let compatible = |local: IpAddr, remote: IpAddr| {
            local.is_ipv4() == remote.is_ipv4() && local.is_loopback() == remote.is_loopback()
        };
        let mgmt_local = compatible(self.mgmt.addr, h.mgmt.ip()).then_some(self.mgmt.addr);
        let mut hs = Connector::new(
            now,
            self.cfg.timeout,
            h.nonce,
            random_u64(),
            nstreams as u16,
        );
        // The control stream runs from the first rail to the first data address: share the
        // link of a connection that runs the other way between those two, if there is one.
        let offer = if self.cfg.share_ctrl {
            let rail = &d.rails[0];
            let remote = remote_data[0].ip();
            let local = compatible(rail.addr, remote).then_some(rail.addr);
            ctrl::offer(self.instance, local, remote, &[])
        } else {
            None
        };
        if let Some(o) = &offer {
            hs.offer_join(o.id());
        }
        let mut ctrl = PendingSock::new(
            h.mgmt,
            mgmt_local,
            self.mgmt.iface.clone(),
            tune_handshake,
            &self.cfg,
        )?;
        ctrl.out = hs.hello();
        let data_sock = |k: usize, tune: Tune| -> Result<PendingSock> {
            let remote = remote_data[k % remote_data.len()];
            let rail = &d.rails[k % d.rails.len()];
            let local = compatible(rail.addr, remote.ip()).then_some(rail.addr);
            PendingSock::new(remote, local, rail.iface.clone(), tune, &self.cfg)
        };
        let mut dctrl = data_sock(0, tune_ctrl_stream)?;
        dctrl.out = hs.ctrl_hello();
        let mut streams = Vec::with_capacity(nstreams);
        for k in 0..nstreams {
            let mut p = data_sock(k, tune_data_stream)?;
            p.out = hs.stream_hello(k as u16);
            streams.push(p);
        }
        Ok(Connecting {
            cfg: self.cfg.clone(),
            instance: self.instance,
            conn_id: hs.conn_id(),
            hs,
            offer,
            ctrl,
            dctrl,
            streams,
            dec_buf: Vec::new(),
        })
    }
}

/// Socket options for a socket the sender opens, by what it is for (see [`PendingSock`]).
/// A connection being set up by the sender. Poll it until it yields a [`SendConn`].
#[derive(Debug)]
pub struct Connecting {
    cfg: Config,
    instance: u64,
    conn_id: u64,
    hs: Connector,
    /// The link offered in a JOIN, reserved until the answer.
    offer: Option<ctrl::Offer>,
    /// Handshake stream (management network).
    ctrl: PendingSock,
    /// Control stream (data network).
    dctrl: PendingSock,
    streams: Vec<PendingSock>,
    dec_buf: Vec<u8>,
}

impl Connecting {
    /// Advances the handshake without blocking. `Ok(None)`: call again later.
    pub fn poll(&mut self) -> Result<Option<SendConn>> {
        let now = Instant::now();
        let mut all = self.ctrl.poll(now, &self.cfg)?;
        all &= self.dctrl.poll(now, &self.cfg)?;
        for s in &mut self.streams {
            all &= s.poll(now, &self.cfg)?;
        }
        if all {
            let want = self.hs.wanted();
            if want > 0 {
                self.dec_buf.resize(want, 0);
                match (&self.ctrl.sock).read(&mut self.dec_buf) {
                    Ok(0) => return Err(self.ctrl.link.closed(Stage::Handshake)),
                    Ok(n) => self.hs.handle_ctrl_bytes(&self.dec_buf[..n]),
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) => {}
                    Err(e) => return Err(self.ctrl.link.io("recv ack", Stage::Handshake, &e)),
                }
            }
        }
        self.hs.handle_timeout(now);
        match self.hs.poll_event() {
            None => Ok(None),
            Some(ev @ (ConnectEvent::Established | ConnectEvent::Joined)) => {
                let dup = |s: &Socket| -> Result<TcpStream> {
                    Ok(s.try_clone().map_err(|e| Error::local("dup", &e))?.into())
                };
                let side =
                    SideChannel::new(dup(&self.ctrl.sock)?, self.ctrl.link.clone()).answering();
                let joined = match (ev, self.offer.take()) {
                    (ConnectEvent::Joined, Some(o)) => o.accept(),
                    // A plain ACK answers a JOIN with "no": the offered slot stays unused.
                    (_, Some(o)) => {
                        o.refused();
                        None
                    }
                    // JOINED without an offer is refused by the Connector.
                    (_, None) => None,
                };
                let ctrl = match joined {
                    Some(link) => link,
                    None => CtrlLink::open(
                        self.conn_id,
                        self.instance,
                        dup(&self.dctrl.sock)?,
                        self.dctrl.link.clone(),
                        End::Send,
                    )?,
                };
                let mut streams = Vec::new();
                for s in &self.streams {
                    let t: TcpStream = s
                        .sock
                        .try_clone()
                        .map_err(|e| Error::local("dup", &e))?
                        .into();
                    streams.push(Stream::new(t, s.link.clone()));
                }
                let engine = Engine::new(Dir::Send, streams, self.cfg.nthreads, self.cfg.timeout)?;
                Ok(Some(SendConn {
                    link: ctrl.link().clone(),
                    ctrl,
                    side,
                    engine,
                    inline_max: self.cfg.inline_max,
                    min_chunk: self.cfg.min_chunk as u64,
                    next_check: now,
                    linger: self.cfg.timeout.min(LINGER_MAX),
                    reqs: Slab::new(MAX_SEND_REQUESTS),
                    next_stream: 0,
                    error: None,
                    moving: if self.cfg.share_ctrl {
                        Moving::Watching {
                            generation: u64::MAX,
                            at: now,
                            asked: 0,
                        }
                    } else {
                        Moving::Settled
                    },
                    old: None,
                    timeout: self.cfg.timeout,
                    probe: Probe::new(self.cfg.timeout, now),
                }))
            }
            Some(ConnectEvent::Rejected(r)) => Err(Error::Rejected {
                peer: self.ctrl.link.peer,
                iface: self.ctrl.link.iface.clone(),
                reason: r.to_string(),
            }),
            Some(ConnectEvent::Protocol(e)) => Err(self.ctrl.link.protocol(Stage::Handshake, e)),
            Some(ConnectEvent::TimedOut) => {
                // Name the first socket that is not connected, else the control stream (no ACK).
                let (link, stage) = [&self.ctrl, &self.dctrl]
                    .into_iter()
                    .chain(&self.streams)
                    .find(|s| !s.connected)
                    .map_or((&self.ctrl.link, Stage::Handshake), |s| {
                        (&s.link, Stage::Connect)
                    });
                Err(link.timeout(stage, self.cfg.timeout))
            }
        }
    }

    /// Polls until connected or failed (at most the configured timeout). For tools and tests.
    pub fn wait(mut self) -> Result<SendConn> {
        loop {
            if let Some(c) = self.poll()? {
                return Ok(c);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The receiver's listening side of a device: accepts connections made with its handle.
#[derive(Debug)]
pub struct Listener {
    cfg: Config,
    /// The transport's instance (see `ctrl`).
    instance: u64,
    handle: ListenHandle,
    listeners: Vec<(TcpListener, String)>,
    acceptor: Acceptor<u64>,
    socks: HashMap<u64, (TcpStream, Link)>,
    next_key: u64,
    idle_since: Option<Instant>,
    /// Connections closed because they did not speak weft's protocol, for the caller to log.
    discarded: Vec<Error>,
}

impl Listener {
    /// The handle to give the sender (128 bytes, see [`proto::HANDLE_SIZE`]).
    pub fn handle(&self) -> [u8; proto::HANDLE_SIZE] {
        self.handle.encode()
    }

    /// The decoded handle (addresses and nonce).
    pub fn handle_info(&self) -> &ListenHandle {
        &self.handle
    }

    /// Accepts without blocking. `Ok(None)`: no connection is complete yet, call again.
    /// A socket that does not speak weft's protocol to this listener (garbage, a bare connect
    /// and close, a health probe, a foreign nonce, one that stalls past the timeout) is closed
    /// and kept for [`Listener::take_discarded`]; accepting goes on waiting for the real peer.
    /// With nothing arriving for `accept_timeout`, times out.
    pub fn accept(&mut self) -> Result<Option<RecvConn>> {
        loop {
            match self.accept_once()? {
                Accepted::Conn(c) => return Ok(Some(c)),
                Accepted::Nothing => return Ok(None),
                Accepted::Discarded(e) => self.discarded.push(e),
            }
        }
    }

    /// The stray connections discarded since the last call, as errors naming each peer.
    pub fn take_discarded(&mut self) -> Vec<Error> {
        std::mem::take(&mut self.discarded)
    }

    fn accept_once(&mut self) -> Result<Accepted> {
        let now = Instant::now();
        let idle_since = *self.idle_since.get_or_insert(now);
        for (l, iface) in &self.listeners {
            loop {
                match l.accept() {
                    Ok((s, peer)) => {
                        let key = self.next_key;
                        self.next_key += 1;
                        let link = Link {
                            peer,
                            iface: iface.clone(),
                        };
                        let sock = Socket::from(s);
                        sock.set_nonblocking(true)
                            .and_then(|()| tune(&sock, &self.cfg))
                            .map_err(|e| link.io("setsockopt", Stage::Accept, &e))?;
                        self.socks.insert(key, (sock.into(), link));
                        self.acceptor.handle_new(now, key);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::local(format!("accept on {iface}"), &e)),
                }
            }
        }
        let waiting: Vec<u64> = self.acceptor.waiting().collect();
        let mut buf = [0u8; proto::FRAME_LEN];
        for key in waiting {
            let want = self.acceptor.wanted(key).min(buf.len());
            let Some((s, _)) = self.socks.get(&key) else {
                continue;
            };
            match (&*s).read(&mut buf[..want]) {
                Ok(0) => self.acceptor.handle_closed(key),
                Ok(n) => self.acceptor.handle_bytes(now, key, &buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => self.acceptor.handle_closed(key),
            }
        }
        self.acceptor.handle_timeout(now);
        if self.acceptor.busy() {
            self.idle_since = Some(now);
        }
        if let Some(ev) = self.acceptor.poll_event() {
            return match ev {
                AcceptEvent::Refused { key, reply, error } => {
                    let (s, link) = self
                        .socks
                        .remove(&key)
                        .ok_or_else(|| Error::Usage("unknown socket".into()))?;
                    if let Some(r) = reply {
                        let _ = (&s).write(&r);
                    }
                    let stage = Stage::Accept;
                    Ok(Accepted::Discarded(match error {
                        proto::AcceptError::Frame(f) => link.protocol(stage, f),
                        proto::AcceptError::TimedOut(_) => link.timeout(stage, self.cfg.timeout),
                        proto::AcceptError::Closed => link.closed(stage),
                        other => Error::Rejected {
                            peer: link.peer,
                            iface: link.iface,
                            reason: format!("refused: {other}"),
                        },
                    }))
                }
                AcceptEvent::Ready {
                    conn_id,
                    ctrl,
                    dctrl,
                    streams,
                    ack,
                    join,
                } => {
                    let (hs, hs_link) = self
                        .socks
                        .remove(&ctrl)
                        .ok_or_else(|| Error::Usage("unknown socket".into()))?;
                    let (c, link) = self
                        .socks
                        .remove(&dctrl)
                        .ok_or_else(|| Error::Usage("unknown socket".into()))?;
                    let mut data = Vec::new();
                    for k in streams {
                        let (s, l) = self
                            .socks
                            .remove(&k)
                            .ok_or_else(|| Error::Usage("unknown socket".into()))?;
                        data.push(Stream::new(s, l));
                    }
                    tune_ctrl(socket2::SockRef::from(&c), &self.cfg)
                        .map_err(|e| link.io("setsockopt", Stage::Accept, &e))?;
                    tune_side(socket2::SockRef::from(&hs))
                        .map_err(|e| hs_link.io("setsockopt", Stage::Accept, &e))?;
                    let engine = Engine::new(Dir::Recv, data, self.cfg.nthreads, self.cfg.timeout)?;
                    let addrs = c
                        .local_addr()
                        .and_then(|l| Ok((l.ip(), c.peer_addr()?.ip())));
                    let joined = match (join, addrs) {
                        (Some(id), Ok((local, peer))) if self.cfg.share_ctrl => {
                            ctrl::join(self.instance, id, local, peer)
                        }
                        _ => None,
                    };
                    let (ctrl, ack) = match joined {
                        Some(l) => {
                            let mut joined_ack = Vec::new();
                            Frame::Joined {
                                nonce: self.handle.nonce,
                                conn_id,
                            }
                            .encode(&mut joined_ack);
                            (l, joined_ack)
                        }
                        None => (
                            CtrlLink::open(conn_id, self.instance, c, link, End::Recv)?,
                            ack,
                        ),
                    };
                    if let Err(e) = write_all_until(&hs, &ack, now + self.cfg.timeout) {
                        ctrl.detach(End::Recv, Duration::ZERO);
                        return Err(hs_link.io("send ack", Stage::Accept, &e));
                    }
                    self.idle_since = Some(now);
                    Ok(Accepted::Conn(RecvConn {
                        link: ctrl.link().clone(),
                        ctrl,
                        side: SideChannel::new(hs, hs_link).answering(),
                        next_check: now,
                        engine,
                        msgs: VecDeque::new(),
                        reqs: Slab::new(MAX_RECV_REQUESTS),
                        order: VecDeque::new(),
                        next_stream: 0,
                        peer_closed: false,
                        error: None,
                        linger: self.cfg.timeout.min(LINGER_MAX),
                        next: None,
                        held: VecDeque::new(),
                        held_bytes: 0,
                        timeout: self.cfg.timeout,
                        probe: Probe::new(self.cfg.timeout, now),
                    }))
                }
            };
        }
        if now.duration_since(idle_since) >= self.cfg.accept_timeout {
            return Err(Error::Timeout {
                peer: self.handle.mgmt,
                iface: self.listeners[0].1.clone(),
                stage: Stage::Accept,
                after: self.cfg.accept_timeout,
            });
        }
        Ok(Accepted::Nothing)
    }

    /// Polls until a connection arrives or the accept timeout passes. For tools and tests.
    pub fn wait(&mut self) -> Result<RecvConn> {
        loop {
            if let Some(c) = self.accept()? {
                return Ok(c);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// What one look at the listening sockets found (short-lived: the size difference is moot).
#[allow(clippy::large_enum_variant)]
enum Accepted {
    Conn(RecvConn),
    Discarded(Error),
    Nothing,
}

#[derive(Debug)]
struct SendReq {
    /// Sequence number of its MSG frame on the control link.
    seq: u64,
    /// Its MSG frame is on the control stream this connection moved away from.
    on_old: bool,
    size: usize,
    chunks: Arc<ReqState>,
}

/// The sending end of a connection.
#[derive(Debug)]
pub struct SendConn {
    /// Control stream (data network), possibly shared with a receiving connection from the
    /// same peer (see `ctrl`).
    ctrl: Arc<CtrlLink>,
    link: Link,
    /// Handshake stream (management network), now the ABORT side channel.
    side: SideChannel,
    engine: Engine,
    inline_max: usize,
    min_chunk: u64,
    /// When to look at the control stream next.
    next_check: Instant,
    /// Longest a drop waits for the receiver's kernel to acknowledge the control stream.
    linger: Duration,
    reqs: Slab<SendReq>,
    next_stream: usize,
    error: Option<Error>,
    /// Moving onto a shared control stream after the handshake (protocol MOVE).
    moving: Moving,
    /// The control stream left by a MOVE, until what was queued on it is delivered.
    old: Option<Arc<CtrlLink>>,
    timeout: Duration,
    /// Whether the receiver's process still runs while our bytes do not move (PROBE/ALIVE).
    probe: Probe,
}

/// Most MOVE requests one connection makes (refusals are normally transient: the race of two
/// moves in opposite directions, a link going away; the bound rules out ping-pong).
const MAX_MOVE_REQUESTS: u32 = 64;
/// How often a connection that has not moved looks for a link even when nothing seemed to
/// change.
const MOVE_RESCAN: Duration = Duration::from_millis(20);

/// Where a [`SendConn`] is in moving its control stream onto a link shared with a receiving
/// connection from the same peer (see the `ctrl` module).
#[derive(Debug)]
enum Moving {
    /// Looking for a link each time the set of links changes (`generation`) and at least
    /// every [`MOVE_RESCAN`], after `asked` requests so far.
    Watching {
        generation: u64,
        at: Instant,
        asked: u32,
    },
    /// Asked the receiver (MOVE request) to move onto the offered link.
    Asked {
        offer: ctrl::Offer,
        since: Instant,
        asked: u32,
    },
    /// Moved, refused, or nothing to do (shared from the start, or sharing turned off).
    Settled,
}

/// What [`SendConn`] and [`RecvConn`] do alike over the fields of the same names (`link`,
/// `side`, `engine`, `ctrl`, `error`): the accessors, and `fail`, which keeps the first
/// error and tells the peer once (see [`give_up`]). `$end` is the type's end; `$other` names
/// the connection of the other direction in the docs.
macro_rules! conn_common {
    ($t:ty, $end:expr, $other:literal) => {
        impl $t {
            /// Remote address and local interface of the control stream (on the data network).
            pub fn peer(&self) -> (SocketAddr, &str) {
                (self.link.peer, &self.link.iface)
            }

            /// Remote address and local interface of the management side channel.
            pub fn side_peer(&self) -> (SocketAddr, &str) {
                (self.side.link.peer, &self.side.link.iface)
            }

            /// Number of data streams.
            pub fn nstreams(&self) -> usize {
                self.engine.nstreams()
            }

            #[doc = concat!("Whether the control stream is shared with ", $other, " of the same peers.")]
            pub fn shares_control_stream(&self) -> bool {
                self.ctrl.shared()
            }

            /// Records the connection's first error and tells the peer (see [`give_up`]): on
            /// the control stream and on the side channel, since the control stream may be on
            /// the link that died. Later calls return that first error.
            fn fail(&mut self, e: Error, link_failed: bool) -> Error {
                if let Some(first) = &self.error {
                    return first.clone();
                }
                let e = give_up(&self.ctrl, &mut self.side, $end, e, link_failed);
                self.error.insert(e).clone()
            }
        }
    };
}
conn_common!(SendConn, End::Send, "a receiving connection");
conn_common!(RecvConn, End::Recv, "a sending connection");

impl SendConn {
    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.reqs.live()
    }

    /// Whether some request still needs the receiver (bytes not yet handed to the kernel).
    fn work_pending(&self) -> bool {
        self.ctrl.pending_out()
            || self
                .reqs
                .values()
                .any(|r| r.chunks.remaining.load(Ordering::Acquire) > 0)
    }

    /// Any number that changes when this connection's bytes move or credit comes back.
    fn progress_mark(&self) -> u64 {
        let chunks: usize = self
            .reqs
            .values()
            .map(|r| r.chunks.remaining.load(Ordering::Acquire))
            .sum();
        self.ctrl.progress_mark().wrapping_add(chunks as u64)
    }

    /// Tells a frozen receiver (SIGSTOP: its kernel acknowledges, its window stays closed)
    /// from a late one: PROBE once our bytes have not moved for a quarter of the timeout,
    /// and an error when the receiver's process leaves one unanswered (see [`Probe`]).
    fn watch_receiver(&mut self, now: Instant) -> Result<()> {
        if self.side.take_alive() {
            self.probe.answered();
        }
        let pending = self.work_pending();
        let mark = if pending { self.progress_mark() } else { 0 };
        match self.probe.check(now, pending, mark) {
            ProbeStep::Wait => Ok(()),
            ProbeStep::Send => {
                self.side.send_probe();
                Ok(())
            }
            ProbeStep::Frozen => Err(self.link.timeout(Stage::Data, self.timeout)),
        }
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let now = Instant::now();
        let check = now >= self.next_check;
        if check {
            self.next_check = now + CTRL_CHECK_EVERY;
            if let Some(e) = self.side.poll_abort("receiver") {
                return Err(self.fail(e, false));
            }
            if let Err(e) = self.watch_receiver(now) {
                return Err(self.fail(e, false));
            }
        }
        if let Err(e) = self.ctrl.pump(check) {
            return Err(self.fail(e, true));
        }
        if let Some(e) = self.ctrl.write_error() {
            return Err(self.fail(e, true));
        }
        if check
            && let Some(e) = self.ctrl.peer_recv_gone()
            && self.work_pending()
        {
            return Err(self.fail(e, false));
        }
        if check {
            self.try_move(now);
        }
        if let Some(old) = &self.old {
            let pending = self.reqs.values().any(|r| r.on_old);
            let r = old
                .pump(false)
                .and_then(|()| old.write_error().map_or(Ok(()), Err));
            match r {
                Err(e) if pending => return Err(self.fail(e, false)),
                Err(_) => self.old = None,
                Ok(()) if !pending && old.quiescent() => {
                    old.detach(End::Send, Duration::ZERO);
                    self.old = None;
                }
                Ok(()) => {}
            }
        }
        if let Err(e) = self.engine.progress() {
            return Err(self.fail(e, false));
        }
        Ok(())
    }

    /// Moves the control stream onto a link shared with a receiving connection from the same
    /// peer, if one has appeared since the handshake (both directions connected at once): asks
    /// (MOVE request), and on acceptance ends the old stream with MOVED and continues on the
    /// link. Called at most once per `CTRL_CHECK_EVERY`.
    fn try_move(&mut self, now: Instant) {
        match &mut self.moving {
            Moving::Settled => {}
            Moving::Watching {
                generation,
                at,
                asked,
            } => {
                let g = ctrl::offers_generation();
                if *generation == g && now.duration_since(*at) < MOVE_RESCAN {
                    return;
                }
                *generation = g;
                *at = now;
                if self.ctrl.shared() {
                    self.moving = Moving::Settled;
                    return;
                }
                let (local, peer) = self.ctrl.ips();
                let own = [self.ctrl.id()];
                if let Some(offer) = ctrl::offer(self.ctrl.owner(), Some(local), peer, &own) {
                    let link = offer.id();
                    self.ctrl.set_moving_to(Some(link));
                    self.ctrl.send_now(&Frame::Move {
                        step: proto::MoveStep::Request,
                        link,
                    });
                    self.moving = Moving::Asked {
                        offer,
                        since: now,
                        asked: *asked + 1,
                    };
                }
            }
            Moving::Asked { since, .. } => {
                let answer = self.ctrl.take_move_answer();
                if answer.is_none() && now.duration_since(*since) < self.timeout {
                    return;
                }
                self.ctrl.set_moving_to(None);
                let Moving::Asked { offer, asked, .. } =
                    std::mem::replace(&mut self.moving, Moving::Settled)
                else {
                    return;
                };
                if answer.is_none() {
                    // No answer within the timeout: the peer does not move; stay (dropping
                    // the offer leaves its slot used: the peer may still attach to it).
                    return;
                }
                if answer == Some(false) {
                    offer.refused();
                    // Refused: the peer's own move onto ours won, or the link is going away.
                    // Look again when the links change (releasing the offer is such a
                    // change), a bounded number of times.
                    if asked < MAX_MOVE_REQUESTS {
                        self.moving = Moving::Watching {
                            generation: ctrl::offers_generation(),
                            at: now,
                            asked,
                        };
                    }
                    return;
                }
                let Some(link) = offer.accept() else {
                    return;
                };
                self.ctrl.send_in_order(&Frame::Move {
                    step: proto::MoveStep::Moved,
                    link: link.id(),
                });
                for r in self.reqs.values_mut() {
                    r.on_old = true;
                }
                self.link = link.link().clone();
                self.ctrl.set_leaving();
                self.old = Some(std::mem::replace(&mut self.ctrl, link));
            }
        }
    }

    /// Starts sending `len` bytes at `data` with `tag`. `Ok(None)`: too many requests in
    /// flight, try again after testing some.
    ///
    /// # Safety
    /// `data..data+len` must be readable and must not change until [`SendConn::test`] reports
    /// the request done or the connection is dropped.
    pub unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: i32,
    ) -> Result<Option<RequestId>> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if let Some(e) = self.ctrl.peer_recv_gone() {
            return Err(self.fail(e, false));
        }
        if self.reqs.live() >= MAX_SEND_REQUESTS {
            return Ok(None);
        }
        let chunks = Arc::new(ReqState::default());
        let seq = if len <= self.inline_max {
            let payload = if len == 0 {
                &[][..]
            } else {
                // SAFETY: the caller guarantees `data..data+len` is readable.
                unsafe { std::slice::from_raw_parts(data, len) }
            };
            self.ctrl
                .queue_msg(|out| Frame::encode_msg(out, tag, Some(payload), len as u64, 0))
        } else {
            let n = self.engine.nstreams();
            let chunk = proto::chunk_size(len as u64, n, self.min_chunk);
            let seq = self
                .ctrl
                .queue_msg(|out| Frame::encode_msg(out, tag, None, len as u64, chunk));
            let start = self.next_stream;
            let count = (len as u64).div_ceil(chunk) as usize;
            self.next_stream = (start + count) % n;
            chunks.remaining.store(count, Ordering::Release);
            let base = data as usize;
            let tasks = proto::chunks(len as u64, chunk, n, start).map(|c| {
                let t = Task {
                    ptr: base + c.offset as usize,
                    len: c.len as usize,
                    done: 0,
                    req: chunks.clone(),
                };
                (c.stream, t)
            });
            self.engine.push(tasks);
            seq
        };
        let id = self.reqs.insert(SendReq {
            seq,
            on_old: false,
            size: len,
            chunks,
        });
        self.progress()?;
        Ok(id)
    }

    /// Whether request `id` is done; `Some(bytes)` once it is (the id is then released).
    pub fn test(&mut self, id: RequestId) -> Result<Option<usize>> {
        self.progress()?;
        let flushed = self.ctrl.seq_flushed();
        let flushed_old = self.old.as_ref().map_or(u64::MAX, |o| o.seq_flushed());
        let r = self.reqs.tested(id, "send")?;
        let sent = if r.on_old { flushed_old } else { flushed };
        if sent >= r.seq && r.chunks.remaining.load(Ordering::Acquire) == 0 {
            let size = r.size;
            self.reqs.remove(id);
            return Ok(Some(size));
        }
        Ok(None)
    }
}

/// A connection's first failure, `e`: tells the peer why (ABORT on the control stream and the
/// side channel) and shuts both down so that it fails now rather than on its timers. A control
/// stream that another connection uses, used or may use (see `share::Share::sole`) stays up
/// for it unless the stream itself failed (`link_failed`): the failing end only leaves it
/// (CLOSE), and the ABORT goes on the side channel, which is this connection's alone.
/// Returns the error the connection keeps.
fn give_up(
    ctrl: &CtrlLink,
    side: &mut SideChannel,
    end: End,
    e: Error,
    link_failed: bool,
) -> Error {
    let abort = abort_frame(&e);
    let e = if link_failed || ctrl.sole(end) {
        ctrl.fail(&e, abort.as_ref())
    } else {
        ctrl.detach(end, Duration::ZERO);
        e
    };
    side.send_abort(abort.as_ref());
    e
}

/// Longest a connection's drop waits for its control stream's bytes to be acknowledged.
const LINGER_MAX: Duration = Duration::from_secs(2);

impl Drop for SendConn {
    /// Leaves the control link: CLOSE to the peer while a receiving connection still uses it,
    /// else a graceful close (see `CtrlLink::detach`). Data streams carry nothing back, so
    /// they close with a FIN.
    fn drop(&mut self) {
        if let Some(old) = self.old.take() {
            old.detach(End::Send, self.linger);
        }
        self.ctrl.detach(End::Send, self.linger);
    }
}

#[derive(Debug)]
struct RecvReq {
    bufs: Vec<RecvBuf>,
    filled: Vec<bool>,
    sizes: [usize; MAX_RECVS],
    matched: usize,
    chunks: Arc<ReqState>,
    /// Held messages matched to this receive, copied into `*mut u8` once they are whole.
    copies: Vec<(Held, *mut u8)>,
}

impl RecvReq {
    /// Gives buffer `slot` to a message of `size` bytes with `tag` (held or new), which must
    /// fit it; returns the buffer.
    fn fill(&mut self, slot: usize, size: u64, tag: i32, peer: SocketAddr) -> Result<RecvBuf> {
        let buf = self.bufs[slot];
        if size > buf.len as u64 {
            return Err(Error::Truncated {
                peer,
                sent: size,
                posted: buf.len,
                tag,
            });
        }
        self.filled[slot] = true;
        self.sizes[slot] = size as usize;
        self.matched += 1;
        Ok(buf)
    }
}

/// A message whose tag matched no empty buffer of the receive it reached: its tag belongs to a
/// later receive (the sender ran ahead of the receiver's grouped receives, which NCCL's IB
/// transport answers with "not yet"). It is held, its chunks read into `data` so that later
/// messages keep flowing, until a receive with a buffer for its tag is posted.
#[derive(Debug)]
struct Held {
    tag: i32,
    size: u64,
    data: Box<[u8]>,
    /// Chunks still to be read into `data`.
    chunks: Arc<ReqState>,
}

/// Most bytes of held messages (see [`Held`]) one receiving connection keeps; beyond it a
/// message that matches no buffer is an error.
const MAX_HELD_BYTES: u64 = 256 << 20;

/// Holds message `h` (see [`Held`]): its inline payload, or a buffer its chunks are read into.
fn hold(engine: &mut Engine, next_stream: &mut usize, h: proto::MsgHeader) -> Held {
    let chunks = Arc::new(ReqState::default());
    let data = match h.inline {
        Some(p) => p.into_boxed_slice(),
        None if h.size == 0 => Box::default(),
        None => {
            let mut data = vec![0u8; h.size as usize].into_boxed_slice();
            let n = engine.nstreams();
            let start = *next_stream;
            let count = h.size.div_ceil(h.chunk) as usize;
            *next_stream = (start + count) % n;
            chunks.remaining.store(count, Ordering::Release);
            let base = data.as_mut_ptr() as usize;
            let tasks = proto::chunks(h.size, h.chunk, n, start).map(|c| {
                let t = Task {
                    ptr: base + c.offset as usize,
                    len: c.len as usize,
                    done: 0,
                    req: chunks.clone(),
                };
                (c.stream, t)
            });
            engine.push(tasks);
            data
        }
    };
    Held {
        tag: h.tag,
        size: h.size,
        data,
        chunks,
    }
}

/// The receiving end of a connection.
#[derive(Debug)]
pub struct RecvConn {
    /// Control stream (data network), possibly shared with a sending connection to the same
    /// peer (see `ctrl`).
    ctrl: Arc<CtrlLink>,
    link: Link,
    /// Handshake stream (management network), now the ABORT side channel.
    side: SideChannel,
    /// When to look at the side channel next.
    next_check: Instant,
    engine: Engine,
    msgs: VecDeque<proto::MsgHeader>,
    reqs: Slab<RecvReq>,
    order: VecDeque<RequestId>,
    next_stream: usize,
    peer_closed: bool,
    error: Option<Error>,
    /// Longest a drop waits for the sender's kernel to acknowledge the control stream.
    linger: Duration,
    /// The link the sender is moving onto (MOVE accepted, MOVED not read yet).
    next: Option<Arc<CtrlLink>>,
    /// Messages that came before the receive with a buffer for their tag (after `engine`:
    /// helper threads may write into them until the engine is dropped).
    held: VecDeque<Held>,
    held_bytes: u64,
    timeout: Duration,
    /// Whether the sender's process still runs while a posted receive gets no byte
    /// (PROBE/ALIVE).
    probe: Probe,
}

impl RecvConn {
    /// Whether a posted receive still waits for bytes from the sender (not one whose bytes
    /// all arrived and that only waits for `test`).
    fn waiting(&self) -> bool {
        let busy = |c: &Arc<ReqState>| c.remaining.load(Ordering::Acquire) > 0;
        !self.order.is_empty()
            || self
                .reqs
                .values()
                .any(|r| busy(&r.chunks) || r.copies.iter().any(|(m, _)| busy(&m.chunks)))
    }

    /// Any number that changes when bytes from the sender arrive (control stream or data
    /// streams).
    fn progress_mark(&self) -> u64 {
        self.ctrl
            .consumed()
            .wrapping_add(self.engine.moved())
            .wrapping_add(self.msgs.len() as u64)
    }

    /// Tells a frozen sender (SIGSTOP: its kernel acknowledges, it sends nothing) from a late
    /// one while a posted receive gets no byte: PROBE once nothing has arrived for a quarter
    /// of the timeout, and an error when the sender's process leaves one unanswered (see
    /// [`Probe`]). A sender that computes or waits between messages answers from its
    /// `alive` thread and is never an error, however long it takes.
    fn watch_sender(&mut self, now: Instant) -> Result<()> {
        if self.side.take_alive() {
            self.probe.answered();
        }
        let waiting = self.waiting();
        let mark = if waiting { self.progress_mark() } else { 0 };
        match self.probe.check(now, waiting, mark) {
            ProbeStep::Wait => Ok(()),
            ProbeStep::Send => {
                self.side.send_probe();
                Ok(())
            }
            ProbeStep::Frozen => Err(self.link.timeout(Stage::Data, self.timeout)),
        }
    }

    /// Reads the control stream; errors are failures of the stream itself.
    fn read_ctrl(&mut self) -> Result<()> {
        self.ctrl.pump(true)?;
        let mut taken = self.ctrl.take_msgs(&mut self.msgs);
        if let Some(link) = self.ctrl.take_move_request() {
            // The sender asks to move onto `link` (see `SendConn::try_move`).
            let (local, peer) = self.ctrl.ips();
            let target = match &self.next {
                None => ctrl::accept_move(self.ctrl.owner(), link, self.ctrl.id(), local, peer),
                Some(_) => None,
            };
            let step = if target.is_some() {
                proto::MoveStep::Accepted
            } else {
                proto::MoveStep::Refused
            };
            self.ctrl.send_now(&Frame::Move { step, link });
            if target.is_some() {
                self.next = target;
            }
        }
        if taken.moved {
            // Every message sent on the old stream is in `msgs` (taken with the MOVED flag,
            // under one lock); the rest come on the link.
            let next = self.next.take().ok_or_else(|| {
                let e = proto::FrameError::Unexpected {
                    got: "MOVED",
                    expected: "MOVED only after an accepted MOVE",
                };
                self.link.protocol(Stage::Data, e)
            })?;
            self.link = next.link().clone();
            let old = std::mem::replace(&mut self.ctrl, next);
            old.detach(End::Recv, Duration::ZERO);
            self.ctrl.pump(true)?;
            taken = self.ctrl.take_msgs(&mut self.msgs);
        }
        if let Some(e) = self.ctrl.read_error() {
            return Err(e);
        }
        // From the same look as the messages: a CLOSE read since (by another connection's
        // pump) is seen next time, after the MSGs before it.
        self.peer_closed = taken.peer_send_closed;
        Ok(())
    }

    fn match_msgs(&mut self) -> Result<()> {
        while let Some(&id) = self.order.front() {
            let peer = self.link.peer;
            let n = self.engine.nstreams();
            let r = self
                .reqs
                .get_mut(id)
                .ok_or_else(|| Error::Usage("receive request vanished".into()))?;
            let tags: Vec<i32> = r.bufs.iter().map(|b| b.tag).collect();
            // Messages held for a later receive come first, in the order they arrived.
            let mut i = 0;
            while i < self.held.len() && r.matched < r.bufs.len() {
                let Some(slot) = proto::select_slot(&tags, &r.filled, self.held[i].tag) else {
                    i += 1;
                    continue;
                };
                let Some(m) = self.held.remove(i) else {
                    break;
                };
                self.held_bytes -= m.size;
                let buf = r.fill(slot, m.size, m.tag, peer)?;
                r.copies.push((m, buf.ptr));
            }
            if r.matched == r.bufs.len() {
                self.order.pop_front();
                continue;
            }
            let Some(h) = self.msgs.pop_front() else {
                break;
            };
            let Some(slot) = proto::select_slot(&tags, &r.filled, h.tag) else {
                if self.held_bytes + h.size > MAX_HELD_BYTES {
                    return Err(Error::TagMismatch { peer, tag: h.tag });
                }
                self.held_bytes += h.size;
                let m = hold(&mut self.engine, &mut self.next_stream, h);
                self.held.push_back(m);
                continue;
            };
            let buf = r.fill(slot, h.size, h.tag, peer)?;
            if let Some(p) = &h.inline {
                if !p.is_empty() {
                    // SAFETY: the caller of irecv guarantees `buf.ptr..+buf.len` is writable and we
                    // checked `p.len() == size <= buf.len`.
                    unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), buf.ptr, p.len()) };
                }
            } else if h.size > 0 {
                let start = self.next_stream;
                let count = h.size.div_ceil(h.chunk) as usize;
                self.next_stream = (start + count) % n;
                r.chunks.remaining.fetch_add(count, Ordering::AcqRel);
                let chunks = r.chunks.clone();
                let base = buf.ptr as usize;
                let tasks = proto::chunks(h.size, h.chunk, n, start).map(|c| {
                    let t = Task {
                        ptr: base + c.offset as usize,
                        len: c.len as usize,
                        done: 0,
                        req: chunks.clone(),
                    };
                    (c.stream, t)
                });
                self.engine.push(tasks);
            }
            if r.matched == r.bufs.len() {
                self.order.pop_front();
            }
        }
        if self.peer_closed && !self.order.is_empty() && self.msgs.is_empty() {
            return Err(self.link.closed(Stage::Data));
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let now = Instant::now();
        let check = now >= self.next_check;
        if check {
            self.next_check = now + CTRL_CHECK_EVERY;
            if let Some(e) = self.side.poll_abort("sender") {
                return Err(self.fail(e, false));
            }
        }
        if let Err(e) = self.read_ctrl() {
            return Err(self.fail(e, true));
        }
        let r = self.match_msgs().and_then(|()| self.engine.progress());
        if let Err(e) = r {
            return Err(self.fail(e, false));
        }
        if check && let Err(e) = self.watch_sender(now) {
            return Err(self.fail(e, false));
        }
        Ok(())
    }

    /// Posts a receive of up to [`MAX_RECVS`] buffers; each incoming message lands in the first
    /// empty buffer with its tag. `Ok(None)`: too many requests in flight, try again later.
    ///
    /// # Safety
    /// Every buffer must be writable for its `len` bytes and not be read or written by anyone
    /// else until [`RecvConn::test`] reports the request done or the connection is dropped.
    pub unsafe fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<RequestId>> {
        check_recv_count(bufs)?;
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.reqs.live() >= MAX_RECV_REQUESTS {
            return Ok(None);
        }
        let req = RecvReq {
            bufs: bufs.to_vec(),
            filled: vec![false; bufs.len()],
            sizes: [0; MAX_RECVS],
            matched: 0,
            chunks: Arc::new(ReqState::default()),
            copies: Vec::new(),
        };
        let id = self.reqs.insert(req);
        if let Some(id) = id {
            self.order.push_back(id);
        }
        self.progress()?;
        Ok(id)
    }

    /// Whether request `id` is done; the sizes received once it is (the id is then released).
    pub fn test(&mut self, id: RequestId) -> Result<Option<Completed>> {
        self.progress()?;
        let r = self.reqs.tested(id, "receive")?;
        r.copies.retain(|(m, dst)| {
            if m.chunks.remaining.load(Ordering::Acquire) > 0 {
                return true;
            }
            if !m.data.is_empty() {
                // SAFETY: the caller of irecv guarantees the buffer at `dst` is writable for its
                // length, which match_msgs checked is at least `m.data.len()` (= the size).
                unsafe { std::ptr::copy_nonoverlapping(m.data.as_ptr(), *dst, m.data.len()) };
            }
            false
        });
        if r.matched == r.bufs.len()
            && r.chunks.remaining.load(Ordering::Acquire) == 0
            && r.copies.is_empty()
        {
            let c = Completed {
                n: r.bufs.len(),
                sizes: r.sizes,
            };
            self.reqs.remove(id);
            return Ok(Some(c));
        }
        Ok(None)
    }
}

impl Drop for RecvConn {
    /// Leaves the control link: CLOSE to the peer while a sending connection still uses it,
    /// else a graceful close (see `CtrlLink::detach`).
    fn drop(&mut self) {
        if let Some(next) = self.next.take() {
            next.detach(End::Recv, Duration::ZERO);
        }
        self.ctrl.detach(End::Recv, self.linger);
    }
}

// The raw pointers in RecvBuf are only addresses that the caller vouched for in irecv.
// SAFETY: RecvConn owns its sockets and engine; the buffers it writes are the caller's, who
// promised exclusive access to them until completion, whichever thread drives the connection.
unsafe impl Send for RecvConn {}
