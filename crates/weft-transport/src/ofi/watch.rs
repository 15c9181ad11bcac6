//! What bounds the ofi data path's waits: the stall timer (time passed in), the side channel
//! (ABORT, EOF, POSTED, ALIVE, STOPPED) and the bounds they use (see "Failure detection on the
//! data path" in the module docs).

use super::*;

/// How long a sender keeps polling for a CTS its receiver says left `timeout` ago (POSTED)
/// before it calls it lost.
pub(super) fn cts_grace(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// How long a closing receive connection keeps reading its completion queues.
pub(super) const DRAIN: Duration = Duration::from_millis(20);

/// How long a receiver waits for the sender's ALIVE after POSTED before it calls the sender's
/// process stopped: far longer than the `alive` thread's period plus a round trip.
pub(super) fn answer_bound(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// How long a closing receive connection whose sender may still write waits for its STOPPED.
pub(super) const CLOSE_WAIT: Duration = Duration::from_millis(200);

/// Handed-over messages a sender remembers the time of (for POSTED).
pub(super) const HANDED_LOG: usize = 4 * MAX_SEND_REQUESTS;

/// Gaps between two polls of a connection longer than this are time the application was not
/// polling it, which the stall timer does not count.
pub(super) const POLL_GAP: Duration = Duration::from_millis(100);

/// The data-phase stall timer of a connection (see the module docs, "Failure detection").
pub(super) struct Stall {
    pub(super) timeout: Duration,
    /// When the work now outstanding last saw progress (a completion), or started.
    pub(super) since: Instant,
    /// When the connection was last polled.
    pub(super) polled: Instant,
}

impl Stall {
    pub(super) fn new(now: Instant) -> Stall {
        Stall {
            timeout: Duration::from_secs(30),
            since: now,
            polled: now,
        }
    }

    /// Called on every poll, after the completion queues were read: `progressed`, whether
    /// any completion came; `waiting`, whether timed work is outstanding. True when that work
    /// saw no progress for `timeout` of polling.
    pub(super) fn check(&mut self, now: Instant, progressed: bool, waiting: bool) -> bool {
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
    pub(super) fn rearm(&mut self, now: Instant, after: Duration) {
        self.since = now
            .checked_sub(self.timeout.saturating_sub(after))
            .unwrap_or(now);
    }
}

/// The management side channel of an established connection: ABORT and EOF, and POSTED
/// (a receiver's CTS that left long ago; see "Failure detection" in the module docs).
pub(super) struct Side {
    pub(super) sock: TcpStream,
    pub(super) dec: FrameDecoder,
    pub(super) eof: bool,
    pub(super) next_check: Instant,
    /// The messages, by (tag, k), the peer's latest POSTED says it waits for (each of a
    /// receive whose CTS left `timeout` ago), until the next POSTED.
    pub(super) cts_left: Vec<(i32, u64)>,
    /// The messages the peer's latest POSTED waits for, until looked at.
    pub(super) waits_for: Option<Vec<(i32, u64)>>,
    /// We sent ABORT (and shut our end down).
    pub(super) aborted: bool,
    /// We shut our end down as a closing receiver's notice (see [`STOPPED_TAG`]).
    pub(super) closing: bool,
    /// The peer (a sender) said STOPPED: no RMA write of it is in flight or will come.
    pub(super) stopped: bool,
    /// We (a sender) said STOPPED.
    pub(super) said_stopped: bool,
    /// Answers to the peer's question (a sender's to POSTED, a receiver's to PROBE) while
    /// the application is not polling (see `alive`). Declared after `sock`: the duplicate it
    /// watches closes after ours.
    pub(super) answering: Option<alive::Answering>,
    /// The question `answering` answers.
    question: i32,
    /// A receiver's latest POSTED that no ALIVE has answered yet: when it went.
    pub(super) probed: Option<Instant>,
    /// An ALIVE came since [`Side::take_alive`] was last called.
    alive: bool,
}

impl Side {
    pub(super) fn new(sock: TcpStream) -> Side {
        Side {
            sock,
            dec: FrameDecoder::new(),
            eof: false,
            next_check: Instant::now(),
            cts_left: Vec::new(),
            waits_for: None,
            aborted: false,
            closing: false,
            stopped: false,
            said_stopped: false,
            answering: None,
            question: 0,
            probed: None,
            alive: false,
        }
    }

    /// The side channel answers the peer's `question` (a sender's: POSTED; a receiver's:
    /// PROBE) with ALIVE, by the application's polls or, while it does not poll, by the
    /// process's `alive` thread.
    pub(super) fn answering(mut self, question: i32) -> Side {
        self.answering = alive::Answering::new(&self.sock, question);
        self.question = question;
        self
    }

    /// Whether an ALIVE came since the last call.
    pub(super) fn take_alive(&mut self) -> bool {
        std::mem::take(&mut self.alive)
    }

    /// A sender's PROBE (see [`PROBE_TAG`]), best effort: a few bytes on a socket that
    /// carries nothing else (the next one follows a quarter of the timeout later).
    pub(super) fn send_probe(&mut self) {
        if self.aborted {
            return;
        }
        let mut b = Vec::new();
        Frame::encode_msg(&mut b, PROBE_TAG, Some(&[]), 0, 0);
        let _ = (&self.sock).write(&b);
    }

    /// A closing receiver's notice to its sender: our end of the side channel shut down (the
    /// sender reads EOF, posts no more writes and answers STOPPED once none is in flight).
    pub(super) fn close_notice(&mut self) {
        if !self.aborted && !self.closing {
            let _ = self.sock.shutdown(std::net::Shutdown::Write);
            self.closing = true;
        }
    }

    /// A sender's STOPPED (see [`STOPPED_TAG`]), once.
    pub(super) fn send_stopped(&mut self) {
        if self.aborted || self.said_stopped {
            return;
        }
        let mut b = Vec::new();
        Frame::encode_msg(&mut b, STOPPED_TAG, Some(&[]), 0, 0);
        let _ = (&self.sock).write(&b);
        self.said_stopped = true;
    }

    /// Reads the side channel now, whenever it was last read.
    pub(super) fn poll_now(&mut self, link: &Link, who: &str) -> Option<Error> {
        self.next_check = Instant::now();
        self.poll(link, who)
    }

    /// Tells the sender that we wait for messages `named` (by tag and k), each of a receive
    /// whose CTS left, and have seen nothing for `timeout`.
    pub(super) fn send_posted(&mut self, named: &[(i32, u64)]) {
        if self.aborted {
            return;
        }
        let mut p = vec![0u8; POSTED_ENTRY * named.len()];
        for (i, (tag, k)) in named.iter().enumerate() {
            let at = i * POSTED_ENTRY;
            put_u32(&mut p, at, *tag as u32);
            put_u64(&mut p, at + 4, *k);
        }
        let mut b = Vec::new();
        Frame::encode_msg(&mut b, POSTED_TAG, Some(&p), p.len() as u64, 0);
        // A few bytes on a socket that carries nothing else: they fit (or the next stall
        // sends them again).
        let _ = (&self.sock).write(&b);
        self.probed.get_or_insert_with(Instant::now);
    }

    /// At most every millisecond: the peer's ABORT as an error.
    pub(super) fn poll(&mut self, link: &Link, who: &str) -> Option<Error> {
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
                Ok(Some(Frame::Msg(h))) if h.tag == alive::ALIVE_TAG => {
                    self.probed = None;
                    self.alive = true;
                }
                Ok(Some(Frame::Msg(h))) if h.tag == PROBE_TAG => {
                    if self.answering.is_some() && self.question == PROBE_TAG && !self.aborted {
                        let _ = (&self.sock).write(&alive::frame());
                    }
                }
                Ok(Some(Frame::Msg(h))) if h.tag == POSTED_TAG => {
                    if self.answering.is_some() && self.question == POSTED_TAG && !self.aborted {
                        let _ = (&self.sock).write(&alive::frame());
                    }
                    if let Some(p) = h.inline.as_deref() {
                        let named: Vec<(i32, u64)> = p
                            .chunks_exact(POSTED_ENTRY)
                            .take(POSTED_MAX)
                            .map(|e| (get_u32(e, 0) as i32, get_u64(e, 4)))
                            .collect();
                        self.cts_left = named.clone();
                        self.waits_for = Some(named);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(e) => return Some(link.protocol(Stage::Data, e)),
            }
        }
    }

    pub(super) fn send_abort(&mut self, e: &Error) {
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

/// How long a side whose peer's process ended (side channel EOF), with work still waiting on
/// the peer, keeps reading completions without one arriving before it calls the connection
/// closed: what the peer sent before dying still lands, and while it does (a completion at
/// least every `EOF_QUIET` of polling) the wait goes on. Time nobody polled does not count
/// (see [`Stall`]). A fixed 500 ms from the EOF before made a killed rank of a ring an error
/// for its neighbour after 0.6 s and, through that neighbour's close, for the rank after it
/// only after 1.1 s.
pub(super) const EOF_QUIET: Duration = Duration::from_millis(200);

/// The [`Stall`] that bounds the wait after a peer's EOF (see [`EOF_QUIET`]).
pub(super) fn eof_wait(now: Instant) -> Stall {
    let mut s = Stall::new(now);
    s.timeout = EOF_QUIET;
    s
}

/// What a sender's poll saw, for its [`SendWatch`].
#[derive(Debug, Default)]
pub(super) struct SendSeen {
    /// A completion came.
    pub(super) progressed: bool,
    /// Timed work is outstanding (see `SendConn::timed_work`).
    pub(super) timed: bool,
    /// A send waits for a CTS that the receiver says left `timeout` ago.
    pub(super) cts_left: bool,
    /// Of the messages the receiver's latest POSTED waits for, those we have handed over.
    pub(super) posted_sent: Vec<(i32, u64)>,
    /// An ALIVE came.
    pub(super) alive: bool,
    /// A send is not done.
    pub(super) pending: bool,
    /// The receiver's process ended (side channel EOF).
    pub(super) eof: bool,
    /// Bytes the TCP lane's kernel socket has taken so far (0 without a lane).
    pub(super) lane_written: u64,
}

/// Why a [`SendWatch`] gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gone {
    /// Nothing moved for the bound, a CTS or a message was lost on the data path, or the
    /// receiver's process does not answer: a timeout of the data path.
    Stalled,
    /// The receiver's process ended and nothing more arrives: the connection is closed.
    Closed,
}

/// What one [`SendWatch::check`] asks of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct WatchStep {
    /// Send one PROBE on the side channel.
    pub(super) probe: bool,
    /// Give up (after the PROBE, if any).
    pub(super) gone: Option<Gone>,
}

/// Everything that bounds a sender's waits (see "Failure detection" in the module docs): the
/// stall timer, the wait for a CTS the receiver says left, the log of when messages were
/// handed over (against POSTED), the PROBE of a receiver whose process may be stopped, and
/// the wait after its EOF. Takes `now` and what the poll saw; tested on a virtual clock.
pub(super) struct SendWatch {
    /// The data path, as a stall names it.
    pub(super) data: Link,
    pub(super) stall: Stall,
    /// Bounds the wait for a CTS the receiver says left `timeout` ago (POSTED).
    cts_lost: Stall,
    /// When the latest messages were handed over (eager, on the lane, or their writes
    /// queued): (tag, k) and instant, oldest first, at most [`HANDED_LOG`].
    handed: VecDeque<((i32, u64), Instant)>,
    /// Bounds the wait after the peer's EOF (see [`EOF_QUIET`]).
    eof_wait: Stall,
    /// Whether the receiver's process still runs while a send of ours does not complete and
    /// nothing moves (PROBE/ALIVE): a stopped receiver never sends the CTS a send waits for.
    probe: alive::Probe,
    /// Grows with every poll that read a completion or message (the progress mark).
    moved: u64,
}

impl SendWatch {
    pub(super) fn new(data: Link, timeout: Duration, now: Instant) -> SendWatch {
        let mut stall = Stall::new(now);
        stall.timeout = timeout;
        let mut cts_lost = Stall::new(now);
        cts_lost.timeout = cts_grace(timeout);
        SendWatch {
            data,
            stall,
            cts_lost,
            handed: VecDeque::new(),
            eof_wait: eof_wait(now),
            probe: alive::Probe::new(timeout, now),
            moved: 0,
        }
    }

    /// The error of a data path that stalled.
    pub(super) fn timeout(&self) -> Error {
        self.data.timeout(Stage::Data, self.stall.timeout)
    }

    /// Notes that message `tk` was handed over at `now` (for POSTED).
    pub(super) fn handed(&mut self, tk: (i32, u64), now: Instant) {
        if self.handed.len() >= HANDED_LOG {
            self.handed.pop_front();
        }
        self.handed.push_back((tk, now));
    }

    /// Called on every poll, after the completion queues and the side channel were read.
    /// The checks run in order and the first that gives up ends it.
    pub(super) fn check(&mut self, now: Instant, seen: &SendSeen) -> WatchStep {
        let stalled = WatchStep {
            probe: false,
            gone: Some(Gone::Stalled),
        };
        // After reading the completion queues: what completed while nobody polled counts.
        if self.stall.check(now, seen.progressed, seen.timed) {
            return stalled;
        }
        // A send waits for a CTS that the receiver says left `timeout` ago: lost on the data
        // path (after `cts_grace` more of polling, for a CTS still in the provider).
        if self.cts_lost.check(now, false, seen.cts_left) {
            return stalled;
        }
        // The receiver has seen nothing for `timeout` and waits for a message we handed over
        // `timeout` ago or more (or so long ago that it left the log): lost on the way. One
        // we have not sent yet is not an error (we are late, not dead).
        for tk in &seen.posted_sent {
            let old = self
                .handed
                .iter()
                .rev()
                .find(|h| h.0 == *tk)
                .is_none_or(|h| now.saturating_duration_since(h.1) >= self.stall.timeout);
            if old {
                return stalled;
            }
        }
        // A send that does not complete while nothing moves: is the receiver's process
        // running? (A live receiver that is late to post answers and is never an error.)
        if seen.progressed {
            self.moved = self.moved.wrapping_add(1);
        }
        if seen.alive {
            self.probe.answered();
        }
        let pending = seen.pending && !seen.eof;
        let mark = self.moved.wrapping_add(seen.lane_written);
        let mut step = WatchStep::default();
        match self.probe.check(now, pending, mark) {
            alive::ProbeStep::Wait => {}
            alive::ProbeStep::Send => step.probe = true,
            alive::ProbeStep::Frozen => return stalled,
        }
        let after_eof = seen.eof && seen.pending;
        if self.eof_wait.check(now, seen.progressed, after_eof) {
            step.gone = Some(Gone::Closed);
        }
        step
    }
}

/// What a receiver's poll saw, for its [`RecvWatch`].
#[derive(Debug, Default)]
pub(super) struct RecvSeen {
    /// A completion or lane message came.
    pub(super) progressed: bool,
    /// A message the sender has started is only partly here (see `RecvConn::timed_work`).
    pub(super) timed: bool,
    /// A receive whose CTS left still misses a message.
    pub(super) waits: bool,
    /// When our latest POSTED that no ALIVE has answered yet went.
    pub(super) probed: Option<Instant>,
    /// The sender's process ended (side channel EOF).
    pub(super) eof: bool,
    /// A receive is posted.
    pub(super) open: bool,
}

/// Why a [`RecvWatch`] gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecvGone {
    /// A message partly here saw nothing more for the bound.
    Stalled,
    /// The sender's process did not answer POSTED: it is stopped.
    Unanswered,
    /// The sender's process ended and nothing more arrives: the connection is closed.
    Closed,
}

/// What one [`RecvWatch::check`] asks of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct RecvStep {
    /// Forget the POSTED that waits for an answer (something moved, or nothing waits).
    pub(super) settled: bool,
    /// Send POSTED, naming what the receives whose CTS left wait for.
    pub(super) posted: bool,
    /// Give up (after the POSTED, if any).
    pub(super) gone: Option<RecvGone>,
}

/// Everything that bounds a receiver's waits (see "Failure detection" in the module docs):
/// the stall timer of a message partly here, the quiet of a receive whose CTS left (which
/// sends POSTED, again every quarter of the timeout), the answer POSTED is owed, and the wait
/// after the sender's EOF. Takes `now` and what the poll saw; tested on a virtual clock.
pub(super) struct RecvWatch {
    /// The data path, as a stall names it.
    data: Link,
    stall: Stall,
    /// Bounds the wait for the data of a receive whose CTS left, before POSTED is sent.
    quiet: Stall,
    /// Bounds the wait after the peer's EOF (see [`EOF_QUIET`]).
    eof_wait: Stall,
}

impl RecvWatch {
    pub(super) fn new(data: Link, timeout: Duration, now: Instant) -> RecvWatch {
        let mut stall = Stall::new(now);
        stall.timeout = timeout;
        let mut quiet = Stall::new(now);
        quiet.timeout = timeout;
        RecvWatch {
            data,
            stall,
            quiet,
            eof_wait: eof_wait(now),
        }
    }

    /// The configured timeout.
    pub(super) fn timeout(&self) -> Duration {
        self.stall.timeout
    }

    /// The error `gone` stands for; `link` is the connection's (management) link.
    pub(super) fn error(&self, gone: RecvGone, link: &Link) -> Error {
        match gone {
            RecvGone::Stalled => self.data.timeout(Stage::Data, self.stall.timeout),
            RecvGone::Unanswered => link.timeout(Stage::Data, self.quiet.timeout),
            RecvGone::Closed => link.closed(Stage::Data),
        }
    }

    /// Called on every poll, after the completion queues, the lane and the side channel were
    /// read. The checks run in order and the first that gives up ends it.
    pub(super) fn check(&mut self, now: Instant, seen: &RecvSeen) -> RecvStep {
        let mut step = RecvStep::default();
        // After reading the completion queues: what completed while nobody polled counts.
        if self.stall.check(now, seen.progressed, seen.timed) {
            step.gone = Some(RecvGone::Stalled);
            return step;
        }
        // A receive whose CTS left and nothing since: the sender may not have sent yet (not
        // an error), or the CTS was lost on a cut data link while the sender waits for it.
        // Only the sender can tell: POSTED asks it (it fails if it waits for that CTS).
        if seen.progressed || !seen.waits {
            step.settled = true;
        } else if seen
            .probed
            .is_some_and(|t| now.saturating_duration_since(t) >= answer_bound(self.quiet.timeout))
        {
            step.gone = Some(RecvGone::Unanswered);
            return step;
        }
        if self.quiet.check(now, seen.progressed, seen.waits) {
            step.posted = true;
            // Again every quarter of the timeout while it lasts: the sender may have handed
            // the message over only just before the first one came.
            self.quiet.rearm(now, self.quiet.timeout / 4);
        }
        let after_eof = seen.eof && seen.open;
        if self.eof_wait.check(now, seen.progressed, after_eof) {
            step.gone = Some(RecvGone::Closed);
        }
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(4);

    fn watch(now: Instant) -> SendWatch {
        let link = Link {
            peer: SocketAddr::from(([10, 0, 0, 2], 1)),
            iface: "data0".into(),
        };
        SendWatch::new(link, T, now)
    }

    /// Checks every millisecond from `*now` for `dur` with what `seen` says; the first step
    /// that asks for something, and when.
    fn poll_for(
        w: &mut SendWatch,
        now: &mut Instant,
        dur: Duration,
        seen: &SendSeen,
    ) -> Option<(Duration, WatchStep)> {
        let start = *now;
        while now.duration_since(start) < dur {
            *now += Duration::from_millis(1);
            let s = w.check(*now, seen);
            if s != WatchStep::default() {
                return Some((now.duration_since(start), s));
            }
        }
        None
    }

    #[test]
    fn a_sender_with_timed_work_and_no_progress_stalls_after_the_timeout() {
        let mut now = Instant::now();
        let mut w = watch(now);
        let timed = SendSeen {
            timed: true,
            ..SendSeen::default()
        };
        let (at, s) = poll_for(&mut w, &mut now, 2 * T, &timed).expect("gives up");
        assert_eq!(s.gone, Some(Gone::Stalled));
        assert_eq!(at, T);
        // Progress keeps it going.
        let mut w = watch(now);
        let moving = SendSeen {
            timed: true,
            progressed: true,
            ..SendSeen::default()
        };
        assert_eq!(poll_for(&mut w, &mut now, 2 * T, &moving), None);
        assert!(w.timeout().to_string().contains("data0"));
    }

    #[test]
    fn a_cts_the_receiver_says_left_is_lost_after_the_grace() {
        let mut now = Instant::now();
        let mut w = watch(now);
        let lost = SendSeen {
            cts_left: true,
            ..SendSeen::default()
        };
        let (at, s) = poll_for(&mut w, &mut now, T, &lost).expect("gives up");
        assert_eq!(s.gone, Some(Gone::Stalled));
        assert_eq!(at, cts_grace(T));
    }

    #[test]
    fn posted_naming_a_message_handed_over_long_ago_or_forgotten_is_a_loss() {
        let mut now = Instant::now();
        let mut w = watch(now);
        w.handed((1, 0), now);
        now += T / 2;
        w.handed((1, 1), now);
        now += T / 2;
        let posted = |tk| SendSeen {
            posted_sent: vec![tk],
            ..SendSeen::default()
        };
        // Handed over half the timeout ago: the receiver may just not have it yet.
        assert_eq!(w.check(now, &posted((1, 1))), WatchStep::default());
        // The whole timeout ago: lost.
        assert_eq!(w.check(now, &posted((1, 0))).gone, Some(Gone::Stalled));
        // Not in the log (handed so long ago that it left it): lost too.
        let mut w = watch(now);
        for k in 0..=HANDED_LOG as u64 {
            w.handed((2, k), now);
        }
        assert_eq!(w.check(now, &posted((2, 1))), WatchStep::default());
        assert_eq!(w.check(now, &posted((2, 0))).gone, Some(Gone::Stalled));
    }

    #[test]
    fn a_pending_send_probes_and_an_unanswered_probe_is_a_stopped_receiver() {
        let mut now = Instant::now();
        let mut w = watch(now);
        let pending = SendSeen {
            pending: true,
            ..SendSeen::default()
        };
        let (at, s) = poll_for(&mut w, &mut now, T, &pending).expect("probes");
        // The first poll (1 ms in) starts the quarter.
        assert_eq!(
            (at, s.probe, s.gone),
            (T / 4 + Duration::from_millis(1), true, None)
        );
        // An ALIVE answers it; nothing moved, so the next probe follows a quarter later.
        let alive = SendSeen {
            pending: true,
            alive: true,
            ..SendSeen::default()
        };
        now += Duration::from_millis(1);
        assert_eq!(w.check(now, &alive), WatchStep::default());
        let (at, s) = poll_for(&mut w, &mut now, T, &pending).expect("probes again");
        assert!(s.probe && at < T / 4, "{at:?}");
        // Unanswered: frozen once the answer bound passed.
        let (_, s) = loop {
            let step = poll_for(&mut w, &mut now, 2 * T, &pending).expect("something");
            if step.1.gone.is_some() {
                break step;
            }
        };
        assert_eq!(s.gone, Some(Gone::Stalled));
        // Bytes the lane's kernel took are progress: no probe while they move.
        let mut w = watch(now);
        for i in 0..(T.as_millis() as u64) {
            now += Duration::from_millis(1);
            let s = w.check(
                now,
                &SendSeen {
                    pending: true,
                    lane_written: i,
                    ..SendSeen::default()
                },
            );
            assert_eq!(s, WatchStep::default());
        }
    }

    #[test]
    fn after_the_receivers_eof_pending_work_is_closed_once_nothing_lands_for_eof_quiet() {
        let mut now = Instant::now();
        let mut w = watch(now);
        let eof = SendSeen {
            pending: true,
            eof: true,
            ..SendSeen::default()
        };
        let (at, s) = poll_for(&mut w, &mut now, T, &eof).expect("closes");
        assert_eq!(
            (at, s),
            (
                EOF_QUIET,
                WatchStep {
                    probe: false,
                    gone: Some(Gone::Closed)
                }
            )
        );
        // Completions still landing keep it open; nothing pending is no wait at all.
        let mut w = watch(now);
        let landing = SendSeen {
            progressed: true,
            ..eof
        };
        assert_eq!(poll_for(&mut w, &mut now, T, &landing), None);
        let idle = SendSeen {
            eof: true,
            ..SendSeen::default()
        };
        assert_eq!(poll_for(&mut w, &mut now, T, &idle), None);
    }

    fn recv_watch(now: Instant) -> RecvWatch {
        let link = Link {
            peer: SocketAddr::from(([10, 0, 0, 1], 1)),
            iface: "data0".into(),
        };
        RecvWatch::new(link, T, now)
    }

    #[test]
    fn a_receiver_with_a_message_partly_here_stalls_after_the_timeout() {
        let mut now = Instant::now();
        let mut w = recv_watch(now);
        let partial = RecvSeen {
            timed: true,
            open: true,
            ..RecvSeen::default()
        };
        let mut at = None;
        for i in 1..=2 * T.as_millis() as u32 {
            now += Duration::from_millis(1);
            let s = w.check(now, &partial);
            if s.gone.is_some() {
                at = Some((i, s.gone));
                break;
            }
        }
        assert_eq!(at, Some((T.as_millis() as u32, Some(RecvGone::Stalled))));
    }

    #[test]
    fn a_quiet_receive_sends_posted_every_quarter_and_an_unanswered_one_is_a_stopped_sender() {
        let t0 = Instant::now();
        let mut now = t0;
        let mut w = recv_watch(now);
        let mut probed = None;
        let mut posted = Vec::new();
        let gone = loop {
            now += Duration::from_millis(1);
            assert!(now.duration_since(t0) < 3 * T, "never gave up");
            let s = w.check(
                now,
                &RecvSeen {
                    waits: true,
                    probed,
                    open: true,
                    ..RecvSeen::default()
                },
            );
            assert!(!s.settled);
            if s.posted {
                posted.push(now.duration_since(t0));
                probed.get_or_insert(now);
            }
            if let Some(g) = s.gone {
                break g;
            }
        };
        assert_eq!(gone, RecvGone::Unanswered);
        // The first POSTED after the timeout; unanswered for the answer bound (here a
        // quarter of the timeout, when the next POSTED would go), the sender is stopped.
        assert_eq!(answer_bound(T), T / 4);
        assert_eq!(posted, [T]);
        assert_eq!(now.duration_since(t0), T + answer_bound(T));
        // A sender that answers (ALIVE clears `probed`) is asked again every quarter while
        // the receive stays quiet, and is never an error.
        let t1 = now;
        let mut w2 = recv_watch(now);
        let mut again = Vec::new();
        while now.duration_since(t1) < 2 * T {
            now += Duration::from_millis(1);
            let s = w2.check(
                now,
                &RecvSeen {
                    waits: true,
                    open: true,
                    ..RecvSeen::default()
                },
            );
            assert_eq!(s.gone, None);
            if s.posted {
                again.push(now.duration_since(t1));
            }
        }
        assert_eq!(again, [T, T + T / 4, T + T / 2, T + 3 * T / 4, 2 * T]);
        // Something moving settles it and sends nothing.
        let s = w.check(
            now,
            &RecvSeen {
                waits: true,
                probed,
                progressed: true,
                ..RecvSeen::default()
            },
        );
        assert_eq!(
            s,
            RecvStep {
                settled: true,
                posted: false,
                gone: None
            }
        );
        assert_eq!(
            w.error(RecvGone::Unanswered, &w.data).to_string(),
            w.data.timeout(Stage::Data, T).to_string()
        );
    }

    #[test]
    fn after_the_senders_eof_an_open_receive_is_closed_once_nothing_lands_for_eof_quiet() {
        let mut now = Instant::now();
        let mut w = recv_watch(now);
        let eof = RecvSeen {
            eof: true,
            open: true,
            ..RecvSeen::default()
        };
        let start = now;
        let gone = loop {
            now += Duration::from_millis(1);
            if let Some(g) = w.check(now, &eof).gone {
                break g;
            }
        };
        assert_eq!(
            (gone, now.duration_since(start)),
            (RecvGone::Closed, EOF_QUIET)
        );
        // Nothing posted: nothing to wait for.
        let mut w = recv_watch(now);
        for _ in 0..1000 {
            now += Duration::from_millis(1);
            let s = w.check(
                now,
                &RecvSeen {
                    eof: true,
                    ..RecvSeen::default()
                },
            );
            assert_eq!(s.gone, None);
        }
    }

    /// On a virtual clock: polls every `step` from `*now` for `dur`, checking with
    /// `progressed` and `waiting`; the time of the first firing, if any.
    fn run(
        s: &mut Stall,
        now: &mut Instant,
        step: Duration,
        dur: Duration,
        p: bool,
        w: bool,
    ) -> Option<Instant> {
        let end = *now + dur;
        let mut fired = None;
        while *now < end {
            *now += step;
            if s.check(*now, p, w) && fired.is_none() {
                fired = Some(*now);
            }
        }
        fired
    }

    #[test]
    fn the_stall_timer_counts_polled_time_without_progress_only() {
        let t0 = Instant::now();
        let mut now = t0;
        let ms = Duration::from_millis;
        let mut s = Stall::new(now);
        s.timeout = ms(300);
        // Nothing outstanding: never fires, however long.
        assert_eq!(run(&mut s, &mut now, ms(1), ms(10_000), false, false), None);
        // Outstanding, polled every millisecond without progress: fires at the timeout.
        let start = now;
        let fired = run(&mut s, &mut now, ms(1), ms(400), false, true).expect("fires");
        assert_eq!(fired.duration_since(start), ms(300));
        // Progress restarts it.
        assert!(!s.check(now, true, true));
        let start = now;
        let fired = run(&mut s, &mut now, ms(1), ms(400), false, true).expect("fires again");
        assert_eq!(fired.duration_since(start), ms(300));
        // A gap without polls (over POLL_GAP) does not count: 200 ms polled, 10 s unpolled,
        // then it fires 100 ms of polling later.
        assert!(!s.check(now, true, true));
        let start = now;
        assert_eq!(run(&mut s, &mut now, ms(1), ms(200), false, true), None);
        now += Duration::from_secs(10);
        assert!(!s.check(now, false, true), "time nobody polled counted");
        let fired = run(&mut s, &mut now, ms(1), ms(200), false, true).expect("fires");
        assert_eq!(
            fired.duration_since(start),
            ms(300) + Duration::from_secs(10)
        );
        // Gaps up to POLL_GAP count: polled every 100 ms, it fires at the timeout.
        assert!(!s.check(now, true, true));
        let start = now;
        let fired = run(&mut s, &mut now, POLL_GAP, ms(1000), false, true).expect("fires");
        assert_eq!(fired.duration_since(start), ms(300));
        // Rearmed: fires again after the given time.
        s.rearm(now, ms(50));
        let start = now;
        let fired = run(&mut s, &mut now, ms(1), ms(100), false, true).expect("fires");
        assert_eq!(fired.duration_since(start), ms(50));
    }
}
