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
