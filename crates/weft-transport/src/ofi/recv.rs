//! The receiving end of an ofi connection: CTS (deferred for small receives), eager and lane
//! messages placed in their buffer by (tag, k), RMA write completions, POSTED, the close
//! protocol.

use super::*;

// Receiver

pub(super) struct RecvReq {
    pub(super) bufs: Vec<RecvBuf>,
    /// Per buffer, its index among this connection's buffers of its tag: message (tag, k)
    /// lands in it.
    pub(super) ks: [u64; MAX_RECVS],
    /// Its CTS left (the provider reported it sent).
    pub(super) cts_left: bool,
    /// Per buffer, where its message stands.
    pub(super) land: [Landing; MAX_RECVS],
    /// Buffers whose message is complete.
    pub(super) nfilled: usize,
    pub(super) _mrs: Vec<Arc<Mr>>,
}

/// The receiving end of an ofi connection.
pub struct RecvConn {
    /// One endpoint per rail; rail 0 also carries CTS, eager messages and size records.
    pub(super) eps: Vec<Port>,
    pub(super) link: Link,
    pub(super) side: Side,
    pub(super) ctx: Box<[Ctx]>,
    pub(super) cts: Pool,
    /// Events of one poll (kept for its allocation).
    pub(super) events: Vec<Event>,
    pub(super) cts_free: Vec<usize>,
    pub(super) cts_queue: VecDeque<(usize, usize)>,
    /// Registration cache per rail.
    pub(super) caches: Vec<MrCache>,
    pub(super) reqs: Slab<RecvReq>,
    pub(super) order: VecDeque<RequestId>,
    /// Per tag, the k of the next buffer of that tag posted.
    pub(super) next_k: FastMap<i32, u64>,
    /// Posted buffers whose message has not begun to arrive: (tag, k) -> (request, buffer).
    pub(super) posted: FastMap<(i32, u64), (RequestId, usize)>,
    /// Messages that came before their buffer was posted, by (tag, k): their bytes (copied
    /// out of the endpoint's buffers, see [`Payload::release`]); at most [`EAGER_SLOTS`], the
    /// sender's eager credit.
    pub(super) unexpected: FastMap<(i32, u64), Payload>,
    pub(super) eager_consumed: u64,
    pub(super) virt_addr: bool,
    /// 4-byte protocol: the size table the senders write records into, one per buffer.
    pub(super) table: Option<Pool>,
    pub(super) id: u64,
    /// The TCP lane, when the sender asked for one (WEFT_OFI_MIN_BYTES).
    pub(super) lane: Option<LaneRx>,
    pub(super) watch: RecvWatch,
    /// Per CTS slot in flight, the receive it is the CTS of (none: credit only).
    pub(super) cts_req: [Option<RequestId>; CTS_TX_SLOTS],
    /// Small receives whose CTS waits (see "Small receives" in the module docs), in posting
    /// order: request, when the CTS goes if still incomplete.
    pub(super) deferred: VecDeque<(RequestId, Instant)>,
    /// The eager consumption the latest CTS reported.
    pub(super) eager_reported: u64,
    /// CTS with buffers sent (statistics).
    pub(super) cts_sent: u64,
    pub(super) error: Option<Error>,
    /// The exposed receives were quiesced ([`RecvConn::quiesce`]), at a deregMr or at close.
    pub(super) quiesced: bool,
    /// A region an incomplete receive lands in was deregistered: its caller may have freed
    /// it, so nothing may read the queues for this connection again (see `dereg_mr`).
    pub(super) region_gone: bool,
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
    pub(super) fn new(eps: Vec<Port>, link: Link, sock: TcpStream, cq4: bool) -> Result<RecvConn> {
        let e = |m: FiError| ofi_err(&link, "fi_mr_reg", Stage::Accept, m);
        let ep = &eps[0];
        let cts = Pool::messages(ep, CTS_TX_SLOTS, CTS_BUF, ep.peer_key()).map_err(e)?;
        let table = if cq4 {
            Some(Pool::new(ep, MAX_RECV_REQUESTS * MAX_RECVS, REC).map_err(e)?)
        } else {
            None
        };
        let key = ep.key();
        let mut ctx = ctx_array(CTS_TX_SLOTS);
        for (i, c) in ctx.iter_mut().enumerate() {
            c.owner = key;
            c.id = (C_CTS_TX << 32) | i as u64;
        }
        let virt_addr = ep.dom.info.mr_mode & (sys::FI_MR_VIRT_ADDR | sys::FI_MR_BASIC) != 0;
        let caches = eps.iter().map(|_| MrCache::default()).collect();
        let watch = RecvWatch::new(link.clone(), Duration::from_secs(30), Instant::now());
        let r = RecvConn {
            eps,
            link,
            side: Side::new(sock).answering(PROBE_TAG),
            ctx,
            cts,
            events: Vec::new(),
            cts_free: (0..CTS_TX_SLOTS).rev().collect(),
            cts_queue: VecDeque::new(),
            caches,
            reqs: Slab::new(MAX_RECV_REQUESTS),
            order: VecDeque::new(),
            next_k: FastMap::default(),
            posted: FastMap::default(),
            unexpected: FastMap::default(),
            eager_consumed: 0,
            virt_addr,
            table,
            id: key,
            lane: None,
            watch,
            cts_req: [None; CTS_TX_SLOTS],
            deferred: VecDeque::new(),
            eager_reported: 0,
            cts_sent: 0,
            error: None,
            quiesced: false,
            region_gone: false,
        };
        Ok(r)
    }

    /// Remote management address and "interface (ofi provider/domain)".
    pub fn peer(&self) -> (SocketAddr, &str) {
        (self.link.peer, &self.link.iface)
    }

    /// Registration cache statistics: (hits, misses).
    pub fn mr_stats(&self) -> (u64, u64) {
        stats(&self.caches)
    }

    /// Rails (endpoints) of the connection.
    pub fn rails(&self) -> usize {
        self.eps.len()
    }

    /// Bytes of remote CQ data the connection uses (4 or 8).
    pub fn cq_data_bytes(&self) -> usize {
        if self.table.is_some() { 4 } else { 8 }
    }

    /// Connections of this process on the connection's rail-0 endpoint, itself included (1:
    /// an endpoint of its own, as with 4-byte remote CQ data).
    pub fn endpoint_users(&self) -> usize {
        self.eps[0].users()
    }

    /// Registers `len` bytes at `ptr` for this connection (NCCL's regMr).
    pub fn reg_mr(&mut self, ptr: *const u8, len: usize) -> Result<Registration> {
        register(&mut self.caches, &self.eps, self.id, ptr as usize, len)
            .map_err(|m| self.fi("fi_mr_reg", m))
    }

    /// Releases a registration of [`RecvConn::reg_mr`]; see [`SendConn::dereg_mr`].
    ///
    /// NCCL frees a region right after its deregMr returns and calls closeRecv only after
    /// that (its proxy's teardown: deregMr, free, closeRecv). After an abort a receive may
    /// still be incomplete in it, its CTS gone, and reading the queues lands the rest of a
    /// dead sender's write in it: in freed memory if that waits until close (a SIGSEGV in
    /// `fi_cq_read` under closeRecv, seen with 8 ranks inside NCCL). So the receives are
    /// quiesced here, while the memory is still the caller's, and once such a region is
    /// gone the connection never reads the queues again.
    pub fn dereg_mr(&mut self, reg: Registration) {
        if reg.owner == self.id {
            for c in &mut self.caches {
                c.invalidate(reg.ptr, reg.len);
            }
        }
        if self.incomplete_in(reg.ptr, reg.len) {
            self.region_gone = true;
            self.quiesce();
        }
    }

    /// Whether a receive that is not complete has a buffer in `ptr..ptr + len`.
    fn incomplete_in(&self, ptr: usize, len: usize) -> bool {
        let end = ptr.saturating_add(len);
        self.order.iter().any(|id| {
            self.reqs.get(*id).is_some_and(|r| {
                r.bufs.iter().any(|b| {
                    let s = b.ptr as usize;
                    s < end && s.saturating_add(b.len) > ptr
                })
            })
        })
    }

    /// Receives whose CTS left (or may have) and that are incomplete: their sender may be
    /// writing into them. Tells it (our end of the side channel shut down: it posts no more
    /// writes) and keeps their memory registered, reading the queues (which lands what is on
    /// its way), until it says STOPPED (none in flight), goes away, or `CLOSE_WAIT` passes;
    /// a sender that went away gets `DRAIN` more for what it had sent. Without STOPPED, the
    /// registrations outlive the connection on the endpoint (see `STOPPED_TAG`), unless their
    /// memory is being given back (`region_gone`): then they are closed now, so that a write
    /// still coming is refused by its key instead of landing in freed memory. Once only.
    fn quiesce(&mut self) {
        if self.quiesced {
            return;
        }
        self.quiesced = true;
        let exposed = self
            .order
            .iter()
            .any(|id| !self.deferred.iter().any(|d| d.0 == *id));
        if !exposed {
            return;
        }
        self.side.close_notice();
        let deadline = Instant::now() + CLOSE_WAIT;
        while !self.side.stopped && !self.side.eof && Instant::now() < deadline {
            if self.poll_cq().is_err() || self.side.poll_now(&self.link, "sender").is_some() {
                break;
            }
        }
        if self.side.eof && !self.side.stopped {
            let deadline = Instant::now() + DRAIN;
            while !self.order.is_empty() && Instant::now() < deadline {
                if self.poll_cq().is_err() {
                    break;
                }
            }
        }
        if !self.side.stopped {
            let mrs: Vec<Arc<Mr>> = self
                .reqs
                .values_mut()
                .flat_map(|r| std::mem::take(&mut r._mrs))
                .collect();
            if !self.region_gone {
                self.eps[0].bury(mrs, self.watch.timeout() * 2);
            }
            if let Some(t) = &mut self.table {
                t.leak();
            }
        }
    }

    /// Where senders write size records (address, or offset without FI_MR_VIRT_ADDR; key).
    pub(super) fn table_remote(&self) -> Option<(u64, u64)> {
        self.table.as_ref().map(|t| {
            let addr = if self.virt_addr {
                t.buf.as_ptr() as u64
            } else {
                (t.buf.as_ptr() as usize - t.mr.base) as u64
            };
            (addr, t.mr.key())
        })
    }

    pub(super) fn fi(&self, op: &'static str, m: FiError) -> Error {
        ofi_err(&self.link, op, Stage::Data, m)
    }

    pub(super) fn fail(&mut self, e: Error) -> Error {
        if self.error.is_none() {
            self.side.send_abort(&e);
        }
        self.error.get_or_insert(e).clone()
    }

    /// Sends the queued CTS, in order.
    pub(super) fn flush_cts(&mut self) -> Result<()> {
        // Nothing new to a peer whose process has ended: with `shm` in one process its memory
        // region is gone with its endpoint.
        while let Some(&(slot, len)) = self.cts_queue.front().filter(|_| !self.side.eof) {
            let p = self.cts.ptr(slot);
            let desc = self.cts.mr.desc();
            let c: *mut Ctx = &mut self.ctx[slot];
            let n = self.cts.wire(len);
            // SAFETY: CTS slot and context are reserved for this send until its completion
            // returns the slot to `cts_free`.
            let ok = unsafe { self.eps[0].send(p, n, desc, c.cast()) }
                .map_err(|m| self.fi("fi_send", m))?;
            if !ok {
                break;
            }
            self.cts_queue.pop_front();
        }
        Ok(())
    }

    /// Lands message (tag, k) that came without a buffer index (eager, or early on the TCP
    /// lane) in its buffer, or holds it until that buffer is posted.
    pub(super) fn land(&mut self, tag: i32, k: u64, mut payload: Payload) -> Result<()> {
        if let Some((id, slot)) = self.posted.remove(&(tag, k)) {
            self.eager_consumed += 1;
            return self.place(id, slot, tag, payload.bytes());
        }
        // The sender's eager credit bounds what can wait here; more is a broken peer.
        if self.unexpected.len() >= EAGER_SLOTS || self.unexpected.contains_key(&(tag, k)) {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "more early messages than the eager credit allows, or one twice",
                    expected: "a message within the eager credit",
                },
            ));
        }
        payload.release();
        self.unexpected.insert((tag, k), payload);
        Ok(())
    }

    /// Copies a whole message into buffer `slot` of receive `id`, which is then complete.
    pub(super) fn place(
        &mut self,
        id: RequestId,
        slot: usize,
        tag: i32,
        data: &[u8],
    ) -> Result<()> {
        let peer = self.link.peer;
        let Some(r) = self.reqs.get_mut(id) else {
            return Ok(());
        };
        let b = r.bufs[slot];
        if data.len() > b.len {
            return Err(Error::Truncated {
                peer,
                sent: data.len() as u64,
                posted: b.len,
                tag,
            });
        }
        if !data.is_empty() {
            // SAFETY: the caller of irecv guarantees the buffer is writable for `b.len`
            // bytes, and data.len() <= b.len.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr, data.len()) };
        }
        r.land[slot].placed(data.len());
        r.nfilled += 1;
        Ok(())
    }

    /// Lands a TCP lane message whose buffer the sender knew (from the CTS).
    pub(super) fn on_lane_slotted(&mut self, m: LaneMsg, slot: usize) -> Result<()> {
        let tk = (m.tag, m.k);
        let Some((id, _)) = self.posted.get(&tk).copied().filter(|p| p.1 == slot) else {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "TCP lane message for no pending buffer",
                    expected: "a message for a posted receive buffer",
                },
            ));
        };
        self.posted.remove(&tk);
        self.place(id, slot, m.tag, &m.payload)
    }

    /// Reads the TCP lane (if any) and lands what came.
    pub(super) fn poll_lane(&mut self) -> Result<()> {
        let Some(l) = &mut self.lane else {
            return Ok(());
        };
        let mut msgs = Vec::new();
        l.poll(&self.link, &mut msgs)?;
        for m in msgs {
            match m.slot {
                Some(slot) => self.on_lane_slotted(m, slot)?,
                None => self.land(m.tag, m.k, Payload::Copied(m.payload))?,
            }
        }
        Ok(())
    }

    pub(super) fn on_eager(&mut self, b: &[u8]) -> Result<()> {
        if b.len() < HDR {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "short message",
                    expected: "EAGER",
                },
            ));
        }
        let (kind, tag, k, size) = (
            get_u32(b, 0),
            get_u32(b, 4) as i32,
            get_u64(b, 8),
            get_u64(b, 16),
        );
        if kind != K_EAGER || size > EAGER_MAX as u64 || HDR + size as usize > b.len() {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "unknown message",
                    expected: "EAGER",
                },
            ));
        }
        let payload = Payload::Copied(b[HDR..HDR + size as usize].to_vec());
        self.land(tag, k, payload)
    }

    /// An eager message of the 8-byte protocol: the payload alone, with its tag and the low
    /// bits of its k in the CQ data. k is the one with those bits nearest to the k of the next
    /// buffer of that tag to be posted: a message is at most the sender's requests plus its
    /// eager credit ahead of it and at most the posted receives' buffers behind, both far
    /// inside the window.
    ///
    /// When its receive is posted the message goes from the endpoint's buffer straight into
    /// the caller's; else it is copied out and waits.
    pub(super) fn on_eager_data(&mut self, data: u64, payload: Payload) -> Result<()> {
        if self.table.is_some() || payload.bytes().len() > EAGER_MAX {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "an eager message with CQ data",
                    expected: "EAGER",
                },
            ));
        }
        let tag = (data >> 32) as u32 as i32;
        let next = self.next_k.get(&tag).copied().unwrap_or(0);
        let k = eager_seq(data & EAGER_SEQ_MASK, next);
        self.land(tag, k, payload)
    }

    pub(super) fn on_write(&mut self, data: u64) -> Result<()> {
        let bad = |link: &Link, got: &'static str| {
            link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got,
                    expected: "a write into a posted receive buffer",
                },
            )
        };
        let cq4 = self.table.is_some();
        let Some(ev) = decode_cq_data(cq4, data) else {
            return Err(bad(&self.link, "unknown remote CQ data"));
        };
        let (idx, slot) = match ev {
            WriteEvent::Data { idx, slot, .. } | WriteEvent::Record { idx, slot, .. } => {
                (idx, slot)
            }
        };
        // A size record is in the table before its completion is delivered.
        let record = match (ev, &mut self.table) {
            (WriteEvent::Record { .. }, Some(t)) => {
                let b = t.slot((idx * MAX_RECVS + slot) % (MAX_RECV_REQUESTS * MAX_RECVS));
                Some((get_u64(b, 0), get_u64(b, 8)))
            }
            _ => None,
        };
        let r = self
            .reqs
            .at(idx)
            .filter(|r| slot < r.bufs.len() && !r.land[slot].complete());
        let Some(r) = r else {
            return Err(bad(&self.link, "write completion for no pending buffer"));
        };
        // The check bits are the low bits of the buffer's k: the write is for this posting
        // of the request slot.
        let k = r.ks[slot];
        let in_range = |check: u64| check == k & IMM_CHECK_MASK;
        let land = &mut r.land[slot];
        let fit = match ev {
            WriteEvent::Data {
                size, check, parts, ..
            } => {
                if check.is_some_and(|c| !in_range(c)) {
                    return Err(bad(&self.link, Misfit::Another.what()));
                }
                land.on_data(size, parts)
            }
            WriteEvent::Record { check, .. } => {
                let (size, rk) = record.unwrap_or((u64::MAX, u64::MAX));
                if !in_range(check) || rk != k {
                    return Err(bad(&self.link, Misfit::AnotherRecord.what()));
                }
                land.on_record(size as usize)
            }
        };
        if let Err(m) = fit {
            return Err(bad(&self.link, m.what()));
        }
        // Its message is arriving by RMA: no eager one can be its.
        self.posted.remove(&(r.bufs[slot].tag, k));
        match r.land[slot].settle(r.bufs[slot].len) {
            Ok(true) => r.nfilled += 1,
            Ok(false) => {}
            Err(m) => return Err(bad(&self.link, m.what())),
        }
        Ok(())
    }

    /// Reads every rail's events; whether there were any.
    pub(super) fn poll_cq(&mut self) -> Result<bool> {
        poll_rails(self)
    }

    /// Whether a message the sender has started is only partly here (a stripe or the data
    /// without its size record), so the sender is polling and its rest is due.
    pub(super) fn timed_work(&self) -> bool {
        self.order.iter().any(|id| {
            self.reqs
                .get(*id)
                .is_some_and(|r| r.land[..r.bufs.len()].iter().any(Landing::partial))
        })
    }

    pub(super) fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let mut progressed = false;
        let r = self
            .poll_cq()
            .map(|p| progressed = p)
            .and_then(|()| self.poll_lane())
            .and_then(|()| self.send_deferred(false))
            .and_then(|()| self.flush_cts());
        if let Err(e) = r {
            return Err(self.fail(e));
        }
        if let Some(e) = self.side.poll(&self.link, "sender") {
            return Err(self.fail(e));
        }
        let now = Instant::now();
        let waits = self.order.iter().any(|id| {
            self.reqs
                .get(*id)
                .is_some_and(|r| r.cts_left && r.nfilled < r.bufs.len())
        });
        let seen = RecvSeen {
            progressed,
            timed: self.timed_work(),
            waits,
            probed: self.side.probed,
            eof: self.side.eof,
            open: !self.order.is_empty(),
        };
        let step = self.watch.check(now, &seen);
        if step.settled {
            self.side.probed = None;
        }
        if step.posted {
            let named = self.awaited();
            self.side.send_posted(&named);
        }
        match step.gone {
            None => Ok(()),
            Some(g) => {
                let e = self.watch.error(g, &self.link);
                Err(self.fail(e))
            }
        }
    }

    /// What POSTED names: (tag, k) of each buffer without its whole message of the
    /// receives whose CTS left, oldest first, at most [`POSTED_MAX`].
    pub(super) fn awaited(&self) -> Vec<(i32, u64)> {
        let mut v = Vec::new();
        for r in self.order.iter().filter_map(|id| self.reqs.get(*id)) {
            if !r.cts_left {
                continue;
            }
            for (slot, b) in r.bufs.iter().enumerate() {
                if !r.land[slot].complete() && v.len() < POSTED_MAX {
                    v.push((b.tag, r.ks[slot]));
                }
            }
        }
        v
    }

    /// Posts a receive of up to [`MAX_RECVS`] buffers. `Ok(None)`: busy, retry later.
    ///
    /// # Safety
    /// Every buffer must be writable for its `len` bytes and untouched by anyone else until
    /// [`RecvConn::test`] reports the request done or the connection is dropped.
    pub unsafe fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<RequestId>> {
        // SAFETY: forwarded under the same contract.
        unsafe { self.irecv_mr(bufs, &[]) }
    }

    /// [`RecvConn::irecv`] where buffer `i` lies inside `regs[i]` (from [`RecvConn::reg_mr`];
    /// missing or `None`: looked up in the cache).
    ///
    /// # Safety
    /// As for [`RecvConn::irecv`].
    pub unsafe fn irecv_mr(
        &mut self,
        bufs: &[RecvBuf],
        regs: &[Option<&Registration>],
    ) -> Result<Option<RequestId>> {
        crate::common::check_recv_count(bufs)?;
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        // A CTS slot for this receive and one for each whose CTS waits. Completions are read
        // only when they are short (they free slots): a read costs microseconds, and a receive
        // posted right after the previous one completed is on the ping-pong's latency.
        let full =
            |c: &Self| c.reqs.live() >= MAX_RECV_REQUESTS || c.cts_free.len() <= c.deferred.len();
        if full(self) {
            self.progress()?;
            if full(self) {
                return Ok(None);
            }
        }
        // Per buffer, its registration on every rail (buffer k, rail r at k * rails + r).
        let rails = self.eps.len();
        let mut mrs = Vec::with_capacity(bufs.len() * rails);
        for (i, b) in bufs.iter().enumerate() {
            let given = Registration::covering(
                regs.get(i).copied().flatten(),
                self.id,
                b.ptr as usize,
                b.len,
            );
            for r in 0..rails {
                let m = match given.and_then(|g| g.mrs.get(r)) {
                    Some(m) => m.clone(),
                    None => self.caches[r]
                        .get(self.eps[r].endpoint(), b.ptr as usize, b.len)
                        .map_err(|m| self.fi("fi_mr_reg", m))?,
                };
                mrs.push(m);
            }
        }
        let mut ks = [0u64; MAX_RECVS];
        for (i, b) in bufs.iter().enumerate() {
            let before = bufs[..i].iter().filter(|x| x.tag == b.tag).count() as u64;
            ks[i] = self.next_k.get(&b.tag).copied().unwrap_or(0) + before;
        }
        let Some(id) = self.reqs.insert(RecvReq {
            bufs: bufs.to_vec(),
            ks,
            cts_left: false,
            land: [Landing::default(); MAX_RECVS],
            nfilled: 0,
            _mrs: mrs,
        }) else {
            return Ok(None);
        };
        self.order.push_back(id);
        // Each buffer takes the next k of its tag; a message that came before it lands now.
        for (slot, b) in bufs.iter().enumerate() {
            let k = ks[slot];
            self.next_k.insert(b.tag, k + 1);
            match self.unexpected.remove(&(b.tag, k)) {
                Some(p) => {
                    self.eager_consumed += 1;
                    if let Err(e) = self.place(id, slot, b.tag, p.bytes()) {
                        return Err(self.fail(e));
                    }
                }
                None => {
                    self.posted.insert((b.tag, k), (id, slot));
                }
            }
        }
        if bufs.iter().all(|b| b.len <= EAGER_MAX) {
            // Small: its messages come eagerly if they can; the CTS only when they do not.
            self.deferred.push_back((id, Instant::now() + CTS_DEFER));
        } else {
            // CTS leave in posting order: those still waiting go first.
            if let Err(e) = self.send_deferred(true) {
                return Err(self.fail(e));
            }
            self.send_cts(id);
            // The CTS onto the wire now; completions are read by the next test.
            if let Err(e) = self.flush_cts() {
                return Err(self.fail(e));
            }
        }
        Ok(Some(id))
    }

    /// Queues the CTS of receive `id` (a CTS slot is free: see `irecv`).
    pub(super) fn send_cts(&mut self, id: RequestId) {
        let Some(slot) = self.cts_free.pop() else {
            return;
        };
        let Some(r) = self.reqs.get(id) else {
            self.cts_free.push(slot);
            return;
        };
        let n = r.bufs.len();
        let consumed = self.eager_consumed;
        let virt = self.virt_addr;
        let rails = self.eps.len();
        let b = self.cts.slot(slot);
        put_u32(b, 0, K_CTS);
        put_u32(b, 4, n as u32);
        put_u64(b, 8, 0);
        put_u64(b, 16, consumed);
        put_u32(b, 24, id.index() as u32);
        put_u32(b, 28, 0);
        let size = cts_entry(rails);
        let addr = |rb: &RecvBuf, m: &Mr| {
            if virt {
                rb.ptr as u64
            } else {
                (rb.ptr as usize - m.base) as u64
            }
        };
        for (k, (rb, ms)) in r.bufs.iter().zip(r._mrs.chunks(rails)).enumerate() {
            let at = 32 + k * size;
            put_u64(b, at, addr(rb, &ms[0]));
            put_u64(b, at + 8, ms[0].key());
            put_u64(b, at + 16, rb.len as u64);
            put_u32(b, at + 24, rb.tag as u32);
            // The low 32 bits of the buffer's k (the sender takes the nearest to its own).
            put_u32(b, at + 28, r.ks[k] as u32);
            for (r, m) in ms.iter().enumerate().skip(1) {
                let at = at + CTS_ENTRY + (r - 1) * CTS_RAIL;
                put_u64(b, at, addr(rb, m));
                put_u64(b, at + 8, m.key());
            }
        }
        self.eager_reported = consumed;
        self.cts_sent += 1;
        self.cts_req[slot] = Some(id);
        self.cts_queue.push_back((slot, 32 + size * n));
    }

    /// Small receives whose CTS waits: a complete one never sends it (all its messages came
    /// eagerly); one still incomplete at its time (or at once with `all`) sends it, in posting
    /// order. Then eager credit, when enough is unreported: a CTS of no buffers.
    pub(super) fn send_deferred(&mut self, all: bool) -> Result<()> {
        let now = Instant::now();
        while let Some(&(id, at)) = self.deferred.front() {
            let complete = self.reqs.get(id).is_none_or(|r| r.nfilled == r.bufs.len());
            if complete {
                self.deferred.pop_front();
                continue;
            }
            if !all && now < at {
                break;
            }
            self.deferred.pop_front();
            self.send_cts(id);
        }
        if self.eager_consumed - self.eager_reported >= (EAGER_SLOTS / 2) as u64
            && self.cts_free.len() > self.deferred.len()
            && let Some(slot) = self.cts_free.pop()
        {
            let consumed = self.eager_consumed;
            let b = self.cts.slot(slot);
            put_u32(b, 0, K_CTS);
            put_u32(b, 4, 0);
            put_u64(b, 8, 0);
            put_u64(b, 16, consumed);
            put_u32(b, 24, 0);
            put_u32(b, 28, 0);
            self.eager_reported = consumed;
            // Covers no receive (POSTED names none for it).
            self.cts_req[slot] = None;
            self.cts_queue.push_back((slot, 32));
        }
        Ok(())
    }

    /// CTS with buffers this connection has sent (small receives whose messages all came
    /// eagerly send none).
    pub fn cts_sent(&self) -> u64 {
        self.cts_sent
    }

    /// Whether request `id` is done; the sizes received once it is (the id is then released).
    pub fn test(&mut self, id: RequestId) -> Result<Option<Completed>> {
        self.progress()?;
        let r = self.reqs.tested(id, "receive")?;
        if r.nfilled == r.bufs.len() {
            let c = Completed {
                n: r.bufs.len(),
                sizes: std::array::from_fn(|i| r.land[i].size()),
            };
            self.reqs.remove(id);
            self.order.retain(|x| *x != id);
            return Ok(Some(c));
        }
        Ok(None)
    }
}

impl RailEvents for RecvConn {
    fn ports(&self) -> &[Port] {
        &self.eps
    }

    fn events(&mut self) -> &mut Vec<Event> {
        &mut self.events
    }

    fn on_event(&mut self, ev: Event) -> Result<()> {
        let e = match ev {
            Event::Msg(m) => return self.on_eager(&m),
            Event::MsgData(data, m) => return self.on_eager_data(data, m),
            Event::Done(e) => e,
        };
        if e.flags & sys::FI_REMOTE_CQ_DATA != 0 {
            return self.on_write(e.data);
        }
        if e.op_context.is_null() {
            return Ok(());
        }
        // SAFETY: every context this connection posts is an element of `self.ctx`.
        let id = unsafe { (*e.op_context.cast::<Ctx>()).id };
        let i = (id & 0xffff_ffff) as usize;
        if id >> 32 == C_CTS_TX {
            if let Some(r) = self.cts_req[i % CTS_TX_SLOTS]
                .take()
                .and_then(|id| self.reqs.get_mut(id))
            {
                r.cts_left = true;
            }
            self.cts_free.push(i);
        }
        Ok(())
    }

    fn fi(&self, op: &'static str, m: FiError) -> Error {
        RecvConn::fi(self, op, m)
    }
}

impl Drop for RecvConn {
    fn drop(&mut self) {
        // A failure on the data path may have left the provider mid-message: the endpoint
        // must never be closed (see `SharedEp`'s `Drop`).
        if self.error.as_ref().is_some_and(|e| !e.is_usage()) {
            for p in &self.eps {
                p.taint();
            }
        }
        // Let queued CTS sends finish (bounded) so the endpoint closes with nothing of ours in
        // flight, then drop registrations before the endpoint.
        let deadline = Instant::now() + Duration::from_millis(200);
        while self.error.is_none()
            && !self.region_gone
            && self.cts_free.len() + self.cts_queue.len() < CTS_TX_SLOTS
            && Instant::now() < deadline
        {
            if self.poll_cq().is_err() {
                break;
            }
        }
        self.quiesce();
        // A deregistered region an incomplete receive lands in may be freed memory by now:
        // no more reading of the queues for this connection, and no closing of its
        // endpoints either (libfabric 1.17's tcp;ofi_rxm reads what is pending when it closes).
        if self.region_gone && !self.order.is_empty() {
            for p in &self.eps {
                p.taint();
            }
        }
        // With a receive pending, a sender that went away mid-write may have left the provider
        // a partly received message: let it read the rest and the close (bounded) before the
        // endpoint is closed, which libfabric 1.17's tcp;ofi_rxm does not survive otherwise
        // (SIGSEGV in fi_close).
        let deadline = Instant::now() + DRAIN;
        while !self.region_gone && !self.order.is_empty() && Instant::now() < deadline {
            if self.poll_cq().is_err() {
                break;
            }
        }
        // On a shared endpoint, which stays: if the CTS sends above did not finish, leak what
        // the provider may still use.
        let idle = self.cts_free.len() + self.cts_queue.len() >= CTS_TX_SLOTS;
        if !idle && !self.eps[0].is_private() {
            std::mem::forget(std::mem::take(&mut self.ctx));
            self.cts.leak();
            if let Some(t) = &mut self.table {
                t.leak();
            }
        }
        for c in &mut self.caches {
            c.clear();
        }
    }
}

// SAFETY: the raw pointers in RecvBuf are addresses the caller vouched for in irecv, and the
// endpoint is used by one thread at a time (&mut self).
unsafe impl Send for RecvConn {}
