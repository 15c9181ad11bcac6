//! The ncclNet C ABI, v8 to v12, as `#[repr(C)]` Rust types. Field order follows NCCL's
//! `plugins/net/example/nccl/net_v*.h`; `tests` below pin sizes and offsets (x86_64 / aarch64 LP64).

#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    missing_docs
)]

use std::ffi::{c_char, c_float, c_int, c_ulong, c_void};

pub type ncclResult_t = c_int;
pub const ncclSuccess: ncclResult_t = 0;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;

pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
// The transport encodes its listen handle into exactly the buffer NCCL gives us: the SAFETY
// arguments of `plugin::listen`/`connect` rely on the two sizes being one.
const _: () = assert!(NCCL_NET_HANDLE_MAXSIZE == weft_transport::proto::HANDLE_SIZE);
pub const NCCL_PTR_HOST: c_int = 1;
pub const NCCL_PTR_CUDA: c_int = 2;
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0;
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;
/// Pre-v9 shims refuse isend/irecv sizes above 1 GiB.
pub const MAX_NET_SIZE_V8: usize = 1 << 30;
pub const NCCL_NET_ID_UNDEF: i16 = -1;

pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
pub const NCCL_LOG_TRACE: c_int = 5;
pub const NCCL_INIT: c_ulong = 1;
pub const NCCL_NET: c_ulong = 16;

/// `void (*)(ncclDebugLogLevel, unsigned long flags, const char* file, int line, const char* fmt, ...)`.
pub type ncclDebugLogger_t = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;
/// `ncclResult_t (*)(void** eHandle, int type, void* phandle, int64_t pluginId, void* extData)`.
pub type ncclProfilerCallback_t = Option<
    unsafe extern "C" fn(
        eHandle: *mut *mut c_void,
        ty: c_int,
        phandle: *mut c_void,
        pluginId: i64,
        extData: *mut c_void,
    ) -> ncclResult_t,
>;

#[repr(C)]
#[derive(Debug)]
pub struct ncclNetDeviceHandle_t {
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needsProxyProgress: c_int,
}

#[repr(C)]
#[derive(Debug)]
pub struct ncclNetProperties_v8_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
}

#[repr(C)]
#[derive(Debug)]
pub struct ncclNetVDeviceProps_v9_t {
    pub ndevs: c_int,
    pub devs: [c_int; 4],
}

#[repr(C)]
#[derive(Debug)]
pub struct ncclNetVDeviceProps_v12_t {
    pub ndevs: c_int,
    pub devs: [c_int; 8],
}

/// v9 and v10 share this layout.
#[repr(C)]
#[derive(Debug)]
pub struct ncclNetProperties_v9_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v9_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
}

#[repr(C)]
#[derive(Debug)]
pub struct ncclNetProperties_v11_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v9_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
    pub maxMultiRequestSize: c_int,
}

#[repr(C)]
#[derive(Debug)]
pub struct ncclNetProperties_v12_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v12_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
    pub maxMultiRequestSize: c_int,
    pub railId: i16,
    pub planeId: i16,
}

#[repr(C)]
#[derive(Debug)]
pub struct ncclNetCommConfig_t {
    pub trafficClass: c_int,
}

#[repr(C)]
#[derive(Debug)]
pub struct ncclNetAttr_t {
    pub sendCommAttr: [i32; 4],
    pub recvCommAttr: [i32; 4],
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

pub type Comm = *mut c_void;
pub type DevHandle = *mut *mut ncclNetDeviceHandle_t;

type RegMr =
    unsafe extern "C" fn(Comm, *mut c_void, usize, c_int, *mut *mut c_void) -> ncclResult_t;
type RegMrDmaBuf = unsafe extern "C" fn(
    Comm,
    *mut c_void,
    usize,
    c_int,
    u64,
    c_int,
    *mut *mut c_void,
) -> ncclResult_t;
type DeregMr = unsafe extern "C" fn(Comm, *mut c_void) -> ncclResult_t;
type Accept = unsafe extern "C" fn(Comm, *mut Comm, DevHandle) -> ncclResult_t;
type Iflush = unsafe extern "C" fn(
    Comm,
    c_int,
    *mut *mut c_void,
    *mut c_int,
    *mut *mut c_void,
    *mut *mut c_void,
) -> ncclResult_t;
type Test = unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> ncclResult_t;
type Close = unsafe extern "C" fn(Comm) -> ncclResult_t;
type GetDeviceMr = unsafe extern "C" fn(Comm, *mut c_void, *mut *mut c_void) -> ncclResult_t;
type IrecvConsumed = unsafe extern "C" fn(Comm, c_int, *mut c_void) -> ncclResult_t;
type Devices = unsafe extern "C" fn(*mut c_int) -> ncclResult_t;

#[repr(C)]
pub struct ncclNet_v8_t {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t,
    pub devices: Devices,
    pub getProperties: unsafe extern "C" fn(c_int, *mut ncclNetProperties_v8_t) -> ncclResult_t,
    pub listen: unsafe extern "C" fn(c_int, *mut c_void, *mut Comm) -> ncclResult_t,
    pub connect: unsafe extern "C" fn(c_int, *mut c_void, *mut Comm, DevHandle) -> ncclResult_t,
    pub accept: Accept,
    pub regMr: RegMr,
    pub regMrDmaBuf: Option<RegMrDmaBuf>,
    pub deregMr: DeregMr,
    pub isend: unsafe extern "C" fn(
        Comm,
        *mut c_void,
        c_int,
        c_int,
        *mut c_void,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub irecv: unsafe extern "C" fn(
        Comm,
        c_int,
        *mut *mut c_void,
        *mut c_int,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub iflush: Iflush,
    pub test: Test,
    pub closeSend: Close,
    pub closeRecv: Close,
    pub closeListen: Close,
    pub getDeviceMr: Option<GetDeviceMr>,
    pub irecvConsumed: Option<IrecvConsumed>,
}

#[repr(C)]
pub struct ncclNet_v9_t {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t,
    pub devices: Devices,
    pub getProperties: unsafe extern "C" fn(c_int, *mut ncclNetProperties_v9_t) -> ncclResult_t,
    pub listen: unsafe extern "C" fn(c_int, *mut c_void, *mut Comm) -> ncclResult_t,
    pub connect: unsafe extern "C" fn(c_int, *mut c_void, *mut Comm, DevHandle) -> ncclResult_t,
    pub accept: Accept,
    pub regMr: RegMr,
    pub regMrDmaBuf: Option<RegMrDmaBuf>,
    pub deregMr: DeregMr,
    pub isend: unsafe extern "C" fn(
        Comm,
        *mut c_void,
        usize,
        c_int,
        *mut c_void,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub irecv: unsafe extern "C" fn(
        Comm,
        c_int,
        *mut *mut c_void,
        *mut usize,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub iflush: Iflush,
    pub test: Test,
    pub closeSend: Close,
    pub closeRecv: Close,
    pub closeListen: Close,
    pub getDeviceMr: Option<GetDeviceMr>,
    pub irecvConsumed: Option<IrecvConsumed>,
    pub makeVDevice:
        Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t>,
}

type IsendV10 = unsafe extern "C" fn(
    Comm,
    *mut c_void,
    usize,
    c_int,
    *mut c_void,
    *mut c_void,
    *mut *mut c_void,
) -> ncclResult_t;
type IrecvV10 = unsafe extern "C" fn(
    Comm,
    c_int,
    *mut *mut c_void,
    *mut usize,
    *mut c_int,
    *mut *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> ncclResult_t;

#[repr(C)]
pub struct ncclNet_v10_t {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(ncclDebugLogger_t, ncclProfilerCallback_t) -> ncclResult_t,
    pub devices: Devices,
    pub getProperties: unsafe extern "C" fn(c_int, *mut ncclNetProperties_v9_t) -> ncclResult_t,
    pub listen: unsafe extern "C" fn(c_int, *mut c_void, *mut Comm) -> ncclResult_t,
    pub connect: unsafe extern "C" fn(
        c_int,
        *mut ncclNetCommConfig_t,
        *mut c_void,
        *mut Comm,
        DevHandle,
    ) -> ncclResult_t,
    pub accept: Accept,
    pub regMr: RegMr,
    pub regMrDmaBuf: Option<RegMrDmaBuf>,
    pub deregMr: DeregMr,
    pub isend: IsendV10,
    pub irecv: IrecvV10,
    pub iflush: Iflush,
    pub test: Test,
    pub closeSend: Close,
    pub closeRecv: Close,
    pub closeListen: Close,
    pub getDeviceMr: Option<GetDeviceMr>,
    pub irecvConsumed: Option<IrecvConsumed>,
    pub makeVDevice:
        Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t>,
}

type InitV11 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut ncclNetCommConfig_t,
    ncclDebugLogger_t,
    ncclProfilerCallback_t,
) -> ncclResult_t;

#[repr(C)]
pub struct ncclNet_v11_t {
    pub name: *const c_char,
    pub init: InitV11,
    pub devices: Devices,
    pub getProperties: unsafe extern "C" fn(c_int, *mut ncclNetProperties_v11_t) -> ncclResult_t,
    pub listen: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut Comm) -> ncclResult_t,
    pub connect:
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut Comm, DevHandle) -> ncclResult_t,
    pub accept: Accept,
    pub regMr: RegMr,
    pub regMrDmaBuf: Option<RegMrDmaBuf>,
    pub deregMr: DeregMr,
    pub isend: IsendV10,
    pub irecv: IrecvV10,
    pub iflush: Iflush,
    pub test: Test,
    pub closeSend: Close,
    pub closeRecv: Close,
    pub closeListen: Close,
    pub getDeviceMr: Option<GetDeviceMr>,
    pub irecvConsumed: Option<IrecvConsumed>,
    pub makeVDevice:
        Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t>,
    pub finalize: unsafe extern "C" fn(*mut c_void) -> ncclResult_t,
    pub setNetAttr: Option<unsafe extern "C" fn(*mut c_void, *mut ncclNetAttr_t) -> ncclResult_t>,
}

#[repr(C)]
pub struct ncclNet_v12_t {
    pub name: *const c_char,
    pub init: InitV11,
    pub devices: Devices,
    pub getProperties: unsafe extern "C" fn(c_int, *mut ncclNetProperties_v12_t) -> ncclResult_t,
    pub listen: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut Comm) -> ncclResult_t,
    pub connect:
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut Comm, DevHandle) -> ncclResult_t,
    pub accept: Accept,
    pub regMr: RegMr,
    pub regMrDmaBuf: Option<RegMrDmaBuf>,
    pub deregMr: DeregMr,
    pub isend: IsendV10,
    pub irecv: IrecvV10,
    pub iflush: Iflush,
    pub test: Test,
    pub closeSend: Close,
    pub closeRecv: Close,
    pub closeListen: Close,
    pub getDeviceMr: Option<GetDeviceMr>,
    pub irecvConsumed: Option<IrecvConsumed>,
    pub makeVDevice:
        Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v12_t) -> ncclResult_t>,
    pub finalize: unsafe extern "C" fn(*mut c_void) -> ncclResult_t,
    pub setNetAttr: Option<unsafe extern "C" fn(*mut c_void, *mut ncclNetAttr_t) -> ncclResult_t>,
}

// SAFETY: the tables are immutable after construction; `name` points at a static C string.
unsafe impl Sync for ncclNet_v8_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v9_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v10_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v11_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v12_t {}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    const P: usize = size_of::<usize>();

    #[test]
    fn properties_layouts_match_the_headers() {
        // v8: name, pciPath, guid, ptrSupport, regIsGlobal, speed, port, latency, maxComms,
        // maxRecvs, netDeviceType, netDeviceVersion.
        assert_eq!(offset_of!(ncclNetProperties_v8_t, guid), 16);
        assert_eq!(offset_of!(ncclNetProperties_v8_t, speed), 32);
        assert_eq!(offset_of!(ncclNetProperties_v8_t, latency), 40);
        assert_eq!(offset_of!(ncclNetProperties_v8_t, netDeviceVersion), 56);
        assert_eq!(size_of::<ncclNetProperties_v8_t>(), 64);
        // v9/v10: forceFlush after regIsGlobal, vProps {ndevs, devs[4]}, two size_t.
        assert_eq!(offset_of!(ncclNetProperties_v9_t, forceFlush), 32);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, speed), 36);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, vProps), 64);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, maxP2pBytes), 88);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, maxCollBytes), 96);
        assert_eq!(size_of::<ncclNetProperties_v9_t>(), 104);
        // v11: + maxMultiRequestSize.
        assert_eq!(
            offset_of!(ncclNetProperties_v11_t, maxMultiRequestSize),
            104
        );
        assert_eq!(size_of::<ncclNetProperties_v11_t>(), 112);
        // v12: vProps devs[8], + railId, planeId.
        assert_eq!(offset_of!(ncclNetProperties_v12_t, maxP2pBytes), 104);
        assert_eq!(
            offset_of!(ncclNetProperties_v12_t, maxMultiRequestSize),
            120
        );
        assert_eq!(offset_of!(ncclNetProperties_v12_t, railId), 124);
        assert_eq!(offset_of!(ncclNetProperties_v12_t, planeId), 126);
        assert_eq!(size_of::<ncclNetProperties_v12_t>(), 128);
        assert_eq!(size_of::<ncclNetDeviceHandle_t>(), 32);
        assert_eq!(size_of::<ncclNetAttr_t>(), 44);
    }

    #[test]
    fn tables_have_one_pointer_per_field() {
        // name + 18 functions (v8), + makeVDevice (v9, v10), + finalize, setNetAttr (v11, v12).
        assert_eq!(size_of::<ncclNet_v8_t>(), 19 * P);
        assert_eq!(size_of::<ncclNet_v9_t>(), 20 * P);
        assert_eq!(size_of::<ncclNet_v10_t>(), 20 * P);
        assert_eq!(size_of::<ncclNet_v11_t>(), 22 * P);
        assert_eq!(size_of::<ncclNet_v12_t>(), 22 * P);
        assert_eq!(offset_of!(ncclNet_v8_t, test), 13 * P);
        assert_eq!(offset_of!(ncclNet_v9_t, makeVDevice), 19 * P);
        assert_eq!(offset_of!(ncclNet_v11_t, finalize), 20 * P);
        assert_eq!(offset_of!(ncclNet_v12_t, setNetAttr), 21 * P);
    }
}
