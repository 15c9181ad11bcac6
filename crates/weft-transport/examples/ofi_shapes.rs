//! Where the ofi backend's small-message latency goes: the same ping-pong as `fi_pingpong`,
//! written against libfabric directly in the connection shapes that matter, next to weft's
//! own backends. Two processes, one per side, the address exchange over a TCP socket.
//!
//! ```text
//! # one side, then the other (same mode, size and iterations on both)
//! ofi_shapes server 127.0.0.1:7000 two 20000 8 &
//! ofi_shapes client 127.0.0.1:7000 two 20000 8
//! ```
//!
//! Modes:
//! * `one`: one RDM endpoint per process carrying both directions, as `fi_pingpong` does,
//!   with `fi_send` (`onei`: `fi_inject`, no send completion, as `fi_pingpong` does for small
//!   messages).
//! * `two`: two endpoints per process, one sending and one receiving, so each direction is
//!   its own provider connection. That is the shape NCCL's one-way send and receive comms
//!   give any plugin (`twoi`: with `fi_inject`). Both endpoints are polled.
//! * `weft`: weft's [`Transport`] (backend from `WEFT_BACKEND`, interfaces from
//!   `WEFT_MGMT_IFNAME` / `WEFT_DATA_IFNAME`): one connection each way, and
//!   [`weft_transport::ping_pong`], the loop the `ofi_netns` benchmark times too.
//!
//! Environment: `PROV` (default `tcp;ofi_rxm`) and `DOM` (default `lo`) pick the libfabric
//! domain of the raw modes. The client prints half a round trip in µs and the polling calls
//! per round trip. Results and the commands run are in docs/benchmarks.md.

use std::error::Error;
use std::ffi::c_void;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weft_transport::ofi::fabric::{self, Domain, Endpoint};
use weft_transport::ofi::sys;
use weft_transport::{Config, Transport};

type R<T> = Result<T, Box<dyn Error>>;

fn send_blob(s: &mut TcpStream, n: &[u8]) -> R<()> {
    s.write_all(&(n.len() as u32).to_le_bytes())?;
    s.write_all(n)?;
    Ok(())
}

fn recv_blob(s: &mut TcpStream) -> R<Vec<u8>> {
    let mut l = [0u8; 4];
    s.read_exact(&mut l)?;
    let mut v = vec![0u8; u32::from_le_bytes(l) as usize];
    s.read_exact(&mut v)?;
    Ok(v)
}

/// How long any wait for the other side may take.
const BOUND: Duration = Duration::from_secs(60);

/// The server accepts, the client retries; both within [`BOUND`], and reads on the stream
/// are bounded by it too.
fn rendezvous(server: bool, addr: &str) -> R<TcpStream> {
    let deadline = Instant::now() + BOUND;
    let s = if server {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return Err(e.into()),
                Err(_) if Instant::now() > deadline => {
                    return Err(format!("no client on {addr} within {BOUND:?}").into());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    } else {
        loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => return Err(e.into()),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    };
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(BOUND))?;
    Ok(s)
}

fn report(mode: &str, size: usize, iters: usize, elapsed: Duration, polls: u64) {
    println!(
        "mode={mode} size={size} iters={iters} half-rtt={:.2} us polls/iter={:.1}",
        elapsed.as_secs_f64() / iters as f64 / 2.0 * 1e6,
        polls as f64 / iters as f64
    );
}

fn main() -> R<()> {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: ofi_shapes server|client ADDR one|onei|two|twoi|weft ITERS SIZE";
    if a.len() != 6 {
        return Err(usage.into());
    }
    let server = match a[1].as_str() {
        "server" => true,
        "client" => false,
        _ => return Err(usage.into()),
    };
    let (addr, mode) = (a[2].as_str(), a[3].as_str());
    let iters: usize = a[4].parse()?;
    let size: usize = a[5].parse()?;
    if iters == 0 {
        return Err("ITERS must be at least 1".into());
    }
    match mode {
        "weft" => weft(server, addr, iters, size),
        "one" | "onei" | "two" | "twoi" => raw(server, addr, mode, iters, size),
        _ => Err(usage.into()),
    }
}

/// Ping-pong on libfabric directly: one endpoint, or one per direction.
fn raw(server: bool, addr: &str, mode: &str, iters: usize, size: usize) -> R<()> {
    let prov = std::env::var("PROV").unwrap_or_else(|_| "tcp;ofi_rxm".into());
    let dname = std::env::var("DOM").unwrap_or_else(|_| "lo".into());
    let lib = fabric::lib()?;
    let (info, fi) = fabric::query(&lib, &prov)?
        .into_iter()
        .find(|(i, _)| i.domain == dname)
        .ok_or_else(|| format!("{prov} offers no domain {dname}"))?;
    let inject_size = info.inject_size;
    let dom = Arc::new(Domain::open(info, fi)?);
    let two = mode.starts_with("two");
    let inject = mode.ends_with('i');
    if inject && size > inject_size {
        return Err(format!("{size} bytes exceed the inject size ({inject_size})").into());
    }
    // Allocated before the endpoints, so dropped after them: a receive still posted on an
    // early return ends with its endpoint, not after its buffer is gone.
    let sbuf = vec![1u8; size.max(1)];
    let mut rbuf = vec![0u8; size.max(1)];
    let mut tx = Endpoint::open(&dom, 1024)?;
    let mut rx = if two {
        Some(Endpoint::open(&dom, 1024)?)
    } else {
        None
    };
    let mut s = rendezvous(server, addr)?;
    send_blob(&mut s, &tx.name()?)?;
    if let Some(r) = &rx {
        send_blob(&mut s, &r.name()?)?;
    }
    let peer_tx = recv_blob(&mut s)?;
    match &mut rx {
        Some(r) => {
            tx.set_peer(&recv_blob(&mut s)?)?;
            r.set_peer(&peer_tx)?;
        }
        None => tx.set_peer(&peer_tx)?,
    }
    let smr = tx.register(sbuf.as_ptr(), sbuf.len())?;
    let rep: &Endpoint = rx.as_ref().unwrap_or(&tx);
    let rmr = rep.register(rbuf.as_ptr(), rbuf.len())?;
    // fi_context2 storage for the one send and the one receive in flight.
    let mut ctx = [[0u64; 8]; 2];
    let sctx: *mut c_void = ctx[0].as_mut_ptr().cast();
    let rctx: *mut c_void = ctx[1].as_mut_ptr().cast();
    let mut cq = [sys::fi_cq_data_entry::default(); 16];
    let eps: Vec<&Endpoint> = [Some(&tx), rx.as_ref()].into_iter().flatten().collect();
    let mut polls = 0u64;
    let mut wait = |mut send: bool, mut recv: bool| -> R<()> {
        let deadline = Instant::now() + BOUND;
        while send || recv {
            polls += 1;
            if polls.is_multiple_of(1024) && Instant::now() > deadline {
                return Err(format!("the peer did not answer within {BOUND:?}").into());
            }
            for ep in &eps {
                let n = ep.poll(&mut cq)?;
                for e in &cq[..n] {
                    send &= e.op_context != sctx;
                    recv &= e.op_context != rctx;
                }
            }
        }
        Ok(())
    };
    let rptr = rbuf.as_mut_ptr();
    let post_recv = || -> R<()> {
        // SAFETY: `rbuf` and `ctx` outlive the endpoints' use of them: every receive is
        // waited for before the next is posted and before they are dropped.
        while !unsafe { rep.recv(rptr, size.max(1), rmr.desc(), rctx) }? {}
        Ok(())
    };
    let post_send = || -> R<()> {
        if inject {
            while !tx.inject(&sbuf[..size])? {}
        } else {
            // SAFETY: as for the receive: each send is waited for before the next.
            while !unsafe { tx.send(sbuf.as_ptr(), size, smr.desc(), sctx) }? {}
        }
        Ok(())
    };
    let mut start = Instant::now();
    for i in 0..=iters {
        // The first round trip sets up the provider's connections: untimed.
        if i == 1 {
            start = Instant::now();
        }
        if server {
            post_recv()?;
            wait(false, true)?;
            post_send()?;
            wait(!inject, false)?;
        } else {
            post_recv()?;
            post_send()?;
            wait(!inject, true)?;
        }
    }
    let elapsed = start.elapsed();
    if !server {
        report(mode, size, iters, elapsed, polls);
    }
    // Both sides are done before either closes.
    s.write_all(&[1])?;
    s.read_exact(&mut [0u8; 1])?;
    Ok(())
}

/// The same ping-pong through weft's Transport: one one-way connection each way.
fn weft(server: bool, addr: &str, iters: usize, size: usize) -> R<()> {
    let t = Transport::new(Config::from_env()?)?;
    eprintln!("backend {}", t.backend());
    let mut l = t.listen(0)?;
    let mut s = rendezvous(server, addr)?;
    send_blob(&mut s, &l.handle())?;
    let (tx, rx) = t.connect_and_accept(0, &recv_blob(&mut s)?, &mut l)?;
    let res = weft_transport::ping_pong(tx, rx, size, iters, !server, BOUND)?;
    if !server {
        report("weft", size, iters, res.elapsed, res.polls);
    }
    s.write_all(&[1])?;
    s.read_exact(&mut [0u8; 1])?;
    Ok(())
}
