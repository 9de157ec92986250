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
pub(crate) mod duration;
mod raw;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use crate::auth::ClientTable;
use crate::policy::Policy;

/// A compiled configuration.
#[derive(Debug)]
pub struct Config {
    /// Where it was read from (for messages).
    pub source: String,
    /// `[gateway]`.
    pub gateway: GatewaySettings,
    /// `[servers.NAME]`, by name.
    pub servers: BTreeMap<String, Arc<ServerSettings>>,
    /// `[clients.NAME]`.
    pub clients: ClientTable,
    /// `[[rules]]`.
    pub policy: Policy,
    /// `[rate_limit]`.
    pub rate_limit: RateLimitSettings,
    /// `[sanitize]`.
    pub sanitize: SanitizeSettings,
    /// `[audit]`.
    pub audit: AuditSettings,
    /// `[pins]`.
    pub pins: PinsSettings,
    /// `[telemetry]`.
    pub telemetry: TelemetrySettings,
    /// `[methods]`: the operator's methods beside the specification's.
    pub(crate) methods: crate::mcp::methods::Extras,
    /// `[approvals]`.
    pub approvals: crate::approval::ApprovalSettings,
}

/// `[gateway]`.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// MCP listener (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// Admin listener: health now, dashboard and metrics (default `127.0.0.1:9090`).
    pub admin_listen: SocketAddr,
    /// SHA-256 of the admin token.
    pub admin_token_sha256: Option<[u8; 32]>,
    /// Origins a browser-borne request may come from; any other present `Origin` gets 403.
    pub allowed_origins: Vec<String>,
    /// Host names accepted besides the loopback ones while the listener is on loopback.
    pub allowed_hosts: Vec<String>,
    /// Largest request body (default 1 MiB); larger gets 413.
    pub max_request_bytes: usize,
    /// Deepest JSON nesting in a request (default 64); deeper gets 400.
    pub max_json_depth: usize,
    /// Largest upstream JSON response or SSE event (default 16 MiB).
    pub max_response_bytes: usize,
    /// Most upstream sessions tracked at once (default 10,000); the oldest is dropped past it.
    pub max_sessions: usize,
    /// Most upstream sessions one client may hold (default 100): past it, that
    /// client's own least recently used session is dropped, never another's.
    pub max_sessions_per_client: usize,
    /// Most tasks the gateway tracks at once (default 10,000), in memory.
    pub max_tasks: usize,
    /// Most tasks one client may hold (default 100): past it, that client's
    /// own oldest task is forgotten, never another's.
    pub max_tasks_per_client: usize,
    /// Longest the gateway keeps a task's binding (default 24 h), whatever
    /// ttl the upstream gives it.
    pub max_task_ttl: Duration,
    /// `enforce` (default) or `observe`; a server's `mode` overrides it.
    pub mode: Mode,
    /// How long in-flight requests may finish after SIGTERM (default 10 s).
    pub shutdown_grace: Duration,
    /// Longest a client may take to send a request's headers or body, or to
    /// read what the gateway writes; also how long an idle connection stays
    /// open (default 30 s).
    pub client_timeout: Duration,
    /// Longest a new connection may take to send its first request's
    /// headers (default 10 s, at most `client_timeout`): shorter than the
    /// keep-alive idle time, so half-open connections go first.
    pub header_timeout: Duration,
    /// Most connections open at once on each listener (default 1024); past
    /// it a new connection gets 503 with `Retry-After`, or is closed.
    pub max_connections: usize,
}

/// What the gateway does with its decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Refusals are enforced.
    Enforce,
    /// Policy and validation decisions are made and logged, and the call goes
    /// through unchanged; transport checks stay enforced.
    Observe,
}

impl Mode {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Observe => "observe",
        }
    }
}

/// `[servers.NAME]`: one upstream.
#[derive(Debug, PartialEq)]
pub struct ServerSettings {
    /// The server's name, as in `/mcp/<name>`.
    pub name: String,
    /// How the gateway reaches it: a Streamable HTTP endpoint or a process it spawns.
    pub transport: Transport,
    /// Headers the gateway adds (its own credentials); values are secrets.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Longest wait for a response, and for each SSE event of a response (default 30 s).
    pub timeout: Duration,
    /// Longest wait for a TCP/TLS connection (default 5 s).
    pub connect_timeout: Duration,
    /// What a changed tool definition gets.
    pub pinning: Pinning,
    /// `mode` of this server, overriding `[gateway] mode` when set.
    pub mode: Option<Mode>,
}

/// How a server is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// `url`: a Streamable HTTP endpoint.
    Http(reqwest::Url),
    /// `command`: a stdio server the gateway spawns and supervises.
    Stdio(StdioCommand),
}

impl ServerSettings {
    /// The server's address, when it is reached over HTTP.
    pub fn url(&self) -> Option<&reqwest::Url> {
        match &self.transport {
            Transport::Http(url) => Some(url),
            Transport::Stdio(_) => None,
        }
    }
}

/// `command`, `env` and `cwd` of a stdio server.
#[derive(Clone, PartialEq)]
pub struct StdioCommand {
    /// The program (looked up in `PATH` when it has no `/`).
    pub program: String,
    pub args: Vec<String>,
    /// Variables set for the child besides `PATH`, `HOME` and `LANG`; values are secrets.
    pub env: Vec<(String, String)>,
    /// Working directory (default: the gateway's).
    pub cwd: Option<std::path::PathBuf>,
    /// The command as written (`${NAME}` not expanded), for `check` and the
    /// dashboard: an expanded argument may be a secret.
    pub display: String,
}

impl std::fmt::Debug for StdioCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        // Arguments may carry expanded secrets: shown as written.
        f.debug_struct("StdioCommand")
            .field("env", &env)
            .field("cwd", &self.cwd)
            .field("display", &self.display)
            .finish()
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Http(url) => write!(f, "{url}"),
            Transport::Stdio(c) => write!(f, "stdio: {}", c.display),
        }
    }
}

/// `pinning` of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinning {
    /// Definitions are not pinned.
    Off,
    /// A changed definition passes and is flagged.
    Warn,
    /// A changed definition is quarantined until approved.
    Block,
}

impl Pinning {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Pinning::Off => "off",
            Pinning::Warn => "warn",
            Pinning::Block => "block",
        }
    }
}

/// `[rate_limit]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitSettings {
    /// Where buckets live.
    pub backend: RateBackend,
    /// What a call gets when the backend cannot answer.
    pub on_backend_error: OnBackendError,
}

/// Bucket storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateBackend {
    /// In this process.
    Memory,
    /// Shared by replicas through Redis.
    Redis(String),
}

/// Failure policy of the rate-limit backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBackendError {
    /// Refuse the call.
    Deny,
    /// Let the call through.
    Allow,
}

/// `[sanitize]`.
#[derive(Debug, Clone)]
pub struct SanitizeSettings {
    /// Strip terminal control sequences.
    pub ansi: bool,
    /// Strip invisible Unicode.
    pub invisible_unicode: bool,
    /// What a detected secret gets.
    pub secrets: SecretsAction,
    /// Longest text passed to the model.
    pub max_output_bytes: usize,
    /// Operators' own redactions.
    pub patterns: Vec<(String, regex::Regex)>,
    /// What a `tools/call` whose arguments carry a secret gets.
    pub arguments: ArgumentScan,
    /// `[[sanitize.exemptions]]`, in file order.
    pub exemptions: Vec<Exemption>,
}

impl Default for SanitizeSettings {
    /// The defaults of an empty `[sanitize]` table.
    fn default() -> Self {
        Self {
            ansi: true,
            invisible_unicode: true,
            secrets: SecretsAction::Redact,
            max_output_bytes: 256 * 1024,
            patterns: Vec::new(),
            arguments: ArgumentScan::Block,
            exemptions: Vec::new(),
        }
    }
}

impl SanitizeSettings {
    /// The actions turned off for `tool` on `server` (the union of every
    /// exemption that matches both).
    pub fn skip_for(&self, server: &str, tool: &str) -> crate::sanitize::Skip {
        self.exemptions
            .iter()
            .filter(|e| {
                e.servers.iter().any(|g| g.matches(server))
                    && e.tools.iter().any(|g| g.matches(tool))
            })
            .fold(crate::sanitize::Skip::default(), |acc, e| acc.union(e.skip))
    }
}

/// `arguments` of `[sanitize]`: the secret scan of outgoing arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgumentScan {
    /// Arguments are not scanned.
    Off,
    /// A call whose arguments carry a secret is refused (`argument_not_permitted`).
    Block,
}

/// `[[sanitize.exemptions]]`: sanitizer actions an operator turns off for some tools.
#[derive(Debug, Clone)]
pub struct Exemption {
    /// Servers it applies to (globs; default every server).
    pub servers: Vec<crate::policy::glob::Glob>,
    /// Tools it applies to (globs over tool names).
    pub tools: Vec<crate::policy::glob::Glob>,
    /// The actions turned off.
    pub skip: crate::sanitize::Skip,
}

/// `secrets` of `[sanitize]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretsAction {
    /// Secrets pass.
    Off,
    /// Replaced by `[REDACTED:<kind>]`.
    Redact,
    /// The whole result is withheld.
    Block,
}

/// `[audit]`.
#[derive(Debug, Clone)]
pub struct AuditSettings {
    /// Whether events are stored at all (metrics and the live feed see them either way).
    pub enabled: bool,
    /// SQLite file (WAL); a relative path is read from the configuration
    /// file's directory. `":memory:"`: kept in memory only, lost at exit.
    pub database: String,
    /// How long events are kept.
    pub retention: Duration,
    /// How arguments are recorded.
    pub arguments: AuditArguments,
}

/// `[pins]`: the store of pinned tool definitions and server instructions.
#[derive(Debug, Clone)]
pub struct PinsSettings {
    /// The SQLite file (`database`; default `portcullis-pins.db` beside
    /// `[audit] database`; a relative path is read from the configuration
    /// file's directory). `None` (written `":memory:"`): kept in memory only,
    /// so every restart trusts on first use again.
    pub database: Option<PathBuf>,
}

/// `arguments` of `[audit]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditArguments {
    /// Not recorded.
    None,
    /// Keys and types only.
    Shape,
    /// Values with secrets redacted.
    Redacted,
    /// Values as sent.
    Full,
}

/// `[telemetry]`.
#[derive(Debug, Clone)]
pub struct TelemetrySettings {
    /// OTLP/HTTP endpoint for traces.
    pub otlp_endpoint: Option<reqwest::Url>,
    /// Log line format.
    pub log_format: LogFormat,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable.
    Pretty,
}

/// A configuration that was refused, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or label) that was read.
    pub file: String,
    /// 1-based line, when the fault has a place in the file.
    pub line: Option<usize>,
    /// 1-based column.
    pub column: Option<usize>,
    /// Dotted key of the offending value (`rules[2].tools[0]`).
    pub key: String,
    /// What is wrong and what is expected.
    pub reason: String,
    /// The offending line of the file, for the caret display.
    pub excerpt: Option<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{l}:{c}: ", self.file)?,
            _ => write!(f, "{}: ", self.file)?,
        }
        if self.key.is_empty() {
            write!(f, "{}", self.reason)?;
        } else {
            write!(f, "`{}`: {}", self.key, self.reason)?;
        }
        if let (Some(excerpt), Some(l), Some(c)) = (&self.excerpt, self.line, self.column) {
            let gutter = l.to_string();
            write!(
                f,
                "\n {pad} |\n {gutter} | {excerpt}\n {pad} | {caret:>width$}",
                pad = " ".repeat(gutter.len()),
                caret = "^",
                width = c,
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

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
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: None,
        column: None,
        key: String::new(),
        reason: format!("cannot read the file: {e}"),
        excerpt: None,
    })?;
    let mut config = load_str(&text, &file, &|name| std::env::var(name).ok())?;
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

impl Config {
    /// The effective policy, as `portcullis check` prints it.
    pub fn describe(&self) -> String {
        let servers: Vec<&str> = self.servers.keys().map(String::as_str).collect();
        let clients = self.clients.ids();
        let mut out = format!(
            "{}: OK — {} server(s), {} client(s), {} rule(s)\n\nservers\n",
            self.source,
            servers.len(),
            clients.len(),
            self.policy.rules.len()
        );
        for server in self.servers.values() {
            out.push_str(&format!(
                "  {:<12} {}  (timeout {}, pinning {}{})\n",
                server.name,
                server.transport,
                crate::proxy::humanize(server.timeout),
                server.pinning.as_str(),
                match server.mode.unwrap_or(self.gateway.mode) {
                    Mode::Enforce => "",
                    Mode::Observe => ", mode observe: nothing is refused",
                }
            ));
        }
        if let Some(jwt) = self.clients.jwt() {
            out.push_str(&jwt.describe());
        }
        out.push_str("\neffective policy (deny by default; a deny rule overrides every allow)\n");
        out.push_str(&self.policy.describe(&clients, &servers));
        if !self.methods.is_empty() {
            out.push_str(
                "\nmethods beside the MCP specification (every other unknown method is refused with -32601)\n",
            );
            for (name, class) in self.methods.iter() {
                out.push_str(&format!("  {name:<24} class {}\n", class.as_str()));
            }
        }
        out
    }
}
