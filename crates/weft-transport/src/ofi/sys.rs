//! The part of libfabric 1.17's C API the backend uses, written out from `/usr/include/rdma/*.h`
//! (`fabric.h`, `fi_domain.h`, `fi_endpoint.h`, `fi_eq.h`, `fi_rma.h`, `fi_cm.h`).
//!
//! libfabric is opened at run time ([`Lib::open`]), never linked: NCCL opens plugins with
//! `RTLD_NOW`, so a hard dependency on an absent `libfabric.so.1` would make the whole plugin fail
//! to load. Only four functions are real symbols (`fi_getinfo`, `fi_freeinfo`, `fi_dupinfo`,
//! `fi_fabric`, plus `fi_strerror`); everything else in the C API is a `static inline` function
//! that calls through the ops tables inside the objects, which is why the structs below must match
//! the C layout exactly. The test `layout_matches_c_headers` compiles a C program against the
//! installed headers and compares every size and offset used here.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_void};

/// `fi_addr_t`.
pub type fi_addr_t = u64;
/// Any source: where an endpoint without a peer (a shared one) receives from.
pub const FI_ADDR_UNSPEC: fi_addr_t = u64::MAX;

/// `FI_VERSION(1, 17)`: the API version the structs below describe.
pub const FI_VERSION_1_17: u32 = (1 << 16) | 17;

pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_TRANSMIT: u64 = FI_SEND;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
pub const FI_HMEM: u64 = 1 << 47;
pub const FI_LOCAL_COMM: u64 = 1 << 51;
pub const FI_REMOTE_COMM: u64 = 1 << 52;
/// Mode bit: every operation's context points at a `fi_context` the provider may use.
pub const FI_CONTEXT: u64 = 1 << 59;
/// Mode bit: the same with a `fi_context2` (64 bytes).
pub const FI_CONTEXT2: u64 = 1 << 52;
/// Mode bit: remote CQ data consumes a posted receive.
pub const FI_RX_CQ_DATA: u64 = 1 << 56;
pub const FI_ORDER_SAS: u64 = 1 << 8;

pub const FI_MR_LOCAL: c_int = 1 << 2;
pub const FI_MR_RAW: c_int = 1 << 3;
pub const FI_MR_VIRT_ADDR: c_int = 1 << 4;
pub const FI_MR_ALLOCATED: c_int = 1 << 5;
pub const FI_MR_PROV_KEY: c_int = 1 << 6;
pub const FI_MR_MMU_NOTIFY: c_int = 1 << 7;
pub const FI_MR_RMA_EVENT: c_int = 1 << 8;
pub const FI_MR_ENDPOINT: c_int = 1 << 9;
pub const FI_MR_HMEM: c_int = 1 << 10;
/// The old `FI_MR_BASIC` mode (= LOCAL-less VIRT_ADDR | PROV_KEY | ALLOCATED).
pub const FI_MR_BASIC: c_int = 1;
/// The old `FI_MR_SCALABLE` mode (no bits).
pub const FI_MR_SCALABLE: c_int = 2;

/// `enum fi_ep_type`.
pub const FI_EP_RDM: c_int = 3;
/// `enum fi_threading`.
pub const FI_THREAD_SAFE: c_int = 1;
/// `enum fi_progress`.
pub const FI_PROGRESS_AUTO: c_int = 1;
pub const FI_PROGRESS_MANUAL: c_int = 2;
/// `enum fi_av_type`.
pub const FI_AV_UNSPEC: c_int = 0;
/// `enum fi_cq_format`.
pub const FI_CQ_FORMAT_DATA: c_int = 3;
/// `enum fi_wait_obj`.
pub const FI_WAIT_NONE: c_int = 0;
/// Control command of `fi_enable` / `fi_mr_enable`.
pub const FI_ENABLE: c_int = 6;

pub const FI_EAGAIN: isize = libc::EAGAIN as isize;
pub const FI_EAVAIL: isize = 259;

type Unused = Option<unsafe extern "C" fn()>;

#[repr(C)]
pub struct fi_ops {
    pub size: usize,
    pub close: Option<unsafe extern "C" fn(*mut fid) -> c_int>,
    pub bind: Option<unsafe extern "C" fn(*mut fid, *mut fid, u64) -> c_int>,
    pub control: Option<unsafe extern "C" fn(*mut fid, c_int, *mut c_void) -> c_int>,
    pub ops_open: Unused,
    pub tostr: Unused,
    pub ops_set: Unused,
}

#[repr(C)]
pub struct fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *mut fi_ops,
}

#[repr(C)]
pub struct fi_tx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct fi_rx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

#[repr(C)]
pub struct fi_ep_attr {
    pub type_: c_int,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    pub msg_prefix_size: usize,
    pub max_order_raw_size: usize,
    pub max_order_war_size: usize,
    pub max_order_waw_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
}

#[repr(C)]
pub struct fi_domain_attr {
    pub domain: *mut fid_domain,
    pub name: *mut c_char,
    pub threading: c_int,
    pub control_progress: c_int,
    pub data_progress: c_int,
    pub resource_mgmt: c_int,
    pub av_type: c_int,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub cq_cnt: usize,
    pub ep_cnt: usize,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub max_ep_tx_ctx: usize,
    pub max_ep_rx_ctx: usize,
    pub max_ep_stx_ctx: usize,
    pub max_ep_srx_ctx: usize,
    pub cntr_cnt: usize,
    pub mr_iov_limit: usize,
    pub caps: u64,
    pub mode: u64,
    pub auth_key: *mut u8,
    pub auth_key_size: usize,
    pub max_err_data: usize,
    pub mr_cnt: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct fi_fabric_attr {
    pub fabric: *mut fid_fabric,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_info {
    pub next: *mut fi_info,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut fid,
    pub tx_attr: *mut fi_tx_attr,
    pub rx_attr: *mut fi_rx_attr,
    pub ep_attr: *mut fi_ep_attr,
    pub domain_attr: *mut fi_domain_attr,
    pub fabric_attr: *mut fi_fabric_attr,
    pub nic: *mut c_void,
}

#[repr(C)]
pub struct fi_ops_fabric {
    pub size: usize,
    pub domain: Option<
        unsafe extern "C" fn(
            *mut fid_fabric,
            *mut fi_info,
            *mut *mut fid_domain,
            *mut c_void,
        ) -> c_int,
    >,
    pub passive_ep: Unused,
    pub eq_open: Unused,
    pub wait_open: Unused,
    pub trywait: Unused,
    pub domain2: Unused,
}

#[repr(C)]
pub struct fid_fabric {
    pub fid: fid,
    pub ops: *mut fi_ops_fabric,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_ops_domain {
    pub size: usize,
    pub av_open: Option<
        unsafe extern "C" fn(
            *mut fid_domain,
            *mut fi_av_attr,
            *mut *mut fid_av,
            *mut c_void,
        ) -> c_int,
    >,
    pub cq_open: Option<
        unsafe extern "C" fn(
            *mut fid_domain,
            *mut fi_cq_attr,
            *mut *mut fid_cq,
            *mut c_void,
        ) -> c_int,
    >,
    pub endpoint: Option<
        unsafe extern "C" fn(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, *mut c_void) -> c_int,
    >,
    pub scalable_ep: Unused,
    pub cntr_open: Unused,
    pub poll_open: Unused,
    pub stx_ctx: Unused,
    pub srx_ctx: Unused,
    pub query_atomic: Unused,
    pub query_collective: Unused,
    pub endpoint2: Unused,
}

#[repr(C)]
pub struct fi_ops_mr {
    pub size: usize,
    #[allow(clippy::type_complexity)]
    pub reg: Option<
        unsafe extern "C" fn(
            *mut fid,
            *const c_void,
            usize,
            u64,
            u64,
            u64,
            u64,
            *mut *mut fid_mr,
            *mut c_void,
        ) -> c_int,
    >,
    pub regv: Unused,
    pub regattr: Unused,
}

#[repr(C)]
pub struct fid_domain {
    pub fid: fid,
    pub ops: *mut fi_ops_domain,
    pub mr: *mut fi_ops_mr,
}

#[repr(C)]
pub struct fid_mr {
    pub fid: fid,
    pub mem_desc: *mut c_void,
    pub key: u64,
}

#[repr(C)]
pub struct fi_av_attr {
    pub type_: c_int,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

#[repr(C)]
pub struct fi_ops_av {
    pub size: usize,
    pub insert: Option<
        unsafe extern "C" fn(
            *mut fid_av,
            *const c_void,
            usize,
            *mut fi_addr_t,
            u64,
            *mut c_void,
        ) -> c_int,
    >,
    pub insertsvc: Unused,
    pub insertsym: Unused,
    pub remove: Unused,
    pub lookup: Unused,
    pub straddr: Unused,
    pub av_set: Unused,
}

#[repr(C)]
pub struct fid_av {
    pub fid: fid,
    pub ops: *mut fi_ops_av,
}

#[repr(C)]
pub struct fi_cq_attr {
    pub size: usize,
    pub flags: u64,
    pub format: c_int,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_cond: c_int,
    pub wait_set: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fi_cq_data_entry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
}

impl Default for fi_cq_data_entry {
    /// An empty entry to read into.
    fn default() -> fi_cq_data_entry {
        fi_cq_data_entry {
            op_context: std::ptr::null_mut(),
            flags: 0,
            len: 0,
            buf: std::ptr::null_mut(),
            data: 0,
        }
    }
}

#[repr(C)]
pub struct fi_cq_err_entry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

#[repr(C)]
pub struct fi_ops_cq {
    pub size: usize,
    pub read: Option<unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize) -> isize>,
    pub readfrom: Unused,
    pub readerr: Option<unsafe extern "C" fn(*mut fid_cq, *mut fi_cq_err_entry, u64) -> isize>,
    pub sread: Unused,
    pub sreadfrom: Unused,
    pub signal: Unused,
    pub strerror: Unused,
}

#[repr(C)]
pub struct fid_cq {
    pub fid: fid,
    pub ops: *mut fi_ops_cq,
}

#[repr(C)]
pub struct fi_ops_ep {
    pub size: usize,
    pub cancel: Unused,
    pub getopt: Unused,
    pub setopt: Unused,
    pub tx_ctx: Unused,
    pub rx_ctx: Unused,
    pub rx_size_left: Unused,
    pub tx_size_left: Unused,
}

#[repr(C)]
pub struct fi_ops_cm {
    pub size: usize,
    pub setname: Unused,
    pub getname: Option<unsafe extern "C" fn(*mut fid, *mut c_void, *mut usize) -> c_int>,
    pub getpeer: Unused,
    pub connect: Unused,
    pub listen: Unused,
    pub accept: Unused,
    pub reject: Unused,
    pub shutdown: Unused,
    pub join: Unused,
}

#[repr(C)]
pub struct fi_ops_msg {
    pub size: usize,
    pub recv: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *mut c_void,
            usize,
            *mut c_void,
            fi_addr_t,
            *mut c_void,
        ) -> isize,
    >,
    pub recvv: Unused,
    pub recvmsg: Unused,
    pub send: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *const c_void,
            usize,
            *mut c_void,
            fi_addr_t,
            *mut c_void,
        ) -> isize,
    >,
    pub sendv: Unused,
    pub sendmsg: Unused,
    pub inject: Option<unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, fi_addr_t) -> isize>,
    #[allow(clippy::type_complexity)]
    pub senddata: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *const c_void,
            usize,
            *mut c_void,
            u64,
            fi_addr_t,
            *mut c_void,
        ) -> isize,
    >,
    pub injectdata: Unused,
}

#[repr(C)]
pub struct fi_ops_rma {
    pub size: usize,
    pub read: Unused,
    pub readv: Unused,
    pub readmsg: Unused,
    pub write: Unused,
    pub writev: Unused,
    pub writemsg: Unused,
    pub inject: Unused,
    #[allow(clippy::type_complexity)]
    pub writedata: Option<
        unsafe extern "C" fn(
            *mut fid_ep,
            *const c_void,
            usize,
            *mut c_void,
            u64,
            fi_addr_t,
            u64,
            u64,
            *mut c_void,
        ) -> isize,
    >,
    pub injectdata: Unused,
}

#[repr(C)]
pub struct fid_ep {
    pub fid: fid,
    pub ops: *mut fi_ops_ep,
    pub cm: *mut fi_ops_cm,
    pub msg: *mut fi_ops_msg,
    pub rma: *mut fi_ops_rma,
    pub tagged: *mut c_void,
    pub atomic: *mut c_void,
    pub collective: *mut c_void,
}

/// `struct fi_context2`: room the provider may use inside each operation's context.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fi_context2 {
    pub internal: [*mut c_void; 8],
}

impl Default for fi_context2 {
    fn default() -> fi_context2 {
        fi_context2 {
            internal: [std::ptr::null_mut(); 8],
        }
    }
}

type GetInfo = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const fi_info,
    *mut *mut fi_info,
) -> c_int;
type FreeInfo = unsafe extern "C" fn(*mut fi_info);
type DupInfo = unsafe extern "C" fn(*const fi_info) -> *mut fi_info;
type Fabric = unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int;
type StrError = unsafe extern "C" fn(c_int) -> *const c_char;

/// libfabric, opened at run time, with the five real symbols resolved.
pub struct Lib {
    pub getinfo: GetInfo,
    pub freeinfo: FreeInfo,
    pub dupinfo: DupInfo,
    pub fabric: Fabric,
    pub strerror: StrError,
    /// Keeps the library mapped while the function pointers above are used.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("libfabric")
    }
}

/// Where libfabric is looked for; `WEFT_OFI_LIBRARY` overrides it.
pub const LIB_NAME: &str = "libfabric.so.1";

impl Lib {
    /// Opens `name` (default [`LIB_NAME`]) and resolves the symbols; the error says why not.
    pub fn open(name: &str) -> Result<Lib, super::fabric::FiError> {
        let load = |message: String| super::fabric::FiError::Load {
            library: name.to_string(),
            message,
        };
        // SAFETY: loading libfabric runs its constructors, which only initialise its own state
        // (provider list, logging); nothing of ours runs concurrently with them.
        let lib = unsafe { libloading::Library::new(name) }.map_err(|e| load(e.to_string()))?;
        macro_rules! sym {
            ($n:literal, $t:ty) => {{
                // SAFETY: the symbol is declared in fabric.h / fi_errno.h with exactly this
                // signature (checked against libfabric 1.17's headers); `lib` outlives the copy
                // because both are moved into the returned `Lib`.
                let s: libloading::Symbol<'_, $t> = unsafe { lib.get($n) }
                    .map_err(|e| load(format!("{}: {e}", String::from_utf8_lossy($n))))?;
                *s
            }};
        }
        let getinfo = sym!(b"fi_getinfo\0", GetInfo);
        let freeinfo = sym!(b"fi_freeinfo\0", FreeInfo);
        let dupinfo = sym!(b"fi_dupinfo\0", DupInfo);
        let fabric = sym!(b"fi_fabric\0", Fabric);
        let strerror = sym!(b"fi_strerror\0", StrError);
        Ok(Lib {
            getinfo,
            freeinfo,
            dupinfo,
            fabric,
            strerror,
            _lib: lib,
        })
    }

    /// `fi_strerror` of a (positive or negative) libfabric error code.
    pub fn error_string(&self, code: isize) -> String {
        let c = c_int::try_from(code.unsigned_abs()).unwrap_or(c_int::MAX);
        // SAFETY: fi_strerror accepts any int and returns a static NUL-terminated string.
        let p = unsafe { (self.strerror)(c) };
        if p.is_null() {
            return format!("error {c}");
        }
        // SAFETY: non-null, NUL-terminated, static (see above).
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// (C expression, value in Rust) for every struct size and field offset this module uses.
    fn rust_layout() -> Vec<(&'static str, usize)> {
        macro_rules! l {
            ($v:ident; $s:literal, $t:ty; $($cf:literal => $rf:ident),* $(,)?) => {
                $v.push((concat!("sizeof(struct ", $s, ")"), size_of::<$t>()));
                $( $v.push((concat!("offsetof(struct ", $s, ", ", $cf, ")"), offset_of!($t, $rf))); )*
            };
        }
        let mut v = Vec::new();
        l!(v; "fi_ops", fi_ops; "close" => close, "bind" => bind, "control" => control, "ops_set" => ops_set);
        l!(v; "fid", fid; "fclass" => fclass, "context" => context, "ops" => ops);
        l!(v; "fi_tx_attr", fi_tx_attr; "caps" => caps, "mode" => mode, "msg_order" => msg_order,
           "inject_size" => inject_size, "size" => size, "rma_iov_limit" => rma_iov_limit, "tclass" => tclass);
        l!(v; "fi_rx_attr", fi_rx_attr; "caps" => caps, "mode" => mode, "msg_order" => msg_order,
           "total_buffered_recv" => total_buffered_recv, "size" => size, "iov_limit" => iov_limit);
        l!(v; "fi_ep_attr", fi_ep_attr; "type" => type_, "protocol" => protocol, "max_msg_size" => max_msg_size,
           "mem_tag_format" => mem_tag_format, "auth_key_size" => auth_key_size, "auth_key" => auth_key);
        l!(v; "fi_domain_attr", fi_domain_attr; "domain" => domain, "name" => name, "threading" => threading,
           "control_progress" => control_progress, "data_progress" => data_progress,
           "resource_mgmt" => resource_mgmt, "av_type" => av_type, "mr_mode" => mr_mode,
           "mr_key_size" => mr_key_size, "cq_data_size" => cq_data_size, "mr_iov_limit" => mr_iov_limit,
           "caps" => caps, "mode" => mode, "auth_key" => auth_key, "max_err_data" => max_err_data,
           "mr_cnt" => mr_cnt, "tclass" => tclass);
        l!(v; "fi_fabric_attr", fi_fabric_attr; "fabric" => fabric, "name" => name, "prov_name" => prov_name,
           "prov_version" => prov_version, "api_version" => api_version);
        l!(v; "fi_info", fi_info; "next" => next, "caps" => caps, "mode" => mode, "addr_format" => addr_format,
           "src_addrlen" => src_addrlen, "dest_addrlen" => dest_addrlen, "src_addr" => src_addr,
           "dest_addr" => dest_addr, "handle" => handle, "tx_attr" => tx_attr, "rx_attr" => rx_attr,
           "ep_attr" => ep_attr, "domain_attr" => domain_attr, "fabric_attr" => fabric_attr, "nic" => nic);
        l!(v; "fi_ops_fabric", fi_ops_fabric; "domain" => domain, "domain2" => domain2);
        l!(v; "fid_fabric", fid_fabric; "fid" => fid, "ops" => ops, "api_version" => api_version);
        l!(v; "fi_ops_domain", fi_ops_domain; "av_open" => av_open, "cq_open" => cq_open,
           "endpoint" => endpoint, "endpoint2" => endpoint2);
        l!(v; "fi_ops_mr", fi_ops_mr; "reg" => reg, "regattr" => regattr);
        l!(v; "fid_domain", fid_domain; "fid" => fid, "ops" => ops, "mr" => mr);
        l!(v; "fid_mr", fid_mr; "fid" => fid, "mem_desc" => mem_desc, "key" => key);
        l!(v; "fi_av_attr", fi_av_attr; "type" => type_, "count" => count, "name" => name, "flags" => flags);
        l!(v; "fi_ops_av", fi_ops_av; "insert" => insert, "av_set" => av_set);
        l!(v; "fid_av", fid_av; "fid" => fid, "ops" => ops);
        l!(v; "fi_cq_attr", fi_cq_attr; "size" => size, "flags" => flags, "format" => format,
           "wait_obj" => wait_obj, "wait_cond" => wait_cond, "wait_set" => wait_set);
        l!(v; "fi_cq_data_entry", fi_cq_data_entry; "op_context" => op_context, "flags" => flags,
           "len" => len, "buf" => buf, "data" => data);
        l!(v; "fi_cq_err_entry", fi_cq_err_entry; "op_context" => op_context, "flags" => flags,
           "len" => len, "data" => data, "olen" => olen, "err" => err, "prov_errno" => prov_errno,
           "err_data" => err_data, "err_data_size" => err_data_size);
        l!(v; "fi_ops_cq", fi_ops_cq; "read" => read, "readerr" => readerr, "strerror" => strerror);
        l!(v; "fid_cq", fid_cq; "fid" => fid, "ops" => ops);
        l!(v; "fi_ops_ep", fi_ops_ep; "tx_size_left" => tx_size_left);
        l!(v; "fi_ops_cm", fi_ops_cm; "getname" => getname, "join" => join);
        l!(v; "fi_ops_msg", fi_ops_msg; "recv" => recv, "send" => send, "inject" => inject,
           "senddata" => senddata, "injectdata" => injectdata);
        l!(v; "fi_ops_rma", fi_ops_rma; "writedata" => writedata, "injectdata" => injectdata);
        l!(v; "fid_ep", fid_ep; "fid" => fid, "ops" => ops, "cm" => cm, "msg" => msg, "rma" => rma,
           "tagged" => tagged, "collective" => collective);
        l!(v; "fi_context2", fi_context2; "internal" => internal);
        v
    }

    fn constants() -> Vec<(&'static str, i128)> {
        let mut v: Vec<(&'static str, i128)> = Vec::new();
        macro_rules! c {
            ($($n:ident),*) => { $( v.push((stringify!($n), $n as i128)); )* };
        }
        c!(
            FI_MSG,
            FI_RMA,
            FI_READ,
            FI_WRITE,
            FI_RECV,
            FI_SEND,
            FI_REMOTE_READ,
            FI_REMOTE_WRITE,
            FI_REMOTE_CQ_DATA,
            FI_HMEM,
            FI_LOCAL_COMM,
            FI_REMOTE_COMM,
            FI_CONTEXT,
            FI_CONTEXT2,
            FI_RX_CQ_DATA,
            FI_ORDER_SAS,
            FI_MR_LOCAL,
            FI_MR_RAW,
            FI_MR_VIRT_ADDR,
            FI_MR_ALLOCATED,
            FI_MR_PROV_KEY,
            FI_MR_MMU_NOTIFY,
            FI_MR_RMA_EVENT,
            FI_MR_ENDPOINT,
            FI_MR_HMEM,
            FI_MR_BASIC,
            FI_MR_SCALABLE,
            FI_EP_RDM,
            FI_THREAD_SAFE,
            FI_PROGRESS_AUTO,
            FI_PROGRESS_MANUAL,
            FI_AV_UNSPEC,
            FI_CQ_FORMAT_DATA,
            FI_WAIT_NONE,
            FI_ENABLE,
            FI_EAGAIN,
            FI_EAVAIL
        );
        // ((uint64_t)-1), printed as a long long.
        v.push(("FI_ADDR_UNSPEC", i128::from(FI_ADDR_UNSPEC as i64)));
        v.push((
            "FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)",
            i128::from(FI_VERSION_1_17),
        ));
        v
    }

    /// Compiles a C program against the installed libfabric headers that prints the same sizes,
    /// offsets and constants, and compares. Skipped (with a note) without `cc` or the headers.
    #[test]
    fn layout_matches_c_headers() {
        if !std::path::Path::new("/usr/include/rdma/fabric.h").exists() {
            weft_netns::require::skip(
                "layout_matches_c_headers",
                "/usr/include/rdma/fabric.h absent (package libfabric-dev)",
            );
            return;
        }
        let dir = std::env::temp_dir().join(format!("weft-ofi-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let layout = rust_layout();
        let consts = constants();
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/fabric.h>\n\
             #include <rdma/fi_domain.h>\n#include <rdma/fi_endpoint.h>\n#include <rdma/fi_eq.h>\n\
             #include <rdma/fi_rma.h>\n#include <rdma/fi_cm.h>\n#include <rdma/fi_errno.h>\n\
             int main(void) {\n",
        );
        for (expr, _) in &layout {
            c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        for (name, _) in &consts {
            c.push_str(&format!("  printf(\"%lld\\n\", (long long)({name}));\n"));
        }
        c.push_str("  return 0;\n}\n");
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, c).unwrap();
        let cc = match std::process::Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                weft_netns::require::skip(
                    "layout_matches_c_headers",
                    &format!("no C compiler (cc: {e})"),
                );
                return;
            }
        };
        assert!(
            cc.status.success(),
            "cc failed: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = std::process::Command::new(&exe).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        let mut bad = Vec::new();
        for (expr, rust) in &layout {
            let cval: usize = lines.next().unwrap().parse().unwrap();
            if cval != *rust {
                bad.push(format!("{expr}: C {cval}, Rust {rust}"));
            }
        }
        for (name, rust) in &consts {
            let cval: i128 = lines.next().unwrap().parse().unwrap();
            if cval != *rust {
                bad.push(format!("{name}: C {cval}, Rust {rust}"));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            bad.is_empty(),
            "layout differs from the C headers:\n{}",
            bad.join("\n")
        );
        eprintln!(
            "{} sizes/offsets and {} constants match",
            layout.len(),
            consts.len()
        );
    }
}
