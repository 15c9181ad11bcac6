//! What discovery reports: the host, its RDMA devices and ports, netdevs and GPUs.

use std::fmt;

use serde::{Deserialize, Serialize};
use weft_fabric::Guid;

/// Everything the agent found on one host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostReport {
    /// The host's name (`/etc/hostname`, or `gethostname(2)` on a live host without one).
    pub hostname: String,
    /// RDMA devices (`/sys/class/infiniband/*`), sorted by name.
    pub rdma: Vec<RdmaDevice>,
    /// Network interfaces (`/sys/class/net/*`), sorted by name.
    pub netdevs: Vec<NetDev>,
    /// GPUs NVML reported; empty where NVML is absent.
    pub gpus: Vec<Gpu>,
}

impl HostReport {
    /// The port GUIDs of every RDMA port, in device then port order.
    ///
    /// This includes RoCE ports, whose "port GUID" is the low half of GID 0 (the
    /// EUI-64 of the netdev's MAC); use [`HostReport::fabric_ports`] for the InfiniBand
    /// end ports that can be named in `partitions.conf`.
    pub fn port_guids(&self) -> Vec<Guid> {
        self.rdma
            .iter()
            .flat_map(|d| d.ports.iter().map(|p| p.port_guid))
            .collect()
    }

    /// The RDMA device and port whose port GUID is `guid`.
    pub fn port(&self, guid: Guid) -> Option<(&RdmaDevice, &RdmaPort)> {
        self.rdma
            .iter()
            .find_map(|d| d.ports.iter().find(|p| p.port_guid == guid).map(|p| (d, p)))
    }

    /// The RoCE ports (link layer Ethernet) of every RDMA device, with their device, in
    /// device then port order: what a DGX Spark has instead of InfiniBand ports. They have
    /// no LID and no partition; a controller shows them, it does not place them.
    pub fn roce_ports(&self) -> Vec<(&RdmaDevice, &RdmaPort)> {
        self.rdma
            .iter()
            .flat_map(|d| d.ports.iter().map(move |p| (d, p)))
            .filter(|(_, p)| p.link_layer == LinkLayer::Ethernet)
            .collect()
    }

    /// The NICs on a PCI function (RoCE netdevs, IPoIB, the management port), in name
    /// order; loopback and other virtual interfaces (no PCI address) are left out.
    pub fn data_nics(&self) -> Vec<&NetDev> {
        self.netdevs
            .iter()
            .filter(|n| n.pci.is_some() && n.arp_type != NetDev::ARPHRD_LOOPBACK)
            .collect()
    }

    /// The netdev named `name`.
    pub fn netdev(&self, name: &str) -> Option<&NetDev> {
        self.netdevs.iter().find(|n| n.name == name)
    }

    /// The MTU of `port`'s first netdev (IPoIB `ib0`, or the RoCE interface), in bytes.
    /// The kernel writes no active-MTU file under a port (only the verbs query has it),
    /// so the netdev's `mtu` is the nearest sysfs has; `None` where the port has no
    /// netdev.
    pub fn port_mtu(&self, port: &RdmaPort) -> Option<u32> {
        port.netdevs
            .iter()
            .find_map(|n| self.netdev(n))
            .map(|n| n.mtu)
    }

    /// The InfiniBand ports of CA devices, in the fabric model's terms (what a controller
    /// merges into its [`weft_fabric::Inventory`]). Ethernet (RoCE) ports are left out: they
    /// have no LID and are not members of InfiniBand partitions.
    pub fn fabric_ports(&self) -> Vec<weft_fabric::Port> {
        let mut out = Vec::new();
        for d in &self.rdma {
            if d.node_type != NodeType::Ca {
                continue;
            }
            for p in &d.ports {
                if p.link_layer != LinkLayer::InfiniBand {
                    continue;
                }
                // InfiniBand port numbers are 1..=254; a larger one is not an IB end port.
                let Ok(port_num) = u8::try_from(p.num) else {
                    continue;
                };
                out.push(weft_fabric::Port {
                    node_guid: d.node_guid,
                    port_guid: p.port_guid,
                    port_num,
                    lid: p.lid,
                    node_type: weft_fabric::NodeType::Ca,
                    node_desc: d.node_desc.clone(),
                    pkey_capacity: p.pkey_table_len,
                });
            }
        }
        out
    }
}

/// One RDMA device (`/sys/class/infiniband/<name>`): an HCA, or one PCI function of one.
///
/// A DGX Spark's ConnectX-7 shows each QSFP port as two devices (`rocep1s0f0` and
/// `roceP2p1s0f0`, one per PCIe x4 half); they share `sys_image_guid`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaDevice {
    /// Device name, for example `mlx5_0` or `rocep1s0f0`.
    pub name: String,
    /// `node_guid`.
    pub node_guid: Guid,
    /// `sys_image_guid`: equal for the devices of one adapter.
    pub sys_image_guid: Guid,
    /// `node_type` (`1: CA`).
    pub node_type: NodeType,
    /// `node_desc`, for example `node1 mlx5_0` (what OpenSM and `ibnetdiscover` show).
    pub node_desc: String,
    /// `fw_ver`, where the driver has it.
    pub fw_ver: Option<String>,
    /// `hca_type` (`MT4129` for ConnectX-7), where the driver has it.
    pub hca_type: Option<String>,
    /// Ports, sorted by number.
    pub ports: Vec<RdmaPort>,
}

/// One port of an RDMA device (`ports/<num>/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaPort {
    /// Port number, from 1.
    pub num: u32,
    /// The low 64 bits of `gids/0`: the port GUID on InfiniBand; on RoCE the EUI-64 of
    /// the netdev's MAC (derived from the MAC where the GID table is empty, as it is
    /// while the netdev is down).
    pub port_guid: Guid,
    /// `lid` (0 on RoCE, and before an SM assigned one).
    pub lid: u16,
    /// `sm_lid`: the LID of the master SM (0 on RoCE).
    pub sm_lid: u16,
    /// `state` (`4: ACTIVE`).
    pub state: PortState,
    /// `phys_state` (`5: LinkUp`).
    pub phys_state: PhysState,
    /// The rate in Gb/s, parsed from `rate`; `None` where the file is absent or unreadable
    /// (the kernel refuses to read it while the speed is unknown).
    pub rate_gbps: Option<f64>,
    /// `rate` as written, for example `400 Gb/sec (4X NDR)`.
    pub rate_text: Option<String>,
    /// `link_layer`; InfiniBand where the file is absent (older kernels, ibsim).
    pub link_layer: LinkLayer,
    /// Non-zero entries of the P_Key table (`pkeys/<i>`), in index order, bit 15 (full
    /// membership) included: `0xffff`, `0x8a0a`.
    pub pkeys: Vec<u16>,
    /// Length of the P_Key table (number of `pkeys/<i>` files, zeros included).
    pub pkey_table_len: u16,
    /// Netdevs of this port (`ib0`, `enp1s0f0np0`; IPoIB child interfaces too), sorted.
    pub netdevs: Vec<String>,
}

/// A network interface (`/sys/class/net/<name>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetDev {
    /// Interface name.
    pub name: String,
    /// `address`: 6 bytes on Ethernet, 20 on IPoIB.
    pub mac: String,
    /// `mtu` in bytes.
    pub mtu: u32,
    /// `speed` in Mb/s; `None` where unknown (`-1`, unreadable while down, absent).
    pub speed_mbps: Option<u32>,
    /// `operstate`.
    pub operstate: OperState,
    /// `type`: the ARPHRD number (1 Ethernet, 32 InfiniBand, 772 loopback).
    pub arp_type: u16,
    /// PCI address of the device (`0000:01:00.0`); `None` for virtual interfaces.
    pub pci: Option<String>,
    /// The RDMA device whose port this netdev belongs to.
    pub rdma_device: Option<String>,
    /// IP addresses with prefix length (`192.168.100.10/24`). From `getifaddrs(3)` on a
    /// live host; from the optional `addresses` file (one a line) in a fixture.
    pub addresses: Vec<String>,
}

impl NetDev {
    /// `type` of an Ethernet interface.
    pub const ARPHRD_ETHER: u16 = 1;
    /// `type` of an IPoIB interface.
    pub const ARPHRD_INFINIBAND: u16 = 32;
    /// `type` of the loopback interface.
    pub const ARPHRD_LOOPBACK: u16 = 772;

    /// The link layer the interface's `type` names: Ethernet, InfiniBand (IPoIB), or
    /// Unknown for anything else.
    pub fn link_layer(&self) -> LinkLayer {
        match self.arp_type {
            Self::ARPHRD_ETHER => LinkLayer::Ethernet,
            Self::ARPHRD_INFINIBAND => LinkLayer::InfiniBand,
            _ => LinkLayer::Unknown,
        }
    }
}

/// A GPU NVML reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// NVML device index.
    pub index: u32,
    /// Product name, for example `NVIDIA H200` or `NVIDIA GB10`.
    pub name: String,
    /// `GPU-...` UUID.
    pub uuid: Option<String>,
    /// Total memory in bytes; `None` where NVML does not report it (GB10's unified memory).
    pub memory_total_bytes: Option<u64>,
    /// PCI address in sysfs form (`0000:01:00.0`).
    pub pci: Option<String>,
}

/// `node_type` of an RDMA device (kernel `node_type_show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeType {
    /// `1: CA`
    Ca,
    /// `2: switch`
    Switch,
    /// `3: router`
    Router,
    /// `4: RNIC` (iWARP)
    Rnic,
    /// `5: usNIC`
    Usnic,
    /// `6: usNIC UDP`
    UsnicUdp,
    /// `7: unspecified` (software devices such as rxe report CA; some report this)
    Unspecified,
    /// A code this crate does not know.
    Other(u8),
}

/// Logical port state (kernel `state_show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortState {
    /// `0: NOP`
    Nop,
    /// `1: DOWN`
    Down,
    /// `2: INIT`: link up, waiting for the SM.
    Init,
    /// `3: ARMED`
    Armed,
    /// `4: ACTIVE`
    Active,
    /// `5: ACTIVE_DEFER`
    ActiveDefer,
    /// A code this crate does not know.
    Other(u8),
}

/// Physical port state (kernel `phys_state_show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhysState {
    /// `1: Sleep`
    Sleep,
    /// `2: Polling`: no peer (no cable, or the other end is down).
    Polling,
    /// `3: Disabled`
    Disabled,
    /// `4: PortConfigurationTraining`
    PortConfigurationTraining,
    /// `5: LinkUp`
    LinkUp,
    /// `6: LinkErrorRecovery`
    LinkErrorRecovery,
    /// `7: Phy Test`
    PhyTest,
    /// A code this crate does not know (`0: <unknown>` included).
    Other(u8),
}

/// `link_layer` of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LinkLayer {
    /// `InfiniBand`
    InfiniBand,
    /// `Ethernet` (RoCE)
    Ethernet,
    /// `Unknown`
    Unknown,
}

/// `operstate` of a netdev (RFC 2863 words, as the kernel writes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OperState {
    /// `unknown` (loopback, many virtual devices)
    Unknown,
    /// `notpresent`
    NotPresent,
    /// `down`
    Down,
    /// `lowerlayerdown`
    LowerLayerDown,
    /// `testing`
    Testing,
    /// `dormant`
    Dormant,
    /// `up`
    Up,
}

/// The names a coded sysfs value (`<code>: <name>`) may carry for each code.
trait Coded: Sized + Copy {
    /// Known codes and their names, as the kernel writes them.
    const TABLE: &'static [(u8, &'static str)];
    fn from_code(code: u8) -> Self;
    fn code(self) -> u8;
}

macro_rules! coded {
    ($ty:ident, $other:ident, [$(($code:literal, $name:literal, $var:ident)),* $(,)?]) => {
        impl Coded for $ty {
            const TABLE: &'static [(u8, &'static str)] = &[$(($code, $name)),*];
            fn from_code(code: u8) -> Self {
                match code {
                    $($code => $ty::$var,)*
                    other => $ty::$other(other),
                }
            }
            fn code(self) -> u8 {
                match self {
                    $($ty::$var => $code,)*
                    $ty::$other(c) => c,
                }
            }
        }

        impl $ty {
            /// Parses the sysfs text `<code>: <name>`. An unknown code gives the
            /// catch-all variant; a known code with another name is refused.
            pub fn parse_sysfs(text: &str) -> Result<Self, SysfsError> {
                parse_coded::<$ty>(text)
            }

            /// The sysfs text, `<code>: <name>` (what [`Self::parse_sysfs`] reads).
            pub fn to_sysfs(self) -> String {
                let code = self.code();
                let name = <$ty as Coded>::TABLE
                    .iter()
                    .find(|(c, _)| *c == code)
                    .map_or("<unknown>", |(_, n)| *n);
                format!("{code}: {name}")
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_sysfs())
            }
        }
    };
}

coded!(
    NodeType,
    Other,
    [
        (1, "CA", Ca),
        (2, "switch", Switch),
        (3, "router", Router),
        (4, "RNIC", Rnic),
        (5, "usNIC", Usnic),
        (6, "usNIC UDP", UsnicUdp),
        (7, "unspecified", Unspecified),
    ]
);

coded!(
    PortState,
    Other,
    [
        (0, "NOP", Nop),
        (1, "DOWN", Down),
        (2, "INIT", Init),
        (3, "ARMED", Armed),
        (4, "ACTIVE", Active),
        (5, "ACTIVE_DEFER", ActiveDefer),
    ]
);

coded!(
    PhysState,
    Other,
    [
        (1, "Sleep", Sleep),
        (2, "Polling", Polling),
        (3, "Disabled", Disabled),
        (4, "PortConfigurationTraining", PortConfigurationTraining),
        (5, "LinkUp", LinkUp),
        (6, "LinkErrorRecovery", LinkErrorRecovery),
        (7, "Phy Test", PhyTest),
    ]
);

/// Why a sysfs word or `<code>: <name>` text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysfsError {
    #[error("expected `<number>: <name>`, for example `4: ACTIVE`")]
    NotCoded,
    #[error("`{0}` is not a number from 0 to 255")]
    NotACode(String),
    #[error("no name after the number")]
    NoName,
    /// A known code under another name.
    #[error("code {code} is `{known}`, but the text says `{name}`")]
    NameMismatch {
        code: u8,
        known: &'static str,
        name: String,
    },
    /// A word that is none of those listed.
    #[error("expected {0}")]
    NotOneOf(&'static str),
}

fn parse_coded<T: Coded>(text: &str) -> Result<T, SysfsError> {
    let Some((code, name)) = text.split_once(':') else {
        return Err(SysfsError::NotCoded);
    };
    let code: u8 = code
        .trim()
        .parse()
        .map_err(|_| SysfsError::NotACode(code.trim().to_string()))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(SysfsError::NoName);
    }
    if let Some((_, known)) = T::TABLE.iter().find(|(c, _)| *c == code)
        && !known.eq_ignore_ascii_case(name)
    {
        return Err(SysfsError::NameMismatch {
            code,
            known,
            name: name.to_string(),
        });
    }
    Ok(T::from_code(code))
}

impl LinkLayer {
    /// Parses `InfiniBand`, `Ethernet` or `Unknown`.
    pub fn parse_sysfs(text: &str) -> Result<Self, SysfsError> {
        match text {
            "InfiniBand" => Ok(LinkLayer::InfiniBand),
            "Ethernet" => Ok(LinkLayer::Ethernet),
            "Unknown" => Ok(LinkLayer::Unknown),
            _ => Err(SysfsError::NotOneOf(
                "`InfiniBand`, `Ethernet` or `Unknown`",
            )),
        }
    }

    /// The sysfs word.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Unknown => "Unknown",
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl OperState {
    const ALL: [(OperState, &'static str); 7] = [
        (OperState::Unknown, "unknown"),
        (OperState::NotPresent, "notpresent"),
        (OperState::Down, "down"),
        (OperState::LowerLayerDown, "lowerlayerdown"),
        (OperState::Testing, "testing"),
        (OperState::Dormant, "dormant"),
        (OperState::Up, "up"),
    ];

    /// Parses the kernel's word (`up`, `down`, `lowerlayerdown`, ...).
    pub fn parse_sysfs(text: &str) -> Result<Self, SysfsError> {
        Self::ALL
            .iter()
            .find(|(_, w)| *w == text)
            .map(|(s, _)| *s)
            .ok_or(SysfsError::NotOneOf(
                "one of unknown, notpresent, down, lowerlayerdown, testing, dormant, up",
            ))
    }

    /// The kernel's word.
    pub fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(s, _)| *s == self)
            .map_or("unknown", |(_, w)| *w)
    }
}

impl fmt::Display for OperState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coded_values_round_trip() {
        for s in [
            PortState::Nop,
            PortState::Down,
            PortState::Init,
            PortState::Armed,
            PortState::Active,
            PortState::ActiveDefer,
            PortState::Other(9),
        ] {
            assert_eq!(PortState::parse_sysfs(&s.to_sysfs()), Ok(s));
        }
        assert_eq!(
            PhysState::parse_sysfs("7: Phy Test"),
            Ok(PhysState::PhyTest)
        );
        assert_eq!(
            PhysState::parse_sysfs("0: <unknown>"),
            Ok(PhysState::Other(0))
        );
        assert_eq!(
            NodeType::parse_sysfs("6: usNIC UDP"),
            Ok(NodeType::UsnicUdp)
        );
        assert_eq!(PortState::parse_sysfs("4: active"), Ok(PortState::Active));
    }

    #[test]
    fn coded_values_refuse_bad_text() {
        assert!(PortState::parse_sysfs("ACTIVE").is_err());
        assert!(PortState::parse_sysfs("four: ACTIVE").is_err());
        assert!(PortState::parse_sysfs("4:").is_err());
        assert!(PortState::parse_sysfs("300: X").is_err());
        let e = PortState::parse_sysfs("4: DOWN").unwrap_err();
        assert_eq!(
            e,
            SysfsError::NameMismatch {
                code: 4,
                known: "ACTIVE",
                name: "DOWN".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "code 4 is `ACTIVE`, but the text says `DOWN`"
        );
        assert_eq!(
            PortState::parse_sysfs("four: ACTIVE")
                .unwrap_err()
                .to_string(),
            "`four` is not a number from 0 to 255"
        );
    }

    #[test]
    fn words() {
        assert_eq!(
            OperState::parse_sysfs("lowerlayerdown"),
            Ok(OperState::LowerLayerDown)
        );
        assert!(OperState::parse_sysfs("UP").is_err());
        assert_eq!(OperState::Dormant.as_str(), "dormant");
        assert_eq!(LinkLayer::parse_sysfs("Ethernet"), Ok(LinkLayer::Ethernet));
        assert!(LinkLayer::parse_sysfs("ethernet").is_err());
    }
}
