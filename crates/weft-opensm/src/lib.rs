//! The OpenSM driver: applies a partitions config that the fabric model has already
//! validated to one or more OpenSM subnet managers, and proves it landed.
//!
//! It owns the mechanics and none of the policy: atomic writes of `partitions.conf`
//! on each SM host, checksums compared between primary and standby, the reread
//! (SIGHUP, which makes OpenSM run a heavy sweep), waiting for that sweep in the SM's
//! log rather than sleeping, reading every end port's P_Key table back (with one
//! in-process SMP client, [`SmpReader`], or the diagnostic tools when it cannot attach),
//! and restoring the previous file when anything fails. What the
//! partitions should be is decided by `weft-fabric`; this crate never edits a config.
//!
//! ```no_run
//! use std::time::Duration;
//! use weft_opensm::{Applier, DiagTools, LocalSm};
//! # fn demo(conf: weft_fabric::conf::Conf, primary: LocalSm, standby: LocalSm) -> Result<(), weft_opensm::ApplyError> {
//! let applier = Applier {
//!     sms: vec![Box::new(primary), Box::new(standby)],
//!     diag: DiagTools::default(),
//!     sm_options: Default::default(),
//!     verify_scope: Default::default(),
//!     sweep_timeout: Duration::from_secs(5),
//!     verify_timeout: Duration::from_secs(5),
//! };
//! let before = applier.diag.snapshot()?;
//! let report = applier.apply(&conf, &before)?;
//! println!("{} ports verified in {:.0} ms", report.ports_verified, report.total_ms);
//! # Ok(()) }
//! ```

// The umad transport's two ioctls are the crate's only unsafe code (see `umad.rs`).
#![deny(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod apply;
mod diag;
pub mod master;
mod owner;
mod process;
mod sm;
mod smp;
mod ssh;
#[allow(unsafe_code)]
mod umad;

pub use apply::{Applier, ApplyError, ApplyReport, SmState, Verification, VerifyScope};
pub use diag::{
    DiagError, DiagTools, FabricSnapshot, TableReader, TablesRead, parse_ibnetdiscover,
    parse_sminfo, parse_smpquery_pkeys,
};
pub use owner::{
    FENCE_PREFIX, Fence, FenceRefusal, OWNER_PREFIX, Stamp, owner_of, stamp_of, with_owner,
    with_owner_stamped,
};
pub use process::{Invocation, ProcessError, run_bounded, run_bounded_bytes};
pub use sm::{LocalSm, SmError, SmHost, SmLock, checksum, lock_file_name, write_atomically};
pub use smp::{PkeyTable, SmpError, SmpPath, SmpReader};
pub use ssh::{RemotePaths, SshConfig, SshSm, shell_quote};
