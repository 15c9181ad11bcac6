//! The sending end of an ofi connection: CTS, sends matched to buffers by (tag, k), eager
//! sends, RMA writes, the close protocol, and the count of this process's unacknowledged TCP
//! bytes.

use super::*;

// Sender

#[derive(Debug, Clone, Copy)]
pub(super) struct CtsEntry {
    /// Per rail: address (or offset) and key of the buffer's registration there.
    pub(super) addr: [u64; MAX_RAILS],
    pub(super) key: [u64; MAX_RAILS],
    pub(super) len: u64,
    pub(super) tag: i32,
    /// The buffer's index among the receiver's buffers of its tag: message (tag, k) is its.
    pub(super) k: u64,
}

/// A receive whose CTS came, while some of its buffers have no message yet.
pub(super) struct Group {
    pub(super) n: usize,
    pub(super) rreq: u32,
    pub(super) entries: [CtsEntry; MAX_RECVS],
    /// Buffers whose message is sent (or went without its buffer, eagerly or early on the
    /// lane); the group is dropped when all are.
    pub(super) assigned: usize,
}

/// A send that waits for the CTS of its buffer, (tag, k).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waiting {
    pub(super) tag: i32,
    pub(super) k: u64,
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) req: RequestId,
    /// Goes over the TCP lane once its buffer is known.
    pub(super) lane: bool,
}

pub(super) struct WriteOp {
    pub(super) rail: usize,
    pub(super) req: RequestId,
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) addr: u64,
    pub(super) key: u64,
    pub(super) data: u64,
    /// Which of the request's write contexts (see [`WRITES_PER_REQ`]).
    pub(super) k: usize,
    /// The size record (from the request's slot of `recs`), not the caller's data.
    pub(super) record: bool,
}

/// Write contexts per send request: the data (one per stripe, at most one per rail), and the
/// size record of the 4-byte protocol (the last).
pub(super) const WRITES_PER_REQ: usize = MAX_RAILS + 1;

pub(super) struct SendReq {
    pub(super) size: usize,
    pub(super) done: bool,
    pub(super) posted: bool,
    /// Writes queued or in flight; the request is done when the last one completes.
    pub(super) writes_left: usize,
    /// The caller's registration (isend_mr), used instead of a cache lookup.
    pub(super) given: Vec<Arc<Mr>>,
    /// Registrations of local memory its writes use, kept until they complete.
    pub(super) _mr: Vec<Arc<Mr>>,
}

/// The sending end of an ofi connection. Its state is split by concern, each part with its
/// own methods and tests: the eager slots and credit ([`EagerSlots`]), how writes spread over
/// the rails ([`Rails`]), the TCP lane ([`LaneSend`]) and what bounds its waits
/// ([`SendWatch`]), which buffer each message goes into ([`Matching`]); the connection
/// drives the provider with them.
pub struct SendConn {
    /// One endpoint per rail; rail 0 also carries CTS, eager messages and size records.
    pub(super) eps: Vec<Port>,
    pub(super) link: Link,
    pub(super) side: Side,
    pub(super) ctx: Box<[Ctx]>,
    /// The registered eager bounce slots (their use: `eager`).
    pub(super) bounce: Pool,
    pub(super) eager: EagerSlots,
    /// Events of one poll (kept for its allocation).
    pub(super) events: Vec<Event>,
    /// Registration cache per rail.
    pub(super) caches: Vec<MrCache>,
    pub(super) reqs: Slab<SendReq>,
    /// Which buffer each message goes into.
    pub(super) matching: Matching,
    pub(super) writes: VecDeque<WriteOp>,
    /// RMA writes handed to the provider whose completion has not been read.
    pub(super) writes_out: usize,
    pub(super) mr_local: bool,
    pub(super) max_msg: usize,
    /// 4-byte protocol: the receiver's size table (address or offset, key).
    pub(super) table: Option<(u64, u64)>,
    /// 4-byte protocol: one registered size record per send request.
    pub(super) recs: Pool,
    pub(super) id: u64,
    pub(super) rails: Rails,
    /// The TCP lane for messages under `WEFT_OFI_MIN_BYTES`.
    pub(super) lane: Option<LaneSend>,
    pub(super) watch: SendWatch,
    pub(super) error: Option<Error>,
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
    pub(super) fn new(
        eps: Vec<Port>,
        link: Link,
        sock: TcpStream,
        peer_slots: u32,
        table: Option<(u64, u64)>,
        stripe: usize,
    ) -> Result<SendConn> {
        let e = |m: FiError| ofi_err(&link, "fi_mr_reg", Stage::Handshake, m);
        let ep = &eps[0];
        let bounce = Pool::messages(ep, EAGER_SLOTS, EAGER_BUF, ep.peer_key()).map_err(e)?;
        let recs = Pool::new(ep, MAX_SEND_REQUESTS, REC).map_err(e)?;
        let key = ep.key();
        let mut ctx = ctx_array(EAGER_SLOTS + MAX_SEND_REQUESTS * WRITES_PER_REQ);
        for (i, c) in ctx.iter_mut().enumerate() {
            c.owner = key;
            c.id = if i < EAGER_SLOTS {
                (C_EAGER_TX << 32) | i as u64
            } else {
                (C_WRITE << 32) | (i - EAGER_SLOTS) as u64
            };
        }
        let info = ep.dom.info.clone();
        let caches = eps.iter().map(|_| MrCache::default()).collect();
        let rails = Rails::new(eps.len(), stripe);
        let watch = SendWatch::new(link.clone(), Duration::from_secs(30), Instant::now());
        let s = SendConn {
            eps,
            link,
            side: Side::new(sock).answering(POSTED_TAG),
            ctx,
            bounce,
            eager: EagerSlots::new(peer_slots),
            caches,
            reqs: Slab::new(MAX_SEND_REQUESTS),
            matching: Matching::default(),
            writes: VecDeque::new(),
            writes_out: 0,
            events: Vec::new(),
            mr_local: info.mr_mode & sys::FI_MR_LOCAL != 0,
            max_msg: info.max_msg_size,
            table,
            recs,
            id: key,
            rails,
            lane: None,
            watch,
            error: None,
        };
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

    /// Bytes of remote CQ data the connection uses (4 or 8).
    pub fn cq_data_bytes(&self) -> usize {
        if self.table.is_some() { 4 } else { 8 }
    }

    /// Registration cache statistics: (hits, misses).
    pub fn mr_stats(&self) -> (u64, u64) {
        stats(&self.caches)
    }

    /// Rails (endpoints) of the connection.
    pub fn rails(&self) -> usize {
        self.eps.len()
    }

    /// Bytes of message data written on each rail so far (RMA writes; eager messages go on
    /// rail 0 and are not counted).
    pub fn rail_bytes(&self) -> Vec<u64> {
        self.rails.bytes()
    }

    /// Connections of this process on the connection's rail-0 endpoint, itself included.
    pub fn endpoint_users(&self) -> usize {
        self.eps[0].users()
    }

    /// Messages sent over the TCP lane so far; `None` without a lane.
    pub fn lane_msgs(&self) -> Option<u64> {
        self.lane.as_ref().map(LaneSend::msgs)
    }

    /// Registers `len` bytes at `ptr` for this connection (NCCL's regMr).
    pub fn reg_mr(&mut self, ptr: *const u8, len: usize) -> Result<Registration> {
        register(&mut self.caches, &self.eps, self.id, ptr as usize, len)
            .map_err(|m| self.fi("fi_mr_reg", m))
    }

    /// Releases a registration of [`SendConn::reg_mr`] (NCCL's deregMr): it and every cached
    /// registration over its range are gone for later operations.
    pub fn dereg_mr(&mut self, reg: Registration) {
        if reg.owner == self.id {
            for c in &mut self.caches {
                c.invalidate(reg.ptr, reg.len);
            }
        }
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

    pub(super) fn on_cts(&mut self, msg: &[u8]) -> Result<()> {
        // Whole entries read as zero past a short message; its kind is checked.
        let mut whole = [0u8; CTS_BUF];
        whole[..msg.len().min(CTS_BUF)].copy_from_slice(&msg[..msg.len().min(CTS_BUF)]);
        let b = &whole[..];
        if msg.len() < 32 || get_u32(b, 0) != K_CTS {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "unknown message",
                    expected: "CTS",
                },
            ));
        }
        let n = (get_u32(b, 4) as usize).min(MAX_RECVS);
        let consumed = get_u64(b, 16);
        let rreq = get_u32(b, 24);
        self.eager.on_consumed(consumed);
        if n == 0 {
            // Eager credit only.
            return Ok(());
        }
        if self.table.is_some() && rreq as usize >= MAX_RECV_REQUESTS {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "CTS with a request index over 63",
                    expected: "CTS",
                },
            ));
        }
        let mut entries = [CtsEntry {
            addr: [0; MAX_RAILS],
            key: [0; MAX_RAILS],
            len: 0,
            tag: 0,
            k: 0,
        }; MAX_RECVS];
        let rails = self.eps.len();
        let size = cts_entry(rails);
        for (i, e) in entries.iter_mut().enumerate().take(n) {
            let at = 32 + i * size;
            e.addr[0] = get_u64(b, at);
            e.key[0] = get_u64(b, at + 8);
            e.len = get_u64(b, at + 16);
            e.tag = get_u32(b, at + 24) as i32;
            // The low 32 bits of k: the buffer is far fewer than 2^31 messages of its tag
            // away from this side's next one.
            e.k = nearest(
                u64::from(get_u32(b, at + 28)),
                32,
                self.matching.next_k(e.tag),
            );
            for r in 1..rails {
                let at = at + CTS_ENTRY + (r - 1) * CTS_RAIL;
                e.addr[r] = get_u64(b, at);
                e.key[r] = get_u64(b, at + 8);
            }
        }
        let gid = self.matching.add_group(n, rreq, entries);
        for (slot, e) in entries.iter().enumerate().take(n) {
            let tk = (e.tag, e.k);
            match self.matching.fate(gid, slot, tk) {
                // Its send waited for this CTS.
                Fate::Start(w) => self.start(w, gid, slot)?,
                // Sent without its buffer (eagerly, or early on the lane): nothing to write;
                // an eager send still in flight is now timed (its receive is posted).
                Fate::Sent => self.eager.cover(tk),
                // For a later isend.
                Fate::Later => {}
            }
        }
        Ok(())
    }

    /// Notes that message (tag, k) was handed over now (for POSTED).
    pub(super) fn log_handed(&mut self, tk: (i32, u64)) {
        self.watch.handed(tk, Instant::now());
    }

    /// Sends `u` into buffer `slot` of group `gid` (its CTS entry is `u`'s (tag, k)): over the
    /// lane with the buffer index, or queues its RMA writes (and size record).
    pub(super) fn start(&mut self, u: Waiting, gid: u64, slot: usize) -> Result<()> {
        let Some((e, grreq)) = self.matching.assign(gid, slot) else {
            return Ok(());
        };
        self.log_handed((u.tag, u.k));
        let peer = self.link.peer;
        let req = u.req;
        if u.len as u64 > e.len {
            return Err(Error::Truncated {
                peer,
                sent: u.len as u64,
                posted: e.len as usize,
                tag: u.tag,
            });
        }
        if u.lane
            && let Some(lane) = &mut self.lane
        {
            let payload = if u.len == 0 {
                &[][..]
            } else {
                // SAFETY: the caller of isend keeps `ptr..ptr+len` readable until the
                // request is done, which is after this copy.
                unsafe { std::slice::from_raw_parts(u.ptr as *const u8, u.len) }
            };
            lane.send(u.k, u.tag, Some(slot), payload, req);
            return Ok(());
        }
        let (rreq, len) = (u64::from(grreq), u.len as u64);
        // Stripes: one per rail from the threshold on, else the whole message on the
        // next rail in turn. The receiver learns their number from the CQ data.
        let stripes = self.rails.split(u.len);
        let parts = stripes.len();
        // Remote CQ data: 8 bytes `size << 32 | receiver's slot << 12 | stripes << 9 |
        // request << 3 | buffer` (stripes 0 meaning 1; the slot is the rail's, added
        // when posted); 4 bytes see IMM_*.
        let parts_field = if parts > 1 { parts as u64 } else { 0 };
        let (data, record) = match self.table {
            None => (
                (len << 32)
                    | (parts_field << W8_PARTS_SHIFT)
                    | (rreq << W8_REQ_SHIFT)
                    | slot as u64,
                None,
            ),
            Some((ta, tk)) => {
                // 4-byte protocol: the size inline when it fits, else in a size record
                // written to the receiver's table (its own completion: the receiver
                // waits for both, so no ordering between the writes is needed). The check
                // bits are the low bits of the buffer's k.
                let base = rreq
                    | ((slot as u64) << IMM_SLOT_SHIFT)
                    | ((u.k & IMM_CHECK_MASK) << IMM_CHECK_SHIFT);
                if parts == 1 && u.len <= IMM_SIZE_MAX {
                    (
                        base | (IMM_SIZED << IMM_KIND_SHIFT) | (len << IMM_SIZE_SHIFT),
                        None,
                    )
                } else {
                    let at = (grreq as usize * MAX_RECVS + slot) * REC;
                    (
                        base | (IMM_DATA << IMM_KIND_SHIFT) | (parts_field << IMM_SIZE_SHIFT),
                        Some(WriteOp {
                            rail: 0,
                            req,
                            ptr: 0,
                            len: REC,
                            addr: ta + at as u64,
                            key: tk,
                            data: base | (IMM_RECORD << IMM_KIND_SHIFT),
                            k: MAX_RAILS,
                            record: true,
                        }),
                    )
                }
            }
        };
        for (k, p) in stripes.enumerate() {
            self.writes.push_back(WriteOp {
                rail: p.rail,
                req,
                ptr: u.ptr + p.off,
                len: p.len,
                addr: e.addr[p.rail] + p.off as u64,
                key: e.key[p.rail],
                data,
                k,
                record: false,
            });
        }
        let mut n = parts;
        if let Some(op) = record {
            let rb = self.recs.slot(req.index());
            put_u64(rb, 0, len);
            put_u64(rb, 8, u.k);
            self.writes.push_back(op);
            n += 1;
        }
        if let Some(r) = self.reqs.get_mut(req) {
            r.writes_left = n;
        }
        Ok(())
    }

    /// Hands queued eager sends to the provider, in order; each is complete at its send
    /// completion, not when the provider takes it: the provider may still need this side's
    /// progress to deliver it (a full socket, `ofi_rxm`'s segmented protocol above its eager
    /// size), and a caller stops testing a request once it is done. For the same reason no
    /// message goes by `fi_inject`, which has no completion to wait for. An eager send is not
    /// `posted` (timed): its receive may not be posted yet.
    pub(super) fn post_eager(&mut self) -> Result<()> {
        while let Some(QueuedEager {
            slot,
            len,
            req: id,
            tag,
            src,
        }) = self.eager.front()
        {
            let desc = self.bounce.mr.desc();
            let c: *mut Ctx = &mut self.ctx[slot];
            let ok = if self.table.is_none() {
                let k = self.eager.k(slot);
                let data = (u64::from(tag as u32) << 32)
                    | self.eps[0].peer_slot_bits()
                    | (k & EAGER_SEQ_MASK);
                // From the caller's buffer, with its registration where the provider wants
                // one (kept until the send completes); an empty message from the bounce slot.
                let (p, desc) = if src == 0 {
                    (self.bounce.slot(slot).as_ptr(), desc)
                } else {
                    let given = self
                        .reqs
                        .get_mut(id)
                        .and_then(|r| r.given.first())
                        .filter(|m| m.covers(src, len))
                        .cloned();
                    let mr = match given {
                        Some(m) => Some(m),
                        None if self.mr_local => Some(
                            self.caches[0]
                                .get(self.eps[0].endpoint(), src, len)
                                .map_err(|m| self.fi("fi_mr_reg", m))?,
                        ),
                        None => None,
                    };
                    let desc = mr.as_ref().map_or(std::ptr::null_mut(), |m| m.desc());
                    if let Some(r) = self.reqs.get_mut(id) {
                        r._mr.extend(mr);
                    }
                    (src as *const u8, desc)
                };
                // SAFETY: the caller of isend keeps its buffer valid, and the bounce slot and
                // context stay untouched, until this send's completion makes the request done
                // and frees the slot (`EagerSlots::completed`); they outlive it (the
                // connection's drop waits for it, or leaks them).
                unsafe { self.eps[0].send_data(p, len, desc, data, c.cast()) }
            } else {
                let p = self.bounce.ptr(slot);
                let n = self.bounce.wire(HDR + len);
                // SAFETY: as above.
                unsafe { self.eps[0].send(p, n, desc, c.cast()) }
            }
            .map_err(|m| self.fi("fi_send", m))?;
            if !ok {
                break;
            }
            self.eager.accepted();
        }
        Ok(())
    }

    pub(super) fn post_writes(&mut self) -> Result<()> {
        while let Some(w) = self.writes.front() {
            let (rail, req, ptr, len) = (w.rail, w.req, w.ptr, w.len);
            let (addr, key, data) = (w.addr, w.key, w.data);
            let c: *mut Ctx = &mut self.ctx[EAGER_SLOTS + req.index() * WRITES_PER_REQ + w.k];
            if w.record {
                let p = self.recs.ptr(req.index());
                let desc = self.recs.mr.desc();
                // SAFETY: the request's record slot is written only by `assign` before this
                // write is queued and not again until the request completes; the remote range
                // is the receiver's size table entry for the buffer its CTS gave this message.
                let ok = unsafe { self.eps[0].write_data(p, len, desc, data, addr, key, c.cast()) }
                    .map_err(|m| self.fi("fi_writedata", m))?;
                if !ok {
                    break;
                }
                self.writes_out += 1;
                self.writes.pop_front();
                continue;
            }
            let given = self
                .reqs
                .get_mut(req)
                .and_then(|r| r.given.get(rail))
                .filter(|m| m.covers(ptr, len))
                .cloned();
            let mr = match given {
                Some(m) => Some(m),
                None if self.mr_local => Some(
                    self.caches[rail]
                        .get(self.eps[rail].endpoint(), ptr, len)
                        .map_err(|m| self.fi("fi_mr_reg", m))?,
                ),
                None => None,
            };
            let desc = mr.as_ref().map_or(std::ptr::null_mut(), |m| m.desc());
            // The 8-byte protocol routes the write to the receiver's connection on its rail.
            let data = if self.table.is_none() {
                data | self.eps[rail].peer_slot_bits()
            } else {
                data
            };
            // SAFETY: the caller of isend keeps `ptr..ptr+len` valid until test reports done,
            // which is after this write's completion; the context lives with the connection;
            // the remote range was announced by the receiver's CTS for this very message.
            let ok = unsafe {
                self.eps[rail].write_data(ptr as *const u8, len, desc, data, addr, key, c.cast())
            }
            .map_err(|m| self.fi("fi_writedata", m))?;
            if !ok {
                break;
            }
            self.writes_out += 1;
            if let Some(r) = self.reqs.get_mut(req) {
                r.posted = true;
                // Kept until the write completes.
                r._mr.extend(mr);
            }
            self.rails.wrote(rail, len);
            self.writes.pop_front();
        }
        Ok(())
    }

    /// Reads every rail's events; whether there were any.
    pub(super) fn poll_cq(&mut self) -> Result<bool> {
        poll_rails(self)
    }

    pub(super) fn work_pending(&self) -> bool {
        self.reqs.values().any(|r| !r.done)
    }

    /// Writes what the lane can take; its sends the kernel has all of are done (see
    /// [`LaneSend`]).
    pub(super) fn flush_lane(&mut self) -> Result<()> {
        let Some(lane) = &mut self.lane else {
            return Ok(());
        };
        let reqs = &mut self.reqs;
        lane.flush(&self.link, |id| {
            if let Some(r) = reqs.get_mut(id) {
                r.done = true;
            }
        })
    }

    /// Whether the sender waits for the completion of data it handed over for a receive the
    /// receiver has posted (so the receiver polls it, and drives its provider): an RMA write
    /// queued or in flight, or an eager send whose message a CTS has covered since. Not an
    /// eager send to a receive not posted yet (with a manual-progress provider it may not
    /// complete until the receiver polls, which it may legitimately do much later), and not
    /// the TCP lane (bounded on its own).
    pub(super) fn timed_work(&self) -> bool {
        !self.writes.is_empty()
            || self.reqs.values().any(|r| r.posted && !r.done)
            || self.eager.timed()
    }

    pub(super) fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let mut progressed = false;
        if let Err(e) = self.poll_cq().map(|p| progressed = p) {
            return Err(self.fail(e));
        }
        // The side channel before anything is posted: a receiver that closed (EOF) gets no
        // more writes, which would reach registrations it is about to close (see
        // [`STOPPED_TAG`]); once none of ours is in flight, it is told so.
        if let Some(e) = self.side.poll(&self.link, "receiver") {
            return Err(self.fail(e));
        }
        if self.side.eof {
            if self.writes_out == 0 {
                self.side.send_stopped();
            }
        } else {
            let r = self
                .post_eager()
                .and_then(|()| self.post_writes())
                .and_then(|()| self.flush_lane());
            if let Err(e) = r {
                return Err(self.fail(e));
            }
        }
        let now = Instant::now();
        // A send waits for a CTS that the receiver says left `timeout` ago?
        let cts_left = self.matching.waits_for_any(&self.side.cts_left);
        // Of the messages the receiver's latest POSTED waits for, those handed over (one we
        // have not sent yet is not lost).
        let posted_sent = self.side.waits_for.take().map_or_else(Vec::new, |ws| {
            ws.into_iter()
                .filter(|&tk| self.matching.handed_over(tk))
                .collect()
        });
        let seen = SendSeen {
            progressed,
            timed: self.timed_work(),
            cts_left,
            posted_sent,
            alive: self.side.take_alive(),
            pending: self.work_pending(),
            eof: self.side.eof,
            lane_written: self.lane.as_ref().map_or(0, LaneSend::written),
        };
        let step = self.watch.check(now, &seen);
        if step.probe {
            self.side.send_probe();
        }
        let e = match step.gone {
            None => return Ok(()),
            Some(Gone::Stalled) => self.watch.timeout(),
            Some(Gone::Closed) => self.link.closed(Stage::Data),
        };
        Err(self.fail(e))
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
        // SAFETY: forwarded under the same contract.
        unsafe { self.isend_mr(data, len, tag, None) }
    }

    /// [`SendConn::isend`] of memory inside `reg` (from [`SendConn::reg_mr`]), whose
    /// registration it uses instead of looking one up.
    ///
    /// # Safety
    /// As for [`SendConn::isend`].
    pub unsafe fn isend_mr(
        &mut self,
        data: *const u8,
        len: usize,
        tag: i32,
        reg: Option<&Registration>,
    ) -> Result<Option<RequestId>> {
        let given = Registration::covering(reg, self.id, data as usize, len)
            .map_or_else(Vec::new, |r| r.mrs.clone());
        // No completion-queue read before the message is handed over: with `tcp;ofi_rxm` a
        // read costs about a microsecond of system calls, all on the message's latency. A CTS
        // that arrived but was not read yet only means the message goes eagerly (into the
        // same buffer, (tag, k), which the receiver then has posted).
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if len > u32::MAX as usize || len > self.max_msg {
            return Err(Error::Usage(format!(
                "message of {len} bytes exceeds the ofi backend's limit ({} bytes)",
                self.max_msg.min(u32::MAX as usize)
            )));
        }
        if self.reqs.live() >= MAX_SEND_REQUESTS {
            // Busy: a caller that retries isend alone must still drive the provider.
            self.progress()?;
            return Ok(None);
        }
        // Message (tag, k) goes into buffer (tag, k): by RMA (or on the lane with its index)
        // when that buffer's CTS is here, else eagerly (or early on the lane) when there is
        // credit, else it waits for that CTS.
        let k = self.matching.next_k(tag);
        let known = self.matching.known((tag, k));
        let early = known.is_none() && self.eager.has_credit();
        let on_lane = self.lane.as_ref().is_some_and(|l| l.carries(len));
        let eager = !on_lane && early && len <= EAGER_MAX && self.eager.has_free();
        // Not `posted` (timed by completions) until its writes are: an eager or lane send is
        // bounded otherwise.
        let Some(id) = self.reqs.insert(SendReq {
            size: len,
            done: false,
            posted: false,
            writes_left: usize::from(!on_lane && !eager),
            // Eager with 8-byte CQ data, or RMA: sent from the caller's buffer, with its
            // registration if any.
            given,
            _mr: Vec::new(),
        }) else {
            return Ok(None);
        };
        self.matching.numbered(tag, k);
        let w = Waiting {
            tag,
            k,
            ptr: data as usize,
            len,
            req: id,
            lane: on_lane,
        };
        if let Some((gid, slot)) = known {
            self.matching.take_known((tag, k));
            if let Err(e) = self.start(w, gid, slot) {
                return Err(self.fail(e));
            }
            self.progress()?;
            return Ok(Some(id));
        }
        if on_lane && early {
            if let Some(lane) = &mut self.lane {
                let payload = if len == 0 {
                    &[][..]
                } else {
                    // SAFETY: the caller guarantees `data..data+len` is readable.
                    unsafe { std::slice::from_raw_parts(data, len) }
                };
                lane.send(k, tag, None, payload, id);
                self.eager.spend_credit();
            }
            self.log_handed((tag, k));
            self.progress()?;
            return Ok(Some(id));
        }
        // With 8-byte remote CQ data an eager message is the payload alone (its CQ data says
        // the rest), so EAGER_MAX bytes fit `ofi_rxm`'s eager size, and it goes straight from
        // the caller's buffer, which stays valid until the send is done (at its completion).
        // Else a header and a copy into the bounce slot first.
        let src = if self.table.is_none() && len > 0 {
            data as usize
        } else {
            0
        };
        if eager && let Some(slot) = self.eager.take((tag, k), len, id, src) {
            if self.table.is_some() {
                let b = self.bounce.slot(slot);
                put_u32(b, 0, K_EAGER);
                put_u32(b, 4, tag as u32);
                put_u64(b, 8, k);
                put_u64(b, 16, len as u64);
                if len > 0 {
                    // SAFETY: the caller guarantees `data..data+len` is readable;
                    // len <= EAGER_MAX.
                    let src = unsafe { std::slice::from_raw_parts(data, len) };
                    b[HDR..HDR + len].copy_from_slice(src);
                }
            }
            self.log_handed((tag, k));
            // Straight onto the wire; completions are read by the next test.
            if let Err(e) = self.post_eager() {
                return Err(self.fail(e));
            }
            return Ok(Some(id));
        }
        self.matching.wait(w);
        self.progress()?;
        Ok(Some(id))
    }

    /// Whether request `id` is done; `Some(bytes)` once it is (the id is then released).
    pub fn test(&mut self, id: RequestId) -> Result<Option<usize>> {
        self.progress()?;
        let r = self.reqs.tested(id, "send")?;
        if r.done {
            let size = r.size;
            self.reqs.remove(id);
            return Ok(Some(size));
        }
        Ok(None)
    }
}

impl RailEvents for SendConn {
    fn ports(&self) -> &[Port] {
        &self.eps
    }

    fn events(&mut self) -> &mut Vec<Event> {
        &mut self.events
    }

    fn on_event(&mut self, ev: Event) -> Result<()> {
        let e = match ev {
            Event::Msg(m) => return self.on_cts(&m),
            Event::MsgData(..) => {
                return Err(self.link.protocol(
                    Stage::Data,
                    proto::FrameError::Unexpected {
                        got: "an eager message",
                        expected: "CTS",
                    },
                ));
            }
            Event::Done(e) => e,
        };
        if e.op_context.is_null() {
            return Ok(());
        }
        // SAFETY: every context this connection posts is an element of `self.ctx`.
        let id = unsafe { (*e.op_context.cast::<Ctx>()).id };
        let i = (id & 0xffff_ffff) as usize;
        match id >> 32 {
            C_EAGER_TX => {
                if let Some(r) = self.eager.completed(i).and_then(|id| self.reqs.get_mut(id)) {
                    r.done = true;
                    r._mr.clear();
                }
            }
            C_WRITE => {
                self.writes_out = self.writes_out.saturating_sub(1);
                if let Some(r) = self.reqs.at(i / WRITES_PER_REQ) {
                    r.writes_left = r.writes_left.saturating_sub(1);
                    if r.writes_left == 0 {
                        r.done = true;
                        r._mr.clear();
                        r.given.clear();
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn fi(&self, op: &'static str, m: FiError) -> Error {
        SendConn::fi(self, op, m)
    }
}

impl Drop for SendConn {
    /// Lets posted operations finish (bounded, 2 s) so that eager messages already reported
    /// complete reach the receiver, then closes the endpoint before its buffers go.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        // A failure on the data path may have left the provider mid-message: the endpoint
        // must never be closed (see `SharedEp`'s `Drop`).
        if self.error.as_ref().is_some_and(|e| !e.is_usage()) {
            for p in &self.eps {
                p.taint();
            }
        }
        // Writes in flight finish (no new ones are posted), and so do eager sends and the
        // lane, unless the receiver closed (EOF): then only the writes, which may still reach
        // its registrations, which it keeps until it hears STOPPED.
        while self.error.is_none()
            && (self.writes_out > 0
                || (!self.side.eof
                    && (self.eager.busy() > 0
                        || self.lane.as_ref().is_some_and(LaneSend::pending))))
            && Instant::now() < deadline
        {
            if self
                .flush_lane()
                .and_then(|()| self.poll_cq())
                .and_then(|_| {
                    if self.side.eof {
                        Ok(())
                    } else {
                        self.post_eager()
                    }
                })
                .is_err()
            {
                break;
            }
            if self.side.poll(&self.link, "receiver").is_some() {
                break;
            }
        }
        if self.writes_out == 0 {
            self.side.send_stopped();
        }
        // A completed send may still sit unacknowledged in a kernel socket of the provider
        // (tcp;ofi_rxm): if this process exits now, closing that socket with bytes unread (the
        // receiver's CTS and acknowledgements) makes the kernel reset it and drop what it has
        // not sent, sends reported done included. So wait, within the same bound, until the
        // peer's kernel has acknowledged every byte of this process's TCP sockets.
        while self.error.is_none() && Instant::now() < deadline && tcp_unacked_bytes() > 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        // The endpoint stays with the other connections: if the sends above did not finish,
        // leak what the provider may still use, registrations of the caller's buffers (eager
        // messages and writes go from them) included.
        let idle = self.eager.busy() == 0 && self.writes_out == 0;
        if !idle && !self.eps[0].is_private() {
            std::mem::forget(std::mem::take(&mut self.ctx));
            self.bounce.leak();
            self.recs.leak();
            std::mem::forget(std::mem::take(&mut self.caches));
            std::mem::forget(std::mem::replace(&mut self.reqs, Slab::new(0)));
        }
        for c in &mut self.caches {
            c.clear();
        }
    }
}

/// Bytes written to this process's TCP sockets that their peers' kernels have not yet
/// acknowledged (`SIOCOUTQ` summed over `/proc/self/fd`): the provider's sockets are not ours
/// to name, so every one counts. 0 when `/proc` is unreadable (nothing to wait for then).
pub(super) fn tcp_unacked_bytes() -> usize {
    tcp_queued(libc::TIOCOUTQ)
}

/// Bytes that have arrived on this process's TCP sockets and are not read yet (`SIOCINQ`
/// summed as in [`tcp_unacked_bytes`]): what a provider still has to take in.
pub(crate) fn tcp_unread_bytes() -> usize {
    tcp_queued(libc::FIONREAD)
}

/// `SIOCOUTQ` or `SIOCINQ` summed over this process's connected TCP sockets.
pub(super) fn tcp_queued(req: libc::Ioctl) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut total = 0usize;
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let is_socket =
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        let mut ty: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: SO_TYPE writes one int through the pointer to a live c_int of `len` bytes; a
        // closed or foreign fd makes it fail, which we skip.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                (&mut ty as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r != 0 || ty != libc::SOCK_STREAM {
            continue;
        }
        // TCP only: a Unix stream socket's queue counts bytes its peer has not read (a
        // provider's wake-up pipe), which no kernel acknowledges.
        let family = sock_family(fd, libc::getsockname);
        if family != Some(libc::AF_INET) && family != Some(libc::AF_INET6) {
            continue;
        }
        let mut n: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (= SIOCOUTQ) and FIONREAD (= SIOCINQ) write one int through the
        // pointer to a live c_int.
        let r = unsafe { libc::ioctl(fd, req, &mut n) };
        if r != 0 || n == 0 {
            continue;
        }
        // Only a connected socket's bytes can still be acknowledged: one that is not (reset,
        // or closed by its peer and shut down) keeps its count for good.
        if sock_family(fd, libc::getpeername).is_some() {
            total += usize::try_from(n).unwrap_or(0);
        }
    }
    total
}

/// The address family of `fd`'s own (`getsockname`) or its peer's (`getpeername`) address;
/// `None` when the call fails (for `getpeername`: the socket is not connected).
fn sock_family(
    fd: libc::c_int,
    call: unsafe extern "C" fn(
        libc::c_int,
        *mut libc::sockaddr,
        *mut libc::socklen_t,
    ) -> libc::c_int,
) -> Option<libc::c_int> {
    // SAFETY: an all-zero sockaddr_storage is a valid value of that plain C struct.
    let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname and getpeername write at most `len` bytes into the live
    // sockaddr_storage and update `len`; a closed or foreign fd makes them fail.
    let r = unsafe {
        call(
            fd,
            (&mut sa as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(libc::c_int::from(sa.ss_family))
}

// SAFETY: as for `RecvConn`: a send connection only holds addresses vouched for in isend.
unsafe impl Send for SendConn {}
