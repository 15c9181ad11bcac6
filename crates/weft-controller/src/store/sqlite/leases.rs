//! The lease that keeps a second controller off the store, and this store's controller id.

use rusqlite::{OptionalExtension, Transaction, params};

use super::{meta, secs, set_meta};
use crate::store::Result;

pub(super) fn acquire_lease(
    tx: &Transaction,
    name: &str,
    holder: &str,
    ttl_s: u64,
    now: u64,
    steal: &dyn Fn(&str) -> bool,
) -> Result<Result<(), String>> {
    let row: Option<(String, i64)> = tx
        .query_row(
            "SELECT holder, expires FROM leases WHERE name = ?1",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((h, expires)) = row
        && h != holder
        && secs(expires) > now
        && !steal(&h)
    {
        return Ok(Err(h));
    }
    let expires = i64::try_from(now.saturating_add(ttl_s)).unwrap_or(i64::MAX);
    tx.execute(
        "INSERT INTO leases (name, holder, expires) VALUES (?1, ?2, ?3)
         ON CONFLICT(name) DO UPDATE SET holder = ?2, expires = ?3",
        params![name, holder, expires],
    )?;
    Ok(Ok(()))
}

pub(super) fn release_lease(tx: &Transaction, name: &str, holder: &str) -> Result<()> {
    tx.execute(
        "DELETE FROM leases WHERE name = ?1 AND holder = ?2",
        params![name, holder],
    )?;
    Ok(())
}

pub(super) fn controller_id(tx: &Transaction) -> Result<String> {
    if let Some(id) = meta(tx, "controller_id")? {
        return Ok(id);
    }
    let id = crate::store::new_controller_id();
    set_meta(tx, "controller_id", &id)?;
    Ok(id)
}
