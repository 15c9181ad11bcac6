//! Frames. Every frame starts with a fixed [`FRAME_LEN`]-byte header
//! `kind u8 | flags u8 | a u16 | b u32 | c u64 | d u64` (big endian); a message frame with the
//! inline flag is followed by its payload.
//!
//! A connection has three kinds of streams: the *handshake stream* on the management network,
//! the *control stream* on the data network (first data address of the listener) and `n`
//! *data streams* on the data network.
//!
//! | kind | stream | a | b | c | d |
//! |---|---|---|---|---|---|
//! | HELLO | handshake, sender→receiver | data streams | magic | nonce | connection id |
//! | JOIN | handshake, sender→receiver | data streams | magic | nonce | connection id, then 8 bytes: link id |
//! | STREAM | control and data, sender→receiver | stream index ([`CTRL_STREAM`] for control) | magic | nonce | connection id |
//! | ACK | handshake, receiver→sender | 0, or 1 (JOINED) | magic | nonce | connection id |
//! | REJECT | handshake, receiver→sender | reason | magic | nonce | connection id |
//! | MSG | control, sender→receiver | 0 | tag | size | chunk size |
//! | CREDIT | control, receiver→sender | 0 | magic | control bytes consumed | 0 |
//! | ABORT | control and handshake, either way | reason | magic | detail (e.g. ms stalled) | 0 |
//! | CLOSE | control, either way | 1: my sending end closed, 2: my receiving end closed | magic | 0 | 0 |
//! | MOVE | control, either way | 1: request, 2: accepted, 3: refused, 4: moved | magic | link id | 0 |
//!
//! After the ACK the handshake stream carries nothing but an ABORT (at most one per side, when
//! it gives up) and, while a side waits on the other with nothing moving, questions (PROBE;
//! the ofi backend adds POSTED) and their ALIVE answers, MSG frames with tags of their own
//! (see `crate::alive`): every
//! message header, inline payload and CREDIT travels on the data network.
//! CREDIT is the control stream's flow control (the sender keeps at most [`CTRL_WINDOW`] bytes
//! unread by the receiver, so the control stream's TCP window never closes and
//! `TCP_USER_TIMEOUT` on it only fires for a dead peer or link). ABORT is sent by whichever
//! side fails first on both the control and the handshake stream, so the other side learns the
//! reason at once even when the data network is the part that died.
//!
//! JOIN is a HELLO that asks to share an existing control stream (the *link* whose id it
//! carries, running the other way between the same two addresses) instead of the control
//! stream this connection opened; JOINED accepts. Two one-way connections between the same
//! pair then share one TCP connection for their headers, inline messages and CREDITs, so that
//! a reply carries the acknowledgement of the request (see `tcp::ctrl`). CLOSE tells the peer
//! that one of the two connections sharing a link is gone while the other stays. MOVE does
//! what JOIN does for connections that are both up already (NCCL opens both directions at
//! once, so neither finds the other's link at its handshake): the sending end asks on its own
//! control stream to move onto `link`, the receiver accepts or refuses, and on acceptance the
//! sender ends its old control stream with MOVED and continues on the link.
//!
//! `flags` carries the protocol version in handshake frames and `INLINE` in message frames.

use super::handle::{MAGIC, VERSION};

/// Length of every frame header.
pub const FRAME_LEN: usize = 24;
/// Largest inline payload a decoder accepts (bounds memory against garbage).
pub const MAX_INLINE: u64 = 1 << 20;
/// Most chunks one message may be split into.
const MAX_CHUNKS: u64 = 1 << 24;

const K_HELLO: u8 = 1;
const K_STREAM: u8 = 2;
const K_ACK: u8 = 3;
const K_REJECT: u8 = 4;
const K_MSG: u8 = 5;
const K_CREDIT: u8 = 6;
const K_ABORT: u8 = 7;
const K_JOIN: u8 = 8;
const K_CLOSE: u8 = 9;
const K_MOVE: u8 = 10;
/// Bytes after the header of a JOIN frame (the link id).
const JOIN_TRAILER: usize = 8;
/// `a` of an ACK that accepts a JOIN.
const ACK_JOINED: u16 = 1;

/// Stream index that marks the control stream (on the data network) in a STREAM frame.
pub const CTRL_STREAM: u16 = u16::MAX;

/// Most control-stream bytes a sender keeps written but not yet consumed by the receiver
/// (well under the smallest receive window Linux offers before the reader runs).
pub const CTRL_WINDOW: u64 = 32 * 1024;
const F_INLINE: u8 = 1;

/// Why a receiver refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The hello's nonce is not this listener's: the handle is stale or meant for someone else.
    WrongNonce,
    /// The sender asked for more streams than allowed.
    TooManyStreams,
    /// The receiver timed out waiting for the sender's data streams.
    StreamsTimedOut,
    /// A code this build does not know.
    Other(u16),
}

impl RejectReason {
    fn code(self) -> u16 {
        match self {
            RejectReason::WrongNonce => 1,
            RejectReason::TooManyStreams => 2,
            RejectReason::StreamsTimedOut => 3,
            RejectReason::Other(c) => c,
        }
    }
    fn from_code(c: u16) -> RejectReason {
        match c {
            1 => RejectReason::WrongNonce,
            2 => RejectReason::TooManyStreams,
            3 => RejectReason::StreamsTimedOut,
            c => RejectReason::Other(c),
        }
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectReason::WrongNonce => f.write_str("wrong nonce (stale or foreign listen handle)"),
            RejectReason::TooManyStreams => f.write_str("too many data streams requested"),
            RejectReason::StreamsTimedOut => f.write_str("data streams did not arrive in time"),
            RejectReason::Other(c) => write!(f, "reason code {c}"),
        }
    }
}

/// Why one side gave up on a connection (carried by ABORT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    /// A data stream moved no byte for the timeout while bytes were expected (detail: ms).
    Stalled,
    /// A data stream failed (closed, reset, unreachable).
    StreamFailed,
    /// The other side broke the protocol.
    Protocol,
    /// The control stream itself failed or timed out (detail: ms).
    ControlFailed,
    /// A local error.
    Local,
    /// A code this build does not know.
    Other(u16),
}

impl AbortReason {
    fn code(self) -> u16 {
        match self {
            AbortReason::Stalled => 1,
            AbortReason::StreamFailed => 2,
            AbortReason::Protocol => 3,
            AbortReason::ControlFailed => 4,
            AbortReason::Local => 5,
            AbortReason::Other(c) => c,
        }
    }
    fn from_code(c: u16) -> AbortReason {
        match c {
            1 => AbortReason::Stalled,
            2 => AbortReason::StreamFailed,
            3 => AbortReason::Protocol,
            4 => AbortReason::ControlFailed,
            5 => AbortReason::Local,
            c => AbortReason::Other(c),
        }
    }

    /// A sentence for logs, with the frame's detail.
    pub fn describe(self, detail: u64) -> String {
        match self {
            AbortReason::Stalled => format!(
                "it received no byte on a data stream for {detail} ms while a message was due (data link down, or this side stalled)"
            ),
            AbortReason::StreamFailed => {
                "one of its streams failed (closed, reset or timed out)".into()
            }
            AbortReason::Protocol => "this side broke the protocol".into(),
            AbortReason::ControlFailed => "its control stream failed".into(),
            AbortReason::Local => "a local error on its side".into(),
            AbortReason::Other(c) => format!("reason code {c}"),
        }
    }
}

/// Header of one message on the control stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsgHeader {
    /// Tag given by the sender.
    pub tag: i32,
    /// Payload bytes.
    pub size: u64,
    /// Chunk size for a message spread over the data streams (0 when inline or empty).
    pub chunk: u64,
    /// Payload carried inline on the control stream.
    pub inline: Option<Vec<u8>>,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// First frame on the handshake stream (management network).
    Hello {
        /// Listener nonce from the handle.
        nonce: u64,
        /// Sender-chosen connection id.
        conn_id: u64,
        /// Data streams that will follow.
        nstreams: u16,
    },
    /// A HELLO that asks to share control stream `link` (see the module docs).
    Join {
        /// Listener nonce from the handle.
        nonce: u64,
        /// Sender-chosen connection id.
        conn_id: u64,
        /// Data streams that will follow.
        nstreams: u16,
        /// Id of the link to share (the connection id of the connection that opened it).
        link: u64,
    },
    /// First frame on the control stream or a data stream.
    Stream {
        /// Listener nonce from the handle.
        nonce: u64,
        /// Connection the stream belongs to.
        conn_id: u64,
        /// Index of this data stream in the connection, or [`CTRL_STREAM`].
        idx: u16,
    },
    /// The receiver has every stream: the connection is up.
    Ack {
        /// Echoed nonce.
        nonce: u64,
        /// Echoed connection id.
        conn_id: u64,
    },
    /// The receiver has every stream and accepted the JOIN: the connection is up, and its
    /// control stream is the shared link.
    Joined {
        /// Echoed nonce.
        nonce: u64,
        /// Echoed connection id.
        conn_id: u64,
    },
    /// The receiver refuses the connection.
    Reject {
        /// Echoed nonce.
        nonce: u64,
        /// Echoed connection id.
        conn_id: u64,
        /// Why.
        reason: RejectReason,
    },
    /// A message.
    Msg(MsgHeader),
    /// The receiver has consumed this many control-stream bytes in total.
    Credit {
        /// Bytes consumed since the connection was established (after the handshake).
        consumed: u64,
    },
    /// A step of moving a connection's control stream onto a shared link.
    Move {
        /// Which step.
        step: MoveStep,
        /// The link the connection moves onto.
        link: u64,
    },
    /// One of the two connections sharing a link is closed (the other stays).
    Close {
        /// Which end of the sender of this frame closed.
        end: End,
    },
    /// The sending side gives up on the connection.
    Abort {
        /// Why.
        reason: AbortReason,
        /// Reason-specific detail (milliseconds for a stall).
        detail: u64,
    },
}

/// The steps of a MOVE (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveStep {
    /// Sender to receiver: may this connection move onto the link?
    Request,
    /// Receiver to sender: yes; the receiving end is attached to the link.
    Accepted,
    /// Receiver to sender: no; stay.
    Refused,
    /// Sender to receiver, last frame of the old control stream: continue on the link.
    Moved,
}

impl MoveStep {
    fn code(self) -> u16 {
        match self {
            MoveStep::Request => 1,
            MoveStep::Accepted => 2,
            MoveStep::Refused => 3,
            MoveStep::Moved => 4,
        }
    }
}

/// One end of a connection, as seen by the side that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    /// The sending end.
    Send,
    /// The receiving end.
    Recv,
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Unknown kind byte.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// Handshake frame without the weft magic.
    #[error("bad magic {0:#010x}: peer does not speak weft")]
    Magic(u32),
    /// Handshake frame of another protocol version.
    #[error("peer speaks protocol version {found}, this build {supported}")]
    Version {
        /// Peer's version.
        found: u8,
        /// Ours.
        supported: u8,
    },
    /// Inline payload larger than any sender produces.
    #[error("inline payload of {0} bytes exceeds {MAX_INLINE}")]
    InlineTooLarge(u64),
    /// Chunk size that does not fit the message size.
    #[error("chunk size {chunk} invalid for a {size}-byte message")]
    Chunk {
        /// Message size.
        size: u64,
        /// Chunk size.
        chunk: u64,
    },
    /// A valid frame where another was expected.
    #[error("unexpected {got} frame, expected {expected}")]
    Unexpected {
        /// What came.
        got: &'static str,
        /// What the state machine waited for.
        expected: &'static str,
    },
    /// The nonce does not match.
    #[error("nonce mismatch")]
    Nonce,
}

impl Frame {
    /// Name of the frame kind, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Frame::Hello { .. } => "HELLO",
            Frame::Join { .. } => "JOIN",
            Frame::Joined { .. } => "ACK (JOINED)",
            Frame::Close { .. } => "CLOSE",
            Frame::Move { .. } => "MOVE",
            Frame::Stream { .. } => "STREAM",
            Frame::Ack { .. } => "ACK",
            Frame::Reject { .. } => "REJECT",
            Frame::Msg(_) => "MSG",
            Frame::Credit { .. } => "CREDIT",
            Frame::Abort { .. } => "ABORT",
        }
    }

    /// Appends the encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let magic = u32::from_be_bytes(MAGIC);
        let (kind, flags, a, b, c, d) = match self {
            Frame::Hello {
                nonce,
                conn_id,
                nstreams,
            } => (K_HELLO, VERSION, *nstreams, magic, *nonce, *conn_id),
            Frame::Join {
                nonce,
                conn_id,
                nstreams,
                ..
            } => (K_JOIN, VERSION, *nstreams, magic, *nonce, *conn_id),
            Frame::Joined { nonce, conn_id } => {
                (K_ACK, VERSION, ACK_JOINED, magic, *nonce, *conn_id)
            }
            Frame::Move { step, link } => (K_MOVE, VERSION, step.code(), magic, *link, 0),
            Frame::Close { end } => {
                let a = match end {
                    End::Send => 1,
                    End::Recv => 2,
                };
                (K_CLOSE, VERSION, a, magic, 0, 0)
            }
            Frame::Stream {
                nonce,
                conn_id,
                idx,
            } => (K_STREAM, VERSION, *idx, magic, *nonce, *conn_id),
            Frame::Ack { nonce, conn_id } => (K_ACK, VERSION, 0, magic, *nonce, *conn_id),
            Frame::Reject {
                nonce,
                conn_id,
                reason,
            } => (K_REJECT, VERSION, reason.code(), magic, *nonce, *conn_id),
            Frame::Msg(h) => {
                let flags = if h.inline.is_some() { F_INLINE } else { 0 };
                (K_MSG, flags, 0, h.tag as u32, h.size, h.chunk)
            }
            Frame::Credit { consumed } => (K_CREDIT, VERSION, 0, magic, *consumed, 0),
            Frame::Abort { reason, detail } => (K_ABORT, VERSION, reason.code(), magic, *detail, 0),
        };
        out.push(kind);
        out.push(flags);
        out.extend_from_slice(&a.to_be_bytes());
        out.extend_from_slice(&b.to_be_bytes());
        out.extend_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&d.to_be_bytes());
        if let Frame::Msg(MsgHeader {
            inline: Some(p), ..
        }) = self
        {
            out.extend_from_slice(p);
        }
        if let Frame::Join { link, .. } = self {
            out.extend_from_slice(&link.to_be_bytes());
        }
    }

    /// Encodes a message header whose inline payload is `payload` (no allocation of a header).
    pub fn encode_msg(out: &mut Vec<u8>, tag: i32, payload: Option<&[u8]>, size: u64, chunk: u64) {
        out.push(K_MSG);
        out.push(if payload.is_some() { F_INLINE } else { 0 });
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&(tag as u32).to_be_bytes());
        out.extend_from_slice(&size.to_be_bytes());
        out.extend_from_slice(&chunk.to_be_bytes());
        if let Some(p) = payload {
            out.extend_from_slice(p);
        }
    }
}

/// Accumulates bytes and yields frames. Never panics, whatever the input; allocates at most
/// [`MAX_INLINE`] bytes per frame.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    pos: usize,
}

impl FrameDecoder {
    /// A decoder with nothing buffered.
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Feeds bytes read from the stream.
    pub fn handle_bytes(&mut self, bytes: &[u8]) {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 64 * 1024 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// How many more bytes the next frame needs at least (for reads that must not over-read).
    pub fn wanted(&self) -> usize {
        let have = self.buffered();
        if have < FRAME_LEN {
            return FRAME_LEN - have;
        }
        let h = &self.buf[self.pos..];
        if h[0] == K_JOIN {
            return (FRAME_LEN + JOIN_TRAILER).saturating_sub(have);
        }
        if h[0] == K_MSG && h[1] & F_INLINE != 0 {
            let size = u64::from_be_bytes(h[8..16].try_into().unwrap_or([0; 8]));
            if size <= MAX_INLINE {
                let need = FRAME_LEN + size as usize;
                return need.saturating_sub(have);
            }
        }
        0
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn poll_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let avail = &self.buf[self.pos..];
        if avail.len() < FRAME_LEN {
            return Ok(None);
        }
        let mut h = [0u8; FRAME_LEN];
        h.copy_from_slice(&avail[..FRAME_LEN]);
        let kind = h[0];
        let flags = h[1];
        let a = u16::from_be_bytes([h[2], h[3]]);
        let b = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let mut c8 = [0u8; 8];
        c8.copy_from_slice(&h[8..16]);
        let c = u64::from_be_bytes(c8);
        c8.copy_from_slice(&h[16..24]);
        let d = u64::from_be_bytes(c8);
        let check_hs = || -> Result<(), FrameError> {
            if b != u32::from_be_bytes(MAGIC) {
                return Err(FrameError::Magic(b));
            }
            if flags != VERSION {
                return Err(FrameError::Version {
                    found: flags,
                    supported: VERSION,
                });
            }
            Ok(())
        };
        let frame = match kind {
            K_HELLO => {
                check_hs()?;
                Frame::Hello {
                    nonce: c,
                    conn_id: d,
                    nstreams: a,
                }
            }
            K_STREAM => {
                check_hs()?;
                Frame::Stream {
                    nonce: c,
                    conn_id: d,
                    idx: a,
                }
            }
            K_JOIN => {
                check_hs()?;
                if avail.len() < FRAME_LEN + JOIN_TRAILER {
                    return Ok(None);
                }
                let mut l = [0u8; 8];
                l.copy_from_slice(&avail[FRAME_LEN..FRAME_LEN + JOIN_TRAILER]);
                self.pos += JOIN_TRAILER;
                Frame::Join {
                    nonce: c,
                    conn_id: d,
                    nstreams: a,
                    link: u64::from_be_bytes(l),
                }
            }
            K_ACK => {
                check_hs()?;
                if a == ACK_JOINED {
                    Frame::Joined {
                        nonce: c,
                        conn_id: d,
                    }
                } else {
                    Frame::Ack {
                        nonce: c,
                        conn_id: d,
                    }
                }
            }
            K_MOVE => {
                check_hs()?;
                let step = match a {
                    1 => MoveStep::Request,
                    2 => MoveStep::Accepted,
                    3 => MoveStep::Refused,
                    4 => MoveStep::Moved,
                    _ => {
                        return Err(FrameError::Unexpected {
                            got: "MOVE of an unknown step",
                            expected: "MOVE 1 to 4",
                        });
                    }
                };
                Frame::Move { step, link: c }
            }
            K_CLOSE => {
                check_hs()?;
                let end = match a {
                    1 => End::Send,
                    2 => End::Recv,
                    _ => {
                        return Err(FrameError::Unexpected {
                            got: "CLOSE of an unknown end",
                            expected: "CLOSE 1 or 2",
                        });
                    }
                };
                Frame::Close { end }
            }
            K_REJECT => {
                check_hs()?;
                Frame::Reject {
                    nonce: c,
                    conn_id: d,
                    reason: RejectReason::from_code(a),
                }
            }
            K_CREDIT => {
                check_hs()?;
                Frame::Credit { consumed: c }
            }
            K_ABORT => {
                check_hs()?;
                Frame::Abort {
                    reason: AbortReason::from_code(a),
                    detail: c,
                }
            }
            K_MSG => {
                let (size, chunk) = (c, d);
                if flags & F_INLINE != 0 {
                    if size > MAX_INLINE {
                        return Err(FrameError::InlineTooLarge(size));
                    }
                    let n = size as usize;
                    if avail.len() < FRAME_LEN + n {
                        return Ok(None);
                    }
                    let payload = avail[FRAME_LEN..FRAME_LEN + n].to_vec();
                    self.pos += FRAME_LEN + n;
                    return Ok(Some(Frame::Msg(MsgHeader {
                        tag: b as i32,
                        size,
                        chunk: 0,
                        inline: Some(payload),
                    })));
                }
                if size > 0 && (chunk == 0 || size.div_ceil(chunk) > MAX_CHUNKS) {
                    return Err(FrameError::Chunk { size, chunk });
                }
                Frame::Msg(MsgHeader {
                    tag: b as i32,
                    size,
                    chunk,
                    inline: None,
                })
            }
            k => return Err(FrameError::Kind(k)),
        };
        self.pos += FRAME_LEN;
        Ok(Some(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all_frames() -> Vec<Frame> {
        vec![
            Frame::Hello {
                nonce: 7,
                conn_id: 9,
                nstreams: 4,
            },
            Frame::Stream {
                nonce: 7,
                conn_id: 9,
                idx: 3,
            },
            Frame::Ack {
                nonce: 7,
                conn_id: 9,
            },
            Frame::Reject {
                nonce: 7,
                conn_id: 9,
                reason: RejectReason::WrongNonce,
            },
            Frame::Msg(MsgHeader {
                tag: -5,
                size: 3,
                chunk: 0,
                inline: Some(vec![1, 2, 3]),
            }),
            Frame::Msg(MsgHeader {
                tag: 1,
                size: 1 << 30,
                chunk: 1 << 20,
                inline: None,
            }),
            Frame::Msg(MsgHeader {
                tag: 0,
                size: 0,
                chunk: 0,
                inline: Some(vec![]),
            }),
            Frame::Credit { consumed: 1 << 40 },
            Frame::Join {
                nonce: 7,
                conn_id: 10,
                nstreams: 2,
                link: 0xfeed_beef_0000_0001,
            },
            Frame::Joined {
                nonce: 7,
                conn_id: 10,
            },
            Frame::Close { end: End::Send },
            Frame::Close { end: End::Recv },
            Frame::Move {
                step: MoveStep::Request,
                link: 5,
            },
            Frame::Move {
                step: MoveStep::Accepted,
                link: 6,
            },
            Frame::Move {
                step: MoveStep::Refused,
                link: 7,
            },
            Frame::Move {
                step: MoveStep::Moved,
                link: u64::MAX,
            },
            Frame::Abort {
                reason: AbortReason::Stalled,
                detail: 2000,
            },
            Frame::Abort {
                reason: AbortReason::Other(77),
                detail: 0,
            },
        ]
    }

    #[test]
    fn round_trip_byte_by_byte() {
        let mut bytes = Vec::new();
        for f in all_frames() {
            f.encode(&mut bytes);
        }
        let mut d = FrameDecoder::new();
        let mut got = Vec::new();
        for b in bytes {
            d.handle_bytes(&[b]);
            while let Some(f) = d.poll_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, all_frames());
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn garbage_is_named() {
        let mut d = FrameDecoder::new();
        d.handle_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(d.poll_frame(), Err(FrameError::Kind(b'G')));
        let mut bytes = Vec::new();
        Frame::Hello {
            nonce: 1,
            conn_id: 2,
            nstreams: 1,
        }
        .encode(&mut bytes);
        bytes[1] = 99;
        let mut d = FrameDecoder::new();
        d.handle_bytes(&bytes);
        assert_eq!(
            d.poll_frame(),
            Err(FrameError::Version {
                found: 99,
                supported: VERSION
            })
        );
    }

    proptest! {
        #[test]
        fn decoder_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let mut d = FrameDecoder::new();
            for c in chunks {
                d.handle_bytes(&c);
                let _ = d.wanted();
                while let Ok(Some(_)) = d.poll_frame() {}
            }
        }

        #[test]
        fn decoder_never_panics_on_valid_kinds(kind in 1u8..=7, flags in 0u8..3, rest in proptest::collection::vec(any::<u8>(), 22..80)) {
            let mut bytes = vec![kind, flags];
            bytes.extend_from_slice(&rest);
            let mut d = FrameDecoder::new();
            d.handle_bytes(&bytes);
            let _ = d.wanted();
            let _ = d.poll_frame();
        }

        #[test]
        fn msg_round_trip(tag in any::<i32>(), payload in proptest::collection::vec(any::<u8>(), 0..300), split in 0usize..400) {
            let mut bytes = Vec::new();
            Frame::encode_msg(&mut bytes, tag, Some(&payload), payload.len() as u64, 0);
            let split = split.min(bytes.len());
            let mut d = FrameDecoder::new();
            d.handle_bytes(&bytes[..split]);
            let first = d.poll_frame().unwrap();
            d.handle_bytes(&bytes[split..]);
            let f = match first { Some(f) => f, None => d.poll_frame().unwrap().unwrap() };
            prop_assert_eq!(f, Frame::Msg(MsgHeader { tag, size: payload.len() as u64, chunk: 0, inline: Some(payload) }));
        }
    }
}
