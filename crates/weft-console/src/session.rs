//! Console sessions: a token is given once at login and never again; the browser holds a
//! random session id in a cookie (`HttpOnly; Secure; SameSite=Strict; Path=/`), the
//! server holds the token's *hash* (so a revoked or expired token ends its sessions at
//! their next request) and a per-session CSRF token that every form carries.
//!
//! Sessions are kept in the controller's store ([`Store::console_session_create`]), so a
//! controller restart (or a standby taking over the same store) does not log anyone out.
//! The store keeps only the session id's SHA-256, never the id: whoever reads the store
//! cannot present a session. At most [`MAX`] are live (the oldest ends first); each ends
//! after [`TTL`]; logout ends it in the store. Ended sessions are kept until their life is
//! over, so that a replayed cookie is refused *and audited* under the actor it belonged
//! to, while a made-up cookie is refused without an audit line (no one can fill the audit
//! log).

use std::time::Duration;

use sha2::Digest;
use weft_controller::store::{ConsoleSession, Store, StoreError};

/// The cookie's name.
pub const COOKIE: &str = "weft_session";

/// The most sessions live at once.
pub const MAX: usize = 1024;
/// How long a session lasts.
pub const TTL: Duration = Duration::from_secs(12 * 3600);

/// One logged-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    /// SHA-256 of the API token it logged in with (looked up at every request).
    pub token_hash: String,
    /// The CSRF token its forms carry.
    pub csrf: String,
    /// Who, for the audit log (`admin:<id>`, `tenant:<name>:<id>`).
    pub actor: String,
    /// Unix seconds when it was made.
    pub created: u64,
}

/// What a cookie names.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// A live session.
    Live(Session),
    /// A session that was logged out or expired; its actor.
    Ended(String),
    /// Nothing this controller made (or kept).
    Unknown,
}

/// SHA-256 of a session id, hex: what the store keeps.
fn id_hash(id: &str) -> String {
    sha2::Sha256::digest(id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Keeps a new session with id `id` (random, from [`random_hex`]) and CSRF token `csrf`
/// for a token whose hash is `token_hash`.
pub fn create(
    store: &dyn Store,
    id: &str,
    csrf: String,
    token_hash: String,
    actor: String,
    now: u64,
) -> Result<Session, StoreError> {
    let row = ConsoleSession {
        id_hash: id_hash(id),
        token_hash,
        csrf,
        actor,
        created: now,
        ended: None,
    };
    store.console_session_create(&row, TTL.as_secs(), MAX)?;
    Ok(Session {
        token_hash: row.token_hash,
        csrf: row.csrf,
        actor: row.actor,
        created: now,
    })
}

/// What `id` names at `now` (a session past its life ends here).
pub fn get(store: &dyn Store, id: &str, now: u64) -> Result<Lookup, StoreError> {
    let hash = id_hash(id);
    let Some(row) = store.console_session(&hash)? else {
        return Ok(Lookup::Unknown);
    };
    if row.ended.is_some() {
        return Ok(Lookup::Ended(row.actor));
    }
    if now.saturating_sub(row.created) >= TTL.as_secs() {
        store.console_session_end(&hash, now)?;
        return Ok(Lookup::Ended(row.actor));
    }
    Ok(Lookup::Live(Session {
        token_hash: row.token_hash,
        csrf: row.csrf,
        actor: row.actor,
        created: row.created,
    }))
}

/// Ends the session `id` (logout, a revoked token); whether it was live.
pub fn end(store: &dyn Store, id: &str, now: u64) -> Result<bool, StoreError> {
    store.console_session_end(&id_hash(id), now)
}

/// 32 random bytes from the kernel, in hex.
pub fn random_hex() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The session id in a request's `Cookie` header(s), if any.
pub fn cookie_id(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
        .filter(|v| !v.is_empty() && v.len() <= 128)
}

/// The `Set-Cookie` value of a new session.
pub fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age={}",
        TTL.as_secs()
    )
}

/// The `Set-Cookie` value that removes the cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age=0")
}

/// Compares two tokens in time that does not depend on where they differ.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_ends_at_logout_and_is_remembered_as_ended_and_the_store_never_holds_its_id() {
        let store = weft_controller::store::SqliteStore::in_memory().unwrap();
        let (id, csrf) = (random_hex().unwrap(), random_hex().unwrap());
        assert_eq!(id.len(), 64);
        assert_ne!(id, csrf);
        create(&store, &id, csrf, "h".into(), "admin:x".into(), 100).unwrap();
        assert!(matches!(get(&store, &id, 101).unwrap(), Lookup::Live(s) if s.actor == "admin:x"));
        assert!(
            store.console_session(&id).unwrap().is_none(),
            "kept by its hash only"
        );
        assert!(end(&store, &id, 102).unwrap());
        assert!(matches!(get(&store, &id, 103).unwrap(), Lookup::Ended(a) if a == "admin:x"));
        assert!(!end(&store, &id, 104).unwrap());
        assert!(matches!(
            get(&store, "made-up", 105).unwrap(),
            Lookup::Unknown
        ));
    }

    #[test]
    fn a_session_ends_after_its_life() {
        let store = weft_controller::store::SqliteStore::in_memory().unwrap();
        create(&store, "s1", "c".into(), "h".into(), "a".into(), 100).unwrap();
        let later = 100 + TTL.as_secs();
        assert!(matches!(
            get(&store, "s1", later - 1).unwrap(),
            Lookup::Live(_)
        ));
        assert!(matches!(
            get(&store, "s1", later).unwrap(),
            Lookup::Ended(_)
        ));
    }

    #[test]
    fn cookies_are_parsed_and_tokens_compared() {
        let mut h = axum::http::HeaderMap::new();
        h.insert(
            axum::http::header::COOKIE,
            "a=1; weft_session=abc; b=2".parse().unwrap(),
        );
        assert_eq!(cookie_id(&h).as_deref(), Some("abc"));
        assert!(set_cookie("abc").contains("HttpOnly; Secure; SameSite=Strict"));
        assert!(same_token("abc", "abc") && !same_token("abc", "abd") && !same_token("a", "ab"));
    }
}
