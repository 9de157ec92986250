//! Who is calling: API keys matched against configured SHA-256 digests.
//!
//! Place in the path: first stage after the transport checks (Origin/Host);
//! everything after it knows the client by name.
//!
//! Invariants: keys are compared as digests in constant time, against every
//! configured client (no early exit that would time which one matched); the
//! presented credential never leaves this module — the upstream never sees it;
//! a request without credentials passes only as `anonymous`, and only when
//! `[clients.anonymous]` exists.

use std::fmt;
use std::sync::Arc;

use http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The name a request is known by after authentication.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientId {
    name: Arc<str>,
    anonymous: bool,
}

/// The configured clients.
#[derive(Debug, Default)]
pub struct ClientTable {
    keyed: Vec<KeyedClient>,
    anonymous: bool,
}

#[derive(Debug)]
struct KeyedClient {
    id: ClientId,
    key_sha256: [u8; 32],
}

/// Why a request is not authenticated (HTTP 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    #[error("missing credentials: send `Authorization: Bearer <key>`")]
    Missing,
    #[error("the credentials are not valid")]
    Invalid,
}

/// The SHA-256 of `key`, as configured in `api_key_sha256`.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

// === impl ClientId ===

impl ClientId {
    /// A named, authenticated client.
    pub fn named(name: &str) -> Self {
        Self {
            name: Arc::from(name),
            anonymous: false,
        }
    }

    /// The anonymous client.
    pub fn anonymous() -> Self {
        Self {
            name: Arc::from("anonymous"),
            anonymous: true,
        }
    }

    /// The client's configured name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for the client of requests without credentials.
    pub fn is_anonymous(&self) -> bool {
        self.anonymous
    }
}

impl fmt::Debug for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientId({})", self.name)
    }
}

// === impl ClientTable ===

impl ClientTable {
    pub(crate) fn add_keyed(&mut self, name: &str, key_sha256: [u8; 32]) {
        self.keyed.push(KeyedClient {
            id: ClientId::named(name),
            key_sha256,
        });
    }

    pub(crate) fn allow_anonymous(&mut self) {
        self.anonymous = true;
    }

    /// Every configured client, keyed ones first, in file order.
    pub fn ids(&self) -> Vec<ClientId> {
        let mut ids: Vec<ClientId> = self.keyed.iter().map(|c| c.id.clone()).collect();
        if self.anonymous {
            ids.push(ClientId::anonymous());
        }
        ids
    }

    /// Names the client of a request from its `Authorization` header.
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<ClientId, AuthError> {
        let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
        let Some(value) = values.next() else {
            return if self.anonymous {
                Ok(ClientId::anonymous())
            } else {
                Err(AuthError::Missing)
            };
        };
        if values.next().is_some() {
            return Err(AuthError::Invalid);
        }
        let key = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|k| !k.is_empty())
            .ok_or(AuthError::Invalid)?;
        let digest = hash_key(key);
        // Compare against every client so the time taken does not say which matched.
        let mut found: Option<&ClientId> = None;
        for client in &self.keyed {
            if bool::from(client.key_sha256.ct_eq(&digest)) {
                found = Some(&client.id);
            }
        }
        found.cloned().ok_or(AuthError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn table() -> ClientTable {
        let mut t = ClientTable::default();
        t.add_keyed("alice", hash_key("alice-key"));
        t.add_keyed("bob", hash_key("bob-key"));
        t
    }

    fn bearer(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(v).expect("header"),
        );
        h
    }

    #[test]
    fn keys_name_their_clients() {
        let t = table();
        assert_eq!(
            t.authenticate(&bearer("Bearer alice-key")),
            Ok(ClientId::named("alice"))
        );
        assert_eq!(
            t.authenticate(&bearer("bearer bob-key")),
            Ok(ClientId::named("bob"))
        );
    }

    #[test]
    fn wrong_missing_and_malformed_credentials_are_refused() {
        let t = table();
        assert_eq!(t.authenticate(&HeaderMap::new()), Err(AuthError::Missing));
        assert_eq!(
            t.authenticate(&bearer("Bearer nope")),
            Err(AuthError::Invalid)
        );
        assert_eq!(
            t.authenticate(&bearer("Basic YWxpY2U6eA==")),
            Err(AuthError::Invalid)
        );
        assert_eq!(t.authenticate(&bearer("Bearer ")), Err(AuthError::Invalid));
        let mut twice = bearer("Bearer alice-key");
        twice.append(
            http::header::AUTHORIZATION,
            HeaderValue::from_static("Bearer bob-key"),
        );
        assert_eq!(t.authenticate(&twice), Err(AuthError::Invalid));
    }

    #[test]
    fn anonymous_only_when_configured() {
        let mut t = table();
        assert_eq!(t.authenticate(&HeaderMap::new()), Err(AuthError::Missing));
        t.allow_anonymous();
        assert_eq!(t.authenticate(&HeaderMap::new()), Ok(ClientId::anonymous()));
        // A wrong key is still wrong, even with anonymous access on.
        assert_eq!(
            t.authenticate(&bearer("Bearer nope")),
            Err(AuthError::Invalid)
        );
    }
}
