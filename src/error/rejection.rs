//! The [`Rejection`] type: why a request was not (or not fully) served, the
//! facts each refusal carries, and its source and code tags.
//!
//! Place: the bottom of the error module; every stage that stops a request
//! builds one of these, and the renderings beside this file read them.
//! Invariants: the gateway's own JSON-RPC codes lie outside -32768…-32000;
//! a code tag is stable (logs, metrics and audit key on it).

use std::time::Duration;

use serde_json::Value;

use crate::auth::{AuthError, AuthRefusal};
use crate::mcp::jsonrpc::ClassifyError;
use crate::mcp::limits::Overlong;
use crate::mcp::version::Era;
use crate::policy::Rate;
use crate::policy::uri::UriRefusal;

/// Gateway-specific JSON-RPC codes (outside the reserved range).
pub(crate) mod codes {
    /// The upstream could not be reached, or failed.
    pub(crate) const UPSTREAM_UNAVAILABLE: i64 = -31001;
    /// The upstream did not answer in time.
    pub(crate) const UPSTREAM_TIMEOUT: i64 = -31002;
    /// The upstream's reply could not be read.
    pub(crate) const UPSTREAM_PROTOCOL: i64 = -31003;
    /// The session is unknown to the gateway, or belongs to another client.
    pub(crate) const SESSION_NOT_FOUND: i64 = -31004;
    /// The request was refused by the gateway's transport checks.
    pub(crate) const FORBIDDEN: i64 = -31005;
    /// The client is not authenticated.
    pub(crate) const UNAUTHENTICATED: i64 = -31006;
    /// The body is larger than allowed.
    pub(crate) const TOO_LARGE: i64 = -31007;
    /// No such server, or a method the endpoint does not serve.
    pub(crate) const NOT_FOUND: i64 = -31008;
    /// A rate limit refused a `resources/read` or `prompts/get`.
    pub(crate) const RATE_LIMITED: i64 = -31009;
    /// A result other than a `tools/call` one that the gateway will not pass on
    /// (a secret under `secrets = "block"`, or too large for the client).
    pub(crate) const OUTPUT_REFUSED: i64 = -31010;
    /// A resource URI spelled so that decoding it would change its structure.
    pub(crate) const NON_CANONICAL_URI: i64 = -31011;
    /// The upstream refused the request with an HTTP 4xx and no JSON-RPC error of its own.
    pub(crate) const UPSTREAM_REFUSED: i64 = -31016;
    /// The credential the client reaches the upstream with could not be had;
    /// nothing was sent.
    pub(crate) const UPSTREAM_CREDENTIALS: i64 = -31017;
    /// The listener is at `max_connections`.
    pub(crate) const OVERLOADED: i64 = -31012;
    /// A client's JSON-RPC response names an approval question (its id has
    /// the gateway's question form) that is not open for this client and session.
    pub(crate) const APPROVAL_ANSWER_UNKNOWN: i64 = -31020;
    /// The shared state store did not answer; nothing was forwarded.
    pub(crate) const STATE_UNAVAILABLE: i64 = -31021;
    /// A listed resource or prompt whose use a rule's condition refuses
    /// (`call_not_permitted`, `rule_expression_failed` in `data.code`).
    pub(crate) const USE_NOT_PERMITTED: i64 = -31022;
}

/// Who a failure is attributed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The client sent something the gateway refuses.
    Client,
    /// The configured policy refused it.
    Policy,
    /// The upstream failed.
    Upstream,
}

/// Why a request was not (or not fully) served.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Rejection {
    /// `Origin` or `Host` refused (403).
    Forbidden(String),
    /// No such server (404).
    UnknownServer(String),
    /// An HTTP method the endpoint does not serve (405).
    MethodNotAllowed(&'static str),
    /// No or wrong credentials (401), or a token without a required scope (403).
    Unauthenticated(AuthRefusal),
    /// Body over `max_request_bytes` (413).
    TooLarge(usize),
    /// Not one JSON-RPC message (400).
    Malformed(ClassifyError),
    /// Standard headers disagree with the body (400, -32020).
    HeaderMismatch(String),
    /// Protocol version not served (400, -32022); `era` is the mechanism the
    /// client used (body `_meta` for 2026-07-28, the header before it).
    UnsupportedVersion { requested: String, era: Era },
    /// Params the method cannot take (400, -32602).
    InvalidParams(String),
    /// A method this endpoint does not serve (-32601; HTTP 404 in 2026-07-28).
    MethodNotFound(String),
    /// Session unknown or another client's (404).
    SessionNotFound,
    /// A resource or prompt the client may not use — answered exactly like a
    /// missing one (JSON-RPC -32602).
    NotFound(String),
    /// A `tools/call` refused by policy or validation (isError result).
    Tool(ToolRefusal),
    /// A resource read or subscription, a prompt get, a completion or a
    /// subscription stream whose item the client's list shows, refused by a
    /// rule's condition once the use's facts are known (its labels, a
    /// prompt's arguments), or by a condition that failed: JSON-RPC -31022
    /// with the refusal's code (`call_not_permitted`,
    /// `rule_expression_failed`) and details in `data`.
    Use(ToolRefusal),
    /// A call refused by a rate limit (isError on tools/call, JSON-RPC error
    /// otherwise; `Retry-After` on both).
    RateLimited(RateLimited),
    /// The upstream failed (isError on tools/call, 502/504 otherwise).
    Upstream(UpstreamFailure),
    /// A `tools/call` result the gateway will not pass on (isError result).
    Output(OutputRefusal),
    /// An identifier longer than its cap (400, -32602); the value is never echoed.
    TooLong(Overlong),
    /// A resource URI refused for its spelling, whatever the rules say (400,
    /// -31011). It depends on the text alone, so it tells nothing about what
    /// exists or what the rules allow.
    NonCanonicalUri {
        /// The URI as the client sent it.
        uri: String,
        /// Why it is refused.
        why: UriRefusal,
    },
    /// A task method naming a task that is not the client's: another client's,
    /// expired, or never created through the gateway — one answer for all, the
    /// spec's unknown-task error (JSON-RPC -32602).
    UnknownTask,
    /// The shared state store (`redis`) did not answer, so whether the
    /// request is the client's to make cannot be known (a task created
    /// through another replica), or the flow label a resource read or a
    /// prompt get sets cannot be kept: HTTP 503, -31021; nothing was forwarded.
    StateUnavailable(&'static str),
    /// A request other than `tools/call` (or a notification, or a response to
    /// the server) carrying what looks like a credential, with `sanitize.arguments
    /// = "block"`: JSON-RPC -32602 with the pointers and kinds, never the values.
    SecretInParams(SecretFound),
    /// A client's response to an approval question that is not open for it
    /// (unknown, answered, expired, another client's or session's): HTTP 400,
    /// -31020, one answer for all.
    UnknownApprovalAnswer,
}

/// Where a client→upstream message carries secrets.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SecretFound {
    pub method: String,
    /// (JSON pointer from the message's `params`, kind of secret).
    pub found: Vec<(String, String)>,
    /// A request (answered with HTTP 200 and its id) or not (HTTP 400).
    pub request: bool,
}

/// A tool call the gateway answers itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolRefusal {
    /// Stable code (`unknown_tool`, `invalid_arguments`, …).
    pub code: &'static str,
    /// Text for the model.
    pub text: String,
    /// Extra fields for `_meta["portcullis/error"]`.
    pub detail: serde_json::Map<String, Value>,
}

/// A call a rate limit refused, or that could not be checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RateLimited {
    /// What was called.
    pub subject: Limited,
    /// The authenticated client.
    pub client: String,
    /// The bucket that binds; `None` when the limiter's backend could not answer.
    pub limit: Option<Limit>,
    /// When the same call passes (exact for a limit; a suggestion otherwise).
    pub retry_after: Duration,
}

/// What a rate-limited call asked for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Limited {
    Tool(String),
    Resource(String),
    Prompt(String),
}

/// The rate that refused a call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Limit {
    /// Position of the rule in `[[rules]]`.
    pub rule: usize,
    /// The rule's `rate`.
    pub rate: Rate,
    /// With `key = "client"`: the rule's patterns whose calls share the bucket.
    pub shared_by: Vec<String>,
}

/// What went wrong upstream.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UpstreamFailure {
    pub kind: UpstreamKind,
    /// Boxed, not a `String`: a `Rejection` stays small enough to return by value.
    pub server: Box<str>,
    /// The tool, on `tools/call`.
    pub tool: Option<String>,
    /// Gateway-written description (never upstream text).
    pub reason: String,
    /// The upstream's own words, already sanitized and capped (see [`snippet`]).
    pub snippet: Option<String>,
    /// True when the request certainly never reached the upstream.
    pub not_run: bool,
    /// True when it failed while the gateway fetched the tool list, before it
    /// could check the arguments.
    pub unchecked: bool,
    /// What the tool's annotations say about running it again.
    pub hints: ToolHints,
    /// With [`UpstreamKind::Refused`]: the upstream's own JSON-RPC error
    /// object, already sanitized, relayed as it is under the request's id.
    pub relayed: Option<Box<Value>>,
}

/// Kinds of upstream failure, as in the product's error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamKind {
    /// Unreachable, refused, 5xx.
    Unavailable,
    /// No answer in time.
    Timeout,
    /// An answer the gateway cannot read (malformed JSON or SSE, wrong id, over the size cap).
    Protocol,
    /// A JSON-RPC error in answer to `tools/call`.
    Error(RpcError),
    /// An `isError` result from the upstream's tool.
    ToolFailed(ToolFailure),
    /// The upstream refused the request at the HTTP level (a 4xx other than
    /// 401/403/407, which concern the gateway's own credentials): its answer,
    /// relayed with its status. The request did not run.
    Refused(u16),
    /// The credential the caller reaches this server with could not be had
    /// (`identity`): the request was not sent.
    Credentials {
        /// Whether the same request may succeed later (an authorization
        /// server down) or not until someone acts (a refused token, a
        /// missing secret).
        retry_helps: bool,
    },
    /// The server's circuit breaker is open: the request was not sent.
    Open,
}

/// A JSON-RPC error answering `tools/call`, as the gateway reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RpcError {
    /// The upstream's code.
    pub code: i64,
    /// -32602 with a "not found" / "unknown tool" message: the upstream no
    /// longer has the tool (SDKs answer an unknown tool this way).
    pub unknown_tool: bool,
}

/// How an upstream `isError` result reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolFailure {
    /// The Python SDK's bare "Error executing tool X": the cause was swallowed.
    Opaque,
    /// Any other text (an SDK's prefix removed from the snippet).
    Message,
}

/// What a tool's `annotations` say about running it again. Annotations are
/// untrusted: they only shape advice, never a decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ToolHints {
    /// `readOnlyHint: true`.
    pub read_only: bool,
    /// `idempotentHint: true`.
    pub idempotent: bool,
}

/// A result withheld by the gateway: of a `tools/call` (an isError result),
/// or of another method (a JSON-RPC error).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OutputRefusal {
    pub kind: OutputKind,
    pub server: String,
    /// The tool, on `tools/call` (and results that stand for one, such as a
    /// task's); `None` for any other result.
    pub tool: Option<String>,
    /// The method the result answers (named in the text when there is no tool).
    pub method: String,
    pub hints: ToolHints,
}

/// Why a result was withheld.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OutputKind {
    /// It carried secrets and `secrets = "block"`: the kinds found.
    Withheld(Vec<String>),
    /// `structuredContent` does not match the tool's `outputSchema`; `sanitized`
    /// when it did before the sanitizer changed it.
    SchemaViolation {
        violations: Vec<crate::validate::Violation>,
        sanitized: bool,
    },
    /// Larger than the official SDK clients accept in one message, even with
    /// its texts cut and its `structuredContent` left out (or its
    /// `structuredContent` had to be left out and the tool has an
    /// `outputSchema`): the size it would have had and the limit.
    TooLarge { bytes: usize, limit: usize },
    /// Its keys, short values and blocks alone exceed `max_output_bytes`
    /// (no cut of its texts brings it under): its size as the bound measures
    /// it, and the limit.
    OverBound { bytes: usize, limit: usize },
}

/// Longest upstream snippet quoted in a gateway text, in characters.
pub(crate) const SNIPPET_CHARS: usize = 300;

/// The upstream's words made fit to quote: whitespace runs folded to one
/// space, cut at [`SNIPPET_CHARS`] with an ellipsis. The caller sanitizes first;
/// a byte order mark, which the sanitizer keeps at the start of a text, is
/// dropped here because a quote puts it in the middle of the gateway's text.
pub(crate) fn snippet(text: &str) -> Option<String> {
    let folded = text
        .split_whitespace()
        .map(crate::sanitize::unbom)
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if folded.is_empty() {
        return None;
    }
    if folded.chars().count() <= SNIPPET_CHARS {
        return Some(folded);
    }
    let mut cut: String = folded.chars().take(SNIPPET_CHARS).collect();
    cut.push('…');
    Some(cut)
}

/// What rendering needs to know about the request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenderCtx<'a> {
    pub id: Option<&'a Value>,
    pub era: Era,
}

impl Source {
    /// Label for logs and metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::Client => "client",
            Source::Policy => "policy",
            Source::Upstream => "upstream",
        }
    }
}

/// Stable code of a rate-limit refusal.
pub(super) const RATE_LIMITED: &str = "rate_limited";
pub(super) const NON_CANONICAL_URI: &str = "non_canonical_uri";

// === impl Rejection ===

impl Rejection {
    /// Who is to blame.
    pub(crate) fn source(&self) -> Source {
        match self {
            Rejection::Forbidden(_)
            | Rejection::UnknownServer(_)
            | Rejection::MethodNotAllowed(_)
            | Rejection::Unauthenticated(_)
            | Rejection::TooLarge(_)
            | Rejection::Malformed(_)
            | Rejection::HeaderMismatch(_)
            | Rejection::UnsupportedVersion { .. }
            | Rejection::InvalidParams(_)
            | Rejection::MethodNotFound(_)
            | Rejection::TooLong(_)
            | Rejection::SessionNotFound
            | Rejection::NonCanonicalUri { .. }
            | Rejection::SecretInParams(_)
            | Rejection::UnknownApprovalAnswer => Source::Client,
            Rejection::UnknownTask | Rejection::StateUnavailable(_) => Source::Policy,
            Rejection::NotFound(_)
            | Rejection::Tool(_)
            | Rejection::Use(_)
            | Rejection::RateLimited(_) => Source::Policy,
            Rejection::Upstream(_) | Rejection::Output(_) => Source::Upstream,
        }
    }

    /// Stable label for logs, metrics and audit.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Rejection::Forbidden(_) => "forbidden",
            Rejection::UnknownServer(_) => "unknown_server",
            Rejection::MethodNotAllowed(_) => "method_not_allowed",
            Rejection::Unauthenticated(AuthRefusal {
                error: AuthError::InsufficientScope(_),
                ..
            }) => "insufficient_scope",
            Rejection::Unauthenticated(_) => "unauthenticated",
            Rejection::TooLarge(_) => "request_too_large",
            Rejection::Malformed(ClassifyError::Batch) => "batch",
            Rejection::Malformed(ClassifyError::TooDeep(_)) => "too_deep",
            Rejection::Malformed(_) => "malformed",
            Rejection::HeaderMismatch(_) => "header_mismatch",
            Rejection::UnsupportedVersion { .. } => "unsupported_version",
            Rejection::InvalidParams(_) => "invalid_params",
            Rejection::MethodNotFound(_) => "method_not_found",
            Rejection::SessionNotFound => "session_not_found",
            Rejection::UnknownTask => "unknown_task",
            Rejection::StateUnavailable(_) => "state_unavailable",
            Rejection::SecretInParams(_) => "argument_not_permitted",
            Rejection::NotFound(_) => "not_found",
            Rejection::Tool(t) | Rejection::Use(t) => t.code,
            Rejection::RateLimited(_) => RATE_LIMITED,
            Rejection::Upstream(u) => u.kind.code(),
            Rejection::Output(o) => o.kind.code(),
            Rejection::TooLong(_) => "identifier_too_long",
            Rejection::NonCanonicalUri { .. } => NON_CANONICAL_URI,
            Rejection::UnknownApprovalAnswer => "approval_answer_unknown",
        }
    }
}
