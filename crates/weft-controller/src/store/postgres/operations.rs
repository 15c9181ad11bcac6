//! Operations on PostgreSQL (the SQL of `../sqlite/operations.rs`): each change's
//! generation and diff, delivery marked applied or failed, and the status.

use postgres::{Row, Transaction};

use super::{audit, meta, meta_i64, secs, set_meta};
use crate::model::{DriftView, OpState, OperationView, StatusView};
use crate::store::{Applied, Result, StoreError, VerifiedDelivery};

pub(super) fn applied(tx: &mut Transaction<'_>) -> Result<Applied> {
    Ok(Applied {
        generation: meta_i64(tx, "applied_generation")?,
        checksum: meta(tx, "applied_checksum")?,
        conf: meta(tx, "applied_conf")?,
    })
}

/// Pending operations up to `generation`: (id, attempts), oldest first.
fn pending_upto(tx: &mut Transaction<'_>, generation: i64) -> Result<Vec<(i64, i64)>> {
    tx.query(
        "SELECT id, attempts FROM operations WHERE state = 'pending' AND generation <= $1 ORDER BY id",
        &[&generation],
    )?
    .iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
    .collect()
}

pub(super) fn mark_applied(
    tx: &mut Transaction<'_>,
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
    let ids = pending_upto(tx, generation)?;
    for (id, attempts) in &ids {
        tx.execute(
            "UPDATE operations SET state = 'applied', finished = $2, warning = $3, taken = $4 WHERE id = $1",
            &[id, &(now as i64), &warning, &taken],
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

pub(super) fn mark_failed(
    tx: &mut Transaction<'_>,
    generation: i64,
    error: &str,
    now: u64,
) -> Result<()> {
    for (id, _) in pending_upto(tx, generation)? {
        tx.execute(
            "UPDATE operations SET attempts = attempts + 1, last_error = $2 WHERE id = $1",
            &[&id, &error],
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

pub(super) fn operations(
    tx: &mut Transaction<'_>,
    pending_only: bool,
) -> Result<Vec<OperationView>> {
    let filter = if pending_only {
        "WHERE state = 'pending'"
    } else {
        ""
    };
    tx.query(
        &format!("SELECT {OP_COLS} FROM operations {filter} ORDER BY id DESC LIMIT 500"),
        &[],
    )?
    .iter()
    .map(op_row)
    .collect()
}

/// The status as the store knows it; `stale_servers` is computed by the caller.
pub(super) fn status(tx: &mut Transaction<'_>, stale_servers: Vec<String>) -> Result<StatusView> {
    Ok(StatusView {
        desired_generation: meta_i64(tx, "desired_generation")?,
        applied_generation: meta_i64(tx, "applied_generation")?,
        applied_checksum: meta(tx, "applied_checksum")?,
        pending_operations: tx
            .query_one(
                "SELECT count(*) FROM operations WHERE state = 'pending'",
                &[],
            )?
            .try_get(0)?,
        stale_servers,
        delivers: false,
        drift: DriftView::default(),
        applied_conf: meta(tx, "applied_conf")?,
        default_policy: crate::render::DEFAULT_POLICY.into(),
    })
}

/// A new pending operation: the desired generation bumped, the change's diff kept.
pub(super) fn new_operation(
    tx: &mut Transaction<'_>,
    actor: &str,
    action: &str,
    diff: &str,
    now: u64,
) -> Result<OperationView> {
    let generation = meta_i64(tx, "desired_generation")? + 1;
    set_meta(tx, "desired_generation", &generation.to_string())?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO operations (id, actor, action, generation, state, diff, created) OVERRIDING SYSTEM VALUE VALUES ((SELECT COALESCE(MAX(id), 0) + 1 FROM operations), $1, $2, $3, 'pending', $4, $5) RETURNING id",
            &[&actor, &action, &generation, &diff, &(now as i64)],
        )?
        .try_get(0)?;
    read_operation(tx, id)
}

fn op_row(r: &Row) -> Result<OperationView> {
    let state: String = r.try_get(5)?;
    Ok(OperationView {
        id: r.try_get(0)?,
        actor: r.try_get(1)?,
        action: r.try_get(2)?,
        generation: r.try_get(3)?,
        attempts: r.try_get(4)?,
        state: if state == "applied" {
            OpState::Applied
        } else {
            OpState::Pending
        },
        last_error: r.try_get(6)?,
        diff: r.try_get(7)?,
        created: secs(r.try_get(8)?),
        finished: r.try_get::<_, Option<i64>>(9)?.map(secs),
        warning: r.try_get(10)?,
        taken: r
            .try_get::<_, String>(11)?
            .lines()
            .map(str::to_string)
            .collect(),
    })
}

const OP_COLS: &str = "id, actor, action, generation, attempts, state, last_error, diff, created, finished, warning, taken";

/// One operation by id.
pub(super) fn read_operation(tx: &mut Transaction<'_>, id: i64) -> Result<OperationView> {
    match tx.query_opt(
        &format!("SELECT {OP_COLS} FROM operations WHERE id = $1"),
        &[&id],
    )? {
        Some(r) => op_row(&r),
        None => Err(StoreError::NotFound(format!("no operation {id}"))),
    }
}
