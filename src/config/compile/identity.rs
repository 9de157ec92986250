//! `[identity]` and `[servers.NAME.identity]` → the identity module's
//! settings types ([`crate::identity`]).
//!
//! Invariants: every value is checked here, with its place in the file; a
//! secret or a key is read from the environment or a file at load, never
//! from the TOML, and its value never appears in a refusal; a mode takes
//! only its own keys; a token endpoint is https (http only on a loopback
//! address), without credentials in its URL.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use toml::Spanned;

use super::super::model::{ServerSettings, Transport};
use super::super::raw::{RawIdentity, RawServerIdentity};
use super::{Ctx, Result};
use crate::identity::{
    AssertionSettings, DEFAULT_ASSERTION_LIFETIME, DEFAULT_MAX_CACHED,
    DEFAULT_MAX_CACHED_PER_CLIENT, IdentitySettings, MAX_ASSERTION_LIFETIME, ServerIdentity,
    SigningKey, Template,
};

#[cfg(test)]
mod tests;
mod values;

/// Which keys each mode takes (besides `mode`).
const MODE_KEYS: &[(&str, &[&str])] = &[
    ("secret", &["header", "format", "secrets"]),
    ("template", &["headers"]),
    (
        "assertion",
        &["header", "format", "audience", "lifetime", "reuse"],
    ),
    (
        "exchange",
        &[
            "header",
            "format",
            "token_endpoint",
            "client_id",
            "client_auth",
            "client_secret",
            "resource",
            "token_audience",
            "scopes",
            "subject_token_type",
            "timeout",
            "refresh_before",
            "max_reuse",
        ],
    ),
    (
        "client_credentials",
        &[
            "header",
            "format",
            "token_endpoint",
            "client_id",
            "client_auth",
            "client_secret",
            "resource",
            "token_audience",
            "scopes",
            "timeout",
            "refresh_before",
            "max_reuse",
        ],
    ),
];

const ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";
const JWT: &str = "urn:ietf:params:oauth:token-type:jwt";

impl Ctx<'_> {
    /// `[identity]`.
    pub(super) fn identity(&self, raw: &RawIdentity) -> Result<IdentitySettings> {
        let issuer = match &raw.issuer {
            None => None,
            Some(i) => {
                let text = self.expand(i, "identity.issuer")?;
                if text.is_empty()
                    || text.len() > 256
                    || !text.bytes().all(|b| b.is_ascii_graphic())
                {
                    return Err(self.fail(
                        Some(i.span()),
                        "identity.issuer",
                        "expected the gateway's identifier as upstreams know it, such as \"https://gateway.example.com\" (visible ASCII, at most 256 bytes)",
                    ));
                }
                Some(text)
            }
        };
        let mut keys: Vec<Arc<SigningKey>> = Vec::new();
        for (i, source) in raw.signing_keys.iter().enumerate() {
            let key = format!("identity.signing_keys[{i}]");
            let (pem, _) = self.secret_source(source, &key)?;
            let parsed = SigningKey::from_pem(pem.expose())
                .map_err(|why| self.fail(Some(source.span()), &key, why))?;
            if keys.iter().any(|k| k.kid() == parsed.kid()) {
                return Err(self.fail(
                    Some(source.span()),
                    &key,
                    "this key is listed twice; list each key once (the first signs, all are published)",
                ));
            }
            keys.push(Arc::new(parsed));
        }
        let max_cached = self.size(
            raw.max_cached_tokens.as_ref(),
            "identity.max_cached_tokens",
            DEFAULT_MAX_CACHED,
            1,
            1_000_000,
        )?;
        let max_cached_per_client = self.size(
            raw.max_cached_tokens_per_client.as_ref(),
            "identity.max_cached_tokens_per_client",
            DEFAULT_MAX_CACHED_PER_CLIENT.min(max_cached),
            1,
            max_cached,
        )?;
        Ok(IdentitySettings {
            issuer,
            keys,
            max_cached,
            max_cached_per_client,
        })
    }

    /// Each server's `identity`, once the clients and `[identity]` are known.
    pub(super) fn server_identities(
        &self,
        raw: &super::super::raw::RawConfig,
        servers: &mut BTreeMap<String, Arc<ServerSettings>>,
        clients: &BTreeSet<String>,
        gateway: &IdentitySettings,
    ) -> Result<()> {
        for (name, server) in &raw.servers {
            let Some(identity) = &server.identity else {
                continue;
            };
            let key = format!("servers.{}.identity", name.get_ref());
            let Some(settings) = servers.get_mut(name.get_ref()).and_then(Arc::get_mut) else {
                continue;
            };
            let url = match &settings.transport {
                Transport::Http(url) => url.as_str().to_owned(),
                Transport::Stdio(_) => {
                    return Err(self.fail(
                        Some(identity.span()),
                        &key,
                        "an identity mode applies to servers reached by `url`: a stdio server is one process shared \
                         by every client, so it cannot be reached as each of them",
                    ));
                }
            };
            let static_headers: Vec<&str> =
                settings.headers.iter().map(|(n, _)| n.as_str()).collect();
            let compiled = self.server_identity(
                identity,
                &key,
                &url,
                clients,
                gateway,
                raw.auth.jwt.is_some(),
            )?;
            for header in compiled.header_names() {
                if static_headers.contains(&header.as_str()) {
                    return Err(self.fail(
                        Some(identity.span()),
                        &key,
                        format!(
                            "the identity mode sets `{header}`, which `servers.{}.headers` sets too; keep one",
                            name.get_ref()
                        ),
                    ));
                }
            }
            settings.identity = Some(compiled);
        }
        Ok(())
    }

    fn server_identity(
        &self,
        spanned: &Spanned<RawServerIdentity>,
        key: &str,
        url: &str,
        clients: &BTreeSet<String>,
        gateway: &IdentitySettings,
        jwt: bool,
    ) -> Result<ServerIdentity> {
        let raw = spanned.get_ref();
        let mode = raw.mode.get_ref().as_str();
        let allowed = MODE_KEYS
            .iter()
            .find(|(m, _)| *m == mode)
            .map(|(_, keys)| *keys)
            .ok_or_else(|| {
                self.fail(
                    Some(raw.mode.span()),
                    &format!("{key}.mode"),
                    format!(
                        "{mode:?} is not an identity mode; expected one of \"secret\", \"template\", \"assertion\", \"exchange\", \"client_credentials\""
                    ),
                )
            })?;
        for (present, span) in present_keys(raw) {
            if !allowed.contains(&present) {
                return Err(self.fail(
                    Some(span),
                    &format!("{key}.{present}"),
                    format!(
                        "`{present}` does not apply to mode {mode:?}; it takes {}",
                        allowed.join(", ")
                    ),
                ));
            }
        }
        let header = self.identity_header(raw.header.as_ref(), key)?;
        Ok(match mode {
            "secret" => {
                let format = self.format(raw.format.as_ref(), key, "{secret}")?;
                let mut secrets = BTreeMap::new();
                for (client, source) in &raw.secrets {
                    let skey = format!("{key}.secrets.{}", client.get_ref());
                    if !clients.contains(client.get_ref()) {
                        return Err(self.fail(
                            Some(client.span()),
                            &skey,
                            format!("no client named {:?} is defined", client.get_ref()),
                        ));
                    }
                    let (secret, from) = self.secret_source(source, &skey)?;
                    if format.render(secret.expose()).is_err() {
                        return Err(self.fail(
                            Some(source.span()),
                            &skey,
                            "the secret cannot be sent in a header: it must be one line of visible ASCII",
                        ));
                    }
                    secrets.insert(client.get_ref().clone(), (secret, from));
                }
                if secrets.is_empty() {
                    return Err(self.fail(
                        Some(spanned.span()),
                        &format!("{key}.secrets"),
                        "mode \"secret\" needs each client's secret, such as secrets.alice = { env = \"FILES_ALICE_TOKEN\" }",
                    ));
                }
                ServerIdentity::Secrets {
                    header,
                    format,
                    secrets,
                }
            }
            "template" => {
                let mut headers = Vec::new();
                for (name, value) in &raw.headers {
                    let hkey = format!("{key}.headers.{}", name.get_ref());
                    let header = self.header_name(name, &hkey)?;
                    let template = Template::parse(value.get_ref())
                        .map_err(|why| self.fail(Some(value.span()), &hkey, why))?;
                    headers.push((header, template));
                }
                if headers.is_empty() {
                    return Err(self.fail(
                        Some(spanned.span()),
                        &format!("{key}.headers"),
                        "mode \"template\" needs at least one header, such as headers = { X-User = \"{client}\" }",
                    ));
                }
                ServerIdentity::Template { headers }
            }
            "assertion" => {
                if gateway.keys.is_empty() || gateway.issuer.is_none() {
                    return Err(self.fail(
                        Some(raw.mode.span()),
                        &format!("{key}.mode"),
                        "mode \"assertion\" needs the gateway's `issuer` and `signing_keys` in [identity]",
                    ));
                }
                let lifetime = self.duration(
                    raw.lifetime.as_ref(),
                    &format!("{key}.lifetime"),
                    DEFAULT_ASSERTION_LIFETIME,
                    MAX_ASSERTION_LIFETIME,
                )?;
                let reuse = match &raw.reuse {
                    None => None,
                    Some(r) => {
                        let d =
                            self.duration(Some(r), &format!("{key}.reuse"), lifetime, lifetime)?;
                        if d >= lifetime {
                            return Err(self.fail(
                                Some(r.span()),
                                &format!("{key}.reuse"),
                                "`reuse` must be shorter than `lifetime`, or an upstream would get an expired assertion",
                            ));
                        }
                        Some(d)
                    }
                };
                ServerIdentity::Assertion(AssertionSettings {
                    header,
                    format: self.format(raw.format.as_ref(), key, "{token}")?,
                    audience: self
                        .plain_value(raw.audience.as_ref(), &format!("{key}.audience"))?
                        .unwrap_or_else(|| url.to_owned()),
                    lifetime,
                    reuse,
                })
            }
            _ => {
                let exchange = mode == "exchange";
                if exchange && !jwt {
                    return Err(self.fail(
                        Some(raw.mode.span()),
                        &format!("{key}.mode"),
                        "mode \"exchange\" exchanges the JWT a client signs in with, so it needs [auth.jwt]",
                    ));
                }
                let grant = self.grant(raw, key, header, gateway)?;
                if exchange {
                    ServerIdentity::Exchange(grant)
                } else {
                    ServerIdentity::Service(grant)
                }
            }
        })
    }
}

/// The keys set in a server's identity table, with their places.
fn present_keys(raw: &RawServerIdentity) -> Vec<(&'static str, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut opt = |name: &'static str, v: Option<std::ops::Range<usize>>| {
        if let Some(span) = v {
            out.push((name, span));
        }
    };
    opt("header", raw.header.as_ref().map(Spanned::span));
    opt("format", raw.format.as_ref().map(Spanned::span));
    opt("secrets", raw.secrets.keys().next().map(Spanned::span));
    opt("headers", raw.headers.keys().next().map(Spanned::span));
    opt("audience", raw.audience.as_ref().map(Spanned::span));
    opt("lifetime", raw.lifetime.as_ref().map(Spanned::span));
    opt("reuse", raw.reuse.as_ref().map(Spanned::span));
    opt(
        "token_endpoint",
        raw.token_endpoint.as_ref().map(Spanned::span),
    );
    opt("client_id", raw.client_id.as_ref().map(Spanned::span));
    opt("client_auth", raw.client_auth.as_ref().map(Spanned::span));
    opt(
        "client_secret",
        raw.client_secret.as_ref().map(Spanned::span),
    );
    opt("resource", raw.resource.as_ref().map(Spanned::span));
    opt(
        "token_audience",
        raw.token_audience.as_ref().map(Spanned::span),
    );
    opt("scopes", raw.scopes.first().map(Spanned::span));
    opt(
        "subject_token_type",
        raw.subject_token_type.as_ref().map(Spanned::span),
    );
    opt("timeout", raw.timeout.as_ref().map(Spanned::span));
    opt(
        "refresh_before",
        raw.refresh_before.as_ref().map(Spanned::span),
    );
    opt("max_reuse", raw.max_reuse.as_ref().map(Spanned::span));
    out
}
