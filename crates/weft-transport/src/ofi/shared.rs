//! Endpoints that the connections of a process share, and each connection's [`Port`] on one.
//!
//! NCCL's comms are one-way, so with an endpoint per connection the two directions between two
//! processes are two provider connections (with `tcp;ofi_rxm`, two TCP sockets, each carrying
//! data one way and bare ACKs the other), and a manual-progress provider only moves a
//! connection's bytes while that very connection is polled. On one endpoint per device and
//! process (as `fi_pingpong` and aws-ofi-nccl use theirs), the two directions share one
//! provider connection, and any connection's poll drives them all.
//!
//! Sharing needs everything that arrives routed to its connection:
//! * messages (eager data, CTS) land in the endpoint's one pool of receive buffers (untagged,
//!   from any source, so that matching a message to a buffer is O(1) however many connections
//!   there are) and start with the receiving connection's key ([`KEY_BYTES`]), or, sent with
//!   remote CQ data ([`Port::send_data`]), carry its slot there as writes do;
//! * local completions carry the posting connection's key in their context ([`Ctx::owner`]);
//! * remote writes carry the receiving connection's *slot* on its endpoint in bits
//!   [`SLOT_SHIFT`].. of their 8-byte remote CQ data. With 4 bytes there is no room, so such a
//!   connection gets a *private* endpoint, whose remote writes are all its own.
//!
//! A poll first takes what other connections read for this one (its inbox), then reads the
//! completion queue, keeping its own events, queueing the others' in their inboxes and
//! reposting the pool's buffers, all under one lock, so each connection sees its events in
//! the queue's order. A message with remote CQ data stays in its buffer ([`Held`]) until the
//! receiving connection has copied it where it belongs (at most half the buffers at once);
//! the buffer is posted again by the next poll after that.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::fabric::{CqError, Domain, Endpoint, FiResult, Mr};
use super::sys;

/// Context of one posted operation: the provider's `fi_context2` first, then ours.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct Ctx {
    prov: sys::fi_context2,
    /// What the operation was (kind and index, per connection).
    pub id: u64,
    /// Key of the connection that posted it ([`POOL`] for the endpoint's receive pool).
    pub owner: u64,
}

/// Owner of the endpoint's own receive buffers.
const POOL: u64 = 0;

/// Bytes of the receiving connection's key in front of every message.
pub(super) const KEY_BYTES: usize = 8;

/// Where the receiving connection's slot sits in 8-byte remote CQ data (bits 12..32).
pub(super) const SLOT_SHIFT: u32 = 12;
const SLOT_BITS: u32 = 20;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// Connection keys: unique in the process (0 is the pool's), never reused, so a message for a
/// connection that is gone reaches no later one.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A new connection key.
pub(super) fn new_key() -> u64 {
    NEXT_KEY.fetch_add(1, Ordering::Relaxed)
}

/// What a connection's poll gets, in the order the endpoint saw it.
pub(super) enum Event {
    /// A completion of its own operation, or a remote write to it.
    Done(sys::fi_cq_data_entry),
    /// A message to it, without the key.
    Msg(Vec<u8>),
    /// A message sent with remote CQ data (routed by the slot in it), and that data.
    MsgData(u64, Payload),
}

/// The bytes of a message with remote CQ data: still in the endpoint's receive buffer, or,
/// when the pool is short of buffers, a copy.
pub(super) enum Payload {
    Held(Held),
    Copied(Vec<u8>),
}

impl Payload {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Payload::Held(h) => h.bytes(),
            Payload::Copied(v) => v,
        }
    }

    /// Copies a held message out, so that its receive buffer goes back to the pool (a
    /// message that waits for its receive must not keep one).
    pub fn release(&mut self) {
        if let Payload::Held(h) = self {
            *self = Payload::Copied(h.bytes().to_vec());
        }
    }
}

/// A message read in place from a pool receive buffer, which is not posted again before this
/// is dropped. It saves copying the message before the receiving connection copies it into
/// the caller's buffer.
pub(super) struct Held {
    ep: Arc<SharedEp>,
    index: usize,
    ptr: *const u8,
    len: usize,
}

// SAFETY: `ptr` points into the pool's buffer, owned by `ep` (kept alive here); buffer
// `index` is this value's alone until it is dropped (see `bytes`).
unsafe impl Send for Held {}

impl Held {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies in receive buffer `index` of the pool, whose memory
        // lives as long as `ep`. The buffer is neither idle nor posted while this value
        // exists (`Drop` gives it back), so neither the provider nor another poll writes it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Only the `returned` lock: a `Held` may be dropped with the routes locked.
        self.ep
            .returned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.index);
        self.ep.held.fetch_sub(1, Ordering::Release);
    }
}

enum Routed {
    Event(Event),
    Failed(CqError),
}

/// The endpoint's receive buffers: registered memory, one context per buffer.
struct RxPool {
    buf: Box<[u8]>,
    mr: Mr,
    size: usize,
    ctx: Box<[Ctx]>,
    /// Buffers to post again (the provider had no room).
    idle: Vec<usize>,
}

#[derive(Default)]
struct Routes {
    /// Per registered connection (key), what others read for it, oldest first.
    inbox: HashMap<u64, VecDeque<Routed>>,
    /// Slot (remote CQ data) -> connection key.
    slots: HashMap<u32, u64>,
    next_slot: u32,
    /// `fi_addr_t` per peer address: a peer is inserted once, so that `ofi_rxm` keeps one
    /// connection to it.
    peers: HashMap<Vec<u8>, sys::fi_addr_t>,
}

/// Buried registrations, each with the instant it may go.
type Graves = Mutex<Vec<(std::time::Instant, Vec<Arc<Mr>>)>>;

/// An endpoint, its receive buffers and the routing of what it reads.
pub struct SharedEp {
    /// Dropped first (see `Drop`): closed before the pool's memory goes, and before the
    /// registrations kept in `graves`; never, with them, when `tainted`.
    ep: ManuallyDrop<Endpoint>,
    /// Registrations of receives whose connection closed while its sender might still write
    /// into them (it had not said it stopped): a write that reaches a closed registration
    /// ends the provider's connection to that peer (with `tcp`), which every connection
    /// between the two processes shares. Each is kept until its instant, or until the
    /// endpoint closes.
    graves: ManuallyDrop<Graves>,
    /// One connection only (4-byte remote CQ data): every remote write is its own.
    private: bool,
    routes: ManuallyDrop<Mutex<(Routes, RxPool)>>,
    /// Receive buffers given back by dropped [`Held`] messages, to post again. Locked after
    /// `routes` when both are, never the other way.
    returned: Mutex<Vec<usize>>,
    /// Receive buffers held by [`Held`] messages now.
    held: AtomicUsize,
    /// Most buffers that may be held at once: the rest keep receiving, whoever holds what.
    held_max: usize,
    /// A connection of it failed on the data path (a peer gone, aborted or stalled, maybe
    /// mid-message): the endpoint is never closed, and its memory never freed (see `Drop`).
    tainted: AtomicBool,
}

// SAFETY: the raw pointers in queued completions and contexts are tokens (compared, or read by
// the connection they belong to); the endpoint's domain is FI_THREAD_SAFE and all mutable
// state is behind the mutex.
unsafe impl Send for SharedEp {}
// SAFETY: as above.
unsafe impl Sync for SharedEp {}

impl SharedEp {
    /// Opens an endpoint on `dom` with a completion queue of `cq_size` entries and `slots`
    /// posted receive buffers of `msg_max` bytes (plus the key); `private`: for one
    /// connection.
    pub fn open(
        dom: &Arc<Domain>,
        cq_size: usize,
        slots: usize,
        msg_max: usize,
        private: bool,
    ) -> FiResult<Arc<SharedEp>> {
        let ep = Endpoint::open(dom, cq_size)?;
        let size = KEY_BYTES + msg_max;
        let buf = vec![0u8; slots * size].into_boxed_slice();
        let mr = ep.register(buf.as_ptr(), buf.len())?;
        let mut ctx = vec![Ctx::default(); slots].into_boxed_slice();
        for (i, c) in ctx.iter_mut().enumerate() {
            c.id = i as u64;
            c.owner = POOL;
        }
        let pool = RxPool {
            buf,
            mr,
            size,
            ctx,
            idle: (0..slots).rev().collect(),
        };
        let sh = Arc::new(SharedEp {
            ep: ManuallyDrop::new(ep),
            private,
            routes: ManuallyDrop::new(Mutex::new((Routes::default(), pool))),
            graves: ManuallyDrop::new(Mutex::new(Vec::new())),
            tainted: AtomicBool::new(false),
            returned: Mutex::new(Vec::new()),
            held: AtomicUsize::new(0),
            held_max: slots / 2,
        });
        let mut g = sh.lock();
        sh.post(&mut g.1)?;
        drop(g);
        Ok(sh)
    }

    /// Connections using it.
    pub fn users(&self) -> usize {
        self.lock().0.inbox.len()
    }

    fn lock(&self) -> MutexGuard<'_, (Routes, RxPool)> {
        // A poisoned lock only means another connection panicked while routing; the queues
        // are still consistent (each push or pop is one step).
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Posts the idle receive buffers and those given back, until the provider has no room.
    fn post(&self, pool: &mut RxPool) -> FiResult<()> {
        {
            let mut back = self.returned.lock().unwrap_or_else(|p| p.into_inner());
            pool.idle.append(&mut back);
        }
        while let Some(&i) = pool.idle.last() {
            // Buffer `i` alone: the others may be posted (the provider writes them) or held
            // (another thread reads them).
            let p = pool.buf[i * pool.size..(i + 1) * pool.size].as_mut_ptr();
            let c: *mut Ctx = &mut pool.ctx[i];
            // SAFETY: buffer `i` and its context belong to the pool, which lives as long as
            // the endpoint (closed first, see the field order) and is not touched until the
            // receive completes and `i` is idle again.
            if !unsafe { self.ep.recv(p, pool.size, pool.mr.desc(), c.cast()) }? {
                break;
            }
            pool.idle.pop();
        }
        Ok(())
    }

    /// The connection an entry belongs to: a remote write's by its slot, a local
    /// operation's by its context ([`POOL`] for a message).
    fn owner(&self, r: &Routes, e: &sys::fi_cq_data_entry) -> Option<u64> {
        // A remote write: its `op_context` is not ours and need not be null (`tcp;ofi_rxm`
        // leaves junk there). A message with CQ data is a receive (FI_RECV), into the pool.
        if e.flags & sys::FI_REMOTE_CQ_DATA != 0 && e.flags & sys::FI_RECV == 0 {
            if self.private {
                return r.inbox.keys().next().copied();
            }
            return r
                .slots
                .get(&(((e.data >> SLOT_SHIFT) & SLOT_MASK) as u32))
                .copied();
        }
        if e.op_context.is_null() {
            return None;
        }
        // SAFETY: every context posted on the endpoint is a `Ctx`, alive until its completion
        // is read (the pool's live with the endpoint; a connection that closes waits for its
        // operations, or leaks their memory).
        Some(unsafe { (*e.op_context.cast::<Ctx>()).owner })
    }
}

/// How long the last user of an endpoint lets it take in what is still arriving before it
/// closes it.
const CLOSE_DRAIN: std::time::Duration = std::time::Duration::from_millis(500);

impl Drop for SharedEp {
    /// Before the endpoint closes, its queue is read (what it reads is discarded: every
    /// connection of it is gone) until nothing more arrives on the process's TCP sockets,
    /// bounded: libfabric 1.17's `tcp;ofi_rxm` closes an endpoint that is in the middle of
    /// receiving a message (a peer that went away mid-write, or one still writing) with a
    /// SIGSEGV in `fi_close`; once the provider has read the rest, or the peer's close, it
    /// closes cleanly.
    ///
    /// That is not always enough (a peer that went away mid-write still crashes it now and
    /// then), so an endpoint one of whose connections failed on the data path is not closed
    /// at all: it and its memory are leaked, a bounded cost of a failure, rather than the
    /// process.
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + CLOSE_DRAIN;
        let mut ents = [sys::fi_cq_data_entry::default(); 16];
        let mut quiet = 0;
        while quiet < 3 && std::time::Instant::now() < deadline {
            // An error completion is something that arrived too.
            let got = self.ep.read_cq(&mut ents).unwrap_or(1);
            if got == 0 && super::tcp_unread_bytes() == 0 {
                quiet += 1;
            } else {
                quiet = 0;
            }
        }
        if self.tainted.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: each field is dropped once, here, and not used after (this is `drop`); the
        // endpoint first, so the provider is done with the pool's memory and the buried
        // registrations before they go.
        unsafe {
            ManuallyDrop::drop(&mut self.ep);
            ManuallyDrop::drop(&mut self.routes);
            ManuallyDrop::drop(&mut self.graves);
        }
    }
}

/// A connection's use of a (shared or private) endpoint: its key, its slot (remote writes to
/// it), and its peer.
pub struct Port {
    shared: Arc<SharedEp>,
    /// Domain of the endpoint.
    pub dom: Arc<Domain>,
    key: u64,
    slot: u32,
    peer: sys::fi_addr_t,
    peer_key: u64,
    peer_slot: u32,
}

impl Port {
    /// Registers connection `key` on `shared`.
    pub fn open(shared: &Arc<SharedEp>, key: u64) -> Port {
        let mut g = shared.lock();
        let r = &mut g.0;
        let mut slot = r.next_slot;
        while r.slots.contains_key(&slot) {
            slot = (slot + 1) & SLOT_MASK as u32;
        }
        r.next_slot = (slot + 1) & SLOT_MASK as u32;
        r.slots.insert(slot, key);
        r.inbox.insert(key, VecDeque::new());
        drop(g);
        Port {
            dom: shared.ep.dom.clone(),
            shared: shared.clone(),
            key,
            slot,
            peer: sys::FI_ADDR_UNSPEC,
            peer_key: 0,
            peer_slot: 0,
        }
    }

    /// The peer: its endpoint address, the key of its connection (in front of our messages
    /// to it) and its slot (remote CQ data of our writes to it).
    pub fn connect(&mut self, addr: &[u8], peer_key: u64, peer_slot: u32) -> FiResult<()> {
        let mut g = self.shared.lock();
        let r = &mut g.0;
        let fa = match r.peers.get(addr) {
            Some(&fa) => fa,
            None => {
                let fa = self.shared.ep.insert_addr(addr)?;
                r.peers.insert(addr.to_vec(), fa);
                fa
            }
        };
        self.peer = fa;
        self.peer_key = peer_key;
        self.peer_slot = peer_slot;
        Ok(())
    }

    /// This connection's key.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The peer connection's key (what our messages to it start with).
    pub fn peer_key(&self) -> u64 {
        self.peer_key
    }

    /// This connection's slot on its endpoint.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Remote CQ data bits that route a write to the peer connection (8-byte protocol).
    pub fn peer_slot_bits(&self) -> u64 {
        u64::from(self.peer_slot) << SLOT_SHIFT
    }

    /// The endpoint (registrations).
    pub fn endpoint(&self) -> &Endpoint {
        &self.shared.ep
    }

    /// A connection of the endpoint failed on the data path: never close it (see
    /// `SharedEp`'s `Drop`).
    pub fn taint(&self) {
        self.shared.tainted.store(true, Ordering::Release);
    }

    /// Whether the endpoint is this connection's alone.
    pub fn is_private(&self) -> bool {
        self.shared.private
    }

    /// Connections on the endpoint, this one included.
    pub fn users(&self) -> usize {
        self.shared.users()
    }

    /// Keeps `mrs` registered for `keep` (or until the endpoint closes, if sooner): the
    /// memory of receives that a sender may still write into after their connection closed.
    /// Those kept longer than their time are released now.
    pub fn bury(&self, mrs: Vec<Arc<Mr>>, keep: std::time::Duration) {
        let now = std::time::Instant::now();
        let mut g = self.shared.graves.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|(until, _)| *until > now);
        if !mrs.is_empty() {
            g.push((now + keep, mrs));
        }
    }

    /// The endpoint's address (fi_getname).
    pub fn name(&self) -> FiResult<Vec<u8>> {
        self.shared.ep.name()
    }

    /// Registers memory (see [`Endpoint::register`]).
    pub fn register(&self, ptr: *const u8, len: usize) -> FiResult<Mr> {
        self.shared.ep.register(ptr, len)
    }

    /// Sends a message to the peer; it must start with the peer's key ([`Port::peer_key`]).
    ///
    /// # Safety
    /// As for [`Endpoint::send`]; `ctx` is a [`Ctx`] whose `owner` is this connection's key.
    pub unsafe fn send(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        ctx: *mut c_void,
    ) -> FiResult<bool> {
        // SAFETY: per the caller's promise.
        unsafe { self.shared.ep.send_to(buf, len, desc, self.peer, ctx) }
    }

    /// Sends a message without the key to the peer, with remote CQ `data` that carries the
    /// peer's slot bits ([`Port::peer_slot_bits`]) in place of it.
    ///
    /// # Safety
    /// As for [`Port::send`].
    pub unsafe fn send_data(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        data: u64,
        ctx: *mut c_void,
    ) -> FiResult<bool> {
        // SAFETY: per the caller's promise.
        unsafe {
            self.shared
                .ep
                .senddata_to(buf, len, desc, data, self.peer, ctx)
        }
    }

    /// fi_writedata to the peer (the caller puts the peer's slot bits into `data`).
    ///
    /// # Safety
    /// As for [`Endpoint::write_data`]; `ctx` as for [`Port::send`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_data(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        data: u64,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> FiResult<bool> {
        // SAFETY: per the caller's promise.
        unsafe {
            self.shared
                .ep
                .write_data(buf, len, desc, data, self.peer, addr, key, ctx)
        }
    }

    /// Appends up to `max` events of this connection to `out`: first those other connections
    /// read for it, then from the queue (queueing the others', reposting the receive buffers),
    /// which also drives the provider for every connection on the endpoint. An error
    /// completion of this connection becomes `Err`. Returns how many it appended.
    pub fn poll(&self, out: &mut Vec<Event>, max: usize) -> FiResult<usize> {
        let sh = &self.shared;
        let mut g = sh.lock();
        let (r, pool) = &mut *g;
        let start = out.len();
        // Older than anything in the queue: what others read for us.
        if let Some(q) = r.inbox.get_mut(&self.key) {
            while out.len() - start < max {
                match q.pop_front() {
                    None => break,
                    Some(Routed::Event(e)) => out.push(e),
                    Some(Routed::Failed(e)) if out.len() == start => return Err(e.error),
                    Some(f @ Routed::Failed(_)) => {
                        q.push_front(f);
                        return Ok(out.len() - start);
                    }
                }
            }
        }
        let mut ents = [sys::fi_cq_data_entry::default(); 16];
        while out.len() - start < max {
            let got = match sh.ep.read_cq(&mut ents) {
                Ok(got) => got,
                Err(e) => {
                    // An error without a context of ours (none, or a remote write's, as in
                    // `owner`) is the poller's.
                    let write =
                        e.flags & sys::FI_REMOTE_CQ_DATA != 0 && e.flags & sys::FI_RECV == 0;
                    let ctx = (!e.ctx.is_null() && !write).then_some(e.ctx.cast::<Ctx>());
                    // SAFETY: as in `owner`: a context posted here is a live `Ctx`.
                    let owner = ctx.map_or(self.key, |c| unsafe { (*c).owner });
                    if owner == POOL {
                        // A receive buffer that failed (a message too long for it): whose it
                        // was is unknown, and a lost message is what the stall timer and
                        // POSTED bound. The buffer goes back.
                        // SAFETY: as above.
                        let i = ctx.map_or(0, |c| unsafe { (*c).id }) as usize;
                        pool.idle.push(i);
                        continue;
                    }
                    if owner == self.key {
                        if out.len() == start {
                            return Err(e.error);
                        }
                        if let Some(q) = r.inbox.get_mut(&self.key) {
                            q.push_back(Routed::Failed(e));
                        }
                        return Ok(out.len() - start);
                    }
                    if let Some(q) = r.inbox.get_mut(&owner) {
                        q.push_back(Routed::Failed(e));
                    }
                    continue;
                }
            };
            for e in &ents[..got] {
                let (owner, ev) = match sh.owner(r, e) {
                    Some(POOL) => {
                        // SAFETY: as in `owner`.
                        let i = unsafe { (*e.op_context.cast::<Ctx>()).id } as usize;
                        let at = i * pool.size;
                        let msg = &pool.buf[at..at + e.len.min(pool.size)];
                        let (key, ev) = if e.flags & sys::FI_REMOTE_CQ_DATA != 0 {
                            let slot = ((e.data >> SLOT_SHIFT) & SLOT_MASK) as u32;
                            let key = if sh.private {
                                r.inbox.keys().next().copied()
                            } else {
                                r.slots.get(&slot).copied()
                            };
                            let payload = if sh.held.load(Ordering::Acquire) < sh.held_max {
                                sh.held.fetch_add(1, Ordering::AcqRel);
                                Payload::Held(Held {
                                    ep: Arc::clone(sh),
                                    index: i,
                                    ptr: msg.as_ptr(),
                                    len: msg.len(),
                                })
                            } else {
                                pool.idle.push(i);
                                Payload::Copied(msg.to_vec())
                            };
                            (key, Event::MsgData(e.data, payload))
                        } else {
                            let key = msg
                                .get(..KEY_BYTES)
                                .and_then(|k| k.try_into().ok())
                                .map(u64::from_le_bytes);
                            let body = msg.get(KEY_BYTES..).unwrap_or_default();
                            pool.idle.push(i);
                            (key, Event::Msg(body.to_vec()))
                        };
                        (key, ev)
                    }
                    o => (o, Event::Done(*e)),
                };
                if owner == Some(self.key) && out.len() - start < max {
                    out.push(ev);
                } else if let Some(q) = owner.and_then(|o| r.inbox.get_mut(&o)) {
                    q.push_back(Routed::Event(ev));
                }
                // Else: for a connection that is gone (or no one): dropped.
            }
            if got < ents.len() {
                break;
            }
        }
        sh.post(pool)?;
        Ok(out.len() - start)
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        let mut g = self.shared.lock();
        let r = &mut g.0;
        r.inbox.remove(&self.key);
        if r.slots.get(&self.slot) == Some(&self.key) {
            r.slots.remove(&self.slot);
        }
    }
}
