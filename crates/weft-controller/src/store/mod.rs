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
//! | `lease_quotas` | per tenant: nodes at once, node-seconds per period |
//! | `node_leases` | weft-lease's leases: tenant, size, times, phase, nodes, reason |
//! | `lease_decisions` | every decision of the lease loop (also audited as `lease.<kind>`) |
//! | `lease_notices` | per server: the lease that ends on it and when (the agent reads it) |
//! | `link_runs` | runs of link measurements sent with `--report-to` (results as JSON) |
//!
//! [`PgStore`] implements the same trait on PostgreSQL with the same transactions; the
//! migrations of both come from one versioned list (`migrations.rs`).
//!
//! Layout: this file is the trait and the types it speaks; [`rules`] holds the decisions
//! a change makes (a group's name and P_Key, what a move does to membership) as pure
//! functions, over weft-fabric's allocator and reserved names; `sqlite/` is the SQLite
//! implementation, one file per concern (tokens, tenants, servers and their reports,
//! groups and changes, operations, audit, leases, node leases); `postgres/` is the PostgreSQL
//! one, file for file.

use std::collections::BTreeMap;

use weft_fabric::Guid;

use crate::auth::{Principal, Role};
use crate::model::{
    AuditEntry, AuditPruned, ClaimView, GroupView, OperationView, ReportAck, ServerView,
    StatusView, TenantView, TokenView,
};
use crate::render::Desired;

#[cfg(test)]
mod backend_tests;
mod migrations;
mod postgres;
pub mod rules;
mod sqlite;

pub use self::postgres::{PgStore, redact};
pub use sqlite::{BackupReport, SqliteStore};

/// A new controller id (`controller` and 16 hex digits from the time, the process and an
/// address), made once per store and kept in it.
fn new_controller_id() -> String {
    use sha2::Digest;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{nanos} {} {:p}", std::process::id(), &nanos);
    let digest = sha2::Sha256::digest(seed.as_bytes());
    format!(
        "controller {}",
        digest[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// A GUID as the databases' 64-bit integer (the same 64 bits).
fn guid_to_sql(g: Guid) -> i64 {
    g.0 as i64
}

/// A GUID read back from a database.
fn guid_from_sql(i: i64) -> Guid {
    Guid(i as u64)
}

/// Seconds since the epoch read back from a database (a negative value reads as 0).
fn secs(i: i64) -> u64 {
    u64::try_from(i).unwrap_or(0)
}

/// "expires N" or "no expiry", for audit lines.
fn expiry(expires: Option<u64>) -> String {
    expires.map_or_else(|| "no expiry".into(), |e| format!("expires {e}"))
}

/// Why a store call did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
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
    /// The database itself (the backend's message; no backend's error type, so that the
    /// trait stays the same for every backend).
    #[error("database: {0}")]
    Db(String),
    /// The storage under the database failed (space, I/O, permissions, a damaged file);
    /// the store turns it into [`StoreError::Unavailable`], naming itself.
    #[error("storage: {0}")]
    Storage(String),
    /// The store cannot write (a full disk, an I/O error, a read-only or damaged file):
    /// the message names the store and the cause. Nothing of the call was stored.
    #[error("{0}")]
    Unavailable(String),
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
    /// Rate as sysfs writes it.
    pub rate: Option<String>,
    /// The MTU of the port's netdev.
    pub mtu: Option<u32>,
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

/// One agent's whole report, as [`Store::report_host`] records it in one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentReport {
    /// The server it reports for (the agent's own, checked by the caller).
    pub server: String,
    /// Its InfiniBand ports.
    pub ports: Vec<ReportedPort>,
    /// The hash of `ports` ([`Store::report`]'s `report_hash`).
    pub report_hash: String,
    /// Its GPUs ([`Store::set_gpus`]).
    pub gpus: Vec<weft_agent::Gpu>,
    /// Its RoCE ports and NICs ([`Store::set_links`]).
    pub links: crate::model::HostLinks,
}

thread_local! {
    /// Set on a thread that is off every runtime's workers ([`mark_blocking_thread`]).
    static BLOCKING_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as one of tokio's blocking threads (`spawn_blocking`), where a
/// store may block, and may start a runtime of its own (PostgreSQL's blocking client
/// does): a store then runs the call on this thread instead of one started for the call.
/// Call it only from a `spawn_blocking` closure or a plain thread; the mark stays.
pub fn mark_blocking_thread() {
    BLOCKING_THREAD.with(|b| b.set(true));
}

/// Whether [`mark_blocking_thread`] marked this thread.
fn on_blocking_thread() -> bool {
    BLOCKING_THREAD.with(std::cell::Cell::get)
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
    /// What it took away from what the SMs held (removals in words, then ports and the
    /// keys they lose), one per line; kept on each operation.
    pub taken: &'a str,
}

/// Where a store stands in the order of deliveries (see `weft_opensm::Fence`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fencing {
    /// The fencing number its deliveries carry: 1 until a restore raises it.
    pub number: u64,
    /// Checksums of the files it began to deliver above its applied generation (a
    /// delivery killed before it was recorded as verified), so that it may replace them.
    pub in_flight: Vec<String>,
}

/// Where a controller stands in the leader election ([`Store::elect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Election {
    /// This controller leads: its deliveries carry `fencing`. `took_over`: it took the
    /// lease in this round (the fencing number was raised, with an audit line).
    Leader {
        /// The fencing number of this leadership.
        fencing: u64,
        /// Whether this round took the lease over (else it renewed it).
        took_over: bool,
    },
    /// Another controller leads, named by its holder id, with the URL it advertises.
    Follower {
        /// The leader's holder id.
        holder: Option<String>,
        /// The leader's advertised URL (`--advertise-url`), if it gave one.
        url: Option<String>,
    },
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

/// The `audit.prune` line of a prune of `count` lines written from `oldest` to `newest`,
/// before `before`; its detail is the JSON that the delete trigger reads the cut-off from.
/// Refused when the cut-off is after `now` (the lines being written would go).
fn prune_line(
    before: u64,
    now: u64,
    count: u64,
    oldest: Option<u64>,
    newest: Option<u64>,
) -> Result<(String, String)> {
    if before > now {
        return Err(StoreError::Invalid(format!(
            "the audit prune's cut-off {before} is after now ({now}): only lines already written can go"
        )));
    }
    let subject = format!("{count} lines written before {before}");
    let detail = serde_json::json!({
        "before": before,
        "count": count,
        "oldest": oldest,
        "newest": newest,
    })
    .to_string();
    Ok((subject, detail))
}

/// The node leases' state: what weft-lease's [`weft_lease::Book`] is made of, without the
/// pool (the members of the pool group) and the topology.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseRecords {
    /// Every lease, by number.
    pub leases: Vec<weft_lease::Lease>,
    /// Each tenant's quota.
    pub quotas: BTreeMap<String, weft_lease::Quota>,
}

/// One step of the lease loop, committed in one transaction: the leases it changed,
/// the group changes that carry out its moves (each an operation, delivered and verified
/// by the reconcile loop), and its decisions (stored, audited, and the agents' warnings).
#[derive(Debug, Clone, Copy)]
pub struct LeaseCommit<'a> {
    /// Who (`controller` for the loop's own ticks, else the caller's actor).
    pub actor: &'a str,
    /// The leases as they are now (inserted or updated).
    pub leases: &'a [weft_lease::Lease],
    /// The group changes, in order.
    pub changes: &'a [Change],
    /// The decisions.
    pub decisions: &'a [weft_lease::Decision],
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
    /// process is known dead). Answers the holder that keeps it: the inner `Err` is not a
    /// failure but the answer "someone else holds it", and it carries that holder's name
    /// (which is all a caller does with it), so it stays a `String`.
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
    /// Records an agent's whole report (ports as [`Store::report`], GPUs as
    /// [`Store::set_gpus`], links as [`Store::set_links`]) in one transaction: all of it
    /// or nothing. A store may commit several agents' reports in one transaction (group
    /// commit); each caller is answered after the commit that holds its report.
    fn report_host(&self, report: AgentReport, now: u64) -> Result<ReportOutcome>;
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
    /// Deletes the audit lines written before `before` (Unix seconds, not after `now`) in
    /// one transaction that first appends the `audit.prune` line recording it (`actor`, the
    /// cut-off, the range and the count): the append-only trigger lets a DELETE through
    /// only under such a line (migration 11). Every other delete or update stays refused.
    fn audit_prune(&self, actor: &str, before: u64, now: u64) -> Result<AuditPruned>;
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
    /// The fencing number and the deliveries in flight ([`Fencing`]).
    fn fencing(&self) -> Result<Fencing>;
    /// Records, before any SM is written, that a delivery of `generation` writes the file
    /// whose checksum is `checksum`.
    fn begin_delivery(&self, generation: i64, checksum: &str) -> Result<()>;
    /// Raises the fencing number above both its own and `above` (the highest an SM's file
    /// holds), with an audit line by `actor` saying `detail` (and `diff`); the new number.
    /// With `held`, that file (the master's, written by this store's lineage) becomes the
    /// applied file that the removal guard compares against: what the restored store's
    /// next delivery changes on it is its own to change.
    fn raise_fencing(
        &self,
        actor: &str,
        above: u64,
        held: Option<&str>,
        diff: &str,
        detail: &str,
        now: u64,
    ) -> Result<u64>;
    /// Whether the store can take writes now: `Err` names the store and the cause (its
    /// last write failed for want of space or an I/O error and no write has succeeded
    /// since, or its file system is nearly full), as [`StoreError::Unavailable`].
    /// Readiness (`/healthz`) asks this.
    fn health(&self) -> Result<()> {
        Ok(())
    }
    /// The newest `limit` audit lines, oldest first.
    fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>>;
    /// Desired against observed.
    fn status(&self, now: u64, stale_after_s: u64) -> Result<StatusView>;
    /// Records the GPUs a server's agent reported (its last report wins).
    fn set_gpus(&self, server: &str, gpus: &[weft_agent::Gpu], now: u64) -> Result<()>;
    /// The GPUs every server last reported, by server (servers that reported none are absent).
    fn gpus(&self) -> Result<BTreeMap<String, Vec<weft_agent::Gpu>>>;
    /// The node leases and the tenants' lease quotas.
    fn lease_records(&self) -> Result<LeaseRecords>;
    /// Commits one step of the lease loop; the operations its changes created.
    fn lease_commit(&self, commit: &LeaseCommit<'_>, now: u64) -> Result<Vec<OperationView>>;
    /// Sets (or, with `None`, removes) a tenant's lease quota, with an audit line.
    fn set_lease_quota(
        &self,
        actor: &str,
        tenant: &str,
        quota: Option<&weft_lease::Quota>,
        now: u64,
    ) -> Result<()>;
    /// Every decision about one lease, oldest first.
    fn lease_decisions(&self, lease: u64) -> Result<Vec<crate::lease::model::LeaseDecisionView>>;
    /// The warnings for a server: leases that end on it.
    fn lease_notices(&self, server: &str) -> Result<Vec<crate::lease::model::LeaseNotice>>;
    /// Records the RoCE ports and NICs a server's agent reported (its last report wins);
    /// [`Store::servers`] shows them with its GPUs.
    fn set_links(&self, server: &str, links: &crate::model::HostLinks, now: u64) -> Result<()>;
    /// Whether controllers on this store elect a leader ([`Store::elect`]): PostgreSQL's
    /// do; on SQLite one controller runs per store, kept alone by the store's lease.
    fn elects(&self) -> bool {
        false
    }
    /// One round of the leader election for `holder`, advertising `url`: renews the lease
    /// `holder` holds, takes over one that ran out by the database's clock (raising the
    /// fencing number in the same transaction, audited), or answers who leads. The lease
    /// lasts `ttl_s` seconds of the database's clock from this round. A store that does
    /// not elect ([`Store::elects`]) answers that its one controller leads, at the
    /// store's fencing number.
    fn elect(&self, holder: &str, url: Option<&str>, ttl_s: u64, now: u64) -> Result<Election> {
        let _ = (holder, url, ttl_s, now);
        Ok(Election::Leader {
            fencing: self.fencing()?.number,
            took_over: false,
        })
    }
    /// Ends `holder`'s lease at once (a controller stopping), if it holds it.
    fn resign(&self, holder: &str) -> Result<()> {
        let _ = holder;
        Ok(())
    }
    /// Who leads now, by holder id and advertised URL (`None`: no live lease; always
    /// `None` on a store that does not elect).
    fn leader(&self) -> Result<Option<(String, Option<String>)>> {
        Ok(None)
    }
    /// Stores a run of link measurements (checked by [`crate::links::check_run`]) sent by
    /// `actor`, with an audit line; runs beyond the newest [`crate::links::MAX_RUNS`] are
    /// forgotten. The run as stored.
    fn add_link_run(
        &self,
        actor: &str,
        run: &crate::links::LinkRunIn,
        now: u64,
    ) -> Result<crate::links::LinkRunView>;
    /// The newest `limit` runs of link measurements, newest first.
    fn link_runs(&self, limit: usize) -> Result<Vec<crate::links::LinkRunView>>;
    /// Keeps a new web-console session; sessions created more than `ttl_s` before it are
    /// forgotten, and beyond `max_live` live ones the oldest end.
    fn console_session_create(
        &self,
        session: &ConsoleSession,
        ttl_s: u64,
        max_live: usize,
    ) -> Result<()>;
    /// The console session whose id hashes to `id_hash` (live or ended), if kept.
    fn console_session(&self, id_hash: &str) -> Result<Option<ConsoleSession>>;
    /// Ends a console session (logout, expiry, a revoked token); whether it was live.
    fn console_session_end(&self, id_hash: &str, now: u64) -> Result<bool>;
}

/// A web-console session as the store keeps it: never the session id itself (the cookie
/// holds it), only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    /// SHA-256 of the session id, hex.
    pub id_hash: String,
    /// SHA-256 of the API token it logged in with (looked up at every request).
    pub token_hash: String,
    /// The CSRF token its forms carry.
    pub csrf: String,
    /// Who, for the audit log.
    pub actor: String,
    /// Unix seconds when it began.
    pub created: u64,
    /// Unix seconds when it ended, if it did.
    pub ended: Option<u64>,
}
