//! An eager message the provider needs the sender's progress to deliver still arrives when the
//! sender stops testing its connection once its send is done, as NCCL does.
//!
//! `ofi_rxm` sends a message above its eager size (`FI_OFI_RXM_BUFFER_SIZE`, 16 KiB by default)
//! in segments, and with `tcp` (manual progress) the later segments leave only while the
//! sender reads its completion queue; so does a message queued behind a full socket. This
//! binary shrinks that buffer to 2 KiB, so that weft's 8 KiB eager messages take the segmented
//! path. It has its own binary because libfabric reads the variable once per process.
//!
//! Real libfabric (`tcp;ofi_rxm` over loopback). Without libfabric it prints "skipped".

mod common;

use std::time::{Duration, Instant};

use common::{ofi_cfg, ofi_transport};
use weft_transport::RecvBuf;

#[test]
fn an_eager_send_reported_done_needs_no_more_tests_to_arrive() {
    // SAFETY: the only test of this binary sets the variable before anything in the process
    // reads the environment on another thread (libfabric is opened by Transport::new below).
    unsafe { std::env::set_var("FI_OFI_RXM_BUFFER_SIZE", "2048") };
    let size = weft_transport::ofi::EAGER_MAX;
    let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    // Before the connections, so dropped after them: a request still posted when an assertion
    // fails ends with its connection, not after its buffer is gone.
    let mut buf = vec![0u8; size];
    let Some(t) = ofi_transport(ofi_cfg("tcp;ofi_rxm", "lo"), "tcp;ofi_rxm") else {
        return;
    };
    // The receiver on a transport of its own: on one shared endpoint its polls would drive
    // the sender's side too.
    let t2 = ofi_transport(ofi_cfg("tcp;ofi_rxm", "lo"), "tcp;ofi_rxm").expect("as the first");
    let mut l = t2.listen(0).unwrap();
    let (mut tx, mut rx) = t.connect_and_accept(0, &l.handle(), &mut l).unwrap();
    assert_eq!(
        tx.ofi_endpoint_users(),
        Some(1),
        "sender alone on its endpoint"
    );
    // A first message both sides poll for: `ofi_rxm` connects on the first send.
    let h = std::thread::spawn(move || {
        tx.send(b"hello", 1).unwrap();
        tx
    });
    let mut small = [0u8; 16];
    assert_eq!(rx.recv(&mut small, 1).unwrap(), 5);
    let mut tx = h.join().unwrap();

    // Before the receive is posted, so it goes eagerly.
    // SAFETY: `data` outlives `tx` (declared before it).
    let mut send = Some(
        unsafe { tx.isend(data.as_ptr(), size, 2) }
            .unwrap()
            .expect("a request slot"),
    );
    let rb = RecvBuf {
        ptr: buf.as_mut_ptr(),
        len: size,
        tag: 2,
    };
    // SAFETY: `buf` outlives `rx` (declared before it).
    let r = unsafe { rx.irecv(&[rb]) }.unwrap().expect("a request slot");
    // Both sides polled, the send only until it is reported done, as NCCL tests it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let got = loop {
        if let Some(id) = send
            && tx.test(id).unwrap().is_some()
        {
            send = None;
        }
        if let Some(done) = rx.test(r).unwrap() {
            break done;
        }
        assert!(
            Instant::now() < deadline,
            "the eager message did not arrive within 5 s (send reported done: {})",
            send.is_none()
        );
    };
    assert_eq!(got.sizes[0], size);
    assert!(buf == data, "payload differs");
}
