//! `weft controller backup` and `weft controller restore`: SQLite's online backup, and on
//! a PostgreSQL store pg_dump of one snapshot and pg_restore into a fresh database; then
//! the fencing raise. `weft controller audit prune` on either store.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use weft_controller::store::{PgStore, SqliteStore};

use super::fabric_of;
use crate::EXIT_OK;
use crate::config::Config;
use crate::output;

/// `weft controller backup`: a SQLite store copied through SQLite's online backup API, a
/// PostgreSQL store dumped with `pg_dump` (one exported snapshot).
pub(super) fn backup(
    file: &std::path::Path,
    db: Option<PathBuf>,
    store: Option<String>,
    cfg: &Config,
    json: bool,
) -> Result<u8> {
    match postgres_url(store, db.as_ref(), cfg) {
        Some(url) => {
            let r = weft_controller::pgdump::dump(&url, file).with_context(|| {
                format!(
                    "backup of {} into {}",
                    weft_controller::store::redact(&url),
                    file.display()
                )
            })?;
            print_backup(
                &r,
                [
                    r.path.display().to_string(),
                    r.bytes.to_string(),
                    r.desired_generation.to_string(),
                    r.applied_generation.to_string(),
                    r.operations.to_string(),
                    r.audit_lines.to_string(),
                ],
                json,
            )
        }
        None => backup_sqlite(file, db, cfg, json),
    }
}

/// `weft controller restore`, on the store's backend.
pub(super) fn restore(
    db: Option<PathBuf>,
    store: Option<String>,
    from: Option<PathBuf>,
    no_fabric: bool,
    cfg: &Config,
    json: bool,
) -> Result<u8> {
    match postgres_url(store, db.as_ref(), cfg) {
        Some(url) => restore_postgres(&url, from, no_fabric, cfg, json),
        None => restore_sqlite(db, from, no_fabric, cfg, json),
    }
}

/// The PostgreSQL store's URL: `--store`, else `[controller] store_url` unless `--db` is
/// given (a flag beats the file); `None`: the SQLite store.
fn postgres_url(flag: Option<String>, db: Option<&PathBuf>, cfg: &Config) -> Option<String> {
    flag.or_else(|| {
        db.is_none()
            .then(|| cfg.controller.store_url.clone())
            .flatten()
    })
}

/// `weft controller restore` on a PostgreSQL store (after `pg_restore` into it, or on a
/// replica promoted by hand): the fencing number raised above what the SMs hold.
fn restore_postgres(
    url: &str,
    from: Option<PathBuf>,
    no_fabric: bool,
    cfg: &Config,
    json: bool,
) -> Result<u8> {
    let name = weft_controller::store::redact(url);
    let fabric = fabric_of(no_fabric, cfg)?;
    let actor = format!(
        "operator:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    if let Some(from) = from {
        let r = weft_controller::restore::restore_from_dump(
            &from,
            url,
            fabric.as_ref(),
            &actor,
            weft_controller::unix_now(),
        )
        .with_context(|| format!("restore of {name} from {}", from.display()))?;
        return print_restore(&r, json);
    }
    let store = PgStore::open(url, false)?;
    let r = weft_controller::restore::restore(
        &store,
        fabric.as_ref(),
        &actor,
        weft_controller::unix_now(),
    )
    .with_context(|| format!("restore of {name}"))?;
    print_restore(&r, json)
}

/// The store of `--db`, else `[controller] db`, else the packaged default.
fn store_path(db: Option<PathBuf>, cfg: &Config) -> PathBuf {
    db.or_else(|| cfg.controller.db.clone())
        .unwrap_or_else(|| "/var/lib/weft/controller.db".into())
}

/// `weft controller backup`.
fn backup_sqlite(
    file: &std::path::Path,
    db: Option<PathBuf>,
    cfg: &Config,
    json: bool,
) -> Result<u8> {
    let db = store_path(db, cfg);
    let r = SqliteStore::backup(&db, file)
        .with_context(|| format!("backup of {} into {}", db.display(), file.display()))?;
    print_backup(
        &r,
        [
            r.path.display().to_string(),
            r.bytes.to_string(),
            r.desired_generation.to_string(),
            r.applied_generation.to_string(),
            r.operations.to_string(),
            r.audit_lines.to_string(),
        ],
        json,
    )
}

/// A backup's report: its JSON, or a one-row table of `row` (file, bytes, generations,
/// counts).
fn print_backup(whole: &impl serde::Serialize, row: [String; 6], json: bool) -> Result<u8> {
    if json {
        output::json(whole)?;
    } else {
        println!(
            "{}",
            output::table(
                [
                    "BACKUP",
                    "BYTES",
                    "GENERATION",
                    "APPLIED",
                    "OPERATIONS",
                    "AUDIT LINES"
                ],
                [row]
            )
        );
    }
    Ok(EXIT_OK)
}

/// `weft controller restore` on a SQLite store.
fn restore_sqlite(
    db: Option<PathBuf>,
    from: Option<PathBuf>,
    no_fabric: bool,
    cfg: &Config,
    json: bool,
) -> Result<u8> {
    let db = store_path(db, cfg);
    let actor = format!(
        "operator:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    if let Some(from) = from {
        let fabric = fabric_of(no_fabric, cfg)?;
        let r = weft_controller::restore::restore_from_backup(
            &from,
            &db,
            fabric.as_ref(),
            &actor,
            weft_controller::unix_now(),
        )
        .with_context(|| format!("restore of {} from {}", db.display(), from.display()))?;
        return print_restore(&r, json);
    }
    if !db.is_file() {
        return Err(anyhow!(
            "the store {} does not exist: restore works on a store copied back from a backup",
            db.display()
        ));
    }
    let fabric = fabric_of(no_fabric, cfg)?;
    let store = SqliteStore::open_existing(&db)
        .with_context(|| format!("cannot open the store {}", db.display()))?;
    let r = weft_controller::restore::restore(
        &store,
        fabric.as_ref(),
        &actor,
        weft_controller::unix_now(),
    )
    .with_context(|| format!("restore of {}", db.display()))?;
    print_restore(&r, json)
}

fn print_restore(r: &weft_controller::restore::RestoreReport, json: bool) -> Result<u8> {
    if json {
        output::json(r)?;
        return Ok(EXIT_OK);
    }
    println!(
        "{}",
        output::table(
            ["SM", "HOLDS"],
            r.sms.iter().map(|(n, s)| {
                [
                    n.clone(),
                    s.map_or_else(|| "no stamped file".into(), |s| s.to_string()),
                ]
            })
        )
    );
    println!(
        "fencing number {} -> {} (the SMs held at most {}); the store's applied generation is {}",
        r.old_fencing, r.fencing, r.held_fencing, r.applied_generation
    );
    if r.diff.is_empty() {
        println!("its next delivery replaces the master's file with its own state");
    } else {
        println!(
            "its state, delivered once the controller starts, changes the master's file so:\n{}",
            r.diff
                .lines()
                .map(output::clean)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(EXIT_OK)
}

/// `weft controller audit prune`: the lines written before `before` deleted under the line
/// that records it, on the store of `--db`/`--store` (stopped or running controller alike:
/// the prune is one transaction under the store's write lock).
pub(super) fn audit_prune(
    before: u64,
    now: u64,
    db: Option<PathBuf>,
    store: Option<String>,
    cfg: &Config,
    json: bool,
) -> Result<u8> {
    use weft_controller::store::Store;
    let actor = format!(
        "operator:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    let (name, store): (String, Box<dyn Store>) = match postgres_url(store, db.as_ref(), cfg) {
        Some(url) => (
            weft_controller::store::redact(&url),
            Box::new(PgStore::open(&url, false)?),
        ),
        None => {
            let db = store_path(db, cfg);
            let s = SqliteStore::open_existing(&db)
                .with_context(|| format!("cannot open the store {}", db.display()))?;
            (db.display().to_string(), Box::new(s))
        }
    };
    let r = store
        .audit_prune(&actor, before, now)
        .with_context(|| format!("audit prune of {name}"))?;
    if json {
        output::json(&r)?;
    } else {
        let at = |t: Option<u64>| {
            t.map_or_else(
                || "-".to_string(),
                |t| {
                    humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH + std::time::Duration::from_secs(t),
                    )
                    .to_string()
                },
            )
        };
        println!(
            "{}",
            output::table(
                [
                    "STORE",
                    "BEFORE",
                    "DELETED",
                    "OLDEST",
                    "NEWEST",
                    "RECORDED AS"
                ],
                [[
                    name,
                    at(Some(r.before)),
                    r.count.to_string(),
                    at(r.oldest),
                    at(r.newest),
                    format!("audit line {} (audit.prune by {actor})", r.line),
                ]]
            )
        );
    }
    Ok(EXIT_OK)
}
