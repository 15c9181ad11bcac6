//! Clients with a list of controller URLs (`[controller] urls`): a dead URL is passed over
//! for the next, within one bound; a follower's `421 not_leader` is followed to the leader
//! only when the leader is a configured URL; a write whose answer is lost is never sent
//! again; an agent keeps reporting when the controller at its first URL dies and the store
//! is served at its second.
//!
//! The controllers are real (SQLite stores). What answers `421` is a scripted stand-in
//! ([`not_leader_stand_in`]): leader election is not on this branch, and the stand-in
//! produces exactly the answer a follower gives by contract (HTTP 421, the error shape with
//! `code: "not_leader"` and `leader`).

use std::sync::atomic::{AtomicUsize, Ordering};

use weft_controller::client::ClientError;

use super::*;

/// A port on loopback that nothing listens on (bound, then given back).
fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

/// What the stand-in answers.
#[derive(Clone)]
enum StandIn {
    /// `421` with `leader` set to this (or null).
    NotLeader(Option<String>),
    /// Reads the request and never answers (a controller that died after the request
    /// reached it, or a network that lost the answer).
    Silent,
}

/// SCRIPTED STAND-IN, not a controller: an HTTP server on loopback that answers every
/// request as a follower does by contract (`421`, `{"error", "code": "not_leader",
/// "leader"}`), or never answers. Real leader election is not on this branch. Returns its
/// URL and how many requests reached it.
async fn not_leader_stand_in(what: StandIn) -> (String, Arc<AtomicUsize>) {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = axum::Router::new().fallback(move || {
        let what = what.clone();
        let h = h.clone();
        async move {
            h.fetch_add(1, Ordering::SeqCst);
            match what {
                StandIn::NotLeader(leader) => (
                    StatusCode::MISDIRECTED_REQUEST,
                    axum::Json(serde_json::json!({
                        "error": "this controller is a follower; writes go to the leader",
                        "code": "not_leader",
                        "leader": leader,
                    })),
                )
                    .into_response(),
                StandIn::Silent => {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    StatusCode::OK.into_response()
                }
            }
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", local(&l));
    tokio::spawn(async move { axum::serve(l, app).await });
    (url, hits)
}

fn admin_over(urls: &[String], timeout: Duration) -> Client {
    Client::over(
        urls,
        Some(Secret::new(ADMIN)),
        timeout,
        &ClientTls::default(),
    )
    .unwrap()
}

/// A dead first URL: reads and writes go on to the second, a real controller, and later
/// calls start there; with every URL dead the error names each and what it said, within
/// the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_first_url_is_passed_over_for_the_next_and_every_url_is_named_when_none_answers() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let dead = dead_url();
    let c = admin_over(&[dead.clone(), ctl.base.clone()], Duration::from_secs(3));
    let created = c.create_tenant("bob").await.unwrap();
    assert_eq!(created.tenant.name, "bob");
    assert_eq!(c.current_url(), ctl.base);
    let tenants = c.tenants().await.unwrap();
    assert_eq!(
        tenants.iter().filter(|t| t.name == "bob").count(),
        1,
        "{tenants:?}"
    );

    let dead2 = dead_url();
    let none = admin_over(&[dead.clone(), dead2.clone()], Duration::from_secs(3));
    let t = Instant::now();
    let e = none.tenants().await.unwrap_err();
    assert!(
        t.elapsed() <= none.failover_bound(),
        "{:?} > {:?}",
        t.elapsed(),
        none.failover_bound()
    );
    let ClientError::NoController { ref tried, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(tried.len(), 2, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&dead) && text.contains(&dead2) && text.contains("refused"),
        "{text}"
    );
}

/// A follower's `421`: a write goes once to the leader it names when that is a configured
/// URL, and is applied there once; a leader that is not configured is not followed (the
/// token never goes there) and the error says so; with no leader elected the client waits
/// and asks again, bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_421_is_followed_once_to_a_configured_leader_and_no_leader_is_a_bounded_wait() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let (follower, hits) =
        not_leader_stand_in(StandIn::NotLeader(Some(format!("{}/", ctl.base)))).await;
    let dead = dead_url();
    // The follower first, a dead URL second: the 421 sends the call straight to the leader.
    let c = admin_over(
        &[follower.clone(), dead.clone(), ctl.base.clone()],
        Duration::from_secs(3),
    );
    c.create_tenant("alice").await.unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(c.current_url(), ctl.base);
    let tenants = ctl.admin.tenants().await.unwrap();
    assert_eq!(tenants.iter().filter(|t| t.name == "alice").count(), 1);
    let audit = ctl.admin.audit(100).await.unwrap();
    assert_eq!(
        audit
            .iter()
            .filter(|a| a.action.contains("tenant") && a.subject.contains("alice"))
            .count(),
        1,
        "{audit:?}"
    );

    // A leader that is not among the configured URLs is not followed.
    let (stranger, stranger_hits) = not_leader_stand_in(StandIn::NotLeader(None)).await;
    let (liar, _) = not_leader_stand_in(StandIn::NotLeader(Some(stranger.clone()))).await;
    let c = admin_over(std::slice::from_ref(&liar), Duration::from_secs(3))
        .with_leader_wait(Duration::ZERO);
    let e = c.create_tenant("carol").await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(&liar)
            && text.contains(&stranger)
            && text.contains("not among the configured URLs"),
        "{text}"
    );
    assert_eq!(stranger_hits.load(Ordering::SeqCst), 0);

    // No leader elected: asked again after short waits, and an error within the wait.
    let (electing, electing_hits) = not_leader_stand_in(StandIn::NotLeader(None)).await;
    let c = admin_over(std::slice::from_ref(&electing), Duration::from_secs(3))
        .with_leader_wait(Duration::from_millis(1500));
    let t = Instant::now();
    let e = c.create_tenant("dave").await.unwrap_err();
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    assert!(electing_hits.load(Ordering::SeqCst) >= 3, "asked again");
    assert!(e.to_string().contains("no leader is elected"), "{e}");
    assert!(
        !ctl.admin
            .tenants()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == "carol" || t.name == "dave")
    );
}

/// A write sent to a controller that never answers is not sent to the next URL: the error
/// says the outcome is unknown, names where it went and how to check; a read in the same
/// place goes on to the next URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_is_lost_is_never_sent_again_and_says_its_outcome_is_unknown() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let (silent, hits) = not_leader_stand_in(StandIn::Silent).await;
    let c = admin_over(&[silent.clone(), ctl.base.clone()], Duration::from_secs(1));
    let t = Instant::now();
    let e = c.create_tenant("erin").await.unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let ClientError::OutcomeUnknown { ref url, .. } = e else {
        panic!("{e:?}")
    };
    assert!(url.starts_with(&silent), "{url}");
    let text = e.to_string();
    assert!(
        text.contains("POST /v1/tenants")
            && text.contains("unknown")
            && text.contains("not sent again")
            && text.contains("weft audit"),
        "{text}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert!(
        !ctl.admin
            .tenants()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == "erin")
    );

    // A read is safe to ask again elsewhere.
    let tenants = c.tenants().await.unwrap();
    assert!(tenants.iter().all(|t| t.name != "erin"));
    assert_eq!(c.current_url(), ctl.base);
}

/// One SQLite store served at a first URL, then (that controller stopped) at a second: the
/// agent, given both, enrolled through the first, goes on reporting (heartbeats and a
/// changed host) to the second with the same credentials, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_keeps_reporting_when_the_controller_at_its_first_url_dies() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("controller.db");
    let second = dead_url();
    let config = || ControllerConfig {
        admin_token: Some(Secret::new(ADMIN)),
        stale_after_s: 30,
        recheck: Duration::from_secs(5),
        max_backoff: Duration::from_millis(500),
        ..ControllerConfig::default()
    };
    let serve_at = |addr: String| {
        let db = db.clone();
        async move {
            let store = SqliteStore::open(&db).unwrap();
            let ctl = Controller::start(
                Arc::new(store),
                Arc::new(RecordingFabric::default()),
                config(),
            )
            .unwrap();
            let api = tokio::net::TcpListener::bind(addr).await.unwrap();
            let base = format!("http://{}", local(&api));
            let (stop, mut rx) = watch::channel(false);
            let task = tokio::spawn(serve(ctl, api, None, async move {
                let _ = rx.wait_for(|s| *s).await;
            }));
            (base, stop, task)
        }
    };
    let (first, stop_first, task_first) = serve_at("127.0.0.1:0".into()).await;
    let urls = vec![first.clone(), second.clone()];
    let admin = admin_over(&urls, Duration::from_secs(2));

    // The host's sysfs tree behind a symlink, swapped in one rename when the host changes
    // (the agent never sees half a tree).
    let root = dir.path().join("host-node1");
    write_fixture(&dir.path().join("v1"), "node1", 0x0002_c903_0000_0100, &[1]);
    std::os::unix::fs::symlink(dir.path().join("v1"), &root).unwrap();
    let mut cfg = AgentConfig::new(&first, dir.path().join("node1.state"), root.clone());
    cfg.controllers = urls.clone();
    cfg.enroll_token = Some(admin.create_enrollment(None).await.unwrap().token);
    cfg.heartbeat = Duration::from_millis(300);
    cfg.rescan = Duration::from_millis(300);
    cfg.request_timeout = Duration::from_secs(2);
    cfg.max_backoff = Duration::from_millis(500);
    let (_stop_agent, agent) = spawn_agent(cfg);
    servers_with_ports(&admin, 1).await;

    // The first controller dies; the store is served at the second URL.
    stop_first.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(15), task_first)
        .await
        .expect("the first controller stops")
        .unwrap()
        .unwrap();
    let addr = second.trim_start_matches("http://").to_string();
    let (base2, _stop_second, _task2) = serve_at(addr).await;
    assert_eq!(base2, second);
    let direct = Client::new(&second, Some(Secret::new(ADMIN)), Duration::from_secs(2)).unwrap();
    let seen_before = direct.servers().await.unwrap()[0].last_seen.unwrap();

    // The host changes: the agent's next report must reach the second controller.
    write_fixture(
        &dir.path().join("v2"),
        "node1",
        0x0002_c903_0000_0100,
        &[1, 2],
    );
    std::os::unix::fs::symlink(dir.path().join("v2"), dir.path().join("next")).unwrap();
    std::fs::rename(dir.path().join("next"), &root).unwrap();
    let s = until(
        "the changed host reported to the second controller",
        Duration::from_secs(20),
        || async {
            let s = direct.servers().await.ok()?;
            (s.len() == 1 && s[0].ports.len() == 2).then_some(s)
        },
    )
    .await;
    assert_eq!(s[0].liveness, Liveness::Ok, "{s:?}");
    until(
        "heartbeats on the second controller",
        Duration::from_secs(20),
        || async {
            let s = direct.servers().await.ok()?;
            (s[0].last_seen? > seen_before).then_some(())
        },
    )
    .await;
    assert!(!agent.is_finished(), "the agent kept running");
    // The admin's client went over too, and starts there now.
    assert_eq!(admin.servers().await.unwrap()[0].ports.len(), 2);
    assert_eq!(admin.current_url(), second);
}
