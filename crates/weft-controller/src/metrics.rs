//! Prometheus metrics of the controller, served on their own listener (`/metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of one API request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Request {
    /// The route pattern (`/v1/groups/{group}`), never the raw path.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// Status code.
    pub status: u16,
}

/// Labels of a route.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Route {
    /// The route pattern.
    pub route: String,
}

/// Labels of a delivery outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// `applied`, `degraded` (applied with a standby left out) or `failed`.
    pub outcome: String,
}

/// Labels of a server liveness.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LivenessLabel {
    /// `ok`, `stale`, `never`.
    pub liveness: String,
}

/// Every metric the controller keeps.
pub struct Metrics {
    registry: Registry,
    /// `weft_http_requests_total`.
    pub requests: Family<Request, Counter>,
    /// `weft_http_request_duration_seconds`.
    pub latency: Family<Route, Histogram, fn() -> Histogram>,
    /// `weft_agent_reports_total`.
    pub reports: Counter,
    /// `weft_fabric_applies_total`.
    pub applies: Family<Outcome, Counter>,
    /// `weft_fabric_apply_duration_seconds`.
    pub apply_seconds: Histogram,
    /// `weft_servers` by liveness (set at scrape time).
    pub servers: Family<LivenessLabel, Gauge>,
    /// `weft_operations_pending` (set at scrape time).
    pub pending: Gauge,
    /// `weft_http_rate_limited_total`: requests without a token refused for their rate.
    pub rate_limited: Counter,
    /// `weft_fabric_drift` by kind (`files`, `ports`): 1 while that part of the fabric
    /// differs from what the controller applied, else 0.
    pub drift: Family<DriftKind, Gauge>,
    /// `weft_fabric_drift_repairs_total`: deliveries made to repair drift.
    pub drift_repairs: Counter,
}

/// Labels of a drift gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftKind {
    /// `files` (an SM's partitions file) or `ports` (a port's P_Key table).
    pub kind: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("weft");
        let requests = Family::<Request, Counter>::default();
        registry.register(
            "http_requests",
            "API requests by route, method and status",
            requests.clone(),
        );
        let latency = Family::<Route, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "http_request_duration_seconds",
            "API request latency by route",
            latency.clone(),
        );
        let reports = Counter::default();
        registry.register("agent_reports", "Agent reports accepted", reports.clone());
        let applies = Family::<Outcome, Counter>::default();
        registry.register(
            "fabric_applies",
            "Deliveries to the subnet managers by outcome",
            applies.clone(),
        );
        let apply_seconds = Histogram::new(exponential_buckets(0.05, 2.0, 10));
        registry.register(
            "fabric_apply_duration_seconds",
            "From delivery start to verified ports",
            apply_seconds.clone(),
        );
        let servers = Family::<LivenessLabel, Gauge>::default();
        registry.register("servers", "Servers by agent liveness", servers.clone());
        let pending = Gauge::default();
        registry.register(
            "operations_pending",
            "Operations not yet verified on the fabric",
            pending.clone(),
        );
        let rate_limited = Counter::default();
        registry.register(
            "http_rate_limited",
            "Requests without a token refused because their source asked too often",
            rate_limited.clone(),
        );
        let drift = Family::<DriftKind, Gauge>::default();
        registry.register(
            "fabric_drift",
            "1 while the SMs' files (kind=files) or the ports' tables (kind=ports) differ from what the controller applied",
            drift.clone(),
        );
        let drift_repairs = Counter::default();
        registry.register(
            "fabric_drift_repairs",
            "Deliveries made to repair drift",
            drift_repairs.clone(),
        );
        Metrics {
            drift,
            drift_repairs,
            rate_limited,
            registry,
            requests,
            latency,
            reports,
            applies,
            apply_seconds,
            servers,
            pending,
        }
    }
}

impl Metrics {
    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Labels of one agent request: what it was and how it ended.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentRequest {
    /// `enroll`, `report` or `heartbeat`.
    pub kind: String,
    /// `ok` or `error`.
    pub outcome: String,
}

/// Prometheus metrics of one agent (`weft agent --metrics-listen`).
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    /// Requests to the controller by kind and outcome.
    pub requests: Family<AgentRequest, Counter>,
    /// RDMA ports found at the last discovery.
    pub rdma_ports: Gauge,
    /// Unix time of the last request the controller accepted.
    pub last_success: Gauge,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("weft_agent");
        let requests = Family::<AgentRequest, Counter>::default();
        registry.register(
            "requests",
            "Requests to the controller by kind and outcome",
            requests.clone(),
        );
        let rdma_ports = Gauge::default();
        registry.register(
            "rdma_ports",
            "RDMA ports found at the last discovery",
            rdma_ports.clone(),
        );
        let last_success = Gauge::default();
        registry.register(
            "last_success_timestamp_seconds",
            "Unix time of the last request the controller accepted",
            last_success.clone(),
        );
        AgentMetrics {
            registry,
            requests,
            rdma_ports,
            last_success,
        }
    }
}

impl AgentMetrics {
    /// Counts one request to the controller.
    pub fn record(&self, kind: &str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.requests
            .get_or_create(&AgentRequest {
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .inc();
        if ok {
            self.last_success
                .set(i64::try_from(crate::unix_now()).unwrap_or(i64::MAX));
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// A router serving `/metrics`, for the agent's own listener.
    pub fn app(self: std::sync::Arc<Self>) -> axum::Router {
        axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let m = self.clone();
                async move { m.encode() }
            }),
        )
    }

    /// Serves [`AgentMetrics::app`] on `listener` until the task is dropped.
    pub async fn serve(
        self: std::sync::Arc<Self>,
        listener: tokio::net::TcpListener,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.app()).await
    }
}
