//! Node leases in the controller: tenants lease nodes from the provider's free pool (the
//! members of the pool group) for a time, and the controller moves them in and out by
//! itself.
//!
//! The decisions are weft-lease's ([`weft_lease::Book`]); this module loads the book from
//! the store (leases, quotas), the pool group and the topology (each node's leaf switch,
//! from [`crate::reconcile::Fabric::leaf_switches`]), runs one step (a request, an
//! extension, a release, or the loop's own tick), turns the moves into group changes and
//! commits the step in one transaction ([`crate::store::Store::lease_commit`]): the leases,
//! the changes with their operations, every decision with its audit line, and the
//! warnings the agents read. The reconcile loop then delivers and verifies the moves as
//! it does every change. Steps run one at a time (a lock), so a step never works on a
//! stale book; a controller killed between two steps restarts with the last committed
//! one, whose pending operations the reconcile loop re-delivers, and the next tick
//! carries on from there.
//!
//! A node moves into its tenant's group (the tenant's first group by name, or a new group
//! named after the tenant) and back into the pool group; a move out happens only while
//! the node is in a group of the lease's tenant, so a lease ending never moves what
//! belongs to someone else.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use weft_fabric::Guid;
use weft_lease::{Book, Decision, Lease, PoolNode, Refusal};

use crate::model::GroupView;
use crate::reconcile::{Event, Fabric};
use crate::store::{Change, LeaseCommit, Store, StoreError};

pub mod api;
pub mod model;

use model::{LeaseDecisionView, LeaseList, LeaseRequest, LeaseView, PoolNodeView};

/// The lease loop's knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The provider's pool group: free nodes are its members.
    pub pool_group: String,
    /// Seconds before a lease's end that its nodes' agents are warned.
    pub warn_s: u64,
    /// How often the loop looks at the clock.
    pub tick: Duration,
    /// How often the leaf switches are read from the fabric.
    pub topology_refresh: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            pool_group: "pool".into(),
            warn_s: 300,
            tick: Duration::from_secs(1),
            topology_refresh: Duration::from_secs(60),
        }
    }
}

/// Why a lease call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The lease loop refused it.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The blocking task.
    #[error("lease task: {0}")]
    Task(String),
    /// Not for this principal (an admin requesting: leases are requested by a tenant).
    #[error("{0}")]
    Forbidden(String),
}

/// What one step did: its result, its decisions and the operations of its moves.
#[derive(Debug, Clone)]
pub struct Stepped<T> {
    /// The step's own result.
    pub value: T,
    /// Every decision taken.
    pub decisions: Vec<Decision>,
    /// The operations created.
    pub operations: Vec<i64>,
    /// The book after the step.
    pub book: Book,
}

/// The lease loop: the store, the fabric (for the topology) and the lock that makes one
/// step at a time.
pub struct Leases {
    store: Arc<dyn Store>,
    events: mpsc::Sender<Event>,
    fabric: Arc<dyn Fabric>,
    metrics: Arc<crate::metrics::Metrics>,
    cfg: LeaseConfig,
    lock: tokio::sync::Mutex<()>,
    switches: std::sync::Mutex<BTreeMap<Guid, String>>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").field("cfg", &self.cfg).finish()
    }
}

/// The book as the store and the fabric have it now, and the groups it was built from.
pub fn load(
    store: &dyn Store,
    cfg: &LeaseConfig,
    switches: &BTreeMap<Guid, String>,
) -> Result<(Book, Vec<GroupView>), StoreError> {
    let records = store.lease_records()?;
    let groups = store.groups()?;
    let mut names: BTreeSet<String> = groups
        .iter()
        .filter(|g| g.name == cfg.pool_group)
        .flat_map(|g| g.members.iter().cloned())
        .collect();
    names.extend(
        records
            .leases
            .iter()
            .filter(|l| l.phase.live())
            .flat_map(|l| l.nodes.iter().cloned()),
    );
    let servers = store.servers(0, u64::MAX)?;
    let switch_of = |name: &str| {
        servers
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.ports.iter().find_map(|p| switches.get(&p.guid).cloned()))
    };
    let pool = names
        .into_iter()
        .map(|name| PoolNode {
            switch: switch_of(&name),
            name,
        })
        .collect();
    let mut book = Book::new(pool, cfg.warn_s);
    book.quotas = records.quotas;
    book.leases = records.leases.into_iter().map(|l| (l.id, l)).collect();
    Ok((book, groups))
}

/// The group a tenant's leased nodes go into: its first group by name (not the pool
/// group), or one named after the tenant (`None`: it has to be created).
fn tenant_group(groups: &[GroupView], tenant: &str, pool: &str) -> (String, bool) {
    groups
        .iter()
        .filter(|g| g.tenant == tenant && g.name != pool)
        .map(|g| g.name.clone())
        .min()
        .map_or_else(|| (tenant.to_string(), false), |g| (g, true))
}

/// The group changes that carry out `decisions`: a node moved in goes to its tenant's
/// group (created first if the tenant has none), a node moved out goes to the pool group
/// only if it is in a group of the lease's tenant. A node moved out and in within one step
/// moves once, to where it ends up.
pub fn changes(
    decisions: &[Decision],
    book: &Book,
    groups: &[GroupView],
    pool: &str,
) -> Vec<Change> {
    let original: BTreeMap<&str, &str> = groups
        .iter()
        .flat_map(|g| g.members.iter().map(move |m| (m.as_str(), g.name.as_str())))
        .collect();
    let mut current: BTreeMap<String, String> = original
        .iter()
        .map(|(m, g)| (m.to_string(), g.to_string()))
        .collect();
    let owner_of = |group: &str, created: &BTreeMap<String, String>| {
        groups
            .iter()
            .find(|g| g.name == group)
            .map(|g| g.tenant.clone())
            .or_else(|| {
                created
                    .iter()
                    .find(|(_, g)| g.as_str() == group)
                    .map(|(t, _)| t.clone())
            })
    };
    let mut out = Vec::new();
    let mut created: BTreeMap<String, String> = BTreeMap::new();
    let mut touched: Vec<String> = Vec::new();
    for d in decisions {
        let tenant = |lease: &u64| book.leases.get(lease).map(|l| l.tenant.clone());
        match d {
            Decision::MoveIn { lease, node } => {
                let Some(t) = tenant(lease) else { continue };
                let (g, exists) = tenant_group(groups, &t, pool);
                if !exists && !created.contains_key(&t) {
                    out.push(Change::CreateGroup {
                        name: g.clone(),
                        tenant: t.clone(),
                    });
                    created.insert(t, g.clone());
                }
                current.insert(node.clone(), g);
                touched.push(node.clone());
            }
            Decision::MoveOut { lease, node } => {
                let Some(t) = tenant(lease) else { continue };
                let holder = current
                    .get(node)
                    .and_then(|g| owner_of(g, &created))
                    .filter(|_| current.get(node).is_some_and(|g| g != pool));
                if holder.as_deref() == Some(t.as_str()) {
                    current.insert(node.clone(), pool.to_string());
                    touched.push(node.clone());
                } else {
                    tracing::warn!(%node, lease, "a lease ended on a node that is not in its tenant's group; not moved");
                }
            }
            _ => {}
        }
    }
    let mut seen = BTreeSet::new();
    for node in touched {
        if !seen.insert(node.clone()) {
            continue;
        }
        let Some(to) = current.get(&node) else {
            continue;
        };
        if original.get(node.as_str()) != Some(&to.as_str()) {
            out.push(Change::Move {
                server: node,
                to: to.clone(),
            });
        }
    }
    out
}

/// A lease as the API shows it, with its queue position.
pub fn view(book: &Book, l: &Lease) -> LeaseView {
    let position = book.position(l.id);
    let reason = l.reason.clone().or_else(|| {
        (l.phase == weft_lease::Phase::Queued)
            .then(|| {
                book.quota_blocked(l, now_s())
                    .or_else(|| Some("waits for free nodes".into()))
            })
            .flatten()
    });
    LeaseView {
        id: l.id,
        tenant: l.tenant.clone(),
        nodes_wanted: l.nodes_wanted,
        duration_s: l.duration_s,
        submitted: l.submitted,
        not_before: l.not_before,
        same_switch: l.same_switch,
        phase: l.phase.as_str().into(),
        position,
        start: l.start,
        end: l.end,
        nodes: l.nodes.clone(),
        reason,
    }
}

/// What `p` may see of `book` (`GET /v1/leases`, the console's Leases page): its leases
/// (every lease for an admin), newest first, at most 1000; the queue positions of those;
/// the pool with each node's holder for an admin, only the counts for a tenant.
pub fn list(book: &Book, p: &crate::auth::Principal) -> LeaseList {
    let mut leases: Vec<LeaseView> = book
        .leases
        .values()
        .rev()
        .filter(|l| p.can_read_tenant(&l.tenant))
        .map(|l| view(book, l))
        .collect();
    leases.truncate(1000);
    let queue = book
        .queue()
        .into_iter()
        .filter(|id| {
            book.leases
                .get(id)
                .is_some_and(|l| p.can_read_tenant(&l.tenant))
        })
        .collect();
    let holder = |name: &str| {
        book.leases
            .values()
            .find(|l| l.phase.live() && l.nodes.iter().any(|n| n == name))
            .map(|l| l.id)
    };
    let pool = if p.is_admin() {
        book.pool
            .iter()
            .map(|n| PoolNodeView {
                name: n.name.clone(),
                switch: n.switch.clone(),
                lease: holder(&n.name),
            })
            .collect()
    } else {
        Vec::new()
    };
    LeaseList {
        leases,
        queue,
        pool,
        pool_size: book.pool.len(),
        pool_free: book.free().len(),
    }
}

/// The tenant a principal leases as, `None` for an admin.
pub(crate) fn tenant_of(p: &crate::auth::Principal) -> Option<String> {
    match &p.role {
        crate::auth::Role::Admin => None,
        crate::auth::Role::Tenant(t) => Some(t.clone()),
    }
}

/// A decision as the API shows it.
pub fn decision_view(at: u64, d: &Decision) -> LeaseDecisionView {
    LeaseDecisionView {
        at,
        kind: d.kind().into(),
        detail: d.detail(),
    }
}

fn now_s() -> u64 {
    crate::server::unix_now()
}

impl Leases {
    /// The loop over this store and fabric; [`Leases::run`] drives its ticks.
    pub fn new(
        store: Arc<dyn Store>,
        events: mpsc::Sender<Event>,
        fabric: Arc<dyn Fabric>,
        metrics: Arc<crate::metrics::Metrics>,
        cfg: LeaseConfig,
    ) -> Leases {
        Leases {
            store,
            events,
            fabric,
            metrics,
            cfg,
            lock: tokio::sync::Mutex::new(()),
            switches: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// Its knobs.
    pub fn config(&self) -> &LeaseConfig {
        &self.cfg
    }

    fn switches(&self) -> BTreeMap<Guid, String> {
        self.switches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A tenant's request for nodes from the pool (`POST /v1/leases`, the console's
    /// form), as `p`: granted, queued, waiting for its start or refused, in one step.
    /// An admin is refused ([`LeaseError::Forbidden`]); no nodes or no time is
    /// [`Refusal::Invalid`].
    pub async fn request(
        &self,
        p: &crate::auth::Principal,
        req: LeaseRequest,
    ) -> Result<Stepped<u64>, LeaseError> {
        let Some(tenant) = tenant_of(p) else {
            return Err(LeaseError::Forbidden(
                "a lease is requested with a tenant's token".into(),
            ));
        };
        if req.nodes == 0 {
            return Err(Refusal::Invalid("nodes: a lease needs at least one node".into()).into());
        }
        if req.duration_s == 0 {
            return Err(
                Refusal::Invalid("duration_s: a lease needs at least one second".into()).into(),
            );
        }
        let ask = weft_lease::Ask {
            tenant,
            nodes: req.nodes,
            duration_s: req.duration_s,
            start: req.start,
            same_switch: req.same_switch,
        };
        self.step(&p.actor, move |b, now| Ok(b.request(now, ask)))
            .await
    }

    /// Gives lease `id` back, as `p` (its tenant, or an admin): a queued one leaves the
    /// queue, one that holds nodes moves them back to the pool now. Another tenant's
    /// lease is refused as one that does not exist.
    pub async fn release(
        &self,
        p: &crate::auth::Principal,
        id: u64,
    ) -> Result<Stepped<u64>, LeaseError> {
        let tenant = tenant_of(p);
        self.step(&p.actor, move |b, now| {
            b.release(now, id, tenant.as_deref()).map(|d| (id, d))
        })
        .await
    }

    /// The book now (for the API's views).
    pub async fn book(&self) -> Result<Book, LeaseError> {
        let store = self.store.clone();
        let cfg = self.cfg.clone();
        let switches = self.switches();
        tokio::task::spawn_blocking(move || load(&*store, &cfg, &switches).map(|(b, _)| b))
            .await
            .map_err(|e| LeaseError::Task(e.to_string()))?
            .map_err(LeaseError::from)
    }

    /// One step: loads the book, runs `f` at the current time and commits what it
    /// decided (nothing is written when it decided nothing), as `actor`.
    pub async fn step<T: Send + 'static>(
        &self,
        actor: &str,
        f: impl FnOnce(&mut Book, u64) -> Result<(T, Vec<Decision>), Refusal> + Send + 'static,
    ) -> Result<Stepped<T>, LeaseError> {
        let _one = self.lock.lock().await;
        let store = self.store.clone();
        let cfg = self.cfg.clone();
        let switches = self.switches();
        let actor = actor.to_string();
        let stepped = tokio::task::spawn_blocking(move || -> Result<Stepped<T>, LeaseError> {
            let (mut book, groups) = load(&*store, &cfg, &switches)?;
            let before = book.leases.clone();
            let now = now_s();
            let (value, decisions) = f(&mut book, now)?;
            let changed: Vec<Lease> = book
                .leases
                .values()
                .filter(|l| before.get(&l.id) != Some(*l))
                .cloned()
                .collect();
            let mut operations = Vec::new();
            if !decisions.is_empty() || !changed.is_empty() {
                let moves = changes(&decisions, &book, &groups, &cfg.pool_group);
                let commit = LeaseCommit {
                    actor: &actor,
                    leases: &changed,
                    changes: &moves,
                    decisions: &decisions,
                };
                operations = store
                    .lease_commit(&commit, now)?
                    .into_iter()
                    .map(|o| o.id)
                    .collect();
            }
            Ok(Stepped {
                value,
                decisions,
                operations,
                book,
            })
        })
        .await
        .map_err(|e| LeaseError::Task(e.to_string()))??;
        if !stepped.operations.is_empty() {
            let _ = self.events.try_send(Event::Changed);
        }
        self.count(&stepped.book);
        Ok(stepped)
    }

    /// Sets the lease gauges from `book`.
    fn count(&self, book: &Book) {
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for phase in weft_lease::Phase::ALL {
            let n = book.leases.values().filter(|l| l.phase == phase).count();
            self.metrics
                .leases
                .get_or_create(&crate::metrics::LeasePhase {
                    phase: phase.as_str().into(),
                })
                .set(as_i64(n));
        }
        self.metrics.lease_queue.set(as_i64(book.queue().len()));
        self.metrics.lease_pool_free.set(as_i64(book.free().len()));
    }

    /// Reads the leaf switches from the fabric (blocking work off the runtime); on a
    /// failure the last known topology stays.
    pub async fn refresh_topology(&self) {
        let fabric = self.fabric.clone();
        match tokio::task::spawn_blocking(move || fabric.leaf_switches()).await {
            Ok(Ok(map)) => {
                *self.switches.lock().unwrap_or_else(|p| p.into_inner()) = map;
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot read the leaf switches"),
            Err(e) => tracing::warn!(error = %e, "topology task"),
        }
    }

    /// One turn of the loop: the topology when [`LeaseConfig::topology_refresh`] has
    /// passed since `last_topology`, then a tick. The controller calls it every
    /// [`LeaseConfig::tick`] while it runs.
    pub async fn tick_once(&self, last_topology: &mut Option<tokio::time::Instant>) {
        if last_topology.is_none_or(|t| t.elapsed() >= self.cfg.topology_refresh) {
            self.refresh_topology().await;
            *last_topology = Some(tokio::time::Instant::now());
        }
        if let Err(e) = self
            .step("controller", |b, now| Ok(((), b.tick(now))))
            .await
        {
            tracing::warn!(error = %e, "lease tick");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, tenant: &str, members: &[&str]) -> GroupView {
        GroupView {
            name: name.into(),
            tenant: tenant.into(),
            pkey: "0x0a01".into(),
            members: members.iter().map(|m| m.to_string()).collect(),
            ports: Vec::new(),
        }
    }

    #[test]
    fn moves_go_to_the_tenants_group_and_back_and_never_take_anothers_node() {
        let mut book = Book::new(Vec::new(), 60);
        for (id, tenant) in [(1, "alice"), (2, "bob")] {
            book.leases.insert(
                id,
                Lease {
                    id,
                    tenant: tenant.into(),
                    nodes_wanted: 1,
                    duration_s: 60,
                    submitted: 0,
                    not_before: 0,
                    same_switch: false,
                    phase: weft_lease::Phase::Active,
                    start: Some(0),
                    end: Some(60),
                    nodes: Vec::new(),
                    reason: None,
                },
            );
        }
        let groups = [
            group("pool", "provider", &["n1", "n2"]),
            group("bob-hpc", "bob", &["n3"]),
            group("carol", "carol", &["n4"]),
        ];
        let d = |lease: u64, kind: &str, node: &str| match kind {
            "in" => Decision::MoveIn {
                lease,
                node: node.into(),
            },
            _ => Decision::MoveOut {
                lease,
                node: node.into(),
            },
        };
        let c = changes(
            &[
                d(1, "in", "n1"),
                d(2, "in", "n2"),
                d(2, "out", "n3"),
                d(1, "out", "n4"),
            ],
            &book,
            &groups,
            "pool",
        );
        assert_eq!(
            c,
            vec![
                Change::CreateGroup {
                    name: "alice".into(),
                    tenant: "alice".into()
                },
                Change::Move {
                    server: "n1".into(),
                    to: "alice".into()
                },
                Change::Move {
                    server: "n2".into(),
                    to: "bob-hpc".into()
                },
                Change::Move {
                    server: "n3".into(),
                    to: "pool".into()
                },
            ]
        );
        // Out of bob's lease and into alice's in one step: one move.
        let c = changes(
            &[d(2, "out", "n3"), d(1, "in", "n3")],
            &book,
            &groups,
            "pool",
        );
        assert_eq!(
            c.last().unwrap(),
            &Change::Move {
                server: "n3".into(),
                to: "alice".into()
            }
        );
        assert_eq!(c.len(), 2);
    }
}
