//! What weft learns from each host: the agent's discovery report, the interfaces that carry a
//! default route, the host's clock and the NCCL/weft settings in its environment; plus the
//! interface selection (NCCL's `IFNAME` syntax) the roles are decided with. [`gather`] runs
//! *on* the host, through the hidden `weft bench host-facts` ([`crate::remote`]).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use weft_agent::{HostReport, NetDev};

use weft_ifaddrs::IfSpec;

use crate::HostsError;

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
pub fn gather(root: &Path) -> Result<HostFacts, HostsError> {
    let mut report = weft_agent::discover(root).map_err(|e| HostsError::Host {
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
pub fn parse_ifspec(what: &str, spec: &str) -> Result<IfSpec, HostsError> {
    spec.parse::<IfSpec>()
        .map_err(|e| HostsError::Usage(format!("{what} {spec:?}: {e}")))
}

/// The addresses of an interface, for [`IfSpec::matches`].
pub(crate) fn ip_addrs(n: &NetDev) -> Vec<IpAddr> {
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

/// Not loopback (by name or ARP type 772).
pub(crate) fn is_real(n: &NetDev) -> bool {
    n.name != "lo" && n.arp_type != 772
}

/// The first IPv4 address of an interface, with its prefix length.
pub fn ipv4(n: &NetDev) -> Option<(Ipv4Addr, u8)> {
    n.addresses.iter().find_map(|a| {
        let (ip, len) = a.split_once('/').unwrap_or((a, "32"));
        Some((ip.parse().ok()?, len.parse().ok()?))
    })
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
}
