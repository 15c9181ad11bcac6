//! The web console's sessions ([`ConsoleSession`]).

use rusqlite::{OptionalExtension, Transaction, params};

use super::Result;
use crate::store::ConsoleSession;

pub(super) fn create(
    tx: &Transaction,
    s: &ConsoleSession,
    ttl_s: u64,
    max_live: usize,
) -> Result<()> {
    // Sessions past their life go (a cookie that old is refused as unknown, unaudited).
    tx.execute(
        "DELETE FROM console_sessions WHERE created < ?1",
        [s.created.saturating_sub(ttl_s) as i64],
    )?;
    tx.execute(
        "INSERT INTO console_sessions (id_hash, token_hash, csrf, actor, created) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![s.id_hash, s.token_hash, s.csrf, s.actor, s.created as i64],
    )?;
    // At most `max_live` live: the oldest end first.
    tx.execute(
        "UPDATE console_sessions SET ended = ?1 WHERE ended IS NULL AND id_hash IN \
         (SELECT id_hash FROM console_sessions WHERE ended IS NULL ORDER BY created DESC, id_hash LIMIT -1 OFFSET ?2)",
        params![s.created as i64, max_live as i64],
    )?;
    Ok(())
}

pub(super) fn get(tx: &Transaction, id_hash: &str) -> Result<Option<ConsoleSession>> {
    Ok(tx
        .query_row(
            "SELECT id_hash, token_hash, csrf, actor, created, ended FROM console_sessions WHERE id_hash = ?1",
            [id_hash],
            |r| {
                Ok(ConsoleSession {
                    id_hash: r.get(0)?,
                    token_hash: r.get(1)?,
                    csrf: r.get(2)?,
                    actor: r.get(3)?,
                    created: r.get::<_, i64>(4)?.max(0) as u64,
                    ended: r.get::<_, Option<i64>>(5)?.map(|e| e.max(0) as u64),
                })
            },
        )
        .optional()?)
}

pub(super) fn end(tx: &Transaction, id_hash: &str, now: u64) -> Result<bool> {
    Ok(tx.execute(
        "UPDATE console_sessions SET ended = ?2 WHERE id_hash = ?1 AND ended IS NULL",
        params![id_hash, now as i64],
    )? > 0)
}
