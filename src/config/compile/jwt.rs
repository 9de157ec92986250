//! `[auth.jwt]` → [`JwtVerifier`]: issuer, audiences, keys and claims checked
//! at load.
//!
//! Invariants: only public-key algorithms pass (`HS*` and `none` are refused
//! with a reason); every audience is an absolute http(s) URL (RFC 8707
//! resource indicators) bound to exactly one configured server or to the
//! whole gateway, or refused (see [`bind`]); exactly one key source; a `jwks_file` is read and
//! must hold at least one usable key; a `jwks_url` is https (http only to a
//! loopback host) and is not fetched here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::super::model::ServerSettings;
use super::super::raw::RawJwt;
use super::{Ctx, Result};
use crate::auth::jwt::{Algorithm, Audience, JwtSettings, JwtVerifier, KeySet, KeySource};
use crate::util::duration;

const KEY: &str = "auth.jwt";
const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);
const MAX_LEEWAY: Duration = Duration::from_secs(600);
const DEFAULT_REFRESH: Duration = Duration::from_secs(300);
const MAX_REFRESH: Duration = Duration::from_secs(86_400);

/// What an audience admits tokens to: `Some(server)` for `…/mcp/<server>`
/// naming a configured server, `None` for the whole gateway (`…/mcp`, or the
/// origin alone); any other path is refused with the reason, so no audience
/// can silently admit a token at more than its operator meant.
fn bind(
    url: &reqwest::Url,
    text: &str,
    servers: &BTreeMap<String, Arc<ServerSettings>>,
) -> std::result::Result<Option<String>, String> {
    let shapes = "an audience is this gateway's resource URL: `<origin>/mcp/<server>` (tokens for that server \
                  only), `<origin>/mcp` or `<origin>` (tokens for the whole gateway, the merged /mcp view included)";
    if url.query().is_some() {
        return Err(format!("{text:?} has a query; {shapes}"));
    }
    let path = url.path();
    if path == "/" || path == "/mcp" {
        return Ok(None);
    }
    if path.ends_with('/') {
        return Err(format!(
            "{text:?} ends in `/`: write it as {:?}, the resource URL the gateway's metadata names \
             (audiences are compared as exact strings, so the two would be different audiences); {shapes}",
            text.trim_end_matches('/'),
        ));
    }
    match path.strip_prefix("/mcp/") {
        Some(name) if !name.contains('/') => {
            if servers.contains_key(name) {
                return Ok(Some(name.to_owned()));
            }
            let known: Vec<&str> = servers.keys().map(String::as_str).collect();
            Err(format!(
                "{text:?} names the server `{name}`, which is not configured (servers: {}); a token bound to \
                 a server must name one that is served here, and a reload that removes a server must remove \
                 its audience too",
                known.join(", ")
            ))
        }
        _ => Err(format!(
            "the path of {text:?} is none of this gateway's resources (the gateway is served at the origin's \
             root: no base path); {shapes}"
        )),
    }
}

impl Ctx<'_> {
    pub(super) fn jwt(
        &self,
        raw: &Spanned<RawJwt>,
        servers: &BTreeMap<String, Arc<ServerSettings>>,
    ) -> Result<JwtVerifier> {
        let table = Some(raw.span());
        let raw = raw.get_ref();
        let issuer = raw.issuer.as_ref().ok_or_else(|| {
            self.fail(
                table.clone(),
                KEY,
                "`issuer` is required: the authorization server's identifier, exactly as in the tokens' `iss`",
            )
        })?;
        self.http_url(issuer, &format!("{KEY}.issuer"))?;
        let audiences = self.audiences(raw, servers, table.clone())?;
        let resource_url = match &raw.resource_url {
            Some(url) => {
                let key = format!("{KEY}.resource_url");
                let parsed = self.http_url(url, &key)?;
                if parsed.path() != "/" || parsed.query().is_some() {
                    return Err(self.fail(
                        Some(url.span()),
                        &key,
                        "expected the origin clients reach this gateway at, such as \"https://mcp.example.com\" (no path)",
                    ));
                }
                parsed.origin().ascii_serialization()
            }
            // Never the request's Host: a configured value cannot be spoofed.
            None => audiences
                .first()
                .and_then(|a| reqwest::Url::parse(&a.value).ok())
                .map(|u| u.origin().ascii_serialization())
                .unwrap_or_default(),
        };
        let keys = self.key_source(raw, table)?;
        let client_claim = match &raw.client_claim {
            Some(c) if c.get_ref().trim().is_empty() => {
                return Err(self.fail(
                    Some(c.span()),
                    &format!("{KEY}.client_claim"),
                    "expected the name of a claim, such as \"sub\", \"client_id\" or \"azp\"",
                ));
            }
            Some(c) => c.get_ref().clone(),
            None => "sub".to_owned(),
        };
        let leeway = match &raw.leeway {
            None => DEFAULT_LEEWAY,
            Some(v) => {
                let key = format!("{KEY}.leeway");
                let d =
                    duration::parse(v.get_ref()).map_err(|e| self.fail(Some(v.span()), &key, e))?;
                if d > MAX_LEEWAY {
                    return Err(self.fail(
                        Some(v.span()),
                        &key,
                        format!("expected at most {}s", MAX_LEEWAY.as_secs()),
                    ));
                }
                d
            }
        };
        let algorithms = match &raw.algorithms {
            None => Algorithm::DEFAULT.to_vec(),
            Some(list) => {
                let key = format!("{KEY}.algorithms");
                if list.get_ref().is_empty() {
                    return Err(self.fail(
                        Some(list.span()),
                        &key,
                        "name at least one algorithm, such as \"RS256\"",
                    ));
                }
                list.get_ref()
                    .iter()
                    .map(|a| {
                        Algorithm::parse(a.get_ref())
                            .map_err(|e| self.fail(Some(a.span()), &key, e))
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let required_scopes = match &raw.required_scopes {
            None => Vec::new(),
            Some(list) => {
                let key = format!("{KEY}.required_scopes");
                for scope in list.get_ref() {
                    // RFC 6749 §3.3 scope-token: it is quoted into WWW-Authenticate.
                    let ok = !scope.get_ref().is_empty()
                        && scope.get_ref().bytes().all(|b| {
                            b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b)
                        });
                    if !ok {
                        return Err(self.fail(
                            Some(scope.span()),
                            &key,
                            "a scope is one word of visible ASCII without `\"` or `\\`, such as \"mcp:tools\"",
                        ));
                    }
                }
                list.get_ref().iter().map(|s| s.get_ref().clone()).collect()
            }
        };
        Ok(JwtVerifier::new(JwtSettings {
            issuer: issuer.get_ref().clone(),
            audiences,
            keys,
            client_claim,
            leeway,
            algorithms,
            required_scopes,
            resource_url,
        }))
    }

    fn audiences(
        &self,
        raw: &RawJwt,
        servers: &BTreeMap<String, Arc<ServerSettings>>,
        table: Option<std::ops::Range<usize>>,
    ) -> Result<Vec<Audience>> {
        let key = format!("{KEY}.audience");
        let value = raw.audience.as_ref().ok_or_else(|| {
            self.fail(
                table,
                KEY,
                "`audience` is required: this gateway's resource URL as the tokens' `aud` names it, such as \"https://mcp.example.com/mcp/flights\"",
            )
        })?;
        let expected = "expected this gateway's resource URL (RFC 8707), or a list of them, such as \"https://mcp.example.com/mcp/flights\"";
        let values: Vec<&str> = match value.get_ref() {
            toml::Value::String(s) => vec![s.as_str()],
            toml::Value::Array(list) if !list.is_empty() => list
                .iter()
                .map(|v| v.as_str())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.fail(Some(value.span()), &key, expected))?,
            _ => return Err(self.fail(Some(value.span()), &key, expected)),
        };
        let mut audiences = Vec::new();
        for text in values {
            let url = reqwest::Url::parse(text)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https") && u.fragment().is_none())
                .ok_or_else(|| {
                    self.fail(
                        Some(value.span()),
                        &key,
                        format!(
                            "{text:?} is not an absolute http(s) URL without fragment; {expected}"
                        ),
                    )
                })?;
            let server = bind(&url, text, servers)
                .map_err(|why| self.fail(Some(value.span()), &key, why))?;
            audiences.push(Audience {
                value: text.to_owned(),
                server,
            });
        }
        Ok(audiences)
    }

    fn key_source(&self, raw: &RawJwt, table: Option<std::ops::Range<usize>>) -> Result<KeySource> {
        match (&raw.jwks_file, &raw.jwks_url) {
            (Some(_), Some(url)) => Err(self.fail(
                Some(url.span()),
                &format!("{KEY}.jwks_url"),
                "give either `jwks_file` or `jwks_url`, not both",
            )),
            (None, None) => Err(self.fail(
                table,
                KEY,
                "the verification keys are required: give `jwks_url` (the authorization server's JWKS) or `jwks_file`",
            )),
            (Some(file), None) => {
                let key = format!("{KEY}.jwks_file");
                if let Some(refresh) = &raw.jwks_refresh {
                    return Err(self.fail(
                        Some(refresh.span()),
                        &format!("{KEY}.jwks_refresh"),
                        "`jwks_refresh` applies to `jwks_url`; a `jwks_file` is read at load and on reload",
                    ));
                }
                let text = std::fs::read(file.get_ref()).map_err(|e| {
                    self.fail(
                        Some(file.span()),
                        &key,
                        format!("cannot read {:?}: {e}", file.get_ref()),
                    )
                })?;
                let (set, skipped) = KeySet::parse(&text).map_err(|e| {
                    self.fail(Some(file.span()), &key, format!("{:?}: {e}", file.get_ref()))
                })?;
                if set.is_empty() {
                    let why = match skipped.is_empty() {
                        true => "the key set is empty".to_owned(),
                        false => format!("no key can verify signatures: {}", skipped.join("; ")),
                    };
                    return Err(self.fail(
                        Some(file.span()),
                        &key,
                        format!("{:?}: {why}", file.get_ref()),
                    ));
                }
                for why in skipped {
                    tracing::warn!(file = %file.get_ref(), "key set: left out {why}");
                }
                Ok(KeySource::File(set))
            }
            (None, Some(url)) => {
                let key = format!("{KEY}.jwks_url");
                let parsed = self.http_url(url, &key)?;
                let loopback = parsed.host_str().is_some_and(|h| {
                    h == "localhost"
                        || h.trim_start_matches('[')
                            .trim_end_matches(']')
                            .parse::<std::net::IpAddr>()
                            .is_ok_and(|ip| ip.is_loopback())
                });
                if parsed.scheme() != "https" && !loopback {
                    return Err(self.fail(
                        Some(url.span()),
                        &key,
                        "the key set must be fetched over https (http only from a loopback address)",
                    ));
                }
                let refresh = self.duration(
                    raw.jwks_refresh.as_ref(),
                    &format!("{KEY}.jwks_refresh"),
                    DEFAULT_REFRESH,
                    MAX_REFRESH,
                )?;
                Ok(KeySource::Url {
                    url: parsed,
                    refresh,
                })
            }
        }
    }

    /// An absolute `http`/`https` URL.
    fn http_url(&self, value: &Spanned<String>, key: &str) -> Result<reqwest::Url> {
        reqwest::Url::parse(value.get_ref())
            .ok()
            .filter(|u| {
                matches!(u.scheme(), "http" | "https") && u.has_host() && u.fragment().is_none()
            })
            .ok_or_else(|| {
                self.fail(
                    Some(value.span()),
                    key,
                    format!("{:?} is not an absolute http(s) URL", value.get_ref()),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::super::compile;
    use super::*;
    use crate::config::{Config, ConfigError};

    const BASE: &str = "[servers.flights]\nurl = \"http://127.0.0.1:3001/mcp\"\n";

    fn jwt(lines: &str) -> String {
        format!(
            "{BASE}[auth.jwt]\nissuer = \"https://idp.example.com\"\naudience = [\"https://mcp.example.com/mcp/flights\", \"https://mcp.example.com/mcp\"]\n{lines}\n"
        )
    }

    fn accept(text: &str) -> Config {
        compile(text, "p.toml", &|_| None).expect("must compile")
    }

    fn refuse(text: &str) -> ConfigError {
        compile(text, "p.toml", &|_| None).expect_err("must be refused")
    }

    #[test]
    fn defaults_and_audiences() {
        let c = accept(&jwt(
            "jwks_url = \"https://idp.example.com/jwks.json\"\n[clients.carol]",
        ));
        let s = c.clients.jwt().expect("jwt").settings();
        assert_eq!(s.client_claim, "sub");
        assert_eq!(s.leeway, Duration::from_secs(60));
        assert_eq!(s.algorithms, Algorithm::DEFAULT);
        assert!(s.required_scopes.is_empty());
        assert_eq!(s.resource_url, "https://mcp.example.com");
        assert!(
            matches!(&s.keys, KeySource::Url { refresh, .. } if *refresh == Duration::from_secs(300))
        );
        assert_eq!(s.audiences[0].server.as_deref(), Some("flights"));
        assert_eq!(s.audiences[1].server, None);
        // The keyless table names a JWT client that rules can address.
        let names: Vec<String> = c
            .clients
            .ids()
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
        assert_eq!(names, ["carol"]);
    }

    #[test]
    fn a_jwks_file_is_read_at_load() {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        let x =
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, [9u8; 32]);
        write!(
            file,
            r#"{{"keys": [{{"kty": "OKP", "crv": "Ed25519", "x": "{x}"}}, {{"kty": "oct", "k": "c2VjcmV0"}}]}}"#
        )
        .expect("write");
        let c = accept(&jwt(&format!(
            "jwks_file = \"{}\"\nresource_url = \"https://gw.example.com\"",
            file.path().display()
        )));
        let s = c.clients.jwt().expect("jwt").settings();
        assert!(matches!(&s.keys, KeySource::File(set) if set.len() == 1));
        assert_eq!(s.resource_url, "https://gw.example.com");

        let mut only_secret = tempfile::NamedTempFile::new().expect("temp file");
        write!(
            only_secret,
            r#"{{"keys": [{{"kty": "oct", "k": "c2VjcmV0"}}]}}"#
        )
        .expect("write");
        let e = refuse(&jwt(&format!(
            "jwks_file = \"{}\"",
            only_secret.path().display()
        )));
        assert!(
            e.to_string().contains("no key can verify signatures"),
            "{e}"
        );
        let e = refuse(&jwt("jwks_file = \"/nonexistent/jwks.json\""));
        assert!(e.to_string().contains("auth.jwt.jwks_file"), "{e}");
    }

    #[test]
    fn unsafe_or_unclear_values_are_refused() {
        let url = "jwks_url = \"https://idp.example.com/jwks.json\"\n";
        for (lines, expected) in [
            (format!("{url}algorithms = [\"none\"]"), "never accepted"),
            (format!("{url}algorithms = [\"HS512\"]"), "shared-secret"),
            (format!("{url}algorithms = []"), "at least one"),
            (
                "jwks_url = \"http://idp.example.com/jwks.json\"".to_owned(),
                "https",
            ),
            (
                format!("{url}resource_url = \"https://gw.example.com/base\""),
                "no path",
            ),
            (format!("{url}required_scopes = [\"a b\"]"), "one word"),
            (format!("{url}leeway = \"1h\""), "at most 600s"),
            (format!("{url}client_claim = \"\""), "name of a claim"),
            (format!("{url}jwks_refresh = \"0s\""), "above zero"),
            (format!("{url}audiance = \"x\""), "did you mean `audience`"),
            (
                "jwks_file = \"/x\"\njwks_refresh = \"1m\"".to_owned(),
                "applies to `jwks_url`",
            ),
            (String::new(), "verification keys are required"),
        ] {
            let e = refuse(&jwt(&lines)).to_string();
            assert!(e.contains(expected), "{lines:?}: {e}");
        }
        let e = refuse(&format!(
            "{BASE}[auth.jwt]\naudience = \"https://mcp.example.com\"\n{url}"
        ));
        assert!(e.to_string().contains("`issuer` is required"), "{e}");
        let e = refuse(&format!(
            "{BASE}[auth.jwt]\nissuer = \"https://idp.example.com\"\naudience = \"my-api\"\n{url}"
        ));
        assert!(e.to_string().contains("RFC 8707"), "{e}");
        // http is fine from a loopback address.
        accept(&jwt("jwks_url = \"http://127.0.0.1:8081/jwks.json\""));
    }
}
