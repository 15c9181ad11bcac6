//! The HTTP JSON API: one [`AppState`], one router per area merged in [`app`], one error
//! type ([`ApiError`]) that is the only translation from failures to HTTP statuses.
//!
//! Routes (see `/openapi.json` for the bodies):
//!
//! | method | path | who |
//! |---|---|---|
//! | GET | `/healthz`, `/openapi.json` | anyone |
//! | POST | `/v1/agents/enroll` | an agent with a one-time enrollment token |
//! | POST | `/v1/agents/report`, `/v1/agents/heartbeat` | an enrolled agent (its secret) |
//! | POST | `/v1/enrollments` | admin |
//! | GET | `/v1/servers`, `/v1/claims`, `/v1/audit`, `/v1/operations`, `/v1/status` | admin |
//! | POST | `/v1/claims/{id}/approve`, `/v1/claims/{id}/reject` | admin |
//! | GET, POST | `/v1/tenants` | GET: admin all, tenant its own; POST: admin |
//! | GET, POST | `/v1/tokens` | admin (GET lists metadata, never a token) |
//! | DELETE | `/v1/tokens/{id}` | admin (revokes) |
//! | DELETE | `/v1/tenants/{tenant}`, `/v1/servers/{server}` | admin |
//! | GET, POST | `/v1/groups` | GET: admin all, tenant its own; POST: admin |
//! | GET, DELETE | `/v1/groups/{group}` | GET: admin or the owning tenant; DELETE: admin |
//! | POST | `/v1/groups/{group}/members` | admin |
//! | DELETE | `/v1/groups/{group}/members/{server}` | admin |
//! | POST | `/v1/moves` | admin |
//! | GET | `/v1/operations/{id}` | admin |
//! | GET, POST | `/v1/leases` | tenant (its own; GET: admin all) — see [`crate::lease::api`] |
//! | GET | `/v1/leases/{id}` | admin or the owning tenant |
//! | POST | `/v1/leases/{id}/extend`, `/v1/leases/{id}/release` | admin or the owning tenant |
//! | GET | `/v1/lease-quotas` | admin all, tenant its own |
//! | PUT, DELETE | `/v1/lease-quotas/{tenant}` | admin |
//! | GET | `/v1/agents/notices` | an enrolled agent: leases that end on its server |
//! | POST | `/v1/link-results` | admin (a run of link measurements) — see [`crate::links::api`] |
//! | GET | `/v1/link-results`, `/v1/link-health` | admin all, tenant the links among its nodes |

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{
    ConnectInfo, DefaultBodyLimit, FromRequest, FromRequestParts, MatchedPath, Path, Query,
    Request, State,
};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use utoipa::{IntoParams, OpenApi};
use utoipa_axum::{router::OpenApiRouter, routes};
use weft_agent::HostReport;

use crate::auth::{self, Principal, Role, TokenKind};
use crate::input::{self, Limiter};
use crate::metrics::{Metrics, Request as RequestLabels, Route};
use crate::model::*;
use crate::openapi::{
    AdminOnly, Authed, BodyErrors, Conflicting, HostReportSchema, Invalid, Missing, RateLimited,
};
use crate::reconcile::Event;
use crate::store::{Change, ReportedPort, Store, StoreError};

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Wakes the reconcile loop.
    pub events: mpsc::Sender<Event>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Seconds of silence after which an agent is stale.
    pub stale_after_s: u64,
    /// The per-source limit of the endpoints that answer without a token.
    pub limiter: Arc<Limiter>,
    /// Whether the fabric delivers to SMs ([`crate::reconcile::Fabric::delivers`]).
    pub delivers: bool,
    /// The drift check's last findings, written by the reconcile loop.
    pub drift: Arc<std::sync::Mutex<crate::model::DriftView>>,
    /// Per agent: how often its reports may change what the store holds.
    pub reports: Arc<input::ReportLimiter>,
    /// The node-lease loop ([`crate::lease`]).
    pub leases: Arc<crate::lease::Leases>,
    /// Whether this controller leads (takes writes and delivers) or follows.
    pub lead: Arc<crate::leader::Leadership>,
    /// The speed every RDMA data link should negotiate, Gb/s ([`crate::links`]).
    pub expected_link_gbps: Option<f64>,
}

/// Every failure an API call can answer with. 5xx answers say only that something
/// failed inside; the detail goes to the log.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No token, or one the controller does not know.
    #[error("{0}")]
    Unauthorized(String),
    /// A token whose role does not allow this.
    #[error("{0}")]
    Forbidden(String),
    /// Not there (or not visible to this caller).
    #[error("{0}")]
    NotFound(String),
    /// Contradicts the current state.
    #[error("{0}")]
    Conflict(String),
    /// A request that cannot be carried out as asked.
    #[error("{0}")]
    BadRequest(String),
    /// A request body over the limit.
    #[error("{0}")]
    TooLarge(String),
    /// This source asked too often; try again later.
    #[error("{0}")]
    TooMany(String),
    /// Something inside failed.
    #[error("{0}")]
    Internal(String),
    /// The store cannot write now (the message names it and the cause); try again once
    /// it can.
    #[error("{0}")]
    Unavailable(String),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(m) => ApiError::NotFound(m),
            StoreError::Conflict(m) => ApiError::Conflict(m),
            StoreError::Invalid(m) => ApiError::BadRequest(m),
            StoreError::Refused(m) => ApiError::Unauthorized(m),
            e @ StoreError::Db(_) => ApiError::Internal(e.to_string()),
            StoreError::Storage(m) => ApiError::Unavailable(format!("the store cannot write: {m}")),
            StoreError::Unavailable(m) => ApiError::Unavailable(m),
        }
    }
}

impl From<crate::input::InputError> for ApiError {
    fn from(e: crate::input::InputError) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ApiError::Unauthorized(m) => (StatusCode::UNAUTHORIZED, m),
            ApiError::Forbidden(m) => (StatusCode::FORBIDDEN, m),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            ApiError::Conflict(m) => (StatusCode::CONFLICT, m),
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            ApiError::TooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, m),
            ApiError::TooMany(m) => {
                let mut r =
                    (StatusCode::TOO_MANY_REQUESTS, Json(ErrorBody { error: m })).into_response();
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                return r;
            }
            ApiError::Unavailable(m) => {
                tracing::error!(cause = %m, "store unavailable");
                let mut r = (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(ErrorBody { error: m }),
                )
                    .into_response();
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
                return r;
            }
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error; see the controller's log".into(),
                )
            }
        };
        (status, Json(ErrorBody { error: message })).into_response()
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

pub(crate) async fn db<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
) -> ApiResult<T> {
    let store = state.store.clone();
    tokio::task::spawn_blocking(move || {
        crate::store::mark_blocking_thread();
        f(&*store)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("store task: {e}")))?
    .map_err(ApiError::from)
}

pub(crate) fn now() -> u64 {
    crate::server::unix_now()
}

fn bearer(parts: &Parts) -> ApiResult<auth::Secret> {
    let value = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ApiError::Unauthorized("missing `Authorization: Bearer <token>`".into()))?;
    let token = value.strip_prefix("Bearer ").ok_or_else(|| {
        ApiError::Unauthorized("the Authorization header is not `Bearer <token>`".into())
    })?;
    Ok(auth::Secret::new(token.trim()))
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let hash = bearer(parts)?.hash();
        db(state, move |s| s.principal(&hash, now()))
            .await?
            .ok_or_else(|| ApiError::Unauthorized("unknown API token".into()))
    }
}

/// An authenticated agent: the server its secret belongs to.
pub struct Agent(pub String);

impl FromRequestParts<AppState> for Agent {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let hash = bearer(parts)?.hash();
        db(state, move |s| s.agent(&hash))
            .await?
            .map(Agent)
            .ok_or_else(|| ApiError::Unauthorized("unknown agent secret".into()))
    }
}

pub(crate) fn admin(p: &Principal) -> ApiResult<()> {
    if p.is_admin() {
        Ok(())
    } else {
        Err(ApiError::Forbidden("this needs an admin token".into()))
    }
}

/// The largest request body the API reads (an agent's report of a large host is tens of
/// KiB); a larger one is refused with 413 before it is parsed.
pub const MAX_BODY: usize = 1 << 20;

/// Every route with its description: the router and the OpenAPI document come from
/// these `routes!` lists together (see [`crate::openapi`]), so a route served here is a
/// route described there. Without the layers, which need the state.
pub(crate) fn documented() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(crate::openapi::ApiDoc::openapi())
        .merge(open())
        .merge(agents())
        .merge(servers())
        .merge(tenants())
        .merge(groups())
        .merge(records())
        .merge(crate::lease::api::routes())
        .merge(crate::links::api::routes())
}

/// The whole API, without a listener: tests and `serve` call this.
pub fn app(state: AppState) -> Router {
    let (router, _) = OpenApiRouter::new()
        // What answers without a token is rate-limited per source address.
        .merge(open().route_layer(middleware::from_fn_with_state(state.clone(), rate_limited)))
        .merge(agents())
        .merge(servers())
        .merge(tenants())
        .merge(groups())
        .merge(records())
        .merge(crate::lease::api::routes())
        .merge(crate::links::api::routes())
        .split_for_parts();
    router
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

/// Refuses every write (any method but GET, HEAD and OPTIONS) while this controller does
/// not lead: 421 Misdirected Request, `code: "not_leader"`, and the leader's advertised
/// URL in `leader` (null while none is known). Agents' reports are writes too.
pub async fn leader_only_writes(
    State(lead): State<Arc<crate::leader::Leadership>>,
    request: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let method = request.method();
    if method == axum::http::Method::GET
        || method == axum::http::Method::HEAD
        || method == axum::http::Method::OPTIONS
    {
        return next.run(request).await;
    }
    let Some(leader) = lead.refuses_writes() else {
        return next.run(request).await;
    };
    let error = match &leader {
        Some(url) => format!("this controller is not the leader; send writes to the leader at {url}"),
        None => "this controller is not the leader and no leader is elected now; try again in a few seconds".to_string(),
    };
    (
        StatusCode::MISDIRECTED_REQUEST,
        Json(crate::model::NotLeaderBody {
            error,
            code: "not_leader".into(),
            leader,
        }),
    )
        .into_response()
}

// ------------------------------------------------------------------ open

fn open() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(openapi_json))
        .routes(routes!(enroll))
}

/// Readiness: `ok` while the controller serves and its store can take writes; 503 naming
/// the store and the cause when it cannot (a full disk, an I/O error).
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    responses(
        (status = 200, description = "the controller is up and its store takes writes", content_type = "text/plain", body = String),
        (status = 503, description = "the store cannot write: the body names it and the cause", body = ErrorBody),
        RateLimited
    )
)]
async fn healthz(State(state): State<AppState>) -> ApiResult<&'static str> {
    let store = state.store.clone();
    tokio::task::spawn_blocking(move || store.health())
        .await
        .map_err(|e| ApiError::Internal(format!("store task: {e}")))??;
    Ok("ok\n")
}

/// This document (OpenAPI 3.1).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    responses((status = 200, description = "this document", body = Object), RateLimited)
)]
async fn openapi_json() -> Json<&'static serde_json::Value> {
    Json(crate::openapi::document())
}

/// A path parameter; one that does not parse (`/v1/operations/x`) is a 400 with the
/// JSON error body, like every other refusal.
pub struct Param<T>(pub T);

impl<T, S> FromRequestParts<S> for Param<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(Param(v)),
            Err(e) => Err(bad(format!(
                "path: {}",
                input::escape_control(&e.body_text())
            ))),
        }
    }
}

/// A query string; one that does not parse (an unknown field, `?limit=x`) is a 400 with
/// the JSON error body.
pub struct QueryParams<T>(pub T);

impl<T, S> FromRequestParts<S> for QueryParams<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(QueryParams(v)),
            Err(e) => Err(bad(format!(
                "query: {}",
                input::escape_control(&e.body_text())
            ))),
        }
    }
}

/// Refuses a request whose source address went past [`AppState::limiter`]. A request that
/// came without a peer address (a test calling the router directly) counts as one source.
async fn rate_limited(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let source = req
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    if !state.limiter.allow(source, Instant::now()) {
        state.metrics.rate_limited.inc();
        return ApiError::TooMany(format!(
            "too many requests without a token from {source}; try again in a second"
        ))
        .into_response();
    }
    next.run(req).await
}

/// A JSON request body; a body that does not parse (a field the API does not know, a
/// missing one, a number out of range) is a 400 with serde's reason, control characters
/// escaped, and one over [`MAX_BODY`] a 413.
pub struct Body<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> ApiResult<Self> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::TooLarge(
                format!("the request body is larger than {MAX_BODY} bytes"),
            )),
            Err(e) => {
                let text = e.body_text();
                let text: String = text.chars().take(400).collect();
                Err(bad(format!(
                    "request body: {}",
                    input::escape_control(&text)
                )))
            }
        }
    }
}

pub(crate) fn bad(m: String) -> ApiError {
    ApiError::BadRequest(m)
}

async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().to_string();
    let start = Instant::now();
    let response = next.run(req).await;
    state
        .metrics
        .latency
        .get_or_create(&Route {
            route: route.clone(),
        })
        .observe(start.elapsed().as_secs_f64());
    state
        .metrics
        .requests
        .get_or_create(&RequestLabels {
            route,
            method,
            status: response.status().as_u16(),
        })
        .inc();
    response
}

// ------------------------------------------------------------------ agents

fn agents() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(report))
        .routes(routes!(heartbeat))
        .routes(routes!(create_enrollment))
}

/// Enrolls an agent with a one-time token; returns its secret once.
#[utoipa::path(
    post,
    path = "/v1/agents/enroll",
    tag = "agents",
    request_body = EnrollRequest,
    responses((status = 200, description = "enrolled; the secret is shown once", body = Enrolled), BodyErrors, RateLimited, (status = 401, description = "an enrollment token that is unknown, used, expired or bound to another host", body = ErrorBody), (status = 500, description = "something inside failed (the detail is in the controller's log)", body = ErrorBody), (status = 503, description = "the store cannot write now: the body names it and the cause", body = ErrorBody))
)]
async fn enroll(
    State(state): State<AppState>,
    Body(req): Body<EnrollRequest>,
) -> ApiResult<Json<Enrolled>> {
    // Checked before anything is stored or audited: a refused name leaves no trace.
    input::name("host name", &req.hostname)?;
    let secret = auth::generate(TokenKind::Agent).map_err(|e| ApiError::Internal(e.to_string()))?;
    let (token_hash, secret_hash, hostname) = (req.token.hash(), secret.hash(), req.hostname);
    let server = db(&state, move |s| {
        s.enroll(&token_hash, &hostname, &secret_hash, now())
    })
    .await?;
    tracing::info!(%server, "agent enrolled");
    Ok(Json(Enrolled { server, secret }))
}

fn reported_ports(report: &HostReport) -> Vec<ReportedPort> {
    report
        .fabric_ports()
        .into_iter()
        .map(|p| {
            let (device, state, rate, mtu) = report.port(p.port_guid).map_or(
                (String::new(), String::new(), None, None),
                |(d, rp)| {
                    let text = rp.state.to_string();
                    let state = text
                        .split_once(": ")
                        .map_or(text.clone(), |(_, n)| n.to_string());
                    (
                        d.name.clone(),
                        state,
                        rp.rate_text.clone(),
                        report.port_mtu(rp),
                    )
                },
            );
            ReportedPort {
                guid: p.port_guid,
                device,
                num: u32::from(p.port_num),
                lid: p.lid,
                state,
                rate,
                mtu,
            }
        })
        .collect()
}

/// Reports a host's ports (weft-agent's HostReport).
#[utoipa::path(
    post,
    path = "/v1/agents/report",
    tag = "agents",
    security(("agent" = [])),
    request_body = HostReportSchema,
    responses((status = 200, description = "what the controller made of the report", body = ReportAck), BodyErrors, Authed, RateLimited, (status = 403, description = "the report names a host other than the one this agent enrolled as", body = ErrorBody))
)]
async fn report(
    State(state): State<AppState>,
    Agent(server): Agent,
    Body(report): Body<HostReport>,
) -> ApiResult<Json<ReportAck>> {
    if report.hostname != server {
        return Err(ApiError::Forbidden(format!(
            "this agent enrolled as `{server}` and cannot report for `{}`",
            report.hostname
        )));
    }
    let ports = reported_ports(&report);
    let gpus = report.gpus.clone();
    if ports.len() > input::MAX_REPORT_PORTS || gpus.len() > input::MAX_REPORT_GPUS {
        return Err(bad(format!(
            "the report of `{server}` names {} fabric port(s) and {} GPU(s); at most {} and {} a host",
            ports.len(),
            gpus.len(),
            input::MAX_REPORT_PORTS,
            input::MAX_REPORT_GPUS
        )));
    }
    let links = crate::model::HostLinks::of(&report);
    let hash: String = {
        let text = format!("{ports:?}");
        Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let content = format!("{hash} {:?}", gpus);
    if !state.reports.allow(&server, &content, Instant::now()) {
        state.metrics.rate_limited.inc();
        return Err(ApiError::TooMany(format!(
            "the reports of `{server}` change too often (at most {} changes at once, then one every {:.0} s); the agent reports again later",
            input::REPORT_CHANGES.burst,
            1.0 / input::REPORT_CHANGES.per_s
        )));
    }
    let report = crate::store::AgentReport {
        server,
        ports,
        report_hash: hash,
        gpus,
        links,
    };
    let outcome = db(&state, move |s| s.report_host(report, now())).await?;
    state.metrics.reports.inc();
    if outcome.desired_changed {
        let _ = state.events.try_send(Event::Changed);
    }
    Ok(Json(outcome.ack))
}

/// Tells the controller this agent is alive.
#[utoipa::path(
    post,
    path = "/v1/agents/heartbeat",
    tag = "agents",
    security(("agent" = [])),
    responses((status = 204, description = "seen"), Authed)
)]
async fn heartbeat(State(state): State<AppState>, Agent(server): Agent) -> ApiResult<StatusCode> {
    db(&state, move |s| s.heartbeat(&server, now())).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Creates a one-time enrollment token.
#[utoipa::path(
    post,
    path = "/v1/enrollments",
    tag = "agents",
    security(("admin" = [])),
    request_body = EnrollmentRequest,
    responses((status = 200, description = "the one-time token, shown once", body = EnrollmentToken), BodyErrors, AdminOnly)
)]
async fn create_enrollment(
    State(state): State<AppState>,
    p: Principal,
    Body(req): Body<EnrollmentRequest>,
) -> ApiResult<Json<EnrollmentToken>> {
    admin(&p)?;
    if let Some(s) = &req.server {
        input::name("server", s)?;
    }
    let ttl = input::seconds("ttl_s", req.ttl_s.unwrap_or(86_400), 60, 30 * 86_400)?;
    let token =
        auth::generate(TokenKind::Enrollment).map_err(|e| ApiError::Internal(e.to_string()))?;
    let expires = now() + ttl;
    let hash = token.hash();
    db(&state, move |s| {
        s.create_enrollment(&p.actor, &hash, req.server.as_deref(), expires, now())
    })
    .await?;
    Ok(Json(EnrollmentToken { token, expires }))
}

// ------------------------------------------------------------------ servers and claims

fn servers() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_servers))
        .routes(routes!(remove_server))
        .routes(routes!(list_claims))
        .routes(routes!(approve_claim))
        .routes(routes!(reject_claim))
}

/// Servers, their ports, liveness and group.
#[utoipa::path(
    get,
    path = "/v1/servers",
    tag = "servers",
    security(("admin" = [])),
    responses((status = 200, description = "every server", body = Vec<ServerView>), AdminOnly)
)]
async fn list_servers(
    State(state): State<AppState>,
    p: Principal,
) -> ApiResult<Json<Vec<ServerView>>> {
    admin(&p)?;
    let stale = state.stale_after_s;
    Ok(Json(db(&state, move |s| s.servers(now(), stale)).await?))
}

/// Forgets a server that is in no group.
#[utoipa::path(
    delete,
    path = "/v1/servers/{server}",
    tag = "servers",
    security(("admin" = [])),
    params(("server" = String, Path, description = "the server's name (its host name)", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")),
    responses((status = 204, description = "forgotten"), Invalid, AdminOnly, Missing, Conflicting)
)]
async fn remove_server(
    State(state): State<AppState>,
    p: Principal,
    Param(server): Param<String>,
) -> ApiResult<StatusCode> {
    admin(&p)?;
    input::name("server", &server)?;
    db(&state, move |s| s.remove_server(&p.actor, &server, now())).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// GUID claims: ports a server reported that another server owns.
#[utoipa::path(
    get,
    path = "/v1/claims",
    tag = "servers",
    security(("admin" = [])),
    responses((status = 200, description = "every claim", body = Vec<ClaimView>), AdminOnly)
)]
async fn list_claims(
    State(state): State<AppState>,
    p: Principal,
) -> ApiResult<Json<Vec<ClaimView>>> {
    admin(&p)?;
    Ok(Json(db(&state, |s| s.claims()).await?))
}

/// Gives a claimed GUID to its claimant.
#[utoipa::path(
    post,
    path = "/v1/claims/{id}/approve",
    tag = "servers",
    security(("admin" = [])),
    params(("id" = i64, Path, description = "the claim's id")),
    responses((status = 202, description = "accepted; the operation to poll (absent when nothing changed)", body = Accepted), Invalid, AdminOnly, Missing, Conflicting)
)]
async fn approve_claim(
    State(state): State<AppState>,
    p: Principal,
    Param(id): Param<i64>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    admin(&p)?;
    change(&state, p, Change::ApproveClaim { id }).await
}

/// Rejects a claim.
#[utoipa::path(
    post,
    path = "/v1/claims/{id}/reject",
    tag = "servers",
    security(("admin" = [])),
    params(("id" = i64, Path, description = "the claim's id")),
    responses((status = 204, description = "rejected"), Invalid, AdminOnly, Missing)
)]
async fn reject_claim(
    State(state): State<AppState>,
    p: Principal,
    Param(id): Param<i64>,
) -> ApiResult<StatusCode> {
    admin(&p)?;
    db(&state, move |s| s.reject_claim(&p.actor, id, now())).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ------------------------------------------------------------------ tenants and tokens

fn tenants() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_tenants, create_tenant))
        .routes(routes!(delete_tenant))
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
}

/// Tenants (a tenant token sees its own).
#[utoipa::path(
    get,
    path = "/v1/tenants",
    tag = "tenants",
    security(("api" = [])),
    responses((status = 200, description = "tenants this token may see", body = Vec<TenantView>), Authed)
)]
async fn list_tenants(
    State(state): State<AppState>,
    p: Principal,
) -> ApiResult<Json<Vec<TenantView>>> {
    let all = db(&state, |s| s.tenants()).await?;
    Ok(Json(
        all.into_iter()
            .filter(|t| p.can_read_tenant(&t.name))
            .collect(),
    ))
}

/// Creates a tenant; returns its first token once.
#[utoipa::path(
    post,
    path = "/v1/tenants",
    tag = "tenants",
    security(("admin" = [])),
    request_body = CreateTenant,
    responses((status = 201, description = "created; its first token is shown once", body = TenantCreated), BodyErrors, AdminOnly, Conflicting)
)]
async fn create_tenant(
    State(state): State<AppState>,
    p: Principal,
    Body(req): Body<CreateTenant>,
) -> ApiResult<(StatusCode, Json<TenantCreated>)> {
    admin(&p)?;
    input::name("tenant name", &req.name)?;
    let token = auth::generate(TokenKind::Api).map_err(|e| ApiError::Internal(e.to_string()))?;
    let hash = token.hash();
    let tenant = db(&state, move |s| {
        let at = now();
        s.create_tenant(
            &p.actor,
            &req.name,
            &hash,
            Some(at + DEFAULT_TENANT_TOKEN_TTL_S),
            at,
        )
    })
    .await?;
    Ok((StatusCode::CREATED, Json(TenantCreated { tenant, token })))
}

/// Deletes a tenant that owns no group, and its tokens.
#[utoipa::path(
    delete,
    path = "/v1/tenants/{tenant}",
    tag = "tenants",
    security(("admin" = [])),
    params(("tenant" = String, Path, description = "the tenant's name", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")),
    responses((status = 204, description = "deleted, with its tokens"), Invalid, AdminOnly, Missing, Conflicting)
)]
async fn delete_tenant(
    State(state): State<AppState>,
    p: Principal,
    Param(tenant): Param<String>,
) -> ApiResult<StatusCode> {
    admin(&p)?;
    input::name("tenant", &tenant)?;
    db(&state, move |s| s.delete_tenant(&p.actor, &tenant, now())).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// API tokens: ids and metadata, never a token.
#[utoipa::path(
    get,
    path = "/v1/tokens",
    tag = "tenants",
    security(("admin" = [])),
    responses((status = 200, description = "every token's metadata", body = Vec<TokenView>), AdminOnly)
)]
async fn list_tokens(
    State(state): State<AppState>,
    p: Principal,
) -> ApiResult<Json<Vec<TokenView>>> {
    admin(&p)?;
    Ok(Json(db(&state, |s| s.tokens()).await?))
}

/// Revokes a token by its id.
#[utoipa::path(
    delete,
    path = "/v1/tokens/{id}",
    tag = "tenants",
    security(("admin" = [])),
    params(("id" = String, Path, description = "the token's id: the first 16 hex digits of its SHA-256", pattern = "^[0-9a-f]{16}$")),
    responses((status = 204, description = "revoked"), Invalid, AdminOnly, Missing)
)]
async fn revoke_token(
    State(state): State<AppState>,
    p: Principal,
    Param(id): Param<String>,
) -> ApiResult<StatusCode> {
    admin(&p)?;
    db(&state, move |s| s.revoke_token(&p.actor, &id, now())).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Creates an API token; the role is always explicit.
#[utoipa::path(
    post,
    path = "/v1/tokens",
    tag = "tenants",
    security(("admin" = [])),
    request_body = CreateToken,
    responses((status = 201, description = "created; the token is shown once", body = TokenCreated), BodyErrors, AdminOnly, Missing)
)]
async fn create_token(
    State(state): State<AppState>,
    p: Principal,
    Body(req): Body<CreateToken>,
) -> ApiResult<(StatusCode, Json<TokenCreated>)> {
    admin(&p)?;
    // The scope is what the request says, never what an absent field implies.
    let role = match (req.role, req.tenant) {
        (TokenRole::Admin, None) => Role::Admin,
        (TokenRole::Admin, Some(_)) => {
            return Err(bad(
                "an admin token has no tenant: send `\"role\": \"admin\"` alone".into(),
            ));
        }
        (TokenRole::Tenant, Some(t)) => {
            input::name("tenant", &t)?;
            Role::Tenant(t)
        }
        (TokenRole::Tenant, None) => {
            return Err(bad(
                "a tenant token names its tenant: `\"tenant\": \"<name>\"`".into(),
            ));
        }
    };
    let ttl = match (req.ttl_s, &role) {
        (Some(t), _) => Some(input::seconds("ttl_s", t, 60, MAX_TOKEN_TTL_S)?),
        (None, Role::Tenant(_)) => Some(DEFAULT_TENANT_TOKEN_TTL_S),
        (None, Role::Admin) => Some(DEFAULT_ADMIN_TOKEN_TTL_S),
    };
    let token = auth::generate(TokenKind::Api).map_err(|e| ApiError::Internal(e.to_string()))?;
    let hash = token.hash();
    let at = now();
    let expires = ttl.map(|t| at + t);
    let id = auth::token_id(&hash);
    db(&state, move |s| {
        s.create_api_token(&p.actor, &role, &hash, expires, at)
    })
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(TokenCreated { token, id, expires }),
    ))
}

/// How long an admin token made through the API lives when the request does not say: one
/// day. (It also ends when the controller's own admin token is rotated.)
pub const DEFAULT_ADMIN_TOKEN_TTL_S: u64 = 86_400;
/// How long a tenant token lives when the request does not say: 90 days.
pub const DEFAULT_TENANT_TOKEN_TTL_S: u64 = 90 * 86_400;
/// The longest life a token may be given: ten years.
pub const MAX_TOKEN_TTL_S: u64 = 3650 * 86_400;

// ------------------------------------------------------------------ groups

fn groups() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_groups, create_group))
        .routes(routes!(get_group, delete_group))
        .routes(routes!(group_nodes))
        .routes(routes!(add_member))
        .routes(routes!(remove_member))
        .routes(routes!(move_server))
}

async fn change(
    state: &AppState,
    p: Principal,
    c: Change,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    let operation = db(state, move |s| s.change(&p.actor, &c, now())).await?;
    if operation.is_some() {
        let _ = state.events.try_send(Event::Changed);
    }
    Ok((StatusCode::ACCEPTED, Json(Accepted { operation })))
}

/// Groups (a tenant token sees its own).
#[utoipa::path(
    get,
    path = "/v1/groups",
    tag = "groups",
    security(("api" = [])),
    responses((status = 200, description = "groups this token may see", body = Vec<GroupView>), Authed)
)]
async fn list_groups(
    State(state): State<AppState>,
    p: Principal,
) -> ApiResult<Json<Vec<GroupView>>> {
    let all = db(&state, |s| s.groups()).await?;
    Ok(Json(
        all.into_iter()
            .filter(|g| p.can_read_tenant(&g.tenant))
            .collect(),
    ))
}

/// One group.
#[utoipa::path(
    get,
    path = "/v1/groups/{group}",
    tag = "groups",
    security(("api" = [])),
    params(("group" = String, Path, description = "the group's name", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")),
    responses((status = 200, description = "the group", body = GroupView), Authed, Missing)
)]
async fn get_group(
    State(state): State<AppState>,
    p: Principal,
    Param(group): Param<String>,
) -> ApiResult<Json<GroupView>> {
    let all = db(&state, |s| s.groups()).await?;
    // Another tenant's group answers exactly like a group that does not exist.
    all.into_iter()
        .find(|g| g.name == group && p.can_read_tenant(&g.tenant))
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no group `{group}`")))
}

/// A group's members with their liveness and the GPUs their agents reported.
///
/// Visible to whoever may see the group.
#[utoipa::path(
    get,
    path = "/v1/groups/{group}/nodes",
    tag = "groups",
    security(("api" = [])),
    params(("group" = String, Path, description = "the group's name", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")),
    responses((status = 200, description = "its members", body = Vec<NodeView>), Authed, Missing)
)]
async fn group_nodes(
    State(state): State<AppState>,
    p: Principal,
    Param(group): Param<String>,
) -> ApiResult<Json<Vec<NodeView>>> {
    let stale = state.stale_after_s;
    let (groups, servers, mut gpus) = db(&state, move |s| {
        Ok((s.groups()?, s.servers(now(), stale)?, s.gpus()?))
    })
    .await?;
    let g = groups
        .into_iter()
        .find(|g| g.name == group && p.can_read_tenant(&g.tenant))
        .ok_or_else(|| ApiError::NotFound(format!("no group `{group}`")))?;
    Ok(Json(
        g.members
            .iter()
            .map(|m| {
                let seen = servers.iter().find(|s| &s.name == m);
                NodeView {
                    name: m.clone(),
                    liveness: seen.map_or(Liveness::Never, |s| s.liveness),
                    last_seen: seen.and_then(|s| s.last_seen),
                    gpus: gpus.remove(m).unwrap_or_default(),
                }
            })
            .collect(),
    ))
}

/// Creates a group (a partition with a fresh P_Key).
#[utoipa::path(
    post,
    path = "/v1/groups",
    tag = "groups",
    security(("admin" = [])),
    request_body = CreateGroup,
    responses((status = 202, description = "accepted; the operation to poll", body = Accepted), BodyErrors, AdminOnly, Missing, Conflicting)
)]
async fn create_group(
    State(state): State<AppState>,
    p: Principal,
    Body(req): Body<CreateGroup>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    admin(&p)?;
    change(
        &state,
        p,
        Change::CreateGroup {
            name: req.name,
            tenant: req.tenant,
        },
    )
    .await
}

/// Deletes a group.
#[utoipa::path(
    delete,
    path = "/v1/groups/{group}",
    tag = "groups",
    security(("admin" = [])),
    params(("group" = String, Path, description = "the group's name", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")),
    responses((status = 202, description = "accepted; the operation to poll", body = Accepted), Invalid, AdminOnly, Missing, Conflicting)
)]
async fn delete_group(
    State(state): State<AppState>,
    p: Principal,
    Param(group): Param<String>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    admin(&p)?;
    change(&state, p, Change::DeleteGroup { group }).await
}

/// Adds a server to a group.
#[utoipa::path(
    post,
    path = "/v1/groups/{group}/members",
    tag = "groups",
    security(("admin" = [])),
    params(("group" = String, Path, description = "the group's name", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")),
    request_body = AddMember,
    responses((status = 202, description = "accepted; the operation to poll (absent when nothing changed)", body = Accepted), BodyErrors, AdminOnly, Missing, Conflicting)
)]
async fn add_member(
    State(state): State<AppState>,
    p: Principal,
    Param(group): Param<String>,
    Body(req): Body<AddMember>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    admin(&p)?;
    change(
        &state,
        p,
        Change::AddMember {
            group,
            server: req.server,
        },
    )
    .await
}

/// Removes a server from a group.
#[utoipa::path(
    delete,
    path = "/v1/groups/{group}/members/{server}",
    tag = "groups",
    security(("admin" = [])),
    params(("group" = String, Path, description = "the group's name", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$"), ("server" = String, Path, description = "the server's name (its host name)", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")),
    responses((status = 202, description = "accepted; the operation to poll (absent when nothing changed)", body = Accepted), Invalid, AdminOnly, Missing, Conflicting)
)]
async fn remove_member(
    State(state): State<AppState>,
    p: Principal,
    Param((group, server)): Param<(String, String)>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    admin(&p)?;
    change(&state, p, Change::RemoveMember { group, server }).await
}

/// Moves a server to another group in one step.
#[utoipa::path(
    post,
    path = "/v1/moves",
    tag = "groups",
    security(("admin" = [])),
    request_body = MoveServer,
    responses((status = 202, description = "accepted; the operation to poll (absent when nothing changed)", body = Accepted), BodyErrors, AdminOnly, Missing, Conflicting)
)]
async fn move_server(
    State(state): State<AppState>,
    p: Principal,
    Body(req): Body<MoveServer>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    admin(&p)?;
    change(
        &state,
        p,
        Change::Move {
            server: req.server,
            to: req.to,
        },
    )
    .await
}

// ------------------------------------------------------------------ operations, audit, status

fn records() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_operations))
        .routes(routes!(get_operation))
        .routes(routes!(list_audit))
        .routes(routes!(status))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct OpsQuery {
    /// Only the operations not yet applied.
    #[serde(default)]
    pending: bool,
}

/// Operations, newest first (`?pending=true`: only those not yet applied).
#[utoipa::path(
    get,
    path = "/v1/operations",
    tag = "records",
    security(("admin" = [])),
    params(OpsQuery),
    responses((status = 200, description = "operations, newest first", body = Vec<OperationView>), Invalid, AdminOnly)
)]
async fn list_operations(
    State(state): State<AppState>,
    p: Principal,
    QueryParams(q): QueryParams<OpsQuery>,
) -> ApiResult<Json<Vec<OperationView>>> {
    admin(&p)?;
    Ok(Json(db(&state, move |s| s.operations(q.pending)).await?))
}

/// One operation.
#[utoipa::path(
    get,
    path = "/v1/operations/{id}",
    tag = "records",
    security(("admin" = [])),
    params(("id" = i64, Path, description = "the operation's id")),
    responses((status = 200, description = "the operation", body = OperationView), Invalid, AdminOnly, Missing)
)]
async fn get_operation(
    State(state): State<AppState>,
    p: Principal,
    Param(id): Param<i64>,
) -> ApiResult<Json<OperationView>> {
    admin(&p)?;
    Ok(Json(db(&state, move |s| s.operation(id)).await?))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// The most entries to return (default 100, at most 10 000).
    limit: Option<usize>,
}

/// The audit log, oldest first (`?limit=N`, default 100, at most 10 000).
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "records",
    security(("admin" = [])),
    params(AuditQuery),
    responses((status = 200, description = "audit entries, oldest first", body = Vec<AuditEntry>), Invalid, AdminOnly)
)]
async fn list_audit(
    State(state): State<AppState>,
    p: Principal,
    QueryParams(q): QueryParams<AuditQuery>,
) -> ApiResult<Json<Vec<AuditEntry>>> {
    admin(&p)?;
    let limit = q.limit.unwrap_or(100).min(10_000);
    Ok(Json(db(&state, move |s| s.audit(limit)).await?))
}

/// Desired against observed, and the drift check's findings.
#[utoipa::path(
    get,
    path = "/v1/status",
    tag = "records",
    security(("admin" = [])),
    responses((status = 200, description = "desired against observed", body = StatusView), AdminOnly)
)]
async fn status(State(state): State<AppState>, p: Principal) -> ApiResult<Json<StatusView>> {
    admin(&p)?;
    let stale = state.stale_after_s;
    let mut view = db(&state, move |s| s.status(now(), stale)).await?;
    view.delivers = state.delivers;
    view.drift = state
        .drift
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(Json(view))
}
