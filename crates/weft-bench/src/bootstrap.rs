//! Rank bootstrap: a TCP rendezvous at rank 0. Every other rank connects to rank 0's address
//! (retrying until the deadline: rank 0 may start last) and says who it is; rank 0 answers
//! all-gathers over these star connections. Ranks exchange their plugin listen handles this way,
//! and later barriers and timings. Every read, write and wait is bounded.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::BenchError;

const MAGIC: u32 = 0x5746_4253; // "WFBS"

/// The star of TCP connections around rank 0.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    /// Rank 0: a stream to every other rank (index = rank; index 0 is `None`).
    /// Other ranks: one stream, to rank 0, at index 0.
    streams: Vec<Option<TcpStream>>,
    addr: SocketAddr,
}

fn io(stage: &str, addr: SocketAddr, e: std::io::Error) -> BenchError {
    BenchError::Bootstrap(format!("{stage} {addr}: {e}"))
}

fn write_frame(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    s.write_all(&(data.len() as u32).to_le_bytes())?;
    s.write_all(data)
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 64 << 20 {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            "frame too long",
        ));
    }
    let mut v = vec![0u8; len];
    s.read_exact(&mut v)?;
    Ok(v)
}

impl Bootstrap {
    /// Joins the rendezvous at `addr` as `rank` of `nranks`; returns once all ranks are in.
    /// `timeout` bounds the whole rendezvous and, later, every single read or write.
    pub fn join(
        addr: SocketAddr,
        rank: usize,
        nranks: usize,
        timeout: Duration,
    ) -> Result<Bootstrap, BenchError> {
        if nranks == 0 || rank >= nranks {
            return Err(BenchError::Usage(format!("rank {rank} of {nranks}")));
        }
        let deadline = Instant::now() + timeout;
        let mut streams: Vec<Option<TcpStream>> = (0..nranks).map(|_| None).collect();
        if rank == 0 {
            let l = TcpListener::bind(addr).map_err(|e| io("bind rendezvous", addr, e))?;
            l.set_nonblocking(true)
                .map_err(|e| io("rendezvous", addr, e))?;
            let mut have = 1;
            while have < nranks {
                match l.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false)
                            .and_then(|()| s.set_read_timeout(Some(timeout)))
                            .and_then(|()| s.set_write_timeout(Some(timeout)))
                            .and_then(|()| s.set_nodelay(true))
                            .map_err(|e| io("rendezvous", addr, e))?;
                        let hello =
                            read_frame(&mut s).map_err(|e| io("rendezvous hello", addr, e))?;
                        let (m, r, n) = parse_hello(&hello);
                        if m != MAGIC || n != nranks || r == 0 || r >= nranks {
                            return Err(BenchError::Bootstrap(format!(
                                "rendezvous {addr}: a peer says rank {r} of {n} (expected 1..{nranks} of {nranks})"
                            )));
                        }
                        if streams[r].is_some() {
                            return Err(BenchError::Bootstrap(format!(
                                "rendezvous {addr}: rank {r} joined twice"
                            )));
                        }
                        streams[r] = Some(s);
                        have += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            let missing: Vec<String> = (1..nranks)
                                .filter(|r| streams[*r].is_none())
                                .map(|r| r.to_string())
                                .collect();
                            return Err(BenchError::Timeout(format!(
                                "rendezvous {addr}: ranks {} did not join within {timeout:?}",
                                missing.join(",")
                            )));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(io("rendezvous accept", addr, e)),
                }
            }
        } else {
            let mut last = None;
            let s = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(BenchError::Timeout(format!(
                        "rank {rank}: rendezvous {addr} not reachable within {timeout:?} (last error: {})",
                        last.map_or("none".to_string(), |e: std::io::Error| e.to_string())
                    )));
                }
                match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
                    Ok(s) => break s,
                    Err(e) => {
                        last = Some(e);
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            };
            let mut s = s;
            s.set_read_timeout(Some(timeout))
                .and_then(|()| s.set_write_timeout(Some(timeout)))
                .and_then(|()| s.set_nodelay(true))
                .map_err(|e| io("rendezvous", addr, e))?;
            let mut hello = Vec::with_capacity(12);
            for v in [MAGIC, rank as u32, nranks as u32] {
                hello.extend_from_slice(&v.to_le_bytes());
            }
            write_frame(&mut s, &hello).map_err(|e| io("rendezvous hello", addr, e))?;
            streams[0] = Some(s);
        }
        Ok(Bootstrap {
            rank,
            nranks,
            streams,
            addr,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Every rank's `mine`, indexed by rank.
    pub fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BenchError> {
        let addr = self.addr;
        if self.rank == 0 {
            let mut all = vec![mine.to_vec()];
            for r in 1..self.nranks {
                let s = self.streams[r].as_mut().ok_or_else(|| lost(r))?;
                all.push(
                    read_frame(s)
                        .map_err(|e| io(&format!("bootstrap read from rank {r}"), addr, e))?,
                );
            }
            let mut packed = Vec::new();
            for a in &all {
                packed.extend_from_slice(&(a.len() as u32).to_le_bytes());
                packed.extend_from_slice(a);
            }
            for r in 1..self.nranks {
                let s = self.streams[r].as_mut().ok_or_else(|| lost(r))?;
                write_frame(s, &packed)
                    .map_err(|e| io(&format!("bootstrap write to rank {r}"), addr, e))?;
            }
            Ok(all)
        } else {
            let s = self.streams[0].as_mut().ok_or_else(|| lost(0))?;
            write_frame(s, mine).map_err(|e| io("bootstrap write to rank 0", addr, e))?;
            let packed = read_frame(s).map_err(|e| io("bootstrap read from rank 0", addr, e))?;
            let mut all = Vec::with_capacity(self.nranks);
            let mut rest = &packed[..];
            while rest.len() >= 4 {
                let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let end = (4 + n).min(rest.len());
                all.push(rest[4..end].to_vec());
                rest = &rest[end..];
            }
            if all.len() != self.nranks {
                return Err(BenchError::Bootstrap(
                    "malformed all-gather from rank 0".into(),
                ));
            }
            Ok(all)
        }
    }

    /// Waits until every rank is here.
    pub fn barrier(&mut self) -> Result<(), BenchError> {
        self.allgather(&[]).map(drop)
    }

    /// Every rank's `x`.
    pub fn allgather_f64(&mut self, x: f64) -> Result<Vec<f64>, BenchError> {
        Ok(self
            .allgather(&x.to_le_bytes())?
            .iter()
            .map(|b| f64::from_le_bytes(b.as_slice().try_into().unwrap_or([0; 8])))
            .collect())
    }

    /// Every rank's list `xs` (the lists may differ in length).
    pub fn allgather_f64s(&mut self, xs: &[f64]) -> Result<Vec<Vec<f64>>, BenchError> {
        let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(self
            .allgather(&bytes)?
            .iter()
            .map(|b| {
                b.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect()
            })
            .collect())
    }
}

fn lost(r: usize) -> BenchError {
    BenchError::Bootstrap(format!("no bootstrap connection to rank {r}"))
}

fn parse_hello(b: &[u8]) -> (u32, usize, usize) {
    let w = |i: usize| {
        b.get(i * 4..i * 4 + 4)
            .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    (w(0), w(1) as usize, w(2) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allgather_f64s_gives_every_rank_each_ranks_list_in_rank_order() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let t = Duration::from_secs(20);
        let other = std::thread::spawn(move || {
            let mut b = Bootstrap::join(addr, 1, 2, t).unwrap();
            b.allgather_f64s(&[2.5]).unwrap()
        });
        let mut b = Bootstrap::join(addr, 0, 2, t).unwrap();
        let here = b.allgather_f64s(&[1.0, -0.125]).unwrap();
        let there = other.join().unwrap();
        assert_eq!(here, vec![vec![1.0, -0.125], vec![2.5]]);
        assert_eq!(there, here);
    }
}
