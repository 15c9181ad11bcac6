//! The NCCL net plugin as NCCL sees it: a shared object opened with `dlopen`, its
//! `ncclNetPlugin_v8` table, and calls shaped like NCCL's (non-blocking connect/accept retried
//! until they give a comm, requests polled with `test`).
//!
//! This is a client-side mirror of NCCL's `net_v8.h`, the same way NCCL itself knows it; the
//! plugin crate owns the server side. v8 is the oldest version every weft plugin exports and
//! every NCCL since 2.19 accepts, so a bench over v8 measures the path real jobs take.

use std::ffi::{CStr, c_char, c_float, c_int, c_ulong, c_void};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::BenchError;

type NcclResult = c_int;
type Comm = *mut c_void;
/// `ncclDebugLogger_t` (variadic; see [`logger`]).
type Logger =
    Option<unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...)>;

/// `NCCL_PTR_HOST`.
const PTR_HOST: c_int = 1;
/// Size of a listen handle (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_SIZE: usize = 128;

#[repr(C)]
struct PropsV8 {
    name: *mut c_char,
    pci_path: *mut c_char,
    guid: u64,
    ptr_support: c_int,
    reg_is_global: c_int,
    speed: c_int,
    port: c_int,
    latency: c_float,
    max_comms: c_int,
    max_recvs: c_int,
    net_device_type: c_int,
    net_device_version: c_int,
}

/// `ncclNet_v8_t`, field for field.
#[repr(C)]
struct NetV8 {
    name: *const c_char,
    init: unsafe extern "C" fn(Logger) -> NcclResult,
    devices: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_properties: unsafe extern "C" fn(c_int, *mut PropsV8) -> NcclResult,
    listen: unsafe extern "C" fn(c_int, *mut c_void, *mut Comm) -> NcclResult,
    connect: unsafe extern "C" fn(c_int, *mut c_void, *mut Comm, *mut *mut c_void) -> NcclResult,
    accept: unsafe extern "C" fn(Comm, *mut Comm, *mut *mut c_void) -> NcclResult,
    reg_mr: unsafe extern "C" fn(Comm, *mut c_void, usize, c_int, *mut *mut c_void) -> NcclResult,
    reg_mr_dma_buf: Option<unsafe extern "C" fn()>,
    dereg_mr: unsafe extern "C" fn(Comm, *mut c_void) -> NcclResult,
    isend:
        unsafe extern "C" fn(Comm, *mut c_void, c_int, c_int, *mut c_void, *mut Comm) -> NcclResult,
    irecv: unsafe extern "C" fn(
        Comm,
        c_int,
        *mut *mut c_void,
        *mut c_int,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> NcclResult,
    iflush: Option<unsafe extern "C" fn()>,
    test: unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> NcclResult,
    close_send: unsafe extern "C" fn(Comm) -> NcclResult,
    close_recv: unsafe extern "C" fn(Comm) -> NcclResult,
    close_listen: unsafe extern "C" fn(Comm) -> NcclResult,
    get_device_mr: Option<unsafe extern "C" fn()>,
    irecv_consumed: Option<unsafe extern "C" fn()>,
}

/// NCCL's logger is variadic; weft's plugin always calls it with fmt `"%s"` and one `char*`,
/// which on the LP64 C ABIs of x86_64 and aarch64 Linux arrives like a sixth fixed argument.
unsafe extern "C" fn logger(
    level: c_int,
    _flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    _fmt: *const c_char,
    msg: *const c_char,
) {
    if msg.is_null() {
        return;
    }
    // SAFETY: the plugin passes a NUL-terminated message as the "%s" argument.
    let m = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    // Called from C: a panic (a tracing layer's, say) must not unwind into the plugin.
    let _ = std::panic::catch_unwind(|| match level {
        0..=2 => {
            tracing::warn!(target: "plugin", "{m}");
            if let Ok(mut w) = LAST_WARN.lock() {
                *w = Some(m.clone().into_owned());
            }
        }
        3 => tracing::debug!(target: "plugin", "{m}"),
        _ => tracing::trace!(target: "plugin", "{m}"),
    });
}

/// The plugin's last WARN, attached to the error of the call that failed.
static LAST_WARN: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

fn logger_ptr() -> Logger {
    // SAFETY: see `logger`: the one argument shape the plugin uses has the same calling
    // convention as this non-variadic function.
    Some(unsafe {
        std::mem::transmute::<
            *const (),
            unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...),
        >(logger as *const ())
    })
}

/// Where to look for `libnccl_net_weft.so` / `libnccl-net-weft.so` when no path is given:
/// `$WEFT_PLUGIN`, then next to the running executable, its `deps/` and `../lib`.
pub fn find_plugin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEFT_PLUGIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let mut dirs = vec![dir.to_path_buf(), dir.join("../lib")];
    if let Some(up) = dir.parent() {
        dirs.push(up.to_path_buf());
    }
    for d in dirs {
        for n in ["libnccl_net_weft.so", "libnccl-net-weft.so"] {
            let p = d.join(n);
            if p.exists() {
                return Some(p);
            }
        }
    }
    None
}

/// One loaded plugin, initialised. Calls are NCCL-shaped; every wait is bounded.
pub struct Plugin {
    table: *const NetV8,
    path: PathBuf,
    _lib: libloading::Library,
}

// SAFETY: the table is immutable static data in the loaded library, which lives as long as
// `Plugin`; the plugin's entry points are thread-safe as NCCL requires.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

/// An opaque plugin object (listen/send/receive comm, or memory handle). Only the plugin makes
/// them, so the safe methods below cannot be handed a stray pointer by a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle(*mut c_void);

impl Handle {
    /// The null handle ("none yet").
    pub const NULL: Handle = Handle(std::ptr::null_mut());

    /// Whether this is the null handle.
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
}

/// A posted send or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request(*mut c_void);

fn ok(r: NcclResult, what: &str, path: &Path) -> Result<(), BenchError> {
    if r == 0 {
        Ok(())
    } else {
        let warn = LAST_WARN.lock().ok().and_then(|mut w| w.take());
        Err(BenchError::Plugin(format!(
            "{what} returned ncclResult {r}{} ({})",
            warn.map_or(String::new(), |w| format!(": {w}")),
            path.display()
        )))
    }
}

impl Plugin {
    /// Opens `path`, takes its `ncclNetPlugin_v8` table and calls `init`.
    pub fn load(path: &Path) -> Result<Plugin, BenchError> {
        // SAFETY: loading a shared object runs its initialisers; the plugin's are Rust statics
        // only. NCCL loads it the same way.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| BenchError::Plugin(format!("dlopen {}: {e}", path.display())))?;
        // SAFETY: the symbol is a static `ncclNet_v8_t`; we only take its address.
        let table = unsafe { lib.get::<*const NetV8>(b"ncclNetPlugin_v8\0") }
            .map(|s| *s)
            .map_err(|e| {
                BenchError::Plugin(format!("{}: no ncclNetPlugin_v8: {e}", path.display()))
            })?;
        let p = Plugin {
            table,
            path: path.to_path_buf(),
            _lib: lib,
        };
        // SAFETY: `table` points at a valid v8 table for the library's lifetime.
        let r = unsafe { ((*p.table).init)(logger_ptr()) };
        ok(r, "init", &p.path)?;
        Ok(p)
    }

    fn t(&self) -> &NetV8 {
        // SAFETY: valid for the library's lifetime, which `self` holds.
        unsafe { &*self.table }
    }

    /// The plugin's name (`weft`).
    pub fn name(&self) -> String {
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(self.t().name) }
            .to_string_lossy()
            .into_owned()
    }

    /// Number of network devices.
    pub fn devices(&self) -> Result<usize, BenchError> {
        let mut n = 0;
        // SAFETY: NCCL-shaped call with a valid out pointer.
        ok(unsafe { (self.t().devices)(&mut n) }, "devices", &self.path)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Name and speed (Mb/s) of device `dev`.
    pub fn properties(&self, dev: usize) -> Result<(String, i32), BenchError> {
        // SAFETY: zeroed memory is a valid value for this plain C struct; the plugin fills it.
        let mut p: PropsV8 = unsafe { std::mem::zeroed() };
        // SAFETY: NCCL-shaped call.
        let r = unsafe { (self.t().get_properties)(dev as c_int, &mut p) };
        ok(r, "getProperties", &self.path)?;
        let name = if p.name.is_null() {
            String::new()
        } else {
            // SAFETY: the plugin keeps its names alive for the library's lifetime.
            unsafe { CStr::from_ptr(p.name) }
                .to_string_lossy()
                .into_owned()
        };
        Ok((name, p.speed))
    }

    /// Opens a listener on `dev`; returns the listen comm and its handle.
    pub fn listen(&self, dev: usize) -> Result<(Handle, [u8; HANDLE_SIZE]), BenchError> {
        let mut handle = [0u8; HANDLE_SIZE];
        let mut lc: Comm = std::ptr::null_mut();
        // SAFETY: NCCL-shaped call; the handle buffer is HANDLE_SIZE bytes.
        let r = unsafe { (self.t().listen)(dev as c_int, handle.as_mut_ptr().cast(), &mut lc) };
        ok(r, "listen", &self.path)?;
        if lc.is_null() {
            return Err(BenchError::Plugin("listen gave a NULL comm".into()));
        }
        Ok((Handle(lc), handle))
    }

    /// One connect attempt: `None` means call again (with the same handle buffer).
    pub fn connect(
        &self,
        dev: usize,
        handle: &mut [u8; HANDLE_SIZE],
    ) -> Result<Option<Handle>, BenchError> {
        let mut sc: Comm = std::ptr::null_mut();
        let mut dh: *mut c_void = std::ptr::null_mut();
        // SAFETY: NCCL-shaped call; NCCL passes the same 128-byte handle on every retry.
        let r = unsafe {
            (self.t().connect)(dev as c_int, handle.as_mut_ptr().cast(), &mut sc, &mut dh)
        };
        ok(r, "connect", &self.path)?;
        Ok((!sc.is_null()).then_some(Handle(sc)))
    }

    /// One accept attempt: `None` means call again.
    pub fn accept(&self, lc: Handle) -> Result<Option<Handle>, BenchError> {
        let mut rc: Comm = std::ptr::null_mut();
        let mut dh: *mut c_void = std::ptr::null_mut();
        // SAFETY: NCCL-shaped call on a live listen comm.
        let r = unsafe { (self.t().accept)(lc.0, &mut rc, &mut dh) };
        ok(r, "accept", &self.path)?;
        Ok((!rc.is_null()).then_some(Handle(rc)))
    }

    /// Registers host memory `[ptr, ptr+len)` with `comm`.
    pub fn reg_mr(&self, comm: Handle, ptr: *mut u8, len: usize) -> Result<Handle, BenchError> {
        let mut mh = std::ptr::null_mut();
        // SAFETY: NCCL-shaped call; the caller keeps the memory alive until `dereg_mr`.
        let r = unsafe { (self.t().reg_mr)(comm.0, ptr.cast(), len, PTR_HOST, &mut mh) };
        ok(r, "regMr", &self.path)?;
        Ok(Handle(mh))
    }

    /// Deregisters.
    pub fn dereg_mr(&self, comm: Handle, mh: Handle) -> Result<(), BenchError> {
        // SAFETY: `mh` came from `reg_mr` on `comm`.
        ok(
            unsafe { (self.t().dereg_mr)(comm.0, mh.0) },
            "deregMr",
            &self.path,
        )
    }

    /// Posts a send; `None` means the plugin cannot take it yet (call again).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid and unchanged until the request completes, inside memory
    /// registered as `mh` on `comm`.
    pub unsafe fn isend(
        &self,
        comm: Handle,
        ptr: *const u8,
        len: usize,
        mh: Handle,
    ) -> Result<Option<Request>, BenchError> {
        let len = c_int::try_from(len)
            .map_err(|_| BenchError::Plugin(format!("message of {len} bytes > 2 GiB")))?;
        let mut req = std::ptr::null_mut();
        // SAFETY: the caller's contract.
        let r = unsafe { (self.t().isend)(comm.0, ptr.cast_mut().cast(), len, 0, mh.0, &mut req) };
        ok(r, "isend", &self.path)?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// Posts a receive of up to `len` bytes; `None` means call again.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid and otherwise unused until the request completes, inside
    /// memory registered as `mh` on `comm`.
    pub unsafe fn irecv(
        &self,
        comm: Handle,
        ptr: *mut u8,
        len: usize,
        mh: Handle,
    ) -> Result<Option<Request>, BenchError> {
        let mut size = c_int::try_from(len)
            .map_err(|_| BenchError::Plugin(format!("message of {len} bytes > 2 GiB")))?;
        let mut data: *mut c_void = ptr.cast();
        let mut tag: c_int = 0;
        let mut mh = mh.0;
        let mut req = std::ptr::null_mut();
        // SAFETY: the caller's contract; the one-element arrays live until the call returns.
        let r = unsafe {
            (self.t().irecv)(comm.0, 1, &mut data, &mut size, &mut tag, &mut mh, &mut req)
        };
        ok(r, "irecv", &self.path)?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// Polls a request: `Some(bytes)` once it is done.
    pub fn test(&self, req: Request) -> Result<Option<usize>, BenchError> {
        let mut done: c_int = 0;
        let mut sizes: [c_int; 8] = [0; 8];
        // SAFETY: `req` is a live request; sizes has room for the largest grouped receive.
        let r = unsafe { (self.t().test)(req.0, &mut done, sizes.as_mut_ptr()) };
        ok(r, "test", &self.path)?;
        Ok((done != 0).then(|| usize::try_from(sizes[0]).unwrap_or(0)))
    }

    /// Closes a send comm.
    pub fn close_send(&self, c: Handle) -> Result<(), BenchError> {
        // SAFETY: a live send comm, not used afterwards.
        ok(
            unsafe { (self.t().close_send)(c.0) },
            "closeSend",
            &self.path,
        )
    }

    /// Closes a receive comm.
    pub fn close_recv(&self, c: Handle) -> Result<(), BenchError> {
        // SAFETY: a live receive comm, not used afterwards.
        ok(
            unsafe { (self.t().close_recv)(c.0) },
            "closeRecv",
            &self.path,
        )
    }

    /// Closes a listen comm.
    pub fn close_listen(&self, c: Handle) -> Result<(), BenchError> {
        // SAFETY: a live listen comm, not used afterwards.
        ok(
            unsafe { (self.t().close_listen)(c.0) },
            "closeListen",
            &self.path,
        )
    }

    /// Retries `f` (a connect, accept, isend or irecv that may answer "not yet") until it
    /// gives a value or `deadline` passes.
    pub fn retry<T>(
        &self,
        what: &str,
        deadline: Instant,
        mut f: impl FnMut() -> Result<Option<T>, BenchError>,
    ) -> Result<T, BenchError> {
        let mut spins = 0u32;
        loop {
            if let Some(v) = f()? {
                return Ok(v);
            }
            if Instant::now() > deadline {
                return Err(BenchError::Timeout(what.to_string()));
            }
            spins += 1;
            if spins > 64 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// This crate drives the plugin through its own copy of the v8 ABI (it loads the `.so` like
/// NCCL does, so it must not link the plugin's types). The copy is checked here against the
/// plugin's `ffi.rs`, which `scripts/abi/check_ncclnet_abi.sh` checks against NCCL's headers.
#[cfg(test)]
mod abi_tests {
    use std::mem::{offset_of, size_of};

    use nccl_net_weft::ffi as p;

    use super::*;

    #[test]
    fn the_v8_copy_matches_the_plugin_field_for_field() {
        assert_eq!(HANDLE_SIZE, p::NCCL_NET_HANDLE_MAXSIZE);
        assert_eq!(size_of::<NetV8>(), size_of::<p::ncclNet_v8_t>());
        let pairs = [
            (offset_of!(NetV8, name), offset_of!(p::ncclNet_v8_t, name)),
            (offset_of!(NetV8, init), offset_of!(p::ncclNet_v8_t, init)),
            (
                offset_of!(NetV8, devices),
                offset_of!(p::ncclNet_v8_t, devices),
            ),
            (
                offset_of!(NetV8, get_properties),
                offset_of!(p::ncclNet_v8_t, getProperties),
            ),
            (
                offset_of!(NetV8, listen),
                offset_of!(p::ncclNet_v8_t, listen),
            ),
            (
                offset_of!(NetV8, connect),
                offset_of!(p::ncclNet_v8_t, connect),
            ),
            (
                offset_of!(NetV8, accept),
                offset_of!(p::ncclNet_v8_t, accept),
            ),
            (
                offset_of!(NetV8, reg_mr),
                offset_of!(p::ncclNet_v8_t, regMr),
            ),
            (
                offset_of!(NetV8, reg_mr_dma_buf),
                offset_of!(p::ncclNet_v8_t, regMrDmaBuf),
            ),
            (
                offset_of!(NetV8, dereg_mr),
                offset_of!(p::ncclNet_v8_t, deregMr),
            ),
            (offset_of!(NetV8, isend), offset_of!(p::ncclNet_v8_t, isend)),
            (offset_of!(NetV8, irecv), offset_of!(p::ncclNet_v8_t, irecv)),
            (
                offset_of!(NetV8, iflush),
                offset_of!(p::ncclNet_v8_t, iflush),
            ),
            (offset_of!(NetV8, test), offset_of!(p::ncclNet_v8_t, test)),
            (
                offset_of!(NetV8, close_send),
                offset_of!(p::ncclNet_v8_t, closeSend),
            ),
            (
                offset_of!(NetV8, close_recv),
                offset_of!(p::ncclNet_v8_t, closeRecv),
            ),
            (
                offset_of!(NetV8, close_listen),
                offset_of!(p::ncclNet_v8_t, closeListen),
            ),
            (
                offset_of!(NetV8, get_device_mr),
                offset_of!(p::ncclNet_v8_t, getDeviceMr),
            ),
            (
                offset_of!(NetV8, irecv_consumed),
                offset_of!(p::ncclNet_v8_t, irecvConsumed),
            ),
        ];
        for (i, (ours, theirs)) in pairs.iter().enumerate() {
            assert_eq!(ours, theirs, "field {i} of ncclNet_v8_t");
        }
        assert_eq!(size_of::<PropsV8>(), size_of::<p::ncclNetProperties_v8_t>());
        let props = [
            (
                offset_of!(PropsV8, guid),
                offset_of!(p::ncclNetProperties_v8_t, guid),
            ),
            (
                offset_of!(PropsV8, speed),
                offset_of!(p::ncclNetProperties_v8_t, speed),
            ),
            (
                offset_of!(PropsV8, latency),
                offset_of!(p::ncclNetProperties_v8_t, latency),
            ),
            (
                offset_of!(PropsV8, max_comms),
                offset_of!(p::ncclNetProperties_v8_t, maxComms),
            ),
            (
                offset_of!(PropsV8, max_recvs),
                offset_of!(p::ncclNetProperties_v8_t, maxRecvs),
            ),
            (
                offset_of!(PropsV8, net_device_version),
                offset_of!(p::ncclNetProperties_v8_t, netDeviceVersion),
            ),
        ];
        for (i, (ours, theirs)) in props.iter().enumerate() {
            assert_eq!(ours, theirs, "field {i} of ncclNetProperties_v8_t");
        }
    }
}
