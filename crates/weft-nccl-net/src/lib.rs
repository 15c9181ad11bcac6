//! `libnccl-net-weft.so`: the NCCL network plugin of weft. NCCL loads it with
//! `NCCL_NET_PLUGIN=weft` and uses it as its network ("NET/weft" in NCCL's logs): the handshake
//! of every connection runs over the management interface, the bytes over the data interfaces.
//!
//! This crate is only the C ABI: the `ncclNet_v8_t` … `ncclNet_v12_t` tables (the only exported
//! symbols are `ncclNetPlugin_v8` … `ncclNetPlugin_v12`), each a thin adapter over one internal
//! API, which in turn is a thin layer over `weft-transport`. No protocol logic lives here.
//!
//! Building and installing: `cargo build --release -p weft-nccl-net` produces
//! `target/release/libnccl_net_weft.so`; copy it as `libnccl-net-weft.so` into a directory on
//! `LD_LIBRARY_PATH` (or pass its full path in `NCCL_NET_PLUGIN`):
//!
//! ```text
//! install -m 0755 target/release/libnccl_net_weft.so /opt/weft/lib/libnccl-net-weft.so
//! LD_LIBRARY_PATH=/opt/weft/lib NCCL_NET_PLUGIN=weft NCCL_NET=weft \
//!   WEFT_MGMT_IFNAME=eno1 WEFT_DATA_IFNAME=enp65s0f0,enp65s0f1 WEFT_TIMEOUT_MS=20000 \
//!   all_reduce_perf -b 8 -e 1G -f 2
//! ```
//!
//! Configuration is read once, at the first `init`, from the `WEFT_*` variables listed in
//! [`weft_transport::ENV_VARS`]. Every error is logged as a WARN line through NCCL's logger,
//! naming the peer address and the interface, and returned as an `ncclResult_t`; panics are
//! caught at every entry point and returned as `ncclInternalError`. Only host memory is
//! supported (`ptrSupport = NCCL_PTR_HOST`): NCCL stages GPU data through host buffers.
//!
//! From Rust (tests, tools) the tables are reachable as plain statics, e.g.
//! `nccl_net_weft::ncclNetPlugin_v8.name`.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod ffi;
mod guard;
mod plugin;
mod tables;

pub use tables::{
    ncclNetPlugin_v8, ncclNetPlugin_v9, ncclNetPlugin_v10, ncclNetPlugin_v11, ncclNetPlugin_v12,
};
