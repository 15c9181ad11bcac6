//! The lease API's JSON types, shared by the server, the client and the CLI.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A lease as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseView {
    /// Its number.
    pub id: u64,
    /// Whose it is.
    pub tenant: String,
    /// Nodes asked for.
    pub nodes_wanted: u32,
    /// Seconds asked for.
    pub duration_s: u64,
    /// Unix seconds when it was asked for.
    pub submitted: u64,
    /// Unix seconds of its earliest start.
    pub not_before: u64,
    /// Every node under one leaf switch.
    pub same_switch: bool,
    /// `waiting`, `queued`, `active`, `ending`, `ended`, `released` or `refused`.
    #[schema(example = "active")]
    pub phase: String,
    /// Its place in the queue (1 is next), while queued.
    #[schema(required = true)]
    pub position: Option<usize>,
    /// Unix seconds when it got its nodes.
    #[schema(required = true)]
    pub start: Option<u64>,
    /// Unix seconds when its nodes move (or moved) out.
    #[schema(required = true)]
    pub end: Option<u64>,
    /// Its nodes.
    pub nodes: Vec<String>,
    /// Why it was refused, or what holds it in the queue.
    #[schema(required = true)]
    pub reason: Option<String>,
}

/// One decision of the lease loop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseDecisionView {
    /// Unix seconds.
    pub at: u64,
    /// `grant`, `queue`, `wait`, `refuse`, `move-in`, `warn`, `move-out`, `extend`, `release`.
    pub kind: String,
    /// What it says.
    pub detail: String,
}

/// A lease with every decision about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseDetail {
    /// The lease.
    pub lease: LeaseView,
    /// Its decisions, oldest first.
    pub decisions: Vec<LeaseDecisionView>,
}

/// A pool node, its leaf switch and the lease that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolNodeView {
    /// The server.
    pub name: String,
    /// Its leaf switch, if the fabric says.
    #[schema(required = true)]
    pub switch: Option<String>,
    /// The live lease that holds it.
    #[schema(required = true)]
    pub lease: Option<u64>,
}

/// `GET /v1/leases`: the caller's leases, the queue and the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseList {
    /// Leases this token may see, newest first.
    pub leases: Vec<LeaseView>,
    /// The queue, first to be served first (numbers of the leases this token may see).
    pub queue: Vec<u64>,
    /// Pool nodes (every one, with its holder, for an admin; none for a tenant).
    pub pool: Vec<PoolNodeView>,
    /// Nodes in the pool.
    pub pool_size: usize,
    /// Pool nodes no lease holds.
    pub pool_free: usize,
}

/// `POST /v1/leases`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// How many nodes.
    #[schema(minimum = 1)]
    pub nodes: u32,
    /// For how many seconds.
    #[schema(minimum = 1)]
    pub duration_s: u64,
    /// Unix seconds of the earliest start (absent: now).
    #[serde(default)]
    pub start: Option<u64>,
    /// Every node under one leaf switch, or wait.
    #[serde(default)]
    pub same_switch: bool,
}

/// `POST /v1/leases/{id}/extend`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendLease {
    /// Seconds to add.
    #[schema(minimum = 1)]
    pub by_s: u64,
}

/// What a request, an extension or a release did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseAccepted {
    /// The lease now.
    pub lease: LeaseView,
    /// What was decided (the lease's, and any others' the step took, such as a queued
    /// lease granted the nodes a release freed).
    pub decisions: Vec<LeaseDecisionView>,
    /// The operations that carry out its moves, to poll.
    pub operations: Vec<i64>,
}

/// A tenant's lease quota and its use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseQuotaView {
    /// The tenant.
    pub tenant: String,
    /// Nodes at once.
    pub max_nodes: u32,
    /// Node-seconds of the leases started in one period.
    pub node_seconds: u64,
    /// The period, in seconds (aligned to the epoch).
    pub period_s: u64,
    /// Nodes it holds now.
    pub held_nodes: u64,
    /// Node-seconds charged in the current period.
    pub used_node_seconds: u64,
}

/// `PUT /v1/lease-quotas/{tenant}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetLeaseQuota {
    /// Nodes at once.
    pub max_nodes: u32,
    /// Node-seconds of the leases started in one period.
    pub node_seconds: u64,
    /// The period, in seconds.
    #[schema(minimum = 1)]
    pub period_s: u64,
}

/// A warning for an agent: a lease on its server ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseNotice {
    /// The lease.
    pub lease: u64,
    /// Unix seconds when the server leaves the tenant's group.
    pub end: u64,
}
