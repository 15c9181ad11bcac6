//! Node leases on PostgreSQL (the SQL of `../sqlite/node_leases.rs`): the lease loop's
//! state (weft-lease's leases and the tenants' quotas), every decision it took, the
//! warnings the agents read, and one step of the loop committed with the group changes
//! that carry out its moves, in one transaction.

use std::collections::BTreeMap;

use postgres::Transaction;
use weft_lease::{Decision, Lease, Phase, Quota};

use super::{audit, exists, groups, secs};
use crate::lease::model::{LeaseDecisionView, LeaseNotice};
use crate::model::OperationView;
use crate::store::{LeaseCommit, LeaseRecords, Result, StoreError};

fn sql_u64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn records(tx: &mut Transaction<'_>) -> Result<LeaseRecords> {
    let mut quotas = BTreeMap::new();
    for r in tx.query(
        "SELECT tenant, max_nodes, node_seconds, period_s FROM lease_quotas",
        &[],
    )? {
        quotas.insert(
            r.try_get::<_, String>(0)?,
            Quota {
                max_nodes: u32::try_from(r.try_get::<_, i64>(1)?).unwrap_or(0),
                node_seconds: secs(r.try_get(2)?),
                period_s: secs(r.try_get(3)?).max(1),
            },
        );
    }
    let mut leases = Vec::new();
    for r in tx.query(
        "SELECT id, tenant, nodes_wanted, duration_s, submitted, not_before, same_switch, phase, start_at, end_at, nodes, reason FROM node_leases ORDER BY id",
        &[],
    )? {
        let id = secs(r.try_get(0)?);
        let phase: String = r.try_get(7)?;
        let phase = Phase::parse(&phase).ok_or_else(|| {
            StoreError::Invalid(format!("lease {id} has an unknown phase `{phase}`"))
        })?;
        leases.push(Lease {
            id,
            tenant: r.try_get(1)?,
            nodes_wanted: u32::try_from(r.try_get::<_, i64>(2)?).unwrap_or(0),
            duration_s: secs(r.try_get(3)?),
            submitted: secs(r.try_get(4)?),
            not_before: secs(r.try_get(5)?),
            same_switch: r.try_get::<_, i64>(6)? != 0,
            phase,
            start: r.try_get::<_, Option<i64>>(8)?.map(secs),
            end: r.try_get::<_, Option<i64>>(9)?.map(secs),
            nodes: r
                .try_get::<_, String>(10)?
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            reason: r.try_get(11)?,
        });
    }
    Ok(LeaseRecords { leases, quotas })
}

fn upsert(tx: &mut Transaction<'_>, l: &Lease) -> Result<()> {
    tx.execute(
        "INSERT INTO node_leases (id, tenant, nodes_wanted, duration_s, submitted, not_before, same_switch, phase, start_at, end_at, nodes, reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         ON CONFLICT (id) DO UPDATE SET phase = $8, start_at = $9, end_at = $10, nodes = $11, reason = $12",
        &[
            &sql_u64(l.id),
            &l.tenant,
            &i64::from(l.nodes_wanted),
            &sql_u64(l.duration_s),
            &sql_u64(l.submitted),
            &sql_u64(l.not_before),
            &i64::from(l.same_switch),
            &l.phase.as_str(),
            &l.start.map(sql_u64),
            &l.end.map(sql_u64),
            &l.nodes.join(","),
            &l.reason,
        ],
    )?;
    Ok(())
}

pub(super) fn commit(
    tx: &mut Transaction<'_>,
    c: &LeaseCommit<'_>,
    now: u64,
) -> Result<Vec<OperationView>> {
    for l in c.leases {
        upsert(tx, l)?;
    }
    let mut ops = Vec::new();
    for change in c.changes {
        if let Some(op) = groups::change(tx, c.actor, change, now)? {
            ops.push(op);
        }
    }
    for d in c.decisions {
        let lease = sql_u64(d.lease());
        let (kind, detail) = (d.kind(), d.detail());
        tx.execute(
            "INSERT INTO lease_decisions (id, lease, at, kind, detail) OVERRIDING SYSTEM VALUE VALUES ((SELECT COALESCE(MAX(id), 0) + 1 FROM lease_decisions), $1, $2, $3, $4)",
            &[&lease, &sql_u64(now), &kind, &detail],
        )?;
        // A decision about a lease not stored names no tenant, as on SQLite.
        let tenant: String =
            match tx.query_opt("SELECT tenant FROM node_leases WHERE id = $1", &[&lease])? {
                Some(r) => r.try_get(0)?,
                None => String::new(),
            };
        audit(
            tx,
            now,
            c.actor,
            &format!("lease.{kind}"),
            &format!("lease {lease} ({tenant})"),
            "",
            "decided",
            &detail,
        )?;
        match d {
            Decision::Warn { nodes, end, .. } => {
                for n in nodes {
                    tx.execute(
                        "INSERT INTO lease_notices (server, lease, end_at) VALUES ($1, $2, $3)
                         ON CONFLICT (server) DO UPDATE SET lease = $2, end_at = $3",
                        &[n, &lease, &sql_u64(*end)],
                    )?;
                }
            }
            Decision::Extend { .. } => {
                tx.execute("DELETE FROM lease_notices WHERE lease = $1", &[&lease])?;
            }
            Decision::MoveOut { node, .. } => {
                tx.execute("DELETE FROM lease_notices WHERE server = $1", &[node])?;
            }
            _ => {}
        }
    }
    Ok(ops)
}

pub(super) fn set_quota(
    tx: &mut Transaction<'_>,
    actor: &str,
    tenant: &str,
    quota: Option<&Quota>,
    now: u64,
) -> Result<()> {
    if !exists(tx, "SELECT 1 FROM tenants WHERE name = $1", &tenant)? {
        return Err(StoreError::NotFound(format!("no tenant `{tenant}`")));
    }
    let detail = match quota {
        Some(q) => {
            tx.execute(
                "INSERT INTO lease_quotas (tenant, max_nodes, node_seconds, period_s) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (tenant) DO UPDATE SET max_nodes = $2, node_seconds = $3, period_s = $4",
                &[
                    &tenant,
                    &i64::from(q.max_nodes),
                    &sql_u64(q.node_seconds),
                    &sql_u64(q.period_s),
                ],
            )?;
            format!(
                "{} nodes at once, {} node-seconds per {} s",
                q.max_nodes, q.node_seconds, q.period_s
            )
        }
        None => {
            tx.execute("DELETE FROM lease_quotas WHERE tenant = $1", &[&tenant])?;
            "removed: the tenant cannot lease".into()
        }
    };
    audit(tx, now, actor, "lease.quota", tenant, "", "ok", &detail)
}

pub(super) fn decisions(tx: &mut Transaction<'_>, lease: u64) -> Result<Vec<LeaseDecisionView>> {
    tx.query(
        "SELECT at, kind, detail FROM lease_decisions WHERE lease = $1 ORDER BY id",
        &[&sql_u64(lease)],
    )?
    .iter()
    .map(|r| {
        Ok(LeaseDecisionView {
            at: secs(r.try_get(0)?),
            kind: r.try_get(1)?,
            detail: r.try_get(2)?,
        })
    })
    .collect()
}

pub(super) fn notices(tx: &mut Transaction<'_>, server: &str) -> Result<Vec<LeaseNotice>> {
    tx.query(
        "SELECT lease, end_at FROM lease_notices WHERE server = $1",
        &[&server],
    )?
    .iter()
    .map(|r| {
        Ok(LeaseNotice {
            lease: secs(r.try_get(0)?),
            end: secs(r.try_get(1)?),
        })
    })
    .collect()
}
