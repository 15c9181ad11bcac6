//! The controller's state behind the [`Store`] trait, and its SQLite implementation.
//!
//! Every method is one transaction: a change to the desired state, the operation it
//! creates and its audit line commit together or not at all, so a controller killed at
//! any point restarts with a consistent store. The audit table is append-only (SQLite
//! triggers refuse UPDATE and DELETE). Tokens and secrets are kept only as SHA-256 hashes.
//!
//! Schema (migration 1):
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

// tidy: long-file: the Store trait, its SQLite implementation and the schema still share
// this file; splitting them by concern is issue 20's work.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use weft_fabric::Guid;

use crate::auth::{Principal, Role, token_id};
use crate::model::{
    AuditEntry, ClaimView, DriftView, GroupView, Liveness, OpState, OperationView, PortView,
    ReportAck, ServerView, StatusView, TenantView, TokenRole, TokenView,
};
use crate::render::{self, Desired, DesiredGroup};

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
    /// Marks `generation` delivered and verified: operations up to it are applied.
    /// `warning` is what the delivery could not verify (ports not on the fabric); it is
    /// kept on each operation.
    #[allow(clippy::too_many_arguments)]
    fn mark_applied(
        &self,
        generation: i64,
        checksum: &str,
        conf: &str,
        detail: &str,
        warning: Option<&str>,
        now: u64,
    ) -> Result<Vec<i64>>;
    /// Records a failed delivery of `generation` (operations stay pending; retried).
    fn mark_failed(&self, generation: i64, error: &str, now: u64) -> Result<()>;
    /// One operation.
    fn operation(&self, id: i64) -> Result<OperationView>;
    /// Operations, newest first; only pending ones when asked.
    fn operations(&self, pending_only: bool) -> Result<Vec<OperationView>>;
    /// Appends one audit line.
    fn audit_append(
        &self,
        actor: &str,
        action: &str,
        subject: &str,
        outcome: &str,
        detail: &str,
        now: u64,
    ) -> Result<()>;
    /// Appends one audit line with a diff (a delivery: what the SM held against what
    /// was written, removals included).
    #[allow(clippy::too_many_arguments)]
    fn audit_with_diff(
        &self,
        actor: &str,
        action: &str,
        subject: &str,
        diff: &str,
        outcome: &str,
        detail: &str,
        now: u64,
    ) -> Result<()>;
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
}

const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('desired_generation', '0'), ('applied_generation', '0');
CREATE TABLE tenants (name TEXT PRIMARY KEY, created INTEGER NOT NULL);
CREATE TABLE api_tokens (
    hash TEXT PRIMARY KEY,
    role TEXT NOT NULL CHECK (role IN ('admin', 'tenant')),
    tenant TEXT REFERENCES tenants(name),
    created INTEGER NOT NULL,
    CHECK ((role = 'tenant') = (tenant IS NOT NULL))
);
CREATE TABLE enrollments (
    hash TEXT PRIMARY KEY,
    server TEXT,
    expires INTEGER NOT NULL,
    used INTEGER,
    created_by TEXT NOT NULL
);
CREATE TABLE servers (
    name TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL UNIQUE,
    enrolled INTEGER NOT NULL,
    last_seen INTEGER,
    report_hash TEXT
);
CREATE TABLE ports (
    guid INTEGER PRIMARY KEY,
    server TEXT NOT NULL REFERENCES servers(name),
    device TEXT NOT NULL,
    num INTEGER NOT NULL,
    lid INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX ports_server ON ports(server);
CREATE TABLE claims (
    id INTEGER PRIMARY KEY,
    guid INTEGER NOT NULL,
    claimant TEXT NOT NULL REFERENCES servers(name),
    owner TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'rejected')),
    created INTEGER NOT NULL,
    decided INTEGER
);
CREATE TABLE groups (
    name TEXT PRIMARY KEY,
    tenant TEXT NOT NULL REFERENCES tenants(name),
    pkey INTEGER NOT NULL UNIQUE,
    created INTEGER NOT NULL
);
CREATE TABLE members (
    server TEXT PRIMARY KEY REFERENCES servers(name),
    grp TEXT NOT NULL REFERENCES groups(name)
);
CREATE TABLE operations (
    id INTEGER PRIMARY KEY,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    generation INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'applied')),
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    diff TEXT NOT NULL,
    created INTEGER NOT NULL,
    finished INTEGER
);
CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    subject TEXT NOT NULL,
    diff TEXT NOT NULL DEFAULT '',
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
"#,
    // Tokens with a life, and the lease that keeps a second controller off the store.
    // Admin tokens made before this migration were the bootstrap token (or minted by a
    // body without a tenant): treated as bootstrap tokens, so rotation revokes them.
    r#"
ALTER TABLE api_tokens ADD COLUMN expires INTEGER;
ALTER TABLE api_tokens ADD COLUMN revoked INTEGER;
ALTER TABLE api_tokens ADD COLUMN source TEXT NOT NULL DEFAULT 'api';
UPDATE api_tokens SET source = 'bootstrap' WHERE role = 'admin';
CREATE TABLE leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires INTEGER NOT NULL);
"#,
    // An applied operation says what it could not verify (ports not on the fabric).
    r#"
ALTER TABLE operations ADD COLUMN warning TEXT;
"#,
    // The GPUs each agent reports (weft_agent::Gpu as JSON), for `weft plan --group`.
    r#"
CREATE TABLE server_gpus (server TEXT PRIMARY KEY, gpus TEXT NOT NULL, reported INTEGER NOT NULL);
"#,
];

/// The first P_Key base handed to a group; groups get the lowest free one from here.
const FIRST_GROUP_PKEY: u16 = 0x0a01;

/// [`Store`] on SQLite: WAL journal, foreign keys on, embedded migrations tracked in
/// `PRAGMA user_version`. One connection behind a mutex: SQLite serializes writers anyway.
pub struct SqliteStore {
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteStore")
    }
}

fn g2i(g: Guid) -> i64 {
    g.0 as i64
}
fn i2g(i: i64) -> Guid {
    Guid(i as u64)
}
fn u(i: i64) -> u64 {
    u64::try_from(i).unwrap_or(0)
}

impl SqliteStore {
    /// Opens (creating) the database at `path` and migrates it.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        Self::with_connection(Connection::open(path)?)
    }

    /// An in-memory database (tests).
    pub fn in_memory() -> Result<SqliteStore> {
        Self::with_connection(Connection::open_in_memory()?)
    }

    fn with_connection(mut conn: Connection) -> Result<SqliteStore> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // WAL: readers never block the writer; NORMAL sync is durable across a process
        // crash (kill -9), which is the failure the controller must survive.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let tx = conn.transaction()?;
        for (i, m) in MIGRATIONS
            .iter()
            .enumerate()
            .skip(usize::try_from(version).unwrap_or(0))
        {
            tx.execute_batch(m)?;
            tx.pragma_update(None, "user_version", i as i64 + 1)?;
        }
        tx.commit()?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
        })
    }

    fn tx<T>(&self, f: impl FnOnce(&Transaction) -> Result<T>) -> Result<T> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }
}

fn meta(tx: &Transaction, key: &str) -> Result<Option<String>> {
    Ok(tx
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()?)
}

fn set_meta(tx: &Transaction, key: &str, value: &str) -> Result<()> {
    tx.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = ?2",
        params![key, value],
    )?;
    Ok(())
}

fn meta_i64(tx: &Transaction, key: &str) -> Result<i64> {
    Ok(meta(tx, key)?.and_then(|v| v.parse().ok()).unwrap_or(0))
}

#[allow(clippy::too_many_arguments)]
fn audit(
    tx: &Transaction,
    now: u64,
    actor: &str,
    action: &str,
    subject: &str,
    diff: &str,
    outcome: &str,
    detail: &str,
) -> Result<()> {
    tx.execute(
        "INSERT INTO audit (at, actor, action, subject, diff, outcome, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![now as i64, actor, action, subject, diff, outcome, detail],
    )?;
    Ok(())
}

fn expiry(expires: Option<u64>) -> String {
    expires.map_or_else(|| "no expiry".into(), |e| format!("expires {e}"))
}

fn read_desired(tx: &Transaction) -> Result<Desired> {
    let generation = meta_i64(tx, "desired_generation")?;
    let mut groups = Vec::new();
    {
        let mut st = tx.prepare("SELECT name, tenant, pkey FROM groups ORDER BY name")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        for row in rows {
            let (name, tenant, pkey) = row?;
            groups.push(DesiredGroup {
                name,
                tenant,
                pkey: u16::try_from(pkey).unwrap_or(0),
                members: Vec::new(),
            });
        }
    }
    let mut st = tx.prepare(
        "SELECT m.grp, m.server, p.guid FROM members m LEFT JOIN ports p ON p.server = m.server ORDER BY m.grp, m.server, p.guid",
    )?;
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<i64>>(2)?,
        ))
    })?;
    let mut by_group: BTreeMap<String, Vec<(String, Vec<Guid>)>> = BTreeMap::new();
    for row in rows {
        let (grp, server, guid) = row?;
        let members = by_group.entry(grp).or_default();
        if members.last().map(|(s, _)| s != &server).unwrap_or(true) {
            members.push((server, Vec::new()));
        }
        if let (Some(g), Some(last)) = (guid, members.last_mut()) {
            last.1.push(i2g(g));
        }
    }
    for g in &mut groups {
        g.members = by_group.remove(&g.name).unwrap_or_default();
    }
    Ok(Desired { generation, groups })
}

fn exists(tx: &Transaction, sql: &str, key: &dyn rusqlite::ToSql) -> Result<bool> {
    Ok(tx.query_row(sql, [key], |_| Ok(())).optional()?.is_some())
}

fn group_of(tx: &Transaction, server: &str) -> Result<Option<String>> {
    Ok(tx
        .query_row("SELECT grp FROM members WHERE server = ?1", [server], |r| {
            r.get(0)
        })
        .optional()?)
}

fn need_server(tx: &Transaction, server: &str) -> Result<()> {
    if exists(tx, "SELECT 1 FROM servers WHERE name = ?1", &server)? {
        Ok(())
    } else {
        Err(StoreError::NotFound(format!("no server `{server}`")))
    }
}

fn need_group(tx: &Transaction, group: &str) -> Result<()> {
    if exists(tx, "SELECT 1 FROM groups WHERE name = ?1", &group)? {
        Ok(())
    } else {
        Err(StoreError::NotFound(format!("no group `{group}`")))
    }
}

fn apply_change(tx: &Transaction, change: &Change, now: u64) -> Result<()> {
    match change {
        Change::CreateGroup { name, tenant } => {
            weft_fabric::conf::validate_name(name)
                .map_err(|m| StoreError::Invalid(format!("group name `{name}`: {m}")))?;
            if name == "Default" {
                return Err(StoreError::Invalid(
                    "`Default` is the Default partition's name".into(),
                ));
            }
            if !exists(tx, "SELECT 1 FROM tenants WHERE name = ?1", tenant)? {
                return Err(StoreError::NotFound(format!("no tenant `{tenant}`")));
            }
            if exists(tx, "SELECT 1 FROM groups WHERE name = ?1", name)? {
                return Err(StoreError::Conflict(format!("group `{name}` exists")));
            }
            if meta(tx, "adopted_names")?.is_some_and(|n| n.split(',').any(|n| n == name.as_str()))
            {
                return Err(StoreError::Conflict(format!(
                    "`{name}` is a partition the controller adopted from the SMs"
                )));
            }
            let mut used: Vec<i64> = tx
                .prepare("SELECT pkey FROM groups ORDER BY pkey")?
                .query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            // Keys of adopted partitions are taken too.
            used.extend(
                meta(tx, "adopted_pkeys")?
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|k| k.parse::<i64>().ok()),
            );
            let pkey = (i64::from(FIRST_GROUP_PKEY)..0x7fff)
                .find(|k| !used.contains(k))
                .ok_or_else(|| StoreError::Conflict("no free P_Key".into()))?;
            tx.execute(
                "INSERT INTO groups (name, tenant, pkey, created) VALUES (?1, ?2, ?3, ?4)",
                params![name, tenant, pkey, now as i64],
            )?;
        }
        Change::AddMember { group, server } => {
            need_group(tx, group)?;
            need_server(tx, server)?;
            if let Some(g) = group_of(tx, server)? {
                return Err(StoreError::Conflict(format!(
                    "server `{server}` is in group `{g}`; move it instead"
                )));
            }
            tx.execute(
                "INSERT INTO members (server, grp) VALUES (?1, ?2)",
                params![server, group],
            )?;
        }
        Change::RemoveMember { group, server } => {
            need_group(tx, group)?;
            if group_of(tx, server)?.as_deref() != Some(group.as_str()) {
                return Err(StoreError::NotFound(format!(
                    "server `{server}` is not in group `{group}`"
                )));
            }
            tx.execute("DELETE FROM members WHERE server = ?1", [server])?;
        }
        Change::Move { server, to } => {
            need_group(tx, to)?;
            need_server(tx, server)?;
            match group_of(tx, server)? {
                Some(g) if &g == to => {
                    return Err(StoreError::Conflict(format!(
                        "server `{server}` is already in group `{to}`"
                    )));
                }
                Some(_) => {
                    tx.execute(
                        "UPDATE members SET grp = ?2 WHERE server = ?1",
                        params![server, to],
                    )?;
                }
                None => {
                    tx.execute(
                        "INSERT INTO members (server, grp) VALUES (?1, ?2)",
                        params![server, to],
                    )?;
                }
            }
        }
        Change::DeleteGroup { group } => {
            need_group(tx, group)?;
            tx.execute("DELETE FROM members WHERE grp = ?1", [group])?;
            tx.execute("DELETE FROM groups WHERE name = ?1", [group])?;
        }
        Change::ApproveClaim { id } => {
            let row: Option<(i64, String, String)> = tx
                .query_row(
                    "SELECT guid, claimant, state FROM claims WHERE id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            let Some((guid, claimant, state)) = row else {
                return Err(StoreError::NotFound(format!("no claim {id}")));
            };
            if state != "pending" {
                return Err(StoreError::Conflict(format!("claim {id} is {state}")));
            }
            tx.execute(
                "UPDATE ports SET server = ?2 WHERE guid = ?1",
                params![guid, claimant],
            )?;
            tx.execute(
                "UPDATE claims SET state = 'approved', decided = ?2 WHERE id = ?1",
                params![id, now as i64],
            )?;
            // Other pending claims on the same GUID are moot now.
            tx.execute(
                "UPDATE claims SET state = 'rejected', decided = ?2 WHERE guid = ?1 AND state = 'pending'",
                params![guid, now as i64],
            )?;
        }
    }
    Ok(())
}

fn new_operation(
    tx: &Transaction,
    actor: &str,
    action: &str,
    diff: &str,
    now: u64,
) -> Result<OperationView> {
    let generation = meta_i64(tx, "desired_generation")? + 1;
    set_meta(tx, "desired_generation", &generation.to_string())?;
    tx.execute(
        "INSERT INTO operations (actor, action, generation, state, diff, created) VALUES (?1, ?2, ?3, 'pending', ?4, ?5)",
        params![actor, action, generation, diff, now as i64],
    )?;
    let id = tx.last_insert_rowid();
    read_operation(tx, id)
}

fn op_row(r: &rusqlite::Row) -> rusqlite::Result<OperationView> {
    let state: String = r.get(5)?;
    Ok(OperationView {
        id: r.get(0)?,
        actor: r.get(1)?,
        action: r.get(2)?,
        generation: r.get(3)?,
        attempts: r.get(4)?,
        state: if state == "applied" {
            OpState::Applied
        } else {
            OpState::Pending
        },
        last_error: r.get(6)?,
        diff: r.get(7)?,
        created: u(r.get(8)?),
        finished: r.get::<_, Option<i64>>(9)?.map(u),
        warning: r.get(10)?,
    })
}

const OP_COLS: &str =
    "id, actor, action, generation, attempts, state, last_error, diff, created, finished, warning";

fn read_operation(tx: &Transaction, id: i64) -> Result<OperationView> {
    tx.query_row(
        &format!("SELECT {OP_COLS} FROM operations WHERE id = ?1"),
        [id],
        op_row,
    )
    .optional()?
    .ok_or_else(|| StoreError::NotFound(format!("no operation {id}")))
}

impl Store for SqliteStore {
    fn bootstrap_admin(&self, hash: &str, now: u64) -> Result<()> {
        self.tx(|tx| {
            let known: Option<(String, String, Option<i64>)> = tx
                .query_row("SELECT role, source, revoked FROM api_tokens WHERE hash = ?1", [hash], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            match known {
                None => {
                    tx.execute(
                        "INSERT INTO api_tokens (hash, role, tenant, created, source) VALUES (?1, 'admin', NULL, ?2, 'bootstrap')",
                        params![hash, now as i64],
                    )?;
                }
                Some((role, source, revoked)) if role != "admin" || source != "bootstrap" || revoked.is_some() => {
                    return Err(StoreError::Refused(
                        "the admin token given to the controller is already known to the store as another or a revoked token; give a fresh one".into(),
                    ));
                }
                Some(_) => {}
            }
            let old: Vec<String> = tx
                .prepare("SELECT hash FROM api_tokens WHERE source = 'bootstrap' AND revoked IS NULL AND hash != ?1")?
                .query_map([hash], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            for h in &old {
                tx.execute("UPDATE api_tokens SET revoked = ?2 WHERE hash = ?1", params![h, now as i64])?;
                audit(tx, now, "controller", "token.rotate", &format!("token {}", token_id(h)), "", "revoked", "the controller started with another admin token")?;
            }
            Ok(())
        })
    }

    fn principal(&self, hash: &str, now: u64) -> Result<Option<Principal>> {
        self.tx(|tx| {
            let row: Option<(String, Option<String>)> = tx
                .query_row(
                    "SELECT role, tenant FROM api_tokens WHERE hash = ?1 AND revoked IS NULL AND (expires IS NULL OR expires > ?2)",
                    params![hash, now as i64],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            // The actor names the token by the first 8 hex digits of its hash: enough to
            // tell tokens apart in the audit log, useless to an attacker.
            let id = hash.get(..8).unwrap_or(hash);
            Ok(row.map(|(role, tenant)| match (role.as_str(), tenant) {
                ("tenant", Some(t)) => Principal {
                    actor: format!("tenant:{t}:{id}"),
                    role: Role::Tenant(t),
                },
                _ => Principal {
                    actor: format!("admin:{id}"),
                    role: Role::Admin,
                },
            }))
        })
    }

    fn create_api_token(
        &self,
        actor: &str,
        role: &Role,
        hash: &str,
        expires: Option<u64>,
        now: u64,
    ) -> Result<()> {
        self.tx(|tx| {
            let (r, t) = match role {
                Role::Admin => ("admin", None),
                Role::Tenant(t) => {
                    if !exists(tx, "SELECT 1 FROM tenants WHERE name = ?1", t)? {
                        return Err(StoreError::NotFound(format!("no tenant `{t}`")));
                    }
                    ("tenant", Some(t.as_str()))
                }
            };
            tx.execute(
                "INSERT INTO api_tokens (hash, role, tenant, created, expires) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![hash, r, t, now as i64, expires.map(|e| e as i64)],
            )?;
            audit(
                tx,
                now,
                actor,
                "token.create",
                t.unwrap_or("admin"),
                "",
                "ok",
                &format!("role {r}, token {}, {}", token_id(hash), expiry(expires)),
            )
        })
    }

    fn tokens(&self) -> Result<Vec<TokenView>> {
        self.tx(|tx| {
            Ok(tx
                .prepare("SELECT hash, role, tenant, source, created, expires, revoked FROM api_tokens ORDER BY created, hash")?
                .query_map([], |r| {
                    let role: String = r.get(1)?;
                    Ok(TokenView {
                        id: token_id(&r.get::<_, String>(0)?),
                        role: if role == "tenant" { TokenRole::Tenant } else { TokenRole::Admin },
                        tenant: r.get(2)?,
                        source: r.get(3)?,
                        created: u(r.get(4)?),
                        expires: r.get::<_, Option<i64>>(5)?.map(u),
                        revoked: r.get::<_, Option<i64>>(6)?.map(u),
                    })
                })?
                .collect::<Result<_, _>>()?)
        })
    }

    fn revoke_token(&self, actor: &str, id: &str, now: u64) -> Result<()> {
        self.tx(|tx| {
            if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
                return Err(StoreError::Invalid(format!("token id {}: not 16 lowercase hex digits (see `GET /v1/tokens`)", crate::input::shown(id))));
            }
            let n = tx.execute(
                "UPDATE api_tokens SET revoked = ?2 WHERE substr(hash, 1, 16) = ?1 AND revoked IS NULL",
                params![id, now as i64],
            )?;
            if n == 0 {
                return Err(StoreError::NotFound(format!("no token `{id}` that is not revoked")));
            }
            audit(tx, now, actor, "token.revoke", &format!("token {id}"), "", "ok", "")
        })
    }
    fn create_tenant(
        &self,
        actor: &str,
        name: &str,
        token_hash: &str,
        expires: Option<u64>,
        now: u64,
    ) -> Result<TenantView> {
        self.tx(|tx| {
            weft_fabric::conf::validate_name(name).map_err(|m| StoreError::Invalid(format!("tenant name `{name}`: {m}")))?;
            if exists(tx, "SELECT 1 FROM tenants WHERE name = ?1", &name)? {
                return Err(StoreError::Conflict(format!("tenant `{name}` exists")));
            }
            tx.execute("INSERT INTO tenants (name, created) VALUES (?1, ?2)", params![name, now as i64])?;
            tx.execute(
                "INSERT INTO api_tokens (hash, role, tenant, created, expires) VALUES (?1, 'tenant', ?2, ?3, ?4)",
                params![token_hash, name, now as i64, expires.map(|e| e as i64)],
            )?;
            audit(tx, now, actor, "tenant.create", name, "", "ok", &format!("token {}, {}", token_id(token_hash), expiry(expires)))?;
            Ok(TenantView { name: name.to_string(), groups: Vec::new() })
        })
    }

    fn delete_tenant(&self, actor: &str, name: &str, now: u64) -> Result<()> {
        self.tx(|tx| {
            if !exists(tx, "SELECT 1 FROM tenants WHERE name = ?1", &name)? {
                return Err(StoreError::NotFound(format!("no tenant `{name}`")));
            }
            let groups: Vec<String> = tx
                .prepare("SELECT name FROM groups WHERE tenant = ?1 ORDER BY name")?
                .query_map([name], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            if !groups.is_empty() {
                return Err(StoreError::Conflict(format!(
                    "tenant `{name}` owns group(s) {}; remove them first",
                    groups
                        .iter()
                        .map(|g| format!("`{g}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            let tokens = tx.execute("DELETE FROM api_tokens WHERE tenant = ?1", [name])?;
            tx.execute("DELETE FROM tenants WHERE name = ?1", [name])?;
            audit(
                tx,
                now,
                actor,
                "tenant.delete",
                name,
                "",
                "ok",
                &format!("{tokens} token(s) deleted"),
            )
        })
    }

    fn remove_server(&self, actor: &str, name: &str, now: u64) -> Result<()> {
        self.tx(|tx| {
            need_server(tx, name)?;
            if let Some(g) = group_of(tx, name)? {
                return Err(StoreError::Conflict(format!(
                    "server `{name}` is in group `{g}`; remove it from the group first"
                )));
            }
            tx.execute("DELETE FROM claims WHERE claimant = ?1", [name])?;
            let ports = tx.execute("DELETE FROM ports WHERE server = ?1", [name])?;
            tx.execute("DELETE FROM servers WHERE name = ?1", [name])?;
            audit(
                tx,
                now,
                actor,
                "server.remove",
                name,
                "",
                "ok",
                &format!("{ports} port(s) forgotten; its agent secret no longer works"),
            )
        })
    }

    fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_s: u64,
        now: u64,
        steal: &dyn Fn(&str) -> bool,
    ) -> Result<Result<(), String>> {
        self.tx(|tx| {
            let row: Option<(String, i64)> = tx
                .query_row(
                    "SELECT holder, expires FROM leases WHERE name = ?1",
                    [name],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if let Some((h, expires)) = row
                && h != holder
                && u(expires) > now
                && !steal(&h)
            {
                return Ok(Err(h));
            }
            let expires = i64::try_from(now.saturating_add(ttl_s)).unwrap_or(i64::MAX);
            tx.execute(
                "INSERT INTO leases (name, holder, expires) VALUES (?1, ?2, ?3)
                 ON CONFLICT(name) DO UPDATE SET holder = ?2, expires = ?3",
                params![name, holder, expires],
            )?;
            Ok(Ok(()))
        })
    }

    fn release_lease(&self, name: &str, holder: &str) -> Result<()> {
        self.tx(|tx| {
            tx.execute(
                "DELETE FROM leases WHERE name = ?1 AND holder = ?2",
                params![name, holder],
            )?;
            Ok(())
        })
    }

    fn tenants(&self) -> Result<Vec<TenantView>> {
        self.tx(|tx| {
            let mut st = tx.prepare("SELECT t.name, g.name FROM tenants t LEFT JOIN groups g ON g.tenant = t.name ORDER BY t.name, g.name")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)))?;
            let mut out: Vec<TenantView> = Vec::new();
            for row in rows {
                let (t, g) = row?;
                if out.last().map(|v| v.name != t).unwrap_or(true) {
                    out.push(TenantView { name: t, groups: Vec::new() });
                }
                if let (Some(g), Some(last)) = (g, out.last_mut()) {
                    last.groups.push(g);
                }
            }
            Ok(out)
        })
    }

    fn create_enrollment(
        &self,
        actor: &str,
        hash: &str,
        server: Option<&str>,
        expires: u64,
        now: u64,
    ) -> Result<()> {
        self.tx(|tx| {
            tx.execute(
                "INSERT INTO enrollments (hash, server, expires, created_by) VALUES (?1, ?2, ?3, ?4)",
                params![hash, server, expires as i64, actor],
            )?;
            audit(tx, now, actor, "enrollment.create", server.unwrap_or("any host"), "", "ok", &format!("expires {expires}"))
        })
    }

    fn enroll(
        &self,
        token_hash: &str,
        hostname: &str,
        secret_hash: &str,
        now: u64,
    ) -> Result<String> {
        let outcome = self.tx(|tx| {
            let row: Option<(Option<String>, i64, Option<i64>)> = tx
                .query_row("SELECT server, expires, used FROM enrollments WHERE hash = ?1", [token_hash], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            let refuse = |why: &str| Ok(Err(why.to_string()));
            // The name is checked before anything, the refusal's audit line included.
            crate::input::name("host name", hostname).map_err(StoreError::Invalid)?;
            let Some((bound, expires, used)) = row else {
                return refuse("unknown enrollment token");
            };
            if used.is_some() {
                return refuse("enrollment token already used");
            }
            if u(expires) < now {
                return refuse("enrollment token expired");
            }
            if bound.as_deref().is_some_and(|b| b != hostname) {
                return refuse("enrollment token is for another host");
            }
            let known = exists(tx, "SELECT 1 FROM servers WHERE name = ?1", &hostname)?;
            if known && bound.is_none() {
                // Re-enrolling an existing server takes a token bound to it by an admin.
                return refuse("a server of this name is enrolled; re-enrolling takes a token bound to it");
            }
            tx.execute("UPDATE enrollments SET used = ?2 WHERE hash = ?1", params![token_hash, now as i64])?;
            tx.execute(
                "INSERT INTO servers (name, secret_hash, enrolled) VALUES (?1, ?2, ?3)
                 ON CONFLICT(name) DO UPDATE SET secret_hash = ?2, enrolled = ?3, report_hash = NULL",
                params![hostname, secret_hash, now as i64],
            )?;
            audit(tx, now, &format!("agent:{hostname}"), "agent.enroll", hostname, "", "ok", if known { "re-enrolled" } else { "" })?;
            Ok(Ok(hostname.to_string()))
        })?;
        match outcome {
            Ok(s) => Ok(s),
            Err(why) => {
                // The refusal is audited in its own transaction (the failed one changed nothing).
                self.audit_append(
                    &format!("agent:{hostname}"),
                    "agent.enroll",
                    hostname,
                    "refused",
                    &why,
                    now,
                )?;
                Err(StoreError::Refused(why))
            }
        }
    }

    fn agent(&self, secret_hash: &str) -> Result<Option<String>> {
        self.tx(|tx| {
            Ok(tx
                .query_row(
                    "SELECT name FROM servers WHERE secret_hash = ?1",
                    [secret_hash],
                    |r| r.get(0),
                )
                .optional()?)
        })
    }

    fn report(
        &self,
        server: &str,
        ports: &[ReportedPort],
        report_hash: &str,
        now: u64,
    ) -> Result<ReportOutcome> {
        self.tx(|tx| {
            let previous: Option<String> =
                tx.query_row("SELECT report_hash FROM servers WHERE name = ?1", [server], |r| r.get(0))?;
            tx.execute("UPDATE servers SET last_seen = ?2, report_hash = ?3 WHERE name = ?1", params![server, now as i64, report_hash])?;
            let mut desired_changed = false;
            if previous.as_deref() != Some(report_hash) {
                let before = read_desired(tx)?;
                let reported: Vec<i64> = ports.iter().map(|p| g2i(p.guid)).collect();
                // Ports this server owned and no longer reports (an HCA removed or replaced).
                let owned: Vec<i64> = tx.prepare("SELECT guid FROM ports WHERE server = ?1")?.query_map([server], |r| r.get(0))?.collect::<Result<_, _>>()?;
                for g in owned.iter().filter(|g| !reported.contains(g)) {
                    tx.execute("DELETE FROM ports WHERE guid = ?1", [g])?;
                    audit(tx, now, &format!("agent:{server}"), "port.gone", &i2g(*g).to_string(), "", "ok", "no longer reported")?;
                }
                for p in ports {
                    let owner: Option<String> = tx.query_row("SELECT server FROM ports WHERE guid = ?1", [g2i(p.guid)], |r| r.get(0)).optional()?;
                    match owner {
                        Some(o) if o != server => {
                            let pending = tx
                                .query_row(
                                    "SELECT 1 FROM claims WHERE guid = ?1 AND claimant = ?2 AND state = 'pending'",
                                    params![g2i(p.guid), server],
                                    |_| Ok(()),
                                )
                                .optional()?
                                .is_some();
                            if !pending {
                                tx.execute(
                                    "INSERT INTO claims (guid, claimant, owner, state, created) VALUES (?1, ?2, ?3, 'pending', ?4)",
                                    params![g2i(p.guid), server, o, now as i64],
                                )?;
                                audit(tx, now, &format!("agent:{server}"), "claim.pending", &p.guid.to_string(), "", "pending", &format!("owned by `{o}`; needs an admin's approval"))?;
                            }
                        }
                        Some(_) => {
                            tx.execute(
                                "UPDATE ports SET device = ?2, num = ?3, lid = ?4, state = ?5 WHERE guid = ?1",
                                params![g2i(p.guid), p.device, p.num, p.lid, p.state],
                            )?;
                        }
                        None => {
                            tx.execute(
                                "INSERT INTO ports (guid, server, device, num, lid, state) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                                params![g2i(p.guid), server, p.device, p.num, p.lid, p.state],
                            )?;
                        }
                    }
                }
                let after = read_desired(tx)?;
                if after.groups != before.groups {
                    let (b, a) = (render::conf_text(&before), render::conf_text(&after));
                    let diff = match (&b, &a) {
                        (Ok(b), Ok(a)) => render::diff(b, a),
                        _ => String::new(),
                    };
                    let op = new_operation(tx, &format!("agent:{server}"), &format!("ports of {server} changed"), &diff, now)?;
                    audit(tx, now, &format!("agent:{server}"), "ports.change", server, &diff, "accepted", &format!("operation {}, generation {}", op.id, op.generation))?;
                    desired_changed = true;
                }
            }
            let mut owned = Vec::new();
            let mut pending = Vec::new();
            for p in ports {
                let owner: Option<String> = tx.query_row("SELECT server FROM ports WHERE guid = ?1", [g2i(p.guid)], |r| r.get(0)).optional()?;
                if owner.as_deref() == Some(server) {
                    owned.push(p.guid);
                } else {
                    pending.push(p.guid);
                }
            }
            Ok(ReportOutcome { ack: ReportAck { server: server.to_string(), owned, pending }, desired_changed })
        })
    }

    fn heartbeat(&self, server: &str, now: u64) -> Result<()> {
        self.tx(|tx| {
            tx.execute(
                "UPDATE servers SET last_seen = ?2 WHERE name = ?1",
                params![server, now as i64],
            )?;
            Ok(())
        })
    }

    fn servers(&self, now: u64, stale_after_s: u64) -> Result<Vec<ServerView>> {
        self.tx(|tx| {
            let mut out = Vec::new();
            let mut st = tx.prepare(
                "SELECT s.name, s.last_seen, m.grp FROM servers s LEFT JOIN members m ON m.server = s.name ORDER BY s.name",
            )?;
            let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?, r.get::<_, Option<String>>(2)?)))?;
            for row in rows {
                let (name, last_seen, group) = row?;
                let last_seen = last_seen.map(u);
                let liveness = match last_seen {
                    None => Liveness::Never,
                    Some(t) if now.saturating_sub(t) > stale_after_s => Liveness::Stale,
                    Some(_) => Liveness::Ok,
                };
                let ports = tx
                    .prepare("SELECT guid, device, num, lid, state FROM ports WHERE server = ?1 ORDER BY device, num")?
                    .query_map([&name], |r| {
                        Ok(PortView { guid: i2g(r.get(0)?), device: r.get(1)?, num: r.get(2)?, lid: r.get(3)?, state: r.get(4)? })
                    })?
                    .collect::<Result<_, _>>()?;
                let pending_claims = tx
                    .prepare("SELECT guid FROM claims WHERE claimant = ?1 AND state = 'pending' ORDER BY guid")?
                    .query_map([&name], |r| Ok(i2g(r.get(0)?)))?
                    .collect::<Result<_, _>>()?;
                out.push(ServerView { name, liveness, last_seen, ports, group, pending_claims });
            }
            Ok(out)
        })
    }

    fn groups(&self) -> Result<Vec<GroupView>> {
        self.tx(|tx| {
            Ok(read_desired(tx)?
                .groups
                .into_iter()
                .map(|g| GroupView {
                    ports: g
                        .members
                        .iter()
                        .flat_map(|(_, p)| p.iter().copied())
                        .collect(),
                    members: g.members.into_iter().map(|(s, _)| s).collect(),
                    pkey: format!("{:#06x}", g.pkey),
                    name: g.name,
                    tenant: g.tenant,
                })
                .collect())
        })
    }

    fn change(&self, actor: &str, change: &Change, now: u64) -> Result<Option<OperationView>> {
        self.tx(|tx| {
            let (action, subject) = change.describe();
            let before = read_desired(tx)?;
            let before_text = render::conf_text(&before).map_err(StoreError::Invalid)?;
            apply_change(tx, change, now)?;
            let after = read_desired(tx)?;
            let after_text = render::conf_text(&after).map_err(StoreError::Invalid)?;
            let diff = render::diff(&before_text, &after_text);
            if diff.is_empty() {
                audit(
                    tx,
                    now,
                    actor,
                    action,
                    &subject,
                    "",
                    "no change",
                    "the partitions file stays the same",
                )?;
                return Ok(None);
            }
            let op = new_operation(tx, actor, &format!("{action} {subject}"), &diff, now)?;
            audit(
                tx,
                now,
                actor,
                action,
                &subject,
                &diff,
                "accepted",
                &format!("operation {}, generation {}", op.id, op.generation),
            )?;
            Ok(Some(op))
        })
    }

    fn reject_claim(&self, actor: &str, id: i64, now: u64) -> Result<()> {
        self.tx(|tx| {
            let n = tx.execute("UPDATE claims SET state = 'rejected', decided = ?2 WHERE id = ?1 AND state = 'pending'", params![id, now as i64])?;
            if n == 0 {
                return Err(StoreError::NotFound(format!("no pending claim {id}")));
            }
            audit(tx, now, actor, "claim.reject", &format!("claim {id}"), "", "ok", "")
        })
    }

    fn claims(&self) -> Result<Vec<ClaimView>> {
        self.tx(|tx| {
            Ok(tx
                .prepare(
                    "SELECT id, guid, claimant, owner, state, created FROM claims ORDER BY id",
                )?
                .query_map([], |r| {
                    Ok(ClaimView {
                        id: r.get(0)?,
                        guid: i2g(r.get(1)?),
                        claimant: r.get(2)?,
                        owner: r.get(3)?,
                        state: r.get(4)?,
                        created: u(r.get(5)?),
                    })
                })?
                .collect::<Result<_, _>>()?)
        })
    }

    fn desired(&self) -> Result<Desired> {
        self.tx(read_desired)
    }

    fn applied(&self) -> Result<Applied> {
        self.tx(|tx| {
            Ok(Applied {
                generation: meta_i64(tx, "applied_generation")?,
                checksum: meta(tx, "applied_checksum")?,
                conf: meta(tx, "applied_conf")?,
            })
        })
    }

    fn mark_applied(
        &self,
        generation: i64,
        checksum: &str,
        conf: &str,
        detail: &str,
        warning: Option<&str>,
        now: u64,
    ) -> Result<Vec<i64>> {
        self.tx(|tx| {
            if generation > meta_i64(tx, "applied_generation")? {
                set_meta(tx, "applied_generation", &generation.to_string())?;
            }
            set_meta(tx, "applied_checksum", checksum)?;
            set_meta(tx, "applied_conf", conf)?;
            let ids: Vec<(i64, i64)> = tx
                .prepare("SELECT id, attempts FROM operations WHERE state = 'pending' AND generation <= ?1 ORDER BY id")?
                .query_map([generation], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            for (id, attempts) in &ids {
                tx.execute("UPDATE operations SET state = 'applied', finished = ?2, warning = ?3 WHERE id = ?1", params![id, now as i64, warning])?;
                let retried = if *attempts > 0 { format!(" after {attempts} failed attempt(s)") } else { String::new() };
                audit(tx, now, "controller", "apply", &format!("operation {id}"), "", "applied", &format!("generation {generation}{retried}: {detail}"))?;
            }
            Ok(ids.into_iter().map(|(id, _)| id).collect())
        })
    }

    fn mark_failed(&self, generation: i64, error: &str, now: u64) -> Result<()> {
        self.tx(|tx| {
            let ids: Vec<i64> = tx
                .prepare("SELECT id FROM operations WHERE state = 'pending' AND generation <= ?1 ORDER BY id")?
                .query_map([generation], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            for id in &ids {
                tx.execute("UPDATE operations SET attempts = attempts + 1, last_error = ?2 WHERE id = ?1", params![id, error])?;
                audit(tx, now, "controller", "apply", &format!("operation {id}"), "", "failed", &format!("generation {generation}: {error}; will retry"))?;
            }
            Ok(())
        })
    }

    fn operation(&self, id: i64) -> Result<OperationView> {
        self.tx(|tx| read_operation(tx, id))
    }

    fn operations(&self, pending_only: bool) -> Result<Vec<OperationView>> {
        self.tx(|tx| {
            let filter = if pending_only {
                "WHERE state = 'pending'"
            } else {
                ""
            };
            Ok(tx
                .prepare(&format!(
                    "SELECT {OP_COLS} FROM operations {filter} ORDER BY id DESC LIMIT 500"
                ))?
                .query_map([], op_row)?
                .collect::<Result<_, _>>()?)
        })
    }

    fn audit_append(
        &self,
        actor: &str,
        action: &str,
        subject: &str,
        outcome: &str,
        detail: &str,
        now: u64,
    ) -> Result<()> {
        self.tx(|tx| audit(tx, now, actor, action, subject, "", outcome, detail))
    }

    fn audit_with_diff(
        &self,
        actor: &str,
        action: &str,
        subject: &str,
        diff: &str,
        outcome: &str,
        detail: &str,
        now: u64,
    ) -> Result<()> {
        self.tx(|tx| audit(tx, now, actor, action, subject, diff, outcome, detail))
    }

    fn controller_id(&self) -> Result<String> {
        self.tx(|tx| {
            if let Some(id) = meta(tx, "controller_id")? {
                return Ok(id);
            }
            use sha2::Digest;
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let seed = format!("{nanos} {} {:p}", std::process::id(), &nanos);
            let digest = sha2::Sha256::digest(seed.as_bytes());
            let id = format!(
                "controller {}",
                digest[..8]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            );
            set_meta(tx, "controller_id", &id)?;
            Ok(id)
        })
    }

    fn adopted(&self) -> Result<Option<String>> {
        self.tx(|tx| meta(tx, "adopted_conf"))
    }

    fn adopt(
        &self,
        conf: &str,
        pkeys: &[u16],
        names: &[String],
        detail: &str,
        now: u64,
    ) -> Result<()> {
        self.tx(|tx| {
            for k in pkeys {
                if exists(tx, "SELECT 1 FROM groups WHERE pkey = ?1", &i64::from(*k))? {
                    return Err(StoreError::Conflict(format!(
                        "P_Key {k:#06x} of an adopted partition is a group's"
                    )));
                }
            }
            for n in names {
                if exists(tx, "SELECT 1 FROM groups WHERE name = ?1", n)? {
                    return Err(StoreError::Conflict(format!(
                        "adopted partition `{n}` has a group's name"
                    )));
                }
            }
            let keys: Vec<String> = pkeys.iter().map(u16::to_string).collect();
            set_meta(tx, "adopted_conf", conf)?;
            set_meta(tx, "adopted_pkeys", &keys.join(","))?;
            set_meta(tx, "adopted_names", &names.join(","))?;
            let diff: String = conf.lines().map(|l| format!("+{l}\n")).collect();
            audit(
                tx,
                now,
                "controller",
                "adopt",
                "fabric",
                &diff,
                "adopted",
                detail,
            )
        })
    }

    fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>> {
        self.tx(|tx| {
            let mut v: Vec<AuditEntry> = tx
                .prepare("SELECT id, at, actor, action, subject, diff, outcome, detail FROM audit ORDER BY id DESC LIMIT ?1")?
                .query_map([limit as i64], |r| {
                    Ok(AuditEntry {
                        id: r.get(0)?,
                        at: u(r.get(1)?),
                        actor: r.get(2)?,
                        action: r.get(3)?,
                        subject: r.get(4)?,
                        diff: r.get(5)?,
                        outcome: r.get(6)?,
                        detail: r.get(7)?,
                    })
                })?
                .collect::<Result<_, _>>()?;
            v.reverse();
            Ok(v)
        })
    }

    fn status(&self, now: u64, stale_after_s: u64) -> Result<StatusView> {
        let stale_servers = self
            .servers(now, stale_after_s)?
            .into_iter()
            .filter(|s| s.liveness == Liveness::Stale)
            .map(|s| s.name)
            .collect();
        self.tx(|tx| {
            Ok(StatusView {
                desired_generation: meta_i64(tx, "desired_generation")?,
                applied_generation: meta_i64(tx, "applied_generation")?,
                applied_checksum: meta(tx, "applied_checksum")?,
                pending_operations: tx.query_row(
                    "SELECT count(*) FROM operations WHERE state = 'pending'",
                    [],
                    |r| r.get(0),
                )?,
                stale_servers,
                delivers: false,
                drift: DriftView::default(),
                applied_conf: meta(tx, "applied_conf")?,
            })
        })
    }

    fn set_gpus(&self, server: &str, gpus: &[weft_agent::Gpu], now: u64) -> Result<()> {
        let json = serde_json::to_string(gpus)
            .map_err(|e| StoreError::Invalid(format!("GPUs of `{server}`: {e}")))?;
        self.tx(|tx| {
            tx.execute(
                "INSERT INTO server_gpus (server, gpus, reported) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(server) DO UPDATE SET gpus = ?2, reported = ?3",
                params![server, json, now as i64],
            )?;
            Ok(())
        })
    }

    fn gpus(&self) -> Result<BTreeMap<String, Vec<weft_agent::Gpu>>> {
        self.tx(|tx| {
            // Joined with servers: a removed server's last report is not shown.
            let mut st = tx.prepare(
                "SELECT g.server, g.gpus FROM server_gpus g JOIN servers s ON s.name = g.server",
            )?;
            let rows =
                st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
            let mut out = BTreeMap::new();
            for row in rows {
                let (server, json) = row?;
                // Written by set_gpus from the same type; a row that does not parse (a
                // downgrade) reads as no GPUs rather than failing every listing.
                let gpus: Vec<weft_agent::Gpu> = serde_json::from_str(&json).unwrap_or_default();
                if !gpus.is_empty() {
                    out.insert(server, gpus);
                }
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(g: u64) -> ReportedPort {
        ReportedPort {
            guid: Guid(g),
            device: "mlx5_0".into(),
            num: 1,
            lid: 3,
            state: "ACTIVE".into(),
        }
    }

    fn enrolled(s: &SqliteStore, name: &str) {
        s.create_enrollment("admin:x", &format!("e-{name}"), None, 100, 1)
            .unwrap();
        s.enroll(&format!("e-{name}"), name, &format!("s-{name}"), 2)
            .unwrap();
    }

    #[test]
    fn a_move_is_one_operation_with_its_diff_and_the_audit_is_append_only() {
        let s = SqliteStore::in_memory().unwrap();
        s.create_tenant("admin:x", "alice", "ta", None, 1).unwrap();
        s.create_tenant("admin:x", "bob", "tb", None, 1).unwrap();
        for n in ["node1", "node2"] {
            enrolled(&s, n);
        }
        s.report("node1", &[port(0x101)], "h1", 3).unwrap();
        s.report("node2", &[port(0x201)], "h2", 3).unwrap();
        s.change(
            "admin:x",
            &Change::CreateGroup {
                name: "a".into(),
                tenant: "alice".into(),
            },
            4,
        )
        .unwrap();
        s.change(
            "admin:x",
            &Change::CreateGroup {
                name: "b".into(),
                tenant: "bob".into(),
            },
            4,
        )
        .unwrap();
        s.change(
            "admin:x",
            &Change::AddMember {
                group: "a".into(),
                server: "node1".into(),
            },
            5,
        )
        .unwrap();
        let op = s
            .change(
                "admin:x",
                &Change::Move {
                    server: "node1".into(),
                    to: "b".into(),
                },
                6,
            )
            .unwrap()
            .unwrap();
        assert_eq!(op.state, OpState::Pending);
        assert!(
            op.diff
                .contains("-a=0x0a01,ipoib : 0x0000000000000101=full ;"),
            "{}",
            op.diff
        );
        assert!(
            op.diff
                .contains("+b=0x0a02,ipoib : 0x0000000000000101=full ;"),
            "{}",
            op.diff
        );
        assert_eq!(s.desired().unwrap().generation, op.generation);
        // Refused changes leave nothing behind.
        let before = s.audit(100).unwrap().len();
        assert!(matches!(
            s.change(
                "admin:x",
                &Change::AddMember {
                    group: "a".into(),
                    server: "node1".into()
                },
                7
            ),
            Err(StoreError::Conflict(_))
        ));
        assert!(matches!(
            s.change(
                "admin:x",
                &Change::Move {
                    server: "node9".into(),
                    to: "a".into()
                },
                7
            ),
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(s.audit(100).unwrap().len(), before);
        let conn = s.conn.lock().unwrap();
        let err = conn
            .execute("UPDATE audit SET outcome = 'x'", [])
            .unwrap_err();
        assert!(err.to_string().contains("append-only"), "{err}");
        assert!(conn.execute("DELETE FROM audit", []).is_err());
    }

    #[test]
    fn a_guid_another_server_owns_is_held_pending_until_approved() {
        let s = SqliteStore::in_memory().unwrap();
        enrolled(&s, "node1");
        enrolled(&s, "node2");
        s.report("node1", &[port(0x101)], "h1", 3).unwrap();
        let out = s
            .report("node2", &[port(0x101), port(0x201)], "h2", 3)
            .unwrap();
        assert_eq!(out.ack.pending, vec![Guid(0x101)]);
        assert_eq!(out.ack.owned, vec![Guid(0x201)]);
        let claims = s.claims().unwrap();
        assert_eq!(
            (
                claims[0].claimant.as_str(),
                claims[0].owner.as_str(),
                claims[0].state.as_str()
            ),
            ("node2", "node1", "pending")
        );
        // Reporting again does not pile up claims.
        s.report("node2", &[port(0x101), port(0x201)], "h2b", 4)
            .unwrap();
        assert_eq!(s.claims().unwrap().len(), 1);
        s.change("admin:x", &Change::ApproveClaim { id: claims[0].id }, 5)
            .unwrap();
        let servers = s.servers(5, 30).unwrap();
        let node2 = servers.iter().find(|v| v.name == "node2").unwrap();
        assert_eq!(node2.ports.len(), 2);
        assert!(node2.pending_claims.is_empty());
    }

    #[test]
    fn enrollment_tokens_are_one_time_and_silence_makes_a_server_stale() {
        let s = SqliteStore::in_memory().unwrap();
        s.create_enrollment("admin:x", "e1", None, 100, 1).unwrap();
        s.enroll("e1", "node1", "s1", 2).unwrap();
        assert!(matches!(
            s.enroll("e1", "node9", "s9", 3),
            Err(StoreError::Refused(_))
        ));
        assert!(matches!(
            s.enroll("nope", "node9", "s9", 3),
            Err(StoreError::Refused(_))
        ));
        s.create_enrollment("admin:x", "e2", None, 10, 1).unwrap();
        assert!(matches!(
            s.enroll("e2", "node2", "s2", 11),
            Err(StoreError::Refused(_))
        ));
        assert_eq!(s.agent("s1").unwrap().as_deref(), Some("node1"));
        assert_eq!(s.servers(50, 30).unwrap()[0].liveness, Liveness::Never);
        s.heartbeat("node1", 50).unwrap();
        assert_eq!(s.servers(60, 30).unwrap()[0].liveness, Liveness::Ok);
        assert_eq!(s.servers(81, 30).unwrap()[0].liveness, Liveness::Stale);
        assert!(s.audit(100).unwrap().iter().any(|a| a.outcome == "refused"));
    }

    #[test]
    fn a_token_stops_at_its_expiry_and_a_revoked_bootstrap_token_cannot_come_back() {
        let s = SqliteStore::in_memory().unwrap();
        s.create_tenant("admin:x", "alice", "ta", Some(100), 1)
            .unwrap();
        assert!(s.principal("ta", 99).unwrap().is_some());
        assert!(s.principal("ta", 100).unwrap().is_none());
        s.bootstrap_admin("old", 1).unwrap();
        s.bootstrap_admin("new", 2).unwrap();
        assert!(s.principal("old", 3).unwrap().is_none());
        assert!(s.principal("new", 3).unwrap().is_some());
        assert!(matches!(
            s.bootstrap_admin("old", 4),
            Err(StoreError::Refused(_))
        ));
        assert!(matches!(
            s.bootstrap_admin("ta", 4),
            Err(StoreError::Refused(_))
        ));
    }

    #[test]
    fn the_schema_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        {
            let s = SqliteStore::open(&path).unwrap();
            s.create_tenant("admin:x", "alice", "ta", None, 1).unwrap();
        }
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.tenants().unwrap()[0].name, "alice");
        let conn = s.conn.lock().unwrap();
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }
}
