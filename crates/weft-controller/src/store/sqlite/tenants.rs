//! Tenants: creating one with its first token, deleting one that owns no group, listing.

use rusqlite::{Transaction, params};

use super::{audit, exists};
use crate::auth::token_id;
use crate::model::TenantView;
use crate::store::{Result, StoreError, expiry};

pub(super) fn create_tenant(
    tx: &Transaction,
    actor: &str,
    name: &str,
    token_hash: &str,
    expires: Option<u64>,
    now: u64,
) -> Result<TenantView> {
    weft_fabric::conf::validate_name(name)
        .map_err(|m| StoreError::Invalid(format!("tenant name `{name}`: {m}")))?;
    if exists(tx, "SELECT 1 FROM tenants WHERE name = ?1", &name)? {
        return Err(StoreError::Conflict(format!("tenant `{name}` exists")));
    }
    tx.execute(
        "INSERT INTO tenants (name, created) VALUES (?1, ?2)",
        params![name, now as i64],
    )?;
    tx.execute(
        "INSERT INTO api_tokens (hash, role, tenant, created, expires) VALUES (?1, 'tenant', ?2, ?3, ?4)",
        params![token_hash, name, now as i64, expires.map(|e| e as i64)],
    )?;
    audit(
        tx,
        now,
        actor,
        "tenant.create",
        name,
        "",
        "ok",
        &format!("token {}, {}", token_id(token_hash), expiry(expires)),
    )?;
    Ok(TenantView {
        name: name.to_string(),
        groups: Vec::new(),
    })
}

pub(super) fn delete_tenant(tx: &Transaction, actor: &str, name: &str, now: u64) -> Result<()> {
    if !exists(tx, "SELECT 1 FROM tenants WHERE name = ?1", &name)? {
        return Err(StoreError::NotFound(format!("no tenant `{name}`")));
    }
    let groups: Vec<String> = tx
        .prepare("SELECT name FROM groups WHERE tenant = ?1 ORDER BY name")?
        .query_map([name], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if !groups.is_empty() {
        return Err(StoreError::Conflict(format!(
            "tenant `{name}` owns group(s) {}; remove them first",
            groups
                .iter()
                .map(|g| format!("`{g}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let tokens = tx.execute("DELETE FROM api_tokens WHERE tenant = ?1", [name])?;
    tx.execute("DELETE FROM tenants WHERE name = ?1", [name])?;
    audit(
        tx,
        now,
        actor,
        "tenant.delete",
        name,
        "",
        "ok",
        &format!("{tokens} token(s) deleted"),
    )
}

pub(super) fn tenants(tx: &Transaction) -> Result<Vec<TenantView>> {
    let mut st = tx.prepare("SELECT t.name, g.name FROM tenants t LEFT JOIN groups g ON g.tenant = t.name ORDER BY t.name, g.name")?;
    let rows = st.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
    })?;
    let mut out: Vec<TenantView> = Vec::new();
    for row in rows {
        let (t, g) = row?;
        if out.last().map(|v| v.name != t).unwrap_or(true) {
            out.push(TenantView {
                name: t,
                groups: Vec::new(),
            });
        }
        if let (Some(g), Some(last)) = (g, out.last_mut()) {
            last.groups.push(g);
        }
    }
    Ok(out)
}
