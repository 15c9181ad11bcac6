//! Packet loss on the management network: every host sends a paced train of ICMP echoes
//! ([`weft_icmp::echo_train`]) to every other host's management address (the hidden
//! `weft bench loss-probe`), and [`judge`] decides which links lose packets. A host is named
//! when every measured pair that involves it is lossy (its own link drops requests it sends
//! and replies to the requests it gets), so one lossy link among many healthy ones is named
//! alone; lossy pairs no host explains are reported as pairs.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A pair is lossy from this percentage of unanswered echoes on...
pub const LOSSY_PCT: f64 = 1.0;
/// ...and at least this many unanswered (a single lost echo is noise).
pub const LOSSY_MIN: u32 = 3;

/// What one train from this host found, as `weft bench loss-probe` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainResult {
    pub dst: Ipv4Addr,
    pub sent: u32,
    pub received: u32,
    /// Median round trip of the answered echoes, microseconds (0 when none).
    pub rtt_us: f64,
}

/// Trains to every one of `dsts` at once (one thread each): `count` echoes each, one every
/// `interval`, late answers awaited for `linger`.
pub fn probe(
    dsts: &[Ipv4Addr],
    count: u32,
    interval: Duration,
    linger: Duration,
) -> std::io::Result<Vec<TrainResult>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = dsts
            .iter()
            .map(|&d| s.spawn(move || weft_icmp::echo_train(d, count, interval, linger)))
            .collect();
        dsts.iter()
            .zip(hs)
            .map(|(&dst, h)| {
                let t = h
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("echo thread panicked")))?;
                let mut rtts: Vec<f64> = t.rtts.iter().map(|d| d.as_secs_f64() * 1e6).collect();
                Ok(TrainResult {
                    dst,
                    sent: t.sent,
                    received: t.received,
                    rtt_us: crate::p2p::median(&mut rtts).unwrap_or(0.0),
                })
            })
            .collect()
    })
}

/// One measured ordered pair of hosts (indexes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairLoss {
    pub src: usize,
    pub dst: usize,
    pub sent: u32,
    pub received: u32,
}

impl PairLoss {
    pub fn lost(&self) -> u32 {
        self.sent.saturating_sub(self.received)
    }

    pub fn pct(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            100.0 * f64::from(self.lost()) / f64::from(self.sent)
        }
    }

    /// Loses enough to matter.
    pub fn lossy(&self) -> bool {
        self.lost() >= LOSSY_MIN && self.pct() >= LOSSY_PCT
    }
}

/// What [`judge`] found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LossVerdict {
    /// Hosts every measured pair of which is lossy, with the loss of those pairs (percent).
    pub hosts: Vec<(usize, f64)>,
    /// Lossy pairs (indexes into the input) that no named host explains.
    pub pairs: Vec<usize>,
}

/// Which hosts explain the lossy pairs among `n` hosts. With two hosts a lossy pair cannot
/// tell its ends apart, and both are named. A pair whose every echo was lost is left to the
/// other checks (a host that is down, or blocks ICMP): it does not make a host lossy.
pub fn judge(n: usize, pairs: &[PairLoss]) -> LossVerdict {
    let counted = |p: &PairLoss| p.sent > 0 && p.received > 0;
    let mut v = LossVerdict::default();
    for h in 0..n {
        let mine: Vec<&PairLoss> = pairs
            .iter()
            .filter(|p| counted(p) && (p.src == h || p.dst == h))
            .collect();
        if !mine.is_empty() && mine.iter().all(|p| p.lossy()) {
            let (sent, lost) = mine
                .iter()
                .fold((0u32, 0u32), |(s, l), p| (s + p.sent, l + p.lost()));
            v.hosts
                .push((h, 100.0 * f64::from(lost) / f64::from(sent.max(1))));
        }
    }
    for (k, p) in pairs.iter().enumerate() {
        if counted(p) && p.lossy() && !v.hosts.iter().any(|(h, _)| *h == p.src || *h == p.dst) {
            v.pairs.push(k);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ordered pair among `n`, 300 echoes, `lost(src, dst)` unanswered.
    fn all(n: usize, lost: impl Fn(usize, usize) -> u32) -> Vec<PairLoss> {
        let mut v = Vec::new();
        for s in 0..n {
            for d in 0..n {
                if s != d {
                    v.push(PairLoss {
                        src: s,
                        dst: d,
                        sent: 300,
                        received: 300 - lost(s, d),
                    });
                }
            }
        }
        v
    }

    #[test]
    fn one_lossy_link_names_its_host_alone() {
        // Host 1 loses 5% of what it sends: its requests and its replies.
        let v = judge(3, &all(3, |s, d| if s == 1 || d == 1 { 15 } else { 0 }));
        assert_eq!(v.hosts.len(), 1, "{v:?}");
        assert_eq!(v.hosts[0].0, 1);
        assert!((v.hosts[0].1 - 5.0).abs() < 1e-9, "{v:?}");
        assert!(v.pairs.is_empty(), "{v:?}");
    }

    #[test]
    fn noise_a_dead_peer_and_an_unexplained_pair() {
        // One lost echo here and there: nothing.
        let v = judge(4, &all(4, |s, d| u32::from((s + d) % 3 == 0)));
        assert_eq!(v, LossVerdict::default());
        // A host that answers nothing is not lossy (reach and the other checks say why).
        let v = judge(3, &all(3, |s, d| if s == 2 || d == 2 { 300 } else { 0 }));
        assert_eq!(v, LossVerdict::default());
        // One lossy pair between healthy hosts: the pair, no host.
        let p = all(4, |s, d| if (s, d) == (0, 3) { 20 } else { 0 });
        let v = judge(4, &p);
        assert!(v.hosts.is_empty(), "{v:?}");
        assert_eq!(v.pairs.len(), 1);
        assert_eq!((p[v.pairs[0]].src, p[v.pairs[0]].dst), (0, 3));
        // Two hosts: both ends named.
        let v = judge(2, &all(2, |_, _| 12));
        assert_eq!(v.hosts.iter().map(|h| h.0).collect::<Vec<_>>(), [0, 1]);
    }
}
