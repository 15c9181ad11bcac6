//! Connection set-up as two state machines without I/O.
//!
//! Sender ([`Connector`]): opens the handshake stream (management network), the control stream
//! and `n` data streams (data network), writes HELLO on the handshake stream and STREAM on the
//! others (the control stream's index is [`CTRL_STREAM`]), then waits for ACK on the handshake
//! stream. Receiver ([`Acceptor`]): reads the first frame of every incoming socket, groups
//! sockets by connection id, and when the handshake stream, the control stream and all `n` data
//! streams are there, answers ACK and hands them out. Either side gives up after its timeout.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::frame::{CTRL_STREAM, Frame, FrameDecoder, FrameError, RejectReason};

/// What the sender's handshake ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectEvent {
    /// The receiver acknowledged: the connection is up.
    Established,
    /// The receiver acknowledged and accepted the JOIN: the connection is up, and its control
    /// stream is the offered link.
    Joined,
    /// The receiver refused.
    Rejected(RejectReason),
    /// The receiver sent something that is not an ACK.
    Protocol(FrameError),
    /// No ACK before the deadline.
    TimedOut,
}

/// Sender side of the handshake.
#[derive(Debug)]
pub struct Connector {
    nonce: u64,
    conn_id: u64,
    nstreams: u16,
    /// Link offered in a JOIN.
    join: Option<u64>,
    deadline: Instant,
    dec: FrameDecoder,
    event: Option<ConnectEvent>,
}

impl Connector {
    /// Starts a handshake at `now` that must finish within `timeout`.
    pub fn new(
        now: Instant,
        timeout: Duration,
        nonce: u64,
        conn_id: u64,
        nstreams: u16,
    ) -> Connector {
        Connector {
            nonce,
            conn_id,
            nstreams,
            join: None,
            deadline: now + timeout,
            dec: FrameDecoder::new(),
            event: None,
        }
    }

    /// The connection id this handshake announces.
    pub fn conn_id(&self) -> u64 {
        self.conn_id
    }

    /// Offers to share control stream `link` (HELLO becomes JOIN). The sender still opens its
    /// own control stream, used when the receiver answers a plain ACK.
    pub fn offer_join(&mut self, link: u64) {
        self.join = Some(link);
    }

    /// Bytes to write first on the handshake stream (management network).
    pub fn hello(&self) -> Vec<u8> {
        let mut v = Vec::new();
        let (nonce, conn_id, nstreams) = (self.nonce, self.conn_id, self.nstreams);
        match self.join {
            None => Frame::Hello {
                nonce,
                conn_id,
                nstreams,
            },
            Some(link) => Frame::Join {
                nonce,
                conn_id,
                nstreams,
                link,
            },
        }
        .encode(&mut v);
        v
    }

    /// Bytes to write first on data stream `idx`.
    pub fn stream_hello(&self, idx: u16) -> Vec<u8> {
        let mut v = Vec::new();
        Frame::Stream {
            nonce: self.nonce,
            conn_id: self.conn_id,
            idx,
        }
        .encode(&mut v);
        v
    }

    /// Bytes to write first on the control stream (data network).
    pub fn ctrl_hello(&self) -> Vec<u8> {
        self.stream_hello(CTRL_STREAM)
    }

    /// How many bytes to read from the handshake stream at most (never reads past the ACK).
    pub fn wanted(&self) -> usize {
        if self.event.is_some() {
            0
        } else {
            self.dec.wanted()
        }
    }

    /// Bytes read from the handshake stream.
    pub fn handle_ctrl_bytes(&mut self, bytes: &[u8]) {
        if self.event.is_some() {
            return;
        }
        self.dec.handle_bytes(bytes);
        self.event = match self.dec.poll_frame() {
            Ok(None) => None,
            Ok(Some(Frame::Ack { nonce, conn_id }))
                if nonce == self.nonce && conn_id == self.conn_id =>
            {
                Some(ConnectEvent::Established)
            }
            Ok(Some(Frame::Joined { nonce, conn_id }))
                if nonce == self.nonce && conn_id == self.conn_id && self.join.is_some() =>
            {
                Some(ConnectEvent::Joined)
            }
            Ok(Some(Frame::Ack { .. } | Frame::Joined { .. })) => {
                Some(ConnectEvent::Protocol(FrameError::Nonce))
            }
            Ok(Some(Frame::Reject { reason, .. })) => Some(ConnectEvent::Rejected(reason)),
            Ok(Some(f)) => Some(ConnectEvent::Protocol(FrameError::Unexpected {
                got: f.name(),
                expected: "ACK",
            })),
            Err(e) => Some(ConnectEvent::Protocol(e)),
        };
    }

    /// Time passes.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.event.is_none() && now >= self.deadline {
            self.event = Some(ConnectEvent::TimedOut);
        }
    }

    /// The outcome, once there is one.
    pub fn poll_event(&mut self) -> Option<ConnectEvent> {
        self.event.clone()
    }
}

/// What the receiver's handshake produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcceptEvent<K> {
    /// A complete connection: write `ack` on `ctrl`, then use the streams (in index order).
    Ready {
        /// Sender's connection id.
        conn_id: u64,
        /// Handshake socket (management network; afterwards only the ABORT side channel).
        ctrl: K,
        /// Control socket (data network: message headers, inline payloads, CREDIT, ABORT).
        dctrl: K,
        /// Data sockets, index order.
        streams: Vec<K>,
        /// Bytes to write on `ctrl`.
        ack: Vec<u8>,
        /// The link the sender offered to share (JOIN): the receiver may answer JOINED
        /// ([`Frame::Joined`]) instead of `ack` and use that link as the control stream.
        join: Option<u64>,
    },
    /// A socket to close; `reply` (if any) should be written to it first, best effort.
    /// `error` says why, for the log and for the caller.
    Refused {
        /// The socket.
        key: K,
        /// Bytes to send before closing.
        reply: Option<Vec<u8>>,
        /// Why.
        error: AcceptError,
    },
}

/// Why the receiver refused a socket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcceptError {
    /// Garbage or a wrong frame.
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// A hello with another listener's nonce.
    #[error("hello carries a foreign nonce (stale or foreign listen handle)")]
    WrongNonce,
    /// Too many streams, duplicate or out-of-range stream index.
    #[error("bad stream layout: {0}")]
    Streams(String),
    /// The socket closed before its first frame was complete.
    #[error("peer closed the socket before its first frame")]
    Closed,
    /// No first frame, or not all streams, before the deadline.
    #[error("handshake incomplete after the timeout: {0}")]
    TimedOut(&'static str),
}

#[derive(Debug)]
struct Incoming<K> {
    key: K,
    since: Instant,
    dec: FrameDecoder,
}

#[derive(Debug)]
struct Pending<K> {
    conn_id: u64,
    since: Instant,
    ctrl: Option<K>,
    dctrl: Option<K>,
    nstreams: Option<u16>,
    join: Option<u64>,
    streams: Vec<Option<K>>,
}

/// Receiver side of the handshake, generic over the socket key `K`.
#[derive(Debug)]
pub struct Acceptor<K> {
    nonce: u64,
    max_streams: u16,
    timeout: Duration,
    incoming: Vec<Incoming<K>>,
    pending: Vec<Pending<K>>,
    events: VecDeque<AcceptEvent<K>>,
}

impl<K: Copy + Eq> Acceptor<K> {
    /// A receiver for a listener with `nonce`.
    pub fn new(nonce: u64, max_streams: u16, timeout: Duration) -> Acceptor<K> {
        Acceptor {
            nonce,
            max_streams,
            timeout,
            incoming: Vec::new(),
            pending: Vec::new(),
            events: VecDeque::new(),
        }
    }

    /// A socket was accepted.
    pub fn handle_new(&mut self, now: Instant, key: K) {
        self.incoming.push(Incoming {
            key,
            since: now,
            dec: FrameDecoder::new(),
        });
    }

    /// Bytes to read from `key` at most, so that nothing past the first frame is consumed.
    pub fn wanted(&self, key: K) -> usize {
        self.incoming
            .iter()
            .find(|i| i.key == key)
            .map_or(0, |i| i.dec.wanted())
    }

    /// Sockets still waiting for their first frame.
    pub fn waiting(&self) -> impl Iterator<Item = K> + '_ {
        self.incoming.iter().map(|i| i.key)
    }

    /// Whether some connection is part-way through its handshake.
    pub fn busy(&self) -> bool {
        !self.incoming.is_empty() || !self.pending.is_empty()
    }

    fn refuse(&mut self, key: K, reply: Option<Vec<u8>>, error: AcceptError) {
        self.events
            .push_back(AcceptEvent::Refused { key, reply, error });
    }

    /// `key` reached end of stream or failed before its first frame.
    pub fn handle_closed(&mut self, key: K) {
        if let Some(pos) = self.incoming.iter().position(|i| i.key == key) {
            self.incoming.swap_remove(pos);
            self.refuse(key, None, AcceptError::Closed);
        }
    }

    /// Bytes read from `key`.
    pub fn handle_bytes(&mut self, now: Instant, key: K, bytes: &[u8]) {
        let Some(pos) = self.incoming.iter().position(|i| i.key == key) else {
            return;
        };
        self.incoming[pos].dec.handle_bytes(bytes);
        let frame = match self.incoming[pos].dec.poll_frame() {
            Ok(None) => return,
            Ok(Some(f)) => f,
            Err(e) => {
                self.incoming.swap_remove(pos);
                return self.refuse(key, None, e.into());
            }
        };
        self.incoming.swap_remove(pos);
        let (nonce, conn_id) = match &frame {
            Frame::Hello { nonce, conn_id, .. }
            | Frame::Join { nonce, conn_id, .. }
            | Frame::Stream { nonce, conn_id, .. } => (*nonce, *conn_id),
            f => {
                let e = FrameError::Unexpected {
                    got: f.name(),
                    expected: "HELLO or STREAM",
                };
                return self.refuse(key, None, e.into());
            }
        };
        if nonce != self.nonce {
            let mut reply = Vec::new();
            Frame::Reject {
                nonce,
                conn_id,
                reason: RejectReason::WrongNonce,
            }
            .encode(&mut reply);
            return self.refuse(key, Some(reply), AcceptError::WrongNonce);
        }
        let p = match self.pending.iter().position(|p| p.conn_id == conn_id) {
            Some(p) => p,
            None => {
                self.pending.push(Pending {
                    conn_id,
                    since: now,
                    ctrl: None,
                    dctrl: None,
                    nstreams: None,
                    join: None,
                    streams: Vec::new(),
                });
                self.pending.len() - 1
            }
        };
        let (frame, join) = match frame {
            Frame::Join {
                nonce,
                conn_id,
                nstreams,
                link,
            } => (
                Frame::Hello {
                    nonce,
                    conn_id,
                    nstreams,
                },
                Some(link),
            ),
            f => (f, None),
        };
        match frame {
            Frame::Hello { nstreams, .. } => {
                if self.pending[p].ctrl.is_some() || nstreams == 0 || nstreams > self.max_streams {
                    let mut reply = Vec::new();
                    Frame::Reject {
                        nonce,
                        conn_id,
                        reason: RejectReason::TooManyStreams,
                    }
                    .encode(&mut reply);
                    let why = format!(
                        "{nstreams} streams (allowed 1..={}) or duplicate hello",
                        self.max_streams
                    );
                    return self.refuse(key, Some(reply), AcceptError::Streams(why));
                }
                self.pending[p].ctrl = Some(key);
                self.pending[p].nstreams = Some(nstreams);
                self.pending[p].join = join;
            }
            Frame::Stream { idx, .. } if idx == CTRL_STREAM => {
                if self.pending[p].dctrl.is_some() {
                    let why = "duplicate control stream".to_string();
                    return self.refuse(key, None, AcceptError::Streams(why));
                }
                self.pending[p].dctrl = Some(key);
            }
            Frame::Stream { idx, .. } => {
                let i = usize::from(idx);
                let pend = &mut self.pending[p];
                if idx >= self.max_streams || pend.streams.get(i).is_some_and(Option::is_some) {
                    let why = format!("stream index {idx} duplicate or >= {}", self.max_streams);
                    return self.refuse(key, None, AcceptError::Streams(why));
                }
                if pend.streams.len() <= i {
                    pend.streams.resize(i + 1, None);
                }
                pend.streams[i] = Some(key);
            }
            _ => {}
        }
        self.check_complete(p);
    }

    fn check_complete(&mut self, p: usize) {
        let pend = &self.pending[p];
        let (Some(ctrl), Some(n)) = (pend.ctrl, pend.nstreams) else {
            return;
        };
        let n = usize::from(n);
        if pend.streams.len() > n {
            // A stream index beyond what the hello announced.
            let pend = self.pending.swap_remove(p);
            let why = format!("stream index beyond the {n} announced");
            for k in pend.streams.into_iter().flatten().chain(pend.dctrl) {
                self.refuse(k, None, AcceptError::Streams(why.clone()));
            }
            let mut reply = Vec::new();
            Frame::Reject {
                nonce: self.nonce,
                conn_id: pend.conn_id,
                reason: RejectReason::TooManyStreams,
            }
            .encode(&mut reply);
            return self.refuse(ctrl, Some(reply), AcceptError::Streams(why));
        }
        let Some(dctrl) = pend.dctrl else {
            return;
        };
        if pend.streams.len() < n || pend.streams.iter().any(Option::is_none) {
            return;
        }
        let pend = self.pending.swap_remove(p);
        let mut ack = Vec::new();
        Frame::Ack {
            nonce: self.nonce,
            conn_id: pend.conn_id,
        }
        .encode(&mut ack);
        let streams = pend.streams.into_iter().flatten().collect();
        self.events.push_back(AcceptEvent::Ready {
            conn_id: pend.conn_id,
            ctrl,
            dctrl,
            streams,
            ack,
            join: pend.join,
        });
    }

    /// Time passes: drops sockets and connections that ran past the timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        let t = self.timeout;
        let mut i = 0;
        while i < self.incoming.len() {
            if now.saturating_duration_since(self.incoming[i].since) >= t {
                let inc = self.incoming.swap_remove(i);
                self.refuse(
                    inc.key,
                    None,
                    AcceptError::TimedOut("no hello on an accepted socket"),
                );
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            if now.saturating_duration_since(self.pending[i].since) >= t {
                let pend = self.pending.swap_remove(i);
                let what = if pend.ctrl.is_none() {
                    "data streams but no handshake stream"
                } else if pend.dctrl.is_none() {
                    "missing control stream"
                } else {
                    "missing data streams"
                };
                for k in pend.streams.into_iter().flatten().chain(pend.dctrl) {
                    self.refuse(k, None, AcceptError::TimedOut(what));
                }
                if let Some(c) = pend.ctrl {
                    let mut reply = Vec::new();
                    Frame::Reject {
                        nonce: self.nonce,
                        conn_id: pend.conn_id,
                        reason: RejectReason::StreamsTimedOut,
                    }
                    .encode(&mut reply);
                    self.refuse(c, Some(reply), AcceptError::TimedOut(what));
                }
            } else {
                i += 1;
            }
        }
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<AcceptEvent<K>> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn both_sides_agree_in_any_arrival_order() {
        let now = t0();
        let c = Connector::new(now, Duration::from_secs(1), 42, 7, 3);
        let mut a: Acceptor<u32> = Acceptor::new(42, 8, Duration::from_secs(1));
        // Data streams first, in reverse order, then the handshake stream, then the control
        // stream, each byte by byte.
        let order = [
            (3u32, c.stream_hello(2)),
            (2, c.stream_hello(1)),
            (0, c.hello()),
            (1, c.stream_hello(0)),
            (4, c.ctrl_hello()),
        ];
        for (k, bytes) in &order {
            a.handle_new(now, *k);
            for b in bytes {
                assert!(a.poll_event().is_none());
                a.handle_bytes(now, *k, &[*b]);
            }
        }
        let Some(AcceptEvent::Ready {
            conn_id,
            ctrl,
            dctrl,
            streams,
            ack,
            join,
        }) = a.poll_event()
        else {
            panic!()
        };
        assert_eq!((conn_id, ctrl, dctrl, streams), (7, 0, 4, vec![1, 2, 3]));
        assert_eq!(join, None);
        let mut c = c;
        c.handle_ctrl_bytes(&ack);
        assert_eq!(c.poll_event(), Some(ConnectEvent::Established));
        assert!(!a.busy());
    }

    /// A JOIN reaches the receiver with its link; JOINED completes the sender's handshake as
    /// joined, a plain ACK as not joined; JOINED without an offer is a protocol error.
    #[test]
    fn join_is_offered_and_answered_either_way() {
        let now = t0();
        for accept in [true, false] {
            let mut c = Connector::new(now, Duration::from_secs(1), 42, 7, 1);
            c.offer_join(0xabc);
            let mut a: Acceptor<u32> = Acceptor::new(42, 8, Duration::from_secs(1));
            for (k, bytes) in [
                (0u32, c.hello()),
                (1, c.ctrl_hello()),
                (2, c.stream_hello(0)),
            ] {
                a.handle_new(now, k);
                for b in &bytes {
                    a.handle_bytes(now, k, std::slice::from_ref(b));
                }
            }
            let Some(AcceptEvent::Ready { join, ack, .. }) = a.poll_event() else {
                panic!()
            };
            assert_eq!(join, Some(0xabc));
            let reply = if accept {
                let mut v = Vec::new();
                Frame::Joined {
                    nonce: 42,
                    conn_id: 7,
                }
                .encode(&mut v);
                v
            } else {
                ack
            };
            c.handle_ctrl_bytes(&reply);
            let want = if accept {
                ConnectEvent::Joined
            } else {
                ConnectEvent::Established
            };
            assert_eq!(c.poll_event(), Some(want));
        }
        let mut c = Connector::new(now, Duration::from_secs(1), 42, 7, 1);
        let mut v = Vec::new();
        Frame::Joined {
            nonce: 42,
            conn_id: 7,
        }
        .encode(&mut v);
        c.handle_ctrl_bytes(&v);
        assert!(matches!(c.poll_event(), Some(ConnectEvent::Protocol(_))));
    }

    #[test]
    fn wrong_nonce_is_rejected_and_reported_to_the_sender() {
        let now = t0();
        let mut c = Connector::new(now, Duration::from_secs(1), 1, 7, 1);
        let mut a: Acceptor<u32> = Acceptor::new(2, 8, Duration::from_secs(1));
        a.handle_new(now, 0);
        a.handle_bytes(now, 0, &c.hello());
        let Some(AcceptEvent::Refused {
            key: 0,
            reply: Some(r),
            error: AcceptError::WrongNonce,
        }) = a.poll_event()
        else {
            panic!()
        };
        c.handle_ctrl_bytes(&r);
        assert_eq!(
            c.poll_event(),
            Some(ConnectEvent::Rejected(RejectReason::WrongNonce))
        );
    }

    #[test]
    fn silence_times_out_on_both_sides() {
        let now = t0();
        let mut c = Connector::new(now, Duration::from_millis(100), 1, 7, 2);
        let mut a: Acceptor<u32> = Acceptor::new(1, 8, Duration::from_millis(100));
        a.handle_new(now, 0);
        a.handle_new(now, 1);
        a.handle_bytes(now, 1, &c.hello());
        c.handle_timeout(now + Duration::from_millis(99));
        a.handle_timeout(now + Duration::from_millis(99));
        assert_eq!(c.poll_event(), None);
        assert_eq!(a.poll_event(), None);
        c.handle_timeout(now + Duration::from_millis(100));
        a.handle_timeout(now + Duration::from_millis(100));
        assert_eq!(c.poll_event(), Some(ConnectEvent::TimedOut));
        let mut keys = vec![];
        while let Some(AcceptEvent::Refused {
            key,
            error: AcceptError::TimedOut(_),
            ..
        }) = a.poll_event()
        {
            keys.push(key);
        }
        keys.sort();
        assert_eq!(keys, [0, 1]);
        assert!(!a.busy());
    }

    #[test]
    fn no_connection_without_its_control_stream() {
        let now = t0();
        let c = Connector::new(now, Duration::from_millis(100), 1, 7, 1);
        let mut a: Acceptor<u32> = Acceptor::new(1, 8, Duration::from_millis(100));
        for (k, b) in [(0u32, c.hello()), (1, c.stream_hello(0))] {
            a.handle_new(now, k);
            a.handle_bytes(now, k, &b);
        }
        assert_eq!(a.poll_event(), None, "ready without a control stream");
        // A second control stream for the same connection is refused.
        a.handle_new(now, 2);
        a.handle_bytes(now, 2, &c.ctrl_hello());
        assert!(matches!(
            a.poll_event(),
            Some(AcceptEvent::Ready { dctrl: 2, .. })
        ));
        let mut a: Acceptor<u32> = Acceptor::new(1, 8, Duration::from_millis(100));
        for (k, b) in [(0u32, c.ctrl_hello()), (1, c.ctrl_hello())] {
            a.handle_new(now, k);
            a.handle_bytes(now, k, &b);
        }
        assert!(matches!(
            a.poll_event(),
            Some(AcceptEvent::Refused {
                key: 1,
                error: AcceptError::Streams(_),
                ..
            })
        ));
        a.handle_timeout(now + Duration::from_millis(100));
        assert!(matches!(
            a.poll_event(),
            Some(AcceptEvent::Refused {
                key: 0,
                error: AcceptError::TimedOut(_),
                ..
            })
        ));
        assert!(!a.busy());
    }

    #[test]
    fn garbage_and_bad_layouts_are_refused() {
        let now = t0();
        let c = Connector::new(now, Duration::from_secs(1), 1, 7, 2);
        let mut a: Acceptor<u32> = Acceptor::new(1, 4, Duration::from_secs(1));
        a.handle_new(now, 0);
        a.handle_bytes(now, 0, &[0xff; 24]);
        assert!(matches!(
            a.poll_event(),
            Some(AcceptEvent::Refused {
                key: 0,
                error: AcceptError::Frame(_),
                ..
            })
        ));
        // A stream index past the announced count.
        a.handle_new(now, 1);
        a.handle_bytes(now, 1, &c.stream_hello(3));
        a.handle_new(now, 2);
        a.handle_bytes(now, 2, &c.hello());
        let mut n = 0;
        while let Some(e) = a.poll_event() {
            assert!(
                matches!(
                    e,
                    AcceptEvent::Refused {
                        error: AcceptError::Streams(_),
                        ..
                    }
                ),
                "{e:?}"
            );
            n += 1;
        }
        assert_eq!(n, 2);
        // Sender told garbage instead of an ACK.
        let mut c = c;
        c.handle_ctrl_bytes(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        assert!(matches!(
            c.poll_event(),
            Some(ConnectEvent::Protocol(FrameError::Kind(b'H')))
        ));
    }
}
