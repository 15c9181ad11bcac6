//! A communicator over the plugin: one send and one receive connection to every other rank,
//! three registered host buffers, and the collectives, built from `isend`/`irecv`/`test` the
//! way NCCL builds them from its primitives.
//!
//! Buffer convention (nccl-tests'): the output is always buffer `B`; out-of-place, the input is
//! buffer `A`; in-place, the input is in `B` where NCCL expects it (all-gather: this rank's piece
//! of `B`; reduce-scatter: the output is this rank's piece of `B`). `T` is scratch.

use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::BenchError;
use crate::bootstrap::Bootstrap;
use crate::dtype::{DataType, RedOp, reduce};
use crate::net::{HANDLE_SIZE, Handle, Plugin};

/// A collective, named as nccl-tests names its binaries (without `_perf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
}

impl Coll {
    /// Every collective.
    pub const ALL: [Coll; 7] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
        Coll::SendRecv,
    ];

    /// `all_reduce`, `alltoall`, ...
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::SendRecv => "sendrecv",
        }
    }

    /// Whether it reduces (has an operation).
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether it has a root.
    pub fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// Whether the size is split into one piece per rank.
    pub fn per_rank_pieces(self) -> bool {
        matches!(self, Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll)
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }
}

crate::dtype::by_name!(Coll);

impl FromStr for Coll {
    type Err = String;
    fn from_str(s: &str) -> Result<Coll, String> {
        let s = s.strip_suffix("_perf").unwrap_or(s).replace('-', "_");
        Ok(match s.as_str() {
            "all_reduce" | "allreduce" => Coll::AllReduce,
            "all_gather" | "allgather" => Coll::AllGather,
            "reduce_scatter" | "reducescatter" => Coll::ReduceScatter,
            "broadcast" | "bcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            "alltoall" | "all_to_all" => Coll::AllToAll,
            "sendrecv" | "send_recv" => Coll::SendRecv,
            _ => {
                return Err(format!(
                    "unknown collective {s:?} (all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv)"
                ));
            }
        })
    }
}

/// How a rooted or reducing collective moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    /// A ring (all-reduce: reduce-scatter then all-gather); a chain for broadcast and reduce.
    Ring,
    /// A binary tree (all-reduce: reduce to rank 0, then broadcast), pipelined in slices.
    Tree,
}

impl FromStr for Algo {
    type Err = String;
    fn from_str(s: &str) -> Result<Algo, String> {
        match s.to_ascii_lowercase().as_str() {
            "ring" => Ok(Algo::Ring),
            "tree" => Ok(Algo::Tree),
            _ => Err(format!("unknown algorithm {s:?} (ring, tree)")),
        }
    }
}

/// One of the communicator's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// Out-of-place input.
    A = 0,
    /// Output (and in-place input).
    B = 1,
    /// Scratch.
    T = 2,
}

struct Region {
    mem: Box<[u64]>,
    /// Memory handles, per send comm then per receive comm (index = peer).
    mh_send: Vec<Handle>,
    mh_recv: Vec<Handle>,
}

impl Region {
    fn base(&mut self) -> *mut u8 {
        self.mem.as_mut_ptr().cast()
    }
}

/// One rank's view of the job.
pub struct Comm {
    plugin: Plugin,
    boot: Bootstrap,
    rank: usize,
    nranks: usize,
    send: Vec<Handle>,
    recv: Vec<Handle>,
    listen: Handle,
    regions: Vec<Region>,
    bytes: usize,
    timeout: Duration,
    tickets: Vec<Option<crate::net::Request>>,
}

// SAFETY: the raw comm pointers are owned by this value alone and used from one thread at a
// time; the plugin's entry points are thread-safe.
unsafe impl Send for Comm {}

/// What connects ranks: the plugin, the bootstrap, sizes and bounds.
pub struct CommOptions {
    /// Largest size (bytes) any buffer will hold.
    pub max_bytes: usize,
    /// Bound on every wait (connect, each transfer).
    pub timeout: Duration,
    /// The plugin's device to use.
    pub dev: usize,
}

impl Comm {
    /// Connects every pair of ranks through `plugin` (handles exchanged over `boot`), allocates
    /// and registers the buffers.
    pub fn new(
        plugin: Plugin,
        mut boot: Bootstrap,
        opts: &CommOptions,
    ) -> Result<Comm, BenchError> {
        let rank = boot.rank();
        let nranks = boot.nranks();
        let ndev = plugin.devices()?;
        if opts.dev >= ndev {
            return Err(BenchError::Plugin(format!(
                "device {} requested, plugin has {ndev}",
                opts.dev
            )));
        }
        let (listen, handle) = plugin.listen(opts.dev)?;
        let handles = boot.allgather(&handle)?;
        let deadline = Instant::now() + opts.timeout;
        let mut send: Vec<Handle> = vec![Handle::NULL; nranks];
        let mut accepted: Vec<Handle> = Vec::new();
        let mut hs: Vec<[u8; HANDLE_SIZE]> = handles
            .iter()
            .map(|h| {
                let mut a = [0u8; HANDLE_SIZE];
                let n = h.len().min(HANDLE_SIZE);
                a[..n].copy_from_slice(&h[..n]);
                a
            })
            .collect();
        // NCCL's loop: keep calling connect and accept until every one has given a comm.
        loop {
            let mut pending = false;
            for p in (0..nranks).filter(|p| *p != rank) {
                if send[p].is_null() {
                    match plugin.connect(opts.dev, &mut hs[p])? {
                        Some(c) => send[p] = c,
                        None => pending = true,
                    }
                }
            }
            if accepted.len() < nranks - 1 {
                if let Some(c) = plugin.accept(listen)? {
                    accepted.push(c);
                }
                pending |= accepted.len() < nranks - 1;
            }
            if !pending {
                break;
            }
            if Instant::now() > deadline {
                let missing: Vec<String> = (0..nranks)
                    .filter(|p| *p != rank && send[*p].is_null())
                    .map(|p| p.to_string())
                    .collect();
                return Err(BenchError::Timeout(format!(
                    "rank {rank}: connections not up within {:?} (connect to ranks [{}] pending, {} of {} accepted)",
                    opts.timeout,
                    missing.join(","),
                    accepted.len(),
                    nranks - 1
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Round the buffers up so the id exchange fits.
        let bytes = opts.max_bytes.max(256 << 10).next_multiple_of(64);
        let mut c = Comm {
            plugin,
            boot,
            rank,
            nranks,
            send,
            recv: accepted,
            listen,
            regions: Vec::new(),
            bytes,
            timeout: opts.timeout,
            tickets: Vec::new(),
        };
        for _ in 0..3 {
            let mem = vec![0u64; bytes / 8].into_boxed_slice();
            let mut r = Region {
                mem,
                mh_send: vec![Handle::NULL; nranks],
                mh_recv: vec![Handle::NULL; nranks],
            };
            let base = r.base();
            for p in 0..nranks {
                if !c.send[p].is_null() {
                    r.mh_send[p] = c.plugin.reg_mr(c.send[p], base, bytes)?;
                }
            }
            // Receive comms are not yet sorted by peer: register by accept order, permute below.
            for (i, rc) in c.recv.iter().enumerate() {
                r.mh_recv[i] = c.plugin.reg_mr(*rc, base, bytes)?;
            }
            c.regions.push(r);
        }
        c.identify_peers()?;
        Ok(c)
    }

    /// The receive comms came from `accept` in arrival order; every rank sends its number first
    /// on each send comm, so each receive comm learns its peer.
    fn identify_peers(&mut self) -> Result<(), BenchError> {
        let (n, me) = (self.nranks, self.rank);
        self.slice(Buf::A, 0, 8)
            .copy_from_slice(&(me as u64).to_le_bytes());
        for p in (0..n).filter(|p| *p != me) {
            self.isend(p, Buf::A, 0, 8)?;
        }
        // Receive comm i (accept order) into T[8i..8i+8]. `irecv_raw` takes the comm index.
        for i in 0..self.recv.len() {
            let comm = self.recv[i];
            let mh = self.regions[Buf::T as usize].mh_recv[i];
            let ptr = self.ptr(Buf::T, 8 * i);
            let deadline = Instant::now() + self.timeout;
            // SAFETY: T[8i..8i+8] lies in T, registered on this comm, and stays untouched until
            // the wait below.
            let req = self.plugin.retry("irecv rank id", deadline, || unsafe {
                self.plugin.irecv(comm, ptr, 8, mh)
            })?;
            self.tickets.push(Some(req));
        }
        self.wait_all()?;
        let mut recv: Vec<Handle> = vec![Handle::NULL; n];
        let mut mhs: Vec<Vec<Handle>> = vec![vec![Handle::NULL; n]; 3];
        for i in 0..self.recv.len() {
            let mut id = [0u8; 8];
            id.copy_from_slice(self.slice(Buf::T, 8 * i, 8));
            let p = u64::from_le_bytes(id) as usize;
            if p >= n || p == self.rank || !recv[p].is_null() {
                return Err(BenchError::Plugin(format!(
                    "rank {}: a connection announced itself as rank {p}",
                    self.rank
                )));
            }
            recv[p] = self.recv[i];
            for (b, m) in mhs.iter_mut().enumerate() {
                m[p] = self.regions[b].mh_recv[i];
            }
        }
        self.recv = recv;
        for (b, m) in mhs.into_iter().enumerate() {
            self.regions[b].mh_recv = m;
        }
        Ok(())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Capacity of each buffer in bytes.
    pub fn capacity(&self) -> usize {
        self.bytes
    }

    /// The bootstrap, for barriers and gathering timings.
    pub fn bootstrap(&mut self) -> &mut Bootstrap {
        &mut self.boot
    }

    fn ptr(&mut self, b: Buf, off: usize) -> *mut u8 {
        debug_assert!(off <= self.bytes);
        // SAFETY: in bounds of the region (checked by callers against `bytes`).
        unsafe { self.regions[b as usize].base().add(off) }
    }

    /// `len` bytes of buffer `b` at `off`, for filling and checking between collectives.
    ///
    /// # Panics
    /// If the range is outside the buffer.
    pub fn slice(&mut self, b: Buf, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.bytes, "{off}+{len} > {}", self.bytes);
        let p = self.ptr(b, off);
        // SAFETY: in bounds (asserted); no request is in flight between collectives, and inside
        // a collective this is only called on ranges no in-flight request touches.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    fn copy(&mut self, from: (Buf, usize), to: (Buf, usize), len: usize) {
        if len == 0 || from == to {
            return;
        }
        assert!(from.1 + len <= self.bytes && to.1 + len <= self.bytes);
        let src = self.ptr(from.0, from.1);
        let dst = self.ptr(to.0, to.1);
        // SAFETY: both ranges are in bounds; `copy` handles overlap.
        unsafe { std::ptr::copy(src, dst, len) };
    }

    fn reduce_into(
        &mut self,
        dt: DataType,
        op: RedOp,
        dst: (Buf, usize),
        src: (Buf, usize),
        len: usize,
    ) {
        assert!(dst.0 != src.0, "reduce within one buffer");
        assert!(src.1 + len <= self.bytes);
        let s = self.ptr(src.0, src.1);
        let d = self.slice(dst.0, dst.1, len);
        // SAFETY: `src` is in bounds of a different buffer than `dst`, so they do not overlap,
        // and no in-flight request writes it.
        let s = unsafe { std::slice::from_raw_parts(s, len) };
        reduce(dt, op, d, s);
    }

    fn isend(&mut self, peer: usize, b: Buf, off: usize, len: usize) -> Result<usize, BenchError> {
        assert!(off + len <= self.bytes);
        let comm = self.send[peer];
        let mh = self.regions[b as usize].mh_send[peer];
        let ptr = self.ptr(b, off);
        self.post(
            || format!("isend of {len} B to rank {peer}"),
            // SAFETY: the range is in a registered buffer and is neither written nor freed
            // until this ticket completes (wait/wait_all before anything touches it).
            |plugin| unsafe { plugin.isend(comm, ptr, len, mh) },
        )
    }

    fn irecv(&mut self, peer: usize, b: Buf, off: usize, len: usize) -> Result<usize, BenchError> {
        assert!(off + len <= self.bytes);
        let comm = self.recv[peer];
        let mh = self.regions[b as usize].mh_recv[peer];
        let ptr = self.ptr(b, off);
        self.post(
            || format!("irecv of {len} B from rank {peer}"),
            // SAFETY: as in `isend`; nothing reads or writes the range until the ticket is done.
            |plugin| unsafe { plugin.irecv(comm, ptr, len, mh) },
        )
    }

    /// Posts a request with `try_post` until the plugin takes it (it answers "not yet"
    /// while it cannot), progressing the other requests meanwhile, bounded by the
    /// communicator's timeout; the posted request's ticket. `what` names it in the error.
    fn post(
        &mut self,
        what: impl Fn() -> String,
        mut try_post: impl FnMut(&Plugin) -> Result<Option<crate::net::Request>, BenchError>,
    ) -> Result<usize, BenchError> {
        let deadline = Instant::now() + self.timeout;
        let req = loop {
            if let Some(r) = try_post(&self.plugin)? {
                break r;
            }
            self.progress()?;
            if Instant::now() > deadline {
                return Err(self.timed_out(&what()));
            }
        };
        self.tickets.push(Some(req));
        Ok(self.tickets.len() - 1)
    }

    fn timed_out(&self, what: &str) -> BenchError {
        BenchError::Timeout(format!(
            "rank {} of {}: {what} not done within {:?}",
            self.rank, self.nranks, self.timeout
        ))
    }

    /// Tests every outstanding request once.
    fn progress(&mut self) -> Result<bool, BenchError> {
        let mut any = false;
        for t in self.tickets.iter_mut() {
            if let Some(r) = *t {
                if self.plugin.test(r)?.is_some() {
                    *t = None;
                } else {
                    any = true;
                }
            }
        }
        Ok(any)
    }

    /// Waits for ticket `t` (progressing all others meanwhile).
    fn wait(&mut self, t: usize) -> Result<(), BenchError> {
        let deadline = Instant::now() + self.timeout;
        let mut spins = 0u32;
        while self.tickets[t].is_some() {
            self.progress()?;
            if Instant::now() > deadline {
                return Err(self.timed_out("transfer"));
            }
            spins += 1;
            if spins > 256 {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(())
    }

    /// Waits for every outstanding request.
    fn wait_all(&mut self) -> Result<(), BenchError> {
        let deadline = Instant::now() + self.timeout;
        let mut spins = 0u32;
        while self.progress()? {
            if Instant::now() > deadline {
                return Err(self.timed_out("transfers"));
            }
            spins += 1;
            if spins > 256 {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        self.tickets.clear();
        Ok(())
    }

    /// Times every link into this rank, one link of the job at a time (so that no other
    /// traffic, not even the acknowledgements of a transfer the other way, shares a host's
    /// link with the one measured): for every ordered pair, after a barrier, the sender sends
    /// `bytes` of `A` and the receiver times their arrival into `T`; `reps` rounds, the best
    /// kept. Returns seconds per sender (index = rank; this rank's own entry 0). Every rank
    /// calls it with the same arguments.
    pub fn probe_links(&mut self, bytes: usize, reps: usize) -> Result<Vec<f64>, BenchError> {
        let (n, r) = (self.nranks, self.rank);
        if bytes == 0 || bytes > self.bytes {
            return Err(BenchError::Usage(format!(
                "link probe of {bytes} B: must be 1 to {} B",
                self.bytes
            )));
        }
        let mut best = vec![f64::INFINITY; n];
        best[r] = 0.0;
        let res = self.probe_rounds(bytes, reps, &mut best);
        if res.is_err() {
            // Leave no request pointing into the buffers.
            self.tickets.clear();
        }
        res.map(|()| best)
    }

    fn probe_rounds(
        &mut self,
        bytes: usize,
        reps: usize,
        best: &mut [f64],
    ) -> Result<(), BenchError> {
        let (n, r) = (self.nranks, self.rank);
        for _ in 0..reps.max(1) {
            for src in 0..n {
                for dst in (0..n).filter(|d| *d != src) {
                    self.boot.barrier()?;
                    if r == src {
                        self.isend(dst, Buf::A, 0, bytes)?;
                        self.wait_all()?;
                    } else if r == dst {
                        let t0 = Instant::now();
                        let t = self.irecv(src, Buf::T, 0, bytes)?;
                        self.wait(t)?;
                        let took = t0.elapsed().as_secs_f64();
                        if let Some(b) = best.get_mut(src) {
                            *b = b.min(took);
                        }
                        self.wait_all()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Bytes actually moved by one call of `coll` with nccl-tests size `bytes`, the per-rank
    /// element count, and the element count nccl-tests prints.
    pub fn shape(&self, coll: Coll, dt: DataType, bytes: usize) -> (usize, usize) {
        let es = dt.size();
        if coll.per_rank_pieces() {
            let per = bytes / (es * self.nranks);
            (per * es * self.nranks, per)
        } else {
            let count = bytes / es;
            (count * es, count)
        }
    }

    /// Runs one collective on `count` elements per rank (per piece for all-gather,
    /// reduce-scatter and all-to-all), following the buffer convention of this module.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        coll: Coll,
        algo: Algo,
        dt: DataType,
        op: RedOp,
        root: usize,
        count: usize,
        in_place: bool,
    ) -> Result<(), BenchError> {
        let es = dt.size();
        let n = self.nranks;
        let r = self.rank;
        let need = if coll.per_rank_pieces() {
            count * n * es
        } else {
            count * es
        };
        if need > self.bytes {
            return Err(BenchError::Usage(format!(
                "{coll} of {need} B exceeds the {} B buffers",
                self.bytes
            )));
        }
        if root >= n {
            return Err(BenchError::Usage(format!("root {root} with {n} ranks")));
        }
        let bytes = count * es;
        let res = match coll {
            Coll::AllReduce => {
                if !in_place {
                    self.copy((Buf::A, 0), (Buf::B, 0), bytes);
                }
                match algo {
                    Algo::Ring => self
                        .ring_reduce_scatter(dt, op, count, 0)
                        .and_then(|()| self.ring_all_gather(dt, count, 1)),
                    Algo::Tree => self
                        .reduce_tree(dt, op, 0, count, true)
                        .and_then(|()| self.bcast_tree(0, bytes, true)),
                }
            }
            Coll::AllGather => {
                if !in_place {
                    self.copy((Buf::A, 0), (Buf::B, r * bytes), bytes);
                }
                self.ring_all_gather(dt, count * n, 0)
            }
            Coll::ReduceScatter => {
                if !in_place {
                    self.copy((Buf::A, 0), (Buf::B, 0), bytes * n);
                }
                let res = self.ring_reduce_scatter(dt, op, count * n, n - 1);
                if !in_place {
                    self.copy((Buf::B, r * bytes), (Buf::B, 0), bytes);
                }
                res
            }
            Coll::Broadcast => {
                if !in_place && r == root {
                    self.copy((Buf::A, 0), (Buf::B, 0), bytes);
                }
                self.bcast_tree(root, bytes, algo == Algo::Tree)
            }
            Coll::Reduce => {
                if !in_place {
                    self.copy((Buf::A, 0), (Buf::B, 0), bytes);
                }
                self.reduce_tree(dt, op, root, count, algo == Algo::Tree)
            }
            Coll::AllToAll => {
                if !in_place {
                    self.copy((Buf::A, 0), (Buf::B, 0), bytes * n);
                }
                self.all_to_all(bytes)
            }
            Coll::SendRecv => {
                if !in_place {
                    self.copy((Buf::A, 0), (Buf::B, 0), bytes);
                }
                let next = (r + 1) % n;
                let prev = (r + n - 1) % n;
                if bytes > 0 && n > 1 {
                    self.irecv(prev, Buf::T, 0, bytes)?;
                    self.isend(next, Buf::B, 0, bytes)?;
                    self.wait_all()?;
                    self.copy((Buf::T, 0), (Buf::B, 0), bytes);
                }
                Ok(())
            }
        };
        if res.is_err() {
            // Leave no request pointing into the buffers we might free.
            self.tickets.clear();
        }
        res
    }

    /// Element range of piece `i` of `count` split `n` ways as evenly as possible.
    fn piece(count: usize, n: usize, i: usize) -> (usize, usize) {
        (i * count / n, (i + 1) * count / n)
    }

    /// Ring reduce-scatter over `count` elements of `B`, in `n` balanced pieces; afterwards this
    /// rank holds the full reduction of piece `(rank + 1 + shift) % n`.
    fn ring_reduce_scatter(
        &mut self,
        dt: DataType,
        op: RedOp,
        count: usize,
        shift: usize,
    ) -> Result<(), BenchError> {
        let (n, r, es) = (self.nranks, self.rank, dt.size());
        if n == 1 {
            return Ok(());
        }
        let next = (r + 1) % n;
        let prev = (r + n - 1) % n;
        let slice = slice_bytes(count * es / n, es);
        for k in 0..n - 1 {
            let s = (r + shift + 2 * n - k) % n;
            let v = (r + shift + 2 * n - k - 1) % n;
            let (s0, s1) = Self::piece(count, n, s);
            let (v0, v1) = Self::piece(count, n, v);
            // Send and receive pieces in the same slices (both ends split alike), reducing
            // each received slice while later ones arrive.
            let mut off = 0;
            while off < (s1 - s0) * es {
                let l = slice.min((s1 - s0) * es - off);
                self.isend(next, Buf::B, s0 * es + off, l)?;
                off += l;
            }
            let len = (v1 - v0) * es;
            let mut tickets = Vec::new();
            let mut off = 0;
            while off < len {
                let l = slice.min(len - off);
                tickets.push((self.irecv(prev, Buf::T, off, l)?, off, l));
                off += l;
            }
            for (t, off, l) in tickets {
                self.wait(t)?;
                self.reduce_into(dt, op, (Buf::B, v0 * es + off), (Buf::T, off), l);
            }
            self.wait_all()?;
        }
        Ok(())
    }

    /// Ring all-gather of `count` elements of `B` in `n` pieces, starting from this rank owning
    /// piece `(rank + shift) % n`.
    fn ring_all_gather(
        &mut self,
        dt: DataType,
        count: usize,
        shift: usize,
    ) -> Result<(), BenchError> {
        let (n, r, es) = (self.nranks, self.rank, dt.size());
        if n == 1 {
            return Ok(());
        }
        let next = (r + 1) % n;
        let prev = (r + n - 1) % n;
        for k in 0..n - 1 {
            let s = (r + shift + n - k) % n;
            let v = (r + shift + 2 * n - k - 1) % n;
            let (s0, s1) = Self::piece(count, n, s);
            let (v0, v1) = Self::piece(count, n, v);
            if v1 > v0 {
                self.irecv(prev, Buf::B, v0 * es, (v1 - v0) * es)?;
            }
            if s1 > s0 {
                self.isend(next, Buf::B, s0 * es, (s1 - s0) * es)?;
            }
            self.wait_all()?;
        }
        Ok(())
    }

    /// Parent and children of this rank in a tree rooted at `root` (binary tree, or a chain).
    fn tree(&self, root: usize, binary: bool) -> (Option<usize>, Vec<usize>) {
        let n = self.nranks;
        let v = (self.rank + n - root) % n;
        let real = |x: usize| (x + root) % n;
        if binary {
            let parent = (v > 0).then(|| real((v - 1) / 2));
            let children = [2 * v + 1, 2 * v + 2]
                .into_iter()
                .filter(|c| *c < n)
                .map(real)
                .collect();
            (parent, children)
        } else {
            let parent = (v > 0).then(|| real(v - 1));
            let children = (v + 1 < n).then(|| real(v + 1)).into_iter().collect();
            (parent, children)
        }
    }

    /// Reduces `count` elements of `B` to `root` along the tree (or chain), in slices.
    fn reduce_tree(
        &mut self,
        dt: DataType,
        op: RedOp,
        root: usize,
        count: usize,
        binary: bool,
    ) -> Result<(), BenchError> {
        let es = dt.size();
        let len = count * es;
        if self.nranks == 1 || len == 0 {
            return Ok(());
        }
        let (parent, children) = self.tree(root, binary);
        let slice = slice_bytes(len, es);
        let nslices = len.div_ceil(slice);
        let slot = |j: usize, ci: usize| ((j % 2) * 2 + ci) * slice;
        let post = |c: &mut Comm, j: usize| -> Result<Vec<usize>, BenchError> {
            let off = j * slice;
            let l = slice.min(len - off);
            let mut ts = Vec::new();
            for (ci, ch) in children.iter().enumerate() {
                ts.push(c.irecv(*ch, Buf::T, slot(j, ci), l)?);
            }
            Ok(ts)
        };
        let mut next = post(self, 0)?;
        for j in 0..nslices {
            let cur = std::mem::take(&mut next);
            if j + 1 < nslices {
                next = post(self, j + 1)?;
            }
            let off = j * slice;
            let l = slice.min(len - off);
            for (ci, t) in cur.into_iter().enumerate() {
                self.wait(t)?;
                self.reduce_into(dt, op, (Buf::B, off), (Buf::T, slot(j, ci)), l);
            }
            if let Some(p) = parent {
                self.isend(p, Buf::B, off, l)?;
            }
        }
        self.wait_all()
    }

    /// Broadcasts `len` bytes of `B` from `root` along the tree (or chain), in slices.
    fn bcast_tree(&mut self, root: usize, len: usize, binary: bool) -> Result<(), BenchError> {
        if self.nranks == 1 || len == 0 {
            return Ok(());
        }
        let (parent, children) = self.tree(root, binary);
        let slice = slice_bytes(len, 1);
        let nslices = len.div_ceil(slice);
        const WINDOW: usize = 4;
        let mut recvs = std::collections::VecDeque::new();
        let mut posted = 0;
        for j in 0..nslices {
            if let Some(p) = parent {
                while posted < nslices && posted < j + WINDOW {
                    let off = posted * slice;
                    recvs.push_back(self.irecv(p, Buf::B, off, slice.min(len - off))?);
                    posted += 1;
                }
                if let Some(t) = recvs.pop_front() {
                    self.wait(t)?;
                }
            }
            let off = j * slice;
            for ch in children.clone() {
                self.isend(ch, Buf::B, off, slice.min(len - off))?;
            }
        }
        self.wait_all()
    }

    /// Pairwise exchange: step k sends piece `rank+k` to rank `rank+k` and receives rank
    /// `rank-k`'s piece for us into `T`; pieces land in `B` at the end.
    fn all_to_all(&mut self, piece: usize) -> Result<(), BenchError> {
        let (n, r) = (self.nranks, self.rank);
        if piece == 0 {
            return Ok(());
        }
        for k in 1..n {
            let to = (r + k) % n;
            let from = (r + n - k) % n;
            self.irecv(from, Buf::T, from * piece, piece)?;
            self.isend(to, Buf::B, to * piece, piece)?;
        }
        self.wait_all()?;
        for p in (0..n).filter(|p| *p != r) {
            self.copy((Buf::T, p * piece), (Buf::B, p * piece), piece);
        }
        Ok(())
    }
}

/// Pipeline slice for `len` bytes: about 1/16 of it, 64 KiB to 4 MiB (at most `len`), whole
/// elements. Four slices fit in `max(len / 4, 256 KiB)`.
fn slice_bytes(len: usize, es: usize) -> usize {
    let s = (len / 16).clamp(64 << 10, 4 << 20).min(len.max(es));
    (s / es).max(1) * es
}

impl Drop for Comm {
    fn drop(&mut self) {
        for r in &self.regions {
            for p in 0..self.nranks {
                if !r.mh_send[p].is_null() {
                    let _ = self.plugin.dereg_mr(self.send[p], r.mh_send[p]);
                }
                if !r.mh_recv[p].is_null() && !self.recv[p].is_null() {
                    let _ = self.plugin.dereg_mr(self.recv[p], r.mh_recv[p]);
                }
            }
        }
        for c in self.send.iter().filter(|c| !c.is_null()) {
            let _ = self.plugin.close_send(*c);
        }
        for c in self.recv.iter().filter(|c| !c.is_null()) {
            let _ = self.plugin.close_recv(*c);
        }
        let _ = self.plugin.close_listen(self.listen);
    }
}
