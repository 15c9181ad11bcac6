//! Leases of nodes from a free pool, as a pure loop: given the leases, the tenants'
//! quotas, the pool with its topology (the leaf switch each node is cabled to) and the
//! clock, a [`Book`] answers a request, an extension, a release or a tick with the
//! [`Decision`]s to carry out: grant, queue (with the position), refuse (with the
//! reason), move a node in, warn that a lease ends, move a node out.
//!
//! It is for the controller's lease loop, which stores the leases, performs the moves
//! through its verified group moves and tells the agents; it is not for I/O: no clock
//! (time is passed in, the way quinn-proto takes `now`), no store, no fabric. That is what
//! lets the property tests run a week of many tenants in milliseconds.
//!
//! The rules:
//! - a node is in at most one live (active or ending) lease, and a lease that ends or is
//!   released moves out only the nodes it holds;
//! - a tenant holds at most its quota's nodes at once, and the node-seconds of the leases
//!   it starts in one quota period (each lease charged wholly to the period it started
//!   in, extensions included, a release charging only what ran) stay within the quota;
//! - a request that can never be met (no quota, over the quota, more nodes than the pool
//!   or, with `same_switch`, than the largest leaf switch has) is refused with the reason;
//!   one that cannot be met now waits in the queue, first come first served: the queue is
//!   served in order and stops at the first request the free nodes cannot hold, so no
//!   later request takes nodes an earlier one waits for; a request held back by its own
//!   tenant's quota does not hold back the others;
//! - `start` is the earliest start: the request joins the queue at that time;
//! - nodes under one leaf switch are preferred, and required with `same_switch`;
//! - a lease is warned `warn_s` before its end (phase `ending`), then its nodes move out
//!   unless it was extended.
//!
//! ```
//! use weft_lease::{Ask, Book, Decision, PoolNode, Quota};
//! let pool = vec![
//!     PoolNode { name: "n1".into(), switch: Some("leaf-a".into()) },
//!     PoolNode { name: "n2".into(), switch: Some("leaf-a".into()) },
//! ];
//! let mut book = Book::new(pool, 60);
//! book.quotas.insert("alice".into(), Quota { max_nodes: 2, node_seconds: 7200, period_s: 86_400 });
//! let ask = Ask { tenant: "alice".into(), nodes: 2, duration_s: 600, start: None, same_switch: true };
//! let (id, decisions) = book.request(1_000, ask);
//! assert!(matches!(&decisions[0], Decision::Grant { nodes, .. } if nodes.len() == 2));
//! let ending = book.tick(1_000 + 540);
//! assert!(matches!(&ending[0], Decision::Warn { lease, .. } if *lease == id));
//! let end = book.tick(1_000 + 600);
//! assert_eq!(end.iter().filter(|d| matches!(d, Decision::MoveOut { .. })).count(), 2);
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

mod pick;

pub use pick::{largest_switch, pick};

/// A lease's number: unique, growing with every request.
pub type LeaseId = u64;

/// What a tenant may lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// Nodes held at once.
    pub max_nodes: u32,
    /// Node-seconds of the leases started in one period.
    pub node_seconds: u64,
    /// The period's length in seconds; periods are aligned to the epoch.
    pub period_s: u64,
}

/// A node of the free pool and the leaf switch its HCA port is cabled to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolNode {
    /// Its server name.
    pub name: String,
    /// Its leaf switch (`None`: not known).
    pub switch: Option<String>,
}

/// A tenant's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// Who asks.
    pub tenant: String,
    /// How many nodes.
    pub nodes: u32,
    /// For how long, in seconds.
    pub duration_s: u64,
    /// The earliest start (`None`: now).
    pub start: Option<u64>,
    /// Every node under one leaf switch, or wait.
    pub same_switch: bool,
}

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Its start is in the future.
    Waiting,
    /// In the queue for nodes.
    Queued,
    /// Holds its nodes.
    Active,
    /// Holds its nodes and has been warned that it ends.
    Ending,
    /// Ran to its end; its nodes moved out.
    Ended,
    /// Given back by its tenant (or an admin).
    Released,
    /// Refused, with a reason.
    Refused,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; 7] = [
        Phase::Waiting,
        Phase::Queued,
        Phase::Active,
        Phase::Ending,
        Phase::Ended,
        Phase::Released,
        Phase::Refused,
    ];

    /// Its name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Queued => "queued",
            Phase::Active => "active",
            Phase::Ending => "ending",
            Phase::Ended => "ended",
            Phase::Released => "released",
            Phase::Refused => "refused",
        }
    }

    /// The phase named `s`.
    pub fn parse(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Whether the lease holds nodes.
    pub fn live(self) -> bool {
        matches!(self, Phase::Active | Phase::Ending)
    }

    /// Whether the lease is over (ended, released or refused).
    pub fn closed(self) -> bool {
        matches!(self, Phase::Ended | Phase::Released | Phase::Refused)
    }
}

/// One lease, from request to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Its number.
    pub id: LeaseId,
    /// Whose it is.
    pub tenant: String,
    /// Nodes asked for.
    pub nodes_wanted: u32,
    /// Seconds asked for (extensions add to [`Lease::end`], not here).
    pub duration_s: u64,
    /// When it was asked for.
    pub submitted: u64,
    /// The earliest start; it joins the queue then.
    pub not_before: u64,
    /// Every node under one leaf switch.
    pub same_switch: bool,
    /// Where it stands.
    pub phase: Phase,
    /// When it got its nodes.
    pub start: Option<u64>,
    /// When its nodes move out (or moved out, for a released lease).
    pub end: Option<u64>,
    /// The nodes it holds (or held).
    pub nodes: Vec<String>,
    /// Why it was refused.
    pub reason: Option<String>,
}

impl Lease {
    /// Node-seconds charged to its tenant's quota: what it booked, or what ran.
    pub fn charged(&self) -> u64 {
        match (self.start, self.end) {
            (Some(s), Some(e)) => u64::from(self.nodes_wanted).saturating_mul(e.saturating_sub(s)),
            _ => 0,
        }
    }
}

/// What the loop decided; the controller stores each one and carries out the moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The lease got these nodes, from `start` to `end`; a [`Decision::MoveIn`] follows
    /// for each node.
    Grant {
        /// The lease.
        lease: LeaseId,
        /// Its nodes.
        nodes: Vec<String>,
        /// Now.
        start: u64,
        /// When they move out.
        end: u64,
    },
    /// The lease waits in the queue at this position (1 is next).
    Queue {
        /// The lease.
        lease: LeaseId,
        /// Its place in the queue.
        position: usize,
    },
    /// The lease joins the queue at its start.
    Wait {
        /// The lease.
        lease: LeaseId,
        /// Its earliest start.
        until: u64,
    },
    /// The lease is refused.
    Refuse {
        /// The lease.
        lease: LeaseId,
        /// Why.
        reason: String,
    },
    /// Move this node from the pool into the lease's tenant's group.
    MoveIn {
        /// The lease.
        lease: LeaseId,
        /// The node.
        node: String,
    },
    /// Tell these nodes' agents that the lease ends at `end`.
    Warn {
        /// The lease.
        lease: LeaseId,
        /// Its nodes.
        nodes: Vec<String>,
        /// When they move out.
        end: u64,
    },
    /// Move this node from the lease's tenant's group back to the pool.
    MoveOut {
        /// The lease.
        lease: LeaseId,
        /// The node.
        node: String,
    },
    /// The lease now ends at `end` (a warning given is withdrawn).
    Extend {
        /// The lease.
        lease: LeaseId,
        /// Its new end.
        end: u64,
    },
    /// The lease was given back; a [`Decision::MoveOut`] follows for each node it held.
    Release {
        /// The lease.
        lease: LeaseId,
    },
}

impl Decision {
    /// The lease it is about.
    pub fn lease(&self) -> LeaseId {
        match self {
            Decision::Grant { lease, .. }
            | Decision::Queue { lease, .. }
            | Decision::Wait { lease, .. }
            | Decision::Refuse { lease, .. }
            | Decision::MoveIn { lease, .. }
            | Decision::Warn { lease, .. }
            | Decision::MoveOut { lease, .. }
            | Decision::Extend { lease, .. }
            | Decision::Release { lease } => *lease,
        }
    }

    /// Its kind, as stored and audited (`lease.<kind>`).
    pub fn kind(&self) -> &'static str {
        match self {
            Decision::Grant { .. } => "grant",
            Decision::Queue { .. } => "queue",
            Decision::Wait { .. } => "wait",
            Decision::Refuse { .. } => "refuse",
            Decision::MoveIn { .. } => "move-in",
            Decision::Warn { .. } => "warn",
            Decision::MoveOut { .. } => "move-out",
            Decision::Extend { .. } => "extend",
            Decision::Release { .. } => "release",
        }
    }

    /// What it says, for a person.
    pub fn detail(&self) -> String {
        match self {
            Decision::Grant {
                nodes, start, end, ..
            } => {
                format!("{} from {start} to {end}", nodes.join(","))
            }
            Decision::Queue { position, .. } => format!("position {position} in the queue"),
            Decision::Wait { until, .. } => format!("joins the queue at {until}"),
            Decision::Refuse { reason, .. } => reason.clone(),
            Decision::MoveIn { node, .. } => format!("{node} into the tenant's group"),
            Decision::Warn { nodes, end, .. } => format!("{} leave at {end}", nodes.join(",")),
            Decision::MoveOut { node, .. } => format!("{node} back to the pool"),
            Decision::Extend { end, .. } => format!("ends at {end}"),
            Decision::Release { .. } => "given back".into(),
        }
    }
}

/// Why an extension or a release was not done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No such lease (or not the caller's).
    #[error("no lease {0}")]
    NotFound(LeaseId),
    /// The lease is not in a phase that allows it.
    #[error("lease {id} is {phase}; {what}")]
    Phase {
        /// The lease.
        id: LeaseId,
        /// Its phase.
        phase: &'static str,
        /// What would be needed.
        what: &'static str,
    },
    /// The tenant's quota does not allow it.
    #[error("{0}")]
    Quota(String),
    /// The input itself.
    #[error("{0}")]
    Invalid(String),
}

/// The leases, the quotas and the pool: the loop's whole state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Book {
    /// Every lease, by number.
    pub leases: BTreeMap<LeaseId, Lease>,
    /// Each tenant's quota; a tenant without one cannot lease.
    pub quotas: BTreeMap<String, Quota>,
    /// The nodes leases are made of: the free pool and the nodes leased out.
    pub pool: Vec<PoolNode>,
    /// Seconds before its end that a lease is warned.
    pub warn_s: u64,
}

/// `s` seconds as hours, for messages.
fn hours(s: u64) -> String {
    let h = s as f64 / 3600.0;
    if h.fract() == 0.0 {
        format!("{h:.0}")
    } else {
        format!("{h:.2}")
    }
}

impl Book {
    /// A book with these pool nodes, no leases and no quotas.
    pub fn new(pool: Vec<PoolNode>, warn_s: u64) -> Book {
        Book {
            pool,
            warn_s,
            ..Book::default()
        }
    }

    /// The number the next request gets.
    pub fn next_id(&self) -> LeaseId {
        self.leases.keys().next_back().map_or(1, |k| k + 1)
    }

    /// The queue, first to be served first: queued leases by the time they joined
    /// (their earliest start), then by number.
    pub fn queue(&self) -> Vec<LeaseId> {
        let mut q: Vec<&Lease> = self
            .leases
            .values()
            .filter(|l| l.phase == Phase::Queued)
            .collect();
        q.sort_by_key(|l| (l.not_before, l.id));
        q.into_iter().map(|l| l.id).collect()
    }

    /// A queued lease's place in the queue (1 is next).
    pub fn position(&self, id: LeaseId) -> Option<usize> {
        self.queue().iter().position(|q| *q == id).map(|p| p + 1)
    }

    /// The pool nodes no live lease holds, in pool order.
    pub fn free(&self) -> Vec<&PoolNode> {
        let held: BTreeSet<&str> = self
            .leases
            .values()
            .filter(|l| l.phase.live())
            .flat_map(|l| l.nodes.iter().map(String::as_str))
            .collect();
        self.pool
            .iter()
            .filter(|n| !held.contains(n.name.as_str()))
            .collect()
    }

    /// Nodes `tenant` holds now.
    pub fn held_by(&self, tenant: &str) -> u64 {
        self.leases
            .values()
            .filter(|l| l.tenant == tenant && l.phase.live())
            .map(|l| u64::from(l.nodes_wanted))
            .sum()
    }

    /// Node-seconds charged to `tenant` in the quota period that holds `at`.
    pub fn used(&self, tenant: &str, at: u64) -> u64 {
        let Some(q) = self.quotas.get(tenant) else {
            return 0;
        };
        let period = q.period_s.max(1);
        self.leases
            .values()
            .filter(|l| l.tenant == tenant && l.start.is_some_and(|s| s / period == at / period))
            .map(Lease::charged)
            .fold(0, u64::saturating_add)
    }

    /// Why `lease` could never be granted as things stand (no quota, over the quota, more
    /// nodes than the pool or one switch has); `None` if it could.
    pub fn never(&self, lease: &Lease) -> Option<String> {
        let t = &lease.tenant;
        let Some(q) = self.quotas.get(t) else {
            return Some(format!(
                "tenant `{t}` has no lease quota; an admin sets one (weft lease quota)"
            ));
        };
        let n = lease.nodes_wanted;
        if n == 0 {
            return Some("a lease needs at least one node".into());
        }
        if lease.duration_s == 0 {
            return Some("a lease needs a duration of at least one second".into());
        }
        if n > q.max_nodes {
            return Some(format!(
                "{n} nodes is over tenant `{t}`'s quota of {} nodes at once",
                q.max_nodes
            ));
        }
        let want = u64::from(n).saturating_mul(lease.duration_s);
        if want > q.node_seconds {
            return Some(format!(
                "{n} nodes for {} h is {} node-hours, over tenant `{t}`'s quota of {} node-hours per {} h",
                hours(lease.duration_s),
                hours(want),
                hours(q.node_seconds),
                hours(q.period_s)
            ));
        }
        if n as usize > self.pool.len() {
            return Some(format!(
                "{n} nodes is more than the pool's {} nodes",
                self.pool.len()
            ));
        }
        if lease.same_switch {
            match largest_switch(&self.pool) {
                Some((most, _)) if most >= n as usize => {}
                Some((most, sw)) => {
                    return Some(format!(
                        "no leaf switch has {n} pool nodes (the most under one is {most}, under {sw}); ask without --same-switch or for fewer nodes"
                    ));
                }
                None => {
                    return Some(
                        "the pool's leaf switches are not known, so --same-switch cannot be honoured".into(),
                    );
                }
            }
        }
        None
    }

    /// Why `lease`'s own tenant's quota holds it back at `now`; `None` if it does not.
    pub fn quota_blocked(&self, lease: &Lease, now: u64) -> Option<String> {
        let q = self.quotas.get(&lease.tenant)?;
        let held = self.held_by(&lease.tenant);
        if held + u64::from(lease.nodes_wanted) > u64::from(q.max_nodes) {
            return Some(format!(
                "tenant `{}` holds {held} of its {} nodes",
                lease.tenant, q.max_nodes
            ));
        }
        let used = self.used(&lease.tenant, now);
        let want = u64::from(lease.nodes_wanted).saturating_mul(lease.duration_s);
        if used.saturating_add(want) > q.node_seconds {
            return Some(format!(
                "tenant `{}` used {} of its {} node-hours this period",
                lease.tenant,
                hours(used),
                hours(q.node_seconds)
            ));
        }
        None
    }

    /// A tenant's request at `now`: its number and what was decided (refused, waiting
    /// for its start, granted with its moves, or queued with its position; a tick's other
    /// decisions may come with it).
    pub fn request(&mut self, now: u64, ask: Ask) -> (LeaseId, Vec<Decision>) {
        let id = self.next_id();
        let not_before = ask.start.unwrap_or(now).max(now);
        let lease = Lease {
            id,
            tenant: ask.tenant,
            nodes_wanted: ask.nodes,
            duration_s: ask.duration_s,
            submitted: now,
            not_before,
            same_switch: ask.same_switch,
            phase: Phase::Queued,
            start: None,
            end: None,
            nodes: Vec::new(),
            reason: None,
        };
        if let Some(reason) = self.never(&lease) {
            self.leases.insert(
                id,
                Lease {
                    phase: Phase::Refused,
                    reason: Some(reason.clone()),
                    ..lease
                },
            );
            return (id, vec![Decision::Refuse { lease: id, reason }]);
        }
        if not_before > now {
            self.leases.insert(
                id,
                Lease {
                    phase: Phase::Waiting,
                    ..lease
                },
            );
            return (
                id,
                vec![Decision::Wait {
                    lease: id,
                    until: not_before,
                }],
            );
        }
        self.leases.insert(id, lease);
        let mut out = self.tick(now);
        if let Some(position) = self.position(id) {
            out.push(Decision::Queue {
                lease: id,
                position,
            });
        }
        (id, out)
    }

    fn lease_of(&self, id: LeaseId, tenant: Option<&str>) -> Result<&Lease, Refusal> {
        self.leases
            .get(&id)
            .filter(|l| tenant.is_none_or(|t| t == l.tenant))
            .ok_or(Refusal::NotFound(id))
    }

    /// Extends a live lease by `by_s` seconds at `now` (`tenant`: the caller's, `None`
    /// for an admin). The extension is charged to the period the lease started in.
    pub fn extend(
        &mut self,
        now: u64,
        id: LeaseId,
        tenant: Option<&str>,
        by_s: u64,
    ) -> Result<Vec<Decision>, Refusal> {
        let l = self.lease_of(id, tenant)?;
        if !l.phase.live() {
            return Err(Refusal::Phase {
                id,
                phase: l.phase.as_str(),
                what: "only a lease that holds its nodes can be extended",
            });
        }
        if by_s == 0 {
            return Err(Refusal::Invalid(
                "an extension needs at least one second".into(),
            ));
        }
        let start = l.start.unwrap_or(now);
        let want = u64::from(l.nodes_wanted).saturating_mul(by_s);
        let used = self.used(&l.tenant, start);
        if let Some(q) = self.quotas.get(&l.tenant)
            && used.saturating_add(want) > q.node_seconds
        {
            return Err(Refusal::Quota(format!(
                "extending lease {id} by {} h takes {} node-hours; tenant `{}` has {} of {} node-hours left in the period it started in",
                hours(by_s),
                hours(want),
                l.tenant,
                hours(q.node_seconds.saturating_sub(used)),
                hours(q.node_seconds)
            )));
        }
        let warn_s = self.warn_s;
        let Some(l) = self.leases.get_mut(&id) else {
            return Err(Refusal::NotFound(id));
        };
        let end = l.end.unwrap_or(now).saturating_add(by_s);
        l.end = Some(end);
        if end.saturating_sub(warn_s) > now {
            l.phase = Phase::Active;
        }
        Ok(vec![Decision::Extend { lease: id, end }])
    }

    /// Gives a lease back at `now`: a queued or waiting one leaves the queue, a live one
    /// moves its nodes out; the queue is then served.
    pub fn release(
        &mut self,
        now: u64,
        id: LeaseId,
        tenant: Option<&str>,
    ) -> Result<Vec<Decision>, Refusal> {
        let l = self.lease_of(id, tenant)?;
        if l.phase.closed() {
            return Err(Refusal::Phase {
                id,
                phase: l.phase.as_str(),
                what: "there is nothing to release",
            });
        }
        let Some(l) = self.leases.get_mut(&id) else {
            return Err(Refusal::NotFound(id));
        };
        let mut out = vec![Decision::Release { lease: id }];
        if l.phase.live() {
            out.extend(l.nodes.iter().map(|n| Decision::MoveOut {
                lease: id,
                node: n.clone(),
            }));
            l.end = Some(now);
        }
        l.phase = Phase::Released;
        out.extend(self.tick(now));
        Ok(out)
    }

    /// The clock moved to `now`: leases at their end move out (warned first if no tick
    /// fell in their warning time), leases within `warn_s` of their end are warned,
    /// waiting leases whose start came join the queue, queued leases that can no longer
    /// ever be met are refused, and the queue is served in order.
    pub fn tick(&mut self, now: u64) -> Vec<Decision> {
        let mut out = Vec::new();
        let warn_s = self.warn_s;
        for l in self.leases.values_mut() {
            let Some(end) = l.end.filter(|_| l.phase.live()) else {
                continue;
            };
            if end <= now {
                if l.phase == Phase::Active {
                    out.push(Decision::Warn {
                        lease: l.id,
                        nodes: l.nodes.clone(),
                        end,
                    });
                }
                out.extend(l.nodes.iter().map(|n| Decision::MoveOut {
                    lease: l.id,
                    node: n.clone(),
                }));
                l.phase = Phase::Ended;
            } else if l.phase == Phase::Active && end.saturating_sub(warn_s) <= now {
                out.push(Decision::Warn {
                    lease: l.id,
                    nodes: l.nodes.clone(),
                    end,
                });
                l.phase = Phase::Ending;
            }
        }
        for l in self.leases.values_mut() {
            if l.phase == Phase::Waiting && l.not_before <= now {
                l.phase = Phase::Queued;
            }
        }
        for id in self.queue() {
            let never = self.leases.get(&id).and_then(|l| self.never(l));
            if let (Some(reason), Some(l)) = (never, self.leases.get_mut(&id)) {
                l.phase = Phase::Refused;
                l.reason = Some(reason.clone());
                out.push(Decision::Refuse { lease: id, reason });
            }
        }
        for id in self.queue() {
            let Some(l) = self.leases.get(&id) else {
                continue;
            };
            if self.quota_blocked(l, now).is_some() {
                continue;
            }
            let Some(nodes) = pick(&self.free(), l.nodes_wanted, l.same_switch) else {
                // First come, first served: nobody behind it takes what it waits for.
                break;
            };
            let Some(l) = self.leases.get_mut(&id) else {
                continue;
            };
            let end = now.saturating_add(l.duration_s);
            l.phase = Phase::Active;
            l.start = Some(now);
            l.end = Some(end);
            l.nodes = nodes.clone();
            out.push(Decision::Grant {
                lease: id,
                nodes: nodes.clone(),
                start: now,
                end,
            });
            out.extend(
                nodes
                    .into_iter()
                    .map(|node| Decision::MoveIn { lease: id, node }),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book() -> Book {
        let pool = (1..=4)
            .map(|i| PoolNode {
                name: format!("n{i}"),
                switch: Some(if i <= 2 { "leaf-a" } else { "leaf-b" }.into()),
            })
            .collect();
        let mut b = Book::new(pool, 60);
        for t in ["alice", "bob"] {
            b.quotas.insert(
                t.into(),
                Quota {
                    max_nodes: 3,
                    node_seconds: 3 * 3600,
                    period_s: 86_400,
                },
            );
        }
        b
    }

    fn ask(tenant: &str, nodes: u32, duration_s: u64) -> Ask {
        Ask {
            tenant: tenant.into(),
            nodes,
            duration_s,
            start: None,
            same_switch: false,
        }
    }

    #[test]
    fn a_request_is_granted_queued_or_refused_with_its_reason() {
        let mut b = book();
        let (a, d) = b.request(0, ask("alice", 3, 600));
        assert!(
            matches!(&d[0], Decision::Grant { lease, nodes, .. } if *lease == a && nodes.len() == 3)
        );
        assert_eq!(d.iter().filter(|d| d.kind() == "move-in").count(), 3);
        let (q, d) = b.request(1, ask("bob", 2, 600));
        assert_eq!(
            d,
            vec![Decision::Queue {
                lease: q,
                position: 1
            }]
        );
        let (_, d) = b.request(2, ask("carol", 1, 600));
        assert!(
            matches!(&d[0], Decision::Refuse { reason, .. } if reason.contains("no lease quota"))
        );
        let (_, d) = b.request(2, ask("bob", 4, 60));
        assert!(
            matches!(&d[0], Decision::Refuse { reason, .. } if reason.contains("quota of 3 nodes"))
        );
        let (_, d) = b.request(2, ask("bob", 2, 3 * 3600));
        assert!(matches!(&d[0], Decision::Refuse { reason, .. } if reason.contains("node-hours")));
        let mut same = ask("bob", 3, 60);
        same.same_switch = true;
        let (_, d) = b.request(2, same);
        assert!(
            matches!(&d[0], Decision::Refuse { reason, .. } if reason.contains("no leaf switch has 3"))
        );
        // Alice gives back: bob's queued lease gets the nodes at once.
        let d = b.release(10, a, Some("alice")).unwrap();
        assert_eq!(d.iter().filter(|d| d.kind() == "move-out").count(), 3);
        assert!(
            d.iter()
                .any(|d| matches!(d, Decision::Grant { lease, .. } if *lease == q))
        );
        assert_eq!(
            b.release(11, a, Some("alice")).unwrap_err().to_string(),
            format!("lease {a} is released; there is nothing to release")
        );
        assert_eq!(b.release(11, q, Some("alice")), Err(Refusal::NotFound(q)));
    }

    #[test]
    fn a_lease_is_warned_then_ends_unless_extended() {
        let mut b = book();
        let (a, _) = b.request(0, ask("alice", 1, 600));
        assert!(b.tick(539).is_empty());
        assert!(matches!(
            &b.tick(540)[..],
            [Decision::Warn { end: 600, .. }]
        ));
        assert_eq!(b.leases[&a].phase, Phase::Ending);
        assert_eq!(
            b.extend(550, a, Some("alice"), 600).unwrap(),
            vec![Decision::Extend {
                lease: a,
                end: 1200
            }]
        );
        assert_eq!(b.leases[&a].phase, Phase::Active);
        assert!(b.tick(600).is_empty());
        let refused = b.extend(560, a, Some("alice"), 3 * 3600).unwrap_err();
        assert!(matches!(refused, Refusal::Quota(_)), "{refused}");
        let end = b.tick(1200);
        assert_eq!(
            end.iter().map(Decision::kind).collect::<Vec<_>>(),
            ["warn", "move-out"]
        );
        assert_eq!(b.leases[&a].phase, Phase::Ended);
        assert!(b.extend(1201, a, None, 60).is_err());
    }

    #[test]
    fn a_later_start_joins_the_queue_then_and_the_quota_blocked_do_not_block_others() {
        let mut b = book();
        let mut later = ask("alice", 1, 600);
        later.start = Some(100);
        let (w, d) = b.request(0, later);
        assert_eq!(
            d,
            vec![Decision::Wait {
                lease: w,
                until: 100
            }]
        );
        let (a, _) = b.request(0, ask("alice", 3, 600));
        assert_eq!(b.leases[&a].phase, Phase::Active);
        // At 100 alice's waiting lease is held back by her own quota; bob's request
        // behind it is served.
        let d = b.tick(100);
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(b.position(w), Some(1));
        let (q, d) = b.request(101, ask("bob", 1, 60));
        assert!(matches!(&d[0], Decision::Grant { lease, .. } if *lease == q));
        assert_eq!(b.position(w), Some(1));
    }
}
