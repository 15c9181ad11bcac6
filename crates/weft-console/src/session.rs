//! Console sessions: a token is given once at login and never again; the browser holds a
//! random session id in a cookie (`HttpOnly; Secure; SameSite=Strict; Path=/`), the
//! server holds the token's *hash* (so a revoked or expired token ends its sessions at
//! their next request) and a per-session CSRF token that every form carries.
//!
//! Sessions live in memory only: a restart logs everyone out, which is the safe side.
//! The table is bounded ([`Sessions::MAX`]; the oldest session goes first) and each
//! session ends after [`Sessions::TTL`]. Ended sessions are remembered (bounded too) so
//! that a replayed cookie is refused *and audited* under the actor it belonged to, while a
//! made-up cookie is refused without an audit line (no one can fill the audit log).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The cookie's name.
pub const COOKIE: &str = "weft_session";

/// One logged-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    /// SHA-256 of the API token it logged in with (looked up at every request).
    pub token_hash: String,
    /// The CSRF token its forms carry.
    pub csrf: String,
    /// Who, for the audit log (`admin:<id>`, `tenant:<name>:<id>`).
    pub actor: String,
    /// When it was made.
    pub created: Instant,
}

/// What a cookie names.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// A live session.
    Live(Session),
    /// A session that was logged out or expired; its actor.
    Ended(String),
    /// Nothing this server made (or forgot).
    Unknown,
}

/// Every session of this console.
#[derive(Debug, Default)]
pub struct Sessions {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    live: HashMap<String, Session>,
    order: VecDeque<String>,
    ended: HashMap<String, String>,
    ended_order: VecDeque<String>,
}

impl Inner {
    fn end(&mut self, id: &str) -> Option<Session> {
        let s = self.live.remove(id)?;
        self.order.retain(|o| o != id);
        self.ended.insert(id.to_string(), s.actor.clone());
        self.ended_order.push_back(id.to_string());
        while self.ended_order.len() > Sessions::MAX {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
        Some(s)
    }
}

impl Sessions {
    /// The most sessions held at once (and ended ones remembered).
    pub const MAX: usize = 1024;
    /// How long a session lasts.
    pub const TTL: Duration = Duration::from_secs(12 * 3600);

    /// A new session for a token whose hash is `token_hash`: its id (for the cookie).
    pub fn create(&self, token_hash: String, actor: String) -> std::io::Result<(String, Session)> {
        let id = random_hex()?;
        let session = Session {
            token_hash,
            csrf: random_hex()?,
            actor,
            created: Instant::now(),
        };
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        while g.live.len() >= Self::MAX {
            let Some(old) = g.order.front().cloned() else {
                break;
            };
            g.end(&old);
        }
        g.live.insert(id.clone(), session.clone());
        g.order.push_back(id.clone());
        Ok((id, session))
    }

    /// What `id` names now (an expired session ends here).
    pub fn get(&self, id: &str) -> Lookup {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match g.live.get(id) {
            Some(s) if s.created.elapsed() < Self::TTL => Lookup::Live(s.clone()),
            Some(_) => match g.end(id) {
                Some(s) => Lookup::Ended(s.actor),
                None => Lookup::Unknown,
            },
            None => g
                .ended
                .get(id)
                .map_or(Lookup::Unknown, |a| Lookup::Ended(a.clone())),
        }
    }

    /// Ends the session `id` (logout); whether it was live.
    pub fn end(&self, id: &str) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.end(id).is_some()
    }

    /// Live sessions.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .live
            .len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// 32 random bytes from the kernel, in hex.
fn random_hex() -> std::io::Result<String> {
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
        Sessions::TTL.as_secs()
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
    fn a_session_ends_at_logout_and_is_remembered_as_ended() {
        let s = Sessions::default();
        let (id, sess) = s.create("h".into(), "admin:x".into()).unwrap();
        assert_eq!(id.len(), 64);
        assert_ne!(id, sess.csrf);
        assert!(matches!(s.get(&id), Lookup::Live(_)));
        assert!(s.end(&id));
        assert!(matches!(s.get(&id), Lookup::Ended(a) if a == "admin:x"));
        assert!(!s.end(&id));
        assert!(matches!(s.get("made-up"), Lookup::Unknown));
    }

    #[test]
    fn the_table_is_bounded_and_the_oldest_goes_first() {
        let s = Sessions::default();
        let (first, _) = s.create("h".into(), "a".into()).unwrap();
        for _ in 0..Sessions::MAX {
            s.create("h".into(), "a".into()).unwrap();
        }
        assert_eq!(s.len(), Sessions::MAX);
        assert!(matches!(s.get(&first), Lookup::Ended(_)));
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
