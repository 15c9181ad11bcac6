//! weft-ring-rank, one rank of the ring tests (tests/common): a process that listens, prints
//! `HANDLE <hex>` on stdout, reads the handle of the next rank from stdin, connects to it
//! while accepting from the previous rank, then for `argv[3]` rounds sends to the next rank
//! and receives from the previous one at the same time (round r: `size(r)` bytes, tag r,
//! filled by rank and round, checked on arrival), closes and prints `OK`. Usage:
//! `weft-ring-rank RANK NRANKS ROUNDS MAX_BYTES`; configuration from the `WEFT_*` environment,
//! as the plugin's. Exit status 0 only when every message arrived intact.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use weft_transport::{Config, RecvBuf, Transport};

fn main() {
    if let Err(e) = run() {
        eprintln!("ring_rank: {e}");
        std::process::exit(1);
    }
}

/// Bytes of round `r`: small (eager, inline) and large (RMA, chunked) messages in turn.
fn size(r: usize, max: usize) -> usize {
    [max, 1, 4000, 16384, max / 3, 0][r % 6].min(max)
}

fn fill(rank: usize, round: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13) ^ (rank as u8).wrapping_mul(61) ^ round as u8)
        .collect()
}

fn num(s: &str, what: &str) -> Result<usize, String> {
    s.parse().map_err(|e| format!("{what} {s:?}: {e}"))
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let [_, rank, nranks, rounds, max] = &args[..] else {
        return Err("usage: weft-ring-rank RANK NRANKS ROUNDS MAX_BYTES".into());
    };
    let (rank, nranks) = (num(rank, "rank")?, num(nranks, "nranks")?);
    let (rounds, max) = (num(rounds, "rounds")?, num(max, "max bytes")?);
    let prev = (rank + nranks - 1) % nranks;
    let t = Transport::new(Config::from_env().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let mut l = t.listen(0).map_err(|e| e.to_string())?;
    let hex: String = l.handle().iter().map(|b| format!("{b:02x}")).collect();
    println!("HANDLE {hex}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("stdin: {e}"))?;
    let line = line.trim();
    let next: Vec<u8> = (0..line.len() / 2)
        .map(|i| u8::from_str_radix(&line[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("next handle {line:?}: {e}"))?;
    let (mut tx, mut rx) = t
        .connect_and_accept(0, &next, &mut l)
        .map_err(|e| format!("rank {rank}: connect and accept: {e}"))?;
    let mut dst = vec![0u8; max];
    for round in 0..rounds {
        let n = size(round, max);
        let src = fill(rank, round, n);
        let rb = RecvBuf {
            ptr: dst.as_mut_ptr(),
            len: dst.len(),
            tag: round as i32,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let rr = loop {
            // SAFETY: `dst` outlives the request, tested to completion below.
            match unsafe { rx.irecv(&[rb]) } {
                Ok(Some(id)) => break id,
                Ok(None) if Instant::now() < deadline => {}
                Ok(None) => return Err(format!("rank {rank} round {round}: irecv busy")),
                Err(e) => return Err(format!("rank {rank} round {round}: irecv: {e}")),
            }
        };
        let sr = loop {
            // SAFETY: `src` outlives the request, tested to completion below.
            match unsafe { tx.isend(src.as_ptr(), n, round as i32) } {
                Ok(Some(id)) => break id,
                Ok(None) if Instant::now() < deadline => {}
                Ok(None) => return Err(format!("rank {rank} round {round}: isend busy")),
                Err(e) => return Err(format!("rank {rank} round {round}: isend: {e}")),
            }
        };
        let (mut sd, mut rd) = (None, None);
        while sd.is_none() || rd.is_none() {
            if Instant::now() > deadline {
                return Err(format!("rank {rank} round {round}: not done in 30 s"));
            }
            if sd.is_none() {
                sd = tx
                    .test(sr)
                    .map_err(|e| format!("rank {rank} round {round}: send: {e}"))?;
            }
            if rd.is_none() {
                rd = rx
                    .test(rr)
                    .map_err(|e| format!("rank {rank} round {round}: receive: {e}"))?;
            }
        }
        let got = rd.map_or(0, |c| c.sizes()[0]);
        let want = fill(prev, round, size(round, max));
        if got != want.len() || dst[..got] != want[..] {
            return Err(format!(
                "rank {rank} round {round}: {got} bytes from rank {prev}, not the {} sent",
                want.len()
            ));
        }
    }
    drop((tx, rx));
    println!("OK");
    Ok(())
}
