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

/// A prune of the lines written before `before` ([`crate::store::Store::audit_prune`]):
/// its line first (the newest, so that the delete trigger lets the older ones go), then the
/// delete, which must take exactly the lines counted.
pub(super) fn prune(
    tx: &Transaction,
    actor: &str,
    before: u64,
    now: u64,
) -> Result<crate::model::AuditPruned> {
    let cut = i64::try_from(before).unwrap_or(i64::MAX);
    let (count, oldest, newest): (i64, Option<i64>, Option<i64>) = tx.query_row(
        "SELECT COUNT(*), MIN(at), MAX(at) FROM audit WHERE at < ?1",
        [cut],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let count = u64::try_from(count).unwrap_or(0);
    let (oldest, newest) = (oldest.map(secs), newest.map(secs));
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
    let line = tx.last_insert_rowid();
    let deleted = tx.execute(
        "DELETE FROM audit WHERE at < ?1 AND id < ?2",
        params![cut, line],
    )?;
    if deleted as u64 != count {
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
