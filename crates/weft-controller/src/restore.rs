//! `weft controller restore`: makes a restored (or stale) store the one that delivers.
//!
//! A store copied back from a backup, or started from an older copy, holds a fencing
//! number and generations the subnet managers have seen pass: every delivery it attempts
//! is refused at the SMs' apply lock (`weft_opensm::Fence`). Restoring it, on a stopped
//! controller, reads what every SM holds, and raises the store's fencing number above
//! the highest one there, with an audit line saying what the SMs held: from then on its
//! deliveries replace theirs (forward: the fencing number never goes back), and any
//! controller still running on the older number is refused in turn.

use serde::Serialize;
use weft_opensm::Stamp;

use crate::reconcile::Fabric;
use crate::store::Store;

/// What a restore found and did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    /// The fencing number the store had.
    pub old_fencing: u64,
    /// The highest fencing number an SM's file held (0: none stamped).
    pub held_fencing: u64,
    /// The store's fencing number now.
    pub fencing: u64,
    /// The store's applied generation (what it verified last).
    pub applied_generation: i64,
    /// Each SM: its name and the stamp of its file (`None`: no file, or no stamp).
    pub sms: Vec<(String, Option<Stamp>)>,
    /// The line diff from the master's file to the store's last verified file: what the
    /// restored store's state puts back or takes away (empty: the master's file is not
    /// this store's lineage's, or there is none).
    pub diff: String,
}

/// Why a restore did not happen; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// An SM's file could not be read: what it holds is unknown.
    #[error("cannot read what SM `{sm}` holds, so the restore cannot know what to fence: {error}")]
    Unreadable {
        /// The SM's configured name (`master` for the master's file).
        sm: String,
        /// Why it could not be read (boxed: the fabric's errors are large).
        #[source]
        error: Box<crate::reconcile::FabricAccessError>,
    },
    /// A controller runs on the store (or could not be ruled out).
    #[error(transparent)]
    Running(#[from] crate::StartError),
    /// The store.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// A PostgreSQL backup could not be loaded.
    #[error(transparent)]
    Dump(#[from] crate::pgdump::DumpError),
}

/// Reads every SM's file through `fabric`, and raises `store`'s fencing number above the
/// highest it finds (audited as `actor`). Holds the store's lease meanwhile: refused while
/// a controller runs on the store.
pub fn restore(
    store: &dyn Store,
    fabric: &dyn Fabric,
    actor: &str,
    now: u64,
) -> Result<RestoreReport, RestoreError> {
    crate::server::while_stopped(store, || restore_held(store, fabric, actor, now))?
}

/// Loads the PostgreSQL backup `dump` ([`crate::pgdump::dump`]'s) into the fresh, empty
/// database at `url` and [`restore`]s it there: the fencing number raised above what the
/// SMs hold. Refused when the database holds any table (never over a store), and when the
/// file is not a `pg_dump` archive.
pub fn restore_from_dump(
    dump: &std::path::Path,
    url: &str,
    fabric: &dyn Fabric,
    actor: &str,
    now: u64,
) -> Result<RestoreReport, RestoreError> {
    crate::pgdump::load(dump, url)?;
    let store = crate::store::PgStore::open(url, false)?;
    // The dump carries its database's leader row; no controller runs on this copy (`load`
    // takes an empty database only), so a lease still live in it is held by nobody here.
    if let Some((holder, _)) = crate::store::Store::leader(&store)? {
        crate::store::Store::resign(&store, &holder)?;
    }
    restore(&store, fabric, actor, now)
}

/// Puts the backup `backup` in place of the store `db` and [`restore`]s it: refused while a
/// controller runs on `db` (its lease), and when the backup is damaged; a `db` that is
/// itself damaged (the reason to restore) is replaced.
pub fn restore_from_backup(
    backup: &std::path::Path,
    db: &std::path::Path,
    fabric: &dyn Fabric,
    actor: &str,
    now: u64,
) -> Result<RestoreReport, RestoreError> {
    use crate::store::SqliteStore;
    if db.exists() {
        match SqliteStore::open_existing(db) {
            Ok(old) => crate::server::while_stopped(&old, || ())?,
            Err(e) => tracing::warn!(error = %e, "replacing a store that does not open"),
        }
    }
    SqliteStore::replace_with_backup(backup, db)?;
    let store = SqliteStore::open_existing(db)?;
    restore(&store, fabric, actor, now)
}

fn restore_held(
    store: &dyn Store,
    fabric: &dyn Fabric,
    actor: &str,
    now: u64,
) -> Result<RestoreReport, RestoreError> {
    let mut sms = Vec::new();
    for (name, file) in fabric.sm_files() {
        let file = file.map_err(|error| RestoreError::Unreadable {
            sm: name.clone(),
            error: Box::new(error),
        })?;
        sms.push((name, file.and_then(|t| weft_opensm::stamp_of(t.as_bytes()))));
    }
    let held = sms
        .iter()
        .filter_map(|(_, s)| s.map(|s| s.fencing))
        .max()
        .unwrap_or(0);
    let old = store.fencing()?.number;
    let applied = store.applied()?;
    // The master's file, when this store's lineage wrote it (its owner header names this
    // store's controller id), becomes the file the store's next delivery replaces.
    let me = store.controller_id()?;
    let master = fabric.held().map_err(|error| RestoreError::Unreadable {
        sm: "master".into(),
        error: Box::new(error),
    })?;
    let ours =
        master.filter(|t| weft_opensm::owner_of(t.as_bytes()).as_deref() == Some(me.as_str()));
    // What the store's last verified state would change on the fabric.
    let diff = ours
        .as_deref()
        .map(|t| crate::render::diff(t, applied.conf.as_deref().unwrap_or_default()))
        .unwrap_or_default();
    let applied = applied.generation;
    let seen: Vec<String> = sms
        .iter()
        .map(|(n, s)| match s {
            Some(s) => format!("SM `{n}` held {s}"),
            None => format!("SM `{n}` held no stamped file"),
        })
        .collect();
    let detail = format!(
        "restore: the store (applied generation {applied}) takes over the subnet managers; {}",
        if seen.is_empty() {
            "no SM configured".to_string()
        } else {
            seen.join("; ")
        }
    );
    let new = store.raise_fencing(actor, held, ours.as_deref(), &diff, &detail, now)?;
    Ok(RestoreReport {
        old_fencing: old,
        held_fencing: held,
        fencing: new,
        applied_generation: applied,
        sms,
        diff,
    })
}
