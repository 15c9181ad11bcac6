//! The lease routes: a tenant requests, lists, shows, extends and releases its leases; an
//! admin sees every lease and the pool and sets the quotas; an agent reads the warnings
//! for its server. Every answer comes from one step of the lease loop
//! ([`super::Leases::step`]) or from the book it loads.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use utoipa_axum::{router::OpenApiRouter, routes};
use weft_lease::{Quota, Refusal};

use super::model::*;
use super::{LeaseError, decision_view, tenant_of, view};
use crate::api::{Agent, ApiError, ApiResult, AppState, Body, Param, admin, bad, db, now};
use crate::auth::Principal;
use crate::model::ErrorBody;
use crate::openapi::{AdminOnly, Authed, BodyErrors, Conflicting, Invalid, Missing};

/// The lease routes, merged into the API's router and document.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_leases, request_lease))
        .routes(routes!(get_lease))
        .routes(routes!(extend_lease))
        .routes(routes!(release_lease))
        .routes(routes!(list_quotas))
        .routes(routes!(set_quota, delete_quota))
        .routes(routes!(notices))
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        match e {
            LeaseError::Refused(Refusal::NotFound(id)) => {
                ApiError::NotFound(format!("no lease {id}"))
            }
            LeaseError::Refused(r @ (Refusal::Phase { .. } | Refusal::Quota(_))) => {
                ApiError::Conflict(r.to_string())
            }
            LeaseError::Refused(r @ Refusal::Invalid(_)) => ApiError::BadRequest(r.to_string()),
            LeaseError::Store(s) => s.into(),
            e @ LeaseError::Task(_) => ApiError::Internal(e.to_string()),
            LeaseError::Forbidden(why) => ApiError::Forbidden(why),
        }
    }
}

fn accepted(stepped: super::Stepped<u64>, at: u64) -> ApiResult<Json<LeaseAccepted>> {
    let id = stepped.value;
    let lease = stepped
        .book
        .leases
        .get(&id)
        .map(|l| view(&stepped.book, l))
        .ok_or_else(|| ApiError::Internal(format!("lease {id} vanished in its own step")))?;
    Ok(Json(LeaseAccepted {
        lease,
        decisions: stepped
            .decisions
            .iter()
            .map(|d| decision_view(at, d))
            .collect(),
        operations: stepped.operations,
    }))
}

/// The caller's leases (every lease for an admin), the queue and the pool.
#[utoipa::path(
    get,
    path = "/v1/leases",
    tag = "leases",
    security(("api" = [])),
    responses((status = 200, description = "leases this token may see, the queue and the pool", body = LeaseList), Authed)
)]
async fn list_leases(State(state): State<AppState>, p: Principal) -> ApiResult<Json<LeaseList>> {
    let book = state.leases.book().await?;
    Ok(Json(super::list(&book, &p)))
}

/// Requests nodes from the pool (a tenant token): granted now, queued with its position,
/// waiting for its start, or refused with the reason.
#[utoipa::path(
    post,
    path = "/v1/leases",
    tag = "leases",
    security(("api" = [])),
    request_body = LeaseRequest,
    responses((status = 200, description = "the lease, what was decided and the operations of its moves", body = LeaseAccepted), BodyErrors, Authed, (status = 403, description = "an admin token: leases are requested by a tenant", body = ErrorBody))
)]
async fn request_lease(
    State(state): State<AppState>,
    p: Principal,
    Body(req): Body<LeaseRequest>,
) -> ApiResult<Json<LeaseAccepted>> {
    let stepped = state.leases.request(&p, req).await?;
    accepted(stepped, now())
}

/// One lease with every decision about it.
#[utoipa::path(
    get,
    path = "/v1/leases/{id}",
    tag = "leases",
    security(("api" = [])),
    params(("id" = u64, Path, description = "the lease's number")),
    responses((status = 200, description = "the lease and its decisions", body = LeaseDetail), Invalid, Authed, Missing)
)]
async fn get_lease(
    State(state): State<AppState>,
    p: Principal,
    Param(id): Param<u64>,
) -> ApiResult<Json<LeaseDetail>> {
    let book = state.leases.book().await?;
    // Another tenant's lease answers exactly like one that does not exist.
    let lease = book
        .leases
        .get(&id)
        .filter(|l| p.can_read_tenant(&l.tenant))
        .map(|l| view(&book, l))
        .ok_or_else(|| ApiError::NotFound(format!("no lease {id}")))?;
    let decisions = db(&state, move |s| s.lease_decisions(id)).await?;
    Ok(Json(LeaseDetail { lease, decisions }))
}

/// Extends a lease that holds its nodes (its tenant or an admin); a warning given is
/// withdrawn.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/extend",
    tag = "leases",
    security(("api" = [])),
    params(("id" = u64, Path, description = "the lease's number")),
    request_body = ExtendLease,
    responses((status = 200, description = "the lease with its new end", body = LeaseAccepted), BodyErrors, Authed, Missing, Conflicting)
)]
async fn extend_lease(
    State(state): State<AppState>,
    p: Principal,
    Param(id): Param<u64>,
    Body(req): Body<ExtendLease>,
) -> ApiResult<Json<LeaseAccepted>> {
    let tenant = tenant_of(&p);
    let stepped = state
        .leases
        .step(&p.actor, move |b, now| {
            b.extend(now, id, tenant.as_deref(), req.by_s)
                .map(|d| (id, d))
        })
        .await?;
    accepted(stepped, now())
}

/// Gives a lease back (its tenant or an admin): a queued one leaves the queue, one that
/// holds nodes moves them back to the pool now.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/release",
    tag = "leases",
    security(("api" = [])),
    params(("id" = u64, Path, description = "the lease's number")),
    responses((status = 200, description = "the lease, released, and the operations of its moves", body = LeaseAccepted), Invalid, Authed, Missing, Conflicting)
)]
async fn release_lease(
    State(state): State<AppState>,
    p: Principal,
    Param(id): Param<u64>,
) -> ApiResult<Json<LeaseAccepted>> {
    let stepped = state.leases.release(&p, id).await?;
    accepted(stepped, now())
}

/// Lease quotas and their use (a tenant sees its own).
#[utoipa::path(
    get,
    path = "/v1/lease-quotas",
    tag = "leases",
    security(("api" = [])),
    responses((status = 200, description = "quotas this token may see", body = Vec<LeaseQuotaView>), Authed)
)]
async fn list_quotas(
    State(state): State<AppState>,
    p: Principal,
) -> ApiResult<Json<Vec<LeaseQuotaView>>> {
    let book = state.leases.book().await?;
    let at = now();
    Ok(Json(
        book.quotas
            .iter()
            .filter(|(t, _)| p.can_read_tenant(t))
            .map(|(t, q)| LeaseQuotaView {
                tenant: t.clone(),
                max_nodes: q.max_nodes,
                node_seconds: q.node_seconds,
                period_s: q.period_s,
                held_nodes: book.held_by(t),
                used_node_seconds: book.used(t, at),
            })
            .collect(),
    ))
}

/// Sets a tenant's lease quota.
#[utoipa::path(
    put,
    path = "/v1/lease-quotas/{tenant}",
    tag = "leases",
    security(("admin" = [])),
    params(("tenant" = String, Path, description = "the tenant's name", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")),
    request_body = SetLeaseQuota,
    responses((status = 204, description = "set"), BodyErrors, AdminOnly, Missing)
)]
async fn set_quota(
    State(state): State<AppState>,
    p: Principal,
    Param(tenant): Param<String>,
    Body(req): Body<SetLeaseQuota>,
) -> ApiResult<StatusCode> {
    admin(&p)?;
    crate::input::name("tenant", &tenant)?;
    if req.period_s == 0 {
        return Err(bad(
            "period_s: a quota period needs at least one second".into()
        ));
    }
    let q = Quota {
        max_nodes: req.max_nodes,
        node_seconds: req.node_seconds,
        period_s: req.period_s,
    };
    db(&state, move |s| {
        s.set_lease_quota(&p.actor, &tenant, Some(&q), now())
    })
    .await?;
    // A queued lease may fit now.
    let _ = state
        .leases
        .step("controller", |b, now| Ok(((), b.tick(now))))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Removes a tenant's lease quota: it cannot lease any more (its live leases run on).
#[utoipa::path(
    delete,
    path = "/v1/lease-quotas/{tenant}",
    tag = "leases",
    security(("admin" = [])),
    params(("tenant" = String, Path, description = "the tenant's name", pattern = "^[A-Za-z_][A-Za-z0-9_.-]{0,30}$")),
    responses((status = 204, description = "removed"), Invalid, AdminOnly, Missing)
)]
async fn delete_quota(
    State(state): State<AppState>,
    p: Principal,
    Param(tenant): Param<String>,
) -> ApiResult<StatusCode> {
    admin(&p)?;
    crate::input::name("tenant", &tenant)?;
    db(&state, move |s| {
        s.set_lease_quota(&p.actor, &tenant, None, now())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The warnings for this agent's server: leases that end on it, and when.
#[utoipa::path(
    get,
    path = "/v1/agents/notices",
    tag = "agents",
    security(("agent" = [])),
    responses((status = 200, description = "leases ending on this server", body = Vec<LeaseNotice>), Authed)
)]
async fn notices(
    State(state): State<AppState>,
    Agent(server): Agent,
) -> ApiResult<Json<Vec<LeaseNotice>>> {
    Ok(Json(db(&state, move |s| s.lease_notices(&server)).await?))
}
