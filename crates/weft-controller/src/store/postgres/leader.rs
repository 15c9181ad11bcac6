//! Leader election among the controllers on one database: the one row of the table
//! `leader` (migration 8). The holder renews it; once its `expires` has passed by the
//! database's clock (`now()`), any controller takes it over, raising the fencing number
//! (meta `fencing`, the number every delivery carries into the SMs' apply lock) in the
//! transaction that takes the row, with an audit line. Runs on the store's election
//! connection (see `PgStore::elect`), so a renewal never waits behind an API call.

use postgres::Transaction;

use super::{WRITE_LOCK, fencing};
use crate::store::{Election, Result};

/// One round of the election for `holder` (advertising `url`): renews the lease if it
/// holds it, takes it over if it ran out, or answers who holds it.
pub(super) fn elect(
    tx: &mut Transaction<'_>,
    holder: &str,
    url: Option<&str>,
    ttl_s: u64,
    now: u64,
) -> Result<Election> {
    let ttl = f64::from(u32::try_from(ttl_s).unwrap_or(u32::MAX));
    let row = tx.query_one(
        "SELECT holder, url, fencing, expires > now() FROM leader WHERE id = 1 FOR UPDATE",
        &[],
    )?;
    let (old, old_url, number, live): (String, Option<String>, i64, bool) = (
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
    );
    if old == holder {
        tx.execute(
            "UPDATE leader SET url = $1, expires = now() + make_interval(secs => $2) WHERE id = 1",
            &[&url, &ttl],
        )?;
        return Ok(Election::Leader {
            fencing: u64::try_from(number).unwrap_or(0),
            took_over: false,
        });
    }
    if live {
        return Ok(Election::Follower {
            holder: Some(old),
            url: old_url,
        });
    }
    // A takeover writes the audit and meta: it takes the write lock as every change does
    // (the audit's numbering depends on it).
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK])?;
    let from = if old.is_empty() {
        "no leader before".to_string()
    } else {
        format!("{old}, whose lease ran out by the database's clock")
    };
    let detail = format!(
        "leader election: {holder} ({}) takes over from {from}",
        url.unwrap_or("no advertised URL")
    );
    let new = fencing::raise(
        tx,
        "controller",
        u64::try_from(number).unwrap_or(0),
        None,
        ("", &detail),
        now,
    )?;
    let new_i = i64::try_from(new).unwrap_or(i64::MAX);
    tx.execute(
        "UPDATE leader SET holder = $1, url = $2, fencing = $3, since = now(),
             expires = now() + make_interval(secs => $4) WHERE id = 1",
        &[&holder, &url, &new_i, &ttl],
    )?;
    Ok(Election::Leader {
        fencing: new,
        took_over: true,
    })
}

/// Gives the lease up (a controller stopping): it runs out at once, so that a follower
/// takes over at its next round instead of after the TTL.
pub(super) fn resign(tx: &mut Transaction<'_>, holder: &str) -> Result<()> {
    tx.execute(
        "UPDATE leader SET expires = '-infinity' WHERE id = 1 AND holder = $1",
        &[&holder],
    )?;
    Ok(())
}

/// Who leads now (holder and advertised URL), if a lease is live.
pub(super) fn leader(tx: &mut Transaction<'_>) -> Result<Option<(String, Option<String>)>> {
    let row = tx.query_opt(
        "SELECT holder, url FROM leader WHERE id = 1 AND expires > now()",
        &[],
    )?;
    Ok(match row {
        Some(r) => Some((r.try_get(0)?, r.try_get(1)?)),
        None => None,
    })
}
