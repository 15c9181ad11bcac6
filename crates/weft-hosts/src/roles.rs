//! Which of each host's interfaces carries what: management (SSH, rendezvous, handshakes)
//! and data (bulk traffic), decided for a set of hosts together ([`roles_for`]).

use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};
use weft_agent::{NetDev, OperState};
use weft_ifaddrs::IfSpec;

use crate::HostsError;
use crate::facts::{HostFacts, ip_addrs, ipv4, ipv4_net, is_real, parse_ifspec, selects};

/// The interfaces the user named for each role (`--mgmt-if`, `--data-if`, or
/// `WEFT_MGMT_IFNAME` / `WEFT_DATA_IFNAME`: NCCL's `NCCL_SOCKET_IFNAME` syntax or subnets),
/// parsed once; `None` for the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IfChoice {
    pub mgmt: Option<IfSpec>,
    pub data: Option<IfSpec>,
}

impl IfChoice {
    /// Parses `--mgmt-if` and `--data-if`; an error names the flag and the value.
    pub fn parse(mgmt: Option<&str>, data: Option<&str>) -> Result<IfChoice, HostsError> {
        Ok(IfChoice {
            mgmt: mgmt.map(|s| parse_ifspec("--mgmt-if", s)).transpose()?,
            data: data.map(|s| parse_ifspec("--data-if", s)).transpose()?,
        })
    }
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

impl Roles<'_> {
    /// The management interface's name and first IPv4 address, if it has one.
    pub fn mgmt_addr(&self) -> Option<(&str, Ipv4Addr)> {
        self.mgmt
            .and_then(|(n, _)| ipv4(n).map(|(a, _)| (n.name.as_str(), a)))
    }

    /// The data rails: each data interface that has an IPv4 address, with that address, in
    /// the order of the host's interfaces.
    pub fn rails(&self) -> Vec<(String, Ipv4Addr)> {
        self.data
            .iter()
            .filter_map(|d| ipv4(d).map(|(a, _)| (d.name.clone(), a)))
            .collect()
    }
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
///
/// `weft doctor`, `weft bench p2p`, `weft bench collectives --hosts` and `weft run` all call
/// this with every host of the command at once, so that the same hosts and flags give the
/// same interfaces whichever command asks (a host without a route or an SSH session gets its
/// management interface from the others' subnets, which a per-host decision cannot see).
pub fn roles_for<'a>(hosts: &[&'a HostFacts], choice: &IfChoice) -> Vec<Roles<'a>> {
    let (data, mgmt) = (choice.data.as_ref(), choice.mgmt.as_ref());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::ssh_server_addr;
    use weft_agent::HostReport;

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
        let r = roles_for(&[&a, &b, &c], &IfChoice::default());
        let want = |s| (Some(("eno1".to_string(), s)), vec!["enp1s0".to_string()]);
        assert_eq!(names(&r[0]), want(MgmtSource::DefaultRoute));
        assert_eq!(names(&r[1]), want(MgmtSource::SshSession));
        // No route, no session: management is found on the others' management subnet and
        // does not become data.
        assert_eq!(names(&r[2]), want(MgmtSource::Peers));
        // No host has a route or a session: management is unknown (the doctor says so and
        // asks for --mgmt-if) and every up interface is data.
        let (d, e) = (host(4, false, false), host(5, false, false));
        let r = roles_for(&[&d, &e], &IfChoice::default());
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
            let r = roles_for(
                &[&a],
                &IfChoice {
                    data: Some(spec(s)),
                    mgmt: None,
                },
            );
            assert_eq!(names(&r[0]).1, want, "{s}");
        }
        let r = roles_for(&[&a], &IfChoice::parse(Some("=enp1s0"), None).unwrap());
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
        assert_eq!(
            names(&roles_for(&[&b], &IfChoice::default())[0]).1,
            ["ibp1"]
        );
        assert_eq!(
            ssh_server_addr("10.0.0.9 51234 10.0.0.2 22"),
            Some(Ipv4Addr::new(10, 0, 0, 2))
        );
    }
}
