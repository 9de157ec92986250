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
use std::time::Duration;

use http::HeaderName;
use toml::Spanned;

use super::super::model::{ServerSettings, Transport};
use super::super::raw::{RawIdentity, RawSecretSource, RawServerIdentity};
use super::{Ctx, RESERVED_HEADERS, Result};
use crate::identity::{
    AssertionSettings, ClientAuth, DEFAULT_ASSERTION_LIFETIME, DEFAULT_MAX_CACHED,
    DEFAULT_MAX_CACHED_PER_CLIENT, DEFAULT_MAX_TOKEN_REUSE, DEFAULT_REFRESH_BEFORE,
    DEFAULT_TOKEN_TIMEOUT, Format, GrantSettings, IdentitySettings, MAX_ASSERTION_LIFETIME, Secret,
    ServerIdentity, SigningKey, Template,
};

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

    fn grant(
        &self,
        raw: &RawServerIdentity,
        key: &str,
        header: HeaderName,
        gateway: &IdentitySettings,
    ) -> Result<GrantSettings> {
        let endpoint_key = format!("{key}.token_endpoint");
        let endpoint_raw = raw.token_endpoint.as_ref().ok_or_else(|| {
            self.fail(None, &endpoint_key, "the authorization server's token endpoint is required, such as \"https://sso.example.com/oauth2/token\"")
        })?;
        let text = self.expand(endpoint_raw, &endpoint_key)?;
        let endpoint = reqwest::Url::parse(&text)
            .ok()
            .filter(|u| {
                matches!(u.scheme(), "http" | "https") && u.has_host() && u.fragment().is_none()
            })
            .ok_or_else(|| {
                self.fail(
                    Some(endpoint_raw.span()),
                    &endpoint_key,
                    "expected an https URL such as \"https://sso.example.com/oauth2/token\"",
                )
            })?;
        let loopback = endpoint.host_str().is_some_and(|h| {
            h.eq_ignore_ascii_case("localhost")
                || h.trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
        if endpoint.scheme() != "https" && !loopback {
            return Err(self.fail(
                Some(endpoint_raw.span()),
                &endpoint_key,
                "the token endpoint must be https (http only on a loopback address): client tokens and secrets are sent to it",
            ));
        }
        if !endpoint.username().is_empty() || endpoint.password().is_some() {
            return Err(self.fail(
                Some(endpoint_raw.span()),
                &endpoint_key,
                "credentials in the URL would be logged; use `client_secret`",
            ));
        }
        let id_key = format!("{key}.client_id");
        let client_id = self
            .plain_value(raw.client_id.as_ref(), &id_key)?
            .ok_or_else(|| {
                self.fail(
                    None,
                    &id_key,
                    "the gateway's client id at the authorization server is required",
                )
            })?;
        let auth_key = format!("{key}.client_auth");
        let method = self.one_of(
            raw.client_auth.as_ref(),
            &auth_key,
            &[
                ("client_secret_basic", 0u8),
                ("client_secret_post", 1u8),
                ("private_key_jwt", 2u8),
            ],
            0,
        )?;
        let secret_key = format!("{key}.client_secret");
        let auth = match (method, &raw.client_secret) {
            (2, Some(s)) => {
                return Err(self.fail(
                    Some(s.span()),
                    &secret_key,
                    "`private_key_jwt` signs with [identity] signing_keys; remove `client_secret`",
                ));
            }
            (2, None) if gateway.keys.is_empty() => {
                return Err(self.fail(
                    None,
                    &auth_key,
                    "`private_key_jwt` needs a key in [identity] signing_keys",
                ));
            }
            (2, None) => ClientAuth::PrivateKeyJwt,
            (m, Some(s)) => {
                let (secret, _) = self.secret_source(s, &secret_key)?;
                if m == 0 {
                    ClientAuth::Basic(secret)
                } else {
                    ClientAuth::Post(secret)
                }
            }
            (_, None) => {
                return Err(self.fail(None, &secret_key, "the gateway's client secret is required, { env = \"NAME\" } or { file = \"…\" } (or client_auth = \"private_key_jwt\")"));
            }
        };
        let mut scopes = Vec::new();
        for (i, scope) in raw.scopes.iter().enumerate() {
            let s = scope.get_ref();
            let valid = !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
            if !valid {
                return Err(self.fail(
                    Some(scope.span()),
                    &format!("{key}.scopes[{i}]"),
                    "a scope is one word of visible ASCII (no space, `\"` or `\\`)",
                ));
            }
            scopes.push(s.clone());
        }
        let subject_token_type = match &raw.subject_token_type {
            None => ACCESS_TOKEN.to_owned(),
            Some(t) if [ACCESS_TOKEN, JWT].contains(&t.get_ref().as_str()) => t.get_ref().clone(),
            Some(t) => {
                return Err(self.fail(
                    Some(t.span()),
                    &format!("{key}.subject_token_type"),
                    format!("expected \"{ACCESS_TOKEN}\" or \"{JWT}\""),
                ));
            }
        };
        Ok(GrantSettings {
            header,
            format: self.format(raw.format.as_ref(), key, "{token}")?,
            endpoint,
            client_id,
            auth,
            resource: self.plain_value(raw.resource.as_ref(), &format!("{key}.resource"))?,
            audience: self.plain_value(
                raw.token_audience.as_ref(),
                &format!("{key}.token_audience"),
            )?,
            scopes,
            subject_token_type,
            timeout: self.duration(
                raw.timeout.as_ref(),
                &format!("{key}.timeout"),
                DEFAULT_TOKEN_TIMEOUT,
                Duration::from_secs(60),
            )?,
            refresh_before: self.duration(
                raw.refresh_before.as_ref(),
                &format!("{key}.refresh_before"),
                DEFAULT_REFRESH_BEFORE,
                Duration::from_secs(3600),
            )?,
            max_reuse: self.duration(
                raw.max_reuse.as_ref(),
                &format!("{key}.max_reuse"),
                DEFAULT_MAX_TOKEN_REUSE,
                Duration::from_secs(86_400),
            )?,
        })
    }

    /// A secret from `{ env = "NAME" }` or `{ file = "…" }` (a trailing
    /// newline dropped), with where it came from in words.
    fn secret_source(
        &self,
        source: &Spanned<RawSecretSource>,
        key: &str,
    ) -> Result<(Secret, String)> {
        let raw = source.get_ref();
        let (text, from) = match (&raw.env, &raw.file) {
            (Some(env), None) => {
                let name = env.get_ref();
                let value = (self.env)(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                    self.fail(Some(env.span()), &format!("{key}.env"), format!("the environment variable {name} is not set or empty (it is read at load time)"))
                })?;
                (value, format!("env {name}"))
            }
            (None, Some(file)) => {
                let path = self.expand(file, &format!("{key}.file"))?;
                let value = std::fs::read_to_string(&path).map_err(|e| {
                    self.fail(
                        Some(file.span()),
                        &format!("{key}.file"),
                        format!("cannot read {path}: {e}"),
                    )
                })?;
                let value = value.strip_suffix('\n').unwrap_or(&value);
                let value = value.strip_suffix('\r').unwrap_or(value).to_owned();
                if value.is_empty() {
                    return Err(self.fail(
                        Some(file.span()),
                        &format!("{key}.file"),
                        format!("{path} is empty"),
                    ));
                }
                (value, format!("file {path}"))
            }
            _ => {
                return Err(self.fail(Some(source.span()), key, "give exactly one of { env = \"NAME\" } or { file = \"/path\" }: a secret is never written in the configuration itself"));
            }
        };
        Ok((Secret::new(&text), from))
    }

    fn identity_header(&self, raw: Option<&Spanned<String>>, key: &str) -> Result<HeaderName> {
        match raw {
            None => Ok(http::header::AUTHORIZATION),
            Some(name) => self.header_name(name, &format!("{key}.header")),
        }
    }

    fn header_name(&self, name: &Spanned<String>, key: &str) -> Result<HeaderName> {
        let header = HeaderName::from_bytes(name.get_ref().as_bytes())
            .map_err(|_| self.fail(Some(name.span()), key, "not a valid HTTP header name"))?;
        let forwarded = header.as_str().starts_with("mcp-")
            || ["traceparent", "tracestate", "baggage", "last-event-id"].contains(&header.as_str());
        if RESERVED_HEADERS.contains(&header.as_str()) || forwarded {
            return Err(self.fail(
                Some(name.span()),
                key,
                "this header is managed by the gateway and cannot carry an identity",
            ));
        }
        Ok(header)
    }

    fn format(
        &self,
        raw: Option<&Spanned<String>>,
        key: &str,
        placeholder: &str,
    ) -> Result<Format> {
        match raw {
            None if placeholder == "{secret}" => Format::parse("Bearer {secret}", placeholder)
                .map_err(|why| self.fail(None, key, why)),
            None => Ok(Format::bearer()),
            Some(f) => Format::parse(f.get_ref(), placeholder)
                .map_err(|why| self.fail(Some(f.span()), &format!("{key}.format"), why)),
        }
    }

    /// A value sent to an authorization server or an upstream as it is: one
    /// word of visible ASCII.
    fn plain_value(&self, raw: Option<&Spanned<String>>, key: &str) -> Result<Option<String>> {
        let Some(raw) = raw else { return Ok(None) };
        let text = self.expand(raw, key)?;
        if text.is_empty() || text.len() > 2048 || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(self.fail(
                Some(raw.span()),
                key,
                "expected one word of visible ASCII (at most 2048 bytes)",
            ));
        }
        Ok(Some(text))
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
