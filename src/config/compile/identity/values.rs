//! The values of `[servers.NAME.identity]` and `[identity]` beneath the
//! modes: a token endpoint and how the gateway authenticates to it, secrets
//! from the environment or a file, header names, formats and plain values.
//!
//! Invariants: a secret's value never appears in a refusal; a token endpoint
//! is https (http only on a loopback address) without credentials in its URL;
//! a header that carries an identity is never one the gateway manages.

use std::time::Duration;

use http::HeaderName;
use toml::Spanned;

use super::super::super::raw::{RawSecretSource, RawServerIdentity};
use super::super::{Ctx, RESERVED_HEADERS, Result};
use super::{ACCESS_TOKEN, JWT};
use crate::identity::{
    ClientAuth, DEFAULT_MAX_TOKEN_REUSE, DEFAULT_REFRESH_BEFORE, DEFAULT_TOKEN_TIMEOUT, Format,
    GrantSettings, IdentitySettings, Secret,
};

impl Ctx<'_> {
    pub(super) fn grant(
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
    pub(super) fn secret_source(
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

    pub(super) fn identity_header(
        &self,
        raw: Option<&Spanned<String>>,
        key: &str,
    ) -> Result<HeaderName> {
        match raw {
            None => Ok(http::header::AUTHORIZATION),
            Some(name) => self.header_name(name, &format!("{key}.header")),
        }
    }

    pub(super) fn header_name(&self, name: &Spanned<String>, key: &str) -> Result<HeaderName> {
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

    pub(super) fn format(
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
    pub(super) fn plain_value(
        &self,
        raw: Option<&Spanned<String>>,
        key: &str,
    ) -> Result<Option<String>> {
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
