//! Test-only infrastructure: a real OpenSM driving an ibsim simulated InfiniBand fabric, and
//! a real OpenSSH server ([`Sshd`]) for code that reaches hosts over SSH.
//!
//! This crate is for weft's integration tests and the xtask demo. It starts `ibsim` (package
//! `ibsim-utils`) on a generated topology, attaches real `opensm` processes and the
//! infiniband-diags tools to it through the `libumad2sim.so` preload, and cleans all of it up
//! on drop. It is **not** for production: it is never linked into a shipped binary, it shells
//! out to Debian's `opensm`/`ibsim`/diag binaries, and it assumes a Linux host where those are
//! installed (no IB hardware or kernel modules needed).
//!
//! Each [`SimFabric`] has its own scratch dir and its own `IBSIM_SOCKNAME`, so fabrics in
//! parallel tests do not see each other. ibsim accepts at most 10 attached clients at a time
//! (every SM and every running diag tool counts); [`SimFabric::diag`] retries briefly when
//! refused.
//!
//! ```no_run
//! use std::time::Duration;
//! use weft_testbed::{SimFabric, SmSpec, Topology};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let topo = Topology::single_switch(4);
//! let mut fabric = SimFabric::start(&topo)?;
//! let parts = fabric.dir().join("partitions.conf");
//! std::fs::write(&parts, "Default=0x7fff, ipoib : ALL=full ;\n")?;
//! let sm = fabric.start_sm(SmSpec::new("sm1", "smhost", 10, &parts))?; // waits for SUBNET UP
//! // P_Key table of node1 port 1, addressed by port GUID (smpquery resolves it via the SA).
//! let guid = format!("{:#018x}", topo.port_guid("node1", 1).unwrap());
//! let table = fabric.diag("smhost", "smpquery", &["-G", "pkeys", &guid, "1"])?;
//! assert!(table.contains("0xffff"));
//! fabric.wait_master("node1", &sm.name, Duration::from_secs(5))?;
//! # Ok(()) }
//! // Dropping `fabric` stops opensm and ibsim and removes the scratch dir.
//! ```
//!
//! Facts about the simulation worth knowing (verified with opensm 3.3.23, ibsim 0.10,
//! infiniband-diags 44):
//! * SA queries that return more records than fit into one MAD are **truncated to the first
//!   MAD** (umad2sim does no RMPP): `saquery NR` without a LID returns one NodeRecord (the
//!   requester's own), `saquery --smkey 1 PKTR` without a LID returns two PKeyTableRecords,
//!   and name lookups such as `saquery -l <name>` come back empty. Query per LID
//!   (`saquery NR <lid>`, `saquery --smkey 1 PKTR <lid>` = both 32-entry blocks of a 64-entry
//!   HCA table), address by GUID (`smpquery -G pkeys <port_guid> <port>`), or take the LIDs
//!   from the SM's `opensm-subnet.lst` / `cache/guid2lid` or from `ibnetdiscover`.
//! * `saquery PKTR` needs `--smkey 1` (trusted request).
//! * The SA only answers about nodes that share a P_Key with the requester: with
//!   `Default=0x7fff : ALL=limited, SELF=full`, a limited-only node gets nothing for other
//!   limited nodes. Query from the SM host (`smhost`, a full member) to see everything.
//! * A diag tool waiting for an SA that is gone hangs; every call here is bounded.

#![forbid(unsafe_code)]

mod error;
mod fabric;
pub mod partitions;
mod postgres;
mod sadump;
mod sshd;
mod topology;

pub use error::TestbedError;
pub use fabric::{
    DEFAULT_UMAD2SIM, DiscoveredPort, ENTERING_STANDBY, KEEP_ENV, SUBNET_UP, SimFabric, SmHandle,
    SmInfo, SmSpec, parse_ibnetdiscover_ports, wait_for_log,
};
/// Signals for [`SimFabric::kill_sm`] (re-exported from `nix`).
pub use nix::sys::signal::Signal;
pub use postgres::{PG_BIN, Postgres};
pub use sadump::{DumpedGroup, parse_sa_dump_groups};
pub use sshd::{SSHD, Sshd, SshdOptions};
pub use topology::{
    GUID_PREFIX, SM_HOST, SM_HOST2, SimHca, SimSwitch, Topology, hca_node_guid, sm_host_node_guid,
    switch_node_guid,
};
