//! Storage faults are health: a full disk under the store (a small tmpfs) makes readiness
//! fail and every change answer 503 naming the store and the cause, loses nothing stored,
//! and ends when space comes back.

use std::io::Write;

use super::*;

/// A tmpfs of `size` mounted on `path`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(path).map_err(|e| e.to_string())?;
        let o = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(path)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "mount -t tmpfs (needs root): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(Tmpfs(path.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .args(["-l"])
            .arg(&self.0)
            .status();
    }
}

async fn healthz(base: &str) -> (u16, String) {
    let r = reqwest::get(format!("{base}/healthz")).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_failed_readiness_and_503s_naming_the_store_and_nothing_is_lost() {
    let outer = tempfile::tempdir().unwrap();
    let mnt = outer.path().join("store");
    let tmpfs = match Tmpfs::mount(&mnt, "4m") {
        Ok(t) => t,
        Err(why) => {
            weft_netns::require::skip("the full-disk test", &why);
            return;
        }
    };
    let db = mnt.join("controller.db");
    let ctl = super::fencing::start_at(
        tempfile::tempdir().unwrap(),
        &db,
        Arc::new(RecordingFabric::default()),
    )
    .await;
    assert_eq!(healthz(&ctl.base).await, (200, "ok\n".to_string()));
    ctl.admin.create_tenant("alice").await.unwrap();
    ctl.admin.create_group("a", "alice").await.unwrap();

    // Fill the file system.
    let filler = mnt.join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    let (status, body) = healthz(&ctl.base).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains(&db.display().to_string()) && body.contains("bytes free"),
        "{body}"
    );
    for attempt in [
        ctl.admin.create_tenant("bob").await.map(|_| ()),
        ctl.admin.create_group("b", "alice").await.map(|_| ()),
    ] {
        let e = attempt.expect_err("a change on a full disk must be refused");
        let text = e.to_string();
        assert_eq!(e.status(), Some(503), "{text}");
        assert!(
            text.contains(&db.display().to_string()) && text.contains("cannot write"),
            "{text}"
        );
    }
    // Reads still answer.
    assert_eq!(ctl.admin.tenants().await.unwrap().len(), 1);

    // Space back: ready again, the refused changes were not stored, nothing was lost.
    std::fs::remove_file(&filler).unwrap();
    until("readiness back", Duration::from_secs(10), || async {
        (healthz(&ctl.base).await.0 == 200).then_some(())
    })
    .await;
    let tenants: Vec<String> = ctl
        .admin
        .tenants()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(tenants, ["alice"]);
    let groups: Vec<String> = ctl
        .admin
        .groups()
        .await
        .unwrap()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(groups, ["a"]);
    ctl.admin.create_tenant("bob").await.unwrap();
    drop(ctl);
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(tmpfs);
}

/// Every table of the SQLite file at `path`, row by row, as text.
fn rows(path: &Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    tables
        .into_iter()
        .map(|t| {
            let mut stmt = conn
                .prepare(&format!("SELECT * FROM \"{t}\" ORDER BY rowid"))
                .unwrap();
            let n = stmt.column_count();
            let v: Vec<String> = stmt
                .query_map([], |r| {
                    Ok((0..n)
                        .map(|i| match r.get_ref(i).unwrap() {
                            rusqlite::types::ValueRef::Text(t) => {
                                String::from_utf8_lossy(t).into_owned()
                            }
                            other => format!("{other:?}"),
                        })
                        .collect::<Vec<_>>()
                        .join("|"))
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            (t, v)
        })
        .collect()
}

/// A backup taken while 100 changes go on is the store at one moment: its desired
/// generation is its newest operation's, every operation has its audit line and no audit
/// line names an operation it lacks; restored into a fresh database (through the restore
/// that raises the fencing number), every row equals the backup's, and the restored store
/// opens and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_during_100_changes_is_one_consistent_moment_and_restores_row_for_row() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let db = ctl.dir.path().join("controller.db");
    ctl.admin.create_tenant("alice").await.unwrap();
    let backups = tempfile::tempdir().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let taker = {
        let (db, dir) = (db.clone(), backups.path().to_path_buf());
        std::thread::spawn(move || {
            let mut taken = Vec::new();
            for i in 0.. {
                let stop = done_rx.try_recv().is_ok();
                let path = dir.join(format!("b{i}.db"));
                taken.push(SqliteStore::backup(&db, &path).unwrap());
                if stop {
                    break;
                }
                std::thread::sleep(Duration::from_millis(15));
            }
            taken
        })
    };
    for i in 0..100 {
        ctl.admin
            .create_group(&format!("g{i}"), "alice")
            .await
            .unwrap();
    }
    done_tx.send(()).unwrap();
    let taken = tokio::task::block_in_place(|| taker.join().unwrap());
    assert!(taken.len() >= 3, "{} backups", taken.len());
    let last = taken.last().unwrap();
    assert_eq!(last.operations, 100, "{last:?}");
    for b in &taken {
        let conn = rusqlite::Connection::open(&b.path).unwrap();
        let newest: i64 = conn
            .query_row(
                "SELECT COALESCE(MAX(generation), 0) FROM operations",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(b.desired_generation, newest, "{b:?}");
        let accepted: Vec<String> = conn
            .prepare("SELECT detail FROM audit WHERE outcome = 'accepted' ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let ops: Vec<(i64, i64)> = conn
            .prepare("SELECT id, generation FROM operations ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let want: Vec<String> = ops
            .iter()
            .map(|(id, g)| format!("operation {id}, generation {g}"))
            .collect();
        assert_eq!(accepted, want, "{b:?}");
    }
    // Restore a backup from the middle into a fresh database.
    let mid = &taken[taken.len() / 2];
    let fresh = backups.path().join("fresh.db");
    let report = tokio::task::block_in_place(|| {
        weft_controller::restore::restore_from_backup(
            &mid.path,
            &fresh,
            &RecordingFabric::default(),
            "admin:test",
            weft_controller::unix_now(),
        )
        .unwrap()
    });
    assert!(report.fencing > report.old_fencing, "{report:?}");
    let (a, b) = (rows(&mid.path), rows(&fresh));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (table, rows_a) in &a {
        let rows_b = &b[table];
        if table == "audit" {
            // The restore adds its own line (`fence`/`raised`) and nothing else.
            assert_eq!(&rows_b[..rows_a.len()], &rows_a[..], "{table}");
            assert_eq!(rows_b.len(), rows_a.len() + 1, "{table}");
            assert!(
                rows_b.last().unwrap().contains("raised"),
                "{:?}",
                rows_b.last()
            );
        } else if table == "meta" || table == "leases" {
            // The fencing number rose (and the restore's lease came and went).
            continue;
        } else {
            assert_eq!(rows_b, rows_a, "{table}");
        }
    }
    let store = SqliteStore::open_existing(&fresh).unwrap();
    use weft_controller::store::Store;
    assert_eq!(store.desired().unwrap().generation, mid.desired_generation);
}

/// Every table of the PostgreSQL database at `url` (leases and the schema version aside):
/// its rows as JSON, in the order of their first column (ids and names).
fn pg_rows(url: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let url = url.to_string();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let tables: Vec<String> = c
            .query(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        tables
            .into_iter()
            .map(|t| {
                let first: String = c
                    .query_one(
                        "SELECT column_name::text FROM information_schema.columns WHERE table_name = $1 AND ordinal_position = 1",
                        &[&t],
                    )
                    .unwrap()
                    .get(0);
                let rows: Vec<String> = c
                    .query(
                        &format!(
                            "SELECT row_to_json(x)::text FROM \"{t}\" x ORDER BY x.\"{first}\""
                        ),
                        &[],
                    )
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                (t, rows)
            })
            .collect()
    })
    .join()
    .unwrap()
}

/// A PostgreSQL store backed up (`pg_dump` of one exported snapshot) again and again while
/// a server is moved 100 times between two groups, each backup restored into a fresh
/// database (`pg_restore`, then the fencing raise): each is one moment of the live store.
/// Its operations are the first N of the final ones, row for row; its audit is the first
/// lines of the final audit, row for row, plus the restore's own `fence`/`raised` line;
/// each operation has its `accepted` line; its desired generation is its newest
/// operation's; the server sits in the group its last move named; and the report said
/// what it holds. A backup never overwrites a file, and a restore into a database that
/// holds tables is refused, leaving it as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_backup_taken_during_100_moves_is_one_consistent_moment_when_restored() {
    use weft_controller::pgdump::{self, DumpError};
    use weft_controller::store::{PgStore, Store};
    if let Err(why) = weft_testbed::Postgres::available() {
        weft_netns::require::skip("backup of a PostgreSQL store", &why);
        return;
    }
    let pg = tokio::task::block_in_place(weft_testbed::Postgres::start).expect("PostgreSQL");
    let live = pg.database("live").unwrap();
    let store = PgStore::open(&live, true).unwrap();
    let config = ControllerConfig {
        admin_token: Some(Secret::new(ADMIN)),
        ..ControllerConfig::default()
    };
    let ctl = Controller::start(
        Arc::new(store),
        Arc::new(RecordingFabric::default()),
        config,
    )
    .unwrap();
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", local(&api));
    tokio::spawn(serve(ctl, api, None, std::future::pending()));
    let admin = Client::new(&base, Some(Secret::new(ADMIN)), Duration::from_secs(10)).unwrap();
    admin.create_tenant("alice").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("host-node1");
    write_fixture(&root, "node1", 0x0002_c903_0000_0100, &[1]);
    let token = admin.create_enrollment(Some("node1")).await.unwrap().token;
    let anon = Client::new(&base, None, Duration::from_secs(10)).unwrap();
    let secret = anon.enroll(&token, "node1").await.unwrap().secret;
    anon.with_token(Some(secret))
        .report(&weft_agent::discover(&root).unwrap())
        .await
        .unwrap();
    admin.create_group("g0", "alice").await.unwrap();
    admin.create_group("g1", "alice").await.unwrap();
    admin.add_member("g0", "node1").await.unwrap();

    let backups = tempfile::tempdir().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let taker = {
        let (url, dir) = (live.clone(), backups.path().to_path_buf());
        std::thread::spawn(move || {
            let mut taken = Vec::new();
            for i in 0.. {
                let stop = done_rx.try_recv().is_ok();
                taken.push(pgdump::dump(&url, &dir.join(format!("b{i}.pgdump"))).unwrap());
                if stop {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            taken
        })
    };
    for i in 0..100 {
        admin
            .move_server("node1", &format!("g{}", (i + 1) % 2))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done_tx.send(()).unwrap();
    let taken = tokio::task::block_in_place(|| taker.join().unwrap());
    assert!(taken.len() >= 3, "{} backups", taken.len());
    let final_rows = tokio::task::block_in_place(|| pg_rows(&live));
    let final_ops = &final_rows["operations"];
    let final_audit = &final_rows["audit"];
    assert!(final_ops.len() >= 103, "{}", final_ops.len());
    assert!(
        taken
            .iter()
            .any(|b| 3 < b.operations && (b.operations as usize) < final_ops.len()),
        "no backup from the middle: {taken:?}"
    );

    // A backup is never written over.
    let again = pgdump::dump(&live, &taken[0].path).unwrap_err();
    assert!(matches!(again, DumpError::Exists(_)), "{again}");

    // Five backups, the first and the last among them, each restored into its own database.
    let mut picked: Vec<usize> = (0..5).map(|j| j * (taken.len() - 1) / 4).collect();
    picked.dedup();
    for i in picked {
        let b = &taken[i];
        let fresh = pg.database(&format!("fresh{i}")).unwrap();
        let report = tokio::task::block_in_place(|| {
            weft_controller::restore::restore_from_dump(
                &b.path,
                &fresh,
                &RecordingFabric::default(),
                "admin:test",
                weft_controller::unix_now(),
            )
            .unwrap()
        });
        assert!(report.fencing > report.old_fencing, "{report:?}");
        let rows = tokio::task::block_in_place(|| pg_rows(&fresh));
        let ops = &rows["operations"];
        assert_eq!(ops.len() as i64, b.operations, "{b:?}");
        // What an operation asked for never changes (its state, end and what it took away
        // are written once it is applied).
        let what = |o: &String| {
            let mut v: serde_json::Value = serde_json::from_str(o).unwrap();
            let m = v.as_object_mut().unwrap();
            for k in [
                "state",
                "attempts",
                "last_error",
                "finished",
                "warning",
                "taken",
            ] {
                m.remove(k);
            }
            v
        };
        assert_eq!(
            final_ops[..ops.len()].iter().map(what).collect::<Vec<_>>(),
            ops.iter().map(what).collect::<Vec<_>>(),
            "backup {i}: operations"
        );
        let audit = &rows["audit"];
        assert_eq!(audit.len() as i64, b.audit_lines + 1, "{b:?}");
        assert_eq!(
            &final_audit[..audit.len() - 1],
            &audit[..audit.len() - 1],
            "backup {i}: audit"
        );
        assert!(
            audit.last().unwrap().contains("raised"),
            "{:?}",
            audit.last()
        );
        assert!(rows["leases"].is_empty(), "{:?}", rows["leases"]);

        let restored = tokio::task::block_in_place(|| PgStore::open(&fresh, false).unwrap());
        let desired = restored.desired().unwrap();
        assert_eq!(desired.generation, b.desired_generation, "{b:?}");
        let opv: Vec<serde_json::Value> = ops
            .iter()
            .map(|o| serde_json::from_str(o).unwrap())
            .collect();
        let newest = opv
            .iter()
            .map(|o| o["generation"].as_i64().unwrap())
            .max()
            .unwrap_or(0);
        assert_eq!(desired.generation, newest, "backup {i}");
        let accepted: Vec<String> = audit
            .iter()
            .map(|a| serde_json::from_str::<serde_json::Value>(a).unwrap())
            .filter(|a| a["outcome"] == "accepted")
            .map(|a| a["detail"].as_str().unwrap().to_string())
            .collect();
        let want: Vec<String> = opv
            .iter()
            .map(|o| format!("operation {}, generation {}", o["id"], o["generation"]))
            .collect();
        assert_eq!(accepted, want, "backup {i}");
        // The server sits where the backup's last operation put it.
        let last = opv.last().unwrap()["action"].as_str().unwrap().to_string();
        let group = restored
            .servers(weft_controller::unix_now(), 30)
            .unwrap()
            .into_iter()
            .find(|s| s.name == "node1")
            .unwrap()
            .group;
        let to = last
            .strip_prefix("group.move node1 -> ")
            .or_else(|| last.strip_prefix("group.add node1 -> "));
        if let Some(to) = to {
            assert_eq!(group.as_deref(), Some(to), "backup {i}: {last}");
        } else {
            assert_eq!(group, None, "backup {i}: {last}");
        }
    }

    // Never over a store: a database with tables is refused and left as it was.
    let before = tokio::task::block_in_place(|| pg_rows(&live));
    let e = tokio::task::block_in_place(|| {
        weft_controller::restore::restore_from_dump(
            &taken[0].path,
            &live,
            &RecordingFabric::default(),
            "admin:test",
            weft_controller::unix_now(),
        )
        .unwrap_err()
    });
    assert!(e.to_string().contains("fresh, empty database"), "{e}");
    let after = tokio::task::block_in_place(|| pg_rows(&live));
    assert_eq!(before["operations"], after["operations"]);
}
