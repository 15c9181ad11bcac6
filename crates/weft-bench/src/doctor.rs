//! `weft doctor`: per-host facts compared against expectations and against each other, into
//! PASS / WARN / FAIL / INFO findings (every FAIL with its remedy), and the settings a job on
//! this cluster should use.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weft_agent::{LinkLayer, OperState, PortState};

use crate::BenchError;
use weft_hosts::facts;
use weft_hosts::remote::{Gathered, Remote, gather_all};
use weft_hosts::ssh_pairs::{self, Outcome};
use weft_hosts::{HostRunner, IfChoice, MgmtSource, each_host, roles_for};

use crate::p2p;
use crate::probe::{Probe, ProbeResult};
use crate::remote;

/// Severity of a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Level {
    Pass,
    Info,
    Warn,
    Fail,
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Level::Pass => "PASS",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        })
    }
}

/// One finding about one host (or the cluster: `host` = `*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finding {
    pub level: Level,
    pub host: String,
    /// `link`, `speed`, `mtu`, `jumbo`, `throughput`, `roles`, `address`, `rdma`, `gpu`, `clock`,
    /// `env`, `reach`, `ssh` (host to host; the subject is the peer).
    pub check: String,
    /// The interface or device concerned, if any.
    pub subject: Option<String>,
    pub message: String,
    /// What to do (FAIL and WARN).
    pub remedy: Option<String>,
}

/// What the doctor is told to expect.
#[derive(Debug, Clone, Default)]
pub struct DoctorOptions {
    pub expect_mtu: Option<u32>,
    pub expect_speed_mbps: Option<u32>,
    /// Data interfaces (NCCL syntax); default: RDMA netdevs, else every up interface but mgmt.
    pub data_if: Option<String>,
    /// Management interface (NCCL syntax); default: the default-route interface.
    pub mgmt_if: Option<String>,
    /// Warn above this clock offset; fail above 10x.
    pub max_skew: Duration,
    /// Bound on each DF probe.
    pub probe_timeout: Duration,
    /// Bulk transfer per ordered pair of the throughput check (`bench p2p`'s probe and
    /// analysis, short); `None` skips the check.
    pub throughput: Option<Duration>,
    /// Connect timeout of the host-to-host SSH check (every ordered pair of hosts reached
    /// over SSH); `None` skips the check.
    pub ssh_pairs: Option<Duration>,
    /// ICMP echoes from every host to every other host's management address, for packet
    /// loss on the management network ([`crate::loss`]); `None` skips the check.
    pub loss_echoes: Option<u32>,
}

pub use crate::checks::{CHECKS, CheckDoc, checks_help};

/// A pair below this fraction of the median is slow (as `bench p2p`'s default).
const THROUGHPUT_THRESHOLD: f64 = 0.5;

/// The doctor's report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DoctorReport {
    pub hosts: Vec<String>,
    /// Each reached host's interfaces by role, as `weft run` and `weft bench` use them on the
    /// same hosts and flags ([`weft_hosts::roles_for`]).
    pub roles: Vec<HostRoles>,
    pub findings: Vec<Finding>,
    /// Settings for jobs on this cluster, in order, ready to paste as `export K=V`.
    pub env: Vec<(String, String)>,
    pub failed: bool,
    /// Every ordered pair the throughput check measured (empty when it did not run).
    #[serde(default)]
    pub pairs: Vec<p2p::Pair>,
}

/// One host's interfaces by role, in a [`DoctorReport`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostRoles {
    pub host: String,
    /// The management interface, if one was found.
    pub mgmt: Option<String>,
    /// The data interfaces.
    pub data: Vec<String>,
}

struct Out(Vec<Finding>);
impl Out {
    fn add(
        &mut self,
        level: Level,
        host: &str,
        check: &str,
        subject: Option<&str>,
        message: String,
        remedy: Option<String>,
    ) {
        self.0.push(Finding {
            level,
            host: host.to_string(),
            check: check.to_string(),
            subject: subject.map(str::to_string),
            message,
            remedy,
        });
    }
}

fn majority<T: Ord + Clone>(v: impl IntoIterator<Item = T>) -> Option<T> {
    let mut c: BTreeMap<T, usize> = BTreeMap::new();
    for x in v {
        *c.entry(x).or_default() += 1;
    }
    let best = c.values().copied().max()?;
    // Ties go to the largest value (the healthy one is usually the larger MTU or speed).
    c.into_iter()
        .rev()
        .find(|(_, n)| *n == best)
        .map(|(k, _)| k)
}

/// A data interface, as the checks need it.
#[derive(Debug, Clone)]
struct DataIf {
    name: String,
    mtu: u32,
    speed_mbps: Option<u32>,
    state: OperState,
    addr: Option<(Ipv4Addr, u8)>,
    rdma: Option<String>,
    /// A physical NIC (a PCI device): its reported speed is what the link should do.
    physical: bool,
}

/// A reached host's interfaces by role, as the checks after the roles see them.
struct Host {
    /// Index into the host list.
    idx: usize,
    mgmt: Option<String>,
    mgmt_addr: Option<Ipv4Addr>,
    data: Vec<DataIf>,
}

/// Runs every check on every host: facts gathered once, then one function per check.
pub fn run(
    hosts: &[Box<dyn HostRunner>],
    r: &Remote,
    o: &DoctorOptions,
) -> Result<DoctorReport, BenchError> {
    let names: Vec<String> = hosts.iter().map(|h| h.name().to_string()).collect();
    let mut out = Out(Vec::new());
    let gathered = gather_all(hosts, r);
    let mut ok: Vec<(usize, Gathered)> = Vec::new();
    for (i, g) in gathered.into_iter().enumerate() {
        match g {
            Ok(g) => ok.push((i, g)),
            Err(e) => out.add(
                Level::Fail,
                &names[i],
                "reach",
                None,
                format!("cannot run weft there: {e}"),
                Some("check SSH (BatchMode, keys) and that `weft` is installed on the host (--remote-weft)".into()),
            ),
        }
    }
    let reached: Vec<usize> = ok.iter().map(|(i, _)| *i).collect();
    ssh_pair_check(hosts, r, o, &names, &reached, &mut out);
    let hs = role_checks(&ok, &names, o, &mut out)?;
    interface_checks(&hs, &names, o, &mut out);
    jumbo_check(hosts, r, o, &hs, &names, &mut out);
    // Throughput: `bench p2p` with a short transfer; a link shaped or negotiated down shows
    // here even when the interface reports its full speed.
    let mut pairs = Vec::new();
    match o.throughput {
        None => out.add(
            Level::Info,
            "*",
            "throughput",
            None,
            "throughput check skipped (--no-throughput)".into(),
            None,
        ),
        Some(d) => {
            pairs = throughput(
                hosts,
                r,
                d,
                &names,
                &hs.iter().map(|h| (h.idx, &h.data[..])).collect::<Vec<_>>(),
                o.expect_speed_mbps,
                &mut out,
            )
        }
    }
    // Packet loss on the management network.
    match o.loss_echoes {
        None => out.add(
            Level::Info,
            "*",
            "loss",
            None,
            "management loss check skipped (--no-loss)".into(),
            None,
        ),
        Some(count) => {
            let mgmts: Vec<(usize, String, Ipv4Addr)> = hs
                .iter()
                .filter_map(|h| Some((h.idx, h.mgmt.clone()?, h.mgmt_addr?)))
                .collect();
            mgmt_loss(hosts, r, count, &names, &mgmts, &mut out);
        }
    }
    let hcas = rdma_check(&ok, &hs, &names, &mut out);
    // GPUs: count and total memory per GPU, against the other hosts.
    let gpus: Vec<(usize, &[weft_agent::Gpu])> = ok
        .iter()
        .map(|(i, g)| (*i, &g.facts.report.gpus[..]))
        .collect();
    gpu_check(&gpus, &names, &mut out);
    clock_check(&ok, &names, o, &mut out);
    let env = settings(&hs, hcas);
    out.0
        .sort_by(|a, b| a.host.cmp(&b.host).then(b.level.cmp(&a.level)));
    let failed = out.0.iter().any(|f| f.level == Level::Fail);
    let roles = hs
        .iter()
        .map(|h| HostRoles {
            host: names[h.idx].clone(),
            mgmt: h.mgmt.clone(),
            data: h.data.iter().map(|d| d.name.clone()).collect(),
        })
        .collect();
    Ok(DoctorReport {
        roles,
        hosts: names,
        findings: out.0,
        env,
        failed,
        pairs,
    })
}

/// Every host's management and data interfaces, decided together (`weft_hosts::roles_for`), with
/// a finding for each; the hosts as the later checks see them.
fn role_checks(
    ok: &[(usize, Gathered)],
    names: &[String],
    o: &DoctorOptions,
    out: &mut Out,
) -> Result<Vec<Host>, BenchError> {
    // Roles of every host's interfaces, decided together: one selection (the plugin's
    // `IfSpec`) for doctor, p2p, collectives and `weft run`.
    let choice = IfChoice::parse(o.mgmt_if.as_deref(), o.data_if.as_deref())?;
    let all_facts: Vec<&facts::HostFacts> = ok.iter().map(|(_, g)| &g.facts).collect();
    let roles = roles_for(&all_facts, &choice);
    let mut hs: Vec<Host> = Vec::new();
    for ((i, g), role) in ok.iter().zip(roles) {
        let f = &g.facts;
        let name = &names[*i];
        let mgmt = role.mgmt.map(|(n, _)| n.name.clone());
        let data = role.data;
        match role.mgmt {
            Some((m, how)) => out.add(
                Level::Pass,
                name,
                "roles",
                Some(&m.name),
                format!(
                    "management interface {} ({})",
                    m.name,
                    match how {
                        MgmtSource::Flag => "--mgmt-if",
                        MgmtSource::DefaultRoute => "the default route",
                        MgmtSource::SshSession => "the SSH session's address",
                        MgmtSource::Peers =>
                            "no default route; on the other hosts' management subnet",
                    }
                ),
                None,
            ),
            None if o.mgmt_if.is_some() => out.add(
                Level::Fail,
                name,
                "roles",
                None,
                format!(
                    "no interface matches --mgmt-if {:?}",
                    o.mgmt_if.as_deref().unwrap_or("")
                ),
                Some(
                    "name the management interface with --mgmt-if (NCCL_SOCKET_IFNAME syntax, or a subnet)"
                        .into(),
                ),
            ),
            None => out.add(
                Level::Info,
                name,
                "roles",
                None,
                "no default route, no SSH session and no other host's management subnet: pass --mgmt-if to name the management interface".into(),
                None,
            ),
        }
        if data.is_empty() {
            out.add(
                Level::Fail,
                name,
                "roles",
                None,
                "no data interface found".into(),
                Some("name the data interfaces with --data-if (or WEFT_DATA_IFNAME), e.g. --data-if enp1s0f1np1,enP2p1s0f1np1".into()),
            );
        }
        for d in &data {
            if f.default_route_ifs.contains(&d.name) || mgmt.as_deref() == Some(d.name.as_str()) {
                out.add(
                    Level::Fail,
                    name,
                    "roles",
                    Some(&d.name),
                    format!("data interface {} is also the management / default-route interface: bulk traffic would share it", d.name),
                    Some("put bulk traffic on the fast rails: set WEFT_DATA_IFNAME to the RDMA/fast interfaces and WEFT_MGMT_IFNAME to the management one".into()),
                );
            }
        }
        let subnets: Vec<(String, u32)> = data
            .iter()
            .filter_map(|d| {
                facts::ipv4(d).map(|(a, l)| {
                    (
                        d.name.clone(),
                        u32::from(a) & (!0u32).checked_shl(32 - u32::from(l)).unwrap_or(0),
                    )
                })
            })
            .collect();
        for (k, (a, na)) in subnets.iter().enumerate() {
            for (b, nb) in &subnets[k + 1..] {
                if na == nb {
                    out.add(Level::Warn, name, "address", Some(a), format!("data interfaces {a} and {b} are on the same subnet: routing is ambiguous"), Some("give each data interface (each logical half of a port) its own subnet".into()));
                }
            }
        }
        hs.push(Host {
            idx: *i,
            mgmt,
            mgmt_addr: role.mgmt.and_then(|(m, _)| facts::ipv4(m)).map(|a| a.0),
            data: data
                .iter()
                .map(|d| DataIf {
                    name: d.name.clone(),
                    mtu: d.mtu,
                    speed_mbps: d.speed_mbps,
                    state: d.operstate,
                    addr: facts::ipv4(d),
                    rdma: d.rdma_device.clone(),
                    physical: d.pci.is_some(),
                })
                .collect(),
        });
    }
    Ok(hs)
}

/// Link state, address, MTU and speed of every data interface.
fn interface_checks(hs: &[Host], names: &[String], o: &DoctorOptions, out: &mut Out) {
    // Link state, address, MTU and speed, against expectations or the other interfaces of
    // the same role: a data interface is compared with those on its subnet (one L2 network,
    // one MTU), else with those of its rail. The reference is the largest value, so that a
    // remedy never tells a healthy host to lower its MTU.
    let role_of = |h: &Host, k: usize| -> (Option<(u32, u8)>, usize) {
        let d = &h.data[k];
        match d.addr {
            Some((a, l)) => (
                Some((
                    u32::from(a) & (!0u32).checked_shl(32 - u32::from(l)).unwrap_or(0),
                    l,
                )),
                0,
            ),
            None => (None, k),
        }
    };
    let mut ref_mtus: BTreeMap<(Option<(u32, u8)>, usize), u32> = BTreeMap::new();
    let mut ref_speeds: BTreeMap<(Option<(u32, u8)>, usize), u32> = BTreeMap::new();
    for h in hs {
        for (k, d) in h.data.iter().enumerate() {
            let e = ref_mtus.entry(role_of(h, k)).or_default();
            *e = (*e).max(d.mtu);
            if let Some(sp) = d.speed_mbps {
                let e = ref_speeds.entry(role_of(h, k)).or_default();
                *e = (*e).max(sp);
            }
        }
    }
    for h in hs {
        let name = &names[h.idx];
        for (k, d) in h.data.iter().enumerate() {
            let DataIf {
                name: ifn,
                mtu,
                speed_mbps: speed,
                state,
                addr,
                ..
            } = d;
            let role = role_of(h, k);
            let ref_mtu = o.expect_mtu.or_else(|| ref_mtus.get(&role).copied());
            let ref_speed = o
                .expect_speed_mbps
                .or_else(|| ref_speeds.get(&role).copied());
            let s = Some(ifn.as_str());
            if *state == OperState::Up {
                out.add(Level::Pass, name, "link", s, format!("{ifn} is up"), None);
            } else {
                out.add(
                    Level::Fail,
                    name,
                    "link",
                    s,
                    format!("{ifn} is {state:?}"),
                    Some(format!(
                        "check the cable and the switch port; `ip link set {ifn} up`"
                    )),
                );
            }
            if addr.is_none() {
                out.add(
                    Level::Fail,
                    name,
                    "address",
                    s,
                    format!("{ifn} has no IPv4 address"),
                    Some(format!(
                        "give {ifn} an address on its rail's subnet (netplan or `ip addr add`)"
                    )),
                );
            }
            match ref_mtu {
                Some(m) if *mtu != m => out.add(
                    Level::Fail,
                    name,
                    "mtu",
                    s,
                    format!("{ifn} MTU {mtu}, expected {m}{}", if o.expect_mtu.is_none() { " like the other hosts' interfaces on its network" } else { "" }),
                    Some(format!("`ip link set dev {ifn} mtu {m}` on {name} (and persist it), and the same MTU on its switch port")),
                ),
                _ => out.add(Level::Pass, name, "mtu", s, format!("{ifn} MTU {mtu}"), None),
            }
            match (ref_speed, speed) {
                (Some(want), Some(got)) if *got < want => out.add(
                    Level::Fail,
                    name,
                    "speed",
                    s,
                    format!("{ifn} negotiated {got} Mb/s, expected {want} Mb/s"),
                    Some("check the cable's rating, the switch port speed (force it if auto-negotiation picks less) and the transceiver".into()),
                ),
                (Some(want), Some(got)) if *got > want => out.add(Level::Info, name, "speed", s, format!("{ifn} {got} Mb/s, above the expected {want} Mb/s"), None),
                (_, Some(got)) => out.add(Level::Pass, name, "speed", s, format!("{ifn} {got} Mb/s"), None),
                (Some(want), None) if o.expect_speed_mbps.is_some() => out.add(Level::Warn, name, "speed", s, format!("{ifn} reports no link speed (expected {want} Mb/s)"), Some("read it with `ethtool`".into())),
                _ => out.add(Level::Info, name, "speed", s, format!("{ifn} reports no link speed"), None),
            }
        }
    }
}

/// Jumbo frames end to end: DF probes between every pair of hosts on each rail.
fn jumbo_check(
    hosts: &[Box<dyn HostRunner>],
    r: &Remote,
    o: &DoctorOptions,
    hs: &[Host],
    names: &[String],
    out: &mut Out,
) {
    // Jumbo frames end to end: DF probes of MTU - 28 between every pair on each rail.
    // Each rail at its own MTU: the expected one, else the largest of its interfaces.
    let rails = hs.iter().map(|h| h.data.len()).max().unwrap_or(0);
    let rail_mtu = |rail: usize| {
        o.expect_mtu.or_else(|| {
            hs.iter()
                .filter_map(|h| h.data.get(rail).map(|d| d.mtu))
                .max()
        })
    };
    let jumbo_rails: Vec<(usize, u32)> = (0..rails)
        .filter_map(|rail| rail_mtu(rail).map(|m| (rail, m)))
        .filter(|(_, m)| *m > 1500 || o.expect_mtu.is_some())
        .collect();
    if !jumbo_rails.is_empty() {
        for &(rail, m) in &jumbo_rails {
            let payload = (m as usize).saturating_sub(28);
            let addr = |h: &Host| h.data.get(rail).and_then(|d| d.addr.map(|a| a.0));
            let targets: Vec<Vec<Ipv4Addr>> = hs
                .iter()
                .map(|h| {
                    hs.iter()
                        .filter(|p| p.idx != h.idx)
                        .filter_map(addr)
                        .collect()
                })
                .collect();
            let sub: Vec<&dyn HostRunner> = hs.iter().map(|h| hosts[h.idx].as_ref()).collect();
            let res = probe_subset(&sub, r, &targets, payload, o.probe_timeout);
            // (src, dst) -> passes?
            let mut fails: Vec<(usize, usize, Probe, Probe)> = Vec::new();
            let mut pairs = 0usize;
            for (k, h) in hs.iter().enumerate() {
                match &res[k] {
                    Err(e) => out.add(
                        Level::Fail,
                        &names[h.idx],
                        "jumbo",
                        None,
                        format!("DF probe could not run: {e}"),
                        Some("the probe needs root or CAP_NET_RAW on the host".into()),
                    ),
                    Ok(v) => {
                        for p in v {
                            pairs += 1;
                            let Some(d) = hs.iter().position(|x| addr(x) == Some(p.dst)) else {
                                continue;
                            };
                            if p.jumbo != Probe::Reply {
                                fails.push((k, d, p.small, p.jumbo));
                            }
                        }
                    }
                }
            }
            let ifname = |k: usize| {
                hs[k]
                    .data
                    .get(rail)
                    .map_or("?".to_string(), |d| d.name.clone())
            };
            let mut blamed = Vec::new();
            if hs.len() > 2 {
                for k in 0..hs.len() {
                    let n_touch = fails.iter().filter(|f| f.0 == k || f.1 == k).count();
                    if n_touch == 2 * (hs.len() - 1) {
                        blamed.push(k);
                        out.add(
                            Level::Fail,
                            &names[hs[k].idx],
                            "jumbo",
                            Some(&ifname(k)),
                            format!("{payload}-byte DF packets neither leave nor reach {} on {} (rail {rail}): a smaller MTU on this host or its switch port", names[hs[k].idx], ifname(k)),
                            Some(format!("set MTU {m} on {} of {} and on its switch port", ifname(k), names[hs[k].idx])),
                        );
                    }
                }
            }
            for (s, d, small, jumbo) in &fails {
                if blamed.contains(s) || blamed.contains(d) {
                    continue;
                }
                let why = match (small, jumbo) {
                    (Probe::Reply, Probe::TooBigHere) => format!(
                        "{} refuses to send {payload}-byte DF packets (its MTU is smaller)",
                        ifname(*s)
                    ),
                    (Probe::Reply, _) => format!(
                        "{payload}-byte DF packets are dropped on the way (a smaller MTU on the path)"
                    ),
                    _ => "the peer does not answer even small echoes".to_string(),
                };
                out.add(
                    Level::Fail,
                    &names[hs[*s].idx],
                    "jumbo",
                    Some(&ifname(*s)),
                    format!("to {} ({}) on rail {rail}: {why}", names[hs[*d].idx], ifname(*d)),
                    Some(format!("MTU {m} on both hosts' interfaces and every switch port between them; a firewall may drop ICMP")),
                );
            }
            if fails.is_empty() && pairs > 0 {
                out.add(Level::Pass, "*", "jumbo", None, format!("{payload}-byte DF packets pass between all {pairs} ordered pairs on rail {rail}"), None);
            }
        }
    } else {
        out.add(
            Level::Info,
            "*",
            "jumbo",
            None,
            "data MTU is 1500 or less: no jumbo frames to probe".into(),
            None,
        );
    }
}

/// RDMA ports and the pinned GID index; returns the active HCAs (for `NCCL_IB_HCA`).
fn rdma_check(
    ok: &[(usize, Gathered)],
    hs: &[Host],
    names: &[String],
    out: &mut Out,
) -> Vec<String> {
    // RDMA devices.
    let mut hcas: Vec<String> = Vec::new();
    for (i, g) in ok {
        let name = &names[*i];
        let f = &g.facts;
        if f.report.rdma.is_empty() {
            out.add(
                Level::Info,
                name,
                "rdma",
                None,
                "no RDMA devices: bulk data runs over TCP sockets".into(),
                None,
            );
        }
        for d in &f.report.rdma {
            for p in &d.ports {
                let subj = format!("{}:{}", d.name, p.num);
                let ll = match p.link_layer {
                    LinkLayer::InfiniBand => "InfiniBand",
                    LinkLayer::Ethernet => "Ethernet (RoCE)",
                    LinkLayer::Unknown => "unknown link layer",
                };
                let rate = p.rate_text.clone().unwrap_or_else(|| "unknown rate".into());
                if p.state == PortState::Active {
                    out.add(
                        Level::Pass,
                        name,
                        "rdma",
                        Some(&subj),
                        format!(
                            "{subj} ACTIVE, {rate}, {ll}, netdev {}",
                            if p.netdevs.is_empty() {
                                "-".into()
                            } else {
                                p.netdevs.join(",")
                            }
                        ),
                        None,
                    );
                    if !hcas.contains(&d.name) {
                        hcas.push(d.name.clone());
                    }
                } else {
                    out.add(
                        Level::Fail,
                        name,
                        "rdma",
                        Some(&subj),
                        format!("{subj} is {:?}, not ACTIVE ({ll})", p.state),
                        Some(if p.link_layer == LinkLayer::InfiniBand {
                            "check the cable and that a subnet manager runs (OpenSM)".into()
                        } else {
                            "check the cable and that the netdev is up".into()
                        }),
                    );
                }
                if p.netdevs.is_empty() && p.link_layer == LinkLayer::Ethernet {
                    out.add(
                        Level::Warn,
                        name,
                        "rdma",
                        Some(&subj),
                        format!("{subj} has no netdev"),
                        Some(
                            "load the driver's Ethernet side (mlx5_core) and check `ibdev2netdev`"
                                .into(),
                        ),
                    );
                }
            }
        }
        if !f.report.rdma.is_empty()
            && let Some(h) = hs.iter().find(|h| h.idx == *i)
        {
            {
                for d in &h.data {
                    if d.rdma.is_none() {
                        out.add(
                            Level::Warn,
                            name,
                            "rdma",
                            Some(&d.name),
                            format!("data interface {} belongs to no RDMA device", d.name),
                            Some("pick the RDMA netdevs as data interfaces (--data-if)".into()),
                        );
                    }
                }
            }
        }
        if let Some((k, v)) = f.env.iter().find(|(k, _)| k == "NCCL_IB_GID_INDEX") {
            out.add(Level::Warn, name, "env", None, format!("{k}={v} is pinned in the environment"), Some("unset NCCL_IB_GID_INDEX: GID indexes move when addresses change; NCCL picks the RoCE v2 GID itself".into()));
        }
    }
    hcas
}

/// Each host's clock against this machine's.
fn clock_check(ok: &[(usize, Gathered)], names: &[String], o: &DoctorOptions, out: &mut Out) {
    // Clocks: offset against this machine, beyond what the call's own duration explains.
    for (i, g) in ok {
        let beyond = (g.offset_ns.abs() - g.uncertainty_ns).max(0);
        let ms = beyond as f64 / 1e6;
        let max = o.max_skew.as_secs_f64() * 1e3;
        if ms > max {
            let level = if ms > 10.0 * max {
                Level::Fail
            } else {
                Level::Warn
            };
            out.add(
                level,
                &names[*i],
                "clock",
                None,
                format!(
                    "clock is {:.0} ms off this machine's",
                    g.offset_ns as f64 / 1e6
                ),
                Some("run chrony or systemd-timesyncd on every host".into()),
            );
        } else {
            out.add(
                Level::Pass,
                &names[*i],
                "clock",
                None,
                format!(
                    "clock within {max:.0} ms (+-{:.0} ms)",
                    g.uncertainty_ns as f64 / 1e6
                ),
                None,
            );
        }
    }
}

/// The settings for jobs on these hosts, ready to paste as `export K=V`.
fn settings(hs: &[Host], mut hcas: Vec<String>) -> Vec<(String, String)> {
    // Settings.
    let mut env = Vec::new();
    let mgmts: Vec<&str> = hs.iter().filter_map(|h| h.mgmt.as_deref()).collect();
    let mut data_names: Vec<String> = Vec::new();
    for h in hs {
        for d in &h.data {
            if !data_names.contains(&d.name) {
                data_names.push(d.name.clone());
            }
        }
    }
    if !mgmts.is_empty() {
        let mut all: Vec<&str> = mgmts.clone();
        all.sort_unstable();
        all.dedup();
        let v = format!("={}", all.join(","));
        env.push(("WEFT_MGMT_IFNAME".to_string(), v.clone()));
        env.push(("NCCL_SOCKET_IFNAME".to_string(), v));
    }
    if !data_names.is_empty() {
        env.push((
            "WEFT_DATA_IFNAME".to_string(),
            format!("={}", data_names.join(",")),
        ));
    }
    if !hcas.is_empty() {
        hcas.sort();
        env.push(("NCCL_IB_HCA".to_string(), format!("={}", hcas.join(","))));
    }
    env
}

/// GiB, for messages.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// One host's GPUs, for messages: `8x NVIDIA H200 (140.4 GiB)`, groups in index order.
pub fn gpu_summary(gpus: &[weft_agent::Gpu]) -> String {
    let mut groups: Vec<(String, Option<u64>, usize)> = Vec::new();
    for g in gpus {
        match groups.last_mut() {
            Some(l) if l.0 == g.name && l.1 == g.memory_total_bytes => l.2 += 1,
            _ => groups.push((g.name.clone(), g.memory_total_bytes, 1)),
        }
    }
    groups
        .iter()
        .map(|(n, m, c)| {
            let mem = m.map_or_else(|| "memory not reported".to_string(), gib);
            format!("{c}x {n} ({mem})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Two GPU memory sizes are the same within 2% (ECC on or off moves the total a little).
fn same_memory(a: Option<u64>, b: Option<u64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.abs_diff(b) as f64 <= 0.02 * a.max(b) as f64,
        (None, None) => true,
        _ => false,
    }
}

/// GPU count and memory of every host against the majority: PASS with the count and memory,
/// WARN where a host has another count or another memory size, INFO where no host has a GPU.
fn gpu_check(gpus: &[(usize, &[weft_agent::Gpu])], names: &[String], out: &mut Out) {
    let gmaj = majority(gpus.iter().map(|g| g.1.len())).unwrap_or(0);
    // The reference memory list: the most common one (in whole GiB) among hosts of that count.
    let key = |v: &[weft_agent::Gpu]| -> Vec<Option<u64>> {
        let mut k: Vec<Option<u64>> = v
            .iter()
            .map(|g| g.memory_total_bytes.map(|b| (b + (1 << 29)) >> 30))
            .collect();
        k.sort_unstable();
        k
    };
    let reference: Option<&[weft_agent::Gpu]> =
        majority(gpus.iter().filter(|g| g.1.len() == gmaj).map(|g| key(g.1)))
            .and_then(|k| gpus.iter().find(|g| key(g.1) == k).map(|g| g.1));
    let sorted_mem = |v: &[weft_agent::Gpu]| -> Vec<Option<u64>> {
        let mut m: Vec<Option<u64>> = v.iter().map(|g| g.memory_total_bytes).collect();
        m.sort_unstable();
        m
    };
    for (i, v) in gpus {
        let name = &names[*i];
        let c = v.len();
        if c == 0 && gmaj == 0 {
            out.add(
                Level::Info,
                name,
                "gpu",
                None,
                "no GPUs (no NVIDIA driver)".into(),
                None,
            );
            continue;
        }
        let summary = if c == 0 {
            "no GPUs".to_string()
        } else {
            gpu_summary(v)
        };
        let reference_summary = reference.map_or_else(String::new, gpu_summary);
        if c != gmaj {
            out.add(
                Level::Warn,
                name,
                "gpu",
                None,
                format!("{c} GPUs ({summary}), the other hosts have {gmaj} ({reference_summary})"),
                Some(format!("check `nvidia-smi` and the driver on {name}: a GPU that fell off the bus or a missing driver")),
            );
            continue;
        }
        let same = reference.is_none_or(|r| {
            sorted_mem(r)
                .iter()
                .zip(sorted_mem(v))
                .all(|(a, b)| same_memory(*a, b))
        });
        if same {
            out.add(
                Level::Pass,
                name,
                "gpu",
                None,
                format!("{c} GPUs: {summary}"),
                None,
            );
        } else {
            out.add(
                Level::Warn,
                name,
                "gpu",
                None,
                format!("GPU memory differs from the other hosts: {summary}, the others have {reference_summary}"),
                Some(format!("a job sized for the larger memory runs out of memory on {name}: check the GPU model, MIG and ECC settings (`nvidia-smi -q -d MEMORY,ECC`)")),
            );
        }
    }
}

/// SSH between every ordered pair of the hosts reached over SSH, from each host the doctor
/// could reach; hosts reached otherwise (netns, local) are not checked, and an INFO says so.
fn ssh_pair_check(
    hosts: &[Box<dyn HostRunner>],
    r: &Remote,
    o: &DoctorOptions,
    names: &[String],
    reached: &[usize],
    out: &mut Out,
) {
    let Some(connect) = o.ssh_pairs else {
        out.add(
            Level::Info,
            "*",
            "ssh",
            None,
            "host-to-host SSH check skipped (--no-ssh-pairs)".into(),
            None,
        );
        return;
    };
    let over_ssh: Vec<usize> = (0..hosts.len())
        .filter(|&i| hosts[i].ssh_options().is_some())
        .collect();
    if over_ssh.len() < 2 {
        let how: Vec<&str> = {
            let mut v: Vec<&str> = hosts.iter().map(|h| h.kind()).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        out.add(
            Level::Info,
            "*",
            "ssh",
            None,
            format!(
                "SKIP host-to-host SSH check: not over SSH (hosts reached via {}; fewer than two hosts over SSH)",
                how.join(", ")
            ),
            None,
        );
        return;
    }
    let sources: Vec<usize> = over_ssh
        .iter()
        .copied()
        .filter(|i| reached.contains(i))
        .collect();
    let bound = connect * 2 + r.timeout;
    let res = ssh_pairs::probe_all(hosts, &sources, &over_ssh, connect, bound);
    for &s in &sources {
        let mine: Vec<&ssh_pairs::PairResult> = res.iter().filter(|p| p.src == s).collect();
        let src = &names[s];
        let mut bad = 0usize;
        for p in &mine {
            let dst = &names[p.dst];
            match &p.outcome {
                Outcome::Reached => {}
                Outcome::Failed { status, error } => {
                    bad += 1;
                    out.add(
                        Level::Fail,
                        src,
                        "ssh",
                        Some(dst),
                        format!("{src} -> {dst}: ssh failed (exit {status}): {error}"),
                        Some(ssh_pairs::remedy(src, dst, *status, error)),
                    );
                }
                Outcome::NotRun(why) => {
                    bad += 1;
                    out.add(
                        Level::Warn,
                        src,
                        "ssh",
                        Some(dst),
                        format!("{src} -> {dst}: the SSH probe could not run on {src}: {why}"),
                        Some(format!("check that `sh` and `ssh` run on {src}")),
                    );
                }
            }
        }
        if bad == 0 {
            out.add(
                Level::Pass,
                src,
                "ssh",
                None,
                format!(
                    "{src} reaches its {} peers over SSH (BatchMode, strict host-key checking)",
                    mine.len()
                ),
                None,
            );
        }
    }
}

/// The throughput check among the hosts reached (an unreachable host was named already):
/// every ordered pair for `d` through [`remote::p2p_matrix`], then [`p2p::analyse_with`],
/// each pair judged against what its links should do (`--expect-speed`, else the speed a
/// physical NIC reports), else against its peers. A blamed host FAILs, the others PASS.
/// Answers the pairs it measured.
fn throughput(
    hosts: &[Box<dyn HostRunner>],
    r: &Remote,
    d: Duration,
    names: &[String],
    data: &[(usize, &[DataIf])],
    expect_speed_mbps: Option<u32>,
    out: &mut Out,
) -> Vec<p2p::Pair> {
    let mut info: Vec<remote::P2pHost> = Vec::new();
    let mut runners: Vec<&dyn HostRunner> = Vec::new();
    let mut expected = p2p::RailTargets::new();
    for (i, v) in data {
        let rail_ifs: Vec<remote::RailIf> = v
            .iter()
            .map(|x| remote::RailIf {
                name: x.name.clone(),
                addr: x.addr.map(|(a, _)| a),
                link_mbps: if x.physical { x.speed_mbps } else { None },
            })
            .collect();
        let mut mine = p2p::RailTargets::new();
        let h = remote::P2pHost::from_data(&names[*i], &rail_ifs, expect_speed_mbps, &mut mine);
        if h.rails.is_empty() {
            continue;
        }
        expected.extend(mine);
        info.push(h);
        runners.push(hosts[*i].as_ref());
    }
    if info.len() < 2 {
        out.add(
            Level::Info,
            "*",
            "throughput",
            None,
            "throughput check skipped: fewer than two reachable hosts with a data address".into(),
            None,
        );
        return Vec::new();
    }
    let opts = remote::P2pOptions {
        streams: 2,
        duration: d,
        pings: 5,
    };
    let pairs = match remote::p2p_matrix(&runners, &info, r, &opts, &mut |_| {}) {
        Ok(p) => p,
        Err(e) => {
            out.add(
                Level::Fail,
                "*",
                "throughput",
                None,
                format!("throughput check could not run: {e}"),
                Some(
                    "run `weft bench p2p` on these hosts for details; skip with --no-throughput"
                        .into(),
                ),
            );
            return Vec::new();
        }
    };
    let in_check: Vec<String> = info.iter().map(|h| h.name.clone()).collect();
    let m = p2p::analyse_with(in_check, pairs, THROUGHPUT_THRESHOLD, &expected);
    let mut failed: Vec<&str> = Vec::new();
    for b in m.blamed.iter().filter(|b| b.what != "mtu") {
        let subj = info
            .iter()
            .find(|h| h.name == b.host)
            .and_then(|h| h.rails.get(b.rail))
            .map(|x| x.0.as_str());
        failed.push(&b.host);
        let ifn = subj.unwrap_or("IF");
        let remedy = if b.what == "unreachable" {
            format!(
                "check that {ifn} on {} is up, addressed and cabled (`ip -br addr show {ifn}`), and that no firewall drops TCP on it",
                b.host
            )
        } else {
            format!(
                "check {}'s cable and switch port speed, traffic shaping (`tc qdisc show dev {ifn}`) and the NIC's negotiated rate (`ethtool {ifn}`); `weft bench p2p` measures every pair at length",
                b.host
            )
        };
        out.add(
            Level::Fail,
            &b.host,
            "throughput",
            subj,
            b.message.clone(),
            Some(remedy),
        );
    }
    for h in &m.hosts {
        if failed.contains(&h.as_str()) {
            continue;
        }
        let mut from: Vec<f64> = m
            .pairs
            .iter()
            .filter(|p| &p.src == h && p.error.is_none())
            .map(|p| p.gbps)
            .collect();
        if let Some(g) = p2p::median(&mut from) {
            out.add(
                Level::Pass,
                h,
                "throughput",
                None,
                format!(
                    "sends {g:.3} Gb/s (median of its pairs over {:.1} s)",
                    d.as_secs_f64(),
                ),
                None,
            );
        }
    }
    // Slow pairs no host explains: a path between two healthy hosts.
    let explains = |host: &str, sending: bool, rail: usize| {
        m.blamed.iter().any(|b| {
            b.what == "bandwidth"
                && b.host == host
                && b.rail == rail
                && (b.direction == "both" || (b.direction == "sending") == sending)
        })
    };
    for s in &m.slow {
        if explains(&s.src, true, s.rail) || explains(&s.dst, false, s.rail) {
            continue;
        }
        out.add(
            Level::Warn,
            &s.src,
            "throughput",
            Some(&s.dst),
            format!(
                "{} -> {} (rail {}) ran at {:.3} Gb/s, {:.0}% of {:.3} Gb/s; no host explains it alone",
                s.src, s.dst, s.rail, s.gbps, s.pct_of_reference, s.reference_gbps
            ),
            Some("a path problem between these two (a switch port or an ECMP path): `weft bench p2p` measures the pair at length".into()),
        );
    }
    m.pairs
}

/// Packet loss between the management addresses of `mgmts` (host index, interface,
/// address): a train of `count` echoes from every one to every other, judged by
/// [`crate::loss::judge`]. A host whose every pair loses packets FAILs on its management
/// interface; a lossy pair no host explains WARNs; the others PASS with what they lost.
fn mgmt_loss(
    hosts: &[Box<dyn HostRunner>],
    r: &Remote,
    count: u32,
    names: &[String],
    mgmts: &[(usize, String, Ipv4Addr)],
    out: &mut Out,
) {
    use crate::loss::{self, PairLoss};
    if mgmts.len() < 2 {
        out.add(
            Level::Info,
            "*",
            "loss",
            None,
            "management loss check skipped: fewer than two hosts with a known management address (see --mgmt-if)".into(),
            None,
        );
        return;
    }
    let interval = Duration::from_millis(2);
    let res: Vec<Result<Vec<loss::TrainResult>, BenchError>> = each_host(mgmts, |(i, _, me)| {
        let targets: Vec<Ipv4Addr> = mgmts.iter().map(|m| m.2).filter(|a| a != me).collect();
        remote::loss_probe_one(hosts[*i].as_ref(), r, &targets, count, interval)
    });
    let mut pairs: Vec<PairLoss> = Vec::new();
    let mut ran = vec![false; mgmts.len()];
    for (k, rr) in res.iter().enumerate() {
        let name = &names[mgmts[k].0];
        match rr {
            Err(e) => out.add(
                Level::Warn,
                name,
                "loss",
                Some(&mgmts[k].1),
                format!("the management loss probe could not run: {e}"),
                Some("the probe needs root or CAP_NET_RAW on the host".into()),
            ),
            Ok(v) => {
                ran[k] = true;
                for t in v {
                    let Some(d) = mgmts.iter().position(|m| m.2 == t.dst) else {
                        continue;
                    };
                    pairs.push(PairLoss {
                        src: k,
                        dst: d,
                        sent: t.sent,
                        received: t.received,
                    });
                }
            }
        }
    }
    let v = loss::judge(mgmts.len(), &pairs);
    let label = |k: usize| format!("{} ({})", names[mgmts[k].0], mgmts[k].1);
    for &(k, pct) in &v.hosts {
        let (name, ifn) = (&names[mgmts[k].0], &mgmts[k].1);
        let each: Vec<String> = pairs
            .iter()
            .filter(|p| p.src == k || p.dst == k)
            .map(|p| {
                format!(
                    "{} -> {} {:.1}%",
                    names[mgmts[p.src].0],
                    names[mgmts[p.dst].0],
                    p.pct()
                )
            })
            .collect();
        out.add(
            Level::Fail,
            name,
            "loss",
            Some(ifn),
            format!(
                "management link {ifn} of {name} loses {pct:.1}% of packets: every pair with it lost ICMP echoes ({})",
                each.join(", ")
            ),
            Some(format!(
                "check {ifn}'s cable, transceiver and switch port on {name} (`ip -s link show {ifn}`: errors and drops; `ethtool -S {ifn}`) and any shaping (`tc qdisc show dev {ifn}`); loss here stalls SSH, the rendezvous and every handshake"
            )),
        );
    }
    for &k in &v.pairs {
        let p = &pairs[k];
        out.add(
            Level::Warn,
            &names[mgmts[p.src].0],
            "loss",
            Some(&names[mgmts[p.dst].0]),
            format!(
                "{} -> {}: {} of {} ICMP echoes lost on the management network ({:.1}%); no host explains it alone",
                label(p.src),
                label(p.dst),
                p.lost(),
                p.sent,
                p.pct()
            ),
            Some("a path problem between these two (a switch port, a lossy uplink)".into()),
        );
    }
    for p in pairs.iter().filter(|p| p.sent > 0 && p.received == 0) {
        out.add(
            Level::Warn,
            &names[mgmts[p.src].0],
            "loss",
            Some(&names[mgmts[p.dst].0]),
            format!(
                "{} -> {}: none of {} ICMP echoes answered on the management network",
                label(p.src),
                label(p.dst),
                p.sent
            ),
            Some("allow ICMP echo between the hosts' management addresses, or loss cannot be measured".into()),
        );
    }
    for (k, m) in mgmts.iter().enumerate() {
        if !ran[k] || v.hosts.iter().any(|h| h.0 == k) {
            continue;
        }
        // Pairs with a host named above are that host's loss, not this one's.
        let named = |x: usize| v.hosts.iter().any(|h| h.0 == x);
        let mine: Vec<&PairLoss> = pairs
            .iter()
            .filter(|p| (p.src == k || p.dst == k) && p.received > 0)
            .filter(|p| !named(p.src) && !named(p.dst))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let (sent, lost) = mine
            .iter()
            .fold((0u32, 0u32), |(s, l), p| (s + p.sent, l + p.lost()));
        out.add(
            Level::Pass,
            &names[m.0],
            "loss",
            Some(&m.1),
            format!(
                "management {}: {lost} of {sent} ICMP echoes lost with its {} peers{}",
                m.1,
                mine.iter()
                    .map(|p| if p.src == k { p.dst } else { p.src })
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                if v.hosts.is_empty() {
                    ""
                } else {
                    " (the lossy hosts named above left out)"
                }
            ),
            None,
        );
    }
}

fn probe_subset(
    hosts: &[&dyn HostRunner],
    r: &Remote,
    targets: &[Vec<Ipv4Addr>],
    payload: usize,
    per_probe: Duration,
) -> Vec<Result<Vec<ProbeResult>, BenchError>> {
    let jobs: Vec<(&dyn HostRunner, &Vec<Ipv4Addr>)> = hosts.iter().copied().zip(targets).collect();
    each_host(&jobs, |(h, t)| {
        remote::df_probe_one(*h, r, t, payload, per_probe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, name: &str, mib: Option<u64>) -> weft_agent::Gpu {
        weft_agent::Gpu {
            index,
            name: name.into(),
            uuid: None,
            memory_total_bytes: mib.map(|m| m << 20),
            pci: None,
        }
    }

    fn gpu_findings(hosts: &[Vec<weft_agent::Gpu>]) -> Vec<Finding> {
        let names: Vec<String> = (0..hosts.len()).map(|i| format!("n{i}")).collect();
        let v: Vec<(usize, &[weft_agent::Gpu])> =
            hosts.iter().enumerate().map(|(i, g)| (i, &g[..])).collect();
        let mut out = Out(Vec::new());
        gpu_check(&v, &names, &mut out);
        out.0
    }

    #[test]
    fn gpu_count_and_memory_differences_warn_on_the_odd_host() {
        let h200 = |n: u32| -> Vec<weft_agent::Gpu> {
            (0..n)
                .map(|i| gpu(i, "NVIDIA H200", Some(143_771)))
                .collect()
        };
        // All alike: PASS with the memory.
        let f = gpu_findings(&[h200(8), h200(8)]);
        assert!(f.iter().all(|f| f.level == Level::Pass), "{f:?}");
        assert!(f[0].message.contains("8x NVIDIA H200 (140.4 GiB)"), "{f:?}");
        // One host lost a GPU: WARN on it only.
        let f = gpu_findings(&[h200(8), h200(7), h200(8)]);
        let warned: Vec<&str> = f
            .iter()
            .filter(|f| f.level == Level::Warn)
            .map(|f| f.host.as_str())
            .collect();
        assert_eq!(warned, ["n1"], "{f:?}");
        // Same count, another memory size (a different model): WARN on it only.
        let mut odd = h200(8);
        odd[3] = gpu(3, "NVIDIA H100 80GB HBM3", Some(81_559));
        let f = gpu_findings(&[h200(8), h200(8), odd]);
        let warned: Vec<(&str, &str)> = f
            .iter()
            .filter(|f| f.level == Level::Warn)
            .map(|f| (f.host.as_str(), f.message.as_str()))
            .collect();
        assert_eq!(warned.len(), 1, "{f:?}");
        assert_eq!(warned[0].0, "n2");
        assert!(warned[0].1.contains("memory differs"), "{f:?}");
        // ECC on one host shaves off less than 2%: the same memory.
        let ecc: Vec<weft_agent::Gpu> = (0..8)
            .map(|i| gpu(i, "NVIDIA H200", Some(141_000)))
            .collect();
        let f = gpu_findings(&[h200(8), ecc]);
        assert!(f.iter().all(|f| f.level == Level::Pass), "{f:?}");
        // No driver anywhere: INFO.
        let f = gpu_findings(&[vec![], vec![]]);
        assert!(f.iter().all(|f| f.level == Level::Info), "{f:?}");
        // Unified memory (GB10) is said so.
        assert_eq!(
            gpu_summary(&[gpu(0, "NVIDIA GB10", None)]),
            "1x NVIDIA GB10 (memory not reported)"
        );
    }

    #[test]
    fn majority_prefers_the_larger_on_a_tie() {
        assert_eq!(majority([9000, 9000, 1500]), Some(9000));
        assert_eq!(majority([1500, 9000]), Some(9000));
        assert_eq!(majority(Vec::<u32>::new()), None);
    }
}
