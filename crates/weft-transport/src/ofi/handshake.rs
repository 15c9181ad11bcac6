//! Connection set-up of the ofi backend over the management network: the sender's
//! [`Connecting`] (ports, HELLO and address record, ACK) and the receiver's [`Listener`]
//! (nonce check, `fi_av_insert`, its own record), stray connections discarded.

use super::*;

/// A connection being set up by the sender.
pub struct Connecting {
    pub(super) cfg: Config,
    pub(super) link: Link,
    /// The side channel being connected, with HELLO and our address record to write.
    pub(super) side: PendingSock,
    pub(super) dec: FrameDecoder,
    pub(super) acked: bool,
    pub(super) nonce: u64,
    pub(super) conn_id: u64,
    pub(super) deadline: Instant,
    /// One endpoint per rail; taken when established.
    pub(super) eps: Vec<Port>,
    pub(super) cq_data: u8,
    /// The address of our data interface, to bind a TCP lane to.
    pub(super) lane_local: Option<IpAddr>,
    /// Name of our data device, for errors of the data path.
    pub(super) data_iface: String,
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
            let stage = if self.side.connected {
                Stage::Handshake
            } else {
                Stage::Connect
            };
            return Err(self.link.timeout(stage, self.cfg.timeout));
        }
        if !self.side.poll(now, &self.cfg)? {
            return Ok(None);
        }
        let mut buf = [0u8; 1024];
        loop {
            let want = self.dec.wanted().min(buf.len());
            match (&self.side.sock).read(&mut buf[..want.max(1)]) {
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

    pub(super) fn bad(&self, what: &'static str) -> Error {
        self.link.protocol(
            Stage::Handshake,
            proto::FrameError::Unexpected {
                got: "malformed MSG",
                expected: what,
            },
        )
    }

    pub(super) fn establish(&mut self, rec: AddrRecord) -> Result<SendConn> {
        if self.eps.is_empty() {
            return Err(Error::Usage("connection already established".into()));
        }
        let mut eps = std::mem::take(&mut self.eps);
        let ep = &eps[0];
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
        // The receiver answers with what the connection uses: at most what we offered.
        let cq4 = match rec.cq_data.min(self.cq_data) {
            8 => false,
            4 if rec.table.is_some() => true,
            n => {
                return Err(Error::Rejected {
                    peer: self.link.peer,
                    iface: self.link.iface.clone(),
                    reason: format!(
                        "the listener answered with {n}-byte remote CQ data{} (4 or 8 expected)",
                        if rec.table.is_none() {
                            " and no size table"
                        } else {
                            ""
                        }
                    ),
                });
            }
        };
        // The receiver answers with the rails the connection uses: at most ours.
        if rec.more.len() >= eps.len() {
            return Err(self.bad("address record with no more rails than offered"));
        }
        eps.truncate(1 + rec.more.len());
        if rec.ids.len() != eps.len() {
            return Err(self.bad("address record with an id per rail"));
        }
        for ((ep, addr), &(tag, slot)) in eps
            .iter_mut()
            .zip(std::iter::once(&rec.addr).chain(&rec.more))
            .zip(&rec.ids)
        {
            ep.connect(addr, tag, slot)
                .map_err(|e| ofi_err(&self.link, "fi_av_insert", Stage::Handshake, e))?;
        }
        let sock: TcpStream = self
            .side
            .sock
            .try_clone()
            .map_err(|e| Error::local("dup", &e))?
            .into();
        let link = Link {
            peer: self.link.peer,
            iface: format!("{} ({})", self.link.iface, describe(&eps)),
        };
        let lane = match rec.lane {
            Some(addr) if self.cfg.ofi_min_bytes > 0 && rec.min_bytes > 0 => {
                let local = self.lane_local.filter(|l| l.is_ipv4() == addr.is_ipv4());
                Some(LaneTx::connect(
                    addr,
                    local,
                    self.conn_id,
                    &self.cfg,
                    &link,
                )?)
            }
            _ => None,
        };
        let data = data_link(&self.link, &self.data_iface, &rec.addr, &eps);
        let mut s = SendConn::new(
            eps,
            link,
            sock,
            rec.eager_slots,
            rec.table.filter(|_| cq4),
            self.cfg.ofi_stripe_bytes,
        )?;
        s.watch = SendWatch::new(data, self.cfg.timeout, Instant::now());
        s.lane = lane.map(|tx| LaneSend::new(tx, self.cfg.ofi_min_bytes));
        Ok(s)
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

pub(super) fn describe(eps: &[Port]) -> String {
    let mut s = String::from("ofi ");
    for (i, ep) in eps.iter().enumerate() {
        if i == 0 {
            s.push_str(&format!("{}/{}", ep.dom.info.provider, ep.dom.info.domain));
        } else {
            s.push_str(&format!("+{}", ep.dom.info.domain));
        }
    }
    s
}

/// The data path of a connection as its errors name it: the peer's data address (its rail 0
/// endpoint address when that is an IP socket address, as with `tcp`; else the management
/// peer) and "data device (ofi provider/domain)".
pub(super) fn data_link(mgmt: &Link, dev: &str, peer_addr: &[u8], eps: &[Port]) -> Link {
    let dev = if dev.is_empty() {
        mgmt.iface.as_str()
    } else {
        dev
    };
    Link {
        peer: sockaddr(peer_addr).unwrap_or(mgmt.peer),
        iface: format!("{dev} ({})", describe(eps)),
    }
}

/// An endpoint address that is a `struct sockaddr_in` or `sockaddr_in6` (FI_SOCKADDR_IN*).
pub(super) fn sockaddr(a: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes(a.get(..2)?.try_into().ok()?));
    let port = u16::from_be_bytes(a.get(2..4)?.try_into().ok()?);
    let ip: IpAddr = if family == libc::AF_INET && a.len() >= 16 {
        <[u8; 4]>::try_from(a.get(4..8)?).ok()?.into()
    } else if family == libc::AF_INET6 && a.len() >= 28 {
        <[u8; 16]>::try_from(a.get(8..24)?).ok()?.into()
    } else {
        return None;
    };
    (!ip.is_unspecified()).then_some(SocketAddr::new(ip, port))
}

pub(super) struct PendingAccept {
    pub(super) sock: TcpStream,
    pub(super) link: Link,
    pub(super) dec: FrameDecoder,
    pub(super) since: Instant,
    pub(super) hello: Option<(u64, u64)>,
}

impl PendingAccept {
    /// Tells the sender why it is refused (best effort: it may be gone) and gives the error
    /// this side reports, naming the sender.
    fn reject(&self, nonce: u64, conn_id: u64, reason: RejectReason, why: String) -> Error {
        let mut v = Vec::new();
        Frame::Reject {
            nonce,
            conn_id,
            reason,
        }
        .encode(&mut v);
        let _ = (&self.sock).write(&v);
        Error::Rejected {
            peer: self.link.peer,
            iface: self.link.iface.clone(),
            reason: why,
        }
    }
}

/// The receiver's listening side of a device.
pub struct Listener {
    pub(super) cfg: Config,
    pub(super) backend: Arc<Backend>,
    pub(super) dev: usize,
    pub(super) iface: String,
    pub(super) handle: ListenHandle,
    pub(super) listener: TcpListener,
    pub(super) pending: Vec<PendingAccept>,
    pub(super) idle_since: Option<Instant>,
    /// Connections closed because they did not speak weft's protocol, for the caller to log.
    pub(super) discarded: Vec<Error>,
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

    /// The stray connections discarded since the last call, as errors naming each peer.
    pub fn take_discarded(&mut self) -> Vec<Error> {
        std::mem::take(&mut self.discarded)
    }

    /// Accepts without blocking. `Ok(None)`: nothing complete yet. A socket that does not
    /// speak weft's protocol is closed and kept for [`Listener::take_discarded`].
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
                // Not weft's protocol (garbage, a bare connect and close, a probe, a foreign
                // nonce, a stall): closed and kept for the caller to log; keep waiting.
                Err(e) => {
                    self.pending.swap_remove(i);
                    self.discarded.push(e);
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

    pub(super) fn step(
        &mut self,
        i: usize,
        now: Instant,
    ) -> Result<Option<(u64, u64, AddrRecord)>> {
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
                        return Err(p.reject(nonce, conn_id, reason, format!("refused: {reason}")));
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

    pub(super) fn finish(
        &mut self,
        i: usize,
        nonce: u64,
        conn_id: u64,
        rec: AddrRecord,
    ) -> Result<RecvConn> {
        let doms = self.backend.rail_domains(self.dev)?;
        let dom = doms[0].clone();
        let p = &self.pending[i];
        if rec.provider != dom.info.provider {
            return Err(p.reject(
                nonce,
                conn_id,
                RejectReason::Other(REJECT_NOT_OFI),
                format!(
                    "refused: the sender uses provider {}, this side {}",
                    rec.provider, dom.info.provider
                ),
            ));
        }
        // Remote CQ data: the smaller of both sides' (a version 1 sender said nothing: 8).
        let cq_data = rec.cq_data.min(self.backend.cq_bytes(&dom));
        if cq_data < 4 {
            return Err(p.reject(
                nonce,
                conn_id,
                RejectReason::Other(REJECT_NOT_OFI),
                format!("refused: the sender offers {cq_data}-byte remote CQ data"),
            ));
        }
        // Rails: as many as both sides have.
        let n = doms.len().min(1 + rec.more.len());
        if rec.ids.len() != 1 + rec.more.len() {
            return Err(p.link.protocol(
                Stage::Accept,
                proto::FrameError::Unexpected {
                    got: "malformed MSG",
                    expected: "address record with an id per rail",
                },
            ));
        }
        // Remote writes find their connection on a shared endpoint by the slot in their
        // 8-byte CQ data; with 4 bytes there is no room, so the connection has its own.
        let key = shared::new_key();
        let mut eps = Vec::new();
        let mut names = Vec::new();
        for (rail, ((d, addr), &(tag, slot))) in doms
            .iter()
            .zip(std::iter::once(&rec.addr).chain(&rec.more))
            .zip(&rec.ids)
            .take(n)
            .enumerate()
        {
            let mut ep = self
                .backend
                .port(self.dev, rail, d, key, cq_data == 4)
                .map_err(|e| ofi_err(&p.link, "fi_endpoint", Stage::Accept, e))?;
            ep.connect(addr, tag, slot)
                .map_err(|e| ofi_err(&p.link, "fi_av_insert", Stage::Accept, e))?;
            names.push(
                ep.name()
                    .map_err(|e| ofi_err(&p.link, "fi_getname", Stage::Accept, e))?,
            );
            eps.push(ep);
        }
        let link = Link {
            peer: p.link.peer,
            iface: format!("{} ({})", p.link.iface, describe(&eps)),
        };
        let sock = p.sock.try_clone().map_err(|e| Error::local("dup", &e))?;
        // Post the eager buffers before the sender can learn our address.
        let data = data_link(&p.link, &self.backend.dev_name(self.dev), &rec.addr, &eps);
        let mut conn = RecvConn::new(eps, link.clone(), sock, cq_data == 4)?;
        conn.watch = RecvWatch::new(data, self.cfg.timeout, Instant::now());
        // A TCP lane for small messages, when the sender asks for one.
        let lane_ip = self.backend.lane_addrs.get(self.dev).copied().flatten();
        let mut lane = None;
        if let (true, Some(ip)) = (rec.min_bytes > 0, lane_ip) {
            let l = LaneRx::listen(ip, conn_id, &self.cfg)?;
            lane = Some(l.addr);
            conn.lane = Some(l);
        }
        let mine = AddrRecord {
            provider: dom.info.provider.clone(),
            addr: names.remove(0),
            eager_slots: EAGER_SLOTS as u32,
            cq_data,
            table: conn.table_remote(),
            more: names,
            min_bytes: if lane.is_some() { rec.min_bytes } else { 0 },
            lane,
            ids: conn.eps.iter().map(|p| (p.key(), p.slot())).collect(),
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_addresses_that_are_ip_socket_addresses_name_the_data_peer() {
        let mut v4 = [0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&4242u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[10, 201, 1, 2]);
        assert_eq!(sockaddr(&v4), Some("10.201.1.2:4242".parse().unwrap()));
        let mut v6 = [0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&7u16.to_be_bytes());
        v6[23] = 1;
        assert_eq!(sockaddr(&v6), Some("[::1]:7".parse().unwrap()));
        // Unspecified, short, or not an IP address (shm names, IB addresses): none.
        v4[4..8].fill(0);
        assert_eq!(sockaddr(&v4), None);
        assert_eq!(sockaddr(&v6[..20]), None);
        assert_eq!(sockaddr(b"fi_shm://1234"), None);
    }
}
