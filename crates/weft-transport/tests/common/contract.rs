//! The contract suite: what every backend of `weft_transport::Transport` promises alike,
//! written once over a backend-neutral fixture ([`Backend`]) and instantiated per backend by
//! [`contract_suite!`]: tests/tcp.rs for TCP (module `tcp`), tests/ofi.rs for libfabric on
//! `tcp;ofi_rxm` and `shm`, with 8-byte CQ data and, for the data-moving promises, 4-byte
//! (modules `ofi_tcp`, `ofi_shm`, `ofi_tcp_cq4`, `ofi_shm_cq4`). A test's name says backend
//! and promise: `tcp::sizes_0_to_64mib`, `ofi_shm::sizes_0_to_64mib`.
//!
//! The promises come in groups, so that a backend that cannot keep one group is instantiated
//! without it, and says why where it is instantiated:
//!
//! | group | promises |
//! | --- | --- |
//! | `data` | sizes 0..64 MiB; 32 in flight into grouped receives; out-of-step tags |
//! | `ping_pong` | ping-pong on two connections of one transport, and a silent peer |
//! | `setup` | wrong handles refused; a listener that never answers; accept with no peer; a silent socket; stray connections |
//! | `processes` | a sender process that exits right after completion; rings of 3 to 8 processes |
//! | `closing` | closing in flight beside busy connections |
//! | `peers_in_one_process` | a peer that goes away; close with requests in flight; many pairs between two transports in random orders |
//!
//! A backend that is not available here (no libfabric) skips, saying so, and fails under
//! `WEFT_TEST_REQUIRE=all` ([`super::ofi_transport`]); one that libfabric cannot run fails.

use std::thread;
use std::time::{Duration, Instant};

use weft_transport::proto::ListenHandle;
use weft_transport::{Config, Error, RecvConn, SendConn, Stage, Transport};

use super::pattern;

/// Which backend a [`Backend`] makes transports of.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// The TCP backend.
    Tcp,
    /// libfabric on `provider` (and `domain`, unless empty), 4-byte remote CQ data if `cq4`.
    Ofi {
        provider: &'static str,
        domain: &'static str,
        cq4: bool,
    },
}

/// One backend under contract: makes its transports and connection pairs, names it in
/// messages, and says where it differs from the others.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    /// For messages: `tcp`, `ofi tcp;ofi_rxm`, `ofi shm (cq4)`...
    pub name: &'static str,
    pub kind: Kind,
}

/// Short bounds for the tests that wait for a timeout to pass.
const SHORT: Duration = Duration::from_millis(1500);
/// Bounds for the tests that move data on a busy 2-core CI machine in debug mode.
const ROOMY: Duration = Duration::from_secs(20);

impl Backend {
    /// The TCP backend.
    pub const fn tcp() -> Backend {
        Backend {
            name: "tcp",
            kind: Kind::Tcp,
        }
    }

    /// libfabric on `provider` over `domain` (none if empty), with 4-byte CQ data if `cq4`.
    pub const fn ofi(
        name: &'static str,
        provider: &'static str,
        domain: &'static str,
        cq4: bool,
    ) -> Backend {
        Backend {
            name,
            kind: Kind::Ofi {
                provider,
                domain,
                cq4,
            },
        }
    }

    /// The loopback configuration with every bound `timeout` and, for TCP, `nthreads` helper
    /// threads of `nsocks` data streams each (libfabric has neither).
    pub fn config(&self, timeout: Duration, (nthreads, nsocks): (usize, usize)) -> Config {
        match self.kind {
            Kind::Tcp => Config {
                mgmt_ifname: Some("=lo".parse().expect("a valid interface spec")),
                timeout,
                accept_timeout: timeout,
                nthreads,
                nsocks_per_thread: nsocks,
                ..Config::default()
            },
            Kind::Ofi {
                provider,
                domain,
                cq4,
            } => Config {
                timeout,
                accept_timeout: timeout,
                ofi_cq_data_bytes: cq4.then_some(4),
                ..super::ofi_cfg(provider, domain)
            },
        }
    }

    /// A transport of [`Backend::config`], or None when the backend is not available here
    /// (skipped, saying so; a failure under `WEFT_TEST_REQUIRE=all`).
    pub fn transport_with(&self, timeout: Duration, layout: (usize, usize)) -> Option<Transport> {
        let c = self.config(timeout, layout);
        match self.kind {
            Kind::Tcp => {
                let t = Transport::new(c).expect("a TCP transport");
                assert_eq!(t.backend(), "tcp");
                Some(t)
            }
            Kind::Ofi { .. } => super::ofi_transport(c, self.name),
        }
    }

    /// A transport with every bound `timeout`, caller-driven, one data stream.
    pub fn transport(&self, timeout: Duration) -> Option<Transport> {
        self.transport_with(timeout, (0, 1))
    }

    /// The set-ups a promise covers: TCP's `(helper threads, data streams)` layouts as
    /// given; libfabric's one (it has no such layouts).
    pub fn layouts(&self, tcp: &[(usize, usize)]) -> Vec<(usize, usize)> {
        match self.kind {
            Kind::Tcp => tcp.to_vec(),
            Kind::Ofi { .. } => vec![(0, 1)],
        }
    }

    /// `name` and, for TCP, the layout: for messages.
    pub fn with_layout(&self, (nthreads, nsocks): (usize, usize)) -> String {
        match self.kind {
            Kind::Tcp => format!("{} ({nthreads} threads x {nsocks} streams)", self.name),
            Kind::Ofi { .. } => self.name.to_string(),
        }
    }

    /// The connect timeout under which this backend's set-up is reliable on a loaded 2-core
    /// machine in debug mode, for the tests that assert a connection comes up within it:
    /// 1.5 s for TCP, 20 s for libfabric (whose provider opens endpoints and addresses).
    pub fn tight(&self) -> Duration {
        match self.kind {
            Kind::Tcp => SHORT,
            Kind::Ofi { .. } => ROOMY,
        }
    }

    /// `t` connected to itself, polling both ends in one thread, as NCCL's GDR probe does;
    /// for libfabric checked to be on libfabric with the CQ data asked for and (8 bytes)
    /// both directions on one endpoint ([`super::ofi_pair_on`]).
    pub fn pair_on(&self, t: &Transport) -> (SendConn, RecvConn) {
        match self.kind {
            Kind::Tcp => {
                let mut l = t.listen(0).expect("listen");
                let (tx, rx) = t
                    .connect_and_accept(0, &l.handle(), &mut l)
                    .unwrap_or_else(|e| panic!("{}: connect to itself: {e}", self.name));
                assert!(!tx.is_ofi() && !rx.is_ofi(), "{}", self.name);
                (tx, rx)
            }
            Kind::Ofi { .. } => super::ofi_pair_on(t),
        }
    }

    /// The `WEFT_*` environment that configures a child process (the `weft-send-and-exit`
    /// and `weft-ring-rank` binaries) for this backend on loopback with `timeout_ms` bounds.
    pub fn child_env(&self, timeout_ms: u64) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("WEFT_MGMT_IFNAME", "=lo".to_string()),
            ("WEFT_TIMEOUT_MS", timeout_ms.to_string()),
        ];
        match self.kind {
            Kind::Tcp => env.push(("WEFT_BACKEND", "tcp".into())),
            Kind::Ofi {
                provider,
                domain,
                cq4,
            } => {
                env.push(("WEFT_BACKEND", "ofi".into()));
                env.push(("WEFT_OFI_PROVIDER", provider.into()));
                if !domain.is_empty() {
                    env.push(("WEFT_OFI_DOMAIN", domain.into()));
                }
                if cq4 {
                    env.push(("WEFT_OFI_CQ_DATA_BYTES", "4".into()));
                }
            }
        }
        env
    }

    /// Rounds of the sent-means-delivered scenario, (32 x 5,000 bytes, 8 x 300,000 bytes):
    /// from 100 on TCP (3/5 and 2/5), from 60 on libfabric (3/4 and 1/4), whose process
    /// starts cost more; `WEFT_TEST_ROUNDS` sets the sum.
    pub fn exit_rounds(&self) -> (usize, usize) {
        match self.kind {
            Kind::Tcp => {
                let n = super::rounds(100);
                (n * 3 / 5, n * 2 / 5)
            }
            Kind::Ofi { .. } => {
                let n = super::rounds(60);
                (n * 3 / 4, n / 4)
            }
        }
    }

    /// How often each ring size runs: twice on TCP, once on libfabric (`WEFT_TEST_ROUNDS`
    /// overrides).
    pub fn ring_reps(&self) -> usize {
        let default = match self.kind {
            Kind::Tcp => 2,
            Kind::Ofi { .. } => 1,
        };
        std::env::var("WEFT_TEST_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// Whether the last-out rounds of the in-flight close may run between two transports of
    /// this process. Not with `shm`: libfabric 1.17's `shm` progress reads the region of a
    /// peer endpoint of the same process that closed (SIGSEGV), which two processes never see.
    pub fn last_out_across_transports(&self) -> bool {
        !matches!(
            self.kind,
            Kind::Ofi {
                provider: "shm",
                ..
            }
        )
    }
}

/// Instantiates the contract tests of each group (see the module's table) for `backend` (an
/// expression of type [`Backend`]), one `#[test]` per promise, named after it.
#[allow(unused_macros)] // not every test binary that shares this module instantiates it
macro_rules! contract_suite {
    ($backend:expr; $($group:ident),+ $(,)?) => {
        $( $crate::common::contract::contract_group!($group, $backend); )+
    };
}

/// The promises of one group, as `#[test]`s for a backend.
#[allow(unused_macros)]
macro_rules! contract_group {
    (data, $b:expr) => {
        $crate::common::contract::contract_tests!(
            $b;
            sizes_0_to_64mib,
            thirty_two_in_flight_and_grouped_receives_by_tag,
            out_of_step_tags_land_in_later_grouped_receives,
        );
    };
    (ping_pong, $b:expr) => {
        $crate::common::contract::contract_tests!(
            $b;
            ping_pong_completes_and_a_silent_peer_is_a_timeout,
        );
    };
    (setup, $b:expr) => {
        $crate::common::contract::contract_tests!(
            $b;
            wrong_handles_are_refused_before_any_io,
            a_listener_that_never_answers_times_out_naming_the_peer,
            accept_with_no_peer_at_all_times_out,
            a_silent_socket_on_the_listener_times_out,
            stray_connections_are_discarded_while_the_real_peer_connects,
        );
    };
    (processes, $b:expr) => {
        $crate::common::contract::contract_tests!(
            $b;
            a_sender_that_exits_right_after_completion_loses_nothing,
            rings_of_3_to_8_processes,
        );
    };
    (closing, $b:expr) => {
        $crate::common::contract::contract_tests!(
            $b;
            closing_in_flight_leaves_the_busy_connections_alone,
        );
    };
    (peers_in_one_process, $b:expr) => {
        $crate::common::contract::contract_tests!(
            $b;
            a_peer_that_goes_away_is_a_bounded_error,
            close_with_requests_in_flight_frees_everything,
            many_pairs_between_two_transports_open_transfer_and_close_in_random_orders,
        );
    };
}

/// One `#[test]` per named promise, calling it with the backend.
#[allow(unused_macros)]
macro_rules! contract_tests {
    ($b:expr; $($promise:ident),+ $(,)?) => {
        $(
            #[test]
            fn $promise() {
                $crate::common::contract::$promise(&$b);
            }
        )+
    };
}

#[allow(unused_imports)] // not every test binary that shares this module instantiates it
pub(crate) use {contract_group, contract_suite, contract_tests};

/// The message sizes of [`sizes_0_to_64mib`]: 0 to 64 MiB around the TCP inline and chunk
/// limits and the libfabric eager limit, and 20 pseudo-random ones under 4 MiB.
pub fn sizes() -> Vec<usize> {
    let mut v = vec![
        0,
        1,
        7,
        8,
        1023,
        1024,
        1025,
        4096,
        8191,
        8192,
        8193,
        65535,
        65536,
        65537,
        1 << 20,
        (1 << 20) + 3,
        16 << 20,
        64 << 20,
    ];
    let mut x: u64 = 0x9e37_79b9;
    for _ in 0..20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push((x % (4 << 20)) as usize);
    }
    v
}

/// Every size of [`sizes`], in order, from a sender thread into receives 100 bytes larger
/// than the message: the actual size is reported, every byte checked, nothing written past
/// the message. TCP caller-driven with 1 and 4 streams and with helper threads (2 x 2, 1 x 1).
pub fn sizes_0_to_64mib(b: &Backend) {
    for layout in b.layouts(&[(0, 1), (0, 4), (2, 2), (1, 1)]) {
        let Some(t) = b.transport_with(ROOMY, layout) else {
            return;
        };
        let p = b.with_layout(layout);
        let (mut tx, mut rx) = b.pair_on(&t);
        let sizes = sizes();
        let s2 = sizes.clone();
        let h = thread::spawn(move || {
            for (i, n) in s2.iter().enumerate() {
                tx.send(&pattern(*n, i as u8), i as i32)
                    .unwrap_or_else(|e| panic!("send {i} ({n} bytes): {e}"));
            }
            tx
        });
        for (i, n) in sizes.iter().enumerate() {
            let mut buf = vec![0u8; n + 100];
            let got = rx
                .recv(&mut buf, i as i32)
                .unwrap_or_else(|e| panic!("{p}: receive {i} ({n} bytes): {e}"));
            assert_eq!(got, *n, "{p}: message {i}");
            assert!(
                buf[..*n] == pattern(*n, i as u8)[..],
                "{p}: payload of message {i} ({n} bytes) differs"
            );
            assert!(
                buf[*n..].iter().all(|b| *b == 0),
                "{p}: wrote past message {i}"
            );
        }
        drop(h.join().expect("the sender thread"));
    }
}

/// 64 messages all in flight into 32 grouped receives by tag
/// ([`super::thirty_two_in_flight_and_grouped_receives_by_tag`]); TCP with helper threads,
/// 2 x 2 streams.
pub fn thirty_two_in_flight_and_grouped_receives_by_tag(b: &Backend) {
    let Some(t) = b.transport_with(ROOMY, (2, 2)) else {
        return;
    };
    let (mut tx, mut rx) = b.pair_on(&t);
    super::thirty_two_in_flight_and_grouped_receives_by_tag(b.name, &mut tx, &mut rx);
}

/// Out-of-step tags (issue 15): a sender that runs ahead of the receiver's grouped receives
/// (the second tag-1 message comes before the first group's tag-2 one) never kills the
/// connection: the k-th message of a tag lands in the k-th buffer of that tag, whichever way
/// it travels. Sizes 0, 100 and 5,000 bytes (eager, or TCP inline) and 70,000 and 300,000
/// (RMA after the CTS, TCP chunked); groups posted late (one by one, the sender ahead) and
/// early (all before the first send). TCP caller-driven and with helper threads (2 x 2).
pub fn out_of_step_tags_land_in_later_grouped_receives(b: &Backend) {
    for layout in b.layouts(&[(0, 1), (2, 2)]) {
        let Some(t) = b.transport_with(ROOMY, layout) else {
            return;
        };
        let p = b.with_layout(layout);
        for early in [false, true] {
            let (tx, rx) = b.pair_on(&t);
            out_of_step_tags_on(&p, tx, rx, early);
        }
    }
}

/// The rounds of [`out_of_step_tags_land_in_later_grouped_receives`] on one connection pair:
/// 12 groups {tag 1, tag 2} of 300,000-byte buffers, posted one by one after the previous
/// completed (`early` false: the sender runs ahead) or all at once before the sender starts;
/// then one more message shows the connection still works.
pub fn out_of_step_tags_on(p: &str, mut tx: SendConn, mut rx: RecvConn, early: bool) {
    use weft_transport::RecvBuf;
    const GROUPS: usize = 12;
    const CAP: usize = 300_000;
    let size = |k: usize| [0usize, 100, 5000, 70_000, 300_000][k % 5];
    // Message k of the sender: tags 1, 1, 2, 2, 1, 1, 2, 2, ... so that every second message
    // of tag 1 is one group early, and every first of tag 2 one group late.
    let tags: Vec<i32> = (0..2 * GROUPS)
        .map(|k| if (k / 2) % 2 == 0 { 1 } else { 2 })
        .collect();
    // Group g receives the g-th message of each tag.
    let nth = |tag: i32, g: usize| {
        tags.iter()
            .enumerate()
            .filter(|(_, t)| **t == tag)
            .nth(g)
            .map(|(k, _)| k)
            .expect("every group has a message of each tag")
    };
    let mut bufs: Vec<(Vec<u8>, Vec<u8>)> = (0..GROUPS)
        .map(|_| (vec![0xa5u8; CAP], vec![0xa5u8; CAP]))
        .collect();
    let post = |rx: &mut RecvConn, a: &mut Vec<u8>, b: &mut Vec<u8>| {
        let rb = [
            RecvBuf {
                ptr: a.as_mut_ptr(),
                len: CAP,
                tag: 1,
            },
            RecvBuf {
                ptr: b.as_mut_ptr(),
                len: CAP,
                tag: 2,
            },
        ];
        // SAFETY: the buffers outlive the request, tested to completion below.
        unsafe { rx.irecv(&rb) }
            .unwrap_or_else(|e| panic!("{p}: irecv: {e}"))
            .unwrap_or_else(|| panic!("{p}: irecv busy"))
    };
    let check = |g: usize, sizes: &[usize], a: &[u8], b: &[u8]| {
        let (k1, k2) = (nth(1, g), nth(2, g));
        assert_eq!(
            sizes,
            &[size(k1), size(k2)],
            "{p} (early {early}): group {g}"
        );
        for (buf, k, tag) in [(a, k1, 1), (b, k2, 2)] {
            assert!(
                buf[..size(k)] == pattern(size(k), k as u8)[..],
                "{p} (early {early}): group {g} tag {tag} does not hold message {k}"
            );
            assert!(
                buf[size(k)..].iter().all(|x| *x == 0xa5),
                "{p} (early {early}): group {g} tag {tag}: written past message {k}"
            );
        }
    };
    let mut ids = Vec::new();
    if early {
        for (a, b) in bufs.iter_mut() {
            ids.push(post(&mut rx, a, b));
        }
    }
    let tags2 = tags.clone();
    // All sends in flight at once, as NCCL's are: a large one waits for its buffer's receive,
    // which may only be posted once a later message of the other tag completed an earlier
    // group.
    let h = thread::spawn(move || {
        let msgs: Vec<Vec<u8>> = (0..tags2.len())
            .map(|k| pattern(size(k), k as u8))
            .collect();
        let deadline = Instant::now() + ROOMY;
        let mut ids = Vec::new();
        let mut done = Vec::new();
        let poll = |tx: &mut SendConn, ids: &[weft_transport::RequestId], done: &mut Vec<bool>| {
            done.resize(ids.len(), false);
            for (k, (id, d)) in ids.iter().zip(done.iter_mut()).enumerate() {
                if !*d {
                    *d = tx
                        .test(*id)
                        .unwrap_or_else(|e| panic!("send {k}: {e}"))
                        .is_some();
                }
            }
        };
        for (k, tag) in tags2.iter().enumerate() {
            let id = loop {
                assert!(Instant::now() < deadline, "isend {k} stuck");
                // SAFETY: `msgs` outlives the requests, tested to completion below.
                let r = unsafe { tx.isend(msgs[k].as_ptr(), msgs[k].len(), *tag) }
                    .unwrap_or_else(|e| panic!("send {k} (tag {tag}, {} bytes): {e}", size(k)));
                if let Some(id) = r {
                    break id;
                }
                poll(&mut tx, &ids, &mut done);
            };
            ids.push(id);
        }
        loop {
            poll(&mut tx, &ids, &mut done);
            if done.iter().all(|d| *d) {
                break;
            }
            assert!(Instant::now() < deadline, "sends stuck: {done:?}");
        }
        tx
    });
    let deadline = Instant::now() + ROOMY;
    if early {
        let mut done: Vec<Option<Vec<usize>>> = vec![None; GROUPS];
        while done.iter().any(Option::is_none) {
            assert!(Instant::now() < deadline, "{p} (early): stuck: {done:?}");
            for (id, d) in ids.iter().zip(done.iter_mut()) {
                if d.is_none() {
                    *d = rx
                        .test(*id)
                        .unwrap_or_else(|e| panic!("{p} (early): {e}"))
                        .map(|c| c.sizes().to_vec());
                }
            }
        }
        for (g, d) in done.iter().enumerate() {
            let (a, b) = &bufs[g];
            check(g, d.as_deref().unwrap_or_default(), a, b);
        }
    } else {
        thread::sleep(Duration::from_millis(50));
        for (g, (a, b)) in bufs.iter_mut().enumerate() {
            let id = post(&mut rx, a, b);
            let c = loop {
                assert!(Instant::now() < deadline, "{p}: group {g} stuck");
                if let Some(c) = rx
                    .test(id)
                    .unwrap_or_else(|e| panic!("{p}: group {g}: {e}"))
                {
                    break c;
                }
            };
            check(g, c.sizes(), a, b);
        }
    }
    let mut tx = h.join().expect("the sender thread");
    // Still one working connection.
    tx.send(b"after", 9)
        .unwrap_or_else(|e| panic!("{p}: send after: {e}"));
    let mut buf = [0u8; 5];
    assert_eq!(
        rx.recv(&mut buf, 9)
            .unwrap_or_else(|e| panic!("{p}: receive after: {e}")),
        5
    );
    assert_eq!(&buf, b"after", "{p}");
}

/// `ping_pong`, which the latency benchmarks time: both sides complete 200 round trips of
/// 64 bytes (each side on a thread, two connections of one transport), the client reports a
/// time, and a side whose peer never sends fails with a data timeout within its bound
/// (200 ms asked, 5 s allowed). TCP with one helper thread.
pub fn ping_pong_completes_and_a_silent_peer_is_a_timeout(b: &Backend) {
    let Some(t) = b.transport_with(ROOMY, (1, 1)) else {
        return;
    };
    let p = b.name;
    let (tx1, rx1) = b.pair_on(&t);
    let (tx2, rx2) = b.pair_on(&t);
    // Side A sends on connection 1 and receives on 2; side B the other way round.
    let side_b = thread::spawn(move || {
        weft_transport::ping_pong(tx2, rx1, 64, 200, false, Duration::from_secs(10))
    });
    let a = weft_transport::ping_pong(tx1, rx2, 64, 200, true, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{p}: client: {e}"));
    side_b
        .join()
        .expect("the server thread")
        .unwrap_or_else(|e| panic!("{p}: server: {e}"));
    assert!(a.elapsed > Duration::ZERO, "{p}");

    // A server whose client never starts: the wait for the first message times out.
    let (tx, rx) = b.pair_on(&t);
    let start = Instant::now();
    let err = weft_transport::ping_pong(tx, rx, 8, 10, false, Duration::from_millis(200))
        .expect_err("a ping-pong with a silent peer succeeded");
    assert_timeout(p, &err, Stage::Data, start, Duration::from_secs(5));
}

/// `err` is a timeout of `stage`, and came less than `bound` after `start`.
fn assert_timeout(p: &str, err: &Error, stage: Stage, start: Instant, bound: Duration) {
    assert!(
        matches!(err, Error::Timeout { stage: s, .. } if *s == stage),
        "{p}: {err}"
    );
    assert!(
        start.elapsed() < bound,
        "{p}: {err} after {:?}",
        start.elapsed()
    );
}

/// A handle with a bad magic, an unknown version, or the wrong length is refused by
/// `connect` as a handle error, before any I/O.
pub fn wrong_handles_are_refused_before_any_io(b: &Backend) {
    let Some(t) = b.transport(SHORT) else {
        return;
    };
    let p = b.name;
    let l = t.listen(0).expect("listen");
    let mut h = l.handle();
    h[0] = b'X';
    let r = t.connect(0, &h);
    assert!(matches!(r, Err(Error::Handle(_))), "{p}: bad magic: {r:?}");
    let mut h = l.handle();
    h[4] = 9;
    let r = t.connect(0, &h);
    assert!(
        matches!(r, Err(Error::Handle(_))),
        "{p}: unknown version: {r:?}"
    );
    let r = t.connect(0, &[0u8; 10]);
    assert!(matches!(r, Err(Error::Handle(_))), "{p}: short: {r:?}");
}

/// A connect to a TCP listener that accepts and never answers fails with a handshake timeout
/// about one timeout (1.5 s) after it started, naming the peer and the interface (`lo`), in
/// the error's fields and in its text. TCP with 2 streams.
pub fn a_listener_that_never_answers_times_out_naming_the_peer(b: &Backend) {
    let Some(t) = b.transport_with(SHORT, (0, 2)) else {
        return;
    };
    let p = b.name;
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("addr");
    let h = ListenHandle {
        nonce: 1,
        mgmt: addr,
        data: vec![],
    }
    .encode();
    let start = Instant::now();
    let mut c = t.connect(0, &h).expect("connect starts");
    let err = loop {
        match c.poll() {
            Ok(None) => thread::sleep(Duration::from_millis(1)),
            Ok(Some(_)) => panic!("{p}: connected to a silent listener"),
            Err(e) => break e,
        }
    };
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(4),
        "{p}: {took:?}"
    );
    match &err {
        Error::Timeout {
            peer,
            iface,
            stage: Stage::Handshake,
            ..
        } => {
            assert_eq!(*peer, addr, "{p}");
            assert_eq!(iface, "lo", "{p}");
        }
        e => panic!("{p}: {e}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&addr.to_string()) && msg.contains("lo"),
        "{p}: {msg}"
    );
}

/// With no peer at all, `wait` fails with an accept timeout within 4 s (1.5 s asked).
pub fn accept_with_no_peer_at_all_times_out(b: &Backend) {
    let Some(t) = b.transport(SHORT) else {
        return;
    };
    let p = b.name;
    let mut l = t.listen(0).expect("listen");
    let start = Instant::now();
    let err = l.wait().expect_err("accepted with no peer");
    assert_timeout(p, &err, Stage::Accept, start, Duration::from_secs(4));
}

/// A socket that connects and never speaks is discarded when the handshake timeout passes,
/// reported as an accept timeout naming it; with no real peer the accept then times out,
/// within 4 s (1.5 s asked).
pub fn a_silent_socket_on_the_listener_times_out(b: &Backend) {
    let Some(t) = b.transport(SHORT) else {
        return;
    };
    let p = b.name;
    let mut l = t.listen(0).expect("listen");
    let s = std::net::TcpStream::connect(l.handle_info().mgmt).expect("connect");
    let me = s.local_addr().expect("addr");
    let start = Instant::now();
    let err = loop {
        match l.accept() {
            Ok(None) => thread::sleep(Duration::from_millis(2)),
            Ok(Some(_)) => panic!("{p}: accepted a silent socket"),
            Err(e) => break e,
        }
    };
    assert_timeout(p, &err, Stage::Accept, start, Duration::from_secs(4));
    let gone = l.take_discarded();
    assert!(
        matches!(&gone[..], [Error::Timeout { peer, stage: Stage::Accept, .. }] if *peer == me),
        "{p}: {gone:?}"
    );
    drop(s);
}

/// Garbage, a bare connect and close, a health probe and a half-open connection on every
/// listening port during a real connect: each is discarded and reported naming its peer, the
/// real connection comes up within the backend's [`Backend::tight`] bound; 100 rounds
/// (`WEFT_TEST_ROUNDS` overrides), to catch a 1-in-20 failure.
pub fn stray_connections_are_discarded_while_the_real_peer_connects(b: &Backend) {
    let Some(t) = b.transport(b.tight()) else {
        return;
    };
    super::strays_do_not_fail_a_real_connect(&t, super::rounds(100));
}

/// Sent means delivered: a sender process that closes and exits as soon as its 32 sends of
/// 5,000 bytes (TCP inline, libfabric eager) are reported done loses none of them; then 8 of
/// 300,000 bytes (chunked, RMA); rounds from [`Backend::exit_rounds`]. Closing the receiving
/// end once the sender's process is gone takes less than
/// [`super::CLOSE_AFTER_PEER_GONE`] (it has nothing left to wait for).
pub fn a_sender_that_exits_right_after_completion_loses_nothing(b: &Backend) {
    let Some(t) = b.transport(ROOMY) else {
        return;
    };
    let env = b.child_env(20_000);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (small, large) = b.exit_rounds();
    super::sender_exits_right_after_completion(&t, &env, small, 32, 5000);
    super::sender_exits_right_after_completion(&t, &env, large, 8, 300_000);
}

/// Rings of 3 to 8 rank processes: every rank sends to the next and receives from the
/// previous one at once, sizes up to 1 MiB, 12 rounds, each ring size
/// [`Backend::ring_reps`] times.
pub fn rings_of_3_to_8_processes(b: &Backend) {
    // The ranks make their own transports; this one only says whether the backend is here.
    if b.transport(ROOMY).is_none() {
        return;
    }
    let env = b.child_env(20_000);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for _ in 0..b.ring_reps() {
        for n in 3..=8 {
            super::ring(n, &env, 12, 1 << 20);
        }
    }
}

/// Closing connections with requests in flight never harms the other connections between
/// the same two transports (TCP: which share control streams; libfabric: endpoints of their
/// own, as between two processes, every connection on one provider connection), and the last
/// one out closes cleanly: see [`super::closing_in_flight_leaves_the_busy_connections_alone`]
/// (100 rounds, `WEFT_TEST_ROUNDS` overrides; `WEFT_TEST_BUSY_PAIRS` busy pairs, default 1).
pub fn closing_in_flight_leaves_the_busy_connections_alone(b: &Backend) {
    let (Some(t), Some(u)) = (b.transport(ROOMY), b.transport(ROOMY)) else {
        return;
    };
    let last_out = if b.last_out_across_transports() {
        &u
    } else {
        &t
    };
    super::closing_in_flight_leaves_the_busy_connections_alone(b.name, &t, &u, last_out);
}

/// A peer that goes away is an error within 3 s, not a hang: a sender that drops its
/// connection in the middle of a 32 MiB message (TCP: a close or a socket error; libfabric,
/// whose sender waits for the receive, a close), a sender gone before the receive is posted,
/// and a receiver gone while its sender waits (both a close). TCP caller-driven and with 2
/// helper threads, 2 streams each.
pub fn a_peer_that_goes_away_is_a_bounded_error(b: &Backend) {
    let gone = |e: &Error| match b.kind {
        Kind::Tcp => matches!(e, Error::Closed { .. } | Error::Io { .. }),
        Kind::Ofi { .. } => matches!(e, Error::Closed { .. }),
    };
    for layout in b.layouts(&[(0, 2), (2, 2)]) {
        let Some(t) = b.transport_with(ROOMY, layout) else {
            return;
        };
        let p = b.with_layout(layout);
        // The sender goes away mid-message.
        let (mut tx, mut rx) = b.pair_on(&t);
        let big = vec![7u8; 32 << 20];
        // SAFETY: `big` outlives `tx`, which is dropped below before `big`.
        let _ = unsafe { tx.isend(big.as_ptr(), big.len(), 0) }
            .expect("isend")
            .expect("a request slot");
        thread::sleep(Duration::from_millis(50));
        drop(tx);
        let mut buf = vec![0u8; 32 << 20];
        let start = Instant::now();
        let e = rx
            .recv(&mut buf, 0)
            .expect_err("received from a closed sender");
        assert!(gone(&e), "{p}: mid-message: {e}");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{p}: mid-message: took {:?}",
            start.elapsed()
        );
        // The sender is gone before the receive is posted.
        let (tx, mut rx) = b.pair_on(&t);
        drop(tx);
        let mut buf = vec![0u8; 1 << 20];
        let start = Instant::now();
        let e = rx
            .recv(&mut buf, 0)
            .expect_err("received from a closed sender");
        assert!(matches!(e, Error::Closed { .. }), "{p}: sender gone: {e}");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{p}: sender gone: took {:?}",
            start.elapsed()
        );
        // The receiver is gone while the sender sends to it. A send may complete into the
        // kernel's socket buffer before the peer's reset arrives (with net.core.wmem_max at
        // 4 MiB a whole 1 MiB message fits), so the bound is on the sender learning it: the
        // sends that follow end in `Closed` within it, never a hang.
        let (mut tx, rx) = b.pair_on(&t);
        drop(rx);
        let big = vec![0u8; 1 << 20];
        let start = Instant::now();
        let e = loop {
            match tx.send(&big, 0) {
                Err(e) => break e,
                Ok(_) if start.elapsed() < Duration::from_secs(3) => continue,
                Ok(_) => panic!("{p}: receiver gone: every send for 3 s completed"),
            }
        };
        assert!(matches!(e, Error::Closed { .. }), "{p}: receiver gone: {e}");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{p}: receiver gone: took {:?}",
            start.elapsed()
        );
    }
}

/// Closing both ends with 8 receives of 4 MiB and 4 sends of 4 MiB posted and nothing
/// completed returns (TCP: joining its helper threads, 0, 1 and 4 of them) and frees
/// everything; the transport then still connects and moves a message.
pub fn close_with_requests_in_flight_frees_everything(b: &Backend) {
    use weft_transport::RecvBuf;
    for layout in b.layouts(&[(0, 1), (1, 1), (4, 1)]) {
        let Some(t) = b.transport_with(SHORT, layout) else {
            return;
        };
        let p = b.with_layout(layout);
        // Before the connection, so dropped after it.
        let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 4 << 20]).collect();
        let src = vec![1u8; 4 << 20];
        let (mut tx, mut rx) = b.pair_on(&t);
        for buf in &mut bufs {
            let rb = [RecvBuf {
                ptr: buf.as_mut_ptr(),
                len: buf.len(),
                tag: 0,
            }];
            // SAFETY: `bufs` outlives `rx`, which is dropped below.
            unsafe { rx.irecv(&rb) }
                .expect("irecv")
                .expect("a request slot");
        }
        for _ in 0..4 {
            // SAFETY: `src` outlives `tx`, which is dropped below.
            unsafe { tx.isend(src.as_ptr(), src.len(), 0) }
                .expect("isend")
                .expect("a request slot");
        }
        drop(rx);
        drop(tx);
        let (mut tx, mut rx) = b.pair_on(&t);
        let mut dst = vec![0u8; 100];
        let got = super::transfer(&mut tx, &mut rx, &pattern(100, 5), &mut dst, 3);
        assert_eq!(got, 100, "{p}: a pair after the close");
        assert_eq!(dst, pattern(100, 5), "{p}: a pair after the close");
    }
}

/// A small xorshift generator: random orders that a failing run can replay from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One side's thread of [`many_pairs_between_two_transports_open_transfer_and_close_in_random_orders`]:
/// `rounds` times, a pair of connections with its peer thread (one each way, both opened at
/// once; TCP: so they join or move onto control streams shared with other threads'
/// connections), a ping-pong of random sizes, and a close of its two ends in a random order
/// after a random pause. Returns an error naming the round and step instead of panicking.
fn pair_thread(
    t: Transport,
    rounds: usize,
    seed: u64,
    first: bool,
    to_peer: std::sync::mpsc::Sender<[u8; 128]>,
    from_peer: std::sync::mpsc::Receiver<[u8; 128]>,
) -> Result<(), String> {
    let mut rng = Rng(seed);
    for round in 0..rounds {
        let at = |what: &str, e: Error| format!("seed {seed:#x} round {round}: {what}: {e}");
        let mut l = t.listen(0).map_err(|e| at("listen", e))?;
        to_peer.send(l.handle()).map_err(|e| format!("{e}"))?;
        let h = from_peer
            .recv_timeout(Duration::from_secs(20))
            .map_err(|e| format!("seed {seed:#x} round {round}: peer handle: {e}"))?;
        let (mut tx, mut rx) = t
            .connect_and_accept(0, &h, &mut l)
            .map_err(|e| at("connect", e))?;
        let n = 1 + rng.below(40) as usize;
        for i in 0..n {
            let size = match rng.below(4) {
                0 => 0,
                1 => rng.below(2000) as usize,
                2 => rng.below(20_000) as usize,
                _ => rng.below(300_000) as usize,
            };
            // Both sides draw the same sizes: the peer's generator runs the same sequence.
            let data = pattern(size, (i + round) as u8);
            let mut buf = vec![0u8; size];
            if first {
                tx.send(&data, i as i32).map_err(|e| at("send", e))?;
                let got = rx.recv(&mut buf, i as i32).map_err(|e| at("recv", e))?;
                if got != size || buf != data {
                    return Err(format!("seed {seed:#x} round {round}: message {i} differs"));
                }
            } else {
                let got = rx.recv(&mut buf, i as i32).map_err(|e| at("recv", e))?;
                if got != size || buf != data {
                    return Err(format!("seed {seed:#x} round {round}: message {i} differs"));
                }
                tx.send(&data, i as i32).map_err(|e| at("send", e))?;
            }
        }
        thread::sleep(Duration::from_micros(rng.below(3000)));
        if rng.below(2) == 0 {
            drop(tx);
            thread::sleep(Duration::from_micros(rng.below(1000)));
            drop(rx);
        } else {
            drop(rx);
            thread::sleep(Duration::from_micros(rng.below(1000)));
            drop(tx);
        }
        drop(l);
    }
    Ok(())
}

/// Several connection pairs between the same two transports (two ranks of several
/// communicators), 4 thread pairs opening, transferring and closing them in random orders,
/// 25 rounds each: closing one pair never fails another, though they share control streams
/// (TCP) or endpoints and provider connections (libfabric); all within 120 s, else a failure
/// (not a hang). The seeds are in the failure messages.
pub fn many_pairs_between_two_transports_open_transfer_and_close_in_random_orders(b: &Backend) {
    const THREADS: u64 = 4;
    const ROUNDS: usize = 25;
    let (Some(ta), Some(tb)) = (b.transport(ROOMY), b.transport(ROOMY)) else {
        return;
    };
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos() as u64
        ^ u64::from(std::process::id());
    let start = Instant::now();
    let mut hs = Vec::new();
    let mut seeds = Vec::new();
    for i in 0..THREADS {
        let (to_b, from_a) = std::sync::mpsc::channel();
        let (to_a, from_b) = std::sync::mpsc::channel();
        let seed = (base.wrapping_mul(i + 1) | 1).wrapping_add(i);
        seeds.push(seed);
        let (ta, tb) = (ta.clone(), tb.clone());
        hs.push(thread::spawn(move || {
            pair_thread(ta, ROUNDS, seed, true, to_b, from_b)
        }));
        hs.push(thread::spawn(move || {
            pair_thread(tb, ROUNDS, seed, false, to_a, from_a)
        }));
    }
    // A hang fails the test naming the seeds (and leaves its threads behind) instead of
    // holding up the run.
    while !hs.iter().all(|h| h.is_finished()) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{}: not done in 120 s; seeds {seeds:#x?}",
            b.name
        );
        thread::sleep(Duration::from_millis(20));
    }
    let errors: Vec<String> = hs
        .into_iter()
        .filter_map(|h| h.join().expect("a pair thread").err())
        .collect();
    assert!(errors.is_empty(), "{}: {errors:#?}", b.name);
}
