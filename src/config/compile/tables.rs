//! The smaller tables: `[audit]`, `[methods]`, `[pins]` and `[telemetry]`,
//! each into the settings type of the module that owns it.
//!
//! Invariants: every value is checked here, with its place in the file.

use std::time::Duration;

use super::super::raw::RawConfig;
use crate::audit::{AuditArguments, AuditSettings};
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
            log_format: self.one_of(
                t.log_format.as_ref(),
                "telemetry.log_format",
                &[("json", LogFormat::Json), ("pretty", LogFormat::Pretty)],
                LogFormat::Json,
            )?,
        })
    }
}
