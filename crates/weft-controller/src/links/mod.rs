//! Link health: the one place that judges a cluster's links, for the API, the console and
//! the metrics alike.
//!
//! Two kinds of evidence are judged:
//! - what the agents report on every report: each RDMA data NIC's negotiated speed. A NIC
//!   is flagged when it runs below the speed most of its peers (the RDMA NICs of its link
//!   layer) run at, or below the operator's expectation (`[controller] expected_link_gbps`,
//!   one figure for every RDMA data link of the cluster) ([`slow_nics`]);
//! - what `weft bench p2p`, `weft bench collectives` (the links it times through the
//!   plugin before its collectives, one per ordered pair of hosts) and `weft doctor`
//!   measured and sent with `--report-to` ([`LinkRunIn`], stored as runs): a measured link
//!   is flagged when
//!   it failed, or ran below [`PEER_THRESHOLD`] x the median of the links measured with it
//!   in the same run ([`slow_pairs`]). A measured TCP or plugin throughput is not compared
//!   with a NIC's line rate: protocol and host costs make that comparison say little.
//!
//! The routes are in [`api`]; the metric `weft_link_below_expected` is set from
//! [`health`] at every scrape.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::ServerView;

pub mod api;

/// A measured link is slow below this fraction of the median of its run: a link at half
/// its peers' speed (a port negotiated at half rate) is flagged, the run-to-run noise of a
/// TCP or plugin measurement (tens of percent on a loaded host) is not.
pub const PEER_THRESHOLD: f64 = 0.7;
/// The most results one run may carry (64 nodes, every ordered pair, on one rail: 4032).
pub const MAX_RESULTS: usize = 4096;
/// The most runs the store keeps; older ones are forgotten as new ones arrive.
pub const MAX_RUNS: i64 = 500;
/// The most runs one listing answers with.
pub const MAX_LIST: usize = 200;
/// The longest error text one result may carry.
pub const MAX_ERROR: usize = 400;
/// The fastest link the API believes, Gb/s (a figure above it is a unit mistake).
pub const MAX_GBPS: f64 = 10_000.0;

/// What measured the links of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LinkSource {
    /// `weft bench p2p`: TCP streams between every ordered pair of hosts.
    P2p,
    /// `weft bench collectives`: each link between two ranks timed through the plugin.
    Collectives,
    /// `weft doctor`: its throughput check.
    Doctor,
}

impl LinkSource {
    /// `p2p`, `collectives`, `doctor`.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkSource::P2p => "p2p",
            LinkSource::Collectives => "collectives",
            LinkSource::Doctor => "doctor",
        }
    }

    /// The name read back from a store.
    pub fn parse(s: &str) -> Option<LinkSource> {
        [LinkSource::P2p, LinkSource::Collectives, LinkSource::Doctor]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// One measured link: from a node, over one of its NICs, to another node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkResult {
    /// The sending node (as the command named it: its `--hosts` entry).
    pub src: String,
    /// The receiving node.
    pub dst: String,
    /// The sender's interface (`enp1s0f0np0`), or `plugin` where the command does not
    /// know it (collectives).
    pub nic: String,
    /// Measured throughput, Gb/s (10^9 bit/s); 0 when it failed.
    pub gbps: f64,
    /// Median round trip in microseconds, where measured.
    #[serde(default)]
    #[schema(required = false)]
    pub rtt_us: Option<f64>,
    /// Why the measurement failed, if it did.
    #[serde(default)]
    #[schema(required = false)]
    pub error: Option<String>,
}

impl LinkResult {
    /// A pair measured from `src` over its `nic` to `dst` (`weft bench p2p`, `weft doctor`'s
    /// throughput check): the round trip is kept only where the pair did not fail and it is a
    /// number, and an error is cut to what the API takes ([`MAX_ERROR`] characters).
    pub fn measured(
        src: &str,
        dst: &str,
        nic: &str,
        gbps: f64,
        rtt_us: f64,
        error: Option<&str>,
    ) -> LinkResult {
        LinkResult {
            src: src.to_string(),
            dst: dst.to_string(),
            nic: nic.to_string(),
            gbps,
            rtt_us: (error.is_none() && rtt_us.is_finite()).then_some(rtt_us),
            error: error.map(|e| e.chars().take(MAX_ERROR).collect()),
        }
    }

    /// A link timed by sending `bytes` from `src` to `dst` through the NCCL plugin (`weft
    /// bench collectives`, before its collectives): interface `plugin` (the plugin picks it
    /// among the data interfaces), no round trip; a time that is not a positive number, or a
    /// speed that is not finite, makes it a failed link at 0 Gb/s saying so.
    pub fn timed(src: &str, dst: &str, bytes: u64, seconds: f64, gbps: f64) -> LinkResult {
        let ok = seconds.is_finite() && seconds > 0.0 && gbps.is_finite();
        LinkResult {
            src: src.to_string(),
            dst: dst.to_string(),
            nic: "plugin".into(),
            gbps: if ok { gbps } else { 0.0 },
            rtt_us: None,
            error: (!ok).then(|| format!("no time measured for {bytes} B through the plugin")),
        }
    }
}

/// One run of measurements, as a command sends it (`POST /v1/link-results`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkRunIn {
    /// What measured them.
    pub source: LinkSource,
    /// The links, 1 to [`MAX_RESULTS`].
    pub results: Vec<LinkResult>,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LinkRunView {
    /// Its number (increasing).
    pub id: i64,
    /// When it was stored, seconds since the epoch.
    pub at: u64,
    /// What measured it.
    pub source: LinkSource,
    /// Who sent it (`admin:<id>`).
    pub actor: String,
    /// Its links.
    pub results: Vec<LinkResult>,
}

/// A measured link that failed or ran below its run's peers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SlowPair {
    /// The run.
    pub run: i64,
    /// What measured it.
    pub source: LinkSource,
    /// Sender.
    pub src: String,
    /// Receiver.
    pub dst: String,
    /// The sender's interface.
    pub nic: String,
    /// What it did, Gb/s.
    pub gbps: f64,
    /// The median of the run's links, Gb/s.
    pub peers_gbps: f64,
    /// Why it failed, if it did.
    #[schema(required = true)]
    pub error: Option<String>,
}

/// An RDMA data NIC an agent reported below its peers' or the expected speed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SlowNic {
    /// The node.
    pub node: String,
    /// The NIC (`enp1s0f0np0`).
    pub nic: String,
    /// Its negotiated speed, Mb/s.
    pub speed_mbps: u32,
    /// The speed most of its peers run at, Mb/s, when it is below it.
    #[schema(required = true)]
    pub peers_mbps: Option<u32>,
    /// The expected speed, Mb/s, when it is below it.
    #[schema(required = true)]
    pub expected_mbps: Option<u32>,
    /// How many links of its kind were compared.
    pub compared: usize,
}

/// Every link flagged now (`GET /v1/link-health`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LinkHealthView {
    /// `[controller] expected_link_gbps`, if set.
    #[schema(required = true)]
    pub expected_gbps: Option<f64>,
    /// RDMA NICs the agents report below their peers' or the expected speed.
    pub nics: Vec<SlowNic>,
    /// How many RDMA NICs were compared with peers.
    pub nics_compared: usize,
    /// Measured links of the newest run of each source that failed or ran below their
    /// run's peers.
    pub pairs: Vec<SlowPair>,
}

/// Why a run of link measurements is refused: the result and its field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LinkRunError {
    /// A run with no results.
    #[error("results: empty; a run carries at least one link")]
    Empty,
    /// More results than one run may carry.
    #[error("results: {count} links; at most {max} in one run", max = MAX_RESULTS)]
    TooMany {
        /// How many the run carried.
        count: usize,
    },
    /// One field of one result.
    #[error("results[{index}].{field}: {problem}")]
    Field {
        /// The result's index in the run.
        index: usize,
        /// The field's name in the request body (`src`, `gbps`, ...).
        field: &'static str,
        /// What is wrong with it.
        problem: LinkFieldError,
    },
}

/// What is wrong with one field of a measured link.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LinkFieldError {
    /// An empty name.
    #[error("empty")]
    Empty,
    /// A name longer than allowed (`shown` as [`crate::input::shown`] writes it).
    #[error("{shown} is longer than {max} characters")]
    TooLong {
        /// The value, shortened and escaped.
        shown: String,
        /// The most characters allowed.
        max: usize,
    },
    /// A name with a character outside the allowed set.
    #[error("{shown} holds a character other than letters, digits, `_`, `.`, `-`, `:`")]
    BadChar {
        /// The value, shortened and escaped.
        shown: String,
    },
    /// A link whose sender is its receiver.
    #[error("{0} is the sender too; a link joins two nodes")]
    ToItself(String),
    /// A throughput that is not a number in range.
    #[error("{0} is not a throughput in [0, {max}] Gb/s", max = MAX_GBPS)]
    Gbps(f64),
    /// A round-trip time that is not a number in range.
    #[error("{0} is not a time in [0, 1e9] us")]
    RttUs(f64),
    /// An error text longer than allowed (its length in characters).
    #[error("{0} characters; at most {max}", max = MAX_ERROR)]
    ErrorTooLong(usize),
}

/// Why a run is refused: names the result and what is wrong with it.
pub fn check_run(run: &LinkRunIn) -> Result<(), LinkRunError> {
    if run.results.is_empty() {
        return Err(LinkRunError::Empty);
    }
    if run.results.len() > MAX_RESULTS {
        return Err(LinkRunError::TooMany {
            count: run.results.len(),
        });
    }
    for (index, r) in run.results.iter().enumerate() {
        let at = |field: &'static str, problem: LinkFieldError| LinkRunError::Field {
            index,
            field,
            problem,
        };
        node_name(&r.src).map_err(|e| at("src", e))?;
        node_name(&r.dst).map_err(|e| at("dst", e))?;
        nic_name(&r.nic).map_err(|e| at("nic", e))?;
        if r.src == r.dst {
            return Err(at("dst", LinkFieldError::ToItself(r.dst.clone())));
        }
        if !(r.gbps.is_finite() && (0.0..=MAX_GBPS).contains(&r.gbps)) {
            return Err(at("gbps", LinkFieldError::Gbps(r.gbps)));
        }
        if let Some(t) = r.rtt_us
            && !(t.is_finite() && (0.0..=1e9).contains(&t))
        {
            return Err(at("rtt_us", LinkFieldError::RttUs(t)));
        }
        if let Some(e) = &r.error
            && e.chars().count() > MAX_ERROR
        {
            return Err(at("error", LinkFieldError::ErrorTooLong(e.chars().count())));
        }
    }
    Ok(())
}

/// A node as the commands name it: 1 to 64 of letters, digits, `_ . - :`.
fn node_name(s: &str) -> Result<(), LinkFieldError> {
    word(s, 64)
}

/// An interface name (or `plugin`): 1 to 32 of letters, digits, `_ . - :`.
fn nic_name(s: &str) -> Result<(), LinkFieldError> {
    word(s, 32)
}

fn word(s: &str, max: usize) -> Result<(), LinkFieldError> {
    if s.is_empty() {
        return Err(LinkFieldError::Empty);
    }
    if s.len() > max {
        return Err(LinkFieldError::TooLong {
            shown: crate::input::shown(s),
            max,
        });
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_.-:".contains(c))
    {
        return Err(LinkFieldError::BadChar {
            shown: crate::input::shown(s),
        });
    }
    Ok(())
}

/// The median of `v` (the mean of the middle two for an even count); `None` when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The median of a run's links that did not fail.
pub fn run_median(run: &LinkRunView) -> Option<f64> {
    let mut v: Vec<f64> = run
        .results
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.gbps)
        .collect();
    median(&mut v)
}

/// The links of `run` that failed or ran below [`PEER_THRESHOLD`] x its median.
pub fn slow_pairs(run: &LinkRunView) -> Vec<SlowPair> {
    let peers = run_median(run).unwrap_or(0.0);
    run.results
        .iter()
        .filter(|r| r.error.is_some() || r.gbps < PEER_THRESHOLD * peers)
        .map(|r| SlowPair {
            run: run.id,
            source: run.source,
            src: r.src.clone(),
            dst: r.dst.clone(),
            nic: r.nic.clone(),
            gbps: r.gbps,
            peers_gbps: peers,
            error: r.error.clone(),
        })
        .collect()
}

/// The RDMA data links (NICs of an RDMA port: RoCE netdevs and IPoIB) that negotiated below
/// their peers or below `expected_mbps`: per link layer, the speed most such links run at
/// (the higher one on a tie) is the peers' speed. The most common field failure on small
/// RoCE and InfiniBand clusters: a cable or switch port that came up at half rate. Links of
/// unknown speed are not judged; a kind with a single link is judged only against the
/// expectation. Answers the flagged links and how many were compared with peers.
pub fn slow_nics(servers: &[ServerView], expected_mbps: Option<u32>) -> (Vec<SlowNic>, usize) {
    use std::collections::BTreeMap;
    let mut by_layer: BTreeMap<&str, Vec<(&str, &str, u32)>> = BTreeMap::new();
    for s in servers {
        for n in &s.nics {
            if let (Some(_), Some(speed)) = (&n.rdma_device, n.speed_mbps) {
                by_layer.entry(n.link_layer.as_str()).or_default().push((
                    s.name.as_str(),
                    n.name.as_str(),
                    speed,
                ));
            }
        }
    }
    let mut out = Vec::new();
    let mut compared = 0;
    for links in by_layer.values() {
        let peers = if links.len() < 2 {
            None
        } else {
            compared += links.len();
            let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
            for (_, _, speed) in links {
                *counts.entry(*speed).or_default() += 1;
            }
            counts
                .iter()
                .max_by_key(|(speed, n)| (**n, **speed))
                .map(|(s, _)| *s)
        };
        for (node, nic, speed) in links {
            let below_peers = peers.filter(|p| speed < p);
            let below_expected = expected_mbps.filter(|e| speed < e);
            if below_peers.is_some() || below_expected.is_some() {
                out.push(SlowNic {
                    node: node.to_string(),
                    nic: nic.to_string(),
                    speed_mbps: *speed,
                    peers_mbps: below_peers,
                    expected_mbps: below_expected,
                    compared: links.len(),
                });
            }
        }
    }
    (out, compared)
}

/// Gb/s as Mb/s (`None` for a figure that is not a positive speed).
pub fn gbps_to_mbps(gbps: f64) -> Option<u32> {
    (gbps.is_finite() && gbps > 0.0 && gbps <= MAX_GBPS).then(|| (gbps * 1000.0).round() as u32)
}

/// Every link flagged now: the agents' NICs ([`slow_nics`]) and the newest run of each
/// source ([`slow_pairs`]); `runs` newest first.
pub fn health(
    servers: &[ServerView],
    runs: &[LinkRunView],
    expected_gbps: Option<f64>,
) -> LinkHealthView {
    let (nics, nics_compared) = slow_nics(servers, expected_gbps.and_then(gbps_to_mbps));
    let mut seen = Vec::new();
    let mut pairs = Vec::new();
    for r in runs {
        if !seen.contains(&r.source) {
            seen.push(r.source);
            pairs.extend(slow_pairs(r));
        }
    }
    LinkHealthView {
        expected_gbps,
        nics,
        nics_compared,
        pairs,
    }
}

/// `run` with only the links among `nodes` (both ends), or `None` when none is left: what
/// a tenant may see of it.
pub fn among(run: &LinkRunView, nodes: &[String]) -> Option<LinkRunView> {
    let results: Vec<LinkResult> = run
        .results
        .iter()
        .filter(|r| nodes.contains(&r.src) && nodes.contains(&r.dst))
        .cloned()
        .collect();
    (!results.is_empty()).then(|| LinkRunView {
        results,
        ..run.clone()
    })
}

/// One run in a node's trend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrendPoint {
    /// The run.
    pub run: i64,
    /// When it was stored.
    pub at: u64,
    /// The median of what the node sent in it, Gb/s.
    pub median: f64,
    /// The slowest link the node sent on in it, Gb/s (0 for a failed one).
    pub slowest: f64,
}

/// A node's trend: every run (oldest first) that measured links from it, with the median
/// and the slowest of what it sent.
pub fn trend(node: &str, runs: &[LinkRunView]) -> Vec<TrendPoint> {
    let mut out: Vec<TrendPoint> = runs
        .iter()
        .filter_map(|r| {
            let mine: Vec<&LinkResult> = r.results.iter().filter(|x| x.src == node).collect();
            let slowest = mine
                .iter()
                .map(|x| if x.error.is_some() { 0.0 } else { x.gbps })
                .fold(f64::INFINITY, f64::min);
            let mut ok: Vec<f64> = mine
                .iter()
                .filter(|x| x.error.is_none())
                .map(|x| x.gbps)
                .collect();
            (!mine.is_empty()).then(|| TrendPoint {
                run: r.id,
                at: r.at,
                median: median(&mut ok).unwrap_or(0.0),
                slowest,
            })
        })
        .collect();
    out.sort_by_key(|p| p.run);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Liveness, NicView};

    fn server(name: &str, nics: &[(&str, &str, u32)]) -> ServerView {
        ServerView {
            name: name.into(),
            last_seen: None,
            liveness: Liveness::Ok,
            group: None,
            ports: vec![],
            pending_claims: vec![],
            roce: vec![],
            nics: nics
                .iter()
                .map(|(n, layer, speed)| NicView {
                    name: n.to_string(),
                    link_layer: layer.to_string(),
                    speed_mbps: Some(*speed),
                    mtu: 9000,
                    operstate: "up".into(),
                    pci: Some("0000:01:00.0".into()),
                    rdma_device: Some("mlx5_0".into()),
                    addresses: vec![],
                })
                .collect(),
            gpus: vec![],
        }
    }

    fn result(src: &str, dst: &str, gbps: f64) -> LinkResult {
        LinkResult {
            src: src.into(),
            dst: dst.into(),
            nic: "eth0".into(),
            gbps,
            rtt_us: None,
            error: None,
        }
    }

    #[test]
    fn a_link_timed_through_the_plugin_is_failed_when_its_time_is_not_a_positive_number() {
        let ok = LinkResult::timed("a", "b", 4 << 20, 0.004, 8.4);
        assert_eq!(
            (ok.nic.as_str(), ok.gbps, ok.rtt_us, ok.error),
            ("plugin", 8.4, None, None)
        );
        for (seconds, gbps) in [
            (0.0, 8.4),
            (f64::NAN, 8.4),
            (-1.0, 1.0),
            (0.5, f64::INFINITY),
        ] {
            let bad = LinkResult::timed("a", "b", 4096, seconds, gbps);
            assert_eq!(bad.gbps, 0.0, "{seconds} {gbps}");
            assert_eq!(
                bad.error.as_deref(),
                Some("no time measured for 4096 B through the plugin")
            );
        }
    }

    #[test]
    fn a_measured_pair_keeps_its_round_trip_only_when_it_did_not_fail_and_cuts_its_error() {
        let ok = LinkResult::measured("n1", "n2", "eth0", 98.5, 12.0, None);
        assert_eq!(
            ok,
            LinkResult {
                src: "n1".into(),
                dst: "n2".into(),
                nic: "eth0".into(),
                gbps: 98.5,
                rtt_us: Some(12.0),
                error: None,
            }
        );
        assert_eq!(
            LinkResult::measured("n1", "n2", "eth0", 98.5, f64::NAN, None).rtt_us,
            None
        );
        let long = "x".repeat(MAX_ERROR + 50);
        let failed = LinkResult::measured("n1", "n2", "eth0", 0.0, 12.0, Some(&long));
        assert_eq!(failed.rtt_us, None);
        assert_eq!(
            failed.error.as_deref().map(|e| e.chars().count()),
            Some(MAX_ERROR)
        );
        check_run(&LinkRunIn {
            source: LinkSource::P2p,
            results: vec![ok, failed],
        })
        .unwrap();
    }

    #[test]
    fn a_nic_at_half_its_peers_speed_is_named_and_one_below_the_expectation_too() {
        let servers = vec![
            server("a", &[("e0", "Ethernet", 200_000)]),
            server("b", &[("e0", "Ethernet", 200_000)]),
            server("c", &[("e0", "Ethernet", 100_000)]),
        ];
        let (slow, compared) = slow_nics(&servers, None);
        assert_eq!(compared, 3);
        assert_eq!(slow.len(), 1);
        assert_eq!((slow[0].node.as_str(), slow[0].nic.as_str()), ("c", "e0"));
        assert_eq!(slow[0].peers_mbps, Some(200_000));
        assert_eq!(slow[0].expected_mbps, None);
        // A management port (no RDMA device) is not judged.
        let mut with_mgmt = servers.clone();
        let mut mgmt = with_mgmt[0].nics[0].clone();
        (mgmt.name, mgmt.speed_mbps, mgmt.rdma_device) = ("enP7s7".into(), Some(1000), None);
        with_mgmt[0].nics.push(mgmt);
        assert_eq!(slow_nics(&with_mgmt, None), (slow.clone(), 3));
        // Expecting 400G: every link is below it; c is also below its peers.
        let (slow, _) = slow_nics(&servers, Some(400_000));
        assert_eq!(slow.len(), 3);
        assert!(slow.iter().all(|s| s.expected_mbps == Some(400_000)));
        // A single link of its kind is judged against the expectation only.
        let lone = vec![server("a", &[("ib0", "InfiniBand", 100_000)])];
        assert!(slow_nics(&lone, None).0.is_empty());
        assert_eq!(slow_nics(&lone, Some(200_000)).0.len(), 1);
    }

    #[test]
    fn a_measured_link_at_half_its_peers_is_flagged_and_a_failed_one_too() {
        let mut results = vec![
            result("a", "b", 10.0),
            result("b", "a", 10.2),
            result("a", "c", 9.8),
            result("c", "a", 4.9),
        ];
        results.push(LinkResult {
            error: Some("refused".into()),
            gbps: 0.0,
            ..result("b", "c", 0.0)
        });
        let run = LinkRunView {
            id: 7,
            at: 1,
            source: LinkSource::P2p,
            actor: "admin:x".into(),
            results,
        };
        let slow = slow_pairs(&run);
        assert_eq!(slow.len(), 2, "{slow:?}");
        assert_eq!((slow[0].src.as_str(), slow[0].dst.as_str()), ("c", "a"));
        assert!((slow[0].peers_gbps - 9.9).abs() < 1e-9);
        assert!(slow[1].error.is_some());
        // A tenant that has a and b sees only their links.
        let mine = among(&run, &["a".into(), "b".into()]).unwrap();
        assert_eq!(mine.results.len(), 2);
        assert!(among(&run, &["z".into()]).is_none());
    }

    #[test]
    fn bad_runs_are_refused_naming_the_result_and_the_field() {
        let ok = LinkRunIn {
            source: LinkSource::P2p,
            results: vec![result("a", "b", 1.0)],
        };
        assert!(check_run(&ok).is_ok());
        let bad = |r: LinkResult| {
            check_run(&LinkRunIn {
                source: LinkSource::P2p,
                results: vec![result("a", "b", 1.0), r],
            })
            .unwrap_err()
            .to_string()
        };
        assert!(bad(result("a", "b", f64::NAN)).starts_with("results[1].gbps"));
        assert!(bad(result("a", "b", 1e6)).starts_with("results[1].gbps"));
        assert!(bad(result("a", "a", 1.0)).starts_with("results[1].dst"));
        assert!(bad(result("a b", "c", 1.0)).starts_with("results[1].src"));
        let e = check_run(&LinkRunIn {
            source: LinkSource::P2p,
            results: vec![],
        })
        .unwrap_err();
        assert_eq!(e, LinkRunError::Empty);
        assert!(e.to_string().contains("empty"), "{e}");
        let json = r#"{"source":"p2p","results":[],"extra":1}"#;
        assert!(serde_json::from_str::<LinkRunIn>(json).is_err());
    }

    #[test]
    fn a_trend_is_the_median_and_the_slowest_a_node_sent_per_run_oldest_first() {
        let run = |id: i64, g: f64| LinkRunView {
            id,
            at: id as u64 * 10,
            source: LinkSource::P2p,
            actor: String::new(),
            results: vec![result("a", "b", g), result("a", "c", g + 2.0)],
        };
        let t = trend("a", &[run(2, 5.0), run(1, 9.0)]);
        let p = |run, at, median, slowest| TrendPoint {
            run,
            at,
            median,
            slowest,
        };
        assert_eq!(t, vec![p(1, 10, 10.0, 9.0), p(2, 20, 6.0, 5.0)]);
        assert!(trend("z", &[run(1, 1.0)]).is_empty());
    }
}
