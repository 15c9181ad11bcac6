//! The ping-pong that weft's latency benchmarks and tools time (`ofi_netns`, `ofi_shapes`):
//! one place, so that they all measure the same thing.

use std::time::{Duration, Instant};

use crate::backend::{RecvConn, SendConn};
use crate::common::{RecvBuf, RequestId};
use crate::error::{Error, Result, Stage};

/// What one side of [`ping_pong`] measured.
#[derive(Debug, Clone, Copy)]
pub struct PingPong {
    /// Time of the timed round trips (all but the first).
    pub elapsed: Duration,
    /// `test` calls that found their request not done yet (busy polling), over all round
    /// trips.
    pub polls: u64,
}

/// Runs `iters + 1` round trips of `size`-byte messages (tag 0) with the peer, which runs the
/// same with the other `client` value; the client sends first. The first round trip is not
/// timed (it sets up the provider's connections). Like `fi_pingpong`, each side posts its
/// next receive as soon as the previous one completed, before its own next send, and both
/// sides spin on `test`. Each wait for the peer's message is bounded by `timeout`. The
/// connections are closed when it returns.
pub fn ping_pong(
    tx: SendConn,
    rx: RecvConn,
    size: usize,
    iters: usize,
    client: bool,
    timeout: Duration,
) -> Result<PingPong> {
    let sbuf = vec![7u8; size];
    let mut rbuf = vec![0u8; size];
    // Declared after the buffers, so dropped before them: a request still posted on an
    // early return (an error) ends with its connection, not after its buffer is gone.
    let (mut tx, mut rx) = (tx, rx);
    let rb = RecvBuf {
        ptr: rbuf.as_mut_ptr(),
        len: size,
        tag: 0,
    };
    let mut polls = 0u64;
    let post = |rx: &mut RecvConn| -> Result<RequestId> {
        loop {
            // SAFETY: `rbuf` outlives every request: each is tested to completion below, and
            // on an early return the connection is dropped (endpoint closed) before `rbuf`.
            if let Some(id) = unsafe { rx.irecv(&[rb]) }? {
                return Ok(id);
            }
        }
    };
    let send = |tx: &mut SendConn, polls: &mut u64| -> Result<()> {
        let id = loop {
            // SAFETY: `sbuf` outlives the request, tested to completion here (or, on an
            // error, the connection is dropped before `sbuf`).
            if let Some(id) = unsafe { tx.isend(sbuf.as_ptr(), size, 0) }? {
                break id;
            }
        };
        while tx.test(id)?.is_none() {
            *polls += 1;
        }
        Ok(())
    };
    let wait = |rx: &mut RecvConn, r: RequestId, polls: &mut u64| -> Result<()> {
        let deadline = Instant::now() + timeout;
        while rx.test(r)?.is_none() {
            *polls += 1;
            if polls.is_multiple_of(1024) && Instant::now() >= deadline {
                let (peer, iface) = rx.peer();
                return Err(Error::Timeout {
                    peer,
                    iface: iface.to_string(),
                    stage: Stage::Data,
                    after: timeout,
                });
            }
        }
        Ok(())
    };
    let mut r = post(&mut rx)?;
    let mut start = Instant::now();
    for i in 0..=iters {
        if i == 1 {
            start = Instant::now();
            polls = 0;
        }
        if client {
            send(&mut tx, &mut polls)?;
            wait(&mut rx, r, &mut polls)?;
            if i < iters {
                r = post(&mut rx)?;
            }
        } else {
            wait(&mut rx, r, &mut polls)?;
            if i < iters {
                r = post(&mut rx)?;
            }
            send(&mut tx, &mut polls)?;
        }
    }
    Ok(PingPong {
        elapsed: start.elapsed(),
        polls,
    })
}
