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

    /// Whether the sender's process has not answered our POSTED within `bound` (stopped).
    pub(super) fn unanswered(&self, bound: Duration) -> bool {
        self.probed.is_some_and(|t| t.elapsed() >= bound)
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

#[cfg(test)]
mod tests {
    use super::*;

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
