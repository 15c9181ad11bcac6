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
use crate::metrics::{LivenessLabel, Metrics};
use crate::model::Liveness;
use crate::reconcile::{self, Event, Fabric};
use crate::store::{Store, StoreError};

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            admin_token: None,
            stale_after_s: 30,
            recheck: Duration::from_secs(30),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// A running controller: the reconcile loop is spawned; [`Controller::app`] is the API.
pub struct Controller {
    state: AppState,
}

impl Controller {
    /// Bootstraps the admin token, spawns the reconcile loop (which first re-drives what
    /// a previous run left pending) and returns the controller. Needs a Tokio runtime.
    pub fn start(
        store: Arc<dyn Store>,
        fabric: Arc<dyn Fabric>,
        config: ControllerConfig,
    ) -> Result<Controller, StoreError> {
        if let Some(t) = &config.admin_token {
            store.bootstrap_admin(&t.hash(), unix_now())?;
        }
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = mpsc::channel(64);
        let _ = tx.try_send(Event::Started);
        tokio::spawn(reconcile::run(
            store.clone(),
            fabric,
            metrics.clone(),
            rx,
            config.recheck,
            config.max_backoff,
        ));
        Ok(Controller {
            state: AppState {
                store,
                events: tx,
                metrics,
                stale_after_s: config.stale_after_s,
            },
        })
    }

    /// The API router.
    pub fn app(&self) -> Router {
        app(self.state.clone())
    }

    /// The metrics router (`/metrics`), for its own listener.
    pub fn metrics_app(&self) -> Router {
        let state = self.state.clone();
        Router::new().route(
            "/metrics",
            get(move || {
                let state = state.clone();
                async move {
                    let s = state.store.clone();
                    let stale = state.stale_after_s;
                    let counts = tokio::task::spawn_blocking(move || {
                        s.status(unix_now(), stale)
                            .and_then(|st| Ok((st, s.servers(unix_now(), stale)?)))
                    })
                    .await;
                    if let Ok(Ok((status, servers))) = counts {
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
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        state.metrics.encode(),
                    )
                }
            }),
        )
    }
}

/// Serves the API on `api` and the metrics on `metrics` until `shutdown` resolves, then
/// drains in-flight requests. Returns the bound addresses through `bound` first.
pub async fn serve(
    controller: Controller,
    api: tokio::net::TcpListener,
    metrics: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = metrics.map(|l| {
        let app = controller.metrics_app();
        let mut rx = stop_rx.clone();
        tokio::spawn(async move {
            let _ = axum::serve(l, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.wait_for(|s| *s).await;
                })
                .await;
        })
    });
    let result = axum::serve(api, controller.app())
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        })
        .await;
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
