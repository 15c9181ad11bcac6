//! [`Store`] on SQLite: WAL journal, foreign keys on, the migrations of `../migrations/`
//! embedded and tracked in `PRAGMA user_version`. This file opens and migrates the
//! database, runs each call in one transaction and maps the trait onto the per-concern
//! files; the SQL lives in those.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use weft_fabric::Guid;

use crate::auth::{Principal, Role};
use crate::model::{
    AuditEntry, ClaimView, GroupView, Liveness, OperationView, ServerView, StatusView, TenantView,
    TokenView,
};
use crate::render::Desired;
use crate::store::{
    Applied, AuditLine, Change, Fencing, ReportOutcome, ReportedPort, Result, Store, StoreError,
    VerifiedDelivery,
};

mod audit;
mod backup;
mod fencing;
mod groups;
mod leases;
mod node_leases;
mod operations;
mod servers;
mod tenants;
mod tokens;

pub use backup::BackupReport;

/// The schema's migrations, in order; a database at `user_version` N has run the first N.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_schema.sql"),
    include_str!("../migrations/0002_token_life_and_lease.sql"),
    include_str!("../migrations/0003_operation_warning.sql"),
    include_str!("../migrations/0004_server_gpus.sql"),
    include_str!("../migrations/0005_operation_taken.sql"),
    include_str!("../migrations/0006_node_leases.sql"),
    include_str!("../migrations/0007_server_links.sql"),
];

/// [`Store`] on SQLite: WAL journal, foreign keys on, embedded migrations tracked in
/// `PRAGMA user_version`. One connection behind a mutex: SQLite serializes writers anyway.
pub struct SqliteStore {
    conn: Mutex<Connection>,
    /// The database file (`:memory:` for a store in memory), named in every fault.
    path: std::path::PathBuf,
    /// Why the last write failed for the storage's sake, until a write succeeds again.
    fault: Mutex<Option<String>>,
}

/// Below this many free bytes on the store's file system, readiness fails: a transaction
/// writes a few pages and their WAL frames, and a full disk fails writes half way.
const MIN_FREE_BYTES: u64 = 256 * 1024;

/// Why a store file cannot be opened: it names the file and what is wrong with it.
fn refuse(path: &Path, why: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("the store {}: {why}", path.display()))
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        if is_storage_fault(&e) {
            StoreError::Storage(e.to_string())
        } else {
            StoreError::Db(e.to_string())
        }
    }
}

/// Whether a database error is the storage's (space, I/O, permissions, a damaged file)
/// rather than the call's.
fn is_storage_fault(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode as C;
    matches!(
        e.sqlite_error_code(),
        Some(
            C::DiskFull
                | C::SystemIoFailure
                | C::ReadOnly
                | C::CannotOpen
                | C::DatabaseCorrupt
                | C::NotADatabase
                | C::PermissionDenied
                | C::FileLockingProtocolFailed
        )
    )
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteStore")
    }
}

/// A GUID as SQLite's INTEGER (the same 64 bits).
fn guid_to_sql(g: Guid) -> i64 {
    g.0 as i64
}

/// A GUID read back from SQLite.
fn guid_from_sql(i: i64) -> Guid {
    Guid(i as u64)
}

/// Seconds since the epoch read back from SQLite (a negative value reads as 0).
fn secs(i: i64) -> u64 {
    u64::try_from(i).unwrap_or(0)
}

impl SqliteStore {
    /// Opens the database at `path`, creating it (mode 0600) when it is missing or empty
    /// (`weft controller --init`), checks it and migrates it.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        Self::open_with(path, true)
    }

    /// Opens the existing database at `path`, checks it and migrates it: a missing or
    /// empty file is refused, naming it (it is created only when asked: [`Self::open`]).
    pub fn open_existing(path: &Path) -> Result<SqliteStore> {
        Self::open_with(path, false)
    }

    fn open_with(path: &Path, init: bool) -> Result<SqliteStore> {
        let len = match std::fs::metadata(path) {
            Ok(m) => Some(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(refuse(path, e)),
        };
        if !init {
            match len {
                None => {
                    return Err(refuse(
                        path,
                        "no such file; `weft controller --init` creates a new store (an existing one is refused if missing, so that a lost or unmounted file is never replaced by an empty store)",
                    ));
                }
                Some(0) => {
                    return Err(refuse(
                        path,
                        "the file is empty; `weft controller --init` makes a new store in it",
                    ));
                }
                Some(_) => {}
            }
        }
        if len.is_none() {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| refuse(path, format!("cannot create it: {e}")))?;
        }
        let conn = Connection::open(path).map_err(|e| refuse(path, e))?;
        let store = Self::with_connection(conn, path).map_err(|e| match e {
            StoreError::Db(e) | StoreError::Storage(e) => refuse(path, e),
            other => other,
        })?;
        // The database, its WAL and shared-memory files hold token hashes: owner only.
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            let p = std::path::PathBuf::from(p);
            if p.exists() {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| refuse(&p, format!("cannot make it private (0600): {e}")))?;
            }
        }
        Ok(store)
    }

    /// An in-memory database (tests).
    pub fn in_memory() -> Result<SqliteStore> {
        Self::with_connection(Connection::open_in_memory()?, Path::new(":memory:"))
    }

    fn with_connection(mut conn: Connection, path: &Path) -> Result<SqliteStore> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // A damaged file is refused at start, naming it, not some requests later.
        let mut check: Vec<String> = Vec::new();
        {
            let mut stmt = conn.prepare("PRAGMA quick_check(5)")?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
            for r in rows {
                check.push(r?);
            }
        }
        if check != ["ok"] {
            return Err(refuse(
                path,
                format!(
                    "SQLite's quick_check finds it damaged: {}; restore it from a backup (`weft controller restore`)",
                    check.join("; ")
                ),
            ));
        }
        // WAL: readers never block the writer; NORMAL sync is durable across a process
        // crash (kill -9), which is the failure the controller must survive.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if usize::try_from(version).unwrap_or(usize::MAX) > MIGRATIONS.len() {
            return Err(refuse(
                path,
                format!(
                    "its schema is version {version}, newer than this weft's {}: run the weft that wrote it, or a newer one",
                    MIGRATIONS.len()
                ),
            ));
        }
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
            path: path.to_path_buf(),
            fault: Mutex::new(None),
        })
    }

    fn tx<T>(&self, f: impl FnOnce(&Transaction) -> Result<T>) -> Result<T> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let before = conn.total_changes();
        let out = (|| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            // A write on a nearly full file system is refused whole (rolled back) rather
            // than left to fail half way through a checkpoint.
            if tx.total_changes() != before
                && let Some(free) = self.free_bytes()
                && free < MIN_FREE_BYTES
            {
                return Err(StoreError::Unavailable(format!(
                    "the store {} cannot write: its file system has {free} bytes free (under {MIN_FREE_BYTES})",
                    self.path.display()
                )));
            }
            tx.commit()?;
            Ok(out)
        })();
        match out {
            Ok(v) => {
                if conn.total_changes() != before {
                    *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                Ok(v)
            }
            Err(StoreError::Unavailable(why)) => {
                tracing::error!(store = %self.path.display(), %why, "store fault");
                *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                Err(StoreError::Unavailable(why))
            }
            Err(StoreError::Storage(e)) => {
                let why = format!("the store {} cannot write: {e}", self.path.display());
                tracing::error!(store = %self.path.display(), error = %e, "store fault");
                *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                Err(StoreError::Unavailable(why))
            }
            Err(e) => Err(e),
        }
    }

    /// Free bytes on the store's file system (`None`: in memory, or statvfs failed).
    fn free_bytes(&self) -> Option<u64> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ if self.path == Path::new(":memory:") => return None,
            _ => Path::new("."),
        };
        let v = nix::sys::statvfs::statvfs(dir).ok()?;
        Some(v.blocks_available().saturating_mul(v.fragment_size()))
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

/// Appends an audit line: the short form of [`audit::append`] that the concerns use.
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
    let line = AuditLine {
        actor,
        action,
        subject,
        diff,
        outcome,
        detail,
    };
    audit::append(tx, now, &line)
}

fn exists(tx: &Transaction, sql: &str, key: &dyn rusqlite::ToSql) -> Result<bool> {
    Ok(tx.query_row(sql, [key], |_| Ok(())).optional()?.is_some())
}

impl Store for SqliteStore {
    fn bootstrap_admin(&self, hash: &str, now: u64) -> Result<()> {
        self.tx(|tx| tokens::bootstrap_admin(tx, hash, now))
    }

    fn principal(&self, hash: &str, now: u64) -> Result<Option<Principal>> {
        self.tx(|tx| tokens::principal(tx, hash, now))
    }

    fn create_api_token(
        &self,
        actor: &str,
        role: &Role,
        hash: &str,
        expires: Option<u64>,
        now: u64,
    ) -> Result<()> {
        self.tx(|tx| tokens::create_api_token(tx, actor, role, hash, expires, now))
    }

    fn tokens(&self) -> Result<Vec<TokenView>> {
        self.tx(tokens::tokens)
    }

    fn revoke_token(&self, actor: &str, id: &str, now: u64) -> Result<()> {
        self.tx(|tx| tokens::revoke_token(tx, actor, id, now))
    }

    fn create_tenant(
        &self,
        actor: &str,
        name: &str,
        token_hash: &str,
        expires: Option<u64>,
        now: u64,
    ) -> Result<TenantView> {
        self.tx(|tx| tenants::create_tenant(tx, actor, name, token_hash, expires, now))
    }

    fn delete_tenant(&self, actor: &str, name: &str, now: u64) -> Result<()> {
        self.tx(|tx| tenants::delete_tenant(tx, actor, name, now))
    }

    fn remove_server(&self, actor: &str, name: &str, now: u64) -> Result<()> {
        self.tx(|tx| servers::remove_server(tx, actor, name, now))
    }

    fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_s: u64,
        now: u64,
        steal: &dyn Fn(&str) -> bool,
    ) -> Result<Result<(), String>> {
        self.tx(|tx| leases::acquire_lease(tx, name, holder, ttl_s, now, steal))
    }

    fn release_lease(&self, name: &str, holder: &str) -> Result<()> {
        self.tx(|tx| leases::release_lease(tx, name, holder))
    }

    fn tenants(&self) -> Result<Vec<TenantView>> {
        self.tx(tenants::tenants)
    }

    fn create_enrollment(
        &self,
        actor: &str,
        hash: &str,
        server: Option<&str>,
        expires: u64,
        now: u64,
    ) -> Result<()> {
        self.tx(|tx| servers::create_enrollment(tx, actor, hash, server, expires, now))
    }

    fn enroll(
        &self,
        token_hash: &str,
        hostname: &str,
        secret_hash: &str,
        now: u64,
    ) -> Result<String> {
        match self.tx(|tx| servers::enroll(tx, token_hash, hostname, secret_hash, now))? {
            Ok(s) => Ok(s),
            Err(why) => {
                // The refusal is audited in its own transaction (the failed one changed nothing).
                let actor = format!("agent:{hostname}");
                let line = AuditLine {
                    actor: &actor,
                    action: "agent.enroll",
                    subject: hostname,
                    outcome: "refused",
                    detail: &why,
                    ..AuditLine::default()
                };
                self.audit_append(&line, now)?;
                Err(StoreError::Refused(why))
            }
        }
    }

    fn agent(&self, secret_hash: &str) -> Result<Option<String>> {
        self.tx(|tx| servers::agent(tx, secret_hash))
    }

    fn report(
        &self,
        server: &str,
        ports: &[ReportedPort],
        report_hash: &str,
        now: u64,
    ) -> Result<ReportOutcome> {
        self.tx(|tx| servers::report(tx, server, ports, report_hash, now))
    }

    fn heartbeat(&self, server: &str, now: u64) -> Result<()> {
        self.tx(|tx| servers::heartbeat(tx, server, now))
    }

    fn servers(&self, now: u64, stale_after_s: u64) -> Result<Vec<ServerView>> {
        self.tx(|tx| servers::servers(tx, now, stale_after_s))
    }

    fn groups(&self) -> Result<Vec<GroupView>> {
        self.tx(groups::groups)
    }

    fn change(&self, actor: &str, change: &Change, now: u64) -> Result<Option<OperationView>> {
        self.tx(|tx| groups::change(tx, actor, change, now))
    }

    fn reject_claim(&self, actor: &str, id: i64, now: u64) -> Result<()> {
        self.tx(|tx| servers::reject_claim(tx, actor, id, now))
    }

    fn claims(&self) -> Result<Vec<ClaimView>> {
        self.tx(servers::claims)
    }

    fn desired(&self) -> Result<Desired> {
        self.tx(groups::read_desired)
    }

    fn applied(&self) -> Result<Applied> {
        self.tx(operations::applied)
    }

    fn mark_applied(&self, delivered: &VerifiedDelivery<'_>, now: u64) -> Result<Vec<i64>> {
        self.tx(|tx| operations::mark_applied(tx, delivered, now))
    }

    fn mark_failed(&self, generation: i64, error: &str, now: u64) -> Result<()> {
        self.tx(|tx| operations::mark_failed(tx, generation, error, now))
    }

    fn operation(&self, id: i64) -> Result<OperationView> {
        self.tx(|tx| operations::read_operation(tx, id))
    }

    fn operations(&self, pending_only: bool) -> Result<Vec<OperationView>> {
        self.tx(|tx| operations::operations(tx, pending_only))
    }

    fn audit_append(&self, line: &AuditLine<'_>, now: u64) -> Result<()> {
        self.tx(|tx| audit::append(tx, now, line))
    }

    fn controller_id(&self) -> Result<String> {
        self.tx(leases::controller_id)
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
        self.tx(|tx| groups::adopt(tx, conf, pkeys, names, detail, now))
    }

    fn health(&self) -> std::result::Result<(), String> {
        if let Some(free) = self.free_bytes()
            && free < MIN_FREE_BYTES
        {
            return Err(format!(
                "the store {} cannot write: its file system has {free} bytes free (under {MIN_FREE_BYTES})",
                self.path.display()
            ));
        }
        let fault = self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(fault) = fault {
            // Space came back, perhaps: a small write says whether writes work again.
            let probe =
                self.tx(|tx| set_meta(tx, "health_probe", &crate::server::unix_now().to_string()));
            if probe.is_err() {
                return Err(fault);
            }
        }
        Ok(())
    }

    fn fencing(&self) -> Result<Fencing> {
        self.tx(fencing::fencing)
    }

    fn begin_delivery(&self, generation: i64, checksum: &str) -> Result<()> {
        self.tx(|tx| fencing::begin_delivery(tx, generation, checksum))
    }

    fn raise_fencing(
        &self,
        actor: &str,
        above: u64,
        held: Option<&str>,
        diff: &str,
        detail: &str,
        now: u64,
    ) -> Result<u64> {
        self.tx(|tx| fencing::raise(tx, actor, above, held, (diff, detail), now))
    }

    fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>> {
        self.tx(|tx| audit::newest(tx, limit))
    }

    fn status(&self, now: u64, stale_after_s: u64) -> Result<StatusView> {
        let stale_servers = self
            .servers(now, stale_after_s)?
            .into_iter()
            .filter(|s| s.liveness == Liveness::Stale)
            .map(|s| s.name)
            .collect();
        self.tx(|tx| operations::status(tx, stale_servers))
    }

    fn set_gpus(&self, server: &str, gpus: &[weft_agent::Gpu], now: u64) -> Result<()> {
        let json = serde_json::to_string(gpus)
            .map_err(|e| StoreError::Invalid(format!("GPUs of `{server}`: {e}")))?;
        self.tx(|tx| servers::set_gpus(tx, server, &json, now))
    }

    fn gpus(&self) -> Result<BTreeMap<String, Vec<weft_agent::Gpu>>> {
        self.tx(servers::gpus)
    }

    fn lease_records(&self) -> Result<crate::store::LeaseRecords> {
        self.tx(node_leases::records)
    }

    fn lease_commit(
        &self,
        commit: &crate::store::LeaseCommit<'_>,
        now: u64,
    ) -> Result<Vec<OperationView>> {
        self.tx(|tx| node_leases::commit(tx, commit, now))
    }

    fn set_lease_quota(
        &self,
        actor: &str,
        tenant: &str,
        quota: Option<&weft_lease::Quota>,
        now: u64,
    ) -> Result<()> {
        self.tx(|tx| node_leases::set_quota(tx, actor, tenant, quota, now))
    }

    fn lease_decisions(&self, lease: u64) -> Result<Vec<crate::lease::model::LeaseDecisionView>> {
        self.tx(|tx| node_leases::decisions(tx, lease))
    }

    fn lease_notices(&self, server: &str) -> Result<Vec<crate::lease::model::LeaseNotice>> {
        self.tx(|tx| node_leases::notices(tx, server))
    }

    fn set_links(&self, server: &str, links: &crate::model::HostLinks, now: u64) -> Result<()> {
        let json = serde_json::to_string(links)
            .map_err(|e| StoreError::Invalid(format!("links of `{server}`: {e}")))?;
        self.tx(|tx| servers::set_links(tx, server, &json, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Liveness, OpState};

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

    #[test]
    fn the_fencing_number_only_rises_and_deliveries_in_flight_end_with_the_applied_one() {
        let s = SqliteStore::in_memory().unwrap();
        assert_eq!(
            s.fencing().unwrap(),
            Fencing {
                number: 1,
                in_flight: vec![]
            }
        );
        s.begin_delivery(1, "aa").unwrap();
        s.begin_delivery(1, "aa").unwrap();
        s.begin_delivery(2, "bb").unwrap();
        assert_eq!(s.fencing().unwrap().in_flight, ["aa", "bb"]);
        let d = VerifiedDelivery {
            generation: 1,
            checksum: "aa",
            conf: "x",
            detail: "",
            warning: None,
            taken: "",
        };
        s.mark_applied(&d, 2).unwrap();
        // At or below the applied generation a file is replaceable anyway.
        assert_eq!(s.fencing().unwrap().in_flight, ["bb"]);
        // Raised above what the SMs hold, never below its own.
        assert_eq!(
            s.raise_fencing("operator:x", 5, None, "", "held 5", 3)
                .unwrap(),
            6
        );
        assert_eq!(
            s.raise_fencing("operator:x", 2, Some("held"), "-a\n+b", "held 2", 4)
                .unwrap(),
            7
        );
        let f = s.fencing().unwrap();
        assert_eq!((f.number, f.in_flight.len()), (7, 0));
        assert_eq!(s.applied().unwrap().conf.as_deref(), Some("held"));
        let a = s.audit(10).unwrap();
        let raised: Vec<&AuditEntry> = a.iter().filter(|l| l.action == "fence").collect();
        assert_eq!(raised.len(), 2);
        assert!(
            raised[1].detail.contains("6 -> 7") && raised[1].diff == "-a\n+b",
            "{a:?}"
        );
    }

    #[test]
    fn a_missing_or_empty_file_is_created_only_when_asked_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let e = SqliteStore::open_existing(&path).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("--init"),
            "{e}"
        );
        assert!(!path.exists(), "a refused open must not create the file");
        std::fs::write(&path, b"").unwrap();
        let e = SqliteStore::open_existing(&path).unwrap_err().to_string();
        assert!(e.contains("empty") && e.contains("--init"), "{e}");
        std::fs::remove_file(&path).unwrap();
        {
            let s = SqliteStore::open(&path).unwrap();
            s.create_tenant("admin:x", "alice", "ta", None, 1).unwrap();
        }
        let s = SqliteStore::open_existing(&path).unwrap();
        assert_eq!(s.tenants().unwrap()[0].name, "alice");
        for suffix in ["", "-wal", "-shm"] {
            let p = dir.path().join(format!("c.db{suffix}"));
            if p.exists() {
                let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "{}", p.display());
            }
        }
    }

    #[test]
    fn a_damaged_file_or_a_newer_schema_is_refused_at_start_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        {
            let s = SqliteStore::open(&path).unwrap();
            for i in 0..300 {
                let name = format!("tenant{i:03}");
                s.create_tenant("admin:x", &name, &format!("t{i}"), None, 1)
                    .unwrap();
            }
        }
        // Closed: the WAL is checkpointed into the file. Garbage into its middle.
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 64 * 1024, "{}", bytes.len());
        let mid = bytes.len() / 2 / 4096 * 4096;
        for b in &mut bytes[mid..mid + 4096] {
            *b = 0xa5;
        }
        std::fs::write(&path, &bytes).unwrap();
        let e = SqliteStore::open_existing(&path).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("damaged"),
            "{e}"
        );
        // Refused as it is: the file is not changed (nor "repaired" into less).
        assert_eq!(std::fs::read(&path).unwrap(), bytes);

        let newer = dir.path().join("newer.db");
        drop(SqliteStore::open(&newer).unwrap());
        let conn = Connection::open(&newer).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let e = SqliteStore::open_existing(&newer).unwrap_err().to_string();
        assert!(e.contains("version 99") && e.contains("newer.db"), "{e}");
    }
}
