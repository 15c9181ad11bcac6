//! Fencing at the subnet managers: a controller started from an earlier copy of the
//! store, beside the live one and against the same primary/standby OpenSM on ibsim, never
//! delivers older state; its refusal is audited; `restore` lets it take over, after which
//! the deposed one is refused in turn.

use super::*;
use weft_controller::reconcile::OpenSmFabric;
use weft_testbed::Topology;

/// A controller on the store in `dir` (`controller.db`), plain HTTP on loopback.
async fn start_in(dir: tempfile::TempDir, fabric: Arc<dyn Fabric>) -> Ctl {
    let db = dir.path().join("controller.db");
    start_at(dir, &db, fabric).await
}

/// A controller on the store `db` (created if missing), its fixtures in `dir`.
pub(crate) async fn start_at(dir: tempfile::TempDir, db: &Path, fabric: Arc<dyn Fabric>) -> Ctl {
    let config = ControllerConfig {
        admin_token: Some(Secret::new(ADMIN)),
        stale_after_s: 30,
        recheck: Duration::from_secs(1),
        max_backoff: Duration::from_millis(500),
        ..ControllerConfig::default()
    };
    let store = Arc::new(SqliteStore::open(db).unwrap());
    // A controller stopped just before gives the store's lease back as it winds down.
    let controller = until("the store's lease", Duration::from_secs(10), || {
        let r = Controller::start(store.clone(), fabric.clone(), config.clone()).ok();
        async move { r }
    })
    .await;
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", local(&api));
    let metrics_url = format!("http://{}/metrics", local(&metrics));
    let (stop, mut rx) = watch::channel(false);
    tokio::spawn(serve(controller, api, Some(metrics), async move {
        let _ = rx.wait_for(|s| *s).await;
    }));
    let trust = ClientTls::default();
    let admin = Client::with_tls(
        &base,
        Some(Secret::new(ADMIN)),
        Duration::from_secs(10),
        &trust,
    )
    .unwrap();
    Ctl {
        metrics: metrics_url,
        base,
        admin,
        dir,
        stop,
        trust,
    }
}

/// A consistent copy of the live store (SQLite's `VACUUM INTO`, what a backup taken while
/// it runs holds), with the store's lease row cleared: the copy stands for one started on
/// another host once the copied lease ran out, which no lease can stop.
fn copy_store(from: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("controller.db");
    let live = rusqlite::Connection::open(from).unwrap();
    live.execute("VACUUM INTO ?1", [to.to_str().unwrap()])
        .unwrap();
    let copy = rusqlite::Connection::open(&to).unwrap();
    copy.execute("DELETE FROM leases", []).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_on_a_stale_copy_of_the_store_never_delivers_older_state() {
    let topology = Topology::single_switch(4);
    let bed = tokio::task::block_in_place(|| fabric::bed(&topology));
    let live = Ctl::start(
        Arc::new(OpenSmFabric {
            applier: bed.applier(),
        }),
        30,
    )
    .await;
    let agents = agents_on_nodes(&live, &topology).await;
    assert_eq!(agents.len(), 4);
    let wait = Duration::from_secs(30);
    live.admin.create_tenant("alice").await.unwrap();
    live.admin.create_tenant("bob").await.unwrap();
    live.admin.create_group("a", "alice").await.unwrap();
    live.admin.create_group("b", "bob").await.unwrap();
    let mut last = 0;
    for (g, s) in [("b", "node1"), ("a", "node2"), ("b", "node3")] {
        last = live
            .admin
            .add_member(g, s)
            .await
            .unwrap()
            .operation
            .unwrap()
            .id;
    }
    live.admin.wait_applied(last, wait).await.unwrap();
    let (ka, kb) = (0x8a01u16, 0x8a02u16);
    let t = tokio::task::block_in_place(|| bed.verified());
    assert!(t["node1"].contains(&kb), "{t:x?}");

    // The copy: node1 is in bob's partition there.
    let copy = copy_store(&live.dir.path().join("controller.db"));

    // The live controller takes node1 out of bob's partition (a removal only: the stale
    // controller's file then only adds, which the one-owner check lets through).
    let op = live
        .admin
        .remove_member("b", "node1")
        .await
        .unwrap()
        .operation
        .unwrap();
    live.admin.wait_applied(op.id, wait).await.unwrap();
    let t = tokio::task::block_in_place(|| bed.verified());
    assert!(
        !t["node1"].contains(&ka) && !t["node1"].contains(&kb),
        "{t:x?}"
    );
    let held: Vec<String> = bed
        .sms
        .iter()
        .map(|(_, f)| std::fs::read_to_string(f).unwrap())
        .collect();

    // The stale controller starts beside it, against the same SMs.
    let stale = start_in(
        copy,
        Arc::new(OpenSmFabric {
            applier: bed.applier(),
        }),
    )
    .await;
    // Its first pass has run once it audited a delivery, a failure or a refusal.
    until("the stale controller's first pass", wait, || async {
        let a = stale.admin.audit(1000).await.ok()?;
        a.iter()
            .any(|l| {
                l.actor == "controller"
                    && ["deliver", "fence", "apply"].contains(&l.action.as_str())
                    && l.outcome != "accepted"
            })
            .then_some(())
    })
    .await;
    // Changes on the stale controller take its generation past the live one's: still
    // nothing of it may reach the SMs.
    for i in 0..6 {
        let to = if i % 2 == 0 { "b" } else { "a" };
        stale.admin.move_server("node2", to).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let t = tokio::task::block_in_place(|| bed.verified());
    assert!(
        !t["node1"].contains(&kb),
        "the stale controller gave node1 back to bob's partition: {t:x?}"
    );
    assert!(
        t["node2"].contains(&ka) && !t["node2"].contains(&kb),
        "{t:x?}"
    );
    for ((_, f), before) in bed.sms.iter().zip(&held) {
        assert_eq!(
            &std::fs::read_to_string(f).unwrap(),
            before,
            "{}",
            f.display()
        );
    }
    // The refusal is audited, naming what the SM holds and what was offered.
    let audit = stale.admin.audit(1000).await.unwrap();
    let refused = audit
        .iter()
        .find(|l| l.action == "fence" && l.outcome == "refused")
        .unwrap_or_else(|| panic!("no refusal audited: {audit:#?}"));
    assert!(
        refused.detail.contains("fencing") && refused.detail.contains("restore"),
        "{refused:?}"
    );

    // The live controller goes on delivering.
    let op = live
        .admin
        .move_server("node3", "a")
        .await
        .unwrap()
        .operation
        .unwrap();
    live.admin.wait_applied(op.id, wait).await.unwrap();
    let t = tokio::task::block_in_place(|| bed.verified());
    assert!(
        t["node3"].contains(&ka) && !t["node3"].contains(&kb),
        "{t:x?}"
    );

    // An operator restores the stale store on purpose: stopped, `restore` reads what the
    // SMs hold and raises its fencing number past it; started again, it delivers its
    // state, and the deposed live controller is refused from then on.
    let mut stale = stale;
    let copy = std::mem::replace(&mut stale.dir, tempfile::tempdir().unwrap());
    drop(stale);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = tokio::task::block_in_place(|| {
        let store = SqliteStore::open(&copy.path().join("controller.db")).unwrap();
        let fabric = OpenSmFabric {
            applier: bed.applier(),
        };
        // The stopped controller gives the store's lease back as it winds down.
        let start = Instant::now();
        loop {
            let now = weft_controller::unix_now();
            match weft_controller::restore::restore(&store, &fabric, "admin:test", now) {
                Err(weft_controller::restore::RestoreError::Running(_))
                    if start.elapsed() < Duration::from_secs(10) =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => break other.unwrap(),
            }
        }
    });
    assert!(report.fencing > report.held_fencing, "{report:?}");
    // The operator sees what the restored state puts back: node1 in bob's partition.
    assert!(
        report.diff.contains("0x0002c90300000101"),
        "{}",
        report.diff
    );
    let restored = start_in(
        copy,
        Arc::new(OpenSmFabric {
            applier: bed.applier(),
        }),
    )
    .await;
    until("the restored controller's delivery", wait, || async {
        let pending = restored.admin.operations(true).await.ok()?;
        pending.is_empty().then_some(())
    })
    .await;
    let t = tokio::task::block_in_place(|| bed.verified());
    assert!(t["node1"].contains(&kb), "the restored state: {t:x?}");
    let op = live
        .admin
        .move_server("node3", "b")
        .await
        .unwrap()
        .operation
        .unwrap();
    let err = live
        .admin
        .wait_applied(op.id, Duration::from_secs(5))
        .await
        .unwrap_err();
    let audit = live.admin.audit(1000).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|l| l.action == "fence" && l.outcome == "refused"),
        "{err}: {audit:#?}"
    );
    for (stop, _) in &agents {
        let _ = stop.send(true);
    }
}

/// The window between a delivery's write and its record as verified: a controller killed
/// there restarts with the SM holding a newer generation of its own fencing number. The
/// file it began to deliver (recorded before the first write) is its own and is replaced;
/// the same stamp on a file it never began (a copy of its store wrote it) is refused and
/// audited. On a recording fabric that plays the master SM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_the_store_began_to_deliver_is_its_own_after_a_kill_and_any_other_is_fenced() {
    use weft_controller::store::Store;
    for began in [true, false] {
        let fabric = Arc::new(RecordingFabric {
            plays_sm: true,
            ..RecordingFabric::default()
        });
        let ctl = start_in(tempfile::tempdir().unwrap(), fabric.clone()).await;
        ctl.admin.create_tenant("alice").await.unwrap();
        let op = ctl
            .admin
            .create_group("a", "alice")
            .await
            .unwrap()
            .operation
            .unwrap();
        ctl.admin
            .wait_applied(op.id, Duration::from_secs(10))
            .await
            .unwrap();
        let mut ctl = ctl;
        let dir = std::mem::replace(&mut ctl.dir, tempfile::tempdir().unwrap());
        drop(ctl);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // While it is down: the SM holds the next generation's file, stamped with the
        // store's fencing number; the store began that delivery, or never did.
        let db = dir.path().join("controller.db");
        let applied = tokio::task::block_in_place(|| {
            let s = SqliteStore::open_existing(&db).unwrap();
            s.applied().unwrap()
        });
        let next = weft_opensm::with_owner_stamped(
            "controller someone",
            weft_opensm::Stamp {
                fencing: 1,
                generation: u64::try_from(applied.generation).unwrap() + 1,
            },
            "Default=0x7fff, ipoib : ALL=full ;\n".into(),
        );
        if began {
            tokio::task::block_in_place(|| {
                let s = SqliteStore::open_existing(&db).unwrap();
                s.begin_delivery(
                    applied.generation + 1,
                    &weft_opensm::checksum(next.as_bytes()),
                )
                .unwrap();
            });
        }
        *fabric.held.lock().unwrap() = Some(next.clone());
        let before = fabric.delivered.lock().unwrap().len();
        let ctl = start_in(dir, fabric.clone()).await;
        if began {
            until(
                "the restarted controller's delivery",
                Duration::from_secs(10),
                || async { (fabric.delivered.lock().unwrap().len() > before).then_some(()) },
            )
            .await;
        } else {
            let refused = until("the refusal audited", Duration::from_secs(10), || async {
                let a = ctl.admin.audit(1000).await.ok()?;
                a.into_iter()
                    .find(|l| l.action == "fence" && l.outcome == "refused")
            })
            .await;
            assert!(
                refused
                    .detail
                    .contains(&format!("fencing 1 generation {}", applied.generation + 1))
                    && refused.detail.contains("never wrote"),
                "{refused:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(fabric.delivered.lock().unwrap().len(), before);
            let m = reqwest::get(&ctl.metrics)
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            assert!(
                m.lines()
                    .any(|l| l.starts_with("weft_fabric_applies_total{outcome=\"fenced\"}")),
                "{m}"
            );
            assert_eq!(fabric.held.lock().unwrap().as_deref(), Some(next.as_str()));
        }
    }
}
