//! The agent's service loop: discover this host, enroll once with a one-time token, then
//! report at start, on change and with a heartbeat, over the management network.
//!
//! Every request is bounded by the client's timeout; failures are retried with
//! exponential backoff (capped), except a refusal of the agent's credentials, which ends
//! the loop with an error: retrying a wrong token only fills the controller's log. The
//! agent makes no decisions; what its ports are for is the controller's business.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weft_agent::HostReport;

use std::sync::Arc;

use crate::auth::Secret;
use crate::client::{Client, ClientError};
use crate::metrics::AgentMetrics;
use crate::tls::ClientTls;

/// The agent's knobs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The controller's base URL.
    pub controller: String,
    /// Every controller of the store, `controller` among them: the agent fails over between
    /// them ([`crate::client`]). Empty: `controller` alone.
    pub controllers: Vec<String>,
    /// A one-time enrollment token (needed only until the agent has enrolled).
    pub enroll_token: Option<Secret>,
    /// Where the agent keeps its credentials after enrolling (mode 0600).
    pub state_file: PathBuf,
    /// The root of the sysfs tree to discover (`/` on a live host).
    pub sysfs_root: PathBuf,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// How often the host is discovered again to notice changes.
    pub rescan: Duration,
    /// Timeout of one request.
    pub request_timeout: Duration,
    /// The longest pause between retries.
    pub max_backoff: Duration,
    /// Where to count requests and discoveries, when the agent exposes `/metrics`.
    pub metrics: Option<Arc<AgentMetrics>>,
    /// How the controller is trusted (CA file or pinned certificate; plain HTTP only to
    /// loopback unless allowed).
    pub tls: ClientTls,
    /// Where a lease ending on this server is announced (a file and a hook), if anywhere.
    pub lease_notice: Option<LeaseNoticeConfig>,
}

/// How the agent announces, on its host, that a lease of this server ends: with each
/// heartbeat it asks the controller (`GET /v1/agents/notices`); while a lease ends it
/// keeps `file` written (one line per lease: `lease <id> ends <unix seconds>`), and runs
/// `hook` once per lease and end, with `WEFT_LEASE_ID`, `WEFT_LEASE_END` and
/// `WEFT_LEASE_FILE` in its environment, bounded by `hook_timeout`. When no lease ends any
/// more (it was extended, or the server has left), the file is removed.
#[derive(Debug, Clone)]
pub struct LeaseNoticeConfig {
    /// The file.
    pub file: PathBuf,
    /// A command run by `sh -c`.
    pub hook: Option<String>,
    /// The longest a hook may run.
    pub hook_timeout: Duration,
}

impl AgentConfig {
    /// Defaults for `controller`, `state_file` and `sysfs_root`: heartbeat 10 s, rescan
    /// 30 s, requests 5 s, backoff up to 30 s.
    pub fn new(controller: &str, state_file: PathBuf, sysfs_root: PathBuf) -> AgentConfig {
        AgentConfig {
            controller: controller.to_string(),
            controllers: Vec::new(),
            enroll_token: None,
            state_file,
            sysfs_root,
            heartbeat: Duration::from_secs(10),
            rescan: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(30),
            metrics: None,
            tls: ClientTls::default(),
            lease_notice: None,
        }
    }
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Discovery failed.
    #[error("discovery: {0}")]
    Discover(String),
    /// The controller refused the agent's token or secret.
    #[error("the controller refused this agent: {0}")]
    Refused(String),
    /// The controller's certificate is not the one this agent trusts: nothing was sent.
    #[error("{0}")]
    Untrusted(String),
    /// No enrollment token and no saved credentials.
    #[error("not enrolled: give an enrollment token (--enroll-token or WEFT_ENROLL_TOKEN)")]
    NoToken,
    /// The state file.
    #[error("state file {path}: {source}")]
    State {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The client could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
}

#[derive(Serialize, Deserialize)]
struct Credentials {
    server: String,
    secret: Secret,
}

/// What drives the agent's loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Rescan,
    Heartbeat,
    Shutdown,
}

async fn discover(cfg: &AgentConfig) -> Result<HostReport, AgentError> {
    let root = cfg.sysfs_root.clone();
    let report = tokio::task::spawn_blocking(move || weft_agent::discover(&root))
        .await
        .map_err(|e| AgentError::Discover(e.to_string()))?
        .map_err(|e| AgentError::Discover(e.to_string()))?;
    if let Some(m) = &cfg.metrics {
        m.rdma_ports
            .set(i64::try_from(report.port_guids().len()).unwrap_or(i64::MAX));
    }
    Ok(report)
}

/// Counts a request's outcome when the agent has metrics.
fn count<T>(cfg: &AgentConfig, kind: &str, r: &Result<T, ClientError>) {
    if let Some(m) = &cfg.metrics {
        m.record(kind, r.is_ok());
    }
}

fn fatal(e: ClientError) -> AgentError {
    match e {
        ClientError::Untrusted { .. } => AgentError::Untrusted(e.to_string()),
        e => AgentError::Refused(e.to_string()),
    }
}

/// A refusal that retrying cannot mend: the agent's credentials, or a controller whose
/// certificate the agent does not trust (it sends it nothing).
fn refused(e: &ClientError) -> bool {
    matches!(e.status(), Some(401 | 403)) || matches!(e, ClientError::Untrusted { .. })
}

fn load(cfg: &AgentConfig) -> Result<Option<Credentials>, AgentError> {
    match std::fs::read(&cfg.state_file) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AgentError::State {
            path: cfg.state_file.clone(),
            source,
        }),
    }
}

fn save(cfg: &AgentConfig, c: &Credentials) -> Result<(), AgentError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| AgentError::State {
        path: cfg.state_file.clone(),
        source,
    };
    let tmp = cfg.state_file.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    let text = serde_json::to_vec(c).map_err(|e| err(std::io::Error::other(e)))?;
    f.write_all(&text).and_then(|_| f.sync_all()).map_err(err)?;
    std::fs::rename(&tmp, &cfg.state_file).map_err(err)
}

/// Retries `f` with exponential backoff until it succeeds, is refused, or `stop` fires.
async fn retry<T, F, Fut>(
    what: &str,
    max: Duration,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    mut f: F,
) -> Result<Option<T>, AgentError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let mut pause = Duration::from_millis(200);
    loop {
        match f().await {
            Ok(v) => return Ok(Some(v)),
            Err(e) if refused(&e) => return Err(fatal(e)),
            Err(e) => tracing::warn!(error = %e, "{what} failed; retrying in {pause:?}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {},
            _ = stop.wait_for(|s| *s) => return Ok(None),
        }
        pause = (pause * 2).min(max);
    }
}

/// Asks the controller which leases end on this server and announces them on the host
/// ([`LeaseNoticeConfig`]); `announced` holds the (lease, end) pairs whose hook ran.
/// Failures are logged: a notice is retried with the next heartbeat.
async fn lease_notices(
    client: &Client,
    n: &LeaseNoticeConfig,
    announced: &mut std::collections::BTreeSet<(u64, u64)>,
) {
    let notices = match client.lease_notices().await {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read lease notices");
            return;
        }
    };
    if notices.is_empty() {
        match std::fs::remove_file(&n.file) {
            Ok(()) => {
                tracing::info!(file = %n.file.display(), "no lease ends on this server any more")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(error = %e, file = %n.file.display(), "cannot remove the lease notice")
            }
        }
        announced.clear();
        return;
    }
    let text: String = notices
        .iter()
        .map(|x| format!("lease {} ends {}\n", x.lease, x.end))
        .collect();
    let tmp = n.file.with_extension("tmp");
    if let Some(dir) = n.file.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(&tmp, &text).and_then(|_| std::fs::rename(&tmp, &n.file)) {
        tracing::warn!(error = %e, file = %n.file.display(), "cannot write the lease notice");
        return;
    }
    for x in &notices {
        if !announced.insert((x.lease, x.end)) {
            continue;
        }
        tracing::warn!(
            lease = x.lease,
            end = x.end,
            "a lease on this server ends; it leaves the tenant's group then"
        );
        let Some(hook) = n.hook.clone() else { continue };
        let env = vec![
            ("WEFT_LEASE_ID".to_string(), x.lease.to_string()),
            ("WEFT_LEASE_END".to_string(), x.end.to_string()),
            ("WEFT_LEASE_FILE".to_string(), n.file.display().to_string()),
        ];
        let timeout = n.hook_timeout;
        let ran = tokio::task::spawn_blocking(move || {
            let inv = weft_proc::Invocation {
                env: &env,
                cwd: None,
                timeout,
            };
            weft_proc::run_bounded("sh", &["-c", &hook], &inv)
        })
        .await;
        match ran {
            Ok(Ok(_)) => tracing::info!(lease = x.lease, "lease hook ran"),
            Ok(Err(e)) => tracing::warn!(error = %e, lease = x.lease, "lease hook failed"),
            Err(e) => tracing::warn!(error = %e, "lease hook task"),
        }
    }
}

/// Runs the agent until `stop` turns true. Returns an error when the controller refuses
/// its credentials or the host cannot be discovered.
pub async fn run(
    cfg: AgentConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), AgentError> {
    let mut report = discover(&cfg).await?;
    let urls = if cfg.controllers.is_empty() {
        vec![cfg.controller.clone()]
    } else {
        cfg.controllers.clone()
    };
    let anonymous = Client::over(&urls, None, cfg.request_timeout, &cfg.tls)?;
    let creds = match load(&cfg)? {
        Some(c) => c,
        None => {
            let token = cfg.enroll_token.clone().ok_or(AgentError::NoToken)?;
            let host = report.hostname.clone();
            let cfg_ref = &cfg;
            let Some(enrolled) = retry("enrolling", cfg.max_backoff, &mut stop, || {
                let call = anonymous.enroll(&token, &host);
                async move {
                    let r = call.await;
                    count(cfg_ref, "enroll", &r);
                    r
                }
            })
            .await?
            else {
                return Ok(());
            };
            let c = Credentials {
                server: enrolled.server,
                secret: enrolled.secret,
            };
            save(&cfg, &c)?;
            tracing::info!(server = %c.server, "enrolled");
            c
        }
    };
    let client = anonymous.with_token(Some(creds.secret.clone()));
    let cfg_ref = &cfg;
    let send = |r: HostReport| {
        let client = client.clone();
        async move {
            let result = client.report(&r).await;
            count(cfg_ref, "report", &result);
            result
        }
    };
    let Some(ack) = retry("reporting", cfg.max_backoff, &mut stop, || {
        send(report.clone())
    })
    .await?
    else {
        return Ok(());
    };
    tracing::info!(
        server = %ack.server,
        owned = ack.owned.len(),
        pending = ack.pending.len(),
        "reported this host's ports"
    );
    if !ack.pending.is_empty() {
        tracing::warn!(pending = ?ack.pending, "ports another server owns are held pending an admin's approval");
    }
    let mut announced = std::collections::BTreeSet::new();
    let mut heartbeat = tokio::time::interval(cfg.heartbeat);
    let mut rescan = tokio::time::interval(cfg.rescan);
    heartbeat.tick().await;
    rescan.tick().await;
    loop {
        let event = tokio::select! {
            _ = heartbeat.tick() => Event::Heartbeat,
            _ = rescan.tick() => Event::Rescan,
            _ = stop.wait_for(|s| *s) => Event::Shutdown,
        };
        match event {
            Event::Shutdown => return Ok(()),
            Event::Heartbeat => {
                let result = client.heartbeat().await;
                count(&cfg, "heartbeat", &result);
                match result {
                    Ok(()) => {
                        if let Some(n) = &cfg.lease_notice {
                            lease_notices(&client, n, &mut announced).await;
                        }
                    }
                    Err(e) if refused(&e) => return Err(fatal(e)),
                    Err(e) => {
                        tracing::warn!(error = %e, "heartbeat failed; next one in {:?}", cfg.heartbeat)
                    }
                }
            }
            Event::Rescan => {
                let now = discover(&cfg).await?;
                if now != report {
                    report = now;
                    tracing::info!("host changed; reporting");
                    if retry("reporting", cfg.max_backoff, &mut stop, || {
                        send(report.clone())
                    })
                    .await?
                    .is_none()
                    {
                        return Ok(());
                    }
                }
            }
        }
    }
}
