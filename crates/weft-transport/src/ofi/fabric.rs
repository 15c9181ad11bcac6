//! Safe owners of libfabric objects: the library, a provider's domain, a connection's endpoint
//! (endpoint + completion queue + address vector), memory registrations and their cache.
//!
//! Every `fi_*` "call" here is what the `static inline` function of the same name in the C
//! headers does: a call through the ops table stored in the object.

use std::ffi::{CStr, CString, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::sys::{self, Lib};

/// A libfabric failure: what was asked (a call, loading the library), the provider and
/// domain when one was involved, and libfabric's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FiError {
    /// libfabric could not be loaded, or lacks a symbol weft calls.
    #[error("{library}: {message}")]
    Load {
        /// The library's file name (`WEFT_OFI_LIBRARY` or [`sys::LIB_NAME`]).
        library: String,
        /// The loader's message (with the symbol, for a missing one).
        message: String,
    },
    /// A call returned an error code: `call (provider/domain): message`.
    #[error("{call}{}: {message}", .at.as_ref().map_or(String::new(), |a| format!(" ({a})")))]
    Call {
        /// The call, with its arguments where they say what was asked.
        call: String,
        /// `provider/domain`, when the call was on a domain.
        at: Option<String>,
        /// `fi_strerror` of the code.
        message: String,
    },
    /// A completion reported an error.
    #[error("completion error ({at}): {message} (provider errno {prov_errno})")]
    Completion {
        /// `provider/domain`.
        at: String,
        /// `fi_strerror` of the completion's error.
        message: String,
        /// The provider's own error number.
        prov_errno: c_int,
    },
    /// A failure libfabric gives no message for: an operation the provider's ops table
    /// lacks (`no writedata`), an allocation that failed.
    #[error("{0}")]
    Other(&'static str),
    /// A name handed to libfabric holds a NUL byte.
    #[error("{0} contains NUL")]
    Nul(&'static str),
}

/// An operation missing from a provider's ops table (`ok_or("no send")?`).
impl From<&'static str> for FiError {
    fn from(what: &'static str) -> FiError {
        FiError::Other(what)
    }
}

/// libfabric, opened once per process; `Err` says why it is unavailable.
pub fn lib() -> Result<Arc<Lib>, FiError> {
    static LIB: OnceLock<Result<Arc<Lib>, FiError>> = OnceLock::new();
    LIB.get_or_init(|| {
        let name = std::env::var("WEFT_OFI_LIBRARY")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| sys::LIB_NAME.to_string());
        Lib::open(&name).map(Arc::new)
    })
    .clone()
}

/// What the provider of a domain told us about itself.
#[derive(Debug, Clone)]
pub struct DomainInfo {
    /// e.g. `tcp;ofi_rxm`.
    pub provider: String,
    /// e.g. `eth1`, `lo`, `shm`, `mlx5_0`.
    pub domain: String,
    /// FI_MR_* bits the provider requires.
    pub mr_mode: c_int,
    /// Bytes of remote CQ data.
    pub cq_data_size: usize,
    /// Largest message / RMA.
    pub max_msg_size: usize,
    /// FI_PROGRESS_MANUAL or AUTO.
    pub data_progress: c_int,
    /// Mode bits the provider asked for (FI_CONTEXT, FI_CONTEXT2).
    pub mode: u64,
    /// Whether the provider supports device memory (FI_HMEM).
    pub hmem: bool,
    /// Largest message `fi_inject` takes (0: none).
    pub inject_size: usize,
}

fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's strings in fi_info are NUL-terminated and live as long as the info.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// MR mode bits weft implements (see `MrCache::get`).
pub const MR_MODES_SUPPORTED: c_int = sys::FI_MR_LOCAL
    | sys::FI_MR_VIRT_ADDR
    | sys::FI_MR_ALLOCATED
    | sys::FI_MR_PROV_KEY
    | sys::FI_MR_ENDPOINT;

/// Queries the providers named `provider` for reliable-datagram endpoints with send/receive and
/// RMA write with remote CQ data; returns every domain offered, in the provider's order.
pub fn query(lib: &Arc<Lib>, provider: &str) -> Result<Vec<(DomainInfo, InfoList)>, FiError> {
    // SAFETY: fi_dupinfo(NULL) is fi_allocinfo: a zeroed fi_info with every attr allocated.
    let hints = unsafe { (lib.dupinfo)(ptr::null()) };
    if hints.is_null() {
        return Err(FiError::Other("fi_allocinfo failed"));
    }
    let prov = CString::new(provider).map_err(|_| FiError::Nul("provider name"))?;
    // SAFETY: `hints` and its attrs were allocated by fi_allocinfo above; strings we put in
    // are strdup'ed so that fi_freeinfo can free them.
    unsafe {
        let h = &mut *hints;
        h.caps = sys::FI_MSG
            | sys::FI_RMA
            | sys::FI_SEND
            | sys::FI_RECV
            | sys::FI_WRITE
            | sys::FI_REMOTE_WRITE;
        h.mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
        (*h.ep_attr).type_ = sys::FI_EP_RDM;
        (*h.domain_attr).mr_mode = MR_MODES_SUPPORTED;
        (*h.domain_attr).threading = sys::FI_THREAD_SAFE;
        (*h.tx_attr).msg_order = sys::FI_ORDER_SAS;
        (*h.rx_attr).msg_order = sys::FI_ORDER_SAS;
        (*h.fabric_attr).prov_name = libc::strdup(prov.as_ptr());
    }
    let mut out: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: valid hints; `out` receives a list we own (freed by InfoList).
    let rc = unsafe {
        (lib.getinfo)(
            sys::FI_VERSION_1_17,
            ptr::null(),
            ptr::null(),
            0,
            hints,
            &mut out,
        )
    };
    // SAFETY: hints came from fi_allocinfo and is not used after this.
    unsafe { (lib.freeinfo)(hints) };
    if rc != 0 {
        return Err(FiError::Call {
            call: format!("fi_getinfo({provider}, FI_EP_RDM, FI_MSG|FI_RMA)"),
            at: None,
            message: lib.error_string(rc as isize),
        });
    }
    let mut v = Vec::new();
    let mut p = out;
    while !p.is_null() {
        // SAFETY: `p` walks the list fi_getinfo returned; each entry has its attrs allocated.
        let (info, next) = unsafe {
            let i = &*p;
            let d = &*i.domain_attr;
            let f = &*i.fabric_attr;
            (
                DomainInfo {
                    provider: cstr(f.prov_name),
                    domain: cstr(d.name),
                    mr_mode: d.mr_mode,
                    cq_data_size: d.cq_data_size,
                    max_msg_size: (*i.ep_attr).max_msg_size,
                    data_progress: d.data_progress,
                    mode: i.mode,
                    hmem: i.caps & sys::FI_HMEM != 0,
                    inject_size: if i.tx_attr.is_null() {
                        0
                    } else {
                        (*i.tx_attr).inject_size
                    },
                },
                i.next,
            )
        };
        // SAFETY: dup of one valid entry (fi_dupinfo copies only that entry, next = NULL).
        let one = unsafe { (lib.dupinfo)(p) };
        if !one.is_null() {
            v.push((
                info,
                InfoList {
                    lib: lib.clone(),
                    ptr: one,
                },
            ));
        }
        p = next;
    }
    // SAFETY: the list came from fi_getinfo; the entries we keep were duplicated.
    unsafe { (lib.freeinfo)(out) };
    Ok(v)
}

/// An owned `fi_info` (freed with fi_freeinfo).
pub struct InfoList {
    lib: Arc<Lib>,
    ptr: *mut sys::fi_info,
}

impl Drop for InfoList {
    fn drop(&mut self) {
        // SAFETY: we own the info (from fi_dupinfo) and nothing else refers to it.
        unsafe { (self.lib.freeinfo)(self.ptr) };
    }
}

// SAFETY: the fi_info is plain heap data only read after creation.
unsafe impl Send for InfoList {}
// SAFETY: as above: never written after creation.
unsafe impl Sync for InfoList {}

fn close_fid(f: *mut sys::fid) -> c_int {
    if f.is_null() {
        return 0;
    }
    // SAFETY: `f` is a live libfabric object whose ops table has `close` (fi_close).
    unsafe {
        match (*(*f).ops).close {
            Some(c) => c(f),
            None => 0,
        }
    }
}

/// A provider's fabric and domain, shared by every connection of one device.
pub struct Domain {
    pub lib: Arc<Lib>,
    pub info: DomainInfo,
    fi: InfoList,
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    next_key: AtomicU64,
}

// SAFETY: the domain was opened FI_THREAD_SAFE: libfabric serialises concurrent use itself.
unsafe impl Send for Domain {}
// SAFETY: as above.
unsafe impl Sync for Domain {}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Domain({}/{})", self.info.provider, self.info.domain)
    }
}

impl Domain {
    /// Opens the fabric and domain of one `fi_info` from [`query`].
    pub fn open(info: DomainInfo, fi: InfoList) -> Result<Domain, FiError> {
        let lib = fi.lib.clone();
        let mut fabric: *mut sys::fid_fabric = ptr::null_mut();
        // SAFETY: fabric_attr of a valid info; `fabric` receives a new object.
        let rc = unsafe { (lib.fabric)((*fi.ptr).fabric_attr, &mut fabric, ptr::null_mut()) };
        if rc != 0 {
            return Err(FiError::Call {
                call: "fi_fabric".into(),
                at: None,
                message: lib.error_string(rc as isize),
            });
        }
        let mut domain: *mut sys::fid_domain = ptr::null_mut();
        // SAFETY: fi_domain(fabric, info, &domain, NULL) through the fabric's ops table.
        let rc = unsafe {
            match (*(*fabric).ops).domain {
                Some(f) => f(fabric, fi.ptr, &mut domain, ptr::null_mut()),
                None => -libc::ENOSYS,
            }
        };
        if rc != 0 {
            close_fid(fabric.cast());
            return Err(FiError::Call {
                call: "fi_domain".into(),
                at: None,
                message: lib.error_string(rc as isize),
            });
        }
        Ok(Domain {
            lib,
            info,
            fi,
            fabric,
            domain,
            next_key: AtomicU64::new(1),
        })
    }

    fn err(&self, what: &str, rc: isize) -> FiError {
        FiError::Call {
            call: what.to_string(),
            at: Some(self.at()),
            message: self.lib.error_string(rc),
        }
    }

    /// `provider/domain`, for messages.
    fn at(&self) -> String {
        format!("{}/{}", self.info.provider, self.info.domain)
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        close_fid(self.domain.cast());
        close_fid(self.fabric.cast());
    }
}

/// One completion: the context of the operation, or for a remote write its CQ data.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    /// FI_* flags of the completion.
    pub flags: u64,
    /// `op_context` as given when posting (null for remote writes).
    pub ctx: *mut c_void,
    /// Bytes (receives).
    pub len: usize,
    /// Remote CQ data (remote writes).
    pub data: u64,
}

/// An error completion, or a failure to read the completion queue (`ctx` null).
#[derive(Debug, Clone)]
pub struct CqError {
    /// `op_context` of the failed operation (not ours when `flags` has FI_REMOTE_CQ_DATA).
    pub ctx: *mut c_void,
    /// FI_* flags of the error entry.
    pub flags: u64,
    /// libfabric's message, with provider and domain.
    pub error: FiError,
}

impl CqError {
    fn plain(error: impl Into<FiError>) -> CqError {
        CqError {
            ctx: ptr::null_mut(),
            flags: 0,
            error: error.into(),
        }
    }
}

/// An endpoint with its own completion queue and address vector.
pub struct Endpoint {
    pub dom: Arc<Domain>,
    ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    peer: sys::fi_addr_t,
}

// SAFETY: owned by one connection, which is used by one thread at a time (&mut self); the
// domain is FI_THREAD_SAFE.
unsafe impl Send for Endpoint {}

/// A libfabric failure: the call and libfabric's message.
pub type FiResult<T> = Result<T, FiError>;

impl Endpoint {
    /// Opens an enabled endpoint bound to a fresh CQ (size `cq_size`) and AV.
    pub fn open(dom: &Arc<Domain>, cq_size: usize) -> FiResult<Endpoint> {
        let d = dom.domain;
        let mut e = Endpoint {
            dom: dom.clone(),
            ep: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            peer: sys::FI_ADDR_UNSPEC,
        };
        let mut cq_attr = sys::fi_cq_attr {
            size: cq_size,
            flags: 0,
            format: sys::FI_CQ_FORMAT_DATA,
            wait_obj: sys::FI_WAIT_NONE,
            signaling_vector: 0,
            wait_cond: 0,
            wait_set: ptr::null_mut(),
        };
        // SAFETY: fi_cq_open(domain, &attr, &cq, NULL) through the domain's ops table.
        let rc = unsafe {
            ((*(*d).ops).cq_open.ok_or("no cq_open")?)(d, &mut cq_attr, &mut e.cq, ptr::null_mut())
        };
        if rc != 0 {
            return Err(dom.err("fi_cq_open", rc as isize));
        }
        let mut av_attr = sys::fi_av_attr {
            type_: sys::FI_AV_UNSPEC,
            rx_ctx_bits: 0,
            count: 4,
            ep_per_node: 0,
            name: ptr::null(),
            map_addr: ptr::null_mut(),
            flags: 0,
        };
        // SAFETY: fi_av_open(domain, &attr, &av, NULL).
        let rc = unsafe {
            ((*(*d).ops).av_open.ok_or("no av_open")?)(d, &mut av_attr, &mut e.av, ptr::null_mut())
        };
        if rc != 0 {
            return Err(dom.err("fi_av_open", rc as isize));
        }
        // SAFETY: fi_endpoint(domain, info, &ep, NULL) with the info the domain was opened with.
        let rc = unsafe {
            ((*(*d).ops).endpoint.ok_or("no endpoint")?)(d, dom.fi.ptr, &mut e.ep, ptr::null_mut())
        };
        if rc != 0 {
            return Err(dom.err("fi_endpoint", rc as isize));
        }
        // SAFETY: fi_ep_bind(ep, &cq->fid, FI_TRANSMIT|FI_RECV), fi_ep_bind(ep, &av->fid, 0),
        // fi_enable(ep): calls through the endpoint's fid ops on live objects.
        unsafe {
            let ops = &*(*e.ep).fid.ops;
            let bind = ops.bind.ok_or("no bind")?;
            let rc = bind(e.ep.cast(), e.cq.cast(), sys::FI_TRANSMIT | sys::FI_RECV);
            if rc != 0 {
                return Err(dom.err("fi_ep_bind(cq)", rc as isize));
            }
            let rc = bind(e.ep.cast(), e.av.cast(), 0);
            if rc != 0 {
                return Err(dom.err("fi_ep_bind(av)", rc as isize));
            }
            let rc =
                (ops.control.ok_or("no control")?)(e.ep.cast(), sys::FI_ENABLE, ptr::null_mut());
            if rc != 0 {
                return Err(dom.err("fi_enable", rc as isize));
            }
        }
        Ok(e)
    }

    /// This endpoint's address (fi_getname).
    pub fn name(&self) -> FiResult<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: fi_getname(&ep->fid, buf, &len) writes at most `len` bytes.
        let rc = unsafe {
            ((*(*self.ep).cm).getname.ok_or("no getname")?)(
                self.ep.cast(),
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(self.dom.err("fi_getname", rc as isize));
        }
        buf.truncate(len);
        Ok(buf)
    }

    /// Inserts the peer's address (fi_av_insert); later operations without an address of
    /// their own go to it (without one, receives take messages from any source).
    pub fn set_peer(&mut self, addr: &[u8]) -> FiResult<()> {
        self.peer = self.insert_addr(addr)?;
        Ok(())
    }

    /// Inserts `addr` into the endpoint's address vector (fi_av_insert): its `fi_addr_t`.
    pub fn insert_addr(&self, addr: &[u8]) -> FiResult<sys::fi_addr_t> {
        let mut fa: sys::fi_addr_t = 0;
        // SAFETY: fi_av_insert(av, addr, 1, &fa, 0, NULL): reads one address of the format the
        // provider gave the peer (same provider, checked in the handshake).
        let rc = unsafe {
            ((*(*self.av).ops).insert.ok_or("no av insert")?)(
                self.av,
                addr.as_ptr().cast(),
                1,
                &mut fa,
                0,
                ptr::null_mut(),
            )
        };
        if rc != 1 {
            return Err(self.dom.err("fi_av_insert", rc.min(0) as isize));
        }
        Ok(fa)
    }

    /// fi_recv of `len` bytes at `buf`. `Ok(false)`: FI_EAGAIN, try again after progress.
    ///
    /// # Safety
    /// `buf..buf+len` and `ctx` (a `fi_context2`) stay valid until the completion is read or
    /// the endpoint is closed.
    pub unsafe fn recv(
        &self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        ctx: *mut c_void,
    ) -> FiResult<bool> {
        // SAFETY: per the caller's promise; fi_recv through the endpoint's msg ops.
        let rc = unsafe {
            ((*(*self.ep).msg).recv.ok_or("no recv")?)(
                self.ep,
                buf.cast(),
                len,
                desc,
                self.peer,
                ctx,
            )
        };
        self.posted(rc, "fi_recv")
    }

    /// fi_send of `len` bytes at `buf` to the peer. `Ok(false)`: FI_EAGAIN.
    ///
    /// # Safety
    /// As for [`Endpoint::recv`].
    pub unsafe fn send(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        ctx: *mut c_void,
    ) -> FiResult<bool> {
        // SAFETY: per the caller's promise.
        unsafe { self.send_to(buf, len, desc, self.peer, ctx) }
    }

    /// fi_send of `len` bytes at `buf` to `dest`. `Ok(false)`: FI_EAGAIN.
    ///
    /// # Safety
    /// As for [`Endpoint::recv`].
    pub unsafe fn send_to(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: sys::fi_addr_t,
        ctx: *mut c_void,
    ) -> FiResult<bool> {
        // SAFETY: per the caller's promise; fi_send through the endpoint's msg ops.
        let rc = unsafe {
            ((*(*self.ep).msg).send.ok_or("no send")?)(self.ep, buf.cast(), len, desc, dest, ctx)
        };
        self.posted(rc, "fi_send")
    }

    /// fi_senddata of `len` bytes at `buf` to `dest` with remote CQ `data`. `Ok(false)`:
    /// FI_EAGAIN.
    ///
    /// # Safety
    /// As for [`Endpoint::recv`].
    pub unsafe fn senddata_to(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        data: u64,
        dest: sys::fi_addr_t,
        ctx: *mut c_void,
    ) -> FiResult<bool> {
        // SAFETY: per the caller's promise; fi_senddata through the endpoint's msg ops.
        let rc = unsafe {
            ((*(*self.ep).msg).senddata.ok_or("no senddata")?)(
                self.ep,
                buf.cast(),
                len,
                desc,
                data,
                dest,
                ctx,
            )
        };
        self.posted(rc, "fi_senddata")
    }

    /// fi_inject of `len` bytes at `buf` (at most the provider's inject size): the buffer is
    /// free again on return and no completion is generated. `Ok(false)`: FI_EAGAIN.
    pub fn inject(&self, buf: &[u8]) -> FiResult<bool> {
        // SAFETY: fi_inject through the endpoint's msg ops; it copies `buf` before returning.
        let rc = unsafe {
            ((*(*self.ep).msg).inject.ok_or("no inject")?)(
                self.ep,
                buf.as_ptr().cast(),
                buf.len(),
                self.peer,
            )
        };
        self.posted(rc, "fi_inject")
    }

    /// fi_writedata: writes `len` bytes at `buf` to `addr`/`key` of `dest` with remote CQ
    /// `data`. `Ok(false)`: FI_EAGAIN.
    ///
    /// # Safety
    /// As for [`Endpoint::recv`]; `addr..addr+len` must be inside a registration of the peer.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_data(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        data: u64,
        dest: sys::fi_addr_t,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> FiResult<bool> {
        // SAFETY: per the caller's promise; fi_writedata through the endpoint's rma ops.
        let rc = unsafe {
            ((*(*self.ep).rma).writedata.ok_or("no writedata")?)(
                self.ep,
                buf.cast(),
                len,
                desc,
                data,
                dest,
                addr,
                key,
                ctx,
            )
        };
        self.posted(rc, "fi_writedata")
    }

    fn posted(&self, rc: isize, what: &str) -> FiResult<bool> {
        match rc {
            0 => Ok(true),
            r if r == -sys::FI_EAGAIN => Ok(false),
            r => Err(self.dom.err(what, r)),
        }
    }

    /// Reads up to `out.len()` completions (fi_cq_read), which also drives a manual-progress
    /// provider. An error completion becomes `Err` with libfabric's message.
    pub fn poll(&self, out: &mut [sys::fi_cq_data_entry]) -> FiResult<usize> {
        self.read_cq(out).map_err(|e| e.error)
    }

    /// As [`Endpoint::poll`], with an error completion's context (null when it has none, or
    /// when reading the queue itself failed).
    pub fn read_cq(&self, out: &mut [sys::fi_cq_data_entry]) -> Result<usize, CqError> {
        // SAFETY: fi_cq_read(cq, buf, count) writes at most `count` FI_CQ_FORMAT_DATA entries.
        let rc = unsafe {
            ((*(*self.cq).ops)
                .read
                .ok_or_else(|| CqError::plain("no cq read"))?)(
                self.cq,
                out.as_mut_ptr().cast(),
                out.len(),
            )
        };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        if rc == -sys::FI_EAGAIN {
            return Ok(0);
        }
        if rc == -sys::FI_EAVAIL {
            // SAFETY: an all-zero fi_cq_err_entry is valid (pointers null, ints zero).
            let mut e: sys::fi_cq_err_entry = unsafe { std::mem::zeroed() };
            // SAFETY: fi_cq_readerr(cq, &e, 0) fills one entry.
            let r = unsafe {
                ((*(*self.cq).ops)
                    .readerr
                    .ok_or_else(|| CqError::plain("no cq readerr"))?)(
                    self.cq, &mut e, 0
                )
            };
            if r > 0 {
                return Err(CqError {
                    ctx: e.op_context,
                    flags: e.flags,
                    error: FiError::Completion {
                        at: self.dom.at(),
                        message: self.dom.lib.error_string(e.err as isize),
                        prov_errno: e.prov_errno,
                    },
                });
            }
        }
        Err(CqError::plain(self.dom.err("fi_cq_read", rc)))
    }

    /// Registers `len` bytes at `ptr` for local use and remote writes, honouring the domain's
    /// MR mode (keys chosen by us unless FI_MR_PROV_KEY; bound to this endpoint and enabled
    /// under FI_MR_ENDPOINT).
    pub fn register(&self, ptr: *const u8, len: usize) -> FiResult<Mr> {
        let dom = &self.dom;
        let d = dom.domain;
        let key = if dom.info.mr_mode & sys::FI_MR_PROV_KEY != 0 {
            0
        } else {
            dom.next_key.fetch_add(1, Ordering::Relaxed)
        };
        let access = sys::FI_SEND
            | sys::FI_RECV
            | sys::FI_READ
            | sys::FI_WRITE
            | sys::FI_REMOTE_READ
            | sys::FI_REMOTE_WRITE;
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: fi_mr_reg(domain, buf, len, access, 0, key, 0, &mr, NULL) through the domain's
        // mr ops; the caller keeps the memory mapped while the registration lives.
        let rc = unsafe {
            ((*(*d).mr).reg.ok_or("no mr reg")?)(
                d.cast(),
                ptr.cast(),
                len,
                access,
                0,
                key,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(dom.err("fi_mr_reg", rc as isize));
        }
        let out = Mr {
            mr,
            base: ptr as usize,
            len,
            _dom: dom.clone(),
        };
        if dom.info.mr_mode & sys::FI_MR_ENDPOINT != 0 {
            // SAFETY: fi_mr_bind(mr, &ep->fid, 0) and fi_mr_enable(mr) on live objects.
            unsafe {
                let ops = &*(*mr).fid.ops;
                let rc = (ops.bind.ok_or("no mr bind")?)(mr.cast(), self.ep.cast(), 0);
                if rc != 0 {
                    return Err(dom.err("fi_mr_bind", rc as isize));
                }
                let rc = (ops.control.ok_or("no mr control")?)(
                    mr.cast(),
                    sys::FI_ENABLE,
                    ptr::null_mut(),
                );
                if rc != 0 {
                    return Err(dom.err("fi_mr_enable", rc as isize));
                }
            }
        }
        Ok(out)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        close_fid(self.ep.cast());
        close_fid(self.av.cast());
        close_fid(self.cq.cast());
    }
}

/// One memory registration. It keeps its domain open: a registration handed out (the plugin's
/// `regMr` handle) may outlive the connection that made it.
#[derive(Debug)]
pub struct Mr {
    mr: *mut sys::fid_mr,
    /// Registered range.
    pub base: usize,
    /// Registered length.
    pub len: usize,
    _dom: Arc<Domain>,
}

// SAFETY: a registration is an immutable handle; closing it is done once, by Drop.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// fi_mr_desc: the local descriptor.
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: `mr` is live until Drop.
        unsafe { (*self.mr).mem_desc }
    }
    /// fi_mr_key: the remote key.
    pub fn key(&self) -> u64 {
        // SAFETY: as above.
        unsafe { (*self.mr).key }
    }
    /// Whether `ptr..ptr+len` lies inside.
    pub fn covers(&self, ptr: usize, len: usize) -> bool {
        ptr >= self.base && ptr.saturating_add(len) <= self.base + self.len
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        close_fid(self.mr.cast());
    }
}

/// Most idle registrations a cache keeps; registrations in use are never evicted.
pub const MR_CACHE_CAP: usize = 64;

/// Registration cache of one endpoint: ranges are widened to whole pages, looked up most
/// recently used first, and evicted least recently used once more than [`MR_CACHE_CAP`] exist
/// and nothing in flight uses them. A repeated registration of a cached range costs a short
/// linear scan.
#[derive(Debug, Default)]
pub struct MrCache {
    entries: Vec<Arc<Mr>>,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that registered.
    pub misses: u64,
}

impl MrCache {
    /// The registration covering `ptr..ptr+len`, registering (page-aligned) on a miss.
    pub fn get(&mut self, ep: &Endpoint, ptr: usize, len: usize) -> FiResult<Arc<Mr>> {
        if let Some(i) = self.entries.iter().position(|m| m.covers(ptr, len)) {
            self.hits += 1;
            let m = self.entries.remove(i);
            self.entries.insert(0, m.clone());
            return Ok(m);
        }
        self.misses += 1;
        const PAGE: usize = 4096;
        let start = ptr & !(PAGE - 1);
        let end = ptr
            .saturating_add(len.max(1))
            .div_ceil(PAGE)
            .saturating_mul(PAGE);
        let m = Arc::new(ep.register(start as *const u8, end - start)?);
        self.entries.insert(0, m.clone());
        while self.entries.len() > MR_CACHE_CAP {
            match self.entries.iter().rposition(|m| Arc::strong_count(m) == 1) {
                Some(i) => drop(self.entries.remove(i)),
                None => break,
            }
        }
        Ok(m)
    }

    /// Forgets every cached registration that overlaps `ptr..ptr+len` (its memory is being
    /// deregistered, and may be freed and reused with other pages at the same address): later
    /// lookups register afresh. Registrations still held elsewhere (a request in flight, a
    /// handle) stay valid for their holders. Returns how many entries were dropped.
    pub fn invalidate(&mut self, ptr: usize, len: usize) -> usize {
        let end = ptr.saturating_add(len.max(1));
        let before = self.entries.len();
        self.entries
            .retain(|m| m.base >= end || m.base.saturating_add(m.len) <= ptr);
        before - self.entries.len()
    }

    /// Registrations cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops every registration (before the endpoint closes).
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}
