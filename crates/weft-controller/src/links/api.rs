//! The link routes: an admin stores a run of measurements (`weft bench p2p --report-to`,
//! `weft bench collectives --report-to`, `weft doctor --report-to`); anyone with a token
//! reads the runs and what is flagged, a tenant only the links whose both ends are its
//! nodes (the members of its groups).

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{LinkHealthView, LinkRunIn, LinkRunView, MAX_LIST, SlowPair};
use crate::api::{ApiResult, AppState, Body, QueryParams, admin, bad, db, now};
use crate::auth::{Principal, Role};
use crate::openapi::{AdminOnly, Authed, BodyErrors, Invalid};

/// The link routes, merged into the API's router and document.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_runs, add_run))
        .routes(routes!(link_health))
}

/// What the controller made of a stored run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LinkRunAccepted {
    /// The run as stored.
    pub run: LinkRunView,
    /// Its links that failed or ran below their run's peers.
    pub slow: Vec<SlowPair>,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct RunsQuery {
    /// The most runs to return, newest first (default 20, at most 200).
    limit: Option<usize>,
}

/// The nodes a principal may see links of: `None` for an admin (every node).
async fn visible_nodes(state: &AppState, p: &Principal) -> ApiResult<Option<Vec<String>>> {
    match &p.role {
        Role::Admin => Ok(None),
        Role::Tenant(t) => {
            let t = t.clone();
            let groups = db(state, |s| s.groups()).await?;
            Ok(Some(
                groups
                    .into_iter()
                    .filter(|g| g.tenant == t)
                    .flat_map(|g| g.members)
                    .collect(),
            ))
        }
    }
}

fn visible_runs(runs: Vec<LinkRunView>, nodes: Option<&[String]>) -> Vec<LinkRunView> {
    match nodes {
        None => runs,
        Some(n) => runs.iter().filter_map(|r| super::among(r, n)).collect(),
    }
}

/// Stores a run of link measurements (an admin token); every link is checked before
/// anything is stored.
#[utoipa::path(
    post,
    path = "/v1/link-results",
    tag = "links",
    security(("admin" = [])),
    request_body = LinkRunIn,
    responses((status = 200, description = "the run as stored, and its links below their peers", body = LinkRunAccepted), BodyErrors, AdminOnly)
)]
async fn add_run(
    State(state): State<AppState>,
    p: Principal,
    Body(run): Body<LinkRunIn>,
) -> ApiResult<Json<LinkRunAccepted>> {
    admin(&p)?;
    super::check_run(&run).map_err(|e| bad(e.to_string()))?;
    let actor = p.actor.clone();
    let stored = db(&state, move |s| s.add_link_run(&actor, &run, now())).await?;
    let slow = super::slow_pairs(&stored);
    tracing::info!(
        run = stored.id,
        source = stored.source.as_str(),
        links = stored.results.len(),
        slow = slow.len(),
        "link results stored"
    );
    Ok(Json(LinkRunAccepted { run: stored, slow }))
}

/// The newest runs of link measurements, newest first (`?limit=N`); a tenant sees only
/// the links among its nodes, and no run without one.
#[utoipa::path(
    get,
    path = "/v1/link-results",
    tag = "links",
    security(("api" = [])),
    params(RunsQuery),
    responses((status = 200, description = "runs, newest first", body = Vec<LinkRunView>), Invalid, Authed)
)]
async fn list_runs(
    State(state): State<AppState>,
    p: Principal,
    QueryParams(q): QueryParams<RunsQuery>,
) -> ApiResult<Json<Vec<LinkRunView>>> {
    let limit = q.limit.unwrap_or(20).min(MAX_LIST);
    let nodes = visible_nodes(&state, &p).await?;
    let runs = db(&state, move |s| s.link_runs(limit)).await?;
    Ok(Json(visible_runs(runs, nodes.as_deref())))
}

/// Every link flagged now: RDMA NICs the agents report below their peers' speed or below
/// `expected_link_gbps`, and measured links of the newest run of each source that failed
/// or ran below 70% of their run's median. A tenant sees those of its nodes only.
#[utoipa::path(
    get,
    path = "/v1/link-health",
    tag = "links",
    security(("api" = [])),
    responses((status = 200, description = "the links flagged now", body = LinkHealthView), Authed)
)]
async fn link_health(
    State(state): State<AppState>,
    p: Principal,
) -> ApiResult<Json<LinkHealthView>> {
    let nodes = visible_nodes(&state, &p).await?;
    let stale = state.stale_after_s;
    let (servers, runs) = db(&state, move |s| {
        Ok((s.servers(now(), stale)?, s.link_runs(MAX_LIST)?))
    })
    .await?;
    let mut h = super::health(&servers, &runs, state.expected_link_gbps);
    if let Some(n) = &nodes {
        // Judged among every link (a tenant's half-rate link is half of everyone's), shown
        // only where both ends are the tenant's.
        h.nics.retain(|x| n.contains(&x.node));
        h.pairs.retain(|x| n.contains(&x.src) && n.contains(&x.dst));
    }
    Ok(Json(h))
}
