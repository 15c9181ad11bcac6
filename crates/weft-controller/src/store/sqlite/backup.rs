//! Backups of a store, taken while a controller runs on it, through SQLite's online backup
//! API; and putting one back in place of a store (on a stopped controller).

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};
use serde::Serialize;

use super::{SqliteStore, refuse};
use crate::store::{Result, StoreError};

/// What a backup holds.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BackupReport {
    /// The backup file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// The desired generation at the moment it holds.
    pub desired_generation: i64,
    /// The applied generation at that moment.
    pub applied_generation: i64,
    /// Operations in it.
    pub operations: i64,
    /// Audit lines in it.
    pub audit_lines: i64,
}

fn count(conn: &Connection, sql: &str) -> Result<i64> {
    Ok(conn.query_row(sql, [], |r| r.get(0))?)
}

fn meta_num(conn: &Connection, key: &str) -> Result<i64> {
    let v: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .ok();
    Ok(v.and_then(|v| v.parse().ok()).unwrap_or(0))
}

impl SqliteStore {
    /// Copies the store at `src` into the new file `dest` (mode 0600) through SQLite's
    /// online backup API, in one step: one read transaction, so the copy is the store at
    /// one moment (WAL: the controller's writes go on meanwhile). The copy is checked
    /// (`quick_check`) before it is reported.
    pub fn backup(src: &Path, dest: &Path) -> Result<BackupReport> {
        if dest.exists() {
            return Err(refuse(
                dest,
                "exists already; a backup never overwrites a file",
            ));
        }
        if !src.is_file() {
            return Err(refuse(src, "no such file"));
        }
        let source = Connection::open_with_flags(
            src,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| refuse(src, e))?;
        source
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(|e| refuse(src, e))?;
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dest)
                .map_err(|e| refuse(dest, format!("cannot create it: {e}")))?;
        }
        let result = (|| {
            let mut copy = Connection::open(dest).map_err(|e| refuse(dest, e))?;
            {
                let b = rusqlite::backup::Backup::new(&source, &mut copy)
                    .map_err(|e| refuse(dest, e))?;
                // -1: every page in one step, under one read lock (a writer goes on in
                // the WAL meanwhile). Busy: another connection holds a lock; bounded.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                loop {
                    use rusqlite::backup::StepResult;
                    match b
                        .step(-1)
                        .map_err(|e| refuse(dest, format!("the backup failed: {e}")))?
                    {
                        StepResult::Done => break,
                        StepResult::More | StepResult::Busy | StepResult::Locked
                            if std::time::Instant::now() < deadline =>
                        {
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                        other => {
                            return Err(refuse(
                                src,
                                format!("the backup did not finish within 10 s: {other:?}"),
                            ));
                        }
                    }
                }
            }
            // One file: the copy's pages go into it, not into a WAL beside it.
            copy.pragma_update(None, "journal_mode", "DELETE")
                .map_err(|e| refuse(dest, e))?;
            // A copy runs no controller: the running one's lease stays behind, so that a
            // restore of it is not refused until that lease runs out.
            copy.execute("DELETE FROM leases", [])
                .map_err(|e| refuse(dest, e))?;
            let check: String = copy
                .query_row("PRAGMA quick_check", [], |r| r.get(0))
                .map_err(|e| refuse(dest, e))?;
            if check != "ok" {
                return Err(refuse(dest, format!("the copy fails quick_check: {check}")));
            }
            let report = BackupReport {
                path: dest.to_path_buf(),
                bytes: 0,
                desired_generation: meta_num(&copy, "desired_generation")?,
                applied_generation: meta_num(&copy, "applied_generation")?,
                operations: count(&copy, "SELECT COUNT(*) FROM operations")?,
                audit_lines: count(&copy, "SELECT COUNT(*) FROM audit")?,
            };
            drop(copy);
            std::fs::File::open(dest)
                .and_then(|f| f.sync_all())
                .map_err(|e| refuse(dest, format!("cannot sync it: {e}")))?;
            let bytes = std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0);
            Ok(BackupReport { bytes, ..report })
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(dest);
        }
        result
    }

    /// Puts the backup `from` in place of the store `db` (which must not be in use: the
    /// caller holds its lease or knows it is stopped): the backup is checked, copied
    /// beside `db` and renamed over it, and `db`'s old WAL and shared-memory files are
    /// removed so that they cannot be replayed into the copy.
    pub fn replace_with_backup(from: &Path, db: &Path) -> Result<()> {
        drop(SqliteStore::open_existing(from)?);
        let mut tmp = db.as_os_str().to_owned();
        tmp.push(".restoring");
        let tmp = PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        SqliteStore::backup(from, &tmp)?;
        for suffix in ["-wal", "-shm"] {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            match std::fs::remove_file(PathBuf::from(&p)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(refuse(Path::new(&p), format!("cannot remove it: {e}"))),
            }
        }
        std::fs::rename(&tmp, db).map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot put {} in place of {}: {e}",
                tmp.display(),
                db.display()
            ))
        })?;
        Ok(())
    }
}
