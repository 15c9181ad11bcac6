//! API tokens: the bootstrap admin token and its rotation, who a token speaks for,
//! minting, listing (metadata only) and revoking.

use rusqlite::{OptionalExtension, Transaction, params};

use super::{audit, exists, secs};
use crate::auth::{Principal, Role, token_id};
use crate::model::{TokenRole, TokenView};
use crate::store::{Result, StoreError, expiry};

pub(super) fn bootstrap_admin(tx: &Transaction, hash: &str, now: u64) -> Result<()> {
    let known: Option<(String, String, Option<i64>)> = tx
        .query_row(
            "SELECT role, source, revoked FROM api_tokens WHERE hash = ?1",
            [hash],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    match known {
        None => {
            tx.execute(
                "INSERT INTO api_tokens (hash, role, tenant, created, source) VALUES (?1, 'admin', NULL, ?2, 'bootstrap')",
                params![hash, now as i64],
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
    let old: Vec<String> = tx
        .prepare("SELECT hash FROM api_tokens WHERE source = 'bootstrap' AND revoked IS NULL AND hash != ?1")?
        .query_map([hash], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for h in &old {
        tx.execute(
            "UPDATE api_tokens SET revoked = ?2 WHERE hash = ?1",
            params![h, now as i64],
        )?;
        audit(
            tx,
            now,
            "controller",
            "token.rotate",
            &format!("token {}", token_id(h)),
            "",
            "revoked",
            "the controller started with another admin token",
        )?;
    }
    // A rotation also ends the admin tokens made through the API: whoever held the old
    // admin token could have made them.
    if !old.is_empty() {
        let made: Vec<String> = tx
            .prepare("SELECT hash FROM api_tokens WHERE role = 'admin' AND source != 'bootstrap' AND revoked IS NULL AND (expires IS NULL OR expires > ?1)")?
            .query_map([now as i64], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for h in &made {
            tx.execute(
                "UPDATE api_tokens SET revoked = ?2 WHERE hash = ?1",
                params![h, now as i64],
            )?;
            audit(
                tx,
                now,
                "controller",
                "token.rotate",
                &format!("token {}", token_id(h)),
                "",
                "revoked",
                "an admin token made through the API ends when the admin token is rotated",
            )?;
        }
    }
    Ok(())
}

pub(super) fn principal(tx: &Transaction, hash: &str, now: u64) -> Result<Option<Principal>> {
    let row: Option<(String, Option<String>)> = tx
        .query_row(
            "SELECT role, tenant FROM api_tokens WHERE hash = ?1 AND revoked IS NULL AND (expires IS NULL OR expires > ?2)",
            params![hash, now as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    // The actor names the token by the first 8 hex digits of its hash: enough to
    // tell tokens apart in the audit log, useless to an attacker.
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
    tx: &Transaction,
    actor: &str,
    role: &Role,
    hash: &str,
    expires: Option<u64>,
    now: u64,
) -> Result<()> {
    let (r, t) = match role {
        Role::Admin => ("admin", None),
        Role::Tenant(t) => {
            if !exists(tx, "SELECT 1 FROM tenants WHERE name = ?1", t)? {
                return Err(StoreError::NotFound(format!("no tenant `{t}`")));
            }
            ("tenant", Some(t.as_str()))
        }
    };
    tx.execute(
        "INSERT INTO api_tokens (hash, role, tenant, created, expires) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![hash, r, t, now as i64, expires.map(|e| e as i64)],
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

pub(super) fn tokens(tx: &Transaction) -> Result<Vec<TokenView>> {
    Ok(tx
        .prepare("SELECT hash, role, tenant, source, created, expires, revoked FROM api_tokens ORDER BY created, hash")?
        .query_map([], |r| {
            let role: String = r.get(1)?;
            Ok(TokenView {
                id: token_id(&r.get::<_, String>(0)?),
                role: if role == "tenant" { TokenRole::Tenant } else { TokenRole::Admin },
                tenant: r.get(2)?,
                source: r.get(3)?,
                created: secs(r.get(4)?),
                expires: r.get::<_, Option<i64>>(5)?.map(secs),
                revoked: r.get::<_, Option<i64>>(6)?.map(secs),
            })
        })?
        .collect::<Result<_, _>>()?)
}

pub(super) fn revoke_token(tx: &Transaction, actor: &str, id: &str, now: u64) -> Result<()> {
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
        "UPDATE api_tokens SET revoked = ?2 WHERE substr(hash, 1, 16) = ?1 AND revoked IS NULL",
        params![id, now as i64],
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
