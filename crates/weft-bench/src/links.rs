//! Time per link of a collectives run: before the collectives, every rank sends a fixed number
//! of bytes to every other rank through the plugin, one ordered pair at a time (no other
//! transfer shares a link with the one measured, not even acknowledgements of one the other
//! way, which a rate-limited egress would delay), and the receiver times it. The matrix is judged
//! like `bench p2p`'s ([`crate::p2p::analyse`]: failed pairs excluded, robust peer
//! reference), so a slow host is named in the collectives report.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::p2p::{self, Blame, Pair, Slow};

/// A pair is slow below this fraction of its reference (as `bench p2p`'s default).
pub const THRESHOLD: f64 = 0.5;

/// One ordered pair of ranks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LinkTime {
    pub src_rank: usize,
    pub dst_rank: usize,
    /// Seconds from the round's start (a barrier) until the receiver had every byte.
    pub seconds: f64,
    pub gbps: f64,
}

/// The links of a run and what stands out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkReport {
    /// Bytes sent over each link.
    pub bytes: usize,
    /// Each rank's host, as the ranks were started (`--hosts` entries), in rank order;
    /// `rankN` where those names are not unique (local ranks).
    pub hosts: Vec<String>,
    pub links: Vec<LinkTime>,
    /// Median of the links, Gb/s.
    pub median_gbps: f64,
    /// Pairs below [`THRESHOLD`] x their reference.
    pub slow: Vec<Slow>,
    /// Hosts that explain the slow pairs (every link from it, or to it, is slow).
    pub blamed: Vec<Blame>,
}

/// Judges `times[dst][src]` (seconds for `bytes` from `src` to `dst`; the diagonal ignored;
/// a non-finite or non-positive time is a failed link) among hosts named `names` (rank order).
pub fn judge(names: &[String], bytes: usize, times: &[Vec<f64>]) -> LinkReport {
    let n = names.len();
    let mut unique = names.to_vec();
    unique.sort();
    unique.dedup();
    let hosts: Vec<String> = if unique.len() == n {
        names.to_vec()
    } else {
        (0..n).map(|r| format!("rank{r}")).collect()
    };
    let mut links = Vec::new();
    let mut pairs = Vec::new();
    for (dst, row) in times.iter().enumerate().take(n) {
        for (src, &t) in row.iter().enumerate().take(n) {
            if src == dst {
                continue;
            }
            let ok = t.is_finite() && t > 0.0;
            let gbps = if ok {
                bytes as f64 * 8.0 / t / 1e9
            } else {
                0.0
            };
            links.push(LinkTime {
                src_rank: src,
                dst_rank: dst,
                seconds: t,
                gbps,
            });
            pairs.push(Pair {
                src: hosts[src].clone(),
                dst: hosts[dst].clone(),
                src_if: String::new(),
                dst_addr: Ipv4Addr::UNSPECIFIED,
                rail: 0,
                gbps,
                rtt_us: 0.0,
                mss: 0,
                error: (!ok).then(|| "no time measured".to_string()),
            });
        }
    }
    links.sort_by_key(|l| (l.src_rank, l.dst_rank));
    let m = p2p::analyse(hosts.clone(), pairs, THRESHOLD);
    LinkReport {
        bytes,
        hosts,
        links,
        median_gbps: m.median_gbps,
        slow: m.slow,
        blamed: m.blamed,
    }
}

/// The report as nccl-tests comment lines (each starts with `#`, so scripts that read
/// nccl-tests output skip them): every link's rate, then the hosts that explain slow links.
pub fn comment_lines(r: &LinkReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Links: {} B from every rank to every other through the plugin, one pair at a time",
        r.bytes
    );
    let w = r.hosts.iter().map(String::len).max().unwrap_or(4).max(4);
    let _ = writeln!(
        s,
        "#  {:>w$}  {:>w$}  {:>10}  {:>10}",
        "from", "to", "time (ms)", "Gb/s"
    );
    for l in &r.links {
        let slow = r
            .slow
            .iter()
            .any(|x| x.src == r.hosts[l.src_rank] && x.dst == r.hosts[l.dst_rank] && x.rail == 0);
        let _ = writeln!(
            s,
            "#  {:>w$}  {:>w$}  {:>10.2}  {:>10.3}{}",
            r.hosts[l.src_rank],
            r.hosts[l.dst_rank],
            l.seconds * 1e3,
            l.gbps,
            if slow { "  SLOW" } else { "" }
        );
    }
    if r.blamed.is_empty() {
        let _ = writeln!(
            s,
            "# Links: all {} within {:.0}% of the reference (median {:.3} Gb/s)",
            r.links.len(),
            THRESHOLD * 100.0,
            r.median_gbps
        );
    }
    for b in &r.blamed {
        let _ = writeln!(s, "# SLOW HOST {} ({}): {}", b.host, b.direction, b.message);
    }
    s.push_str("#\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("h{i}")).collect()
    }

    /// `times[dst][src]` for 1 MB links: `rate(src, dst)` Gb/s.
    fn times(n: usize, rate: impl Fn(usize, usize) -> f64) -> Vec<Vec<f64>> {
        (0..n)
            .map(|d| {
                (0..n)
                    .map(|s| {
                        if s == d {
                            0.0
                        } else {
                            8e6 / (rate(s, d) * 1e9)
                        }
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_slow_sender_is_named_and_nobody_else() {
        let r = judge(
            &names(4),
            1_000_000,
            &times(4, |s, _| if s == 2 { 0.08 } else { 0.4 }),
        );
        let b: Vec<(&str, &str)> = r
            .blamed
            .iter()
            .map(|b| (b.host.as_str(), b.direction.as_str()))
            .collect();
        assert_eq!(b, [("h2", "sending")], "{r:#?}");
        assert_eq!(r.slow.len(), 3);
        assert!((r.links[0].gbps - 0.4).abs() < 1e-9, "{r:#?}");
        let t = comment_lines(&r);
        assert!(t.lines().all(|l| l.starts_with('#')), "{t}");
        assert!(
            t.contains("# SLOW HOST h2 (sending): every pair from h2"),
            "{t}"
        );
        assert_eq!(t.matches("  SLOW\n").count(), 3, "{t}");
    }

    #[test]
    fn healthy_links_name_nobody_and_failed_links_do_not_count_as_slow() {
        let r = judge(&names(3), 1_000_000, &times(3, |_, _| 1.0));
        assert!(r.blamed.is_empty() && r.slow.is_empty(), "{r:#?}");
        assert!(comment_lines(&r).contains("# Links: all 6 within 50%"));
        // One link without a time: excluded, the others still fine.
        let mut t = times(3, |_, _| 1.0);
        t[1][0] = f64::NAN;
        let r = judge(&names(3), 1_000_000, &t);
        assert!(r.slow.is_empty(), "{r:#?}");
        assert!(r.blamed.iter().all(|b| b.what != "bandwidth"), "{r:#?}");
    }

    #[test]
    fn ranks_on_one_host_name_are_told_apart_by_rank() {
        let same = vec!["local".to_string(); 3];
        let r = judge(
            &same,
            1_000_000,
            &times(3, |_, d| if d == 1 { 0.1 } else { 1.0 }),
        );
        assert_eq!(r.hosts, ["rank0", "rank1", "rank2"]);
        assert_eq!(r.blamed.len(), 1, "{r:#?}");
        assert_eq!(
            (r.blamed[0].host.as_str(), r.blamed[0].direction.as_str()),
            ("rank1", "receiving")
        );
    }
}
