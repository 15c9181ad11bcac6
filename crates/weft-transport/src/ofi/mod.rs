//! The libfabric backend: the RDMA data path. The same code runs on `verbs;ofi_rxm`
//! (InfiniBand, RoCE), `tcp;ofi_rxm` and `shm`: reliable-datagram endpoints (FI_EP_RDM), memory
//! registration with remote keys, RMA writes with remote CQ data, completion queues polled by
//! `test` (which is also what drives manual-progress providers).
//!
//! libfabric is opened at run time (see [`sys`]); without it the backend is "unavailable" and
//! [`crate::Transport`] uses the TCP backend.
//!
//! # Connection set-up (management network)
//!
//! The listen handle is the TCP backend's (nonce and management address, no data address). The
//! sender takes a port on the endpoint of each rail (see "Shared endpoints"), connects a TCP
//! stream to the management address and writes HELLO (`nstreams = 0`) followed by a MSG frame
//! whose inline payload is its *address record* (version 4: provider, `fi_getname` address of
//! each rail, eager slots, the bytes of remote CQ data it can use, and per rail the
//! connection's key and slot on that endpoint); the receiver checks the nonce, takes its ports
//! (as many rails as both sides have), `fi_av_insert`s the sender's addresses (once per
//! address and endpoint) and answers ACK plus its own record, which fixes what the connection
//! uses: the rails, and the remote CQ data size (the smaller of both sides', with, for 4 bytes,
//! where its size table is). Records of versions 1 and 2 (an endpoint per connection) and 3
//! (messages matched by sequence ranges, not by (tag, k)) are refused: both sides must run
//! this version. From then on
//! the TCP stream is the side channel, as in the TCP backend: silent except for one ABORT when
//! a side gives up, EOF when the peer process dies, and POSTED while a receive stalls (see
//! "Failure detection"). It is also the liveness watch of a dead peer *host* (keepalive,
//! `TCP_USER_TIMEOUT = timeout`), since an RDM endpoint has no connection whose death the
//! application would see.
//!
//! # Shared endpoints
//!
//! The connections of a process share one endpoint per device and rail (`shared.rs`): both
//! directions between two processes are one provider connection (with `tcp;ofi_rxm` one TCP
//! socket, not two, whose replies carry the acknowledgements), and any connection's poll drives
//! every connection's bytes. Messages (eager data, CTS) start with the receiving connection's
//! key and land in the endpoint's one pool of untagged receive buffers, so matching stays O(1)
//! however many connections there are; remote writes find their connection by the slot in
//! their 8-byte CQ data. A receiver with 4-byte remote CQ data (`verbs;ofi_rxm`) has no room
//! for the slot and takes an endpoint of its own. A poll routes what it reads to the
//! connections' inboxes under one lock; a connection closing on a shared endpoint waits for its
//! own sends (bounded) and leaks their memory if they did not finish. An endpoint one of whose
//! connections failed on the data path is never closed (see `shared::SharedEp`'s `Drop`).
//!
//! # Data path (data network), receiver-driven
//!
//! Messages and buffers are numbered *per tag*: the k-th `isend` of tag t on a connection is
//! message (t, k), the k-th posted buffer of tag t is buffer (t, k), and message (t, k) lands
//! in buffer (t, k), whichever way it travels (see "Out-of-step tags").
//! * **CTS**: each `irecv` of `n` buffers sends the sender one clear-to-send message (`fi_send`
//!   on rail 0, into the sender's endpoint's receive pool): per buffer its capacity, tag, the
//!   low 32 bits of its k (the sender takes the k with those bits nearest its own next one of
//!   that tag) and, per rail, its address (virtual, or offset without FI_MR_VIRT_ADDR) and
//!   remote key, plus the number of eager messages the receiver has consumed (eager credit).
//! * **Small receives** (every buffer at most [`EAGER_MAX`]): the CTS is held back
//!   (`CTS_DEFER`, 500 µs); a receive that all its messages reach eagerly meanwhile never
//!   sends it, so a small message costs one provider message (not a CTS, then a write), as in
//!   a ping-pong where each side posts its next receive just before it sends. A receive
//!   still incomplete then (the sender had no credit, or a message waiting behind one that
//!   waits for its CTS, or a message too large for it) sends its CTS, and from then on is like any
//!   other. A larger receive first sends the CTS of every small one before it that still
//!   waits. Eager credit without CTS: once [`EAGER_SLOTS`] / 2 consumed messages are
//!   unreported, a CTS of no buffers reports them. The sender never waits for credit: a send
//!   that cannot go eagerly waits for its buffer's CTS, which a receive missing a message
//!   sends.
//! * **RMA**: a send whose CTS is there is written straight into the receive buffer with
//!   `fi_writedata`, whose remote CQ data completes it on the receiver.
//!   * *8 bytes of remote CQ data* (`tcp;ofi_rxm`, `shm`): `size << 32 | receiver's slot << 12
//!     | stripes << 9 | request index << 3 | buffer index`.
//!   * *4 bytes* (`verbs;ofi_rxm`, or `WEFT_OFI_CQ_DATA_BYTES=4`): request index (6 bits),
//!     buffer index (3), kind (2), the low 5 bits of the buffer's k (a check that the write
//!     belongs to this posting of the request slot), and 16 bits that hold the size of a
//!     message under 64 KiB (kind *sized*: one write, complete in itself) or the number of
//!     stripes (kind *data*). A larger or striped message also writes a 16-byte *size record*
//!     (size, k) into the receiver's registered size table, at the entry of its request
//!     and buffer, with its own remote CQ data (kind *record*). The receiver completes the
//!     buffer when it has seen every data write and the record. Each completion with remote CQ
//!     data is delivered only after that write's data is placed, so this needs no ordering
//!     between the writes (no FI_ORDER_WAW/RAW), on any provider.
//! * **Rails** (`WEFT_OFI_DOMAIN=a,b`, up to [`MAX_RAILS`]; a domain may be named twice and is
//!   then opened twice): a message of at least `WEFT_OFI_STRIPE_BYTES` is cut into one stripe
//!   per rail, each written on its rail with the stripe count in its CQ data; smaller messages
//!   go whole to the rails in turn. CTS, eager messages and size records use rail 0. The
//!   receiver polls every rail's completion queue.
//! * **Eager**: a send of at most [`EAGER_MAX`] bytes whose CTS is not there yet, with credit
//!   left (at most [`EAGER_SLOTS`] unreported), is sent into the receiver's endpoint's receive
//!   pool; the receiver copies it into buffer (t, k) (or copies it out and keeps it, by
//!   (t, k), until that buffer is posted: at most [`EAGER_SLOTS`], the credit, else a protocol
//!   error). With 8-byte remote CQ data the message is the payload alone, sent
//!   with `fi_senddata` straight from the caller's buffer and copied from the pool buffer into
//!   the receive's (one copy more than `fi_pingpong`, which receives into its own buffer).
//!   The CQ data carries its tag (bits 32..64), the receiver's slot (12..32, which routes
//!   it) and the low 12 bits of its k (the receiver takes the k with those bits nearest to
//!   that of its next buffer of the tag; the sender's requests in flight and credit and the
//!   receiver's posted buffers are far inside that window), so [`EAGER_MAX`] (16 KiB) fills
//!   `ofi_rxm`'s eager size exactly, as
//!   `fi_pingpong`'s 16 KiB message does. With 4 bytes it is `fi_send` of a registered bounce
//!   buffer holding the key, a 24-byte header (kind, tag, k, size) and a copy
//!   of the payload. An eager send is complete when the
//!   provider reports it sent, not when it accepts it: the provider may still need the
//!   sender's progress to deliver it (a full socket, `ofi_rxm`'s segmented protocol), and
//!   NCCL stops testing a request that is done.
//!   For the same reason none goes by `fi_inject` (no completion), although `fi_pingpong`
//!   sends small messages so.
//! * **Hand over first, poll after**: `isend` gives an eager message to the provider, and
//!   `irecv` of a large receive its CTS, before reading any completion queue; the queues are
//!   read by `test` (and by `isend`/`irecv` only when they are out of request or CTS slots, so
//!   a caller that only retries still drives the provider). With `tcp;ofi_rxm` a read is an
//!   `epoll_wait` and a `poll`, about a microsecond, and in a ping-pong the echo side read five
//!   times between seeing a message and sending the reply. A CTS that arrived but was not
//!   read yet only makes a message go eagerly (the receiver then finds its buffer posted).
//! * **TCP lane** (`WEFT_OFI_MIN_BYTES`, default 0 = off): messages under that size go over
//!   one TCP stream on the data network instead of libfabric, larger ones by RMA as above. The
//!   sender asks for it in its address record; the receiver opens a listener on its device's
//!   data address for the connection and answers with it; the sender connects right after the
//!   handshake and starts the stream with the connection id. Each message carries its tag, k,
//!   size and the buffer index when the sender knows it (its CTS is there; the receiver checks
//!   it is buffer (t, k)); one sent before the CTS (with eager credit, as an eager send) has no
//!   index and lands like an eager message. A lane send is complete once the kernel has all of
//!   its bytes (not when they are queued in weft).
//!
//! # Out-of-step tags
//!
//! The k-th message of a tag lands in the k-th buffer of that tag, in posting order (NCCL's
//! InfiniBand semantics, and the TCP backend's): a sender may run ahead of a grouped receive
//! with a tag the group has no free buffer for (receives {1, 2}, {1, 2}; sends of tag 1, 1, 2,
//! 2), and that never kills the connection, since both sides know each message's buffer
//! without choosing one: message (t, k) is for buffer (t, k).
//! * `isend` always gives a request (unless out of requests): by RMA (or on the lane with the
//!   buffer index) when buffer (t, k)'s CTS is here, else eagerly (or early on the lane) with
//!   credit, else it waits for that CTS; a CTS entry whose message already went eagerly needs
//!   nothing more.
//! * The receiver lands an eager or early lane message in buffer (t, k) when it is posted,
//!   else holds it until it is; a receive of a tag nobody sends is just incomplete.
//! * Receives may complete out of posting order (a later receive whose messages all came
//!   first); `test` is per request, and so are the plugin's and NCCL's.
//!
//! # Failure detection on the data path
//!
//! A cut data link (management network up) makes no RDM operation fail: the provider (with
//! `tcp;ofi_rxm`, the kernel under it) retries for many minutes. Completions are the only
//! sign of progress, so the bound is a *stall timer* per connection: timed work that sees no
//! completion of the connection for `timeout` while the connection is being polled fails with
//! [`Error::Timeout`] (stage data transfer) naming the data path (the peer's data address when
//! its endpoint address is an IP one, and "data device (ofi provider/domain)"), and sends ABORT
//! on the side channel, so the other side fails at once too. Each poll reads the completion
//! queues *before* it looks at the timer (what completed while nobody polled counts), and a gap
//! of more than 100 ms between two polls is time the application was not polling, which does
//! not count: with a manual-progress provider nothing can complete then.
//!
//! Only waits that a live peer answers while it polls anyway are timed, so that a peer that is
//! legitimately late (a sender that has not called isend yet, a receiver that has not posted)
//! is never an error, whatever the provider's progress model:
//! * **Sender**: its RMA writes (queued or in flight), and eager sends whose receive has been
//!   posted since (a CTS covers them). Writes only start after the receiver posted (CTS), and a
//!   receiver polls a posted receive until it completes, so both sides drive their providers
//!   then. Not an eager send to a receive not yet posted: a manual-progress receiver need not
//!   poll it before it posts, which may be much later.
//! * **Receiver**: a message that is partly here (a stripe, or data without its size record).
//!   A posted receive with nothing arrived is not timed on its own: the sender may simply not
//!   have sent yet. But on a cut link its CTS may be lost after the receiver's provider
//!   reported it sent, or the data after the sender's provider reported the write complete
//!   (with `tcp`, both complete once the kernel has the bytes). So a receive whose CTS left
//!   and that sees nothing for `timeout` sends POSTED on the side channel (again every
//!   `timeout / 4` while that lasts): the messages it waits for by (tag, k), those of every
//!   incomplete receive whose CTS left (at most [`POSTED_MAX`]). The sender fails, as for a stall, if a send of it waits for a CTS that POSTED says
//!   has left (after polling `min(timeout / 4, 1 s)` more, for a CTS still in its provider),
//!   or if it handed a named message over `timeout` ago or more; a named message it has not
//!   sent yet is not an error (it is late). A small receive whose CTS is held back is in no
//!   POSTED (a credit-only CTS names no receive either): it
//!   sends its CTS `CTS_DEFER` after it was posted if still incomplete, and is then timed
//!   like any other.
//!
//! A stopped (SIGSTOP) peer completes nothing and answers nothing, though its kernel keeps the
//! connection up. A stopped sender: the receiver's POSTED goes unanswered (see above and
//! `crate::alive`). A stopped receiver: a send of ours that does not complete while nothing
//! moves (an eager send, a send waiting for a CTS that never comes) makes the sender ask after
//! `timeout / 4` (PROBE, again every `timeout / 4`); the receiver's process answers ALIVE from
//! its polls or its `alive` thread, and a PROBE unanswered for `max(3 * timeout / 4, 200 ms)`
//! fails the sender, about `timeout` after the last completion. A receiver that is only late to
//! post answers, and is never an error.
//!
//! A cut data link thus fails both sides `timeout` to `timeout * 1.25` after the last
//! completion, provided the application polls. Idle connections (nothing posted) notice
//! nothing until the next operation, which then fails as above.
//!
//! # Registration
//!
//! Buffers are registered through a per-rail cache ([`fabric::MrCache`]). The plugin's
//! regMr/deregMr go through the connection ([`SendConn::reg_mr`], [`SendConn::dereg_mr`]): a
//! [`Registration`] holds the buffer's registration on every rail, and sends and receives that
//! pass it use it without a lookup. Registering drops every cached entry over the range first,
//! and deregistering drops every cached entry over it, so memory freed after deregMr and
//! reused (even at the same address) is never reached through an old registration.
//!
//! # Limits
//! Remote CQ data of 4 or 8 bytes (both work; the 4-byte protocol costs a second write for
//! messages of 64 KiB and more), messages up to 4 GiB - 1 and `max_msg_size`, at most
//! [`MAX_RAILS`] rails, all of one provider. Host memory only (no FI_HMEM, no dmabuf). Size
//! records, CTS and eager messages do not stripe. The TCP lane is one stream (messages up to
//! 16 MiB), not the TCP backend's multi-stream engine; a lane whose sender cannot write for
//! `timeout` fails (a receiver that stops polling for that long with more than the socket
//! buffers queued on the lane trips it); the stall timer does not cover the lane's receiver.
//! A cut data link is bounded by the stall timer (see "Failure detection on the data path"),
//! which sees completions, not bytes: one RMA write that takes longer than `timeout` to
//! complete (4 GiB at 1 Gbit/s with the default 30 s) trips it, as does a receiver that posts
//! and then stops polling its receive for `timeout`. Per-tag indexes are kept per tag seen on a
//! connection (a map entry per distinct tag, never dropped).

mod eager;
pub mod fabric;
mod handshake;
mod landing;
mod lane;
mod matching;
mod pool;
mod rails;
mod recv;
mod send;
mod shared;
pub mod sys;
mod watch;
mod wire;

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The maps a message touches on its way (by tag, or (tag, k)): Fx, not SipHash, since a
/// ping-pong of small messages does several lookups per message.
type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

use socket2::{Domain as SockDomain, Protocol, SockAddr, Socket, TcpKeepalive, Type};

use crate::alive;
use crate::common::{
    Completed, Device, MAX_RECVS, PendingSock, RecvBuf, RequestId, poll_fd, write_all_until,
};
use crate::config::Config;
use crate::error::{Error, Link, Result, Stage};
use crate::proto::{self, AbortReason, Frame, FrameDecoder, ListenHandle, RejectReason};
use crate::slab::Slab;
use fabric::{Domain, DomainInfo, FiError, FiResult, Mr, MrCache};
use shared::{Ctx, Event, Payload, Port, SharedEp};

use eager::*;
pub use handshake::{Connecting, Listener};
use landing::*;
use lane::*;
use matching::*;
pub use pool::Registration;
use pool::*;
use rails::*;
pub use recv::RecvConn;
pub use send::SendConn;
use send::*;
use watch::*;
use wire::*;

/// Largest message sent eagerly (no CTS wait): `ofi_rxm`'s eager
/// size, which a message with 8-byte remote CQ data fills exactly (no header; see "Eager").
pub const EAGER_MAX: usize = 16384;
/// Eager messages a sender may have outstanding to its receiver before a CTS reports them
/// consumed (its eager credit; also its bounce buffers).
pub const EAGER_SLOTS: usize = 64;
/// Requests one receive connection keeps in flight.
pub const MAX_RECV_REQUESTS: usize = 64;
/// Requests one send connection keeps in flight (NCCL: 32 x maxRecvs).
pub const MAX_SEND_REQUESTS: usize = 32 * MAX_RECVS;
const CTS_TX_SLOTS: usize = MAX_RECV_REQUESTS;
const HDR: usize = 24;
/// How long a small receive (every buffer at most [`EAGER_MAX`]) that is still incomplete
/// holds its CTS back: longer than a round trip, so that a reply in a ping-pong comes eagerly
/// without one, short enough that a sender waiting for it (no eager credit, or a message
/// queued behind one waiting for its CTS) is not held up long.
const CTS_DEFER: Duration = Duration::from_micros(500);
const EAGER_BUF: usize = HDR + EAGER_MAX;
/// A CTS entry of rail 0 (address, key, capacity, tag); each further rail adds its address
/// and key.
const CTS_ENTRY: usize = 32;
const CTS_RAIL: usize = 16;
const CTS_BUF: usize = 32 + (CTS_ENTRY + CTS_RAIL * (MAX_RAILS - 1)) * MAX_RECVS;

/// Bytes of one CTS entry with `rails` rails.
fn cts_entry(rails: usize) -> usize {
    CTS_ENTRY + CTS_RAIL * (rails - 1)
}
const K_EAGER: u32 = 1;
const K_CTS: u32 = 2;
/// A size record of the 4-byte protocol: message size and the buffer's k, little endian.
const REC: usize = 16;
// The 4-byte remote CQ data: bits 0..6 request index, 6..9 buffer index, 9..11 kind, 11..16 the
// low bits of the buffer's k, 16..32 the size of a small message.
const IMM_SLOT_SHIFT: u32 = 6;
const IMM_KIND_SHIFT: u32 = 9;
const IMM_CHECK_SHIFT: u32 = 11;
const IMM_CHECK_MASK: u64 = 0x1f;
const IMM_SIZE_SHIFT: u32 = 16;
/// Largest message whose size rides in the 4-byte remote CQ data itself.
const IMM_SIZE_MAX: usize = 0xffff;
/// Kind: the data, with its size in bits 16..32 (complete in itself).
const IMM_SIZED: u64 = 0;
/// Kind: the data; the size comes in a size record.
const IMM_DATA: u64 = 1;
/// Kind: the size record of the buffer, written into the receiver's size table.
const IMM_RECORD: u64 = 2;
const _: () = assert!(MAX_RECV_REQUESTS <= 1 << IMM_SLOT_SHIFT && MAX_RECVS <= 8);
/// 8-byte remote CQ data: where the request index and the stripe count sit (the buffer index
/// in bits 0..3, the receiver's slot from `shared::SLOT_SHIFT`, the size from bit 32).
const W8_REQ_SHIFT: u32 = 3;
/// 8-byte remote CQ data of an eager message: the low bits of its k (bits
/// 0..12), the receiver's slot (from `shared::SLOT_SHIFT`), its tag (from bit 32).
const EAGER_SEQ_BITS: u32 = 12;
const EAGER_SEQ_MASK: u64 = (1 << EAGER_SEQ_BITS) - 1;
const _: () = assert!(EAGER_SEQ_BITS == shared::SLOT_SHIFT);
const W8_PARTS_SHIFT: u32 = 9;
const _: () = assert!(
    MAX_RECV_REQUESTS <= 1 << (W8_PARTS_SHIFT - W8_REQ_SHIFT)
        && MAX_RAILS < 8
        && W8_PARTS_SHIFT + 3 <= shared::SLOT_SHIFT
);
/// Tag of the MSG frame that carries an address record in the handshake.
const ADDR_TAG: i32 = 0x4f46_4931; // "OFI1"
/// Tag of the MSG frame a receiver sends on the side channel while a receive whose CTS left
/// sees nothing for `timeout` (POSTED): its inline payload names the messages the receiver
/// waits for, every one of a receive whose CTS left, at most [`POSTED_MAX`] entries of
/// [`POSTED_ENTRY`] bytes (tag u32, k u64, little endian).
const POSTED_TAG: i32 = 0x4f46_4950; // "OFIP"
/// Messages one POSTED names at most (8 receives of 8 buffers).
const POSTED_MAX: usize = 64;
/// Bytes of one POSTED entry.
const POSTED_ENTRY: usize = 12;
/// Tag of the MSG frame (no payload) a sender sends on the side channel once it has no RMA
/// write in flight and will post no more (STOPPED): after the receiver's close notice (it shut
/// its end of the side channel down), and as its own connection closes. A receiver that closes
/// with receives its CTS announced deregisters their memory only after STOPPED, since a write
/// that reaches a closed registration ends the provider connection that every connection
/// between the two processes shares (`tcp`); the exception is a deregMr of that memory, after
/// which the caller frees it (see `RecvConn::dereg_mr`). Peers that predate it ignore it.
const STOPPED_TAG: i32 = 0x4f46_4953; // "OFIS"
/// Tag of the MSG frame (no payload) a sender sends on the side channel while a send of it
/// has not completed and nothing moved for a quarter of the timeout (PROBE: is the receiver's
/// process running?). The receiver's process answers with ALIVE, from its polls or its
/// `alive` thread; one left unanswered is a stopped (SIGSTOP) receiver (see
/// [`crate::alive::Probe`]).
const PROBE_TAG: i32 = 0x4f46_4951; // "OFIQ"
/// Reject code: the sender is not an ofi sender (TCP backend on the other side).
const REJECT_NOT_OFI: u16 = 100;

/// Default provider preference when `WEFT_OFI_PROVIDER` is unset.
pub const DEFAULT_PROVIDERS: &[&str] = &["verbs;ofi_rxm", "tcp;ofi_rxm"];

/// Most rails (domains) of one ofi connection.
pub const MAX_RAILS: usize = 4;
/// Completion queue entries of an endpoint its device's connections share, and of one that a
/// connection has alone.
const SHARED_CQ: usize = 16384;
const PRIVATE_CQ: usize = 4096;
/// Receive buffers an endpoint keeps posted for the messages (eager data, CTS) of all its
/// connections, and a private one (a receiver's, eager messages only).
const SHARED_RX: usize = 256;
const PRIVATE_RX: usize = EAGER_SLOTS;
/// Largest message (without the key): an eager message or a CTS.
const MSG_MAX: usize = if EAGER_BUF > CTS_BUF {
    EAGER_BUF
} else {
    CTS_BUF
};
/// Events a connection takes from an endpoint per read.
const POLL_BATCH: usize = 16;

/// The libfabric backend of a host: one opened domain per data device, plus the domains of its
/// further rails (`WEFT_OFI_DOMAIN=a,b,...`).
#[derive(Debug)]
pub struct Backend {
    domains: Vec<Arc<Domain>>,
    /// Per device, the domains of rails 1.. (empty: one rail).
    more: Vec<Vec<Arc<Domain>>>,
    /// Per device, the address of its first data interface (where a TCP lane listens).
    lane_addrs: Vec<Option<IpAddr>>,
    /// Per device, its name (data interfaces), for errors of the data path.
    dev_names: Vec<String>,
    /// `WEFT_OFI_CQ_DATA_BYTES`.
    cq_force: Option<usize>,
    /// The endpoint each (device, rail) shares among its connections, while any uses it.
    shared: std::sync::Mutex<std::collections::HashMap<(usize, usize), std::sync::Weak<SharedEp>>>,
}

/// Why the libfabric backend could not be opened (the transport then falls back to TCP and
/// says why).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// `WEFT_OFI_DOMAIN` names more domains than there are rails.
    #[error("WEFT_OFI_DOMAIN names {0} domains (at most {max} rails)", max = MAX_RAILS)]
    TooManyDomains(usize),
    /// `WEFT_OFI_DOMAIN` names a domain the provider does not offer (usable).
    #[error("{provider}: no domain named {name:?} (WEFT_OFI_DOMAIN)")]
    NoSuchDomain {
        /// The provider asked.
        provider: String,
        /// The domain named.
        name: String,
    },
    /// The provider offers no domain for a device.
    #[error("{provider}: no domain for device {device}")]
    NoDomainFor {
        /// The provider asked.
        provider: String,
        /// The device's name.
        device: String,
    },
    /// No provider tried offered a usable domain; why, one entry per provider or domain.
    #[error("no usable libfabric provider: {}", .0.join("; "))]
    NoProvider(Vec<String>),
    /// libfabric itself failed (loading it, a query, opening a domain).
    #[error(transparent)]
    Fi(#[from] FiError),
}

impl Backend {
    /// Opens libfabric and, per device, a domain of the configured provider; `Err` says why the
    /// backend is unavailable.
    pub fn open(cfg: &Config, devices: &[Device]) -> std::result::Result<Backend, OpenError> {
        let lib = fabric::lib()?;
        let wanted: Vec<String> = match &cfg.ofi_provider {
            Some(p) => vec![p.clone()],
            None => DEFAULT_PROVIDERS.iter().map(|s| s.to_string()).collect(),
        };
        // WEFT_OFI_DOMAIN=a,b: rail 0 on domain a, rail 1 on domain b (a domain named twice is
        // opened twice).
        let names: Vec<String> = cfg
            .ofi_domain
            .as_deref()
            .map(|v| {
                v.split(',')
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        if names.len() > MAX_RAILS {
            return Err(OpenError::TooManyDomains(names.len()));
        }
        let mut why = Vec::new();
        for prov in &wanted {
            let infos = match fabric::query(&lib, prov) {
                Ok(v) if !v.is_empty() => v,
                Ok(_) => {
                    why.push(format!("{prov}: no domain"));
                    continue;
                }
                Err(e) => {
                    why.push(e.to_string());
                    continue;
                }
            };
            let usable: Vec<_> = infos
                .into_iter()
                .filter(|(i, _)| {
                    let ok = usable_cq_data(i);
                    if !ok {
                        why.push(format!(
                            "{}/{}: {}-byte remote CQ data (4 needed)",
                            i.provider, i.domain, i.cq_data_size
                        ));
                    }
                    ok
                })
                .collect();
            if usable.is_empty() {
                continue;
            }
            let mut domains = Vec::new();
            let mut opened: Vec<(String, Arc<Domain>)> = Vec::new();
            let mut infos = usable;
            for d in devices {
                // Domain: WEFT_OFI_DOMAIN, else the one named like the device's first data
                // interface (tcp names domains after interfaces), else the provider's first.
                let name = names
                    .first()
                    .cloned()
                    .unwrap_or_else(|| d.rails.first().map_or(String::new(), |r| r.iface.clone()));
                let pick = infos
                    .iter()
                    .position(|(i, _)| i.domain == name)
                    .or_else(|| {
                        opened
                            .iter()
                            .position(|(n, _)| *n == name)
                            .map(|_| usize::MAX)
                    });
                let dom = match pick {
                    Some(usize::MAX) => opened
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, d)| d.clone()),
                    Some(i) => {
                        let (info, fi) = infos.remove(i);
                        let n = info.domain.clone();
                        let dom = Arc::new(Domain::open(info, fi)?);
                        opened.push((n, dom.clone()));
                        Some(dom)
                    }
                    None if cfg.ofi_domain.is_some() => {
                        return Err(OpenError::NoSuchDomain {
                            provider: prov.clone(),
                            name,
                        });
                    }
                    None => match opened.first() {
                        Some((_, d)) => Some(d.clone()),
                        None if !infos.is_empty() => {
                            let (info, fi) = infos.remove(0);
                            let n = info.domain.clone();
                            let dom = Arc::new(Domain::open(info, fi)?);
                            opened.push((n, dom.clone()));
                            Some(dom)
                        }
                        None => None,
                    },
                };
                match dom {
                    Some(d) => domains.push(d),
                    None => {
                        return Err(OpenError::NoDomainFor {
                            provider: prov.clone(),
                            device: d.name.clone(),
                        });
                    }
                }
            }
            let mut more = Vec::new();
            for _ in devices {
                let mut rails = Vec::new();
                for name in names.iter().skip(1) {
                    let (info, fi) = fabric::query(&lib, prov)?
                        .into_iter()
                        .find(|(i, _)| i.domain == *name && usable_cq_data(i))
                        .ok_or_else(|| OpenError::NoSuchDomain {
                            provider: prov.clone(),
                            name: name.clone(),
                        })?;
                    rails.push(Arc::new(Domain::open(info, fi)?));
                }
                more.push(rails);
            }
            return Ok(Backend {
                domains,
                more,
                lane_addrs: devices
                    .iter()
                    .map(|d| d.rails.first().map(|r| r.addr))
                    .collect(),
                dev_names: devices.iter().map(|d| d.name.clone()).collect(),
                cq_force: cfg.ofi_cq_data_bytes,
                shared: Default::default(),
            });
        }
        Err(OpenError::NoProvider(why))
    }

    /// `provider/domain` of device `dev` (`provider/a+b` with several rails).
    pub fn describe(&self, dev: usize) -> String {
        self.domains.get(dev).map_or_else(String::new, |d| {
            let mut s = format!("{}/{}", d.info.provider, d.info.domain);
            for m in self.more.get(dev).into_iter().flatten() {
                s.push('+');
                s.push_str(&m.info.domain);
            }
            s
        })
    }

    /// Rails (domains) of device `dev`.
    pub fn rails(&self, dev: usize) -> usize {
        1 + self.more.get(dev).map_or(0, Vec::len)
    }

    fn rail_domains(&self, dev: usize) -> Result<Vec<Arc<Domain>>> {
        let mut v = vec![self.domain(dev)?.clone()];
        v.extend(self.more.get(dev).into_iter().flatten().cloned());
        Ok(v)
    }

    /// What the provider of device `dev` reported.
    pub fn info(&self, dev: usize) -> Option<&DomainInfo> {
        self.domains.get(dev).map(|d| &d.info)
    }

    /// Bytes of remote CQ data this side can use on `dom`: 8, or 4 (the provider offers less
    /// than 8, or `WEFT_OFI_CQ_DATA_BYTES=4`).
    fn cq_bytes(&self, dom: &Domain) -> u8 {
        let n = dom.info.cq_data_size.min(self.cq_force.unwrap_or(8));
        if n >= 8 { 8 } else { 4 }
    }

    /// Connection `key`'s port on rail `rail` of device `dev`: on the endpoint the rail's
    /// connections share, or (`private`) on one of its own.
    fn port(
        &self,
        dev: usize,
        rail: usize,
        dom: &Arc<Domain>,
        key: u64,
        private: bool,
    ) -> FiResult<Port> {
        if private {
            let ep = SharedEp::open(dom, PRIVATE_CQ, PRIVATE_RX, MSG_MAX, true)?;
            return Ok(Port::open(&ep, key));
        }
        let mut m = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let ep = match m.get(&(dev, rail)).and_then(std::sync::Weak::upgrade) {
            Some(ep) => ep,
            None => {
                let ep = SharedEp::open(dom, SHARED_CQ, SHARED_RX, MSG_MAX, false)?;
                m.insert((dev, rail), Arc::downgrade(&ep));
                ep
            }
        };
        Ok(Port::open(&ep, key))
    }

    /// Name of device `dev` (its data interfaces), or "" when unknown.
    fn dev_name(&self, dev: usize) -> String {
        self.dev_names.get(dev).cloned().unwrap_or_default()
    }

    fn domain(&self, dev: usize) -> Result<&Arc<Domain>> {
        self.domains
            .get(dev)
            .ok_or_else(|| Error::Usage(format!("device {dev} does not exist")))
    }

    /// Opens the management listener of device `dev`.
    pub fn listen(
        self: &Arc<Self>,
        cfg: &Config,
        mgmt: (IpAddr, &str),
        dev: usize,
    ) -> Result<Listener> {
        self.domain(dev)?;
        let sa = SocketAddr::new(mgmt.0, 0);
        let op = || format!("management listener on {sa}");
        let s = Socket::new(
            SockDomain::for_address(sa),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| Error::local(op(), &e))?;
        s.bind(&sa.into()).map_err(|e| Error::local(op(), &e))?;
        s.listen(1024).map_err(|e| Error::local(op(), &e))?;
        s.set_nonblocking(true)
            .map_err(|e| Error::local(op(), &e))?;
        let l: TcpListener = s.into();
        let addr = l.local_addr().map_err(|e| Error::local("local_addr", &e))?;
        Ok(Listener {
            cfg: cfg.clone(),
            backend: self.clone(),
            dev,
            iface: mgmt.1.to_string(),
            handle: ListenHandle {
                nonce: crate::common::random_u64(),
                mgmt: addr,
                data: Vec::new(),
            },
            listener: l,
            pending: Vec::new(),
            idle_since: None,
            discarded: Vec::new(),
        })
    }

    /// Starts connecting device `dev` to the listener of `handle`.
    pub fn connect(
        self: &Arc<Self>,
        cfg: &Config,
        mgmt: (IpAddr, &str),
        dev: usize,
        handle: &[u8],
    ) -> Result<Connecting> {
        let h = ListenHandle::decode(handle)?;
        let doms = self.rail_domains(dev)?;
        let dom = doms[0].clone();
        let link = Link {
            peer: h.mgmt,
            iface: mgmt.1.to_string(),
        };
        // Remote writes only reach receivers' endpoints: a sender always shares its own.
        let key = shared::new_key();
        let mut eps = Vec::new();
        let mut names = Vec::new();
        for (rail, d) in doms.iter().enumerate() {
            let ep = self
                .port(dev, rail, d, key, false)
                .map_err(|e| ofi_err(&link, "fi_endpoint", Stage::Connect, e))?;
            names.push(
                ep.name()
                    .map_err(|e| ofi_err(&link, "fi_getname", Stage::Connect, e))?,
            );
            eps.push(ep);
        }
        let ids = eps.iter().map(|p| (p.key(), p.slot())).collect();
        let rec = AddrRecord {
            provider: dom.info.provider.clone(),
            addr: names.remove(0),
            eager_slots: EAGER_SLOTS as u32,
            cq_data: self.cq_bytes(&dom),
            table: None,
            more: names,
            min_bytes: cfg.ofi_min_bytes as u32,
            lane: None,
            ids,
        };
        let conn_id = crate::common::random_u64();
        let mut out = Vec::new();
        Frame::Hello {
            nonce: h.nonce,
            conn_id,
            nstreams: 0,
        }
        .encode(&mut out);
        rec.encode(&mut out);
        let local = (mgmt.0.is_ipv4() == h.mgmt.ip().is_ipv4()
            && mgmt.0.is_loopback() == h.mgmt.ip().is_loopback())
        .then_some(mgmt.0);
        let mut side = PendingSock::new(h.mgmt, local, link.iface.clone(), tune_side, cfg)?;
        side.out = out;
        Ok(Connecting {
            cfg: cfg.clone(),
            link,
            side,
            dec: FrameDecoder::new(),
            acked: false,
            nonce: h.nonce,
            conn_id,
            deadline: Instant::now() + cfg.timeout,
            eps,
            cq_data: rec.cq_data,
            lane_local: self.lane_addrs.get(dev).copied().flatten(),
            data_iface: self.dev_name(dev),
        })
    }
}

/// Whether the protocol works with the provider's remote CQ data: 4 bytes (the 4-byte
/// protocol, `verbs;ofi_rxm`) or more.
fn usable_cq_data(i: &DomainInfo) -> bool {
    i.cq_data_size >= 4
}

fn ofi_err(link: &Link, op: &'static str, stage: Stage, error: FiError) -> Error {
    Error::Io {
        op,
        peer: link.peer,
        iface: link.iface.clone(),
        stage,
        kind: io::ErrorKind::Other,
        message: error.to_string(),
    }
}

/// The side channel's socket options: the liveness watch of the peer host (see module docs).
fn tune_side(s: &Socket, cfg: &Config) -> io::Result<()> {
    s.set_tcp_nodelay(true)?;
    s.set_keepalive(true)?;
    let idle = (cfg.timeout / 3).max(Duration::from_secs(1));
    s.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(idle)
            .with_interval(Duration::from_secs(1))
            .with_retries(3),
    )?;
    s.set_tcp_user_timeout(Some(cfg.timeout))
}

const C_CTS_TX: u64 = 2;
const C_EAGER_TX: u64 = 4;
const C_WRITE: u64 = 5;

/// A connection as [`poll_rails`] drives it.
trait RailEvents {
    fn ports(&self) -> &[Port];
    /// The buffer of one read's events (kept for its allocation).
    fn events(&mut self) -> &mut Vec<Event>;
    fn on_event(&mut self, ev: Event) -> Result<()>;
    fn fi(&self, op: &'static str, m: FiError) -> Error;
}

/// Reads every rail's events of `c` and hands each to it; whether there were any.
fn poll_rails<C: RailEvents>(c: &mut C) -> Result<bool> {
    let mut evs = std::mem::take(c.events());
    let mut any = false;
    let mut r = Ok(());
    'rails: for rail in 0..c.ports().len() {
        loop {
            evs.clear();
            let n = match c.ports()[rail].poll(&mut evs, POLL_BATCH) {
                Ok(n) => n,
                Err(m) => {
                    r = Err(c.fi("fi_cq_read", m));
                    break 'rails;
                }
            };
            any |= n > 0;
            for ev in evs.drain(..) {
                if let Err(e) = c.on_event(ev) {
                    r = Err(e);
                    break 'rails;
                }
            }
            if n < POLL_BATCH {
                break;
            }
        }
    }
    evs.clear();
    *c.events() = evs;
    r.map(|()| any)
}

fn ctx_array(n: usize) -> Box<[Ctx]> {
    vec![Ctx::default(); n].into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_is_preferred_and_its_4_byte_cq_data_is_usable() {
        assert_eq!(DEFAULT_PROVIDERS.first(), Some(&"verbs;ofi_rxm"));
        let info = |cq| DomainInfo {
            provider: "verbs;ofi_rxm".into(),
            domain: "mlx5_0".into(),
            mr_mode: 0,
            cq_data_size: cq,
            max_msg_size: 1 << 30,
            data_progress: 0,
            mode: 0,
            hmem: false,
            inject_size: 0,
        };
        assert!(usable_cq_data(&info(4)));
        assert!(usable_cq_data(&info(8)));
        assert!(!usable_cq_data(&info(2)));
        assert!(!usable_cq_data(&info(0)));
    }
}
