//! The store on PostgreSQL: the schema from [`super::migrations`] (PostgreSQL's text of
//! each step), its version in the table `weft_schema`, and each call one transaction, as
//! on SQLite.
//!
//! The bridge from the sync [`super::Store`] trait is the `postgres` crate's blocking
//! client: the trait is called on tokio's blocking threads (`spawn_blocking`), one call is
//! one transaction, and the client runs each statement to completion on its own small
//! runtime, so no async code leaks into the store. Writes go through one connection;
//! writers are serialized across every controller on the database by a
//! transaction-scoped advisory lock ([`WRITE_LOCK`]), as SQLite's `BEGIN IMMEDIATE`
//! serializes them on one file: a change reads, decides and writes without another
//! controller's change in between. Reads that no delivery decides on (listings, an
//! agent's secret, a token) run on [`READERS`] more connections, each a `REPEATABLE
//! READ READ ONLY` snapshot of what was committed, without the lock, so they never queue
//! behind a write. Agents' reports are committed together ([`reports`]: group commit).
//! Each connection keeps the statements it prepared for the hot paths.
//! The same lock makes ids as SQLite makes them: the next id of an operation, an audit
//! line, a claim or a lease decision is one above the highest (a sequence would leave
//! the ids of a rolled-back transaction unused, and the two backends would number apart).
//!
//! A lost connection, a server shutting down, a full disk or a read-only server is
//! [`StoreError::Unavailable`], naming the store (its URL without a password) and the
//! cause; the connection is dropped and made again at the next call.
//!
//! Layout: this file connects, migrates and runs transactions; one file per concern
//! holds its SQL (`audit`, `fencing`, `node_leases`, ...), one function per store method.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use postgres::{Client, NoTls, Statement, Transaction};

use crate::auth::{Principal, Role};
use crate::model::{
    AuditEntry, AuditPruned, ClaimView, GroupView, Liveness, OperationView, ServerView, StatusView,
    TenantView, TokenView,
};
use crate::render::Desired;
use crate::store::{
    AgentReport, Applied, AuditLine, Change, Election, Fencing, ReportOutcome, ReportedPort,
    Result, Store, StoreError, VerifiedDelivery, guid_from_sql, guid_to_sql, migrations, secs,
};

mod audit;
mod console;
mod fencing;
mod groups;
mod leader;
mod leases;
mod links;
mod node_leases;
mod operations;
mod reports;
mod servers;
mod tenants;
mod tokens;

/// The advisory lock key every write transaction takes (`pg_advisory_xact_lock`): "weft".
pub(crate) const WRITE_LOCK: i64 = 0x7765_6674;

/// The statement that takes [`WRITE_LOCK`].
const LOCK_SQL: &str = "SELECT pg_advisory_xact_lock($1)";

/// How long a connection attempt may take before the store is unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The server-side bounds of every statement and lock wait (milliseconds): a stuck
/// statement or a lock held by a dead peer is an error within them, never a hang.
const SESSION_OPTIONS: &str =
    "-c statement_timeout=15000 -c lock_timeout=10000 -c idle_in_transaction_session_timeout=30000";

/// The bounds of the election connection's statements, lock waits and connects
/// (milliseconds): a renewal that cannot finish well inside the leader's lease fails
/// fast, so that the leader's own clock, not a hung call, decides when it stops.
const ELECTION_OPTIONS: &str =
    "-c statement_timeout=1000 -c lock_timeout=1000 -c idle_in_transaction_session_timeout=5000";

/// How long the election connection may take to connect.
const ELECTION_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How many connections serve reads ([`PgStore::read`]), beside the one for writes.
const READERS: usize = 3;

/// A connection and the statements prepared on it (made again with the connection).
struct Conn {
    client: Client,
    prepared: HashMap<&'static str, Statement>,
}

impl Conn {
    /// The statements of `sqls`, each prepared on this connection once.
    fn statements<const N: usize>(&mut self, sqls: [&'static str; N]) -> Result<[Statement; N]> {
        let mut out = Vec::with_capacity(N);
        for sql in sqls {
            let st = match self.prepared.get(sql) {
                Some(st) => st.clone(),
                None => {
                    let st = self.client.prepare(sql)?;
                    self.prepared.insert(sql, st.clone());
                    st
                }
            };
            out.push(st);
        }
        out.try_into()
            .map_err(|_| StoreError::Db("prepared statements: wrong count".into()))
    }
}

/// One connection, made at its first call and again after a fault.
type Slot = Mutex<Option<Conn>>;

/// Which connection a call runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    /// The one for writes (and reads that a delivery decides on).
    Write,
    /// One of the [`READERS`]: read-only snapshots, never behind a write.
    Read,
    /// The election's.
    Election,
}

/// The controller's store on PostgreSQL.
pub struct PgStore {
    config: postgres::Config,
    /// The URL without its password, named in every fault.
    name: String,
    client: Slot,
    /// The read connections' config (the same, named apart in `pg_stat_activity`).
    reader_config: postgres::Config,
    /// Connections for reads that need no write lock (listings, an agent's secret, a
    /// token): each a `REPEATABLE READ READ ONLY` snapshot of committed state, so a read
    /// never waits for a write, nor a write for a read.
    readers: [Slot; READERS],
    /// The reader a blocked read waits for (round robin).
    next_reader: AtomicUsize,
    /// The election's own connection ([`Store::elect`]) and its tighter bounds, so that
    /// a renewal never queues behind an API call on `client`.
    elector_config: postgres::Config,
    elector: Slot,
    /// Agents' reports waiting to be committed together ([`Store::report_host`]).
    reports: Mutex<reports::Queue>,
    /// Why the last call failed for the database's sake, until a call succeeds again.
    fault: Mutex<Option<String>>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // The client's close blocks on its own runtime: never on a runtime's thread.
        let mut conns: Vec<Option<Conn>> = vec![
            self.client
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
            self.elector
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        ];
        for r in &mut self.readers {
            conns.push(r.get_mut().unwrap_or_else(|p| p.into_inner()).take());
        }
        if tokio::runtime::Handle::try_current().is_ok() && !super::on_blocking_thread() {
            std::thread::scope(|scope| {
                scope.spawn(move || drop(conns));
            });
        }
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgStore({})", self.name)
    }
}

/// `url` without the password of its user, if it has one.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some((a, h)) => (Some(a), h),
        None => (None, rest),
    };
    match auth {
        Some(a) => {
            let user = a.split_once(':').map_or(a, |(u, _)| u);
            format!("{scheme}://{user}@{host}")
        }
        None => format!("{scheme}://{host}"),
    }
}

/// Whether a PostgreSQL error is the database's or the connection's (unreachable, shut
/// down, out of space or memory, read-only, damaged) rather than the call's.
fn is_storage_fault(e: &postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        // No answer from the server: the connection (I/O, closed, a timeout).
        return true;
    };
    let code = db.code().code();
    code.starts_with("08") // connection exception
        || code.starts_with("53") // insufficient resources: disk full, out of memory
        || code.starts_with("57P") // admin or crash shutdown, cannot connect now
        || code.starts_with("58") // system error (I/O)
        || code.starts_with("XX") // internal error, data corrupted
        || code == "25006" // read-only transaction (a standby)
}

/// The error's words: the server's message (and detail) or the connection's cause.
fn words(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return match db.detail() {
            Some(d) => format!("{} ({d})", db.message()),
            None => db.message().to_string(),
        };
    }
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> StoreError {
        if is_storage_fault(&e) {
            StoreError::Storage(words(&e))
        } else {
            StoreError::Db(words(&e))
        }
    }
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user@host/db`, a unix socket
    /// directory as a percent-encoded host), and migrates it. With `init`, a database
    /// without a weft schema gets one (`weft controller --init`); without, it is refused,
    /// so that a wrong or emptied database is never taken for a new store.
    pub fn open(url: &str, init: bool) -> Result<PgStore> {
        let name = redact(url);
        let mut config: postgres::Config = url.parse().map_err(|e: postgres::Error| {
            StoreError::Invalid(format!("the store URL {name}: {}", words(&e)))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let options = match config.get_options() {
            Some(o) => format!("{o} {SESSION_OPTIONS}"),
            None => SESSION_OPTIONS.to_string(),
        };
        config.options(&options);
        config.keepalives(true);
        config.application_name("weft-controller");
        let mut elector_config = config.clone();
        let options = match elector_config.get_options() {
            Some(o) => format!("{} {ELECTION_OPTIONS}", o.replace(SESSION_OPTIONS, "")),
            None => ELECTION_OPTIONS.to_string(),
        };
        elector_config.options(options.trim());
        let connect = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_TIMEOUT);
        elector_config.connect_timeout(connect.min(ELECTION_CONNECT_TIMEOUT));
        elector_config.application_name("weft-controller election");
        let mut reader_config = config.clone();
        reader_config.application_name("weft-controller read");
        let store = PgStore {
            config,
            name,
            client: Mutex::new(None),
            reader_config,
            readers: std::array::from_fn(|_| Mutex::new(None)),
            next_reader: AtomicUsize::new(0),
            elector_config,
            elector: Mutex::new(None),
            reports: Mutex::new(reports::Queue::default()),
            fault: Mutex::new(None),
        };
        store.migrate(init).map_err(|e| match e {
            StoreError::Db(e) | StoreError::Storage(e) => store.refuse(e),
            other => other,
        })?;
        Ok(store)
    }

    /// The store's name in messages: its URL without a password.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn refuse(&self, why: impl std::fmt::Display) -> StoreError {
        StoreError::Unavailable(format!("the store {}: {why}", self.name))
    }

    fn migrate(&self, init: bool) -> Result<()> {
        self.run(|tx| {
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK])?;
            let exists: bool = tx
                .query_one("SELECT to_regclass('weft_schema') IS NOT NULL", &[])?
                .get(0);
            if !exists {
                let tables: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()",
                        &[],
                    )?
                    .get(0);
                if !init {
                    return Err(StoreError::Unavailable(format!(
                        "the store {}: the database has no weft store ({tables} other tables); `weft controller --init` creates one in it",
                        self.name
                    )));
                }
                if tables > 0 {
                    return Err(StoreError::Unavailable(format!(
                        "the store {}: the database already holds {tables} tables that are not a weft store; give weft an empty database",
                        self.name
                    )));
                }
                tx.batch_execute("CREATE TABLE weft_schema (version BIGINT NOT NULL)")?;
                tx.execute("INSERT INTO weft_schema (version) VALUES (0)", &[])?;
            }
            let version: i64 = tx.query_one("SELECT version FROM weft_schema", &[])?.get(0);
            if let Some(why) = migrations::too_new(version) {
                return Err(StoreError::Unavailable(format!(
                    "the store {}: {why}",
                    self.name
                )));
            }
            for (i, step) in migrations::STEPS
                .iter()
                .enumerate()
                .skip(usize::try_from(version).unwrap_or(0))
            {
                tx.batch_execute(step.postgres())?;
                tx.execute("UPDATE weft_schema SET version = $1", &[&(i as i64 + 1)])?;
            }
            Ok(())
        })
    }

    /// The schema version of the database (the number of [`migrations::STEPS`] it has run).
    pub fn schema_version(&self) -> Result<i64> {
        self.run(|tx| Ok(tx.query_one("SELECT version FROM weft_schema", &[])?.get(0)))
    }

    /// Runs `f` in one transaction holding [`WRITE_LOCK`].
    fn tx<T: Send>(&self, f: impl FnOnce(&mut Transaction<'_>) -> Result<T> + Send) -> Result<T> {
        self.off_runtime(|| {
            self.with_conn(Which::Write, |conn| {
                let [lock] = conn.statements([LOCK_SQL])?;
                let mut tx = conn.client.transaction()?;
                tx.execute(&lock, &[&WRITE_LOCK])?;
                let out = f(&mut tx)?;
                tx.commit()?;
                Ok(out)
            })
        })
    }

    /// Runs `f` in one transaction, connecting first when there is no live connection;
    /// a fault of the connection or the server is [`StoreError::Unavailable`] and drops
    /// the connection.
    fn run<T: Send>(&self, f: impl FnOnce(&mut Transaction<'_>) -> Result<T> + Send) -> Result<T> {
        self.run_on(Which::Write, f)
    }

    /// Runs `f` in a read-only snapshot (`REPEATABLE READ READ ONLY`) on one of the
    /// read connections: it takes no lock, so it never waits for a write; what it sees
    /// is what was committed when it began.
    fn read<T: Send>(&self, f: impl FnOnce(&mut Transaction<'_>) -> Result<T> + Send) -> Result<T> {
        self.run_on(Which::Read, f)
    }

    /// [`PgStore::run`] on the connection `which`.
    fn run_on<T: Send>(
        &self,
        which: Which,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<T> + Send,
    ) -> Result<T> {
        self.off_runtime(|| {
            self.with_conn(which, |conn| {
                let mut tx = if which == Which::Read {
                    conn.client
                        .build_transaction()
                        .isolation_level(postgres::IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start()?
                } else {
                    conn.client.transaction()?
                };
                let out = f(&mut tx)?;
                tx.commit()?;
                Ok(out)
            })
        })
    }

    /// Runs `f` where the blocking client may run: here, off a runtime or on a blocking
    /// thread ([`super::mark_blocking_thread`]); else on a thread of its own, joined
    /// before returning.
    fn off_runtime<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        // The blocking client runs each statement on a small runtime of its own, which
        // tokio forbids on a thread that is in a runtime (a worker, or a test's single
        // thread); its blocking threads are not in one.
        if tokio::runtime::Handle::try_current().is_err() || super::on_blocking_thread() {
            return f();
        }
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("weft-pg".into())
                .spawn_scoped(scope, f)
                .map_err(|e| self.refuse(format!("cannot start a thread for the call: {e}")))?
                .join()
                .unwrap_or_else(|_| Err(self.refuse("the call panicked")))
        })
    }

    /// The slot and config of the connection `which`: a read takes a reader that is free,
    /// else waits for the next in turn.
    fn slot(&self, which: Which) -> (MutexGuard<'_, Option<Conn>>, &postgres::Config) {
        fn lock(m: &Slot) -> MutexGuard<'_, Option<Conn>> {
            m.lock().unwrap_or_else(|p| p.into_inner())
        }
        match which {
            Which::Write => (lock(&self.client), &self.config),
            Which::Election => (lock(&self.elector), &self.elector_config),
            Which::Read => {
                for r in &self.readers {
                    match r.try_lock() {
                        Ok(g) => return (g, &self.reader_config),
                        Err(std::sync::TryLockError::Poisoned(p)) => {
                            return (p.into_inner(), &self.reader_config);
                        }
                        Err(std::sync::TryLockError::WouldBlock) => {}
                    }
                }
                let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % READERS;
                (lock(&self.readers[i]), &self.reader_config)
            }
        }
    }

    /// Runs `f` on the connection `which`, on this thread, connecting first when there
    /// is no live connection; a fault of the connection or the server is
    /// [`StoreError::Unavailable`] and drops the connection.
    fn with_conn<T>(&self, which: Which, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let (mut slot, config) = self.slot(which);
        let out = (|| {
            if slot.as_ref().is_none_or(|c| c.client.is_closed()) {
                *slot = None;
                *slot = Some(Conn {
                    client: config.connect(NoTls)?,
                    prepared: HashMap::new(),
                });
            }
            let Some(conn) = slot.as_mut() else {
                return Err(StoreError::Storage("no connection".into()));
            };
            f(conn)
        })();
        match out {
            // The election's faults are the election's (the leader stops delivering on
            // its own clock); the store's health is its other connections'.
            Ok(v) if which == Which::Election => Ok(v),
            Err(StoreError::Storage(e)) if which == Which::Election => {
                *slot = None;
                Err(self.refuse(format!("the election connection: {e}")))
            }
            Ok(v) => {
                *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = None;
                Ok(v)
            }
            Err(StoreError::Storage(e)) => {
                *slot = None;
                let why = format!("the store {} cannot write: {e}", self.name);
                tracing::error!(store = %self.name, error = %e, "store fault");
                *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                Err(StoreError::Unavailable(why))
            }
            Err(e) => Err(e),
        }
    }
}

/// One function of a concern file per method, in one transaction each (see
/// `../sqlite/mod.rs` for the same on SQLite).
impl Store for PgStore {
    fn bootstrap_admin(&self, hash: &str, now: u64) -> Result<()> {
        self.tx(|tx| tokens::bootstrap_admin(tx, hash, now))
    }

    fn principal(&self, hash: &str, now: u64) -> Result<Option<Principal>> {
        self.read(|tx| tokens::principal(tx, hash, now))
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
        self.read(tokens::tokens)
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
        // `steal` is the caller's (not Send): asked here about the holder read first; a
        // holder that changed in between is asked nothing and keeps the lease.
        let current: Option<String> = self.tx(|tx| {
            Ok(tx
                .query_opt("SELECT holder FROM leases WHERE name = $1", &[&name])?
                .map(|r| r.try_get(0))
                .transpose()?)
        })?;
        let may_steal = current.as_deref().is_some_and(steal);
        let asked = current.unwrap_or_default();
        let steal_asked = move |h: &str| may_steal && h == asked;
        self.tx(|tx| leases::acquire_lease(tx, name, holder, ttl_s, now, &steal_asked))
    }

    fn release_lease(&self, name: &str, holder: &str) -> Result<()> {
        self.tx(|tx| leases::release_lease(tx, name, holder))
    }

    fn tenants(&self) -> Result<Vec<TenantView>> {
        self.read(tenants::tenants)
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
        // Every request of an agent asks this: one statement, prepared once, no transaction.
        self.off_runtime(|| {
            self.with_conn(Which::Read, |conn| {
                let [st] = conn.statements([servers::AGENT_SQL])?;
                match conn.client.query_opt(&st, &[&secret_hash])? {
                    Some(r) => Ok(Some(r.try_get(0)?)),
                    None => Ok(None),
                }
            })
        })
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
        let queued = reports::Queued::new(report, now)?;
        reports::report(self, queued)
    }

    fn heartbeat(&self, server: &str, now: u64) -> Result<()> {
        self.tx(|tx| servers::heartbeat(tx, server, now))
    }

    fn servers(&self, now: u64, stale_after_s: u64) -> Result<Vec<ServerView>> {
        self.read(|tx| servers::servers(tx, now, stale_after_s))
    }

    fn groups(&self) -> Result<Vec<GroupView>> {
        self.read(groups::groups)
    }

    fn change(&self, actor: &str, change: &Change, now: u64) -> Result<Option<OperationView>> {
        self.tx(|tx| groups::change(tx, actor, change, now))
    }

    fn reject_claim(&self, actor: &str, id: i64, now: u64) -> Result<()> {
        self.tx(|tx| servers::reject_claim(tx, actor, id, now))
    }

    fn claims(&self) -> Result<Vec<ClaimView>> {
        self.read(servers::claims)
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
        self.read(|tx| operations::read_operation(tx, id))
    }

    fn operations(&self, pending_only: bool) -> Result<Vec<OperationView>> {
        self.read(|tx| operations::operations(tx, pending_only))
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

    /// The last fault, until the database answers again.
    fn health(&self) -> Result<()> {
        let fault = self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(fault) = fault {
            // The server may be back: a round trip says whether calls work again.
            if self.run(|tx| Ok(tx.batch_execute("SELECT 1")?)).is_err() {
                return Err(StoreError::Unavailable(fault));
            }
        }
        Ok(())
    }

    fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>> {
        self.read(|tx| audit::newest(tx, limit))
    }

    fn status(&self, now: u64, stale_after_s: u64) -> Result<StatusView> {
        let stale_servers = self
            .servers(now, stale_after_s)?
            .into_iter()
            .filter(|s| s.liveness == Liveness::Stale)
            .map(|s| s.name)
            .collect();
        self.read(|tx| operations::status(tx, stale_servers))
    }

    fn set_gpus(&self, server: &str, gpus: &[weft_agent::Gpu], now: u64) -> Result<()> {
        let json = serde_json::to_string(gpus)
            .map_err(|e| StoreError::Invalid(format!("GPUs of `{server}`: {e}")))?;
        self.tx(|tx| servers::set_gpus(tx, server, &json, now))
    }

    fn gpus(&self) -> Result<BTreeMap<String, Vec<weft_agent::Gpu>>> {
        self.read(servers::gpus)
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
        self.read(|tx| node_leases::decisions(tx, lease))
    }

    fn lease_notices(&self, server: &str) -> Result<Vec<crate::lease::model::LeaseNotice>> {
        self.read(|tx| node_leases::notices(tx, server))
    }

    fn set_links(&self, server: &str, links: &crate::model::HostLinks, now: u64) -> Result<()> {
        let json = serde_json::to_string(links)
            .map_err(|e| StoreError::Invalid(format!("links of `{server}`: {e}")))?;
        self.tx(|tx| servers::set_links(tx, server, &json, now))
    }

    fn elects(&self) -> bool {
        true
    }

    fn elect(&self, holder: &str, url: Option<&str>, ttl_s: u64, now: u64) -> Result<Election> {
        self.run_on(Which::Election, |tx| {
            leader::elect(tx, holder, url, ttl_s, now)
        })
    }

    fn resign(&self, holder: &str) -> Result<()> {
        self.run_on(Which::Election, |tx| leader::resign(tx, holder))
    }

    fn leader(&self) -> Result<Option<(String, Option<String>)>> {
        self.read(leader::leader)
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
        self.read(|tx| links::newest(tx, limit))
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
        self.read(|tx| console::get(tx, id_hash))
    }

    fn console_session_end(&self, id_hash: &str, now: u64) -> Result<bool> {
        self.tx(|tx| console::end(tx, id_hash, now))
    }
}

fn meta(tx: &mut Transaction<'_>, key: &str) -> Result<Option<String>> {
    Ok(tx
        .query_opt("SELECT value FROM meta WHERE key = $1", &[&key])?
        .map(|r| r.get(0)))
}

fn set_meta(tx: &mut Transaction<'_>, key: &str, value: &str) -> Result<()> {
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = $2",
        &[&key, &value],
    )?;
    Ok(())
}

fn meta_i64(tx: &mut Transaction<'_>, key: &str) -> Result<i64> {
    Ok(meta(tx, key)?.and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// Whether `sql` (one `$1` parameter) finds a row.
fn exists(
    tx: &mut Transaction<'_>,
    sql: &str,
    key: &(dyn postgres::types::ToSql + Sync),
) -> Result<bool> {
    Ok(tx.query_opt(sql, &[key])?.is_some())
}

/// A BIGINT read back into a narrower type (a port number, a LID): out of range is the
/// database's fault, named.
fn num<T: TryFrom<i64>>(i: i64, what: &str) -> Result<T> {
    T::try_from(i).map_err(|_| StoreError::Db(format!("{what} {i} is out of range")))
}

/// Appends an audit line: the short form of [`audit::append`] that the concerns use.
#[allow(clippy::too_many_arguments)]
fn audit(
    tx: &mut Transaction<'_>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    /// A real PostgreSQL, or `None` where it cannot run (a failure under
    /// `WEFT_TEST_REQUIRE=all`).
    fn server(test: &str) -> Option<weft_testbed::Postgres> {
        if let Err(why) = weft_testbed::Postgres::available() {
            weft_netns::require::skip(test, &why);
            return None;
        }
        Some(weft_testbed::Postgres::start().expect("start PostgreSQL"))
    }

    fn line<'a>(actor: &'a str, detail: &'a str) -> AuditLine<'a> {
        AuditLine {
            actor,
            action: "test",
            subject: "store",
            diff: "",
            outcome: "ok",
            detail,
        }
    }

    #[test]
    fn migrations_run_once_and_a_missing_newer_or_foreign_schema_is_refused() {
        let Some(pg) = server("PostgreSQL store migrations") else {
            return;
        };
        let url = pg.database("weft").unwrap();
        let err = PgStore::open(&url, false).unwrap_err().to_string();
        assert!(
            err.contains("no weft store") && err.contains("--init") && err.contains("/weft"),
            "{err}"
        );
        let store = PgStore::open(&url, true).unwrap();
        assert_eq!(
            store.schema_version().unwrap(),
            migrations::STEPS.len() as i64
        );
        store.audit_append(&line("admin:a", "kept"), 7).unwrap();
        drop(store);
        // Opened again (with or without --init), nothing is run twice or lost.
        let store = PgStore::open(&url, true).unwrap();
        assert_eq!(
            store.schema_version().unwrap(),
            migrations::STEPS.len() as i64
        );
        assert_eq!(store.audit(10).unwrap().len(), 1);
        drop(store);
        let bumped = psql_url(
            &url,
            &format!(
                "UPDATE weft_schema SET version = {}",
                migrations::STEPS.len() + 1
            ),
        );
        assert!(bumped.status.success(), "{bumped:?}");
        let err = PgStore::open(&url, false).unwrap_err().to_string();
        assert!(
            err.contains("newer than this weft's") && err.contains("/weft"),
            "{err}"
        );
        // A database holding someone else's tables is not made a store.
        let other = pg.database("other").unwrap();
        psql_url(&other, "CREATE TABLE payroll (id int)");
        let err = PgStore::open(&other, true).unwrap_err().to_string();
        assert!(err.contains("not a weft store"), "{err}");
    }

    fn psql_url(url: &str, sql: &str) -> std::process::Output {
        std::process::Command::new(std::path::Path::new(weft_testbed::PG_BIN).join("psql"))
            .args([url, "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql])
            .output()
            .unwrap()
    }

    #[test]
    fn the_audit_is_append_only_in_the_database_itself() {
        let Some(pg) = server("PostgreSQL audit append-only") else {
            return;
        };
        let url = pg.database("weft").unwrap();
        let store = PgStore::open(&url, true).unwrap();
        store.audit_append(&line("admin:a", "first"), 1).unwrap();
        store
            .audit_append(&line("tenant:bob:b", "second"), 2)
            .unwrap();
        for sql in [
            "UPDATE audit SET actor = 'nobody'",
            "DELETE FROM audit",
            "TRUNCATE audit",
        ] {
            let out = psql_url(&url, sql);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{sql} went through");
            assert!(stderr.contains("append-only"), "{sql}: {stderr}");
        }
        let lines = store.audit(10).unwrap();
        let got: Vec<(&str, &str, u64)> = lines
            .iter()
            .map(|l| (l.actor.as_str(), l.detail.as_str(), l.at))
            .collect();
        assert_eq!(
            got,
            [("admin:a", "first", 1), ("tenant:bob:b", "second", 2)]
        );
        assert!(lines[0].id < lines[1].id);
        // After a prune (its line the newest), still nothing else goes: not a line newer
        // than its cut-off, not its own line, no update, no truncate.
        store.audit_prune("operator:root", 2, 3).unwrap();
        for sql in [
            "DELETE FROM audit",
            "DELETE FROM audit WHERE action = 'audit.prune'",
            "UPDATE audit SET detail = '{\"before\": 99}'",
            "TRUNCATE audit",
        ] {
            let out = psql_url(&url, sql);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{sql} went through after a prune");
            assert!(stderr.contains("append-only"), "{sql}: {stderr}");
        }
        // A delete by hand that does not first write its own prune line is refused too
        // (a newer line than the prune's makes its cut-off void).
        store
            .audit_append(&line("admin:a", "after the prune"), 4)
            .unwrap();
        let out = psql_url(&url, "DELETE FROM audit WHERE at = 2");
        assert!(
            !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("append-only"),
            "a delete under an old prune line went through: {out:?}"
        );
        let got: Vec<(String, u64)> = store
            .audit(10)
            .unwrap()
            .into_iter()
            .map(|l| (l.action, l.at))
            .collect();
        assert_eq!(
            got,
            [
                ("test".to_string(), 2),
                ("audit.prune".to_string(), 3),
                ("test".to_string(), 4)
            ]
        );
    }

    /// The fencing calls both stores answer, so that one scenario runs on each.
    trait Fenced {
        fn fencing(&self) -> Result<Fencing>;
        fn begin(&self, generation: i64, checksum: &str) -> Result<()>;
        fn raise(&self, above: u64, held: Option<&str>) -> Result<u64>;
        fn audit_lines(&self) -> Result<Vec<AuditEntry>>;
    }

    impl Fenced for SqliteStore {
        fn fencing(&self) -> Result<Fencing> {
            Store::fencing(self)
        }
        fn begin(&self, generation: i64, checksum: &str) -> Result<()> {
            Store::begin_delivery(self, generation, checksum)
        }
        fn raise(&self, above: u64, held: Option<&str>) -> Result<u64> {
            Store::raise_fencing(self, "admin:r", above, held, "", "restored", 9)
        }
        fn audit_lines(&self) -> Result<Vec<AuditEntry>> {
            Store::audit(self, 100)
        }
    }

    impl Fenced for PgStore {
        fn fencing(&self) -> Result<Fencing> {
            Store::fencing(self)
        }
        fn begin(&self, generation: i64, checksum: &str) -> Result<()> {
            Store::begin_delivery(self, generation, checksum)
        }
        fn raise(&self, above: u64, held: Option<&str>) -> Result<u64> {
            Store::raise_fencing(self, "admin:r", above, held, "", "restored", 9)
        }
        fn audit_lines(&self) -> Result<Vec<AuditEntry>> {
            Store::audit(self, 100)
        }
    }

    /// What the scenario saw, to compare between backends.
    fn fencing_scenario(s: &dyn Fenced) -> Vec<String> {
        let mut seen = Vec::new();
        let f = s.fencing().unwrap();
        assert_eq!(f.number, 1, "a new store's fencing number");
        seen.push(format!("{f:?}"));
        s.begin(1, "aaa").unwrap();
        s.begin(1, "aaa").unwrap(); // a retry of one generation counts once
        s.begin(2, "bbb").unwrap();
        seen.push(format!("{:?}", s.fencing().unwrap()));
        let new = s.raise(5, Some("held file\n")).unwrap();
        assert_eq!(new, 6, "above both its own (1) and the held (5)");
        let f = s.fencing().unwrap();
        assert!(f.in_flight.is_empty(), "{f:?}");
        seen.push(format!("{f:?}"));
        assert_eq!(s.raise(2, None).unwrap(), 7, "never goes back");
        for l in s.audit_lines().unwrap() {
            seen.push(format!(
                "{} {} {} {} {}",
                l.actor, l.action, l.subject, l.outcome, l.detail
            ));
        }
        seen
    }

    #[test]
    fn fencing_and_begin_delivery_are_the_same_on_sqlite_and_postgresql() {
        let Some(pg) = server("PostgreSQL fencing") else {
            return;
        };
        let sqlite = fencing_scenario(&SqliteStore::in_memory().unwrap());
        let store = PgStore::open(&pg.database("weft").unwrap(), true).unwrap();
        let postgres = fencing_scenario(&store);
        assert_eq!(sqlite, postgres);
        assert!(
            postgres.iter().any(|l| l.contains("fencing number 1 -> 6")),
            "{postgres:?}"
        );
    }

    /// `acquire_lease("controller", holder, 30, now, steal)` on either backend.
    type Acquire<'a> = &'a dyn Fn(&str, u64, bool) -> Result<Result<(), String>>;

    /// The lease scenario on either backend: what each call answered.
    fn lease_scenario(
        acquire: Acquire<'_>,
        release: &dyn Fn(&str) -> Result<()>,
        id: &dyn Fn() -> Result<String>,
    ) -> Vec<String> {
        let steps = [
            format!("{:?}", acquire("host-a", 100, false).unwrap()),
            format!("{:?}", acquire("host-b", 110, false).unwrap()), // a live holder keeps it
            format!("{:?}", acquire("host-b", 110, true).unwrap()),  // a dead one is replaced
            format!("{:?}", acquire("host-a", 120, false).unwrap()),
            format!("{:?}", release("host-a")), // not its lease: no-op
            format!("{:?}", acquire("host-a", 200, false).unwrap()), // expired at 140
            format!("{:?}", release("host-a")),
            format!("{:?}", acquire("host-c", 201, false).unwrap()),
        ];
        let first = id().unwrap();
        assert_eq!(id().unwrap(), first, "the controller id is made once");
        assert!(
            first.starts_with("controller ") && first.len() == 27,
            "{first}"
        );
        steps.to_vec()
    }

    #[test]
    fn leases_and_the_controller_id_are_the_same_on_sqlite_and_postgresql() {
        let Some(pg) = server("PostgreSQL leases") else {
            return;
        };
        let lite = SqliteStore::in_memory().unwrap();
        let sqlite = lease_scenario(
            &|h, now, steal| Store::acquire_lease(&lite, "controller", h, 30, now, &|_| steal),
            &|h| Store::release_lease(&lite, "controller", h),
            &|| Store::controller_id(&lite),
        );
        let store = PgStore::open(&pg.database("weft").unwrap(), true).unwrap();
        let postgres = lease_scenario(
            &|h, now, steal| store.acquire_lease("controller", h, 30, now, &|_| steal),
            &|h| store.release_lease("controller", h),
            &|| store.controller_id(),
        );
        assert_eq!(sqlite, postgres);
        assert_eq!(postgres[1], "Err(\"host-a\")", "{postgres:?}");
        assert_eq!(postgres[3], "Err(\"host-b\")", "{postgres:?}");
        assert_eq!(postgres[5], "Ok(())", "{postgres:?}");
    }

    /// Tokens and tenants through the same method names on either backend (the Store
    /// trait's on SQLite, PgStore's own): what each call answered and the audit after.
    macro_rules! tokens_scenario {
        ($s:expr) => {{
            let s = $s;
            let h = |c: &str| c.repeat(64);
            let mut seen: Vec<String> = Vec::new();
            seen.push(format!("{:?}", s.bootstrap_admin(&h("a"), 10)));
            seen.push(format!("{:?}", s.principal(&h("a"), 11)));
            seen.push(format!(
                "{:?}",
                s.create_tenant("admin:x", "bob", &h("b"), Some(100), 12)
            ));
            seen.push(format!(
                "{:?}",
                s.create_tenant("admin:x", "bob", &h("c"), None, 13)
            ));
            seen.push(format!(
                "{:?}",
                s.create_tenant("admin:x", "Bad Name", &h("c"), None, 13)
            ));
            seen.push(format!(
                "{:?}",
                s.create_api_token("admin:x", &Role::Tenant("eve".into()), &h("d"), None, 14)
            ));
            seen.push(format!(
                "{:?}",
                s.create_api_token("admin:x", &Role::Tenant("bob".into()), &h("e"), None, 15)
            ));
            seen.push(format!(
                "{:?}",
                s.create_api_token("admin:x", &Role::Admin, &h("f"), Some(50), 16)
            ));
            seen.push(format!("{:?}", s.principal(&h("b"), 20)));
            seen.push(format!("{:?}", s.principal(&h("b"), 100))); // expired
            seen.push(format!("{:?}", s.principal(&h("f"), 49)));
            seen.push(format!(
                "{:?}",
                s.revoke_token("admin:x", &h("e")[..16], 30)
            ));
            seen.push(format!(
                "{:?}",
                s.revoke_token("admin:x", &h("e")[..16], 31)
            ));
            seen.push(format!("{:?}", s.revoke_token("admin:x", "NOT-AN-ID", 31)));
            seen.push(format!("{:?}", s.principal(&h("e"), 32)));
            seen.push(format!("{:?}", s.bootstrap_admin(&h("9"), 40))); // rotation
            seen.push(format!("{:?}", s.principal(&h("a"), 41)));
            seen.push(format!("{:?}", s.bootstrap_admin(&h("a"), 42))); // revoked: refused
            seen.push(format!("{:?}", s.tokens()));
            seen.push(format!("{:?}", s.tenants()));
            seen.push(format!("{:?}", s.delete_tenant("admin:x", "bob", 50)));
            seen.push(format!("{:?}", s.delete_tenant("admin:x", "bob", 51)));
            seen.push(format!("{:?}", s.tenants()));
            for l in s.audit(100).unwrap() {
                seen.push(format!(
                    "{} {} {} {} {} {}",
                    l.at, l.actor, l.action, l.subject, l.outcome, l.detail
                ));
            }
            seen
        }};
    }

    #[test]
    fn tokens_and_tenants_are_the_same_on_sqlite_and_postgresql() {
        let Some(pg) = server("PostgreSQL tokens and tenants") else {
            return;
        };
        let lite = SqliteStore::in_memory().unwrap();
        let sqlite = tokens_scenario!(&lite);
        let store = PgStore::open(&pg.database("weft").unwrap(), true).unwrap();
        let postgres = tokens_scenario!(&store);
        assert_eq!(sqlite, postgres);
        // The scenario is not vacuous: a refusal, an expiry and a rotation happened.
        assert!(postgres[3].contains("Conflict"), "{}", postgres[3]);
        assert!(postgres[5].contains("NotFound"), "{}", postgres[5]);
        assert_eq!(postgres[9], "Ok(None)");
        assert_eq!(
            postgres[16], "Ok(None)",
            "the rotated-out bootstrap token no longer works"
        );
        assert!(postgres[17].contains("Refused"), "{}", postgres[17]);
        assert!(
            postgres.iter().any(|l| l.contains("token.rotate")),
            "{postgres:?}"
        );
    }

    #[test]
    fn one_leader_at_a_time_each_takeover_raises_the_fencing_number_by_the_databases_clock() {
        let Some(pg) = server("PostgreSQL leader election") else {
            return;
        };
        let url = pg.database("weft").unwrap();
        let (a, b) = (
            PgStore::open(&url, true).unwrap(),
            PgStore::open(&url, false).unwrap(),
        );
        assert!(a.elects() && !SqliteStore::in_memory().unwrap().elects());
        assert_eq!(
            a.leader().unwrap(),
            None,
            "no leader before the first round"
        );
        let took = |fencing| Election::Leader {
            fencing,
            took_over: true,
        };
        let kept = |fencing| Election::Leader {
            fencing,
            took_over: false,
        };
        assert_eq!(a.elect("A", Some("http://a"), 5, 1).unwrap(), took(2));
        let follows_a = Election::Follower {
            holder: Some("A".into()),
            url: Some("http://a".into()),
        };
        assert_eq!(b.elect("B", Some("http://b"), 5, 1).unwrap(), follows_a);
        assert_eq!(a.elect("A", Some("http://a"), 5, 2).unwrap(), kept(2));
        assert_eq!(b.elect("B", Some("http://b"), 5, 2).unwrap(), follows_a);
        assert_eq!(
            b.leader().unwrap(),
            Some(("A".to_string(), Some("http://a".to_string())))
        );
        // A's lease runs out by the database's clock (moved back rather than waited for):
        // B takes over at a higher number; A now follows B.
        let mut c = postgres::Client::connect(&url, NoTls).unwrap();
        c.execute(
            "UPDATE leader SET expires = now() - interval '1 millisecond'",
            &[],
        )
        .unwrap();
        assert_eq!(b.elect("B", Some("http://b"), 5, 3).unwrap(), took(3));
        assert_eq!(
            a.elect("A", Some("http://a"), 5, 3).unwrap(),
            Election::Follower {
                holder: Some("B".into()),
                url: Some("http://b".into()),
            }
        );
        assert_eq!(
            Store::fencing(&a).unwrap().number,
            3,
            "meta follows the takeover"
        );
        // The lease lasts the TTL of the database's clock from the round.
        let left: f64 = c
            .query_one(
                "SELECT extract(epoch FROM expires - now())::float8 FROM leader",
                &[],
            )
            .unwrap()
            .get(0);
        assert!(left > 3.0 && left <= 5.0, "{left}");
        // A leader that stops gives the lease up at once; the next round takes it, higher.
        b.resign("B").unwrap();
        assert_eq!(a.leader().unwrap(), None);
        assert_eq!(a.elect("A", None, 5, 4).unwrap(), took(4));
        // A restore (or anything) that raised meta above the row: a takeover goes above both.
        a.raise_fencing("admin:x", 9, None, "", "restore", 5)
            .unwrap();
        c.execute(
            "UPDATE leader SET expires = now() - interval '1 millisecond'",
            &[],
        )
        .unwrap();
        assert_eq!(b.elect("B", None, 5, 6).unwrap(), took(11));
        // Every takeover is audited, naming who took over from whom.
        let lines: Vec<String> = a
            .audit(100)
            .unwrap()
            .into_iter()
            .filter(|e| e.action == "fence" && e.detail.contains("leader election"))
            .map(|e| e.detail)
            .collect();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(
            lines[1].contains("fencing number 2 -> 3")
                && lines[1].contains("B (http://b) takes over from A"),
            "{lines:?}"
        );
    }

    #[test]
    fn a_lost_connection_is_unavailable_naming_the_store_and_nothing_is_half_written() {
        let Some(pg) = server("PostgreSQL faults") else {
            return;
        };
        let url = pg.database("weft").unwrap();
        let store = PgStore::open(&url, true).unwrap();
        store.audit_append(&line("admin:a", "before"), 1).unwrap();
        assert!(store.health().is_ok());
        // The server ends the store's session (as an operator's pg_terminate_backend or
        // a failover does).
        let out = pg
            .psql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'weft-controller'")
            .unwrap();
        assert_eq!(out.trim(), "1", "{out}");
        let err = store.audit_append(&line("admin:a", "lost"), 2).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(
            msg.contains(store.name()) && msg.contains("cannot write"),
            "{msg}"
        );
        // The next call connects again; the failed one left nothing.
        store.audit_append(&line("admin:a", "after"), 3).unwrap();
        let details: Vec<String> = store
            .audit(10)
            .unwrap()
            .into_iter()
            .map(|l| l.detail)
            .collect();
        assert_eq!(details, ["before", "after"]);
        assert!(store.health().is_ok());
        // A server that is not there: refused within the connect bound, naming the store.
        drop(store);
        let gone = pg.url("weft");
        drop(pg);
        let t = std::time::Instant::now();
        let err = PgStore::open(&gone, false).unwrap_err();
        assert!(t.elapsed() < CONNECT_TIMEOUT + Duration::from_secs(5));
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(msg.contains(&redact(&gone)), "{msg}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_work_from_a_runtime_worker_and_from_spawn_blocking() {
        let Some(pg) = server("PostgreSQL store in a runtime") else {
            return;
        };
        let store =
            std::sync::Arc::new(PgStore::open(&pg.database("weft").unwrap(), true).unwrap());
        // As Controller::start does: straight from async code on a worker.
        store.bootstrap_admin(&"a".repeat(64), 1).unwrap();
        let s = store.clone();
        let tenants = tokio::task::spawn_blocking(move || {
            s.create_tenant("admin:x", "bob", &"b".repeat(64), None, 2)?;
            s.tenants()
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(tenants[0].name, "bob");
        assert_eq!(store.audit(10).unwrap().len(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn calls_work_on_a_single_threaded_runtime() {
        let Some(pg) = server("PostgreSQL store on one thread") else {
            return;
        };
        let url = pg.database("weft").unwrap();
        let store = tokio::task::spawn_blocking(move || PgStore::open(&url, true))
            .await
            .unwrap()
            .unwrap();
        // On the runtime's only thread, as a `#[tokio::test]` calls it.
        store
            .create_tenant("admin:x", "bob", &"b".repeat(64), None, 2)
            .unwrap();
        assert_eq!(store.tenants().unwrap()[0].name, "bob");
        // Dropped here too: the client's close must not block this thread's runtime.
        drop(store);
    }

    #[test]
    fn a_password_is_never_named() {
        assert_eq!(
            redact("postgres://weft:s3cret@db.example:5432/weft"),
            "postgres://weft@db.example:5432/weft"
        );
        assert_eq!(redact("postgres://db/weft"), "postgres://db/weft");
    }
}
