//! Answers for a sender process whose application is not polling: a frozen sender
//! (SIGSTOP: its kernel still acknowledges every byte) and one that has simply not sent yet
//! look the same to the receiver, unless something in the sender's process that does not
//! depend on the application answers. That is this thread: for every send connection it
//! watches the side channel's unread bytes (`FIONREAD`, never reading them), and when they
//! grow (the receiver's POSTED arrived and the application has not read it) it writes one
//! ALIVE frame. A sender application that reads POSTED itself answers too (see `Side::poll`).
//! A stopped process answers nothing, so the receiver fails after POSTED goes unanswered.
//!
//! Only senders answer, and only to bytes that arrived: the two sides never answer each
//! other, and a quiet connection puts no byte on the management network.

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::proto::Frame;

/// Tag of the MSG frame (no payload) that answers a receiver's POSTED: the sender's process
/// runs. Peers that predate it ignore it.
pub(super) const ALIVE_TAG: i32 = 0x4f46_4941; // "OFIA"

/// How often the thread looks at the side channels.
const PERIOD: Duration = Duration::from_millis(20);

struct Entry {
    sock: TcpStream,
    gone: Arc<AtomicBool>,
    unread: usize,
}

fn registry() -> &'static Mutex<Vec<Entry>> {
    static REG: OnceLock<Mutex<Vec<Entry>>> = OnceLock::new();
    REG.get_or_init(|| {
        // No thread (no answers) only if the system refuses one; the receiver's bound then
        // applies to a late sender too, which errs on the side of an error over a hang.
        let _ = std::thread::Builder::new()
            .name("weft-ofi-alive".into())
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
            let n = unread(&e.sock);
            if n > e.unread {
                let _ = (&e.sock).write(&frame());
            }
            e.unread = n;
        }
    }
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
pub(super) fn frame() -> Vec<u8> {
    let mut b = Vec::new();
    Frame::encode_msg(&mut b, ALIVE_TAG, Some(&[]), 0, 0);
    b
}

/// Answers on the side channel `sock` of a send connection until the guard is dropped.
pub(super) struct Answering(Arc<AtomicBool>);

impl Answering {
    /// Registers `sock` (a duplicate of its descriptor is watched); `None` when it cannot be
    /// duplicated (then only the application's polls answer).
    pub fn new(sock: &TcpStream) -> Option<Answering> {
        let dup = sock.try_clone().ok()?;
        let gone = Arc::new(AtomicBool::new(false));
        let unread = unread(&dup);
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Entry {
                sock: dup,
                gone: gone.clone(),
                unread,
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
