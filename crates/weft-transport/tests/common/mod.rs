//! What the transport tests (`tcp.rs`, `ofi.rs`, `ofi_progress.rs`) share: the contract suite
//! that every backend runs ([`contract`]), the libfabric configuration they start from, the
//! rule that a missing libfabric skips a test while an installed one that cannot run the
//! configured provider fails it, and the scenarios the contract and the backends' own tests
//! are made of.

#[allow(dead_code)] // not every test binary that shares this module instantiates the suite
pub mod contract;

use std::time::Duration;

use weft_transport::{BackendKind, Config, Transport};

/// The ofi backend on `provider` (and `domain`, unless empty) over loopback, 20 s bounds.
pub fn ofi_cfg(provider: &str, domain: &str) -> Config {
    Config {
        mgmt_ifname: Some("=lo".parse().expect("a valid interface spec")),
        timeout: Duration::from_secs(20),
        accept_timeout: Duration::from_secs(20),
        nthreads: 0,
        nsocks_per_thread: 1,
        backend: BackendKind::Ofi,
        ofi_provider: Some(provider.into()),
        ofi_domain: (!domain.is_empty()).then(|| domain.to_string()),
        ..Config::default()
    }
}

/// The transport of `c`, or None when libfabric is not installed (the test is then skipped,
/// and says so). Panics, naming `what`, when libfabric is installed but `c` cannot use it.
pub fn ofi_transport(c: Config, what: &str) -> Option<Transport> {
    let t = Transport::new(c).expect("a transport");
    if !t.is_ofi() {
        let note = t.backend_note().unwrap_or_default().to_string();
        assert!(
            !std::path::Path::new("/usr/lib/x86_64-linux-gnu/libfabric.so.1").exists(),
            "libfabric is installed but {what} is unusable: {note}"
        );
        weft_netns::require::skip(what, &note);
        return None;
    }
    Some(t)
}

/// `t` (libfabric) connected to itself, polling both ends in one thread, checked: both ends
/// on libfabric with the remote CQ data `t` asks for (4 bytes, else 8), both directions of
/// the process on one endpoint with 8 bytes, a 4-byte receiver on one of its own.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn ofi_pair_on(t: &Transport) -> (weft_transport::SendConn, weft_transport::RecvConn) {
    let mut l = t.listen(0).expect("listen");
    let (tx, rx) = t
        .connect_and_accept(0, &l.handle(), &mut l)
        .unwrap_or_else(|e| panic!("{}: connect to itself: {e}", t.backend()));
    assert!(tx.is_ofi() && rx.is_ofi());
    let want = if t.config().ofi_cq_data_bytes == Some(4) {
        4
    } else {
        8
    };
    assert_eq!(tx.cq_data_bytes(), want, "sender's remote CQ data");
    assert_eq!(rx.cq_data_bytes(), want, "receiver's remote CQ data");
    if want == 8 {
        assert!(
            tx.ofi_endpoint_users() >= Some(2),
            "sender's endpoint shared"
        );
        assert!(
            rx.ofi_endpoint_users() >= Some(2),
            "receiver's endpoint shared"
        );
    } else {
        assert_eq!(
            rx.ofi_endpoint_users(),
            Some(1),
            "4-byte receiver's own endpoint"
        );
    }
    (tx, rx)
}

/// What NCCL's peers cannot rule out on a listening port while a communicator is set up: for
/// `rounds` listeners of `t`, each TCP port of the handle gets 1 KiB of garbage, a bare connect
/// and close, an HTTP health probe and a half-open connection (connects, never writes), then
/// a real connection is made. The real one comes up within its bound, each stray one is
/// discarded and reported (naming its peer) by `take_discarded`, and nothing else fails.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn strays_do_not_fail_a_real_connect(t: &Transport, rounds: usize) {
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::Instant;
    for round in 0..rounds {
        let mut l = t.listen(0).expect("listen");
        let info = l.handle_info().clone();
        let ports: Vec<_> = std::iter::once(info.mgmt)
            .chain(info.data.clone())
            .collect();
        let mut strays = Vec::new();
        let mut half_open = Vec::new();
        for p in &ports {
            let mut g = TcpStream::connect(p).expect("connect");
            g.write_all(&[0xa5; 1024]).expect("garbage");
            strays.push(g.local_addr().expect("addr"));
            let c = TcpStream::connect(p).expect("connect");
            strays.push(c.local_addr().expect("addr"));
            drop(c);
            let mut h = TcpStream::connect(p).expect("connect");
            h.write_all(b"GET /health HTTP/1.0\r\n\r\n").expect("probe");
            strays.push(h.local_addr().expect("addr"));
            half_open.push(TcpStream::connect(p).expect("connect"));
            drop((g, h));
        }
        let start = Instant::now();
        let (mut tx, mut rx) = t
            .connect_and_accept(0, &l.handle(), &mut l)
            .unwrap_or_else(|e| panic!("round {round}: the real connect failed: {e}"));
        assert!(
            start.elapsed() < t.config().timeout,
            "round {round}: {:?}",
            start.elapsed()
        );
        tx.send(b"real", 1).expect("send");
        let mut buf = [0u8; 4];
        assert_eq!(rx.recv(&mut buf, 1).expect("recv"), 4);
        assert_eq!(&buf, b"real");
        // Every stray that wrote or closed is discarded by now or soon (the half-open ones
        // when they time out, not waited for here); each is named.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut named = Vec::new();
        while named.len() < strays.len() && Instant::now() < deadline {
            assert!(l.accept().expect("accept after strays").is_none());
            for e in l.take_discarded() {
                let text = e.to_string();
                let who = strays.iter().find(|a| text.contains(&a.to_string()));
                let who = who.unwrap_or_else(|| panic!("round {round}: {text} names no stray"));
                named.push(*who);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        for s in &strays {
            assert!(
                named.contains(s),
                "round {round}: stray {s} not reported: {named:?}"
            );
        }
        drop(half_open);
    }
}

/// Sent means delivered: `rounds` times, a separate sender process (the `weft-send-and-exit`
/// binary of this crate, configured by `env`) sends `count` messages of `size` bytes to a listener of `t`,
/// closes and exits as soon as all are reported done; every message must arrive intact.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn sender_exits_right_after_completion(
    t: &Transport,
    env: &[(&str, &str)],
    rounds: usize,
    count: usize,
    size: usize,
) {
    use std::time::Instant;
    let example = env!("CARGO_BIN_EXE_weft-send-and-exit");
    for round in 0..rounds {
        let mut l = t.listen(0).expect("listen");
        let hex: String = l.handle().iter().map(|b| format!("{b:02x}")).collect();
        let mut child = std::process::Command::new(example)
            .args([hex, count.to_string(), size.to_string()])
            .envs(env.iter().copied())
            .spawn()
            .expect("spawn send_and_exit");
        let mut rx = l
            .wait()
            .unwrap_or_else(|e| panic!("round {round}: accept: {e}"));
        let mut bufs: Vec<Vec<u8>> = (0..count).map(|_| vec![0xffu8; size]).collect();
        let mut ids = Vec::new();
        for (k, b) in bufs.iter_mut().enumerate() {
            let rb = weft_transport::RecvBuf {
                ptr: b.as_mut_ptr(),
                len: b.len(),
                tag: k as i32,
            };
            // SAFETY: `bufs` outlives the requests, tested to completion (or failure) below.
            let id = unsafe { rx.irecv(&[rb]) }
                .unwrap_or_else(|e| panic!("round {round}: irecv {k}: {e}"))
                .expect("a free request slot");
            ids.push(Some(id));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while ids.iter().any(Option::is_some) {
            assert!(Instant::now() < deadline, "round {round}: receives stuck");
            for (k, id) in ids.iter_mut().enumerate() {
                if let Some(i) = *id {
                    match rx.test(i) {
                        Ok(Some(c)) => {
                            assert_eq!(c.sizes(), &[size], "round {round} message {k}");
                            *id = None;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            let _ = child.wait();
                            panic!("round {round}: message {k} of {count} lost: {e}")
                        }
                    }
                }
            }
        }
        for (k, b) in bufs.iter().enumerate() {
            assert!(
                b.iter().all(|x| *x == k as u8),
                "round {round} message {k} differs"
            );
        }
        let st = child.wait().expect("wait");
        assert!(st.success(), "round {round}: sender {st}");
        // The sender's process is gone (its sockets closed, reset by what we sent since):
        // closing waits for nothing it could still deliver.
        let t0 = Instant::now();
        drop(rx);
        let took = t0.elapsed();
        assert!(
            took < CLOSE_AFTER_PEER_GONE,
            "round {round}: closing after the sender exited took {took:?}"
        );
    }
}

/// Longest a connection's close may take once its peer's process is gone (a killed peer is
/// an error within 1 s, and the close after it is part of that).
#[allow(dead_code)] // not every test binary that shares this module uses it
pub const CLOSE_AFTER_PEER_GONE: Duration = Duration::from_millis(700);

/// A ring of `n` rank processes (the `weft-ring-rank` binary of this crate, configured by
/// `env`): each connects to the next while accepting from the previous one, then passes
/// `rounds` messages of up to `max` bytes around the ring (every rank sending and receiving at
/// once, checked on arrival), closes and exits. Every rank must report `OK` within 60 s.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn ring(n: usize, env: &[(&str, &str)], rounds: usize, max: usize) {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Command, Stdio};
    use std::time::Instant;
    let exe = env!("CARGO_BIN_EXE_weft-ring-rank");
    let mut kids = Vec::new();
    let mut outs = Vec::new();
    let mut handles = Vec::new();
    for rank in 0..n {
        let mut c = Command::new(exe)
            .args([
                rank.to_string(),
                n.to_string(),
                rounds.to_string(),
                max.to_string(),
            ])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn weft-ring-rank");
        let mut out = BufReader::new(c.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("rank's handle");
        let hex = line
            .trim()
            .strip_prefix("HANDLE ")
            .unwrap_or_else(|| panic!("ring of {n}: rank {rank} printed {line:?}"))
            .to_string();
        handles.push(hex);
        outs.push(out);
        kids.push(c);
    }
    for (rank, c) in kids.iter_mut().enumerate() {
        let mut stdin = c.stdin.take().expect("stdin");
        writeln!(stdin, "{}", handles[(rank + 1) % n]).expect("next handle");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut fault = None;
    for rank in 0..n {
        let st = loop {
            if let Some(st) = kids[rank].try_wait().expect("wait") {
                break Some(st);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut rest = String::new();
        if st.is_some() {
            let _ = outs[rank].read_to_string(&mut rest);
        }
        match st {
            Some(st) if st.success() && rest.trim() == "OK" => {}
            Some(st) => fault = Some(format!("rank {rank} {st}, printed {rest:?}")),
            None => fault = Some(format!("rank {rank} did not finish in 60 s")),
        }
        if fault.is_some() {
            break;
        }
    }
    if let Some(f) = fault {
        for c in &mut kids {
            let _ = c.kill();
            let _ = c.wait();
        }
        panic!("ring of {n}: {f}");
    }
}

/// `WEFT_TEST_ROUNDS` if set, else `default`: how many rounds a repeated scenario runs (the
/// defaults catch a 1-in-20 failure with at least 95 % probability: 0.95^60 < 0.05).
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn rounds(default: usize) -> usize {
    std::env::var("WEFT_TEST_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Moves `src` into `dst` over `tx`/`rx` with `tag` (both polled here), within 20 s.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn transfer(
    tx: &mut weft_transport::SendConn,
    rx: &mut weft_transport::RecvConn,
    src: &[u8],
    dst: &mut [u8],
    tag: i32,
) -> usize {
    let rb = weft_transport::RecvBuf {
        ptr: dst.as_mut_ptr(),
        len: dst.len(),
        tag,
    };
    // SAFETY: `dst` and `src` outlive the requests, tested to completion below.
    let rr = unsafe { rx.irecv(&[rb]) }.unwrap().unwrap();
    // SAFETY: as above.
    let sr = unsafe { tx.isend(src.as_ptr(), src.len(), tag) }
        .unwrap()
        .unwrap();
    complete_both(tx, rx, sr, rr, src.len())
}

/// Tests send `sr` of `len` bytes on `tx` and receive `rr` on `rx` until both are done
/// (within 20 s); the size the receiver reported.
pub fn complete_both(
    tx: &mut weft_transport::SendConn,
    rx: &mut weft_transport::RecvConn,
    sr: weft_transport::RequestId,
    rr: weft_transport::RequestId,
    len: usize,
) -> usize {
    use std::time::Instant;
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut sd, mut rd) = (None, None);
    while sd.is_none() || rd.is_none() {
        assert!(Instant::now() < deadline, "transfer did not complete");
        if sd.is_none() {
            sd = tx.test(sr).unwrap();
        }
        if rd.is_none() {
            rd = rx.test(rr).unwrap();
        }
    }
    assert_eq!(sd, Some(len));
    rd.unwrap().sizes()[0]
}

/// A connection from `a` to a listener of `b`, both polled here, within 20 s.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn pair_between(
    a: &Transport,
    b: &Transport,
) -> (weft_transport::SendConn, weft_transport::RecvConn) {
    use std::time::Instant;
    let mut l = b.listen(0).unwrap();
    let mut c = a.connect(0, &l.handle()).unwrap();
    let (mut tx, mut rx) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while tx.is_none() || rx.is_none() {
        assert!(Instant::now() < deadline, "connect between transports");
        if tx.is_none() {
            tx = c.poll().unwrap();
        }
        if rx.is_none() {
            rx = l.accept().unwrap();
        }
    }
    (tx.unwrap(), rx.unwrap())
}

/// The bytes of test message `seed`, `n` long: what a sender sends and its receiver checks.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Closing connections with requests in flight never harms the other connections of the
/// process, and the last one out closes cleanly. `WEFT_TEST_BUSY_PAIRS` pairs (default 1)
/// between `t` and `u`, each in its own thread, move messages of 1 B to 1 MiB (checked) the
/// whole time, while the main thread, [`rounds`] (100) rounds, opens a pair between the same
/// two transports (directions alternating), posts receives and sends of 64 B to 1 MiB (inline
/// or eager, chunked or RMA), tests them a varying number of times and closes both sides in a
/// varying order (receiver first with data coming, sender first with data queued, or from
/// another thread), with nothing completed. The busy pairs see no error and keep moving. Then,
/// the busy pairs closed, a quarter as many rounds between `t` and `last_out` where the pair
/// closed in flight is the only user of what it shares (its close is the last one out), and one
/// pair after them works.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn closing_in_flight_leaves_the_busy_connections_alone(
    what: &str,
    t: &Transport,
    u: &Transport,
    last_out: &Transport,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::thread;
    use std::time::Instant;
    const SIZES: [usize; 5] = [64, 5000, 16384, 200_000, 1 << 20];
    let npairs: usize = std::env::var("WEFT_TEST_BUSY_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let stop = Arc::new(AtomicBool::new(false));
    let mut busy = Vec::new();
    for k in 0..npairs {
        let (mut btx, mut brx) = if k % 2 == 0 {
            pair_between(t, u)
        } else {
            pair_between(u, t)
        };
        let moved = Arc::new(AtomicUsize::new(0));
        let (stop, m, p) = (
            stop.clone(),
            moved.clone(),
            format!("{what}: busy pair {k}"),
        );
        let h = thread::spawn(move || {
            let mut dst = vec![0u8; 1 << 20];
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let n = [1, 4000, 16384, 100_000, 1 << 20][(i + k) % 5];
                let src = pattern(n, i as u8);
                let got = transfer(&mut btx, &mut brx, &src, &mut dst, i as i32);
                assert_eq!(got, n, "{p}: message {i}");
                assert!(dst[..n] == src[..], "{p}: message {i} differs");
                i += 1;
                m.store(i, Ordering::Relaxed);
            }
            (btx, brx)
        });
        busy.push((h, moved));
    }
    // Receive buffers stay valid past the closes: data already on its way may still land.
    let mut dst: Vec<Vec<u8>> = SIZES.iter().map(|&n| vec![0u8; n]).collect();
    let src: Vec<Vec<u8>> = SIZES.iter().map(|&n| pattern(n, 7)).collect();
    let mut x: u64 = 0x2545_f491;
    let start = Instant::now();
    let n = rounds(100);
    for round in 0..n {
        for (k, (h, _)) in busy.iter().enumerate() {
            assert!(
                !h.is_finished(),
                "{what}: round {round}: busy pair {k} failed"
            );
        }
        let (a, b) = if round % 2 == 0 { (t, u) } else { (u, t) };
        close_in_flight(a, b, round / 2, &mut x, &mut dst, &src);
    }
    let before: Vec<usize> = busy
        .iter()
        .map(|(_, m)| m.load(Ordering::Relaxed))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    for (k, (h, m)) in busy.iter().enumerate() {
        while m.load(Ordering::Relaxed) < before[k] + 5 && !h.is_finished() {
            assert!(
                Instant::now() < deadline,
                "{what}: busy pair {k} stopped moving"
            );
            thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for (k, (h, m)) in busy.into_iter().enumerate() {
        total += m.load(Ordering::Relaxed);
        let pair = h
            .join()
            .unwrap_or_else(|_| panic!("{what}: busy pair {k} failed (see its panic above)"));
        drop(pair);
    }
    eprintln!(
        "{what}: {n} rounds in {:?} beside {npairs} busy pairs, {total} busy messages",
        start.elapsed()
    );
    for round in 0..n / 4 {
        close_in_flight(t, last_out, round, &mut x, &mut dst, &src);
    }
    let (mut tx, mut rx) = pair_between(t, u);
    let got = transfer(&mut tx, &mut rx, &src[4], &mut dst[4], 1);
    assert_eq!(got, src[4].len(), "{what}: a pair after the last close");
}

/// One round of [`closing_in_flight_leaves_the_busy_connections_alone`]: a pair with five
/// receives and five sends posted, tested `x % 6` times, then closed in the order `round`
/// picks.
fn close_in_flight(
    a: &Transport,
    b: &Transport,
    round: usize,
    x: &mut u64,
    dst: &mut [Vec<u8>],
    src: &[Vec<u8>],
) {
    let (mut tx, mut rx) = pair_between(a, b);
    let mut rids = Vec::new();
    for (k, d) in dst.iter_mut().enumerate() {
        let rb = weft_transport::RecvBuf {
            ptr: d.as_mut_ptr(),
            len: d.len(),
            tag: k as i32,
        };
        // SAFETY: `dst` outlives the connection and any data still on its way (the caller's).
        rids.push(unsafe { rx.irecv(&[rb]) }.unwrap().unwrap());
    }
    let mut sids = Vec::new();
    for (k, s) in src.iter().enumerate() {
        // SAFETY: `src` outlives the connection.
        sids.push(unsafe { tx.isend(s.as_ptr(), s.len(), k as i32) }.unwrap());
    }
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    for _ in 0..(*x % 6) {
        let _ = rx.test(rids[0]);
        if let Some(Some(s)) = sids.last() {
            let _ = tx.test(*s);
        }
    }
    match round % 3 {
        0 => drop((rx, tx)),
        1 => drop((tx, rx)),
        _ => std::thread::spawn(move || drop((rx, tx))).join().unwrap(),
    }
}

/// The contract test every backend runs (see [`contract`]), also on libfabric's rails and lane: 64 messages of 100 B to
/// 1.9 MiB (inline or eager, chunked or RMA) all in flight at once (at least 32 sends), into 32
/// grouped receives of two buffers (tags 1 and 2) posted first, the sends alternating tag 2
/// then 1: each group gets its pair, each buffer the message of its tag, every byte checked.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn thirty_two_in_flight_and_grouped_receives_by_tag(
    p: &str,
    tx: &mut weft_transport::SendConn,
    rx: &mut weft_transport::RecvConn,
) {
    use std::time::Instant;
    use weft_transport::RecvBuf;
    let msgs: Vec<Vec<u8>> = (0..64)
        .map(|i| {
            pattern(
                if i % 3 == 0 {
                    100 + i
                } else {
                    1000 + i * 30_000
                },
                i as u8,
            )
        })
        .collect();
    let mut bufs: Vec<Vec<u8>> = (0..64).map(|_| vec![0u8; 2_000_000]).collect();
    let mut rreqs = Vec::new();
    for pair in bufs.chunks_mut(2) {
        let (a, b) = pair.split_at_mut(1);
        let rb = [
            RecvBuf {
                ptr: a[0].as_mut_ptr(),
                len: a[0].len(),
                tag: 1,
            },
            RecvBuf {
                ptr: b[0].as_mut_ptr(),
                len: b[0].len(),
                tag: 2,
            },
        ];
        // SAFETY: the buffers outlive the requests, all tested to completion below.
        rreqs.push(unsafe { rx.irecv(&rb) }.unwrap().unwrap());
    }
    let mut sreqs = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let tag = if i % 2 == 0 { 2 } else { 1 };
        // SAFETY: `msgs` outlives the requests, all tested to completion below.
        sreqs.push(
            unsafe { tx.isend(m.as_ptr(), m.len(), tag) }
                .unwrap()
                .unwrap(),
        );
    }
    assert!(tx.in_flight() >= 32, "{p}");
    let mut done_s = vec![false; sreqs.len()];
    let mut done_r = vec![None; rreqs.len()];
    let deadline = Instant::now() + Duration::from_secs(30);
    while done_s.iter().any(|d| !d) || done_r.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "{p}: 32 in flight did not complete"
        );
        for (i, r) in sreqs.iter().enumerate() {
            if !done_s[i] {
                done_s[i] = tx.test(*r).unwrap().is_some();
            }
        }
        for (i, r) in rreqs.iter().enumerate() {
            if done_r[i].is_none() {
                done_r[i] = rx.test(*r).unwrap();
            }
        }
    }
    for (i, c) in done_r.iter().enumerate() {
        let c = c.unwrap();
        assert_eq!(
            c.sizes(),
            &[msgs[2 * i + 1].len(), msgs[2 * i].len()],
            "{p}"
        );
        assert_eq!(
            &bufs[2 * i][..msgs[2 * i + 1].len()],
            &msgs[2 * i + 1][..],
            "{p}"
        );
        assert_eq!(
            &bufs[2 * i + 1][..msgs[2 * i].len()],
            &msgs[2 * i][..],
            "{p}"
        );
    }
}
