//! The smaller tables: `[audit]`, `[methods]`, `[pins]` and `[telemetry]`,
//! each into the settings type of the module that owns it.
//!
//! Invariants: every value is checked here, with its place in the file.

use std::time::Duration;

use super::super::raw::RawConfig;
use crate::audit::{AuditArguments, AuditBackend, AuditSettings};
use crate::mcp::methods::{ExtraError, Extras};
use crate::pins::PinsSettings;
use crate::telemetry::{LogFormat, TelemetrySettings};

use super::{Ctx, Result};

impl Ctx<'_> {
    pub(super) fn audit(&self, raw: &RawConfig) -> Result<AuditSettings> {
        let a = &raw.audit;
        let database = match &a.database {
            Some(d) => self.expand(d, "audit.database")?,
            None => "portcullis-audit.db".to_owned(),
        };
        #[derive(Clone, Copy)]
        enum Kind {
            Sqlite,
            Postgres,
        }
        let kind = self.one_of(
            a.backend.as_ref(),
            "audit.backend",
            &[("sqlite", Kind::Sqlite), ("postgres", Kind::Postgres)],
            Kind::Sqlite,
        )?;
        let replica = self.replica(raw)?;
        let backend = match kind {
            Kind::Sqlite => {
                for (value, key) in [(&a.url, "audit.url"), (&a.spool, "audit.spool")] {
                    if let Some(v) = value {
                        return Err(self.fail(
                            Some(v.span()),
                            key,
                            "this key belongs to backend = \"postgres\"; the SQLite store is `database`",
                        ));
                    }
                }
                AuditBackend::Sqlite
            }
            Kind::Postgres => {
                let Some(url) = &a.url else {
                    return Err(self.fail(
                        a.backend.as_ref().map(toml::Spanned::span),
                        "audit.url",
                        "backend = \"postgres\" needs `url`, such as \"postgres://portcullis@db:5432/audit?sslmode=require\"",
                    ));
                };
                let url_text = self.expand(url, "audit.url")?;
                if let Err(e) = url_text.parse::<tokio_postgres::Config>() {
                    return Err(self.fail(
                        Some(url.span()),
                        "audit.url",
                        format!("not a PostgreSQL connection URL: {e}"),
                    ));
                }
                let spool = match &a.spool {
                    Some(s) => self.expand(s, "audit.spool")?,
                    None => format!("portcullis-audit-spool-{replica}.jsonl"),
                };
                let buffer =
                    self.size(a.buffer.as_ref(), "audit.buffer", 100_000, 1, 100_000_000)? as u64;
                AuditBackend::Postgres {
                    url: url_text,
                    spool,
                    buffer,
                }
            }
        };
        Ok(AuditSettings {
            enabled: a.enabled.unwrap_or(true),
            backend,
            replica,
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

    /// `[gateway] replica`: who this gateway is in a fleet (logs, spans,
    /// metrics, audit rows); the host name by default (a pod's name).
    pub(super) fn replica(&self, raw: &RawConfig) -> Result<String> {
        let Some(value) = &raw.gateway.replica else {
            return Ok(host_name());
        };
        let name = self.expand(value, "gateway.replica")?;
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !ok {
            return Err(self.fail(
                Some(value.span()),
                "gateway.replica",
                "expected 1 to 64 letters, digits, `-`, `_` or `.` (it names this replica in logs, metrics and audit rows)",
            ));
        }
        Ok(name)
    }

    /// `[methods]`: each name outside the specification, with a class it may have.
    pub(super) fn methods(&self, raw: &RawConfig) -> Result<Extras> {
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

    pub(super) fn pins(&self, raw: &RawConfig) -> Result<PinsSettings> {
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

    pub(super) fn telemetry(&self, raw: &RawConfig) -> Result<TelemetrySettings> {
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
            replica: self.replica(raw)?,
            log_format: self.one_of(
                t.log_format.as_ref(),
                "telemetry.log_format",
                &[("json", LogFormat::Json), ("pretty", LogFormat::Pretty)],
                LogFormat::Json,
            )?,
        })
    }
}

/// The host's name (a pod's name in Kubernetes), kept to what a replica
/// name may hold; `unknown` when it cannot be read.
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let name: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(64)
        .collect();
    if name.is_empty() {
        "unknown".to_owned()
    } else {
        name
    }
}
