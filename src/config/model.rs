//! The compiled configuration: the gateway's own settings (listeners, limits,
//! mode), each server's, and the decisions' settings types it holds, plus
//! what a refused configuration says.
//!
//! Place: the config layer, above the decisions whose settings it gathers.
//! Invariant: every value here has been checked by the compiler in
//! [`super::compile`]; nothing can be invalid once it exists.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use crate::audit::AuditSettings;
use crate::auth::ClientTable;
use crate::pins::{Pinning, PinsSettings};
use crate::policy::Policy;
use crate::ratelimit::RateLimitSettings;
use crate::sanitize::SanitizeSettings;
use crate::telemetry::TelemetrySettings;

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
    /// `[identity]`.
    pub identity: crate::identity::IdentitySettings,
    /// `[servers.NAME.labels]`: the flow labels of tools.
    pub flow: crate::flow::FlowSettings,
    /// `[state]`.
    pub state: crate::state::StateSettings,
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
    /// `[servers.NAME.identity]`: how each client reaches it as itself
    /// (none: only `headers`, one identity for all).
    pub identity: Option<crate::identity::ServerIdentity>,
    /// `[servers.NAME.retry]`: which failed requests the gateway sends again.
    pub retry: RetrySettings,
    /// `[servers.NAME.breaker]`: when the gateway stops sending to a failing server.
    pub breaker: BreakerSettings,
    /// `[servers.NAME.timeouts]`: tool pattern → the whole call's deadline,
    /// most specific first (a literal name, then longer patterns).
    pub tool_timeouts: Vec<(crate::policy::glob::Glob, Duration)>,
}

/// `[servers.NAME.breaker]`: after `failures` consecutive transport failures,
/// or when `ratio` of the last `window` requests failed (with at least
/// `min_calls` of them known), the server's calls are answered at once for
/// `cool_down`, then one probe goes.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerSettings {
    /// Transport failures in a row that open the breaker (default 5; 0 = not by count).
    pub failures: u32,
    /// How long it stays open before one probe (default 30 s).
    pub cool_down: Duration,
    /// Share of the window's requests that failed which opens it (default 0.5; 0 = not by ratio).
    pub ratio: f64,
    /// How many of the last requests the ratio is taken over (default 20).
    pub window: u32,
    /// Fewest requests in the window before the ratio counts (default 10).
    pub min_calls: u32,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failures: 5,
            cool_down: Duration::from_secs(30),
            ratio: 0.5,
            window: 20,
            min_calls: 10,
        }
    }
}

/// `[servers.NAME.retry]`: which failed requests the gateway sends again by
/// itself. A request that never left the gateway may always be sent again; one
/// that may have reached the server only when its tool is known to be safe to
/// run twice.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrySettings {
    /// Most tries of one request, the first included (default 3; 1 = never retry).
    pub attempts: u32,
    /// Retries allowed per request sent, over a window (default 0.2).
    pub budget: f64,
    /// Tools the operator says are safe to run twice (patterns).
    pub idempotent_tools: Vec<crate::policy::glob::Glob>,
    /// Whether a tool's own `readOnlyHint`/`idempotentHint` counts as that (default false).
    pub trust_annotations: bool,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            attempts: 3,
            budget: 0.2,
            idempotent_tools: Vec::new(),
            trust_annotations: false,
        }
    }
}

impl RetrySettings {
    /// Whether `tool` may be sent again after it may have reached the server:
    /// named by the operator, or (when trusted) annotated read-only or idempotent.
    pub fn repeatable(&self, tool: &str, read_only: bool, idempotent: bool) -> bool {
        self.idempotent_tools.iter().any(|g| g.matches(tool))
            || (self.trust_annotations && (read_only || idempotent))
    }
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
    /// The deadline of a whole call of `tool` (its retries and its reply to
    /// the end), when `[servers.NAME.timeouts]` names one for it.
    pub fn call_timeout(&self, tool: &str) -> Option<Duration> {
        (self.tool_timeouts.iter())
            .find(|(glob, _)| glob.matches(tool))
            .map(|(_, limit)| *limit)
    }

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
    /// `[servers.NAME.restart]`: how a crashed process is started again.
    pub restart: RestartSettings,
}

/// `[servers.NAME.restart]` of a stdio server: a process that ends is
/// started again after a delay that doubles from `min_backoff` to
/// `max_backoff`; after `max_restarts` restarts in a row (none of them up for
/// 30 s) the gateway stops restarting it.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartSettings {
    /// The first delay (default 100 ms).
    pub min_backoff: Duration,
    /// The longest delay (default 30 s).
    pub max_backoff: Duration,
    /// Restarts in a row before the gateway gives up (default 10; 0 = never gives up).
    pub max_restarts: u32,
}

impl Default for RestartSettings {
    fn default() -> Self {
        Self {
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            max_restarts: 10,
        }
    }
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

impl Config {
    /// What each client reaches each server with (`portcullis check`).
    fn describe_identity(&self, clients: &[crate::auth::ClientId]) -> String {
        let identity = &self.identity;
        let any = self.servers.values().any(|s| s.identity.is_some());
        if !any && identity.keys.is_empty() {
            return String::new();
        }
        let mut out =
            String::from("\nupstream identity (the client's own credential never crosses)\n");
        if !identity.keys.is_empty() {
            let kids: Vec<String> = identity
                .keys
                .iter()
                .map(|k| format!("{} {}", k.alg(), k.kid()))
                .collect();
            out.push_str(&format!(
                "  signing keys (the first signs; all published at {}): {}\n",
                crate::identity::JWKS_PATH,
                kids.join(", ")
            ));
        }
        for server in self.servers.values() {
            let mode = server.identity.as_ref().map_or("none", |i| i.mode());
            out.push_str(&format!("  {} (mode {mode})\n", server.name));
            for client in clients {
                let with_token = self.clients.authenticates_with_token(client);
                out.push_str(&format!(
                    "    {:<14} {}\n",
                    client.name(),
                    crate::identity::describe(server.identity.as_ref(), client, with_token)
                ));
            }
            if self.clients.jwt().is_some() {
                let other = crate::auth::ClientId::unlisted("(other token)");
                out.push_str(&format!(
                    "    {:<14} {}\n",
                    "other tokens",
                    crate::identity::describe(server.identity.as_ref(), &other, true)
                ));
            }
        }
        out
    }

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
                crate::util::time::humanize(server.timeout),
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
        out.push_str(&self.describe_identity(&clients));
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
