//! The API's JSON types, shared by the server, the client, the CLI and the tests.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use weft_fabric::Guid;

use crate::auth::Secret;

/// Whether a server's agent is reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    /// Reported within the stale bound.
    Ok,
    /// Enrolled, then silent for longer than the stale bound.
    Stale,
    /// Enrolled, never reported.
    Never,
}

impl Liveness {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Ok => "ok",
            Liveness::Stale => "stale",
            Liveness::Never => "never",
        }
    }
}

/// One port a server owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PortView {
    /// Port GUID.
    #[schema(value_type = String, example = "0x0002c90300000101")]
    pub guid: Guid,
    /// RDMA device name (`mlx5_0`).
    pub device: String,
    /// Port number on the device.
    pub num: u32,
    /// LID as the agent saw it.
    pub lid: u16,
    /// Port state as the agent saw it (`ACTIVE`).
    pub state: String,
    /// The port's rate as sysfs writes it (`400 Gb/sec (4X NDR)`); `None` where the
    /// agent could not read it (the kernel refuses while the speed is unknown).
    #[serde(default)]
    #[schema(required = true)]
    pub rate: Option<String>,
    /// The MTU of the port's netdev (IPoIB or RoCE), in bytes: sysfs has no active-MTU
    /// file under a port, so this is the nearest it has; `None` where the port has no
    /// netdev.
    #[serde(default)]
    #[schema(required = true)]
    pub mtu: Option<u32>,
}

/// A server (one agent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServerView {
    /// Its name (the host name it enrolled with).
    pub name: String,
    /// Whether its agent reports.
    pub liveness: Liveness,
    /// Unix seconds of the last report or heartbeat.
    #[schema(required = true)]
    pub last_seen: Option<u64>,
    /// The InfiniBand ports it owns.
    pub ports: Vec<PortView>,
    /// The group it belongs to, if any.
    #[schema(required = true)]
    pub group: Option<String>,
    /// GUIDs it reported that another server owns (held pending).
    #[schema(value_type = Vec<String>)]
    pub pending_claims: Vec<Guid>,
    /// Its RoCE ports (a DGX Spark's ConnectX-7), from its last report.
    pub roce: Vec<RoceView>,
    /// Its NICs on a PCI function, from its last report.
    pub nics: Vec<NicView>,
    /// Its GPUs, from its last report.
    #[schema(value_type = Vec<GpuSchema>)]
    pub gpus: Vec<weft_agent::Gpu>,
}

/// One RoCE port (link layer Ethernet) of a server, as its agent last reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoceView {
    /// RDMA device name (`rocep1s0f0`).
    pub device: String,
    /// Port number on the device.
    pub num: u32,
    /// The low half of GID 0: the EUI-64 of the netdev's MAC.
    #[schema(value_type = String, example = "0x0202c9fffe020101")]
    pub guid: Guid,
    /// Port state (`ACTIVE`).
    pub state: String,
    /// The port's rate as the device writes it (`200 Gb/sec (4X HDR)`); null when unknown.
    #[schema(required = true)]
    pub rate: Option<String>,
    /// Its netdev (`enp1s0f0np0`), if it has one.
    #[schema(required = true)]
    pub netdev: Option<String>,
}

/// One NIC of a server (a netdev on a PCI function), as its agent last reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NicView {
    /// Interface name.
    pub name: String,
    /// `Ethernet` or `InfiniBand` (IPoIB), `Unknown` otherwise.
    pub link_layer: String,
    /// Negotiated speed in Mb/s; null when the kernel does not know it (link down).
    #[schema(required = true)]
    pub speed_mbps: Option<u32>,
    /// MTU in bytes.
    pub mtu: u32,
    /// `operstate` (`up`).
    pub operstate: String,
    /// PCI address.
    #[schema(required = true)]
    pub pci: Option<String>,
    /// The RDMA device whose port it is, if any.
    #[schema(required = true)]
    pub rdma_device: Option<String>,
    /// IP addresses with prefix length.
    pub addresses: Vec<String>,
}

/// What a report says of a server's links beyond its InfiniBand ports: kept per server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostLinks {
    /// RoCE ports.
    pub roce: Vec<RoceView>,
    /// NICs.
    pub nics: Vec<NicView>,
}

impl HostLinks {
    /// The RoCE ports and NICs of an agent's report.
    pub fn of(report: &weft_agent::HostReport) -> HostLinks {
        let state = |s: weft_agent::PortState| {
            let text = s.to_string();
            text.split_once(": ")
                .map_or(text.clone(), |(_, n)| n.to_string())
        };
        HostLinks {
            roce: report
                .roce_ports()
                .into_iter()
                .map(|(d, p)| RoceView {
                    device: d.name.clone(),
                    num: p.num,
                    guid: p.port_guid,
                    state: state(p.state),
                    rate: p.rate_text.clone(),
                    netdev: p.netdevs.first().cloned(),
                })
                .collect(),
            nics: report
                .data_nics()
                .into_iter()
                .map(|n| NicView {
                    name: n.name.clone(),
                    link_layer: n.link_layer().to_string(),
                    speed_mbps: n.speed_mbps,
                    mtu: n.mtu,
                    operstate: n.operstate.to_string(),
                    pci: n.pci.clone(),
                    rdma_device: n.rdma_device.clone(),
                    addresses: n.addresses.clone(),
                })
                .collect(),
        }
    }
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    /// Its name.
    pub name: String,
    /// Its groups.
    pub groups: Vec<String>,
}

/// The answer to creating a tenant: its first API token, shown once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantCreated {
    /// The tenant.
    pub tenant: TenantView,
    /// A tenant-role API token; only its hash is kept.
    #[schema(value_type = String)]
    pub token: Secret,
}

/// A group: one partition, owned by a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GroupView {
    /// Its name (the partition's name).
    pub name: String,
    /// The owning tenant.
    pub tenant: String,
    /// Its P_Key base, `0x0a01`.
    pub pkey: String,
    /// Its servers.
    pub members: Vec<String>,
    /// The port GUIDs of its servers.
    #[schema(value_type = Vec<String>)]
    pub ports: Vec<Guid>,
}

/// An operation's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OpState {
    /// Committed to the desired state, not yet verified on the fabric.
    Pending,
    /// Delivered to every SM and verified on the ports.
    Applied,
}

/// A change an operator asked for, and how far it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OperationView {
    /// Its id.
    pub id: i64,
    /// Who asked.
    pub actor: String,
    /// What (`move node7 alice -> bob`).
    pub action: String,
    /// The desired-state generation it created.
    pub generation: i64,
    /// How far it got.
    pub state: OpState,
    /// Failed delivery attempts so far.
    pub attempts: i64,
    /// The last error, if an attempt failed.
    #[schema(required = true)]
    pub last_error: Option<String>,
    /// The partitions.conf diff it made (`-`/`+` lines).
    pub diff: String,
    /// Unix seconds.
    pub created: u64,
    /// Unix seconds when it was verified on the fabric.
    #[schema(required = true)]
    pub finished: Option<u64>,
    /// What the delivery could not verify: ports of its servers that are not on the
    /// fabric, by GUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// What its delivery took away from what the SMs held, one line each: removals in
    /// words (`- ALL goes from full to limited in partition `Default` (0x7fff)`), then every
    /// port that loses a key (`port 0x... (node1 HCA-1): loses 0xffff`), also ports of
    /// servers it did not name. Empty when it took nothing (or was not yet applied).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taken: Vec<String>,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditEntry {
    /// Its id (increasing).
    pub id: i64,
    /// Unix seconds.
    pub at: u64,
    /// Who: `admin:…`, `tenant:…`, `agent:<server>`, `controller`.
    pub actor: String,
    /// What (`group.move`, `apply`, `claim.pending`, …).
    pub action: String,
    /// What it was about (`node7`, `operation 4`).
    pub subject: String,
    /// The rendered partitions.conf diff, where the action changes it.
    pub diff: String,
    /// `accepted`, `applied`, `failed`, `refused`, `pending`, …
    pub outcome: String,
    /// Details (an error, a checksum, timings).
    pub detail: String,
}

/// What a prune of the audit log did (`POST /v1/audit/prune`, `weft controller audit
/// prune`): the lines older than `before` deleted, and the line that records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditPruned {
    /// The id of the `audit.prune` line that records the prune (it stays).
    pub line: i64,
    /// The cut-off: lines written before it (Unix seconds) were deleted.
    pub before: u64,
    /// How many lines were deleted.
    pub count: u64,
    /// When the oldest deleted line was written (Unix seconds); none when nothing was.
    pub oldest: Option<u64>,
    /// When the newest deleted line was written.
    pub newest: Option<u64>,
}

/// A GUID a server reported that another server already owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClaimView {
    /// Its id.
    pub id: i64,
    /// The port GUID.
    #[schema(value_type = String, example = "0x0002c90300000101")]
    pub guid: Guid,
    /// The server that reported it.
    pub claimant: String,
    /// The server that owns it now.
    pub owner: String,
    /// `pending`, `approved`, `rejected`.
    pub state: String,
    /// Unix seconds.
    pub created: u64,
}

/// The controller's view of desired against observed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StatusView {
    /// Generation of the desired state (bumped by every change).
    pub desired_generation: i64,
    /// Generation last delivered and verified.
    pub applied_generation: i64,
    /// Checksum of the partitions file last verified.
    #[schema(required = true)]
    pub applied_checksum: Option<String>,
    /// Operations not yet applied.
    pub pending_operations: i64,
    /// Servers whose agents went silent.
    pub stale_servers: Vec<String>,
    /// Whether the controller delivers to subnet managers and verifies on ports; `false`
    /// under `weft controller --no-fabric`, where "applied" means recorded only.
    #[serde(default)]
    #[schema(required = true)]
    pub delivers: bool,
    /// Whether the SMs' files and the ports still hold what was applied.
    #[serde(default)]
    #[schema(required = true)]
    pub drift: DriftView,
    /// The partitions file last verified (what `weft fabric verify` compares against).
    #[serde(default)]
    #[schema(required = true)]
    pub applied_conf: Option<String>,
    /// The controller's Default partition policy, in words (it isolates).
    #[serde(default)]
    pub default_policy: String,
}

/// Whether the fabric still holds what the controller applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DriftState {
    /// Not checked yet (nothing applied, no fabric, or no check done).
    #[default]
    Unknown,
    /// Every SM's file and every port checked hold what was applied.
    InSync,
    /// Something differs: see the lists.
    Drift,
}

impl DriftState {
    /// As printed.
    pub fn as_str(self) -> &'static str {
        match self {
            DriftState::Unknown => "unknown",
            DriftState::InSync => "in sync",
            DriftState::Drift => "DRIFT",
        }
    }
}

/// The drift check's last findings (`GET /v1/status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DriftView {
    /// The verdict.
    pub state: DriftState,
    /// When the SMs' files were last read (Unix seconds).
    #[schema(required = true)]
    pub files_checked_at: Option<u64>,
    /// When the ports' tables were last read (Unix seconds).
    #[schema(required = true)]
    pub ports_checked_at: Option<u64>,
    /// SMs whose file is not the applied one.
    pub files: Vec<String>,
    /// SMs that could not be read (no verdict on them).
    pub unreadable: Vec<String>,
    /// Ports whose tables are not what the applied file programs.
    pub ports: Vec<String>,
    /// Repairs delivered since the controller started.
    pub repairs: u64,
    /// Every configured SM as the last file check read it: its role, its file's
    /// checksum, whether that is the applied file.
    #[serde(default)]
    pub sms: Vec<SmView>,
}

/// One subnet manager, as the drift check last read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SmView {
    /// Its configured name.
    pub name: String,
    /// `master` (the SM the fabric names as master: `sminfo`, or SMInfo at the local
    /// port's MasterSMLID), `standby` (a configured SM that is not the master), or
    /// `unknown` (the master could not be read).
    pub role: String,
    /// SHA-256 of the partitions file it holds (`None`: it holds none, or it could not
    /// be read).
    #[schema(required = true)]
    pub checksum: Option<String>,
    /// Whether its file is the applied one.
    pub agrees: bool,
    /// Why its file or the master could not be read, when it could not.
    #[schema(required = true)]
    pub error: Option<String>,
}

/// `POST /v1/agents/enroll`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnrollRequest {
    /// The one-time enrollment token.
    #[schema(value_type = String)]
    pub token: Secret,
    /// The host name the agent discovered.
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")]
    pub hostname: String,
}

/// The answer to enrolling: the agent's secret, shown once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Enrolled {
    /// The server name the controller knows this agent by.
    pub server: String,
    /// The per-agent secret for every later report.
    #[schema(value_type = String)]
    pub secret: Secret,
}

/// `POST /v1/enrollments`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnrollmentRequest {
    /// Bind the token to one host name.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")]
    pub server: Option<String>,
    /// Seconds the token stays valid, 60 to 2 592 000 (30 days); default one day.
    #[serde(default)]
    #[schema(minimum = 60, maximum = 2_592_000)]
    pub ttl_s: Option<u64>,
}

/// A one-time enrollment token, shown once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EnrollmentToken {
    /// The token.
    #[schema(value_type = String)]
    pub token: Secret,
    /// Unix seconds when it expires.
    pub expires: u64,
}

/// What the controller made of a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReportAck {
    /// The server name.
    pub server: String,
    /// Ports it now owns.
    #[schema(value_type = Vec<String>)]
    pub owned: Vec<Guid>,
    /// Ports held pending because another server owns them.
    #[schema(value_type = Vec<String>)]
    pub pending: Vec<Guid>,
}

/// `POST /v1/tenants`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// The name.
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")]
    pub name: String,
}

/// `POST /v1/groups`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateGroup {
    /// The name (a partitions.conf name).
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")]
    pub name: String,
    /// The owning tenant.
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")]
    pub tenant: String,
}

/// `POST /v1/groups/{group}/members`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMember {
    /// The server.
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")]
    pub server: String,
}

/// `POST /v1/moves`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveServer {
    /// The server.
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")]
    pub server: String,
    /// The group it goes to.
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")]
    pub to: String,
}

/// The scope of an API token as a request names it: always explicit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TokenRole {
    /// Everything.
    Admin,
    /// One tenant's groups; the request names the tenant.
    Tenant,
}

/// `POST /v1/tokens`: `{"role": "admin"}` or `{"role": "tenant", "tenant": "alice"}`.
/// The role is required: a body without it (or with a field the API does not know, such
/// as a misspelled `tenat`) is refused, never read as an admin token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// `admin` or `tenant`.
    pub role: TokenRole,
    /// The tenant, for (and only for) `"role": "tenant"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")]
    pub tenant: Option<String>,
    /// Seconds the token stays valid, 60 to 315 360 000 (ten years). Tenant tokens
    /// default to 90 days; admin tokens made here without it never expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 60, maximum = 315_360_000)]
    pub ttl_s: Option<u64>,
}

/// A fresh API token, shown once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    /// The token.
    #[schema(value_type = String)]
    pub token: Secret,
    /// Its id in `GET /v1/tokens` (the first 16 hex digits of its SHA-256).
    pub id: String,
    /// Unix seconds when it stops working; `None`: never.
    #[schema(required = true)]
    pub expires: Option<u64>,
}

/// One API token as `GET /v1/tokens` lists it: metadata only, never the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    /// The first 16 hex digits of the token's SHA-256: what `DELETE /v1/tokens/{id}` takes.
    pub id: String,
    /// `admin` or `tenant`.
    pub role: TokenRole,
    /// The tenant of a tenant token.
    #[schema(required = true)]
    pub tenant: Option<String>,
    /// `bootstrap` (the controller's `WEFT_ADMIN_TOKEN`) or `api` (made through the API).
    pub source: String,
    /// Unix seconds.
    pub created: u64,
    /// Unix seconds when it stops working; `None`: never.
    #[schema(required = true)]
    pub expires: Option<u64>,
    /// Unix seconds when it was revoked.
    #[schema(required = true)]
    pub revoked: Option<u64>,
}

/// The answer to a change: the operation it created (absent when nothing changed).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Accepted {
    /// The operation to poll at `/v1/operations/{id}`.
    #[schema(required = true)]
    pub operation: Option<OperationView>,
}

/// An error answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong (for 5xx, only that it did).
    pub error: String,
}

/// The answer of a controller that does not lead to a write (HTTP 421): the error shape
/// with `code` `not_leader` and the leader's advertised URL (null while none is known).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NotLeaderBody {
    /// What went wrong, and where to go.
    pub error: String,
    /// Always `not_leader`.
    pub code: String,
    /// The leader's advertised URL, or null while no leader is elected (or it advertises none).
    #[schema(required = true)]
    pub leader: Option<String>,
}

/// A member of a group as a job sees it: liveness and the GPUs its agent reported
/// (`GET /v1/groups/{group}/nodes`, for `weft plan --group` and `weft run --group`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    /// The server's name (its host name).
    pub name: String,
    /// Whether its agent reports.
    pub liveness: Liveness,
    /// Unix seconds of the last report or heartbeat.
    #[schema(required = true)]
    pub last_seen: Option<u64>,
    /// The GPUs of its last report; empty when it reported none.
    #[schema(value_type = Vec<GpuSchema>)]
    pub gpus: Vec<weft_agent::Gpu>,
}

impl NodeView {
    /// The planner's view of the node (`weft plan --group`): each GPU's memory, and whether
    /// its agent reports now.
    pub fn plan_node(&self) -> weft_plan::cluster::NodeGpus {
        weft_plan::cluster::NodeGpus {
            name: self.name.clone(),
            memory_bytes: self.gpus.iter().map(|g| g.memory_total_bytes).collect(),
            live: self.liveness == Liveness::Ok,
        }
    }

    /// The node as the uneven planner reads a report: its name, and each GPU's NVML name and
    /// memory ([`weft_plan::uneven::from_reports`]).
    pub fn reported(&self) -> weft_plan::uneven::ReportedNode {
        (
            self.name.clone(),
            self.gpus
                .iter()
                .map(|g| (g.name.clone(), g.memory_total_bytes))
                .collect(),
        )
    }
}

/// The schema of [`weft_agent::Gpu`] in the API document (weft-agent does not depend on
/// utoipa); a test checks it names exactly the fields a serialized `Gpu` has.
#[derive(ToSchema)]
#[schema(as = Gpu)]
#[allow(dead_code)]
pub(crate) struct GpuSchema {
    /// NVML device index.
    index: u32,
    /// Product name, for example `NVIDIA H200`.
    name: String,
    /// `GPU-...` UUID.
    #[schema(required = true)]
    uuid: Option<String>,
    /// Total memory in bytes; `null` where NVML does not report it (GB10's unified memory).
    #[schema(required = true)]
    memory_total_bytes: Option<u64>,
    /// PCI address in sysfs form (`0000:01:00.0`).
    #[schema(required = true)]
    pci: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str, memory: Option<u64>) -> weft_agent::Gpu {
        weft_agent::Gpu {
            index: 0,
            name: name.into(),
            uuid: None,
            memory_total_bytes: memory,
            pci: None,
        }
    }

    #[test]
    fn the_planner_sees_each_gpus_memory_and_only_a_reporting_agent_as_live() {
        let mut n = NodeView {
            name: "spark1".into(),
            liveness: Liveness::Ok,
            last_seen: Some(1),
            gpus: vec![
                gpu("NVIDIA GB10", None),
                gpu("NVIDIA H200", Some(141 << 30)),
            ],
        };
        assert_eq!(
            n.plan_node(),
            weft_plan::cluster::NodeGpus {
                name: "spark1".into(),
                memory_bytes: vec![None, Some(141 << 30)],
                live: true,
            }
        );
        assert_eq!(
            n.reported(),
            (
                "spark1".to_string(),
                vec![
                    ("NVIDIA GB10".to_string(), None),
                    ("NVIDIA H200".to_string(), Some(141 << 30))
                ]
            )
        );
        for l in [Liveness::Stale, Liveness::Never] {
            n.liveness = l;
            assert!(!n.plan_node().live);
        }
    }
}
