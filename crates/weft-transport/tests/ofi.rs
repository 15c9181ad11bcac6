//! The libfabric backend against the real libfabric 1.17 on this host: `tcp;ofi_rxm` over
//! loopback and `shm`, both in one process (NCCL's self-connection) and across threads. Sizes
//! 0..64 MiB with receives larger than the send, eager and RMA paths, tags and grouped
//! receives, 32 in flight, the registration cache, errors (truncation, tag mismatch, a peer
//! that dies, a TCP peer), and the fallback to TCP when no provider is usable.
//!
//! Without libfabric every test prints "skipped" and passes: the backend is optional.

use std::thread;
use std::time::{Duration, Instant};

use weft_transport::{BackendKind, Config, Error, RecvBuf, RecvConn, SendConn, Transport};

const PROVIDERS: &[(&str, &str)] = &[("tcp;ofi_rxm", "lo"), ("shm", "")];

fn cfg(provider: &str, domain: &str) -> Config {
    Config {
        mgmt_ifname: Some("=lo".parse().unwrap()),
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

/// The transport for `provider`, or None (test skipped) when libfabric is not installed.
fn transport(provider: &str, domain: &str) -> Option<Transport> {
    let t = Transport::new(cfg(provider, domain)).unwrap();
    if !t.is_ofi() {
        let note = t.backend_note().unwrap_or_default().to_string();
        assert!(
            !std::path::Path::new("/usr/lib/x86_64-linux-gnu/libfabric.so.1").exists(),
            "libfabric is installed but {provider} is unusable: {note}"
        );
        eprintln!("skipped: {note}");
        return None;
    }
    Some(t)
}

fn pair_on(t: &Transport) -> (SendConn, RecvConn) {
    let mut l = t.listen(0).unwrap();
    let mut cg = t.connect(0, &l.handle()).unwrap();
    let (mut tx, mut rx) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tx.is_none() || rx.is_none() {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if tx.is_none() {
            tx = cg.poll().unwrap();
        }
        if rx.is_none() {
            rx = l.accept().unwrap();
        }
    }
    let (tx, rx) = (tx.unwrap(), rx.unwrap());
    assert!(tx.is_ofi() && rx.is_ofi());
    (tx, rx)
}

fn each_provider(f: impl Fn(&str, &Transport)) {
    for (p, d) in PROVIDERS {
        if let Some(t) = transport(p, d) {
            eprintln!("provider {p}: {}", t.backend());
            f(p, &t);
        }
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sizes() -> Vec<usize> {
    let mut v = vec![
        0,
        1,
        7,
        8,
        1023,
        8191,
        8192,
        8193,
        65536,
        1 << 20,
        (1 << 20) + 3,
        16 << 20,
        64 << 20,
    ];
    let mut x: u64 = 0x9e37_79b9;
    for _ in 0..10 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push((x % (4 << 20)) as usize);
    }
    v
}

#[test]
fn sizes_0_to_64mib_receive_larger_than_send() {
    each_provider(|p, t| {
        let (mut tx, mut rx) = pair_on(t);
        let sizes = sizes();
        let s2 = sizes.clone();
        let h = thread::spawn(move || {
            for (i, n) in s2.iter().enumerate() {
                tx.send(&pattern(*n, i as u8), i as i32).unwrap();
            }
            tx
        });
        for (i, n) in sizes.iter().enumerate() {
            let mut buf = vec![0u8; n + 100];
            let got = rx.recv(&mut buf, i as i32).unwrap();
            assert_eq!(got, *n, "{p}: message {i}");
            assert!(
                buf[..*n] == pattern(*n, i as u8)[..],
                "{p}: payload of message {i} ({n} bytes) differs"
            );
            assert!(
                buf[*n..].iter().all(|b| *b == 0),
                "{p}: wrote past the message"
            );
        }
        let tx = h.join().unwrap();
        drop(tx);
    });
}

/// Sends posted before the receives (eager, kept until the receive comes) and after (RMA),
/// all in one thread as NCCL's GDR probe does. Manual-progress providers move data only while
/// both ends are polled, as NCCL's proxy does, so the sends are tested after the receives.
#[test]
fn eager_before_the_receive_and_rma_after_it_in_one_thread() {
    each_provider(|p, t| {
        let (mut tx, mut rx) = pair_on(t);
        let early: Vec<Vec<u8>> = (0..10).map(|i| pattern(100 * i, i as u8)).collect();
        let mut sreqs = Vec::new();
        for (i, m) in early.iter().enumerate() {
            // SAFETY: `early` outlives the requests, tested to completion below.
            sreqs.push(
                unsafe { tx.isend(m.as_ptr(), m.len(), i as i32) }
                    .unwrap()
                    .unwrap(),
            );
        }
        for (i, m) in early.iter().enumerate() {
            let mut buf = vec![0u8; 4096];
            let b = RecvBuf {
                ptr: buf.as_mut_ptr(),
                len: buf.len(),
                tag: i as i32,
            };
            // SAFETY: `buf` outlives the request, tested to completion below.
            let rr = unsafe { rx.irecv(&[b]) }.unwrap().unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            let c = loop {
                if let Some(c) = rx.test(rr).unwrap() {
                    break c;
                }
                for r in &sreqs {
                    let _ = tx.test(*r);
                }
                assert!(
                    Instant::now() < deadline,
                    "{p}: receive {i} did not complete"
                );
            };
            assert_eq!(c.sizes(), &[m.len()], "{p}");
            assert_eq!(&buf[..m.len()], &m[..], "{p}");
        }
        // Now the receive first, then a small send: it goes by RMA write into the buffer.
        let mut buf = vec![0u8; 64];
        let rb = RecvBuf {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            tag: 99,
        };
        // SAFETY: `buf` outlives the request, tested to completion below.
        let rr = unsafe { rx.irecv(&[rb]) }.unwrap().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        // SAFETY: an empty send reads nothing.
        let sr = unsafe { tx.isend(std::ptr::null(), 0, 99) }
            .unwrap()
            .unwrap();
        let (mut sd, mut rd) = (None, None);
        while sd.is_none() || rd.is_none() {
            assert!(
                Instant::now() < deadline,
                "{p}: empty message did not arrive"
            );
            if sd.is_none() {
                sd = tx.test(sr).unwrap();
            }
            if rd.is_none() {
                rd = rx.test(rr).unwrap();
            }
        }
        assert_eq!(rd.unwrap().sizes(), &[0], "{p}");
    });
}

#[test]
fn thirty_two_in_flight_and_grouped_receives_by_tag() {
    each_provider(|p, t| {
        let (mut tx, mut rx) = pair_on(t);
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
    });
}

/// Sends whose receive is not there yet, interleaved with tests, more than the eager credit:
/// the sender falls back to waiting for the receive (CTS) instead of overrunning.
#[test]
fn more_small_sends_than_eager_credit() {
    each_provider(|p, t| {
        let (mut tx, mut rx) = pair_on(t);
        let n = 300;
        let h = thread::spawn(move || {
            for i in 0..n {
                tx.send(&pattern(64, i as u8), 7).unwrap();
            }
            tx
        });
        thread::sleep(Duration::from_millis(100));
        for i in 0..n {
            let mut buf = [0u8; 64];
            assert_eq!(rx.recv(&mut buf, 7).unwrap(), 64, "{p}");
            assert_eq!(&buf[..], &pattern(64, i as u8)[..], "{p}: message {i}");
        }
        drop(h.join().unwrap());
    });
}

#[test]
fn registration_cache_makes_repeated_buffers_free() {
    each_provider(|p, t| {
        let (mut tx, mut rx) = pair_on(t);
        let src = pattern(1 << 20, 3);
        let h = thread::spawn(move || {
            for _ in 0..50 {
                tx.send(&src, 0).unwrap();
            }
            tx
        });
        let mut buf = vec![0u8; 1 << 20];
        let t0 = Instant::now();
        for _ in 0..50 {
            assert_eq!(rx.recv(&mut buf, 0).unwrap(), 1 << 20);
        }
        let _tx = h.join().unwrap();
        let (hits, misses) = rx.mr_stats();
        eprintln!(
            "{p}: receiver registrations: {hits} hits, {misses} misses in {:?}",
            t0.elapsed()
        );
        assert_eq!(
            misses, 1,
            "{p}: the same buffer was registered more than once"
        );
        assert_eq!(hits, 49, "{p}");
    });
}

#[test]
fn truncation_and_tag_mismatch_are_errors_on_both_sides() {
    each_provider(|p, t| {
        // Truncation by RMA: the receive is posted first, the sender sees its size.
        let (mut tx, mut rx) = pair_on(t);
        let mut small = [0u8; 10];
        let rb = RecvBuf {
            ptr: small.as_mut_ptr(),
            len: small.len(),
            tag: 5,
        };
        // SAFETY: `small` outlives the request (the connection fails and is dropped first).
        let rr = unsafe { rx.irecv(&[rb]) }.unwrap().unwrap();
        let big = [1u8; 100_000];
        let start = Instant::now();
        // SAFETY: `big` outlives the request (the connection fails and is dropped first).
        let sr = unsafe { tx.isend(big.as_ptr(), big.len(), 5) }
            .unwrap()
            .unwrap();
        let (mut se, mut re) = (None, None);
        while se.is_none() || re.is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{p}: {se:?} {re:?}"
            );
            if se.is_none() {
                match tx.test(sr) {
                    Err(e) => se = Some(e),
                    Ok(Some(_)) => panic!("{p}: truncated send succeeded"),
                    Ok(None) => {}
                }
            }
            if re.is_none() {
                match rx.test(rr) {
                    Err(e) => re = Some(e),
                    Ok(Some(_)) => panic!("{p}: truncated receive completed"),
                    Ok(None) => {}
                }
            }
        }
        let (se, re) = (se.unwrap(), re.unwrap());
        assert!(
            matches!(
                se,
                Error::Truncated {
                    sent: 100_000,
                    posted: 10,
                    tag: 5,
                    ..
                }
            ),
            "{p}: {se}"
        );
        assert!(matches!(re, Error::Aborted { .. }), "{p}: {re}");
        // Truncation and mismatch of an eager message: found by the receiver.
        let (mut tx, mut rx) = pair_on(t);
        let h = thread::spawn(move || {
            let _ = tx.send(&[1u8; 100], 5);
            tx
        });
        let mut small = [0u8; 10];
        let r = rx.recv(&mut small, 5);
        assert!(
            matches!(
                r,
                Err(Error::Truncated {
                    sent: 100,
                    posted: 10,
                    tag: 5,
                    ..
                })
            ),
            "{p}: {r:?}"
        );
        drop(h.join().unwrap());
        let (mut tx, mut rx) = pair_on(t);
        let h = thread::spawn(move || {
            let _ = tx.send(&[1u8; 10], 5);
            tx
        });
        let mut buf = [0u8; 10];
        let r = rx.recv(&mut buf, 6);
        assert!(
            matches!(r, Err(Error::TagMismatch { tag: 5, .. })),
            "{p}: {r:?}"
        );
        drop(h.join().unwrap());
    });
}

/// In one process only with `tcp;ofi_rxm`: `shm` maps the peer's memory region, which a peer in
/// the same process unmaps when it closes (across processes the mapping stays valid).
#[test]
fn a_peer_that_goes_away_is_a_bounded_error() {
    each_provider(|p, t| {
        if p == "shm" {
            return;
        }
        // Sender gone while the receiver waits.
        let (tx, mut rx) = pair_on(t);
        drop(tx);
        let mut buf = vec![0u8; 1 << 20];
        let start = Instant::now();
        let e = rx.recv(&mut buf, 0).unwrap_err();
        assert!(matches!(e, Error::Closed { .. }), "{p}: {e}");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{p}: took {:?}",
            start.elapsed()
        );
        // Receiver gone while the sender waits for its receive.
        let (mut tx, rx) = pair_on(t);
        drop(rx);
        let big = vec![0u8; 1 << 20];
        let start = Instant::now();
        let e = tx.send(&big, 0).unwrap_err();
        assert!(matches!(e, Error::Closed { .. }), "{p}: {e}");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{p}: took {:?}",
            start.elapsed()
        );
    });
}

#[test]
fn an_ofi_sender_and_a_tcp_listener_refuse_each_other() {
    let Some(t) = transport("tcp;ofi_rxm", "lo") else {
        return;
    };
    let tcp = Transport::new(Config {
        backend: BackendKind::Tcp,
        timeout: Duration::from_secs(2),
        accept_timeout: Duration::from_secs(2),
        ..cfg("tcp;ofi_rxm", "lo")
    })
    .unwrap();
    // ofi sender, tcp listener.
    let mut l = tcp.listen(0).unwrap();
    let mut cg = t.connect(0, &l.handle()).unwrap();
    let start = Instant::now();
    let mut sender_err = None;
    let mut listener_err = None;
    while (sender_err.is_none() || listener_err.is_none())
        && start.elapsed() < Duration::from_secs(10)
    {
        if sender_err.is_none() {
            match cg.poll() {
                Err(e) => sender_err = Some(e),
                Ok(Some(_)) => panic!("an ofi sender connected to a tcp listener"),
                Ok(None) => {}
            }
        }
        if listener_err.is_none() {
            match l.accept() {
                Err(e) => listener_err = Some(e),
                Ok(Some(_)) => panic!("a tcp listener accepted an ofi sender"),
                Ok(None) => {}
            }
        }
    }
    assert!(sender_err.is_some(), "the ofi sender did not fail");
    // tcp sender, ofi listener: refused with a reason.
    let mut l = t.listen(0).unwrap();
    let mut cg = tcp.connect(0, &l.handle()).unwrap();
    let start = Instant::now();
    let e = loop {
        assert!(start.elapsed() < Duration::from_secs(10));
        if let Err(e) = l.accept() {
            break e;
        }
        if let Err(e) = cg.poll() {
            eprintln!("tcp sender: {e}");
        }
    };
    assert!(matches!(e, Error::Rejected { .. }), "{e}");
}

#[test]
fn an_unusable_provider_falls_back_to_tcp_which_still_works() {
    let t = Transport::new(cfg("no-such-provider", "")).unwrap();
    assert!(!t.is_ofi());
    assert_eq!(t.backend(), "tcp");
    let note = t.backend_note().unwrap();
    assert!(
        note.contains("no-such-provider") || note.contains("libfabric"),
        "{note}"
    );
    let (mut tx, mut rx) = {
        let mut l = t.listen(0).unwrap();
        let mut cg = t.connect(0, &l.handle()).unwrap();
        let (mut tx, mut rx) = (None, None);
        while tx.is_none() || rx.is_none() {
            if tx.is_none() {
                tx = cg.poll().unwrap();
            }
            if rx.is_none() {
                rx = l.accept().unwrap();
            }
        }
        (tx.unwrap(), rx.unwrap())
    };
    assert!(!tx.is_ofi());
    let h = thread::spawn(move || {
        tx.send(&pattern(100_000, 1), 3).unwrap();
        tx
    });
    let mut buf = vec![0u8; 100_000];
    assert_eq!(rx.recv(&mut buf, 3).unwrap(), 100_000);
    assert_eq!(buf, pattern(100_000, 1));
    drop(h.join().unwrap());
}
