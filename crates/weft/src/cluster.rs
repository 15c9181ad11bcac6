//! The fabric controller's commands: `weft controller` and `weft agent` (the services),
//! and `weft nodes`, `weft group`, `weft tenant`, `weft audit` (clients of its API).
//! Glue only: the work is in `weft-controller`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::{Args, Subcommand};
use weft_controller::agent::{AgentConfig, AgentError};
use weft_controller::auth::Secret;
use weft_controller::client::{Client, ClientError};
use weft_controller::model::{Accepted, OpState, OperationView};
use weft_controller::reconcile::{Fabric, OpenSmFabric, RecordingFabric};
use weft_controller::store::{PgStore, SqliteStore};
use weft_controller::tls::{ClientTls, ServerTls};
use weft_controller::{Controller, ControllerConfig};

use crate::config::{Config, ControllerClientConfig};
use crate::output;
use crate::{EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_OK};

mod nodes_view;
mod store_admin;

/// Where the controller is and who is asking.
#[derive(Args)]
pub struct Remote {
    #[command(flatten)]
    trust: Trust,
    /// API token (admin, or a tenant's).
    #[arg(long, env = "WEFT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Timeout of each request, seconds.
    #[arg(long, default_value_t = 10)]
    timeout_s: u64,
}

impl Remote {
    /// The controller as the environment alone names it (`WEFT_CONTROLLER`,
    /// `WEFT_CONTROLLER_URLS`, `WEFT_TOKEN`, `WEFT_CA_FILE`, `WEFT_PIN`,
    /// `WEFT_INSECURE_HTTP`; `[controller]` of weft.toml under them in [`client_for`]), for a
    /// command that has none of these flags: read through the flags' own definitions, so as
    /// every controller command reads them. A blank token, CA file or pin counts as unset.
    pub(crate) fn from_env() -> std::result::Result<Remote, clap::Error> {
        #[derive(clap::Parser)]
        struct FromEnv {
            #[command(flatten)]
            remote: Remote,
        }
        let mut r = <FromEnv as clap::Parser>::try_parse_from(["weft"])?.remote;
        let blank = |v: &std::ffi::OsStr| v.to_string_lossy().trim().is_empty();
        r.token = r.token.filter(|t| !blank(t.as_ref()));
        r.trust.pin = r.trust.pin.filter(|p| !blank(p.as_ref()));
        r.trust.ca_file = r.trust.ca_file.filter(|f| !blank(f.as_os_str()));
        Ok(r)
    }

    /// How the controller is trusted (`--ca-file`, `--pin`, `--insecure-http` or their
    /// `WEFT_*` variables, over `[controller]` of weft.toml), for a client of a URL given
    /// some other way (`--report-to`).
    pub(crate) fn tls(&self, file: &ControllerClientConfig) -> ClientTls {
        self.trust.tls(file)
    }
}

/// The controller's URL and how it is trusted (flags, then `WEFT_*`, then `[controller]`
/// in weft.toml).
#[derive(Args)]
pub struct Trust {
    /// The controller's API: https://HOST:PORT, or http:// on loopback [default:
    /// `--controller-urls`, else `[controller] urls` or `url` of weft.toml, else
    /// http://127.0.0.1:7100].
    #[arg(long, env = "WEFT_CONTROLLER")]
    controller: Option<String>,
    /// The controllers of one store, comma-separated (a leader and its followers): a call
    /// that cannot reach one goes on to the next, and follows a follower to the leader.
    #[arg(long, env = "WEFT_CONTROLLER_URLS", value_name = "URL,URL...")]
    controller_urls: Option<String>,
    /// PEM CA certificate(s) to verify the controller's certificate and name against.
    #[arg(long, env = "WEFT_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Trust exactly the certificate with this fingerprint (`sha256:<hex>`, as
    /// `weft controller --tls-self-signed` prints it).
    #[arg(long, env = "WEFT_PIN")]
    pin: Option<String>,
    /// Allow plain http:// to a controller off loopback (tokens cross the network in clear).
    #[arg(long, env = "WEFT_INSECURE_HTTP")]
    insecure_http: bool,
}

impl Trust {
    /// The URLs and the TLS settings, the flags over the config file.
    fn resolve(&self, file: &ControllerClientConfig) -> Result<(Vec<String>, ClientTls)> {
        let urls = controller_urls(
            self.controller.as_deref(),
            self.controller_urls.as_deref(),
            file,
        )?;
        Ok((urls, self.tls(file)))
    }

    /// The TLS settings alone, the flags over the config file.
    fn tls(&self, file: &ControllerClientConfig) -> ClientTls {
        ClientTls {
            ca_file: self.ca_file.clone().or_else(|| file.ca_file.clone()),
            pin: self.pin.clone().or_else(|| file.pin.clone()),
            insecure_http: self.insecure_http || file.insecure_http,
        }
    }
}

/// The controller URLs a client talks to: `one` (`--controller`, `WEFT_CONTROLLER`) as a
/// one-element list, else `list` (`--controller-urls`, `WEFT_CONTROLLER_URLS`,
/// comma-separated), else `[controller] urls`, else `[controller] url`, else the loopback
/// default. The file giving both `url` and `urls` is refused: which one it means is not
/// for weft to guess.
fn controller_urls(
    one: Option<&str>,
    list: Option<&str>,
    file: &ControllerClientConfig,
) -> Result<Vec<String>> {
    if let Some(u) = one.filter(|u| !u.trim().is_empty()) {
        return Ok(vec![u.trim().to_string()]);
    }
    if let Some(l) = list.filter(|l| !l.trim().is_empty()) {
        return Ok(weft_controller::client::split_urls(l));
    }
    match (&file.url, &file.urls) {
        (Some(_), Some(_)) => Err(anyhow!(
            "[controller] gives both `url` and `urls`: keep one (`urls = [\"https://a:7100\", \"https://b:7100\"]` names every controller of the store)"
        )),
        (None, Some(l)) if l.is_empty() => Err(anyhow!(
            "[controller] urls is empty: name at least one controller, e.g. urls = [\"https://ctl:7100\"]"
        )),
        (None, Some(l)) => Ok(l.clone()),
        (Some(u), None) => Ok(vec![u.clone()]),
        (None, None) => Ok(vec!["http://127.0.0.1:7100".into()]),
    }
}

/// How long a change waits to be verified on the fabric.
#[derive(Args)]
pub struct Wait {
    /// Return once the change is accepted, without waiting for the fabric.
    #[arg(long)]
    no_wait: bool,
    /// Seconds to wait for the change to be verified on the ports.
    #[arg(long, default_value_t = 60)]
    wait_s: u64,
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Run the fabric controller: API, store, reconcile loop, metrics.
    #[command(
        after_help = "Examples:\n  WEFT_ADMIN_TOKEN=... weft --config weft.toml controller --db /var/lib/weft/controller.db --init   # --init: first start\n  weft controller --listen 0.0.0.0:7100 --tls-self-signed        # prints the fingerprint to --pin\n  weft controller --listen 10.0.0.1:7100 --tls-cert ctl.crt --tls-key ctl.key\n  weft controller --store postgres://weft@db/weft --listen 0.0.0.0:7100 --tls-self-signed --advertise-url https://ctl2:7100   # one of several on one PostgreSQL: one leads, the others answer writes 421 with the leader's URL\n\nThe subnet managers are the [[fabric.sm]] entries of the config file. Plain HTTP only on\nloopback unless --insecure-http."
    )]
    Controller(Box<ControllerArgs>),
    /// Run the agent of this server: discover its ports and report them to the controller.
    #[command(
        after_help = "Example:\n  WEFT_ENROLL_TOKEN=wfe_... weft agent --controller https://10.0.0.1:7100 --pin sha256:... --state-file /var/lib/weft/agent.json\n\nThe agent verifies the controller (--ca-file or --pin) before it sends a token or a report."
    )]
    Agent(AgentArgs),
    /// Servers, their ports and whether their agents report; enrollment and GUID claims.
    #[command(
        after_help = "Examples:\n  weft nodes\n  weft nodes enroll --server node7\n  weft nodes claims\n  weft nodes approve 3"
    )]
    Nodes(NodesArgs),
    /// Groups of servers: one InfiniBand partition each, owned by a tenant.
    #[command(subcommand)]
    Group(GroupCommand),
    /// Tenants and their API tokens.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// The audit log: who changed what, when, the rendered diff, the outcome.
    #[command(after_help = "Example:\n  weft audit --limit 20 --diff")]
    Audit(AuditArgs),
    /// API tokens: list (ids and metadata, never a token), make an admin token, revoke.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Lease nodes from the provider's free pool for a time (a tenant's token); the
    /// controller moves them in and back by itself. Quotas are an admin's.
    #[command(
        subcommand,
        after_help = "Examples:\n  weft lease request --nodes 4 --for 8h --same-switch\n  weft lease list\n  weft lease extend 7 --by 2h\n  weft lease release 7\n  weft lease quota set alice --nodes 4 --node-hours 200 --period 7d   # admin"
    )]
    Lease(crate::lease::LeaseCommand),
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// List every API token: id, role, tenant, where it came from, expiry, revocation.
    #[command(after_help = "Example:\n  weft token list --json")]
    List {
        #[command(flatten)]
        remote: Remote,
    },
    /// Make another admin token (shown once).
    #[command(after_help = "Example:\n  weft token admin --ttl-s 86400")]
    Admin {
        /// Seconds it stays valid (60 to 315360000; default one day). It also ends when the
        /// controller restarts with a new WEFT_ADMIN_TOKEN.
        #[arg(long)]
        ttl_s: Option<u64>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Revoke a token by its id (from `weft token list`); it stops working at once.
    #[command(after_help = "Example:\n  weft token revoke 3f2a9c0d1e4b5a6f")]
    Revoke {
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ControllerArgs {
    #[command(subcommand)]
    command: Option<ControllerCommand>,
    /// API listen address (port 0 picks one; the address is printed) [default: `[controller]
    /// listen` of weft.toml, else 127.0.0.1:7100].
    #[arg(long)]
    listen: Option<String>,
    /// Metrics listen address (`/metrics`) [default: `[controller] metrics_listen`, else
    /// 127.0.0.1:7101].
    #[arg(long)]
    metrics_listen: Option<String>,
    /// The SQLite database [default: `[controller] db`, else /var/lib/weft/controller.db].
    #[arg(long)]
    db: Option<PathBuf>,
    /// A PostgreSQL store instead of the SQLite --db: `postgres://USER@HOST/DATABASE` (a
    /// unix socket directory as a percent-encoded host; a password in it is never printed)
    /// [default: `[controller] store_url` of weft.toml, unless --db is given].
    #[arg(
        long,
        env = "WEFT_STORE_URL",
        hide_env_values = true,
        conflicts_with = "db"
    )]
    store: Option<String>,
    /// Create the store when the file is missing or empty (first start). Without it such a
    /// file is refused, so that a lost or unmounted database never comes back empty.
    #[arg(long)]
    init: bool,
    /// With a PostgreSQL --store, several controllers run and one leads: the URL the
    /// others hand out for this one while it leads (their writes answer 421 `not_leader`
    /// with it) [default: `[controller] advertise_url`, else the API's listen address
    /// unless it is unspecified].
    #[arg(long, value_name = "URL")]
    advertise_url: Option<String>,
    /// A file holding an admin API token to accept.
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// Seconds of silence after which an agent is shown stale [default: 30].
    #[arg(long)]
    stale_after_s: Option<u64>,
    /// Deliver to no subnet manager (render and record only): for trying the API.
    #[arg(long)]
    no_fabric: bool,
    /// The PEM certificate chain the API (and metrics) listener presents.
    #[arg(long, env = "WEFT_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "WEFT_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Make a self-signed certificate on first start (kept in --tls-cert/--tls-key, default
    /// beside --db) and print its fingerprint for clients' --pin.
    #[arg(long)]
    tls_self_signed: bool,
    /// Extra names (host names, IP addresses) for the self-signed certificate.
    #[arg(long, value_delimiter = ',')]
    tls_name: Vec<String>,
    /// Take over the partitions the SMs hold that this controller did not write (a file
    /// `weft fabric apply` wrote): they are kept in every file it writes. Without it, a
    /// delivery that would remove them is refused.
    #[arg(long)]
    adopt: bool,
    /// Seconds between drift checks of the SMs' files (and reconcile passes) [default: 30].
    #[arg(long)]
    recheck_s: Option<u64>,
    /// Seconds between drift checks of every port's P_Key table [default: 300].
    #[arg(long)]
    port_check_s: Option<u64>,
    /// Deliver the applied state again when drift is found (else it is only reported:
    /// metric, audit line, `weft fabric status`).
    #[arg(long)]
    repair_drift: bool,
    /// Serve plain HTTP on an address that is not loopback (tokens in clear).
    #[arg(long, env = "WEFT_INSECURE_HTTP")]
    insecure_http: bool,
    /// The provider's pool group: the nodes tenants lease (`weft lease`) are its members
    /// [default: `[controller] lease_pool`, else pool].
    #[arg(long, value_name = "GROUP")]
    lease_pool: Option<String>,
    /// Seconds before a lease ends that its nodes' agents are warned [default:
    /// `[controller] lease_warn_s`, else 300].
    #[arg(long)]
    lease_warn_s: Option<u64>,
    /// The speed every RDMA data link should negotiate, Gb/s: a link below it is flagged in
    /// the console and by `weft_link_below_expected` [default: `[controller]
    /// expected_link_gbps`, else none: links are compared with their peers only].
    #[arg(long, value_name = "GBPS")]
    expected_link_gbps: Option<f64>,
}

/// Operator commands on a controller's store.
#[derive(Subcommand)]
pub enum ControllerCommand {
    /// The store's audit log: prune the lines older than a time.
    #[command(subcommand)]
    Audit(ControllerAuditCommand),
    /// Copy the store into FILE while the controller runs, as one consistent moment: SQLite's
    /// online backup API (checked with quick_check), or on PostgreSQL `pg_dump` of one
    /// exported snapshot (custom format). The file is new and 0600.
    #[command(
        after_help = "Example:\n  weft --config weft.toml controller backup /backup/controller-$(date +%F).db\n  weft controller backup --db /var/lib/weft/controller.db /backup/ctl.db --json\n  weft controller backup --store postgres://weft@db/weft /backup/ctl.pgdump\n\nPut it back with `weft controller restore --from FILE` on a stopped controller (on\nPostgreSQL: into a fresh, empty database)."
    )]
    Backup {
        /// The backup file to create (never overwritten).
        file: PathBuf,
        /// The SQLite database [default: `[controller] db` of weft.toml, else
        /// /var/lib/weft/controller.db].
        #[arg(long)]
        db: Option<PathBuf>,
        /// A PostgreSQL store instead of the SQLite --db: `postgres://USER@HOST/DATABASE`
        /// [default: `[controller] store_url` of weft.toml, unless --db is given].
        #[arg(
            long,
            env = "WEFT_STORE_URL",
            hide_env_values = true,
            conflicts_with = "db"
        )]
        store: Option<String>,
    },
    /// Make a restored (or stale) store the one that delivers: read what every subnet
    /// manager holds, and raise the store's fencing number above it, so that its
    /// deliveries replace theirs and a controller still on the older number is refused.
    #[command(
        after_help = "Example:\n  systemctl stop weft-controller\n  weft --config weft.toml controller restore --from /backup/ctl.db --db /var/lib/weft/controller.db\n  systemctl start weft-controller\n  weft controller restore --db /var/lib/weft/controller.db   # a store copied back by hand\n  createdb weft2 && weft controller restore --from /backup/ctl.pgdump --store postgres://weft@db/weft2\n\nUntil then, a controller on a store older than what the SMs hold delivers nothing: each\nattempt is refused at the SMs' apply lock and audited (`fence`, `refused`). The command\nprints the diff its state makes to the master's file; it refuses while a controller runs\non the store."
    )]
    Restore {
        /// The SQLite database [default: `[controller] db` of weft.toml, else
        /// /var/lib/weft/controller.db].
        #[arg(long)]
        db: Option<PathBuf>,
        /// A PostgreSQL store instead of the SQLite --db: `postgres://USER@HOST/DATABASE`
        /// [default: `[controller] store_url` of weft.toml, unless --db is given].
        #[arg(
            long,
            env = "WEFT_STORE_URL",
            hide_env_values = true,
            conflicts_with = "db"
        )]
        store: Option<String>,
        /// A backup (`weft controller backup`) to put in place of --db first (checked
        /// before anything is replaced); on PostgreSQL, loaded with pg_restore into the
        /// --store database, which must be fresh and empty.
        #[arg(long)]
        from: Option<PathBuf>,
        /// No subnet managers to read (a store used with `weft controller --no-fabric`).
        #[arg(long)]
        no_fabric: bool,
    },
}

/// `weft controller audit ...`: the audit log in the store itself.
#[derive(Subcommand)]
pub enum ControllerAuditCommand {
    /// Delete the audit lines written before a time, in one transaction that first writes
    /// the `audit.prune` line recording it (who, the cut-off, the range and the count). On a
    /// stopped or a running controller's store (whoever can open the store is its admin);
    /// every other delete or update of the audit log stays refused by the database.
    #[command(
        after_help = "Examples:\n  weft --config weft.toml controller audit prune --older-than 90d\n  weft controller audit prune --db /var/lib/weft/controller.db --before 2026-01-01T00:00:00Z --json\n  weft controller audit prune --store postgres://weft@db/weft --before 1767225600\n\nThe line it writes stays: `weft audit` shows it as `audit.prune` with the range and count."
    )]
    Prune {
        /// Delete the lines written before this time: RFC 3339 (`2026-01-01T00:00:00Z`) or
        /// Unix seconds; not after now.
        #[arg(long, value_parser = crate::lease::parse_time, required_unless_present = "older_than", conflicts_with = "older_than")]
        before: Option<u64>,
        /// Delete the lines older than this age (`90d`, `12h`, humantime's grammar).
        #[arg(long, value_parser = crate::lease::parse_duration)]
        older_than: Option<Duration>,
        /// The SQLite database [default: `[controller] db` of weft.toml, else
        /// /var/lib/weft/controller.db].
        #[arg(long)]
        db: Option<PathBuf>,
        /// A PostgreSQL store instead of the SQLite --db: `postgres://USER@HOST/DATABASE`
        /// [default: `[controller] store_url` of weft.toml, unless --db is given].
        #[arg(
            long,
            env = "WEFT_STORE_URL",
            hide_env_values = true,
            conflicts_with = "db"
        )]
        store: Option<String>,
    },
}

#[derive(Args)]
pub struct AgentArgs {
    #[command(flatten)]
    trust: Trust,
    /// One-time enrollment token (`weft nodes enroll`); needed until the agent enrolled.
    #[arg(long, env = "WEFT_ENROLL_TOKEN", hide_env_values = true)]
    enroll_token: Option<String>,
    /// Where the agent keeps its credentials [default: `[agent] state_file` of weft.toml,
    /// else /var/lib/weft-agent/agent.json].
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// Root of the sysfs tree to discover [default: `[agent] sysfs_root`, else /].
    #[arg(long)]
    sysfs_root: Option<PathBuf>,
    /// Heartbeat period, seconds [default: `[agent] heartbeat_s`, else 10].
    #[arg(long)]
    heartbeat_s: Option<f64>,
    /// Rediscovery period, seconds [default: `[agent] rescan_s`, else 30].
    #[arg(long)]
    rescan_s: Option<f64>,
    /// Serve Prometheus metrics on this address (`/metrics`), e.g. 127.0.0.1:7102.
    #[arg(long, env = "WEFT_AGENT_METRICS")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// While a lease on this server ends, keep this file written (`lease <id> ends <unix
    /// seconds>`) [default: `[agent] lease_notice_file`, else /run/weft/lease-ending].
    #[arg(long)]
    lease_notice_file: Option<PathBuf>,
    /// Run this command (`sh -c`) once when a lease on this server starts ending, with
    /// WEFT_LEASE_ID, WEFT_LEASE_END and WEFT_LEASE_FILE set [default: `[agent]
    /// lease_hook`].
    #[arg(long)]
    lease_hook: Option<String>,
}

/// `weft controller`'s settings once flags, environment and `[controller]` of weft.toml
/// are merged (in that order of precedence), with the service defaults filled in.
struct ControllerRun {
    listen: String,
    metrics_listen: String,
    db: PathBuf,
    /// The PostgreSQL store, when one is set (else the SQLite `db`).
    store_url: Option<String>,
    init: bool,
    advertise_url: Option<String>,
    admin_token_file: Option<PathBuf>,
    stale_after_s: u64,
    no_fabric: bool,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_self_signed: bool,
    tls_name: Vec<String>,
    adopt: bool,
    recheck_s: u64,
    port_check_s: u64,
    repair_drift: bool,
    insecure_http: bool,
    lease_pool: String,
    lease_warn_s: u64,
    expected_link_gbps: Option<f64>,
}

impl ControllerArgs {
    fn with_file(self, f: &ControllerClientConfig) -> Result<ControllerRun> {
        // The pair comes from one place: the flags (clap makes them come together), else
        // the file.
        let (tls_cert, tls_key) = if self.tls_cert.is_some() || self.tls_key.is_some() {
            (self.tls_cert, self.tls_key)
        } else {
            (f.tls_cert.clone(), f.tls_key.clone())
        };
        let expected_link_gbps = self.expected_link_gbps.or(f.expected_link_gbps);
        if let Some(g) = expected_link_gbps
            && weft_controller::links::gbps_to_mbps(g).is_none()
        {
            return Err(anyhow!(
                "--expected-link-gbps / [controller] expected_link_gbps {g}: not a speed in (0, {}] Gb/s",
                weft_controller::links::MAX_GBPS
            ));
        }
        if tls_cert.is_some() != tls_key.is_some() {
            return Err(anyhow!(
                "config: [controller] tls_cert and tls_key go together: set both or neither"
            ));
        }
        Ok(ControllerRun {
            listen: self
                .listen
                .or_else(|| f.listen.clone())
                .unwrap_or_else(|| "127.0.0.1:7100".into()),
            metrics_listen: self
                .metrics_listen
                .or_else(|| f.metrics_listen.clone())
                .unwrap_or_else(|| "127.0.0.1:7101".into()),
            db: self
                .db
                .clone()
                .or_else(|| f.db.clone())
                .unwrap_or_else(|| "/var/lib/weft/controller.db".into()),
            store_url: match self.store {
                Some(url) => Some(url),
                None if self.db.is_some() => None,
                None => f.store_url.clone(),
            },
            init: self.init,
            advertise_url: self.advertise_url.or_else(|| f.advertise_url.clone()),
            admin_token_file: self.admin_token_file.or_else(|| f.admin_token_file.clone()),
            stale_after_s: self.stale_after_s.or(f.stale_after_s).unwrap_or(30),
            no_fabric: self.no_fabric,
            tls_cert,
            tls_key,
            tls_self_signed: self.tls_self_signed || f.tls_self_signed,
            tls_name: if self.tls_name.is_empty() {
                f.tls_names.clone()
            } else {
                self.tls_name
            },
            adopt: self.adopt || f.adopt,
            recheck_s: self.recheck_s.or(f.recheck_s).unwrap_or(30),
            port_check_s: self.port_check_s.or(f.port_check_s).unwrap_or(300),
            repair_drift: self.repair_drift || f.repair_drift,
            insecure_http: self.insecure_http || f.insecure_http,
            lease_pool: self
                .lease_pool
                .or_else(|| f.lease_pool.clone())
                .unwrap_or_else(|| "pool".into()),
            lease_warn_s: self.lease_warn_s.or(f.lease_warn_s).unwrap_or(300),
            expected_link_gbps,
        })
    }
}

/// `weft agent`'s settings once flags, environment and `[agent]` of weft.toml are merged.
struct AgentRun {
    trust: Trust,
    enroll_token: Option<String>,
    state_file: PathBuf,
    sysfs_root: PathBuf,
    heartbeat_s: f64,
    rescan_s: f64,
    metrics_listen: Option<std::net::SocketAddr>,
    lease_notice_file: PathBuf,
    lease_hook: Option<String>,
}

impl AgentArgs {
    fn with_file(self, f: &crate::config::AgentFileConfig) -> AgentRun {
        AgentRun {
            trust: self.trust,
            enroll_token: self.enroll_token,
            state_file: self
                .state_file
                .or_else(|| f.state_file.clone())
                .unwrap_or_else(|| "/var/lib/weft-agent/agent.json".into()),
            sysfs_root: self
                .sysfs_root
                .or_else(|| f.sysfs_root.clone())
                .unwrap_or_else(|| "/".into()),
            heartbeat_s: self.heartbeat_s.or(f.heartbeat_s).unwrap_or(10.0),
            rescan_s: self.rescan_s.or(f.rescan_s).unwrap_or(30.0),
            metrics_listen: self.metrics_listen.or(f.metrics_listen),
            lease_notice_file: self
                .lease_notice_file
                .or_else(|| f.lease_notice_file.clone())
                .unwrap_or_else(|| "/run/weft/lease-ending".into()),
            lease_hook: self.lease_hook.or_else(|| f.lease_hook.clone()),
        }
    }
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct NodesArgs {
    #[command(flatten)]
    remote: Remote,
    #[command(subcommand)]
    command: Option<NodesCommand>,
}

#[derive(Subcommand)]
pub enum NodesCommand {
    /// List servers (the default).
    #[command(after_help = "Example:\n  weft nodes list --json")]
    List {
        #[command(flatten)]
        remote: Remote,
    },
    /// Create a one-time enrollment token for an agent.
    #[command(after_help = "Example:\n  weft nodes enroll --server node7")]
    Enroll {
        /// Bind the token to this host name.
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// GUIDs a server reported that another server owns.
    #[command(after_help = "Example:\n  weft nodes claims")]
    Claims {
        #[command(flatten)]
        remote: Remote,
    },
    /// Forget a server that is in no group: its ports, claims and agent secret.
    #[command(after_help = "Example:\n  weft nodes remove node7")]
    Remove {
        server: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Give a claimed GUID to the server that reported it.
    #[command(after_help = "Example:\n  weft nodes approve 3")]
    Approve {
        /// The claim's id.
        id: i64,
        #[command(flatten)]
        remote: Remote,
        #[command(flatten)]
        wait: Wait,
    },
}

#[derive(Subcommand)]
pub enum GroupCommand {
    /// Create a group (a partition with its own P_Key) owned by a tenant.
    #[command(after_help = "Example:\n  weft group create training --tenant alice")]
    Create {
        name: String,
        #[arg(long)]
        tenant: String,
        #[command(flatten)]
        remote: Remote,
        #[command(flatten)]
        wait: Wait,
    },
    /// Add servers that are in no group to a group.
    #[command(after_help = "Example:\n  weft group add training node1 node2")]
    Add {
        group: String,
        #[arg(required = true)]
        servers: Vec<String>,
        #[command(flatten)]
        remote: Remote,
        #[command(flatten)]
        wait: Wait,
    },
    /// Move a server from its group to another, in one step.
    #[command(after_help = "Example:\n  weft group move node7 --to inference")]
    Move {
        server: String,
        #[arg(long)]
        to: String,
        #[command(flatten)]
        remote: Remote,
        #[command(flatten)]
        wait: Wait,
    },
    /// Remove a server from a group, or (without a server) the whole group.
    #[command(
        after_help = "Examples:\n  weft group remove training node2\n  weft group remove training"
    )]
    Remove {
        group: String,
        server: Option<String>,
        #[command(flatten)]
        remote: Remote,
        #[command(flatten)]
        wait: Wait,
    },
    /// List the groups this token may see.
    #[command(after_help = "Example:\n  WEFT_TOKEN=$ALICE weft group list --json")]
    List {
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Subcommand)]
pub enum TenantCommand {
    /// Create a tenant; prints its first API token (shown once).
    #[command(after_help = "Example:\n  weft tenant create alice")]
    Create {
        name: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List tenants and their groups.
    #[command(after_help = "Example:\n  weft tenant list")]
    List {
        #[command(flatten)]
        remote: Remote,
    },
    /// Create another API token for a tenant (shown once); it expires (90 days unless
    /// `--ttl-s` says otherwise).
    #[command(after_help = "Example:\n  weft tenant token alice --ttl-s 604800")]
    Token {
        name: String,
        /// Seconds it stays valid (60 to 315360000; default 90 days).
        #[arg(long)]
        ttl_s: Option<u64>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Delete a tenant that owns no group; its tokens stop working.
    #[command(after_help = "Example:\n  weft tenant delete alice")]
    Delete {
        name: String,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Args)]
pub struct AuditArgs {
    /// How many of the newest entries.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Print each entry's partitions.conf diff under the table.
    #[arg(long)]
    diff: bool,
    #[command(flatten)]
    remote: Remote,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub(crate) fn client(r: &Remote, file: &ControllerClientConfig) -> Result<Client> {
    client_for(r, file).map(|(c, _)| c)
}

/// The API client of `r` (flags over `[controller]` of weft.toml), and the URL it talks to.
pub fn client_for(r: &Remote, file: &ControllerClientConfig) -> Result<(Client, String)> {
    let (urls, tls) = r.trust.resolve(file)?;
    let c = Client::over(
        &urls,
        r.token.clone().map(Secret::new),
        Duration::from_secs(r.timeout_s.max(1)),
        &tls,
    )?;
    let url = c.current_url().to_string();
    Ok((c, url))
}

/// A failed API call, reported in the one error shape (`output::error`), and its exit code:
/// a change the controller accepted but did not apply within the wait is a failed check (1);
/// everything else is usage or environment (2): a refusal of what was asked (HTTP 4xx:
/// bad input, a bad or missing token, a name that does not exist, a conflict), no answer,
/// an untrusted certificate, a broken controller.
pub(crate) fn failed(e: ClientError, json: bool) -> Result<u8> {
    let code = match &e {
        ClientError::NotApplied { .. } => EXIT_CHECK_FAILED,
        _ => EXIT_ENVIRONMENT,
    };
    let tried = |t: &[weft_controller::client::Tried]| -> Vec<serde_json::Value> {
        t.iter()
            .map(|t| serde_json::json!({ "url": t.url, "said": t.said }))
            .collect()
    };
    let extra = match (&e, e.status()) {
        (ClientError::OutcomeUnknown { url, tried: t, .. }, _) => {
            serde_json::json!({ "outcome": "unknown", "sent_to": url, "tried": tried(t) })
        }
        (ClientError::NoController { tried: t, .. }, _) => {
            serde_json::json!({ "tried": tried(t) })
        }
        (_, Some(s)) => serde_json::json!({ "http_status": s }),
        (_, None) => serde_json::Value::Null,
    };
    output::error(json, code, &e.to_string(), &[], extra);
    Ok(code)
}

/// Runs one of the controller's commands.
pub fn run(cmd: ClusterCommand, cfg: &Config, json: bool) -> Result<u8> {
    match cmd {
        ClusterCommand::Controller(a) => match *a {
            ControllerArgs {
                command:
                    Some(ControllerCommand::Restore {
                        db,
                        store,
                        from,
                        no_fabric,
                    }),
                ..
            } => store_admin::restore(db, store, from, no_fabric, cfg, json),
            ControllerArgs {
                command: Some(ControllerCommand::Backup { file, db, store }),
                ..
            } => store_admin::backup(&file, db, store, cfg, json),
            ControllerArgs {
                command:
                    Some(ControllerCommand::Audit(ControllerAuditCommand::Prune {
                        before,
                        older_than,
                        db,
                        store,
                    })),
                ..
            } => {
                let now = weft_controller::unix_now();
                let before = match (before, older_than) {
                    (Some(t), _) => t,
                    (None, Some(age)) => now.saturating_sub(age.as_secs()),
                    (None, None) => return Err(anyhow!("give --before TIME or --older-than AGE")),
                };
                store_admin::audit_prune(before, now, db, store, cfg, json)
            }
            a => controller(a, cfg),
        },
        ClusterCommand::Agent(a) => agent(a.with_file(&cfg.agent), &cfg.controller, json),
        other => runtime()?.block_on(client_command(other, &cfg.controller, json)),
    }
}

/// The SM hosts of `[[fabric.sm]]`, or a fabric that records (`no_fabric`).
fn fabric_of(no_fabric: bool, cfg: &Config) -> Result<Arc<dyn Fabric>> {
    Ok(if no_fabric {
        Arc::new(RecordingFabric::default())
    } else {
        let f = &cfg.fabric;
        if f.sm.is_empty() {
            return Err(anyhow!(
                "no subnet managers configured: add [[fabric.sm]] entries to the config file, or pass --no-fabric"
            ));
        }
        // The SM hosts (local or over SSH) come from the one place that builds them.
        Arc::new(OpenSmFabric {
            applier: f.applier()?,
        })
    })
}

fn controller(a: ControllerArgs, cfg: &Config) -> Result<u8> {
    let a = a.with_file(&cfg.controller)?;
    let fabric = fabric_of(a.no_fabric, cfg)?;
    let admin_token = match (&a.admin_token_file, std::env::var("WEFT_ADMIN_TOKEN")) {
        (Some(p), _) => Some(Secret::new(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?
                .trim(),
        )),
        (None, Ok(t)) if !t.trim().is_empty() => Some(Secret::new(t.trim())),
        _ => None,
    };
    let tls = server_tls(&a)?;
    if let Some(u) = &a.advertise_url
        && !(u.starts_with("http://") || u.starts_with("https://"))
    {
        return Err(anyhow!(
            "--advertise-url `{u}`: give the URL clients reach this controller at, http:// or https://"
        ));
    }
    let store: Arc<dyn weft_controller::store::Store> = match &a.store_url {
        Some(url) => Arc::new(PgStore::open(url, a.init)?),
        None => Arc::new(
            if a.init {
                SqliteStore::open(&a.db)
            } else {
                SqliteStore::open_existing(&a.db)
            }
            .with_context(|| format!("cannot open the store {}", a.db.display()))?,
        ),
    };
    runtime()?.block_on(async move {
        let api = tokio::net::TcpListener::bind(&a.listen)
            .await
            .with_context(|| format!("cannot listen on {}", a.listen))?;
        let metrics = tokio::net::TcpListener::bind(&a.metrics_listen)
            .await
            .with_context(|| format!("cannot listen on {}", a.metrics_listen))?;
        let (api_addr, metrics_addr) = (
            weft_controller::local(&api),
            weft_controller::local(&metrics),
        );
        let scheme = if tls.is_some() { "https" } else { "http" };
        let advertise_url = a.advertise_url.clone().or_else(|| {
            (!api_addr.ip().is_unspecified()).then(|| format!("{scheme}://{api_addr}"))
        });
        let config = ControllerConfig {
            admin_token,
            advertise_url,
            stale_after_s: a.stale_after_s,
            adopt: a.adopt,
            recheck: Duration::from_secs(a.recheck_s.max(1)),
            port_check: Duration::from_secs(a.port_check_s.max(1)),
            repair_drift: a.repair_drift,
            lease: weft_controller::lease::LeaseConfig {
                pool_group: a.lease_pool.clone(),
                warn_s: a.lease_warn_s,
                ..Default::default()
            },
            expected_link_gbps: a.expected_link_gbps,
            ..ControllerConfig::default()
        };
        let mut ctl = Controller::start(store, fabric, config)?;
        // The web console, on the same listener with the same TLS and tokens.
        ctl.mount(weft_console::router(
            ctl.state(),
            weft_console::ConsoleConfig::default(),
        ));
        if tls.is_none() {
            weft_controller::tls::check_plain_listen(api_addr, a.insecure_http)?;
            weft_controller::tls::check_plain_listen(metrics_addr, a.insecure_http)?;
        }
        println!(
            "weft controller: api {scheme}://{api_addr} metrics {scheme}://{metrics_addr}/metrics console {scheme}://{api_addr}/console"
        );
        if let Some(t) = &tls {
            println!("weft controller: TLS certificate {}", t.fingerprint());
        }

        weft_controller::serve_tls(
            ctl,
            api,
            Some(metrics),
            tls,
            weft_controller::shutdown_signal(),
        )
        .await?;
        Ok(EXIT_OK)
    })
}

/// The controller's certificate: the given files, or a self-signed pair (made on first
/// start, beside the store unless --tls-cert/--tls-key name the files).
fn server_tls(a: &ControllerRun) -> Result<Option<ServerTls>> {
    if a.tls_self_signed {
        let dir =
            a.db.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), PathBuf::from);
        let cert = a
            .tls_cert
            .clone()
            .unwrap_or_else(|| dir.join("weft-controller.crt"));
        let key = a
            .tls_key
            .clone()
            .unwrap_or_else(|| dir.join("weft-controller.key"));
        let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
        if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            names.push(h.trim().to_string());
        }
        if let Ok(addr) = a.listen.parse::<std::net::SocketAddr>()
            && !addr.ip().is_unspecified()
        {
            names.push(addr.ip().to_string());
        }
        names.extend(a.tls_name.iter().cloned());
        names.sort();
        names.dedup();
        let (tls, made) = ServerTls::self_signed(&cert, &key, &names)?;
        if made {
            eprintln!(
                "weft controller: made a self-signed certificate {} (key {}) for {}",
                cert.display(),
                key.display(),
                names.join(", ")
            );
        }
        eprintln!(
            "weft controller: clients trust it with --pin {} (or --ca-file {})",
            tls.fingerprint(),
            cert.display()
        );
        return Ok(Some(tls));
    }
    match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Ok(Some(ServerTls::from_files(c, k)?)),
        _ => Ok(None),
    }
}

fn agent(a: AgentRun, file: &ControllerClientConfig, json: bool) -> Result<u8> {
    let (urls, tls) = a.trust.resolve(file)?;
    let mut cfg = AgentConfig::new(&urls[0], a.state_file, a.sysfs_root);
    cfg.controllers = urls;
    cfg.tls = tls;
    cfg.enroll_token = a.enroll_token.map(Secret::new);
    cfg.heartbeat = Duration::from_secs_f64(a.heartbeat_s.max(0.05));
    cfg.rescan = Duration::from_secs_f64(a.rescan_s.max(0.05));
    cfg.lease_notice = Some(weft_controller::agent::LeaseNoticeConfig {
        file: a.lease_notice_file.clone(),
        hook: a.lease_hook.clone(),
        hook_timeout: Duration::from_secs(60),
    });
    let metrics_listen = a.metrics_listen;
    runtime()?.block_on(async move {
        if let Some(addr) = metrics_listen {
            let metrics = std::sync::Arc::new(weft_controller::metrics::AgentMetrics::default());
            cfg.metrics = Some(metrics.clone());
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for metrics on {addr}"))?;
            tokio::spawn(async move {
                if let Err(e) = metrics.serve(listener).await {
                    tracing::warn!(error = %e, "the metrics listener stopped");
                }
            });
        }
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            weft_controller::shutdown_signal().await;
            let _ = tx.send(true);
        });
        match weft_controller::agent::run(cfg, rx).await {
            Ok(()) => Ok(EXIT_OK),
            Err(e @ (AgentError::Refused(_) | AgentError::NoToken | AgentError::Untrusted(_))) => {
                output::error(
                    json,
                    EXIT_ENVIRONMENT,
                    &format!("agent: {e}"),
                    &[],
                    serde_json::Value::Null,
                );
                Ok(EXIT_ENVIRONMENT)
            }
            Err(e) => Err(e.into()),
        }
    })
}

fn since(t: Option<u64>) -> String {
    match t {
        None => "-".into(),
        Some(t) => format!("{}s ago", weft_controller::unix_now().saturating_sub(t)),
    }
}

/// Unix seconds as `2026-01-31 12:00:00Z` (RFC 3339 with a space, as tables show it).
fn utc(t: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t);
    humantime::format_rfc3339_seconds(at)
        .to_string()
        .replacen('T', " ", 1)
}

/// Prints an operation. `delivers` is whether the controller delivers to SMs: under
/// `--no-fabric` an applied operation was recorded, never verified.
fn print_op(op: &OperationView, delivers: Option<bool>, json: bool) -> Result<()> {
    if json {
        return output::json(op);
    }
    let state = match (op.state, delivers) {
        (OpState::Applied, Some(true)) if op.warning.is_some() => {
            "applied; verified on the ports that are on the fabric, not on the others"
        }
        (OpState::Applied, Some(true)) => "applied and verified",
        (OpState::Applied, Some(false)) => {
            "recorded, no fabric: the controller runs with --no-fabric; nothing was delivered or verified"
        }
        (OpState::Applied, None) => "applied",
        (OpState::Pending, _) => "pending",
    };
    println!("operation {}: {} ({state})", op.id, op.action);
    if let Some(w) = &op.warning {
        println!("  {}", output::clean(w));
    }
    if !op.taken.is_empty() {
        println!(
            "  takes away from what the subnet managers held (also from servers it did not name):"
        );
        for line in &op.taken {
            println!("    {}", output::clean(line));
        }
    }
    for line in op.diff.lines() {
        println!("  {line}");
    }
    Ok(())
}

async fn finish(c: &Client, accepted: Accepted, wait: &Wait, json: bool) -> Result<u8> {
    let Some(op) = accepted.operation else {
        if json {
            output::json(&accepted)?;
        } else {
            println!("nothing to change on the fabric");
        }
        return Ok(EXIT_OK);
    };
    if wait.no_wait {
        print_op(&op, None, json)?;
        return Ok(EXIT_OK);
    }
    match c
        .wait_applied(op.id, Duration::from_secs(wait.wait_s))
        .await
    {
        Ok(done) => {
            // "verified" only if the controller says it delivers to SMs.
            let delivers = c.status().await.ok().map(|s| s.delivers);
            print_op(&done, delivers, json)?;
            Ok(EXIT_OK)
        }
        Err(ClientError::NotApplied {
            id,
            waited,
            last_error,
        }) => {
            let message = format!(
                "operation {id} is not applied after {:.0} s ({last_error}); it stays pending and the controller keeps delivering it: see `weft audit` for when it is applied",
                waited.as_secs_f64()
            );
            output::error(
                json,
                EXIT_CHECK_FAILED,
                &message,
                &[],
                serde_json::json!({ "operation": id, "state": "pending" }),
            );
            Ok(EXIT_CHECK_FAILED)
        }
        Err(e) => failed(e, json),
    }
}

/// A fresh token on stdout (alone, for scripts), its id and expiry on stderr.
fn print_token(t: &weft_controller::model::TokenCreated, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({ "token": t.token.expose(), "id": t.id, "expires": t.expires })
        );
    } else {
        println!("{}", t.token.expose());
        eprintln!(
            "token {} (shown once), {}",
            t.id,
            t.expires
                .map_or_else(|| "no expiry".into(), |e| format!("valid until {}", utc(e)))
        );
    }
}

/// The answer to a command that returns nothing but success.
pub(crate) fn done(json: bool, message: &str) {
    if json {
        println!("{}", serde_json::json!({ "ok": true, "message": message }));
    } else {
        println!("{message}");
    }
}

async fn client_command(
    cmd: ClusterCommand,
    file: &ControllerClientConfig,
    json: bool,
) -> Result<u8> {
    macro_rules! try_api {
        ($e:expr) => {
            match $e.await {
                Ok(v) => v,
                Err(e) => return failed(e, json),
            }
        };
    }
    match cmd {
        ClusterCommand::Controller(_) | ClusterCommand::Agent(_) => unreachable!("handled by run"),
        ClusterCommand::Lease(c) => crate::lease::run(c, file, json).await,
        ClusterCommand::Nodes(NodesArgs { remote, command }) => {
            match command.unwrap_or(NodesCommand::List { remote }) {
                NodesCommand::List { remote } => {
                    let servers = try_api!(client(&remote, file)?.servers());
                    if json {
                        output::json(&servers)?;
                    } else {
                        println!(
                            "{}",
                            output::table(
                                [
                                    "NAME",
                                    "AGENT",
                                    "LAST SEEN",
                                    "GROUP",
                                    "IB PORTS",
                                    "ROCE",
                                    "NICS",
                                    "GPUS",
                                    "PENDING CLAIMS"
                                ],
                                servers.iter().map(|s| [
                                    s.name.clone(),
                                    s.liveness.as_str().to_string(),
                                    since(s.last_seen),
                                    s.group.clone().unwrap_or_else(|| "-".into()),
                                    nodes_view::node_ports(s),
                                    nodes_view::node_roce(s),
                                    nodes_view::node_nics(s),
                                    nodes_view::node_gpus(s),
                                    if s.pending_claims.is_empty() {
                                        "-".into()
                                    } else {
                                        s.pending_claims
                                            .iter()
                                            .map(|g| g.to_string())
                                            .collect::<Vec<_>>()
                                            .join(" ")
                                    },
                                ])
                            )
                        );
                    }
                    Ok(EXIT_OK)
                }
                NodesCommand::Enroll { server, remote } => {
                    let t = try_api!(client(&remote, file)?.create_enrollment(server.as_deref()));
                    if json {
                        println!(
                            "{}",
                            serde_json::json!({ "token": t.token.expose(), "expires": t.expires })
                        );
                    } else {
                        println!("{}", t.token.expose());
                        eprintln!("one-time enrollment token, valid until {}", utc(t.expires));
                    }
                    Ok(EXIT_OK)
                }
                NodesCommand::Remove { server, remote } => {
                    try_api!(client(&remote, file)?.remove_server(&server));
                    done(
                        json,
                        &format!("server `{server}` removed; its agent secret no longer works"),
                    );
                    Ok(EXIT_OK)
                }
                NodesCommand::Claims { remote } => {
                    let claims = try_api!(client(&remote, file)?.claims());
                    if json {
                        output::json(&claims)?;
                    } else {
                        println!(
                            "{}",
                            output::table(
                                ["ID", "GUID", "CLAIMED BY", "OWNED BY", "STATE", "SINCE"],
                                claims.iter().map(|c| [
                                    c.id.to_string(),
                                    c.guid.to_string(),
                                    c.claimant.clone(),
                                    c.owner.clone(),
                                    c.state.clone(),
                                    utc(c.created)
                                ])
                            )
                        );
                    }
                    Ok(EXIT_OK)
                }
                NodesCommand::Approve { id, remote, wait } => {
                    let c = client(&remote, file)?;
                    let accepted = try_api!(c.approve_claim(id));
                    finish(&c, accepted, &wait, json).await
                }
            }
        }
        ClusterCommand::Group(g) => match g {
            GroupCommand::Create {
                name,
                tenant,
                remote,
                wait,
            } => {
                let c = client(&remote, file)?;
                let accepted = try_api!(c.create_group(&name, &tenant));
                finish(&c, accepted, &wait, json).await
            }
            GroupCommand::Add {
                group,
                servers,
                remote,
                wait,
            } => {
                let c = client(&remote, file)?;
                let mut code = EXIT_OK;
                for s in servers {
                    let accepted = try_api!(c.add_member(&group, &s));
                    code = code.max(finish(&c, accepted, &wait, json).await?);
                }
                Ok(code)
            }
            GroupCommand::Move {
                server,
                to,
                remote,
                wait,
            } => {
                let c = client(&remote, file)?;
                let accepted = try_api!(c.move_server(&server, &to));
                finish(&c, accepted, &wait, json).await
            }
            GroupCommand::Remove {
                group,
                server,
                remote,
                wait,
            } => {
                let c = client(&remote, file)?;
                let accepted = match server {
                    Some(s) => try_api!(c.remove_member(&group, &s)),
                    None => try_api!(c.delete_group(&group)),
                };
                finish(&c, accepted, &wait, json).await
            }
            GroupCommand::List { remote } => {
                let groups = try_api!(client(&remote, file)?.groups());
                if json {
                    output::json(&groups)?;
                } else {
                    println!(
                        "{}",
                        output::table(
                            ["GROUP", "TENANT", "PKEY", "SERVERS", "PORTS"],
                            groups.iter().map(|g| [
                                g.name.clone(),
                                g.tenant.clone(),
                                g.pkey.clone(),
                                if g.members.is_empty() {
                                    "-".into()
                                } else {
                                    g.members.join(" ")
                                },
                                g.ports.len().to_string(),
                            ])
                        )
                    );
                }
                Ok(EXIT_OK)
            }
        },
        ClusterCommand::Tenant(t) => match t {
            TenantCommand::Create { name, remote } => {
                let created = try_api!(client(&remote, file)?.create_tenant(&name));
                if json {
                    println!(
                        "{}",
                        serde_json::json!({ "tenant": created.tenant, "token": created.token.expose() })
                    );
                } else {
                    println!("{}", created.token.expose());
                    eprintln!(
                        "tenant `{name}` created; the line above is its API token, shown once"
                    );
                }
                Ok(EXIT_OK)
            }
            TenantCommand::List { remote } => {
                let tenants = try_api!(client(&remote, file)?.tenants());
                if json {
                    output::json(&tenants)?;
                } else {
                    println!(
                        "{}",
                        output::table(
                            ["TENANT", "GROUPS"],
                            tenants.iter().map(|t| [
                                t.name.clone(),
                                if t.groups.is_empty() {
                                    "-".into()
                                } else {
                                    t.groups.join(" ")
                                }
                            ])
                        )
                    );
                }
                Ok(EXIT_OK)
            }
            TenantCommand::Token {
                name,
                ttl_s,
                remote,
            } => {
                let t = try_api!(client(&remote, file)?.create_token(Some(&name), ttl_s));
                print_token(&t, json);
                Ok(EXIT_OK)
            }
            TenantCommand::Delete { name, remote } => {
                try_api!(client(&remote, file)?.delete_tenant(&name));
                done(
                    json,
                    &format!("tenant `{name}` deleted; its tokens no longer work"),
                );
                Ok(EXIT_OK)
            }
        },
        ClusterCommand::Token(t) => match t {
            TokenCommand::List { remote } => {
                let tokens = try_api!(client(&remote, file)?.tokens());
                if json {
                    return output::json(&tokens).map(|_| EXIT_OK);
                }
                println!(
                    "{}",
                    output::table(
                        [
                            "ID", "ROLE", "TENANT", "SOURCE", "CREATED", "EXPIRES", "REVOKED"
                        ],
                        tokens.iter().map(|t| [
                            t.id.clone(),
                            format!("{:?}", t.role).to_lowercase(),
                            t.tenant.clone().unwrap_or_else(|| "-".into()),
                            t.source.clone(),
                            utc(t.created),
                            t.expires.map_or_else(|| "never".into(), utc),
                            t.revoked.map_or_else(|| "-".into(), utc),
                        ])
                    )
                );
                Ok(EXIT_OK)
            }
            TokenCommand::Admin { ttl_s, remote } => {
                let t = try_api!(client(&remote, file)?.create_token(None, ttl_s));
                print_token(&t, json);
                Ok(EXIT_OK)
            }
            TokenCommand::Revoke { id, remote } => {
                try_api!(client(&remote, file)?.revoke_token(&id));
                done(json, &format!("token {id} revoked"));
                Ok(EXIT_OK)
            }
        },
        ClusterCommand::Audit(a) => {
            let entries = try_api!(client(&a.remote, file)?.audit(a.limit));
            if json {
                return output::json(&entries).map(|_| EXIT_OK);
            }
            println!(
                "{}",
                output::table(
                    [
                        "ID", "TIME", "ACTOR", "ACTION", "SUBJECT", "OUTCOME", "DETAIL"
                    ],
                    entries.iter().map(|e| [
                        e.id.to_string(),
                        utc(e.at),
                        e.actor.clone(),
                        e.action.clone(),
                        e.subject.clone(),
                        e.outcome.clone(),
                        e.detail.clone()
                    ])
                )
            );
            if a.diff {
                for e in entries.iter().filter(|e| !e.diff.is_empty()) {
                    println!(
                        "\n#{} {} {}:",
                        e.id,
                        output::clean(&e.action),
                        output::clean(&e.subject)
                    );
                    for line in e.diff.lines() {
                        println!("  {}", output::clean(line));
                    }
                }
            }
            Ok(EXIT_OK)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00Z");
        assert_eq!(super::utc(1_767_225_599), "2025-12-31 23:59:59Z");
    }
}
