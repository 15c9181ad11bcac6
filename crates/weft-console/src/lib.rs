//! The controller's web console: server-rendered pages (maud templates) on the
//! controller's own listener, with its TLS and its API tokens, and htmx (built into the
//! binary) for the live parts: the nodes table refreshes itself, a move is previewed as
//! the partitions-file diff it will make, then followed over server-sent events until it
//! is verified on the fabric or fails with its reason.
//!
//! It is for: looking (Overview, Partitions, History, `/docs`) and one action (a move),
//! with the same roles as the API: an admin sees and moves everything; a tenant sees its
//! own groups and their nodes, and is refused every change, as the API refuses it. It is
//! not for: any state of its own beyond login sessions ([`session`], kept in the store so
//! that they survive a restart); everything shown is
//! read from the controller's store at each request, and a move is the store's
//! [`Change::Move`], exactly as `POST /v1/moves` makes it.
//!
//! Security: a token is given once, in the login form's body; the browser then holds a
//! random session id in an `HttpOnly; Secure; SameSite=Strict` cookie (never a token, never
//! in a URL). Every state-changing request carries the session's CSRF token. Refusals of
//! a live or ended session (wrong role, another tenant's node, no CSRF token, a cookie
//! replayed after logout) are written to the audit log; a made-up cookie is refused
//! without one. Pages are sent with a Content-Security-Policy that allows only the
//! console's own scripts and styles.
//!
//! ```no_run
//! # fn demo(mut ctl: weft_controller::Controller) {
//! let routes = weft_console::router(ctl.state(), weft_console::ConsoleConfig::default());
//! ctl.mount(routes);
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod assets;
pub mod leases;
pub mod links;
pub mod pages;
pub mod session;
pub mod sms;
pub mod view;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use maud::Markup;
use serde::Deserialize;
use weft_controller::api::AppState;
use weft_controller::auth::{Principal, Role, Secret};
use weft_controller::model::OpState;
use weft_controller::store::{AuditLine, Change, Store, StoreError};

use crate::pages::{Nav, Who};
use crate::session::{Lookup, Session};
use crate::view::HistoryFilter;

/// The console's knobs.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// How long a followed operation may stay pending before the page says it failed.
    pub follow_limit: Duration,
    /// How often a followed operation is looked at.
    pub follow_every: Duration,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            follow_limit: Duration::from_secs(120),
            follow_every: Duration::from_millis(100),
        }
    }
}

#[derive(Clone)]
struct Console {
    app: AppState,
    cfg: ConsoleConfig,
}

/// The console's routes (`/`, `/console/...`, `/docs`), to [`weft_controller::Controller::mount`].
pub fn router(app: AppState, cfg: ConsoleConfig) -> Router {
    let state = Console { app, cfg };
    Router::new()
        .route("/", get(|| async { Redirect::to("/console") }))
        .route("/console", get(overview))
        .route("/console/nodes", get(nodes_fragment))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/partitions", get(partitions))
        .route("/console/move", get(move_page).post(move_confirm))
        .route("/console/move/preview", post(move_preview))
        .route("/console/operations/{id}/events", get(follow_events))
        .route("/console/history", get(history))
        .route("/console/assets/{name}", get(asset))
        .route("/docs", get(docs))
        .route("/console/links", get(links::links_page))
        .merge(leases::routes())
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(state)
}

/// The Content-Security-Policy and friends on every console answer.
async fn secure_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

fn now() -> u64 {
    weft_controller::unix_now()
}

/// `[controller] expected_link_gbps` in Mb/s, as the link checks take it.
fn expected_mbps(c: &Console) -> Option<u32> {
    c.app
        .expected_link_gbps
        .and_then(weft_controller::links::gbps_to_mbps)
}

/// Runs a store call off the async threads.
async fn db<T: Send + 'static>(
    c: &Console,
    f: impl FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Response> {
    let store = c.app.store.clone();
    match tokio::task::spawn_blocking(move || f(&*store)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "console: store call failed");
            Err(page_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the store failed; see the controller's log",
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "console: store task failed");
            Err(page_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the store failed; see the controller's log",
            ))
        }
    }
}

fn page_error(status: StatusCode, why: &str) -> Response {
    (
        status,
        pages::layout("Error", Nav::None, None, pages::refused(why)),
    )
        .into_response()
}

/// A logged-in viewer.
struct Viewer {
    session_id: String,
    session: Session,
    principal: Principal,
}

impl Viewer {
    fn who(&self) -> Who<'_> {
        Who {
            label: match &self.principal.role {
                Role::Admin => "admin".into(),
                Role::Tenant(t) => format!("tenant {t}"),
            },
            csrf: &self.session.csrf,
            admin: self.principal.is_admin(),
        }
    }

    fn page(&self, title: &str, nav: Nav, body: Markup) -> Response {
        pages::layout(title, nav, Some(&self.who()), body).into_response()
    }
}

/// Why a request has no viewer.
enum NoViewer {
    /// No cookie, or one this server never made: log in.
    Anonymous,
    /// A session that ended (logout, expiry, a revoked token): its actor.
    Ended(String),
}

async fn viewer(c: &Console, headers: &HeaderMap) -> Result<Result<Viewer, NoViewer>, Response> {
    let Some(id) = session::cookie_id(headers) else {
        return Ok(Err(NoViewer::Anonymous));
    };
    let key = id.clone();
    let session = match db(c, move |s| session::get(s, &key, now())).await? {
        Lookup::Live(s) => s,
        Lookup::Ended(actor) => return Ok(Err(NoViewer::Ended(actor))),
        Lookup::Unknown => return Ok(Err(NoViewer::Anonymous)),
    };
    let hash = session.token_hash.clone();
    match db(c, move |s| s.principal(&hash, now())).await? {
        Some(principal) => Ok(Ok(Viewer {
            session_id: id,
            session,
            principal,
        })),
        None => {
            // The token was revoked or ran out: the session ends with it.
            db(c, move |s| session::end(s, &id, now())).await?;
            Ok(Err(NoViewer::Ended(session.actor)))
        }
    }
}

/// The viewer of a page (GET); anyone else is sent to the login form.
async fn page_viewer(c: &Console, headers: &HeaderMap) -> Result<Viewer, Response> {
    match viewer(c, headers).await? {
        Ok(v) => Ok(v),
        Err(_) => Err(Redirect::to("/console/login").into_response()),
    }
}

/// Appends an audit line for a refused console request.
async fn audit_refusal(
    c: &Console,
    actor: String,
    action: &'static str,
    subject: String,
    detail: String,
) {
    let r = db(c, move |s| {
        s.audit_append(
            &AuditLine {
                actor: &actor,
                action,
                subject: &subject,
                diff: "",
                outcome: "refused",
                detail: &detail,
            },
            now(),
        )
    })
    .await;
    if r.is_err() {
        tracing::warn!("console: a refusal could not be audited");
    }
}

/// The viewer of a state-changing request, with its CSRF token checked; every refusal
/// of a known session is audited.
async fn acting_viewer(
    c: &Console,
    headers: &HeaderMap,
    csrf: Option<&str>,
    action: &'static str,
    subject: &str,
) -> Result<Viewer, Response> {
    match viewer(c, headers).await? {
        Ok(v) => {
            if csrf.is_some_and(|t| session::same_token(t, &v.session.csrf)) {
                Ok(v)
            } else {
                audit_refusal(
                    c,
                    v.principal.actor.clone(),
                    action,
                    subject.to_string(),
                    "console: the request carries no valid CSRF token".into(),
                )
                .await;
                Err(page_error(
                    StatusCode::FORBIDDEN,
                    "this form is missing its CSRF token or it is not this session's; reload the page and try again",
                ))
            }
        }
        Err(NoViewer::Ended(actor)) => {
            audit_refusal(
                c,
                actor,
                action,
                subject.to_string(),
                "console: a session that has ended (logged out, expired or its token revoked) was presented".into(),
            )
            .await;
            Err(page_error(
                StatusCode::UNAUTHORIZED,
                "this session has ended; log in again",
            ))
        }
        Err(NoViewer::Anonymous) => Err(page_error(StatusCode::UNAUTHORIZED, "log in first")),
    }
}

async fn asset(Path(name): Path<String>) -> Response {
    assets::serve(&name)
}

async fn login_page(State(c): State<Console>, headers: HeaderMap) -> Result<Response, Response> {
    if let Ok(Ok(_)) = viewer(&c, &headers).await {
        return Ok(Redirect::to("/console").into_response());
    }
    Ok(pages::layout("Log in", Nav::None, None, pages::login(None)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginForm {
    token: String,
}

async fn login(
    State(c): State<Console>,
    connect: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    Form(f): Form<LoginForm>,
) -> Result<Response, Response> {
    // Token guessing goes through the same per-source limit as the API's open endpoints.
    if let Some(axum::Extension(axum::extract::ConnectInfo(addr))) = connect
        && !c.app.limiter.allow(addr.ip(), std::time::Instant::now())
    {
        return Err(page_error(
            StatusCode::TOO_MANY_REQUESTS,
            "too many attempts from this address; wait a minute",
        ));
    }
    let hash = Secret::new(f.token.trim()).hash();
    let h = hash.clone();
    let Some(p) = db(&c, move |s| s.principal(&h, now())).await? else {
        return Ok((
            StatusCode::UNAUTHORIZED,
            pages::layout("Log in", Nav::None, None, pages::login(Some("that token is not one this controller knows (or it was revoked or has expired)"))),
        )
            .into_response());
    };
    let (id, csrf) = match (session::random_hex(), session::random_hex()) {
        (Ok(id), Ok(csrf)) => (id, csrf),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "console: no randomness for a session");
            return Err(page_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot make a session",
            ));
        }
    };
    let (key, actor) = (id.clone(), p.actor.clone());
    db(&c, move |s| {
        session::create(s, &key, csrf, hash, actor, now()).map(|_| ())
    })
    .await?;
    let actor = p.actor.clone();
    db(&c, move |s| {
        s.audit_append(
            &AuditLine {
                actor: &actor,
                action: "console.login",
                subject: "console",
                diff: "",
                outcome: "ok",
                detail: "a console session began",
            },
            now(),
        )
    })
    .await?;
    let mut r = Redirect::to("/console").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&id)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CsrfForm {
    #[serde(default)]
    csrf: Option<String>,
}

async fn logout(
    State(c): State<Console>,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Result<Response, Response> {
    let v = acting_viewer(&c, &headers, f.csrf.as_deref(), "console.logout", "console").await?;
    let id = v.session_id.clone();
    db(&c, move |s| session::end(s, &id, now())).await?;
    let actor = v.principal.actor.clone();
    db(&c, move |s| {
        s.audit_append(
            &AuditLine {
                actor: &actor,
                action: "console.logout",
                subject: "console",
                diff: "",
                outcome: "ok",
                detail: "the console session ended",
            },
            now(),
        )
    })
    .await?;
    let mut r = Redirect::to("/console/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// The servers and groups `v` may see.
async fn visible(
    c: &Console,
    v: &Viewer,
) -> Result<
    (
        Vec<weft_controller::model::ServerView>,
        Vec<weft_controller::model::GroupView>,
    ),
    Response,
> {
    let stale = c.app.stale_after_s;
    let (servers, groups) = db(c, move |s| Ok((s.servers(now(), stale)?, s.groups()?))).await?;
    let groups = view::visible_groups(groups, &v.principal);
    let servers = view::visible_servers(servers, &groups, &v.principal);
    Ok((servers, groups))
}

async fn overview(State(c): State<Console>, headers: HeaderMap) -> Result<Response, Response> {
    let v = page_viewer(&c, &headers).await?;
    let (servers, _) = visible(&c, &v).await?;
    let status = if v.principal.is_admin() {
        let stale = c.app.stale_after_s;
        let mut st = db(&c, move |s| s.status(now(), stale)).await?;
        st.delivers = c.app.delivers;
        st.drift = c.app.drift.lock().map(|d| d.clone()).unwrap_or_default();
        Some(st)
    } else {
        None
    };
    Ok(v.page(
        "Overview",
        Nav::Overview,
        pages::overview(
            &servers,
            status.as_ref(),
            now(),
            c.app.stale_after_s,
            expected_mbps(&c),
        ),
    ))
}

async fn nodes_fragment(
    State(c): State<Console>,
    headers: HeaderMap,
) -> Result<Response, Response> {
    let v = match viewer(&c, &headers).await? {
        Ok(v) => v,
        Err(_) => return Err(StatusCode::UNAUTHORIZED.into_response()),
    };
    let (servers, _) = visible(&c, &v).await?;
    Ok(pages::nodes_table(&servers, now(), c.app.stale_after_s, expected_mbps(&c)).into_response())
}

async fn partitions(State(c): State<Console>, headers: HeaderMap) -> Result<Response, Response> {
    let v = page_viewer(&c, &headers).await?;
    let (servers, groups) = visible(&c, &v).await?;
    let desired = db(&c, |s| s.desired()).await?;
    let names: BTreeSet<String> = groups.iter().map(|g| g.name.clone()).collect();
    let rows: Vec<&weft_controller::model::ServerView> = servers.iter().collect();
    let m = view::matrix(&desired, &rows, &names)
        .map_err(|e| page_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))?;
    Ok(v.page("Partitions", Nav::Partitions, pages::partitions(&m)))
}

async fn move_page(State(c): State<Console>, headers: HeaderMap) -> Result<Response, Response> {
    let v = page_viewer(&c, &headers).await?;
    if !v.principal.is_admin() {
        return Ok((
            StatusCode::FORBIDDEN,
            v.page(
                "Move",
                Nav::Move,
                pages::refused("moves need an admin token, as in the API"),
            ),
        )
            .into_response());
    }
    let (servers, groups) = visible(&c, &v).await?;
    Ok(v.page(
        "Move",
        Nav::Move,
        pages::move_form(&servers, &groups, &v.session.csrf),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveForm {
    #[serde(default)]
    csrf: Option<String>,
    server: String,
    to: String,
}

/// Checks that `v` may move `f.server` to `f.to`: an admin, the node and group visible.
/// A refusal is audited and changes nothing.
async fn may_move(c: &Console, v: &Viewer, f: &MoveForm) -> Result<(), Response> {
    let subject = format!("{} -> {}", f.server, f.to);
    let why = if !v.principal.is_admin() {
        Some("moves need an admin token, as in the API".to_string())
    } else {
        None
    };
    if let Some(why) = why {
        audit_refusal(
            c,
            v.principal.actor.clone(),
            "console.move",
            subject,
            format!("console: {why}"),
        )
        .await;
        return Err(page_error(StatusCode::FORBIDDEN, &why));
    }
    Ok(())
}

fn fragment_or_page(v: &Viewer, headers: &HeaderMap, title: &str, body: Markup) -> Response {
    if headers.contains_key("hx-request") {
        body.into_response()
    } else {
        v.page(title, Nav::Move, body)
    }
}

async fn move_preview(
    State(c): State<Console>,
    headers: HeaderMap,
    Form(f): Form<MoveForm>,
) -> Result<Response, Response> {
    let subject = format!("{} -> {}", f.server, f.to);
    let v = acting_viewer(&c, &headers, f.csrf.as_deref(), "console.move", &subject).await?;
    may_move(&c, &v, &f).await?;
    let (servers, _) = visible(&c, &v).await?;
    let Some(server) = servers.iter().find(|s| s.name == f.server) else {
        return Err(page_error(
            StatusCode::NOT_FOUND,
            &format!("there is no node `{}`", f.server),
        ));
    };
    let desired = db(&c, |s| s.desired()).await?;
    let body = match view::move_diff(&desired, server, &f.to) {
        Ok(d) => pages::move_preview(&f.server, &f.to, &d, &v.session.csrf),
        Err(e) => maud::html! { p.error role="alert" { "This move cannot be made: " (e) } },
    };
    Ok(fragment_or_page(&v, &headers, "Move", body))
}

async fn move_confirm(
    State(c): State<Console>,
    headers: HeaderMap,
    Form(f): Form<MoveForm>,
) -> Result<Response, Response> {
    let subject = format!("{} -> {}", f.server, f.to);
    let v = acting_viewer(&c, &headers, f.csrf.as_deref(), "console.move", &subject).await?;
    may_move(&c, &v, &f).await?;
    let actor = v.principal.actor.clone();
    let change = Change::Move {
        server: f.server.clone(),
        to: f.to.clone(),
    };
    let store = c.app.store.clone();
    let r = tokio::task::spawn_blocking(move || store.change(&actor, &change, now())).await;
    let body = match r {
        Ok(Ok(Some(op))) => {
            let _ = c
                .app
                .events
                .try_send(weft_controller::reconcile::Event::Changed);
            pages::follow(&op)
        }
        Ok(Ok(None)) => {
            maud::html! { p { "Nothing to change: the partitions file stays the same." } }
        }
        Ok(Err(
            e @ (StoreError::NotFound(_) | StoreError::Conflict(_) | StoreError::Invalid(_)),
        )) => {
            maud::html! { p.error role="alert" { "The move was refused: " (e) } }
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "console: move failed in the store");
            return Err(page_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the store failed; see the controller's log",
            ));
        }
        Err(e) => {
            tracing::warn!(error = %e, "console: move task failed");
            return Err(page_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the store failed; see the controller's log",
            ));
        }
    };
    Ok(fragment_or_page(&v, &headers, "Move", body))
}

/// Server-sent events for one operation: a `progress` event (an HTML fragment) at each
/// change, until it is verified, or [`ConsoleConfig::follow_limit`] passes (then the
/// reason it failed); then `done`.
async fn follow_events(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Result<Response, Response> {
    let v = page_viewer(&c, &headers).await?;
    if !v.principal.is_admin() {
        return Err(page_error(
            StatusCode::FORBIDDEN,
            "operations need an admin token, as in the API",
        ));
    }
    let first = db(&c, move |s| s.operation(id)).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(8);
    let cfg = c.cfg.clone();
    let store = c.app.store.clone();
    tokio::spawn(async move {
        let start = std::time::Instant::now();
        let mut last: Option<String> = None;
        let mut op = first;
        loop {
            let done = op.state == OpState::Applied;
            let gave_up = (!done && start.elapsed() >= cfg.follow_limit).then(|| {
                format!(
                    "not verified within {} s{}",
                    cfg.follow_limit.as_secs(),
                    op.last_error
                        .as_deref()
                        .map(|e| format!("; last error: {e}"))
                        .unwrap_or_default()
                )
            });
            let html = pages::one_line(pages::progress(&op, gave_up.as_deref()));
            if last.as_deref() != Some(&html) {
                if tx
                    .send(Ok(Event::default().event("progress").data(html.clone())))
                    .await
                    .is_err()
                {
                    return;
                }
                last = Some(html);
            }
            if done || gave_up.is_some() {
                let _ = tx
                    .send(Ok(Event::default().event("done").data("done")))
                    .await;
                return;
            }
            tokio::time::sleep(cfg.follow_every).await;
            let s = store.clone();
            match tokio::task::spawn_blocking(move || s.operation(id)).await {
                Ok(Ok(o)) => op = o,
                _ => {
                    let _ = tx
                        .send(Ok(Event::default()
                            .event("progress")
                            .data("the store could not be read; reload to try again")))
                        .await;
                    return;
                }
            }
        }
    });
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

async fn history(
    State(c): State<Console>,
    headers: HeaderMap,
    q: Result<Query<HistoryFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Response> {
    let v = page_viewer(&c, &headers).await?;
    let Query(f) =
        q.map_err(|e| page_error(StatusCode::BAD_REQUEST, &format!("the filter: {e}")))?;
    if !v.principal.is_admin() {
        return Ok((
            StatusCode::FORBIDDEN,
            v.page(
                "History",
                Nav::History,
                pages::refused(
                    "the history needs an admin token, as the API's operations and audit log do",
                ),
            ),
        )
            .into_response());
    }
    let (ops, audit, groups) = db(&c, |s| {
        Ok((s.operations(false)?, s.audit(500)?, s.groups()?))
    })
    .await?;
    let mut actions: Vec<String> = audit
        .iter()
        .map(|e| e.action.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    actions.sort();
    let ops: Vec<_> = ops.iter().filter(|o| f.operation(o, &groups)).collect();
    let audit: Vec<_> = audit.iter().rev().filter(|e| f.audit(e, &groups)).collect();
    Ok(v.page(
        "History",
        Nav::History,
        pages::history(&ops, &audit, &f, &actions),
    ))
}

async fn docs(State(c): State<Console>, headers: HeaderMap) -> Result<Response, Response> {
    let body = pages::docs(weft_controller::openapi_document());
    match viewer(&c, &headers).await? {
        Ok(v) => Ok(v.page("API docs", Nav::Docs, body)),
        Err(_) => Ok(pages::layout("API docs", Nav::Docs, None, body).into_response()),
    }
}
