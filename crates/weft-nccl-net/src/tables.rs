//! One thin table per ncclNet version. Each shim is named after the first version whose
//! signature it matches and only converts arguments; the work is in `plugin`.

use std::ffi::{c_int, c_void};

use crate::ffi::*;
use crate::guard::{guard, out, set_logger};
use crate::plugin;

const NAME: &std::ffi::CStr = c"weft";

// ---- shared by every version -------------------------------------------------------------

unsafe extern "C" fn devices_v8(ndev: *mut c_int) -> ncclResult_t {
    guard!("devices", {
        out(ndev, "ndev", plugin::devices()? as c_int)
    })
}

unsafe extern "C" fn accept_v8(
    listen_comm: Comm,
    recv_comm: *mut Comm,
    _dev: DevHandle,
) -> ncclResult_t {
    guard!("accept", { plugin::accept(listen_comm, recv_comm) })
}

unsafe extern "C" fn reg_mr_v8(
    comm: Comm,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    mh: *mut *mut c_void,
) -> ncclResult_t {
    guard!("regMr", { plugin::reg_mr(comm, data, size, ty, mh) })
}

unsafe extern "C" fn reg_mr_dmabuf_v8(
    _comm: Comm,
    _data: *mut c_void,
    _size: usize,
    _ty: c_int,
    _offset: u64,
    _fd: c_int,
    _mh: *mut *mut c_void,
) -> ncclResult_t {
    guard!("regMrDmaBuf", {
        plugin::unsupported("regMrDmaBuf (ptrSupport has no NCCL_PTR_DMABUF)")
    })
}

unsafe extern "C" fn dereg_mr_v8(comm: Comm, mh: *mut c_void) -> ncclResult_t {
    guard!("deregMr", { plugin::dereg_mr(comm, mh) })
}

unsafe extern "C" fn iflush_v8(
    _recv_comm: Comm,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mh: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    guard!("iflush", { plugin::iflush(request) })
}

unsafe extern "C" fn test_v8(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> ncclResult_t {
    guard!("test", { plugin::test(request, done, sizes) })
}

unsafe extern "C" fn close_send_v8(c: Comm) -> ncclResult_t {
    guard!("closeSend", { plugin::close_send(c) })
}

unsafe extern "C" fn close_recv_v8(c: Comm) -> ncclResult_t {
    guard!("closeRecv", { plugin::close_recv(c) })
}

unsafe extern "C" fn close_listen_v8(c: Comm) -> ncclResult_t {
    guard!("closeListen", { plugin::close_listen(c) })
}

// ---- v8 ------------------------------------------------------------------------------------

unsafe extern "C" fn init_v8(logger: ncclDebugLogger_t) -> ncclResult_t {
    set_logger(logger);
    guard!("init", { plugin::init() })
}

unsafe extern "C" fn get_properties_v8(
    dev: c_int,
    props: *mut ncclNetProperties_v8_t,
) -> ncclResult_t {
    guard!("getProperties", {
        let p = plugin::props(dev)?;
        out(
            props,
            "props",
            ncclNetProperties_v8_t {
                name: p.name,
                pciPath: p.pci_path,
                guid: p.guid,
                ptrSupport: NCCL_PTR_HOST,
                regIsGlobal: 0,
                speed: p.speed,
                port: 0,
                latency: 0.0,
                maxComms: plugin::MAX_COMMS,
                maxRecvs: plugin::MAX_RECVS_ADVERTISED,
                netDeviceType: NCCL_NET_DEVICE_HOST,
                netDeviceVersion: NCCL_NET_DEVICE_INVALID_VERSION,
            },
        )
    })
}

unsafe extern "C" fn listen_v8(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut Comm,
) -> ncclResult_t {
    guard!("listen", { plugin::listen(dev, handle, listen_comm) })
}

unsafe extern "C" fn connect_v8(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut Comm,
    _d: DevHandle,
) -> ncclResult_t {
    guard!("connect", { plugin::connect(dev, handle, send_comm) })
}

unsafe extern "C" fn isend_v8(
    c: Comm,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mh: *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    guard!("isend", {
        let size = usize::try_from(size)
            .map_err(|_| crate::guard::PluginError::Usage(format!("isend size {size}")))?;
        plugin::isend(c, data, size, tag, mh, req)
    })
}

unsafe extern "C" fn irecv_v8(
    c: Comm,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    guard!("irecv", {
        if sizes.is_null() {
            return Err(crate::guard::PluginError::Null("sizes"));
        }
        // SAFETY: NCCL passes `n` sizes; `plugin::irecv` only asks for i < n.
        let size_of = |i: usize| usize::try_from(unsafe { *sizes.add(i) }).unwrap_or(0);
        plugin::irecv(c, n, data, size_of, tags, mh, req)
    })
}

// ---- v9 ------------------------------------------------------------------------------------

fn props_v9(p: &plugin::Props) -> ncclNetProperties_v9_t {
    ncclNetProperties_v9_t {
        name: p.name,
        pciPath: p.pci_path,
        guid: p.guid,
        ptrSupport: NCCL_PTR_HOST,
        regIsGlobal: 0,
        forceFlush: 0,
        speed: p.speed,
        port: 0,
        latency: 0.0,
        maxComms: plugin::MAX_COMMS,
        maxRecvs: plugin::MAX_RECVS_ADVERTISED,
        netDeviceType: NCCL_NET_DEVICE_HOST,
        netDeviceVersion: NCCL_NET_DEVICE_INVALID_VERSION,
        vProps: ncclNetVDeviceProps_v9_t {
            ndevs: 1,
            devs: [p.dev, 0, 0, 0],
        },
        maxP2pBytes: NCCL_MAX_NET_SIZE_BYTES,
        maxCollBytes: NCCL_MAX_NET_SIZE_BYTES,
    }
}

unsafe extern "C" fn get_properties_v9(
    dev: c_int,
    props: *mut ncclNetProperties_v9_t,
) -> ncclResult_t {
    guard!("getProperties", {
        out(props, "props", props_v9(&plugin::props(dev)?))
    })
}

unsafe extern "C" fn isend_v9(
    c: Comm,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    guard!("isend", { plugin::isend(c, data, size, tag, mh, req) })
}

unsafe extern "C" fn irecv_v9(
    c: Comm,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    guard!("irecv", {
        if sizes.is_null() {
            return Err(crate::guard::PluginError::Null("sizes"));
        }
        // SAFETY: NCCL passes `n` sizes; `plugin::irecv` only asks for i < n.
        let size_of = |i: usize| unsafe { *sizes.add(i) };
        plugin::irecv(c, n, data, size_of, tags, mh, req)
    })
}

// ---- v10 -----------------------------------------------------------------------------------

unsafe extern "C" fn init_v10(
    logger: ncclDebugLogger_t,
    _prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    set_logger(logger);
    guard!("init", { plugin::init() })
}

unsafe extern "C" fn connect_v10(
    dev: c_int,
    _cfg: *mut ncclNetCommConfig_t,
    handle: *mut c_void,
    send_comm: *mut Comm,
    _d: DevHandle,
) -> ncclResult_t {
    guard!("connect", { plugin::connect(dev, handle, send_comm) })
}

unsafe extern "C" fn isend_v10(
    c: Comm,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    _ph: *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    guard!("isend", { plugin::isend(c, data, size, tag, mh, req) })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn irecv_v10(
    c: Comm,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    _ph: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    guard!("irecv", {
        if sizes.is_null() {
            return Err(crate::guard::PluginError::Null("sizes"));
        }
        // SAFETY: NCCL passes `n` sizes; `plugin::irecv` only asks for i < n.
        let size_of = |i: usize| unsafe { *sizes.add(i) };
        plugin::irecv(c, n, data, size_of, tags, mh, req)
    })
}

// ---- v11 -----------------------------------------------------------------------------------

/// The per-communicator context of v11+: only counts references to the shared transport.
struct Ctx {
    _comm_id: u64,
}

unsafe extern "C" fn init_v11(
    ctx: *mut *mut c_void,
    comm_id: u64,
    _cfg: *mut ncclNetCommConfig_t,
    logger: ncclDebugLogger_t,
    _prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    set_logger(logger);
    guard!("init", {
        if ctx.is_null() {
            return Err(crate::guard::PluginError::Null("ctx"));
        }
        plugin::init()?;
        out(
            ctx,
            "ctx",
            crate::guard::into_handle(Box::new(Ctx { _comm_id: comm_id })),
        )
    })
}

unsafe extern "C" fn finalize_v11(ctx: *mut c_void) -> ncclResult_t {
    guard!("finalize", {
        if !ctx.is_null() {
            // SAFETY: NCCL finalizes each context that init returned exactly once.
            drop(unsafe { crate::guard::free_handle::<Ctx>(ctx, "ctx")? });
        }
        plugin::finalize()
    })
}

fn props_v11(p: &plugin::Props) -> ncclNetProperties_v11_t {
    let b = props_v9(p);
    ncclNetProperties_v11_t {
        name: b.name,
        pciPath: b.pciPath,
        guid: b.guid,
        ptrSupport: b.ptrSupport,
        regIsGlobal: b.regIsGlobal,
        forceFlush: b.forceFlush,
        speed: b.speed,
        port: b.port,
        latency: b.latency,
        maxComms: b.maxComms,
        maxRecvs: b.maxRecvs,
        netDeviceType: b.netDeviceType,
        netDeviceVersion: b.netDeviceVersion,
        vProps: b.vProps,
        maxP2pBytes: b.maxP2pBytes,
        maxCollBytes: b.maxCollBytes,
        maxMultiRequestSize: 1,
    }
}

unsafe extern "C" fn get_properties_v11(
    dev: c_int,
    props: *mut ncclNetProperties_v11_t,
) -> ncclResult_t {
    guard!("getProperties", {
        out(props, "props", props_v11(&plugin::props(dev)?))
    })
}

unsafe extern "C" fn listen_v11(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut Comm,
) -> ncclResult_t {
    guard!("listen", { plugin::listen(dev, handle, listen_comm) })
}

unsafe extern "C" fn connect_v11(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut Comm,
    _d: DevHandle,
) -> ncclResult_t {
    guard!("connect", { plugin::connect(dev, handle, send_comm) })
}

// ---- v12 -----------------------------------------------------------------------------------

unsafe extern "C" fn get_properties_v12(
    dev: c_int,
    props: *mut ncclNetProperties_v12_t,
) -> ncclResult_t {
    guard!("getProperties", {
        let b = props_v11(&plugin::props(dev)?);
        out(
            props,
            "props",
            ncclNetProperties_v12_t {
                name: b.name,
                pciPath: b.pciPath,
                guid: b.guid,
                ptrSupport: b.ptrSupport,
                regIsGlobal: b.regIsGlobal,
                forceFlush: b.forceFlush,
                speed: b.speed,
                port: b.port,
                latency: b.latency,
                maxComms: b.maxComms,
                maxRecvs: b.maxRecvs,
                netDeviceType: b.netDeviceType,
                netDeviceVersion: b.netDeviceVersion,
                vProps: ncclNetVDeviceProps_v12_t {
                    ndevs: 1,
                    devs: [dev, 0, 0, 0, 0, 0, 0, 0],
                },
                maxP2pBytes: b.maxP2pBytes,
                maxCollBytes: b.maxCollBytes,
                maxMultiRequestSize: b.maxMultiRequestSize,
                railId: NCCL_NET_ID_UNDEF,
                planeId: NCCL_NET_ID_UNDEF,
            },
        )
    })
}

// ---- the exported tables -------------------------------------------------------------------

/// ncclNet v8 (NCCL 2.20 and later).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v8: ncclNet_v8_t = ncclNet_v8_t {
    name: NAME.as_ptr(),
    init: init_v8,
    devices: devices_v8,
    getProperties: get_properties_v8,
    listen: listen_v8,
    connect: connect_v8,
    accept: accept_v8,
    regMr: reg_mr_v8,
    regMrDmaBuf: Some(reg_mr_dmabuf_v8),
    deregMr: dereg_mr_v8,
    isend: isend_v8,
    irecv: irecv_v8,
    iflush: iflush_v8,
    test: test_v8,
    closeSend: close_send_v8,
    closeRecv: close_recv_v8,
    closeListen: close_listen_v8,
    getDeviceMr: None,
    irecvConsumed: None,
};

/// ncclNet v9 (NCCL 2.24 and later).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v9: ncclNet_v9_t = ncclNet_v9_t {
    name: NAME.as_ptr(),
    init: init_v8,
    devices: devices_v8,
    getProperties: get_properties_v9,
    listen: listen_v8,
    connect: connect_v8,
    accept: accept_v8,
    regMr: reg_mr_v8,
    regMrDmaBuf: Some(reg_mr_dmabuf_v8),
    deregMr: dereg_mr_v8,
    isend: isend_v9,
    irecv: irecv_v9,
    iflush: iflush_v8,
    test: test_v8,
    closeSend: close_send_v8,
    closeRecv: close_recv_v8,
    closeListen: close_listen_v8,
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: None,
};

/// ncclNet v10 (NCCL 2.26 and later).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v10: ncclNet_v10_t = ncclNet_v10_t {
    name: NAME.as_ptr(),
    init: init_v10,
    devices: devices_v8,
    getProperties: get_properties_v9,
    listen: listen_v8,
    connect: connect_v10,
    accept: accept_v8,
    regMr: reg_mr_v8,
    regMrDmaBuf: Some(reg_mr_dmabuf_v8),
    deregMr: dereg_mr_v8,
    isend: isend_v10,
    irecv: irecv_v10,
    iflush: iflush_v8,
    test: test_v8,
    closeSend: close_send_v8,
    closeRecv: close_recv_v8,
    closeListen: close_listen_v8,
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: None,
};

/// ncclNet v11 (NCCL 2.28 and later).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v11: ncclNet_v11_t = ncclNet_v11_t {
    name: NAME.as_ptr(),
    init: init_v11,
    devices: devices_v8,
    getProperties: get_properties_v11,
    listen: listen_v11,
    connect: connect_v11,
    accept: accept_v8,
    regMr: reg_mr_v8,
    regMrDmaBuf: Some(reg_mr_dmabuf_v8),
    deregMr: dereg_mr_v8,
    isend: isend_v10,
    irecv: irecv_v10,
    iflush: iflush_v8,
    test: test_v8,
    closeSend: close_send_v8,
    closeRecv: close_recv_v8,
    closeListen: close_listen_v8,
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: None,
    finalize: finalize_v11,
    setNetAttr: None,
};

/// ncclNet v12 (NCCL 2.30 and later).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v12: ncclNet_v12_t = ncclNet_v12_t {
    name: NAME.as_ptr(),
    init: init_v11,
    devices: devices_v8,
    getProperties: get_properties_v12,
    listen: listen_v11,
    connect: connect_v11,
    accept: accept_v8,
    regMr: reg_mr_v8,
    regMrDmaBuf: Some(reg_mr_dmabuf_v8),
    deregMr: dereg_mr_v8,
    isend: isend_v10,
    irecv: irecv_v10,
    iflush: iflush_v8,
    test: test_v8,
    closeSend: close_send_v8,
    closeRecv: close_recv_v8,
    closeListen: close_listen_v8,
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: None,
    finalize: finalize_v11,
    setNetAttr: None,
};
