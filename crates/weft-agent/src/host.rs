//! What a live host tells only through system calls: its name and its IP addresses.

use std::collections::BTreeMap;
use std::io;

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

/// The IPv4 and IPv6 addresses of every interface of this host (its network namespace),
/// as `address/prefix`, by interface name, in the order `getifaddrs(3)` lists them
/// ([`weft_ifaddrs::addrs`]).
///
/// [`crate::discover`] calls it for the live root `/`; fixtures list addresses in files.
pub fn local_addresses() -> Result<BTreeMap<String, Vec<String>>, DiscoverError> {
    let all = weft_ifaddrs::addrs().map_err(|source| DiscoverError::Sys {
        call: "getifaddrs",
        source,
    })?;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in all {
        out.entry(a.name)
            .or_default()
            .push(format!("{}/{}", a.addr, a.prefix));
    }
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
