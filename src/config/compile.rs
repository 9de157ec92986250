//! Raw TOML → [`Config`]: every value checked, every reference resolved.
//!
//! Invariants: the first fault stops compilation and is reported with its place
//! in the file; nothing is half-applied; environment values are substituted into
//! the parsed strings (never into the TOML text, so they cannot inject syntax).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use toml::Spanned;

use super::model::{
    Config, ConfigError, GatewaySettings, Mode, ServerSettings, StdioCommand, Transport,
};
use super::raw::{RawConfig, RawGateway, RawRule, RawServer};
use crate::audit::{AuditArguments, AuditSettings};
use crate::auth::{ClientTable, hash_key};
use crate::mcp::methods::{ExtraError, Extras};
use crate::pins::{Pinning, PinsSettings};
use crate::policy::glob::Glob;
use crate::policy::{Action, Policy, Rate, RateKey, Rule};
use crate::ratelimit::{OnBackendError, RateBackend, RateLimitSettings};
use crate::sanitize::{ArgumentScan, Exemption, SanitizeSettings, SecretsAction};
use crate::telemetry::{LogFormat, TelemetrySettings};
use crate::util::duration;
use crate::validate::{CompiledSchema, SchemaLimits};

mod approval;
mod jwt;

type Result<T> = std::result::Result<T, ConfigError>;

/// What `[[sanitize.exemptions]]` may turn off.
/// `[gateway] max_connections` unless set: a sidecar serves a handful of
/// agents, each with a few connections; 1024 of them idle cost a few MiB.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 1024;

const SKIPPABLE: &[&str] = &[
    "ansi",
    "invisible_unicode",
    "secrets",
    "max_output_bytes",
    "arguments",
];

/// Headers the gateway owns on the upstream request; a server's `headers` may not set them.
const RESERVED_HEADERS: &[&str] = &[
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
    let servers = cx.servers(&raw)?;
    let (mut clients, client_names) = cx.clients(&raw)?;
    if let Some(jwt) = &raw.auth.jwt {
        clients.set_jwt(cx.jwt(jwt, &servers)?);
    }
    let policy = cx.policy(&raw.rules, &client_names, &servers)?;
    let sanitize = cx.sanitize(&raw, &servers)?;
    Ok(Config {
        source: file.to_owned(),
        gateway,
        servers,
        clients,
        policy,
        rate_limit: cx.rate_limit(&raw)?,
        sanitize,
        audit: cx.audit(&raw)?,
        pins: cx.pins(&raw)?,
        telemetry: cx.telemetry(&raw)?,
        methods: cx.methods(&raw)?,
        approvals: cx.approvals(&raw.approvals)?,
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
        let key = match e.span() {
            Some(span) => self.name_map_keys(key, span.start),
            None => key.to_owned(),
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
                let excerpt = self.text[line_start..]
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned();
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

    fn gateway(&self, raw: &RawGateway) -> Result<GatewaySettings> {
        let listen = self.socket(raw.listen.as_ref(), "gateway.listen", "127.0.0.1:8080")?;
        let admin_listen = self.socket(
            raw.admin_listen.as_ref(),
            "gateway.admin_listen",
            "127.0.0.1:9090",
        )?;
        let admin_token_sha256 = raw
            .admin_token_sha256
            .as_ref()
            .map(|v| self.sha256(v, "gateway.admin_token_sha256"))
            .transpose()?;
        if !admin_listen.ip().is_loopback() && admin_token_sha256.is_none() {
            let span = raw.admin_listen.as_ref().map(Spanned::span);
            return Err(self.fail(
                span,
                "gateway.admin_listen",
                "the admin listener is off loopback, so `admin_token_sha256` must be set to protect it",
            ));
        }
        let mut allowed_origins = Vec::new();
        for (i, origin) in raw.allowed_origins.iter().enumerate() {
            let o = origin.get_ref().trim_end_matches('/');
            let ok = reqwest::Url::parse(o)
                .map(|u| {
                    matches!(u.scheme(), "http" | "https")
                        && u.host_str().is_some()
                        && u.path() == "/"
                })
                .unwrap_or(false);
            if !ok {
                return Err(self.fail(
                    Some(origin.span()),
                    &format!("gateway.allowed_origins[{i}]"),
                    "expected an origin such as \"https://app.example.com\" (scheme, host and optional port; no path)",
                ));
            }
            allowed_origins.push(o.to_ascii_lowercase());
        }
        let mut allowed_hosts = Vec::new();
        for (i, host) in raw.allowed_hosts.iter().enumerate() {
            let h = host.get_ref();
            let has_port = !h.starts_with('[') && h.contains(':') || h.contains("]:");
            if h.is_empty() || h.contains(['/', ' ', '@']) || has_port {
                return Err(self.fail(
                    Some(host.span()),
                    &format!("gateway.allowed_hosts[{i}]"),
                    "expected a host name such as \"mcp.example.com\" (no scheme, no port, no path: any port is accepted)",
                ));
            }
            allowed_hosts.push(h.to_ascii_lowercase());
        }
        let mode = self.one_of(
            raw.mode.as_ref(),
            "gateway.mode",
            &[("enforce", Mode::Enforce), ("observe", Mode::Observe)],
            Mode::Enforce,
        )?;
        let client_timeout = self.duration(
            raw.client_timeout.as_ref(),
            "gateway.client_timeout",
            Duration::from_secs(30),
            Duration::from_secs(3600),
        )?;
        let header_timeout = self.duration(
            raw.header_timeout.as_ref(),
            "gateway.header_timeout",
            Duration::from_secs(10).min(client_timeout),
            Duration::from_secs(3600),
        )?;
        if header_timeout > client_timeout {
            return Err(self.fail(
                raw.header_timeout.as_ref().map(|v| v.span()),
                "gateway.header_timeout",
                format!(
                    "must be at most client_timeout ({} ms): the first request's headers may \
                     not take longer than any later request's",
                    client_timeout.as_millis()
                ),
            ));
        }
        Ok(GatewaySettings {
            listen,
            admin_listen,
            admin_token_sha256,
            allowed_origins,
            allowed_hosts,
            max_request_bytes: self.size(
                raw.max_request_bytes.as_ref(),
                "gateway.max_request_bytes",
                1 << 20,
                1024,
                256 << 20,
            )?,
            max_json_depth: self.size(
                raw.max_json_depth.as_ref(),
                "gateway.max_json_depth",
                64,
                4,
                1024,
            )?,
            max_response_bytes: self.size(
                raw.max_response_bytes.as_ref(),
                "gateway.max_response_bytes",
                16 << 20,
                4096,
                1 << 30,
            )?,
            max_sessions: self.size(
                raw.max_sessions.as_ref(),
                "gateway.max_sessions",
                10_000,
                1,
                10_000_000,
            )?,
            max_sessions_per_client: self.size(
                raw.max_sessions_per_client.as_ref(),
                "gateway.max_sessions_per_client",
                100,
                1,
                10_000_000,
            )?,
            max_tasks: self.size(
                raw.max_tasks.as_ref(),
                "gateway.max_tasks",
                10_000,
                1,
                10_000_000,
            )?,
            max_tasks_per_client: self.size(
                raw.max_tasks_per_client.as_ref(),
                "gateway.max_tasks_per_client",
                100,
                1,
                10_000_000,
            )?,
            max_task_ttl: self.duration(
                raw.max_task_ttl.as_ref(),
                "gateway.max_task_ttl",
                Duration::from_secs(24 * 3600),
                Duration::from_secs(30 * 24 * 3600),
            )?,
            mode,
            shutdown_grace: self.duration(
                raw.shutdown_grace.as_ref(),
                "gateway.shutdown_grace",
                Duration::from_secs(10),
                Duration::from_secs(3600),
            )?,
            client_timeout,
            header_timeout,
            max_connections: self.size(
                raw.max_connections.as_ref(),
                "gateway.max_connections",
                DEFAULT_MAX_CONNECTIONS,
                1,
                1_000_000,
            )?,
        })
    }

    fn servers(&self, raw: &RawConfig) -> Result<BTreeMap<String, Arc<ServerSettings>>> {
        if raw.servers.is_empty() {
            return Err(self.fail(
                None,
                "servers",
                "no server is configured; add a [servers.NAME] table with a `url` or a `command`",
            ));
        }
        let mut out = BTreeMap::new();
        for (name, server) in &raw.servers {
            let key = format!("servers.{}", name.get_ref());
            check_name(name.get_ref())
                .and_then(|()| check_server_name(name.get_ref()))
                .map_err(|r| self.fail(Some(name.span()), &key, r))?;
            let settings = self.server(name, server, &key)?;
            out.insert(name.get_ref().clone(), Arc::new(settings));
        }
        Ok(out)
    }

    fn server(&self, name: &Spanned<String>, raw: &RawServer, key: &str) -> Result<ServerSettings> {
        let transport = match (&raw.url, &raw.command) {
            (Some(_), Some(command)) => {
                return Err(self.fail(
                    Some(command.span()),
                    &format!("{key}.command"),
                    "give either `url` (a Streamable HTTP server) or `command` (a stdio server the gateway spawns), not both",
                ));
            }
            (None, None) => {
                return Err(self.fail(
                    Some(name.span()),
                    key,
                    "the server has neither `url` nor `command`; give its Streamable HTTP endpoint, \
                     e.g. url = \"http://127.0.0.1:3001/mcp\", or the stdio server to spawn, e.g. command = [\"python3\", \"server.py\"]",
                ));
            }
            (Some(url), None) => Transport::Http(self.server_url(url, key, raw)?),
            (None, Some(command)) => Transport::Stdio(self.stdio_command(command, key, raw)?),
        };
        let mut headers = Vec::new();
        for (hname, hvalue) in &raw.headers {
            let hkey = format!("{key}.headers.{}", hname.get_ref());
            let header = HeaderName::from_bytes(hname.get_ref().as_bytes()).map_err(|_| {
                self.fail(Some(hname.span()), &hkey, "not a valid HTTP header name")
            })?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(self.fail(
                    Some(hname.span()),
                    &hkey,
                    "this header is managed by the gateway and cannot be configured",
                ));
            }
            let text = self.expand(hvalue, &hkey)?;
            let mut value = HeaderValue::from_str(&text).map_err(|_| {
                self.fail(
                    Some(hvalue.span()),
                    &hkey,
                    "the value has characters an HTTP header cannot carry",
                )
            })?;
            value.set_sensitive(true);
            headers.push((header, value));
        }
        Ok(ServerSettings {
            name: name.get_ref().clone(),
            transport,
            headers,
            timeout: self.duration(
                raw.timeout.as_ref(),
                &format!("{key}.timeout"),
                Duration::from_secs(30),
                Duration::from_secs(3600),
            )?,
            connect_timeout: self.duration(
                raw.connect_timeout.as_ref(),
                &format!("{key}.connect_timeout"),
                Duration::from_secs(5),
                Duration::from_secs(300),
            )?,
            pinning: self.one_of(
                raw.pinning.as_ref(),
                &format!("{key}.pinning"),
                &[
                    ("off", Pinning::Off),
                    ("warn", Pinning::Warn),
                    ("block", Pinning::Block),
                ],
                Pinning::Block,
            )?,
            mode: raw
                .mode
                .as_ref()
                .map(|m| {
                    self.one_of(
                        Some(m),
                        &format!("{key}.mode"),
                        &[("enforce", Mode::Enforce), ("observe", Mode::Observe)],
                        Mode::Enforce,
                    )
                })
                .transpose()?,
        })
    }

    /// `url` of an HTTP server; `env` and `cwd` belong to stdio servers only.
    fn server_url(
        &self,
        value: &Spanned<String>,
        key: &str,
        raw: &RawServer,
    ) -> Result<reqwest::Url> {
        if let Some((k, v)) = raw.env.iter().next() {
            return Err(self.fail(
                Some(v.span()),
                &format!("{key}.env.{k}"),
                "`env` applies to stdio servers (`command`); an HTTP server gets the gateway's credentials through `headers`",
            ));
        }
        if let Some(cwd) = &raw.cwd {
            return Err(self.fail(
                Some(cwd.span()),
                &format!("{key}.cwd"),
                "`cwd` applies to stdio servers (`command`), not to a server reached by `url`",
            ));
        }
        let url_key = format!("{key}.url");
        let url_text = self.expand(value, &url_key)?;
        let url = reqwest::Url::parse(&url_text)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or_else(|| {
                self.fail(
                    Some(value.span()),
                    &url_key,
                    "expected an http:// or https:// URL such as \"http://127.0.0.1:3001/mcp\"",
                )
            })?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(self.fail(
                Some(value.span()),
                &url_key,
                "credentials in the URL would be logged; put them in `headers` instead",
            ));
        }
        Ok(url)
    }

    /// `command`, `env` and `cwd` of a stdio server; `headers` and
    /// `connect_timeout` belong to HTTP servers only.
    fn stdio_command(
        &self,
        command: &Spanned<Vec<Spanned<String>>>,
        key: &str,
        raw: &RawServer,
    ) -> Result<StdioCommand> {
        if let Some((k, _)) = raw.headers.iter().next() {
            return Err(self.fail(
                Some(k.span()),
                &format!("{key}.headers.{}", k.get_ref()),
                "`headers` apply to HTTP servers (`url`); give a stdio server its credentials through `env`",
            ));
        }
        if let Some(t) = &raw.connect_timeout {
            return Err(self.fail(
                Some(t.span()),
                &format!("{key}.connect_timeout"),
                "`connect_timeout` applies to HTTP servers (`url`); a stdio server's start and handshake are bounded by `timeout`",
            ));
        }
        let command_key = format!("{key}.command");
        let mut words = Vec::new();
        for word in command.get_ref() {
            words.push(self.expand(word, &command_key)?);
        }
        let Some((program, args)) = words.split_first() else {
            return Err(self.fail(
                Some(command.span()),
                &command_key,
                "the command is empty; give the program and its arguments, e.g. [\"npx\", \"-y\", \"@modelcontextprotocol/server-everything\"]",
            ));
        };
        if program.is_empty() || program.contains('\0') || args.iter().any(|a| a.contains('\0')) {
            return Err(self.fail(
                Some(command.span()),
                &command_key,
                "the program name is empty or a word has a NUL character",
            ));
        }
        let mut env = Vec::new();
        for (name, value) in &raw.env {
            let env_key = format!("{key}.env.{name}");
            let valid = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                return Err(self.fail(
                    Some(value.span()),
                    &env_key,
                    "not an environment variable name; use letters, digits and `_`",
                ));
            }
            let text = self.expand(value, &env_key)?;
            if text.contains('\0') {
                return Err(self.fail(
                    Some(value.span()),
                    &env_key,
                    "the value has a NUL character",
                ));
            }
            env.push((name.clone(), text));
        }
        let cwd = match &raw.cwd {
            None => None,
            Some(value) => {
                let cwd_key = format!("{key}.cwd");
                let path = std::path::PathBuf::from(self.expand(value, &cwd_key)?);
                if !path.is_dir() {
                    return Err(self.fail(
                        Some(value.span()),
                        &cwd_key,
                        format!("{} is not a directory", path.display()),
                    ));
                }
                Some(path)
            }
        };
        let display = command
            .get_ref()
            .iter()
            .map(|w| w.get_ref().as_str())
            .collect::<Vec<_>>()
            .join(" ");
        Ok(StdioCommand {
            program: program.clone(),
            args: args.to_vec(),
            env,
            cwd,
            display,
        })
    }

    fn clients(&self, raw: &RawConfig) -> Result<(ClientTable, BTreeSet<String>)> {
        let mut table = ClientTable::default();
        let mut names = BTreeSet::new();
        let mut seen: BTreeMap<[u8; 32], String> = BTreeMap::new();
        for (name, client) in &raw.clients {
            let key = format!("clients.{}", name.get_ref());
            check_name(name.get_ref()).map_err(|r| self.fail(Some(name.span()), &key, r))?;
            let digest = match (&client.api_key_sha256, &client.api_key_env) {
                (Some(_), Some(env)) => {
                    return Err(self.fail(
                        Some(env.span()),
                        &key,
                        "give either `api_key_sha256` or `api_key_env`, not both",
                    ));
                }
                (Some(sha), None) => Some(self.sha256(sha, &format!("{key}.api_key_sha256"))?),
                (None, Some(var)) => {
                    let k = format!("{key}.api_key_env");
                    let value = (self.env)(var.get_ref()).filter(|v| !v.is_empty()).ok_or_else(|| {
                        self.fail(Some(var.span()), &k, format!("the environment variable {} is not set or empty; it must hold the client's API key", var.get_ref()))
                    })?;
                    Some(hash_key(&value))
                }
                (None, None) if name.get_ref() == "anonymous" => None,
                // With [auth.jwt], a keyless client is one that tokens name.
                (None, None) if raw.auth.jwt.is_some() => {
                    table.add_token_named(name.get_ref());
                    names.insert(name.get_ref().clone());
                    continue;
                }
                (None, None) => {
                    return Err(self.fail(
                        Some(name.span()),
                        &key,
                        "the client has no key; give `api_key_sha256` or `api_key_env` (only [clients.anonymous] may have neither)",
                    ));
                }
            };
            match digest {
                Some(d) => {
                    if let Some(other) = seen.insert(d, name.get_ref().clone()) {
                        return Err(self.fail(Some(name.span()), &key, format!("this client has the same key as [clients.{other}]; each client needs its own key")));
                    }
                    if name.get_ref() == "anonymous" {
                        return Err(self.fail(Some(name.span()), &key, "[clients.anonymous] names requests without credentials and cannot have a key"));
                    }
                    table.add_keyed(name.get_ref(), d);
                }
                None => table.allow_anonymous(),
            }
            names.insert(name.get_ref().clone());
        }
        Ok((table, names))
    }

    fn policy(
        &self,
        rules: &[RawRule],
        clients: &BTreeSet<String>,
        servers: &BTreeMap<String, Arc<ServerSettings>>,
    ) -> Result<Policy> {
        let server_names: BTreeSet<String> = servers.keys().cloned().collect();
        let mut compiled = Vec::new();
        for (i, raw) in rules.iter().enumerate() {
            let key = format!("rules[{i}]");
            let action = self.one_of(
                Some(&raw.action),
                &format!("{key}.action"),
                &[("allow", Action::Allow), ("deny", Action::Deny)],
                Action::Allow,
            )?;
            let clients =
                self.references(&raw.clients, &format!("{key}.clients"), clients, "clients")?;
            let servers = self.references(
                &raw.servers,
                &format!("{key}.servers"),
                &server_names,
                "servers",
            )?;
            let tools = self.globs(raw.tools.as_deref(), &format!("{key}.tools"))?;
            let resources =
                self.resource_globs(raw.resources.as_deref(), &format!("{key}.resources"))?;
            let prompts = self.globs(raw.prompts.as_deref(), &format!("{key}.prompts"))?;
            if tools.is_empty() && resources.is_empty() && prompts.is_empty() {
                return Err(self.fail(
                    Some(raw.action.span()),
                    &key,
                    "the rule names nothing to allow or deny; give at least one of `tools`, `resources` or `prompts` (use [\"*\"] for all)",
                ));
            }
            let rate = match &raw.rate {
                None => None,
                Some(_) if action == Action::Deny => {
                    return Err(self.fail(raw.rate.as_ref().map(Spanned::span), &format!("{key}.rate"), "a deny rule refuses every call it matches, so a `rate` on it would never apply"));
                }
                Some(rate) => Some(self.rate(rate, &format!("{key}.rate"))?),
            };
            let arguments = match &raw.arguments {
                None => None,
                Some(a) if action == Action::Deny || tools.is_empty() => {
                    return Err(self.fail(Some(a.span()), &format!("{key}.arguments"), "`arguments` constrains the tools an allow rule lets through; it needs `action = \"allow\"` and `tools`"));
                }
                Some(a) => Some(self.arguments(a, &format!("{key}.arguments"))?),
            };
            let approval = match &raw.approval {
                None => None,
                Some(a) if action == Action::Deny || tools.is_empty() => {
                    return Err(self.fail(Some(a.span()), &format!("{key}.approval"), "`approval` makes a person approve the tool calls an allow rule lets through; it needs `action = \"allow\"` and `tools`"));
                }
                Some(a) => Some(self.approval(a, &format!("{key}.approval"), i)?),
            };
            compiled.push(Rule {
                index: i,
                approval,
                clients,
                servers,
                tools,
                resources,
                prompts,
                action,
                rate,
                arguments,
            });
        }
        Ok(Policy::new(compiled))
    }

    fn references(
        &self,
        list: &Spanned<Vec<Spanned<String>>>,
        key: &str,
        defined: &BTreeSet<String>,
        table: &str,
    ) -> Result<Vec<Glob>> {
        if list.get_ref().is_empty() {
            return Err(self.fail(
                Some(list.span()),
                key,
                format!(
                    "the list is empty, so the rule can never match; name {table} or use [\"*\"]"
                ),
            ));
        }
        let mut out = Vec::new();
        for (j, item) in list.get_ref().iter().enumerate() {
            let k = format!("{key}[{j}]");
            let glob = Glob::new(item.get_ref()).map_err(|e| {
                self.fail(Some(item.span()), &k, format!("not a valid pattern: {e}"))
            })?;
            if glob.is_literal() && !defined.contains(item.get_ref()) {
                let known: Vec<&str> = defined.iter().map(String::as_str).collect();
                let singular = table.trim_end_matches('s');
                return Err(self.fail(
                    Some(item.span()),
                    &k,
                    format!(
                        "no {singular} named {:?} is defined; defined {table}: {} (or use a pattern such as \"*\")",
                        item.get_ref(),
                        if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                    ),
                ));
            }
            out.push(glob);
        }
        Ok(out)
    }

    fn globs(&self, list: Option<&[Spanned<String>]>, key: &str) -> Result<Vec<Glob>> {
        let mut out = Vec::new();
        for (j, item) in list.unwrap_or_default().iter().enumerate() {
            let glob = Glob::new(item.get_ref()).map_err(|e| {
                self.fail(
                    Some(item.span()),
                    &format!("{key}[{j}]"),
                    format!("not a valid pattern: {e}"),
                )
            })?;
            out.push(glob);
        }
        Ok(out)
    }

    /// Resource patterns are matched against canonical URIs only
    /// ([`crate::policy::uri`]): a pattern spelled otherwise could never match
    /// what it seems to name, so it is refused with the spelling to write.
    fn resource_globs(&self, list: Option<&[Spanned<String>]>, key: &str) -> Result<Vec<Glob>> {
        for (j, item) in list.unwrap_or_default().iter().enumerate() {
            let written = item.get_ref();
            let reason = match crate::policy::uri::pattern(written) {
                Ok(canonical) if canonical == *written => continue,
                Ok(canonical) => format!(
                    "resource URIs are matched in their canonical form (lowercase scheme and host, \
                     unreserved characters unencoded, other escapes in uppercase hex, no empty segments); \
                     write {canonical:?}"
                ),
                Err(why) => format!("this resource pattern can never match a canonical URI: {why}"),
            };
            return Err(self.fail(Some(item.span()), &format!("{key}[{j}]"), reason));
        }
        self.globs(list, key)
    }

    fn rate(&self, rate: &Spanned<super::raw::RawRate>, key: &str) -> Result<Rate> {
        let raw = rate.get_ref();
        let burst = u32::try_from(*raw.burst.get_ref())
            .ok()
            .and_then(NonZeroU32::new)
            .filter(|b| b.get() <= 1_000_000_000)
            .ok_or_else(|| {
                self.fail(
                    Some(raw.burst.span()),
                    &format!("{key}.burst"),
                    "expected a whole number of calls from 1 to 1000000000",
                )
            })?;
        let per_second = *raw.per_second.get_ref();
        if !(per_second.is_finite() && per_second > 0.0 && per_second <= 1e9) {
            return Err(self.fail(
                Some(raw.per_second.span()),
                &format!("{key}.per_second"),
                "expected a number of calls per second above 0 (e.g. 0.5 for one call every 2 s)",
            ));
        }
        let key_kind = self.one_of(
            raw.key.as_ref(),
            &format!("{key}.key"),
            &[
                ("client", RateKey::Client),
                ("client+tool", RateKey::ClientTool),
                ("all", RateKey::All),
            ],
            RateKey::Client,
        )?;
        // The buckets' arithmetic is exact up to a refill time of 100 years.
        let refill_secs = f64::from(burst.get()) / per_second;
        if refill_secs > crate::ratelimit::gcra::MAX_REFILL as f64 / 1e9 {
            return Err(self.fail(
                Some(rate.span()),
                key,
                format!(
                    "an empty bucket would take {:.0} years to fill (burst / per_second); at most 100 years is supported",
                    refill_secs / (365.0 * 86_400.0)
                ),
            ));
        }
        Ok(Rate {
            burst,
            per_second,
            key: key_kind,
        })
    }

    fn arguments(&self, value: &Spanned<toml::Value>, key: &str) -> Result<CompiledSchema> {
        let json = serde_json::to_value(value.get_ref()).map_err(|e| {
            self.fail(
                Some(value.span()),
                key,
                format!("cannot be read as JSON Schema: {e}"),
            )
        })?;
        let json = if json.get("type").is_none() {
            let mut j = json;
            if let Some(map) = j.as_object_mut() {
                map.insert("type".into(), "object".into());
            }
            j
        } else {
            json
        };
        CompiledSchema::compile(&json, SchemaLimits::default()).map_err(|e| {
            self.fail(
                Some(value.span()),
                key,
                format!("expected a JSON Schema for the call's arguments: {e}"),
            )
        })
    }

    fn rate_limit(&self, raw: &RawConfig) -> Result<RateLimitSettings> {
        let r = &raw.rate_limit;
        let redis = self.one_of(
            r.backend.as_ref(),
            "rate_limit.backend",
            &[("memory", false), ("redis", true)],
            false,
        )?;
        // A redis_url is checked even when unused, so a later switch of backend cannot surprise.
        let url = match &r.redis_url {
            Some(url) => {
                let text = self.expand(url, "rate_limit.redis_url")?;
                if !(text.starts_with("redis://") || text.starts_with("rediss://")) {
                    return Err(self.fail(
                        Some(url.span()),
                        "rate_limit.redis_url",
                        "expected a redis:// or rediss:// URL",
                    ));
                }
                Some(text)
            }
            None => None,
        };
        let backend = match (redis, url) {
            (true, Some(url)) => RateBackend::Redis(url),
            (true, None) => {
                return Err(self.fail(
                    r.backend.as_ref().map(Spanned::span),
                    "rate_limit.redis_url",
                    "the redis backend needs `redis_url`, e.g. \"redis://127.0.0.1:6379\"",
                ));
            }
            (false, _) => RateBackend::Memory,
        };
        Ok(RateLimitSettings {
            backend,
            on_backend_error: self.one_of(
                r.on_backend_error.as_ref(),
                "rate_limit.on_backend_error",
                &[
                    ("deny", OnBackendError::Deny),
                    ("allow", OnBackendError::Allow),
                ],
                OnBackendError::Deny,
            )?,
        })
    }

    fn sanitize(
        &self,
        raw: &RawConfig,
        servers: &BTreeMap<String, Arc<ServerSettings>>,
    ) -> Result<SanitizeSettings> {
        let s = &raw.sanitize;
        let server_names: BTreeSet<String> = servers.keys().cloned().collect();
        let mut exemptions = Vec::new();
        for (i, e) in s.exemptions.iter().enumerate() {
            exemptions.push(self.exemption(
                e,
                &format!("sanitize.exemptions[{i}]"),
                &server_names,
            )?);
        }
        let mut patterns = Vec::new();
        let mut names = BTreeSet::new();
        for (i, p) in s.patterns.iter().enumerate() {
            let key = format!("sanitize.patterns[{i}]");
            if p.name.get_ref().is_empty() || !names.insert(p.name.get_ref().clone()) {
                return Err(self.fail(
                    Some(p.name.span()),
                    &format!("{key}.name"),
                    "expected a unique, non-empty name (it appears in `[REDACTED:<name>]`)",
                ));
            }
            let re = regex::RegexBuilder::new(p.regex.get_ref())
                .size_limit(1 << 20)
                .build()
                .map_err(|e| {
                    self.fail(
                        Some(p.regex.span()),
                        &format!("{key}.regex"),
                        format!("not a valid regular expression: {e}"),
                    )
                })?;
            patterns.push((p.name.get_ref().clone(), re));
        }
        Ok(SanitizeSettings {
            ansi: s.ansi.unwrap_or(true),
            invisible_unicode: s.invisible_unicode.unwrap_or(true),
            secrets: self.one_of(
                s.secrets.as_ref(),
                "sanitize.secrets",
                &[
                    ("off", SecretsAction::Off),
                    ("redact", SecretsAction::Redact),
                    ("block", SecretsAction::Block),
                ],
                SecretsAction::Redact,
            )?,
            max_output_bytes: self.size(
                s.max_output_bytes.as_ref(),
                "sanitize.max_output_bytes",
                256 * 1024,
                1024,
                64 << 20,
            )?,
            patterns,
            arguments: self.one_of(
                s.arguments.as_ref(),
                "sanitize.arguments",
                &[("off", ArgumentScan::Off), ("block", ArgumentScan::Block)],
                ArgumentScan::Block,
            )?,
            exemptions,
        })
    }

    fn exemption(
        &self,
        raw: &super::raw::RawExemption,
        key: &str,
        servers: &BTreeSet<String>,
    ) -> Result<Exemption> {
        let servers = match &raw.servers {
            Some(list) => self.references(list, &format!("{key}.servers"), servers, "servers")?,
            None => vec![Glob::new("*").map_err(|e| self.fail(None, key, e.to_string()))?],
        };
        if raw.tools.get_ref().is_empty() {
            return Err(self.fail(
                Some(raw.tools.span()),
                &format!("{key}.tools"),
                "the list is empty, so the exemption can never apply; name the tools (globs such as \"read_*\")",
            ));
        }
        let tools = self.globs(Some(raw.tools.get_ref()), &format!("{key}.tools"))?;
        if raw.skip.get_ref().is_empty() {
            return Err(self.fail(
                Some(raw.skip.span()),
                &format!("{key}.skip"),
                format!(
                    "the list is empty; name what to turn off: {}",
                    SKIPPABLE.join(", ")
                ),
            ));
        }
        let mut skip = crate::sanitize::Skip::default();
        for (j, item) in raw.skip.get_ref().iter().enumerate() {
            let flag = match item.get_ref().as_str() {
                "ansi" => &mut skip.ansi,
                "invisible_unicode" => &mut skip.invisible_unicode,
                "secrets" => &mut skip.secrets,
                "max_output_bytes" => &mut skip.max_output_bytes,
                "arguments" => &mut skip.arguments,
                other => {
                    let hint = match crate::policy::closest(other, SKIPPABLE, 1).first() {
                        Some(best) => format!("did you mean {best:?}? "),
                        None => String::new(),
                    };
                    return Err(self.fail(
                        Some(item.span()),
                        &format!("{key}.skip[{j}]"),
                        format!(
                            "{other:?} is not a sanitizer action; {hint}expected one of {}",
                            SKIPPABLE
                                .iter()
                                .map(|s| format!("{s:?}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            };
            *flag = true;
        }
        Ok(Exemption {
            servers,
            tools,
            skip,
        })
    }

    fn audit(&self, raw: &RawConfig) -> Result<AuditSettings> {
        let a = &raw.audit;
        let database = match &a.database {
            Some(d) => self.expand(d, "audit.database")?,
            None => "portcullis-audit.db".to_owned(),
        };
        Ok(AuditSettings {
            enabled: a.enabled.unwrap_or(true),
            database,
            retention: self.duration(
                a.retention.as_ref(),
                "audit.retention",
                Duration::from_secs(7 * 86_400),
                Duration::from_secs(3650 * 86_400),
            )?,
            arguments: self.one_of(
                a.arguments.as_ref(),
                "audit.arguments",
                &[
                    ("none", AuditArguments::None),
                    ("shape", AuditArguments::Shape),
                    ("redacted", AuditArguments::Redacted),
                    ("full", AuditArguments::Full),
                ],
                AuditArguments::Shape,
            )?,
        })
    }

    /// `[methods]`: each name outside the specification, with a class it may have.
    fn methods(&self, raw: &RawConfig) -> Result<Extras> {
        let mut extras = Extras::default();
        for (name, class) in &raw.methods {
            let key = format!("methods.{:?}", name.get_ref());
            extras.add(name.get_ref(), class.get_ref()).map_err(|e| {
                let span = match e {
                    ExtraError::Class(..) => class.span(),
                    _ => name.span(),
                };
                self.fail(Some(span), &key, e.to_string())
            })?;
        }
        Ok(extras)
    }

    fn pins(&self, raw: &RawConfig) -> Result<PinsSettings> {
        let Some(value) = &raw.pins.database else {
            // Beside the audit store, as the product promises.
            let audit = match &raw.audit.database {
                Some(d) => self.expand(d, "audit.database")?,
                None => "portcullis-audit.db".to_owned(),
            };
            let database = std::path::Path::new(&audit).with_file_name("portcullis-pins.db");
            return Ok(PinsSettings {
                database: Some(database),
            });
        };
        let text = self.expand(value, "pins.database")?;
        if text == ":memory:" {
            return Ok(PinsSettings { database: None });
        }
        if text.trim().is_empty() || text.ends_with(['/', '\\']) {
            return Err(self.fail(
                Some(value.span()),
                "pins.database",
                "expected the path of a SQLite file such as \"/var/lib/portcullis/pins.db\" \
                 (or \":memory:\" to keep pins in memory only, which trusts every definition anew at each start)",
            ));
        }
        Ok(PinsSettings {
            database: Some(std::path::PathBuf::from(text)),
        })
    }

    fn telemetry(&self, raw: &RawConfig) -> Result<TelemetrySettings> {
        let t = &raw.telemetry;
        let otlp_endpoint = match &t.otlp_endpoint {
            None => None,
            Some(v) => {
                let text = self.expand(v, "telemetry.otlp_endpoint")?;
                let url = reqwest::Url::parse(&text)
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https"))
                    .ok_or_else(|| {
                        self.fail(
                            Some(v.span()),
                            "telemetry.otlp_endpoint",
                            "expected an http(s) URL such as \"http://127.0.0.1:4318\"",
                        )
                    })?;
                Some(url)
            }
        };
        Ok(TelemetrySettings {
            otlp_endpoint,
            log_format: self.one_of(
                t.log_format.as_ref(),
                "telemetry.log_format",
                &[("json", LogFormat::Json), ("pretty", LogFormat::Pretty)],
                LogFormat::Json,
            )?,
        })
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

#[cfg(test)]
mod tests;
