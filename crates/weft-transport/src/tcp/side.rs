//! The management side channel of an established TCP connection (its handshake stream):
//! ABORT when a side gives up, PROBE from an end that waits on the other while nothing moves
//! (a sender whose bytes stopped moving, a receiver whose posted receive gets no byte) and
//! ALIVE from the other end's process in answer (see [`crate::alive`]); nothing else, ever.

use std::io::{self, Read};
use std::net::TcpStream;

use super::flush_some;
use crate::alive;
use crate::error::{Error, Link, Stage};
use crate::proto::{self, Frame, FrameDecoder};

/// The management side channel of an established connection (the handshake stream): silent
/// unless a side gives up (one ABORT frame) or an end waits on the other while nothing moves
/// (PROBE, answered by ALIVE from the other end's process; see [`crate::alive`]). It earns its place when the data
/// network is what failed: the control stream cannot carry the ABORT then, this can.
#[derive(Debug)]
pub(super) struct SideChannel {
    sock: TcpStream,
    pub(super) link: Link,
    dec: FrameDecoder,
    /// EOF or an error: nothing more will come (not a failure by itself).
    done: bool,
    /// This end's answers to the peer's PROBE while its application is not polling. Declared
    /// after `sock`: the duplicate it watches closes after ours.
    answering: Option<alive::Answering>,
    /// An ALIVE came since [`SideChannel::take_alive`] was last called.
    alive: bool,
}

/// Tag of the MSG frame (no payload) an end that waits on the other while nothing moves sends
/// on the side channel: is the other end's process running? (see [`crate::alive`]).
const PROBE_TAG: i32 = 0x5443_5050; // "TCPP"

impl SideChannel {
    pub(super) fn new(sock: TcpStream, link: Link) -> SideChannel {
        SideChannel {
            sock,
            link,
            dec: FrameDecoder::new(),
            done: false,
            answering: None,
            alive: false,
        }
    }

    /// PROBE is answered with ALIVE, by the application's polls or, while it does not poll, by
    /// the process's `alive` thread (both ends of a connection answer).
    pub(super) fn answering(mut self) -> SideChannel {
        self.answering = alive::Answering::new(&self.sock, PROBE_TAG);
        self
    }

    /// The peer's ABORT (or garbage) as an error, if one came. `who` names the peer's role.
    /// Answers PROBE and notes ALIVE on the way.
    pub(super) fn poll_abort(&mut self, who: &str) -> Option<Error> {
        let mut buf = [0u8; 64];
        while !self.done {
            match (&self.sock).read(&mut buf) {
                Ok(0) => self.done = true,
                Ok(n) => self.dec.handle_bytes(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.done = true,
            }
        }
        loop {
            match self.dec.poll_frame() {
                Ok(None) => return None,
                Ok(Some(Frame::Abort { reason, detail })) => {
                    return Some(
                        self.link
                            .aborted(format!("the {who} gave up: {}", reason.describe(detail))),
                    );
                }
                Ok(Some(Frame::Msg(h))) if h.tag == alive::ALIVE_TAG => self.alive = true,
                Ok(Some(Frame::Msg(h))) if h.tag == PROBE_TAG && self.answering.is_some() => {
                    let mut pos = 0;
                    flush_some(&self.sock, &alive::frame(), &mut pos);
                }
                Ok(Some(f)) => {
                    return Some(self.link.protocol(
                        Stage::Data,
                        proto::FrameError::Unexpected {
                            got: f.name(),
                            expected: "ABORT",
                        },
                    ));
                }
                Err(e) => return Some(self.link.protocol(Stage::Data, e)),
            }
        }
    }

    /// Whether an ALIVE came since the last call.
    pub(super) fn take_alive(&mut self) -> bool {
        std::mem::take(&mut self.alive)
    }

    /// Best effort, never blocks: one PROBE (a few bytes on a socket that carries nothing
    /// else; the next one follows a quarter of the timeout later if this did not fit).
    pub(super) fn send_probe(&mut self) {
        let mut b = Vec::with_capacity(proto::FRAME_LEN);
        Frame::encode_msg(&mut b, PROBE_TAG, Some(&[]), 0, 0);
        let mut pos = 0;
        flush_some(&self.sock, &b, &mut pos);
    }

    /// Best effort, never blocks: sends `abort` and ends the side channel.
    pub(super) fn send_abort(&mut self, abort: Option<&Frame>) {
        self.answering = None;
        if let Some(f) = abort {
            let mut b = Vec::with_capacity(proto::FRAME_LEN);
            f.encode(&mut b);
            let mut pos = 0;
            flush_some(&self.sock, &b, &mut pos);
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }
}
