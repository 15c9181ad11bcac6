//! What the dlopen harnesses share: NCCL's logger (records every line), the path of the built
//! plugin, and `Net`, one loaded ncclNet table of any version with NCCL-shaped calls.
#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::{CStr, c_char, c_int, c_ulong, c_void};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nccl_net_weft::ffi::*;

pub type R<T = ()> = Result<T, String>;

pub mod peers;
pub mod worker;
#[allow(unused_imports)] // conformance and ofi_mr run no workers
pub use worker::{Worker, counters};

/// A listen handle as the hex text workers and parents exchange.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// The listen handle of a worker's `H`/`C` line.
pub fn unhex(s: &str) -> R<[u8; 128]> {
    let mut h = [0u8; 128];
    if s.len() != 256 {
        return Err(format!("bad handle {s:?}"));
    }
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(h)
}

/// A worker's stdin, one line per step from its parent.
pub struct Lines(pub std::io::Lines<std::io::StdinLock<'static>>);

impl Lines {
    pub fn next(&mut self) -> R<String> {
        match self.0.next() {
            Some(Ok(l)) => Ok(l),
            _ => Err("parent closed stdin".into()),
        }
    }
}

/// One line the plugin logged: its level, its subsystem flags (`NCCL_INIT`, `NCCL_NET`, ...)
/// and its text.
pub struct Logged {
    pub level: c_int,
    pub subsystems: c_ulong,
    pub text: String,
}

pub static LOG: Mutex<Vec<Logged>> = Mutex::new(Vec::new());

/// NCCL's logger is variadic; the plugin always calls it with fmt "%s" and exactly one `char*`.
/// On the LP64 C ABIs of x86_64 and aarch64 Linux that extra argument arrives like a sixth
/// fixed argument, so a non-variadic receiver reads it correctly (Rust cannot define variadics).
unsafe extern "C" fn logger(
    level: c_int,
    subsystems: c_ulong,
    _file: *const c_char,
    _line: c_int,
    _fmt: *const c_char,
    msg: *const c_char,
) {
    // SAFETY: the plugin passes a NUL-terminated message as the "%s" argument.
    let m = unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned();
    if std::env::var_os("WEFT_TEST_VERBOSE").is_some() {
        eprintln!("[{level}] {m}");
    }
    LOG.lock().unwrap().push(Logged {
        level,
        subsystems,
        text: m,
    });
}

pub fn logger_ptr() -> ncclDebugLogger_t {
    // SAFETY: see `logger`: same calling convention for the one argument shape the plugin uses.
    Some(unsafe {
        std::mem::transmute::<
            *const (),
            unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...),
        >(logger as *const ())
    })
}

pub fn warns_since(mark: usize) -> Vec<String> {
    LOG.lock().unwrap()[mark..]
        .iter()
        .filter(|l| l.level == NCCL_LOG_WARN)
        .map(|l| l.text.clone())
        .collect()
}

/// The INFO lines logged since `mark`.
pub fn infos_since(mark: usize) -> Vec<String> {
    LOG.lock().unwrap()[mark..]
        .iter()
        .filter(|l| l.level == NCCL_LOG_INFO)
        .map(|l| l.text.clone())
        .collect()
}

pub fn log_mark() -> usize {
    LOG.lock().unwrap().len()
}

pub fn so_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join("libnccl_net_weft.so");
        if p.exists() {
            return p;
        }
    }
    // Not built alongside the tests (unusual): build it.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "-p", "weft-nccl-net"])
        .status()
        .unwrap();
    assert!(st.success());
    deps.parent().unwrap().join("libnccl_net_weft.so")
}

/// The loaded library and one version's table, with NCCL-like calls.
pub struct Net {
    pub v: u32,
    pub table: *const c_void,
    _lib: &'static libloading::Library,
}

pub fn ok(r: ncclResult_t, what: &str) -> R {
    if r == ncclSuccess {
        Ok(())
    } else {
        Err(format!("{what} returned {r}"))
    }
}

macro_rules! t {
    ($s:expr, $f:ident ( $($a:expr),* )) => {
        // SAFETY: `table` points at the exported table of version `v`, checked by `load`.
        unsafe {
            match $s.v {
                8 => ((*($s.table as *const ncclNet_v8_t)).$f)($($a),*),
                9 => ((*($s.table as *const ncclNet_v9_t)).$f)($($a),*),
                10 => ((*($s.table as *const ncclNet_v10_t)).$f)($($a),*),
                11 => ((*($s.table as *const ncclNet_v11_t)).$f)($($a),*),
                _ => ((*($s.table as *const ncclNet_v12_t)).$f)($($a),*),
            }
        }
    };
}

impl Net {
    pub fn load(lib: &'static libloading::Library, v: u32) -> Net {
        let sym = format!("ncclNetPlugin_v{v}\0");
        // SAFETY: the symbol is a static table of the matching type; we only take its address.
        let p: libloading::Symbol<'_, *const c_void> = unsafe { lib.get(sym.as_bytes()) }.unwrap();
        Net {
            v,
            table: *p,
            _lib: lib,
        }
    }

    pub fn name(&self) -> String {
        // SAFETY: every table starts with `const char* name`.
        let n = unsafe { *(self.table as *const *const c_char) };
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(n) }.to_string_lossy().into_owned()
    }

    pub fn init(&self) -> R<*mut c_void> {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: calling the plugin's init with NCCL's argument shapes.
        let r = unsafe {
            match self.v {
                8 | 9 => ((*(self.table as *const ncclNet_v8_t)).init)(logger_ptr()),
                10 => ((*(self.table as *const ncclNet_v10_t)).init)(logger_ptr(), None),
                _ => ((*(self.table as *const ncclNet_v11_t)).init)(
                    &mut ctx,
                    42,
                    std::ptr::null_mut(),
                    logger_ptr(),
                    None,
                ),
            }
        };
        ok(r, "init")?;
        Ok(ctx)
    }

    pub fn finalize(&self, ctx: *mut c_void) -> R {
        if self.v >= 11 {
            // SAFETY: v11/v12 tables have finalize at the same place.
            let r = unsafe { ((*(self.table as *const ncclNet_v11_t)).finalize)(ctx) };
            ok(r, "finalize")?;
        }
        Ok(())
    }

    pub fn devices(&self) -> R<c_int> {
        let mut n = 0;
        ok(t!(self, devices(&mut n)), "devices")?;
        Ok(n)
    }

    /// (name, ptrSupport, speed, maxRecvs)
    pub fn props(&self, dev: c_int) -> R<(String, c_int, c_int, c_int)> {
        // SAFETY: zeroed memory is a valid value for these plain C structs; the plugin fills them.
        unsafe {
            let (name, ptr, speed, recvs) = match self.v {
                8 => {
                    let mut p: ncclNetProperties_v8_t = std::mem::zeroed();
                    ok(
                        ((*(self.table as *const ncclNet_v8_t)).getProperties)(dev, &mut p),
                        "getProperties",
                    )?;
                    (p.name, p.ptrSupport, p.speed, p.maxRecvs)
                }
                9 | 10 => {
                    let mut p: ncclNetProperties_v9_t = std::mem::zeroed();
                    ok(
                        ((*(self.table as *const ncclNet_v9_t)).getProperties)(dev, &mut p),
                        "getProperties",
                    )?;
                    if p.vProps.ndevs != 1 || p.maxP2pBytes == 0 {
                        return Err("v9 vProps/maxP2pBytes unset".into());
                    }
                    (p.name, p.ptrSupport, p.speed, p.maxRecvs)
                }
                11 => {
                    let mut p: ncclNetProperties_v11_t = std::mem::zeroed();
                    ok(
                        ((*(self.table as *const ncclNet_v11_t)).getProperties)(dev, &mut p),
                        "getProperties",
                    )?;
                    (p.name, p.ptrSupport, p.speed, p.maxRecvs)
                }
                _ => {
                    let mut p: ncclNetProperties_v12_t = std::mem::zeroed();
                    ok(
                        ((*(self.table as *const ncclNet_v12_t)).getProperties)(dev, &mut p),
                        "getProperties",
                    )?;
                    if p.railId != -1 || p.planeId != -1 {
                        return Err("v12 railId/planeId not UNDEF".into());
                    }
                    (p.name, p.ptrSupport, p.speed, p.maxRecvs)
                }
            };
            Ok((
                CStr::from_ptr(name).to_string_lossy().into_owned(),
                ptr,
                speed,
                recvs,
            ))
        }
    }

    pub fn listen(&self, ctx: *mut c_void, handle: &mut [u8; 128]) -> R<*mut c_void> {
        self.listen_on(ctx, 0, handle)
    }

    pub fn listen_on(
        &self,
        ctx: *mut c_void,
        dev: c_int,
        handle: &mut [u8; 128],
    ) -> R<*mut c_void> {
        let mut lc = std::ptr::null_mut();
        let h = handle.as_mut_ptr().cast();
        // SAFETY: NCCL-shaped call.
        let r = unsafe {
            match self.v {
                8..=10 => ((*(self.table as *const ncclNet_v8_t)).listen)(dev, h, &mut lc),
                _ => ((*(self.table as *const ncclNet_v11_t)).listen)(ctx, dev, h, &mut lc),
            }
        };
        ok(r, "listen")?;
        if lc.is_null() {
            Err("listen gave NULL".into())
        } else {
            Ok(lc)
        }
    }

    /// One connect call: `Ok(None)` = call again.
    pub fn connect(&self, ctx: *mut c_void, handle: &mut [u8; 128]) -> R<Option<*mut c_void>> {
        self.connect_on(ctx, 0, handle)
    }

    pub fn connect_on(
        &self,
        ctx: *mut c_void,
        dev: c_int,
        handle: &mut [u8; 128],
    ) -> R<Option<*mut c_void>> {
        let mut sc = std::ptr::null_mut();
        let mut dh: *mut ncclNetDeviceHandle_t = std::ptr::null_mut();
        let h = handle.as_mut_ptr().cast();
        // SAFETY: NCCL-shaped call.
        let r = unsafe {
            match self.v {
                8 | 9 => ((*(self.table as *const ncclNet_v8_t)).connect)(dev, h, &mut sc, &mut dh),
                10 => ((*(self.table as *const ncclNet_v10_t)).connect)(
                    dev,
                    std::ptr::null_mut(),
                    h,
                    &mut sc,
                    &mut dh,
                ),
                _ => {
                    ((*(self.table as *const ncclNet_v11_t)).connect)(ctx, dev, h, &mut sc, &mut dh)
                }
            }
        };
        ok(r, "connect")?;
        Ok((!sc.is_null()).then_some(sc))
    }

    pub fn accept(&self, lc: *mut c_void) -> R<Option<*mut c_void>> {
        let mut rc = std::ptr::null_mut();
        let mut dev: *mut ncclNetDeviceHandle_t = std::ptr::null_mut();
        ok(t!(self, accept(lc, &mut rc, &mut dev)), "accept")?;
        Ok((!rc.is_null()).then_some(rc))
    }

    pub fn reg(&self, comm: *mut c_void, buf: &mut [u8], ty: c_int) -> R<*mut c_void> {
        let mut mh = std::ptr::null_mut();
        ok(
            t!(
                self,
                regMr(comm, buf.as_mut_ptr().cast(), buf.len(), ty, &mut mh)
            ),
            "regMr",
        )?;
        Ok(mh)
    }

    pub fn dereg(&self, comm: *mut c_void, mh: *mut c_void) -> R {
        ok(t!(self, deregMr(comm, mh)), "deregMr")
    }

    pub fn isend(
        &self,
        sc: *mut c_void,
        buf: &[u8],
        tag: c_int,
        mh: *mut c_void,
    ) -> R<Option<*mut c_void>> {
        let mut req = std::ptr::null_mut();
        let p = buf.as_ptr().cast_mut().cast();
        // SAFETY: NCCL-shaped call.
        let r = unsafe {
            match self.v {
                8 => ((*(self.table as *const ncclNet_v8_t)).isend)(
                    sc,
                    p,
                    buf.len() as c_int,
                    tag,
                    mh,
                    &mut req,
                ),
                9 => ((*(self.table as *const ncclNet_v9_t)).isend)(
                    sc,
                    p,
                    buf.len(),
                    tag,
                    mh,
                    &mut req,
                ),
                10 => ((*(self.table as *const ncclNet_v10_t)).isend)(
                    sc,
                    p,
                    buf.len(),
                    tag,
                    mh,
                    std::ptr::null_mut(),
                    &mut req,
                ),
                11 => ((*(self.table as *const ncclNet_v11_t)).isend)(
                    sc,
                    p,
                    buf.len(),
                    tag,
                    mh,
                    std::ptr::null_mut(),
                    &mut req,
                ),
                _ => ((*(self.table as *const ncclNet_v12_t)).isend)(
                    sc,
                    p,
                    buf.len(),
                    tag,
                    mh,
                    std::ptr::null_mut(),
                    &mut req,
                ),
            }
        };
        ok(r, "isend")?;
        Ok((!req.is_null()).then_some(req))
    }

    pub fn irecv(
        &self,
        rc: *mut c_void,
        bufs: &mut [&mut [u8]],
        tags: &[c_int],
        mhs: &[*mut c_void],
    ) -> R<Option<*mut c_void>> {
        let n = bufs.len() as c_int;
        let mut data: Vec<*mut c_void> = bufs.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
        let mut s32: Vec<c_int> = bufs.iter().map(|b| b.len() as c_int).collect();
        let mut s64: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        let mut tags = tags.to_vec();
        let mut mhs = mhs.to_vec();
        let mut ph: Vec<*mut c_void> = vec![std::ptr::null_mut(); bufs.len()];
        let mut req = std::ptr::null_mut();
        let (d, tg, m) = (data.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr());
        // SAFETY: NCCL-shaped call; the arrays live until it returns.
        let r = unsafe {
            match self.v {
                8 => ((*(self.table as *const ncclNet_v8_t)).irecv)(
                    rc,
                    n,
                    d,
                    s32.as_mut_ptr(),
                    tg,
                    m,
                    &mut req,
                ),
                9 => ((*(self.table as *const ncclNet_v9_t)).irecv)(
                    rc,
                    n,
                    d,
                    s64.as_mut_ptr(),
                    tg,
                    m,
                    &mut req,
                ),
                10 => ((*(self.table as *const ncclNet_v10_t)).irecv)(
                    rc,
                    n,
                    d,
                    s64.as_mut_ptr(),
                    tg,
                    m,
                    ph.as_mut_ptr(),
                    &mut req,
                ),
                11 => ((*(self.table as *const ncclNet_v11_t)).irecv)(
                    rc,
                    n,
                    d,
                    s64.as_mut_ptr(),
                    tg,
                    m,
                    ph.as_mut_ptr(),
                    &mut req,
                ),
                _ => ((*(self.table as *const ncclNet_v12_t)).irecv)(
                    rc,
                    n,
                    d,
                    s64.as_mut_ptr(),
                    tg,
                    m,
                    ph.as_mut_ptr(),
                    &mut req,
                ),
            }
        };
        ok(r, "irecv")?;
        Ok((!req.is_null()).then_some(req))
    }

    /// One test call: `Some(sizes)` when done.
    pub fn test(&self, req: *mut c_void) -> R<Option<[c_int; 8]>> {
        let mut done = 0;
        let mut sizes = [-1; 8];
        ok(t!(self, test(req, &mut done, sizes.as_mut_ptr())), "test")?;
        Ok((done == 1).then_some(sizes))
    }

    pub fn close_send(&self, c: *mut c_void) -> R {
        ok(t!(self, closeSend(c)), "closeSend")
    }
    pub fn close_recv(&self, c: *mut c_void) -> R {
        ok(t!(self, closeRecv(c)), "closeRecv")
    }
    pub fn close_listen(&self, c: *mut c_void) -> R {
        ok(t!(self, closeListen(c)), "closeListen")
    }

    /// The polling connect/accept loop of NCCL, both ends in this thread.
    pub fn connect_pair(&self, ctx: *mut c_void) -> R<(*mut c_void, *mut c_void)> {
        let mut handle = [0u8; 128];
        let lc = self.listen(ctx, &mut handle)?;
        let (mut sc, mut rc) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while sc.is_none() || rc.is_none() {
            if Instant::now() > deadline {
                return Err("connect/accept did not finish".into());
            }
            if sc.is_none() {
                sc = self.connect(ctx, &mut handle)?;
            }
            if rc.is_none() {
                rc = self.accept(lc)?;
            }
        }
        self.close_listen(lc)?;
        Ok((sc.unwrap_or_default(), rc.unwrap_or_default()))
    }

    pub fn wait(&self, req: *mut c_void) -> R<[c_int; 8]> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.test(req)? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                return Err("request never completed".into());
            }
        }
    }
}

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(131).wrapping_add(seed))
        .collect()
}
