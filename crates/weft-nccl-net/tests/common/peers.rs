//! Dead and frozen peers through the plugin's ABI, from separate processes in namespace hosts:
//! one worker mode and the scenarios, shared by the TCP (`cluster`) and ofi (`cluster_ofi`)
//! harnesses, which pass a `spawn` that starts a worker of their backend.
//!
//! The worker (`peer ROLE SIZE COUNT PAUSE_AT`) connects as a sender (`send`), a receiver
//! (`recv`) or both ways with one peer (`duplex`, as NCCL's rings do), then moves `COUNT`
//! messages of `SIZE` bytes, printing `STEP i` after each; after step `PAUSE_AT` it prints
//! `PAUSED` and blocks on its stdin until `GO` without calling into the plugin (a live process
//! busy elsewhere; the parent may stop it with SIGSTOP instead). On an error it closes its
//! connections first, as NCCL's `ncclCommAbort` does, so the parent's time to the `ERR` line
//! includes the plugin's close.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use super::{Lines, Net, R, Worker, hex, pattern, unhex};

/// Connections of one worker (null where the role has none).
struct Comms {
    send: *mut c_void,
    recv: *mut c_void,
}

impl Comms {
    /// Closes both (errors ignored: this runs after a failure too).
    fn close(&mut self, net: &Net) {
        if !self.send.is_null() {
            let _ = net.close_send(std::mem::replace(&mut self.send, std::ptr::null_mut()));
        }
        if !self.recv.is_null() {
            let _ = net.close_recv(std::mem::replace(&mut self.recv, std::ptr::null_mut()));
        }
    }
}

/// The `peer` worker mode (see the module docs); `a` is `ROLE SIZE COUNT PAUSE_AT`.
pub fn worker_peer(net: &Net, ctx: *mut c_void, a: &[String], stdin: &mut Lines) -> R {
    let role = a.first().map(String::as_str).ok_or("role")?;
    let num = |i: usize| -> R<usize> {
        a.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or(format!("arg {i}"))
    };
    let (size, count, pause_at) = (num(1)?, num(2)?, num(3)?);
    let (sends, recvs) = match role {
        "send" => (true, false),
        "recv" => (false, true),
        "duplex" | "ring" | "ring-first" => (true, true),
        other => return Err(format!("unknown role {other:?}")),
    };
    // In a ring each step's send needs the step's receive first (as a ring all_reduce's GPU
    // waits for the previous rank's data), except on the rank that starts it.
    let order = match role {
        "ring" => Order::RecvThenSend,
        "ring-first" => Order::SendThenRecv,
        _ => Order::Together,
    };
    let mut comms = Comms {
        send: std::ptr::null_mut(),
        recv: std::ptr::null_mut(),
    };
    let r = connect(net, ctx, sends, recvs, stdin, &mut comms).and_then(|()| {
        println!("CONNECTED");
        run(net, &comms, order, (size, count, pause_at), stdin)
    });
    comms.close(net);
    r
}

fn connect(
    net: &Net,
    ctx: *mut c_void,
    sends: bool,
    recvs: bool,
    stdin: &mut Lines,
    comms: &mut Comms,
) -> R {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lc = std::ptr::null_mut();
    if recvs {
        let mut h = [0u8; 128];
        lc = net.listen_on(ctx, 0, &mut h)?;
        println!("H {}", hex(&h));
    }
    let mut peer = if sends {
        let l = stdin.next()?;
        Some(unhex(l.strip_prefix("C ").ok_or("expected C")?)?)
    } else {
        None
    };
    // Both ways at once, polled in turn, as NCCL connects its rings.
    while (sends && comms.send.is_null()) || (recvs && comms.recv.is_null()) {
        if let Some(h) = peer.as_mut()
            && comms.send.is_null()
            && let Some(c) = net.connect_on(ctx, 0, h)?
        {
            comms.send = c;
        }
        if recvs
            && comms.recv.is_null()
            && let Some(c) = net.accept(lc)?
        {
            comms.recv = c;
        }
        if Instant::now() > deadline {
            return Err("connect/accept stuck".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    if recvs {
        net.close_listen(lc)?;
    }
    Ok(())
}

/// In which order a worker with both connections moves each step's two messages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// Both posted at once.
    Together,
    /// The receive completes before the send is posted.
    RecvThenSend,
    /// The send completes before the receive is posted.
    SendThenRecv,
}

/// Moves the step's messages: `send` and `recv` say which to post now.
fn step(net: &Net, c: &Comms, (send, recv): (bool, bool), src: &[u8], dst: &mut [u8]) -> R {
    let mut sreq = None;
    let mut rreq = None;
    while send && !c.send.is_null() && sreq.is_none() {
        sreq = net.isend(c.send, src, 1, std::ptr::null_mut())?;
    }
    while recv && !c.recv.is_null() && rreq.is_none() {
        rreq = net.irecv(c.recv, &mut [&mut *dst], &[1], &[std::ptr::null_mut()])?;
    }
    // No deadline of our own: the plugin must bound every wait (the parent bounds us).
    while sreq.is_some() || rreq.is_some() {
        if let Some(q) = sreq
            && net.test(q)?.is_some()
        {
            sreq = None;
        }
        if let Some(q) = rreq
            && let Some(s) = net.test(q)?
        {
            if s[0] as usize != src.len() || dst != src {
                return Err("a message arrived wrong".into());
            }
            dst.fill(0);
            rreq = None;
        }
    }
    Ok(())
}

fn run(
    net: &Net,
    c: &Comms,
    order: Order,
    (size, count, pause_at): (usize, usize, usize),
    stdin: &mut Lines,
) -> R {
    let src = pattern(size, 7);
    let mut dst = vec![0u8; size];
    for i in 0..count {
        let r = match order {
            Order::Together => step(net, c, (true, true), &src, &mut dst),
            Order::RecvThenSend => step(net, c, (false, true), &src, &mut dst)
                .and_then(|()| step(net, c, (true, false), &src, &mut dst)),
            Order::SendThenRecv => step(net, c, (true, false), &src, &mut dst)
                .and_then(|()| step(net, c, (false, true), &src, &mut dst)),
        };
        r.map_err(|e| format!("step {i}: {e}"))?;
        println!("STEP {i}");
        if i == pause_at {
            println!("PAUSED");
            if stdin.next()? != "GO" {
                return Err("expected GO".into());
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------------------------

/// Starts a worker in host `host` with the `peer` arguments given (the harness adds its own).
pub type Spawn<'a> = dyn Fn(usize, &[&str]) -> R<Worker> + 'a;

/// Sentinel `PAUSE_AT`: never pause.
const NEVER: usize = usize::MAX;

/// Starts `roles.0` in host 0 and `roles.1` in host 1 and connects them.
fn start(
    spawn: &Spawn<'_>,
    roles: (&str, &str),
    size: usize,
    count: usize,
    pause_at: (usize, usize),
) -> R<(Worker, Worker)> {
    let (s, n) = (size.to_string(), count.to_string());
    let (p0, p1) = (pause_at.0.to_string(), pause_at.1.to_string());
    let mut w0 = spawn(0, &["peer", roles.0, &s, &n, &p0])?;
    let mut w1 = spawn(1, &["peer", roles.1, &s, &n, &p1])?;
    let listens = |r: &str| r != "send";
    let sends = |r: &str| r != "recv";
    let h0 = if listens(roles.0) {
        Some(w0.expect("H ", Duration::from_secs(30))?)
    } else {
        None
    };
    let h1 = if listens(roles.1) {
        Some(w1.expect("H ", Duration::from_secs(30))?)
    } else {
        None
    };
    if sends(roles.0) {
        let h = h1.as_ref().ok_or("host 1 does not listen")?;
        w0.send(&format!("C {}", &h[2..]))?;
    }
    if sends(roles.1) {
        let h = h0.as_ref().ok_or("host 0 does not listen")?;
        w1.send(&format!("C {}", &h[2..]))?;
    }
    w0.expect("CONNECTED", Duration::from_secs(30))?;
    w1.expect("CONNECTED", Duration::from_secs(30))?;
    Ok((w0, w1))
}

/// Waits for `w`'s `ERR` line; returns how long after `t0` it came and the line. A `DONE`, an
/// exit without `ERR`, or nothing within `t0 + limit` (a hang) is a failure.
fn err_after(w: &mut Worker, t0: Instant, limit: Duration) -> R<(Duration, String)> {
    loop {
        let left = (t0 + limit).saturating_duration_since(Instant::now());
        match w.lines.recv_timeout(left) {
            Ok(l) if l.starts_with("ERR") => return Ok((t0.elapsed(), l)),
            Ok(l) if l.starts_with("DONE") => {
                return Err(format!("host {} completed despite the fault", w.host));
            }
            Ok(_) => {}
            Err(_) => {
                return Err(format!(
                    "host {}: no error within {limit:?} of the fault: a hang",
                    w.host
                ));
            }
        }
    }
}

/// Stops (SIGSTOP) a worker's process.
fn stop(w: &Worker) -> R {
    let pid = i32::try_from(w.child.id()).map_err(|e| e.to_string())?;
    // SAFETY: kill(2) on our own child's pid, which has not been waited for (the Worker waits
    // for it on drop, after SIGKILL, which ends a stopped process too).
    if unsafe { libc::kill(pid, libc::SIGSTOP) } != 0 {
        return Err(format!("SIGSTOP: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn verbose(what: &str, after: Duration, line: &str) {
    if std::env::var_os("WEFT_TEST_VERBOSE").is_some() {
        eprintln!("{what}: after {after:?}: {line}");
    }
}

/// Scheduling slack on a loaded 2-core machine, on top of each bound below.
const SLACK: Duration = Duration::from_millis(500);

/// The bound for a frozen peer: the timeout `t` plus its probe interval (`t / 4`), and
/// [`SLACK`].
pub fn frozen_bound(t: Duration) -> Duration {
    t + t / 4 + SLACK
}

/// A sender stopped (SIGSTOP) right after a message completed, while its receiver has already
/// posted the next receive: the receiver fails within [`frozen_bound`] of the stop.
pub fn frozen_sender_after_a_message(spawn: &Spawn<'_>, t: Duration) -> R {
    let (mut tx, mut rx) = start(spawn, ("send", "recv"), 1 << 20, 5, (2, NEVER))?;
    rx.expect("STEP 2", Duration::from_secs(30))?;
    tx.expect("PAUSED", Duration::from_secs(30))?;
    stop(&tx)?;
    let t0 = Instant::now();
    let (after, l) = err_after(&mut rx, t0, 4 * t + Duration::from_secs(10))?;
    verbose("receiver of a frozen sender", after, &l);
    if after > frozen_bound(t) {
        return Err(format!(
            "the receiver failed {after:?} after its sender stopped, over {:?}: {l}",
            frozen_bound(t)
        ));
    }
    Ok(())
}

/// A receiver stopped (SIGSTOP) while its sender keeps sending 16 MiB messages: the sender
/// fails within [`frozen_bound`] of the stop.
pub fn frozen_receiver_while_sending(spawn: &Spawn<'_>, t: Duration) -> R {
    let (mut tx, mut rx) = start(spawn, ("send", "recv"), 16 << 20, 1000, (NEVER, 1))?;
    rx.expect("PAUSED", Duration::from_secs(30))?;
    stop(&rx)?;
    let t0 = Instant::now();
    let (after, l) = err_after(&mut tx, t0, 4 * t + Duration::from_secs(10))?;
    verbose("sender to a frozen receiver", after, &l);
    if after > frozen_bound(t) {
        return Err(format!(
            "the sender failed {after:?} after its receiver stopped, over {:?}: {l}",
            frozen_bound(t)
        ));
    }
    Ok(())
}

/// Live peers that only take their time are never an error: a sender that pauses 2.5
/// timeouts between two messages while its receiver has the next receive posted, and a
/// receiver that pauses 2.5 timeouts while its sender keeps 16 MiB messages coming. Every
/// message arrives intact.
pub fn slow_peers_are_not_errors(spawn: &Spawn<'_>, t: Duration) -> R {
    for (size, pause) in [(1 << 20, (2, NEVER)), (16 << 20, (NEVER, 1))] {
        let (mut tx, mut rx) = start(spawn, ("send", "recv"), size, 5, pause)?;
        let paused = if pause.0 == NEVER { &mut rx } else { &mut tx };
        paused.expect("PAUSED", Duration::from_secs(30))?;
        std::thread::sleep(t * 5 / 2);
        paused.send("GO")?;
        rx.expect("DONE", Duration::from_secs(60))
            .map_err(|e| format!("{size}-byte messages, pause {pause:?}: {e}"))?;
        tx.expect("DONE", Duration::from_secs(60))
            .map_err(|e| format!("{size}-byte messages, pause {pause:?}: {e}"))?;
    }
    Ok(())
}

/// A ring of three hosts (each sends to the next and receives from the previous one, a step's
/// send waiting for its receive, as a ring all_reduce's does) with host 1 killed (SIGKILL)
/// mid-traffic: host 2, which receives from it, fails; host 0, which only sends to it and
/// whose sends are all done, learns through host 2 closing its connections. Both fail and
/// have closed theirs (as `ncclCommAbort` does) within `bound` of the kill.
pub fn killed_rank_of_a_ring_within(spawn: &Spawn<'_>, bound: Duration) -> R {
    let mut w = Vec::new();
    for (h, role) in ["ring-first", "ring", "ring"].iter().enumerate() {
        let n = 1_000_000.to_string();
        let never = NEVER.to_string();
        w.push(spawn(h, &["peer", role, "65536", &n, &never])?);
    }
    let mut handles = Vec::new();
    for x in &mut w {
        handles.push(x.expect("H ", Duration::from_secs(30))?);
    }
    for h in 0..3 {
        let next = &handles[(h + 1) % 3];
        w[h].send(&format!("C {}", &next[2..]))?;
    }
    for x in &mut w {
        x.expect("CONNECTED", Duration::from_secs(30))?;
    }
    w[0].expect("STEP 50", Duration::from_secs(30))?;
    w[1].child.kill().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let _ = w[1].child.wait();
    for h in [2, 0] {
        let (after, l) = err_after(&mut w[h], t0, bound + Duration::from_secs(20))?;
        verbose(&format!("ring host {h} after host 1 was killed"), after, &l);
        if after > bound {
            return Err(format!(
                "host {h} failed and closed {after:?} after host 1 was killed, over {bound:?}: {l}"
            ));
        }
    }
    Ok(())
}

/// A peer killed (SIGKILL) in the middle of traffic both ways (a sending and a receiving
/// connection between the two processes, as in NCCL's rings): the survivor's call fails and
/// its connections are closed, as `ncclCommAbort` closes them, within `bound` of the kill.
pub fn killed_peer_within(spawn: &Spawn<'_>, bound: Duration) -> R {
    let (mut a, mut b) = start(
        spawn,
        ("duplex", "duplex"),
        8 << 10,
        1_000_000,
        (NEVER, NEVER),
    )?;
    a.expect("STEP 300", Duration::from_secs(30))?;
    b.child.kill().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let _ = b.child.wait();
    let (after, l) = err_after(&mut a, t0, bound + Duration::from_secs(20))?;
    verbose("survivor of a killed peer", after, &l);
    if after > bound {
        return Err(format!(
            "the survivor failed and closed {after:?} after its peer was killed, over \
             {bound:?}: {l}"
        ));
    }
    Ok(())
}
