//! The controller's state behind the [`Store`] trait, and its SQLite implementation.
//!
//! Every method is one transaction: a change to the desired state, the operation it
//! creates and its audit line commit together or not at all, so a controller killed at
//! any point restarts with a consistent store. The audit table is append-only (SQLite
//! triggers refuse UPDATE and DELETE). Tokens and secrets are kept only as SHA-256 hashes.
//!
//! The schema is the `.sql` files in `store/migrations/`, applied in order and counted in
//! `PRAGMA user_version`; after them the tables are:
//!
//! | table | rows |
//! |---|---|
//! | `meta` | `desired_generation`, `applied_generation`, `applied_checksum`, `applied_conf` |
//! | `api_tokens` | hash, role (`admin`/`tenant`), tenant |
//! | `enrollments` | one-time enrollment token hashes, optional server binding, expiry, use |
//! | `servers` | name, agent secret hash, enrolled, last_seen, hash of the last report |
//! | `ports` | port GUID (primary key: one owner), server, device, port number, LID, state |
//! | `claims` | GUIDs a server reported that another owns: pending / approved / rejected |
//! | `tenants`, `groups` | groups own a fixed P_Key base and belong to one tenant |
//! | `members` | server (primary key: at most one group) → group |
//! | `operations` | each change: generation, pending/applied, attempts, last error, diff |
//! | `audit` | at, actor, action, subject, diff, outcome, detail |
//!
//! A PostgreSQL store would implement the same trait with the same transactions.
//!
//! Layout: this file is the trait and the types it speaks; [`rules`] holds the decisions
//! a change makes (a group's name and P_Key, what a move does to membership) as pure
//! functions, over weft-fabric's allocator and reserved names; `sqlite/` is the SQLite
//! implementation, one file per concern (tokens, tenants, servers and their reports,
//! groups and changes, operations, audit, leases).

use std::collections::BTreeMap;

use weft_fabric::Guid;

use crate::auth::{Principal, Role};
use crate::model::{
    AuditEntry, ClaimView, GroupView, OperationView, ReportAck, ServerView, StatusView, TenantView,
    TokenView,
};
use crate::render::Desired;

pub mod rules;
mod sqlite;

pub use sqlite::SqliteStore;

/// Why a store call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The change contradicts the current state.
    #[error("{0}")]
    Conflict(String),
    /// The change would make an invalid config.
    #[error("{0}")]
    Invalid(String),
    /// A token that is unknown, used or expired.
    #[error("{0}")]
    Refused(String),
    /// The database itself.
    #[error("database: {0}")]
    Db(#[from] rusqlite::Error),
}

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A change to the desired state; each one is an operation with an audit line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new group (a new partition with a fresh P_Key) of a tenant.
    CreateGroup { name: String, tenant: String },
    /// Put a server that is in no group into a group.
    AddMember { group: String, server: String },
    /// Take a server out of a group.
    RemoveMember { group: String, server: String },
    /// Move a server from its group to another, in one step.
    Move { server: String, to: String },
    /// Delete a group; its servers are in no group afterwards.
    DeleteGroup { group: String },
    /// Give a claimed GUID to the server that reported it.
    ApproveClaim { id: i64 },
}

impl Change {
    fn describe(&self) -> (&'static str, String) {
        match self {
            Change::CreateGroup { name, tenant } => {
                ("group.create", format!("{name} (tenant {tenant})"))
            }
            Change::AddMember { group, server } => ("group.add", format!("{server} -> {group}")),
            Change::RemoveMember { group, server } => {
                ("group.remove", format!("{server} from {group}"))
            }
            Change::Move { server, to } => ("group.move", format!("{server} -> {to}")),
            Change::DeleteGroup { group } => ("group.delete", group.clone()),
            Change::ApproveClaim { id } => ("claim.approve", format!("claim {id}")),
        }
    }
}

/// One InfiniBand port an agent reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedPort {
    /// Port GUID.
    pub guid: Guid,
    /// Device name.
    pub device: String,
    /// Port number.
    pub num: u32,
    /// LID.
    pub lid: u16,
    /// State.
    pub state: String,
}

/// What was last delivered and verified.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Applied {
    /// Its generation.
    pub generation: i64,
    /// Checksum of the file.
    pub checksum: Option<String>,
    /// The file.
    pub conf: Option<String>,
}

/// What a report did to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOutcome {
    /// What the agent is told.
    pub ack: ReportAck,
    /// Whether the desired state changed (a member's ports changed).
    pub desired_changed: bool,
}

/// A generation delivered to the SMs and verified on the ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedDelivery<'a> {
    /// The desired generation it carries.
    pub generation: i64,
    /// Checksum of the file written.
    pub checksum: &'a str,
    /// The file written.
    pub conf: &'a str,
    /// What the delivery did, for the audit lines.
    pub detail: &'a str,
    /// What it could not verify (ports not on the fabric); kept on each operation.
    pub warning: Option<&'a str>,
}

/// One line for the append-only audit log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditLine<'a> {
    /// Who did it: `controller`, `admin:<id>`, `tenant:<name>:<id>`, `agent:<host>`.
    pub actor: &'a str,
    /// What kind of thing happened (`group.move`, `apply`, `drift`...).
    pub action: &'a str,
    /// What it happened to.
    pub subject: &'a str,
    /// A partitions-file diff, or empty.
    pub diff: &'a str,
    /// How it ended (`ok`, `accepted`, `refused`, `failed`...).
    pub outcome: &'a str,
    /// Anything else worth reading.
    pub detail: &'a str,
}

/// The controller's state. Every method is one transaction.
pub trait Store: Send + Sync + 'static {
    /// Makes `hash` the bootstrap admin token (the controller's `WEFT_ADMIN_TOKEN`);
    /// every other bootstrap token is revoked (rotation), with an audit line.
    fn bootstrap_admin(&self, hash: &str, now: u64) -> Result<()>;
    /// Who an API token speaks for, if it is known, not revoked and not expired at `now`.
    fn principal(&self, hash: &str, now: u64) -> Result<Option<Principal>>;
    /// A new API token, valid until `expires` (`None`: no end).
    fn create_api_token(
        &self,
        actor: &str,
        role: &Role,
        hash: &str,
        expires: Option<u64>,
        now: u64,
    ) -> Result<()>;
    /// Every API token: metadata only.
    fn tokens(&self) -> Result<Vec<TokenView>>;
    /// Revokes the token whose id ([`crate::auth::token_id`]) is `id`.
    fn revoke_token(&self, actor: &str, id: &str, now: u64) -> Result<()>;
    /// A new tenant with its first token, valid until `expires`.
    fn create_tenant(
        &self,
        actor: &str,
        name: &str,
        token_hash: &str,
        expires: Option<u64>,
        now: u64,
    ) -> Result<TenantView>;
    /// Deletes a tenant that owns no group, and its tokens.
    fn delete_tenant(&self, actor: &str, name: &str, now: u64) -> Result<()>;
    /// Forgets a server that is in no group: its agent secret, ports and claims.
    fn remove_server(&self, actor: &str, name: &str, now: u64) -> Result<()>;
    /// Takes the lease `name` for `holder` until `now + ttl_s`, if no live holder has it;
    /// `steal` says whether a holder whose lease has not run out may be replaced (its
    /// process is known dead). Answers the holder that keeps it.
    fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_s: u64,
        now: u64,
        steal: &dyn Fn(&str) -> bool,
    ) -> Result<Result<(), String>>;
    /// Gives the lease back, if `holder` has it.
    fn release_lease(&self, name: &str, holder: &str) -> Result<()>;
    /// Every tenant.
    fn tenants(&self) -> Result<Vec<TenantView>>;
    /// A one-time enrollment token.
    fn create_enrollment(
        &self,
        actor: &str,
        hash: &str,
        server: Option<&str>,
        expires: u64,
        now: u64,
    ) -> Result<()>;
    /// Uses an enrollment token: the server `hostname` now authenticates with `secret_hash`.
    fn enroll(
        &self,
        token_hash: &str,
        hostname: &str,
        secret_hash: &str,
        now: u64,
    ) -> Result<String>;
    /// The server an agent secret belongs to.
    fn agent(&self, secret_hash: &str) -> Result<Option<String>>;
    /// Records a report: ports, ownership, pending claims, liveness.
    fn report(
        &self,
        server: &str,
        ports: &[ReportedPort],
        report_hash: &str,
        now: u64,
    ) -> Result<ReportOutcome>;
    /// Records a heartbeat.
    fn heartbeat(&self, server: &str, now: u64) -> Result<()>;
    /// Every server, with liveness computed against `stale_after_s`.
    fn servers(&self, now: u64, stale_after_s: u64) -> Result<Vec<ServerView>>;
    /// Every group.
    fn groups(&self) -> Result<Vec<GroupView>>;
    /// Applies a change, creates its operation and audit line; `None` when it changed
    /// nothing on the fabric (still audited).
    fn change(&self, actor: &str, change: &Change, now: u64) -> Result<Option<OperationView>>;
    /// Rejects a pending claim.
    fn reject_claim(&self, actor: &str, id: i64, now: u64) -> Result<()>;
    /// Every claim.
    fn claims(&self) -> Result<Vec<ClaimView>>;
    /// The desired state.
    fn desired(&self) -> Result<Desired>;
    /// What was last delivered and verified.
    fn applied(&self) -> Result<Applied>;
    /// Marks a generation delivered and verified: operations up to it are applied; the
    /// ids of those that were pending.
    fn mark_applied(&self, delivered: &VerifiedDelivery<'_>, now: u64) -> Result<Vec<i64>>;
    /// Records a failed delivery of `generation` (operations stay pending; retried).
    fn mark_failed(&self, generation: i64, error: &str, now: u64) -> Result<()>;
    /// One operation.
    fn operation(&self, id: i64) -> Result<OperationView>;
    /// Operations, newest first; only pending ones when asked.
    fn operations(&self, pending_only: bool) -> Result<Vec<OperationView>>;
    /// Appends one audit line (with a diff for a delivery: what the SM held against what
    /// was written, removals included).
    fn audit_append(&self, line: &AuditLine<'_>, now: u64) -> Result<()>;
    /// This controller's name as the owner header of the files it writes: `controller`
    /// and a random id made once per store.
    fn controller_id(&self) -> Result<String>;
    /// Partitions adopted from the SMs (partitions.conf statements), kept in every file.
    fn adopted(&self) -> Result<Option<String>>;
    /// Records `conf` (statements) as the adopted partitions, their P_Keys and names kept
    /// off groups, with an audit line.
    fn adopt(
        &self,
        conf: &str,
        pkeys: &[u16],
        names: &[String],
        detail: &str,
        now: u64,
    ) -> Result<()>;
    /// The newest `limit` audit lines, oldest first.
    fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>>;
    /// Desired against observed.
    fn status(&self, now: u64, stale_after_s: u64) -> Result<StatusView>;
    /// Records the GPUs a server's agent reported (its last report wins).
    fn set_gpus(&self, server: &str, gpus: &[weft_agent::Gpu], now: u64) -> Result<()>;
    /// The GPUs every server last reported, by server (servers that reported none are absent).
    fn gpus(&self) -> Result<BTreeMap<String, Vec<weft_agent::Gpu>>>;
    /// Records the RoCE ports and NICs a server's agent reported (its last report wins);
    /// [`Store::servers`] shows them with its GPUs.
    fn set_links(&self, server: &str, links: &crate::model::HostLinks, now: u64) -> Result<()>;
}
