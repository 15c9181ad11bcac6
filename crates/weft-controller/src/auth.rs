//! Tokens and secrets: generation, hashing, and who a token speaks for.
//!
//! Every token weft hands out is 32 random bytes in hex behind a prefix that says what it
//! is for (`wfa_` API, `wfe_` enrollment, `wfs_` agent secret). The store keeps only the
//! SHA-256 of a token: the tokens are high-entropy, so an unsalted hash is enough to make a
//! stolen database useless for authenticating, and it lets the store look a token up by
//! its hash. [`Secret`] never shows its value in `Debug` or `Display`.

use std::fmt;
use std::io::Read;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A secret value (a token). `Debug` and `Display` print `[redacted]`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The hex SHA-256 of the value: what the store keeps.
    pub fn hash(&self) -> String {
        hash_token(&self.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// The hex SHA-256 of a token.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What a token is for; the prefix of its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// An API token (admin or tenant).
    Api,
    /// A one-time enrollment token for an agent.
    Enrollment,
    /// An enrolled agent's secret.
    Agent,
}

impl TokenKind {
    fn prefix(self) -> &'static str {
        match self {
            TokenKind::Api => "wfa_",
            TokenKind::Enrollment => "wfe_",
            TokenKind::Agent => "wfs_",
        }
    }
}

/// A fresh random token of `kind` (32 bytes from the kernel's CSPRNG).
pub fn generate(kind: TokenKind) -> std::io::Result<Secret> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Secret(format!("{}{hex}", kind.prefix())))
}

/// A token's id: the first 16 hex digits of its SHA-256 (`hash`). Enough to name a token
/// in a list, a revocation or the audit log; useless for authenticating.
pub fn token_id(hash: &str) -> String {
    hash.get(..16).unwrap_or(hash).to_string()
}

/// What an API token may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", content = "tenant", rename_all = "lowercase")]
pub enum Role {
    /// Everything.
    Admin,
    /// Read the groups (and their servers) of this tenant only.
    Tenant(String),
}

/// The caller of an API request, as its token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The role.
    pub role: Role,
    /// A name for the audit log: `admin:<token id>` or `tenant:<name>:<token id>`.
    pub actor: String,
}

impl Principal {
    /// Whether this caller may see `tenant`'s things.
    pub fn can_read_tenant(&self, tenant: &str) -> bool {
        match &self.role {
            Role::Admin => true,
            Role::Tenant(t) => t == tenant,
        }
    }

    /// Whether this caller is an admin.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_show_in_debug_or_display() {
        let s = generate(TokenKind::Api).unwrap();
        assert!(s.expose().starts_with("wfa_") && s.expose().len() == 68);
        assert!(!format!("{s:?}").contains(&s.expose()[4..]));
        assert_eq!(s.to_string(), "[redacted]");
        assert_ne!(s, generate(TokenKind::Api).unwrap());
        assert_eq!(s.hash(), hash_token(s.expose()));
        assert_eq!(s.hash().len(), 64);
    }
}
