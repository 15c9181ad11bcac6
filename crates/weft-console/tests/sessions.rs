//! Console sessions survive a controller restart: a browser logged in to one controller
//! process stays logged in to the next one on the same store (the session is a row, kept by
//! its id's hash), and a logout on the server is still a logout after the next restart.
//!
//! In-process: two `Controller`s started one after the other on one SQLite file, each with
//! the console mounted, called through their routers (no socket, no browser: the browser
//! test covers the cookie's flags and the pages).

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use tower::ServiceExt;
use weft_controller::auth::Secret;
use weft_controller::reconcile::RecordingFabric;
use weft_controller::store::SqliteStore;
use weft_controller::{Controller, ControllerConfig};

const ADMIN: &str = "wfa_session-test-admin-0123456789abcdef";

/// A controller on the store at `db`, with the console mounted: its router.
fn controller(db: &Path) -> (Controller, axum::Router) {
    let mut ctl = Controller::start(
        Arc::new(SqliteStore::open(db).unwrap()),
        Arc::new(RecordingFabric::default()),
        ControllerConfig {
            admin_token: Some(Secret::new(ADMIN)),
            ..ControllerConfig::default()
        },
    )
    .unwrap();
    ctl.mount(weft_console::router(
        ctl.state(),
        weft_console::ConsoleConfig::default(),
    ));
    let app = ctl.app();
    (ctl, app)
}

struct Answer {
    status: StatusCode,
    location: Option<String>,
    set_cookie: Option<String>,
    body: String,
}

async fn send(app: &axum::Router, r: Request<Body>) -> Answer {
    let resp = app.clone().oneshot(r).await.unwrap();
    let status = resp.status();
    let location = resp
        .headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_string());
    let set_cookie = resp
        .headers()
        .get(header::SET_COOKIE)
        .map(|v| v.to_str().unwrap().to_string());
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&body).into_owned();
    Answer {
        status,
        location,
        set_cookie,
        body,
    }
}

async fn overview(app: &axum::Router, cookie: &str) -> Answer {
    send(
        app,
        Request::get("/console")
            .header(header::COOKIE, cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

async fn logout(app: &axum::Router, cookie: &str, csrf: &str) -> Answer {
    send(
        app,
        Request::post("/console/logout")
            .header(header::COOKIE, cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("csrf={csrf}")))
            .unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_survives_a_controller_restart_and_a_logout_survives_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("controller.db");

    // Controller 1: log in.
    let (ctl, app) = controller(&db);
    let login = send(
        &app,
        Request::post("/console/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("token={ADMIN}")))
            .unwrap(),
    )
    .await;
    assert_eq!(login.status, StatusCode::SEE_OTHER);
    let cookie = login
        .set_cookie
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let id = cookie.trim_start_matches("weft_session=").to_string();
    assert_eq!(overview(&app, &cookie).await.status, StatusCode::OK);
    // The store holds no session id, only its hash.
    let raw = std::fs::read(&db).unwrap();
    assert!(
        !raw.windows(id.len()).any(|w| w == id.as_bytes()),
        "the session id is not in the database file"
    );
    drop(app);
    drop(ctl);

    // Controller 2, same store: still logged in; log out.
    let (ctl, app) = controller(&db);
    let a = overview(&app, &cookie).await;
    assert_eq!(a.status, StatusCode::OK, "the session survived the restart");
    let page = a.body;
    assert!(page.contains("Logged in as"), "{page}");
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let a = logout(&app, &cookie, &csrf).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(a.location.as_deref(), Some("/console/login"));
    drop(app);
    drop(ctl);

    // Controller 3: the logout held; a replay of the cookie is refused and audited.
    let (ctl, app) = controller(&db);
    let a = overview(&app, &cookie).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(a.location.as_deref(), Some("/console/login"));
    let a = logout(&app, &cookie, &csrf).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    let audit = ctl.state().store.audit(100).unwrap();
    assert!(
        audit.iter().any(|a| a.outcome == "refused"
            && a.actor.starts_with("admin:")
            && a.detail.contains("ended")),
        "{audit:#?}"
    );
}
