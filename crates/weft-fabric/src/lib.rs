//! The fabric model of weft's InfiniBand partition manager: pure data and rules, no I/O.
//!
//! It is for: inventory types ([`Guid`], [`PKey`], [`Port`], [`Inventory`]); the
//! operator's [`FabricPlan`] (tenants owning partitions, read from TOML, or imported from a
//! partitions.conf with [`FabricPlan::import`], losslessly); [`compile`], which
//! checks isolation invariants and allocates P_Keys; OpenSM 3.3.23's `partitions.conf`
//! grammar ([`conf::parse`], strict where OpenSM is lenient, and [`conf::render`]); and
//! [`expected_tables`], the P_Key tables OpenSM will program, to compare with what
//! the ports show; [`removals`], what a new file takes away. It is not for: reading sysfs, talking to OpenSM, writing files or
//! keeping time; the OpenSM driver and the controller do that with what this crate decides.
//!
//! ```
//! use weft_fabric::{FabricPlan, compile, conf};
//!
//! let plan = FabricPlan::from_toml(r#"
//!     [[partition]]
//!     name = "tenantA"
//!     tenant = "alice"
//!     pkey = "0x0a0a"
//!     members = [ { guid = "0x0002c90300000101" }, { guid = "0x0002c90300000201", membership = "limited" } ]
//! "#).unwrap();
//! let compiled = compile(&plan, None).unwrap();
//! let text = conf::render(&compiled.conf);
//! assert!(text.contains("Default=0x7fff,ipoib : ALL=limited, SELF=full ;"));
//! assert!(text.contains("tenantA=0x0a0a : 0x0002c90300000101=full, 0x0002c90300000201=limited ;"));
//! assert_eq!(conf::parse(&text).unwrap(), compiled.conf);
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod alloc;
mod compile;
pub mod conf;
mod guard;
mod import;
mod mcast;
mod plan;
mod tables;
mod types;

pub use alloc::{DEFAULT_PARTITION, is_reserved_name, lowest_free_pkey};
pub use compile::{Compiled, Violation, compile};
pub use guard::{Removal, removals};
pub use import::{
    ImportOptions, Imported, KeysError, auto_keyed, keyless_empty, keys_from_tables, live_keyed,
};
pub use mcast::{McastRecord, expected_mcast, expected_mcast_after, mgid_refusal, mgid_scopes};
pub use plan::{
    DefaultPartition, DefaultPolicy, FabricPlan, Group, PlanError, PlanMember, PlanPartition,
};
pub use tables::{
    ExpectedTables, ObservedTables, PortMismatch, SmOptions, expected_index0, expected_tables,
};
pub use types::{FabricError, Guid, Inventory, Membership, NodeType, PKey, Port};
