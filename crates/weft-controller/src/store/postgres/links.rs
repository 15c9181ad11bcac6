//! Runs of link measurements on PostgreSQL (the SQL of `../sqlite/links.rs`).

use postgres::Transaction;

use super::{audit, secs};
use crate::links::{LinkRunIn, LinkRunView, LinkSource, MAX_RUNS};
use crate::store::{Result, StoreError};

pub(super) fn add(
    tx: &mut Transaction<'_>,
    actor: &str,
    run: &LinkRunIn,
    now: u64,
) -> Result<LinkRunView> {
    let json = serde_json::to_string(&run.results)
        .map_err(|e| StoreError::Invalid(format!("link results: {e}")))?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO link_runs (at, source, actor, results) VALUES ($1, $2, $3, $4) RETURNING id",
            &[&(now as i64), &run.source.as_str(), &actor, &json],
        )?
        .get(0);
    tx.execute("DELETE FROM link_runs WHERE id <= $1", &[&(id - MAX_RUNS)])?;
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

pub(super) fn newest(tx: &mut Transaction<'_>, limit: usize) -> Result<Vec<LinkRunView>> {
    let rows = tx.query(
        "SELECT id, at, source, actor, results FROM link_runs ORDER BY id DESC LIMIT $1",
        &[&i64::try_from(limit).unwrap_or(i64::MAX)],
    )?;
    let mut out = Vec::new();
    for r in rows {
        let source: String = r.get(2);
        let results: String = r.get(4);
        // A row this version cannot read is left out rather than failing every listing.
        let (Some(source), Ok(results)) =
            (LinkSource::parse(&source), serde_json::from_str(&results))
        else {
            continue;
        };
        out.push(LinkRunView {
            id: r.get(0),
            at: secs(r.get(1)),
            source,
            actor: r.get(3),
            results,
        });
    }
    Ok(out)
}
