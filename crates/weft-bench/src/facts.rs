//! What the bench and the doctor learn from each host: the agent's discovery report, the
//! interfaces that carry a default route, the host's clock and the NCCL/weft settings in its
//! environment; plus the interface selection (NCCL's `IFNAME` syntax) and a DF-bit ICMP probe
//! that needs no `ping(8)`. All of it runs *on* the host, through a hidden `weft` subcommand.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use weft_agent::{HostReport, NetDev, OperState};

use weft_transport::IfSpec;

use crate::BenchError;

/// Facts about one host, gathered on the host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostFacts {
    /// `weft_agent::discover("/")`.
    pub report: HostReport,
    /// Interfaces with a default route (`/proc/net/route`).
    pub default_route_ifs: Vec<String>,
    /// The host's clock when the facts were taken, ns since the Unix epoch.
    pub unix_time_ns: u64,
    /// `NCCL_*` and `WEFT_*` variables set in the host's environment.
    pub env: Vec<(String, String)>,
    /// The host's address of the SSH session the facts were gathered over
    /// (`SSH_CONNECTION`'s third field), if any: that interface is the management one.
    #[serde(default)]
    pub ssh_server_addr: Option<Ipv4Addr>,
}

/// Gathers [`HostFacts`] on this host (or in this namespace).
pub fn gather(root: &Path) -> Result<HostFacts, BenchError> {
    let mut report = weft_agent::discover(root).map_err(|e| BenchError::Host {
        host: "local".into(),
        msg: format!("discovery: {e}"),
    })?;
    if report.gpus.is_empty() && root == Path::new("/") {
        report.gpus = nvidia_smi_gpus(NVIDIA_SMI_TIMEOUT);
    }
    let routes = std::fs::read_to_string(root.join("proc/net/route")).unwrap_or_default();
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("NCCL_") || k.starts_with("WEFT_"))
        .collect();
    env.sort();
    Ok(HostFacts {
        report,
        default_route_ifs: default_route_ifs(&routes),
        unix_time_ns: now_ns(),
        env,
        ssh_server_addr: std::env::var("SSH_CONNECTION")
            .ok()
            .and_then(|c| ssh_server_addr(&c)),
    })
}

/// Bound on `nvidia-smi` (it can take seconds while the driver wakes the GPUs up).
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// The GPUs `nvidia-smi` lists (count, name, total memory), for hosts where NVML could not be
/// opened but the tool runs; none where it is absent, fails or runs past `timeout`.
pub fn nvidia_smi_gpus(timeout: Duration) -> Vec<weft_agent::Gpu> {
    let mut c = std::process::Command::new("nvidia-smi");
    c.args(weft_agent::NVIDIA_SMI_ARGS);
    match crate::runner::run_bounded(c, timeout) {
        Ok(o) if o.status.success() => {
            weft_agent::parse_nvidia_smi(&String::from_utf8_lossy(&o.stdout))
        }
        Ok(o) => {
            tracing::debug!("nvidia-smi exited with {}", o.status);
            Vec::new()
        }
        Err(e) => {
            tracing::debug!("no nvidia-smi: {e}");
            Vec::new()
        }
    }
}

/// The server address of an `SSH_CONNECTION` value (`client port server port`).
pub fn ssh_server_addr(ssh_connection: &str) -> Option<Ipv4Addr> {
    ssh_connection.split_whitespace().nth(2)?.parse().ok()
}

/// Nanoseconds since the Unix epoch on this host's clock.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Interfaces of `/proc/net/route` lines whose destination and mask are 0.
pub fn default_route_ifs(proc_net_route: &str) -> Vec<String> {
    let mut v: Vec<String> = proc_net_route
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
        })
        .collect();
    v.dedup();
    v
}

/// Parses an interface list (`--data-if`, `--mgmt-if`, `WEFT_*_IFNAME`) with the plugin's
/// parser: NCCL's `NCCL_SOCKET_IFNAME` syntax (`eth,ib` prefixes, `=eth0` exact, `^` to
/// exclude) and subnets (`192.0.2.0/24`). `what` names the input in the error.
pub fn parse_ifspec(what: &str, spec: &str) -> Result<IfSpec, BenchError> {
    spec.parse::<IfSpec>()
        .map_err(|e| BenchError::Usage(format!("{what} {spec:?}: {e}")))
}

/// The addresses of an interface, for [`IfSpec::matches`].
fn ip_addrs(n: &NetDev) -> Vec<IpAddr> {
    n.addresses
        .iter()
        .filter_map(|a| {
            a.split_once('/')
                .map_or(a.as_str(), |(ip, _)| ip)
                .parse()
                .ok()
        })
        .collect()
}

/// Whether `spec` selects `n` (by name or by one of its addresses).
pub fn selects(spec: &IfSpec, n: &NetDev) -> bool {
    spec.matches(&n.name, &ip_addrs(n))
}

fn is_real(n: &NetDev) -> bool {
    n.name != "lo" && n.arp_type != 772
}

/// How a host's management interface was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MgmtSource {
    /// `--mgmt-if` (or `WEFT_MGMT_IFNAME`).
    Flag,
    /// The interface of the default route.
    DefaultRoute,
    /// The interface holding the address the SSH session came in on.
    SshSession,
    /// No route and no SSH session: the interface on the subnet of the other hosts'
    /// management interfaces.
    Peers,
}

/// The roles of one host's interfaces.
#[derive(Debug, Clone)]
pub struct Roles<'a> {
    pub mgmt: Option<(&'a NetDev, MgmtSource)>,
    pub data: Vec<&'a NetDev>,
}

/// The IPv4 network (address & mask, prefix length) of an interface.
pub fn ipv4_net(n: &NetDev) -> Option<(u32, u8)> {
    ipv4(n).map(|(a, l)| {
        (
            u32::from(a) & (!0u32).checked_shl(32 - u32::from(l)).unwrap_or(0),
            l,
        )
    })
}

/// Roles of every host's interfaces, decided together (one selection for doctor, p2p and
/// collectives, with the plugin's defaults and syntax):
///
/// * management: the interface `mgmt` selects; else the default-route one; else the one
///   holding the address the SSH session came in on; else (a host without a default route)
///   the one on a subnet where the other hosts have their management interface;
/// * data: the interfaces `data` selects; else the netdevs of RDMA ports; else every
///   interface that is up with an IPv4 address, except the management one and any on a
///   management subnet of the cluster.
pub fn roles<'a>(
    hosts: &[&'a HostFacts],
    data: Option<&IfSpec>,
    mgmt: Option<&IfSpec>,
) -> Vec<Roles<'a>> {
    let own: Vec<Option<(&NetDev, MgmtSource)>> = hosts
        .iter()
        .map(|f| {
            let nd = &f.report.netdevs;
            if let Some(spec) = mgmt {
                return nd
                    .iter()
                    .find(|n| is_real(n) && selects(spec, n))
                    .map(|n| (n, MgmtSource::Flag));
            }
            if let Some(n) = f
                .default_route_ifs
                .iter()
                .find_map(|r| nd.iter().find(|n| &n.name == r))
            {
                return Some((n, MgmtSource::DefaultRoute));
            }
            let ssh = f.ssh_server_addr?;
            nd.iter()
                .find(|n| ip_addrs(n).contains(&IpAddr::V4(ssh)))
                .map(|n| (n, MgmtSource::SshSession))
        })
        .collect();
    let mgmt_nets: Vec<(u32, u8)> = own
        .iter()
        .flatten()
        .filter_map(|(n, _)| ipv4_net(n))
        .collect();
    hosts
        .iter()
        .zip(own)
        .map(|(f, m)| {
            let nd = &f.report.netdevs;
            let m = m.or_else(|| {
                if mgmt.is_some() {
                    return None;
                }
                nd.iter()
                    .filter(|n| is_real(n))
                    .find(|n| ipv4_net(n).is_some_and(|x| mgmt_nets.contains(&x)))
                    .map(|n| (n, MgmtSource::Peers))
            });
            let data: Vec<&NetDev> = if let Some(spec) = data {
                nd.iter()
                    .filter(|n| is_real(n) && selects(spec, n))
                    .collect()
            } else {
                let rdma: Vec<&NetDev> = nd
                    .iter()
                    .filter(|n| is_real(n) && n.rdma_device.is_some())
                    .collect();
                if rdma.is_empty() {
                    nd.iter()
                        .filter(|n| is_real(n))
                        .filter(|n| m.is_none_or(|(x, _)| x.name != n.name))
                        .filter(|n| !ipv4_net(n).is_some_and(|x| mgmt_nets.contains(&x)))
                        .filter(|n| n.operstate == OperState::Up && ipv4(n).is_some())
                        .collect()
                } else {
                    rdma
                }
            };
            Roles { mgmt: m, data }
        })
        .collect()
}

/// The first IPv4 address of an interface, with its prefix length.
pub fn ipv4(n: &NetDev) -> Option<(Ipv4Addr, u8)> {
    n.addresses.iter().find_map(|a| {
        let (ip, len) = a.split_once('/').unwrap_or((a, "32"));
        Some((ip.parse().ok()?, len.parse().ok()?))
    })
}

/// What one DF-bit probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Probe {
    /// An echo reply came back.
    Reply,
    /// The local stack refused to send a DF packet that large (interface MTU too small).
    TooBigHere,
    /// No reply within the bound (dropped on the way: a smaller MTU further on).
    NoReply,
}

/// One probe result, as the hidden `df-probe` command prints it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeResult {
    pub dst: Ipv4Addr,
    /// Small (56-byte) echo: is the peer reachable at all?
    pub small: Probe,
    /// The `payload`-byte echo with DF set.
    pub jumbo: Probe,
    pub payload: usize,
}

/// One DF-bit probe through [`weft_icmp::echo`], as a [`Probe`].
pub fn icmp_echo(dst: Ipv4Addr, payload: usize, df: bool, timeout: Duration) -> io::Result<Probe> {
    Ok(match weft_icmp::echo(dst, payload, df, timeout)? {
        weft_icmp::Echo::Reply(_) => Probe::Reply,
        weft_icmp::Echo::TooBigHere => Probe::TooBigHere,
        weft_icmp::Echo::NoReply => Probe::NoReply,
    })
}

/// Probes each of `dsts`: a small echo, then a DF echo of `payload` bytes (two tries).
pub fn df_probe(
    dsts: &[Ipv4Addr],
    payload: usize,
    timeout: Duration,
) -> io::Result<Vec<ProbeResult>> {
    let mut out = Vec::new();
    for &dst in dsts {
        let small = icmp_echo(dst, 56, false, timeout)?;
        let mut jumbo = icmp_echo(dst, payload, true, timeout)?;
        if jumbo == Probe::NoReply {
            jumbo = icmp_echo(dst, payload, true, timeout)?;
        }
        out.push(ProbeResult {
            dst,
            small,
            jumbo,
            payload,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_routes_come_from_proc_net_route() {
        let t = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
                 eno1\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
                 eno1\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n\
                 enp1s0f1np1\t0064A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(default_route_ifs(t), ["eno1"]);
        assert!(default_route_ifs("Iface\n").is_empty());
    }

    fn netdev(name: &str, addr: Option<&str>, rdma: bool) -> NetDev {
        NetDev {
            name: name.into(),
            mac: "02:00:00:00:00:01".into(),
            mtu: 9000,
            speed_mbps: None,
            operstate: OperState::Up,
            arp_type: if name == "lo" { 772 } else { 1 },
            pci: None,
            rdma_device: rdma.then(|| "mlx5_0".into()),
            addresses: addr.map(|a| vec![a.to_string()]).unwrap_or_default(),
        }
    }

    fn host(i: u8, default_route: bool, ssh: bool) -> HostFacts {
        let report = HostReport {
            hostname: format!("h{i}"),
            rdma: vec![],
            netdevs: vec![
                netdev("lo", Some("127.0.0.1/8"), false),
                netdev("eno1", Some(&format!("10.0.0.{i}/24")), false),
                netdev("enp1s0", Some(&format!("192.0.2.{i}/24")), false),
            ],
            gpus: vec![],
        };
        HostFacts {
            report,
            default_route_ifs: if default_route {
                vec!["eno1".into()]
            } else {
                vec![]
            },
            unix_time_ns: 0,
            env: vec![],
            ssh_server_addr: ssh.then(|| Ipv4Addr::new(10, 0, 0, i)),
        }
    }

    fn names(r: &Roles) -> (Option<(String, MgmtSource)>, Vec<String>) {
        (
            r.mgmt.map(|(n, s)| (n.name.clone(), s)),
            r.data.iter().map(|n| n.name.clone()).collect(),
        )
    }

    #[test]
    fn roles_default_route_ssh_session_and_peers() {
        let (a, b, c) = (
            host(1, true, false),
            host(2, false, true),
            host(3, false, false),
        );
        let r = roles(&[&a, &b, &c], None, None);
        let want = |s| (Some(("eno1".to_string(), s)), vec!["enp1s0".to_string()]);
        assert_eq!(names(&r[0]), want(MgmtSource::DefaultRoute));
        assert_eq!(names(&r[1]), want(MgmtSource::SshSession));
        // No route, no session: management is found on the others' management subnet and
        // does not become data.
        assert_eq!(names(&r[2]), want(MgmtSource::Peers));
        // No host has a route or a session: management is unknown (the doctor says so and
        // asks for --mgmt-if) and every up interface is data.
        let (d, e) = (host(4, false, false), host(5, false, false));
        let r = roles(&[&d, &e], None, None);
        assert_eq!(names(&r[0]).0, None);
        assert_eq!(names(&r[0]).1, ["eno1", "enp1s0"]);
    }

    #[test]
    fn interface_lists_take_the_plugins_syntax_with_subnets() {
        let a = host(1, true, false);
        let spec = |s: &str| parse_ifspec("--data-if", s).unwrap();
        for (s, want) in [
            ("192.0.2.0/24", vec!["enp1s0"]),
            ("=enp1s0", vec!["enp1s0"]),
            ("en", vec!["eno1", "enp1s0"]),
            ("^eno", vec!["enp1s0"]),
            ("10.0.0.0/8,enp", vec!["eno1", "enp1s0"]),
        ] {
            let r = roles(&[&a], Some(&spec(s)), None);
            assert_eq!(names(&r[0]).1, want, "{s}");
        }
        let r = roles(&[&a], None, Some(&spec("=enp1s0")));
        assert_eq!(
            names(&r[0]),
            (
                Some(("enp1s0".to_string(), MgmtSource::Flag)),
                vec!["eno1".to_string()]
            )
        );
        let e = parse_ifspec("--data-if", "192.0.2.0/33")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--data-if") && e.contains("192.0.2.0/33"), "{e}");
        // RDMA netdevs first, whatever their subnet.
        let mut b = host(2, true, false);
        b.report
            .netdevs
            .push(netdev("ibp1", Some("198.51.100.2/24"), true));
        assert_eq!(names(&roles(&[&b], None, None)[0]).1, ["ibp1"]);
        assert_eq!(
            ssh_server_addr("10.0.0.9 51234 10.0.0.2 22"),
            Some(Ipv4Addr::new(10, 0, 0, 2))
        );
    }
}
