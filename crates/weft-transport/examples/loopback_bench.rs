//! Loopback numbers: 64 MiB one-way bandwidth and 8-byte round-trip latency, using the same
//! env configuration as the plugin (WEFT_NTHREADS, WEFT_NSOCKS_PERTHREAD, ...; interface
//! defaults to `lo` here). `cargo run --release -p weft-transport --example loopback_bench`.

use std::time::Instant;

use weft_transport::{Config, RecvConn, SendConn, Transport};

fn pair(t: &Transport) -> weft_transport::Result<(SendConn, RecvConn)> {
    let mut l = t.listen(0)?;
    t.connect_and_accept(0, &l.handle(), &mut l)
}

fn main() -> weft_transport::Result<()> {
    let mut cfg = Config::from_env()?;
    if cfg.mgmt_ifname.is_none() {
        cfg.mgmt_ifname = Some("=lo".parse()?);
    }
    let t = Transport::new(cfg)?;
    let (mut tx, mut rx) = pair(&t)?;
    let (mut back_tx, mut back_rx) = pair(&t)?;
    let size = 64 << 20;
    let iters = 20;
    let h = std::thread::spawn(move || -> weft_transport::Result<()> {
        let buf = vec![1u8; size];
        for _ in 0..iters + 2 {
            tx.send(&buf, 0)?;
        }
        let mut b = [0u8; 8];
        for _ in 0..20_000 {
            back_rx.recv(&mut b, 1)?;
            tx.send(&b, 1)?;
        }
        Ok(())
    });
    let mut buf = vec![0u8; size];
    for _ in 0..2 {
        rx.recv(&mut buf, 0)?;
    }
    let start = Instant::now();
    for _ in 0..iters {
        rx.recv(&mut buf, 0)?;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "64 MiB x {iters}: {:.2} GB/s ({} streams)",
        (size * iters) as f64 / secs / 1e9,
        rx.nstreams()
    );
    let mut b = [0u8; 8];
    let mut rtts = Vec::with_capacity(20_000);
    for i in 0..20_000 {
        let s = Instant::now();
        back_tx.send(&b, 1)?;
        rx.recv(&mut b, 1)?;
        if i >= 1000 {
            rtts.push(s.elapsed().as_secs_f64() * 1e6);
        }
    }
    rtts.sort_by(f64::total_cmp);
    println!(
        "8 B round trip: median {:.1} us, p99 {:.1} us, min {:.1} us",
        rtts[rtts.len() / 2],
        rtts[rtts.len() * 99 / 100],
        rtts[0]
    );
    h.join()
        .map_err(|_| weft_transport::Error::Usage("sender panicked".into()))??;
    Ok(())
}
