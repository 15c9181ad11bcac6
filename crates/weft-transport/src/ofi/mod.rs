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
//! whose inline payload is its *address record* (version 3: provider, `fi_getname` address of
//! each rail, eager slots, the bytes of remote CQ data it can use, and per rail the
//! connection's key and slot on that endpoint); the receiver checks the nonce, takes its ports
//! (as many rails as both sides have), `fi_av_insert`s the sender's addresses (once per
//! address and endpoint) and answers ACK plus its own record, which fixes what the connection
//! uses: the rails, and the remote CQ data size (the smaller of both sides', with, for 4 bytes,
//! where its size table is). Records of versions 1 and 2 (an endpoint per connection) are
//! refused: both sides must run this version. From then on
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
//! own sends (bounded) and leaks their memory if they did not finish.
//!
//! # Data path (data network), receiver-driven
//!
//! Every message has a sequence number (sends and receive buffers match in posting order).
//! * **CTS**: each `irecv` of `n` buffers sends the sender one clear-to-send message (`fi_send`
//!   on rail 0, into the sender's endpoint's receive pool): the first sequence number it covers, and
//!   per buffer its capacity and tag and, per rail, its address (virtual, or offset without
//!   FI_MR_VIRT_ADDR) and remote key, plus the number of eager messages the receiver has
//!   consumed (eager credit). CTS leave in posting order and arrive in order (FI_ORDER_SAS).
//! * **Small receives** (every buffer at most [`EAGER_MAX`]): the CTS is held back
//!   (`CTS_DEFER`, 500 µs); a receive that all its messages reach eagerly meanwhile never
//!   sends it, so a small message costs one provider message (not a CTS, then a write), as in
//!   a ping-pong where each side posts its next receive just before it sends. A receive
//!   still incomplete then (the sender had no credit, or a message queued behind one waiting
//!   for its CTS, or a message too large for it) sends its CTS, and from then on is like any
//!   other. A larger receive first sends the CTS of every small one before it that still
//!   waits. Eager credit without CTS: once [`EAGER_SLOTS`] / 2 consumed messages are
//!   unreported, a CTS of no buffers reports them; its first sequence number (that of the
//!   oldest receive whose CTS still waits, else the next receive's) tells the sender that the
//!   receives before it sent their CTS already or never will, so the eager messages no CTS
//!   covered there need no buffer choice. The sender never waits for credit: a send that
//!   cannot go eagerly waits for the CTS, which a receive missing a message sends.
//! * **RMA**: a send whose CTS is there is written straight into the receive buffer with
//!   `fi_writedata`, whose remote CQ data completes it on the receiver. Tags pick the buffer
//!   with [`crate::proto::select_slot`], the sender choosing.
//!   * *8 bytes of remote CQ data* (`tcp;ofi_rxm`, `shm`): `size << 32 | receiver's slot << 12
//!     | stripes << 9 | request index << 3 | buffer index`.
//!   * *4 bytes* (`verbs;ofi_rxm`, or `WEFT_OFI_CQ_DATA_BYTES=4`): request index (6 bits),
//!     buffer index (3), kind (2), the low 5 bits of the message's sequence number (a check
//!     that the write belongs to this receive), and 16 bits that hold the size of a message
//!     under 64 KiB (kind *sized*: one write, complete in itself) or the number of stripes
//!     (kind *data*). A larger or striped message also writes a 16-byte *size record* (size,
//!     sequence number) into the receiver's registered size table, at the entry of its request
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
//!   pool; the receiver copies it into the matching buffer (or copies it out and keeps it until
//!   the receive is posted). With 8-byte remote CQ data the message is the payload alone, sent
//!   with `fi_senddata` straight from the caller's buffer and copied from the pool buffer into
//!   the receive's (one copy more than `fi_pingpong`, which receives into its own buffer).
//!   The CQ data carries its tag (bits 32..64), the receiver's slot (12..32, which routes
//!   it) and the low 12 bits of its
//!   sequence number (the receiver takes the number with those bits nearest to its next
//!   receive's; the sender's requests in flight and the receiver's posted buffers are far
//!   inside that window), so [`EAGER_MAX`] (16 KiB) fills `ofi_rxm`'s eager size exactly, as
//!   `fi_pingpong`'s 16 KiB message does. With 4 bytes it is `fi_send` of a registered bounce
//!   buffer holding the key, a 24-byte header (kind, tag, sequence number, size) and a copy
//!   of the payload. An eager send is complete when the
//!   provider reports it sent, not when it accepts it: the provider may still need the
//!   sender's progress to deliver it (a full socket, `ofi_rxm`'s segmented protocol), and
//!   NCCL stops testing a request that is done.
//!   For the same reason none goes by `fi_inject` (no completion), although `fi_pingpong`
//!   sends small messages so. Within one grouped receive eager sends are always a prefix (a
//!   sender that has the CTS uses RMA), so both sides choose the same buffers.
//! * **Hand over first, poll after**: `isend` gives an eager message to the provider, and
//!   `irecv` of a large receive its CTS, before reading any completion queue; the queues are
//!   read by `test` (and by `isend`/`irecv` only when they are out of request or CTS slots, so
//!   a caller that only retries still drives the provider). With `tcp;ofi_rxm` a read is an
//!   `epoll_wait` and a `poll`, about a microsecond, and in a ping-pong the echo side read five
//!   times between seeing a message and sending the reply. A CTS that arrived but was not
//!   read yet only makes a message go eagerly, which keeps eager sends a prefix.
//! * **TCP lane** (`WEFT_OFI_MIN_BYTES`, default 0 = off): messages under that size go over
//!   one TCP stream on the data network instead of libfabric, larger ones by RMA as above. The
//!   sender asks for it in its address record; the receiver opens a listener on its device's
//!   data address for the connection and answers with it; the sender connects right after the
//!   handshake and starts the stream with the connection id. Each message carries its sequence
//!   number, tag, size and the buffer index when the sender knows it (its CTS is there); one
//!   sent before the CTS (with eager credit, under the same rule as an eager send) has no
//!   index and lands like an eager message. The receiver places index-less messages (eager or
//!   lane) strictly in sequence order within their receive, since the two ways may overtake
//!   each other; they are a prefix of it, so both sides choose the same buffers, and messages
//!   complete in order whatever way they took. A lane send is complete once the kernel has
//!   all of its bytes (not when they are queued in weft).
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
//!   `timeout / 4` while that lasts): the first message it waits for and how far its sent CTS
//!   reach. The sender fails, as for a stall, if it waits for a CTS that POSTED says has left
//!   (after polling `min(timeout / 4, 1 s)` more, for a CTS still in its provider), or if it
//!   handed the awaited message over `timeout` ago or more; otherwise (it has not sent yet) it
//!   ignores POSTED. A small receive whose CTS is held back is in no POSTED (CTS leave in
//!   posting order, so none that left reaches it, and a credit-only CTS counts for none): it
//!   sends its CTS `CTS_DEFER` after it was posted if still incomplete, and is then timed
//!   like any other.
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
//! and then stops polling its receive for `timeout`. A receive of several buffers waits, in
//! POSTED, for the first message it has not got counting in arrival order, which with several
//! rails may differ from the sender's order.

// tidy: long-file: the ofi backend's wire formats, handshakes, pools and send/receive paths
// still share this file; the split into ofi/{wire,handshake,watch,lane,pool,send,recv}.rs is
// issue 20's work.

pub mod fabric;
mod shared;
pub mod sys;

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain as SockDomain, Protocol, SockAddr, Socket, TcpKeepalive, Type};

use crate::alive;
use crate::config::Config;
use crate::error::{Error, Link, Result, Stage};
use crate::proto::{self, AbortReason, Frame, FrameDecoder, ListenHandle, RejectReason};
use crate::slab::Slab;
use crate::tcp::{
    Completed, Device, MAX_RECVS, PendingSock, RecvBuf, RequestId, poll_fd, write_all_until,
};
use fabric::{Domain, DomainInfo, FiResult, Mr, MrCache};
use shared::{Ctx, Event, Payload, Port, SharedEp};

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
/// A size record of the 4-byte protocol: message size and sequence number, little endian.
const REC: usize = 16;
// The 4-byte remote CQ data: bits 0..6 request index, 6..9 buffer index, 9..11 kind, 11..16 the
// low bits of the message's sequence number, 16..32 the size of a small message.
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
/// 8-byte remote CQ data of an eager message: the low bits of its sequence number (bits
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
/// sees nothing for `timeout` (POSTED): its inline payload is the sequence number of the first
/// message the receiver waits for, and the one its sent CTS cover up to (8 bytes each, little
/// endian). Peers that predate it ignore it.
const POSTED_TAG: i32 = 0x4f46_4950; // "OFIP"
/// Tag of the MSG frame (no payload) a sender sends on the side channel once it has no RMA
/// write in flight and will post no more (STOPPED): after the receiver's close notice (it shut
/// its end of the side channel down), and as its own connection closes. A receiver that closes
/// with receives its CTS announced deregisters their memory only after STOPPED, since a write
/// that reaches a closed registration ends the provider connection that every connection
/// between the two processes shares (`tcp`). Peers that predate it ignore it.
const STOPPED_TAG: i32 = 0x4f46_4953; // "OFIS"
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

impl Backend {
    /// Opens libfabric and, per device, a domain of the configured provider; `Err` says why the
    /// backend is unavailable.
    pub fn open(cfg: &Config, devices: &[Device]) -> std::result::Result<Backend, String> {
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
            return Err(format!(
                "WEFT_OFI_DOMAIN names {} domains (at most {MAX_RAILS} rails)",
                names.len()
            ));
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
                    why.push(e);
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
                        return Err(format!(
                            "{prov}: no domain named {name:?} (WEFT_OFI_DOMAIN)"
                        ));
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
                    None => return Err(format!("{prov}: no domain for device {}", d.name)),
                }
            }
            let mut more = Vec::new();
            for _ in devices {
                let mut rails = Vec::new();
                for name in names.iter().skip(1) {
                    let (info, fi) = fabric::query(&lib, prov)?
                        .into_iter()
                        .find(|(i, _)| i.domain == *name && usable_cq_data(i))
                        .ok_or_else(|| {
                            format!("{prov}: no domain named {name:?} (WEFT_OFI_DOMAIN)")
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
        Err(format!("no usable libfabric provider: {}", why.join("; ")))
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
                nonce: crate::tcp::random_u64(),
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
        let conn_id = crate::tcp::random_u64();
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

fn ofi_err(link: &Link, op: &'static str, stage: Stage, message: String) -> Error {
    Error::Io {
        op,
        peer: link.peer,
        iface: link.iface.clone(),
        stage,
        kind: io::ErrorKind::Other,
        message,
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

/// What each side tells the other in the handshake. Version 2 adds the remote CQ data bytes
/// (the sender: what it can use; the receiver: what the connection uses, the smaller of both)
/// and, from a receiver using 4 bytes, where its size table is (address or offset, key).
#[derive(Debug, Clone, PartialEq, Eq)]
struct AddrRecord {
    provider: String,
    addr: Vec<u8>,
    eager_slots: u32,
    cq_data: u8,
    table: Option<(u64, u64)>,
    /// Addresses of rails 1.. (the sender: its rails; the receiver: those the connection uses).
    more: Vec<Vec<u8>>,
    /// The sender: messages under this size go over a TCP lane (`WEFT_OFI_MIN_BYTES`; 0: no
    /// lane). The receiver: echoes it when it opened the lane.
    min_bytes: u32,
    /// The receiver: where its TCP lane listens (on its data interface).
    lane: Option<SocketAddr>,
    /// Per rail (as `addr`, then `more`): the connection's key on that rail's endpoint (the
    /// tag of messages to it) and its slot there (remote CQ data of writes to it).
    ids: Vec<(u64, u32)>,
}

impl AddrRecord {
    fn encode(&self, out: &mut Vec<u8>) {
        let mut p = Vec::new();
        p.extend_from_slice(b"WOFI");
        p.push(3);
        p.push(self.provider.len().min(255) as u8);
        p.extend_from_slice(&self.provider.as_bytes()[..self.provider.len().min(255)]);
        p.extend_from_slice(&(self.addr.len() as u16).to_be_bytes());
        p.extend_from_slice(&self.addr);
        p.extend_from_slice(&self.eager_slots.to_be_bytes());
        p.push(self.cq_data);
        let (ta, tk) = self.table.unwrap_or((0, 0));
        p.push(u8::from(self.table.is_some()));
        p.extend_from_slice(&ta.to_be_bytes());
        p.extend_from_slice(&tk.to_be_bytes());
        p.push(self.more.len() as u8);
        for a in &self.more {
            p.extend_from_slice(&(a.len() as u16).to_be_bytes());
            p.extend_from_slice(a);
        }
        p.extend_from_slice(&self.min_bytes.to_be_bytes());
        match self.lane {
            None => p.push(0),
            Some(SocketAddr::V4(a)) => {
                p.push(4);
                p.extend_from_slice(&a.ip().octets());
                p.extend_from_slice(&a.port().to_be_bytes());
            }
            Some(SocketAddr::V6(a)) => {
                p.push(6);
                p.extend_from_slice(&a.ip().octets());
                p.extend_from_slice(&a.port().to_be_bytes());
            }
        }
        p.push(self.ids.len() as u8);
        for (key, slot) in &self.ids {
            p.extend_from_slice(&key.to_be_bytes());
            p.extend_from_slice(&slot.to_be_bytes());
        }
        Frame::encode_msg(out, ADDR_TAG, Some(&p), p.len() as u64, 0);
    }

    /// Version 3 only: the tags and slots of shared endpoints (versions 1 and 2 had one
    /// endpoint per connection, which a peer of this version cannot talk to).
    fn decode(p: &[u8]) -> Option<AddrRecord> {
        if p.len() < 6 || &p[..4] != b"WOFI" || p[4] != 3 {
            return None;
        }
        let pl = p[5] as usize;
        let provider = String::from_utf8(p.get(6..6 + pl)?.to_vec()).ok()?;
        let at = 6 + pl;
        let al = u16::from_be_bytes(p.get(at..at + 2)?.try_into().ok()?) as usize;
        let addr = p.get(at + 2..at + 2 + al)?.to_vec();
        let at = at + 2 + al;
        let eager_slots = u32::from_be_bytes(p.get(at..at + 4)?.try_into().ok()?);
        let at = at + 4;
        let cq_data = *p.get(at)?;
        let has = *p.get(at + 1)? != 0;
        let ta = u64::from_be_bytes(p.get(at + 2..at + 10)?.try_into().ok()?);
        let tk = u64::from_be_bytes(p.get(at + 10..at + 18)?.try_into().ok()?);
        let n = *p.get(at + 18)? as usize;
        if n >= MAX_RAILS {
            return None;
        }
        let mut at = at + 19;
        let mut more = Vec::with_capacity(n);
        for _ in 0..n {
            let l = u16::from_be_bytes(p.get(at..at + 2)?.try_into().ok()?) as usize;
            more.push(p.get(at + 2..at + 2 + l)?.to_vec());
            at += 2 + l;
        }
        let min_bytes = u32::from_be_bytes(p.get(at..at + 4)?.try_into().ok()?);
        let at = at + 4;
        let ip_len = match *p.get(at)? {
            0 => 0,
            4 => 4,
            6 => 16,
            _ => return None,
        };
        let mut lane = None;
        if ip_len > 0 {
            let ip: IpAddr = if ip_len == 4 {
                <[u8; 4]>::try_from(p.get(at + 1..at + 5)?).ok()?.into()
            } else {
                <[u8; 16]>::try_from(p.get(at + 1..at + 17)?).ok()?.into()
            };
            let port =
                u16::from_be_bytes(p.get(at + 1 + ip_len..at + 3 + ip_len)?.try_into().ok()?);
            lane = Some(SocketAddr::new(ip, port));
        }
        let at = at + 1 + if ip_len > 0 { ip_len + 2 } else { 0 };
        let k = *p.get(at)? as usize;
        if k != 1 + n {
            return None;
        }
        let mut ids = Vec::with_capacity(k);
        for i in 0..k {
            let o = at + 1 + 12 * i;
            let key = u64::from_be_bytes(p.get(o..o + 8)?.try_into().ok()?);
            let slot = u32::from_be_bytes(p.get(o + 8..o + 12)?.try_into().ok()?);
            ids.push((key, slot));
        }
        Some(AddrRecord {
            provider,
            addr,
            eager_slots,
            cq_data,
            table: has.then_some((ta, tk)),
            more,
            min_bytes,
            lane,
            ids,
        })
    }
}

/// A connection being set up by the sender.
pub struct Connecting {
    cfg: Config,
    link: Link,
    /// The side channel being connected, with HELLO and our address record to write.
    side: PendingSock,
    dec: FrameDecoder,
    acked: bool,
    nonce: u64,
    conn_id: u64,
    deadline: Instant,
    /// One endpoint per rail; taken when established.
    eps: Vec<Port>,
    cq_data: u8,
    /// The address of our data interface, to bind a TCP lane to.
    lane_local: Option<IpAddr>,
    /// Name of our data device, for errors of the data path.
    data_iface: String,
}

impl std::fmt::Debug for Connecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ofi::Connecting({})", self.link.peer)
    }
}

impl Connecting {
    /// Advances the handshake without blocking. `Ok(None)`: call again later.
    pub fn poll(&mut self) -> Result<Option<SendConn>> {
        let now = Instant::now();
        if now >= self.deadline {
            let stage = if self.side.connected {
                Stage::Handshake
            } else {
                Stage::Connect
            };
            return Err(self.link.timeout(stage, self.cfg.timeout));
        }
        if !self.side.poll(now, &self.cfg)? {
            return Ok(None);
        }
        let mut buf = [0u8; 1024];
        loop {
            let want = self.dec.wanted().min(buf.len());
            match (&self.side.sock).read(&mut buf[..want.max(1)]) {
                Ok(0) => return Err(self.link.closed(Stage::Handshake)),
                Ok(n) => self.dec.handle_bytes(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.link.io("recv ack", Stage::Handshake, &e)),
            }
            loop {
                let f = match self.dec.poll_frame() {
                    Ok(None) => break,
                    Ok(Some(f)) => f,
                    Err(e) => return Err(self.link.protocol(Stage::Handshake, e)),
                };
                match f {
                    Frame::Ack { nonce, conn_id }
                        if !self.acked && nonce == self.nonce && conn_id == self.conn_id =>
                    {
                        self.acked = true;
                    }
                    Frame::Reject { reason, .. } => {
                        return Err(Error::Rejected {
                            peer: self.link.peer,
                            iface: self.link.iface.clone(),
                            reason: match reason {
                                RejectReason::Other(REJECT_NOT_OFI) => {
                                    "the listener's libfabric provider differs from ours".into()
                                }
                                r => r.to_string(),
                            },
                        });
                    }
                    Frame::Msg(h) if self.acked && h.tag == ADDR_TAG => {
                        let rec = h
                            .inline
                            .as_deref()
                            .and_then(AddrRecord::decode)
                            .ok_or_else(|| self.bad("address record"))?;
                        return self.establish(rec).map(Some);
                    }
                    f => {
                        return Err(self.link.protocol(
                            Stage::Handshake,
                            proto::FrameError::Unexpected {
                                got: f.name(),
                                expected: "ACK and address record",
                            },
                        ));
                    }
                }
            }
        }
    }

    fn bad(&self, what: &'static str) -> Error {
        self.link.protocol(
            Stage::Handshake,
            proto::FrameError::Unexpected {
                got: "malformed MSG",
                expected: what,
            },
        )
    }

    fn establish(&mut self, rec: AddrRecord) -> Result<SendConn> {
        if self.eps.is_empty() {
            return Err(Error::Usage("connection already established".into()));
        }
        let mut eps = std::mem::take(&mut self.eps);
        let ep = &eps[0];
        if rec.provider != ep.dom.info.provider {
            return Err(Error::Rejected {
                peer: self.link.peer,
                iface: self.link.iface.clone(),
                reason: format!(
                    "the listener uses provider {}, this side {}",
                    rec.provider, ep.dom.info.provider
                ),
            });
        }
        // The receiver answers with what the connection uses: at most what we offered.
        let cq4 = match rec.cq_data.min(self.cq_data) {
            8 => false,
            4 if rec.table.is_some() => true,
            n => {
                return Err(Error::Rejected {
                    peer: self.link.peer,
                    iface: self.link.iface.clone(),
                    reason: format!(
                        "the listener answered with {n}-byte remote CQ data{} (4 or 8 expected)",
                        if rec.table.is_none() {
                            " and no size table"
                        } else {
                            ""
                        }
                    ),
                });
            }
        };
        // The receiver answers with the rails the connection uses: at most ours.
        if rec.more.len() >= eps.len() {
            return Err(self.bad("address record with no more rails than offered"));
        }
        eps.truncate(1 + rec.more.len());
        if rec.ids.len() != eps.len() {
            return Err(self.bad("address record with an id per rail"));
        }
        for ((ep, addr), &(tag, slot)) in eps
            .iter_mut()
            .zip(std::iter::once(&rec.addr).chain(&rec.more))
            .zip(&rec.ids)
        {
            ep.connect(addr, tag, slot)
                .map_err(|e| ofi_err(&self.link, "fi_av_insert", Stage::Handshake, e))?;
        }
        let sock: TcpStream = self
            .side
            .sock
            .try_clone()
            .map_err(|e| Error::local("dup", &e))?
            .into();
        let link = Link {
            peer: self.link.peer,
            iface: format!("{} ({})", self.link.iface, describe(&eps)),
        };
        let lane = match rec.lane {
            Some(addr) if self.cfg.ofi_min_bytes > 0 && rec.min_bytes > 0 => {
                let local = self.lane_local.filter(|l| l.is_ipv4() == addr.is_ipv4());
                Some(LaneTx::connect(
                    addr,
                    local,
                    self.conn_id,
                    &self.cfg,
                    &link,
                )?)
            }
            _ => None,
        };
        let data = data_link(&self.link, &self.data_iface, &rec.addr, &eps);
        let mut s = SendConn::new(
            eps,
            link,
            sock,
            rec.eager_slots,
            rec.table.filter(|_| cq4),
            self.cfg.ofi_stripe_bytes,
        )?;
        s.data = data;
        s.stall.timeout = self.cfg.timeout;
        s.cts_lost.timeout = cts_grace(self.cfg.timeout);
        if lane.is_some() {
            s.min_bytes = self.cfg.ofi_min_bytes;
            s.lane = lane;
        }
        Ok(s)
    }

    /// Polls until connected or failed (at most the configured timeout).
    pub fn wait(mut self) -> Result<SendConn> {
        loop {
            if let Some(c) = self.poll()? {
                return Ok(c);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

fn describe(eps: &[Port]) -> String {
    let mut s = String::from("ofi ");
    for (i, ep) in eps.iter().enumerate() {
        if i == 0 {
            s.push_str(&format!("{}/{}", ep.dom.info.provider, ep.dom.info.domain));
        } else {
            s.push_str(&format!("+{}", ep.dom.info.domain));
        }
    }
    s
}

/// The data path of a connection as its errors name it: the peer's data address (its rail 0
/// endpoint address when that is an IP socket address, as with `tcp`; else the management
/// peer) and "data device (ofi provider/domain)".
fn data_link(mgmt: &Link, dev: &str, peer_addr: &[u8], eps: &[Port]) -> Link {
    let dev = if dev.is_empty() {
        mgmt.iface.as_str()
    } else {
        dev
    };
    Link {
        peer: sockaddr(peer_addr).unwrap_or(mgmt.peer),
        iface: format!("{dev} ({})", describe(eps)),
    }
}

/// An endpoint address that is a `struct sockaddr_in` or `sockaddr_in6` (FI_SOCKADDR_IN*).
fn sockaddr(a: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes(a.get(..2)?.try_into().ok()?));
    let port = u16::from_be_bytes(a.get(2..4)?.try_into().ok()?);
    let ip: IpAddr = if family == libc::AF_INET && a.len() >= 16 {
        <[u8; 4]>::try_from(a.get(4..8)?).ok()?.into()
    } else if family == libc::AF_INET6 && a.len() >= 28 {
        <[u8; 16]>::try_from(a.get(8..24)?).ok()?.into()
    } else {
        return None;
    };
    (!ip.is_unspecified()).then_some(SocketAddr::new(ip, port))
}

/// How long a sender keeps polling for a CTS its receiver says left `timeout` ago (POSTED)
/// before it calls it lost.
fn cts_grace(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// How long a closing receive connection keeps reading its completion queues.
const DRAIN: Duration = Duration::from_millis(20);

/// How long a receiver waits for the sender's ALIVE after POSTED before it calls the sender's
/// process stopped: far longer than the `alive` thread's period plus a round trip.
fn answer_bound(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// How long a closing receive connection whose sender may still write waits for its STOPPED.
const CLOSE_WAIT: Duration = Duration::from_millis(200);

/// Handed-over messages a sender remembers the time of (for POSTED).
const HANDED_LOG: usize = 4 * MAX_SEND_REQUESTS;

/// Gaps between two polls of a connection longer than this are time the application was not
/// polling it, which the stall timer does not count.
const POLL_GAP: Duration = Duration::from_millis(100);

/// The data-phase stall timer of a connection (see the module docs, "Failure detection").
struct Stall {
    timeout: Duration,
    /// When the work now outstanding last saw progress (a completion), or started.
    since: Instant,
    /// When the connection was last polled.
    polled: Instant,
}

impl Stall {
    fn new() -> Stall {
        let now = Instant::now();
        Stall {
            timeout: Duration::from_secs(30),
            since: now,
            polled: now,
        }
    }

    /// Called on every poll, after the completion queues were read: `progressed`, whether
    /// any completion came; `waiting`, whether timed work is outstanding. True when that work
    /// saw no progress for `timeout` of polling.
    fn check(&mut self, progressed: bool, waiting: bool) -> bool {
        let now = Instant::now();
        let gap = now.duration_since(self.polled);
        self.polled = now;
        if progressed || !waiting {
            self.since = now;
            return false;
        }
        if gap > POLL_GAP {
            // Nobody polled: with a manual-progress provider nothing could move meanwhile.
            self.since += gap;
        }
        now.duration_since(self.since) >= self.timeout
    }

    /// Fires again after `after` more of polling without progress.
    fn rearm(&mut self, after: Duration) {
        let now = Instant::now();
        self.since = now
            .checked_sub(self.timeout.saturating_sub(after))
            .unwrap_or(now);
    }
}

struct PendingAccept {
    sock: TcpStream,
    link: Link,
    dec: FrameDecoder,
    since: Instant,
    hello: Option<(u64, u64)>,
}

/// The receiver's listening side of a device.
pub struct Listener {
    cfg: Config,
    backend: Arc<Backend>,
    dev: usize,
    iface: String,
    handle: ListenHandle,
    listener: TcpListener,
    pending: Vec<PendingAccept>,
    idle_since: Option<Instant>,
    /// Connections closed because they did not speak weft's protocol, for the caller to log.
    discarded: Vec<Error>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ofi::Listener({})", self.handle.mgmt)
    }
}

impl Listener {
    /// The handle to give the sender.
    pub fn handle(&self) -> [u8; proto::HANDLE_SIZE] {
        self.handle.encode()
    }

    /// The decoded handle.
    pub fn handle_info(&self) -> &ListenHandle {
        &self.handle
    }

    /// The stray connections discarded since the last call, as errors naming each peer.
    pub fn take_discarded(&mut self) -> Vec<Error> {
        std::mem::take(&mut self.discarded)
    }

    /// Accepts without blocking. `Ok(None)`: nothing complete yet. A socket that does not
    /// speak weft's protocol is closed and kept for [`Listener::take_discarded`].
    pub fn accept(&mut self) -> Result<Option<RecvConn>> {
        let now = Instant::now();
        let idle_since = *self.idle_since.get_or_insert(now);
        loop {
            match self.listener.accept() {
                Ok((s, peer)) => {
                    let link = Link {
                        peer,
                        iface: self.iface.clone(),
                    };
                    let sock = Socket::from(s);
                    sock.set_nonblocking(true)
                        .and_then(|()| tune_side(&sock, &self.cfg))
                        .map_err(|e| link.io("setsockopt", Stage::Accept, &e))?;
                    self.pending.push(PendingAccept {
                        sock: sock.into(),
                        link,
                        dec: FrameDecoder::new(),
                        since: now,
                        hello: None,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::local(format!("accept on {}", self.iface), &e)),
            }
        }
        if !self.pending.is_empty() {
            self.idle_since = Some(now);
        }
        let mut i = 0;
        while i < self.pending.len() {
            match self.step(i, now) {
                Ok(None) => i += 1,
                Ok(Some((nonce, conn_id, rec))) => {
                    let r = self.finish(i, nonce, conn_id, rec);
                    self.pending.swap_remove(i);
                    return r.map(Some);
                }
                // Not weft's protocol (garbage, a bare connect and close, a probe, a foreign
                // nonce, a stall): closed and kept for the caller to log; keep waiting.
                Err(e) => {
                    self.pending.swap_remove(i);
                    self.discarded.push(e);
                }
            }
        }
        if self.pending.is_empty() && now.duration_since(idle_since) >= self.cfg.accept_timeout {
            return Err(Error::Timeout {
                peer: self.handle.mgmt,
                iface: self.iface.clone(),
                stage: Stage::Accept,
                after: self.cfg.accept_timeout,
            });
        }
        Ok(None)
    }

    fn step(&mut self, i: usize, now: Instant) -> Result<Option<(u64, u64, AddrRecord)>> {
        let p = &mut self.pending[i];
        let mut buf = [0u8; 1024];
        loop {
            let want = p.dec.wanted().min(buf.len()).max(1);
            match (&p.sock).read(&mut buf[..want]) {
                Ok(0) => return Err(p.link.closed(Stage::Accept)),
                Ok(n) => p.dec.handle_bytes(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(p.link.io("recv hello", Stage::Accept, &e)),
            }
            let f = match p.dec.poll_frame() {
                Ok(None) => continue,
                Ok(Some(f)) => f,
                Err(e) => return Err(p.link.protocol(Stage::Accept, e)),
            };
            match (f, p.hello) {
                (
                    Frame::Hello {
                        nonce,
                        conn_id,
                        nstreams,
                    },
                    None,
                ) => {
                    let reason = if nonce != self.handle.nonce {
                        Some(RejectReason::WrongNonce)
                    } else if nstreams != 0 {
                        Some(RejectReason::Other(REJECT_NOT_OFI))
                    } else {
                        None
                    };
                    if let Some(reason) = reason {
                        let mut v = Vec::new();
                        Frame::Reject {
                            nonce,
                            conn_id,
                            reason,
                        }
                        .encode(&mut v);
                        let _ = (&p.sock).write(&v);
                        return Err(Error::Rejected {
                            peer: p.link.peer,
                            iface: p.link.iface.clone(),
                            reason: format!("refused: {reason}"),
                        });
                    }
                    p.hello = Some((nonce, conn_id));
                }
                (Frame::Msg(h), Some((nonce, conn_id))) if h.tag == ADDR_TAG => {
                    let rec = h
                        .inline
                        .as_deref()
                        .and_then(AddrRecord::decode)
                        .ok_or_else(|| {
                            p.link.protocol(
                                Stage::Accept,
                                proto::FrameError::Unexpected {
                                    got: "malformed MSG",
                                    expected: "address record",
                                },
                            )
                        })?;
                    return Ok(Some((nonce, conn_id, rec)));
                }
                (f, _) => {
                    return Err(p.link.protocol(
                        Stage::Accept,
                        proto::FrameError::Unexpected {
                            got: f.name(),
                            expected: "HELLO and address record",
                        },
                    ));
                }
            }
        }
        if now.duration_since(p.since) >= self.cfg.timeout {
            return Err(p.link.timeout(Stage::Accept, self.cfg.timeout));
        }
        Ok(None)
    }

    fn finish(&mut self, i: usize, nonce: u64, conn_id: u64, rec: AddrRecord) -> Result<RecvConn> {
        let doms = self.backend.rail_domains(self.dev)?;
        let dom = doms[0].clone();
        let p = &self.pending[i];
        if rec.provider != dom.info.provider {
            let mut v = Vec::new();
            Frame::Reject {
                nonce,
                conn_id,
                reason: RejectReason::Other(REJECT_NOT_OFI),
            }
            .encode(&mut v);
            let _ = (&p.sock).write(&v);
            return Err(Error::Rejected {
                peer: p.link.peer,
                iface: p.link.iface.clone(),
                reason: format!(
                    "refused: the sender uses provider {}, this side {}",
                    rec.provider, dom.info.provider
                ),
            });
        }
        // Remote CQ data: the smaller of both sides' (a version 1 sender said nothing: 8).
        let cq_data = rec.cq_data.min(self.backend.cq_bytes(&dom));
        if cq_data < 4 {
            let mut v = Vec::new();
            Frame::Reject {
                nonce,
                conn_id,
                reason: RejectReason::Other(REJECT_NOT_OFI),
            }
            .encode(&mut v);
            let _ = (&p.sock).write(&v);
            return Err(Error::Rejected {
                peer: p.link.peer,
                iface: p.link.iface.clone(),
                reason: format!("refused: the sender offers {cq_data}-byte remote CQ data"),
            });
        }
        // Rails: as many as both sides have.
        let n = doms.len().min(1 + rec.more.len());
        if rec.ids.len() != 1 + rec.more.len() {
            return Err(p.link.protocol(
                Stage::Accept,
                proto::FrameError::Unexpected {
                    got: "malformed MSG",
                    expected: "address record with an id per rail",
                },
            ));
        }
        // Remote writes find their connection on a shared endpoint by the slot in their
        // 8-byte CQ data; with 4 bytes there is no room, so the connection has its own.
        let key = shared::new_key();
        let mut eps = Vec::new();
        let mut names = Vec::new();
        for (rail, ((d, addr), &(tag, slot))) in doms
            .iter()
            .zip(std::iter::once(&rec.addr).chain(&rec.more))
            .zip(&rec.ids)
            .take(n)
            .enumerate()
        {
            let mut ep = self
                .backend
                .port(self.dev, rail, d, key, cq_data == 4)
                .map_err(|e| ofi_err(&p.link, "fi_endpoint", Stage::Accept, e))?;
            ep.connect(addr, tag, slot)
                .map_err(|e| ofi_err(&p.link, "fi_av_insert", Stage::Accept, e))?;
            names.push(
                ep.name()
                    .map_err(|e| ofi_err(&p.link, "fi_getname", Stage::Accept, e))?,
            );
            eps.push(ep);
        }
        let link = Link {
            peer: p.link.peer,
            iface: format!("{} ({})", p.link.iface, describe(&eps)),
        };
        let sock = p.sock.try_clone().map_err(|e| Error::local("dup", &e))?;
        // Post the eager buffers before the sender can learn our address.
        let data = data_link(&p.link, &self.backend.dev_name(self.dev), &rec.addr, &eps);
        let mut conn = RecvConn::new(eps, link.clone(), sock, cq_data == 4)?;
        conn.data = data;
        conn.stall.timeout = self.cfg.timeout;
        conn.quiet.timeout = self.cfg.timeout;
        // A TCP lane for small messages, when the sender asks for one.
        let lane_ip = self.backend.lane_addrs.get(self.dev).copied().flatten();
        let mut lane = None;
        if let (true, Some(ip)) = (rec.min_bytes > 0, lane_ip) {
            let l = LaneRx::listen(ip, conn_id, &self.cfg)?;
            lane = Some(l.addr);
            conn.lane = Some(l);
        }
        let mine = AddrRecord {
            provider: dom.info.provider.clone(),
            addr: names.remove(0),
            eager_slots: EAGER_SLOTS as u32,
            cq_data,
            table: conn.table_remote(),
            more: names,
            min_bytes: if lane.is_some() { rec.min_bytes } else { 0 },
            lane,
            ids: conn.eps.iter().map(|p| (p.key(), p.slot())).collect(),
        };
        let mut v = Vec::new();
        Frame::Ack { nonce, conn_id }.encode(&mut v);
        mine.encode(&mut v);
        write_all_until(&conn.side.sock, &v, Instant::now() + self.cfg.timeout)
            .map_err(|e| link.io("send ack", Stage::Accept, &e))?;
        Ok(conn)
    }

    /// Polls until a connection arrives or the accept timeout passes.
    pub fn wait(&mut self) -> Result<RecvConn> {
        loop {
            if let Some(c) = self.accept()? {
                return Ok(c);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The management side channel of an established connection: ABORT and EOF, and POSTED
/// (a receiver's CTS that left long ago; see "Failure detection" in the module docs).
struct Side {
    sock: TcpStream,
    dec: FrameDecoder,
    eof: bool,
    next_check: Instant,
    /// The largest "CTS sent up to" of the peer's POSTED frames.
    posted: u64,
    /// The message the peer's latest POSTED waits for, until looked at.
    waits_for: Option<u64>,
    /// We sent ABORT (and shut our end down).
    aborted: bool,
    /// We shut our end down as a closing receiver's notice (see [`STOPPED_TAG`]).
    closing: bool,
    /// The peer (a sender) said STOPPED: no RMA write of it is in flight or will come.
    stopped: bool,
    /// We (a sender) said STOPPED.
    said_stopped: bool,
    /// A sender's answers to POSTED while its application is not polling (see `alive`).
    /// Declared after `sock`: the duplicate it watches closes after ours.
    answering: Option<alive::Answering>,
    /// A receiver's latest POSTED that no ALIVE has answered yet: when it went.
    probed: Option<Instant>,
}

impl Side {
    fn new(sock: TcpStream) -> Side {
        Side {
            sock,
            dec: FrameDecoder::new(),
            eof: false,
            next_check: Instant::now(),
            posted: 0,
            waits_for: None,
            aborted: false,
            closing: false,
            stopped: false,
            said_stopped: false,
            answering: None,
            probed: None,
        }
    }

    /// A sender's side channel: POSTED is answered with ALIVE, by the application's polls or,
    /// while it does not poll, by the process's `alive` thread.
    fn answering(mut self) -> Side {
        self.answering = alive::Answering::new(&self.sock);
        self
    }

    /// Whether the sender's process has not answered our POSTED within `bound` (stopped).
    fn unanswered(&self, bound: Duration) -> bool {
        self.probed.is_some_and(|t| t.elapsed() >= bound)
    }

    /// A closing receiver's notice to its sender: our end of the side channel shut down (the
    /// sender reads EOF, posts no more writes and answers STOPPED once none is in flight).
    fn close_notice(&mut self) {
        if !self.aborted && !self.closing {
            let _ = self.sock.shutdown(std::net::Shutdown::Write);
            self.closing = true;
        }
    }

    /// A sender's STOPPED (see [`STOPPED_TAG`]), once.
    fn send_stopped(&mut self) {
        if self.aborted || self.said_stopped {
            return;
        }
        let mut b = Vec::new();
        Frame::encode_msg(&mut b, STOPPED_TAG, Some(&[]), 0, 0);
        let _ = (&self.sock).write(&b);
        self.said_stopped = true;
    }

    /// Reads the side channel now, whenever it was last read.
    fn poll_now(&mut self, link: &Link, who: &str) -> Option<Error> {
        self.next_check = Instant::now();
        self.poll(link, who)
    }

    /// Tells the sender that we wait for message `first` and that our CTS up to sequence
    /// number `upto` left, all at least `timeout` ago.
    fn send_posted(&mut self, first: u64, upto: u64) {
        if self.aborted {
            return;
        }
        let mut p = [0u8; 16];
        put_u64(&mut p, 0, first);
        put_u64(&mut p, 8, upto);
        let mut b = Vec::new();
        Frame::encode_msg(&mut b, POSTED_TAG, Some(&p), p.len() as u64, 0);
        // A few bytes on a socket that carries nothing else: they fit (or the next stall
        // sends them again).
        let _ = (&self.sock).write(&b);
        self.probed.get_or_insert_with(Instant::now);
    }

    /// At most every millisecond: the peer's ABORT as an error.
    fn poll(&mut self, link: &Link, who: &str) -> Option<Error> {
        let now = Instant::now();
        if now < self.next_check {
            return None;
        }
        self.next_check = now + Duration::from_millis(1);
        let mut buf = [0u8; 64];
        while !self.eof {
            match (&self.sock).read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.dec.handle_bytes(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.eof = true,
            }
        }
        loop {
            match self.dec.poll_frame() {
                Ok(Some(Frame::Abort { reason, detail })) => {
                    return Some(
                        link.aborted(format!("the {who} gave up: {}", reason.describe(detail))),
                    );
                }
                Ok(Some(Frame::Msg(h))) if h.tag == STOPPED_TAG => self.stopped = true,
                Ok(Some(Frame::Msg(h))) if h.tag == alive::ALIVE_TAG => self.probed = None,
                Ok(Some(Frame::Msg(h))) if h.tag == POSTED_TAG => {
                    if self.answering.is_some() && !self.aborted {
                        let _ = (&self.sock).write(&alive::frame());
                    }
                    if let Some(p) = h.inline.as_deref().filter(|p| p.len() >= 16) {
                        self.waits_for = Some(get_u64(p, 0));
                        self.posted = self.posted.max(get_u64(p, 8));
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(e) => return Some(link.protocol(Stage::Data, e)),
            }
        }
    }

    fn send_abort(&mut self, e: &Error) {
        if matches!(e, Error::Aborted { .. }) {
            return;
        }
        let reason = match e {
            Error::Protocol { .. } | Error::TagMismatch { .. } | Error::Truncated { .. } => {
                AbortReason::Protocol
            }
            Error::Io { .. } | Error::Closed { .. } | Error::Timeout { .. } => {
                AbortReason::StreamFailed
            }
            _ => AbortReason::Local,
        };
        let mut b = Vec::new();
        Frame::Abort { reason, detail: 0 }.encode(&mut b);
        let _ = (&self.sock).write(&b);
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
        self.aborted = true;
    }
}

// ------------------------------------------------------------------------------------------
// TCP lane (WEFT_OFI_MIN_BYTES): small messages over a TCP stream on the data network.

/// Header of a message on a TCP lane: sequence number, tag, buffer index (`u32::MAX`: not
/// known to the sender, the receiver picks it as for an eager message), size.
const LANE_HDR: usize = 24;
const LANE_NO_SLOT: u32 = u32::MAX;
/// Largest message a lane carries (the bound of `WEFT_OFI_MIN_BYTES`).
const LANE_MAX: usize = 16 << 20;

/// A lane message as the receiver reads it.
struct LaneMsg {
    seq: u64,
    tag: i32,
    slot: Option<usize>,
    payload: Vec<u8>,
}

/// The sender's end of a TCP lane: a non-blocking stream to the receiver's lane listener,
/// opened right after the handshake, that starts with the connection id.
struct LaneTx {
    sock: Socket,
    peer: SocketAddr,
    connected: bool,
    out: Vec<u8>,
    pos: usize,
    deadline: Instant,
    timeout: Duration,
    /// Messages sent over the lane (statistics).
    msgs: u64,
    /// Stream offsets: bytes queued so far, and bytes the kernel has taken.
    queued: u64,
    written: u64,
}

impl LaneTx {
    fn connect(
        addr: SocketAddr,
        local: Option<IpAddr>,
        conn_id: u64,
        cfg: &Config,
        link: &Link,
    ) -> Result<LaneTx> {
        let e = |op: &'static str, err: &io::Error| {
            Link {
                peer: addr,
                iface: link.iface.clone(),
            }
            .io(op, Stage::Connect, err)
        };
        let s = Socket::new(
            SockDomain::for_address(addr),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|x| e("lane socket", &x))?;
        s.set_nonblocking(true)
            .and_then(|()| s.set_tcp_nodelay(true))
            .map_err(|x| e("lane setsockopt", &x))?;
        if let Some(l) = local {
            s.bind(&SocketAddr::new(l, 0).into())
                .map_err(|x| e("lane bind", &x))?;
        }
        match s.connect(&SockAddr::from(addr)) {
            Ok(()) => {}
            Err(x) if x.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(x) => return Err(e("lane connect", &x)),
        }
        let out = conn_id.to_le_bytes().to_vec();
        Ok(LaneTx {
            sock: s,
            peer: addr,
            connected: false,
            queued: out.len() as u64,
            written: 0,
            out,
            pos: 0,
            deadline: Instant::now() + cfg.timeout,
            timeout: cfg.timeout,
            msgs: 0,
        })
    }

    /// Queues one message (copied); returns the stream offset its send is complete at (see
    /// [`LaneTx::written`]): only bytes the kernel has taken leave without more flushes.
    fn push(&mut self, seq: u64, tag: i32, slot: Option<usize>, payload: &[u8]) -> u64 {
        let mut h = [0u8; LANE_HDR];
        put_u64(&mut h, 0, seq);
        put_u32(&mut h, 8, tag as u32);
        put_u32(&mut h, 12, slot.map_or(LANE_NO_SLOT, |s| s as u32));
        put_u64(&mut h, 16, payload.len() as u64);
        self.out.extend_from_slice(&h);
        self.out.extend_from_slice(payload);
        self.msgs += 1;
        // Writing resets the bound: it covers a stream that accepts nothing for that long.
        if self.pos == self.out.len() - h.len() - payload.len() {
            self.deadline = Instant::now() + self.timeout;
        }
        self.queued += (h.len() + payload.len()) as u64;
        self.queued
    }

    /// Whether bytes are still queued.
    fn pending(&self) -> bool {
        self.pos < self.out.len()
    }

    /// Connects and writes what it can without blocking. Bounded: a lane that does not connect,
    /// or takes nothing of queued bytes for `timeout`, is an error.
    fn flush(&mut self, link: &Link) -> Result<()> {
        let lane = || Link {
            peer: self.peer,
            iface: link.iface.clone(),
        };
        if !self.connected {
            if poll_fd(self.sock.as_raw_fd(), libc::POLLOUT) == 0 {
                if Instant::now() >= self.deadline {
                    return Err(lane().timeout(Stage::Connect, self.timeout));
                }
                return Ok(());
            }
            match self.sock.take_error() {
                Ok(None) => self.connected = true,
                Ok(Some(e)) | Err(e) => return Err(lane().io("lane connect", Stage::Connect, &e)),
            }
        }
        let start = self.pos;
        while self.pos < self.out.len() {
            match (&self.sock).write(&self.out[self.pos..]) {
                Ok(n) => {
                    self.pos += n;
                    self.written += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(lane().io("lane send", Stage::Data, &e)),
            }
        }
        if self.pos > start {
            self.deadline = Instant::now() + self.timeout;
        } else if self.pending() && Instant::now() >= self.deadline {
            return Err(lane().timeout(Stage::Data, self.timeout));
        }
        if self.pos == self.out.len() {
            self.out.clear();
            self.pos = 0;
        } else if self.pos >= 1 << 20 {
            self.out.drain(..self.pos);
            self.pos = 0;
        }
        Ok(())
    }
}

/// The receiver's end of a TCP lane: its own listener on the data interface, until the
/// sender's stream (which must start with the connection id) arrives.
struct LaneRx {
    addr: SocketAddr,
    listener: Option<TcpListener>,
    sock: Option<TcpStream>,
    conn_id: u64,
    authed: bool,
    inbuf: Vec<u8>,
    deadline: Instant,
    timeout: Duration,
}

impl LaneRx {
    fn listen(ip: IpAddr, conn_id: u64, cfg: &Config) -> Result<LaneRx> {
        let sa = SocketAddr::new(ip, 0);
        let op = || format!("TCP lane listener on {sa}");
        let l = TcpListener::bind(sa).map_err(|e| Error::local(op(), &e))?;
        l.set_nonblocking(true)
            .map_err(|e| Error::local(op(), &e))?;
        let addr = l.local_addr().map_err(|e| Error::local(op(), &e))?;
        Ok(LaneRx {
            addr,
            listener: Some(l),
            sock: None,
            conn_id,
            authed: false,
            inbuf: Vec::new(),
            deadline: Instant::now() + cfg.timeout,
            timeout: cfg.timeout,
        })
    }

    /// Accepts the sender's stream and reads the messages that are complete.
    fn poll(&mut self, link: &Link, out: &mut Vec<LaneMsg>) -> Result<()> {
        let lane = |peer: SocketAddr| Link {
            peer,
            iface: link.iface.clone(),
        };
        if self.sock.is_none() {
            let Some(l) = &self.listener else {
                return Ok(());
            };
            match l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(true)
                        .and_then(|()| s.set_nodelay(true))
                        .map_err(|e| lane(self.addr).io("lane accept", Stage::Accept, &e))?;
                    self.sock = Some(s);
                    self.listener = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= self.deadline {
                        return Err(lane(self.addr).timeout(Stage::Accept, self.timeout));
                    }
                    return Ok(());
                }
                Err(e) => return Err(lane(self.addr).io("lane accept", Stage::Accept, &e)),
            }
        }
        let Some(sock) = &self.sock else {
            return Ok(());
        };
        let peer = sock.peer_addr().unwrap_or(self.addr);
        let mut buf = [0u8; 64 << 10];
        loop {
            match (&*sock).read(&mut buf) {
                // The sender closed its end: the side channel tells whether it is gone.
                Ok(0) => break,
                Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(lane(peer).io("lane recv", Stage::Data, &e)),
            }
        }
        let bad = |got: &'static str| {
            lane(peer).protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got,
                    expected: "a TCP lane message",
                },
            )
        };
        let mut at = 0;
        if !self.authed {
            if self.inbuf.len() < 8 {
                return Ok(());
            }
            if get_u64(&self.inbuf, 0) != self.conn_id {
                return Err(bad("a stream of another connection"));
            }
            self.authed = true;
            at = 8;
        }
        while self.inbuf.len() - at >= LANE_HDR {
            let h = &self.inbuf[at..at + LANE_HDR];
            let len = get_u64(h, 16);
            if len > LANE_MAX as u64 {
                return Err(bad("an oversized message"));
            }
            let len = len as usize;
            if self.inbuf.len() - at - LANE_HDR < len {
                break;
            }
            let slot = get_u32(h, 12);
            out.push(LaneMsg {
                seq: get_u64(h, 0),
                tag: get_u32(h, 8) as i32,
                slot: (slot != LANE_NO_SLOT).then_some(slot as usize),
                payload: self.inbuf[at + LANE_HDR..at + LANE_HDR + len].to_vec(),
            });
            at += LANE_HDR + len;
        }
        self.inbuf.drain(..at);
        Ok(())
    }
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
    fn fi(&self, op: &'static str, m: String) -> Error;
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

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// Registered memory of `n` slots of `size` bytes; message pools (eager bounce buffers, CTS)
/// start each slot with the receiving connection's key ([`shared::KEY_BYTES`]).
struct Pool {
    buf: Box<[u8]>,
    mr: Mr,
    /// Bytes per slot, key included.
    stride: usize,
    /// Bytes in front of each slot's contents (the key, or none).
    prefix: usize,
}

impl Pool {
    fn new(ep: &Port, n: usize, size: usize) -> std::result::Result<Pool, String> {
        let buf = vec![0u8; n * size].into_boxed_slice();
        let mr = ep.register(buf.as_ptr(), buf.len())?;
        Ok(Pool {
            buf,
            mr,
            stride: size,
            prefix: 0,
        })
    }

    /// Slots of `size` bytes for messages to the connection `key`.
    fn messages(ep: &Port, n: usize, size: usize, key: u64) -> std::result::Result<Pool, String> {
        let stride = shared::KEY_BYTES + size;
        let mut buf = vec![0u8; n * stride].into_boxed_slice();
        for s in buf.chunks_mut(stride) {
            s[..shared::KEY_BYTES].copy_from_slice(&key.to_le_bytes());
        }
        let mr = ep.register(buf.as_ptr(), buf.len())?;
        Ok(Pool {
            buf,
            mr,
            stride,
            prefix: shared::KEY_BYTES,
        })
    }

    /// The contents of slot `i` (after the key).
    fn slot(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf[i * self.stride + self.prefix..(i + 1) * self.stride]
    }

    /// Where slot `i` starts (its key), for sending it: [`Pool::wire`] bytes of `len`.
    fn ptr(&mut self, i: usize) -> *mut u8 {
        self.buf[i * self.stride..].as_mut_ptr()
    }

    /// Bytes on the wire of a message with `len` bytes of contents.
    fn wire(&self, len: usize) -> usize {
        self.prefix + len
    }

    /// Gives the memory up for good: the provider may still read it.
    fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.buf));
    }
}

/// How long a side whose peer's process ended (side channel EOF) keeps reading completions
/// before it calls the connection closed: what the peer sent before dying still lands.
const EOF_GRACE: Duration = Duration::from_millis(500);

/// Memory registered through a connection ([`SendConn::reg_mr`], [`RecvConn::reg_mr`]): the
/// plugin's `regMr` handle. Sends and receives that pass it use its registration without a
/// cache lookup; [`SendConn::dereg_mr`] drops it and every cache entry over its range, so no
/// later operation of the connection uses a registration of memory that was deregistered.
/// Not `Clone`: deregistering consumes the one handle.
#[derive(Debug)]
pub struct Registration {
    ptr: usize,
    len: usize,
    /// One registration per rail.
    mrs: Vec<Arc<Mr>>,
    /// The connection that made it (registrations may be bound to its endpoint).
    owner: u64,
}

impl Registration {
    /// This registration, if it is one of connection `owner` covering `ptr..ptr+len`.
    fn covering(
        reg: Option<&Registration>,
        owner: u64,
        ptr: usize,
        len: usize,
    ) -> Option<&Registration> {
        reg.filter(|r| r.owner == owner && r.mrs.iter().all(|m| m.covers(ptr, len)))
    }

    /// Registered address.
    pub fn addr(&self) -> usize {
        self.ptr
    }

    /// Registered length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the registration is of zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

fn register(
    caches: &mut [MrCache],
    eps: &[Port],
    owner: u64,
    ptr: usize,
    len: usize,
) -> std::result::Result<Registration, String> {
    let mut mrs = Vec::with_capacity(eps.len());
    for (cache, ep) in caches.iter_mut().zip(eps) {
        // Anything cached over this range may be of memory freed since without a
        // deregistration (the transport's own callers do not register): register afresh.
        cache.invalidate(ptr, len);
        mrs.push(cache.get(ep.endpoint(), ptr, len)?);
    }
    Ok(Registration {
        ptr,
        len,
        mrs,
        owner,
    })
}

fn stats(caches: &[MrCache]) -> (u64, u64) {
    caches
        .iter()
        .fold((0, 0), |(h, m), c| (h + c.hits, m + c.misses))
}

// ------------------------------------------------------------------------------------------
// Sender

#[derive(Debug, Clone, Copy)]
struct CtsEntry {
    /// Per rail: address (or offset) and key of the buffer's registration there.
    addr: [u64; MAX_RAILS],
    key: [u64; MAX_RAILS],
    len: u64,
    tag: i32,
}

struct Group {
    first: u64,
    n: usize,
    rreq: u32,
    entries: [CtsEntry; MAX_RECVS],
    filled: [bool; MAX_RECVS],
    assigned: usize,
}

struct Unassigned {
    seq: u64,
    tag: i32,
    ptr: usize,
    len: usize,
    req: RequestId,
    /// Sent eagerly: only its buffer choice is left to account (no write).
    eager: bool,
    /// Goes over the TCP lane once its buffer is known.
    lane: bool,
}

struct WriteOp {
    rail: usize,
    req: RequestId,
    ptr: usize,
    len: usize,
    addr: u64,
    key: u64,
    data: u64,
    /// Which of the request's write contexts (see [`WRITES_PER_REQ`]).
    k: usize,
    /// The size record (from the request's slot of `recs`), not the caller's data.
    record: bool,
}

/// Write contexts per send request: the data (one per stripe, at most one per rail), and the
/// size record of the 4-byte protocol (the last).
const WRITES_PER_REQ: usize = MAX_RAILS + 1;

struct SendReq {
    size: usize,
    done: bool,
    posted: bool,
    /// Writes queued or in flight; the request is done when the last one completes.
    writes_left: usize,
    /// The caller's registration (isend_mr), used instead of a cache lookup.
    given: Vec<Arc<Mr>>,
    /// Registrations of local memory its writes use, kept until they complete.
    _mr: Vec<Arc<Mr>>,
}

/// The sending end of an ofi connection.
pub struct SendConn {
    /// One endpoint per rail; rail 0 also carries CTS, eager messages and size records.
    eps: Vec<Port>,
    link: Link,
    side: Side,
    ctx: Box<[Ctx]>,
    eager: Pool,
    /// Events of one poll (kept for its allocation).
    events: Vec<Event>,
    eager_free: Vec<usize>,
    eager_busy: usize,
    /// Eager sends not yet accepted by the provider: (slot, bytes, request, tag, the caller's
    /// buffer when the message goes from it, else 0: from the bounce slot).
    eager_queue: VecDeque<(usize, usize, RequestId, i32, usize)>,
    /// Registration cache per rail.
    caches: Vec<MrCache>,
    reqs: Slab<SendReq>,
    next_seq: u64,
    unassigned: VecDeque<Unassigned>,
    groups: BTreeMap<u64, Group>,
    writes: VecDeque<WriteOp>,
    /// RMA writes handed to the provider whose completion has not been read.
    writes_out: usize,
    eager_sent: u64,
    eager_consumed: u64,
    peer_slots: u64,
    mr_local: bool,
    max_msg: usize,
    /// 4-byte protocol: the receiver's size table (address or offset, key).
    table: Option<(u64, u64)>,
    /// 4-byte protocol: one registered size record per send request.
    recs: Pool,
    id: u64,
    /// Messages of at least this size are striped across the rails.
    stripe: usize,
    /// Rail of the next unstriped message (round robin).
    next_rail: usize,
    /// Bytes written per rail (statistics).
    rail_bytes: [u64; MAX_RAILS],
    /// The TCP lane for messages under `min_bytes` (WEFT_OFI_MIN_BYTES).
    lane: Option<LaneTx>,
    /// Lane sends not complete yet: the stream offset each completes at, in order.
    lane_sends: VecDeque<(u64, RequestId)>,
    min_bytes: usize,
    /// The data path, as a stall names it.
    data: Link,
    stall: Stall,
    /// Bounds the wait for a CTS the receiver says left `timeout` ago (POSTED).
    cts_lost: Stall,
    /// Messages before this sequence number have had their CTS.
    cts_upto: u64,
    /// Every receive before this sequence number sent its CTS before the latest CTS, or never
    /// will (a small receive whose messages all came eagerly): a message before it that no
    /// CTS covers went eagerly and needs no buffer choice.
    settled: u64,
    /// When the latest messages were given their buffer (their data handed over): sequence
    /// number and instant, oldest first, at most [`HANDED_LOG`].
    handed: VecDeque<(u64, Instant)>,
    /// Per eager bounce slot in use, the sequence number of its message.
    eager_seq: [Option<u64>; EAGER_SLOTS],
    /// Per eager bounce slot handed over by `fi_send`, the request its completion completes.
    eager_req: [Option<RequestId>; EAGER_SLOTS],
    eof_at: Option<Instant>,
    error: Option<Error>,
}

impl std::fmt::Debug for SendConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ofi::SendConn({} via {})",
            self.link.peer, self.link.iface
        )
    }
}

impl SendConn {
    fn new(
        eps: Vec<Port>,
        link: Link,
        sock: TcpStream,
        peer_slots: u32,
        table: Option<(u64, u64)>,
        stripe: usize,
    ) -> Result<SendConn> {
        let e = |m: String| ofi_err(&link, "fi_mr_reg", Stage::Handshake, m);
        let ep = &eps[0];
        let eager = Pool::messages(ep, EAGER_SLOTS, EAGER_BUF, ep.peer_key()).map_err(e)?;
        let recs = Pool::new(ep, MAX_SEND_REQUESTS, REC).map_err(e)?;
        let key = ep.key();
        let mut ctx = ctx_array(EAGER_SLOTS + MAX_SEND_REQUESTS * WRITES_PER_REQ);
        for (i, c) in ctx.iter_mut().enumerate() {
            c.owner = key;
            c.id = if i < EAGER_SLOTS {
                (C_EAGER_TX << 32) | i as u64
            } else {
                (C_WRITE << 32) | (i - EAGER_SLOTS) as u64
            };
        }
        let info = ep.dom.info.clone();
        let caches = eps.iter().map(|_| MrCache::default()).collect();
        let data = link.clone();
        let s = SendConn {
            eps,
            link,
            side: Side::new(sock).answering(),
            ctx,
            eager,
            eager_free: (0..EAGER_SLOTS).rev().collect(),
            eager_busy: 0,
            eager_queue: VecDeque::new(),
            caches,
            reqs: Slab::new(MAX_SEND_REQUESTS),
            next_seq: 0,
            unassigned: VecDeque::new(),
            groups: BTreeMap::new(),
            writes: VecDeque::new(),
            writes_out: 0,
            events: Vec::new(),
            eager_sent: 0,
            eager_consumed: 0,
            peer_slots: u64::from(peer_slots),
            mr_local: info.mr_mode & sys::FI_MR_LOCAL != 0,
            max_msg: info.max_msg_size,
            table,
            recs,
            id: key,
            stripe: stripe.max(4096),
            next_rail: 0,
            rail_bytes: [0; MAX_RAILS],
            lane: None,
            lane_sends: VecDeque::new(),
            min_bytes: 0,
            data,
            stall: Stall::new(),
            cts_lost: Stall::new(),
            cts_upto: 0,
            settled: 0,
            handed: VecDeque::new(),
            eager_seq: [None; EAGER_SLOTS],
            eager_req: [None; EAGER_SLOTS],
            eof_at: None,
            error: None,
        };
        Ok(s)
    }

    /// Remote management address and "interface (ofi provider/domain)".
    pub fn peer(&self) -> (SocketAddr, &str) {
        (self.link.peer, &self.link.iface)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.reqs.live()
    }

    /// Bytes of remote CQ data the connection uses (4 or 8).
    pub fn cq_data_bytes(&self) -> usize {
        if self.table.is_some() { 4 } else { 8 }
    }

    /// Registration cache statistics: (hits, misses).
    pub fn mr_stats(&self) -> (u64, u64) {
        stats(&self.caches)
    }

    /// Rails (endpoints) of the connection.
    pub fn rails(&self) -> usize {
        self.eps.len()
    }

    /// Bytes of message data written on each rail so far (RMA writes; eager messages go on
    /// rail 0 and are not counted).
    pub fn rail_bytes(&self) -> Vec<u64> {
        self.rail_bytes[..self.eps.len()].to_vec()
    }

    /// Connections of this process on the connection's rail-0 endpoint, itself included.
    pub fn endpoint_users(&self) -> usize {
        self.eps[0].users()
    }

    /// Messages sent over the TCP lane so far; `None` without a lane.
    pub fn lane_msgs(&self) -> Option<u64> {
        self.lane.as_ref().map(|l| l.msgs)
    }

    /// Registers `len` bytes at `ptr` for this connection (NCCL's regMr).
    pub fn reg_mr(&mut self, ptr: *const u8, len: usize) -> Result<Registration> {
        register(&mut self.caches, &self.eps, self.id, ptr as usize, len)
            .map_err(|m| self.fi("fi_mr_reg", m))
    }

    /// Releases a registration of [`SendConn::reg_mr`] (NCCL's deregMr): it and every cached
    /// registration over its range are gone for later operations.
    pub fn dereg_mr(&mut self, reg: Registration) {
        if reg.owner == self.id {
            for c in &mut self.caches {
                c.invalidate(reg.ptr, reg.len);
            }
        }
    }

    fn fi(&self, op: &'static str, m: String) -> Error {
        ofi_err(&self.link, op, Stage::Data, m)
    }

    fn fail(&mut self, e: Error) -> Error {
        if self.error.is_none() {
            self.side.send_abort(&e);
        }
        self.error.get_or_insert(e).clone()
    }

    fn on_cts(&mut self, msg: &[u8]) -> Result<()> {
        // Whole entries read as zero past a short message; its kind is checked.
        let mut whole = [0u8; CTS_BUF];
        whole[..msg.len().min(CTS_BUF)].copy_from_slice(&msg[..msg.len().min(CTS_BUF)]);
        let b = &whole[..];
        if msg.len() < 32 || get_u32(b, 0) != K_CTS {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "unknown message",
                    expected: "CTS",
                },
            ));
        }
        let n = (get_u32(b, 4) as usize).min(MAX_RECVS);
        let first = get_u64(b, 8);
        let consumed = get_u64(b, 16);
        let rreq = get_u32(b, 24);
        // CTS arrive in the order they were sent (FI_ORDER_SAS on rail 0).
        self.settled = self.settled.max(first);
        if n == 0 {
            // Eager credit only.
            self.eager_consumed = self.eager_consumed.max(consumed);
            self.cts_upto = self.cts_upto.max(first);
            return Ok(());
        }
        if self.table.is_some() && rreq as usize >= MAX_RECV_REQUESTS {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "CTS with a request index over 63",
                    expected: "CTS",
                },
            ));
        }
        let mut entries = [CtsEntry {
            addr: [0; MAX_RAILS],
            key: [0; MAX_RAILS],
            len: 0,
            tag: 0,
        }; MAX_RECVS];
        let rails = self.eps.len();
        let size = cts_entry(rails);
        for (k, e) in entries.iter_mut().enumerate().take(n) {
            let at = 32 + k * size;
            e.addr[0] = get_u64(b, at);
            e.key[0] = get_u64(b, at + 8);
            e.len = get_u64(b, at + 16);
            e.tag = get_u32(b, at + 24) as i32;
            for r in 1..rails {
                let at = at + CTS_ENTRY + (r - 1) * CTS_RAIL;
                e.addr[r] = get_u64(b, at);
                e.key[r] = get_u64(b, at + 8);
            }
        }
        self.eager_consumed = self.eager_consumed.max(consumed);
        self.cts_upto = self.cts_upto.max(first + n as u64);
        self.groups.insert(
            first,
            Group {
                first,
                n,
                rreq,
                entries,
                filled: [false; MAX_RECVS],
                assigned: 0,
            },
        );
        Ok(())
    }

    /// Gives each send whose CTS is known its buffer, in sequence order; queues the writes.
    fn assign(&mut self) -> Result<()> {
        while let Some(u) = self.unassigned.front() {
            let covered = self
                .groups
                .range(..=u.seq)
                .next_back()
                .is_some_and(|(_, g)| u.seq < g.first + g.n as u64);
            if !covered {
                if u.seq >= self.settled {
                    break;
                }
                // Its receive sends no CTS: every message of it came eagerly (a receive still
                // missing one sends its CTS).
                if !u.eager {
                    return Err(self.link.protocol(
                        Stage::Data,
                        proto::FrameError::Unexpected {
                            got: "no CTS for a message that waits for one",
                            expected: "CTS",
                        },
                    ));
                }
                if self.handed.len() >= HANDED_LOG {
                    self.handed.pop_front();
                }
                self.handed.push_back((u.seq, Instant::now()));
                self.unassigned.pop_front();
                continue;
            }
            let Some((&first, g)) = self.groups.range_mut(..=u.seq).next_back() else {
                break;
            };
            if self.handed.len() >= HANDED_LOG {
                self.handed.pop_front();
            }
            self.handed.push_back((u.seq, Instant::now()));
            let tags: Vec<i32> = g.entries[..g.n].iter().map(|e| e.tag).collect();
            let peer = self.link.peer;
            let slot = proto::select_slot(&tags, &g.filled[..g.n], u.tag)
                .ok_or(Error::TagMismatch { peer, tag: u.tag })?;
            g.filled[slot] = true;
            g.assigned += 1;
            let e = g.entries[slot];
            if !u.eager {
                let req = u.req;
                if u.len as u64 > e.len {
                    return Err(Error::Truncated {
                        peer,
                        sent: u.len as u64,
                        posted: e.len as usize,
                        tag: u.tag,
                    });
                }
                if u.lane
                    && let Some(lane) = &mut self.lane
                {
                    let payload = if u.len == 0 {
                        &[][..]
                    } else {
                        // SAFETY: the caller of isend keeps `ptr..ptr+len` readable until the
                        // request is done, which is now (after this copy).
                        unsafe { std::slice::from_raw_parts(u.ptr as *const u8, u.len) }
                    };
                    let end = lane.push(u.seq, u.tag, Some(slot), payload);
                    self.lane_sends.push_back((end, req));
                    if g.assigned == g.n {
                        self.groups.remove(&first);
                    }
                    self.unassigned.pop_front();
                    continue;
                }
                let (rreq, len) = (u64::from(g.rreq), u.len as u64);
                // Stripes: one per rail from the threshold on, else the whole message on the
                // next rail in turn. The receiver learns their number from the CQ data.
                let rails = self.eps.len();
                let parts = if rails > 1 && u.len >= self.stripe {
                    rails
                } else {
                    1
                };
                let chunk = u.len.div_ceil(parts);
                let rail0 = if parts == 1 {
                    self.next_rail = (self.next_rail + 1) % rails;
                    self.next_rail
                } else {
                    0
                };
                // Remote CQ data: 8 bytes `size << 32 | receiver's slot << 12 | stripes << 9 |
                // request << 3 | buffer` (stripes 0 meaning 1; the slot is the rail's, added
                // when posted); 4 bytes see IMM_*.
                let parts_field = if parts > 1 { parts as u64 } else { 0 };
                let (data, record) = match self.table {
                    None => (
                        (len << 32)
                            | (parts_field << W8_PARTS_SHIFT)
                            | (rreq << W8_REQ_SHIFT)
                            | slot as u64,
                        None,
                    ),
                    Some((ta, tk)) => {
                        // 4-byte protocol: the size inline when it fits, else in a size record
                        // written to the receiver's table (its own completion: the receiver
                        // waits for both, so no ordering between the writes is needed).
                        let base = rreq
                            | ((slot as u64) << IMM_SLOT_SHIFT)
                            | ((u.seq & IMM_CHECK_MASK) << IMM_CHECK_SHIFT);
                        if parts == 1 && u.len <= IMM_SIZE_MAX {
                            (
                                base | (IMM_SIZED << IMM_KIND_SHIFT) | (len << IMM_SIZE_SHIFT),
                                None,
                            )
                        } else {
                            let at = (g.rreq as usize * MAX_RECVS + slot) * REC;
                            (
                                base | (IMM_DATA << IMM_KIND_SHIFT)
                                    | (parts_field << IMM_SIZE_SHIFT),
                                Some(WriteOp {
                                    rail: 0,
                                    req,
                                    ptr: 0,
                                    len: REC,
                                    addr: ta + at as u64,
                                    key: tk,
                                    data: base | (IMM_RECORD << IMM_KIND_SHIFT),
                                    k: MAX_RAILS,
                                    record: true,
                                }),
                            )
                        }
                    }
                };
                for k in 0..parts {
                    let off = (k * chunk).min(u.len);
                    let rail = if parts == 1 { rail0 } else { k };
                    self.writes.push_back(WriteOp {
                        rail,
                        req,
                        ptr: u.ptr + off,
                        len: chunk.min(u.len - off),
                        addr: e.addr[rail] + off as u64,
                        key: e.key[rail],
                        data,
                        k,
                        record: false,
                    });
                }
                let mut n = parts;
                if let Some(op) = record {
                    let rb = self.recs.slot(req.index());
                    put_u64(rb, 0, len);
                    put_u64(rb, 8, u.seq);
                    self.writes.push_back(op);
                    n += 1;
                }
                if let Some(r) = self.reqs.get_mut(req) {
                    r.writes_left = n;
                }
            }
            if g.assigned == g.n {
                self.groups.remove(&first);
            }
            self.unassigned.pop_front();
        }
        Ok(())
    }

    /// Hands queued eager sends to the provider, in order; each is complete at its send
    /// completion, not when the provider takes it: the provider may still need this side's
    /// progress to deliver it (a full socket, `ofi_rxm`'s segmented protocol above its eager
    /// size), and a caller stops testing a request once it is done. For the same reason no
    /// message goes by `fi_inject`, which has no completion to wait for. An eager send is not
    /// `posted` (timed): its receive may not be posted yet.
    fn post_eager(&mut self) -> Result<()> {
        while let Some(&(slot, len, id, tag, src)) = self.eager_queue.front() {
            let desc = self.eager.mr.desc();
            let c: *mut Ctx = &mut self.ctx[slot];
            let ok = if self.table.is_none() {
                let seq = self.eager_seq[slot].unwrap_or(0);
                let data = (u64::from(tag as u32) << 32)
                    | self.eps[0].peer_slot_bits()
                    | (seq & EAGER_SEQ_MASK);
                // From the caller's buffer, with its registration where the provider wants
                // one (kept until the send completes); an empty message from the bounce slot.
                let (p, desc) = if src == 0 {
                    (self.eager.slot(slot).as_ptr(), desc)
                } else {
                    let given = self
                        .reqs
                        .get_mut(id)
                        .and_then(|r| r.given.first())
                        .filter(|m| m.covers(src, len))
                        .cloned();
                    let mr = match given {
                        Some(m) => Some(m),
                        None if self.mr_local => Some(
                            self.caches[0]
                                .get(self.eps[0].endpoint(), src, len)
                                .map_err(|m| self.fi("fi_mr_reg", m))?,
                        ),
                        None => None,
                    };
                    let desc = mr.as_ref().map_or(std::ptr::null_mut(), |m| m.desc());
                    if let Some(r) = self.reqs.get_mut(id) {
                        r._mr.extend(mr);
                    }
                    (src as *const u8, desc)
                };
                // SAFETY: the caller of isend keeps its buffer valid, and the bounce slot and
                // context stay untouched, until this send's completion makes the request done
                // and returns the slot to `eager_free`; they outlive it (the connection's drop
                // waits for it, or leaks them).
                unsafe { self.eps[0].send_data(p, len, desc, data, c.cast()) }
            } else {
                let p = self.eager.ptr(slot);
                let n = self.eager.wire(HDR + len);
                // SAFETY: as above.
                unsafe { self.eps[0].send(p, n, desc, c.cast()) }
            }
            .map_err(|m| self.fi("fi_send", m))?;
            if !ok {
                break;
            }
            self.eager_req[slot] = Some(id);
            self.eager_queue.pop_front();
        }
        Ok(())
    }

    fn post_writes(&mut self) -> Result<()> {
        while let Some(w) = self.writes.front() {
            let (rail, req, ptr, len) = (w.rail, w.req, w.ptr, w.len);
            let (addr, key, data) = (w.addr, w.key, w.data);
            let c: *mut Ctx = &mut self.ctx[EAGER_SLOTS + req.index() * WRITES_PER_REQ + w.k];
            if w.record {
                let p = self.recs.ptr(req.index());
                let desc = self.recs.mr.desc();
                // SAFETY: the request's record slot is written only by `assign` before this
                // write is queued and not again until the request completes; the remote range
                // is the receiver's size table entry for the buffer its CTS gave this message.
                let ok = unsafe { self.eps[0].write_data(p, len, desc, data, addr, key, c.cast()) }
                    .map_err(|m| self.fi("fi_writedata", m))?;
                if !ok {
                    break;
                }
                self.writes_out += 1;
                self.writes.pop_front();
                continue;
            }
            let given = self
                .reqs
                .get_mut(req)
                .and_then(|r| r.given.get(rail))
                .filter(|m| m.covers(ptr, len))
                .cloned();
            let mr = match given {
                Some(m) => Some(m),
                None if self.mr_local => Some(
                    self.caches[rail]
                        .get(self.eps[rail].endpoint(), ptr, len)
                        .map_err(|m| self.fi("fi_mr_reg", m))?,
                ),
                None => None,
            };
            let desc = mr.as_ref().map_or(std::ptr::null_mut(), |m| m.desc());
            // The 8-byte protocol routes the write to the receiver's connection on its rail.
            let data = if self.table.is_none() {
                data | self.eps[rail].peer_slot_bits()
            } else {
                data
            };
            // SAFETY: the caller of isend keeps `ptr..ptr+len` valid until test reports done,
            // which is after this write's completion; the context lives with the connection;
            // the remote range was announced by the receiver's CTS for this very message.
            let ok = unsafe {
                self.eps[rail].write_data(ptr as *const u8, len, desc, data, addr, key, c.cast())
            }
            .map_err(|m| self.fi("fi_writedata", m))?;
            if !ok {
                break;
            }
            self.writes_out += 1;
            if let Some(r) = self.reqs.get_mut(req) {
                r.posted = true;
                // Kept until the write completes.
                r._mr.extend(mr);
            }
            self.rail_bytes[rail] += len as u64;
            self.writes.pop_front();
        }
        Ok(())
    }

    /// Reads every rail's events; whether there were any.
    fn poll_cq(&mut self) -> Result<bool> {
        poll_rails(self)
    }

    fn work_pending(&self) -> bool {
        self.reqs.values().any(|r| !r.done)
    }

    /// Writes what the lane can take; a lane send is complete once the kernel has all of its
    /// bytes, not when they are queued: NCCL stops testing a request that is done, and bytes
    /// still queued here would then never leave.
    fn flush_lane(&mut self) -> Result<()> {
        let Some(lane) = &mut self.lane else {
            return Ok(());
        };
        lane.flush(&self.link)?;
        while let Some(&(end, id)) = self.lane_sends.front() {
            if end > lane.written {
                break;
            }
            if let Some(r) = self.reqs.get_mut(id) {
                r.done = true;
            }
            self.lane_sends.pop_front();
        }
        Ok(())
    }

    /// Whether the sender waits for the completion of data it handed over for a receive the
    /// receiver has posted (so the receiver polls it, and drives its provider): an RMA write
    /// queued or in flight, or an eager send whose message a CTS has covered since. Not an
    /// eager send to a receive not posted yet (with a manual-progress provider it may not
    /// complete until the receiver polls, which it may legitimately do much later), and not
    /// the TCP lane (bounded on its own).
    fn timed_work(&self) -> bool {
        !self.writes.is_empty()
            || self.reqs.values().any(|r| r.posted && !r.done)
            || (self.eager_busy > 0
                && self
                    .eager_seq
                    .iter()
                    .any(|s| s.is_some_and(|s| s < self.cts_upto)))
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let mut progressed = false;
        if let Err(e) = self.poll_cq().map(|p| progressed = p) {
            return Err(self.fail(e));
        }
        // The side channel before anything is posted: a receiver that closed (EOF) gets no
        // more writes, which would reach registrations it is about to close (see
        // [`STOPPED_TAG`]); once none of ours is in flight, it is told so.
        if let Some(e) = self.side.poll(&self.link, "receiver") {
            return Err(self.fail(e));
        }
        if self.side.eof {
            if self.writes_out == 0 {
                self.side.send_stopped();
            }
        } else {
            let r = self
                .post_eager()
                .and_then(|()| self.assign())
                .and_then(|()| self.post_writes())
                .and_then(|()| self.flush_lane());
            if let Err(e) = r {
                return Err(self.fail(e));
            }
        }
        // After reading the completion queues: what completed while nobody polled counts.
        let waiting = self.timed_work();
        if self.stall.check(progressed, waiting) {
            let e = self.data.timeout(Stage::Data, self.stall.timeout);
            return Err(self.fail(e));
        }
        // The next message (after `assign`, the first without its CTS) is one the receiver
        // has posted, and its CTS left the receiver `timeout` ago: lost on the data path.
        let lost = self
            .unassigned
            .front()
            .is_some_and(|u| u.seq < self.side.posted);
        if self.cts_lost.check(false, lost) {
            let e = self.data.timeout(Stage::Data, self.stall.timeout);
            return Err(self.fail(e));
        }
        // The receiver has seen nothing for `timeout` and waits for a message we handed over
        // (and saw complete: the provider took it) `timeout` ago or more: lost on the way.
        if let Some(w) = self.side.waits_for.take() {
            let sent = self.unassigned.front().map_or(self.next_seq, |u| u.seq);
            let at = self.handed.partition_point(|h| h.0 < w);
            let old = match self.handed.get(at) {
                Some(&(seq, t)) if seq == w => t.elapsed() >= self.stall.timeout,
                _ => at == 0,
            };
            if w < sent && old {
                let e = self.data.timeout(Stage::Data, self.stall.timeout);
                return Err(self.fail(e));
            }
        }
        if self.side.eof && self.work_pending() {
            let at = *self.eof_at.get_or_insert_with(Instant::now);
            if at.elapsed() >= EOF_GRACE {
                let e = self.link.closed(Stage::Data);
                return Err(self.fail(e));
            }
        }
        Ok(())
    }

    /// Starts sending `len` bytes at `data` with `tag`. `Ok(None)`: busy, retry later.
    ///
    /// # Safety
    /// `data..data+len` must be readable and unchanged until [`SendConn::test`] reports the
    /// request done or the connection is dropped.
    pub unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: i32,
    ) -> Result<Option<RequestId>> {
        // SAFETY: forwarded under the same contract.
        unsafe { self.isend_mr(data, len, tag, None) }
    }

    /// [`SendConn::isend`] of memory inside `reg` (from [`SendConn::reg_mr`]), whose
    /// registration it uses instead of looking one up.
    ///
    /// # Safety
    /// As for [`SendConn::isend`].
    pub unsafe fn isend_mr(
        &mut self,
        data: *const u8,
        len: usize,
        tag: i32,
        reg: Option<&Registration>,
    ) -> Result<Option<RequestId>> {
        let given = Registration::covering(reg, self.id, data as usize, len)
            .map_or_else(Vec::new, |r| r.mrs.clone());
        // No completion-queue read before the message is handed over: with `tcp;ofi_rxm` a
        // read costs about a microsecond of system calls, all on the message's latency. A CTS
        // that arrived but was not read yet only means the message goes eagerly (see the
        // module docs: eager messages stay a prefix of their receive).
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if len > u32::MAX as usize || len > self.max_msg {
            return Err(Error::Usage(format!(
                "message of {len} bytes exceeds the ofi backend's limit ({} bytes)",
                self.max_msg.min(u32::MAX as usize)
            )));
        }
        if self.reqs.live() >= MAX_SEND_REQUESTS {
            // Busy: a caller that retries isend alone must still drive the provider.
            self.progress()?;
            return Ok(None);
        }
        let seq = self.next_seq;
        let cts_known = self
            .groups
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, g)| seq < g.first + g.n as u64);
        // Out of step (NCCL's InfiniBand semantics): when the receive this message reaches is
        // known and none of its free buffers takes the tag, the message is for a later
        // receive; "not yet" (the caller retries), rather than a send the receiver must refuse.
        if cts_known {
            if let Err(e) = self.assign() {
                return Err(self.fail(e));
            }
            let fits = self.groups.range(..=seq).next_back().is_none_or(|(_, g)| {
                let tags: Vec<i32> = g.entries[..g.n].iter().map(|e| e.tag).collect();
                proto::select_slot(&tags, &g.filled[..g.n], tag).is_some()
            });
            if !fits {
                self.progress()?;
                return Ok(None);
            }
        }
        let early = !cts_known
            && self.unassigned.iter().all(|u| u.eager)
            && self.eager_sent - self.eager_consumed < self.peer_slots;
        if self.lane.is_some() && len < self.min_bytes {
            // The TCP lane: now, without a buffer index, when an eager send could go now;
            // else once the CTS gives the buffer.
            // Not `posted` (timed by completions): the lane is bounded on its own.
            let Some(id) = self.reqs.insert(SendReq {
                size: len,
                done: false,
                posted: false,
                writes_left: 0,
                given: Vec::new(),
                _mr: Vec::new(),
            }) else {
                return Ok(None);
            };
            if early && let Some(lane) = &mut self.lane {
                let payload = if len == 0 {
                    &[][..]
                } else {
                    // SAFETY: the caller guarantees `data..data+len` is readable.
                    unsafe { std::slice::from_raw_parts(data, len) }
                };
                let end = lane.push(seq, tag, None, payload);
                self.lane_sends.push_back((end, id));
                self.eager_sent += 1;
            }
            self.next_seq += 1;
            self.unassigned.push_back(Unassigned {
                seq,
                tag,
                ptr: data as usize,
                len,
                req: id,
                eager: early,
                lane: !early,
            });
            self.progress()?;
            return Ok(Some(id));
        }
        let eager = len <= EAGER_MAX && early && !self.eager_free.is_empty();
        if eager && let Some(slot) = self.eager_free.pop() {
            let Some(id) = self.reqs.insert(SendReq {
                size: len,
                done: false,
                posted: false,
                writes_left: 0,
                // Sent from the caller's buffer (8-byte CQ data): its registration, if any.
                given: given.clone(),
                _mr: Vec::new(),
            }) else {
                self.eager_free.push(slot);
                return Ok(None);
            };
            // With 8-byte remote CQ data the message is the payload alone (its CQ data says
            // the rest), so EAGER_MAX bytes fit `ofi_rxm`'s eager size, and it goes straight
            // from the caller's buffer, which stays valid until the send is done (at its
            // completion). Else a header and a copy into the bounce slot first.
            let src = if self.table.is_none() && len > 0 {
                data as usize
            } else {
                0
            };
            if self.table.is_some() {
                let b = self.eager.slot(slot);
                put_u32(b, 0, K_EAGER);
                put_u32(b, 4, tag as u32);
                put_u64(b, 8, seq);
                put_u64(b, 16, len as u64);
                if len > 0 {
                    // SAFETY: the caller guarantees `data..data+len` is readable;
                    // len <= EAGER_MAX.
                    let src = unsafe { std::slice::from_raw_parts(data, len) };
                    b[HDR..HDR + len].copy_from_slice(src);
                }
            }
            self.eager_busy += 1;
            self.eager_seq[slot] = Some(seq);
            self.eager_sent += 1;
            self.next_seq += 1;
            self.eager_queue.push_back((slot, len, id, tag, src));
            self.unassigned.push_back(Unassigned {
                seq,
                tag,
                ptr: data as usize,
                len,
                req: id,
                eager: true,
                lane: false,
            });
            // Straight onto the wire; completions are read by the next test.
            if let Err(e) = self.post_eager() {
                return Err(self.fail(e));
            }
            return Ok(Some(id));
        }
        let Some(id) = self.reqs.insert(SendReq {
            size: len,
            done: false,
            posted: false,
            writes_left: 1,
            given,
            _mr: Vec::new(),
        }) else {
            return Ok(None);
        };
        self.next_seq += 1;
        self.unassigned.push_back(Unassigned {
            seq,
            tag,
            ptr: data as usize,
            len,
            req: id,
            eager: false,
            lane: false,
        });
        self.progress()?;
        Ok(Some(id))
    }

    /// Whether request `id` is done; `Some(bytes)` once it is (the id is then released).
    pub fn test(&mut self, id: RequestId) -> Result<Option<usize>> {
        self.progress()?;
        let r = self
            .reqs
            .get_mut(id)
            .ok_or_else(|| Error::Usage(format!("unknown send request {id:?}")))?;
        if r.done {
            let size = r.size;
            self.reqs.remove(id);
            return Ok(Some(size));
        }
        Ok(None)
    }
}

impl RailEvents for SendConn {
    fn ports(&self) -> &[Port] {
        &self.eps
    }

    fn events(&mut self) -> &mut Vec<Event> {
        &mut self.events
    }

    fn on_event(&mut self, ev: Event) -> Result<()> {
        let e = match ev {
            Event::Msg(m) => return self.on_cts(&m),
            Event::MsgData(..) => {
                return Err(self.link.protocol(
                    Stage::Data,
                    proto::FrameError::Unexpected {
                        got: "an eager message",
                        expected: "CTS",
                    },
                ));
            }
            Event::Done(e) => e,
        };
        if e.op_context.is_null() {
            return Ok(());
        }
        // SAFETY: every context this connection posts is an element of `self.ctx`.
        let id = unsafe { (*e.op_context.cast::<Ctx>()).id };
        let i = (id & 0xffff_ffff) as usize;
        match id >> 32 {
            C_EAGER_TX => {
                self.eager_free.push(i);
                self.eager_busy -= 1;
                self.eager_seq[i] = None;
                if let Some(r) = self.eager_req[i]
                    .take()
                    .and_then(|id| self.reqs.get_mut(id))
                {
                    r.done = true;
                    r._mr.clear();
                }
            }
            C_WRITE => {
                self.writes_out = self.writes_out.saturating_sub(1);
                if let Some(r) = self.reqs.at(i / WRITES_PER_REQ) {
                    r.writes_left = r.writes_left.saturating_sub(1);
                    if r.writes_left == 0 {
                        r.done = true;
                        r._mr.clear();
                        r.given.clear();
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn fi(&self, op: &'static str, m: String) -> Error {
        SendConn::fi(self, op, m)
    }
}

impl Drop for SendConn {
    /// Lets posted operations finish (bounded, 2 s) so that eager messages already reported
    /// complete reach the receiver, then closes the endpoint before its buffers go.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        // Writes in flight finish (no new ones are posted), and so do eager sends and the
        // lane, unless the receiver closed (EOF): then only the writes, which may still reach
        // its registrations, which it keeps until it hears STOPPED.
        while self.error.is_none()
            && (self.writes_out > 0
                || (!self.side.eof
                    && (self.eager_busy > 0 || self.lane.as_ref().is_some_and(LaneTx::pending))))
            && Instant::now() < deadline
        {
            if self
                .flush_lane()
                .and_then(|()| self.poll_cq())
                .and_then(|_| {
                    if self.side.eof {
                        Ok(())
                    } else {
                        self.post_eager()
                    }
                })
                .is_err()
            {
                break;
            }
            if self.side.poll(&self.link, "receiver").is_some() {
                break;
            }
        }
        if self.writes_out == 0 {
            self.side.send_stopped();
        }
        // A completed send may still sit unacknowledged in a kernel socket of the provider
        // (tcp;ofi_rxm): if this process exits now, closing that socket with bytes unread (the
        // receiver's CTS and acknowledgements) makes the kernel reset it and drop what it has
        // not sent, sends reported done included. So wait, within the same bound, until the
        // peer's kernel has acknowledged every byte of this process's TCP sockets.
        while self.error.is_none() && Instant::now() < deadline && tcp_unacked_bytes() > 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        // The endpoint stays with the other connections: if the sends above did not finish,
        // leak what the provider may still use, registrations of the caller's buffers (eager
        // messages and writes go from them) included.
        let idle = self.eager_busy == 0 && self.writes_out == 0;
        if !idle && !self.eps[0].is_private() {
            std::mem::forget(std::mem::take(&mut self.ctx));
            self.eager.leak();
            self.recs.leak();
            std::mem::forget(std::mem::take(&mut self.caches));
            std::mem::forget(std::mem::replace(&mut self.reqs, Slab::new(0)));
        }
        for c in &mut self.caches {
            c.clear();
        }
    }
}

/// Bytes written to this process's TCP sockets that their peers' kernels have not yet
/// acknowledged (`SIOCOUTQ` summed over `/proc/self/fd`): the provider's sockets are not ours
/// to name, so every one counts. 0 when `/proc` is unreadable (nothing to wait for then).
fn tcp_unacked_bytes() -> usize {
    tcp_queued(libc::TIOCOUTQ)
}

/// Bytes that have arrived on this process's TCP sockets and are not read yet (`SIOCINQ`
/// summed as in [`tcp_unacked_bytes`]): what a provider still has to take in.
pub(crate) fn tcp_unread_bytes() -> usize {
    tcp_queued(libc::FIONREAD)
}

/// `SIOCOUTQ` or `SIOCINQ` summed over this process's connected TCP sockets.
fn tcp_queued(req: libc::Ioctl) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut total = 0usize;
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let is_socket =
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        let mut ty: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: SO_TYPE writes one int through the pointer to a live c_int of `len` bytes; a
        // closed or foreign fd makes it fail, which we skip.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                (&mut ty as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r != 0 || ty != libc::SOCK_STREAM {
            continue;
        }
        // TCP only: a Unix stream socket's queue counts bytes its peer has not read (a
        // provider's wake-up pipe), which no kernel acknowledges.
        // SAFETY: an all-zero sockaddr_storage is a valid value of that plain C struct.
        let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut salen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: getsockname writes at most `salen` bytes into the live sockaddr_storage.
        let r = unsafe {
            libc::getsockname(
                fd,
                (&mut sa as *mut libc::sockaddr_storage).cast(),
                &mut salen,
            )
        };
        let family = libc::c_int::from(sa.ss_family);
        if r != 0 || (family != libc::AF_INET && family != libc::AF_INET6) {
            continue;
        }
        let mut n: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (= SIOCOUTQ) and FIONREAD (= SIOCINQ) write one int through the
        // pointer to a live c_int.
        let r = unsafe { libc::ioctl(fd, req, &mut n) };
        if r != 0 || n == 0 {
            continue;
        }
        // Only a connected socket's bytes can still be acknowledged: one that is not (reset,
        // or closed by its peer and shut down) keeps its count for good.
        // SAFETY: an all-zero sockaddr_storage is a valid value of that plain C struct.
        let mut pa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut palen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: getpeername writes at most `palen` bytes into the live sockaddr_storage.
        let r = unsafe {
            libc::getpeername(
                fd,
                (&mut pa as *mut libc::sockaddr_storage).cast(),
                &mut palen,
            )
        };
        if r == 0 {
            total += usize::try_from(n).unwrap_or(0);
        }
    }
    total
}

// ------------------------------------------------------------------------------------------
// Receiver

struct RecvReq {
    bufs: Vec<RecvBuf>,
    first: u64,
    /// Taken by a message (its first data or eager message arrived).
    filled: [bool; MAX_RECVS],
    /// Data writes arrived per buffer.
    got: [usize; MAX_RECVS],
    /// Data writes (stripes) the message of each buffer comes in (0: not known yet).
    parts: [usize; MAX_RECVS],
    /// Messages without a buffer index (eager, early on the lane) placed: the first `prefix`.
    prefix: usize,
    /// Size of the message per buffer, once known.
    known: [Option<usize>; MAX_RECVS],
    /// Complete: all of the data and its size are there.
    complete: [bool; MAX_RECVS],
    sizes: [usize; MAX_RECVS],
    nfilled: usize,
    _mrs: Vec<Arc<Mr>>,
}

/// What one remote CQ data says.
#[derive(Debug, Clone, Copy)]
enum WriteEvent {
    /// One of `parts` stripes of data for buffer `slot` of request `idx`, with the message
    /// size if it came along.
    Data {
        idx: usize,
        slot: usize,
        parts: usize,
        size: Option<usize>,
        check: Option<u64>,
    },
    /// The size record of buffer `slot` of request `idx` is in the size table.
    Record { idx: usize, slot: usize, check: u64 },
}

/// The sequence number whose low [`EAGER_SEQ_BITS`] are `low`, nearest to `next` (the next
/// receive's): within `next - 2048 .. next + 2048` (from 0 while `next` is smaller).
fn eager_seq(low: u64, next: u64) -> u64 {
    let base = next.saturating_sub(1 << (EAGER_SEQ_BITS - 1));
    base + (low.wrapping_sub(base) & EAGER_SEQ_MASK)
}

fn decode_cq_data(cq4: bool, data: u64) -> Option<WriteEvent> {
    if !cq4 {
        let parts = ((data >> W8_PARTS_SHIFT) & 0x7) as usize;
        if parts > MAX_RAILS {
            return None;
        }
        return Some(WriteEvent::Data {
            idx: ((data >> W8_REQ_SHIFT) & 0x3f) as usize,
            slot: (data & 0x7) as usize,
            parts: parts.max(1),
            size: Some((data >> 32) as usize),
            check: None,
        });
    }
    let idx = (data & ((1 << IMM_SLOT_SHIFT) - 1)) as usize;
    let slot = ((data >> IMM_SLOT_SHIFT) & 0x7) as usize;
    let check = (data >> IMM_CHECK_SHIFT) & IMM_CHECK_MASK;
    match (data >> IMM_KIND_SHIFT) & 0x3 {
        IMM_SIZED => Some(WriteEvent::Data {
            idx,
            slot,
            parts: 1,
            size: Some(((data >> IMM_SIZE_SHIFT) & 0xffff) as usize),
            check: Some(check),
        }),
        IMM_DATA if (data >> IMM_SIZE_SHIFT) as usize <= MAX_RAILS => Some(WriteEvent::Data {
            idx,
            slot,
            parts: ((data >> IMM_SIZE_SHIFT) as usize).max(1),
            size: None,
            check: Some(check),
        }),
        IMM_RECORD if data >> IMM_SIZE_SHIFT == 0 => Some(WriteEvent::Record { idx, slot, check }),
        _ => None,
    }
}

/// The receiving end of an ofi connection.
pub struct RecvConn {
    /// One endpoint per rail; rail 0 also carries CTS, eager messages and size records.
    eps: Vec<Port>,
    link: Link,
    side: Side,
    ctx: Box<[Ctx]>,
    cts: Pool,
    /// Events of one poll (kept for its allocation).
    events: Vec<Event>,
    cts_free: Vec<usize>,
    cts_queue: VecDeque<(usize, usize)>,
    /// Registration cache per rail.
    caches: Vec<MrCache>,
    reqs: Slab<RecvReq>,
    order: VecDeque<RequestId>,
    next_seq: u64,
    /// Messages that came before their receive, by sequence number: tag and bytes (copied
    /// out of the endpoint's buffers, see [`Payload::release`]).
    unexpected: BTreeMap<u64, (i32, Payload)>,
    eager_consumed: u64,
    virt_addr: bool,
    /// 4-byte protocol: the size table the senders write records into, one per buffer.
    table: Option<Pool>,
    id: u64,
    /// The TCP lane, when the sender asked for one (WEFT_OFI_MIN_BYTES).
    lane: Option<LaneRx>,
    /// The data path, as a stall names it.
    data: Link,
    stall: Stall,
    /// Bounds the wait for the data of a receive whose CTS left, before POSTED is sent.
    quiet: Stall,
    /// Per CTS slot, the sequence number its receive covers up to.
    cts_seq: [u64; CTS_TX_SLOTS],
    /// The CTS of every receive before this sequence number has left (completed).
    cts_done: u64,
    /// Small receives whose CTS waits (see "Small receives" in the module docs), in posting
    /// order: request, its first sequence number, when the CTS goes if still incomplete.
    deferred: VecDeque<(RequestId, u64, Instant)>,
    /// The eager consumption the latest CTS reported.
    eager_reported: u64,
    /// CTS with buffers sent (statistics).
    cts_sent: u64,
    eof_at: Option<Instant>,
    error: Option<Error>,
}

impl std::fmt::Debug for RecvConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ofi::RecvConn({} via {})",
            self.link.peer, self.link.iface
        )
    }
}

impl RecvConn {
    fn new(eps: Vec<Port>, link: Link, sock: TcpStream, cq4: bool) -> Result<RecvConn> {
        let e = |m: String| ofi_err(&link, "fi_mr_reg", Stage::Accept, m);
        let ep = &eps[0];
        let cts = Pool::messages(ep, CTS_TX_SLOTS, CTS_BUF, ep.peer_key()).map_err(e)?;
        let table = if cq4 {
            Some(Pool::new(ep, MAX_RECV_REQUESTS * MAX_RECVS, REC).map_err(e)?)
        } else {
            None
        };
        let key = ep.key();
        let mut ctx = ctx_array(CTS_TX_SLOTS);
        for (i, c) in ctx.iter_mut().enumerate() {
            c.owner = key;
            c.id = (C_CTS_TX << 32) | i as u64;
        }
        let virt_addr = ep.dom.info.mr_mode & (sys::FI_MR_VIRT_ADDR | sys::FI_MR_BASIC) != 0;
        let caches = eps.iter().map(|_| MrCache::default()).collect();
        let data = link.clone();
        let r = RecvConn {
            eps,
            link,
            side: Side::new(sock),
            ctx,
            cts,
            events: Vec::new(),
            cts_free: (0..CTS_TX_SLOTS).rev().collect(),
            cts_queue: VecDeque::new(),
            caches,
            reqs: Slab::new(MAX_RECV_REQUESTS),
            order: VecDeque::new(),
            next_seq: 0,
            unexpected: BTreeMap::new(),
            eager_consumed: 0,
            virt_addr,
            table,
            id: key,
            lane: None,
            data,
            stall: Stall::new(),
            quiet: Stall::new(),
            cts_seq: [0; CTS_TX_SLOTS],
            cts_done: 0,
            deferred: VecDeque::new(),
            eager_reported: 0,
            cts_sent: 0,
            eof_at: None,
            error: None,
        };
        Ok(r)
    }

    /// Remote management address and "interface (ofi provider/domain)".
    pub fn peer(&self) -> (SocketAddr, &str) {
        (self.link.peer, &self.link.iface)
    }

    /// Registration cache statistics: (hits, misses).
    pub fn mr_stats(&self) -> (u64, u64) {
        stats(&self.caches)
    }

    /// Rails (endpoints) of the connection.
    pub fn rails(&self) -> usize {
        self.eps.len()
    }

    /// Bytes of remote CQ data the connection uses (4 or 8).
    pub fn cq_data_bytes(&self) -> usize {
        if self.table.is_some() { 4 } else { 8 }
    }

    /// Connections of this process on the connection's rail-0 endpoint, itself included (1:
    /// an endpoint of its own, as with 4-byte remote CQ data).
    pub fn endpoint_users(&self) -> usize {
        self.eps[0].users()
    }

    /// Registers `len` bytes at `ptr` for this connection (NCCL's regMr).
    pub fn reg_mr(&mut self, ptr: *const u8, len: usize) -> Result<Registration> {
        register(&mut self.caches, &self.eps, self.id, ptr as usize, len)
            .map_err(|m| self.fi("fi_mr_reg", m))
    }

    /// Releases a registration of [`RecvConn::reg_mr`]; see [`SendConn::dereg_mr`].
    pub fn dereg_mr(&mut self, reg: Registration) {
        if reg.owner == self.id {
            for c in &mut self.caches {
                c.invalidate(reg.ptr, reg.len);
            }
        }
    }

    /// Where senders write size records (address, or offset without FI_MR_VIRT_ADDR; key).
    fn table_remote(&self) -> Option<(u64, u64)> {
        self.table.as_ref().map(|t| {
            let addr = if self.virt_addr {
                t.buf.as_ptr() as u64
            } else {
                (t.buf.as_ptr() as usize - t.mr.base) as u64
            };
            (addr, t.mr.key())
        })
    }

    fn fi(&self, op: &'static str, m: String) -> Error {
        ofi_err(&self.link, op, Stage::Data, m)
    }

    fn fail(&mut self, e: Error) -> Error {
        if self.error.is_none() {
            self.side.send_abort(&e);
        }
        self.error.get_or_insert(e).clone()
    }

    /// Sends the queued CTS, in order.
    fn flush_cts(&mut self) -> Result<()> {
        // Nothing new to a peer whose process has ended: with `shm` in one process its memory
        // region is gone with its endpoint.
        while let Some(&(slot, len)) = self.cts_queue.front().filter(|_| !self.side.eof) {
            let p = self.cts.ptr(slot);
            let desc = self.cts.mr.desc();
            let c: *mut Ctx = &mut self.ctx[slot];
            let n = self.cts.wire(len);
            // SAFETY: CTS slot and context are reserved for this send until its completion
            // returns the slot to `cts_free`.
            let ok = unsafe { self.eps[0].send(p, n, desc, c.cast()) }
                .map_err(|m| self.fi("fi_send", m))?;
            if !ok {
                break;
            }
            self.cts_queue.pop_front();
        }
        Ok(())
    }

    /// Lands the messages that came without a buffer index (eager, or early on the TCP lane;
    /// kept in `unexpected`) in their receives. Such messages are a prefix of their receive
    /// (see the module docs), so each is placed only after the one before it, whichever way
    /// they came: then both sides choose the same buffers.
    fn drain(&mut self) -> Result<()> {
        let peer = self.link.peer;
        for &id in &self.order {
            let Some(r) = self.reqs.get_mut(id) else {
                continue;
            };
            while r.prefix < r.bufs.len() {
                let seq = r.first + r.prefix as u64;
                let Some((tag, payload)) = self.unexpected.remove(&seq) else {
                    break;
                };
                let payload = payload.bytes();
                let tags: Vec<i32> = r.bufs.iter().map(|b| b.tag).collect();
                let slot = proto::select_slot(&tags, &r.filled[..r.bufs.len()], tag)
                    .ok_or(Error::TagMismatch { peer, tag })?;
                let b = r.bufs[slot];
                if payload.len() > b.len {
                    return Err(Error::Truncated {
                        peer,
                        sent: payload.len() as u64,
                        posted: b.len,
                        tag,
                    });
                }
                if !payload.is_empty() {
                    // SAFETY: the caller of irecv guarantees the buffer is writable for `b.len`
                    // bytes, and payload.len() <= b.len.
                    unsafe {
                        std::ptr::copy_nonoverlapping(payload.as_ptr(), b.ptr, payload.len())
                    };
                }
                r.filled[slot] = true;
                r.complete[slot] = true;
                r.sizes[slot] = payload.len();
                r.nfilled += 1;
                r.prefix += 1;
                self.eager_consumed += 1;
            }
        }
        Ok(())
    }

    /// Lands a TCP lane message whose buffer the sender knew (from the CTS).
    fn on_lane_slotted(&mut self, m: LaneMsg, slot: usize) -> Result<()> {
        let link = &self.link;
        let bad = || {
            link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "TCP lane message for no pending buffer",
                    expected: "a message for a posted receive buffer",
                },
            )
        };
        let r = self
            .order
            .iter()
            .find(|id| {
                self.reqs
                    .get(**id)
                    .is_some_and(|r| m.seq >= r.first && m.seq < r.first + r.bufs.len() as u64)
            })
            .copied()
            .and_then(|id| self.reqs.get_mut(id))
            .filter(|r| slot < r.bufs.len() && !r.filled[slot] && r.bufs[slot].tag == m.tag)
            .ok_or_else(bad)?;
        let b = r.bufs[slot];
        if m.payload.len() > b.len {
            return Err(bad());
        }
        if !m.payload.is_empty() {
            // SAFETY: the caller of irecv guarantees the buffer is writable for `b.len` bytes,
            // and the payload is no longer.
            unsafe { std::ptr::copy_nonoverlapping(m.payload.as_ptr(), b.ptr, m.payload.len()) };
        }
        r.filled[slot] = true;
        r.complete[slot] = true;
        r.sizes[slot] = m.payload.len();
        r.nfilled += 1;
        Ok(())
    }

    /// Reads the TCP lane (if any) and lands what came.
    fn poll_lane(&mut self) -> Result<()> {
        let Some(l) = &mut self.lane else {
            return Ok(());
        };
        let mut msgs = Vec::new();
        l.poll(&self.link, &mut msgs)?;
        for m in msgs {
            match m.slot {
                Some(slot) => self.on_lane_slotted(m, slot)?,
                None => {
                    self.unexpected
                        .insert(m.seq, (m.tag, Payload::Copied(m.payload)));
                }
            }
        }
        self.drain()
    }

    fn on_eager(&mut self, b: &[u8]) -> Result<()> {
        if b.len() < HDR {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "short message",
                    expected: "EAGER",
                },
            ));
        }
        let (kind, tag, seq, size) = (
            get_u32(b, 0),
            get_u32(b, 4) as i32,
            get_u64(b, 8),
            get_u64(b, 16),
        );
        if kind != K_EAGER || size > EAGER_MAX as u64 || HDR + size as usize > b.len() {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "unknown message",
                    expected: "EAGER",
                },
            ));
        }
        let payload = Payload::Copied(b[HDR..HDR + size as usize].to_vec());
        self.unexpected.insert(seq, (tag, payload));
        self.drain()
    }

    /// An eager message of the 8-byte protocol: the payload alone, with its tag and the low
    /// bits of its sequence number in the CQ data. The number is the one with those bits
    /// nearest to the next receive's: a message is at most the sender's requests ahead of it
    /// and at most the posted receives' buffers behind, both far inside the window.
    ///
    /// When its receive is posted the message goes from the endpoint's buffer straight into
    /// the caller's; else it is copied out and waits.
    fn on_eager_data(&mut self, data: u64, payload: Payload) -> Result<()> {
        if self.table.is_some() || payload.bytes().len() > EAGER_MAX {
            return Err(self.link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got: "an eager message with CQ data",
                    expected: "EAGER",
                },
            ));
        }
        let tag = (data >> 32) as u32 as i32;
        let seq = eager_seq(data & EAGER_SEQ_MASK, self.next_seq);
        self.unexpected.insert(seq, (tag, payload));
        let drained = self.drain();
        if let Some((_, p)) = self.unexpected.get_mut(&seq) {
            p.release();
        }
        drained
    }

    fn on_write(&mut self, data: u64) -> Result<()> {
        let bad = |link: &Link, got: &'static str| {
            link.protocol(
                Stage::Data,
                proto::FrameError::Unexpected {
                    got,
                    expected: "a write into a posted receive buffer",
                },
            )
        };
        let cq4 = self.table.is_some();
        let Some(ev) = decode_cq_data(cq4, data) else {
            return Err(bad(&self.link, "unknown remote CQ data"));
        };
        let (idx, slot) = match ev {
            WriteEvent::Data { idx, slot, .. } | WriteEvent::Record { idx, slot, .. } => {
                (idx, slot)
            }
        };
        // A size record is in the table before its completion is delivered.
        let record = match (ev, &mut self.table) {
            (WriteEvent::Record { .. }, Some(t)) => {
                let b = t.slot((idx * MAX_RECVS + slot) % (MAX_RECV_REQUESTS * MAX_RECVS));
                Some((get_u64(b, 0), get_u64(b, 8)))
            }
            _ => None,
        };
        let r = self
            .reqs
            .at(idx)
            .filter(|r| slot < r.bufs.len() && !r.complete[slot]);
        let Some(r) = r else {
            return Err(bad(&self.link, "write completion for no pending buffer"));
        };
        // The low bits of the message's sequence number must fall in this receive.
        let in_range =
            |check: u64| (check.wrapping_sub(r.first) & IMM_CHECK_MASK) < r.bufs.len() as u64;
        match ev {
            WriteEvent::Data {
                size, check, parts, ..
            } => {
                if check.is_some_and(|c| !in_range(c))
                    || (r.parts[slot] != 0 && r.parts[slot] != parts)
                {
                    return Err(bad(&self.link, "write completion of another message"));
                }
                r.filled[slot] = true;
                r.got[slot] += 1;
                r.parts[slot] = parts;
                if size.is_some() {
                    r.known[slot] = size;
                }
            }
            WriteEvent::Record { check, .. } => {
                let (size, seq) = record.unwrap_or((u64::MAX, u64::MAX));
                let n = r.bufs.len() as u64;
                if !in_range(check)
                    || seq & IMM_CHECK_MASK != check
                    || seq < r.first
                    || seq >= r.first + n
                    || r.known[slot].is_some()
                {
                    return Err(bad(&self.link, "size record of another message"));
                }
                r.known[slot] = Some(size as usize);
            }
        }
        if let Some(size) = r.known[slot] {
            if size > r.bufs[slot].len || (r.parts[slot] != 0 && r.got[slot] > r.parts[slot]) {
                return Err(bad(&self.link, "write larger than its buffer"));
            }
            if r.parts[slot] != 0 && r.got[slot] == r.parts[slot] {
                r.complete[slot] = true;
                r.sizes[slot] = size;
                r.nfilled += 1;
            }
        }
        Ok(())
    }

    /// Reads every rail's events; whether there were any.
    fn poll_cq(&mut self) -> Result<bool> {
        poll_rails(self)
    }

    /// Whether a message the sender has started is only partly here (a stripe or the data
    /// without its size record), so the sender is polling and its rest is due.
    fn timed_work(&self) -> bool {
        self.order.iter().any(|id| {
            self.reqs
                .get(*id)
                .is_some_and(|r| (0..r.bufs.len()).any(|k| r.filled[k] && !r.complete[k]))
        })
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let mut progressed = false;
        let r = self
            .poll_cq()
            .map(|p| progressed = p)
            .and_then(|()| self.poll_lane())
            .and_then(|()| self.send_deferred(false))
            .and_then(|()| self.flush_cts());
        if let Err(e) = r {
            return Err(self.fail(e));
        }
        if let Some(e) = self.side.poll(&self.link, "sender") {
            return Err(self.fail(e));
        }
        // After reading the completion queues: what completed while nobody polled counts.
        let waiting = self.timed_work();
        if self.stall.check(progressed, waiting) {
            let e = self.data.timeout(Stage::Data, self.stall.timeout);
            return Err(self.fail(e));
        }
        // A receive whose CTS left and nothing since: the sender may not have sent yet (not
        // an error), or the CTS was lost on a cut data link while the sender waits for it.
        // Only the sender can tell: POSTED asks it (it fails if it waits for that CTS).
        let cts_done = self.cts_done;
        // The first message not here yet of the oldest such receive (messages of a grouped
        // receive arrive in order on one rail).
        let first = self.order.iter().find_map(|id| {
            self.reqs
                .get(*id)
                .filter(|r| r.first < cts_done && r.nfilled < r.bufs.len())
                .map(|r| r.first + r.nfilled as u64)
        });
        // A sender whose process answers POSTED neither from its polls nor from its `alive`
        // thread is stopped (SIGSTOP), not late.
        if progressed || first.is_none() {
            self.side.probed = None;
        } else if self.side.unanswered(answer_bound(self.quiet.timeout)) {
            let e = self.link.timeout(Stage::Data, self.quiet.timeout);
            return Err(self.fail(e));
        }
        if self.quiet.check(progressed, first.is_some()) {
            self.side.send_posted(first.unwrap_or(0), cts_done);
            // Again every quarter of the timeout while it lasts: the sender may have handed
            // the message over only just before the first one came.
            self.quiet.rearm(self.quiet.timeout / 4);
        }
        if self.side.eof && !self.order.is_empty() {
            let at = *self.eof_at.get_or_insert_with(Instant::now);
            if at.elapsed() >= EOF_GRACE {
                let e = self.link.closed(Stage::Data);
                return Err(self.fail(e));
            }
        }
        Ok(())
    }

    /// Posts a receive of up to [`MAX_RECVS`] buffers. `Ok(None)`: busy, retry later.
    ///
    /// # Safety
    /// Every buffer must be writable for its `len` bytes and untouched by anyone else until
    /// [`RecvConn::test`] reports the request done or the connection is dropped.
    pub unsafe fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<RequestId>> {
        // SAFETY: forwarded under the same contract.
        unsafe { self.irecv_mr(bufs, &[]) }
    }

    /// [`RecvConn::irecv`] where buffer `i` lies inside `regs[i]` (from [`RecvConn::reg_mr`];
    /// missing or `None`: looked up in the cache).
    ///
    /// # Safety
    /// As for [`RecvConn::irecv`].
    pub unsafe fn irecv_mr(
        &mut self,
        bufs: &[RecvBuf],
        regs: &[Option<&Registration>],
    ) -> Result<Option<RequestId>> {
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::Usage(format!(
                "irecv with {} buffers (1..={MAX_RECVS})",
                bufs.len()
            )));
        }
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        // A CTS slot for this receive and one for each whose CTS waits. Completions are read
        // only when they are short (they free slots): a read costs microseconds, and a receive
        // posted right after the previous one completed is on the ping-pong's latency.
        let full =
            |c: &Self| c.reqs.live() >= MAX_RECV_REQUESTS || c.cts_free.len() <= c.deferred.len();
        if full(self) {
            self.progress()?;
            if full(self) {
                return Ok(None);
            }
        }
        // Per buffer, its registration on every rail (buffer k, rail r at k * rails + r).
        let rails = self.eps.len();
        let mut mrs = Vec::with_capacity(bufs.len() * rails);
        for (i, b) in bufs.iter().enumerate() {
            let given = Registration::covering(
                regs.get(i).copied().flatten(),
                self.id,
                b.ptr as usize,
                b.len,
            );
            for r in 0..rails {
                let m = match given.and_then(|g| g.mrs.get(r)) {
                    Some(m) => m.clone(),
                    None => self.caches[r]
                        .get(self.eps[r].endpoint(), b.ptr as usize, b.len)
                        .map_err(|m| self.fi("fi_mr_reg", m))?,
                };
                mrs.push(m);
            }
        }
        let first = self.next_seq;
        let Some(id) = self.reqs.insert(RecvReq {
            bufs: bufs.to_vec(),
            first,
            filled: [false; MAX_RECVS],
            got: [0; MAX_RECVS],
            parts: [0; MAX_RECVS],
            prefix: 0,
            known: [None; MAX_RECVS],
            complete: [false; MAX_RECVS],
            sizes: [0; MAX_RECVS],
            nfilled: 0,
            _mrs: mrs,
        }) else {
            return Ok(None);
        };
        self.next_seq += bufs.len() as u64;
        self.order.push_back(id);
        // Messages that came before this receive.
        if let Err(e) = self.drain() {
            return Err(self.fail(e));
        }
        if bufs.iter().all(|b| b.len <= EAGER_MAX) {
            // Small: its messages come eagerly if they can; the CTS only when they do not.
            self.deferred
                .push_back((id, first, Instant::now() + CTS_DEFER));
        } else {
            // CTS leave in posting order: those still waiting go first.
            if let Err(e) = self.send_deferred(true) {
                return Err(self.fail(e));
            }
            self.send_cts(id);
            // The CTS onto the wire now; completions are read by the next test.
            if let Err(e) = self.flush_cts() {
                return Err(self.fail(e));
            }
        }
        Ok(Some(id))
    }

    /// Queues the CTS of receive `id` (a CTS slot is free: see `irecv`).
    fn send_cts(&mut self, id: RequestId) {
        let Some(slot) = self.cts_free.pop() else {
            return;
        };
        let Some(r) = self.reqs.get(id) else {
            self.cts_free.push(slot);
            return;
        };
        let (first, n) = (r.first, r.bufs.len());
        let consumed = self.eager_consumed;
        let virt = self.virt_addr;
        let rails = self.eps.len();
        let b = self.cts.slot(slot);
        put_u32(b, 0, K_CTS);
        put_u32(b, 4, n as u32);
        put_u64(b, 8, first);
        put_u64(b, 16, consumed);
        put_u32(b, 24, id.index() as u32);
        put_u32(b, 28, 0);
        let size = cts_entry(rails);
        let addr = |rb: &RecvBuf, m: &Mr| {
            if virt {
                rb.ptr as u64
            } else {
                (rb.ptr as usize - m.base) as u64
            }
        };
        for (k, (rb, ms)) in r.bufs.iter().zip(r._mrs.chunks(rails)).enumerate() {
            let at = 32 + k * size;
            put_u64(b, at, addr(rb, &ms[0]));
            put_u64(b, at + 8, ms[0].key());
            put_u64(b, at + 16, rb.len as u64);
            put_u32(b, at + 24, rb.tag as u32);
            put_u32(b, at + 28, 0);
            for (r, m) in ms.iter().enumerate().skip(1) {
                let at = at + CTS_ENTRY + (r - 1) * CTS_RAIL;
                put_u64(b, at, addr(rb, m));
                put_u64(b, at + 8, m.key());
            }
        }
        self.eager_reported = consumed;
        self.cts_sent += 1;
        self.cts_seq[slot] = first + n as u64;
        self.cts_queue.push_back((slot, 32 + size * n));
    }

    /// Small receives whose CTS waits: a complete one never sends it (all its messages came
    /// eagerly); one still incomplete at its time (or at once with `all`) sends it, in posting
    /// order. Then eager credit, when enough is unreported: a CTS of no buffers whose first
    /// sequence number says that every receive before it sent its CTS before this one or never
    /// will.
    fn send_deferred(&mut self, all: bool) -> Result<()> {
        let now = Instant::now();
        while let Some(&(id, first, at)) = self.deferred.front() {
            let complete = self
                .reqs
                .get(id)
                .is_none_or(|r| r.first != first || r.nfilled == r.bufs.len());
            if complete {
                self.deferred.pop_front();
                continue;
            }
            if !all && now < at {
                break;
            }
            self.deferred.pop_front();
            self.send_cts(id);
        }
        if self.eager_consumed - self.eager_reported >= (EAGER_SLOTS / 2) as u64
            && self.cts_free.len() > self.deferred.len()
            && let Some(slot) = self.cts_free.pop()
        {
            let upto = self.deferred.front().map_or(self.next_seq, |d| d.1);
            let consumed = self.eager_consumed;
            let b = self.cts.slot(slot);
            put_u32(b, 0, K_CTS);
            put_u32(b, 4, 0);
            put_u64(b, 8, upto);
            put_u64(b, 16, consumed);
            put_u32(b, 24, 0);
            put_u32(b, 28, 0);
            self.eager_reported = consumed;
            // Covers no receive: leaves `cts_done` (what POSTED claims) alone.
            self.cts_seq[slot] = 0;
            self.cts_queue.push_back((slot, 32));
        }
        Ok(())
    }

    /// CTS with buffers this connection has sent (small receives whose messages all came
    /// eagerly send none).
    pub fn cts_sent(&self) -> u64 {
        self.cts_sent
    }

    /// Whether request `id` is done; the sizes received once it is (the id is then released).
    pub fn test(&mut self, id: RequestId) -> Result<Option<Completed>> {
        self.progress()?;
        let r = self
            .reqs
            .get_mut(id)
            .ok_or_else(|| Error::Usage(format!("unknown receive request {id:?}")))?;
        if r.nfilled == r.bufs.len() {
            let c = Completed {
                n: r.bufs.len(),
                sizes: r.sizes,
            };
            self.reqs.remove(id);
            self.order.retain(|x| *x != id);
            return Ok(Some(c));
        }
        Ok(None)
    }
}

impl RailEvents for RecvConn {
    fn ports(&self) -> &[Port] {
        &self.eps
    }

    fn events(&mut self) -> &mut Vec<Event> {
        &mut self.events
    }

    fn on_event(&mut self, ev: Event) -> Result<()> {
        let e = match ev {
            Event::Msg(m) => return self.on_eager(&m),
            Event::MsgData(data, m) => return self.on_eager_data(data, m),
            Event::Done(e) => e,
        };
        if e.flags & sys::FI_REMOTE_CQ_DATA != 0 {
            return self.on_write(e.data);
        }
        if e.op_context.is_null() {
            return Ok(());
        }
        // SAFETY: every context this connection posts is an element of `self.ctx`.
        let id = unsafe { (*e.op_context.cast::<Ctx>()).id };
        let i = (id & 0xffff_ffff) as usize;
        if id >> 32 == C_CTS_TX {
            self.cts_done = self.cts_done.max(self.cts_seq[i % CTS_TX_SLOTS]);
            self.cts_free.push(i);
        }
        Ok(())
    }

    fn fi(&self, op: &'static str, m: String) -> Error {
        RecvConn::fi(self, op, m)
    }
}

impl Drop for RecvConn {
    fn drop(&mut self) {
        // Let queued CTS sends finish (bounded) so the endpoint closes with nothing of ours in
        // flight, then drop registrations before the endpoint.
        let deadline = Instant::now() + Duration::from_millis(200);
        while self.error.is_none()
            && self.cts_free.len() + self.cts_queue.len() < CTS_TX_SLOTS
            && Instant::now() < deadline
        {
            if self.poll_cq().is_err() {
                break;
            }
        }
        // Receives whose CTS left (or may have) and that are incomplete: their sender may be
        // writing into them. Tell it (our end of the side channel shut down: it posts no more
        // writes) and keep their memory registered, reading the queues (which lands what is
        // on its way), until it says STOPPED (none in flight), goes away, or `CLOSE_WAIT`
        // passes; without STOPPED, the registrations outlive the connection on the endpoint
        // (see `STOPPED_TAG`).
        let exposed = self
            .order
            .iter()
            .any(|id| !self.deferred.iter().any(|d| d.0 == *id));
        if exposed {
            self.side.close_notice();
            let deadline = Instant::now() + CLOSE_WAIT;
            while !self.side.stopped && !self.side.eof && Instant::now() < deadline {
                if self.poll_cq().is_err() || self.side.poll_now(&self.link, "sender").is_some() {
                    break;
                }
            }
            if !self.side.stopped {
                let mrs: Vec<Arc<Mr>> = self
                    .reqs
                    .values_mut()
                    .flat_map(|r| std::mem::take(&mut r._mrs))
                    .collect();
                self.eps[0].bury(mrs, self.stall.timeout * 2);
                if let Some(t) = &mut self.table {
                    t.leak();
                }
            }
        }
        // With a receive pending, a sender that went away mid-write may have left the provider
        // a partly received message: let it read the rest and the close (bounded) before the
        // endpoint is closed, which libfabric 1.17's tcp;ofi_rxm does not survive otherwise
        // (SIGSEGV in fi_close).
        let deadline = Instant::now() + DRAIN;
        while !self.order.is_empty() && Instant::now() < deadline {
            if self.poll_cq().is_err() {
                break;
            }
        }
        // On a shared endpoint, which stays: if the CTS sends above did not finish, leak what
        // the provider may still use.
        let idle = self.cts_free.len() + self.cts_queue.len() >= CTS_TX_SLOTS;
        if !idle && !self.eps[0].is_private() {
            std::mem::forget(std::mem::take(&mut self.ctx));
            self.cts.leak();
            if let Some(t) = &mut self.table {
                t.leak();
            }
        }
        for c in &mut self.caches {
            c.clear();
        }
    }
}

// SAFETY: the raw pointers in RecvBuf are addresses the caller vouched for in irecv, and the
// endpoint is used by one thread at a time (&mut self).
unsafe impl Send for RecvConn {}
// SAFETY: as above: a send connection only holds addresses vouched for in isend.
unsafe impl Send for SendConn {}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_payload(r: &AddrRecord) -> Vec<u8> {
        let mut v = Vec::new();
        r.encode(&mut v);
        let mut d = FrameDecoder::new();
        d.handle_bytes(&v);
        match d.poll_frame() {
            Ok(Some(Frame::Msg(h))) => h.inline.unwrap_or_default(),
            f => panic!("not a MSG frame: {f:?}"),
        }
    }

    #[test]
    fn address_records_round_trip_and_need_version_3() {
        let r = AddrRecord {
            provider: "verbs;ofi_rxm".into(),
            addr: vec![1, 2, 3, 4],
            eager_slots: 64,
            cq_data: 4,
            table: Some((0xdead_beef_0000, 42)),
            more: vec![vec![5, 6, 7], vec![8; 40]],
            min_bytes: 65536,
            lane: Some("[fd00::2]:4321".parse().unwrap()),
            ids: vec![(7, 0), (u64::MAX, 0xf_ffff), (1 << 40, 3)],
        };
        let p = record_payload(&r);
        assert_eq!(AddrRecord::decode(&p), Some(r.clone()));
        let v4 = AddrRecord {
            lane: Some("10.1.2.3:999".parse().unwrap()),
            ..r.clone()
        };
        assert_eq!(AddrRecord::decode(&record_payload(&v4)), Some(v4));
        // More rails than MAX_RAILS: refused.
        let many = AddrRecord {
            more: vec![vec![1]; MAX_RAILS],
            ids: vec![(1, 1); MAX_RAILS + 1],
            ..r.clone()
        };
        assert_eq!(AddrRecord::decode(&record_payload(&many)), None);
        // Not one id per rail: refused.
        let short = AddrRecord {
            ids: vec![(1, 1)],
            ..r.clone()
        };
        assert_eq!(AddrRecord::decode(&record_payload(&short)), None);
        let one = AddrRecord {
            more: Vec::new(),
            min_bytes: 0,
            lane: None,
            ids: vec![(9, 2)],
            ..r
        };
        let p = record_payload(&one);
        assert_eq!(AddrRecord::decode(&p), Some(one));
        // Truncated records are refused, not misread; so are versions 1 and 2 (an endpoint
        // per connection, untagged messages) and unknown ones.
        assert_eq!(AddrRecord::decode(&p[..p.len() - 1]), None);
        for v in [1, 2, 4] {
            let mut other = p.clone();
            other[4] = v;
            assert_eq!(AddrRecord::decode(&other), None, "version {v}");
        }
    }

    #[test]
    fn eager_sequence_numbers_come_back_from_their_low_bits() {
        // A message is at most the sender's requests ahead of the next receive and at most the
        // posted receives' buffers behind it.
        let ahead = MAX_SEND_REQUESTS as u64;
        let behind = (MAX_RECV_REQUESTS * MAX_RECVS) as u64;
        for next in [0u64, 1, 500, 2047, 2048, 4095, 4096, 4097, 10_000, 1 << 40] {
            for seq in next.saturating_sub(behind)..next + ahead {
                assert_eq!(eager_seq(seq & EAGER_SEQ_MASK, next), seq, "next {next}");
            }
        }
    }

    #[test]
    fn endpoint_addresses_that_are_ip_socket_addresses_name_the_data_peer() {
        let mut v4 = [0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&4242u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[10, 201, 1, 2]);
        assert_eq!(sockaddr(&v4), Some("10.201.1.2:4242".parse().unwrap()));
        let mut v6 = [0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&7u16.to_be_bytes());
        v6[23] = 1;
        assert_eq!(sockaddr(&v6), Some("[::1]:7".parse().unwrap()));
        // Unspecified, short, or not an IP address (shm names, IB addresses): none.
        v4[4..8].fill(0);
        assert_eq!(sockaddr(&v4), None);
        assert_eq!(sockaddr(&v6[..20]), None);
        assert_eq!(sockaddr(b"fi_shm://1234"), None);
    }

    #[test]
    fn the_stall_timer_counts_polled_time_without_progress_only() {
        let mut s = Stall::new();
        s.timeout = Duration::from_millis(300);
        // Nothing outstanding: never fires, however long.
        std::thread::sleep(Duration::from_millis(350));
        assert!(!s.check(false, false));
        // Outstanding, polled without progress: fires after the timeout.
        let start = Instant::now();
        while !s.check(false, true) {
            assert!(start.elapsed() < Duration::from_secs(2));
        }
        assert!(start.elapsed() >= Duration::from_millis(290));
        // Progress restarts it; a gap without polls does not count.
        assert!(!s.check(true, true));
        std::thread::sleep(Duration::from_millis(400));
        assert!(!s.check(false, true), "time nobody polled counted");
        // Rearmed: fires again after the given time.
        let start = Instant::now();
        while !s.check(false, true) {}
        s.rearm(Duration::from_millis(50));
        let again = Instant::now();
        while !s.check(false, true) {}
        assert!(
            again.elapsed() < Duration::from_millis(200),
            "{:?}",
            start.elapsed()
        );
    }

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

    #[test]
    fn four_byte_cq_data_encodes_request_buffer_kind_stripes_and_check() {
        let base = 63 | (7 << IMM_SLOT_SHIFT) | (0x15 << IMM_CHECK_SHIFT);
        let sized = base | (IMM_SIZED << IMM_KIND_SHIFT) | (0xffff << IMM_SIZE_SHIFT);
        assert!(sized <= u64::from(u32::MAX));
        match decode_cq_data(true, sized) {
            Some(WriteEvent::Data {
                idx: 63,
                slot: 7,
                parts: 1,
                size: Some(0xffff),
                check: Some(0x15),
            }) => {}
            e => panic!("{e:?}"),
        }
        match decode_cq_data(true, base | (IMM_DATA << IMM_KIND_SHIFT)) {
            Some(WriteEvent::Data {
                parts: 1,
                size: None,
                check: Some(0x15),
                ..
            }) => {}
            e => panic!("{e:?}"),
        }
        let striped = base | (IMM_DATA << IMM_KIND_SHIFT) | (3 << IMM_SIZE_SHIFT);
        match decode_cq_data(true, striped) {
            Some(WriteEvent::Data {
                parts: 3,
                size: None,
                ..
            }) => {}
            e => panic!("{e:?}"),
        }
        match decode_cq_data(true, base | (IMM_RECORD << IMM_KIND_SHIFT)) {
            Some(WriteEvent::Record {
                idx: 63,
                slot: 7,
                check: 0x15,
            }) => {}
            e => panic!("{e:?}"),
        }
        // Kind 3, too many stripes, and bits on a record are protocol errors.
        assert!(decode_cq_data(true, base | (3 << IMM_KIND_SHIFT)).is_none());
        let too_many = (MAX_RAILS as u64 + 1) << IMM_SIZE_SHIFT;
        assert!(decode_cq_data(true, base | (IMM_DATA << IMM_KIND_SHIFT) | too_many).is_none());
        let rec = base | (IMM_RECORD << IMM_KIND_SHIFT) | (1 << IMM_SIZE_SHIFT);
        assert!(decode_cq_data(true, rec).is_none());
        // The 8-byte layout: size << 32 | receiver's slot << 12 | stripes << 9 | request << 3
        // | buffer; the slot routes the completion (shared.rs) and is no part of the event.
        let slot_bits = 0xf_ffff << shared::SLOT_SHIFT;
        match decode_cq_data(false, (5 << 32) | slot_bits | (3 << W8_REQ_SHIFT) | 2) {
            Some(WriteEvent::Data {
                idx: 3,
                slot: 2,
                parts: 1,
                size: Some(5),
                check: None,
            }) => {}
            e => panic!("{e:?}"),
        }
        match decode_cq_data(
            false,
            (1 << 40) | (2 << W8_PARTS_SHIFT) | (63 << W8_REQ_SHIFT) | 7,
        ) {
            Some(WriteEvent::Data {
                idx: 63,
                slot: 7,
                parts: 2,
                size: Some(0x100),
                ..
            }) => {}
            e => panic!("{e:?}"),
        }
        assert!(decode_cq_data(false, (MAX_RAILS as u64 + 1) << W8_PARTS_SHIFT).is_none());
    }
}
