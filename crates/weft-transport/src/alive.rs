//! Liveness answers from a process whose application is not calling in, for both backends.
//!
//! A frozen peer (SIGSTOP: its kernel still acknowledges every byte) and one that is merely
//! late look the same from the other side, unless something in the peer's process that does
//! not depend on the application answers. That is this module's thread: for every registered
//! side channel (the management stream of a connection) it looks at the unread bytes
//! (`MSG_PEEK`, never reading them), and when the questions among them grow in number (a
//! question arrived and the application has not read it) it writes one ALIVE frame. An
//! application that reads the question itself answers too. A stopped process answers nothing,
//! so the asking side fails once its question goes unanswered for a bound.
//!
//! Who asks whom:
//! * **ofi**: a receiver whose receive stalls sends POSTED; the *sender's* process answers.
//! * **TCP**: either end whose connection waits on the other and sees nothing move for a
//!   quarter of the timeout sends PROBE ([`Probe`] decides when): a sender whose pending bytes
//!   do not move, a receiver whose posted receive gets no byte. The other end's process
//!   answers. A receiver that is late to post (its window closed) or a sender that is late to
//!   send answers and is never an error; a frozen one does not.
//!
//! Only questions are answered, never an ALIVE: both ends of a connection may answer, and an
//! answer that were answered in turn would bounce between two idle processes for ever. A
//! connection that makes progress puts no byte on the management network.

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::proto::Frame;

/// Tag of the MSG frame (no payload) that answers a question (ofi POSTED, TCP PROBE): the
/// answering process runs.
pub(crate) const ALIVE_TAG: i32 = 0x4f46_4941; // "OFIA"

/// How often the thread looks at the side channels.
const PERIOD: Duration = Duration::from_millis(20);

struct Entry {
    sock: TcpStream,
    gone: Arc<AtomicBool>,
    /// The first bytes of the question frame this side answers.
    question: [u8; QUESTION_PREFIX],
    /// Questions among the unread bytes at the last look.
    asked: usize,
}

/// How many leading bytes of a frame identify a question: kind, flags, `a` and the tag.
const QUESTION_PREFIX: usize = 8;

fn registry() -> &'static Mutex<Vec<Entry>> {
    static REG: OnceLock<Mutex<Vec<Entry>>> = OnceLock::new();
    REG.get_or_init(|| {
        // No thread (no answers) only if the system refuses one; the receiver's bound then
        // applies to a late sender too, which errs on the side of an error over a hang.
        let _ = std::thread::Builder::new()
            .name("weft-alive".into())
            .spawn(run);
        Mutex::new(Vec::new())
    })
}

fn run() {
    loop {
        std::thread::sleep(PERIOD);
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        reg.retain(|e| !e.gone.load(Ordering::Acquire));
        for e in reg.iter_mut() {
            let n = questions(&e.sock, &e.question);
            if n > e.asked {
                let _ = (&e.sock).write(&frame());
            }
            e.asked = n;
        }
    }
}

/// How many question frames (frames that start with `question`) wait unread on `s`, found
/// with `MSG_PEEK` (the application reads them later, as if nobody had looked). A question
/// the application has begun reading is not counted; it answers that one itself.
fn questions(s: &TcpStream, question: &[u8; QUESTION_PREFIX]) -> usize {
    let n = unread(s);
    if n < QUESTION_PREFIX {
        return 0;
    }
    let mut buf = vec![0u8; n];
    // SAFETY: recv writes at most `buf.len()` bytes into the live buffer; the descriptor is
    // owned by `s`, open while it lives.
    let got = unsafe {
        libc::recv(
            s.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    let Ok(got) = usize::try_from(got) else {
        return 0;
    };
    count(&buf[..got.min(n)], question)
}

/// Occurrences of `question` in `bytes` (at any offset: the unread bytes may begin inside a
/// frame the application has read part of).
fn count(bytes: &[u8], question: &[u8; QUESTION_PREFIX]) -> usize {
    bytes
        .windows(QUESTION_PREFIX)
        .filter(|w| *w == question)
        .count()
}

/// Bytes waiting to be read on `s` (0 when unknown).
fn unread(s: &TcpStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer to a live c_int; the descriptor
    // is owned by `s`, open while it lives.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r == 0 {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// One ALIVE frame.
pub(crate) fn frame() -> Vec<u8> {
    let mut b = Vec::new();
    Frame::encode_msg(&mut b, ALIVE_TAG, Some(&[]), 0, 0);
    b
}

/// Answers on the side channel `sock` until the guard is dropped.
#[derive(Debug)]
pub(crate) struct Answering(Arc<AtomicBool>);

impl Answering {
    /// Registers `sock` (a duplicate of its descriptor is watched) to answer MSG frames of tag
    /// `question`; `None` when it cannot be duplicated (then only the application's polls
    /// answer).
    pub fn new(sock: &TcpStream, question: i32) -> Option<Answering> {
        let dup = sock.try_clone().ok()?;
        let gone = Arc::new(AtomicBool::new(false));
        let mut q = Vec::with_capacity(crate::proto::FRAME_LEN);
        Frame::encode_msg(&mut q, question, Some(&[]), 0, 0);
        let mut prefix = [0u8; QUESTION_PREFIX];
        prefix.copy_from_slice(&q[..QUESTION_PREFIX]);
        let asked = questions(&dup, &prefix);
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Entry {
                sock: dup,
                gone: gone.clone(),
                question: prefix,
                asked,
            });
        Some(Answering(gone))
    }
}

impl Drop for Answering {
    /// Stops answering and closes the duplicate at once (the connection's EOF is not held
    /// back by it).
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|e| !Arc::ptr_eq(&e.gone, &self.0));
    }
}

/// When an end of a connection asks its peer's process whether it runs (PROBE on the side
/// channel), and when the lack of an answer makes the peer frozen: pure, time passed in. Used
/// by both TCP ends (a sender whose bytes wait for the receiver, a receiver whose posted
/// receive waits for bytes) and by the ofi sender (a send that has not completed).
///
/// An end with work waiting on the peer (`pending`) whose progress mark (any number that
/// changes when bytes move or credit comes) stays the same for `timeout / 4` sends a PROBE,
/// and again every `timeout / 4` while that lasts; any ALIVE answers every PROBE sent so far,
/// and progress does too. A PROBE unanswered for [`Probe::answer_bound`] (three quarters of
/// the timeout, at least 200 ms) is a frozen peer. So a frozen peer fails the waiting end
/// about `timeout` after the last byte moved; a peer that is late (to post, to send) answers
/// and is never an error, however late.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    timeout: Duration,
    /// The progress mark last seen (None: nothing pending).
    mark: Option<u64>,
    /// When the next PROBE is due while nothing moves.
    next: Instant,
    /// The oldest PROBE no ALIVE has answered yet.
    unanswered: Option<Instant>,
}

/// What [`Probe::check`] asks of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeStep {
    /// Nothing to do.
    Wait,
    /// Send one PROBE frame on the side channel.
    Send,
    /// The receiver's process has not answered for the bound: it is stopped.
    Frozen,
}

impl Probe {
    pub fn new(timeout: Duration, now: Instant) -> Probe {
        Probe {
            timeout,
            mark: None,
            next: now,
            unanswered: None,
        }
    }

    /// How long a PROBE may go unanswered: far longer than the answering thread's period
    /// plus a round trip.
    pub fn answer_bound(&self) -> Duration {
        (self.timeout * 3 / 4).max(Duration::from_millis(200))
    }

    /// An ALIVE came: every PROBE so far is answered.
    pub fn answered(&mut self) {
        self.unanswered = None;
    }

    /// Called while the connection is polled: `pending`, whether bytes wait for the receiver;
    /// `mark`, the progress mark.
    pub fn check(&mut self, now: Instant, pending: bool, mark: u64) -> ProbeStep {
        let quarter = self.timeout / 4;
        if !pending || self.mark != Some(mark) {
            self.mark = pending.then_some(mark);
            self.next = now + quarter;
            self.unanswered = None;
            return ProbeStep::Wait;
        }
        if self
            .unanswered
            .is_some_and(|t| now.duration_since(t) >= self.answer_bound())
        {
            return ProbeStep::Frozen;
        }
        if now >= self.next {
            self.next = now + quarter;
            self.unanswered.get_or_insert(now);
            return ProbeStep::Send;
        }
        ProbeStep::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(4);

    #[test]
    fn a_probe_goes_after_a_quarter_of_the_timeout_without_progress_only() {
        let t0 = Instant::now();
        let mut p = Probe::new(T, t0);
        // Nothing pending: never a probe, however long.
        assert_eq!(p.check(t0 + 10 * T, false, 0), ProbeStep::Wait);
        // Pending and moving: no probe.
        let t1 = t0 + 10 * T;
        for k in 0..100u64 {
            let now = t1 + Duration::from_millis(100 * k);
            assert_eq!(p.check(now, true, k), ProbeStep::Wait, "step {k}");
        }
        // Pending and still: a probe once a quarter has passed, not before.
        let t2 = t1 + Duration::from_millis(9_900);
        assert_eq!(p.check(t2, true, 99), ProbeStep::Wait);
        assert_eq!(
            p.check(t2 + T / 4 - Duration::from_millis(1), true, 99),
            ProbeStep::Wait
        );
        assert_eq!(p.check(t2 + T / 4, true, 99), ProbeStep::Send);
        assert_eq!(p.check(t2 + T / 4, true, 99), ProbeStep::Wait);
    }

    #[test]
    fn an_answered_receiver_is_never_frozen_however_late() {
        let t0 = Instant::now();
        let mut p = Probe::new(T, t0);
        assert_eq!(p.check(t0, true, 7), ProbeStep::Wait);
        let mut sent = 0;
        // One hour without a byte moving, every probe answered 50 ms later.
        let mut now = t0;
        let end = t0 + Duration::from_secs(3600);
        while now < end {
            match p.check(now, true, 7) {
                ProbeStep::Send => {
                    sent += 1;
                    p.answered();
                }
                ProbeStep::Wait => {}
                ProbeStep::Frozen => panic!("answered receiver called frozen at {now:?}"),
            }
            now += Duration::from_millis(50);
        }
        // A probe every quarter of the timeout: 3600 s / 1 s.
        assert!((3500..=3601).contains(&sent), "{sent} probes");
    }

    #[test]
    fn an_unanswered_probe_is_a_frozen_receiver_about_a_timeout_after_the_last_byte() {
        let t0 = Instant::now();
        let mut p = Probe::new(T, t0);
        assert_eq!(p.check(t0, true, 1), ProbeStep::Wait);
        let mut now = t0;
        let frozen_at = loop {
            now += Duration::from_millis(10);
            match p.check(now, true, 1) {
                ProbeStep::Frozen => break now,
                ProbeStep::Send | ProbeStep::Wait => {}
            }
            assert!(now < t0 + 2 * T, "never called frozen");
        };
        let after = frozen_at.duration_since(t0);
        assert!(
            after >= T && after <= T + Duration::from_millis(20),
            "{after:?}"
        );
        // Progress (or an answer) clears it.
        assert_eq!(p.check(now, true, 2), ProbeStep::Wait);
        assert_eq!(p.check(now + T / 2, true, 2), ProbeStep::Send);
        p.answered();
        assert_eq!(p.check(now + T, true, 2), ProbeStep::Send);
    }

    fn question(tag: i32, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        Frame::encode_msg(&mut b, tag, Some(payload), payload.len() as u64, 0);
        b
    }

    #[test]
    fn questions_are_counted_at_any_offset_and_answers_never() {
        const Q: i32 = 0x5151_5151;
        let mut prefix = [0u8; QUESTION_PREFIX];
        prefix.copy_from_slice(&question(Q, &[])[..QUESTION_PREFIX]);
        let alive = frame();
        // Only ALIVEs: no question.
        assert_eq!(count(&[alive.clone(), alive.clone()].concat(), &prefix), 0);
        // A question behind the tail of a frame the application read part of, one with a
        // payload, and ALIVEs between them.
        let bytes = [
            alive[5..].to_vec(),
            question(Q, &[]),
            alive.clone(),
            question(Q, &[1; 24]),
        ]
        .concat();
        assert_eq!(count(&bytes, &prefix), 2);
        // Another question's tag is not this one.
        assert_eq!(count(&question(Q + 1, &[]), &prefix), 0);
    }

    /// Both ends of a loopback connection answer (as both TCP ends do): a question to one of
    /// them gets exactly one ALIVE from its thread, and that ALIVE, unread, is not answered in
    /// turn (no answers bouncing between two processes that do not call in).
    #[test]
    fn the_thread_answers_a_question_once_and_never_an_answer() {
        use std::io::Read;
        const Q: i32 = 0x5152_5354;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let _ga = Answering::new(&a, Q).unwrap();
        let _gb = Answering::new(&b, Q).unwrap();
        (&a).write_all(&question(Q, &[])).unwrap();
        std::thread::sleep(PERIOD * 15);
        // b's thread answered once: a holds one ALIVE, unread; b still holds the question.
        assert_eq!(unread(&a), crate::proto::FRAME_LEN);
        assert_eq!(unread(&b), crate::proto::FRAME_LEN);
        let mut got = [0u8; crate::proto::FRAME_LEN];
        (&a).read_exact(&mut got).unwrap();
        assert_eq!(got.to_vec(), frame());
    }

    #[test]
    fn the_answer_bound_has_a_floor_for_tiny_timeouts() {
        let p = Probe::new(Duration::from_millis(100), Instant::now());
        assert_eq!(p.answer_bound(), Duration::from_millis(200));
        assert_eq!(Probe::new(T, Instant::now()).answer_bound(), T * 3 / 4);
    }
}
