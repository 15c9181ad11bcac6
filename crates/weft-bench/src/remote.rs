//! The bench's own helpers on every host, through [`weft_hosts::remote::Remote`]: DF probes,
//! loss trains and the p2p matrix.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::time::{Duration, Instant};

use weft_hosts::facts::{self, HostFacts};
use weft_hosts::remote::{Remote, gather_all};
use weft_hosts::runner::{HostRunner, spawn_tethered, wait_until};
use weft_hosts::{IfChoice, roles_for};

use crate::BenchError;
use crate::p2p::{self, Pair, ProbeReport};
use crate::probe::ProbeResult;

/// From one host, DF probes of `payload` bytes to `targets`.
pub fn df_probe_one(
    h: &dyn HostRunner,
    r: &Remote,
    targets: &[Ipv4Addr],
    payload: usize,
    per_probe: Duration,
) -> Result<Vec<ProbeResult>, BenchError> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let to = comma_list(targets);
    let args = vec![
        "df-probe".into(),
        "--payload".into(),
        payload.to_string(),
        "--to".into(),
        to,
        "--timeout-ms".into(),
        per_probe.as_millis().to_string(),
    ];
    // 3 probes per target, each bounded, plus start-up.
    let bound = per_probe * 3 * targets.len() as u32 + r.timeout;
    Ok(r.json(h, &args, bound)?)
}

/// From one host, a train of `count` echoes to each of `targets` at once, one every
/// `interval` ([`crate::loss::probe`]).
pub fn loss_probe_one(
    h: &dyn HostRunner,
    r: &Remote,
    targets: &[Ipv4Addr],
    count: u32,
    interval: Duration,
) -> Result<Vec<crate::loss::TrainResult>, BenchError> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let to = comma_list(targets);
    let args = vec![
        "loss-probe".into(),
        "--to".into(),
        to,
        "--count".into(),
        count.to_string(),
        "--interval-us".into(),
        interval.as_micros().to_string(),
    ];
    // The train, its linger (1 s), plus start-up.
    let bound = interval * count + Duration::from_secs(1) + r.timeout;
    Ok(r.json(h, &args, bound)?)
}

/// Options of a p2p run.
#[derive(Debug, Clone)]
pub struct P2pOptions {
    pub streams: usize,
    pub duration: Duration,
    pub pings: usize,
}

/// One host of a p2p run: its name and, per rail, its data interface and address.
#[derive(Debug, Clone)]
pub struct P2pHost {
    pub name: String,
    pub rails: Vec<(String, Ipv4Addr)>,
}

/// One data interface as the p2p run sees it.
#[derive(Debug, Clone)]
pub struct RailIf {
    pub name: String,
    /// Its IPv4 address; an interface without one carries no rail.
    pub addr: Option<Ipv4Addr>,
    /// Its link speed in Mbit/s when the NIC is physical (a virtual one reports a speed it
    /// does not keep).
    pub link_mbps: Option<u32>,
}

impl P2pHost {
    /// Host `name`'s rails (each data interface with an IPv4 address, in order), and into
    /// `expected` what each rail should reach: `expect_speed_mbps`, else its physical link
    /// speed. `weft bench p2p` and the doctor's throughput check both decide so.
    pub fn from_data(
        name: &str,
        data: &[RailIf],
        expect_speed_mbps: Option<u32>,
        expected: &mut p2p::RailTargets,
    ) -> P2pHost {
        let addressed: Vec<&RailIf> = data.iter().filter(|d| d.addr.is_some()).collect();
        for (rail, d) in addressed.iter().enumerate() {
            if let Some(mbps) = expect_speed_mbps.or(d.link_mbps) {
                expected.insert((name.to_string(), rail), f64::from(mbps) / 1e3);
            }
        }
        P2pHost {
            name: name.to_string(),
            rails: addressed
                .iter()
                .filter_map(|d| d.addr.map(|a| (d.name.clone(), a)))
                .collect(),
        }
    }
}

/// The hosts of `weft bench p2p`: their facts gathered, interface roles chosen for all of
/// them together ([`roles_for`], as the doctor and `weft run` choose), each host's rails
/// ([`P2pHost::from_data`]) and what each rail should reach. A host with no addressed data
/// interface is [`BenchError::NoRails`].
pub fn p2p_hosts(
    hosts: &[Box<dyn HostRunner>],
    r: &Remote,
    choice: &IfChoice,
    expect_speed_mbps: Option<u32>,
) -> Result<(Vec<P2pHost>, p2p::RailTargets), BenchError> {
    let gathered = gather_all(hosts, r)
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let all: Vec<&HostFacts> = gathered.iter().map(|g| &g.facts).collect();
    let mut expected = p2p::RailTargets::new();
    let mut info = Vec::new();
    for (h, role) in hosts.iter().zip(roles_for(&all, choice)) {
        let data: Vec<RailIf> = role
            .data
            .iter()
            .map(|d| RailIf {
                name: d.name.clone(),
                addr: facts::ipv4(d).map(|(a, _)| a),
                link_mbps: d.pci.as_ref().and(d.speed_mbps),
            })
            .collect();
        let host = P2pHost::from_data(h.name(), &data, expect_speed_mbps, &mut expected);
        if host.rails.is_empty() {
            return Err(BenchError::NoRails {
                host: h.name().to_string(),
            });
        }
        info.push(host);
    }
    Ok((info, expected))
}

/// Starts a server on every host, then measures every ordered pair on every rail, one pair at
/// a time; stops the servers. Pairs that fail carry their error.
pub fn p2p_matrix(
    hosts: &[&dyn HostRunner],
    info: &[P2pHost],
    r: &Remote,
    o: &P2pOptions,
    progress: &mut dyn FnMut(&Pair),
) -> Result<Vec<Pair>, BenchError> {
    // Servers listen on their host's data addresses only, end when their stdin closes (this
    // command ends, is interrupted, or its SSH session closes) and, as a last resort, outlive
    // the whole run by a margin only.
    let n = hosts.len();
    let rails = info.iter().map(|h| h.rails.len()).max().unwrap_or(0);
    let per_pair = o.duration + r.timeout;
    let lifetime = per_pair * (n * n * rails.max(1)) as u32 + r.timeout * 2;
    let mut servers: Vec<std::process::Child> = Vec::new();
    let mut ports: Vec<Vec<u16>> = Vec::new();
    let stop = |servers: &mut Vec<std::process::Child>| {
        // Close every stdin first (a clean exit, also on the far side of SSH), then bound
        // the wait and kill what is left.
        for c in servers.iter_mut() {
            drop(c.stdin.take());
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for c in servers.iter_mut() {
            // Past the deadline `wait_until` kills the server's process group.
            let _ = wait_until(c, deadline);
        }
    };
    for (h, hi) in hosts.iter().zip(info) {
        let bind = hi
            .rails
            .iter()
            .map(|(_, a)| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let devs = hi
            .rails
            .iter()
            .map(|(d, _)| d.clone())
            .collect::<Vec<_>>()
            .join(",");
        let argv = r.argv(&[
            "p2p-serve".into(),
            "--bind".into(),
            bind,
            "--dev".into(),
            devs,
            "--lifetime".into(),
            lifetime.as_secs().max(1).to_string(),
        ]);
        let mut c = match spawn_tethered(*h, &argv, Stdio::piped()) {
            Ok(c) => c,
            Err(e) => {
                stop(&mut servers);
                return Err(e.into());
            }
        };
        let out = c.stdout.take();
        servers.push(c);
        let port = match out {
            Some(o) => p2p::read_ready(o, r.timeout),
            None => Err(p2p::ReadyError::NoStdout),
        };
        match port {
            Ok(p) if p.len() == hi.rails.len() => ports.push(p),
            Ok(p) => {
                stop(&mut servers);
                return Err(BenchError::Host {
                    host: h.name().to_string(),
                    msg: format!(
                        "p2p server listens on {} ports for {} addresses",
                        p.len(),
                        hi.rails.len()
                    ),
                });
            }
            Err(msg) => {
                stop(&mut servers);
                return Err(BenchError::Host {
                    host: h.name().to_string(),
                    msg: format!("p2p server: {msg}"),
                });
            }
        }
    }
    let mut pairs = Vec::new();
    for rail in 0..rails {
        for (i, src) in hosts.iter().enumerate() {
            for (j, _) in hosts.iter().enumerate() {
                if i == j {
                    continue;
                }
                let (Some((src_if, _)), Some((_, dst_addr)), Some(port)) = (
                    info[i].rails.get(rail),
                    info[j].rails.get(rail),
                    ports[j].get(rail),
                ) else {
                    continue;
                };
                let to = SocketAddr::from((*dst_addr, *port));
                let args = vec![
                    "p2p-probe".into(),
                    "--to".into(),
                    to.to_string(),
                    "--streams".into(),
                    o.streams.to_string(),
                    "--duration-ms".into(),
                    o.duration.as_millis().to_string(),
                    "--pings".into(),
                    o.pings.to_string(),
                    "--timeout".into(),
                    r.timeout.as_secs().max(1).to_string(),
                    "--dev".into(),
                    src_if.clone(),
                ];
                let t = Instant::now();
                let res: Result<ProbeReport, BenchError> = r
                    .json(*src, &args, per_pair + r.timeout)
                    .map_err(BenchError::from);
                tracing::debug!(src = %info[i].name, dst = %info[j].name, took = ?t.elapsed(), "p2p pair");
                let mut p = Pair {
                    src: info[i].name.clone(),
                    dst: info[j].name.clone(),
                    src_if: src_if.clone(),
                    dst_addr: *dst_addr,
                    rail,
                    gbps: 0.0,
                    rtt_us: 0.0,
                    mss: 0,
                    error: None,
                };
                match res {
                    Ok(rep) => {
                        p.gbps = rep.gbps;
                        p.rtt_us = rep.rtt_us;
                        p.mss = rep.mss;
                    }
                    Err(e) => p.error = Some(e.to_string()),
                }
                progress(&p);
                pairs.push(p);
            }
        }
    }
    stop(&mut servers);
    Ok(pairs)
}

/// `a,b,c`: the addresses as the probe commands' `--to` takes them.
fn comma_list(targets: &[Ipv4Addr]) -> String {
    targets
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rails_are_the_addressed_data_interfaces_and_expectations_follow_them() {
        let d = |name: &str, addr: Option<[u8; 4]>, link: Option<u32>| RailIf {
            name: name.into(),
            addr: addr.map(Ipv4Addr::from),
            link_mbps: link,
        };
        let data = [
            d("ib0", None, Some(200_000)),
            d("enp1", Some([10, 1, 0, 2]), Some(100_000)),
            d("veth0", Some([10, 2, 0, 2]), None),
        ];
        let mut e = p2p::RailTargets::new();
        let h = P2pHost::from_data("n1", &data, None, &mut e);
        assert_eq!(
            h.rails,
            [
                ("enp1".to_string(), Ipv4Addr::new(10, 1, 0, 2)),
                ("veth0".to_string(), Ipv4Addr::new(10, 2, 0, 2))
            ]
        );
        // Rail 0 is enp1 (the unaddressed ib0 is no rail); the virtual veth0 expects nothing.
        assert_eq!(
            e.into_iter().collect::<Vec<_>>(),
            [(("n1".into(), 0), 100.0)]
        );
        let mut e = p2p::RailTargets::new();
        P2pHost::from_data("n1", &data, Some(25_000), &mut e);
        assert_eq!(e.len(), 2);
        assert!(e.values().all(|&g| g == 25.0));
    }
}
