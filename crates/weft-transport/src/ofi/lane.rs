//! The TCP lane (`WEFT_OFI_MIN_BYTES`): messages under a size over one TCP stream on the data
//! network instead of libfabric.

use super::*;

// TCP lane (WEFT_OFI_MIN_BYTES): small messages over a TCP stream on the data network.

/// Header of a message on a TCP lane: its k (its index among the sender's messages of its
/// tag), tag, buffer index (`u32::MAX`: not known to the sender, the message lands as an
/// eager one), size.
pub(super) const LANE_HDR: usize = 24;
pub(super) const LANE_NO_SLOT: u32 = u32::MAX;
/// Largest message a lane carries (the bound of `WEFT_OFI_MIN_BYTES`).
pub(super) const LANE_MAX: usize = 16 << 20;

/// A lane message as the receiver reads it.
pub(super) struct LaneMsg {
    pub(super) k: u64,
    pub(super) tag: i32,
    pub(super) slot: Option<usize>,
    pub(super) payload: Vec<u8>,
}

/// The sender's end of a TCP lane: a non-blocking stream to the receiver's lane listener,
/// opened right after the handshake, that starts with the connection id.
pub(super) struct LaneTx {
    pub(super) sock: Socket,
    pub(super) peer: SocketAddr,
    pub(super) connected: bool,
    pub(super) out: Vec<u8>,
    pub(super) pos: usize,
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
    /// Messages sent over the lane (statistics).
    pub(super) msgs: u64,
    /// Stream offsets: bytes queued so far, and bytes the kernel has taken.
    pub(super) queued: u64,
    pub(super) written: u64,
}

impl LaneTx {
    pub(super) fn connect(
        addr: SocketAddr,
        local: Option<IpAddr>,
        conn_id: u64,
        cfg: &Config,
        link: &Link,
    ) -> Result<LaneTx> {
        let e = |op: &'static str, err: &io::Error| {
            Link {
                peer: addr,
                iface: link.iface.clone(),
            }
            .io(op, Stage::Connect, err)
        };
        let s = Socket::new(
            SockDomain::for_address(addr),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|x| e("lane socket", &x))?;
        s.set_nonblocking(true)
            .and_then(|()| s.set_tcp_nodelay(true))
            .map_err(|x| e("lane setsockopt", &x))?;
        if let Some(l) = local {
            s.bind(&SocketAddr::new(l, 0).into())
                .map_err(|x| e("lane bind", &x))?;
        }
        match s.connect(&SockAddr::from(addr)) {
            Ok(()) => {}
            Err(x) if x.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(x) => return Err(e("lane connect", &x)),
        }
        let out = conn_id.to_le_bytes().to_vec();
        Ok(LaneTx {
            sock: s,
            peer: addr,
            connected: false,
            queued: out.len() as u64,
            written: 0,
            out,
            pos: 0,
            deadline: Instant::now() + cfg.timeout,
            timeout: cfg.timeout,
            msgs: 0,
        })
    }

    /// Queues one message (copied); returns the stream offset its send is complete at (see
    /// [`LaneTx::written`]): only bytes the kernel has taken leave without more flushes.
    pub(super) fn push(&mut self, k: u64, tag: i32, slot: Option<usize>, payload: &[u8]) -> u64 {
        let mut h = [0u8; LANE_HDR];
        put_u64(&mut h, 0, k);
        put_u32(&mut h, 8, tag as u32);
        put_u32(&mut h, 12, slot.map_or(LANE_NO_SLOT, |s| s as u32));
        put_u64(&mut h, 16, payload.len() as u64);
        self.out.extend_from_slice(&h);
        self.out.extend_from_slice(payload);
        self.msgs += 1;
        // Writing resets the bound: it covers a stream that accepts nothing for that long.
        if self.pos == self.out.len() - h.len() - payload.len() {
            self.deadline = Instant::now() + self.timeout;
        }
        self.queued += (h.len() + payload.len()) as u64;
        self.queued
    }

    /// Whether bytes are still queued.
    pub(super) fn pending(&self) -> bool {
        self.pos < self.out.len()
    }

    /// Connects and writes what it can without blocking. Bounded: a lane that does not connect,
    /// or takes nothing of queued bytes for `timeout`, is an error.
    pub(super) fn flush(&mut self, link: &Link) -> Result<()> {
        let lane = || Link {
            peer: self.peer,
            iface: link.iface.clone(),
        };
        if !self.connected {
            if poll_fd(self.sock.as_raw_fd(), libc::POLLOUT) == 0 {
                if Instant::now() >= self.deadline {
                    return Err(lane().timeout(Stage::Connect, self.timeout));
                }
                return Ok(());
            }
            match self.sock.take_error() {
                Ok(None) => self.connected = true,
                Ok(Some(e)) | Err(e) => return Err(lane().io("lane connect", Stage::Connect, &e)),
            }
        }
        let start = self.pos;
        while self.pos < self.out.len() {
            match (&self.sock).write(&self.out[self.pos..]) {
                Ok(n) => {
                    self.pos += n;
                    self.written += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(lane().io("lane send", Stage::Data, &e)),
            }
        }
        if self.pos > start {
            self.deadline = Instant::now() + self.timeout;
        } else if self.pending() && Instant::now() >= self.deadline {
            return Err(lane().timeout(Stage::Data, self.timeout));
        }
        if self.pos == self.out.len() {
            self.out.clear();
            self.pos = 0;
        } else if self.pos >= 1 << 20 {
            self.out.drain(..self.pos);
            self.pos = 0;
        }
        Ok(())
    }
}

/// The receiver's end of a TCP lane: its own listener on the data interface, until the
/// sender's stream (which must start with the connection id) arrives.
pub(super) struct LaneRx {
    pub(super) addr: SocketAddr,
    pub(super) listener: Option<TcpListener>,
    pub(super) sock: Option<TcpStream>,
    pub(super) conn_id: u64,
    pub(super) authed: bool,
    pub(super) inbuf: Vec<u8>,
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
}

impl LaneRx {
    pub(super) fn listen(ip: IpAddr, conn_id: u64, cfg: &Config) -> Result<LaneRx> {
        let sa = SocketAddr::new(ip, 0);
        let op = || format!("TCP lane listener on {sa}");
        let l = TcpListener::bind(sa).map_err(|e| Error::local(op(), &e))?;
        l.set_nonblocking(true)
            .map_err(|e| Error::local(op(), &e))?;
        let addr = l.local_addr().map_err(|e| Error::local(op(), &e))?;
        Ok(LaneRx {
            addr,
            listener: Some(l),
            sock: None,
            conn_id,
            authed: false,
            inbuf: Vec::new(),
            deadline: Instant::now() + cfg.timeout,
            timeout: cfg.timeout,
        })
    }

    /// Accepts the sender's stream and reads the messages that are complete.
    pub(super) fn poll(&mut self, link: &Link, out: &mut Vec<LaneMsg>) -> Result<()> {
        let lane = |peer: SocketAddr| Link {
            peer,
            iface: link.iface.clone(),
        };
        if self.sock.is_none() {
            let Some(l) = &self.listener else {
                return Ok(());
            };
            match l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(true)
                        .and_then(|()| s.set_nodelay(true))
                        .map_err(|e| lane(self.addr).io("lane accept", Stage::Accept, &e))?;
                    self.sock = Some(s);
                    self.listener = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= self.deadline {
                        return Err(lane(self.addr).timeout(Stage::Accept, self.timeout));
                    }
                    return Ok(());
                }
                Err(e) => return Err(lane(self.addr).io("lane accept", Stage::Accept, &e)),
            }
        }
        let Some(sock) = &self.sock else {
            return Ok(());
        };
        let peer = sock.peer_addr().unwrap_or(self.addr);
        let mut buf = [0u8; 64 << 10];
        loop {
            match (&*sock).read(&mut buf) {
                // The sender closed its end: the side channel tells whether it is gone.
                Ok(0) => break,
                Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(lane(peer).io("lane recv", Stage::Data, &e)),
            }
        }
        let bad = |got: &'static str| {
            lane(peer).protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got,
                    expected: "a TCP lane message",
                },
            )
        };
        let mut at = 0;
        if !self.authed {
            if self.inbuf.len() < 8 {
                return Ok(());
            }
            if get_u64(&self.inbuf, 0) != self.conn_id {
                return Err(bad("a stream of another connection"));
            }
            self.authed = true;
            at = 8;
        }
        while self.inbuf.len() - at >= LANE_HDR {
            let h = &self.inbuf[at..at + LANE_HDR];
            let len = get_u64(h, 16);
            if len > LANE_MAX as u64 {
                return Err(bad("an oversized message"));
            }
            let len = len as usize;
            if self.inbuf.len() - at - LANE_HDR < len {
                break;
            }
            let slot = get_u32(h, 12);
            out.push(LaneMsg {
                k: get_u64(h, 0),
                tag: get_u32(h, 8) as i32,
                slot: (slot != LANE_NO_SLOT).then_some(slot as usize),
                payload: self.inbuf[at + LANE_HDR..at + LANE_HDR + len].to_vec(),
            });
            at += LANE_HDR + len;
        }
        self.inbuf.drain(..at);
        Ok(())
    }
}
