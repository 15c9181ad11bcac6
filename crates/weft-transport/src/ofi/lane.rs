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

/// A sender's lane with its sends: which messages it carries (those under `min_bytes`) and
/// which requests it has completed. A lane send is complete once the kernel has all of its
/// bytes, not when they are queued: NCCL stops testing a request that is done, and bytes
/// still queued here would then never leave.
pub(super) struct LaneSend {
    tx: LaneTx,
    /// Sends not complete yet: the stream offset each completes at, in order.
    sends: VecDeque<(u64, RequestId)>,
    /// Messages under this size go on the lane (`WEFT_OFI_MIN_BYTES`).
    min_bytes: usize,
}

impl LaneSend {
    pub(super) fn new(tx: LaneTx, min_bytes: usize) -> LaneSend {
        LaneSend {
            tx,
            sends: VecDeque::new(),
            min_bytes,
        }
    }

    /// Whether a message of `len` bytes goes on the lane.
    pub(super) fn carries(&self, len: usize) -> bool {
        len < self.min_bytes
    }

    /// Queues message (tag, k) of request `req` (copied), into buffer `slot` when its CTS
    /// named it.
    pub(super) fn send(
        &mut self,
        k: u64,
        tag: i32,
        slot: Option<usize>,
        payload: &[u8],
        req: RequestId,
    ) {
        let end = self.tx.push(k, tag, slot, payload);
        self.sends.push_back((end, req));
    }

    /// Writes what the lane can take; `done` gets each request whose bytes the kernel now
    /// has all of, in order.
    pub(super) fn flush(&mut self, link: &Link, mut done: impl FnMut(RequestId)) -> Result<()> {
        self.tx.flush(link)?;
        while let Some(&(end, id)) = self.sends.front() {
            if end > self.tx.written {
                break;
            }
            done(id);
            self.sends.pop_front();
        }
        Ok(())
    }

    /// Whether bytes are still queued.
    pub(super) fn pending(&self) -> bool {
        self.tx.pending()
    }

    /// Bytes the kernel has taken so far (a progress mark).
    pub(super) fn written(&self) -> u64 {
        self.tx.written
    }

    /// Messages sent so far (statistics).
    pub(super) fn msgs(&self) -> u64 {
        self.tx.msgs
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

#[cfg(test)]
mod tests {
    use super::*;

    fn link(peer: SocketAddr) -> Link {
        Link {
            peer,
            iface: "lo (lane test)".into(),
        }
    }

    /// Flushes `tx` and polls `rx` until `want` requests are done and `msgs` messages came
    /// (bounded: 10 s).
    fn pump(
        tx: &mut LaneSend,
        rx: &mut LaneRx,
        done: &mut Vec<RequestId>,
        got: &mut Vec<LaneMsg>,
        want: usize,
        msgs: usize,
    ) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let l = link(rx.addr);
        while done.len() < want || got.len() < msgs {
            assert!(Instant::now() < deadline, "lane stuck: {} done", done.len());
            tx.flush(&l, |id| done.push(id)).expect("flush");
            rx.poll(&l, got).expect("poll");
        }
    }

    #[test]
    fn lane_sends_arrive_in_order_and_complete_once_the_kernel_has_them() {
        let cfg = Config::default();
        let mut rx = LaneRx::listen(IpAddr::from([127, 0, 0, 1]), 42, &cfg).expect("listen");
        let l = link(rx.addr);
        let tx = LaneTx::connect(rx.addr, None, 42, &cfg, &l).expect("connect");
        let mut tx = LaneSend::new(tx, 1024);
        assert!(tx.carries(1023) && !tx.carries(1024));
        let mut ids = Slab::new(4);
        let id: Vec<RequestId> = (0..3).map(|_| ids.insert(()).expect("room")).collect();
        tx.send(0, 5, None, b"early", id[0]);
        tx.send(1, 5, Some(3), b"", id[1]);
        tx.send(0, 6, Some(0), &[7u8; 1000], id[2]);
        assert_eq!(tx.msgs(), 3);
        let (mut done, mut got) = (Vec::new(), Vec::new());
        pump(&mut tx, &mut rx, &mut done, &mut got, 3, 3);
        assert_eq!(done, id, "completed once written, in order");
        assert!(!tx.pending());
        let seen: Vec<(u64, i32, Option<usize>, usize)> = got
            .iter()
            .map(|m| (m.k, m.tag, m.slot, m.payload.len()))
            .collect();
        assert_eq!(
            seen,
            [(0, 5, None, 5), (1, 5, Some(3), 0), (0, 6, Some(0), 1000)]
        );
        assert_eq!(got[0].payload, b"early");
        // The stream's id and three headers and payloads.
        assert_eq!(tx.written(), 8 + 3 * LANE_HDR as u64 + 5 + 1000);
    }

    #[test]
    fn a_lane_send_the_kernel_has_not_taken_is_not_complete() {
        let cfg = Config::default();
        let mut rx = LaneRx::listen(IpAddr::from([127, 0, 0, 1]), 7, &cfg).expect("listen");
        let l = link(rx.addr);
        let tx = LaneTx::connect(rx.addr, None, 7, &cfg, &l).expect("connect");
        let mut tx = LaneSend::new(tx, LANE_MAX);
        let mut ids = Slab::new(4);
        let id: Vec<RequestId> = (0..3).map(|_| ids.insert(()).expect("room")).collect();
        // More than loopback's socket buffers hold while the receiver reads nothing.
        let big = vec![1u8; LANE_MAX];
        tx.send(0, 1, None, b"small", id[0]);
        tx.send(1, 1, None, &big, id[1]);
        tx.send(2, 1, None, &big, id[2]);
        let mut done = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.is_empty() {
            assert!(Instant::now() < deadline, "the small send never completed");
            tx.flush(&l, |id| done.push(id)).expect("flush");
        }
        for _ in 0..50 {
            tx.flush(&l, |id| done.push(id)).expect("flush");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(tx.pending());
        assert!(
            !done.contains(&id[2]),
            "32 MiB cannot all be in the kernel yet"
        );
        assert_eq!(done[0], id[0]);
        // Once the receiver reads, the rest completes.
        let mut got = Vec::new();
        pump(&mut tx, &mut rx, &mut done, &mut got, 3, 3);
        assert_eq!(done, id);
        assert_eq!(got[2].payload.len(), LANE_MAX);
    }
}
