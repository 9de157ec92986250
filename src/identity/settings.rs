//! The settings of upstream identity, as the configuration compiles them:
//! `[identity]` (the gateway's signing keys and the token cache's bounds) and
//! each server's `[servers.NAME.identity]` (which mode, with what).
//!
//! Place: built by `config` at load, read by the [`super::Broker`] of each
//! server on every upstream request.
//!
//! Invariants: no secret is written in the TOML itself (client secrets and
//! keys come from the environment or a file, read at load); a secret's value
//! never appears in `Debug`; a token endpoint is https unless it is on a
//! loopback address; every duration and bound has a stated range.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use subtle::ConstantTimeEq;

use super::signer::SigningKey;
use super::template::{Format, Template};

/// Default of `[identity] max_cached_tokens` (per server).
pub const DEFAULT_MAX_CACHED: usize = 10_000;
/// Default of `[identity] max_cached_tokens_per_client` (per server).
pub const DEFAULT_MAX_CACHED_PER_CLIENT: usize = 16;
/// Default lifetime of an identity assertion.
pub const DEFAULT_ASSERTION_LIFETIME: Duration = Duration::from_secs(60);
/// Longest lifetime of an identity assertion.
pub const MAX_ASSERTION_LIFETIME: Duration = Duration::from_secs(600);
/// Default wait for a token endpoint's answer.
pub const DEFAULT_TOKEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long before its expiry a cached token is no longer handed out (default).
pub const DEFAULT_REFRESH_BEFORE: Duration = Duration::from_secs(30);
/// Longest a token is reused, whatever its expiry says (default): also how
/// long a revocation at the authorization server may take to be felt.
pub const DEFAULT_MAX_TOKEN_REUSE: Duration = Duration::from_secs(300);

/// `[identity]`: what the gateway itself is toward upstreams.
#[derive(Debug, Clone, PartialEq)]
pub struct IdentitySettings {
    /// `iss` of the assertions the gateway signs, and the `act`/`azp` naming it.
    pub issuer: Option<String>,
    /// `signing_keys`: the first signs; all are published in the JWKS.
    pub keys: Vec<Arc<SigningKey>>,
    /// Most exchanged tokens one server's cache holds.
    pub max_cached: usize,
    /// Most exchanged tokens one client holds in one server's cache.
    pub max_cached_per_client: usize,
}

impl Default for IdentitySettings {
    fn default() -> Self {
        Self {
            issuer: None,
            keys: Vec::new(),
            max_cached: DEFAULT_MAX_CACHED,
            max_cached_per_client: DEFAULT_MAX_CACHED_PER_CLIENT,
        }
    }
}

/// A secret read at load from the environment or a file: compared in
/// constant time, never printed.
#[derive(Clone)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps `value` (already read from its source).
    pub fn new(value: &str) -> Self {
        Self(Arc::from(value))
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && bool::from(self.0.as_bytes().ct_eq(other.0.as_bytes()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// How a server's upstream requests carry the calling client's identity.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerIdentity {
    /// `mode = "secret"`: each client's own secret for this server, in one header.
    Secrets {
        header: HeaderName,
        format: Format,
        /// By client name, with where it was read from (for `check`).
        secrets: BTreeMap<String, (Secret, String)>,
    },
    /// `mode = "template"`: headers filled from the verified identity.
    Template {
        headers: Vec<(HeaderName, Template)>,
    },
    /// `mode = "assertion"`: a JWT the gateway signs for each call (or window).
    Assertion(AssertionSettings),
    /// `mode = "exchange"`: the client's JWT exchanged (RFC 8693) for a token for this server.
    Exchange(GrantSettings),
    /// `mode = "client_credentials"`: one service token of the gateway's for this server.
    Service(GrantSettings),
}

/// `mode = "assertion"`.
#[derive(Debug, Clone, PartialEq)]
pub struct AssertionSettings {
    pub header: HeaderName,
    pub format: Format,
    /// `aud`: the server as it knows itself (default: its URL).
    pub audience: String,
    /// `exp - iat`.
    pub lifetime: Duration,
    /// Reuse one assertion per client for this long (`None`: a new one per call).
    pub reuse: Option<Duration>,
}

/// A token endpoint and how the gateway asks it (`exchange`, `client_credentials`).
#[derive(Debug, Clone, PartialEq)]
pub struct GrantSettings {
    pub header: HeaderName,
    pub format: Format,
    /// `token_endpoint`: https, or http on a loopback address; never redirected.
    pub endpoint: reqwest::Url,
    /// The gateway's client id at the authorization server.
    pub client_id: String,
    /// How the gateway authenticates itself there.
    pub auth: ClientAuth,
    /// RFC 8707 `resource` (default: the server's URL).
    pub resource: Option<String>,
    /// RFC 8693 `audience`, when the authorization server wants one.
    pub audience: Option<String>,
    /// `scope`, space-joined in the request; part of the cache key.
    pub scopes: Vec<String>,
    /// RFC 8693 `subject_token_type` (exchange only).
    pub subject_token_type: String,
    /// Longest wait for the token endpoint, connection included.
    pub timeout: Duration,
    /// A cached token is not handed out within this long of its expiry.
    pub refresh_before: Duration,
    /// Longest a token is reused, whatever its expiry.
    pub max_reuse: Duration,
}

/// How the gateway authenticates to a token endpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientAuth {
    /// `client_secret_basic`: HTTP Basic with the client id and secret.
    Basic(Secret),
    /// `client_secret_post`: both in the form body.
    Post(Secret),
    /// `private_key_jwt` (RFC 7523): a client assertion signed with the
    /// gateway's first `[identity]` signing key.
    PrivateKeyJwt,
}

impl ClientAuth {
    /// The name written in the configuration.
    pub fn name(&self) -> &'static str {
        match self {
            ClientAuth::Basic(_) => "client_secret_basic",
            ClientAuth::Post(_) => "client_secret_post",
            ClientAuth::PrivateKeyJwt => "private_key_jwt",
        }
    }
}

impl ServerIdentity {
    /// The mode's name as configured.
    pub fn mode(&self) -> &'static str {
        match self {
            ServerIdentity::Secrets { .. } => "secret",
            ServerIdentity::Template { .. } => "template",
            ServerIdentity::Assertion(_) => "assertion",
            ServerIdentity::Exchange(_) => "exchange",
            ServerIdentity::Service(_) => "client_credentials",
        }
    }

    /// The headers this mode sets (a server's static `headers` may not set them too).
    pub fn header_names(&self) -> Vec<&HeaderName> {
        match self {
            ServerIdentity::Secrets { header, .. } => vec![header],
            ServerIdentity::Template { headers } => headers.iter().map(|(n, _)| n).collect(),
            ServerIdentity::Assertion(a) => vec![&a.header],
            ServerIdentity::Exchange(g) | ServerIdentity::Service(g) => vec![&g.header],
        }
    }
}
