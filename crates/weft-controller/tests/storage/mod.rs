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
