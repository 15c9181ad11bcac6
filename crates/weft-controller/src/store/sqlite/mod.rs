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
    Applied, AuditLine, Change, ReportOutcome, ReportedPort, Result, Store, StoreError,
    VerifiedDelivery,
};

mod audit;
mod groups;
mod leases;
mod operations;
mod servers;
mod tenants;
mod tokens;

/// The schema's migrations, in order; a database at `user_version` N has run the first N.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_schema.sql"),
    include_str!("../migrations/0002_token_life_and_lease.sql"),
    include_str!("../migrations/0003_operation_warning.sql"),
    include_str!("../migrations/0004_server_gpus.sql"),
    include_str!("../migrations/0005_server_links.sql"),
];

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
}
