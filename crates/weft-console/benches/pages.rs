//! Server time of the console's two heaviest pages, the overview and the partitions matrix,
//! with 1,000 nodes (each with an InfiniBand port) in 100 groups of 10 tenants, against the
//! anchor `GET /v1/servers` (the API's JSON of the same nodes) in the same run.
//!
//! In-process (the router called directly, no socket), so the figure is the server's own
//! time: session lookup, store reads, rendering. Median and p99 of `SAMPLES` requests each.
//!
//! `cargo bench -p weft-console --bench pages`

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, header};
use tower::ServiceExt;
use weft_controller::auth::Secret;
use weft_controller::reconcile::RecordingFabric;
use weft_controller::store::{Change, ReportedPort, SqliteStore, Store};
use weft_controller::{Controller, ControllerConfig};
use weft_fabric::Guid;

const ADMIN: &str = "wfa_bench-admin-token-0123456789abcdef";
const NODES: usize = 1000;
const GROUPS: usize = 100;
const SAMPLES: usize = 60;

fn fill(store: &SqliteStore) {
    let now = weft_controller::unix_now();
    for t in 0..10 {
        store
            .create_tenant(
                "bench",
                &format!("t{t}"),
                &format!("tenant-hash-{t}"),
                None,
                now,
            )
            .unwrap();
    }
    for g in 0..GROUPS {
        store
            .change(
                "bench",
                &Change::CreateGroup {
                    name: format!("g{g:03}"),
                    tenant: format!("t{}", g % 10),
                },
                now,
            )
            .unwrap();
    }
    for n in 0..NODES {
        let name = format!("node{n:04}");
        let token = format!("enroll-{n}");
        store
            .create_enrollment("bench", &token, None, now + 3600, now)
            .unwrap();
        store
            .enroll(&token, &name, &format!("secret-{n}"), now)
            .unwrap();
        let guid = Guid(0x0002_c903_0000_0000 + ((n as u64 + 1) << 8) + 1);
        store
            .report(
                &name,
                &[ReportedPort {
                    guid,
                    device: "mlx5_0".into(),
                    num: 1,
                    lid: n as u16 + 1,
                    state: "ACTIVE".into(),
                    rate: Some("400 Gb/sec (4X NDR)".into()),
                    mtu: Some(4092),
                }],
                &format!("h{n}"),
                now,
            )
            .unwrap();
        store
            .change(
                "bench",
                &Change::AddMember {
                    group: format!("g{:03}", n % GROUPS),
                    server: name,
                },
                now,
            )
            .unwrap();
    }
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    (p(0.5), p(0.99))
}

async fn time(
    app: &axum::Router,
    path: &str,
    headers: &[(header::HeaderName, String)],
) -> (Duration, Duration, usize) {
    let mut v = Vec::new();
    let mut size = 0;
    for _ in 0..SAMPLES {
        let mut r = Request::get(path);
        for (k, val) in headers {
            r = r.header(k, val);
        }
        let t = Instant::now();
        let resp = app
            .clone()
            .oneshot(r.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        v.push(t.elapsed());
        size = body.len();
    }
    let (m, p) = stats(v);
    (m, p, size)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = SqliteStore::in_memory().unwrap();
        let t = Instant::now();
        fill(&store);
        eprintln!(
            "filled {NODES} nodes, {GROUPS} groups in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let config = ControllerConfig {
            admin_token: Some(Secret::new(ADMIN)),
            ..ControllerConfig::default()
        };
        let mut ctl = Controller::start(
            Arc::new(store),
            Arc::new(RecordingFabric::default()),
            config,
        )
        .unwrap();
        ctl.mount(weft_console::router(
            ctl.state(),
            weft_console::ConsoleConfig::default(),
        ));
        let app = ctl.app();
        let login = app
            .clone()
            .oneshot(
                Request::post("/console/login")
                    .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(Body::from(format!("token={ADMIN}")))
                    .unwrap(),
            )
            .await
            .unwrap();
        let cookie = login.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string();
        let c = [(header::COOKIE, cookie)];
        let a = [(header::AUTHORIZATION, format!("Bearer {ADMIN}"))];
        let (am, ap, asz) = time(&app, "/v1/servers", &a).await;
        let (om, op, osz) = time(&app, "/console", &c).await;
        let (mm, mp, msz) = time(&app, "/console/partitions", &c).await;
        println!(
            "{NODES} nodes, {GROUPS} groups, {SAMPLES} requests each, server time (in-process)"
        );
        println!("page                 median     p99        bytes     median / anchor");
        for (name, m, p, sz) in [
            ("GET /v1/servers", am, ap, asz),
            ("GET /console", om, op, osz),
            ("GET /console/partitions", mm, mp, msz),
        ] {
            println!(
                "{name:<24} {:>7.1} ms {:>7.1} ms {sz:>9}  {:.2}",
                m.as_secs_f64() * 1e3,
                p.as_secs_f64() * 1e3,
                m.as_secs_f64() / am.as_secs_f64()
            );
        }
    });
}
