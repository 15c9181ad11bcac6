//! The Leases page: the provider's free pool, the leases this viewer may see (who holds
//! which nodes until when), the queue, and for a tenant a form to request nodes and a
//! button to release each of its leases.
//!
//! Everything goes through the controller's own lease code, not a copy: the page is
//! [`weft_controller::lease::list`] of the loaded book (the same answer as
//! `GET /v1/leases` for the same principal), and a request or release is
//! [`weft_controller::lease::Leases::request`] / [`weft_controller::lease::Leases::release`]
//! as the session's principal, so the tenant scope is the API's: another tenant's lease is
//! neither listed nor released (it is refused as one that does not exist). Every POST
//! carries the session's CSRF token; every refusal is audited under the session's actor
//! (`console.lease.request`, `console.lease.release`).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use maud::{Markup, html};
use serde::Deserialize;
use weft_controller::lease::LeaseError;
use weft_controller::lease::model::{LeaseList, LeaseRequest, LeaseView};
use weft_lease::Refusal;

use crate::pages::Nav;
use crate::{Console, Viewer, acting_viewer, audit_refusal, page_error, page_viewer};

/// The Leases routes, merged into [`crate::router`].
pub(crate) fn routes() -> Router<Console> {
    Router::new()
        .route("/console/leases", get(leases_page).post(request))
        .route("/console/leases/{id}/release", post(release))
}

/// Unix seconds as `2026-01-31 12:00:00Z`, as the CLI's tables print them.
fn utc(t: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t);
    humantime::format_rfc3339_seconds(at)
        .to_string()
        .replacen('T', " ", 1)
}

/// `2 h 5 min`, `40 s`.
fn span(s: u64) -> String {
    match s {
        s if s >= 3600 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// Whether the lease can still be given back (not ended, released or refused).
fn open(l: &LeaseView) -> bool {
    !matches!(l.phase.as_str(), "ended" | "released" | "refused")
}

/// The Leases page for a viewer: `tenant` whether it may request, `csrf` for its forms.
pub fn page(list: &LeaseList, tenant: bool, csrf: &str, now: u64) -> Markup {
    let by_id = |id: u64| list.leases.iter().find(|l| l.id == id);
    html! {
        h1 { "Leases" }
        div.cards {
            div.card { b #pool-size { (list.pool_size) } "nodes in the free pool" }
            div.card { b #pool-free class=(if list.pool_free == 0 { "warn" } else { "ok" }) { (list.pool_free) } "free now" }
            div.card { b #queue-len { (list.queue.len()) } "waiting in the queue" }
        }
        @if tenant {
            h2 { "Request nodes" }
            form #lease-form method="post" action="/console/leases" {
                input type="hidden" name="csrf" value=(csrf);
                label for="lease-nodes" { "Nodes" }
                input #lease-nodes type="number" name="nodes" min="1" max="64" value="1" required;
                label for="lease-minutes" { "For (minutes)" }
                input #lease-minutes type="number" name="minutes" min="1" max="100000" value="60" required;
                label for="lease-same-switch" { input #lease-same-switch type="checkbox" name="same_switch" value="on"; " every node under one leaf switch" }
                button.primary #lease-request type="submit" { "Request" }
            }
            p.muted { "Granted now if the pool and your quota allow it, queued first come, first served if not, or refused with the reason. Nodes move into your group, each move verified on the fabric, and back to the pool at the end." }
        }
        h2 { "Leases" }
        table #leases {
            caption { "Who holds which nodes until when; newest first" }
            thead { tr {
                th scope="col" { "#" } th scope="col" { "Tenant" } th scope="col" { "State" }
                th scope="col" { "Nodes" } th scope="col" { "From" } th scope="col" { "Until" }
                th scope="col" { "Note" } th scope="col" { "Action" }
            } }
            tbody {
                @if list.leases.is_empty() { tr { td colspan="8" { "None." } } }
                @for l in &list.leases {
                    tr data-lease=(l.id) data-phase=(l.phase) data-tenant=(l.tenant) {
                        td { (l.id) } td { (l.tenant) }
                        td { span class=(match l.phase.as_str() { "active" => "ok", "ending" | "queued" | "waiting" => "warn", "refused" => "stale", _ => "muted" }) { (l.phase) }
                             @if let Some(p) = l.position { " #" (p) } }
                        td { @if l.nodes.is_empty() { (l.nodes_wanted) " wanted" } @else { (l.nodes.join(", ")) } }
                        td { @match l.start { Some(s) => { (utc(s)) }, None => { "not before " (utc(l.not_before)) } } }
                        td { @match l.end {
                            Some(e) => { (utc(e)) @if e > now && open(l) { br; span.muted { "in " (span(e - now)) } } }
                            None => { "for " (span(l.duration_s)) }
                        } }
                        td { (l.reason.as_deref().unwrap_or("")) }
                        td { @if open(l) {
                            form.inline method="post" action=(format!("/console/leases/{}/release", l.id)) {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" aria-label=(format!("Release lease {}", l.id)) { "Release" }
                            }
                        } }
                    }
                }
            }
        }
        h2 { "Queue" }
        @if list.queue.is_empty() { p #queue { "Nobody waits." } } @else {
            ol #queue { @for id in &list.queue { li data-lease=(id) {
                "lease " (id)
                @if let Some(l) = by_id(*id) { ": " (l.tenant) " wants " (l.nodes_wanted) " node(s) for " (span(l.duration_s))
                    @if let Some(r) = &l.reason { " (" (r) ")" } }
            } } }
        }
        @if !list.pool.is_empty() {
            h2 { "Free pool" }
            table #pool {
                caption { "Every node of the provider's pool, its leaf switch and the lease that holds it" }
                thead { tr { th scope="col" { "Node" } th scope="col" { "Leaf switch" } th scope="col" { "Held by" } } }
                tbody { @for n in &list.pool { tr data-node=(n.name) {
                    th scope="row" { (n.name) }
                    td { (n.switch.as_deref().unwrap_or("unknown")) }
                    td { @match n.lease { Some(id) => { "lease " (id) @if let Some(l) = by_id(id) { " (" (l.tenant) @if let Some(e) = l.end { ", until " (utc(e)) } ")" } }, None => { span.ok { "free" } } } }
                } } }
            }
        }
    }
}

async fn book_list(c: &Console, v: &Viewer) -> Result<LeaseList, Response> {
    match c.app.leases.book().await {
        Ok(book) => Ok(weft_controller::lease::list(&book, &v.principal)),
        Err(e) => {
            tracing::warn!(error = %e, "console: the lease book could not be loaded");
            Err(page_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the leases could not be read; see the controller's log",
            ))
        }
    }
}

async fn leases_page(State(c): State<Console>, headers: HeaderMap) -> Result<Response, Response> {
    let v = page_viewer(&c, &headers).await?;
    let list = book_list(&c, &v).await?;
    let tenant = !v.principal.is_admin();
    Ok(v.page(
        "Leases",
        Nav::Leases,
        page(&list, tenant, &v.session.csrf, crate::now()),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestForm {
    #[serde(default)]
    csrf: Option<String>,
    nodes: u32,
    minutes: u64,
    #[serde(default)]
    same_switch: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseForm {
    #[serde(default)]
    csrf: Option<String>,
}

/// The answer to a lease call the loop refused: the status the API gives it, audited.
async fn refused(
    c: &Console,
    v: &Viewer,
    action: &'static str,
    subject: String,
    e: LeaseError,
) -> Response {
    let (status, why) = match &e {
        LeaseError::Forbidden(w) => (StatusCode::FORBIDDEN, w.clone()),
        LeaseError::Refused(Refusal::NotFound(id)) => (
            StatusCode::NOT_FOUND,
            format!("there is no lease {id} of yours"),
        ),
        LeaseError::Refused(r @ Refusal::Invalid(_)) => (StatusCode::BAD_REQUEST, r.to_string()),
        LeaseError::Refused(r) => (StatusCode::CONFLICT, r.to_string()),
        LeaseError::Store(_) | LeaseError::Task(_) => {
            tracing::warn!(error = %e, "console: a lease step failed");
            return page_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the lease could not be changed; see the controller's log",
            );
        }
    };
    audit_refusal(
        c,
        v.principal.actor.clone(),
        action,
        subject,
        format!("console: {why}"),
    )
    .await;
    page_error(status, &why)
}

async fn request(
    State(c): State<Console>,
    headers: HeaderMap,
    f: Result<Form<RequestForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, Response> {
    let Form(f) = f.map_err(|e| {
        page_error(
            StatusCode::BAD_REQUEST,
            &format!("the lease form: {e} (nodes and minutes are whole numbers from 1)"),
        )
    })?;
    let subject = format!("{} node(s) for {} min", f.nodes, f.minutes);
    let v = acting_viewer(
        &c,
        &headers,
        f.csrf.as_deref(),
        "console.lease.request",
        &subject,
    )
    .await?;
    let req = LeaseRequest {
        nodes: f.nodes,
        duration_s: f.minutes.saturating_mul(60),
        start: None,
        same_switch: f.same_switch.is_some(),
    };
    match c.app.leases.request(&v.principal, req).await {
        Ok(_) => Ok(Redirect::to("/console/leases").into_response()),
        Err(e) => Err(refused(&c, &v, "console.lease.request", subject, e).await),
    }
}

async fn release(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<u64>,
    Form(f): Form<ReleaseForm>,
) -> Result<Response, Response> {
    let subject = format!("lease {id}");
    let v = acting_viewer(
        &c,
        &headers,
        f.csrf.as_deref(),
        "console.lease.release",
        &subject,
    )
    .await?;
    match c.app.leases.release(&v.principal, id).await {
        Ok(_) => Ok(Redirect::to("/console/leases").into_response()),
        Err(e) => Err(refused(&c, &v, "console.lease.release", subject, e).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_controller::lease::model::PoolNodeView;

    fn lease(id: u64, tenant: &str, phase: &str, nodes: &[&str]) -> LeaseView {
        LeaseView {
            id,
            tenant: tenant.into(),
            nodes_wanted: 1,
            duration_s: 3600,
            submitted: 100,
            not_before: 100,
            same_switch: false,
            phase: phase.into(),
            position: (phase == "queued").then_some(1),
            start: (!nodes.is_empty()).then_some(100),
            end: (!nodes.is_empty()).then_some(3700),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            reason: (phase == "queued").then(|| "waits for free nodes".into()),
        }
    }

    #[test]
    fn the_page_shows_holders_until_when_the_queue_and_release_only_for_open_leases() {
        let list = LeaseList {
            leases: vec![
                lease(3, "bob", "queued", &[]),
                lease(2, "alice", "active", &["node4"]),
                lease(1, "alice", "released", &["node3"]),
            ],
            queue: vec![3],
            pool: vec![PoolNodeView {
                name: "node4".into(),
                switch: Some("leaf1".into()),
                lease: Some(2),
            }],
            pool_size: 1,
            pool_free: 0,
        };
        let h = page(&list, true, "tok", 200).into_string();
        assert!(h.contains(r#"id="lease-form""#), "a tenant gets the form");
        assert!(h.contains("1970-01-01 01:01:40Z"), "until when: {h}");
        assert!(h.contains("in 58 min"), "{h}");
        assert!(h.contains("/console/leases/2/release") && h.contains("/console/leases/3/release"));
        assert!(
            !h.contains("/console/leases/1/release"),
            "a released lease has no button"
        );
        assert!(
            h.contains("lease 3: bob wants 1 node(s) for 1 h 0 min"),
            "{h}"
        );
        assert!(
            h.contains("lease 2 (alice, until 1970-01-01 01:01:40Z)"),
            "{h}"
        );
        let h = page(&list, false, "tok", 200).into_string();
        assert!(
            !h.contains(r#"id="lease-form""#),
            "an admin does not request"
        );
    }
}
