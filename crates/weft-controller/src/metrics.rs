//! Prometheus metrics of the controller, served on their own listener (`/metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Content type of the OpenMetrics text that `prometheus_client` writes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of Prometheus' classic text format (what `curl` and `promtool` read).
pub const TEXT_0_0_4: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The body and content type for a scrape with `accept` (the request's `Accept` header):
/// OpenMetrics when the scraper asks for it (Prometheus does), else the classic text format,
/// so that the content type always says what the body is.
pub fn exposition(openmetrics: String, accept: Option<&str>) -> (&'static str, String) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (OPENMETRICS, openmetrics)
    } else {
        (TEXT_0_0_4, to_text_0_0_4(&openmetrics))
    }
}

/// OpenMetrics text as Prometheus' text format 0.0.4: a counter's family is named with its
/// `_total` suffix (OpenMetrics names the family without it), and `# UNIT` and `# EOF` go.
pub fn to_text_0_0_4(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{prefix}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

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
    /// `weft_fabric_applies_total`, by outcome: `applied`, `degraded`, `failed`, `fenced` (an
    /// SM holds a newer file than this store may replace).
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
    /// `weft_leases` by phase (set after each step of the lease loop).
    pub leases: Family<LeasePhase, Gauge>,
    /// `weft_lease_queue`: leases waiting in the queue.
    pub lease_queue: Gauge,
    /// `weft_lease_pool_free`: pool nodes no lease holds.
    pub lease_pool_free: Gauge,
    /// `weft_controller_leader`: 1 while this controller leads and may deliver, else 0
    /// (set at scrape time).
    pub leader: Gauge,
    /// `weft_controller_fencing`: the fencing number this controller's leadership
    /// delivers with, 0 while it follows or is alone on a SQLite store (set at scrape time).
    pub fencing: Gauge,
    /// `weft_link_below_expected` by node, NIC and source: 1 for every link flagged now
    /// ([`crate::links::health`]; set at scrape time, a link no longer flagged is gone).
    pub link_below_expected: Family<LinkLabel, Gauge>,
}

/// Labels of a flagged link.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LinkLabel {
    /// The node (the sender, for a measured link).
    pub node: String,
    /// Its NIC (`plugin` for a link timed through the NCCL plugin).
    pub nic: String,
    /// `agent` (negotiated below its peers' or the expected speed), or what measured it
    /// (`p2p`, `collectives`, `doctor`: below 70% of its run's median, or failed).
    pub source: String,
}

impl Metrics {
    /// Sets `weft_link_below_expected` to exactly the links `h` flags.
    pub fn set_links(&self, h: &crate::links::LinkHealthView) {
        self.link_below_expected.clear();
        for n in &h.nics {
            self.link_below_expected
                .get_or_create(&LinkLabel {
                    node: n.node.clone(),
                    nic: n.nic.clone(),
                    source: "agent".into(),
                })
                .set(1);
        }
        for p in &h.pairs {
            self.link_below_expected
                .get_or_create(&LinkLabel {
                    node: p.src.clone(),
                    nic: p.nic.clone(),
                    source: p.source.as_str().into(),
                })
                .set(1);
        }
    }
}

/// Labels of the leases gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeasePhase {
    /// `waiting`, `queued`, `active`, `ending`, `ended`, `released`, `refused`.
    pub phase: String,
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
        let leases = Family::<LeasePhase, Gauge>::default();
        registry.register("leases", "Node leases by phase", leases.clone());
        let lease_queue = Gauge::default();
        registry.register(
            "lease_queue",
            "Node leases waiting in the queue",
            lease_queue.clone(),
        );
        let lease_pool_free = Gauge::default();
        registry.register(
            "lease_pool_free",
            "Pool nodes no lease holds",
            lease_pool_free.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "controller_leader",
            "1 while this controller leads (delivers to the SMs and takes writes), else 0",
            leader.clone(),
        );
        let fencing = Gauge::default();
        registry.register(
            "controller_fencing",
            "The fencing number of this controller's leadership (0 while it follows, or alone on SQLite)",
            fencing.clone(),
        );
        let link_below_expected = Family::<LinkLabel, Gauge>::default();
        registry.register(
            "link_below_expected",
            "1 for every link flagged now: an RDMA NIC negotiated below its peers' or the expected speed (source=agent), or a measured link below 70% of its run's median or failed (source=p2p, collectives, doctor)",
            link_below_expected.clone(),
        );
        Metrics {
            leader,
            fencing,
            link_below_expected,
            leases,
            lease_queue,
            lease_pool_free,
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
    /// The OpenMetrics text exposition (see [`exposition`] for what a scrape gets).
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

    /// The OpenMetrics text exposition (see [`exposition`] for what a scrape gets).
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
            axum::routing::get(move |headers: axum::http::HeaderMap| {
                let m = self.clone();
                async move {
                    let accept = headers
                        .get(axum::http::header::ACCEPT)
                        .and_then(|v| v.to_str().ok());
                    let (ty, body) = exposition(m.encode(), accept);
                    ([(axum::http::header::CONTENT_TYPE, ty)], body)
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counter_families_with_total_and_drops_eof() {
        let m = Metrics::default();
        m.reports.inc();
        let om = m.encode();
        assert!(om.contains("# TYPE weft_agent_reports counter"), "{om}");
        let (ty, text) = exposition(om.clone(), Some("text/plain"));
        assert_eq!(ty, TEXT_0_0_4);
        assert!(
            text.contains("# TYPE weft_agent_reports_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP weft_agent_reports_total Agent reports accepted"),
            "{text}"
        );
        assert!(text.contains("weft_agent_reports_total 1\n"), "{text}");
        assert!(
            text.contains("# TYPE weft_operations_pending gauge\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        let (ty, same) = exposition(
            om.clone(),
            Some("application/openmetrics-text;version=1.0.0"),
        );
        assert_eq!((ty, same), (OPENMETRICS, om));
    }
}
