//! What a live host tells only through system calls: its name and its IP addresses.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::error::DiscoverError;

/// `gethostname(2)`.
pub(crate) fn gethostname() -> Result<String, DiscoverError> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes, and gethostname writes at
    // most that many.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(DiscoverError::Sys {
            call: "gethostname",
            source: io::Error::last_os_error(),
        });
    }
    // A name that filled the buffer may lack the NUL; take all of it then.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Frees the list of `getifaddrs` when dropped.
struct IfAddrs(*mut libc::ifaddrs);

impl Drop for IfAddrs {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful getifaddrs and is freed only here.
        unsafe { libc::freeifaddrs(self.0) };
    }
}

/// The IPv4 and IPv6 addresses of every interface of this host (its network namespace),
/// as `address/prefix`, by interface name, in the order `getifaddrs(3)` lists them.
///
/// [`crate::discover`] calls it for the live root `/`; fixtures list addresses in files.
pub fn local_addresses() -> Result<BTreeMap<String, Vec<String>>, DiscoverError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid place for getifaddrs to store the list head.
    let rc = unsafe { libc::getifaddrs(&mut head) };
    if rc != 0 {
        return Err(DiscoverError::Sys {
            call: "getifaddrs",
            source: io::Error::last_os_error(),
        });
    }
    let list = IfAddrs(head);
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
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
        let text = match family {
            libc::AF_INET => {
                // SAFETY: the family says the sockaddr is a sockaddr_in; read_unaligned makes
                // no alignment assumption.
                let sin =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in>()) };
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                let prefix = if ifa.ifa_netmask.is_null() {
                    32
                } else {
                    // SAFETY: the netmask of an AF_INET address is a sockaddr_in too.
                    let m = unsafe {
                        std::ptr::read_unaligned(ifa.ifa_netmask.cast::<libc::sockaddr_in>())
                    };
                    m.sin_addr.s_addr.count_ones()
                };
                format!("{ip}/{prefix}")
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the sockaddr is a sockaddr_in6; read_unaligned makes
                // no alignment assumption.
                let sin6 =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in6>()) };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                let prefix = if ifa.ifa_netmask.is_null() {
                    128
                } else {
                    // SAFETY: the netmask of an AF_INET6 address is a sockaddr_in6 too.
                    let m = unsafe {
                        std::ptr::read_unaligned(ifa.ifa_netmask.cast::<libc::sockaddr_in6>())
                    };
                    m.sin6_addr.s6_addr.iter().map(|b| b.count_ones()).sum()
                };
                format!("{ip}/{prefix}")
            }
            _ => continue,
        };
        out.entry(name).or_default().push(text);
    }
    drop(list);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_has_a_name_and_loopback() {
        assert!(!gethostname().unwrap().is_empty());
        let addrs = local_addresses().unwrap();
        // Every Linux network namespace has `lo`; it is up in any test environment we run in.
        if let Some(lo) = addrs.get("lo") {
            assert!(
                lo.iter().any(|a| a == "127.0.0.1/8" || a == "::1/128"),
                "{lo:?}"
            );
        }
    }
}
