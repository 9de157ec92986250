//! Raw TOML → [`Config`]: every value checked, every reference resolved.
//!
//! Invariants: the first fault stops compilation and is reported with its place
//! in the file; nothing is half-applied; environment values are substituted into
//! the parsed strings (never into the TOML text, so they cannot inject syntax).

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::model::{Config, ConfigError};
use super::raw::RawConfig;
use crate::util::duration;

mod approval;
mod clients;
mod flow;
mod gateway;
mod identity;
mod jwt;
mod policy;
mod sanitize;
mod servers;
mod state;
mod tables;

type Result<T> = std::result::Result<T, ConfigError>;

/// What `[[sanitize.exemptions]]` may turn off.
/// `[gateway] max_connections` unless set: a sidecar serves a handful of
/// agents, each with a few connections; 1024 of them idle cost a few MiB.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 1024;

pub(super) const SKIPPABLE: &[&str] = &[
    "ansi",
    "invisible_unicode",
    "secrets",
    "max_output_bytes",
    "arguments",
];

/// Headers the gateway owns on the upstream request; a server's `headers` may not set them.
pub(super) const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "upgrade",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "te",
    "trailer",
];

struct Ctx<'a> {
    text: &'a str,
    file: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

pub(super) fn compile(
    text: &str,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config> {
    let cx = Ctx { text, file, env };
    let raw = cx.parse()?;
    let gateway = cx.gateway(&raw.gateway)?;
    let identity = cx.identity(&raw.identity)?;
    let mut servers = cx.servers(&raw)?;
    let (mut clients, client_names) = cx.clients(&raw)?;
    if let Some(jwt) = &raw.auth.jwt {
        clients.set_jwt(cx.jwt(jwt, &servers)?);
    }
    cx.server_identities(&raw, &mut servers, &client_names, &identity)?;
    let flow = cx.flow_labels(&raw)?;
    let policy = cx.policy(&raw.rules, &client_names, &servers, &flow.sources())?;
    let sanitize = cx.sanitize(&raw, &servers)?;
    let state = cx.state(&raw)?;
    Ok(Config {
        source: file.to_owned(),
        gateway,
        servers,
        clients,
        policy,
        rate_limit: cx.rate_limit(&raw, &state.namespace)?,
        sanitize,
        audit: cx.audit(&raw)?,
        pins: cx.pins(&raw)?,
        telemetry: cx.telemetry(&raw)?,
        methods: cx.methods(&raw)?,
        approvals: cx.approvals(&raw.approvals)?,
        identity,
        flow,
        state,
    })
}

// === impl Ctx ===

impl Ctx<'_> {
    fn parse(&self) -> Result<RawConfig> {
        let de = toml::de::Deserializer::parse(self.text).map_err(|e| self.toml_error(&e, ""))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            self.toml_error(e.inner(), &path)
        })
    }

    fn toml_error(&self, e: &toml::de::Error, key: &str) -> ConfigError {
        let message = e.message().trim();
        let reason = match unknown_field(message) {
            Some((field, expected)) => {
                let hint = match crate::policy::closest(field, &expected, 1).first() {
                    Some(best) => format!("did you mean `{best}`? "),
                    None => String::new(),
                };
                format!(
                    "unknown key `{field}`; {hint}this table accepts {}. Unknown keys are refused so a typo cannot change the policy",
                    expected
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            None => message.to_owned(),
        };
        // A table read with its span (`Spanned<T>`) names an inner field in the path.
        let key = key.replace(".$__serde_spanned_private_value", "");
        let key = match e.span() {
            Some(span) => self.name_map_keys(&key, span.start),
            None => key,
        };
        self.fail(e.span(), &key, reason)
    }

    /// The path printer cannot show `[servers.NAME]`-style keys (it prints `?`):
    /// fill them in from the table header the fault sits under.
    fn name_map_keys(&self, key: &str, at: usize) -> String {
        if !key.contains('?') {
            return key.to_owned();
        }
        let before = &self.text[..at.min(self.text.len())];
        let header = before
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| l.starts_with('[') && !l.starts_with("[["))
            .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned())
            .unwrap_or_default();
        let names: Vec<&str> = header.split('.').collect();
        key.split('.')
            .enumerate()
            .map(|(i, part)| match (part, names.get(i)) {
                ("?", Some(name)) => (*name).to_owned(),
                (part, _) => part.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(".")
    }

    fn fail(
        &self,
        span: Option<Range<usize>>,
        key: &str,
        reason: impl Into<String>,
    ) -> ConfigError {
        let (line, column, excerpt) = match span {
            Some(span) => {
                let start = span.start.min(self.text.len());
                let before = &self.text[..start];
                let line = before.matches('\n').count() + 1;
                let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
                let column = self.text[line_start..start].chars().count() + 1;
                let excerpt =
                    without_passwords(self.text[line_start..].lines().next().unwrap_or(""));
                (Some(line), Some(column), Some(excerpt))
            }
            None => (None, None, None),
        };
        ConfigError {
            file: self.file.to_owned(),
            line,
            column,
            key: key.to_owned(),
            reason: reason.into(),
            excerpt,
        }
    }

    /// Substitutes `${NAME}` from the environment.
    fn expand(&self, value: &Spanned<String>, key: &str) -> Result<String> {
        let text = value.get_ref();
        let mut out = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(pos) = rest.find("${") {
            out.push_str(&rest[..pos]);
            let after = &rest[pos + 2..];
            let end = after.find('}').ok_or_else(|| {
                self.fail(
                    Some(value.span()),
                    key,
                    "`${` is not closed; write `${NAME}` to read the environment variable NAME",
                )
            })?;
            let name = &after[..end];
            let valid = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                return Err(self.fail(
                    Some(value.span()),
                    key,
                    format!("`${{{name}}}` is not a variable name; write `${{NAME}}` with letters, digits and `_`"),
                ));
            }
            let found = (self.env)(name).ok_or_else(|| {
                self.fail(
                    Some(value.span()),
                    key,
                    format!("the environment variable {name} is not set (it is read at load time)"),
                )
            })?;
            out.push_str(&found);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    fn one_of<T: Copy>(
        &self,
        value: Option<&Spanned<String>>,
        key: &str,
        choices: &[(&str, T)],
        default: T,
    ) -> Result<T> {
        let Some(value) = value else {
            return Ok(default);
        };
        choices
            .iter()
            .find(|(name, _)| name == value.get_ref())
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                self.fail(
                    Some(value.span()),
                    key,
                    format!(
                        "{:?} is not allowed here; expected one of {}",
                        value.get_ref(),
                        names.join(", ")
                    ),
                )
            })
    }

    fn duration(
        &self,
        value: Option<&Spanned<String>>,
        key: &str,
        default: Duration,
        max: Duration,
    ) -> Result<Duration> {
        let Some(value) = value else {
            return Ok(default);
        };
        let d =
            duration::parse(value.get_ref()).map_err(|e| self.fail(Some(value.span()), key, e))?;
        if d.is_zero() || d > max {
            return Err(self.fail(
                Some(value.span()),
                key,
                format!(
                    "expected a duration above zero and at most {}s",
                    max.as_secs()
                ),
            ));
        }
        Ok(d)
    }

    fn size(
        &self,
        value: Option<&Spanned<i64>>,
        key: &str,
        default: usize,
        min: usize,
        max: usize,
    ) -> Result<usize> {
        let Some(value) = value else {
            return Ok(default);
        };
        usize::try_from(*value.get_ref())
            .ok()
            .filter(|v| (min..=max).contains(v))
            .ok_or_else(|| {
                self.fail(
                    Some(value.span()),
                    key,
                    format!("expected a whole number from {min} to {max}"),
                )
            })
    }

    fn socket(
        &self,
        value: Option<&Spanned<String>>,
        key: &str,
        default: &str,
    ) -> Result<SocketAddr> {
        let Some(value) = value else {
            return default
                .parse()
                .map_err(|_| self.fail(None, key, "bad built-in default"));
        };
        value.get_ref().parse().map_err(|_| {
            self.fail(
                Some(value.span()),
                key,
                format!(
                    "{:?} is not an address; expected IP:PORT such as \"127.0.0.1:8080\"",
                    value.get_ref()
                ),
            )
        })
    }

    fn sha256(&self, value: &Spanned<String>, key: &str) -> Result<[u8; 32]> {
        let text = self.expand(value, key)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut out).map_err(|_| {
            self.fail(
                Some(value.span()),
                key,
                "expected 64 hexadecimal characters (the SHA-256 printed by `portcullis hash-key`)",
            )
        })?;
        Ok(out)
    }
}

/// `unknown field `x`, expected one of `a`, `b`` → (`x`, [`a`, `b`]).
fn unknown_field(message: &str) -> Option<(&str, Vec<&str>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (field, rest) = rest.split_once('`')?;
    let expected: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    Some((field, expected))
}

/// Server and client names appear in URLs, logs and metrics labels.
fn check_name(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name; use 1 to 64 letters, digits, `-`, `_` or `.`"
        ))
    }
}

/// The merged `/mcp` view names tools `<server>__<tool>` and splits them at the
/// first `__`: a server name without `__` that does not end in `_` makes that
/// split unambiguous, so two servers' tools can never collide.
fn check_server_name(name: &str) -> std::result::Result<(), String> {
    if name.contains("__") || name.ends_with('_') {
        Err(format!(
            "{name:?} is not a valid server name: it may not contain `__` or end with `_`, \
             because the merged /mcp view names tools `<server>__<tool>`"
        ))
    } else {
        Ok(())
    }
}

/// `line` with the password of every URL in it (`scheme://user:PASSWORD@`)
/// written `***`: an error's excerpt reaches logs that readers of the
/// configuration's secrets may not see, and a URL written with its password
/// in the file would show it there.
fn without_passwords(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(['/', '?', '#', '"', '\'', ' ', '\t'])
            .unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..=colon]);
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;
