//! The IP addresses of this host's interfaces (of its network namespace), from
//! `getifaddrs(3)`: the one walker of that list in weft, so that its `unsafe` is written and
//! checked once; and the interface selection syntax ([`IfSpec`]). weft-agent's discovery,
//! weft-transport's interface selection and weft-hosts' roles read it; it depends on nothing
//! but libc, so the transport and the host tools stay light.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod spec;

pub use spec::{IfMatch, IfSpec, IfSpecError, in_subnet};

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    /// Kernel name (`eth0`).
    pub name: String,
    pub addr: IpAddr,
    /// Prefix length from the netmask (32 or 128 when there is none).
    pub prefix: u8,
    /// Whether the interface is administratively up (`IFF_UP`).
    pub up: bool,
}

/// Frees the list of `getifaddrs` when dropped.
struct List(*mut libc::ifaddrs);

impl Drop for List {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful getifaddrs and is freed only here.
        unsafe { libc::freeifaddrs(self.0) };
    }
}

/// Every IPv4 and IPv6 address of every interface, in the order `getifaddrs(3)` lists them
/// (an interface's addresses in kernel order).
pub fn addrs() -> io::Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid place for getifaddrs to store the list head.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let list = List(head);
    let mut out = Vec::new();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until `list` drops.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is non-null and points to a NUL-terminated name owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points to a sockaddr owned by the list.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let (addr, prefix) = match family {
            libc::AF_INET => {
                // SAFETY: the family says the sockaddr is a sockaddr_in; read_unaligned makes
                // no alignment assumption.
                let sin =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in>()) };
                let prefix = if ifa.ifa_netmask.is_null() {
                    32
                } else {
                    // SAFETY: the netmask of an AF_INET address is a sockaddr_in too.
                    let m = unsafe {
                        std::ptr::read_unaligned(ifa.ifa_netmask.cast::<libc::sockaddr_in>())
                    };
                    m.sin_addr.s_addr.count_ones() as u8
                };
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                (IpAddr::V4(ip), prefix)
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the sockaddr is a sockaddr_in6; read_unaligned makes
                // no alignment assumption.
                let sin6 =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in6>()) };
                let prefix = if ifa.ifa_netmask.is_null() {
                    128
                } else {
                    // SAFETY: the netmask of an AF_INET6 address is a sockaddr_in6 too.
                    let m = unsafe {
                        std::ptr::read_unaligned(ifa.ifa_netmask.cast::<libc::sockaddr_in6>())
                    };
                    m.sin6_addr
                        .s6_addr
                        .iter()
                        .map(|b| b.count_ones() as u8)
                        .sum()
                };
                (IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)), prefix)
            }
            _ => continue,
        };
        out.push(IfAddr {
            name,
            addr,
            prefix,
            up: ifa.ifa_flags & (libc::IFF_UP as libc::c_uint) != 0,
        });
    }
    drop(list);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_with_its_prefix() {
        let all = addrs().unwrap();
        // Every Linux network namespace has `lo`, up in any test environment we run in.
        let lo: Vec<&IfAddr> = all.iter().filter(|a| a.name == "lo").collect();
        assert!(
            lo.iter().any(
                |a| (a.addr == IpAddr::V4(Ipv4Addr::LOCALHOST) && a.prefix == 8)
                    || (a.addr == IpAddr::V6(Ipv6Addr::LOCALHOST) && a.prefix == 128)
            ),
            "{all:?}"
        );
        assert!(lo.iter().all(|a| a.up), "{lo:?}");
    }
}
