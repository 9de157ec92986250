//! `[auth.jwt]` compiled: the issuer, the audiences, where the keys come
//! from, the client claim and the scopes.
//!
//! Place: built by the configuration, held by the verifier.
//! Invariants: an audience admits tokens no wider than written: at one
//! server, or at the whole gateway.

use std::time::Duration;

use super::keys::{Algorithm, KeySet};

/// `[auth.jwt]`, compiled.
#[derive(Debug)]
pub struct JwtSettings {
    /// `iss` must be exactly this.
    pub issuer: String,
    /// `aud` must contain one of these (that applies to the server called).
    pub audiences: Vec<Audience>,
    /// Where the verification keys come from.
    pub keys: KeySource,
    /// The claim whose value names the client (default `sub`).
    pub client_claim: String,
    /// Clock skew allowed on `exp`, `nbf` and `iat` (default 60 s).
    pub leeway: Duration,
    /// Algorithms a token may use (default RS256, ES256, EdDSA).
    pub algorithms: Vec<Algorithm>,
    /// Scopes every token must carry (in `scope` or `scp`).
    pub required_scopes: Vec<String>,
    /// The origin clients reach the gateway at, e.g. `https://mcp.example.com`.
    pub resource_url: String,
}

/// One accepted audience.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audience {
    /// As configured.
    pub value: String,
    /// Set when the audience is one server's URL (`…/mcp/<server>`, a
    /// configured server): it admits tokens at that server only. `None` is the
    /// whole gateway (`…/mcp` or the origin alone); the configuration refuses
    /// every other audience, so a token is never admitted wider than written.
    pub server: Option<String>,
}

/// Where verification keys come from.
#[derive(Debug)]
pub enum KeySource {
    /// `jwks_file`: read at load and on reload.
    File(KeySet),
    /// `jwks_url`: fetched, cached, refreshed every `refresh`.
    Url {
        url: reqwest::Url,
        refresh: Duration,
    },
}
