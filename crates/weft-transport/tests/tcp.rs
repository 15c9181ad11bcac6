//! Loopback tests of the TCP backend: the contract suite that every backend runs (module
//! `tcp`, see `common::contract`), and what only TCP has: its wire protocol (hand-made
//! senders that stall or abort on the side channel), control-stream flow control, control
//! streams shared by opposite connections (JOIN, MOVE), held out-of-step tags, and frozen
//! (SIGSTOP) peers caught by PROBE/ALIVE. Every failure bounded by the timeout with peer and
//! interface named.

// Each test binary uses part of the shared helpers.
#[allow(dead_code)]
mod common;
use common::contract::Backend;
use common::pattern;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use weft_transport::proto::{CTRL_STREAM, Frame};
use weft_transport::{Config, Error, RecvBuf, RecvConn, SendConn, Stage, Transport};

/// The contract suite on the TCP backend: `tcp::<promise>`.
mod tcp {
    use super::common::contract::{Backend, contract_suite};
    contract_suite!(
        Backend::tcp();
        data, ping_pong, setup, processes, closing, peers_in_one_process,
    );
}

/// Short timeouts (1.5 s) for the tests that wait for one; `roomy` (20 s) for those that move
/// data on a busy 2-core CI machine in debug mode. The accept timeout is short in both.
fn roomy(nthreads: usize, nsocks: usize) -> Config {
    Config {
        timeout: Duration::from_secs(20),
        ..cfg(nthreads, nsocks)
    }
}

fn cfg(nthreads: usize, nsocks: usize) -> Config {
    Backend::tcp().config(Duration::from_millis(1500), (nthreads, nsocks))
}

/// Connects in one thread by polling both ends, as NCCL's GDR probe does.
fn pair(c: Config) -> (SendConn, RecvConn) {
    pair_on(&Transport::new(c).unwrap())
}

/// Connects `t` to itself, polling both ends in one thread.
fn pair_on(t: &Transport) -> (SendConn, RecvConn) {
    let mut l = t.listen(0).unwrap();
    t.connect_and_accept(0, &l.handle(), &mut l).unwrap()
}

#[test]
fn truncation_is_an_error() {
    let (mut tx, mut rx) = pair(cfg(0, 1));
    tx.send(&[1u8; 100], 5).unwrap();
    let mut small = [0u8; 10];
    match rx.recv(&mut small, 5) {
        Err(Error::Truncated {
            sent: 100,
            posted: 10,
            tag: 5,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

/// A hand-made TCP sender to the listener of `h`: handshake, control and one data stream
/// (connection `conn_id`), the ACK read, and a 1 MiB message of tag 3 announced on the
/// control stream. Returns the handshake, control and data streams.
fn fake_sender_announcing_1mib(
    h: &weft_transport::proto::ListenHandle,
    conn_id: u64,
) -> (TcpStream, TcpStream, TcpStream) {
    let mut hs = TcpStream::connect(h.mgmt).unwrap();
    let mut ctrl = TcpStream::connect(h.mgmt).unwrap();
    let mut data = TcpStream::connect(h.mgmt).unwrap();
    let mut v = Vec::new();
    Frame::Hello {
        nonce: h.nonce,
        conn_id,
        nstreams: 1,
    }
    .encode(&mut v);
    hs.write_all(&v).unwrap();
    for (s, idx) in [(&mut ctrl, CTRL_STREAM), (&mut data, 0)] {
        v.clear();
        Frame::Stream {
            nonce: h.nonce,
            conn_id,
            idx,
        }
        .encode(&mut v);
        s.write_all(&v).unwrap();
    }
    let mut ack = [0u8; 24];
    hs.read_exact(&mut ack).unwrap();
    v.clear();
    Frame::encode_msg(&mut v, 3, None, 1 << 20, 1 << 20);
    ctrl.write_all(&v).unwrap();
    (hs, ctrl, data)
}

/// A hand-made sender that completes the handshake, announces a 1 MiB message, sends half of it
/// and then stops without closing: the receiver must give up after its timeout.
#[test]
fn sender_stalling_mid_message_times_out_naming_the_stream() {
    let t = Transport::new(cfg(0, 1)).unwrap();
    let mut l = t.listen(0).unwrap();
    let h = l.handle_info().clone();
    let fake = thread::spawn(move || {
        let (hs, ctrl, mut data) = fake_sender_announcing_1mib(&h, 9);
        data.write_all(&vec![1u8; 1 << 19]).unwrap();
        thread::sleep(Duration::from_secs(4));
        (hs, ctrl, data)
    });
    let mut rx = l.wait().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let start = Instant::now();
    let err = rx.recv(&mut buf, 3).unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(
            err,
            Error::Timeout {
                stage: Stage::Data,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("lo"), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    fake.join().unwrap();
}

/// Control-stream flow control: a receiver that does not read lets the sender hand at most
/// CTRL_WINDOW bytes of inline messages to the kernel (so the control stream's window never
/// closes and its TCP_USER_TIMEOUT cannot fire on a slow receiver); once it reads, all arrive.
#[test]
fn a_receiver_that_does_not_read_holds_back_the_control_stream() {
    let (mut tx, mut rx) = pair(roomy(0, 1));
    let msg = vec![3u8; 1000];
    let mut ids = Vec::new();
    for _ in 0..200 {
        // SAFETY: `msg` outlives every request, all completed or dropped with `tx` below.
        ids.push(
            unsafe { tx.isend(msg.as_ptr(), msg.len(), 0) }
                .unwrap()
                .unwrap(),
        );
    }
    let deadline = Instant::now() + Duration::from_millis(300);
    let mut done = 0;
    while Instant::now() < deadline {
        for id in &ids[done..] {
            if tx.test(*id).unwrap().is_none() {
                break;
            }
            done += 1;
        }
    }
    let window = weft_transport::proto::CTRL_WINDOW as usize;
    assert!(
        done * (msg.len() + 24) <= window,
        "{done} messages completed without the receiver reading"
    );
    let h = thread::spawn(move || {
        for id in &ids[done..] {
            while tx.test(*id).unwrap().is_none() {}
        }
        tx
    });
    let mut buf = vec![0u8; 1000];
    for _ in 0..200 {
        assert_eq!(rx.recv(&mut buf, 0).unwrap(), 1000);
    }
    drop(h.join().unwrap());
}

/// A receiver that fails (here: its data stream stalls because the sender is wedged) tells the
/// sender why over the control stream; the sender fails with "aborted", naming the peer.
#[test]
fn a_failing_receiver_aborts_the_sender() {
    let (mut tx, mut rx) = pair(cfg(0, 1));
    let src = vec![1u8; 8 << 20];
    // SAFETY: `src` outlives `tx`.
    let sid = unsafe { tx.isend(src.as_ptr(), src.len(), 0) }
        .unwrap()
        .unwrap();
    let mut dst = vec![0u8; 8 << 20];
    let rb = [RecvBuf {
        ptr: dst.as_mut_ptr(),
        len: dst.len(),
        tag: 0,
    }];
    // SAFETY: `dst` outlives `rx`.
    let rid = unsafe { rx.irecv(&rb) }.unwrap().unwrap();
    // The sender (caller-driven, nthreads = 0) is not polled: its data never comes.
    let start = Instant::now();
    let err = loop {
        match rx.test(rid) {
            Err(e) => break e,
            Ok(Some(_)) => panic!("completed without the sender moving data"),
            Ok(None) => assert!(start.elapsed() < Duration::from_secs(10), "receiver hung"),
        }
    };
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    let err = loop {
        match tx.test(sid) {
            Err(e) => break e,
            Ok(_) => assert!(start.elapsed() < Duration::from_secs(10), "sender hung"),
        }
    };
    assert!(
        matches!(err, Error::Aborted { .. }) && err.to_string().contains("127.0.0.1"),
        "{err}"
    );
}

/// The management side channel: a hand-made sender completes the handshake, announces a
/// message on the control stream, then gives up and says so only on the handshake stream (as
/// when its data link is dead): the receiver fails at once with the sender's reason.
#[test]
fn an_abort_on_the_side_channel_alone_fails_the_peer() {
    let t = Transport::new(cfg(0, 1)).unwrap();
    let mut l = t.listen(0).unwrap();
    let h = l.handle_info().clone();
    let fake = thread::spawn(move || {
        let (mut hs, ctrl, data) = fake_sender_announcing_1mib(&h, 5);
        thread::sleep(Duration::from_millis(100));
        let mut v = Vec::new();
        Frame::Abort {
            reason: weft_transport::proto::AbortReason::ControlFailed,
            detail: 0,
        }
        .encode(&mut v);
        hs.write_all(&v).unwrap();
        thread::sleep(Duration::from_secs(3));
        (hs, ctrl, data)
    });
    let mut rx = l.wait().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let start = Instant::now();
    let err = rx.recv(&mut buf, 3).unwrap_err();
    assert!(
        matches!(&err, Error::Aborted { reason, .. } if reason.contains("control stream failed")),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    fake.join().unwrap();
}

/// Connects `t` to itself once in each direction (as two ranks' ring neighbours do), the
/// second connection after the first is up, polling both ends in one thread.
fn two_way(t: &Transport) -> ((SendConn, RecvConn), (SendConn, RecvConn)) {
    let a = pair_on(t);
    let b = pair_on(t);
    (a, b)
}

/// Two one-way connections between the same addresses share one control stream (JOIN): a
/// ping-pong of every size, inline and chunked, is correct in both directions; one direction
/// closing leaves the other working; the receiver of the closed one sees a clean close.
#[test]
fn opposite_connections_share_a_control_stream_and_close_independently() {
    let t = Transport::new(roomy(2, 2)).unwrap();
    let ((mut tx_a, mut rx_a), (mut tx_b, mut rx_b)) = two_way(&t);
    assert!(tx_a.shares_control_stream() && rx_a.shares_control_stream());
    assert!(tx_b.shares_control_stream() && rx_b.shares_control_stream());
    // Ping on A, pong on B, from one thread each side, every size.
    let sizes = common::contract::sizes();
    let s2 = sizes.clone();
    let echo = thread::spawn(move || {
        for (i, n) in s2.iter().enumerate() {
            let mut buf = vec![0u8; *n];
            assert_eq!(rx_a.recv(&mut buf, i as i32).unwrap(), *n);
            assert!(buf == pattern(*n, i as u8), "ping {i} ({n} bytes)");
            tx_b.send(&pattern(*n, i as u8 ^ 0x55), i as i32).unwrap();
        }
        (rx_a, tx_b)
    });
    for (i, n) in sizes.iter().enumerate() {
        tx_a.send(&pattern(*n, i as u8), i as i32).unwrap();
        let mut buf = vec![0u8; *n];
        assert_eq!(rx_b.recv(&mut buf, i as i32).unwrap(), *n);
        assert!(buf == pattern(*n, i as u8 ^ 0x55), "pong {i} ({n} bytes)");
    }
    let (mut rx_a, tx_b) = echo.join().unwrap();
    // B's sender closes: B's receiver sees a close (an error only for a posted receive), and
    // A keeps working over the shared stream in both its directions of use.
    drop(tx_b);
    for i in 0..200 {
        tx_a.send(&pattern(600, i as u8), 7).unwrap();
        let mut buf = vec![0u8; 600];
        assert_eq!(rx_a.recv(&mut buf, 7).unwrap(), 600);
        assert!(buf == pattern(600, i as u8));
    }
    let mut buf = [0u8; 8];
    let start = Instant::now();
    let e = rx_b.recv(&mut buf, 1).unwrap_err();
    assert!(matches!(e, Error::Closed { .. }), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(rx_b);
    tx_a.send(b"still here", 9).unwrap();
    let mut buf = [0u8; 10];
    assert_eq!(rx_a.recv(&mut buf, 9).unwrap(), 10);
    assert_eq!(&buf, b"still here");
}

/// A failure of one of the two connections sharing a control stream (here a truncation on
/// B's receiver) fails its peer within the bound, through the side channel, and leaves the
/// other direction's connections working on the shared stream.
#[test]
fn a_failure_of_one_connection_on_a_shared_control_stream_spares_the_other() {
    let t = Transport::new(cfg(0, 1)).unwrap();
    let ((mut tx_a, mut rx_a), (mut tx_b, mut rx_b)) = two_way(&t);
    assert!(tx_b.shares_control_stream());
    tx_b.send(&[1u8; 100], 3).unwrap();
    let mut small = [0u8; 10];
    assert!(matches!(
        rx_b.recv(&mut small, 3),
        Err(Error::Truncated { .. })
    ));
    let start = Instant::now();
    let e = loop {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "B's sender did not fail"
        );
        match tx_b.send(&[0u8; 8], 1) {
            Err(e) => break e,
            Ok(()) => thread::sleep(Duration::from_millis(1)),
        }
    };
    assert!(matches!(e, Error::Aborted { .. }), "{e:?}");
    for i in 0..50u8 {
        tx_a.send(&pattern(3000, i), 5).unwrap();
        let mut buf = vec![0u8; 3000];
        assert_eq!(rx_a.recv(&mut buf, 5).unwrap(), 3000);
        assert!(buf == pattern(3000, i));
    }
}

/// WEFT_SHARE_CTRL=0: every connection opens its own control stream.
#[test]
fn sharing_can_be_turned_off() {
    let c = Config::from_lookup(|k| (k == "WEFT_SHARE_CTRL").then(|| "0".to_string())).unwrap();
    assert!(!c.share_ctrl);
    let t = Transport::new(Config {
        share_ctrl: false,
        ..cfg(0, 1)
    })
    .unwrap();
    let ((tx_a, rx_a), (tx_b, rx_b)) = two_way(&t);
    assert!(!tx_a.shares_control_stream() && !rx_a.shares_control_stream());
    assert!(!tx_b.shares_control_stream() && !rx_b.shares_control_stream());
}

/// Both directions connected at once, several per direction, as NCCL sets up its channels:
/// no handshake finds a link to JOIN, so the sending ends move onto shared control streams
/// afterwards (MOVE) while messages flow. Every message arrives intact and in order, each
/// direction's connections end up sharing, and closing one direction leaves the other working.
#[test]
fn connections_opened_at_once_move_onto_shared_control_streams() {
    const N: usize = 3;
    let t = Transport::new(roomy(0, 2)).unwrap();
    let mut ls: Vec<_> = (0..2 * N).map(|_| t.listen(0).unwrap()).collect();
    let mut cs: Vec<_> = ls
        .iter()
        .map(|l| Some(t.connect(0, &l.handle()).unwrap()))
        .collect();
    let mut txs: Vec<Option<SendConn>> = (0..2 * N).map(|_| None).collect();
    let mut rxs: Vec<Option<RecvConn>> = (0..2 * N).map(|_| None).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while txs.iter().any(Option::is_none) || rxs.iter().any(Option::is_none) {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        for i in 0..2 * N {
            if let Some(c) = cs[i].as_mut()
                && let Some(tx) = c.poll().unwrap()
            {
                txs[i] = Some(tx);
                cs[i] = None;
            }
            if rxs[i].is_none() {
                rxs[i] = ls[i].accept().unwrap();
            }
        }
    }
    let mut txs: Vec<SendConn> = txs.into_iter().map(Option::unwrap).collect();
    let mut rxs: Vec<RecvConn> = rxs.into_iter().map(Option::unwrap).collect();
    // Traffic on every connection, polled round-robin from one thread, until all share.
    let sizes = [0usize, 8, 1000, 70_000, 300_000];
    for round in 0..300usize {
        for i in 0..2 * N {
            let n = sizes[round % sizes.len()];
            let data = pattern(n, (round + i) as u8);
            let id = loop {
                // SAFETY: `data` outlives the request: we wait for it below.
                let r = unsafe { txs[i].isend(data.as_ptr(), n, round as i32) };
                if let Some(id) = r.unwrap() {
                    break id;
                }
            };
            let mut buf = vec![0u8; n];
            let b = RecvBuf {
                ptr: buf.as_mut_ptr(),
                len: n,
                tag: round as i32,
            };
            // SAFETY: `buf` outlives the request: we wait for it below.
            let rid = unsafe { rxs[i].irecv(&[b]) }.unwrap().unwrap();
            let (mut sent, mut got) = (false, false);
            let until = Instant::now() + Duration::from_secs(10);
            while !(sent && got) {
                assert!(Instant::now() < until, "round {round} conn {i} stuck");
                sent = sent || txs[i].test(id).unwrap().is_some();
                if !got && let Some(c) = rxs[i].test(rid).unwrap() {
                    assert_eq!(c.sizes(), &[n]);
                    got = true;
                }
            }
            assert!(buf == data, "round {round} conn {i}: payload differs");
        }
        if round > 20
            && txs.iter().all(SendConn::shares_control_stream)
            && rxs.iter().all(RecvConn::shares_control_stream)
        {
            break;
        }
    }
    assert!(
        txs.iter().all(SendConn::shares_control_stream),
        "senders sharing: {:?}",
        txs.iter()
            .map(SendConn::shares_control_stream)
            .collect::<Vec<_>>()
    );
    assert!(rxs.iter().all(RecvConn::shares_control_stream));
    // Close every connection of one direction: the other keeps working.
    let keep: Vec<(SendConn, RecvConn)> = txs.into_iter().zip(rxs).collect();
    let (mut first, second): (Vec<_>, Vec<_>) =
        keep.into_iter().enumerate().partition(|(i, _)| *i < N);
    drop(second);
    for (_, (tx, rx)) in &mut first {
        tx.send(b"after close", 77).unwrap();
        let mut buf = [0u8; 11];
        assert_eq!(rx.recv(&mut buf, 77).unwrap(), 11);
        assert_eq!(&buf, b"after close");
    }
}

/// A receiving process: `weft-recv-late COUNT SIZE` with a 1 s timeout on loopback and `env`,
/// its stdout lines, and the listen handle it printed.
fn spawn_receiver(
    count: usize,
    size: usize,
    env: &[(&str, &str)],
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    Vec<u8>,
) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_weft-recv-late"))
        .args([count.to_string(), size.to_string()])
        .env("WEFT_MGMT_IFNAME", "=lo")
        .env("WEFT_TIMEOUT_MS", "1000")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let hex = first
        .strip_prefix("HANDLE ")
        .unwrap_or_else(|| panic!("{first:?}"));
    let handle = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    (child, lines, handle)
}

/// A frozen receiver (SIGSTOP: its kernel acknowledges every byte, its window stays closed)
/// is an error for its sender about one timeout after the last byte moved, without
/// `WEFT_TCP_USER_TIMEOUT_MS`; a live receiver that posts 2.5 timeouts late is not (it answers
/// the sender's PROBE from its `alive` thread) and gets every byte. 1 s timeout, one 64 MiB
/// message (far more than the socket buffers hold), helper threads off and on.
#[test]
fn a_frozen_receiver_is_an_error_and_a_late_one_is_not() {
    let size = 64 << 20;
    let msg = vec![0u8; size];
    for nthreads in [0, 2] {
        for frozen in [false, true] {
            let what = format!("nthreads {nthreads}, frozen {frozen}");
            let hold = if frozen { "60000" } else { "2500" };
            let (mut child, mut lines, handle) =
                spawn_receiver(1, size, &[("WEFT_TEST_HOLD_MS", hold)]);
            let t = Transport::new(Config {
                timeout: Duration::from_secs(1),
                ..cfg(nthreads, 1)
            })
            .unwrap();
            let mut tx = t.connect(0, &handle).unwrap().wait().unwrap();
            assert_eq!(lines.next().unwrap().unwrap(), "ACCEPTED", "{what}");
            if frozen {
                // SAFETY: kill(2) on our own child's pid, which has not been waited for.
                assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
            }
            // SAFETY: `msg` outlives `tx`, dropped below.
            let id = unsafe { tx.isend(msg.as_ptr(), msg.len(), 0) }
                .unwrap()
                .unwrap();
            let start = Instant::now();
            let result = loop {
                match tx.test(id) {
                    Ok(Some(_)) => break Ok(start.elapsed()),
                    Ok(None) => {}
                    Err(e) => break Err((start.elapsed(), e)),
                }
                assert!(start.elapsed() < Duration::from_secs(20), "{what}: a hang");
                thread::sleep(Duration::from_micros(200));
            };
            if frozen {
                let (after, e) = result.expect_err("a frozen receiver went unnoticed");
                eprintln!("{what}: {e} after {after:?}");
                assert!(matches!(e, Error::Timeout { .. }), "{what}: {e}");
                assert!(
                    after >= Duration::from_millis(900) && after < Duration::from_secs(4),
                    "{what}: after {after:?}"
                );
                // SAFETY: as above.
                unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                let _ = child.wait();
            } else {
                let after = result.unwrap_or_else(|(t, e)| panic!("{what}: {e} after {t:?}"));
                assert!(
                    after >= Duration::from_secs(2),
                    "{what}: done after {after:?}"
                );
                assert_eq!(lines.next().unwrap().unwrap(), "OK", "{what}");
                assert!(child.wait().unwrap().success(), "{what}");
            }
            drop(tx);
        }
    }
}

/// A frozen sender (SIGSTOP mid-message) is an error for its receiver after the timeout: the
/// sender process hands over one 64 MiB message and is stopped; the receive fails with a
/// timeout 1 to 4 s after it was posted (1 s timeout).
#[test]
fn a_sender_frozen_mid_message_is_an_error() {
    use std::io::BufRead;
    let t = Transport::new(Config {
        timeout: Duration::from_secs(1),
        ..cfg(0, 1)
    })
    .unwrap();
    let mut l = t.listen(0).unwrap();
    let hex: String = l.handle().iter().map(|b| format!("{b:02x}")).collect();
    let size = 64 << 20;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_weft-send-and-exit"))
        .args([hex, "1".into(), size.to_string()])
        .env("WEFT_MGMT_IFNAME", "=lo")
        .env("WEFT_TIMEOUT_MS", "1000")
        .env("WEFT_TEST_SAY_SENT", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut rx = l.wait().unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "SENT");
    // Let the message header and the first chunks reach our socket buffers.
    thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on our own child's pid, which has not been waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
    let mut buf = vec![0u8; size];
    let rb = RecvBuf {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
        tag: 0,
    };
    // Timed from the post: irecv itself reads what the socket buffers hold, and the bound is
    // the timeout after the last byte moved, which is during or after this call.
    let start = Instant::now();
    // SAFETY: `buf` outlives `rx`, dropped below before it.
    let id = unsafe { rx.irecv(&[rb]) }.unwrap().unwrap();
    let (after, e) = loop {
        match rx.test(id) {
            Ok(Some(_)) => panic!("a message from a stopped sender completed"),
            Ok(None) => thread::sleep(Duration::from_micros(200)),
            Err(e) => break (start.elapsed(), e),
        }
        assert!(start.elapsed() < Duration::from_secs(20), "a hang");
    };
    eprintln!("frozen sender: {e} after {after:?}");
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(4),
        "after {after:?}"
    );
    drop(rx);
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}
