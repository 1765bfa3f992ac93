//! Bootstrap tokens, kubeadm style: `<id>.<secret>` with a 6-character public id and a
//! 16-character secret (`[a-z0-9]`). Only the SHA-256 of the secret is stored, with an expiry.
use std::collections::BTreeMap;

use rand::Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;

/// Longest lifetime a bootstrap token may have (`token create --ttl`): ten years, so every
/// expiry stays a date the hub can store, compare and print.
pub const MAX_TTL: Duration = Duration::from_secs(3650 * 86400);

/// A bootstrap token as stored: the public id and the SHA-256 of the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRecord {
    /// Public part of the token (`<id>` in `<id>.<secret>`).
    pub id: String,
    /// Hex SHA-256 of the secret part.
    pub secret_sha256: String,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: u64,
    /// Expiry, seconds since the Unix epoch.
    pub expires_unix: u64,
    /// Free text set by the admin.
    #[serde(default)]
    pub description: String,
    /// The only cluster name this token may join as (`token create --cluster-name`); a
    /// ManagedCluster an admin created before its agent joined is bound only by such a token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// Labels the admin gives a cluster registered with this token (`token create --label`).
    /// They drive placement and auto-accept; what an agent reports itself is only a claim.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// How many clusters this token may register (`token create --uses`); unlimited when
    /// absent. Re-joins of a cluster already registered with the same key do not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
    /// Clusters registered with this token so far.
    #[serde(default)]
    pub uses: u32,
}

/// What an admin binds a new token to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenScope {
    /// See [`TokenRecord::cluster_name`].
    pub cluster_name: Option<String>,
    /// See [`TokenRecord::labels`].
    pub labels: BTreeMap<String, String>,
    /// See [`TokenRecord::max_uses`].
    pub max_uses: Option<u32>,
}

impl TokenRecord {
    /// Whether this token may register (or bind) cluster `name`, and why not.
    pub fn check_name(&self, name: &str) -> Result<(), TokenError> {
        match &self.cluster_name {
            Some(bound) if bound != name => Err(TokenError::OtherCluster(bound.clone())),
            _ => Ok(()),
        }
    }

    /// Whether this token has registrations left.
    pub fn has_uses_left(&self) -> bool {
        self.max_uses.is_none_or(|max| self.uses < max)
    }
}

/// Why a presented token was refused. The messages are safe to show the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not of the form `<id>.<secret>`.
    #[error(
        "malformed bootstrap token: expected <id>.<secret> as printed by `flower-hub token create`"
    )]
    Malformed,
    /// Unknown id, wrong secret or deleted token (not told apart, so ids cannot be probed).
    #[error(
        "bootstrap token is unknown or was revoked: create a new one with `flower-hub token create`"
    )]
    Unknown,
    /// The token's lifetime has ended.
    #[error("bootstrap token expired: create a new one with `flower-hub token create`")]
    Expired,
    /// The token is bound to another cluster name.
    #[error(
        "this bootstrap token is bound to cluster {0:?}: join with --cluster-name {0}, or create a token for this name with `flower-hub token create --cluster-name NAME`"
    )]
    OtherCluster(String),
    /// The token registered as many clusters as it may.
    #[error(
        "this bootstrap token has registered as many clusters as it may (--uses): create a new one with `flower-hub token create`"
    )]
    UsedUp,
    /// A cluster an admin pre-created is bound only by a token bound to its name.
    #[error(
        "cluster {0:?} was created by an admin before its agent joined: join it with a token bound to it (`flower-hub token create --cluster-name {0}`)"
    )]
    NotBoundToPreCreated(String),
}

/// A freshly created token: the full secret (shown once) and its stored record.
#[derive(Clone, Debug)]
pub struct NewToken {
    /// `<id>.<secret>`, to hand to `flower-agent join --token`.
    pub token: String,
    /// What the store keeps.
    pub record: TokenRecord,
}

/// Creates a random token valid for `ttl`, bound to nothing.
pub fn generate(ttl: Duration, description: &str) -> NewToken {
    generate_scoped(ttl, description, TokenScope::default())
}

/// Creates a random token valid for `ttl`, bound to `scope`.
pub fn generate_scoped(ttl: Duration, description: &str, scope: TokenScope) -> NewToken {
    let id = random_string(ID_LEN);
    let secret = random_string(SECRET_LEN);
    let now = unix_now();
    NewToken {
        token: format!("{id}.{secret}"),
        record: TokenRecord {
            id,
            secret_sha256: hash_secret(&secret),
            created_unix: now,
            expires_unix: now.saturating_add(ttl.as_secs()),
            description: description.to_string(),
            cluster_name: scope.cluster_name,
            labels: scope.labels,
            max_uses: scope.max_uses,
            uses: 0,
        },
    }
}

/// Splits `<id>.<secret>` after checking the alphabet and lengths.
pub fn parse(token: &str) -> Result<(&str, &str), TokenError> {
    let (id, secret) = token.split_once('.').ok_or(TokenError::Malformed)?;
    let ok = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| ALPHABET.contains(&b));
    if ok(id, ID_LEN) && ok(secret, SECRET_LEN) {
        Ok((id, secret))
    } else {
        Err(TokenError::Malformed)
    }
}

/// Checks a presented secret against its record (constant-time compare) and the expiry.
pub fn verify(record: Option<&TokenRecord>, secret: &str, now_unix: u64) -> Result<(), TokenError> {
    let record = record.ok_or(TokenError::Unknown)?;
    let presented = hash_secret(secret);
    let equal = presented.len() == record.secret_sha256.len()
        && presented
            .bytes()
            .zip(record.secret_sha256.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !equal {
        return Err(TokenError::Unknown);
    }
    if now_unix >= record.expires_unix {
        return Err(TokenError::Expired);
    }
    Ok(())
}

/// Hex SHA-256 of a token secret.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn random_string(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_token_parses_and_verifies_until_expiry() {
        // A token verifies with its secret only, and not after its expiry.
        let new = generate(Duration::from_secs(60), "");
        let (id, secret) = parse(&new.token).expect("parse");
        assert_eq!(id, new.record.id);
        assert_eq!(verify(Some(&new.record), secret, unix_now()), Ok(()));
        assert_eq!(
            verify(Some(&new.record), "aaaaaaaaaaaaaaaa", unix_now()),
            Err(TokenError::Unknown)
        );
        assert_eq!(
            verify(Some(&new.record), secret, new.record.expires_unix),
            Err(TokenError::Expired)
        );
        assert_eq!(verify(None, secret, 0), Err(TokenError::Unknown));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        // Anything not `<6>.<16>` of [a-z0-9] is refused before any lookup.
        for bad in [
            "",
            "abc",
            "abcdef.",
            "ABCDEF.0123456789abcdef",
            "abcdef.0123456789abcde!",
        ] {
            assert_eq!(parse(bad), Err(TokenError::Malformed), "{bad}");
        }
    }
}
