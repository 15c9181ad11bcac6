//! Servers and what their agents report, on PostgreSQL (the SQL of `../sqlite/servers.rs`):
//! enrollment, agent secrets, port reports (with ownership and pending claims),
//! heartbeats, claims, GPUs, and forgetting a server.

use std::collections::{BTreeMap, HashMap};

use postgres::Transaction;
use weft_fabric::Guid;

use super::groups::{group_of, need_server, read_desired};
use super::operations::new_operation;
use super::{audit, exists, guid_from_sql, guid_to_sql, num, secs};
use crate::model::{ClaimView, HostLinks, Liveness, PortView, ReportAck, ServerView};
use crate::render;
use crate::store::{ReportOutcome, ReportedPort, Result, StoreError};

pub(super) fn create_enrollment(
    tx: &mut Transaction<'_>,
    actor: &str,
    hash: &str,
    server: Option<&str>,
    expires: u64,
    now: u64,
) -> Result<()> {
    tx.execute(
        "INSERT INTO enrollments (hash, server, expires, created_by) VALUES ($1, $2, $3, $4)",
        &[&hash, &server, &(expires as i64), &actor],
    )?;
    audit(
        tx,
        now,
        actor,
        "enrollment.create",
        server.unwrap_or("any host"),
        "",
        "ok",
        &format!("expires {expires}"),
    )
}

/// The server an agent secret belongs to (`$1`: the secret's hash).
pub(super) const AGENT_SQL: &str = "SELECT name FROM servers WHERE secret_hash = $1";

pub(super) fn report(
    tx: &mut Transaction<'_>,
    server: &str,
    ports: &[ReportedPort],
    report_hash: &str,
    now: u64,
) -> Result<ReportOutcome> {
    let previous: Option<String> = match tx.query_opt(
        "SELECT report_hash FROM servers WHERE name = $1",
        &[&server],
    )? {
        Some(r) => r.try_get(0)?,
        None => return Err(StoreError::NotFound(format!("no server `{server}`"))),
    };
    tx.execute(
        "UPDATE servers SET last_seen = $2, report_hash = $3 WHERE name = $1",
        &[&server, &(now as i64), &report_hash],
    )?;
    let mut desired_changed = false;
    if previous.as_deref() != Some(report_hash) {
        let before = read_desired(tx)?;
        let reported: Vec<i64> = ports.iter().map(|p| guid_to_sql(p.guid)).collect();
        // Ports this server owned and no longer reports (an HCA removed or replaced).
        let owned: Vec<i64> = tx
            .query(
                "SELECT guid FROM ports WHERE server = $1 ORDER BY guid",
                &[&server],
            )?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        // One audit line for the report, not one per port: a report that drops a
        // thousand ports is one change.
        let gone: Vec<&i64> = owned.iter().filter(|g| !reported.contains(g)).collect();
        for g in &gone {
            tx.execute("DELETE FROM ports WHERE guid = $1", &[*g])?;
        }
        if !gone.is_empty() {
            let mut named: Vec<String> = gone
                .iter()
                .take(8)
                .map(|g| guid_from_sql(**g).to_string())
                .collect();
            if gone.len() > named.len() {
                named.push(format!("and {} more", gone.len() - named.len()));
            }
            audit(
                tx,
                now,
                &format!("agent:{server}"),
                "port.gone",
                server,
                "",
                "ok",
                &format!(
                    "{} port(s) no longer reported: {}",
                    gone.len(),
                    named.join(", ")
                ),
            )?;
        }
        for p in ports {
            let (guid, pnum, lid) = (guid_to_sql(p.guid), i64::from(p.num), i64::from(p.lid));
            let mtu = p.mtu.map(i64::from);
            match port_owner(tx, p.guid)? {
                Some(o) if o != server => {
                    let pending = tx
                        .query_opt(
                            "SELECT 1 FROM claims WHERE guid = $1 AND claimant = $2 AND state = 'pending'",
                            &[&guid, &server],
                        )?
                        .is_some();
                    if !pending {
                        tx.execute(
                            "INSERT INTO claims (id, guid, claimant, owner, state, created) OVERRIDING SYSTEM VALUE VALUES ((SELECT COALESCE(MAX(id), 0) + 1 FROM claims), $1, $2, $3, 'pending', $4)",
                            &[&guid, &server, &o, &(now as i64)],
                        )?;
                        audit(
                            tx,
                            now,
                            &format!("agent:{server}"),
                            "claim.pending",
                            &p.guid.to_string(),
                            "",
                            "pending",
                            &format!("owned by `{o}`; needs an admin's approval"),
                        )?;
                    }
                }
                Some(_) => {
                    tx.execute(
                        "UPDATE ports SET device = $2, num = $3, lid = $4, state = $5, rate = $6, mtu = $7 WHERE guid = $1",
                        &[&guid, &p.device, &pnum, &lid, &p.state, &p.rate, &mtu],
                    )?;
                }
                None => {
                    tx.execute(
                        "INSERT INTO ports (guid, server, device, num, lid, state, rate, mtu) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                        &[&guid, &server, &p.device, &pnum, &lid, &p.state, &p.rate, &mtu],
                    )?;
                }
            }
        }
        let after = read_desired(tx)?;
        if after.groups != before.groups {
            let (b, a) = (render::conf_text(&before), render::conf_text(&after));
            let diff = match (&b, &a) {
                (Ok(b), Ok(a)) => render::diff(b, a),
                _ => String::new(),
            };
            let op = new_operation(
                tx,
                &format!("agent:{server}"),
                &format!("ports of {server} changed"),
                &diff,
                now,
            )?;
            audit(
                tx,
                now,
                &format!("agent:{server}"),
                "ports.change",
                server,
                &diff,
                "accepted",
                &format!("operation {}, generation {}", op.id, op.generation),
            )?;
            desired_changed = true;
        }
    }
    let mut owned = Vec::new();
    let mut pending = Vec::new();
    for p in ports {
        if port_owner(tx, p.guid)?.as_deref() == Some(server) {
            owned.push(p.guid);
        } else {
            pending.push(p.guid);
        }
    }
    Ok(ReportOutcome {
        ack: ReportAck {
            server: server.to_string(),
            owned,
            pending,
        },
        desired_changed,
    })
}

pub(super) fn heartbeat(tx: &mut Transaction<'_>, server: &str, now: u64) -> Result<()> {
    tx.execute(
        "UPDATE servers SET last_seen = $2 WHERE name = $1",
        &[&server, &(now as i64)],
    )?;
    Ok(())
}

/// Every server, in five statements whatever their number (servers with their groups,
/// then every port, pending claim, links and GPUs, put to their servers here).
pub(super) fn servers(
    tx: &mut Transaction<'_>,
    now: u64,
    stale_after_s: u64,
) -> Result<Vec<ServerView>> {
    let rows = tx.query(
        "SELECT s.name, s.last_seen, m.grp FROM servers s LEFT JOIN members m ON m.server = s.name ORDER BY s.name",
        &[],
    )?;
    let mut ports: HashMap<String, Vec<PortView>> = HashMap::new();
    for r in tx.query(
        "SELECT server, guid, device, num, lid, state, rate, mtu FROM ports ORDER BY server, device, num, guid",
        &[],
    )? {
        ports.entry(r.try_get(0)?).or_default().push(PortView {
            guid: guid_from_sql(r.try_get(1)?),
            device: r.try_get(2)?,
            num: num(r.try_get(3)?, "port number")?,
            lid: num(r.try_get(4)?, "LID")?,
            state: r.try_get(5)?,
            rate: r.try_get(6)?,
            mtu: r
                .try_get::<_, Option<i64>>(7)?
                .map(|m| num(m, "MTU"))
                .transpose()?,
        });
    }
    let mut claims: HashMap<String, Vec<Guid>> = HashMap::new();
    for r in tx.query(
        "SELECT claimant, guid FROM claims WHERE state = 'pending' ORDER BY claimant, guid",
        &[],
    )? {
        claims
            .entry(r.try_get(0)?)
            .or_default()
            .push(guid_from_sql(r.try_get(1)?));
    }
    let mut links: HashMap<String, String> = HashMap::new();
    for r in tx.query("SELECT server, links FROM server_links", &[])? {
        links.insert(r.try_get(0)?, r.try_get(1)?);
    }
    let mut gpus: HashMap<String, String> = HashMap::new();
    for r in tx.query("SELECT server, gpus FROM server_gpus", &[])? {
        gpus.insert(r.try_get(0)?, r.try_get(1)?);
    }
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let name: String = row.try_get(0)?;
        let last_seen = row.try_get::<_, Option<i64>>(1)?.map(secs);
        let group: Option<String> = row.try_get(2)?;
        let liveness = match last_seen {
            None => Liveness::Never,
            Some(t) if now.saturating_sub(t) > stale_after_s => Liveness::Stale,
            Some(_) => Liveness::Ok,
        };
        // A row that does not parse (written by another version) reads as none rather
        // than failing every listing.
        let host_links: HostLinks = links
            .remove(&name)
            .and_then(|j| serde_json::from_str(&j).ok())
            .unwrap_or_default();
        let host_gpus: Vec<weft_agent::Gpu> = gpus
            .remove(&name)
            .and_then(|j| serde_json::from_str(&j).ok())
            .unwrap_or_default();
        out.push(ServerView {
            ports: ports.remove(&name).unwrap_or_default(),
            pending_claims: claims.remove(&name).unwrap_or_default(),
            name,
            liveness,
            last_seen,
            group,
            roce: host_links.roce,
            nics: host_links.nics,
            gpus: host_gpus,
        });
    }
    Ok(out)
}

pub(super) fn remove_server(
    tx: &mut Transaction<'_>,
    actor: &str,
    name: &str,
    now: u64,
) -> Result<()> {
    need_server(tx, name)?;
    if let Some(g) = group_of(tx, name)? {
        return Err(StoreError::Conflict(format!(
            "server `{name}` is in group `{g}`; remove it from the group first"
        )));
    }
    tx.execute("DELETE FROM claims WHERE claimant = $1", &[&name])?;
    let ports = tx.execute("DELETE FROM ports WHERE server = $1", &[&name])?;
    tx.execute("DELETE FROM server_links WHERE server = $1", &[&name])?;
    tx.execute("DELETE FROM server_gpus WHERE server = $1", &[&name])?;
    tx.execute("DELETE FROM servers WHERE name = $1", &[&name])?;
    audit(
        tx,
        now,
        actor,
        "server.remove",
        name,
        "",
        "ok",
        &format!("{ports} port(s) forgotten; its agent secret no longer works"),
    )
}

pub(super) fn reject_claim(tx: &mut Transaction<'_>, actor: &str, id: i64, now: u64) -> Result<()> {
    let n = tx.execute(
        "UPDATE claims SET state = 'rejected', decided = $2 WHERE id = $1 AND state = 'pending'",
        &[&id, &(now as i64)],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("no pending claim {id}")));
    }
    audit(
        tx,
        now,
        actor,
        "claim.reject",
        &format!("claim {id}"),
        "",
        "ok",
        "",
    )
}

pub(super) fn claims(tx: &mut Transaction<'_>) -> Result<Vec<ClaimView>> {
    tx.query(
        "SELECT id, guid, claimant, owner, state, created FROM claims ORDER BY id",
        &[],
    )?
    .iter()
    .map(|r| {
        Ok(ClaimView {
            id: r.try_get(0)?,
            guid: guid_from_sql(r.try_get(1)?),
            claimant: r.try_get(2)?,
            owner: r.try_get(3)?,
            state: r.try_get(4)?,
            created: secs(r.try_get(5)?),
        })
    })
    .collect()
}

pub(super) fn gpus(tx: &mut Transaction<'_>) -> Result<BTreeMap<String, Vec<weft_agent::Gpu>>> {
    // Joined with servers: a removed server's last report is not shown.
    let rows = tx.query(
        "SELECT g.server, g.gpus FROM server_gpus g JOIN servers s ON s.name = g.server",
        &[],
    )?;
    let mut out = BTreeMap::new();
    for row in rows {
        let server: String = row.try_get(0)?;
        let json: String = row.try_get(1)?;
        // Written by set_gpus from the same type; a row that does not parse (a
        // downgrade) reads as no GPUs rather than failing every listing.
        let gpus: Vec<weft_agent::Gpu> = serde_json::from_str(&json).unwrap_or_default();
        if !gpus.is_empty() {
            out.insert(server, gpus);
        }
    }
    Ok(out)
}

/// The transaction of an enrollment: `Ok(Err(why))` is a refusal, which changed nothing
/// and is audited by the caller in a transaction of its own.
pub(super) fn enroll(
    tx: &mut Transaction<'_>,
    token_hash: &str,
    hostname: &str,
    secret_hash: &str,
    now: u64,
) -> Result<Result<String, String>> {
    let row = tx.query_opt(
        "SELECT server, expires, used FROM enrollments WHERE hash = $1 FOR UPDATE",
        &[&token_hash],
    )?;
    let row: Option<(Option<String>, i64, Option<i64>)> = match row {
        Some(r) => Some((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)),
        None => None,
    };
    let refuse = |why: &str| Ok(Err(why.to_string()));
    // The name is checked before anything, the refusal's audit line included.
    crate::input::name("host name", hostname).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let Some((bound, expires, used)) = row else {
        return refuse("unknown enrollment token");
    };
    if used.is_some() {
        return refuse("enrollment token already used");
    }
    if secs(expires) < now {
        return refuse("enrollment token expired");
    }
    if bound.as_deref().is_some_and(|b| b != hostname) {
        return refuse("enrollment token is for another host");
    }
    let known = exists(tx, "SELECT 1 FROM servers WHERE name = $1", &hostname)?;
    if known && bound.is_none() {
        // Re-enrolling an existing server takes a token bound to it by an admin.
        return refuse("a server of this name is enrolled; re-enrolling takes a token bound to it");
    }
    tx.execute(
        "UPDATE enrollments SET used = $2 WHERE hash = $1",
        &[&token_hash, &(now as i64)],
    )?;
    tx.execute(
        "INSERT INTO servers (name, secret_hash, enrolled) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET secret_hash = $2, enrolled = $3, report_hash = NULL",
        &[&hostname, &secret_hash, &(now as i64)],
    )?;
    audit(
        tx,
        now,
        &format!("agent:{hostname}"),
        "agent.enroll",
        hostname,
        "",
        "ok",
        if known { "re-enrolled" } else { "" },
    )?;
    Ok(Ok(hostname.to_string()))
}

/// Records the GPUs a server reported, as JSON.
pub(super) fn set_gpus(tx: &mut Transaction<'_>, server: &str, json: &str, now: u64) -> Result<()> {
    tx.execute(
        "INSERT INTO server_gpus (server, gpus, reported) VALUES ($1, $2, $3) \
         ON CONFLICT (server) DO UPDATE SET gpus = $2, reported = $3",
        &[&server, &json, &(now as i64)],
    )?;
    Ok(())
}

/// Records the RoCE ports and NICs a server reported, as JSON.
pub(super) fn set_links(
    tx: &mut Transaction<'_>,
    server: &str,
    json: &str,
    now: u64,
) -> Result<()> {
    tx.execute(
        "INSERT INTO server_links (server, links, reported) VALUES ($1, $2, $3) \
         ON CONFLICT (server) DO UPDATE SET links = $2, reported = $3",
        &[&server, &json, &(now as i64)],
    )?;
    Ok(())
}

/// The server that owns the port `guid`, if any does.
fn port_owner(tx: &mut Transaction<'_>, guid: Guid) -> Result<Option<String>> {
    match tx.query_opt(
        "SELECT server FROM ports WHERE guid = $1",
        &[&guid_to_sql(guid)],
    )? {
        Some(r) => Ok(Some(r.try_get(0)?)),
        None => Ok(None),
    }
}
