//! Reading a sysfs tree (the live one at `/`, or a fixture) into a [`HostReport`].

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

use weft_fabric::Guid;

use crate::error::DiscoverError;
use crate::types::{
    Gpu, HostReport, LinkLayer, NetDev, NodeType, OperState, PhysState, PortState, RdmaDevice,
    RdmaPort,
};
use crate::{gpu, host};

/// Name of the optional per-interface file in a fixture that lists IP addresses, one
/// `address/prefix` a line (sysfs has no addresses; a live host's come from `getifaddrs`).
pub const ADDRESSES_FILE: &str = "addresses";
/// Name of the optional per-interface file in a fixture that holds the PCI address, for
/// fixtures that do not model the `device` symlink.
pub const DEVICE_PCI_FILE: &str = "device_pci";
/// Optional file at a fixture's root: a JSON array of [`Gpu`], standing in for NVML.
pub const GPUS_FILE: &str = "gpus.json";

/// Discovers the host whose filesystem is rooted at `root`.
///
/// `root` is `/` on a live host; anything else is a fixture tree with the same layout
/// (`sys/class/infiniband`, `sys/class/net`, `etc/hostname`). Only a live root asks the
/// OS directly: `gethostname(2)` where `etc/hostname` is missing, `getifaddrs(3)` for IP
/// addresses and NVML for GPUs. A fixture's addresses come from the optional
/// [`ADDRESSES_FILE`] of each interface, its GPUs from the optional [`GPUS_FILE`].
///
/// A host without `sys/class/infiniband` has no RDMA devices; that is not an error.
/// A missing optional file (`link_layer`, `rate`, `speed`, `fw_ver`, ...) is not an
/// error either. A file whose content does not parse is, and the error names it.
pub fn discover(root: &Path) -> Result<HostReport, DiscoverError> {
    let live = root == Path::new("/");
    let hostname = hostname(root, live)?;
    let rdma = rdma_devices(root)?;
    let mut netdevs = netdevs(root)?;

    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for d in &rdma {
        for p in &d.ports {
            for n in &p.netdevs {
                owner.entry(n.as_str()).or_insert(d.name.as_str());
            }
        }
    }
    for n in &mut netdevs {
        n.rdma_device = owner.get(n.name.as_str()).map(|d| d.to_string());
    }

    let gpus = if live {
        let mut addrs = host::local_addresses()?;
        for n in &mut netdevs {
            n.addresses = addrs.remove(&n.name).unwrap_or_default();
        }
        gpu::nvml_gpus()
    } else {
        fixture_gpus(root)?
    };

    Ok(HostReport {
        hostname,
        rdma,
        netdevs,
        gpus,
    })
}

fn hostname(root: &Path, live: bool) -> Result<String, DiscoverError> {
    let path = root.join("etc/hostname");
    let text = optional(&path)?;
    if let Some(name) = text
        .as_deref()
        .and_then(|t| t.lines().next())
        .map(str::trim)
        && !name.is_empty()
    {
        return Ok(name.to_string());
    }
    if live {
        return host::gethostname();
    }
    Err(DiscoverError::Read {
        path,
        source: io::Error::new(io::ErrorKind::NotFound, "a fixture needs a host name"),
    })
}

fn fixture_gpus(root: &Path) -> Result<Vec<Gpu>, DiscoverError> {
    let path = root.join(GPUS_FILE);
    match optional(&path)? {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| DiscoverError::parse(&path, &text, e.to_string())),
    }
}

// ---- reading files --------------------------------------------------------------------

fn read_text(path: &Path) -> io::Result<String> {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// A file that must exist; its content trimmed.
fn required(path: &Path) -> Result<String, DiscoverError> {
    read_text(path)
        .map(|t| t.trim().to_string())
        .map_err(|source| DiscoverError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// A file that may be missing; other read errors are errors.
fn optional(path: &Path) -> Result<Option<String>, DiscoverError> {
    match read_text(path) {
        Ok(t) => Ok(Some(t.trim().to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(DiscoverError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// A file the kernel refuses to read in some states (`rate`, `speed`: EINVAL while the
/// speed is unknown): any read error means "unknown".
fn volatile(path: &Path) -> Option<String> {
    read_text(path).ok().map(|t| t.trim().to_string())
}

fn parse_with<T, E: std::fmt::Display>(
    path: &Path,
    text: &str,
    f: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, DiscoverError> {
    f(text).map_err(|reason| DiscoverError::parse(path, text, reason.to_string()))
}

/// Entry names of a directory, sorted; `None` when it does not exist.
fn list_dir(path: &Path) -> Result<Option<Vec<String>>, DiscoverError> {
    let err = |source| DiscoverError::Read {
        path: path.to_path_buf(),
        source,
    };
    let entries = match fs::read_dir(path) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        names.push(
            entry
                .map_err(err)?
                .file_name()
                .to_string_lossy()
                .into_owned(),
        );
    }
    names.sort();
    Ok(Some(names))
}

// ---- value parsers (pure; the callers attach the path) --------------------------------

fn parse_guid(text: &str) -> Result<Guid, String> {
    text.parse::<Guid>().map_err(|e| e.to_string())
}

fn parse_hex_u16(text: &str) -> Result<u16, String> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .ok_or("expected a hex number with `0x`, for example `0x3`")?;
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("expected 1 to 4 hex digits after `0x`".into());
    }
    u16::from_str_radix(digits, 16).map_err(|e| e.to_string())
}

/// `400 Gb/sec (4X NDR)` -> 400.0; `2.5 Gb/sec (1X SDR)` -> 2.5.
pub(crate) fn parse_rate(text: &str) -> Result<f64, String> {
    let number = text
        .split_once(" Gb/sec")
        .map(|(n, _)| n.trim())
        .ok_or("expected `<number> Gb/sec (<width>X <speed>)`")?;
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{number}` is not a number"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("`{number}` is not a rate"));
    }
    Ok(value)
}

/// The low 64 bits of a GID in the kernel's `%pI6` form; 0 for the empty GID.
fn parse_gid_low(text: &str) -> Result<u64, String> {
    let gid: Ipv6Addr = text
        .parse()
        .map_err(|_| "expected a GID such as `fe80:0000:0000:0000:0002:c903:0000:0101`")?;
    // Truncation intended: the port GUID is the low 64 bits.
    Ok(u128::from(gid) as u64)
}

/// `aa:bb:cc:dd:ee:ff` -> the modified EUI-64 that RoCE puts in the low half of GID 0
/// (also what [`crate::fixtures`] writes there, so a fixture's GUIDs are what discovery reads).
pub(crate) fn mac_eui64(mac: &str) -> Option<u64> {
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    let [a, b, c, d, e, f] = bytes[..] else {
        return None;
    };
    Some(u64::from_be_bytes([a ^ 0x02, b, c, 0xff, 0xfe, d, e, f]))
}

/// `0000:01:00.0` (domain of 4 or more hex digits, bus, device, function).
fn is_pci_address(text: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let parts: Vec<&str> = text.split(':').collect();
    let [domain, bus, devfn] = parts[..] else {
        return false;
    };
    let Some((dev, func)) = devfn.split_once('.') else {
        return false;
    };
    domain.len() >= 4
        && domain.bytes().all(|b| b.is_ascii_hexdigit())
        && hex(bus, 2)
        && hex(dev, 2)
        && func.len() == 1
        && func.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

// ---- RDMA ----------------------------------------------------------------------------

fn rdma_devices(root: &Path) -> Result<Vec<RdmaDevice>, DiscoverError> {
    let base = root.join("sys/class/infiniband");
    let Some(names) = list_dir(&base)? else {
        return Ok(Vec::new());
    };
    names
        .iter()
        .map(|name| rdma_device(root, &base.join(name), name))
        .collect()
}

fn rdma_device(root: &Path, dir: &Path, name: &str) -> Result<RdmaDevice, DiscoverError> {
    let file = |f: &str| dir.join(f);
    let guid_of = |f: &str| -> Result<Guid, DiscoverError> {
        let path = file(f);
        let text = required(&path)?;
        parse_with(&path, &text, parse_guid)
    };
    let node_guid = guid_of("node_guid")?;
    let sys_image_guid = guid_of("sys_image_guid")?;
    let node_type = {
        let path = file("node_type");
        let text = required(&path)?;
        parse_with(&path, &text, NodeType::parse_sysfs)?
    };
    // node_desc may end in spaces that are part of it; drop only the newline.
    let node_desc = {
        let path = file("node_desc");
        read_text(&path)
            .map_err(|source| DiscoverError::Read {
                path: path.clone(),
                source,
            })?
            .trim_end_matches(['\n', '\0'])
            .to_string()
    };
    let fw_ver = optional(&file("fw_ver"))?.filter(|s| !s.is_empty());
    let hca_type = optional(&file("hca_type"))?.filter(|s| !s.is_empty());

    let ports_dir = file("ports");
    let mut nums = Vec::new();
    for entry in list_dir(&ports_dir)?.unwrap_or_default() {
        let num: u32 = entry.parse().map_err(|_| {
            DiscoverError::parse(
                ports_dir.join(&entry),
                &entry,
                "a port directory is named by its number",
            )
        })?;
        nums.push((num, entry));
    }
    nums.sort();
    let single = nums.len() == 1;
    let mut ports = Vec::with_capacity(nums.len());
    for (num, entry) in &nums {
        ports.push(rdma_port(root, dir, &ports_dir.join(entry), *num, single)?);
    }

    Ok(RdmaDevice {
        name: name.to_string(),
        node_guid,
        sys_image_guid,
        node_type,
        node_desc,
        fw_ver,
        hca_type,
        ports,
    })
}

fn rdma_port(
    root: &Path,
    dev_dir: &Path,
    dir: &Path,
    num: u32,
    single_port: bool,
) -> Result<RdmaPort, DiscoverError> {
    let file = |f: &str| dir.join(f);
    let parsed = |f: &str, p: fn(&str) -> Result<u16, String>| -> Result<u16, DiscoverError> {
        let path = file(f);
        let text = required(&path)?;
        parse_with(&path, &text, p)
    };

    let link_layer = {
        let path = file("link_layer");
        match optional(&path)? {
            None => LinkLayer::InfiniBand,
            Some(text) => parse_with(&path, &text, LinkLayer::parse_sysfs)?,
        }
    };
    let lid = parsed("lid", parse_hex_u16)?;
    let sm_lid = parsed("sm_lid", parse_hex_u16)?;
    let state = {
        let path = file("state");
        let text = required(&path)?;
        parse_with(&path, &text, PortState::parse_sysfs)?
    };
    let phys_state = {
        let path = file("phys_state");
        let text = required(&path)?;
        parse_with(&path, &text, PhysState::parse_sysfs)?
    };
    let rate_text = volatile(&file("rate")).filter(|t| !t.is_empty());
    let rate_gbps = match &rate_text {
        None => None,
        Some(t) => Some(parse_with(&file("rate"), t, parse_rate)?),
    };

    let (pkeys, pkey_table_len) = pkey_table(&file("pkeys"))?;
    let netdevs = port_netdevs(dev_dir, dir, num, single_port)?;

    let gid_path = dir.join("gids/0");
    let gid_text = optional(&gid_path)?;
    let gid_low = match &gid_text {
        Some(text) => Some(parse_with(&gid_path, text, parse_gid_low)?),
        None => None,
    };
    let port_guid = match gid_low {
        Some(g) if g != 0 => Guid(g),
        // RoCE: the GID table is empty while the netdev is down; GID 0 would be the
        // link-local address made from the netdev's MAC, so derive the same value.
        _ if link_layer == LinkLayer::Ethernet => netdevs
            .iter()
            .filter_map(|n| volatile(&root.join("sys/class/net").join(n).join("address")))
            .find_map(|mac| mac_eui64(&mac))
            .map(Guid)
            .ok_or_else(|| {
                DiscoverError::parse(
                    &gid_path,
                    gid_text.as_deref().unwrap_or("(missing)"),
                    "the GID table is empty and no netdev of the port has a MAC to derive it from",
                )
            })?,
        Some(_) => {
            return Err(DiscoverError::parse(
                &gid_path,
                gid_text.as_deref().unwrap_or_default(),
                "GID 0 of an InfiniBand port is all zeros: no port GUID",
            ));
        }
        None => {
            return Err(DiscoverError::Read {
                path: gid_path,
                source: io::Error::new(io::ErrorKind::NotFound, "GID 0 holds the port GUID"),
            });
        }
    };

    Ok(RdmaPort {
        num,
        port_guid,
        lid,
        sm_lid,
        state,
        phys_state,
        rate_gbps,
        rate_text,
        link_layer,
        pkeys,
        pkey_table_len,
        netdevs,
    })
}

/// Non-zero P_Key entries in index order, and the table length.
fn pkey_table(dir: &Path) -> Result<(Vec<u16>, u16), DiscoverError> {
    let mut entries = Vec::new();
    for name in list_dir(dir)?.unwrap_or_default() {
        let index: u32 = name.parse().map_err(|_| {
            DiscoverError::parse(dir.join(&name), &name, "a P_Key file is named by its index")
        })?;
        entries.push((index, name));
    }
    entries.sort();
    let len = u16::try_from(entries.len()).map_err(|_| {
        DiscoverError::parse(
            dir,
            &entries.len().to_string(),
            "more P_Key entries than 65535",
        )
    })?;
    let mut keys = Vec::new();
    for (_, name) in entries {
        let path = dir.join(name);
        let text = required(&path)?;
        let key = parse_with(&path, &text, parse_hex_u16)?;
        if key != 0 {
            keys.push(key);
        }
    }
    Ok((keys, len))
}

/// Netdevs of a port: `gid_attrs/ndevs/0` (RoCE), and the device's `device/net/*` whose
/// `dev_port` is this port's (or all of them, on a single-port device without `dev_port`).
fn port_netdevs(
    dev_dir: &Path,
    port_dir: &Path,
    num: u32,
    single_port: bool,
) -> Result<Vec<String>, DiscoverError> {
    let mut names = BTreeSet::new();
    if let Some(n) = volatile(&port_dir.join("gid_attrs/ndevs/0"))
        && !n.is_empty()
    {
        names.insert(n);
    }
    let net = dev_dir.join("device/net");
    for name in list_dir(&net)?.unwrap_or_default() {
        let dev_port =
            volatile(&net.join(&name).join("dev_port")).and_then(|t| t.parse::<u32>().ok());
        let mine = match dev_port {
            Some(p) => p.checked_add(1) == Some(num),
            None => single_port,
        };
        if mine {
            names.insert(name);
        }
    }
    Ok(names.into_iter().collect())
}

// ---- netdevs -------------------------------------------------------------------------

fn netdevs(root: &Path) -> Result<Vec<NetDev>, DiscoverError> {
    let base = root.join("sys/class/net");
    let mut out = Vec::new();
    for name in list_dir(&base)?.unwrap_or_default() {
        let dir = base.join(&name);
        // `bonding_masters` and similar are files next to the interfaces.
        if !dir.is_dir() {
            continue;
        }
        out.push(netdev(&dir, name)?);
    }
    Ok(out)
}

fn netdev(dir: &Path, name: String) -> Result<NetDev, DiscoverError> {
    let file = |f: &str| dir.join(f);
    let mac = required(&file("address"))?;
    let mtu = {
        let path = file("mtu");
        let text = required(&path)?;
        parse_with(&path, &text, |t| {
            t.parse::<u32>()
                .map_err(|_| "expected the MTU in bytes".to_string())
        })?
    };
    let operstate = {
        let path = file("operstate");
        let text = required(&path)?;
        parse_with(&path, &text, OperState::parse_sysfs)?
    };
    let speed_mbps = match volatile(&file("speed")).filter(|t| !t.is_empty()) {
        None => None,
        Some(text) => {
            let v = parse_with(&file("speed"), &text, |t| {
                t.parse::<i64>()
                    .map_err(|_| "expected the speed in Mb/s".to_string())
            })?;
            // -1 (SPEED_UNKNOWN), and the same as an unsigned 32-bit number, mean unknown.
            u32::try_from(v).ok().filter(|&s| s != u32::MAX)
        }
    };
    let arp_type = {
        let path = file("type");
        let text = required(&path)?;
        parse_with(&path, &text, |t| {
            t.parse::<u16>()
                .map_err(|_| "expected an ARPHRD number".to_string())
        })?
    };
    let pci = pci_address(dir)?;
    let addresses = optional(&file(ADDRESSES_FILE))?
        .map(|t| {
            t.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Ok(NetDev {
        name,
        mac,
        mtu,
        speed_mbps,
        operstate,
        arp_type,
        pci,
        rdma_device: None,
        addresses,
    })
}

/// The PCI address behind a netdev: the fixture's [`DEVICE_PCI_FILE`], else the last
/// component of the `device` symlink's target when it is a PCI address.
fn pci_address(dir: &Path) -> Result<Option<String>, DiscoverError> {
    let plain = dir.join(DEVICE_PCI_FILE);
    if let Some(text) = optional(&plain)? {
        if !is_pci_address(&text) {
            return Err(DiscoverError::parse(
                plain,
                &text,
                "expected a PCI address such as `0000:01:00.0`",
            ));
        }
        return Ok(Some(text));
    }
    let target: PathBuf = match fs::read_link(dir.join("device")) {
        Ok(t) => t,
        Err(_) => return Ok(None),
    };
    Ok(target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| is_pci_address(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)"), Ok(400.0));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)"), Ok(2.5));
        assert_eq!(parse_rate("53.125 Gb/sec (1X HDR)"), Ok(53.125));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("x Gb/sec (4X NDR)").is_err());
    }

    #[test]
    fn hex() {
        assert_eq!(parse_hex_u16("0x3"), Ok(3));
        assert_eq!(parse_hex_u16("0xffff"), Ok(0xffff));
        assert!(parse_hex_u16("3").is_err());
        assert!(parse_hex_u16("0x10000").is_err());
        assert!(parse_hex_u16("0xzz").is_err());
    }

    #[test]
    fn gids_and_macs() {
        assert_eq!(
            parse_gid_low("fe80:0000:0000:0000:0002:c903:0000:0101"),
            Ok(0x0002_c903_0000_0101)
        );
        assert_eq!(
            parse_gid_low("0000:0000:0000:0000:0000:0000:0000:0000"),
            Ok(0)
        );
        assert!(parse_gid_low("fe80:0000").is_err());
        assert_eq!(mac_eui64("00:02:c9:02:01:01"), Some(0x0202_c9ff_fe02_0101));
        assert_eq!(mac_eui64("02:00:00:00:00:01"), Some(0x0000_00ff_fe00_0001));
        assert_eq!(mac_eui64("00:02:c9"), None);
    }

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:01:00.0"));
        assert!(is_pci_address("0002:01:00.1"));
        assert!(is_pci_address("10000:e1:00.0"));
        assert!(!is_pci_address("virtio0"));
        assert!(!is_pci_address("0000:01:00"));
        assert!(!is_pci_address("0000:01:00.8"));
    }
}
