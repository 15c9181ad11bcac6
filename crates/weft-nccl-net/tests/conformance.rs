//! Conformance harness: loads the real `libnccl_net_weft.so` with dlopen and drives every
//! exported ncclNet version the way NCCL does (init with a logger, devices, getProperties, the
//! polling listen/connect/accept loop, regMr, isend/irecv/test, close in every state), in one
//! process and across two processes, plus the failure cases (bad handles, silent listener,
//! peer dying mid-message), checking that each is a bounded error logged as WARN.
//!
//! `harness = false`: the environment (WEFT_*) must be set before any thread exists and before
//! the plugin reads it, so `main` sets it, then runs the tests one after another.
//! Set `WEFT_TEST_1GIB=1` to add a 1 GiB message.

use std::ffi::{c_int, c_void};
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use nccl_net_weft::ffi::*;

#[macro_use]
mod common;
use common::*;

fn test_sizes() -> Vec<usize> {
    let mut v = vec![
        0,
        1,
        8,
        127,
        128,
        1024,
        1025,
        65536,
        65537,
        (1 << 20) + 5,
        8 << 20,
        64 << 20,
    ];
    let mut x: u32 = 12345;
    for _ in 0..10 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        v.push((x % (3 << 20)) as usize);
    }
    if std::env::var_os("WEFT_TEST_1GIB").is_some() {
        v.push(1 << 30);
    }
    v
}

/// Sends then receives one message at a time (sender progress interleaved with receiver tests,
/// in one thread, as NCCL's proxy does).
fn transfer(
    net: &Net,
    sc: *mut c_void,
    rc: *mut c_void,
    size: usize,
    tag: c_int,
    extra: usize,
) -> R {
    let src = pattern(size, tag as u8);
    let mut dst = vec![0u8; size + extra];
    let smh = net.reg(sc, &mut src.clone(), NCCL_PTR_HOST)?;
    let rmh = net.reg(rc, &mut dst, NCCL_PTR_HOST)?;
    let rreq = loop {
        if let Some(r) = net.irecv(rc, &mut [&mut dst[..]], &[tag], &[rmh])? {
            break r;
        }
    };
    let sreq = loop {
        if let Some(r) = net.isend(sc, &src, tag, smh)? {
            break r;
        }
    };
    let (mut sd, mut rd) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while sd.is_none() || rd.is_none() {
        if Instant::now() > deadline {
            return Err(format!("{size}-byte transfer did not complete"));
        }
        if sd.is_none() {
            sd = net.test(sreq)?;
        }
        if rd.is_none() {
            rd = net.test(rreq)?;
        }
    }
    let got = rd.unwrap_or_default()[0] as usize;
    if got != size || sd.unwrap_or_default()[0] as usize != size {
        return Err(format!(
            "sizes: sent {size}, test said {:?} / {got}",
            sd.map(|s| s[0])
        ));
    }
    if dst[..size] != src[..] || dst[size..].iter().any(|b| *b != 0) {
        return Err(format!("{size}-byte payload corrupted"));
    }
    net.dereg(sc, smh)?;
    net.dereg(rc, rmh)
}

fn t_init_and_properties(net: &Net) -> R {
    if net.name() != "weft" {
        return Err(format!("name {}", net.name()));
    }
    let ctx = net.init()?;
    let n = net.devices()?;
    if n < 1 {
        return Err("no devices".into());
    }
    let (name, ptr, speed, recvs) = net.props(0)?;
    if name != "lo" || ptr != NCCL_PTR_HOST || speed <= 0 || recvs < 1 {
        return Err(format!(
            "props: {name} ptr={ptr} speed={speed} maxRecvs={recvs}"
        ));
    }
    let mark = log_mark();
    let mut p = [0u8; 256];
    // A device out of range is an error, logged.
    // SAFETY: NCCL-shaped call with a large enough props buffer for every version.
    let r = unsafe {
        match net.v {
            8 => ((*(net.table as *const ncclNet_v8_t)).getProperties)(n, p.as_mut_ptr().cast()),
            _ => ((*(net.table as *const ncclNet_v9_t)).getProperties)(n, p.as_mut_ptr().cast()),
        }
    };
    if r == ncclSuccess || warns_since(mark).is_empty() {
        return Err("getProperties(ndev) did not fail with a WARN".into());
    }
    let log = LOG.lock().unwrap();
    if !log
        .iter()
        .any(|l| l.level == NCCL_LOG_INFO && l.text.contains("NET/weft"))
    {
        return Err("no INFO line through the logger".into());
    }
    // NCCL_DEBUG_SUBSYS leaves NET out by default: the line naming the backend is under INIT
    // too, so that plain NCCL_DEBUG=INFO shows it.
    let init_line = log.iter().find(|l| l.text.contains("backend "));
    match init_line {
        Some(l) if l.subsystems & NCCL_INIT != 0 && l.subsystems & NCCL_NET != 0 => {}
        Some(l) => {
            return Err(format!(
                "the backend line has subsystems {:#x}, not INIT|NET: {}",
                l.subsystems, l.text
            ));
        }
        None => return Err("no INFO line names the backend".into()),
    }
    drop(log);
    net.finalize(ctx)
}

fn t_all_sizes_self_connection(net: &Net) -> R {
    let ctx = net.init()?;
    let (sc, rc) = net.connect_pair(ctx)?;
    for (i, s) in test_sizes().into_iter().enumerate() {
        // Receive buffer larger than the send: the actual size is reported.
        transfer(
            net,
            sc,
            rc,
            s,
            i as c_int,
            if i % 2 == 0 { 0 } else { 4099 },
        )?;
    }
    net.close_send(sc)?;
    net.close_recv(rc)?;
    net.finalize(ctx)
}

fn t_32_in_flight_and_tags(net: &Net) -> R {
    let ctx = net.init()?;
    let (sc, rc) = net.connect_pair(ctx)?;
    let n = 32;
    let srcs: Vec<Vec<u8>> = (0..2 * n)
        .map(|i| pattern(100 + i * 7919, i as u8))
        .collect();
    let mut dsts: Vec<Vec<u8>> = (0..2 * n).map(|_| vec![0u8; 600_000]).collect();
    let mut rreqs = Vec::new();
    for pair in dsts.chunks_mut(2) {
        let (a, b) = pair.split_at_mut(1);
        // Grouped receive of two buffers: tag 10 and tag 20.
        let r = net.irecv(
            rc,
            &mut [&mut a[0][..], &mut b[0][..]],
            &[10, 20],
            &[std::ptr::null_mut(); 2],
        )?;
        rreqs.push(r.ok_or("irecv refused one of 32")?);
    }
    let mut sreqs = Vec::new();
    for (i, s) in srcs.iter().enumerate() {
        let tag = if i % 2 == 0 { 20 } else { 10 };
        sreqs.push(
            net.isend(sc, s, tag, std::ptr::null_mut())?
                .ok_or("isend refused one of 64")?,
        );
    }
    let mut got = vec![None; rreqs.len()];
    let mut sdone = vec![false; sreqs.len()];
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.iter().any(Option::is_none) || sdone.iter().any(|d| !d) {
        if Instant::now() > deadline {
            return Err("in-flight requests did not complete".into());
        }
        for (i, r) in sreqs.iter().enumerate() {
            if !sdone[i] {
                sdone[i] = net.test(*r)?.is_some();
            }
        }
        for (i, r) in rreqs.iter().enumerate() {
            if got[i].is_none() {
                got[i] = net.test(*r)?;
            }
        }
    }
    for (i, g) in got.iter().enumerate() {
        let g = g.unwrap_or_default();
        let (m10, m20) = (&srcs[2 * i + 1], &srcs[2 * i]);
        if g[0] as usize != m10.len() || g[1] as usize != m20.len() {
            return Err(format!("grouped receive {i}: sizes {:?}", &g[..2]));
        }
        if dsts[2 * i][..m10.len()] != m10[..] || dsts[2 * i + 1][..m20.len()] != m20[..] {
            return Err(format!("grouped receive {i}: payload in the wrong buffer"));
        }
    }
    net.close_send(sc)?;
    net.close_recv(rc)?;
    net.finalize(ctx)
}

fn t_close_in_every_state(net: &Net) -> R {
    let ctx = net.init()?;
    // Listen, never accept.
    let mut h = [0u8; 128];
    let lc = net.listen(ctx, &mut h)?;
    net.close_listen(lc)?;
    // Connected, idle.
    let (sc, rc) = net.connect_pair(ctx)?;
    net.close_recv(rc)?;
    net.close_send(sc)?;
    // Requests in flight on both sides (receives posted, big sends half done).
    let (sc, rc) = net.connect_pair(ctx)?;
    let src = vec![3u8; 16 << 20];
    let mut dst = vec![0u8; 4 << 20];
    let _r = net.irecv(rc, &mut [&mut dst[..]], &[0], &[std::ptr::null_mut()])?;
    let _s = net.isend(sc, &src, 1, std::ptr::null_mut())?;
    net.close_send(sc)?;
    net.close_recv(rc)?;
    net.finalize(ctx)
}

fn t_bad_handles_are_warned_errors(net: &Net) -> R {
    let ctx = net.init()?;
    let mut good = [0u8; 128];
    let lc = net.listen(ctx, &mut good)?;
    for (what, edit) in [("magic", 0usize), ("version", 4), ("length", 7)] {
        let mut h = good;
        h[edit] ^= 0x5a;
        let mark = log_mark();
        match net.connect(ctx, &mut h) {
            Err(_) => {}
            Ok(_) => return Err(format!("connect with a wrong {what} succeeded")),
        }
        let w = warns_since(mark);
        if !w.iter().any(|m| m.contains("connect") && m.contains(what)) {
            return Err(format!("no WARN naming the {what}: {w:?}"));
        }
    }
    // Memory the plugin cannot move, too many buffers: errors, not crashes.
    let (sc, rc) = net.connect_pair(ctx)?;
    let mut buf = vec![0u8; 64];
    if net.reg(sc, &mut buf, NCCL_PTR_CUDA).is_ok() {
        return Err("regMr(NCCL_PTR_CUDA) accepted".into());
    }
    let mut many: Vec<Vec<u8>> = (0..9).map(|_| vec![0u8; 8]).collect();
    let mut refs: Vec<&mut [u8]> = many.iter_mut().map(|v| &mut v[..]).collect();
    if net
        .irecv(rc, &mut refs, &[0; 9], &[std::ptr::null_mut(); 9])
        .is_ok()
    {
        return Err("irecv with n=9 accepted".into());
    }
    // NULL pointers: errors.
    if t!(
        net,
        test(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut()
        )
    ) == ncclSuccess
    {
        return Err("test(NULL) succeeded".into());
    }
    net.close_send(sc)?;
    net.close_recv(rc)?;
    net.close_listen(lc)?;
    net.finalize(ctx)
}

fn t_silent_listener_times_out(net: &Net) -> R {
    let ctx = net.init()?;
    let silent = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = silent.local_addr().map_err(|e| e.to_string())?;
    let mut good = [0u8; 128];
    let lc = net.listen(ctx, &mut good)?;
    // Re-point a valid handle at the silent listener.
    let mut h = weft_transport::proto::ListenHandle::decode(&good).map_err(|e| e.to_string())?;
    h.mgmt = addr;
    h.data.clear();
    let mut bytes = h.encode();
    let mark = log_mark();
    let start = Instant::now();
    let err = loop {
        match net.connect(ctx, &mut bytes) {
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Ok(Some(_)) => return Err("connected to a silent listener".into()),
            Err(e) => break e,
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err("connect to a silent listener hung".into());
        }
    };
    let took = start.elapsed();
    let w = warns_since(mark);
    if !w
        .iter()
        .any(|m| m.contains(&addr.to_string()) && m.contains("lo") && m.contains("timed out"))
    {
        return Err(format!(
            "{err}: WARN does not name peer and interface: {w:?}"
        ));
    }
    if took > Duration::from_secs(5) {
        return Err(format!("took {took:?} with a 2 s timeout"));
    }
    net.close_listen(lc)?;
    net.finalize(ctx)
}

/// Two processes: this one listens and receives; a child process (this binary again, in
/// `--child` mode, with the same plugin) connects and sends every size, then sends half of a
/// large message and dies. The receiver must see all data, then a WARN and an error, never hang.
fn t_two_processes_and_peer_death(net: &Net) -> R {
    let ctx = net.init()?;
    let mut handle = [0u8; 128];
    let lc = net.listen(ctx, &mut handle)?;
    let hex: String = handle.iter().map(|b| format!("{b:02x}")).collect();
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .args(["--child", &net.v.to_string(), &hex])
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let rc = loop {
        if let Some(rc) = net.accept(lc)? {
            break rc;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("child never connected".into());
        }
    };
    for (i, s) in test_sizes().into_iter().enumerate() {
        let mut dst = vec![0u8; s + 1];
        let r = net
            .irecv(
                rc,
                &mut [&mut dst[..]],
                &[i as c_int],
                &[std::ptr::null_mut()],
            )?
            .ok_or("irecv refused")?;
        let sizes = net.wait(r)?;
        if sizes[0] as usize != s || dst[..s] != pattern(s, i as u8)[..] {
            let _ = child.kill();
            return Err(format!("message {i} ({s} bytes) from the child is wrong"));
        }
    }
    // The child now starts a 256 MiB message and exits part-way.
    let mut dst = vec![0u8; 256 << 20];
    let mark = log_mark();
    let start = Instant::now();
    // The error may surface in irecv itself (the death was already seen) or in a later test.
    let res = match net.irecv(rc, &mut [&mut dst[..]], &[99], &[std::ptr::null_mut()]) {
        Ok(Some(r)) => net.wait(r),
        Ok(None) => Err("irecv refused".to_string()),
        Err(e) => Err(e),
    };
    let st = child.wait().map_err(|e| e.to_string())?;
    if res.is_ok() {
        return Err("a message cut by the sender's death completed".into());
    }
    if start.elapsed() > Duration::from_secs(10) {
        return Err("peer death took too long to notice".into());
    }
    let w = warns_since(mark);
    if !w
        .iter()
        .any(|m| m.contains("127.0.0.1") && m.contains("lo"))
    {
        return Err(format!("WARN does not name the peer/interface: {w:?}"));
    }
    if st.code() != Some(7) {
        return Err(format!("child exited with {st}"));
    }
    net.close_recv(rc)?;
    net.close_listen(lc)?;
    net.finalize(ctx)
}

fn child(v: u32, hex: &str) -> R {
    let lib: &'static libloading::Library =
        // SAFETY: loading our own plugin; its initialisers have no preconditions.
        Box::leak(Box::new(unsafe { libloading::Library::new(so_path()) }.map_err(|e| e.to_string())?));
    let net = Net::load(lib, v);
    let ctx = net.init()?;
    let mut handle = [0u8; 128];
    for (i, b) in handle.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let sc = loop {
        if let Some(sc) = net.connect(ctx, &mut handle)? {
            break sc;
        }
        if Instant::now() > deadline {
            return Err("connect from the child timed out".into());
        }
    };
    for (i, s) in test_sizes().into_iter().enumerate() {
        let src = pattern(s, i as u8);
        let r = loop {
            if let Some(r) = net.isend(sc, &src, i as c_int, std::ptr::null_mut())? {
                break r;
            }
        };
        net.wait(r)?;
    }
    let big = vec![1u8; 256 << 20];
    let _ = net.isend(sc, &big, 99, std::ptr::null_mut())?;
    for _ in 0..50 {
        let _ = t!(
            net,
            test(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            )
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    std::process::exit(7)
}

fn main() {
    // Single-threaded here: setting the environment is sound, and the plugin reads it at init.
    for (k, v) in [
        ("WEFT_MGMT_IFNAME", "=lo"),
        ("WEFT_TIMEOUT_MS", "2000"),
        ("WEFT_ACCEPT_TIMEOUT_MS", "20000"),
        ("WEFT_NTHREADS", "2"),
        ("WEFT_NSOCKS_PERTHREAD", "2"),
    ] {
        if std::env::var_os(k).is_none() {
            // SAFETY: no other thread exists yet (main's first statement, before any spawn).
            unsafe { std::env::set_var(k, v) };
        }
    }
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--child" {
        let v: u32 = args[2].parse().unwrap_or(8);
        if let Err(e) = child(v, &args[3]) {
            eprintln!("child: {e}");
            std::process::exit(1);
        }
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-')).cloned();
    // SAFETY: loading our own plugin; its initialisers have no preconditions.
    let lib: &'static libloading::Library = Box::leak(Box::new(
        unsafe { libloading::Library::new(so_path()) }.unwrap(),
    ));
    type Case = (&'static str, fn(&Net) -> R);
    let tests: &[Case] = &[
        ("init_and_properties", t_init_and_properties),
        ("all_sizes_self_connection", t_all_sizes_self_connection),
        ("32_in_flight_and_tags", t_32_in_flight_and_tags),
        ("close_in_every_state", t_close_in_every_state),
        (
            "bad_handles_are_warned_errors",
            t_bad_handles_are_warned_errors,
        ),
        ("silent_listener_times_out", t_silent_listener_times_out),
        (
            "two_processes_and_peer_death",
            t_two_processes_and_peer_death,
        ),
    ];
    let (mut passed, mut failed, mut filtered) = (0, 0, 0);
    for v in 8..=12u32 {
        let net = Net::load(lib, v);
        for (name, f) in tests {
            let full = format!("v{v}::{name}");
            if filter.as_ref().is_some_and(|f| !full.contains(f.as_str())) {
                filtered += 1;
                continue;
            }
            let start = Instant::now();
            let r = std::panic::catch_unwind(|| f(&net)).unwrap_or_else(|_| Err("panicked".into()));
            match r {
                Ok(()) => {
                    passed += 1;
                    println!("test {full} ... ok ({:.2?})", start.elapsed());
                }
                Err(e) => {
                    failed += 1;
                    println!("test {full} ... FAILED: {e}");
                }
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
