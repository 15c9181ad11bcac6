//! Writing fixture trees: a host's sysfs as [`crate::discover`] reads it, from a [`HostSpec`].
//!
//! Tests of other crates use it to make agents whose port GUIDs match a simulated fabric
//! (ibsim's scheme: an HCA's port N has GUID node GUID + N, which is what
//! [`PortSpec::infiniband`] gives by default).
//!
//! The tree has the real kernel layout, with relative symlinks:
//!
//! ```text
//! etc/hostname
//! sys/devices/pci<domain>:00/<pci>/infiniband/<hca>/{node_guid,sys_image_guid,node_type,node_desc,fw_ver,hca_type}
//! sys/devices/pci<domain>:00/<pci>/infiniband/<hca>/device -> ../../../<pci>
//! sys/devices/pci<domain>:00/<pci>/infiniband/<hca>/ports/<n>/{gids/0,lid,sm_lid,state,phys_state,rate,link_layer,pkeys/<i>}
//! sys/devices/pci<domain>:00/<pci>/infiniband/<hca>/ports/<n>/gid_attrs/ndevs/0      (Ethernet ports)
//! sys/devices/pci<domain>:00/<pci>/net/<if>/{address,mtu,operstate,speed,type,dev_port,addresses}
//! sys/devices/pci<domain>:00/<pci>/net/<if>/device -> ../../../<pci>
//! sys/devices/virtual/net/<if>/...                                                  (no PCI address)
//! sys/class/infiniband/<hca> -> ../../devices/.../infiniband/<hca>
//! sys/class/net/<if> -> ../../devices/.../net/<if>
//! gpus.json                                                                          (if GPUs are given)
//! ```
//!
//! `addresses` (one `address/prefix` a line) and `gpus.json` are not kernel files: they
//! stand in for `getifaddrs` and NVML, which a fixture cannot answer.
//!
//! This module is always compiled (no cargo feature to turn on): it is small, uses only
//! `std`, and other crates' tests depend on it.

use std::fs;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};
use weft_fabric::Guid;

use crate::discover::{ADDRESSES_FILE, GPUS_FILE, mac_eui64};
use crate::types::{Gpu, LinkLayer, OperState, PhysState, PortState};

/// A host to write: its name, HCAs, other interfaces and GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostSpec {
    /// Written to `etc/hostname`.
    pub hostname: String,
    /// RDMA devices.
    pub hcas: Vec<HcaSpec>,
    /// Interfaces that belong to no RDMA port (management NICs, bridges).
    pub netdevs: Vec<NetDevSpec>,
    /// GPUs, written to `gpus.json` when not empty.
    pub gpus: Vec<Gpu>,
}

impl HostSpec {
    /// A host with nothing but a name.
    pub fn new(hostname: impl Into<String>) -> Self {
        HostSpec {
            hostname: hostname.into(),
            hcas: Vec::new(),
            netdevs: Vec::new(),
            gpus: Vec::new(),
        }
    }

    /// Adds an RDMA device.
    pub fn with_hca(mut self, hca: HcaSpec) -> Self {
        self.hcas.push(hca);
        self
    }

    /// Adds an interface that belongs to no RDMA port.
    pub fn with_netdev(mut self, netdev: NetDevSpec) -> Self {
        self.netdevs.push(netdev);
        self
    }

    /// Adds a GPU.
    pub fn with_gpu(mut self, gpu: Gpu) -> Self {
        self.gpus.push(gpu);
        self
    }
}

/// One RDMA device (one PCI function).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HcaSpec {
    /// Device name (`mlx5_0`, `rocep1s0f0`).
    pub name: String,
    /// `node_guid`.
    pub node_guid: Guid,
    /// `sys_image_guid`; the node GUID when `None`.
    pub sys_image_guid: Option<Guid>,
    /// `node_desc`; `<hostname> <name>` (what rdma-ndd writes) when `None`.
    pub node_desc: Option<String>,
    /// PCI address of the function (`0000:01:00.0`); the port netdevs hang off it too.
    pub pci: String,
    /// `fw_ver`, written when given.
    pub fw_ver: Option<String>,
    /// `hca_type`, written when given.
    pub hca_type: Option<String>,
    /// Ports.
    pub ports: Vec<PortSpec>,
}

impl HcaSpec {
    /// A ConnectX-7 (`MT4129`, firmware 28.39.1002) without ports.
    pub fn new(name: impl Into<String>, node_guid: Guid, pci: impl Into<String>) -> Self {
        HcaSpec {
            name: name.into(),
            node_guid,
            sys_image_guid: None,
            node_desc: None,
            pci: pci.into(),
            fw_ver: Some("28.39.1002".into()),
            hca_type: Some("MT4129".into()),
            ports: Vec::new(),
        }
    }

    /// Adds a port.
    pub fn with_port(mut self, port: PortSpec) -> Self {
        self.ports.push(port);
        self
    }

    /// Sets `sys_image_guid` (equal for the functions of one adapter).
    pub fn with_sys_image_guid(mut self, guid: Guid) -> Self {
        self.sys_image_guid = Some(guid);
        self
    }

    /// Sets `node_desc`.
    pub fn with_node_desc(mut self, desc: impl Into<String>) -> Self {
        self.node_desc = Some(desc.into());
        self
    }
}

/// One port of an RDMA device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortSpec {
    /// Port number, from 1.
    pub num: u32,
    /// Port GUID (low half of `gids/0`). When `None`: the EUI-64 of the netdev's MAC on an
    /// Ethernet port that has a netdev with a MAC, else node GUID + port number (ibsim).
    pub guid: Option<Guid>,
    /// `lid`.
    pub lid: u16,
    /// `sm_lid`.
    pub sm_lid: u16,
    /// `state`.
    pub state: PortState,
    /// `phys_state`.
    pub phys_state: PhysState,
    /// `rate`, written when given (`400 Gb/sec (4X NDR)`).
    pub rate: Option<String>,
    /// `link_layer`; no file when `None` (as in ibsim; discovery then assumes InfiniBand).
    pub link_layer: Option<LinkLayer>,
    /// P_Key table entries from index 0, bit 15 included (`0xffff`).
    pub pkeys: Vec<u16>,
    /// Pads the P_Key table with `0x0000` entries up to this length.
    pub pkey_table_len: Option<u16>,
    /// The port's netdev (IPoIB `ib0`, or the RoCE Ethernet interface).
    pub netdev: Option<NetDevSpec>,
}

impl PortSpec {
    /// An ACTIVE NDR InfiniBand port (`400 Gb/sec (4X NDR)`) with LID `num`, SM LID 1 and
    /// the default P_Key 0xffff; its GUID is node GUID + `num`.
    pub fn infiniband(num: u32) -> Self {
        PortSpec {
            num,
            guid: None,
            lid: u16::try_from(num).unwrap_or(0),
            sm_lid: 1,
            state: PortState::Active,
            phys_state: PhysState::LinkUp,
            rate: Some("400 Gb/sec (4X NDR)".into()),
            link_layer: Some(LinkLayer::InfiniBand),
            pkeys: vec![0xffff],
            pkey_table_len: None,
            netdev: None,
        }
    }

    /// An ACTIVE 200 Gb/s RoCE port (`200 Gb/sec (4X HDR)`, LID 0, P_Key 0xffff) whose GID 0
    /// comes from `netdev`'s MAC.
    pub fn roce(num: u32, netdev: NetDevSpec) -> Self {
        PortSpec {
            num,
            guid: None,
            lid: 0,
            sm_lid: 0,
            state: PortState::Active,
            phys_state: PhysState::LinkUp,
            rate: Some("200 Gb/sec (4X HDR)".into()),
            link_layer: Some(LinkLayer::Ethernet),
            pkeys: vec![0xffff],
            pkey_table_len: None,
            netdev: Some(netdev),
        }
    }

    /// Sets the port GUID.
    pub fn with_guid(mut self, guid: Guid) -> Self {
        self.guid = Some(guid);
        self
    }

    /// Sets the LID.
    pub fn with_lid(mut self, lid: u16) -> Self {
        self.lid = lid;
        self
    }

    /// Sets the SM's LID.
    pub fn with_sm_lid(mut self, sm_lid: u16) -> Self {
        self.sm_lid = sm_lid;
        self
    }

    /// Sets the logical and physical states.
    pub fn with_state(mut self, state: PortState, phys_state: PhysState) -> Self {
        self.state = state;
        self.phys_state = phys_state;
        self
    }

    /// Sets the `rate` text; `None` writes no file.
    pub fn with_rate(mut self, rate: Option<&str>) -> Self {
        self.rate = rate.map(str::to_string);
        self
    }

    /// Sets the link layer; `None` writes no `link_layer` file.
    pub fn with_link_layer(mut self, link_layer: Option<LinkLayer>) -> Self {
        self.link_layer = link_layer;
        self
    }

    /// Sets the P_Key table entries (bit 15 included).
    pub fn with_pkeys(mut self, pkeys: impl IntoIterator<Item = u16>) -> Self {
        self.pkeys = pkeys.into_iter().collect();
        self
    }

    /// Pads the P_Key table with zeros up to `len` entries.
    pub fn with_pkey_table_len(mut self, len: u16) -> Self {
        self.pkey_table_len = Some(len);
        self
    }

    /// Sets the port's netdev.
    pub fn with_netdev(mut self, netdev: NetDevSpec) -> Self {
        self.netdev = Some(netdev);
        self
    }

    /// The GUID [`write_host`] gives this port of a device with `node_guid`.
    pub fn port_guid(&self, node_guid: Guid) -> Guid {
        if let Some(g) = self.guid {
            return g;
        }
        if self.link_layer == Some(LinkLayer::Ethernet)
            && let Some(g) = self
                .netdev
                .as_ref()
                .and_then(|n| n.mac.as_deref())
                .and_then(mac_eui64)
        {
            return Guid(g);
        }
        Guid(node_guid.0.wrapping_add(u64::from(self.num)))
    }
}

/// A network interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetDevSpec {
    /// Interface name.
    pub name: String,
    /// `address`. `None` on an IPoIB port netdev: derived from the port GUID
    /// (`00:00:10:49:fe:80:00:00:00:00:00:00:<GUID>`). Required elsewhere.
    pub mac: Option<String>,
    /// `mtu`.
    pub mtu: u32,
    /// `speed` in Mb/s; no file when `None`.
    pub speed_mbps: Option<u32>,
    /// `operstate`.
    pub operstate: OperState,
    /// `type` (ARPHRD: 1 Ethernet, 32 InfiniBand).
    pub arp_type: u16,
    /// PCI address of an interface that is not a port's netdev; `None` puts it under
    /// `sys/devices/virtual/net`. A port's netdev always hangs off its HCA's PCI function.
    pub pci: Option<String>,
    /// Written to the fixture's `addresses` file (one a line) when not empty.
    pub addresses: Vec<String>,
}

impl NetDevSpec {
    /// An IPoIB interface: MTU 4092 (datagram mode on a 4096-byte IB MTU), up, speed unset,
    /// hardware address derived from the port GUID.
    pub fn ipoib(name: impl Into<String>) -> Self {
        NetDevSpec {
            name: name.into(),
            mac: None,
            mtu: 4092,
            speed_mbps: None,
            operstate: OperState::Up,
            arp_type: 32,
            pci: None,
            addresses: Vec::new(),
        }
    }

    /// An Ethernet interface, up.
    pub fn ethernet(
        name: impl Into<String>,
        mac: impl Into<String>,
        speed_mbps: u32,
        mtu: u32,
    ) -> Self {
        NetDevSpec {
            name: name.into(),
            mac: Some(mac.into()),
            mtu,
            speed_mbps: Some(speed_mbps),
            operstate: OperState::Up,
            arp_type: 1,
            pci: None,
            addresses: Vec::new(),
        }
    }

    /// Sets the speed (`None`: no `speed` file).
    pub fn with_speed(mut self, speed_mbps: Option<u32>) -> Self {
        self.speed_mbps = speed_mbps;
        self
    }

    /// Sets `operstate`.
    pub fn with_operstate(mut self, operstate: OperState) -> Self {
        self.operstate = operstate;
        self
    }

    /// Sets the PCI address.
    pub fn with_pci(mut self, pci: impl Into<String>) -> Self {
        self.pci = Some(pci.into());
        self
    }

    /// Sets the IP addresses (`10.0.0.1/24`).
    pub fn with_addresses<S: Into<String>>(
        mut self,
        addresses: impl IntoIterator<Item = S>,
    ) -> Self {
        self.addresses = addresses.into_iter().map(Into::into).collect();
        self
    }
}

/// `0x0002c90300000101` -> `0002:c903:0000:0101`.
fn sysfs_guid(g: Guid) -> String {
    let v = g.0;
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        v >> 48,
        (v >> 32) & 0xffff,
        (v >> 16) & 0xffff,
        v & 0xffff
    )
}

fn ipoib_hw_address(port_guid: Guid) -> String {
    let mut bytes = vec![0x00, 0x00, 0x10, 0x49, 0xfe, 0x80, 0, 0, 0, 0, 0, 0];
    bytes.extend_from_slice(&port_guid.0.to_be_bytes());
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn with_path(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn put(path: &Path, content: &str) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| with_path(parent, e))?;
    }
    fs::write(path, format!("{content}\n")).map_err(|e| with_path(path, e))
}

fn link(target: &str, at: &Path) -> io::Result<()> {
    if let Some(parent) = at.parent() {
        fs::create_dir_all(parent).map_err(|e| with_path(parent, e))?;
    }
    std::os::unix::fs::symlink(target, at).map_err(|e| with_path(at, e))
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// `0002:01:00.0` -> `pci0002:00/0002:01:00.0`, the device's directory under `sys/devices`.
fn pci_rel(pci: &str) -> io::Result<String> {
    let domain = pci
        .split_once(':')
        .map(|(d, _)| d)
        .filter(|d| !d.is_empty() && !pci.contains('/'))
        .ok_or_else(|| invalid(format!("`{pci}` is not a PCI address such as 0000:01:00.0")))?;
    Ok(format!("pci{domain}:00/{pci}"))
}

/// Writes the fixture tree of `spec` under `root` (created if missing; it should be empty).
///
/// Errors name the path that could not be written, or the part of the spec that is
/// incomplete (an Ethernet interface without a MAC).
pub fn write_host(root: &Path, spec: &HostSpec) -> io::Result<()> {
    let sys = root.join("sys");
    put(&root.join("etc/hostname"), &spec.hostname)?;
    for hca in &spec.hcas {
        let rel = pci_rel(&hca.pci)?;
        let pci_dir = sys.join("devices").join(&rel);
        let dev = pci_dir.join("infiniband").join(&hca.name);
        link(
            &format!("../../devices/{rel}/infiniband/{}", hca.name),
            &sys.join("class/infiniband").join(&hca.name),
        )?;
        link(&format!("../../../{}", hca.pci), &dev.join("device"))?;
        put(&dev.join("node_guid"), &sysfs_guid(hca.node_guid))?;
        put(
            &dev.join("sys_image_guid"),
            &sysfs_guid(hca.sys_image_guid.unwrap_or(hca.node_guid)),
        )?;
        put(&dev.join("node_type"), "1: CA")?;
        let desc = hca
            .node_desc
            .clone()
            .unwrap_or_else(|| format!("{} {}", spec.hostname, hca.name));
        put(&dev.join("node_desc"), &desc)?;
        if let Some(fw) = &hca.fw_ver {
            put(&dev.join("fw_ver"), fw)?;
        }
        if let Some(t) = &hca.hca_type {
            put(&dev.join("hca_type"), t)?;
        }
        for port in &hca.ports {
            let guid = port.port_guid(hca.node_guid);
            let p = dev.join("ports").join(port.num.to_string());
            put(
                &p.join("gids/0"),
                &format!("fe80:0000:0000:0000:{}", sysfs_guid(guid)),
            )?;
            put(&p.join("lid"), &format!("0x{:x}", port.lid))?;
            put(&p.join("sm_lid"), &format!("0x{:x}", port.sm_lid))?;
            put(&p.join("state"), &port.state.to_sysfs())?;
            put(&p.join("phys_state"), &port.phys_state.to_sysfs())?;
            if let Some(rate) = &port.rate {
                put(&p.join("rate"), rate)?;
            }
            if let Some(ll) = port.link_layer {
                put(&p.join("link_layer"), ll.as_str())?;
            }
            let len = usize::from(port.pkey_table_len.unwrap_or(0)).max(port.pkeys.len());
            for i in 0..len {
                let key = port.pkeys.get(i).copied().unwrap_or(0);
                put(
                    &p.join("pkeys").join(i.to_string()),
                    &format!("0x{key:04x}"),
                )?;
            }
            if let Some(nd) = &port.netdev {
                let mut nd = nd.clone();
                if nd.mac.is_none() && port.link_layer != Some(LinkLayer::Ethernet) {
                    nd.mac = Some(ipoib_hw_address(guid));
                }
                if port.link_layer == Some(LinkLayer::Ethernet) {
                    put(&p.join("gid_attrs/ndevs/0"), &nd.name)?;
                }
                let dev_port = port.num.saturating_sub(1);
                write_netdev(&sys, &nd, Some((&hca.pci, dev_port)))?;
            }
        }
    }
    for nd in &spec.netdevs {
        let at = nd.pci.as_deref().map(|pci| (pci, 0));
        write_netdev(&sys, nd, at)?;
    }
    if !spec.gpus.is_empty() {
        let json = serde_json::to_string_pretty(&spec.gpus).map_err(io::Error::other)?;
        put(&root.join(GPUS_FILE), &json)?;
    }
    Ok(())
}

fn write_netdev(sys: &Path, nd: &NetDevSpec, pci: Option<(&str, u32)>) -> io::Result<()> {
    let rel = match pci {
        Some((pci, _)) => format!("devices/{}/net/{}", pci_rel(pci)?, nd.name),
        None => format!("devices/virtual/net/{}", nd.name),
    };
    let dir = sys.join(&rel);
    link(
        &format!("../../{rel}"),
        &sys.join("class/net").join(&nd.name),
    )?;
    let mac = nd
        .mac
        .as_deref()
        .ok_or_else(|| invalid(format!("netdev {}: no MAC address given", nd.name)))?;
    put(&dir.join("address"), mac)?;
    put(&dir.join("mtu"), &nd.mtu.to_string())?;
    put(&dir.join("operstate"), nd.operstate.as_str())?;
    put(&dir.join("type"), &nd.arp_type.to_string())?;
    if let Some(speed) = nd.speed_mbps {
        put(&dir.join("speed"), &speed.to_string())?;
    }
    if let Some((pci, dev_port)) = pci {
        link(&format!("../../../{pci}"), &dir.join("device"))?;
        put(&dir.join("dev_port"), &dev_port.to_string())?;
    }
    if !nd.addresses.is_empty() {
        put(&dir.join(ADDRESSES_FILE), &nd.addresses.join("\n"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_texts() {
        assert_eq!(
            sysfs_guid(Guid(0x0002_c903_0000_0101)),
            "0002:c903:0000:0101"
        );
        assert_eq!(
            ipoib_hw_address(Guid(0x0002_c903_0001_0101)),
            "00:00:10:49:fe:80:00:00:00:00:00:00:00:02:c9:03:00:01:01:01"
        );
        assert_eq!(pci_rel("0002:01:00.0").unwrap(), "pci0002:00/0002:01:00.0");
        assert!(pci_rel("eth0").is_err());
    }

    #[test]
    fn default_port_guids() {
        let node = Guid(0x0002_c903_0000_0100);
        assert_eq!(
            PortSpec::infiniband(1).port_guid(node),
            Guid(0x0002_c903_0000_0101)
        );
        let roce = PortSpec::roce(
            1,
            NetDevSpec::ethernet("e", "00:02:c9:02:01:01", 200_000, 9000),
        );
        assert_eq!(roce.port_guid(node), Guid(0x0202_c9ff_fe02_0101));
        assert_eq!(
            PortSpec::infiniband(2).with_guid(Guid(7)).port_guid(node),
            Guid(7)
        );
    }
}
