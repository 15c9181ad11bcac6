//! Groups and their members: the desired state read from the tables, a [`Change`] carried
//! out (its decisions taken by [`crate::store::rules`]), its operation and audit line, and
//! the partitions adopted from the SMs, whose names and keys groups may not take.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{OptionalExtension, Transaction, params};
use weft_fabric::Guid;

use super::operations::new_operation;
use super::{audit, exists, guid_from_sql, meta, meta_i64, set_meta};
use crate::model::{GroupView, OperationView};
use crate::render::{self, Desired, DesiredGroup};
use crate::store::rules::{self, MemberEdit};
use crate::store::{Change, Result, StoreError};

pub(super) fn groups(tx: &Transaction) -> Result<Vec<GroupView>> {
    Ok(read_desired(tx)?
        .groups
        .into_iter()
        .map(|g| GroupView {
            ports: g
                .members
                .iter()
                .flat_map(|(_, p)| p.iter().copied())
                .collect(),
            members: g.members.into_iter().map(|(s, _)| s).collect(),
            pkey: format!("{:#06x}", g.pkey),
            name: g.name,
            tenant: g.tenant,
        })
        .collect())
}

pub(super) fn change(
    tx: &Transaction,
    actor: &str,
    change: &Change,
    now: u64,
) -> Result<Option<OperationView>> {
    let (action, subject) = change.describe();
    let before = read_desired(tx)?;
    let before_text = render::conf_text(&before).map_err(|e| StoreError::Invalid(e.into()))?;
    apply_change(tx, change, now)?;
    let after = read_desired(tx)?;
    let after_text = render::conf_text(&after).map_err(|e| StoreError::Invalid(e.into()))?;
    let diff = render::diff(&before_text, &after_text);
    if diff.is_empty() {
        audit(
            tx,
            now,
            actor,
            action,
            &subject,
            "",
            "no change",
            "the partitions file stays the same",
        )?;
        return Ok(None);
    }
    let op = new_operation(tx, actor, &format!("{action} {subject}"), &diff, now)?;
    audit(
        tx,
        now,
        actor,
        action,
        &subject,
        &diff,
        "accepted",
        &format!("operation {}, generation {}", op.id, op.generation),
    )?;
    Ok(Some(op))
}

pub(super) fn adopt(
    tx: &Transaction,
    conf: &str,
    pkeys: &[u16],
    names: &[String],
    detail: &str,
    now: u64,
) -> Result<()> {
    for k in pkeys {
        if exists(tx, "SELECT 1 FROM groups WHERE pkey = ?1", &i64::from(*k))? {
            return Err(StoreError::Conflict(format!(
                "P_Key {k:#06x} of an adopted partition is a group's"
            )));
        }
    }
    for n in names {
        if exists(tx, "SELECT 1 FROM groups WHERE name = ?1", n)? {
            return Err(StoreError::Conflict(format!(
                "adopted partition `{n}` has a group's name"
            )));
        }
    }
    let keys: Vec<String> = pkeys.iter().map(u16::to_string).collect();
    set_meta(tx, "adopted_conf", conf)?;
    set_meta(tx, "adopted_pkeys", &keys.join(","))?;
    set_meta(tx, "adopted_names", &names.join(","))?;
    let diff: String = conf.lines().map(|l| format!("+{l}\n")).collect();
    audit(
        tx,
        now,
        "controller",
        "adopt",
        "fabric",
        &diff,
        "adopted",
        detail,
    )
}

/// The desired state: every group with its members and their ports.
pub(super) fn read_desired(tx: &Transaction) -> Result<Desired> {
    let generation = meta_i64(tx, "desired_generation")?;
    let mut groups = Vec::new();
    {
        let mut st = tx.prepare("SELECT name, tenant, pkey FROM groups ORDER BY name")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        for row in rows {
            let (name, tenant, pkey) = row?;
            groups.push(DesiredGroup {
                name,
                tenant,
                pkey: u16::try_from(pkey).unwrap_or(0),
                members: Vec::new(),
            });
        }
    }
    let mut st = tx.prepare(
        "SELECT m.grp, m.server, p.guid FROM members m LEFT JOIN ports p ON p.server = m.server ORDER BY m.grp, m.server, p.guid",
    )?;
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<i64>>(2)?,
        ))
    })?;
    let mut by_group: BTreeMap<String, Vec<(String, Vec<Guid>)>> = BTreeMap::new();
    for row in rows {
        let (grp, server, guid) = row?;
        let members = by_group.entry(grp).or_default();
        if members.last().map(|(s, _)| s != &server).unwrap_or(true) {
            members.push((server, Vec::new()));
        }
        if let (Some(g), Some(last)) = (guid, members.last_mut()) {
            last.1.push(guid_from_sql(g));
        }
    }
    for g in &mut groups {
        g.members = by_group.remove(&g.name).unwrap_or_default();
    }
    Ok(Desired { generation, groups })
}

/// The group `server` is in.
pub(super) fn group_of(tx: &Transaction, server: &str) -> Result<Option<String>> {
    Ok(tx
        .query_row("SELECT grp FROM members WHERE server = ?1", [server], |r| {
            r.get(0)
        })
        .optional()?)
}

/// `NotFound` unless `server` exists.
pub(super) fn need_server(tx: &Transaction, server: &str) -> Result<()> {
    if exists(tx, "SELECT 1 FROM servers WHERE name = ?1", &server)? {
        Ok(())
    } else {
        Err(StoreError::NotFound(format!("no server `{server}`")))
    }
}

fn need_group(tx: &Transaction, group: &str) -> Result<()> {
    if exists(tx, "SELECT 1 FROM groups WHERE name = ?1", &group)? {
        Ok(())
    } else {
        Err(StoreError::NotFound(format!("no group `{group}`")))
    }
}

/// Carries out `change` on the tables, its decisions taken by [`rules`].
fn apply_change(tx: &Transaction, change: &Change, now: u64) -> Result<()> {
    match change {
        Change::CreateGroup { name, tenant } => {
            rules::group_name(name)?;
            if !exists(tx, "SELECT 1 FROM tenants WHERE name = ?1", tenant)? {
                return Err(StoreError::NotFound(format!("no tenant `{tenant}`")));
            }
            if exists(tx, "SELECT 1 FROM groups WHERE name = ?1", name)? {
                return Err(StoreError::Conflict(format!("group `{name}` exists")));
            }
            let adopted_names = meta(tx, "adopted_names")?;
            rules::not_adopted(name, adopted_names.iter().flat_map(|n| n.split(',')))?;
            let mut taken: BTreeSet<u16> = tx
                .prepare("SELECT pkey FROM groups")?
                .query_map([], |r| r.get::<_, i64>(0))?
                .filter_map(|k| k.map(|k| u16::try_from(k).ok()).transpose())
                .collect::<Result<_, _>>()?;
            // Keys of adopted partitions are taken too.
            taken.extend(
                meta(tx, "adopted_pkeys")?
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|k| k.parse::<u16>().ok()),
            );
            let pkey = rules::group_pkey(&taken)?;
            tx.execute(
                "INSERT INTO groups (name, tenant, pkey, created) VALUES (?1, ?2, ?3, ?4)",
                params![name, tenant, pkey, now as i64],
            )?;
        }
        Change::AddMember { group, server } | Change::Move { server, to: group } => {
            need_group(tx, group)?;
            need_server(tx, server)?;
            member_edit(tx, change, server)?;
        }
        Change::RemoveMember { group, server } => {
            need_group(tx, group)?;
            member_edit(tx, change, server)?;
        }
        Change::DeleteGroup { group } => {
            need_group(tx, group)?;
            tx.execute("DELETE FROM members WHERE grp = ?1", [group])?;
            tx.execute("DELETE FROM groups WHERE name = ?1", [group])?;
        }
        Change::ApproveClaim { id } => {
            let row: Option<(i64, String, String)> = tx
                .query_row(
                    "SELECT guid, claimant, state FROM claims WHERE id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            let Some((guid, claimant, state)) = row else {
                return Err(StoreError::NotFound(format!("no claim {id}")));
            };
            if state != "pending" {
                return Err(StoreError::Conflict(format!("claim {id} is {state}")));
            }
            tx.execute(
                "UPDATE ports SET server = ?2 WHERE guid = ?1",
                params![guid, claimant],
            )?;
            tx.execute(
                "UPDATE claims SET state = 'approved', decided = ?2 WHERE id = ?1",
                params![id, now as i64],
            )?;
            // Other pending claims on the same GUID are moot now.
            tx.execute(
                "UPDATE claims SET state = 'rejected', decided = ?2 WHERE guid = ?1 AND state = 'pending'",
                params![guid, now as i64],
            )?;
        }
    }
    Ok(())
}

/// Writes what [`rules::member_edit`] decides for `server`.
fn member_edit(tx: &Transaction, change: &Change, server: &str) -> Result<()> {
    let current = group_of(tx, server)?;
    match rules::member_edit(change, current.as_deref()) {
        None => Ok(()),
        Some(Err(e)) => Err(e),
        Some(Ok(MemberEdit::Insert(group))) => {
            tx.execute(
                "INSERT INTO members (server, grp) VALUES (?1, ?2)",
                params![server, group],
            )?;
            Ok(())
        }
        Some(Ok(MemberEdit::Update(group))) => {
            tx.execute(
                "UPDATE members SET grp = ?2 WHERE server = ?1",
                params![server, group],
            )?;
            Ok(())
        }
        Some(Ok(MemberEdit::Delete)) => {
            tx.execute("DELETE FROM members WHERE server = ?1", [server])?;
            Ok(())
        }
    }
}
