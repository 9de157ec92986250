//! `[servers.<name>]` → one [`ServerSettings`] each: the transport (an HTTP
//! URL or a stdio command), headers, timeouts and mode.
//!
//! Invariants: a server name is one the gateway can route and name in a
//! tool; a server may not set the headers the gateway owns on the upstream
//! request; `${NAME}` values are read from the environment, never from the
//! TOML text.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use toml::Spanned;

use super::super::model::{
    BreakerSettings, Mode, RestartSettings, RetrySettings, ServerSettings, StdioCommand, Transport,
};
use super::super::raw::{RawBreaker, RawConfig, RawRestart, RawRetry, RawServer};
use crate::pins::Pinning;
use crate::policy::glob::Glob;

use super::{Ctx, RESERVED_HEADERS, Result, check_name, check_server_name};

/// Most tries of one request `retry.attempts` may ask for.
const MAX_ATTEMPTS: usize = 20;
/// The longest deadline of one tool call.
const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The longest breaker window, in requests.
const MAX_WINDOW: usize = 1000;

impl Ctx<'_> {
    pub(super) fn servers(&self, raw: &RawConfig) -> Result<BTreeMap<String, Arc<ServerSettings>>> {
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

    pub(super) fn server(
        &self,
        name: &Spanned<String>,
        raw: &RawServer,
        key: &str,
    ) -> Result<ServerSettings> {
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
            // Compiled once the clients are known (`identity.rs`).
            identity: None,
            retry: self.retry(&raw.retry, &format!("{key}.retry"))?,
            breaker: self.breaker(&raw.breaker, &format!("{key}.breaker"))?,
            tool_timeouts: self.tool_timeouts(&raw.timeouts, &format!("{key}.timeouts"))?,
        })
    }

    /// `[servers.NAME.timeouts]`: each pattern with its deadline, the most
    /// specific first (literal names, then the longer patterns), so a tool
    /// named on its own beats a pattern that also matches it.
    fn tool_timeouts(
        &self,
        raw: &BTreeMap<Spanned<String>, Spanned<String>>,
        key: &str,
    ) -> Result<Vec<(Glob, Duration)>> {
        let mut out = Vec::new();
        for (pattern, limit) in raw {
            let at = format!("{key}.{:?}", pattern.get_ref());
            let glob = Glob::new(pattern.get_ref()).map_err(|e| {
                self.fail(
                    Some(pattern.span()),
                    &at,
                    format!("not a valid tool pattern: {e}"),
                )
            })?;
            let limit = self.duration(Some(limit), &at, Duration::ZERO, MAX_CALL_TIMEOUT)?;
            out.push((glob, limit));
        }
        out.sort_by_key(|(glob, _)| (!glob.is_literal(), std::cmp::Reverse(glob.as_str().len())));
        Ok(out)
    }

    /// `[servers.NAME.breaker]`, with the defaults of [`BreakerSettings`].
    fn breaker(&self, raw: &RawBreaker, key: &str) -> Result<BreakerSettings> {
        let defaults = BreakerSettings::default();
        let failures = self.size(
            raw.failures.as_ref(),
            &format!("{key}.failures"),
            defaults.failures as usize,
            0,
            1000,
        )?;
        let ratio = match &raw.ratio {
            None => defaults.ratio,
            Some(r) if (0.0..=1.0).contains(r.get_ref()) => *r.get_ref(),
            Some(r) => {
                return Err(self.fail(
                    Some(r.span()),
                    &format!("{key}.ratio"),
                    "expected a fraction from 0.0 to 1.0: the share of failed requests that opens the breaker (0 = never by ratio)",
                ));
            }
        };
        let window = self.size(
            raw.window.as_ref(),
            &format!("{key}.window"),
            defaults.window as usize,
            1,
            MAX_WINDOW,
        )?;
        let min_calls = self.size(
            raw.min_calls.as_ref(),
            &format!("{key}.min_calls"),
            (defaults.min_calls as usize).min(window),
            1,
            MAX_WINDOW,
        )?;
        if min_calls > window {
            return Err(self.fail(
                raw.min_calls.as_ref().map(|m| m.span()),
                &format!("{key}.min_calls"),
                format!(
                    "expected at most `window` ({window}): the ratio is taken over the last `window` requests"
                ),
            ));
        }
        Ok(BreakerSettings {
            failures: u32::try_from(failures).unwrap_or(defaults.failures),
            cool_down: self.duration(
                raw.cool_down.as_ref(),
                &format!("{key}.cool_down"),
                defaults.cool_down,
                Duration::from_secs(3600),
            )?,
            ratio,
            window: u32::try_from(window).unwrap_or(defaults.window),
            min_calls: u32::try_from(min_calls).unwrap_or(defaults.min_calls),
        })
    }

    /// `[servers.NAME.retry]`, with the defaults of [`RetrySettings`].
    fn retry(&self, raw: &RawRetry, key: &str) -> Result<RetrySettings> {
        let defaults = RetrySettings::default();
        let attempts = self.size(
            raw.attempts.as_ref(),
            &format!("{key}.attempts"),
            defaults.attempts as usize,
            1,
            MAX_ATTEMPTS,
        )?;
        let budget = match &raw.budget {
            None => defaults.budget,
            Some(b) if (0.0..=1.0).contains(b.get_ref()) => *b.get_ref(),
            Some(b) => {
                return Err(self.fail(
                    Some(b.span()),
                    &format!("{key}.budget"),
                    "expected a fraction from 0.0 to 1.0: the share of requests that may be retried",
                ));
            }
        };
        Ok(RetrySettings {
            attempts: u32::try_from(attempts).unwrap_or(defaults.attempts),
            budget,
            idempotent_tools: self.globs(
                raw.idempotent_tools.as_deref(),
                &format!("{key}.idempotent_tools"),
            )?,
            trust_annotations: raw.trust_annotations.unwrap_or(defaults.trust_annotations),
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
        if let Some(r) = &raw.restart {
            return Err(self.fail(
                Some(r.span()),
                &format!("{key}.restart"),
                "`restart` applies to stdio servers (`command`): the gateway runs their process; an HTTP server's failures meet `retry` and `breaker`",
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
        let restart = match &raw.restart {
            Some(r) => self.restart(r.get_ref(), &format!("{key}.restart"))?,
            None => RestartSettings::default(),
        };
        Ok(StdioCommand {
            program: program.clone(),
            args: args.to_vec(),
            env,
            cwd,
            display,
            restart,
        })
    }

    /// `[servers.NAME.restart]`, with the defaults of [`RestartSettings`].
    fn restart(&self, raw: &RawRestart, key: &str) -> Result<RestartSettings> {
        let defaults = RestartSettings::default();
        let hour = Duration::from_secs(3600);
        let min_backoff = self.duration(
            raw.min_backoff.as_ref(),
            &format!("{key}.min_backoff"),
            defaults.min_backoff,
            hour,
        )?;
        let max_key = format!("{key}.max_backoff");
        let max_backoff = self.duration(
            raw.max_backoff.as_ref(),
            &max_key,
            defaults.max_backoff,
            hour,
        )?;
        if max_backoff < min_backoff {
            return Err(self.fail(
                raw.max_backoff.as_ref().map(|m| m.span()),
                &max_key,
                "expected at least `min_backoff`: the delay doubles from `min_backoff` up to it",
            ));
        }
        let max_restarts = self.size(
            raw.max_restarts.as_ref(),
            &format!("{key}.max_restarts"),
            defaults.max_restarts as usize,
            0,
            10_000,
        )?;
        Ok(RestartSettings {
            min_backoff,
            max_backoff,
            max_restarts: u32::try_from(max_restarts).unwrap_or(defaults.max_restarts),
        })
    }
}
