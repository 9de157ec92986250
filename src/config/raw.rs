//! The TOML file as written: serde mirrors of every table, nothing interpreted.
//!
//! Place in the path: read once at load (and later at reload), then handed to
//! [`super::compile`], which turns it into types that cannot be invalid.
//!
//! Invariants: every struct denies unknown fields, so a typo in a security
//! policy fails loudly instead of silently widening access. Values that a
//! later check must point at (names, globs, durations, URLs) keep their span.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use toml::Spanned;

/// The whole file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub gateway: RawGateway,
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawServer>")]
    pub servers: BTreeMap<Spanned<String>, RawServer>,
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawClient>")]
    pub clients: BTreeMap<Spanned<String>, RawClient>,
    #[serde(default)]
    pub auth: RawAuth,
    #[serde(default)]
    pub rules: Vec<RawRule>,
    #[serde(default)]
    pub rate_limit: RawRateLimit,
    #[serde(default)]
    pub sanitize: RawSanitize,
    #[serde(default)]
    pub audit: RawAudit,
    #[serde(default)]
    pub pins: RawPins,
    #[serde(default)]
    pub telemetry: RawTelemetry,
    /// `[approvals]`: the signing key and limits of human approval.
    #[serde(default)]
    pub approvals: RawApprovals,
    /// `[methods]`: methods outside the MCP specification the operator lets
    /// through, each with the class whose rules it must pass.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub methods: BTreeMap<Spanned<String>, Spanned<String>>,
    /// `[identity]`: the gateway's signing keys (identity assertions,
    /// `private_key_jwt`) and the bounds of the upstream token cache.
    #[serde(default)]
    pub identity: RawIdentity,
    /// `[state]`: where the fleet's security state lives (memory or Redis).
    #[serde(default)]
    pub state: RawState,
}

/// `[gateway]`: listeners and request limits.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGateway {
    #[schemars(with = "Option<String>")]
    pub listen: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub admin_listen: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub admin_token_sha256: Option<Spanned<String>>,
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub allowed_origins: Vec<Spanned<String>>,
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub allowed_hosts: Vec<Spanned<String>>,
    #[schemars(with = "Option<i64>")]
    pub max_request_bytes: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_json_depth: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_response_bytes: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_sessions: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_sessions_per_client: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_tasks: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_tasks_per_client: Option<Spanned<i64>>,
    #[schemars(with = "Option<String>")]
    pub max_task_ttl: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub mode: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub shutdown_grace: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub client_timeout: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub header_timeout: Option<Spanned<String>>,
    #[schemars(with = "Option<i64>")]
    pub max_connections: Option<Spanned<i64>>,
    #[schemars(with = "Option<String>")]
    pub replica: Option<Spanned<String>>,
}

/// `[servers.NAME]`: one upstream MCP server.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    #[schemars(with = "Option<String>")]
    pub url: Option<Spanned<String>>,
    #[schemars(with = "Option<Vec<String>>")]
    pub command: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub env: BTreeMap<String, Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub cwd: Option<Spanned<String>>,
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub headers: BTreeMap<Spanned<String>, Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub timeout: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub connect_timeout: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub pinning: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub mode: Option<Spanned<String>>,
    /// `[servers.NAME.identity]`: how each client reaches this server as itself.
    #[schemars(with = "Option<RawServerIdentity>")]
    pub identity: Option<Spanned<RawServerIdentity>>,
    /// `[servers.NAME.retry]`: when the gateway sends a request again by itself.
    #[serde(default)]
    pub retry: RawRetry,
    /// `[servers.NAME.breaker]`: when the gateway stops sending to a failing server.
    #[serde(default)]
    pub breaker: RawBreaker,
    /// `[servers.NAME.restart]`: how a stdio server's crashed process is restarted.
    #[schemars(with = "Option<RawRestart>")]
    pub restart: Option<Spanned<RawRestart>>,
    /// `[servers.NAME.timeouts]`: tool pattern → the whole call's deadline.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub timeouts: BTreeMap<Spanned<String>, Spanned<String>>,
    /// `[servers.NAME.labels]`: tool name → its flow labels.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawLabels>")]
    pub labels: BTreeMap<Spanned<String>, Spanned<RawLabels>>,
    /// Labels tools by their pinned annotations (`openWorldHint`, `readOnlyHint`).
    #[schemars(with = "Option<bool>")]
    pub labels_from_annotations: Option<Spanned<bool>>,
    /// `[servers.NAME.resource_labels]`: canonical URI pattern → its source label.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawLabels>")]
    pub resource_labels: BTreeMap<Spanned<String>, Spanned<RawLabels>>,
    /// `[servers.NAME.prompt_labels]`: prompt name pattern → its source label.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawLabels>")]
    pub prompt_labels: BTreeMap<Spanned<String>, Spanned<RawLabels>>,
}

/// `[servers.NAME.breaker]`: the circuit breaker of one server.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBreaker {
    #[schemars(with = "Option<i64>")]
    pub failures: Option<Spanned<i64>>,
    #[schemars(with = "Option<String>")]
    pub cool_down: Option<Spanned<String>>,
    #[schemars(with = "Option<f64>")]
    pub ratio: Option<Spanned<f64>>,
    #[schemars(with = "Option<i64>")]
    pub window: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub min_calls: Option<Spanned<i64>>,
}

/// `[servers.NAME.restart]`: restarts of a stdio server's process.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRestart {
    #[schemars(with = "Option<String>")]
    pub min_backoff: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub max_backoff: Option<Spanned<String>>,
    #[schemars(with = "Option<i64>")]
    pub max_restarts: Option<Spanned<i64>>,
}

/// `[servers.NAME.retry]`: which failed requests the gateway sends again.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetry {
    #[schemars(with = "Option<i64>")]
    pub attempts: Option<Spanned<i64>>,
    #[schemars(with = "Option<f64>")]
    pub budget: Option<Spanned<f64>>,
    #[schemars(with = "Option<Vec<String>>")]
    pub idempotent_tools: Option<Vec<Spanned<String>>>,
    pub trust_annotations: Option<bool>,
}

/// `"TOOL" = { source, sink }` in `[servers.NAME.labels]`; `{ source }` in
/// `resource_labels` and `prompt_labels` (a sink there is refused: sinks are tools).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLabels {
    /// `"private"` or `"untrusted"`: what a successful call brings into the session.
    #[schemars(with = "Option<String>")]
    pub source: Option<Spanned<String>>,
    /// `"egress"`: the tool can carry data out.
    #[schemars(with = "Option<String>")]
    pub sink: Option<Spanned<String>>,
}

/// `flow = { holds, then }` inside an allow rule.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFlow {
    /// Source labels the session must all hold for the rule to act.
    #[schemars(with = "Vec<String>")]
    pub holds: Spanned<Vec<Spanned<String>>>,
    /// `"deny"` or `"approval"` (the rule's `approval` is asked then, and only then).
    #[schemars(with = "String")]
    pub then: Spanned<String>,
}

/// `[identity]`: what the gateway itself is toward upstream servers.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIdentity {
    /// `iss` of the assertions the gateway signs (and the `act`/`azp` naming it).
    #[schemars(with = "Option<String>")]
    pub issuer: Option<Spanned<String>>,
    /// PKCS#8 PEM private keys, each `{ file = "…" }` or `{ env = "NAME" }`:
    /// the first signs, all are published at `/.well-known/jwks.json`.
    #[serde(default)]
    #[schemars(with = "Vec<RawSecretSource>")]
    pub signing_keys: Vec<Spanned<RawSecretSource>>,
    /// Most tokens one server's cache holds.
    #[schemars(with = "Option<i64>")]
    pub max_cached_tokens: Option<Spanned<i64>>,
    /// Most tokens one client holds in one server's cache.
    #[schemars(with = "Option<i64>")]
    pub max_cached_tokens_per_client: Option<Spanned<i64>>,
}

/// Where a secret is read at load: an environment variable or a file, never the TOML.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSecretSource {
    #[schemars(with = "Option<String>")]
    pub env: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub file: Option<Spanned<String>>,
}

/// `[servers.NAME.identity]`: one mode and its keys.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServerIdentity {
    /// `"secret"`, `"template"`, `"assertion"`, `"exchange"` or `"client_credentials"`.
    #[schemars(with = "String")]
    pub mode: Spanned<String>,
    /// The header carrying the credential (default `Authorization`).
    #[schemars(with = "Option<String>")]
    pub header: Option<Spanned<String>>,
    /// The header's value around the credential (default `"Bearer {token}"`;
    /// `{secret}` in mode `secret`).
    #[schemars(with = "Option<String>")]
    pub format: Option<Spanned<String>>,
    /// Mode `secret`: each client's secret, `{ env = "NAME" }` or `{ file = "…" }`.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawSecretSource>")]
    pub secrets: BTreeMap<Spanned<String>, Spanned<RawSecretSource>>,
    /// Mode `template`: header name → value over `{client}` and `{claims.NAME}`.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub headers: BTreeMap<Spanned<String>, Spanned<String>>,
    /// Mode `assertion`: the `aud` (default the server's URL).
    #[schemars(with = "Option<String>")]
    pub audience: Option<Spanned<String>>,
    /// Mode `assertion`: `exp - iat` (default 60s, at most 10m).
    #[schemars(with = "Option<String>")]
    pub lifetime: Option<Spanned<String>>,
    /// Mode `assertion`: reuse one assertion per client for this long (default: one per call).
    #[schemars(with = "Option<String>")]
    pub reuse: Option<Spanned<String>>,
    /// Modes `exchange` and `client_credentials`: the token endpoint (https; http only on loopback).
    #[schemars(with = "Option<String>")]
    pub token_endpoint: Option<Spanned<String>>,
    /// The gateway's client id at the authorization server.
    #[schemars(with = "Option<String>")]
    pub client_id: Option<Spanned<String>>,
    /// `"client_secret_basic"` (default), `"client_secret_post"` or `"private_key_jwt"`.
    #[schemars(with = "Option<String>")]
    pub client_auth: Option<Spanned<String>>,
    /// The gateway's client secret, `{ env = "NAME" }` or `{ file = "…" }`.
    #[schemars(with = "Option<RawSecretSource>")]
    pub client_secret: Option<Spanned<RawSecretSource>>,
    /// RFC 8707 `resource` (default the server's URL).
    #[schemars(with = "Option<String>")]
    pub resource: Option<Spanned<String>>,
    /// RFC 8693 `audience`, for authorization servers that want one.
    #[schemars(with = "Option<String>")]
    pub token_audience: Option<Spanned<String>>,
    /// `scope` asked for.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub scopes: Vec<Spanned<String>>,
    /// Mode `exchange`: RFC 8693 `subject_token_type` (default access_token).
    #[schemars(with = "Option<String>")]
    pub subject_token_type: Option<Spanned<String>>,
    /// Longest wait for the token endpoint (default 10s).
    #[schemars(with = "Option<String>")]
    pub timeout: Option<Spanned<String>>,
    /// A cached token is not used within this long of its expiry (default 30s).
    #[schemars(with = "Option<String>")]
    pub refresh_before: Option<Spanned<String>>,
    /// Longest a token is reused, whatever its expiry (default 5m).
    #[schemars(with = "Option<String>")]
    pub max_reuse: Option<Spanned<String>>,
}

/// `[clients.NAME]`: who may connect, and with which key.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClient {
    #[schemars(with = "Option<String>")]
    pub api_key_sha256: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub api_key_env: Option<Spanned<String>>,
}

/// `[auth]`: optional identity providers beside API keys.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAuth {
    #[schemars(with = "Option<RawJwt>")]
    pub jwt: Option<Spanned<RawJwt>>,
}

/// `[auth.jwt]`: bearer JWTs from an OAuth authorization server.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwt {
    #[schemars(with = "Option<String>")]
    pub issuer: Option<Spanned<String>>,
    /// A string or a list of strings.
    #[schemars(with = "Option<serde_json::Value>")]
    pub audience: Option<Spanned<toml::Value>>,
    #[schemars(with = "Option<String>")]
    pub jwks_file: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub jwks_url: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub jwks_refresh: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub client_claim: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub leeway: Option<Spanned<String>>,
    #[schemars(with = "Option<Vec<String>>")]
    pub algorithms: Option<Spanned<Vec<Spanned<String>>>>,
    #[schemars(with = "Option<Vec<String>>")]
    pub required_scopes: Option<Spanned<Vec<Spanned<String>>>>,
    #[schemars(with = "Option<String>")]
    pub resource_url: Option<Spanned<String>>,
}

/// `[[rules]]`: one allow or deny rule.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    #[schemars(with = "Vec<String>")]
    pub clients: Spanned<Vec<Spanned<String>>>,
    #[schemars(with = "Vec<String>")]
    pub servers: Spanned<Vec<Spanned<String>>>,
    #[schemars(with = "Option<Vec<String>>")]
    pub tools: Option<Vec<Spanned<String>>>,
    #[schemars(with = "Option<Vec<String>>")]
    pub resources: Option<Vec<Spanned<String>>>,
    #[schemars(with = "Option<Vec<String>>")]
    pub prompts: Option<Vec<Spanned<String>>>,
    #[schemars(with = "String")]
    pub action: Spanned<String>,
    #[schemars(with = "Option<RawRate>")]
    pub rate: Option<Spanned<RawRate>>,
    #[schemars(with = "Option<serde_json::Value>")]
    pub arguments: Option<Spanned<toml::Value>>,
    /// `flow = { holds, then }`: what a call to a sink tool gets once the
    /// session holds the labels named.
    #[schemars(with = "Option<RawFlow>")]
    pub flow: Option<Spanned<RawFlow>>,
    /// `approval = { by, timeout, reason, pending }`: a person must approve
    /// each call this allow rule lets through.
    #[schemars(with = "Option<RawApproval>")]
    pub approval: Option<Spanned<RawApproval>>,
    /// `when = "<CEL expression>"`: the rule matches a use (a tool call, a
    /// resource read, a prompt get) only where the expression is true; the
    /// rule names one kind of subject (see the book's Rules chapter, Expressions).
    #[schemars(with = "Option<String>")]
    pub when: Option<Spanned<String>>,
}

/// `approval = { … }` inside an allow rule.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApproval {
    /// `"user"` (elicitation, in band), `"operator"` (dashboard / admin API)
    /// or `"either"` (the user when the client can be asked, else an operator).
    #[schemars(with = "String")]
    pub by: Spanned<String>,
    /// How long a question stays open and an approval usable (default `"5m"`).
    #[schemars(with = "Option<String>")]
    pub timeout: Option<Spanned<String>>,
    /// Shown to whoever approves.
    #[schemars(with = "Option<String>")]
    pub reason: Option<Spanned<String>>,
    /// Operator path: `"wait"` (the call is held up to the timeout, default)
    /// or `"retry"` (answered at once with an approval id; retried after approval).
    #[schemars(with = "Option<String>")]
    pub pending: Option<Spanned<String>>,
}

/// `[approvals]`: the gateway-wide part of human approval.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApprovals {
    /// HMAC-SHA256 key signing 2026-era `requestState`s (at least 32 bytes;
    /// write `${NAME}`); absent: one is generated at start.
    #[schemars(with = "Option<String>")]
    pub key: Option<Spanned<String>>,
    #[schemars(with = "Option<i64>")]
    pub max_pending: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_pending_per_client: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_used_states: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_used_states_per_client: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_sessions: Option<Spanned<i64>>,
    #[schemars(with = "Option<i64>")]
    pub max_sessions_per_client: Option<Spanned<i64>>,
    /// Removed (values are shown whole): read only to refuse it with a reason.
    #[schemars(skip)]
    pub max_value_chars: Option<Spanned<toml::Value>>,
    #[schemars(with = "Option<i64>")]
    pub max_question_chars: Option<Spanned<i64>>,
}

/// `rate = { burst, per_second, key }` inside a rule.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRate {
    #[schemars(with = "i64")]
    pub burst: Spanned<i64>,
    #[schemars(with = "f64")]
    pub per_second: Spanned<f64>,
    #[schemars(with = "Option<String>")]
    pub key: Option<Spanned<String>>,
}

/// `[rate_limit]`: where token buckets live.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    #[schemars(with = "Option<String>")]
    pub backend: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub redis_url: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub on_backend_error: Option<Spanned<String>>,
}

/// `[state]`: where the deployment's security state lives: in this process
/// (`"memory"`) or in one Redis every replica shares (`"redis"`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawState {
    /// `"memory"` (default) or `"redis"`.
    #[schemars(with = "Option<String>")]
    pub backend: Option<Spanned<String>>,
    /// `redis://` or `rediss://` URL; `[rate_limit] backend = "redis"` uses it
    /// when it names none of its own.
    #[schemars(with = "Option<String>")]
    pub redis_url: Option<Spanned<String>>,
    /// The deployment's name in every key (`portcullis:<namespace>:…`), the
    /// rate-limit buckets' included; `default` when unset.
    #[schemars(with = "Option<String>")]
    pub namespace: Option<Spanned<String>>,
}

/// `[sanitize]`: what is removed from upstream output.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSanitize {
    pub ansi: Option<bool>,
    pub invisible_unicode: Option<bool>,
    #[schemars(with = "Option<String>")]
    pub secrets: Option<Spanned<String>>,
    #[schemars(with = "Option<i64>")]
    pub max_output_bytes: Option<Spanned<i64>>,
    #[serde(default)]
    pub patterns: Vec<RawPattern>,
    #[schemars(with = "Option<String>")]
    pub arguments: Option<Spanned<String>>,
    #[serde(default)]
    pub exemptions: Vec<RawExemption>,
}

/// `[[sanitize.patterns]]`: an operator's own redaction.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPattern {
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    #[schemars(with = "String")]
    pub regex: Spanned<String>,
}

/// `[[sanitize.exemptions]]`: actions turned off for some tools.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawExemption {
    #[schemars(with = "Option<Vec<String>>")]
    pub servers: Option<Spanned<Vec<Spanned<String>>>>,
    #[schemars(with = "Vec<String>")]
    pub tools: Spanned<Vec<Spanned<String>>>,
    #[schemars(with = "Vec<String>")]
    pub skip: Spanned<Vec<Spanned<String>>>,
}

/// `[audit]`: the audit trail (SQLite, or PostgreSQL for a fleet).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAudit {
    pub enabled: Option<bool>,
    #[schemars(with = "Option<String>")]
    pub backend: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub url: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub spool: Option<Spanned<String>>,
    #[schemars(with = "Option<i64>")]
    pub buffer: Option<Spanned<i64>>,
    #[schemars(with = "Option<String>")]
    pub database: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub retention: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub arguments: Option<Spanned<String>>,
}

/// `[pins]`: where pinned tool definitions are kept.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPins {
    #[schemars(with = "Option<String>")]
    pub database: Option<Spanned<String>>,
}

/// `[telemetry]`: traces and logs.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTelemetry {
    #[schemars(with = "Option<String>")]
    pub otlp_endpoint: Option<Spanned<String>>,
    #[schemars(with = "Option<String>")]
    pub log_format: Option<Spanned<String>>,
}
