//! Benchmark: weft's ofi backend against `fi_pingpong` with the same
//! provider and message sizes, in the same run. Ping-pong over two one-way connections (A→B,
//! B→A) in two threads; like fi_pingpong, "MB/s" counts both directions and "µs/xfer" is half a
//! round trip.
//!
//! `cargo bench -p weft-transport --bench ofi_loopback`
//! (`WEFT_BENCH_PROVIDERS="tcp;ofi_rxm:lo,shm:"` to choose).
//!
//! A quick look within one host only: one run, unpinned, fi_pingpong's figures uncorrected.
//! fi_pingpong times its loop from the first send, which includes `ofi_rxm`'s connection
//! set-up (20-200 ms on the 2-vCPU VM), and two busy-polling processes on a loaded 2-core host
//! wait for each other's time slices, which is why its figures here swing by 10x between
//! neighbouring sizes. The comparison in docs/benchmarks.md is `benches/ofi_netns.rs`: a
//! namespace pair, pinned processes, fi_pingpong corrected for its set-up, alternating
//! repetitions and medians.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use weft_transport::{BackendKind, Config, RecvConn, SendConn, Transport};

fn cfg(provider: &str, domain: &str, backend: BackendKind) -> Config {
    Config {
        mgmt_ifname: Some("=lo".parse().unwrap()),
        timeout: Duration::from_secs(30),
        backend,
        ofi_provider: Some(provider.into()),
        ofi_domain: (!domain.is_empty()).then(|| domain.to_string()),
        ..Config::default()
    }
}

fn pair(t: &Transport) -> (SendConn, RecvConn) {
    let mut l = t.listen(0).unwrap();
    t.connect_and_accept(0, &l.handle(), &mut l).unwrap()
}

fn iters(size: usize) -> usize {
    match size {
        0..=4096 => 5000,
        4097..=65536 => 2000,
        65537..=1048576 => 300,
        _ => 40,
    }
}

/// (MB/s both directions, µs per one-way transfer).
fn weft_pingpong(t: &Transport, size: usize) -> (f64, f64) {
    let (mut a_tx, mut b_rx) = pair(t);
    let (mut b_tx, mut a_rx) = pair(t);
    let n = iters(size);
    let warm = n / 10 + 1;
    let h = thread::spawn(move || {
        let mut buf = vec![1u8; size];
        for _ in 0..warm + n {
            b_rx.recv(&mut buf, 0).unwrap();
            b_tx.send(&buf, 0).unwrap();
        }
        (b_rx, b_tx)
    });
    let mut buf = vec![2u8; size];
    let mut start = Instant::now();
    for i in 0..warm + n {
        if i == warm {
            start = Instant::now();
        }
        a_tx.send(&buf, 0).unwrap();
        a_rx.recv(&mut buf, 0).unwrap();
    }
    let el = start.elapsed().as_secs_f64();
    let _ = h.join().unwrap();
    let total = 2.0 * (size * n) as f64;
    (total / el / 1e6, el * 1e6 / (2 * n) as f64)
}

/// fi_pingpong's (MB/s, µs/xfer) for the same provider, size and iterations.
fn fi_pingpong(provider: &str, domain: &str, size: usize, port: u16) -> Option<(f64, f64)> {
    let n = iters(size).to_string();
    let s = size.to_string();
    let mut args = vec!["-p", provider, "-e", "rdm", "-I", &n, "-S", &s];
    if !domain.is_empty() {
        args.extend(["-d", domain]);
    }
    let p = port.to_string();
    let mut srv = Command::new("fi_pingpong")
        .args(&args)
        .args(["-B", &p])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    thread::sleep(Duration::from_millis(300));
    let out = Command::new("timeout")
        .arg("120")
        .arg("fi_pingpong")
        .args(&args)
        .args(["-P", &p, "127.0.0.1"])
        .output()
        .ok()?;
    let _ = srv.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last()?;
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 {
        return None;
    }
    Some((f[5].parse().ok()?, f[6].parse().ok()?))
}

fn main() {
    let provs =
        std::env::var("WEFT_BENCH_PROVIDERS").unwrap_or_else(|_| "tcp;ofi_rxm:lo,shm:".into());
    let sizes = [8usize, 1024, 8192, 65536, 1 << 20, 4 << 20, 16 << 20];
    let mut port = 47700;
    println!(
        "| provider | size | fi_pingpong MB/s | weft ofi MB/s | ratio | fi_pingpong µs | weft ofi µs | ratio | weft tcp MB/s | weft tcp µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for pd in provs.split(',') {
        let (p, d) = pd.split_once(':').unwrap_or((pd, ""));
        let t = Transport::new(cfg(p, d, BackendKind::Ofi)).unwrap();
        assert!(t.is_ofi(), "{:?}", t.backend_note());
        let tcp = Transport::new(cfg(p, d, BackendKind::Tcp)).unwrap();
        for &size in &sizes {
            port += 1;
            let fp = fi_pingpong(p, d, size, port);
            let w = weft_pingpong(&t, size);
            let wt = weft_pingpong(&tcp, size);
            let (fbw, flat) = fp.unwrap_or((f64::NAN, f64::NAN));
            println!(
                "| {p} | {size} | {fbw:.1} | {:.1} | {:.2} | {flat:.2} | {:.2} | {:.2} | {:.1} | {:.2} |",
                w.0,
                w.0 / fbw,
                w.1,
                w.1 / flat,
                wt.0,
                wt.1
            );
        }
    }
}
