//! The plugin's libfabric backend (`WEFT_BACKEND=ofi`) across namespace hosts: the real
//! `libnccl_net_weft.so`, dlopened by worker processes (this binary re-executed with
//! `--worker`) that run inside weft-netns hosts, as `cluster.rs` does for the TCP backend.
//!
//! What it proves, for every exported ABI version (ncclNet v8..v12):
//! * `tcp;ofi_rxm` between two namespace hosts: sizes 0..64 MiB (eager and RMA paths, random
//!   sizes), every receive buffer larger than the send (the actual size is reported, nothing
//!   is written past it), the send and receive buffers sub-ranges of one registered region (as
//!   NCCL's buffers are), 32 grouped receives in flight with tags choosing the buffer; by the
//!   interface byte counters, the bulk crosses `data0` and `mgmt0` stays silent after the
//!   handshake. That the backend really is ofi (no silent fallback to TCP) is shown by the
//!   listen handle, which carries data addresses only with the TCP backend, and by the
//!   handshake itself: an ofi listener refuses a sender of another backend or provider;
//! * `shm` between two processes of one host: the same suite, with neither `data0` nor `mgmt0`
//!   carrying the bulk (shared memory). `tests/conformance.rs` runs the TCP backend only, so
//!   this is the plugin's only shm coverage;
//! * faults, each an error within a bound, its WARN naming the peer's address and the
//!   interface: the sending process killed mid-transfer (the receiver fails), the receiving
//!   process killed (the sender fails), the receiver's data link `ip link set down` (both
//!   fail), the shm sender killed, and a listener sent garbage or a truncated HELLO on its
//!   management port (accept fails, and the listener still takes the next, good, sender);
//! * dead and frozen peers on `tcp;ofi_rxm` (ABI v8; `common::peers`, the scenarios of
//!   `cluster.rs`): frozen senders and receivers an error within the timeout plus a quarter,
//!   pausing ones never, killed peers and ring ranks an error and closed within 1 s.
//!
//! Needs root, iproute2 and libfabric with the `tcp` and `shm` providers (CI installs
//! libfabric1 and libfabric-bin); without namespaces or without libfabric it prints why and
//! passes without running. With libfabric installed, an unusable provider is a failure.

use std::ffi::{c_int, c_void};
use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nccl_net_weft::ffi::*;
use weft_netns::{Cluster, ClusterSpec};
use weft_transport::proto::{Frame, ListenHandle};

#[macro_use]
mod common;
use common::*;

const TCP: &str = "tcp;ofi_rxm";
const SHM: &str = "shm";

// ---------------------------------------------------------------------------------------------
// Worker side (inside a host namespace)
// ---------------------------------------------------------------------------------------------

/// Message sizes of the suite: the edges of the eager limit (8 KiB) and of chunking, 64 MiB,
/// and ten pseudo-random sizes below 3 MiB.
fn suite_sizes() -> Vec<usize> {
    let mut v = vec![
        0,
        1,
        8,
        127,
        8191,
        8192,
        8193,
        65536,
        65537,
        (1 << 20) + 5,
        8 << 20,
        64 << 20,
    ];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..10 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push((x % (3 << 20)) as usize);
    }
    v
}

/// Bytes beyond the message in receive buffer `i` (receives are larger than sends).
fn extra(i: usize) -> usize {
    if i.is_multiple_of(2) { 1 } else { 4099 }
}

const SENTINEL: u8 = 0xee;
const IN_FLIGHT: usize = 32;

/// Payload of message `i`: `base[off(i)..off(i) + size]`, so that no message is generated.
fn off(i: usize) -> usize {
    (i * 37) % 251
}

/// Bytes that never repeat at a shift of a multiple of 8 (each 8-byte word differs), so a
/// chunk written at the wrong offset is found; built word by word (fast in debug builds).
fn base_pattern(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n.next_multiple_of(8)];
    for (w, c) in v.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(
            &(w as u64 + 1)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .to_le_bytes(),
        );
    }
    v.truncate(n);
    v
}

/// Size of message `i` of the in-flight phase (tag 20 for even `i`, tag 10 for odd).
fn flight_size(i: usize) -> usize {
    if i.is_multiple_of(3) {
        100 + i
    } else {
        1000 + i * 7919
    }
}

fn max_flight() -> usize {
    (0..2 * IN_FLIGHT).map(flight_size).max().unwrap_or(0)
}

/// Connects (sender: reads `C <handle>`) or listens and accepts (receiver: prints `H <handle>`).
fn open_conn(net: &Net, ctx: *mut c_void, send: bool, stdin: &mut Lines) -> R<*mut c_void> {
    let deadline = Instant::now() + Duration::from_secs(30);
    if send {
        let l = stdin.next()?;
        let mut h = unhex(l.strip_prefix("C ").ok_or("expected C")?)?;
        loop {
            if let Some(c) = net.connect_on(ctx, 0, &mut h)? {
                return Ok(c);
            }
            if Instant::now() > deadline {
                return Err("connect stuck".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let mut h = [0u8; 128];
    let lc = net.listen_on(ctx, 0, &mut h)?;
    println!("H {}", hex(&h));
    loop {
        if let Some(c) = net.accept(lc)? {
            net.close_listen(lc)?;
            return Ok(c);
        }
        if Instant::now() > deadline {
            return Err("accept stuck".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Polls `req` to completion within `deadline` (the plugin bounds its own waits; this bound
/// only turns a plugin hang into a failure).
fn wait_req(net: &Net, req: *mut c_void, deadline: Instant, what: &str) -> R<[c_int; 8]> {
    loop {
        if let Some(s) = net.test(req)? {
            return Ok(s);
        }
        if Instant::now() > deadline {
            return Err(format!("{what} did not complete"));
        }
    }
}

/// The whole suite on one connection: every size of [`suite_sizes`] one at a time, then
/// [`IN_FLIGHT`] grouped receives of two buffers (tags 10 and 20) against 64 sends in flight.
fn worker_suite(net: &Net, ctx: *mut c_void, send: bool, stdin: &mut Lines) -> R {
    let c = open_conn(net, ctx, send, stdin)?;
    println!("CONNECTED");
    if stdin.next()? != "GO" {
        return Err("expected GO".into());
    }
    let sizes = suite_sizes();
    let max = sizes.iter().copied().max().unwrap_or(0);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(90);
    // One registered region per side; messages are sub-ranges of it, as NCCL's are.
    let mut region = if send {
        base_pattern(max + 256)
    } else {
        vec![SENTINEL; max + 4099]
    };
    let mh = net.reg(c, &mut region, NCCL_PTR_HOST)?;
    let want = if send {
        Vec::new()
    } else {
        base_pattern(max + 256)
    };
    for (i, &size) in sizes.iter().enumerate() {
        let tag = i as c_int;
        if send {
            let msg = &region[off(i)..off(i) + size];
            let req = loop {
                if let Some(q) = net.isend(c, msg, tag, mh)? {
                    break q;
                }
                if Instant::now() > deadline {
                    return Err(format!("isend {i} refused for too long"));
                }
            };
            let s = wait_req(net, req, deadline, &format!("send {i} ({size} bytes)"))?;
            if s[0] as usize != size {
                return Err(format!("send {i}: test reported {} of {size} bytes", s[0]));
            }
        } else {
            let len = size + extra(i);
            region[..len].fill(SENTINEL);
            let req = net
                .irecv(c, &mut [&mut region[..len]], &[tag], &[mh])?
                .ok_or("irecv refused")?;
            let s = wait_req(net, req, deadline, &format!("receive {i} ({size} bytes)"))?;
            if s[0] as usize != size {
                return Err(format!("receive {i}: size {} reported, {size} sent", s[0]));
            }
            if region[..size] != want[off(i)..off(i) + size] {
                return Err(format!("receive {i}: payload of {size} bytes corrupted"));
            }
            if region[size..len].iter().any(|b| *b != SENTINEL) {
                return Err(format!(
                    "receive {i}: bytes written past the {size}-byte message"
                ));
            }
        }
    }
    if std::env::var_os("WEFT_TEST_VERBOSE").is_some() {
        eprintln!("suite: sizes phase done after {:.2?}", t0.elapsed());
    }
    println!("SIZES");
    // In flight: 32 grouped receives, 64 sends, tags choosing the buffer.
    let n = 2 * IN_FLIGHT;
    if send {
        let src = base_pattern(max_flight() + 256);
        let mut reqs = Vec::new();
        for i in 0..n {
            let tag = if i % 2 == 0 { 20 } else { 10 };
            let msg = &src[off(i)..off(i) + flight_size(i)];
            let q = loop {
                if let Some(q) = net.isend(c, msg, tag, std::ptr::null_mut())? {
                    break q;
                }
                // Not ready: progress the ones in flight, as NCCL's proxy does.
                for r in &reqs {
                    let _ = net.test(*r)?;
                }
                if Instant::now() > deadline {
                    return Err(format!("isend {i} of {n} refused for too long"));
                }
            };
            reqs.push(q);
        }
        let mut done = vec![false; n];
        while done.iter().any(|d| !d) {
            if Instant::now() > deadline {
                return Err("sends in flight did not complete".into());
            }
            for (i, r) in reqs.iter().enumerate() {
                if !done[i] {
                    done[i] = net.test(*r)?.is_some();
                }
            }
        }
    } else {
        let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 600_000]).collect();
        let mut reqs = Vec::new();
        for pair in bufs.chunks_mut(2) {
            let (a, b) = pair.split_at_mut(1);
            let r = net.irecv(
                c,
                &mut [&mut a[0][..], &mut b[0][..]],
                &[10, 20],
                &[std::ptr::null_mut(); 2],
            )?;
            reqs.push(r.ok_or(format!("irecv refused one of {IN_FLIGHT}"))?);
        }
        let mut got = vec![None; reqs.len()];
        while got.iter().any(Option::is_none) {
            if Instant::now() > deadline {
                return Err("receives in flight did not complete".into());
            }
            for (i, r) in reqs.iter().enumerate() {
                if got[i].is_none() {
                    got[i] = net.test(*r)?;
                }
            }
        }
        let src = base_pattern(max_flight() + 256);
        for (k, g) in got.iter().enumerate() {
            let g = g.unwrap_or_default();
            // Buffer 0 of receive k has tag 10: the odd send 2k+1; buffer 1 (tag 20): 2k.
            for (b, i) in [(0, 2 * k + 1), (1, 2 * k)] {
                let size = flight_size(i);
                if g[b] as usize != size {
                    return Err(format!("grouped receive {k}: sizes {:?}", &g[..2]));
                }
                if bufs[2 * k + b][..size] != src[off(i)..off(i) + size] {
                    return Err(format!(
                        "grouped receive {k}: payload of send {i} not in the buffer of its tag"
                    ));
                }
            }
        }
    }
    if std::env::var_os("WEFT_TEST_VERBOSE").is_some() {
        eprintln!("suite: in-flight phase done after {:.2?}", t0.elapsed());
    }
    net.dereg(c, mh)?;
    if send {
        net.close_send(c)?;
    } else {
        net.close_recv(c)?;
    }
    Ok(())
}

/// Messages of `size` bytes one after another until the parent kills us or one fails:
/// prints `SENT i` / `GOT i`.
fn worker_stream(net: &Net, ctx: *mut c_void, send: bool, size: usize, stdin: &mut Lines) -> R {
    let c = open_conn(net, ctx, send, stdin)?;
    println!("CONNECTED");
    let mut buf = base_pattern(size);
    let want = buf.clone();
    for i in 0.. {
        let req = loop {
            let q = if send {
                net.isend(c, &buf, 1, std::ptr::null_mut())?
            } else {
                net.irecv(c, &mut [&mut buf[..]], &[1], &[std::ptr::null_mut()])?
            };
            if let Some(q) = q {
                break q;
            }
        };
        // No deadline of our own: the plugin must bound every wait (the parent bounds us).
        let sizes = loop {
            if let Some(s) = net.test(req)? {
                break s;
            }
        };
        if send {
            println!("SENT {i}");
        } else {
            if sizes[0] as usize != size || buf != want {
                return Err(format!("message {i} wrong"));
            }
            buf.fill(0);
            println!("GOT {i}");
        }
    }
    Ok(())
}

/// A listener that reports every failed accept (`AERR <ms> || WARN: ...`) and every stray
/// connection it discarded (`ASTRAY <ms> || INFO: ...`) and carries on, until a good sender
/// connects; then receives one message of `size` bytes.
fn worker_listen(net: &Net, ctx: *mut c_void, size: usize) -> R {
    let mut h = [0u8; 128];
    let lc = net.listen_on(ctx, 0, &mut h)?;
    println!("H {}", hex(&h));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut since = Instant::now();
    let rc = loop {
        let mark = log_mark();
        let got = net.accept(lc);
        for i in infos_since(mark) {
            if i.contains("does not speak weft's protocol") {
                println!("ASTRAY {} || INFO: {i}", since.elapsed().as_millis());
                since = Instant::now();
            }
        }
        match got {
            Ok(Some(c)) => break c,
            Ok(None) => {}
            Err(e) => {
                let w = warns_since(mark).join(" | ");
                println!("AERR {} {e} || WARN: {w}", since.elapsed().as_millis());
                since = Instant::now();
            }
        }
        if Instant::now() > deadline {
            return Err("no good sender within 60 s".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    net.close_listen(lc)?;
    let mut buf = vec![0u8; size];
    let req = net
        .irecv(rc, &mut [&mut buf[..]], &[1], &[std::ptr::null_mut()])?
        .ok_or("irecv refused")?;
    let s = wait_req(net, req, deadline, "the good sender's message")?;
    if s[0] as usize != size || buf != base_pattern(size) {
        return Err("the good sender's message is wrong".into());
    }
    net.close_recv(rc)
}

fn worker(args: &[String]) -> R {
    let lib: &'static libloading::Library = Box::leak(Box::new(
        // SAFETY: loading our own plugin; its initialisers have no preconditions.
        unsafe { libloading::Library::new(so_path()) }.map_err(|e| e.to_string())?,
    ));
    let v: u32 = args.first().and_then(|v| v.parse().ok()).ok_or("version")?;
    let net = Net::load(lib, v);
    let ctx = net.init()?;
    let stdin: &'static std::io::Stdin = Box::leak(Box::new(std::io::stdin()));
    let mut lines = Lines(stdin.lock().lines());
    let size = || -> R<usize> {
        args.get(2)
            .and_then(|s| s.parse().ok())
            .ok_or("size".into())
    };
    let mark = log_mark();
    let r = match args.get(1).map(String::as_str) {
        Some("suite-send") => worker_suite(&net, ctx, true, &mut lines),
        Some("suite-recv") => worker_suite(&net, ctx, false, &mut lines),
        Some("stream-send") => worker_stream(&net, ctx, true, size()?, &mut lines),
        Some("stream-recv") => worker_stream(&net, ctx, false, size()?, &mut lines),
        Some("listen") => worker_listen(&net, ctx, size()?),
        Some("peer") => peers::worker_peer(&net, ctx, &args[2..], &mut lines),
        other => Err(format!("unknown worker mode {other:?}")),
    };
    if let Err(e) = r {
        let w = warns_since(mark).join(" | ");
        println!("ERR {e} || WARN: {w}");
        std::process::exit(3);
    }
    let w = warns_since(mark);
    if args.get(1).is_some_and(|m| m.starts_with("suite")) && !w.is_empty() {
        println!("ERR completed with WARNs: {}", w.join(" | "));
        std::process::exit(3);
    }
    net.finalize(ctx)?;
    println!("DONE");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------------------------

/// A worker on the ofi backend (the callers' `env` comes after, so it may override).
fn spawn_ofi(c: &Cluster, host: usize, args: &[&str], env: &[(&str, &str)]) -> R<Worker> {
    let mut all = vec![("WEFT_BACKEND", "ofi")];
    all.extend_from_slice(env);
    Worker::spawn(c, host, args, &all)
}

fn cluster() -> R<Cluster> {
    Cluster::create(&ClusterSpec::new(2, 1)).map_err(|e| e.to_string())
}

/// The receiver's listen handle from its `H` line, checked to be an ofi handle: the TCP
/// backend puts the data listeners' addresses in it, the ofi backend only the management one.
fn ofi_handle(line: &str, mgmt: std::net::Ipv4Addr) -> R<(String, ListenHandle)> {
    let hexh = line.strip_prefix("H ").ok_or("expected H")?.to_string();
    let h = ListenHandle::decode(&unhex(&hexh)?).map_err(|e| e.to_string())?;
    if !h.data.is_empty() {
        return Err(format!(
            "the listen handle has data addresses {:?}: the plugin runs the TCP backend, not ofi",
            h.data
        ));
    }
    if h.mgmt.ip() != std::net::IpAddr::V4(mgmt) {
        return Err(format!("the handle's management address is {}", h.mgmt));
    }
    Ok((hexh, h))
}

/// Starts a connected sender (host `from`) / receiver (host `to`) pair of `mode` (`suite`, or
/// `stream` with `size`) of ABI version `v`.
fn start_pair(
    c: &Cluster,
    (from, to): (usize, usize),
    v: u32,
    mode: &str,
    size: usize,
    env: &[(&str, &str)],
) -> R<(Worker, Worker)> {
    let (vs, ss) = (v.to_string(), size.to_string());
    let (sm, rm) = (format!("{mode}-send"), format!("{mode}-recv"));
    let mut rx = spawn_ofi(c, to, &[&vs, &rm, &ss], env)?;
    let mut tx = spawn_ofi(c, from, &[&vs, &sm, &ss], env)?;
    let h = rx.expect("H ", Duration::from_secs(30))?;
    let (hexh, _) = ofi_handle(&h, c.host(to).mgmt_addr)?;
    tx.send(&format!("C {hexh}"))?;
    tx.expect("CONNECTED", Duration::from_secs(30))?;
    rx.expect("CONNECTED", Duration::from_secs(30))?;
    Ok((tx, rx))
}

/// Payload bytes of one suite, one way.
fn suite_payload() -> u64 {
    let a: usize = suite_sizes().iter().sum();
    let b: usize = (0..2 * IN_FLIGHT).map(flight_size).sum();
    (a + b) as u64
}

/// Most bytes `mgmt0` of one host may carry in the data phase of one connection: the side
/// channel's FIN exchange at the end (about 4 frames of 66 bytes), a delayed ACK of the
/// handshake, and its keepalive probes (one exchange per timeout / 3 of idle, 10 s by default,
/// about 132 bytes each). A single message header on mgmt0 per message would exceed it.
const MGMT_DATA_PHASE_BOUND: u64 = 2048;

/// The suite for every ABI version between two hosts over `tcp;ofi_rxm`, bulk on data0.
fn t_tcp_suite_every_version() -> R {
    let c = cluster()?;
    let env = [("WEFT_OFI_PROVIDER", TCP), ("WEFT_TIMEOUT_MS", "30000")];
    let payload = suite_payload();
    for v in 8..=12u32 {
        let (mut tx, mut rx) = start_pair(&c, (0, 1), v, "suite", 0, &env)?;
        let read = || -> R<Vec<u64>> {
            [(0, "mgmt0"), (1, "mgmt0"), (0, "data0"), (1, "data0")]
                .iter()
                .map(|(h, i)| counters(&c, *h, i))
                .collect()
        };
        let before = read()?;
        tx.send("GO")?;
        rx.send("GO")?;
        let t0 = Instant::now();
        rx.expect("DONE", Duration::from_secs(120))
            .map_err(|e| format!("v{v}: {e}"))?;
        tx.expect("DONE", Duration::from_secs(30))
            .map_err(|e| format!("v{v}: {e}"))?;
        let d: Vec<u64> = read()?.iter().zip(&before).map(|(a, b)| a - b).collect();
        if std::env::var_os("WEFT_TEST_VERBOSE").is_some() {
            eprintln!(
                "v{v} tcp;ofi_rxm: {payload} payload bytes in {:.2?}; mgmt0 {} / {} bytes, data0 {} / {}",
                t0.elapsed(),
                d[0],
                d[1],
                d[2],
                d[3]
            );
        }
        if d[2] < payload || d[3] < payload {
            return Err(format!(
                "v{v}: data0 carried {} / {} bytes < {payload} of payload",
                d[2], d[3]
            ));
        }
        if d[0] > MGMT_DATA_PHASE_BOUND || d[1] > MGMT_DATA_PHASE_BOUND {
            return Err(format!(
                "v{v}: mgmt0 carried {} / {} bytes during the data phase (bound \
                 {MGMT_DATA_PHASE_BOUND}): data-phase traffic on the management network",
                d[0], d[1]
            ));
        }
    }
    Ok(())
}

/// The suite for every ABI version between two processes of one host over `shm`: neither
/// network carries the bulk.
fn t_shm_suite_every_version() -> R {
    let c = cluster()?;
    let env = [("WEFT_OFI_PROVIDER", SHM), ("WEFT_TIMEOUT_MS", "30000")];
    let payload = suite_payload();
    for v in 8..=12u32 {
        let (mut tx, mut rx) = start_pair(&c, (0, 0), v, "suite", 0, &env)?;
        let before = [counters(&c, 0, "mgmt0")?, counters(&c, 0, "data0")?];
        tx.send("GO")?;
        rx.send("GO")?;
        rx.expect("DONE", Duration::from_secs(120))
            .map_err(|e| format!("v{v}: {e}"))?;
        tx.expect("DONE", Duration::from_secs(30))
            .map_err(|e| format!("v{v}: {e}"))?;
        let d = [
            counters(&c, 0, "mgmt0")? - before[0],
            counters(&c, 0, "data0")? - before[1],
        ];
        if d[0] + d[1] > payload / 1000 {
            return Err(format!(
                "v{v} shm: mgmt0 {} and data0 {} bytes for {payload} of payload: not shared memory",
                d[0], d[1]
            ));
        }
    }
    Ok(())
}

const TIMEOUT_MS: u64 = 2000;
/// "Within the timeout" on a loaded 2-core machine: the timeout, the keepalive granularity
/// (1 s), and scheduling noise.
const BOUND: Duration = Duration::from_millis(TIMEOUT_MS + 4000);

fn fault_env(provider: &'static str) -> [(&'static str, &'static str); 2] {
    [("WEFT_OFI_PROVIDER", provider), ("WEFT_TIMEOUT_MS", "2000")]
}

/// Every address of host `h`.
fn addrs(c: &Cluster, h: usize) -> Vec<String> {
    let host = c.host(h);
    std::iter::once(host.mgmt_addr)
        .chain(host.data_ifs.iter().map(|d| d.1))
        .map(|a| a.to_string())
        .collect()
}

/// Waits for the worker's `ERR` line within [`BOUND`] of `t0` and checks its WARN names one of
/// `peers` (as `addr:port`), one of `ifaces` (as `via <iface>`) and `what`.
fn expect_err(
    w: &mut Worker,
    t0: Instant,
    peers: &[String],
    ifaces: &[&str],
    what: &str,
) -> R<String> {
    let deadline = t0 + BOUND + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match w.lines.recv_timeout(left) {
            Ok(l) if l.starts_with("ERR") => {
                let took = t0.elapsed();
                if took > BOUND {
                    return Err(format!(
                        "host {} failed after {took:?} > {BOUND:?}: {l}",
                        w.host
                    ));
                }
                if std::env::var_os("WEFT_TEST_VERBOSE").is_some() {
                    eprintln!("host {} failed after {took:?}: {l}", w.host);
                }
                let warn = l.split_once("WARN:").map_or("", |x| x.1);
                if !peers.iter().any(|p| warn.contains(&format!("{p}:")))
                    || !ifaces.iter().any(|i| warn.contains(&format!("via {i}")))
                    || !warn.contains(what)
                {
                    return Err(format!(
                        "host {}: WARN does not name a peer of {peers:?}, an interface of \
                         {ifaces:?} and {what:?}: {l}",
                        w.host
                    ));
                }
                return Ok(l);
            }
            Ok(l) if l.starts_with("DONE") => {
                return Err(format!("host {} completed despite the fault", w.host));
            }
            Ok(_) => {}
            Err(_) => {
                return Err(format!(
                    "host {}: no error within {:?} of the fault: a hang",
                    w.host,
                    BOUND + Duration::from_secs(20)
                ));
            }
        }
    }
}

/// SIGKILL of the sending process mid-transfer: the receiver fails (the side channel's EOF).
fn t_fault_sender_killed() -> R {
    let c = cluster()?;
    let (mut tx, mut rx) = start_pair(&c, (0, 1), 11, "stream", 8 << 20, &fault_env(TCP))?;
    rx.expect("GOT 2", Duration::from_secs(30))?;
    tx.child.kill().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let _ = tx.child.wait();
    expect_err(
        &mut rx,
        t0,
        &addrs(&c, 0),
        &["mgmt0", "data0"],
        "tcp;ofi_rxm",
    )?;
    Ok(())
}

/// SIGKILL of the receiving process mid-transfer: the sender fails.
fn t_fault_receiver_killed() -> R {
    let c = cluster()?;
    let (mut tx, mut rx) = start_pair(&c, (0, 1), 8, "stream", 8 << 20, &fault_env(TCP))?;
    rx.expect("GOT 2", Duration::from_secs(30))?;
    rx.child.kill().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let _ = rx.child.wait();
    expect_err(
        &mut tx,
        t0,
        &addrs(&c, 1),
        &["mgmt0", "data0"],
        "tcp;ofi_rxm",
    )?;
    Ok(())
}

/// `ip link set data0 down` on the receiver's host mid-transfer, the management network up:
/// both sides fail within the timeout (nothing moves on the data path; one side gives up and
/// the other hears it over the management side channel, or gives up itself).
fn t_fault_receiver_data_link_down() -> R {
    let c = cluster()?;
    let (mut tx, mut rx) = start_pair(&c, (0, 1), 12, "stream", 8 << 20, &fault_env(TCP))?;
    rx.expect("GOT 2", Duration::from_secs(30))?;
    c.set_link(1, "data0", false).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let r = expect_err(
        &mut rx,
        t0,
        &addrs(&c, 0),
        &["mgmt0", "data0"],
        "tcp;ofi_rxm",
    );
    let s = expect_err(
        &mut tx,
        t0,
        &addrs(&c, 1),
        &["mgmt0", "data0"],
        "tcp;ofi_rxm",
    );
    match (r, s) {
        (Ok(_), Ok(_)) => Ok(()),
        (r, s) => Err(format!("receiver: {r:?}; sender: {s:?}")),
    }
}

/// SIGKILL of an shm sender mid-transfer (two processes of one host): the receiver fails.
fn t_fault_shm_sender_killed() -> R {
    let c = cluster()?;
    let (mut tx, mut rx) = start_pair(&c, (0, 0), 10, "stream", 8 << 20, &fault_env(SHM))?;
    rx.expect("GOT 2", Duration::from_secs(30))?;
    tx.child.kill().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let _ = tx.child.wait();
    expect_err(&mut rx, t0, &addrs(&c, 0), &["mgmt0"], "shm")?;
    Ok(())
}

/// Bytes that are not the weft protocol, then a HELLO cut short and silence, each sent from
/// host 0 to the listener's management port: each is discarded within its bound (the garbage
/// at once, the silent HELLO after the timeout) with an INFO line naming host 0's address and
/// mgmt0, and no accept fails; the listener then accepts a good sender (v9), and its message
/// arrives.
fn t_malformed_handshake() -> R {
    let c = cluster()?;
    let env = fault_env(TCP);
    let size = 3 << 20;
    let mut rx = spawn_ofi(&c, 1, &["9", "listen", &size.to_string()], &env)?;
    let line = rx.expect("H ", Duration::from_secs(30))?;
    let (hexh, h) = ofi_handle(&line, c.host(1).mgmt_addr)?;
    let me = c.host(0).mgmt_addr.to_string();
    let connect = |addr: SocketAddr| -> R<TcpStream> {
        c.in_host(0, || {
            TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
    };
    let check = |l: &str, max: Duration, what: &str| -> R {
        let ms: u64 = l
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or(format!("bad line {l:?}"))?;
        let info = l.split_once("INFO:").map_or("", |x| x.1);
        if !info.contains(&format!("{me}:")) || !info.contains("via mgmt0") || !info.contains(what)
        {
            return Err(format!(
                "the INFO line does not name the peer {me}, mgmt0 and {what:?}: {l}"
            ));
        }
        if Duration::from_millis(ms) > max {
            return Err(format!("accept failed after {ms} ms > {max:?}: {l}"));
        }
        Ok(())
    };
    // Garbage: an HTTP request.
    let mut s = connect(h.mgmt)?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: weft\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let l = rx.expect("ASTRAY", BOUND)?;
    check(&l, Duration::from_secs(2), "accept")?;
    drop(s);
    // A valid HELLO cut short, then silence: the handshake times out.
    let mut hello = Vec::new();
    Frame::Hello {
        nonce: h.nonce,
        conn_id: 1,
        nstreams: 0,
    }
    .encode(&mut hello);
    let mut s = connect(h.mgmt)?;
    s.write_all(&hello[..hello.len() / 2])
        .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let l = rx.expect("ASTRAY", BOUND + Duration::from_secs(10))?;
    check(&l, BOUND, "timed out")?;
    if t0.elapsed() > BOUND {
        return Err(format!("silent HELLO failed after {:?}", t0.elapsed()));
    }
    drop(s);
    // The listener still works.
    let mut tx = spawn_ofi(&c, 0, &["9", "stream-send", &size.to_string()], &env)?;
    tx.send(&format!("C {hexh}"))?;
    rx.expect("DONE", Duration::from_secs(60))?;
    Ok(())
}

/// Whether libfabric with `provider` works here: `Ok(false)` (skip) when libfabric is not
/// installed, an error when it is but the provider is unusable.
fn ofi_usable(provider: &str, domain: Option<&str>) -> R<bool> {
    let t = weft_transport::Transport::new(weft_transport::Config {
        mgmt_ifname: Some("=lo".parse().map_err(|e| format!("{e:?}"))?),
        backend: weft_transport::BackendKind::Ofi,
        ofi_provider: Some(provider.into()),
        ofi_domain: domain.map(str::to_string),
        ..weft_transport::Config::default()
    })
    .map_err(|e| e.to_string())?;
    if t.is_ofi() {
        return Ok(true);
    }
    let note = t.backend_note().unwrap_or_default().to_string();
    let installed = [
        "/usr/lib/x86_64-linux-gnu/libfabric.so.1",
        "/usr/lib/aarch64-linux-gnu/libfabric.so.1",
        "/usr/lib64/libfabric.so.1",
        "/usr/lib/libfabric.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists());
    if installed {
        return Err(format!(
            "libfabric is installed but provider {provider} is unusable: {note}"
        ));
    }
    weft_netns::require::skip("the ofi cluster tests", &note);
    Ok(false)
}

/// The timeout of the dead- and frozen-peer tests (short, to keep the suite's time down).
const PEER_T: Duration = Duration::from_millis(1000);

/// Runs `scenario` among `hosts` hosts whose workers use the ofi backend on `tcp;ofi_rxm`
/// (ABI version 8, as the measurements) with [`PEER_T`].
fn peer_scenario(hosts: usize, scenario: impl FnOnce(&peers::Spawn<'_>) -> R) -> R {
    let c = Cluster::create(&ClusterSpec::new(hosts, 1)).map_err(|e| e.to_string())?;
    let ms = PEER_T.as_millis().to_string();
    let env = [("WEFT_OFI_PROVIDER", TCP), ("WEFT_TIMEOUT_MS", ms.as_str())];
    scenario(&|h: usize, args: &[&str]| {
        let mut all = vec!["8"];
        all.extend_from_slice(args);
        spawn_ofi(&c, h, &all, &env)
    })
}

/// A sender stopped (SIGSTOP) right after a message completed, its receiver's next receive
/// posted: POSTED goes unanswered, the receiver fails within the timeout plus a quarter.
fn t_frozen_sender_after_a_message() -> R {
    peer_scenario(2, |s| peers::frozen_sender_after_a_message(s, PEER_T))
}

/// A receiver stopped while its sender keeps sending 16 MiB messages (which wait for a CTS):
/// the sender's PROBE goes unanswered, it fails within the timeout plus a quarter.
fn t_frozen_receiver_while_sending() -> R {
    peer_scenario(2, |s| peers::frozen_receiver_while_sending(s, PEER_T))
}

/// A sender or receiver that pauses 2.5 timeouts without calling in is not an error.
fn t_slow_peers_are_not_errors() -> R {
    peer_scenario(2, |s| peers::slow_peers_are_not_errors(s, PEER_T))
}

/// A rank of a three-host ring killed: both survivors fail and have closed within 1 s.
fn t_killed_rank_of_a_ring_within_1s() -> R {
    peer_scenario(3, |s| {
        peers::killed_rank_of_a_ring_within(s, Duration::from_secs(1))
    })
}

/// A peer killed mid-traffic both ways: the survivor fails and has closed within 1 s.
fn t_killed_peer_within_1s() -> R {
    peer_scenario(2, |s| peers::killed_peer_within(s, Duration::from_secs(1)))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "--worker") {
        if let Err(e) = worker(&args[2..]) {
            println!("ERR {e}");
            std::process::exit(2);
        }
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    if let Err(why) = weft_netns::available() {
        weft_netns::require::skip("the ofi namespace cluster tests", &why);
        println!("\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
        return;
    }
    match ofi_usable(TCP, Some("lo")).and_then(|a| Ok(a && ofi_usable(SHM, None)?)) {
        Ok(true) => {}
        Ok(false) => {
            println!(
                "\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out"
            );
            return;
        }
        Err(e) => {
            println!("test ofi_providers_usable ... FAILED: {e}");
            std::process::exit(1);
        }
    }
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-')).cloned();
    type Case = (&'static str, fn() -> R);
    let tests: &[Case] = &[
        ("tcp_suite_every_version", t_tcp_suite_every_version),
        ("shm_suite_every_version", t_shm_suite_every_version),
        ("fault_sender_killed", t_fault_sender_killed),
        ("fault_receiver_killed", t_fault_receiver_killed),
        (
            "fault_receiver_data_link_down",
            t_fault_receiver_data_link_down,
        ),
        ("fault_shm_sender_killed", t_fault_shm_sender_killed),
        (
            "frozen_sender_after_a_message",
            t_frozen_sender_after_a_message,
        ),
        (
            "frozen_receiver_while_sending",
            t_frozen_receiver_while_sending,
        ),
        ("slow_peers_are_not_errors", t_slow_peers_are_not_errors),
        ("killed_peer_within_1s", t_killed_peer_within_1s),
        (
            "killed_rank_of_a_ring_within_1s",
            t_killed_rank_of_a_ring_within_1s,
        ),
        ("malformed_handshake", t_malformed_handshake),
    ];
    let (mut passed, mut failed, mut filtered) = (0, 0, 0);
    for (name, f) in tests {
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            filtered += 1;
            continue;
        }
        let start = Instant::now();
        match std::panic::catch_unwind(f).unwrap_or_else(|_| Err("panicked".into())) {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.2?})", start.elapsed());
            }
            Err(e) => {
                failed += 1;
                println!("test {name} ... FAILED ({:.2?}): {e}", start.elapsed());
            }
        }
    }
    let status = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {status}. {passed} passed; {failed} failed; 0 ignored; 0 measured; {filtered} filtered out"
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
