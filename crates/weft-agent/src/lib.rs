//! What a host brings to a weft cluster, as the host itself sees it: its RDMA devices and
//! ports (GUIDs, LIDs, states, rates, P_Key tables, link layer), its network interfaces
//! (MAC, MTU, speed, PCI address, which RDMA port each belongs to, IP addresses) and its
//! GPUs (through NVML, opened at run time). [`discover`] reads it all from a sysfs tree
//! rooted anywhere: `/` on a live host, a fixture directory in tests ([`fixtures`] writes
//! those). It is not for decisions (which rail to use, whether a link is degraded, which
//! partition a port joins: `weft doctor` and the controller decide with this report), and
//! it does no networking yet: the `weft agent` service that sends the report to a
//! controller comes later. Nothing here needs root or writes anything on the host.
//!
//! ```
//! use weft_agent::fixtures::{HcaSpec, HostSpec, NetDevSpec, PortSpec, write_host};
//! use weft_agent::{LinkLayer, PortState, discover};
//! use weft_fabric::Guid;
//!
//! // A host whose HCA matches ibsim's `caguid=0x0002c90300000100` (port GUID = node GUID + 1).
//! let spec = HostSpec::new("node1").with_hca(
//!     HcaSpec::new("mlx5_0", Guid(0x0002_c903_0000_0100), "0000:01:00.0").with_port(
//!         PortSpec::infiniband(1)
//!             .with_lid(3)
//!             .with_pkeys([0xffff, 0x8a0a])
//!             .with_netdev(NetDevSpec::ipoib("ib0")),
//!     ),
//! );
//! let dir = tempfile::tempdir().unwrap();
//! write_host(dir.path(), &spec).unwrap();
//!
//! let report = discover(dir.path()).unwrap();
//! assert_eq!(report.hostname, "node1");
//! assert_eq!(report.port_guids(), [Guid(0x0002_c903_0000_0101)]);
//! let port = &report.rdma[0].ports[0];
//! assert_eq!((port.lid, port.state, port.link_layer), (3, PortState::Active, LinkLayer::InfiniBand));
//! assert_eq!(port.rate_gbps, Some(400.0));
//! assert_eq!(port.pkeys, [0xffff, 0x8a0a]);
//! assert_eq!(report.netdev("ib0").unwrap().rdma_device.as_deref(), Some("mlx5_0"));
//! ```
//!
//! On a live host, `discover(Path::new("/"))` does the same and also asks the OS for the
//! host name (where `/etc/hostname` is missing), the IP addresses (`getifaddrs`) and the
//! GPUs (NVML; none, without error, where `libnvidia-ml.so.1` is absent).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod discover;
mod error;
pub mod fixtures;
mod gpu;
mod host;
mod types;

pub use discover::{ADDRESSES_FILE, DEVICE_PCI_FILE, GPUS_FILE, discover};
pub use error::DiscoverError;
pub use gpu::{NVIDIA_SMI_ARGS, NVML_LIBRARY, nvml_gpus, parse_nvidia_smi};
pub use host::local_addresses;
pub use types::{
    Gpu, HostReport, LinkLayer, NetDev, NodeType, OperState, PhysState, PortState, RdmaDevice,
    RdmaPort, SysfsError,
};
