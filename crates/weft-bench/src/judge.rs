//! Judging a measured bandwidth matrix: which pairs are slow, and which hosts explain them.
//!
//! A pure function over the matrix ([`judge`]), so that every combination of faults is a
//! table-driven test. The rules:
//!
//! * **Expected values first.** A pair whose ends have an expected rate (`--expect-speed`, or
//!   the link speed a physical NIC reports) is judged against the smaller of the two, capped
//!   by the best rate any pair reached on the rail (a TCP probe may not reach line rate; what
//!   the best pair reaches is what the probe can show).
//! * **Peers second.** Otherwise the reference is the median, over the hosts, of each host's
//!   best pair: a healthy host reaches a healthy rate with *some* peer, so two slow hosts of
//!   four do not drag the reference down with them, and one unusually fast pair does not
//!   raise it.
//! * **Failed pairs are excluded from every statistic**: a down NIC or an unreachable host
//!   neither lowers the reference nor counts as slow; hosts whose every pair failed are
//!   reported as such ([`Verdict::unreachable`]).
//! * **Hosts explain slow pairs.** A host may be blamed for sending when every measured pair
//!   from it is slow, for receiving when every measured pair to it is slow. Among those
//!   candidates the smallest sets that explain every slow pair they can are found, and every
//!   candidate that belongs to one of them is blamed: with two hosts a slow pair cannot tell
//!   its ends apart and both are named, while a third host that receives from two slow
//!   senders is not.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One measured ordered pair, as the judge sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub src: usize,
    pub dst: usize,
    pub rail: usize,
    /// `None`: the pair could not be measured.
    pub gbps: Option<f64>,
}

/// Where a pair's reference rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// What the hosts' links should do (`--expect-speed` or the reported link speed).
    Expected,
    /// The median of every host's best pair on the rail.
    Peers,
}

/// The reference a pair was judged against.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    pub gbps: f64,
    pub basis: Basis,
}

/// Which way a blamed host is slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Sending,
    Receiving,
    Both,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Sending => "sending",
            Direction::Receiving => "receiving",
            Direction::Both => "both",
        }
    }
}

/// A host blamed for slow pairs on one rail.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBlame {
    pub host: usize,
    pub rail: usize,
    pub direction: Direction,
}

/// What [`judge`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Per pair (same order as the input): its reference, `None` for failed pairs or a rail
    /// with nothing measured.
    pub reference: Vec<Option<Reference>>,
    /// Indexes of the slow pairs (measured and below `threshold` x their reference).
    pub slow: Vec<usize>,
    /// Hosts that explain slow pairs, sorted by rail then host.
    pub blamed: Vec<HostBlame>,
    /// (host, rail) of hosts with pairs on the rail whose every pair failed.
    pub unreachable: Vec<(usize, usize)>,
}

/// Expected rate of `host` on `rail`, Gb/s.
pub type IndexedRailTargets = BTreeMap<(usize, usize), f64>;

fn median(mut v: Vec<f64>) -> Option<f64> {
    crate::p2p::median(&mut v)
}

/// Judges `pairs` among `n_hosts` hosts: slow below `threshold` x the reference.
pub fn judge(
    n_hosts: usize,
    pairs: &[Measured],
    expected: &IndexedRailTargets,
    threshold: f64,
) -> Verdict {
    let mut rails: Vec<usize> = pairs.iter().map(|p| p.rail).collect();
    rails.sort_unstable();
    rails.dedup();
    let mut reference = vec![None; pairs.len()];
    let mut slow = Vec::new();
    let mut blamed = Vec::new();
    let mut unreachable = Vec::new();
    for &rail in &rails {
        let on: Vec<usize> = (0..pairs.len())
            .filter(|&k| pairs[k].rail == rail)
            .collect();
        let ok = |k: &usize| pairs[*k].gbps.is_some();
        let rate = |k: usize| pairs[k].gbps.unwrap_or(0.0);
        let best_pair = on
            .iter()
            .filter(|k| ok(k))
            .map(|&k| rate(k))
            .fold(0.0, f64::max);
        // Each host's best measured pair, either direction.
        let bests: Vec<f64> = (0..n_hosts)
            .filter_map(|h| {
                on.iter()
                    .filter(|k| ok(k))
                    .filter(|&&k| pairs[k].src == h || pairs[k].dst == h)
                    .map(|&k| rate(k))
                    .reduce(f64::max)
            })
            .collect();
        let peers = median(bests);
        for &k in &on {
            let p = &pairs[k];
            if p.gbps.is_none() {
                continue;
            }
            let exp = [p.src, p.dst]
                .iter()
                .filter_map(|h| expected.get(&(*h, rail)).copied())
                .reduce(f64::min);
            let r = match (exp, peers) {
                (Some(e), _) => Some(Reference {
                    gbps: e.min(best_pair),
                    basis: Basis::Expected,
                }),
                (None, Some(m)) => Some(Reference {
                    gbps: m,
                    basis: Basis::Peers,
                }),
                (None, None) => None,
            };
            if let Some(r) = r
                && rate(k) < threshold * r.gbps
            {
                slow.push(k);
            }
            reference[k] = r;
        }
        for h in 0..n_hosts {
            let mine: Vec<usize> = on
                .iter()
                .copied()
                .filter(|&k| pairs[k].src == h || pairs[k].dst == h)
                .collect();
            if !mine.is_empty() && mine.iter().all(|&k| pairs[k].gbps.is_none()) {
                unreachable.push((h, rail));
            }
        }
        // Candidates: (host, sending?) whose every measured pair that way is slow.
        let slow_on: Vec<usize> = slow
            .iter()
            .copied()
            .filter(|k| pairs[*k].rail == rail)
            .collect();
        let mut cands: Vec<(usize, bool, Vec<usize>)> = Vec::new();
        for h in 0..n_hosts {
            for sending in [true, false] {
                let end = |k: usize| {
                    if sending { pairs[k].src } else { pairs[k].dst }
                };
                let measured: Vec<usize> = on
                    .iter()
                    .copied()
                    .filter(|&k| ok(&k) && end(k) == h)
                    .collect();
                if !measured.is_empty() && measured.iter().all(|k| slow_on.contains(k)) {
                    cands.push((h, sending, measured));
                }
            }
        }
        // The slow pairs some candidate explains; the others are reported as pairs only.
        let coverable: Vec<usize> = slow_on
            .iter()
            .copied()
            .filter(|k| cands.iter().any(|c| c.2.contains(k)))
            .collect();
        let chosen = minimal_covers(&cands, &coverable);
        let mut per_host: BTreeMap<usize, (bool, bool)> = BTreeMap::new();
        for c in chosen {
            let e = per_host.entry(cands[c].0).or_default();
            if cands[c].1 {
                e.0 = true;
            } else {
                e.1 = true;
            }
        }
        for (host, (s, r)) in per_host {
            blamed.push(HostBlame {
                host,
                rail,
                direction: match (s, r) {
                    (true, true) => Direction::Both,
                    (true, false) => Direction::Sending,
                    _ => Direction::Receiving,
                },
            });
        }
    }
    Verdict {
        reference,
        slow,
        blamed,
        unreachable,
    }
}

/// Most subsets [`minimal_covers`] examines before settling for every candidate.
const MAX_SUBSETS: usize = 200_000;

/// Indexes of the candidates that belong to some smallest set covering `targets`; every
/// candidate when the search would examine more than [`MAX_SUBSETS`] subsets.
fn minimal_covers(cands: &[(usize, bool, Vec<usize>)], targets: &[usize]) -> Vec<usize> {
    if targets.is_empty() {
        return Vec::new();
    }
    let n = cands.len();
    let covers = |set: &[usize]| {
        targets
            .iter()
            .all(|t| set.iter().any(|&c| cands[c].2.contains(t)))
    };
    let mut examined = 0usize;
    for k in 1..=n {
        let mut hits: Vec<usize> = Vec::new();
        let mut idx: Vec<usize> = (0..k).collect();
        loop {
            examined += 1;
            if examined > MAX_SUBSETS {
                return (0..n).collect();
            }
            if covers(&idx) {
                hits.extend(idx.iter().copied());
            }
            // Next k-combination of 0..n in lexicographic order.
            let Some(i) = (0..k).rev().find(|&i| idx[i] < n - k + i) else {
                break;
            };
            idx[i] += 1;
            for j in i + 1..k {
                idx[j] = idx[j - 1] + 1;
            }
        }
        if !hits.is_empty() {
            hits.sort_unstable();
            hits.dedup();
            return hits;
        }
    }
    (0..n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full matrix over `n` hosts on rail 0: `rate(src, dst)` Gb/s, `None` for a failed pair.
    fn matrix(n: usize, rate: impl Fn(usize, usize) -> Option<f64>) -> Vec<Measured> {
        let mut v = Vec::new();
        for s in 0..n {
            for d in 0..n {
                if s != d {
                    v.push(Measured {
                        src: s,
                        dst: d,
                        rail: 0,
                        gbps: rate(s, d),
                    });
                }
            }
        }
        v
    }

    fn blamed(v: &Verdict) -> Vec<(usize, Direction)> {
        v.blamed.iter().map(|b| (b.host, b.direction)).collect()
    }

    use Direction::{Both, Receiving, Sending};

    /// Every combination of the issue, and the edge cases: which hosts are named, which way.
    #[test]
    fn every_combination_names_exactly_the_faulty_hosts() {
        type Rate = Box<dyn Fn(usize, usize) -> Option<f64>>;
        let healthy = 1.0;
        /// Name, hosts, rates, who is blamed which way, who is unreachable.
        type Case = (
            &'static str,
            usize,
            Rate,
            Vec<(usize, Direction)>,
            Vec<usize>,
        );
        let cases: Vec<Case> = vec![
            (
                "all healthy",
                4,
                Box::new(move |_, _| Some(healthy)),
                vec![],
                vec![],
            ),
            (
                "one slow sender",
                4,
                Box::new(|s, _| Some(if s == 2 { 0.2 } else { 1.0 })),
                vec![(2, Sending)],
                vec![],
            ),
            (
                "two slow senders of four",
                4,
                Box::new(|s, _| Some(if s == 1 || s == 2 { 0.2 } else { 1.0 })),
                vec![(1, Sending), (2, Sending)],
                vec![],
            ),
            (
                "two slow NICs of four (both directions)",
                4,
                Box::new(|s, d| {
                    Some(if [s, d].iter().any(|h| *h < 2) {
                        0.2
                    } else {
                        1.0
                    })
                }),
                vec![(0, Both), (1, Both)],
                vec![],
            ),
            (
                "slow sender plus a down NIC",
                4,
                Box::new(|s, d| {
                    if s == 1 || d == 1 {
                        None
                    } else {
                        Some(if s == 2 { 0.2 } else { 1.0 })
                    }
                }),
                vec![(2, Sending)],
                vec![1],
            ),
            (
                "slow sender plus a host that is not in the matrix",
                3,
                Box::new(|s, _| Some(if s == 0 { 0.2 } else { 1.0 })),
                vec![(0, Sending)],
                vec![],
            ),
            (
                "two slow senders of three: the receiver is not blamed",
                3,
                Box::new(|s, _| Some(if s < 2 { 0.2 } else { 1.0 })),
                vec![(0, Sending), (1, Sending)],
                vec![],
            ),
            (
                "a slow receiver",
                4,
                Box::new(|_, d| Some(if d == 3 { 0.1 } else { 1.0 })),
                vec![(3, Receiving)],
                vec![],
            ),
            (
                "two hosts: a slow pair cannot tell its ends apart",
                2,
                Box::new(|s, _| Some(if s == 0 { 0.3 } else { 1.0 })),
                vec![(0, Sending), (1, Receiving)],
                vec![],
            ),
            (
                "one fast outlier pair raises nothing",
                4,
                Box::new(|s, d| Some(if (s, d) == (0, 1) { 2.5 } else { 1.0 })),
                vec![],
                vec![],
            ),
            (
                "noise within the threshold",
                4,
                Box::new(|s, d| Some(0.7 + 0.1 * ((s * 3 + d) % 4) as f64)),
                vec![],
                vec![],
            ),
        ];
        for (name, n, rate, want, want_unreachable) in cases {
            let v = judge(n, &matrix(n, rate), &IndexedRailTargets::new(), 0.5);
            assert_eq!(blamed(&v), want, "{name}: {v:?}");
            let un: Vec<usize> = v.unreachable.iter().map(|u| u.0).collect();
            assert_eq!(un, want_unreachable, "{name}: {v:?}");
        }
        // Failed pairs are never slow and have no reference.
        let v = judge(3, &matrix(3, |_, _| None), &IndexedRailTargets::new(), 0.5);
        assert!(v.slow.is_empty() && v.blamed.is_empty(), "{v:?}");
        assert!(v.reference.iter().all(Option::is_none));
        assert_eq!(v.unreachable, [(0, 0), (1, 0), (2, 0)]);
    }

    #[test]
    fn failed_pairs_do_not_lower_the_reference() {
        // Host 1 down: half the pairs fail; host 2 sends at 0.45 of the others. Counting the
        // failures as 0 would put the median at 0.45 and pass host 2.
        let m = matrix(4, |s, d| {
            if s == 1 || d == 1 {
                None
            } else {
                Some(if s == 2 { 0.45 } else { 1.0 })
            }
        });
        let v = judge(4, &m, &IndexedRailTargets::new(), 0.5);
        assert_eq!(blamed(&v), [(2, Sending)], "{v:?}");
        for k in &v.slow {
            assert_eq!(m[*k].src, 2);
        }
        assert!(
            v.reference
                .iter()
                .zip(&m)
                .all(|(r, p)| r.is_some() == p.gbps.is_some())
        );
    }

    #[test]
    fn expected_rates_come_first() {
        // Every pair at 0.2: peers cannot tell anything, and an expectation of 1.0 cannot
        // either, because the reference is capped by the best pair: no host is a cause the
        // matrix can show.
        let m = matrix(4, |_, _| Some(0.2));
        let exp: IndexedRailTargets = (0..4).map(|h| ((h, 0), 1.0)).collect();
        assert!(
            judge(4, &m, &IndexedRailTargets::new(), 0.5)
                .blamed
                .is_empty()
        );
        let v = judge(4, &m, &exp, 0.5);
        assert!(v.blamed.is_empty(), "{v:?}");
        assert!(v.reference.iter().all(|r| r.is_some_and(|r| r.gbps == 0.2)));
        // A host whose link is expected slower is judged against its own
        // expectation, not its faster peers: host 0 has a 0.25 Gb/s link and sends at 0.2.
        let m = matrix(4, |s, d| Some(if s == 0 || d == 0 { 0.2 } else { 1.0 }));
        let peers_only = judge(4, &m, &IndexedRailTargets::new(), 0.5);
        assert_eq!(blamed(&peers_only), [(0, Both)]);
        let mut exp = IndexedRailTargets::new();
        exp.insert((0, 0), 0.25);
        let v = judge(4, &m, &exp, 0.5);
        assert!(v.blamed.is_empty(), "{v:?}");
        let k = m.iter().position(|p| p.src == 0).unwrap();
        assert_eq!(
            v.reference[k],
            Some(Reference {
                gbps: 0.25,
                basis: Basis::Expected
            })
        );
        // Two slow NICs of four, every host expecting 1.0: both named from expectations.
        let m = matrix(4, |s, d| Some(if s < 2 || d < 2 { 0.2 } else { 1.0 }));
        let exp: IndexedRailTargets = (0..4).map(|h| ((h, 0), 1.0)).collect();
        assert_eq!(blamed(&judge(4, &m, &exp, 0.5)), [(0, Both), (1, Both)]);
    }

    #[test]
    fn rails_are_judged_apart() {
        let mut m = matrix(3, |_, _| Some(1.0));
        m.extend(
            matrix(3, |s, _| Some(if s == 1 { 0.1 } else { 1.0 }))
                .into_iter()
                .map(|mut p| {
                    p.rail = 1;
                    p
                }),
        );
        let v = judge(3, &m, &IndexedRailTargets::new(), 0.5);
        assert_eq!(
            v.blamed,
            [HostBlame {
                host: 1,
                rail: 1,
                direction: Sending
            }]
        );
    }
}
