//! The append-only audit log: writing a line and reading the newest ones.

use rusqlite::{Transaction, params};

use super::secs;
use crate::model::AuditEntry;
use crate::store::{AuditLine, Result};

/// Appends `line`, at `now`.
pub(super) fn append(tx: &Transaction, now: u64, line: &AuditLine<'_>) -> Result<()> {
    tx.execute(
        "INSERT INTO audit (at, actor, action, subject, diff, outcome, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            now as i64,
            line.actor,
            line.action,
            line.subject,
            line.diff,
            line.outcome,
            line.detail
        ],
    )?;
    Ok(())
}

/// The newest `limit` lines, oldest first.
pub(super) fn newest(tx: &Transaction, limit: usize) -> Result<Vec<AuditEntry>> {
    let mut v: Vec<AuditEntry> = tx
        .prepare("SELECT id, at, actor, action, subject, diff, outcome, detail FROM audit ORDER BY id DESC LIMIT ?1")?
        .query_map([limit as i64], |r| {
            Ok(AuditEntry {
                id: r.get(0)?,
                at: secs(r.get(1)?),
                actor: r.get(2)?,
                action: r.get(3)?,
                subject: r.get(4)?,
                diff: r.get(5)?,
                outcome: r.get(6)?,
                detail: r.get(7)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    v.reverse();
    Ok(v)
}
