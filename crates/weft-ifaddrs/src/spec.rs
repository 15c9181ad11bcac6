//! Interface selection lists: NCCL's `NCCL_SOCKET_IFNAME` syntax, extended with subnets. The
//! plugin (`WEFT_MGMT_IFNAME`, `WEFT_DATA_IFNAME`) and the tools (`--mgmt-if`, `--data-if`)
//! parse them here, so that both read one syntax the same way.

use std::net::IpAddr;
use std::str::FromStr;

/// A selection list that does not parse; the message names the list and the bad part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfSpecError(pub String);

impl std::fmt::Display for IfSpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IfSpecError {}

/// One element of an interface selection list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// Interface name starts with this prefix (or equals it, with `=`).
    Name(String),
    /// Interface has an address in this subnet (`10.1.0.0/16`, `fd00::/64`).
    Subnet(IpAddr, u8),
}

/// An interface selection in NCCL's `NCCL_SOCKET_IFNAME` syntax, extended with subnets.
///
/// * `eth,ib` — names starting with `eth` or `ib`;
/// * `^docker,lo` — every interface except those starting with `docker` or `lo`;
/// * `=eth0` — exactly `eth0` (`^=eth0`: all but exactly `eth0`);
/// * `10.1.0.0/16` — interfaces with an address in that subnet (weft extension; may be mixed with names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfSpec {
    /// `^`: the list says what to exclude.
    pub exclude: bool,
    /// `=`: names must match exactly instead of by prefix.
    pub exact: bool,
    /// The list.
    pub items: Vec<IfMatch>,
}

impl FromStr for IfSpec {
    type Err = IfSpecError;
    fn from_str(s: &str) -> Result<IfSpec, IfSpecError> {
        let mut rest = s.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let mut items = Vec::new();
        for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some((ip, bits)) = part.split_once('/') {
                let ip: IpAddr = ip.parse().map_err(|_| {
                    IfSpecError(format!(
                        "bad subnet address {part:?} in interface list {s:?}"
                    ))
                })?;
                let max = if ip.is_ipv4() { 32 } else { 128 };
                let bits: u8 = bits.parse().ok().filter(|b| *b <= max).ok_or_else(|| {
                    IfSpecError(format!(
                        "bad prefix length in {part:?} of interface list {s:?}"
                    ))
                })?;
                items.push(IfMatch::Subnet(ip, bits));
            } else {
                // NCCL allows `name:port` for IB devices; the port means nothing for TCP.
                let name = part.split(':').next().unwrap_or(part);
                items.push(IfMatch::Name(name.to_string()));
            }
        }
        if items.is_empty() {
            return Err(IfSpecError(format!("empty interface list {s:?}")));
        }
        Ok(IfSpec {
            exclude,
            exact,
            items,
        })
    }
}

impl IfSpec {
    /// Whether an interface with this name and addresses is selected.
    pub fn matches(&self, name: &str, addrs: &[IpAddr]) -> bool {
        let hit = self.items.iter().any(|m| match m {
            IfMatch::Name(n) => {
                if self.exact {
                    name == n
                } else {
                    name.starts_with(n.as_str())
                }
            }
            IfMatch::Subnet(net, bits) => addrs.iter().any(|a| in_subnet(*a, *net, *bits)),
        });
        hit != self.exclude
    }
}

/// Whether `addr` lies in `net/bits`.
pub fn in_subnet(addr: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(bits.min(32)))
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(bits.min(128)))
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}
