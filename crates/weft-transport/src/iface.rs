//! Network interfaces of this host: enumeration (getifaddrs), selection by [`IfSpec`], and the
//! facts NCCL wants about a NIC (speed, PCI path, a GUID) read from sysfs.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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

/// Every interface of the host with at least one IP address, in kernel order.
pub fn list() -> Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into the pointer we pass; we free it below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::local("getifaddrs", &std::io::Error::last_os_error()));
    }
    let mut out: Vec<Interface> = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned and we have not freed it.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() || ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points at a sockaddr of the family it names.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family says this is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says this is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        let up = ifa.ifa_flags & (libc::IFF_UP as libc::c_uint) != 0;
        match out.iter_mut().find(|i| i.name == name) {
            Some(i) => i.addrs.push(addr),
            None => out.push(Interface {
                name,
                addrs: vec![addr],
                up,
            }),
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
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
