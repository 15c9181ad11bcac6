//! API tokens on PostgreSQL (the SQL of `../sqlite/tokens.rs`): the bootstrap admin token
//! and its rotation, who a token speaks for, minting, listing and revoking.

use postgres::Transaction;

use super::{audit, exists, secs};
use crate::auth::{Principal, Role, token_id};
use crate::model::{TokenRole, TokenView};
use crate::store::{Result, StoreError, expiry};

pub(super) fn bootstrap_admin(tx: &mut Transaction<'_>, hash: &str, now: u64) -> Result<()> {
    let known = tx.query_opt(
        "SELECT role, source, revoked FROM api_tokens WHERE hash = $1",
        &[&hash],
    )?;
    let known: Option<(String, String, Option<i64>)> = match known {
        Some(r) => Some((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)),
        None => None,
    };
    match known {
        None => {
            tx.execute(
                "INSERT INTO api_tokens (hash, role, tenant, created, source) VALUES ($1, 'admin', NULL, $2, 'bootstrap')",
                &[&hash, &(now as i64)],
            )?;
        }
        Some((role, source, revoked))
            if role != "admin" || source != "bootstrap" || revoked.is_some() =>
        {
            return Err(StoreError::Refused(
                "the admin token given to the controller is already known to the store as another or a revoked token; give a fresh one".into(),
            ));
        }
        Some(_) => {}
    }
    let old = tx.query(
        "SELECT hash FROM api_tokens WHERE source = 'bootstrap' AND revoked IS NULL AND hash != $1 ORDER BY hash",
        &[&hash],
    )?;
    for row in &old {
        let h: String = row.try_get(0)?;
        tx.execute(
            "UPDATE api_tokens SET revoked = $2 WHERE hash = $1",
            &[&h, &(now as i64)],
        )?;
        audit(
            tx,
            now,
            "controller",
            "token.rotate",
            &format!("token {}", token_id(&h)),
            "",
            "revoked",
            "the controller started with another admin token",
        )?;
    }
    // A rotation also ends the admin tokens made through the API: whoever held the old
    // admin token could have made them.
    if !old.is_empty() {
        let made = tx.query(
            "SELECT hash FROM api_tokens WHERE role = 'admin' AND source != 'bootstrap' AND revoked IS NULL AND (expires IS NULL OR expires > $1) ORDER BY created, hash",
            &[&(now as i64)],
        )?;
        for row in &made {
            let h: String = row.try_get(0)?;
            tx.execute(
                "UPDATE api_tokens SET revoked = $2 WHERE hash = $1",
                &[&h, &(now as i64)],
            )?;
            audit(
                tx,
                now,
                "controller",
                "token.rotate",
                &format!("token {}", token_id(&h)),
                "",
                "revoked",
                "an admin token made through the API ends when the admin token is rotated",
            )?;
        }
    }
    Ok(())
}

pub(super) fn principal(
    tx: &mut Transaction<'_>,
    hash: &str,
    now: u64,
) -> Result<Option<Principal>> {
    let row = tx.query_opt(
        "SELECT role, tenant FROM api_tokens WHERE hash = $1 AND revoked IS NULL AND (expires IS NULL OR expires > $2)",
        &[&hash, &(now as i64)],
    )?;
    let row: Option<(String, Option<String>)> = match row {
        Some(r) => Some((r.try_get(0)?, r.try_get(1)?)),
        None => None,
    };
    // The actor names the token by the first 8 hex digits of its hash.
    let id = hash.get(..8).unwrap_or(hash);
    Ok(row.map(|(role, tenant)| match (role.as_str(), tenant) {
        ("tenant", Some(t)) => Principal {
            actor: format!("tenant:{t}:{id}"),
            role: Role::Tenant(t),
        },
        _ => Principal {
            actor: format!("admin:{id}"),
            role: Role::Admin,
        },
    }))
}

pub(super) fn create_api_token(
    tx: &mut Transaction<'_>,
    actor: &str,
    role: &Role,
    hash: &str,
    expires: Option<u64>,
    now: u64,
) -> Result<()> {
    let (r, t) = match role {
        Role::Admin => ("admin", None),
        Role::Tenant(t) => {
            if !exists(tx, "SELECT 1 FROM tenants WHERE name = $1", t)? {
                return Err(StoreError::NotFound(format!("no tenant `{t}`")));
            }
            ("tenant", Some(t.as_str()))
        }
    };
    tx.execute(
        "INSERT INTO api_tokens (hash, role, tenant, created, expires) VALUES ($1, $2, $3, $4, $5)",
        &[&hash, &r, &t, &(now as i64), &expires.map(|e| e as i64)],
    )?;
    audit(
        tx,
        now,
        actor,
        "token.create",
        t.unwrap_or("admin"),
        "",
        "ok",
        &format!("role {r}, token {}, {}", token_id(hash), expiry(expires)),
    )
}

pub(super) fn tokens(tx: &mut Transaction<'_>) -> Result<Vec<TokenView>> {
    let rows = tx.query(
        "SELECT hash, role, tenant, source, created, expires, revoked FROM api_tokens ORDER BY created, hash",
        &[],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let role: String = r.try_get(1)?;
        out.push(TokenView {
            id: token_id(&r.try_get::<_, String>(0)?),
            role: if role == "tenant" {
                TokenRole::Tenant
            } else {
                TokenRole::Admin
            },
            tenant: r.try_get(2)?,
            source: r.try_get(3)?,
            created: secs(r.try_get(4)?),
            expires: r.try_get::<_, Option<i64>>(5)?.map(secs),
            revoked: r.try_get::<_, Option<i64>>(6)?.map(secs),
        });
    }
    Ok(out)
}

pub(super) fn revoke_token(
    tx: &mut Transaction<'_>,
    actor: &str,
    id: &str,
    now: u64,
) -> Result<()> {
    if id.len() != 16
        || !id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(StoreError::Invalid(format!(
            "token id {}: not 16 lowercase hex digits (see `GET /v1/tokens`)",
            crate::input::shown(id)
        )));
    }
    let n = tx.execute(
        "UPDATE api_tokens SET revoked = $2 WHERE substr(hash, 1, 16) = $1 AND revoked IS NULL",
        &[&id, &(now as i64)],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!(
            "no token `{id}` that is not revoked"
        )));
    }
    audit(
        tx,
        now,
        actor,
        "token.revoke",
        &format!("token {id}"),
        "",
        "ok",
        "",
    )
}
