//! `[gateway]` → [`GatewaySettings`]: listeners, origins and hosts, body and
//! connection limits, timeouts, the admin listener.
//!
//! Invariants: every value is checked here, with its place in the file; a
//! limit left out takes its stated default.

use std::time::Duration;

use toml::Spanned;

use super::super::model::{GatewaySettings, Mode};
use super::super::raw::RawGateway;

use super::{Ctx, DEFAULT_MAX_CONNECTIONS, Result};

impl Ctx<'_> {
    pub(super) fn gateway(&self, raw: &RawGateway) -> Result<GatewaySettings> {
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
}
