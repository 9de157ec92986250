//! The gateway's configuration: loaded from TOML, compiled into types that
//! cannot be invalid.
//!
//! Place in the path: read at start (and at reload); every request then reads
//! the compiled [`Config`] it started with.
//!
//! Invariants: a file is accepted whole or refused whole; a refusal names the
//! file, line, column, key and what was expected; secrets read from the
//! environment (`${NAME}`, `api_key_env`) are never printed.

// A refusal happens once, at load: its size on the stack does not matter.
#![allow(clippy::result_large_err)]

mod compile;
pub(crate) mod model;
mod raw;
mod reference;

use std::path::Path;

pub use crate::audit::{AuditArguments, AuditSettings};
pub use crate::pins::{Pinning, PinsSettings};
pub use crate::ratelimit::{OnBackendError, RateBackend, RateLimitSettings};
pub use crate::sanitize::{ArgumentScan, Exemption, SanitizeSettings, SecretsAction};
pub use crate::telemetry::{LogFormat, TelemetrySettings};
pub use model::{
    BreakerSettings, Config, ConfigError, GatewaySettings, Mode, RestartSettings, RetrySettings,
    ServerSettings, StdioCommand, Transport,
};

/// The configuration reference as Markdown, from this version's
/// configuration types (what `portcullis config-reference` prints).
pub fn reference_markdown() -> String {
    reference::render(&json_schema())
}

/// The JSON Schema of the configuration file (draft 2020-12), generated from the very
/// types the file is read into, so it cannot drift from what `load` accepts: every table
/// and key, their types, which are required, and no others (`additionalProperties:
/// false`, as the loader refuses unknown keys). Editors use it to complete and check
/// keys (`portcullis config-schema`; `config/portcullis.schema.json` in the repository).
/// Values the loader checks further (durations, addresses, globs, ranges) are strings or
/// numbers here; `portcullis check` says the rest.
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(raw::RawConfig);
    schema.insert(
        "$id".into(),
        "https://portcullis.invalid/portcullis.schema.json".into(),
    );
    schema.insert("title".into(), "Portcullis configuration".into());
    schema.insert(
        "description".into(),
        "The TOML configuration of the Portcullis MCP gateway (portcullis run --config FILE)."
            .into(),
    );
    schema.to_value()
}

/// Reads and compiles the file at `path`, taking `${NAME}` values from the process environment.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_text(path, &read(path)?)
}

/// The text of the file at `path`.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.display().to_string(),
        line: None,
        column: None,
        key: String::new(),
        reason: format!("cannot read the file: {e}"),
        excerpt: None,
    })
}

/// Compiles `text`, read from the file at `path`, as [`load`] does.
pub fn load_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let mut config = load_str(text, &file, &|name| std::env::var(name).ok())?;
    // Relative store paths are the configuration's, wherever the command runs.
    if let (Some(db), Some(dir)) = (&mut config.pins.database, path.parent())
        && db.is_relative()
    {
        *db = dir.join(&*db);
    }
    let audit = Path::new(&config.audit.database);
    if config.audit.database != ":memory:"
        && audit.is_relative()
        && let Some(dir) = path.parent()
    {
        config.audit.database = dir.join(audit).display().to_string();
    }
    if let (crate::audit::AuditBackend::Postgres { spool, .. }, Some(dir)) =
        (&mut config.audit.backend, path.parent())
        && Path::new(spool.as_str()).is_relative()
    {
        *spool = dir.join(&*spool).display().to_string();
    }
    Ok(config)
}

/// Compiles `text` (labelled `file` in messages), looking environment variables up with `env`.
pub fn load_str(
    text: &str,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    compile::compile(text, file, env)
}
