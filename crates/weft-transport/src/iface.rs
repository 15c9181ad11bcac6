//! Network interfaces of this host: enumeration (`weft-ifaddrs`), selection by [`IfSpec`], and the
//! facts NCCL wants about a NIC (speed, PCI path, a GUID) read from sysfs.

use std::net::IpAddr;
use std::path::Path;

use crate::config::IfSpec;
use crate::error::{Error, Result};

/// One network interface with the address weft would use on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Kernel name (`eth0`).
    pub name: String,
    /// Every IP address it has, in kernel order.
    pub addrs: Vec<IpAddr>,
    /// Whether it is administratively up.
    pub up: bool,
}

impl Interface {
    /// The address weft binds on: the first IPv4, else the first IPv6 that is not link-local
    /// (a link-local address needs a scope id that a handle does not carry).
    pub fn best_addr(&self) -> Option<IpAddr> {
        self.addrs
            .iter()
            .copied()
            .find(IpAddr::is_ipv4)
            .or_else(|| self.addrs.iter().copied().find(|a| !is_link_local_v6(a)))
    }

    /// Link speed in Mbit/s from `/sys/class/net/<if>/speed`; `None` if unknown (virtual NICs).
    pub fn speed_mbps(&self) -> Option<u32> {
        let s = std::fs::read_to_string(Path::new("/sys/class/net").join(&self.name).join("speed"))
            .ok()?;
        s.trim()
            .parse::<i64>()
            .ok()
            .filter(|v| *v > 0)
            .and_then(|v| u32::try_from(v).ok())
    }

    /// Canonical sysfs path of the PCI device behind the interface; `None` for virtual ones.
    pub fn pci_path(&self) -> Option<String> {
        let p = std::fs::canonicalize(Path::new("/sys/class/net").join(&self.name).join("device"))
            .ok()?;
        Some(p.to_string_lossy().into_owned())
    }

    /// A 64-bit identity of the port: the MAC address when there is one, else a hash of the name.
    /// Two devices with the same GUID are one physical port to NCCL.
    pub fn guid(&self) -> u64 {
        let mac =
            std::fs::read_to_string(Path::new("/sys/class/net").join(&self.name).join("address"))
                .unwrap_or_default();
        let mut v: u64 = 0;
        let mut n = 0;
        for b in mac.trim().split(':') {
            if let Ok(x) = u8::from_str_radix(b, 16) {
                v = (v << 8) | u64::from(x);
                n += 1;
            }
        }
        if n >= 6 && v != 0 {
            return v;
        }
        // FNV-1a of the name.
        self.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    }
}

fn is_link_local_v6(a: &IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

/// Every interface of the host with at least one IP address, in kernel order
/// ([`weft_ifaddrs::addrs`]).
pub fn list() -> Result<Vec<Interface>> {
    let all = weft_ifaddrs::addrs().map_err(|e| Error::local("getifaddrs", &e))?;
    let mut out: Vec<Interface> = Vec::new();
    for a in all {
        match out.iter_mut().find(|i| i.name == a.name) {
            Some(i) => i.addrs.push(a.addr),
            None => out.push(Interface {
                name: a.name,
                addrs: vec![a.addr],
                up: a.up,
            }),
        }
    }
    Ok(out)
}

/// NCCL's automatic order: anything but `docker*`, `lo`, `virbr*` first, then those three groups.
fn auto_rank(name: &str) -> u8 {
    if name.starts_with("docker") {
        1
    } else if name == "lo" {
        2
    } else if name.starts_with("virbr") {
        3
    } else {
        0
    }
}

/// Interfaces selected by `spec` (all usable ones in NCCL's automatic order when `None`),
/// keeping only those that are up and have a usable address.
pub fn select(all: &[Interface], spec: Option<&IfSpec>) -> Vec<Interface> {
    let mut v: Vec<Interface> = all
        .iter()
        .filter(|i| i.up && i.best_addr().is_some())
        .filter(|i| spec.is_none_or(|s| s.matches(&i.name, &i.addrs)))
        .cloned()
        .collect();
    if spec.is_none() {
        v.sort_by_key(|i| auto_rank(&i.name));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifc(name: &str, addrs: &[&str]) -> Interface {
        Interface {
            name: name.into(),
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            up: true,
        }
    }

    #[test]
    fn auto_order_puts_lo_and_docker_last() {
        let all = vec![
            ifc("lo", &["127.0.0.1"]),
            ifc("docker0", &["172.17.0.1"]),
            ifc("eth0", &["10.0.0.2"]),
        ];
        let names: Vec<_> = select(&all, None).into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["eth0", "docker0", "lo"]);
    }

    #[test]
    fn best_addr_skips_link_local_v6() {
        assert_eq!(
            ifc("a", &["fe80::1", "fd00::2"]).best_addr(),
            Some("fd00::2".parse().unwrap())
        );
        assert_eq!(
            ifc("a", &["fd00::2", "10.0.0.1"]).best_addr(),
            Some("10.0.0.1".parse().unwrap())
        );
        assert_eq!(ifc("a", &["fe80::1"]).best_addr(), None);
    }

    #[test]
    fn host_has_loopback() {
        let all = list().unwrap();
        let spec: IfSpec = "=lo".parse().unwrap();
        let lo = select(&all, Some(&spec));
        assert_eq!(lo.len(), 1, "{all:?}");
        assert!(lo[0].best_addr().unwrap().is_loopback());
        assert_eq!(lo[0].pci_path(), None);
        assert_ne!(lo[0].guid(), 0);
    }
}
