//! The append-only audit log on PostgreSQL (UPDATE, DELETE and TRUNCATE are refused by
//! triggers of migration 1).

use postgres::Transaction;

use super::secs;
use crate::model::AuditEntry;
use crate::store::{AuditLine, Result};

/// Appends `line`, at `now`.
pub(super) fn append(tx: &mut Transaction<'_>, now: u64, line: &AuditLine<'_>) -> Result<()> {
    tx.execute(
        "INSERT INTO audit (id, at, actor, action, subject, diff, outcome, detail) OVERRIDING SYSTEM VALUE VALUES ((SELECT COALESCE(MAX(id), 0) + 1 FROM audit), $1, $2, $3, $4, $5, $6, $7)",
        &[
            &(now as i64),
            &line.actor,
            &line.action,
            &line.subject,
            &line.diff,
            &line.outcome,
            &line.detail,
        ],
    )?;
    Ok(())
}

/// The newest `limit` lines, oldest first.
pub(super) fn newest(tx: &mut Transaction<'_>, limit: usize) -> Result<Vec<AuditEntry>> {
    let rows = tx.query(
        "SELECT id, at, actor, action, subject, diff, outcome, detail FROM audit ORDER BY id DESC LIMIT $1",
        &[&(i64::try_from(limit).unwrap_or(i64::MAX))],
    )?;
    let mut v: Vec<AuditEntry> = rows
        .iter()
        .map(|r| AuditEntry {
            id: r.get(0),
            at: secs(r.get(1)),
            actor: r.get(2),
            action: r.get(3),
            subject: r.get(4),
            diff: r.get(5),
            outcome: r.get(6),
            detail: r.get(7),
        })
        .collect();
    v.reverse();
    Ok(v)
}

/// A prune of the lines written before `before` ([`crate::store::Store::audit_prune`]):
/// its line first (the newest, so that the delete trigger lets the older ones go), then the
/// delete, which must take exactly the lines counted. The caller holds the write lock, so no
/// other line is written in between.
pub(super) fn prune(
    tx: &mut Transaction<'_>,
    actor: &str,
    before: u64,
    now: u64,
) -> Result<crate::model::AuditPruned> {
    let cut = i64::try_from(before).unwrap_or(i64::MAX);
    let row = tx.query_one(
        "SELECT COUNT(*), MIN(at), MAX(at) FROM audit WHERE at < $1",
        &[&cut],
    )?;
    let count = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
    let oldest = row.get::<_, Option<i64>>(1).map(secs);
    let newest = row.get::<_, Option<i64>>(2).map(secs);
    let (subject, detail) = crate::store::prune_line(before, now, count, oldest, newest)?;
    append(
        tx,
        now,
        &AuditLine {
            actor,
            action: "audit.prune",
            subject: &subject,
            outcome: "ok",
            detail: &detail,
            ..AuditLine::default()
        },
    )?;
    let line: i64 = tx.query_one("SELECT MAX(id) FROM audit", &[])?.get(0);
    let deleted = tx.execute(
        "DELETE FROM audit WHERE at < $1 AND id < $2",
        &[&cut, &line],
    )?;
    if deleted != count {
        return Err(crate::store::StoreError::Db(format!(
            "the audit prune deleted {deleted} lines where it counted {count}; nothing was deleted"
        )));
    }
    Ok(crate::model::AuditPruned {
        line,
        before,
        count,
        oldest,
        newest,
    })
}
