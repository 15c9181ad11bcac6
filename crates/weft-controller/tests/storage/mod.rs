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
