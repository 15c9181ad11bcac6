//! Node leases: the lease loop's state (weft-lease's leases and the tenants' quotas), every
//! decision it took, the warnings the agents read, and one step of the loop committed with
//! the group changes that carry out its moves, in one transaction.

use std::collections::BTreeMap;

use rusqlite::{Transaction, params};
use weft_lease::{Decision, Lease, Phase, Quota};

use super::{audit, groups, secs};
use crate::lease::model::{LeaseDecisionView, LeaseNotice};
use crate::model::OperationView;
use crate::store::{LeaseCommit, LeaseRecords, Result, StoreError};

fn opt_secs(v: Option<i64>) -> Option<u64> {
    v.map(secs)
}

fn sql_u64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn records(tx: &Transaction) -> Result<LeaseRecords> {
    let quotas: BTreeMap<String, Quota> = tx
        .prepare("SELECT tenant, max_nodes, node_seconds, period_s FROM lease_quotas")?
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                Quota {
                    max_nodes: u32::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                    node_seconds: secs(r.get(2)?),
                    period_s: secs(r.get(3)?).max(1),
                },
            ))
        })?
        .collect::<Result<_, _>>()?;
    let mut st = tx.prepare(
        "SELECT id, tenant, nodes_wanted, duration_s, submitted, not_before, same_switch, phase, start_at, end_at, nodes, reason FROM node_leases ORDER BY id",
    )?;
    let rows = st.query_map([], |r| {
        Ok((
            Lease {
                id: secs(r.get(0)?),
                tenant: r.get(1)?,
                nodes_wanted: u32::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
                duration_s: secs(r.get(3)?),
                submitted: secs(r.get(4)?),
                not_before: secs(r.get(5)?),
                same_switch: r.get::<_, i64>(6)? != 0,
                phase: Phase::Refused,
                start: opt_secs(r.get(8)?),
                end: opt_secs(r.get(9)?),
                nodes: r
                    .get::<_, String>(10)?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
                reason: r.get(11)?,
            },
            r.get::<_, String>(7)?,
        ))
    })?;
    let mut leases = Vec::new();
    for row in rows {
        let (mut lease, phase) = row?;
        lease.phase = Phase::parse(&phase).ok_or_else(|| {
            StoreError::Invalid(format!("lease {} has an unknown phase `{phase}`", lease.id))
        })?;
        leases.push(lease);
    }
    Ok(LeaseRecords { leases, quotas })
}

fn upsert(tx: &Transaction, l: &Lease) -> Result<()> {
    tx.execute(
        "INSERT INTO node_leases (id, tenant, nodes_wanted, duration_s, submitted, not_before, same_switch, phase, start_at, end_at, nodes, reason)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT(id) DO UPDATE SET phase = ?8, start_at = ?9, end_at = ?10, nodes = ?11, reason = ?12",
        params![
            sql_u64(l.id),
            l.tenant,
            i64::from(l.nodes_wanted),
            sql_u64(l.duration_s),
            sql_u64(l.submitted),
            sql_u64(l.not_before),
            i64::from(l.same_switch),
            l.phase.as_str(),
            l.start.map(sql_u64),
            l.end.map(sql_u64),
            l.nodes.join(","),
            l.reason,
        ],
    )?;
    Ok(())
}

pub(super) fn commit(
    tx: &Transaction,
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
            "INSERT INTO lease_decisions (lease, at, kind, detail) VALUES (?1, ?2, ?3, ?4)",
            params![lease, sql_u64(now), kind, detail],
        )?;
        let tenant: String = tx
            .query_row(
                "SELECT tenant FROM node_leases WHERE id = ?1",
                [lease],
                |r| r.get(0),
            )
            .unwrap_or_default();
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
                        "INSERT INTO lease_notices (server, lease, end_at) VALUES (?1, ?2, ?3)
                         ON CONFLICT(server) DO UPDATE SET lease = ?2, end_at = ?3",
                        params![n, lease, sql_u64(*end)],
                    )?;
                }
            }
            Decision::Extend { .. } => {
                tx.execute("DELETE FROM lease_notices WHERE lease = ?1", [lease])?;
            }
            Decision::MoveOut { node, .. } => {
                tx.execute("DELETE FROM lease_notices WHERE server = ?1", [node])?;
            }
            _ => {}
        }
    }
    Ok(ops)
}

pub(super) fn set_quota(
    tx: &Transaction,
    actor: &str,
    tenant: &str,
    quota: Option<&Quota>,
    now: u64,
) -> Result<()> {
    if !super::exists(tx, "SELECT 1 FROM tenants WHERE name = ?1", &tenant)? {
        return Err(StoreError::NotFound(format!("no tenant `{tenant}`")));
    }
    let detail = match quota {
        Some(q) => {
            tx.execute(
                "INSERT INTO lease_quotas (tenant, max_nodes, node_seconds, period_s) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(tenant) DO UPDATE SET max_nodes = ?2, node_seconds = ?3, period_s = ?4",
                params![
                    tenant,
                    i64::from(q.max_nodes),
                    sql_u64(q.node_seconds),
                    sql_u64(q.period_s)
                ],
            )?;
            format!(
                "{} nodes at once, {} node-seconds per {} s",
                q.max_nodes, q.node_seconds, q.period_s
            )
        }
        None => {
            tx.execute("DELETE FROM lease_quotas WHERE tenant = ?1", [tenant])?;
            "removed: the tenant cannot lease".into()
        }
    };
    audit(tx, now, actor, "lease.quota", tenant, "", "ok", &detail)
}

pub(super) fn decisions(tx: &Transaction, lease: u64) -> Result<Vec<LeaseDecisionView>> {
    Ok(tx
        .prepare("SELECT at, kind, detail FROM lease_decisions WHERE lease = ?1 ORDER BY id")?
        .query_map([sql_u64(lease)], |r| {
            Ok(LeaseDecisionView {
                at: secs(r.get(0)?),
                kind: r.get(1)?,
                detail: r.get(2)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}

pub(super) fn notices(tx: &Transaction, server: &str) -> Result<Vec<LeaseNotice>> {
    Ok(tx
        .prepare("SELECT lease, end_at FROM lease_notices WHERE server = ?1")?
        .query_map([server], |r| {
            Ok(LeaseNotice {
                lease: secs(r.get(0)?),
                end: secs(r.get(1)?),
            })
        })?
        .collect::<Result<_, _>>()?)
}
