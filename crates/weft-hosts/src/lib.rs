//! Reaching the hosts of a cluster and knowing them: the one place in weft that does.
//!
//! * [`runner`]: [`runner::HostRunner`], one implementation per way of reaching a host
//!   (this machine, `ip netns exec`, `ssh -o BatchMode=yes`), every run bounded; host lists
//!   (`a,b`, `netns:ns1`, `ssh:node1`) parsed once.
//! * [`facts`]: what a host says about itself (the agent's discovery report, default routes,
//!   its clock, its `NCCL_*`/`WEFT_*` settings), gathered on the host.
//! * [`remote`]: weft's hidden helpers run on a host and read back as JSON; the facts of
//!   every host at once.
//! * [`roles`]: which interface carries management and which data, decided for a set of
//!   hosts together ([`roles::roles_for`]), so that `weft doctor`, `weft bench` and
//!   `weft run` on the same hosts and flags choose the same interfaces.
//! * [`ssh_pairs`]: can every host reach every other over SSH without a prompt?
//! * [`each`]: "run this on every host at once", the one scoped-thread loop.
//!
//! It knows no benchmark, job or fabric: weft-bench, weft-launch and the `weft` binary build
//! on it.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod each;
pub mod facts;
pub mod remote;
pub mod roles;
pub mod runner;
pub mod ssh_pairs;

pub use each::{each_at_most, each_host};
pub use facts::HostFacts;
pub use roles::{IfChoice, MgmtSource, Roles, roles_for};
pub use runner::HostRunner;

/// Errors of reaching a host or reading what it said. Messages name the host and the input.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// Bad input: a host list, an interface list.
    #[error("{0}")]
    Usage(String),
    /// Running a command on a host failed, or what it printed could not be read.
    #[error("host {host}: {msg}")]
    Host { host: String, msg: String },
}
