//! The plugin's one internal API, independent of ncclNet versions: global init/finalize,
//! device properties, and the comm objects behind NCCL's opaque pointers. The per-version tables
//! in `tables` are thin adapters over these functions.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use weft_transport::{
    Config, Connecting, Listener, MAX_RECV_REQUESTS, MAX_RECVS, MAX_SEND_REQUESTS, MemHandle,
    RecvBuf, RecvConn, RequestId, SendConn, Transport,
};

use crate::ffi;
use crate::guard::{PluginError, Result, info, log_in, warn};

struct Global {
    transport: Arc<Transport>,
    inits: usize,
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of our locks is caught at the boundary; the data is plain values
    // that stay consistent, so keep using it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Initialises (or, for v11+ per-communicator inits, references) the global transport.
pub fn init() -> Result<()> {
    let mut g = lock(&GLOBAL);
    if let Some(g) = g.as_mut() {
        g.inits += 1;
        return Ok(());
    }
    let cfg = Config::from_env()?;
    let t = Transport::new(cfg)?;
    let devs: Vec<String> = t
        .devices()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let rails: Vec<String> = d
                .rails
                .iter()
                .map(|r| format!("{}:{}", r.iface, r.addr))
                .collect();
            format!(
                "[{i}]{} ({}, {} Mb/s)",
                d.name,
                rails.join(" "),
                d.speed_mbps
            )
        })
        .collect();
    let c = t.config();
    // Under INIT too, so that plain NCCL_DEBUG=INFO shows which backend moves the data.
    log_in(
        ffi::NCCL_LOG_INFO,
        ffi::NCCL_INIT | ffi::NCCL_NET,
        &format!(
            "Using {}; OOB {}:{}; backend {}; streams {}x{} threads; timeout {:?}",
            devs.join(" "),
            t.mgmt().iface,
            t.mgmt().addr,
            t.backend(),
            c.nsocks_per_thread,
            c.nthreads,
            c.timeout
        ),
    );
    if let Some(note) = t.backend_note() {
        warn(note);
    }
    if t.devices().is_empty() {
        return Err(PluginError::Usage("no data device found".into()));
    }
    *g = Some(Global {
        transport: Arc::new(t),
        inits: 1,
    });
    Ok(())
}

/// Drops one reference; the last one releases the transport.
pub fn finalize() -> Result<()> {
    let mut g = lock(&GLOBAL);
    match g.as_mut() {
        None => Err(PluginError::NotInitialised),
        Some(gl) => {
            gl.inits -= 1;
            if gl.inits == 0 {
                *g = None;
            }
            Ok(())
        }
    }
}

fn transport() -> Result<Arc<Transport>> {
    lock(&GLOBAL)
        .as_ref()
        .map(|g| g.transport.clone())
        .ok_or(PluginError::NotInitialised)
}

/// Number of devices.
pub fn devices() -> Result<usize> {
    Ok(transport()?.devices().len())
}

fn dev_index(dev: i32) -> Result<usize> {
    let n = devices()?;
    usize::try_from(dev)
        .ok()
        .filter(|d| *d < n)
        .ok_or_else(|| PluginError::Usage(format!("device {dev} out of range ({n} devices)")))
}

/// Interned C strings: NCCL keeps the `name`/`pciPath` pointers of the properties, so they live
/// as long as the library.
fn intern(s: &str) -> *mut c_char {
    static STRINGS: Mutex<Option<HashMap<String, CString>>> = Mutex::new(None);
    let mut g = lock(&STRINGS);
    let map = g.get_or_insert_with(HashMap::new);
    map.entry(s.to_string())
        .or_insert_with(|| CString::new(s.replace('\0', "")).unwrap_or_default())
        .as_ptr()
        .cast_mut()
}

/// Version-independent device properties.
#[derive(Debug, Clone, Copy)]
pub struct Props {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub speed: i32,
    pub dev: i32,
}

/// Properties of device `dev`.
pub fn props(dev: i32) -> Result<Props> {
    let t = transport()?;
    let d = &t.devices()[dev_index(dev)?];
    Ok(Props {
        name: intern(&d.name),
        pci_path: d.pci_path.as_deref().map_or(std::ptr::null_mut(), intern),
        guid: d.guid,
        speed: i32::try_from(d.speed_mbps).unwrap_or(i32::MAX),
        dev,
    })
}

/// Largest grouped receive, as advertised in `maxRecvs`.
pub const MAX_RECVS_ADVERTISED: i32 = MAX_RECVS as i32;
/// `maxComms` advertised.
pub const MAX_COMMS: i32 = 65536;

/// Behind a listenComm.
pub struct ListenComm {
    listener: Mutex<Listener>,
}

/// Opens a listener on `dev`, writes the handle.
pub fn listen(dev: i32, handle: *mut c_void, listen_comm: *mut *mut c_void) -> Result<()> {
    if handle.is_null() {
        return Err(PluginError::Null("handle"));
    }
    let t = transport()?;
    let l = t.listen(dev_index(dev)?)?;
    let bytes = l.handle();
    // SAFETY: NCCL's handle buffer is NCCL_NET_HANDLE_MAXSIZE (128) bytes, the size of `bytes`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), handle.cast::<u8>(), bytes.len()) };
    crate::guard::out(
        listen_comm,
        "listenComm",
        crate::guard::into_handle(Box::new(ListenComm {
            listener: Mutex::new(l),
        })),
    )
}

/// Where in the handle an in-progress connect keeps its state between NCCL's retries (the
/// encoded handle uses at most 115 bytes; NCCL passes the same buffer on every retry).
const STAGE_MARK_AT: usize = 116;
const STAGE_PTR_AT: usize = 120;
const STAGE_MARK: [u8; 4] = *b"WCON";
const _: () = assert!(weft_transport::proto::ListenHandle::encoded_len(4) <= STAGE_MARK_AT);

/// Non-blocking connect: `*send_comm` stays NULL until the connection is up.
pub fn connect(dev: i32, handle: *mut c_void, send_comm: *mut *mut c_void) -> Result<()> {
    if handle.is_null() {
        return Err(PluginError::Null("handle"));
    }
    crate::guard::out(send_comm, "sendComm", std::ptr::null_mut())?;
    // SAFETY: NCCL's handle buffer is 128 bytes and not used by anyone else during connect.
    let h = unsafe {
        std::slice::from_raw_parts_mut(handle.cast::<u8>(), ffi::NCCL_NET_HANDLE_MAXSIZE)
    };
    let staged = h[STAGE_MARK_AT..STAGE_MARK_AT + 4] == STAGE_MARK;
    let mut conn: Box<Connecting> = if staged {
        let mut p = [0u8; 8];
        p.copy_from_slice(&h[STAGE_PTR_AT..STAGE_PTR_AT + 8]);
        // SAFETY: the mark says this pointer was written by a previous call below from
        // `Box::into_raw` and not yet reclaimed (we clear the mark whenever we reclaim it).
        unsafe { Box::from_raw(usize::from_ne_bytes(p) as *mut Connecting) }
    } else {
        let t = transport()?;
        Box::new(t.connect(dev_index(dev)?, &h[..STAGE_MARK_AT])?)
    };
    h[STAGE_MARK_AT..STAGE_MARK_AT + 4].fill(0);
    match conn.poll()? {
        Some(c) => {
            let (peer, iface) = c.peer();
            info(&format!(
                "connected to {peer} via {iface}: {} data stream(s), control stream {}",
                c.nstreams(),
                if c.shares_control_stream() {
                    "shared with the connection from that peer"
                } else {
                    "of its own"
                }
            ));
            let comm = SendComm::into_raw(c);
            crate::guard::out(send_comm, "sendComm", comm)
        }
        None => {
            let p = Box::into_raw(conn) as usize;
            h[STAGE_PTR_AT..STAGE_PTR_AT + 8].copy_from_slice(&p.to_ne_bytes());
            h[STAGE_MARK_AT..STAGE_MARK_AT + 4].copy_from_slice(&STAGE_MARK);
            Ok(())
        }
    }
}

/// Non-blocking accept: `*recv_comm` stays NULL until a sender has connected.
pub fn accept(listen_comm: *mut c_void, recv_comm: *mut *mut c_void) -> Result<()> {
    crate::guard::out(recv_comm, "recvComm", std::ptr::null_mut())?;
    // SAFETY: NCCL passes back the listenComm `listen` created, until closeListen.
    let l = unsafe { crate::guard::handle_ref::<ListenComm>(listen_comm, "listenComm")? };
    let mut listener = lock(&l.listener);
    let got = listener.accept();
    // Logged whether or not this call found the real peer, before any error is returned.
    for e in listener.take_discarded() {
        info(&format!(
            "ignored a connection that does not speak weft's protocol: {e}"
        ));
    }
    drop(listener);
    if let Some(c) = got? {
        let (peer, iface) = c.peer();
        info(&format!(
            "accepted {peer} via {iface}: {} data stream(s), control stream {}",
            c.nstreams(),
            if c.shares_control_stream() {
                "shared with the connection to that peer"
            } else {
                "of its own"
            }
        ));
        crate::guard::out(recv_comm, "recvComm", RecvComm::into_raw(c))?;
    }
    Ok(())
}

/// Frees a listenComm.
pub fn close_listen(listen_comm: *mut c_void) -> Result<()> {
    // SAFETY: NCCL calls closeListen once with the pointer `listen` made.
    drop(unsafe { crate::guard::free_handle::<ListenComm>(listen_comm, "listenComm")? });
    Ok(())
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Owner {
    Send(*const SendComm),
    Recv(*const RecvComm),
}

/// What NCCL's `void* request` points at: a slot of its comm, allocated with the comm and
/// freed with it, so a request pointer stays valid until its comm is closed.
pub struct Request {
    owner: Owner,
    id: AtomicU64,
}

/// First field of a [`SendComm`] / [`RecvComm`]: regMr and deregMr get either as `void*`.
const SEND_MAGIC: u64 = u64::from_le_bytes(*b"weftSEND");
const RECV_MAGIC: u64 = u64::from_le_bytes(*b"weftRECV");

/// Behind a sendComm ([`SendComm`]) or a recvComm ([`RecvComm`]). `repr(C)`: `magic` is at
/// offset 0 (see [`comm_ref`]).
#[repr(C)]
pub(crate) struct ConnComm<C> {
    magic: u64,
    conn: Mutex<C>,
    reqs: Vec<Request>,
}

/// Behind a sendComm.
pub(crate) type SendComm = ConnComm<SendConn>;
/// Behind a recvComm.
pub(crate) type RecvComm = ConnComm<RecvConn>;

/// What a [`ConnComm`] of each direction is marked and sized with.
pub(crate) trait Side: Sized {
    /// Its `magic`.
    const MAGIC: u64;
    /// Its request slots.
    const MAX_REQUESTS: usize;
    /// Its slots' owner.
    fn owner(c: *const ConnComm<Self>) -> Owner;
}

impl Side for SendConn {
    const MAGIC: u64 = SEND_MAGIC;
    const MAX_REQUESTS: usize = MAX_SEND_REQUESTS;
    fn owner(c: *const SendComm) -> Owner {
        Owner::Send(c)
    }
}

impl Side for RecvConn {
    const MAGIC: u64 = RECV_MAGIC;
    const MAX_REQUESTS: usize = MAX_RECV_REQUESTS;
    fn owner(c: *const RecvComm) -> Owner {
        Owner::Recv(c)
    }
}

impl<C: Side> ConnComm<C> {
    /// Boxes `c` with its request slots (which point back at the box) into a handle.
    fn into_raw(c: C) -> *mut c_void {
        let mut b = Box::new(ConnComm {
            magic: C::MAGIC,
            conn: Mutex::new(c),
            reqs: Vec::new(),
        });
        let me: *const ConnComm<C> = &*b;
        b.reqs = (0..C::MAX_REQUESTS)
            .map(|_| Request {
                owner: C::owner(me),
                id: AtomicU64::new(0),
            })
            .collect();
        crate::guard::into_handle(b)
    }
}

impl<C> Drop for ConnComm<C> {
    fn drop(&mut self) {
        self.magic = 0;
    }
}

enum CommRef<'a> {
    Send(&'a SendComm),
    Recv(&'a RecvComm),
}

/// The send or receive comm behind a `void*` of regMr/deregMr.
///
/// # Safety
/// `comm` must be NULL or a live sendComm or recvComm (NCCL passes one of its comms).
unsafe fn comm_ref<'a>(comm: *mut c_void) -> Result<CommRef<'a>> {
    if comm.is_null() {
        return Err(PluginError::Null("comm"));
    }
    // SAFETY: per the contract `comm` points at a SendComm or RecvComm; both are `repr(C)`
    // with the u64 magic first, and boxed (so aligned for u64).
    let magic = unsafe { comm.cast::<u64>().read() };
    match magic {
        // SAFETY: the magic says which of the two it is.
        SEND_MAGIC => Ok(CommRef::Send(unsafe { &*comm.cast::<SendComm>() })),
        // SAFETY: as above.
        RECV_MAGIC => Ok(CommRef::Recv(unsafe { &*comm.cast::<RecvComm>() })),
        _ => Err(PluginError::Usage(
            "regMr/deregMr on a pointer that is not a send or receive comm".into(),
        )),
    }
}

/// The registration behind an mhandle NCCL passes to isend/irecv (NULL: none).
///
/// # Safety
/// `mh` must be NULL or a handle of [`reg_mr`] not yet given to [`dereg_mr`].
unsafe fn mem_handle<'a>(mh: *mut c_void) -> Option<&'a MemHandle> {
    if mh.is_null() {
        return None;
    }
    // SAFETY: per the contract, a live `MemReg` made by `reg_mr`.
    Some(&unsafe { &*mh.cast::<MemReg>() }.handle)
}

/// Gives NCCL the slot of request `id` among `reqs` as its `*request` (isend, irecv); for
/// `None` (busy) leaves the NULL already written there.
fn hand_out(reqs: &[Request], id: Option<RequestId>, request: *mut *mut c_void) -> Result<()> {
    if let Some(id) = id {
        let slot = &reqs[id.index()];
        slot.id.store(id.raw(), Ordering::Release);
        crate::guard::out(
            request,
            "request",
            (slot as *const Request).cast_mut().cast(),
        )?;
    }
    Ok(())
}

/// Starts a send; `*request` is NULL when the comm is busy (NCCL retries).
pub fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: i32,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    crate::guard::out(request, "request", std::ptr::null_mut())?;
    // SAFETY: NCCL passes back a sendComm made by `connect`, until closeSend.
    let s = unsafe { crate::guard::handle_ref::<SendComm>(send_comm, "sendComm")? };
    if data.is_null() && size > 0 {
        return Err(PluginError::Null("data"));
    }
    // SAFETY: NCCL passes the mhandle regMr gave it for this buffer (or NULL) and deregisters
    // it only after the request is done.
    let mh = unsafe { mem_handle(mhandle) };
    // SAFETY: NCCL keeps `data..data+size` registered and untouched until test() reports done,
    // and closes the comm (which joins the helper threads) before freeing it.
    let id = unsafe { lock(&s.conn).isend_mr(data.cast::<u8>(), size, tag, mh)? };
    hand_out(&s.reqs, id, request)
}

/// Starts a grouped receive of `n` buffers; `*request` NULL when busy.
pub fn irecv(
    recv_comm: *mut c_void,
    n: i32,
    data: *mut *mut c_void,
    size_of: impl Fn(usize) -> usize,
    tags: *mut i32,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    crate::guard::out(request, "request", std::ptr::null_mut())?;
    // SAFETY: NCCL passes back a recvComm made by `accept`, until closeRecv.
    let r = unsafe { crate::guard::handle_ref::<RecvComm>(recv_comm, "recvComm")? };
    let n = usize::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_RECVS).contains(n));
    let n = n.ok_or_else(|| PluginError::Usage(format!("irecv with n outside 1..={MAX_RECVS}")))?;
    if data.is_null() || tags.is_null() {
        return Err(PluginError::Null("irecv data/tags"));
    }
    let mut bufs = [RecvBuf {
        ptr: std::ptr::null_mut(),
        len: 0,
        tag: 0,
    }; MAX_RECVS];
    let mut mhs: [Option<&MemHandle>; MAX_RECVS] = [None; MAX_RECVS];
    for (i, b) in bufs.iter_mut().enumerate().take(n) {
        // SAFETY: NCCL passes arrays of `n` entries for data, sizes and tags.
        let (p, tag) = unsafe { (*data.add(i), *tags.add(i)) };
        *b = RecvBuf {
            ptr: p.cast(),
            len: size_of(i),
            tag,
        };
        if !mhandles.is_null() {
            // SAFETY: a non-NULL mhandle array has `n` entries, each NULL or a live handle of
            // regMr that NCCL deregisters only after the request is done.
            mhs[i] = unsafe { mem_handle(*mhandles.add(i)) };
        }
    }
    // SAFETY: NCCL keeps the buffers registered and untouched until test() reports done, and
    // closes the comm (joining helper threads) before freeing them.
    let id = unsafe { lock(&r.conn).irecv_mr(&bufs[..n], &mhs[..n])? };
    hand_out(&r.reqs, id, request)
}

/// Polls a request; writes `*done` and, when done, the sizes (one per buffer for receives).
pub fn test(request: *mut c_void, done: *mut i32, sizes: *mut i32) -> Result<()> {
    crate::guard::out(done, "done", 0)?;
    // SAFETY: NCCL passes a request pointer we returned, which points into its comm's slot
    // array; the comm is alive because NCCL never tests after closing it.
    let req = unsafe { crate::guard::handle_ref::<Request>(request, "request")? };
    let id = RequestId::from_raw(req.id.load(Ordering::Acquire));
    let clamp = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    match req.owner {
        Owner::Send(c) => {
            // SAFETY: see above: the owner comm outlives its requests.
            let c = unsafe { &*c };
            if let Some(n) = lock(&c.conn).test(id)? {
                if !sizes.is_null() {
                    // SAFETY: NCCL passes room for one int for a send.
                    unsafe { sizes.write(clamp(n)) };
                }
                crate::guard::out(done, "done", 1)?;
            }
        }
        Owner::Recv(c) => {
            // SAFETY: see above.
            let c = unsafe { &*c };
            if let Some(done_req) = lock(&c.conn).test(id)? {
                if !sizes.is_null() {
                    for (i, s) in done_req.sizes().iter().enumerate() {
                        // SAFETY: NCCL passes room for `n` ints, n being the irecv's count.
                        unsafe { sizes.add(i).write(clamp(*s)) };
                    }
                }
                crate::guard::out(done, "done", 1)?;
            }
        }
    }
    Ok(())
}

/// Closes a send comm: joins its threads, closes its sockets; in-flight requests are dropped.
pub fn close_send(send_comm: *mut c_void) -> Result<()> {
    // SAFETY: NCCL calls closeSend once with the pointer `connect` made.
    let c = unsafe { crate::guard::free_handle::<SendComm>(send_comm, "sendComm")? };
    let peer = lock(&c.conn).peer().0;
    timed_close("send", peer, move || drop(c));
    Ok(())
}

/// Closes a receive comm.
pub fn close_recv(recv_comm: *mut c_void) -> Result<()> {
    // SAFETY: NCCL calls closeRecv once with the pointer `accept` made.
    let c = unsafe { crate::guard::free_handle::<RecvComm>(recv_comm, "recvComm")? };
    let peer = lock(&c.conn).peer().0;
    timed_close("receive", peer, move || drop(c));
    Ok(())
}

/// A close that takes longer than this is logged (INFO): a close waits for the peer's
/// kernel to acknowledge what was sent (bounded), which should take a round trip, and an
/// application that aborts a communicator (NCCL's `ncclCommAbort` after an error) waits for
/// every close in turn.
const SLOW_CLOSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs `close` of a connection with `peer` and logs it when it took longer than
/// [`SLOW_CLOSE`].
fn timed_close(what: &str, peer: std::net::SocketAddr, close: impl FnOnce()) {
    let t0 = std::time::Instant::now();
    close();
    let took = t0.elapsed();
    if took > SLOW_CLOSE {
        crate::guard::info(&format!(
            "closing the {what} connection with {peer} took {took:.2?}"
        ));
    }
}

/// A memory registration of one comm: on the ofi backend a libfabric registration made
/// through the connection's registration cache; TCP needs none (the handle records the range).
pub struct MemReg {
    handle: MemHandle,
}

/// Registers memory; only host memory is supported.
pub fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: i32,
    mhandle: *mut *mut c_void,
) -> Result<()> {
    crate::guard::out(mhandle, "mhandle", std::ptr::null_mut())?;
    if ty != ffi::NCCL_PTR_HOST {
        return Err(PluginError::Usage(format!(
            "regMr of memory type {ty}: weft moves host memory only (ptrSupport=NCCL_PTR_HOST)"
        )));
    }
    if data.is_null() && size > 0 {
        return Err(PluginError::Null("data"));
    }
    let p = data.cast::<u8>().cast_const();
    // SAFETY: NCCL passes one of the comms connect/accept made, until it closes it.
    let handle = match unsafe { comm_ref(comm)? } {
        CommRef::Send(c) => lock(&c.conn).reg_mr(p, size)?,
        CommRef::Recv(c) => lock(&c.conn).reg_mr(p, size)?,
    };
    crate::guard::out(
        mhandle,
        "mhandle",
        crate::guard::into_handle(Box::new(MemReg { handle })),
    )
}

/// Frees a registration: the comm no longer uses any registration of that memory.
pub fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> Result<()> {
    // SAFETY: NCCL deregisters each handle that regMr returned exactly once.
    let reg = unsafe { crate::guard::free_handle::<MemReg>(mhandle, "mhandle")? };
    // SAFETY: NCCL passes the comm the handle was registered with, still open.
    match unsafe { comm_ref(comm)? } {
        CommRef::Send(c) => lock(&c.conn).dereg_mr(reg.handle),
        CommRef::Recv(c) => lock(&c.conn).dereg_mr(reg.handle),
    }
    Ok(())
}

/// Host memory needs no flush: no request.
pub fn iflush(request: *mut *mut c_void) -> Result<()> {
    crate::guard::out(request, "request", std::ptr::null_mut())
}

/// Warns about, and refuses, a call the plugin does not implement.
pub fn unsupported(what: &str) -> Result<()> {
    warn(&format!("{what} is not supported"));
    Err(PluginError::Usage(format!("{what} is not supported")))
}
