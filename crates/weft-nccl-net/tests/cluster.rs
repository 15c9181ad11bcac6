//! Namespace-cluster tests: the real `libnccl_net_weft.so`, dlopened by worker processes (this
//! binary re-executed with `--worker`) that run inside weft-netns hosts, so NCCL's exact code
//! path crosses real network namespaces with a management network (`mgmt0`) and one or two data
//! networks (`data0`, `data1`).
//!
//! What they prove:
//! * the split: per connection one TCP connection between management addresses (the handshake,
//!   then the silent ABORT side channel) and every other one (control stream and data streams)
//!   between data addresses (`ss` inside the hosts); the handshake's bytes cross `mgmt0`, and
//!   after it `mgmt0` stays silent (interface byte counters: a few hundred bytes at most, for
//!   64 MiB of bulk and for 10 000 8-byte messages alike) while `data0` carries every message
//!   header, inline payload and chunk; over two rails as two devices and as one merged device
//!   (`WEFT_MERGE_RAILS=1`, both rails carry bulk); the advertised device name and speed are
//!   those of the data interfaces;
//! * N hosts (up to 8) connecting all at once, every host to every other, each in a random order,
//!   20 rounds, without a deadlock, every byte checked;
//! * faults, each an error within the timeout with a WARN naming peer and interface: the
//!   receiver's data link cut mid-transfer (both sides fail; the sender learns the receiver's
//!   reason over the management side channel, or finds the dead control stream itself), the
//!   receiving process killed with SIGKILL, the receiver's whole network frozen (both fail); and
//!   a receiver that posts its receive 1.5 timeouts late is not an error;
//! * dead and frozen peers (`common::peers`, shared with `cluster_ofi`): a sender stopped right
//!   after a message with the next receive posted, a receiver stopped under 16 MiB messages
//!   (each an error within the timeout plus a quarter), senders and receivers pausing 2.5
//!   timeouts (never an error), a peer killed with traffic both ways and a rank of a
//!   three-host ring killed (every survivor's error and close within 1 s).
//!
//! Needs root and iproute2 (as CI has); elsewhere it prints why and passes without running.
//! The parent talks to workers over their stdin/stdout, one line per step. Every wait is bounded.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::io::BufRead;
use std::time::{Duration, Instant};

use weft_netns::{Cluster, ClusterSpec};

#[macro_use]
mod common;
use common::*;

// ---------------------------------------------------------------------------------------------
// Worker side (inside a host namespace)
// ---------------------------------------------------------------------------------------------

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Full mesh: listens for every peer and round first (prints the handles), then per round
/// connects to and accepts from every peer at once in a random order, exchanges one message
/// each way with every peer, checks it, closes.
fn worker_mesh(net: &Net, ctx: *mut c_void, a: &[String], stdin: &mut Lines) -> R {
    let num = |i: usize| -> R<usize> {
        a.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or(format!("arg {i}"))
    };
    let (me, n, rounds, seed, size) = (num(0)?, num(1)?, num(2)?, num(3)? as u64, num(4)?);
    let pause = a.get(5).is_some_and(|p| p == "pause");
    let mut listens: HashMap<(usize, usize), *mut c_void> = HashMap::new();
    for r in 0..rounds {
        for j in (0..n).filter(|j| *j != me) {
            let mut h = [0u8; 128];
            listens.insert((r, j), net.listen_on(ctx, 0, &mut h)?);
            println!("H {r} {j} {}", hex(&h));
        }
    }
    println!("READY");
    let mut handles: HashMap<(usize, usize), [u8; 128]> = HashMap::new();
    loop {
        let l = stdin.next()?;
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["C", r, j, h] => {
                let key = (
                    r.parse().map_err(|_| "round")?,
                    j.parse().map_err(|_| "peer")?,
                );
                handles.insert(key, unhex(h)?);
            }
            ["GO"] => break,
            _ => return Err(format!("unexpected line {l:?}")),
        }
    }
    let mut rng = seed ^ ((me as u64 + 1) << 32) | 1;
    for r in 0..rounds {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut sends: HashMap<usize, *mut c_void> = HashMap::new();
        let mut recvs: HashMap<usize, *mut c_void> = HashMap::new();
        let mut todo: Vec<(bool, usize)> = (0..n)
            .filter(|j| *j != me)
            .flat_map(|j| [(true, j), (false, j)])
            .collect();
        while !todo.is_empty() {
            if Instant::now() > deadline {
                return Err(format!("round {r}: connect/accept stuck on {todo:?}"));
            }
            for i in (1..todo.len()).rev() {
                let k = (xorshift(&mut rng) % (i as u64 + 1)) as usize;
                todo.swap(i, k);
            }
            let mut left = Vec::new();
            for (conn, j) in todo {
                let done = if conn {
                    let h = handles.get_mut(&(r, j)).ok_or("missing handle")?;
                    net.connect_on(ctx, 0, h)?.map(|c| sends.insert(j, c))
                } else {
                    net.accept(listens[&(r, j)])?.map(|c| recvs.insert(j, c))
                };
                if done.is_none() {
                    left.push((conn, j));
                }
            }
            todo = left;
        }
        if pause {
            println!("CONNECTED {r}");
            if stdin.next()? != "CONT" {
                return Err("expected CONT".into());
            }
        }
        let sz = size + r * 4099;
        let mut bufs: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut reqs: Vec<(usize, Option<usize>, *mut c_void)> = Vec::new();
        for (&j, &rc) in &recvs {
            bufs.push((j, vec![0u8; sz]));
            let b = bufs.last_mut().ok_or("no buf")?;
            let req = net
                .irecv(
                    rc,
                    &mut [&mut b.1[..]],
                    &[r as c_int],
                    &[std::ptr::null_mut()],
                )?
                .ok_or("irecv refused")?;
            reqs.push((j, Some(bufs.len() - 1), req));
        }
        let srcs: HashMap<usize, Vec<u8>> = sends
            .keys()
            .map(|&j| (j, pattern(sz, (r * 31 + me * 7 + j) as u8)))
            .collect();
        for (&j, &sc) in &sends {
            let req = loop {
                if let Some(q) = net.isend(sc, &srcs[&j], r as c_int, std::ptr::null_mut())? {
                    break q;
                }
                if Instant::now() > deadline {
                    return Err("isend refused for too long".into());
                }
            };
            reqs.push((j, None, req));
        }
        while !reqs.is_empty() {
            if Instant::now() > deadline {
                return Err(format!(
                    "round {r}: {} requests never completed",
                    reqs.len()
                ));
            }
            let mut left = Vec::new();
            for (j, buf, req) in reqs {
                match net.test(req)? {
                    None => left.push((j, buf, req)),
                    Some(sizes) => {
                        if sizes[0] as usize != sz {
                            return Err(format!("round {r}: size {} from {j}", sizes[0]));
                        }
                        if let Some(b) = buf
                            && bufs[b].1 != pattern(sz, (r * 31 + j * 7 + me) as u8)
                        {
                            return Err(format!("round {r}: payload from host {j} corrupted"));
                        }
                    }
                }
            }
            reqs = left;
        }
        for (_, c) in sends {
            net.close_send(c)?;
        }
        for (_, c) in recvs {
            net.close_recv(c)?;
        }
        for j in (0..n).filter(|j| *j != me) {
            if let Some(lc) = listens.remove(&(r, j)) {
                net.close_listen(lc)?;
            }
        }
        println!("ROUND {r}");
    }
    Ok(())
}

/// One side of a pair: `send <dev> <size> <count>` or `recv <dev> <size> <count> <delay_ms>`.
/// Prints `CONNECTED`, then `SENT i` / `GOT i` per message; a failure prints `ERR <warns>`.
fn worker_pair(net: &Net, ctx: *mut c_void, send: bool, a: &[String], stdin: &mut Lines) -> R {
    let num = |i: usize| -> R<usize> {
        a.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or(format!("arg {i}"))
    };
    let (dev, size, count) = (num(0)? as c_int, num(1)?, num(2)?);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (sc, rc) = if send {
        let l = stdin.next()?;
        let mut h = unhex(l.strip_prefix("C ").ok_or("expected C")?)?;
        loop {
            if let Some(c) = net.connect_on(ctx, dev, &mut h)? {
                break (c, std::ptr::null_mut());
            }
            if Instant::now() > deadline {
                return Err("connect stuck".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    } else {
        let mut h = [0u8; 128];
        let lc = net.listen_on(ctx, dev, &mut h)?;
        println!("H {}", hex(&h));
        loop {
            if let Some(c) = net.accept(lc)? {
                net.close_listen(lc)?;
                break (std::ptr::null_mut(), c);
            }
            if Instant::now() > deadline {
                return Err("accept stuck".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    println!("CONNECTED");
    if std::env::var_os("WEFT_TEST_SYNC").is_some() && stdin.next()? != "GO" {
        return Err("expected GO".into());
    }
    let src = pattern(size, 5);
    let mut dst = vec![0u8; size];
    if !send {
        std::thread::sleep(Duration::from_millis(num(3)? as u64));
    }
    for i in 0..count {
        let req = loop {
            let q = if send {
                net.isend(sc, &src, 1, std::ptr::null_mut())?
            } else {
                net.irecv(rc, &mut [&mut dst[..]], &[1], &[std::ptr::null_mut()])?
            };
            if let Some(q) = q {
                break q;
            }
        };
        // No deadline of our own here: the plugin must bound every wait (the parent bounds us).
        let sizes = loop {
            if let Some(s) = net.test(req)? {
                break s;
            }
        };
        if send {
            println!("SENT {i}");
        } else {
            if sizes[0] as usize != size || dst != src {
                return Err(format!("message {i} wrong"));
            }
            dst.fill(0);
            println!("GOT {i}");
        }
    }
    // As NCCL does when a communicator is destroyed.
    if send {
        net.close_send(sc)?;
    } else {
        net.close_recv(rc)?;
    }
    Ok(())
}

fn worker(args: &[String]) -> R {
    let lib: &'static libloading::Library = Box::leak(Box::new(
        // SAFETY: loading our own plugin; its initialisers have no preconditions.
        unsafe { libloading::Library::new(so_path()) }.map_err(|e| e.to_string())?,
    ));
    let net = Net::load(lib, 12);
    let ctx = net.init()?;
    let (name, _, speed, _) = net.props(0)?;
    println!("PROPS {} {name} {speed}", net.devices()?);
    let stdin: &'static std::io::Stdin = Box::leak(Box::new(std::io::stdin()));
    let mut lines = Lines(stdin.lock().lines());
    let rest = &args[1..];
    let mark = log_mark();
    let r = match args.first().map(String::as_str) {
        Some("mesh") => worker_mesh(&net, ctx, rest, &mut lines),
        Some("send") => worker_pair(&net, ctx, true, rest, &mut lines),
        Some("recv") => worker_pair(&net, ctx, false, rest, &mut lines),
        Some("peer") => peers::worker_peer(&net, ctx, rest, &mut lines),
        other => Err(format!("unknown worker mode {other:?}")),
    };
    if let Err(e) = r {
        let w = warns_since(mark).join(" | ");
        println!("ERR {e} || WARN: {w}");
        std::process::exit(3);
    }
    println!("DONE");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------------------------

fn cluster(hosts: usize, rails: usize) -> R<Cluster> {
    Cluster::create(&ClusterSpec::new(hosts, rails)).map_err(|e| e.to_string())
}

/// Established TCP connections of a host as (local ip, peer ip).
fn tcp_conns(c: &Cluster, host: usize) -> R<Vec<(String, String)>> {
    let out = c
        .exec(
            host,
            "ss",
            &["-tnH", "state", "established"],
            Duration::from_secs(10),
        )
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ip = |s: &str| s.rsplit_once(':').map_or(s, |(a, _)| a).to_string();
    Ok(text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().filter(|t| t.contains(':')).collect();
            (f.len() >= 2).then(|| (ip(f[0]), ip(f[1])))
        })
        .collect())
}

/// Starts a connected sender (host 0) / receiver (host 1) pair on `dev`.
fn start_pair(
    c: &Cluster,
    dev: usize,
    size: usize,
    count: usize,
    delay_ms: u64,
    env: &[(&str, &str)],
) -> R<(Worker, Worker, String)> {
    let (d, s, n, ms) = (
        dev.to_string(),
        size.to_string(),
        count.to_string(),
        delay_ms.to_string(),
    );
    let mut rx = Worker::spawn(c, 1, &["recv", &d, &s, &n, &ms], env)?;
    let mut tx = Worker::spawn(c, 0, &["send", &d, &s, &n], env)?;
    let props = tx.expect("PROPS", Duration::from_secs(30))?;
    let h = rx.expect("H ", Duration::from_secs(30))?;
    tx.send(&format!("C {}", &h[2..]))?;
    tx.expect("CONNECTED", Duration::from_secs(30))?;
    rx.expect("CONNECTED", Duration::from_secs(30))?;
    Ok((tx, rx, props))
}

/// Most bytes `mgmt0` of one host may carry (both directions) during the data phase of one
/// connection: its FIN exchange at the end, should the counters catch it (about 4 frames of
/// 66 bytes), and slack for one delayed TCP ACK of the handshake. Any per-message traffic (a
/// 24-byte header per message, keepalives every second) would exceed it many times over.
const MGMT_DATA_PHASE_BOUND: u64 = 512;

/// The split on one rail: one connection between management addresses, the control and data
/// streams between data addresses; handshake bytes on mgmt0, and after the handshake nothing
/// there during the bulk transfer (< 0.1% of the payload, and under an absolute bound), all of
/// it on data0; properties from data0.
fn t_split_one_rail() -> R {
    let c = cluster(2, 1)?;
    let (mgmt0, mgmt1) = (c.host(0).mgmt_addr, c.host(1).mgmt_addr);
    let (data0, data1) = (c.host(0).data_ifs[0].1, c.host(1).data_ifs[0].1);
    let env = [
        ("WEFT_NTHREADS", "2"),
        ("WEFT_NSOCKS_PERTHREAD", "2"),
        ("WEFT_TEST_SYNC", "1"),
    ];
    let before: Vec<u64> = [(0, "mgmt0"), (1, "mgmt0"), (0, "data0"), (1, "data0")]
        .iter()
        .map(|(h, i)| counters(&c, *h, i))
        .collect::<R<_>>()?;
    let (size, count) = (16 << 20, 4);
    let (mut tx, mut rx, props) = start_pair(&c, 0, size, count, 300, &env)?;
    // While connected (the receiver sleeps 300 ms before its first receive): who talks to whom.
    let conns = tcp_conns(&c, 0)?;
    let ctrl = conns
        .iter()
        .filter(|(l, p)| *l == mgmt0.to_string() && *p == mgmt1.to_string())
        .count();
    let data = conns
        .iter()
        .filter(|(l, p)| *l == data0.to_string() && *p == data1.to_string())
        .count();
    if ctrl != 1 || data != 5 || conns.len() != 6 {
        return Err(format!(
            "expected 1 handshake connection {mgmt0}->{mgmt1} and 5 connections \
             {data0}->{data1} (control + 4 data streams), found {conns:?}"
        ));
    }
    let mid: Vec<u64> = [(0, "mgmt0"), (1, "mgmt0"), (0, "data0"), (1, "data0")]
        .iter()
        .map(|(h, i)| counters(&c, *h, i))
        .collect::<R<_>>()?;
    if mid[0] == before[0] || mid[1] == before[1] {
        return Err("the handshake did not cross mgmt0".into());
    }
    tx.send("GO")?;
    rx.send("GO")?;
    tx.expect("DONE", Duration::from_secs(60))?;
    rx.expect("DONE", Duration::from_secs(60))?;
    let after: Vec<u64> = [(0, "mgmt0"), (1, "mgmt0"), (0, "data0"), (1, "data0")]
        .iter()
        .map(|(h, i)| counters(&c, *h, i))
        .collect::<R<_>>()?;
    let d: Vec<u64> = after.iter().zip(&mid).map(|(a, b)| a - b).collect();
    let payload = (size * count) as u64;
    if std::env::var_os("WEFT_TEST_VERBOSE").is_some() {
        eprintln!(
            "split: handshake mgmt0 {} / {} bytes; bulk phase mgmt0 {} / {}, data0 {} / {} for {payload}",
            mid[0] - before[0],
            mid[1] - before[1],
            d[0],
            d[1],
            d[2],
            d[3]
        );
    }
    if d[2] < payload || d[3] < payload {
        return Err(format!(
            "data0 carried {} / {} bytes < {payload}",
            d[2], d[3]
        ));
    }
    if d[0] > (payload / 1000).min(MGMT_DATA_PHASE_BOUND)
        || d[1] > (payload / 1000).min(MGMT_DATA_PHASE_BOUND)
    {
        return Err(format!(
            "mgmt0 carried {} / {} bytes during the bulk phase (bound {MGMT_DATA_PHASE_BOUND}): \
             data-phase traffic leaked onto the management network",
            d[0], d[1]
        ));
    }
    // Properties: the device is data0 with data0's speed (veth: /sys speed, else 10000 Mb/s).
    let want = format!("PROPS 1 data0 {}", sys_speed(&c, 0, "data0")?);
    if props != want {
        return Err(format!("properties {props:?}, expected {want:?}"));
    }
    Ok(())
}

fn sys_speed(c: &Cluster, host: usize, ifname: &str) -> R<i64> {
    let out = c
        .exec(
            host,
            "cat",
            &[&format!("/sys/class/net/{ifname}/speed")],
            Duration::from_secs(10),
        )
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|v| *v > 0)
        .unwrap_or(10_000))
}

/// 10 000 8-byte messages (inline, the latency-bound path): after the handshake, mgmt0 of
/// either host carries at most [`MGMT_DATA_PHASE_BOUND`] bytes in all, while data0 carries
/// every message (payload and 24-byte header each).
fn t_small_messages_stay_off_mgmt() -> R {
    let c = cluster(2, 1)?;
    let env = [("WEFT_TIMEOUT_MS", "10000"), ("WEFT_TEST_SYNC", "1")];
    let (size, count) = (8usize, 10_000usize);
    let (mut tx, mut rx, _) = start_pair(&c, 0, size, count, 0, &env)?;
    let read = || -> R<Vec<u64>> {
        [(0, "mgmt0"), (1, "mgmt0"), (0, "data0"), (1, "data0")]
            .iter()
            .map(|(h, i)| counters(&c, *h, i))
            .collect()
    };
    let before = read()?;
    tx.send("GO")?;
    rx.send("GO")?;
    tx.expect("DONE", Duration::from_secs(120))?;
    rx.expect("DONE", Duration::from_secs(120))?;
    let d: Vec<u64> = read()?.iter().zip(&before).map(|(a, b)| a - b).collect();
    if std::env::var_os("WEFT_TEST_VERBOSE").is_some() {
        eprintln!(
            "small messages: mgmt0 {} / {} bytes, data0 {} / {}",
            d[0], d[1], d[2], d[3]
        );
    }
    let min_data = (count * (size + 24)) as u64;
    if d[2] < min_data || d[3] < min_data {
        return Err(format!(
            "data0 carried {} / {} bytes < {min_data} for {count} messages",
            d[2], d[3]
        ));
    }
    if d[0] > MGMT_DATA_PHASE_BOUND || d[1] > MGMT_DATA_PHASE_BOUND {
        return Err(format!(
            "mgmt0 carried {} / {} bytes for {count} {size}-byte messages (bound \
             {MGMT_DATA_PHASE_BOUND}): per-message traffic on the management network",
            d[0], d[1]
        ));
    }
    Ok(())
}

/// Two rails: as two devices (each carries its own connection's bulk) and merged into one
/// device whose streams are striped over both (both carry bulk).
fn t_two_rails_and_merged() -> R {
    let c = cluster(2, 2)?;
    let speed0 = sys_speed(&c, 0, "data0")?;
    let speed1 = sys_speed(&c, 0, "data1")?;
    let size = 8 << 20;
    for (merge, dev) in [("0", 0), ("0", 1), ("1", 0)] {
        let env = [
            ("WEFT_MERGE_RAILS", merge),
            ("WEFT_NTHREADS", "2"),
            ("WEFT_NSOCKS_PERTHREAD", "2"),
        ];
        let before = [counters(&c, 0, "data0")?, counters(&c, 0, "data1")?];
        let (mut tx, mut rx, p) = start_pair(&c, dev, size, 4, 0, &env)?;
        tx.expect("DONE", Duration::from_secs(60))?;
        rx.expect("DONE", Duration::from_secs(60))?;
        let d = [
            counters(&c, 0, "data0")? - before[0],
            counters(&c, 0, "data1")? - before[1],
        ];
        let payload = 4 * size as u64;
        let ok = match (merge, dev) {
            ("0", 0) => d[0] >= payload && d[1] < payload / 100,
            ("0", _) => d[1] >= payload && d[0] < payload / 100,
            _ => d[0] >= payload * 4 / 10 && d[1] >= payload * 4 / 10 && d[0] + d[1] >= payload,
        };
        if !ok {
            return Err(format!(
                "merge={merge} dev={dev}: data0 carried {} bytes, data1 {} for {payload}",
                d[0], d[1]
            ));
        }
        // Properties seen by the sender: name and speed of the data interface(s).
        let want = if merge == "1" {
            format!("PROPS 1 data0+data1 {}", speed0 + speed1)
        } else {
            format!("PROPS 2 data0 {speed0}")
        };
        if p != want {
            return Err(format!("properties {p:?}, expected {want:?}"));
        }
    }
    Ok(())
}

/// N hosts, full mesh of send/receive pairs started at once in random orders, many rounds.
fn mesh(hosts: usize, rounds: usize, size: usize, seed: u64) -> R {
    let c = cluster(hosts, 1)?;
    let env = [("WEFT_NTHREADS", "1"), ("WEFT_NSOCKS_PERTHREAD", "2")];
    let (hs, rs, ss) = (hosts.to_string(), rounds.to_string(), size.to_string());
    let mut ws = Vec::new();
    for h in 0..hosts {
        let sd = (seed + h as u64 * 1000).to_string();
        ws.push(Worker::spawn(
            &c,
            h,
            &["mesh", &h.to_string(), &hs, &rs, &sd, &ss],
            &env,
        )?);
    }
    // Collect every listen handle, then hand each sender the handles of its receivers.
    let mut to: Vec<Vec<String>> = vec![Vec::new(); hosts];
    for (h, w) in ws.iter_mut().enumerate() {
        loop {
            let l = w.expect("", Duration::from_secs(60))?;
            if l == "READY" {
                break;
            }
            let f: Vec<&str> = l.split_whitespace().collect();
            if let ["H", r, j, hexh] = f.as_slice() {
                let j: usize = j.parse().map_err(|_| "peer")?;
                to[j].push(format!("C {r} {h} {hexh}"));
            }
        }
    }
    let before: Vec<(u64, u64)> = (0..hosts)
        .map(|h| Ok((counters(&c, h, "mgmt0")?, counters(&c, h, "data0")?)))
        .collect::<R<_>>()?;
    for (h, w) in ws.iter_mut().enumerate() {
        for l in &to[h] {
            w.send(l)?;
        }
    }
    for w in &mut ws {
        w.send("GO")?;
    }
    for w in &mut ws {
        w.expect("DONE", Duration::from_secs(240))?;
    }
    let total: u64 = (0..rounds)
        .map(|r| (size + r * 4099) as u64 * (hosts as u64 - 1))
        .sum();
    for (h, b) in before.iter().enumerate() {
        let m = counters(&c, h, "mgmt0")? - b.0;
        let d = counters(&c, h, "data0")? - b.1;
        // Each host sent and received `total` payload bytes; mgmt0 carried handshakes only:
        // per connection (2 (n-1) per round) three TCP connection set-ups and tear-downs' worth.
        let conns = (2 * (hosts as u64 - 1) * rounds as u64).max(1);
        if d < 2 * total || m > conns * MGMT_PER_HANDSHAKE {
            return Err(format!(
                "host {h}: data0 {d} bytes, mgmt0 {m} bytes ({} per connection, bound \
                 {MGMT_PER_HANDSHAKE}) for 2x{total} payload",
                m / conns
            ));
        }
    }
    Ok(())
}

/// Bytes a host's mgmt0 carries for one connection it takes part in, at most: TCP set-up and
/// tear-down (about 7 frames of 66-74 bytes), HELLO or ACK (90 bytes each way), slack.
const MGMT_PER_HANDSHAKE: u64 = 1024;

fn t_mesh_8_hosts_20_rounds() -> R {
    mesh(8, 20, 96 << 10, 1)
}

fn t_mesh_3_hosts_20_rounds() -> R {
    mesh(3, 20, 1 << 20, 2)
}

const TIMEOUT_MS: u64 = 2000;
/// What "within the timeout" is allowed on a loaded 2-core machine: the timeout, the keepalive
/// granularity (1 s), and scheduling noise.
const BOUND: Duration = Duration::from_millis(TIMEOUT_MS + 4000);

/// Every address of host `h`.
fn addrs(c: &Cluster, h: usize) -> Vec<String> {
    let host = c.host(h);
    std::iter::once(host.mgmt_addr)
        .chain(host.data_ifs.iter().map(|d| d.1))
        .map(|a| a.to_string())
        .collect()
}

fn fault_env() -> [(&'static str, &'static str); 3] {
    [
        ("WEFT_TIMEOUT_MS", "2000"),
        ("WEFT_NTHREADS", "2"),
        ("WEFT_NSOCKS_PERTHREAD", "2"),
    ]
}

/// Waits for the worker's `ERR` line within `BOUND` of `t0` and checks its WARN names one of
/// `peers` and one of `ifaces`.
fn expect_err(w: &mut Worker, t0: Instant, peers: &[String], ifaces: &[&str]) -> R<String> {
    let deadline = t0 + BOUND + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match w.lines.recv_timeout(left) {
            Ok(l) if l.starts_with("ERR") => {
                let took = t0.elapsed();
                if took > BOUND {
                    return Err(format!("host {} failed after {took:?} > {BOUND:?}", w.host));
                }
                if std::env::var_os("WEFT_TEST_VERBOSE").is_some() {
                    eprintln!("host {} failed after {took:?}: {l}", w.host);
                }
                let warn = l.split_once("WARN:").map_or("", |x| x.1);
                if !peers.iter().any(|p| warn.contains(&format!("{p}:")))
                    || !ifaces.iter().any(|i| warn.contains(&format!("via {i}")))
                {
                    return Err(format!(
                        "host {}: WARN does not name a peer of {peers:?} and an interface of \
                         {ifaces:?}: {l}",
                        w.host
                    ));
                }
                return Ok(l);
            }
            Ok(l) if l.starts_with("DONE") => {
                return Err(format!("host {} completed despite the fault", w.host));
            }
            Ok(_) => {}
            Err(_) => return Err(format!("host {}: no error at all: a hang", w.host)),
        }
    }
}

/// (a) `ip link set data0 down` on the receiver's host mid-transfer: both sides fail. The
/// receiver's stall timer and both sides' control-stream watch (on data0) race; whichever
/// fires first, the other side hears it over the management side channel ("aborted ... via
/// mgmt0") or finds the dead control stream itself ("timed out ... via data0").
fn t_fault_receiver_data_link_down() -> R {
    let c = cluster(2, 1)?;
    let (mut tx, mut rx, _) = start_pair(&c, 0, 8 << 20, 1_000_000, 0, &fault_env())?;
    rx.expect("GOT 2", Duration::from_secs(30))?;
    c.set_link(1, "data0", false).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let r = expect_err(&mut rx, t0, &addrs(&c, 0), &["data0", "mgmt0"])?;
    let s = expect_err(&mut tx, t0, &addrs(&c, 1), &["mgmt0", "data0"])?;
    let heard = |l: &str| {
        (l.contains("aborted") && l.contains("via mgmt0"))
            || (l.contains("timed out") && l.contains("via data0"))
    };
    if !heard(&s) || !heard(&r) {
        return Err(format!("unexpected reasons: sender {s:?}, receiver {r:?}"));
    }
    Ok(())
}

/// (b) SIGKILL of the receiving process mid-transfer: the sender fails.
fn t_fault_receiver_killed() -> R {
    let c = cluster(2, 1)?;
    let (mut tx, mut rx, _) = start_pair(&c, 0, 8 << 20, 1_000_000, 0, &fault_env())?;
    rx.expect("GOT 2", Duration::from_secs(30))?;
    rx.child.kill().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let _ = rx.child.wait();
    expect_err(&mut tx, t0, &addrs(&c, 1), &["mgmt0", "data0"])?;
    Ok(())
}

/// (c) The receiver's host drops off both networks mid-transfer (no FIN, no RST, nothing): the
/// sender fails on its control stream's liveness watch (data0), the receiver on that or its
/// stall timer.
fn t_fault_receiver_host_frozen() -> R {
    let c = cluster(2, 1)?;
    let (mut tx, mut rx, _) = start_pair(&c, 0, 8 << 20, 1_000_000, 0, &fault_env())?;
    rx.expect("GOT 2", Duration::from_secs(30))?;
    c.set_link(1, "mgmt0", false).map_err(|e| e.to_string())?;
    c.set_link(1, "data0", false).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    expect_err(&mut tx, t0, &addrs(&c, 1), &["data0"])?;
    expect_err(&mut rx, t0, &addrs(&c, 0), &["data0"])?;
    Ok(())
}

/// (d) A receiver that posts its first receive 3 s late with a 2 s timeout, while the sender
/// has a 64 MiB message outstanding: not an error, everything arrives.
fn t_slow_receiver_is_not_an_error() -> R {
    let c = cluster(2, 1)?;
    let (mut tx, mut rx, _) = start_pair(&c, 0, 64 << 20, 3, 3000, &fault_env())?;
    rx.expect("DONE", Duration::from_secs(60))?;
    tx.expect("DONE", Duration::from_secs(60))?;
    Ok(())
}

/// The timeout of the dead- and frozen-peer tests (short, to keep the suite's time down).
const PEER_T: Duration = Duration::from_millis(1000);

/// Runs `scenario` among `hosts` hosts whose workers use the TCP backend with [`PEER_T`].
fn peer_scenario(hosts: usize, scenario: impl FnOnce(&peers::Spawn<'_>) -> R) -> R {
    let c = Cluster::create(&ClusterSpec::new(hosts, 1)).map_err(|e| e.to_string())?;
    let ms = PEER_T.as_millis().to_string();
    let env = [
        ("WEFT_TIMEOUT_MS", ms.as_str()),
        ("WEFT_NTHREADS", "2"),
        ("WEFT_NSOCKS_PERTHREAD", "2"),
    ];
    scenario(&|h: usize, args: &[&str]| Worker::spawn(&c, h, args, &env))
}

/// (e) A sender stopped (SIGSTOP) right after a message completed, its receiver's next
/// receive posted: the receiver asks (PROBE) and fails within the timeout plus a quarter.
fn t_frozen_sender_after_a_message() -> R {
    peer_scenario(2, |s| peers::frozen_sender_after_a_message(s, PEER_T))
}

/// (f) A receiver stopped while its sender keeps sending 16 MiB messages: the sender fails
/// within the timeout plus a quarter.
fn t_frozen_receiver_while_sending() -> R {
    peer_scenario(2, |s| peers::frozen_receiver_while_sending(s, PEER_T))
}

/// (g) A sender or receiver that pauses 2.5 timeouts without calling in is not an error.
fn t_slow_peers_are_not_errors() -> R {
    peer_scenario(2, |s| peers::slow_peers_are_not_errors(s, PEER_T))
}

/// A rank of a three-host ring killed: both survivors fail and have closed within 1 s.
fn t_killed_rank_of_a_ring_within_1s() -> R {
    peer_scenario(3, |s| {
        peers::killed_rank_of_a_ring_within(s, Duration::from_secs(1))
    })
}

/// (h) A peer killed mid-traffic both ways: the survivor fails and has closed within 1 s.
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
        weft_netns::require::skip("the namespace cluster tests", &why);
        println!("\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
        return;
    }
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-')).cloned();
    type Case = (&'static str, fn() -> R);
    let tests: &[Case] = &[
        ("split_one_rail", t_split_one_rail),
        (
            "small_messages_stay_off_mgmt",
            t_small_messages_stay_off_mgmt,
        ),
        ("two_rails_and_merged", t_two_rails_and_merged),
        ("mesh_3_hosts_20_rounds", t_mesh_3_hosts_20_rounds),
        ("mesh_8_hosts_20_rounds", t_mesh_8_hosts_20_rounds),
        (
            "fault_receiver_data_link_down",
            t_fault_receiver_data_link_down,
        ),
        ("fault_receiver_killed", t_fault_receiver_killed),
        ("fault_receiver_host_frozen", t_fault_receiver_host_frozen),
        (
            "slow_receiver_is_not_an_error",
            t_slow_receiver_is_not_an_error,
        ),
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
                println!("test {name} ... FAILED: {e}");
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
