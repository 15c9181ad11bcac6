//! [`Store`] on SQLite: WAL journal, foreign keys on, the migrations of `../migrations/`
//! embedded and tracked in `PRAGMA user_version`. This file opens and migrates the
//! database, runs each call in one transaction and maps the trait onto the per-concern
//! files; the SQL lives in those.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::auth::{Principal, Role};
use crate::model::{
    AuditEntry, AuditPruned, ClaimView, GroupView, Liveness, OperationView, ServerView, StatusView,
    TenantView, TokenView,
};
use crate::render::Desired;
use crate::store::{
    AgentReport, Applied, AuditLine, Change, Fencing, ReportOutcome, ReportedPort, Result, Store,
    StoreError, VerifiedDelivery, guid_from_sql, guid_to_sql, migrations, secs,
};

mod audit;
mod backup;
mod console;
mod fencing;
mod groups;
mod leases;
mod links;
mod node_leases;
mod operations;
mod servers;
mod tenants;
mod tokens;

pub use backup::BackupReport;

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
        // A check that cannot even read the file (a damaged page in the schema or a
        // b-tree's interior) is the same finding as one that lists what is wrong.
        let check: Vec<String> = match (|| {
            let mut stmt = conn.prepare("PRAGMA quick_check(5)")?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
            rows.collect::<rusqlite::Result<Vec<String>>>()
        })() {
            Ok(c) => c,
            Err(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
                ) =>
            {
                vec![e.to_string()]
            }
            Err(e) => return Err(e.into()),
        };
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
        if let Some(why) = migrations::too_new(version) {
            return Err(refuse(path, why));
        }
        let tx = conn.transaction()?;
        for (i, m) in migrations::STEPS
            .iter()
            .enumerate()
            .skip(usize::try_from(version).unwrap_or(0))
        {
            tx.execute_batch(m.sqlite)?;
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

    fn report_host(&self, report: AgentReport, now: u64) -> Result<ReportOutcome> {
        let AgentReport {
            server,
            ports,
            report_hash,
            gpus,
            links,
        } = report;
        let gpus = serde_json::to_string(&gpus)
            .map_err(|e| StoreError::Invalid(format!("GPUs of `{server}`: {e}")))?;
        let links = serde_json::to_string(&links)
            .map_err(|e| StoreError::Invalid(format!("links of `{server}`: {e}")))?;
        self.tx(|tx| {
            let outcome = servers::report(tx, &server, &ports, &report_hash, now)?;
            servers::set_gpus(tx, &server, &gpus, now)?;
            servers::set_links(tx, &server, &links, now)?;
            Ok(outcome)
        })
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

    fn audit_prune(&self, actor: &str, before: u64, now: u64) -> Result<AuditPruned> {
        self.tx(|tx| audit::prune(tx, actor, before, now))
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

    fn health(&self) -> Result<()> {
        if let Some(free) = self.free_bytes()
            && free < MIN_FREE_BYTES
        {
            return Err(StoreError::Unavailable(format!(
                "the store {} cannot write: its file system has {free} bytes free (under {MIN_FREE_BYTES})",
                self.path.display()
            )));
        }
        let fault = self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(fault) = fault {
            // Space came back, perhaps: a small write says whether writes work again.
            let probe =
                self.tx(|tx| set_meta(tx, "health_probe", &crate::server::unix_now().to_string()));
            if probe.is_err() {
                return Err(StoreError::Unavailable(fault));
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

    fn add_link_run(
        &self,
        actor: &str,
        run: &crate::links::LinkRunIn,
        now: u64,
    ) -> Result<crate::links::LinkRunView> {
        self.tx(|tx| links::add(tx, actor, run, now))
    }

    fn link_runs(&self, limit: usize) -> Result<Vec<crate::links::LinkRunView>> {
        self.tx(|tx| links::newest(tx, limit))
    }

    fn console_session_create(
        &self,
        session: &crate::store::ConsoleSession,
        ttl_s: u64,
        max_live: usize,
    ) -> Result<()> {
        self.tx(|tx| console::create(tx, session, ttl_s, max_live))
    }

    fn console_session(&self, id_hash: &str) -> Result<Option<crate::store::ConsoleSession>> {
        self.tx(|tx| console::get(tx, id_hash))
    }

    fn console_session_end(&self, id_hash: &str, now: u64) -> Result<bool> {
        self.tx(|tx| console::end(tx, id_hash, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_is_append_only_in_sqlite_itself() {
        let s = SqliteStore::in_memory().unwrap();
        s.audit_append(
            &AuditLine {
                actor: "admin:x",
                action: "test",
                subject: "store",
                outcome: "ok",
                ..AuditLine::default()
            },
            1,
        )
        .unwrap();
        let conn = s.conn.lock().unwrap();
        let err = conn
            .execute("UPDATE audit SET outcome = 'x'", [])
            .unwrap_err();
        assert!(err.to_string().contains("append-only"), "{err}");
        assert!(conn.execute("DELETE FROM audit", []).is_err());
        drop(conn);
        // After a prune (its line the newest), still nothing else goes: not a line newer
        // than its cut-off, not its own line, no update.
        s.audit_append(
            &AuditLine {
                actor: "admin:x",
                action: "test",
                subject: "kept",
                outcome: "ok",
                ..AuditLine::default()
            },
            5,
        )
        .unwrap();
        let pruned = s.audit_prune("operator:root", 3, 6).unwrap();
        assert_eq!((pruned.count, pruned.oldest), (1, Some(1)));
        let conn = s.conn.lock().unwrap();
        for sql in [
            "DELETE FROM audit",
            "DELETE FROM audit WHERE action = 'audit.prune'",
            "UPDATE audit SET detail = '{\"before\": 99}'",
        ] {
            let err = conn.execute(sql, []).unwrap_err();
            assert!(err.to_string().contains("append-only"), "{sql}: {err}");
        }
        let left: Vec<(String, i64)> = conn
            .prepare("SELECT action, at FROM audit ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            left,
            [("test".to_string(), 5), ("audit.prune".to_string(), 6)]
        );
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
