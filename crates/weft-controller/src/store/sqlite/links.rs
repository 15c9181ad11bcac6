//! Runs of link measurements (`--report-to`), newest [`crate::links::MAX_RUNS`] kept.

use rusqlite::{Transaction, params};

use super::{audit, secs};
use crate::links::{LinkRunIn, LinkRunView, LinkSource, MAX_RUNS};
use crate::store::{Result, StoreError};

pub(super) fn add(tx: &Transaction, actor: &str, run: &LinkRunIn, now: u64) -> Result<LinkRunView> {
    let json = serde_json::to_string(&run.results)
        .map_err(|e| StoreError::Invalid(format!("link results: {e}")))?;
    tx.execute(
        "INSERT INTO link_runs (at, source, actor, results) VALUES (?1, ?2, ?3, ?4)",
        params![now as i64, run.source.as_str(), actor, json],
    )?;
    let id = tx.last_insert_rowid();
    tx.execute("DELETE FROM link_runs WHERE id <= ?1", [id - MAX_RUNS])?;
    audit(
        tx,
        now,
        actor,
        "links.report",
        &format!("run {id}"),
        "",
        "ok",
        &format!(
            "{} link(s) measured by {}",
            run.results.len(),
            run.source.as_str()
        ),
    )?;
    Ok(LinkRunView {
        id,
        at: now,
        source: run.source,
        actor: actor.to_string(),
        results: run.results.clone(),
    })
}

pub(super) fn newest(tx: &Transaction, limit: usize) -> Result<Vec<LinkRunView>> {
    let mut st = tx.prepare(
        "SELECT id, at, source, actor, results FROM link_runs ORDER BY id DESC LIMIT ?1",
    )?;
    let rows = st.query_map([i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, String>(4)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, at, source, actor, results) = row?;
        // A row this version cannot read (another version's source or shape) is left out
        // rather than failing every listing.
        let (Some(source), Ok(results)) =
            (LinkSource::parse(&source), serde_json::from_str(&results))
        else {
            continue;
        };
        out.push(LinkRunView {
            id,
            at: secs(at),
            source,
            actor,
            results,
        });
    }
    Ok(out)
}
