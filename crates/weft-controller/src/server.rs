//! Putting the parts together: the store, the reconcile loop, the API and the metrics
//! listener, with graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tokio::sync::mpsc;

use crate::api::{AppState, app};
use crate::auth::Secret;
use crate::input::{Limiter, RateLimit};
use crate::metrics::{LivenessLabel, Metrics};
use crate::model::Liveness;
use crate::reconcile::{self, Event, Fabric};
use crate::store::{Store, StoreError};
use crate::tls::{ServerTls, TlsListener};

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Why a controller did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No admin token, or one too short to be a secret.
    #[error("admin token: {0}")]
    AdminToken(String),
    /// Another controller holds the store's lease.
    #[error(
        "another controller uses this store ({holder}); stop it first (its lease runs out {LEASE_S} s after it stops renewing)"
    )]
    Leased {
        /// Who holds the lease: its host, process id and start time.
        holder: String,
    },
    /// A controller leads on this store (one that elects a leader).
    #[error(
        "another controller uses this store: it leads ({holder}); stop every controller on it first (the leader's lease runs out {} s after it stops renewing)",
        crate::leader::TTL_S
    )]
    Leads {
        /// The leader: its holder id and advertised URL.
        holder: String,
    },
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The shortest admin token the controller accepts: 32 characters, as 128 random bits in
/// hex would be.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 32;

/// Refuses an admin token that cannot hold 128 bits: shorter than
/// [`MIN_ADMIN_TOKEN_CHARS`], or made of fewer than 8 distinct characters.
pub fn check_admin_token(token: &Secret) -> Result<(), StartError> {
    let t = token.expose();
    let distinct: std::collections::BTreeSet<char> = t.chars().collect();
    if t.chars().count() < MIN_ADMIN_TOKEN_CHARS || distinct.len() < 8 {
        return Err(StartError::AdminToken(format!(
            "it has {} characters ({} distinct); give at least {MIN_ADMIN_TOKEN_CHARS} random ones (128 bits), e.g. from `openssl rand -hex 16`",
            t.chars().count(),
            distinct.len()
        )));
    }
    if t.chars().any(char::is_control) || t.contains(' ') {
        return Err(StartError::AdminToken(
            "it holds blanks or control characters".into(),
        ));
    }
    Ok(())
}

/// Seconds a controller's lease on its store lasts without renewal.
pub const LEASE_S: u64 = 15;
const LEASE_NAME: &str = "controller";

/// This controller as a lease holder: `host <name> pid <pid> since <unix> #<n>`, unique
/// among the controllers of one process too.
fn holder_id() -> String {
    static STARTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "host {} pid {} since {} #{}",
        this_host(),
        std::process::id(),
        unix_now(),
        STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Whether the holder `h` is a process of this host that no longer exists (a controller
/// killed with SIGKILL): its lease may be taken at once instead of after it runs out.
fn holder_is_dead_here(h: &str) -> bool {
    let mut words = h.split_whitespace();
    let (Some("host"), Some(host), Some("pid"), Some(pid)) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return false;
    };
    host == this_host()
        && pid.parse::<u32>().is_ok_and(|p| {
            p != std::process::id() && !std::path::Path::new(&format!("/proc/{p}")).exists()
        })
}

/// Runs `f` holding the store's lease, for a command that needs the controller stopped
/// (`weft controller restore`): refused, naming the holder, while a controller runs on it.
pub(crate) fn while_stopped<T>(store: &dyn Store, f: impl FnOnce() -> T) -> Result<T, StartError> {
    let holder = format!("{} (restore)", holder_id());
    // Controllers on a store that elects hold the leader's lease, not the store's.
    if let Some((leader, url)) = store.leader()?
        && !holder_is_dead_here(&leader)
    {
        return Err(StartError::Leased {
            holder: format!(
                "the leader {leader} at {}",
                url.as_deref().unwrap_or("no advertised URL")
            ),
        });
    }
    store
        .acquire_lease(
            LEASE_NAME,
            &holder,
            LEASE_S,
            unix_now(),
            &holder_is_dead_here,
        )?
        .map_err(|holder| StartError::Leased { holder })?;
    let out = f();
    if let Err(e) = store.release_lease(LEASE_NAME, &holder) {
        tracing::warn!(error = %e, "cannot give the store's lease back; it runs out by itself");
    }
    Ok(out)
}

/// The store's lease, held while the controller runs and given back when it is dropped.
struct Lease {
    store: Arc<dyn Store>,
    holder: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Err(e) = self.store.release_lease(LEASE_NAME, &self.holder) {
            tracing::warn!(error = %e, "cannot give the store's lease back; it runs out by itself");
        }
    }
}

/// Gives the leader's lease up when dropped (a controller stopping), so that a follower
/// takes over at its next round.
struct Resign {
    store: Arc<dyn Store>,
    lead: Arc<crate::leader::Leadership>,
}

impl Drop for Resign {
    fn drop(&mut self) {
        crate::leader::resign(self.store.as_ref(), &self.lead);
    }
}

/// The controller's knobs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// An admin token to accept (its hash is stored; bootstrap).
    pub admin_token: Option<Secret>,
    /// Seconds of silence after which an agent is stale.
    pub stale_after_s: u64,
    /// How often the reconcile loop looks without being asked.
    pub recheck: Duration,
    /// The longest wait between retries of a failed delivery.
    pub max_backoff: Duration,
    /// The per-source rate limit of the endpoints that answer without a token.
    pub rate_limit: RateLimit,
    /// Take over the partitions the SMs hold that this controller did not write, instead
    /// of refusing to remove them (`weft controller --adopt`).
    pub adopt: bool,
    /// How often the drift check reads the ports' tables (the SMs' files are read every
    /// `recheck`).
    pub port_check: Duration,
    /// Deliver the applied state again when drift is found (`--repair-drift`).
    pub repair_drift: bool,
    /// The node-lease loop's knobs (pool group, warning time, tick).
    pub lease: crate::lease::LeaseConfig,
    /// The URL other controllers hand out for this one while it leads
    /// (`--advertise-url`; on a store that elects a leader).
    pub advertise_url: Option<String>,
    /// The speed every RDMA data link should negotiate, Gb/s (`[controller]
    /// expected_link_gbps`): a link below it is flagged ([`crate::links`]). `None`: links
    /// are compared with their peers only.
    pub expected_link_gbps: Option<f64>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            admin_token: None,
            stale_after_s: 30,
            recheck: Duration::from_secs(30),
            max_backoff: Duration::from_secs(30),
            rate_limit: RateLimit::default(),
            adopt: false,
            port_check: Duration::from_secs(300),
            repair_drift: false,
            lease: crate::lease::LeaseConfig::default(),
            advertise_url: None,
            expected_link_gbps: None,
        }
    }
}

/// A running controller: the reconcile loop is spawned; [`Controller::app`] is the API.
pub struct Controller {
    state: AppState,
    /// The store's lease, on a store that does not elect a leader.
    _lease: Option<Arc<Lease>>,
    /// Gives the leader's lease up when the controller stops.
    _resign: Resign,
    /// Routes served beside the API on the same listener (the web console).
    mounted: Option<Router>,
}

impl Controller {
    /// Takes the store's lease (refusing to start while another controller holds it),
    /// bootstraps the admin token (revoking the one a previous start was given, if
    /// different), spawns the reconcile loop (which first re-drives what a previous run
    /// left pending) and returns the controller. Needs a Tokio runtime.
    pub fn start(
        store: Arc<dyn Store>,
        fabric: Arc<dyn Fabric>,
        config: ControllerConfig,
    ) -> Result<Controller, StartError> {
        let token = config.admin_token.as_ref().ok_or_else(|| {
            StartError::AdminToken(
                "none given (WEFT_ADMIN_TOKEN or --admin-token-file); the controller does not run without one".into(),
            )
        })?;
        check_admin_token(token)?;
        let holder = holder_id();
        let (tx, rx) = mpsc::channel(64);
        // On a store that elects (PostgreSQL), several controllers run and the leader
        // delivers; on SQLite one runs, alone by the store's lease.
        let (lease, lead) = if store.elects() {
            (
                None,
                crate::leader::Leadership::elected(&holder, config.advertise_url.as_deref()),
            )
        } else {
            (
                Some(Self::take_lease(&store, &holder)?),
                crate::leader::Leadership::alone(&holder),
            )
        };
        store.bootstrap_admin(&token.hash(), unix_now())?;
        let leads_now = !lead.is_elected() || lead.first_round(store.as_ref())?;
        if lead.is_elected() {
            tokio::spawn(crate::leader::run(
                store.clone(),
                Arc::downgrade(&lead),
                tx.clone(),
            ));
        }
        tracing::info!(
            policy = crate::render::DEFAULT_POLICY,
            "the Default partition"
        );
        let metrics = Arc::new(Metrics::default());
        if leads_now {
            let _ = tx.try_send(Event::Started);
        }
        let delivers = fabric.delivers();
        let leases = Arc::new(crate::lease::Leases::new(
            store.clone(),
            tx.clone(),
            fabric.clone(),
            metrics.clone(),
            config.lease.clone(),
        ));
        let weak_leases = Arc::downgrade(&leases);
        let tick = config.lease.tick;
        let lead_leases = lead.clone();
        tokio::spawn(async move {
            // The loop runs while the controller does: it holds the lease loop only
            // through a weak reference between ticks.
            let mut last_topology: Option<tokio::time::Instant> = None;
            loop {
                let Some(l) = weak_leases.upgrade() else {
                    return;
                };
                // Only the leader's loop decides (and its moves are the leader's to deliver).
                if lead_leases.delivering().is_some() {
                    l.tick_once(&mut last_topology).await;
                }
                drop(l);
                tokio::time::sleep(tick).await;
            }
        });
        let drift = Arc::new(std::sync::Mutex::new(crate::model::DriftView::default()));
        let store_for_resign = store.clone();
        tokio::spawn(reconcile::run(
            store.clone(),
            fabric,
            metrics.clone(),
            rx,
            reconcile::LoopConfig {
                recheck: config.recheck,
                max_backoff: config.max_backoff,
                adopt: config.adopt,
                port_check: config.port_check,
                repair: config.repair_drift,
                lead: lead.clone(),
            },
            drift.clone(),
        ));
        Ok(Controller {
            state: AppState {
                store,
                events: tx,
                metrics,
                stale_after_s: config.stale_after_s,
                limiter: Arc::new(Limiter::new(config.rate_limit)),
                delivers,
                drift,
                reports: Arc::default(),
                leases,
                lead: lead.clone(),
                expected_link_gbps: config.expected_link_gbps,
            },
            _lease: lease,
            _resign: Resign {
                store: store_for_resign,
                lead,
            },
            mounted: None,
        })
    }

    /// Takes the store's lease for `holder`, refusing while another controller holds it,
    /// and renews it while the returned lease lives.
    fn take_lease(store: &Arc<dyn Store>, holder: &str) -> Result<Arc<Lease>, StartError> {
        if let Err(h) = store.acquire_lease(
            LEASE_NAME,
            holder,
            LEASE_S,
            unix_now(),
            &holder_is_dead_here,
        )? {
            return Err(StartError::Leased { holder: h });
        }
        let lease = Arc::new(Lease {
            store: store.clone(),
            holder: holder.to_string(),
        });
        let weak = Arc::downgrade(&lease);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(LEASE_S / 3)).await;
                let Some(lease) = weak.upgrade() else { return };
                let store = lease.store.clone();
                let holder = lease.holder.clone();
                drop(lease);
                let renewed = tokio::task::spawn_blocking(move || {
                    store.acquire_lease(LEASE_NAME, &holder, LEASE_S, unix_now(), &|_| false)
                })
                .await;
                match renewed {
                    Ok(Ok(Ok(()))) => {}
                    Ok(Ok(Err(other))) => {
                        tracing::error!(%other, "another controller took the store's lease")
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew the store's lease"),
                    Err(e) => tracing::warn!(error = %e, "lease renewal task"),
                }
            }
        });
        Ok(lease)
    }

    /// The API router, with what was [`Controller::mount`]ed.
    pub fn app(&self) -> Router {
        let api = app(self.state.clone());
        let all = match &self.mounted {
            Some(extra) => api.merge(extra.clone()),
            None => api,
        };
        // A follower serves reads; every write goes to the leader (421 `not_leader`).
        all.layer(axum::middleware::from_fn_with_state(
            self.state.lead.clone(),
            crate::api::leader_only_writes,
        ))
    }

    /// What the handlers share (store, events, drift, stale bound): for routes that
    /// are mounted beside the API.
    pub fn state(&self) -> AppState {
        self.state.clone()
    }

    /// Serves `routes` beside the API on the same listener, with the same TLS (the web
    /// console). Their paths must not be the API's.
    pub fn mount(&mut self, routes: Router) {
        self.mounted = Some(match self.mounted.take() {
            Some(r) => r.merge(routes),
            None => routes,
        });
    }

    /// The metrics router (`/metrics`), for its own listener.
    pub fn metrics_app(&self) -> Router {
        let state = self.state.clone();
        Router::new().route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let state = state.clone();
                async move {
                    let accept = headers
                        .get(axum::http::header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let s = state.store.clone();
                    let stale = state.stale_after_s;
                    let counts = tokio::task::spawn_blocking(move || {
                        crate::store::mark_blocking_thread();
                        s.status(unix_now(), stale).and_then(|st| {
                            Ok((
                                st,
                                s.servers(unix_now(), stale)?,
                                s.link_runs(crate::links::MAX_LIST)?,
                            ))
                        })
                    })
                    .await;
                    let licence = state.lead.delivering();
                    state.metrics.leader.set(i64::from(licence.is_some()));
                    state.metrics.fencing.set(
                        licence
                            .and_then(|l| l.fencing)
                            .map_or(0, |f| i64::try_from(f).unwrap_or(i64::MAX)),
                    );
                    if let Ok(Ok((status, servers, runs))) = counts {
                        state.metrics.set_links(&crate::links::health(
                            &servers,
                            &runs,
                            state.expected_link_gbps,
                        ));
                        state.metrics.pending.set(status.pending_operations);
                        for l in [Liveness::Ok, Liveness::Stale, Liveness::Never] {
                            let n = servers.iter().filter(|s| s.liveness == l).count();
                            state
                                .metrics
                                .servers
                                .get_or_create(&LivenessLabel {
                                    liveness: l.as_str().into(),
                                })
                                .set(i64::try_from(n).unwrap_or(i64::MAX));
                        }
                    }
                    let (ty, body) =
                        crate::metrics::exposition(state.metrics.encode(), accept.as_deref());
                    ([(axum::http::header::CONTENT_TYPE, ty)], body)
                }
            }),
        )
    }
}

/// Serves the API on `api` and the metrics on `metrics` until `shutdown` resolves, then
/// drains in-flight requests. Plain HTTP: for loopback (see [`serve_tls`]).
pub async fn serve(
    controller: Controller,
    api: tokio::net::TcpListener,
    metrics: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_tls(controller, api, metrics, None, shutdown).await
}

/// [`serve`], with both listeners speaking TLS when `tls` is given.
pub async fn serve_tls(
    controller: Controller,
    api: tokio::net::TcpListener,
    metrics: Option<tokio::net::TcpListener>,
    tls: Option<ServerTls>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = metrics.map(|l| {
        let app = controller.metrics_app();
        let mut rx = stop_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            let _ = match tls {
                Some(t) => {
                    axum::serve(TlsListener::new(l, &t), app)
                        .with_graceful_shutdown(stop)
                        .await
                }
                None => axum::serve(l, app).with_graceful_shutdown(stop).await,
            };
        })
    });
    // The peer address reaches the handlers, for the per-source rate limit.
    let app = controller.app();
    let stop = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let result = match tls {
        Some(t) => {
            // `tap_io` gives the TLS listener the `SocketAddr` connect info.
            let listener = TlsListener::new(api, &t).tap_io(|_| ());
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(stop)
            .await
        }
        None => {
            axum::serve(api, app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(stop)
                .await
        }
    };
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    result
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

/// The local address a listener bound to.
pub fn local(l: &tokio::net::TcpListener) -> SocketAddr {
    l.local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
}
