//! weft's transport: unidirectional send/receive connections whose handshake runs over the
//! management interface and whose every data-phase byte (message headers, inline small
//! messages, flow-control credits, bulk chunks) runs over the data interfaces ("rails").
//!
//! It is for the NCCL plugin (`weft-nccl-net`) and for weft's own tools (a bench binary): one
//! API, no NCCL types. It is not a general RPC layer: connections are one-way, messages are
//! matched per tag in posting order (the k-th send of a tag to the k-th buffer of that tag),
//! and buffers are raw memory the caller keeps alive.
//!
//! Layers: [`proto`] is the wire protocol as pure state machines (no I/O, time passed in);
//! [`tcp`] is the TCP backend (per connection a handshake stream on the management network, a
//! control stream and `n` data streams on the data rails, helper threads optional); [`ofi`] is
//! the libfabric backend (`WEFT_BACKEND=ofi`: RDMA writes over `verbs;ofi_rxm`, `tcp;ofi_rxm`,
//! `shm`; libfabric opened at run time, TCP when it is absent); [`config`]
//! reads the `WEFT_*` environment variables; [`iface`] finds interfaces.
//!
//! # Streams of a connection
//!
//! * **Handshake stream** (management network): HELLO, then ACK or REJECT. Afterwards it is the
//!   *side channel*: it carries nothing (no keepalive either) unless a side gives up, and then
//!   one ABORT frame, or a sender's bytes have not moved for a quarter of the timeout, and then
//!   PROBE, which the receiver's process answers with ALIVE (see "A frozen receiver" below).
//!   It is kept because when the data network is what died, the control stream cannot tell the
//!   peer why, the side channel can.
//! * **Control stream** (data network, to the listener's first data address): message headers,
//!   messages up to `WEFT_INLINE_BYTES` inline, CREDIT frames back, ABORT.
//! * **Data streams** (data network): the chunks of larger messages.
//!
//! # Failure detection: every wait bounded by `WEFT_TIMEOUT_MS`, slow peers allowed
//!
//! NCCL lets a receiver post its receive arbitrarily late, so a sender whose data stream's
//! window is closed cannot tell a slow receiver from a dead one, and TCP's own retransmission
//! limit takes ~15 minutes. weft therefore splits the question by who can answer it:
//!
//! * **A data stream that stops** (data link cut, peer host gone): the *receiver* knows when it
//!   is waiting for bytes that do not come (a posted receive whose message header arrived and a
//!   data stream that moved nothing for `timeout`). It fails, and sends an `ABORT` frame with
//!   the reason over both the control stream and the management side channel, so the sender
//!   fails at once with "peer … aborted the connection: …" even though the data path is dead.
//!   The same holds the other way: whichever side fails first sends `ABORT`.
//! * **A cut data link or a dead peer host**, whether or not a message is due: the control
//!   stream of both sides is watched by the kernel, so it works while the application is not
//!   calling in: keepalive probes every second once idle, and `TCP_USER_TIMEOUT = timeout`,
//!   which ends the connection (`ETIMEDOUT`) when sent bytes or probes stay unacknowledged that
//!   long. Both sides read their control stream (the sender at most every millisecond while
//!   polled), so they fail with the peer and the data interface named. Whichever side's timer
//!   fires first, the other hears its ABORT on the side channel if the management network is up.
//! * **A process that dies** (SIGKILL): its kernel closes or resets every stream; the other side
//!   fails on the next poll (a closed control stream is an error as soon as work is pending).
//! * **A slow receiver is not an error**: its kernel still acknowledges the control stream, and
//!   `TCP_USER_TIMEOUT`, which Linux also applies to a closed window, cannot fire on it because
//!   the control stream has credit-based flow control (`CREDIT` frames): a sender keeps at most
//!   [`proto::CTRL_WINDOW`] (32 KiB) unread by the receiver, so that window never closes. Data
//!   streams carry no `TCP_USER_TIMEOUT` (their window does close while a receiver is late;
//!   `WEFT_TCP_USER_TIMEOUT_MS` adds one for those who want that bound anyway). Like NCCL's own
//!   socket transport, weft never times out a receiver that posts late; once it has posted, its
//!   data must keep moving.
//! * **A frozen receiver** (SIGSTOP, or a process hung in the kernel) looks like a slow one to
//!   TCP: its kernel acknowledges, its window stays closed. So a sender whose bytes (control
//!   stream or data streams) have not moved for `timeout / 4` asks on the side channel (PROBE,
//!   again every `timeout / 4` while that lasts), and the receiver's process answers (ALIVE)
//!   from its application's polls or, while the application does not call in, from a thread
//!   that watches the side channels' unread bytes (module `alive`). A PROBE unanswered for
//!   `3/4 timeout` fails the sender with a timeout: about `timeout` after its last byte moved.
//!   A late receiver answers and is never an error. `WEFT_TCP_USER_TIMEOUT_MS` is not needed
//!   for this. A frozen *sender* is caught by the receiver's stall timer once the message's
//!   header is there (a sender stopped before it sent anything is indistinguishable from one
//!   that has not sent yet, which is legitimate).
//! * **The management network alone failing** during the data phase is not an error: the side
//!   channel only carries news, and its loss is noticed only if an ABORT must travel on it.
//!
//! Bounds: a stall or cut data link fails both sides `timeout` to `timeout + 1 s` after the
//! last byte moved (stall timer plus the helpers' 100 ms poll, or keepalive granularity); a dead
//! host, the same after it went silent; a killed process, at once. Every error names the peer
//! address and the local interface. Closing a send connection waits (at most 2 s, one round
//! trip when the peer is alive) until the receiver's kernel has acknowledged the control stream,
//! because Linux resets a socket closed with unread bytes (CREDIT) and drops what it had not sent.
//! The namespace tests of `weft-nccl-net` (`tests/cluster.rs`) check each case through the real
//! plugin, and check with interface byte counters that the management network is silent during
//! the data phase.
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

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod alive;
mod backend;
mod common;
pub mod config;
mod error;
pub mod iface;
pub mod ofi;
mod pingpong;
pub mod proto;
mod slab;
pub mod tcp;

pub use backend::{Connecting, Listener, MemHandle, RecvConn, SendConn, Transport};
pub use common::{
    Completed, Device, MAX_RECV_REQUESTS, MAX_RECVS, MAX_SEND_REQUESTS, Rail, RecvBuf, RequestId,
};
pub use config::{BackendKind, Config, ENV_VARS, IfSpec};
pub use error::{Error, Result, Stage};
pub use pingpong::{PingPong, ping_pong};
