//! Operations: each change's generation and diff, delivery marked applied or failed, and
//! the status (desired against applied).

use rusqlite::{OptionalExtension, Transaction, params};

use super::{audit, meta, meta_i64, secs, set_meta};
use crate::model::{DriftView, OpState, OperationView, StatusView};
use crate::store::{Applied, Result, StoreError, VerifiedDelivery};

pub(super) fn applied(tx: &Transaction) -> Result<Applied> {
    Ok(Applied {
        generation: meta_i64(tx, "applied_generation")?,
        checksum: meta(tx, "applied_checksum")?,
        conf: meta(tx, "applied_conf")?,
    })
}

pub(super) fn mark_applied(
    tx: &Transaction,
    delivered: &VerifiedDelivery<'_>,
    now: u64,
) -> Result<Vec<i64>> {
    let VerifiedDelivery {
        generation,
        checksum,
        conf,
        detail,
        warning,
        taken,
    } = *delivered;
    if generation > meta_i64(tx, "applied_generation")? {
        set_meta(tx, "applied_generation", &generation.to_string())?;
    }
    set_meta(tx, "applied_checksum", checksum)?;
    set_meta(tx, "applied_conf", conf)?;
    let ids: Vec<(i64, i64)> = tx
        .prepare("SELECT id, attempts FROM operations WHERE state = 'pending' AND generation <= ?1 ORDER BY id")?
        .query_map([generation], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    for (id, attempts) in &ids {
        tx.execute(
            "UPDATE operations SET state = 'applied', finished = ?2, warning = ?3, taken = ?4 WHERE id = ?1",
            params![id, now as i64, warning, taken],
        )?;
        let retried = if *attempts > 0 {
            format!(" after {attempts} failed attempt(s)")
        } else {
            String::new()
        };
        audit(
            tx,
            now,
            "controller",
            "apply",
            &format!("operation {id}"),
            "",
            "applied",
            &format!("generation {generation}{retried}: {detail}"),
        )?;
    }
    Ok(ids.into_iter().map(|(id, _)| id).collect())
}

pub(super) fn mark_failed(tx: &Transaction, generation: i64, error: &str, now: u64) -> Result<()> {
    let ids: Vec<i64> = tx
        .prepare(
            "SELECT id FROM operations WHERE state = 'pending' AND generation <= ?1 ORDER BY id",
        )?
        .query_map([generation], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for id in &ids {
        tx.execute(
            "UPDATE operations SET attempts = attempts + 1, last_error = ?2 WHERE id = ?1",
            params![id, error],
        )?;
        audit(
            tx,
            now,
            "controller",
            "apply",
            &format!("operation {id}"),
            "",
            "failed",
            &format!("generation {generation}: {error}; will retry"),
        )?;
    }
    Ok(())
}

pub(super) fn operations(tx: &Transaction, pending_only: bool) -> Result<Vec<OperationView>> {
    let filter = if pending_only {
        "WHERE state = 'pending'"
    } else {
        ""
    };
    Ok(tx
        .prepare(&format!(
            "SELECT {OP_COLS} FROM operations {filter} ORDER BY id DESC LIMIT 500"
        ))?
        .query_map([], op_row)?
        .collect::<Result<_, _>>()?)
}

/// The status as the store knows it; `stale_servers` is computed by the caller (the
/// servers' liveness), drift by the reconcile loop.
pub(super) fn status(tx: &Transaction, stale_servers: Vec<String>) -> Result<StatusView> {
    Ok(StatusView {
        desired_generation: meta_i64(tx, "desired_generation")?,
        applied_generation: meta_i64(tx, "applied_generation")?,
        applied_checksum: meta(tx, "applied_checksum")?,
        pending_operations: tx.query_row(
            "SELECT count(*) FROM operations WHERE state = 'pending'",
            [],
            |r| r.get(0),
        )?,
        stale_servers,
        delivers: false,
        drift: DriftView::default(),
        applied_conf: meta(tx, "applied_conf")?,
        default_policy: crate::render::DEFAULT_POLICY.into(),
    })
}

/// A new pending operation: the desired generation bumped, the change's diff kept.
pub(super) fn new_operation(
    tx: &Transaction,
    actor: &str,
    action: &str,
    diff: &str,
    now: u64,
) -> Result<OperationView> {
    let generation = meta_i64(tx, "desired_generation")? + 1;
    set_meta(tx, "desired_generation", &generation.to_string())?;
    tx.execute(
        "INSERT INTO operations (actor, action, generation, state, diff, created) VALUES (?1, ?2, ?3, 'pending', ?4, ?5)",
        params![actor, action, generation, diff, now as i64],
    )?;
    let id = tx.last_insert_rowid();
    read_operation(tx, id)
}

fn op_row(r: &rusqlite::Row) -> rusqlite::Result<OperationView> {
    let state: String = r.get(5)?;
    Ok(OperationView {
        id: r.get(0)?,
        actor: r.get(1)?,
        action: r.get(2)?,
        generation: r.get(3)?,
        attempts: r.get(4)?,
        state: if state == "applied" {
            OpState::Applied
        } else {
            OpState::Pending
        },
        last_error: r.get(6)?,
        diff: r.get(7)?,
        created: secs(r.get(8)?),
        finished: r.get::<_, Option<i64>>(9)?.map(secs),
        warning: r.get(10)?,
        taken: r
            .get::<_, String>(11)?
            .lines()
            .map(str::to_string)
            .collect(),
    })
}

const OP_COLS: &str = "id, actor, action, generation, attempts, state, last_error, diff, created, finished, warning, taken";

/// One operation by id.
pub(super) fn read_operation(tx: &Transaction, id: i64) -> Result<OperationView> {
    tx.query_row(
        &format!("SELECT {OP_COLS} FROM operations WHERE id = ?1"),
        [id],
        op_row,
    )
    .optional()?
    .ok_or_else(|| StoreError::NotFound(format!("no operation {id}")))
}
