//! Backup and restore of a PostgreSQL store with PostgreSQL's own tools (`pg_dump`,
//! `pg_restore`), for `weft controller backup` and `weft controller restore --from`.
//!
//! A backup is one consistent moment while the controller runs: a read-only `REPEATABLE
//! READ` transaction exports its snapshot (`pg_export_snapshot()`), what the report says
//! (generations, counts) is read in it, and `pg_dump --snapshot` dumps exactly that
//! snapshot. Every change commits its rows, its operation and its audit line in one
//! transaction, so a snapshot holds each change whole or not at all. The store's lease row
//! is left out (`--exclude-table-data=leases`): a restored store is not held by the
//! controller that ran when the backup was taken.
//!
//! A restore goes into a fresh, empty database only (`pg_restore --single-transaction`:
//! all or nothing), and then through [`crate::restore::restore`], which raises the fencing
//! number above what the subnet managers hold.
//!
//! The URL's password never appears on a command line (`ps` shows those): it goes to the
//! tools in `PGPASSWORD`. The tools are found on `PATH`, else in Debian's
//! `/usr/lib/postgresql/<version>/bin`; every run is bounded.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::store::redact;

/// Why a backup or restore of a PostgreSQL store did not happen.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The backup file exists already (never written over).
    #[error("the backup file {0} exists already; give a new file")]
    Exists(PathBuf),
    /// A file could not be written or read.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The database could not be reached or read, or is not a weft store.
    #[error("the store {store}: {why}")]
    Store {
        /// The store's URL without a password.
        store: String,
        /// Why.
        why: String,
    },
    /// The restore's target holds tables already.
    #[error(
        "the database {store} holds {tables} tables already: restore into a fresh, empty database (`createdb`), never over a store"
    )]
    NotEmpty {
        /// The store's URL without a password.
        store: String,
        /// How many.
        tables: i64,
    },
    /// `pg_dump` or `pg_restore` failed or ran too long.
    #[error("{tool}: {why}")]
    Tool {
        /// The tool.
        tool: String,
        /// Its words.
        why: String,
    },
}

/// What a backup of a PostgreSQL store holds.
#[derive(Debug, Clone, Serialize)]
pub struct DumpReport {
    /// The backup file (`pg_dump --format=custom`; `pg_restore --list FILE` shows it).
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

/// The longest `pg_dump` or `pg_restore` may run.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(3600);

/// `url` without its password, and the password (percent-decoded), if any.
fn split_password(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    let Some((auth, host)) = rest.rsplit_once('@') else {
        return (url.to_string(), None);
    };
    match auth.split_once(':') {
        Some((user, pass)) => (
            format!("{scheme}://{user}@{host}"),
            Some(percent_decode(pass)),
        ),
        None => (url.to_string(), None),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `tool` on `PATH`, else the newest of Debian's `/usr/lib/postgresql/*/bin/tool`.
fn tool_path(tool: &str) -> String {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if on_path {
        return tool.to_string();
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin").join(tool))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
        .pop()
        .map_or_else(|| tool.to_string(), |p| p.display().to_string())
}

fn run_tool(tool: &str, args: &[&str], password: Option<&str>) -> Result<(), DumpError> {
    let mut env = Vec::new();
    if let Some(p) = password {
        env.push(("PGPASSWORD".to_string(), p.to_string()));
    }
    let inv = weft_proc::Invocation {
        env: &env,
        cwd: None,
        timeout: TOOL_TIMEOUT,
    };
    weft_proc::run_bounded(&tool_path(tool), args, &inv)
        .map(|_| ())
        .map_err(|e| DumpError::Tool {
            tool: tool.to_string(),
            why: e.to_string(),
        })
}

/// Runs `f` with a fresh connection to `url`, on a thread of its own (the blocking client
/// runs a runtime of its own, which Tokio refuses to nest).
fn with_client<T: Send>(
    url: &str,
    f: impl FnOnce(&mut postgres::Client) -> Result<T, DumpError> + Send,
) -> Result<T, DumpError> {
    let store = redact(url);
    let fail = |why: String| DumpError::Store {
        store: store.clone(),
        why,
    };
    let mut config: postgres::Config = url
        .parse()
        .map_err(|e: postgres::Error| fail(e.to_string()))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    config.application_name("weft-backup");
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut client = config
                .connect(postgres::NoTls)
                .map_err(|e| fail(weft_chain::error_chain(&e)))?;
            f(&mut client)
        })
        .join()
        .unwrap_or_else(|_| Err(fail("the backup's connection thread panicked".into())))
    })
}

/// Backs the PostgreSQL store at `url` up into the new file `file` (mode 0600; never over
/// an existing file) with `pg_dump`, as one consistent moment while the controller runs.
pub fn dump(url: &str, file: &Path) -> Result<DumpReport, DumpError> {
    use std::os::unix::fs::OpenOptionsExt;
    let store = redact(url);
    let (plain, password) = split_password(url);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => DumpError::Exists(file.to_path_buf()),
            _ => DumpError::File {
                path: file.to_path_buf(),
                why: e.to_string(),
            },
        })?;
    let done = with_client(url, |client| {
        let db = |e: postgres::Error| DumpError::Store {
            store: store.clone(),
            why: e.to_string(),
        };
        let mut tx = client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(db)?;
        let snapshot: String = tx
            .query_one("SELECT pg_export_snapshot()", &[])
            .map_err(db)?
            .get(0);
        let weft: bool = tx
            .query_one("SELECT to_regclass('weft_schema') IS NOT NULL", &[])
            .map_err(db)?
            .get(0);
        if !weft {
            return Err(DumpError::Store {
                store: store.clone(),
                why: "the database holds no weft store".into(),
            });
        }
        let meta = |tx: &mut postgres::Transaction<'_>, key: &str| -> Result<i64, DumpError> {
            let v: Option<String> = tx
                .query_opt("SELECT value FROM meta WHERE key = $1", &[&key])
                .map_err(db)?
                .map(|r| r.get(0));
            Ok(v.and_then(|v| v.parse().ok()).unwrap_or(0))
        };
        let count = |tx: &mut postgres::Transaction<'_>, sql: &str| -> Result<i64, DumpError> {
            Ok(tx.query_one(sql, &[]).map_err(db)?.get(0))
        };
        let report = DumpReport {
            path: file.to_path_buf(),
            bytes: 0,
            desired_generation: meta(&mut tx, "desired_generation")?,
            applied_generation: meta(&mut tx, "applied_generation")?,
            operations: count(&mut tx, "SELECT COUNT(*) FROM operations")?,
            audit_lines: count(&mut tx, "SELECT COUNT(*) FROM audit")?,
        };
        let file_arg = file.display().to_string();
        // The snapshot lives while this transaction is open: pg_dump runs meanwhile.
        run_tool(
            "pg_dump",
            &[
                "--format=custom",
                "--no-owner",
                "--no-privileges",
                "--exclude-table-data=leases",
                &format!("--snapshot={snapshot}"),
                "--file",
                &file_arg,
                "--dbname",
                &plain,
            ],
            password.as_deref(),
        )?;
        tx.commit().map_err(db)?;
        Ok(report)
    });
    let mut report = match done {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(file);
            return Err(e);
        }
    };
    let f = std::fs::File::open(file).map_err(|e| DumpError::File {
        path: file.to_path_buf(),
        why: e.to_string(),
    })?;
    f.sync_all().map_err(|e| DumpError::File {
        path: file.to_path_buf(),
        why: format!("cannot sync it: {e}"),
    })?;
    report.bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
    Ok(report)
}

/// Loads the backup `file` ([`dump`]'s) into the fresh, empty database at `url` with
/// `pg_restore`, in one transaction (a failure leaves it empty). Refused when the database
/// holds any table, or the file is not a `pg_dump` archive. The caller then raises the
/// fencing number ([`crate::restore::restore_from_dump`] does both).
pub fn load(file: &Path, url: &str) -> Result<(), DumpError> {
    let store = redact(url);
    let (plain, password) = split_password(url);
    if !file.is_file() {
        return Err(DumpError::File {
            path: file.to_path_buf(),
            why: "no such file".into(),
        });
    }
    let file_arg = file.display().to_string();
    run_tool("pg_restore", &["--list", &file_arg], None).map_err(|e| DumpError::File {
        path: file.to_path_buf(),
        why: format!("not a pg_dump archive ({e})"),
    })?;
    let tables = with_client(url, |client| {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()",
                &[],
            )
            .map_err(|e| DumpError::Store {
                store: store.clone(),
                why: e.to_string(),
            })?
            .get(0);
        Ok(n)
    })?;
    if tables > 0 {
        return Err(DumpError::NotEmpty { store, tables });
    }
    run_tool(
        "pg_restore",
        &[
            "--single-transaction",
            "--exit-on-error",
            "--no-owner",
            "--no-privileges",
            "--dbname",
            &plain,
            &file_arg,
        ],
        password.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_leaves_the_url_and_is_decoded() {
        assert_eq!(
            split_password("postgres://weft:s%40cret@db.example/weft"),
            (
                "postgres://weft@db.example/weft".to_string(),
                Some("s@cret".to_string())
            )
        );
        assert_eq!(
            split_password("postgres://postgres@%2Ftmp%2Fsock/x"),
            ("postgres://postgres@%2Ftmp%2Fsock/x".to_string(), None)
        );
    }
}
