//! The lease that keeps a second controller off the store, and this store's controller id
//! (the SQL of `../sqlite/leases.rs` on PostgreSQL; the row is read `FOR UPDATE`).

use postgres::Transaction;

use super::{meta, secs, set_meta};
use crate::store::Result;

pub(super) fn acquire_lease(
    tx: &mut Transaction<'_>,
    name: &str,
    holder: &str,
    ttl_s: u64,
    now: u64,
    steal: &dyn Fn(&str) -> bool,
) -> Result<Result<(), String>> {
    let row = tx.query_opt(
        "SELECT holder, expires FROM leases WHERE name = $1 FOR UPDATE",
        &[&name],
    )?;
    let row: Option<(String, i64)> = match row {
        Some(r) => Some((r.try_get(0)?, r.try_get(1)?)),
        None => None,
    };
    if let Some((h, expires)) = row
        && h != holder
        && secs(expires) > now
        && !steal(&h)
    {
        return Ok(Err(h));
    }
    let expires = i64::try_from(now.saturating_add(ttl_s)).unwrap_or(i64::MAX);
    tx.execute(
        "INSERT INTO leases (name, holder, expires) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET holder = $2, expires = $3",
        &[&name, &holder, &expires],
    )?;
    Ok(Ok(()))
}

pub(super) fn release_lease(tx: &mut Transaction<'_>, name: &str, holder: &str) -> Result<()> {
    tx.execute(
        "DELETE FROM leases WHERE name = $1 AND holder = $2",
        &[&name, &holder],
    )?;
    Ok(())
}

pub(super) fn controller_id(tx: &mut Transaction<'_>) -> Result<String> {
    if let Some(id) = meta(tx, "controller_id")? {
        return Ok(id);
    }
    let id = crate::store::new_controller_id();
    set_meta(tx, "controller_id", &id)?;
    Ok(id)
}
