//! Upstream identity: how each client reaches an upstream server as itself,
//! and never with its own credential.
//!
//! Place in the path: the last decision before the upstream request is
//! sent. Authentication has named the client (and kept the JWT it presented,
//! if any); the proxy asks this server's [`Broker`] for the [`Credential`]
//! of that caller and sends it with the request. Five modes, per server
//! (`[servers.NAME.identity]`):
//!
//! - `secret`: each client's own secret for the server, read at load from
//!   the environment or a file, in a header the operator names;
//! - `template`: headers filled from the verified identity (`{client}`,
//!   `{claims.NAME}`), for servers that trust the gateway's network;
//! - `assertion`: a short-lived JWT the gateway signs (`sub` the client,
//!   `aud` the server, `act`/`azp` the gateway), verifiable with the JWKS the
//!   MCP listener publishes ([`JWKS_PATH`]);
//! - `exchange`: the client's JWT exchanged at a token endpoint (RFC 8693)
//!   for a token whose audience is the server (RFC 8707), cached;
//! - `client_credentials`: a service token of the gateway's own, cached.
//!
//! Invariants:
//! - a [`Credential`] exists only as this module made it for one caller and
//!   one server, and the upstream transport takes one with every request:
//!   when none can be had the answer is a [`CredentialError`] and nothing is
//!   sent (`upstream_credentials_unavailable`);
//! - the client's own token is read only as a token exchange's subject; it
//!   never becomes a header;
//! - tokens, secrets and assertions never appear in `Debug`, an error's text,
//!   a log line, a span or the audit: headers carrying them are marked
//!   sensitive, and errors are written by the gateway from codes alone;
//! - a token obtained for one client is only ever handed to that client, for
//!   the subject token it was exchanged from ([`cache`]).

mod cache;
mod credential;
mod grant;
mod settings;
mod signer;
mod template;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use serde_json::Map;
use sha2::{Digest, Sha256};

use crate::auth::{ClientId, PresentedToken};
use cache::{CacheKey, TokenCache};
pub(crate) use credential::{Credential, CredentialError};
use grant::{Ask, Issued};
pub use settings::{
    AssertionSettings, ClientAuth, DEFAULT_ASSERTION_LIFETIME, DEFAULT_MAX_CACHED,
    DEFAULT_MAX_CACHED_PER_CLIENT, DEFAULT_MAX_TOKEN_REUSE, DEFAULT_REFRESH_BEFORE,
    DEFAULT_TOKEN_TIMEOUT, GrantSettings, IdentitySettings, MAX_ASSERTION_LIFETIME, Secret,
    ServerIdentity,
};
pub use signer::{JWKS_PATH, SigningKey, jwks};
pub use template::{Format, Template};

/// Who an upstream request is sent for.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) client: ClientId,
    /// The JWT the client authenticated with (none for an API key or anonymous).
    pub(crate) token: Option<PresentedToken>,
}

/// One server's identity mode and what it keeps: the token cache.
#[derive(Debug)]
pub(crate) struct Broker {
    server: Arc<str>,
    /// The server's URL: the default `resource` and assertion `aud`.
    url: String,
    identity: Option<ServerIdentity>,
    cache: TokenCache,
}

impl Broker {
    /// The broker of `server` (reached at `url`), under `identity`, with the
    /// cache bounds of `[identity]`.
    pub(crate) fn new(
        server: &str,
        url: &str,
        identity: Option<ServerIdentity>,
        gateway: &IdentitySettings,
    ) -> Self {
        Self {
            server: Arc::from(server),
            url: url.to_owned(),
            identity,
            cache: TokenCache::new(gateway.max_cached, gateway.max_cached_per_client),
        }
    }

    /// The credential `caller` reaches this server with; `gateway` holds the
    /// signing keys in force.
    pub(crate) async fn credential(
        &self,
        caller: &Caller,
        gateway: &IdentitySettings,
    ) -> Result<Credential, CredentialError> {
        let Some(identity) = &self.identity else {
            return Ok(Credential {
                headers: Vec::new(),
            });
        };
        let client = caller.client.name();
        let server = &*self.server;
        let headers = match identity {
            ServerIdentity::Secrets {
                header,
                format,
                secrets,
            } => {
                let (secret, _) = secrets.get(client).ok_or_else(|| CredentialError {
                    reason: format!(
                        "no secret is configured for client `{client}` at server `{server}`; the operator must add \
                         `servers.{server}.identity.secrets.{client}`"
                    ),
                    retry_helps: false,
                })?;
                vec![(header.clone(), value(format, secret.expose(), server)?)]
            }
            ServerIdentity::Template { headers } => {
                let claims = caller.token.as_ref().map(PresentedToken::claims);
                let mut out = Vec::new();
                for (name, template) in headers {
                    let text = template
                        .render(client, claims)
                        .map_err(|why| unrenderable(why, name, client, server))?;
                    out.push((name.clone(), sensitive(&text, server)?));
                }
                out
            }
            ServerIdentity::Assertion(a) => {
                vec![(a.header.clone(), self.assertion(a, caller, gateway)?)]
            }
            ServerIdentity::Exchange(g) => {
                let token = caller.token.as_ref().ok_or_else(|| CredentialError {
                    reason: format!(
                        "server `{server}` is reached with a token exchanged from the client's own token, and client \
                         `{client}` did not sign in with one (it used an API key or none). The client must sign in \
                         with a token from the authorization server, or the operator must give `{server}` another \
                         identity mode"
                    ),
                    retry_helps: false,
                })?;
                let subject: [u8; 32] = Sha256::digest(token.secret().as_bytes()).into();
                let subject_until = token.expires_at().map(|s| (s * 1000.0) as u64);
                let key = self.key(client, g, subject);
                let ask = Ask::Exchange {
                    subject_token: token.secret(),
                };
                let issued = self
                    .obtain(key, g, ask, subject_until, gateway.keys.first())
                    .await?;
                vec![(g.header.clone(), value(&g.format, &issued, server)?)]
            }
            ServerIdentity::Service(g) => {
                let key = self.key("", g, [0; 32]);
                let issued = self
                    .obtain(key, g, Ask::Service, None, gateway.keys.first())
                    .await?;
                vec![(g.header.clone(), value(&g.format, &issued, server)?)]
            }
        };
        Ok(Credential { headers })
    }

    fn key(&self, client: &str, grant: &GrantSettings, subject: [u8; 32]) -> CacheKey {
        CacheKey {
            client: Arc::from(client),
            server: self.server.clone(),
            scopes: Arc::from(grant.scopes.join(" ")),
            subject,
        }
    }

    /// The cached token under `key`, or a new one from the token endpoint,
    /// cached until shortly before it (or its subject token) expires.
    async fn obtain(
        &self,
        key: CacheKey,
        grant: &GrantSettings,
        ask: Ask<'_>,
        subject_until: Option<u64>,
        signing: Option<&Arc<SigningKey>>,
    ) -> Result<Arc<str>, CredentialError> {
        let now = now_ms();
        if let Some(token) = self.cache.get(&key, now) {
            return Ok(token);
        }
        let resource = grant.resource.as_deref().unwrap_or(&self.url);
        let signing = signing.map(|k| &**k);
        let Issued { token, expires_in } =
            grant::request(grant, ask, resource, signing, &self.server).await?;
        let token: Arc<str> = Arc::from(token);
        let now = now_ms();
        let mut until = now + ms(grant.max_reuse);
        if let Some(lifetime) = expires_in {
            until = until.min((now + ms(lifetime)).saturating_sub(ms(grant.refresh_before)));
        }
        if let Some(subject) = subject_until {
            until = until.min(subject);
        }
        self.cache.put(key, token.clone(), until, now);
        Ok(token)
    }

    /// A signed assertion for `caller`, or the one minted for it within `reuse`.
    fn assertion(
        &self,
        a: &AssertionSettings,
        caller: &Caller,
        gateway: &IdentitySettings,
    ) -> Result<HeaderValue, CredentialError> {
        let server = &*self.server;
        let client = caller.client.name();
        let key = CacheKey {
            client: Arc::from(client),
            server: self.server.clone(),
            scopes: Arc::from(""),
            subject: [0; 32],
        };
        let now = now_ms();
        if a.reuse.is_some()
            && let Some(token) = self.cache.get(&key, now)
        {
            return value(&a.format, &token, server);
        }
        let (signing, issuer) = match (gateway.keys.first(), &gateway.issuer) {
            (Some(k), Some(i)) => (k, i),
            _ => {
                return Err(CredentialError {
                    reason: "the gateway has no signing key or issuer in force ([identity]); the operator must \
                             configure `signing_keys` and `issuer`"
                        .into(),
                    retry_helps: false,
                });
            }
        };
        let iat = now / 1000;
        let mut claims = Map::new();
        claims.insert("iss".into(), issuer.clone().into());
        claims.insert("sub".into(), client.into());
        claims.insert("aud".into(), a.audience.clone().into());
        claims.insert("azp".into(), issuer.clone().into());
        claims.insert("act".into(), serde_json::json!({ "sub": issuer }));
        claims.insert("iat".into(), iat.into());
        claims.insert("exp".into(), (iat + a.lifetime.as_secs()).into());
        claims.insert("jti".into(), signer::new_jti().into());
        let token = signing
            .sign("JWT", &claims)
            .map_err(|why| CredentialError {
                reason: format!("the gateway could not sign an identity assertion: {why}"),
                retry_helps: false,
            })?;
        if let Some(reuse) = a.reuse {
            self.cache
                .put(key, Arc::from(token.as_str()), now + ms(reuse), now);
        }
        value(&a.format, &token, server)
    }
}

/// For `portcullis check`: what `client` (authenticating with a token or
/// not) reaches a server under `identity` with.
pub(crate) fn describe(
    identity: Option<&ServerIdentity>,
    client: &ClientId,
    with_token: bool,
) -> String {
    let name = client.name();
    match identity {
        None => "the server's own `headers` only (one shared identity)".into(),
        Some(ServerIdentity::Secrets { secrets, header, .. }) => match secrets.get(name) {
            Some((_, source)) => format!("its own secret ({source}) in `{header}`"),
            None => "nothing: no secret is configured for it, so its calls are refused".into(),
        },
        Some(ServerIdentity::Template { headers }) => {
            let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
            let claims = headers.iter().any(|(_, t)| t.reads_claims());
            if claims && !with_token {
                format!(
                    "nothing: the template of {} reads token claims and it signs in without a token",
                    names.join(", ")
                )
            } else {
                format!("its identity in {}", names.join(", "))
            }
        }
        Some(ServerIdentity::Assertion(a)) => format!(
            "an assertion signed by the gateway (sub \"{name}\", aud \"{}\", {}s) in `{}`",
            a.audience,
            a.lifetime.as_secs(),
            a.header
        ),
        Some(ServerIdentity::Exchange(g)) if with_token => format!(
            "its token exchanged at {} ({}) in `{}`",
            g.endpoint,
            g.auth.name(),
            g.header
        ),
        Some(ServerIdentity::Exchange(_)) => {
            "nothing: it signs in without a token, which an exchange needs, so its calls are refused".into()
        }
        Some(ServerIdentity::Service(g)) => format!(
            "the gateway's service token from {} ({}) in `{}` (shared by all clients)",
            g.endpoint,
            g.auth.name(),
            g.header
        ),
    }
}

fn value(format: &Format, credential: &str, server: &str) -> Result<HeaderValue, CredentialError> {
    let text = format.render(credential).map_err(|why| CredentialError {
        reason: format!(
            "the credential for server `{server}` cannot be sent in a header: {}; the operator must check its source",
            why.words()
        ),
        retry_helps: false,
    })?;
    sensitive(&text, server)
}

fn sensitive(text: &str, server: &str) -> Result<HeaderValue, CredentialError> {
    let mut value = HeaderValue::from_str(text).map_err(|_| CredentialError {
        reason: format!("the credential for server `{server}` cannot be sent in a header"),
        retry_helps: false,
    })?;
    value.set_sensitive(true);
    Ok(value)
}

fn unrenderable(
    why: template::Unrenderable,
    header: &HeaderName,
    client: &str,
    server: &str,
) -> CredentialError {
    use template::Unrenderable;
    let what = match why {
        Unrenderable::Missing(claim) => {
            format!(
                "the claim `{claim}` is not in the client's token (or it signed in without one)"
            )
        }
        Unrenderable::NotAValue(claim) => {
            format!("the claim `{claim}` is an object, a list or null, not one value")
        }
        Unrenderable::Unsafe(claim, u) => {
            format!("the value of `{claim}` is refused: {}", u.words())
        }
    };
    CredentialError {
        reason: format!(
            "the header `{header}` for server `{server}` cannot be filled for client `{client}`: {what}. Retrying \
             with the same token will not help; the operator must check `servers.{server}.identity.headers`"
        ),
        retry_helps: false,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests;
