//! weft's TCP transport against iperf3 and a plain TCP ping-pong, in the same pair of network
//! namespaces (weft-netns, 2 hosts, data MTU 9000), plus the same bandwidth sweep over loopback
//! in one process for reference. Prints markdown tables (the ones in docs/benchmarks.md).
//!
//! ```text
//! cargo bench -p weft-transport --bench netns_bw               # full sweep, 5 repetitions
//! cargo bench -p weft-transport --bench netns_bw -- --reps 3 --max-mib 64 --no-loopback
//! WEFT_NTHREADS=1 WEFT_NSOCKS_PERTHREAD=4 cargo bench -p weft-transport --bench netns_bw
//! cargo bench -p weft-transport --bench netns_bw -- --latency-only --reps 5 [--at-once]
//! ```
//!
//! `--at-once` connects both directions of the latency test at the same time, as NCCL does,
//! so that the control streams become shared by MOVE instead of JOIN.
//!
//! The transport is configured from the `WEFT_*` variables like the plugin (interfaces are
//! forced to `mgmt0` / `data0`). Bandwidth is one-way: one sender thread in host 0 keeps up to
//! 8 messages in flight (fewer for large ones), one receiver thread in host 1 keeps as many
//! receives posted; both poll `test()` and yield when nothing completed, as NCCL's proxy does.
//! iperf3 runs with as many parallel streams (`-P`) as weft has data streams. Latency is the
//! median round trip of an 8-byte message on two connections (one each way), both sides
//! spinning, against a plain non-blocking TCP_NODELAY ping-pong spinning the same way between
//! the same interfaces (data0, which carries weft's control stream and so its inline messages),
//! over one connection and over one connection each way. Needs root and iproute2 (and iperf3 for
//! that column); otherwise it says why and exits.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use weft_netns::{Cluster, ClusterSpec};
use weft_transport::{Config, RecvBuf, RecvConn, RequestId, SendConn, Transport};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Opts {
    reps: usize,
    min: usize,
    max: usize,
    loopback: bool,
    iperf: bool,
    latency: bool,
    bandwidth: bool,
    at_once: bool,
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().collect();
    let val = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<usize>().ok())
    };
    Opts {
        reps: val("--reps").unwrap_or(5).max(1),
        min: val("--min-kib").unwrap_or(4) << 10,
        max: val("--max-mib").unwrap_or(1024) << 20,
        loopback: !args.iter().any(|a| a == "--no-loopback"),
        iperf: !args.iter().any(|a| a == "--no-iperf"),
        latency: !args.iter().any(|a| a == "--no-latency"),
        bandwidth: !args.iter().any(|a| a == "--latency-only"),
        at_once: args.iter().any(|a| a == "--at-once"),
    }
}

fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = 4096;
    while s <= max {
        if s >= min {
            v.push(s);
        }
        s *= 4;
    }
    v
}

/// Messages per measurement: about 512 MiB, at least 3, at most 20000.
fn count(size: usize) -> usize {
    ((512 << 20) / size).clamp(3, 20_000)
}

fn in_flight(size: usize) -> usize {
    ((256 << 20) / size).clamp(1, 8)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Connects a pair: listener made by `listen_side`, connector by `connect_side`, polled
/// concurrently on two threads (each may be inside a namespace).
fn pair(
    listen_side: impl FnOnce() -> R<(Transport, weft_transport::Listener)> + Send,
    connect_side: impl FnOnce(&[u8]) -> R<SendConn> + Send,
) -> R<(SendConn, RecvConn)> {
    let (htx, hrx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|s| {
        let rx = s.spawn(move || -> R<RecvConn> {
            let (_t, mut l) = listen_side()?;
            htx.send(l.handle().to_vec())?;
            Ok(l.wait()?)
        });
        let h = hrx.recv_timeout(Duration::from_secs(30))?;
        let tx = connect_side(&h)?;
        let rx = rx.join().map_err(|_| "accept thread panicked")??;
        Ok((tx, rx))
    })
}

fn ns_pair(c: &Cluster, cfg: &Config, from: usize, to: usize) -> R<(SendConn, RecvConn)> {
    pair(
        || {
            c.in_host(to, || -> R<_> {
                let t = Transport::new(cfg.clone())?;
                let l = t.listen(0)?;
                Ok((t, l))
            })?
        },
        |h| {
            c.in_host(from, || -> R<SendConn> {
                let t = Transport::new(cfg.clone())?;
                Ok(t.connect(0, h)?.wait()?)
            })?
        },
    )
}

fn wait_send(tx: &mut SendConn, id: RequestId) -> R<()> {
    while tx.test(id)?.is_none() {
        std::thread::yield_now();
    }
    Ok(())
}

/// One-way bandwidth in GB/s for each size, `reps` times: returns per size the list.
/// Gives the connection back for the next round.
type BwOut = (SendConn, RecvConn, Vec<Vec<f64>>);

fn bandwidth(tx: SendConn, mut rx: RecvConn, sizes: &[usize], reps: usize) -> R<BwOut> {
    let barrier = Arc::new(Barrier::new(2));
    let b2 = barrier.clone();
    let sizes2 = sizes.to_vec();
    let sender = std::thread::spawn(move || -> R<SendConn> {
        let mut tx = tx;
        for &size in &sizes2 {
            let src = vec![7u8; size];
            for _ in 0..reps {
                b2.wait();
                let mut q = std::collections::VecDeque::new();
                for _ in 0..count(size) {
                    if q.len() == in_flight(size) {
                        wait_send(&mut tx, q.pop_front().ok_or("empty")?)?;
                    }
                    let id = loop {
                        // SAFETY: `src` outlives every request: all are waited for below.
                        if let Some(id) = unsafe { tx.isend(src.as_ptr(), size, 0)? } {
                            break id;
                        }
                        std::thread::yield_now();
                    };
                    q.push_back(id);
                }
                while let Some(id) = q.pop_front() {
                    wait_send(&mut tx, id)?;
                }
            }
        }
        Ok(tx)
    });
    let mut out = Vec::new();
    for &size in sizes {
        let k = in_flight(size);
        let mut bufs: Vec<Vec<u8>> = (0..k).map(|_| vec![0u8; size]).collect();
        let mut got = Vec::new();
        for _ in 0..reps {
            barrier.wait();
            let start = Instant::now();
            let n = count(size);
            let (mut posted, mut done) = (0, 0);
            let mut q: std::collections::VecDeque<(RequestId, usize)> = Default::default();
            let mut free: Vec<usize> = (0..k).collect();
            while done < n {
                while posted < n
                    && let Some(slot) = free.pop()
                {
                    let b = RecvBuf {
                        ptr: bufs[slot].as_mut_ptr(),
                        len: size,
                        tag: 0,
                    };
                    // SAFETY: each buffer is in at most one posted receive, and every receive
                    // completes before the buffers are dropped.
                    match unsafe { rx.irecv(&[b])? } {
                        Some(id) => {
                            q.push_back((id, slot));
                            posted += 1;
                        }
                        None => {
                            free.push(slot);
                            break;
                        }
                    }
                }
                let &(id, slot) = q.front().ok_or("nothing posted")?;
                if rx.test(id)?.is_some() {
                    q.pop_front();
                    free.push(slot);
                    done += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            let secs = start.elapsed().as_secs_f64();
            got.push((n * size) as f64 / secs / 1e9);
        }
        out.push(got);
    }
    let tx = sender.join().map_err(|_| "sender panicked")??;
    Ok((tx, rx, out))
}

/// iperf3 with `streams` parallel streams from host 0 to host 1's data address, GB/s.
fn iperf(c: &Cluster, streams: usize, port: u16) -> R<f64> {
    let dst = c.host(1).data_ifs[0].1.to_string();
    let p = port.to_string();
    let mut server = c
        .command(1, "iperf3")?
        .args(["-s", "-1", "-B", &dst, "-p", &p])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let mut last = String::new();
    for _ in 0..50 {
        let out = c.exec(
            0,
            "iperf3",
            &[
                "-c",
                &dst,
                "-p",
                &p,
                "-P",
                &streams.to_string(),
                "-t",
                "3",
                "-O",
                "1",
                "-J",
            ],
            Duration::from_secs(60),
        )?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(bps) = text
            .split("\"sum_received\"")
            .nth(1)
            .and_then(|s| s.split("\"bits_per_second\":").nth(1))
            .and_then(|s| s.split([',', '\n', '}']).next())
            .and_then(|s| s.trim().parse::<f64>().ok())
        {
            let _ = server.wait();
            return Ok(bps / 8e9);
        }
        last = text;
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = server.kill();
    let _ = server.wait();
    Err(format!("iperf3 gave no result: {last}").into())
}

const LAT_ITERS: usize = 20_000;
const LAT_WARMUP: usize = 2_000;

/// Like [`ns_pair`] with each host's one transport, as a process (NCCL's) has one: the second
/// connection between two hosts shares the first one's control stream unless
/// `WEFT_SHARE_CTRL=0`.
fn ns_pair_with(c: &Cluster, ts: &[Transport], from: usize, to: usize) -> R<(SendConn, RecvConn)> {
    let (htx, hrx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|s| {
        let rx = s.spawn(move || -> R<RecvConn> {
            let mut l = c.in_host(to, || ts[to].listen(0))??;
            htx.send(l.handle().to_vec())?;
            Ok(l.wait()?)
        });
        let h = hrx.recv_timeout(Duration::from_secs(30))?;
        let tx = c.in_host(from, || -> R<SendConn> {
            Ok(ts[from].connect(0, &h)?.wait()?)
        })??;
        let rx = rx.join().map_err(|_| "accept thread panicked")??;
        Ok((tx, rx))
    })
}

/// Host `me` connects to the listener `handle` of the other host and accepts on `l`, polling
/// both in one thread inside its namespace, as NCCL's proxy does with both directions at once.
fn both_ways(
    c: &Cluster,
    t: &Transport,
    me: usize,
    mut l: weft_transport::Listener,
    handle: &[u8],
) -> R<(SendConn, RecvConn)> {
    c.in_host(me, || -> R<(SendConn, RecvConn)> {
        Ok(t.connect_and_accept(0, handle, &mut l)?)
    })?
}

/// Median 8-byte round trip over weft, µs, and whether the two connections shared their
/// control stream by the end. `at_once`: both directions connect at the same time (NCCL's
/// pattern: neither handshake can JOIN, the senders MOVE during the warm-up); else one after
/// the other (the second JOINs at its handshake).
fn weft_latency(c: &Cluster, cfg: &Config, at_once: bool) -> R<(f64, bool)> {
    let ts = (0..2)
        .map(|i| {
            c.in_host(i, || Transport::new(cfg.clone()))?
                .map_err(Into::into)
        })
        .collect::<R<Vec<_>>>()?;
    let ((mut tx01, mut rx01), (mut tx10, mut rx10)) = if at_once {
        let l0 = c.in_host(0, || ts[0].listen(0))??;
        let l1 = c.in_host(1, || ts[1].listen(0))??;
        let (h0, h1) = (l0.handle(), l1.handle());
        let (ts0, ts1) = (&ts[0], &ts[1]);
        std::thread::scope(|s| -> R<_> {
            let b = s.spawn(|| both_ways(c, ts1, 1, l1, &h0));
            let (tx01, rx10) = both_ways(c, ts0, 0, l0, &h1)?;
            let (tx10, rx01) = b.join().map_err(|_| "connect thread panicked")??;
            Ok(((tx01, rx01), (tx10, rx10)))
        })?
    } else {
        (ns_pair_with(c, &ts, 0, 1)?, ns_pair_with(c, &ts, 1, 0)?)
    };
    let echo = std::thread::spawn(move || -> R<(RecvConn, SendConn)> {
        let mut b = [0u8; 8];
        for _ in 0..LAT_WARMUP + LAT_ITERS {
            rx01.recv(&mut b, 1)?;
            tx10.send(&b, 1)?;
        }
        Ok((rx01, tx10))
    });
    let mut b = [1u8; 8];
    let mut rtts = Vec::with_capacity(LAT_ITERS);
    for i in 0..LAT_WARMUP + LAT_ITERS {
        let t = Instant::now();
        tx01.send(&b, 1)?;
        rx10.recv(&mut b, 1)?;
        if i >= LAT_WARMUP {
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let (rx01, tx10) = echo.join().map_err(|_| "echo panicked")??;
    let shared = [tx01.shares_control_stream(), rx10.shares_control_stream()]
        .into_iter()
        .chain([tx10.shares_control_stream(), rx01.shares_control_stream()])
        .all(|x| x);
    Ok((median(&mut rtts), shared))
}

fn spin_read(mut s: &TcpStream, b: &mut [u8]) -> std::io::Result<()> {
    let mut at = 0;
    while at < b.len() {
        match s.read(&mut b[at..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A connected (host 0 end, host 1 end) TCP pair between the data0 addresses.
fn tcp_pair(c: &Cluster) -> R<(TcpStream, TcpStream)> {
    let dst = IpAddr::V4(c.host(1).data_ifs[0].1);
    let l = c.in_host(1, || TcpListener::bind(SocketAddr::new(dst, 0)))??;
    let addr = l.local_addr()?;
    let client = c.in_host(0, || TcpStream::connect(addr))??;
    let (server, _) = l.accept()?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
    }
    Ok((client, server))
}

/// Median 8-byte round trip over plain TCP (TCP_NODELAY, non-blocking, spinning) between the
/// hosts' data0 addresses, µs: over one connection, or (`two`) over one connection each
/// way as weft's one-way connections do.
fn tcp_latency(c: &Cluster, two: bool) -> R<f64> {
    let (c0, s0) = tcp_pair(c)?;
    let (out0, in1) = (c0.try_clone()?, s0.try_clone()?);
    let (in0, out1) = if two {
        let (c1, s1) = tcp_pair(c)?;
        (c1, s1)
    } else {
        (c0, s0)
    };
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut b = [0u8; 8];
        for _ in 0..LAT_WARMUP + LAT_ITERS {
            spin_read(&in1, &mut b)?;
            (&out1).write_all(&b)?;
        }
        Ok(())
    });
    let mut b = [1u8; 8];
    let mut rtts = Vec::with_capacity(LAT_ITERS);
    for i in 0..LAT_WARMUP + LAT_ITERS {
        let t = Instant::now();
        (&out0).write_all(&b)?;
        spin_read(&in0, &mut b)?;
        if i >= LAT_WARMUP {
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    echo.join().map_err(|_| "echo panicked")??;
    Ok(median(&mut rtts))
}

fn human(size: usize) -> String {
    if size >= 1 << 30 {
        format!("{} GiB", size >> 30)
    } else if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() -> R<()> {
    let o = opts();
    if let Err(why) = weft_netns::available() {
        println!("netns_bw: skipped: {why}");
        return Ok(());
    }
    let mut cfg = Config::from_env()?;
    cfg.mgmt_ifname = Some("=mgmt0".parse()?);
    cfg.data_ifname = Some("=data0".parse()?);
    let streams = cfg.streams();
    let c = Cluster::create(&ClusterSpec {
        hosts: 2,
        data_rails: 1,
        mtu: 9000,
    })?;
    println!(
        "weft: {} threads x {} streams/thread = {streams} streams, min chunk {} KiB, sock buf {}, \
         {} repetitions; load average before: {}; {} CPUs",
        cfg.nthreads,
        cfg.nsocks_per_thread,
        cfg.min_chunk >> 10,
        if cfg.sock_buf == 0 {
            "auto".to_string()
        } else {
            cfg.sock_buf.to_string()
        },
        o.reps,
        load(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    // --latency-only: no bandwidth sweep at all.
    let sz = if o.bandwidth {
        sizes(o.min, o.max)
    } else {
        Vec::new()
    };
    // Repetitions alternate a weft sweep and an iperf3 run, so that both see the same load
    // (this machine is shared); each weft figure is also divided by the iperf3 run next to it.
    let (mut tx, mut rx) = ns_pair(&c, &cfg, 0, 1)?;
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); sz.len()];
    let mut paired: Vec<Vec<f64>> = vec![Vec::new(); sz.len()];
    let mut ip = Vec::new();
    let mut iperf_ok = o.iperf && o.bandwidth;
    for r in 0..if o.bandwidth { o.reps } else { 0 } {
        let (t, x, one) = bandwidth(tx, rx, &sz, 1)?;
        (tx, rx) = (t, x);
        for (i, v) in one.iter().enumerate() {
            ns[i].push(v[0]);
        }
        if iperf_ok {
            match iperf(&c, streams, 5201 + r as u16) {
                Ok(v) => {
                    ip.push(v);
                    for (i, w) in one.iter().enumerate() {
                        paired[i].push(w[0] / v);
                    }
                }
                Err(e) => {
                    println!("iperf3: {e}");
                    iperf_ok = false;
                }
            }
        }
    }
    drop((tx, rx));
    let lo = if o.loopback && o.bandwidth {
        let mut lcfg = cfg.clone();
        lcfg.mgmt_ifname = Some("=lo".parse()?);
        lcfg.data_ifname = Some("=lo".parse()?);
        let t = Transport::new(lcfg)?;
        let t2 = t.clone();
        let (tx, rx) = pair(
            move || {
                let l = t.listen(0)?;
                Ok((t, l))
            },
            move |h| Ok(t2.connect(0, h)?.wait()?),
        )?;
        Some(bandwidth(tx, rx, &sz, o.reps)?.2)
    } else {
        None
    };
    let ipm = if ip.is_empty() {
        None
    } else {
        Some(median(&mut ip.clone()))
    };
    if let Some(m) = ipm {
        println!(
            "\niperf3 -P {streams} (same namespaces, data0): median {m:.2} GB/s over {} runs (min {:.2}, max {:.2})",
            ip.len(),
            ip.iter().copied().fold(f64::MAX, f64::min),
            ip.iter().copied().fold(0.0, f64::max)
        );
    }
    println!(
        "\n| message | weft netns GB/s median (min-max) | iperf3 -P {streams} GB/s | weft / iperf3 (medians) | weft / iperf3 (median of paired runs) | weft loopback GB/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (i, &s) in sz.iter().enumerate() {
        let mut v = ns[i].clone();
        let m = median(&mut v);
        let (mn, mx) = (v[0], v[v.len() - 1]);
        let ratio = ipm.map_or("-".into(), |p| format!("{:.0}%", 100.0 * m / p));
        let pr = if paired[i].is_empty() {
            "-".to_string()
        } else {
            let mut v = paired[i].clone();
            let m = median(&mut v);
            format!(
                "{:.0}% ({:.0}-{:.0}%)",
                100.0 * m,
                100.0 * v[0],
                100.0 * v[v.len() - 1]
            )
        };
        let lo_s = lo
            .as_ref()
            .map_or("-".into(), |l| format!("{:.2}", median(&mut l[i].clone())));
        println!(
            "| {} | {m:.2} ({mn:.2}-{mx:.2}) | {} | {ratio} | {pr} | {lo_s} |",
            human(s),
            ipm.map_or("-".into(), |p| format!("{p:.2}"))
        );
    }
    if o.latency {
        let (mut w, mut p, mut p2) = (Vec::new(), Vec::new(), Vec::new());
        let mut shared = true;
        for _ in 0..o.reps {
            let (us, sh) = weft_latency(&c, &cfg, o.at_once)?;
            w.push(us);
            shared &= sh;
            p.push(tcp_latency(&c, false)?);
            p2.push(tcp_latency(&c, true)?);
        }
        let (wm, pm, pm2) = (median(&mut w), median(&mut p), median(&mut p2));
        println!(
            "\n8-byte round trip, median of {} runs (each the median of {LAT_ITERS}): weft {wm:.1} us \
             (control stream {}); \
             plain TCP one connection {pm:.1} us (weft/TCP {:.2}x); plain TCP one connection each \
             way {pm2:.1} us (weft/TCP {:.2}x)",
            w.len(),
            if shared {
                "shared"
            } else {
                "one per connection"
            },
            wm / pm,
            wm / pm2
        );
    }
    println!("load average after: {}", load());
    Ok(())
}
