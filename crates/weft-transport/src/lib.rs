//! weft's transport: unidirectional send/receive connections whose handshake runs over the
//! management interface and whose bytes run over the data interfaces ("rails").
//!
//! It is for the NCCL plugin (`weft-nccl-net`) and for weft's own tools (a bench binary): one
//! API, no NCCL types. It is not a general RPC layer: connections are one-way, messages are
//! matched in posting order, and buffers are raw memory the caller keeps alive.
//!
//! Layers: [`proto`] is the wire protocol as pure state machines (no I/O, time passed in);
//! [`tcp`] is the TCP backend (control stream + `n` data streams per connection, helper threads
//! optional); [`config`] reads the `WEFT_*` environment variables; [`iface`] finds interfaces.
//!
//! ```no_run
//! use weft_transport::{Config, Transport};
//! let t = Transport::new(Config::from_env()?)?;
//! let mut listener = t.listen(0)?;             // receiver
//! let handle = listener.handle();              // ship these 128 bytes to the sender
//! let mut connecting = t.connect(0, &handle)?; // sender
//! let (mut tx, mut rx) = (None, None);         // both sides poll; here in one thread
//! while tx.is_none() || rx.is_none() {
//!     if tx.is_none() { tx = connecting.poll()?; }
//!     if rx.is_none() { rx = listener.accept()?; }
//! }
//! let (mut tx, mut rx) = (tx.unwrap(), rx.unwrap());
//! tx.send(b"hello", 7)?;
//! let mut buf = [0u8; 64];
//! assert_eq!(rx.recv(&mut buf, 7)?, 5);
//! # Ok::<(), weft_transport::Error>(())
//! ```

pub mod config;
mod error;
pub mod iface;
pub mod proto;
pub mod tcp;

pub use config::{Config, ENV_VARS, IfSpec};
pub use error::{Error, Result, Stage};
pub use tcp::{
    Completed, Connecting, Device, Listener, MAX_RECV_REQUESTS, MAX_RECVS, MAX_SEND_REQUESTS, Rail,
    RecvBuf, RecvConn, RequestId, SendConn, Transport,
};
