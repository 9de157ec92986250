//! Who is calling: API keys matched against configured SHA-256 digests, and
//! bearer JWTs verified in [`jwt`] when `[auth.jwt]` is configured.
//!
//! Place in the path: first stage after the transport checks (Origin/Host);
//! everything after it knows the client by name.
//!
//! Invariants: keys are compared as digests in constant time, against every
//! configured client (no early exit that would time which one matched); the
//! presented credential never leaves this module — the upstream never sees it;
//! a request without credentials passes only as `anonymous`, and only when
//! `[clients.anonymous]` exists. With `[auth.jwt]`, a bearer shaped like a JWT
//! is verified as one and never compared with API keys; a token whose client
//! claim names an API-key client or `anonymous` is refused, so a token can
//! never take on the rules of a client that holds a key.

pub mod jwt;

use std::fmt;
use std::sync::Arc;

use http::HeaderMap;
use jwt::{JwtVerifier, Refused};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The name a request is known by after authentication.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientId {
    name: Arc<str>,
    anonymous: bool,
    /// A JWT subject not named in `[clients]`: matched by `"*"` rules only.
    unlisted: bool,
}

/// A bearer JWT the gateway verified, kept for the request that presented it:
/// its claims fill identity templates, and the token itself is the subject
/// of a token exchange (`identity`). It never crosses to an upstream.
#[derive(Clone)]
pub struct PresentedToken {
    raw: Arc<str>,
    claims: Arc<serde_json::Map<String, serde_json::Value>>,
}

/// Who a request is from: its client, and the JWT it presented when it
/// authenticated with one (not with an API key).
#[derive(Debug, Clone)]
pub(crate) struct Authenticated {
    pub client: ClientId,
    pub token: Option<PresentedToken>,
}

/// The configured clients.
#[derive(Debug, Default)]
pub struct ClientTable {
    keyed: Vec<KeyedClient>,
    anonymous: bool,
    /// `[clients.NAME]` tables without a key: JWT clients rules may name.
    token_named: Vec<ClientId>,
    jwt: Option<Arc<JwtVerifier>>,
}

/// What a client authenticates with (see [`ClientTable::still_admits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Credential {
    Key([u8; 32]),
    Token,
    Anonymous,
}

#[derive(Debug)]
struct KeyedClient {
    id: ClientId,
    key_sha256: [u8; 32],
}

/// Why a request is not authenticated (HTTP 401), or its token falls short (403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    #[error("missing credentials: send `Authorization: Bearer <key>`")]
    Missing,
    #[error("the credentials are not valid")]
    Invalid,
    /// A valid token without every required scope; carries them, space-separated.
    #[error("the token lacks a required scope; it needs: {0}")]
    InsufficientScope(String),
}

/// An authentication refusal and, with `[auth.jwt]`, where the client learns
/// how to get a token (RFC 9728 `resource_metadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AuthRefusal {
    pub error: AuthError,
    pub resource_metadata: Option<String>,
    /// `required_scopes`, space-separated, for the challenge's `scope`.
    pub scope: Option<String>,
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
            unlisted: false,
        }
    }

    /// A client known only by a token's claim, not named in `[clients]`.
    pub fn unlisted(name: &str) -> Self {
        Self {
            unlisted: true,
            ..Self::named(name)
        }
    }

    /// The anonymous client.
    pub fn anonymous() -> Self {
        Self {
            name: Arc::from("anonymous"),
            anonymous: true,
            unlisted: false,
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

    /// True for a JWT client not named in `[clients]`.
    pub fn is_unlisted(&self) -> bool {
        self.unlisted
    }
}

impl fmt::Debug for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientId({})", self.name)
    }
}

// === impl PresentedToken ===

impl PresentedToken {
    /// A token and its verified claims.
    pub fn new(raw: &str, claims: serde_json::Map<String, serde_json::Value>) -> Self {
        Self {
            raw: Arc::from(raw),
            claims: Arc::new(claims),
        }
    }

    /// The compact JWS as the client sent it: a secret, for a token exchange only.
    pub fn secret(&self) -> &str {
        &self.raw
    }

    /// The verified claims.
    pub fn claims(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.claims
    }

    /// `exp`, in seconds since the epoch (verification requires it).
    pub fn expires_at(&self) -> Option<f64> {
        self.claims.get("exp").and_then(serde_json::Value::as_f64)
    }
}

impl fmt::Debug for PresentedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a credential: its value is never printed.
        f.write_str("PresentedToken(..)")
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

    pub(crate) fn add_token_named(&mut self, name: &str) {
        self.token_named.push(ClientId::named(name));
    }

    pub(crate) fn set_jwt(&mut self, verifier: JwtVerifier) {
        self.jwt = Some(Arc::new(verifier));
    }

    /// `[auth.jwt]`, when configured.
    pub fn jwt(&self) -> Option<&JwtVerifier> {
        self.jwt.as_deref()
    }

    /// Every configured client, keyed ones first, then JWT clients, in file order.
    pub fn ids(&self) -> Vec<ClientId> {
        let mut ids: Vec<ClientId> = self.keyed.iter().map(|c| c.id.clone()).collect();
        ids.extend(self.token_named.iter().cloned());
        if self.anonymous {
            ids.push(ClientId::anonymous());
        }
        ids
    }

    /// Whether `client` signs in with a JWT (a `[clients.NAME]` without a key).
    pub fn authenticates_with_token(&self, client: &ClientId) -> bool {
        client.is_unlisted() || self.token_named.iter().any(|t| t == client)
    }

    /// Whether a client authenticated under `before` is still admitted, and in
    /// the same way, by this table: a reload that removes a client, changes its
    /// key, or takes `[auth.jwt]` or `[clients.anonymous]` away revokes it.
    pub(crate) fn still_admits(&self, before: &ClientTable, client: &ClientId) -> bool {
        let now = self.credential(client);
        now.is_some() && now == before.credential(client)
    }

    /// How `client` proves who it is under this table, if it still can.
    fn credential(&self, client: &ClientId) -> Option<Credential> {
        if client.is_anonymous() {
            return self.anonymous.then_some(Credential::Anonymous);
        }
        if let Some(keyed) = self.keyed.iter().find(|k| k.id == *client) {
            return Some(Credential::Key(keyed.key_sha256));
        }
        // A token never takes on the name of a keyed client.
        let keyed_name = self.keyed.iter().any(|k| k.id.name() == client.name());
        if keyed_name || self.jwt.is_none() {
            return None;
        }
        let named = self.token_named.iter().any(|t| t.name() == client.name());
        (named != client.is_unlisted()).then_some(Credential::Token)
    }

    /// Names the client of a request to `server` (at the request path `path`:
    /// `/mcp` or `/mcp/<server>`) from its `Authorization` header.
    pub(crate) async fn authenticate(
        &self,
        headers: &HeaderMap,
        server: &str,
        path: &str,
    ) -> Result<Authenticated, AuthRefusal> {
        let resource = if path == "/mcp" {
            "/mcp".to_owned()
        } else {
            format!("/mcp/{server}")
        };
        let refusal = |error| AuthRefusal {
            error,
            resource_metadata: self.jwt.as_ref().map(|j| j.metadata_url(&resource)),
            scope: self
                .jwt
                .as_ref()
                .map(|j| j.settings().required_scopes.join(" "))
                .filter(|s| !s.is_empty()),
        };
        match (&self.jwt, bearer(headers)) {
            (Some(jwt), Ok(Some(token))) if jwt::looks_like_jwt(token) => {
                let (client, claims) = self.by_token(jwt, token, server).await.map_err(refusal)?;
                Ok(Authenticated {
                    client,
                    token: Some(PresentedToken::new(token, claims)),
                })
            }
            _ => Ok(Authenticated {
                client: self.by_key(headers).map_err(refusal)?,
                token: None,
            }),
        }
    }

    /// The client a verified token names.
    async fn by_token(
        &self,
        jwt: &JwtVerifier,
        token: &str,
        server: &str,
    ) -> Result<(ClientId, serde_json::Map<String, serde_json::Value>), AuthError> {
        let (name, claims) = match jwt.verify(token, server).await {
            Ok(verified) => verified,
            Err(Refused::Invalid(why)) => {
                tracing::info!(server, "bearer token refused: {why}");
                return Err(AuthError::Invalid);
            }
            Err(Refused::Scope) => {
                let needed = jwt.settings().required_scopes.join(" ");
                return Err(AuthError::InsufficientScope(needed));
            }
        };
        if name == "anonymous" || self.keyed.iter().any(|k| k.id.name() == name) {
            tracing::info!(
                server,
                client = name,
                "bearer token refused: its client claim names a client that authenticates with an API key (or anonymous)"
            );
            return Err(AuthError::Invalid);
        }
        let client = match self.token_named.iter().find(|c| c.name() == name) {
            Some(id) => id.clone(),
            None => ClientId::unlisted(&name),
        };
        Ok((client, claims))
    }

    /// Names the client of a request from its API key.
    fn by_key(&self, headers: &HeaderMap) -> Result<ClientId, AuthError> {
        let Some(key) = bearer(headers)? else {
            return if self.anonymous {
                Ok(ClientId::anonymous())
            } else {
                Err(AuthError::Missing)
            };
        };
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

/// The bearer credential: `Ok(None)` without an `Authorization` header,
/// `Err` when there are several or it is not `Bearer <credential>`.
fn bearer(headers: &HeaderMap) -> Result<Option<&str>, AuthError> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(AuthError::Invalid);
    }
    value
        .to_str()
        .ok()
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .filter(|k| !k.is_empty())
        .map(Some)
        .ok_or(AuthError::Invalid)
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
            t.by_key(&bearer("Bearer alice-key")),
            Ok(ClientId::named("alice"))
        );
        assert_eq!(
            t.by_key(&bearer("bearer bob-key")),
            Ok(ClientId::named("bob"))
        );
    }

    #[test]
    fn wrong_missing_and_malformed_credentials_are_refused() {
        let t = table();
        assert_eq!(t.by_key(&HeaderMap::new()), Err(AuthError::Missing));
        assert_eq!(t.by_key(&bearer("Bearer nope")), Err(AuthError::Invalid));
        assert_eq!(
            t.by_key(&bearer("Basic YWxpY2U6eA==")),
            Err(AuthError::Invalid)
        );
        assert_eq!(t.by_key(&bearer("Bearer ")), Err(AuthError::Invalid));
        let mut twice = bearer("Bearer alice-key");
        twice.append(
            http::header::AUTHORIZATION,
            HeaderValue::from_static("Bearer bob-key"),
        );
        assert_eq!(t.by_key(&twice), Err(AuthError::Invalid));
    }

    #[test]
    fn anonymous_only_when_configured() {
        let mut t = table();
        assert_eq!(t.by_key(&HeaderMap::new()), Err(AuthError::Missing));
        t.allow_anonymous();
        assert_eq!(t.by_key(&HeaderMap::new()), Ok(ClientId::anonymous()));
        // A wrong key is still wrong, even with anonymous access on.
        assert_eq!(t.by_key(&bearer("Bearer nope")), Err(AuthError::Invalid));
    }
}
