//! Every refusal and failure the gateway answers with, and the one place that
//! turns them into HTTP responses.
//!
//! Place in the path: any stage may stop a request with a [`Rejection`];
//! [`Rejection::into_response`] renders it as an HTTP error with a JSON-RPC
//! error body, or — for what happens to a `tools/call` — as a `CallToolResult`
//! with `isError: true` that a model can act on, explained by
//! `_meta["portcullis/error"]`.
//!
//! Invariants: rendering happens here and nowhere else; every rendering carries
//! a stable code; gateway-made text never embeds raw upstream bodies; the
//! gateway's own JSON-RPC codes lie outside -32768…-32000.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use crate::auth::{AuthError, AuthRefusal};
use crate::mcp::META_GATEWAY_ERROR;
use crate::mcp::jsonrpc::{self, ClassifyError};
use crate::mcp::limits::Overlong;
use crate::mcp::version::{self, Era};
use crate::policy::uri::UriRefusal;
use crate::policy::{Rate, RateKey};
use crate::ratelimit::{ceil_millis, ceil_secs};

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
    /// The listener is at `max_connections`.
    pub(crate) const OVERLOADED: i64 = -31012;
    /// A client's JSON-RPC response names an approval question (its id has
    /// the gateway's question form) that is not open for this client and session.
    pub(crate) const APPROVAL_ANSWER_UNKNOWN: i64 = -31020;
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
            Rejection::UnknownTask => Source::Policy,
            Rejection::NotFound(_) | Rejection::Tool(_) | Rejection::RateLimited(_) => {
                Source::Policy
            }
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
            Rejection::SecretInParams(_) => "argument_not_permitted",
            Rejection::NotFound(_) => "not_found",
            Rejection::Tool(t) => t.code,
            Rejection::RateLimited(_) => RATE_LIMITED,
            Rejection::Upstream(u) => u.kind.code(),
            Rejection::Output(o) => o.kind.code(),
            Rejection::TooLong(_) => "identifier_too_long",
            Rejection::NonCanonicalUri { .. } => NON_CANONICAL_URI,
            Rejection::UnknownApprovalAnswer => "approval_answer_unknown",
        }
    }

    /// The HTTP response.
    pub(crate) fn into_response(self, cx: RenderCtx<'_>) -> Response {
        let id = cx.id;
        match self {
            Rejection::Forbidden(why) => {
                error_response(StatusCode::FORBIDDEN, id, codes::FORBIDDEN, &why, None)
            }
            Rejection::UnknownServer(name) => error_response(
                StatusCode::NOT_FOUND,
                id,
                codes::NOT_FOUND,
                &format!("no MCP server named {name:?} is served here"),
                None,
            ),
            Rejection::MethodNotAllowed(allow) => {
                let mut r = error_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    id,
                    codes::NOT_FOUND,
                    &format!("this endpoint accepts {allow}"),
                    None,
                );
                if let Ok(v) = HeaderValue::from_str(allow) {
                    r.headers_mut().insert(header::ALLOW, v);
                }
                r
            }
            Rejection::Unauthenticated(AuthRefusal {
                error,
                resource_metadata,
                scope,
            }) => {
                let (status, code) = match error {
                    AuthError::InsufficientScope(_) => (StatusCode::FORBIDDEN, codes::FORBIDDEN),
                    _ => (StatusCode::UNAUTHORIZED, codes::UNAUTHENTICATED),
                };
                let mut r = error_response(status, id, code, &error.to_string(), None);
                // RFC 6750 §3 challenge; RFC 9728 §5.1 adds where the metadata is.
                let mut params = Vec::new();
                match &error {
                    AuthError::Missing => {}
                    AuthError::Invalid => params.push("error=\"invalid_token\"".to_owned()),
                    AuthError::InsufficientScope(_) => {
                        params.push("error=\"insufficient_scope\"".to_owned())
                    }
                }
                if let Some(scope) = scope {
                    params.push(format!("scope=\"{scope}\""));
                }
                if let Some(url) = resource_metadata {
                    params.push(format!("resource_metadata=\"{url}\""));
                }
                let challenge = match params.is_empty() {
                    true => "Bearer".to_owned(),
                    false => format!("Bearer {}", params.join(", ")),
                };
                if let Ok(v) = HeaderValue::from_str(&challenge) {
                    r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
                }
                r
            }
            Rejection::TooLarge(limit) => error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                id,
                codes::TOO_LARGE,
                &format!("the request body is larger than {limit} bytes"),
                None,
            ),
            Rejection::Malformed(e) => {
                error_response(StatusCode::BAD_REQUEST, id, e.code(), &e.to_string(), None)
            }
            Rejection::HeaderMismatch(why) => error_response(
                StatusCode::BAD_REQUEST,
                id,
                jsonrpc::HEADER_MISMATCH,
                &why,
                None,
            ),
            Rejection::UnsupportedVersion { requested, era } => {
                // A client negotiating through `_meta` can only use the stateless-era versions.
                let supported = match era {
                    Era::Modern => version::MODERN.to_vec(),
                    Era::Legacy => version::supported(),
                };
                error_response(
                    StatusCode::BAD_REQUEST,
                    id,
                    jsonrpc::UNSUPPORTED_VERSION,
                    &format!("protocol version {requested:?} is not supported"),
                    Some(json!({"supported": supported, "requested": requested})),
                )
            }
            Rejection::InvalidParams(why) => error_response(
                StatusCode::BAD_REQUEST,
                id,
                jsonrpc::INVALID_PARAMS,
                &why,
                None,
            ),
            Rejection::MethodNotFound(method) => error_response(
                // 2026-07-28: 404 with -32601. Before it, a request's error is
                // a JSON-RPC answer (200); a notification the server does not
                // accept gets an HTTP error status (400).
                match (cx.era, id) {
                    (Era::Modern, _) => StatusCode::NOT_FOUND,
                    (Era::Legacy, Some(_)) => StatusCode::OK,
                    (Era::Legacy, None) => StatusCode::BAD_REQUEST,
                },
                id,
                jsonrpc::METHOD_NOT_FOUND,
                // The client's own name, quoted and cut: it may be anything.
                &format!(
                    "Method not found: {:?}. This gateway serves the methods of the MCP \
                     specification for the request's protocol version, and those its operator names in [methods]",
                    method.chars().take(128).collect::<String>()
                ),
                None,
            ),
            Rejection::SessionNotFound => error_response(
                StatusCode::NOT_FOUND,
                id,
                codes::SESSION_NOT_FOUND,
                "session not found: start a new session with initialize",
                None,
            ),
            Rejection::NotFound(what) => {
                error_response(StatusCode::OK, id, jsonrpc::INVALID_PARAMS, &what, None)
            }
            // The words an upstream gives an unknown task (the spec's example).
            Rejection::UnknownTask => error_response(
                StatusCode::OK,
                id,
                jsonrpc::INVALID_PARAMS,
                "Failed to retrieve task: Task not found",
                None,
            ),
            Rejection::SecretInParams(s) => {
                let (text, data) = secret_in_params(&s);
                let status = match s.request {
                    true => StatusCode::OK,
                    false => StatusCode::BAD_REQUEST,
                };
                error_response(status, id, jsonrpc::INVALID_PARAMS, &text, Some(data))
            }
            Rejection::Tool(t) => tool_result(cx, t.code, t.text, t.detail),
            Rejection::UnknownApprovalAnswer => error_response(
                StatusCode::BAD_REQUEST,
                None,
                codes::APPROVAL_ANSWER_UNKNOWN,
                "this response answers no approval question open for this session: the question was answered \
                 already, expired, or was never asked here; nothing was forwarded",
                Some(json!({"code": "approval_answer_unknown"})),
            ),
            Rejection::RateLimited(r) => {
                let mut response = match &r.subject {
                    Limited::Tool(_) => tool_result(cx, RATE_LIMITED, r.text(), r.detail()),
                    Limited::Resource(_) | Limited::Prompt(_) => {
                        let mut data = r.detail();
                        data.insert("code".into(), RATE_LIMITED.into());
                        error_response(
                            StatusCode::OK,
                            id,
                            codes::RATE_LIMITED,
                            &r.text(),
                            Some(Value::Object(data)),
                        )
                    }
                };
                response.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(ceil_secs(r.retry_after)),
                );
                response
            }
            Rejection::Output(o) if o.tool.is_some() => {
                tool_result(cx, o.kind.code(), o.text(), o.detail())
            }
            Rejection::Output(o) => {
                let mut data = o.detail();
                data.insert("code".into(), o.kind.code().into());
                error_response(
                    StatusCode::OK,
                    id,
                    codes::OUTPUT_REFUSED,
                    &o.text(),
                    Some(Value::Object(data)),
                )
            }
            Rejection::TooLong(o) => error_response(
                StatusCode::BAD_REQUEST,
                id,
                jsonrpc::INVALID_PARAMS,
                &format!(
                    "`{}` is {} bytes long; this gateway accepts at most {} bytes there, so nothing was \
                     forwarded. Send the exact, shorter identifier the server lists.",
                    o.field, o.length, o.limit
                ),
                Some(json!({"code": "identifier_too_long", "field": o.field, "limit": o.limit})),
            ),
            Rejection::NonCanonicalUri { uri, why } => {
                let message = format!(
                    "The resource URI {uri:?} is refused for its spelling, so nothing was read: {why}. \
                     Send the URI in its plain form (no encoded `/`, `\\` or `.`, no `..` above the root, \
                     each character encoded at most once)."
                );
                error_response(
                    StatusCode::BAD_REQUEST,
                    id,
                    codes::NON_CANONICAL_URI,
                    &message,
                    Some(json!({"code": NON_CANONICAL_URI, "uri": uri, "reason": why.to_string()})),
                )
            }
            Rejection::Upstream(u) => match &u.tool {
                // A refusal is the upstream's transport answer, for a call as for any request.
                _ if matches!(u.kind, UpstreamKind::Refused(_)) => u.refusal_response(id),
                Some(_) => tool_result(cx, u.kind.code(), u.text(), u.detail()),
                None => {
                    let status = match u.kind {
                        UpstreamKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
                        _ => StatusCode::BAD_GATEWAY,
                    };
                    error_response(status, id, u.kind.json_rpc_code(), &u.text(), None)
                }
            },
        }
    }

    /// The isError result message (not the HTTP response) for a tools/call, used
    /// when a failure has to be written into an SSE stream that already started.
    pub(crate) fn tool_message(&self, cx: RenderCtx<'_>) -> Option<Value> {
        match self {
            Rejection::Tool(t) => Some(tool_message(cx, t.code, &t.text, t.detail.clone())),
            Rejection::Output(o) if o.tool.is_some() => {
                Some(tool_message(cx, o.kind.code(), &o.text(), o.detail()))
            }
            Rejection::RateLimited(r) if matches!(r.subject, Limited::Tool(_)) => {
                Some(tool_message(cx, RATE_LIMITED, &r.text(), r.detail()))
            }
            Rejection::Upstream(u) if u.tool.is_some() => {
                Some(tool_message(cx, u.kind.code(), &u.text(), u.detail()))
            }
            _ => None,
        }
    }

    /// The JSON-RPC message (not the HTTP response) answering the request, for
    /// a stream that already started: the isError result of a `tools/call`,
    /// else a JSON-RPC error. `None` for refusals that only exist as HTTP
    /// answers (they never happen once a stream has started).
    pub(crate) fn rpc_message(&self, cx: RenderCtx<'_>) -> Option<Value> {
        if let Some(m) = self.tool_message(cx) {
            return Some(m);
        }
        match self {
            Rejection::Output(o) => {
                let mut data = o.detail();
                data.insert("code".into(), o.kind.code().into());
                Some(jsonrpc::error(
                    cx.id,
                    codes::OUTPUT_REFUSED,
                    &o.text(),
                    Some(Value::Object(data)),
                ))
            }
            Rejection::Upstream(u) => Some(jsonrpc::error(
                cx.id,
                u.kind.json_rpc_code(),
                &u.text(),
                None,
            )),
            _ => None,
        }
    }
}

/// A call refused because its arguments carry secrets (`[sanitize] arguments
/// = "block"`): each finding as (JSON pointer, kind). Never a value.
pub(crate) fn secret_in_arguments(tool: &str, found: &[(String, String)]) -> Rejection {
    let mut text = format!(
        "The arguments for `{tool}` contain what looks like a credential, so the gateway did not send them and the tool was not run:"
    );
    for (pointer, kind) in found {
        let at = if pointer.is_empty() {
            "(the arguments)"
        } else {
            pointer
        };
        text.push_str(&format!("\n- {at}: {kind}"));
    }
    text.push_str(
        "\nSending secrets to a tool is refused so that they cannot leave through it. Remove the credential \
         from the arguments and call again; retrying the same arguments will be refused again. If the tool \
         really needs it, an operator can exempt the tool (`[[sanitize.exemptions]]` with `skip = [\"arguments\"]`).",
    );
    let mut detail = serde_json::Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert(
        "secrets".into(),
        Value::Array(
            found
                .iter()
                .map(|(pointer, kind)| json!({"pointer": pointer, "kind": kind}))
                .collect(),
        ),
    );
    Rejection::Tool(ToolRefusal {
        code: "argument_not_permitted",
        text,
        detail,
    })
}

/// The words and data of a [`Rejection::SecretInParams`].
fn secret_in_params(s: &SecretFound) -> (String, Value) {
    let mut text = format!(
        "The {} message carries what looks like a credential, so the gateway did not send it upstream:",
        s.method
    );
    for (pointer, kind) in &s.found {
        let at = if pointer.is_empty() {
            "(the message)"
        } else {
            pointer
        };
        text.push_str(&format!("\n- {at}: {kind}"));
    }
    text.push_str(
        "\nSending secrets upstream is refused so that they cannot leave through a server. Remove the credential \
         and send the message again; sending it unchanged will be refused again.",
    );
    let secrets: Vec<Value> = s
        .found
        .iter()
        .map(|(pointer, kind)| json!({"pointer": pointer, "kind": kind}))
        .collect();
    let data = json!({"code": "argument_not_permitted", "method": s.method, "secrets": secrets});
    (text, data)
}

/// A `tools/call` whose params outside `arguments` (`_meta`, the name, a
/// key, …) carry secrets: the `argument_not_permitted` isError result.
pub(crate) fn secret_in_call(tool: &str, found: &[(String, String)]) -> Rejection {
    let mut text = format!(
        "The call to `{tool}` carries what looks like a credential, so the gateway did not send it and the tool was not run:"
    );
    for (pointer, kind) in found {
        text.push_str(&format!("\n- {pointer}: {kind}"));
    }
    text.push_str(
        "\nSending secrets to a tool is refused so that they cannot leave through it. Remove the credential \
         and call again; retrying the same call will be refused again.",
    );
    let mut detail = serde_json::Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert(
        "secrets".into(),
        Value::Array(
            found
                .iter()
                .map(|(pointer, kind)| json!({"pointer": pointer, "kind": kind}))
                .collect(),
        ),
    );
    Rejection::Tool(ToolRefusal {
        code: "argument_not_permitted",
        text,
        detail,
    })
}

// === impl RateLimited ===

/// Stable code of a rate-limit refusal.
const RATE_LIMITED: &str = "rate_limited";
const NON_CANONICAL_URI: &str = "non_canonical_uri";

impl RateLimited {
    /// "Rate limit for `echo` reached for client `bob`: 3 calls, then 1 every 20 s. Retry after 7.4 s."
    fn text(&self) -> String {
        let what = match &self.subject {
            Limited::Tool(name) => format!("`{name}`"),
            Limited::Resource(uri) => format!("the resource `{uri}`"),
            Limited::Prompt(name) => format!("the prompt `{name}`"),
        };
        let wait = wait_text(self.retry_after);
        let Some(limit) = &self.limit else {
            return format!(
                "The rate limit for {what} cannot be checked right now (the gateway cannot reach its \
                 rate-limit store), so the call was not run. Retry after {wait}."
            );
        };
        let quota = limit.rate.quota_text();
        match limit.rate.key {
            RateKey::ClientTool => format!(
                "Rate limit for {what} reached for client `{}`: {quota}. Retry after {wait}.",
                self.client
            ),
            RateKey::Client => {
                let own = match &self.subject {
                    Limited::Tool(n) | Limited::Resource(n) | Limited::Prompt(n) => n,
                };
                let shared = if limit.shared_by.len() == 1 && limit.shared_by[0] == *own {
                    String::new()
                } else {
                    let names: Vec<String> =
                        limit.shared_by.iter().map(|p| format!("`{p}`")).collect();
                    format!(", counted together for {}", names.join(", "))
                };
                format!(
                    "Rate limit for {what} reached for client `{}`: {quota}{shared}. Retry after {wait}.",
                    self.client
                )
            }
            RateKey::All => format!(
                "Rate limit for {what} reached: {quota}, shared by all clients. Retry after {wait}."
            ),
        }
    }

    /// `_meta["portcullis/error"]` fields besides `code`.
    fn detail(&self) -> serde_json::Map<String, Value> {
        let mut detail = serde_json::Map::new();
        let (kind, name) = match &self.subject {
            Limited::Tool(n) => ("tool", n),
            Limited::Resource(n) => ("resource", n),
            Limited::Prompt(n) => ("prompt", n),
        };
        detail.insert(kind.into(), name.clone().into());
        detail.insert("client".into(), self.client.clone().into());
        let limit = match &self.limit {
            Some(l) => json!({
                "rule": format!("rules[{}]", l.rule),
                "burst": l.rate.burst.get(),
                "per_second": l.rate.per_second,
                "key": match l.rate.key {
                    RateKey::Client => "client",
                    RateKey::ClientTool => "client+tool",
                    RateKey::All => "all",
                },
                "text": l.rate.describe(),
            }),
            None => {
                detail.insert("reason".into(), "backend_unavailable".into());
                Value::Null
            }
        };
        detail.insert("limit".into(), limit);
        detail.insert(
            "retry_after_ms".into(),
            ceil_millis(self.retry_after).into(),
        );
        detail
    }
}

/// A wait for a model to read, rounded up so that waiting that long is enough:
/// tenths of a second below a minute, then seconds, then minutes.
fn wait_text(d: Duration) -> String {
    let tenths = d.as_nanos().div_ceil(100_000_000);
    if tenths < 600 {
        return if tenths.is_multiple_of(10) {
            format!("{} s", tenths / 10)
        } else {
            format!("{}.{} s", tenths / 10, tenths % 10)
        };
    }
    let secs = ceil_secs(d);
    if secs < 3600 {
        return match secs % 60 {
            0 => format!("{} min", secs / 60),
            s => format!("{} min {s} s", secs / 60),
        };
    }
    let mins = secs.div_ceil(60);
    match mins % 60 {
        0 => format!("{} h", mins / 60),
        m => format!("{} h {m} min", mins / 60),
    }
}

// === impl UpstreamFailure ===

impl UpstreamFailure {
    /// A failure of `kind` on `server` (and `tool`, for `tools/call`).
    pub(crate) fn new(
        kind: UpstreamKind,
        server: &str,
        tool: Option<&str>,
        reason: String,
    ) -> Self {
        Self {
            kind,
            server: server.into(),
            tool: tool.map(str::to_owned),
            reason,
            snippet: None,
            not_run: false,
            unchecked: false,
            hints: ToolHints::default(),
            relayed: None,
        }
    }

    fn detail(&self) -> serde_json::Map<String, Value> {
        let mut detail = serde_json::Map::new();
        detail.insert("server".into(), self.server.to_string().into());
        if let Some(tool) = &self.tool {
            detail.insert("tool".into(), tool.clone().into());
        }
        if let UpstreamKind::Error(e) = self.kind {
            detail.insert("upstream_code".into(), e.code.into());
        }
        if let Some(snippet) = &self.snippet {
            detail.insert("upstream_text".into(), snippet.clone().into());
        }
        detail.insert("retry".into(), self.retry().into());
        detail
    }

    /// Machine-readable retry advice: `safe`, `check_first`, `later` or `no`.
    fn retry(&self) -> &'static str {
        let safe = self.hints.read_only || self.hints.idempotent;
        match self.kind {
            _ if self.unchecked => "later",
            UpstreamKind::Error(RpcError { code: -32602, .. }) => "no",
            UpstreamKind::Unavailable if self.not_run => "later",
            UpstreamKind::Refused(_) => "no",
            _ if safe => "safe",
            _ => "check_first",
        }
    }

    fn text(&self) -> String {
        let Some(tool) = &self.tool else {
            return self.method_text();
        };
        let server = &self.server;
        let said = match &self.snippet {
            Some(s) => format!(" (its reply said: \"{s}\")"),
            None => String::new(),
        };
        let quoted = match &self.snippet {
            Some(s) => format!(": \"{s}\""),
            None => String::new(),
        };
        let again = self.hints.if_it_ran(tool);
        if self.unchecked {
            return format!(
                "The gateway could not get the tool list of server `{server}`, which it needs to check the call of \
                 `{tool}`: {}{said}. The tool was not run. Retrying later may help; if it keeps failing, report that \
                 the server is unavailable.",
                self.reason
            );
        }
        match self.kind {
            UpstreamKind::Unavailable if self.not_run => format!(
                "The gateway could not reach server `{server}` to run `{tool}`: {}. The arguments were valid, and \
                 the tool did not run. Retrying later may help; if it keeps failing, report that the server is unavailable.",
                self.reason
            ),
            UpstreamKind::Unavailable => format!(
                "Server `{server}` failed while handling the call to `{tool}`: {}{said}. The arguments were valid. \
                 The call may or may not have run. Retrying later may help: {again}",
                self.reason
            ),
            UpstreamKind::Timeout => format!(
                "The gateway stopped waiting for `{tool}` on server `{server}`: {}. The arguments were valid. The call \
                 may still have run, or may still be running, on the server: {again}",
                self.reason
            ),
            UpstreamKind::Protocol => format!(
                "The gateway could not read the reply of server `{server}` to the call of `{tool}`: {}{said}. The \
                 arguments were valid, and the call may have run: {again}",
                self.reason
            ),
            UpstreamKind::Refused(status) => format!(
                "Server `{server}` refused the call of `{tool}` with HTTP {}{said}. The tool did not run.",
                status_words(status)
            ),
            UpstreamKind::Error(RpcError {
                unknown_tool: true, ..
            }) => format!(
                "Server `{server}` answered that it has no tool `{tool}`{said}, although it listed it before: its tools \
                 have changed. The arguments were valid and nothing was run. List the tools again (tools/list) and \
                 call one that is listed."
            ),
            UpstreamKind::Error(RpcError { code: -32602, .. }) => format!(
                "Server `{server}` refused the arguments for `{tool}` with JSON-RPC error -32602 (invalid params){quoted}, \
                 although they match the tool's published input schema: the server checks more than its schema says. \
                 The tool did not run. Retrying the same arguments will not help; change them as the server's message says."
            ),
            UpstreamKind::Error(RpcError { code, .. }) => format!(
                "The tool `{tool}` on server `{server}` failed with JSON-RPC error {code} ({}){quoted}. The arguments were \
                 valid for the tool's input schema, so the fault is on the server's side. {}",
                rpc_name(code),
                self.hints.after_failure(tool)
            ),
            UpstreamKind::ToolFailed(ToolFailure::Opaque) => format!(
                "The tool `{tool}` on server `{server}` failed without saying why: the server's SDK reported only \
                 \"Error executing tool {tool}\" (the cause is in the server's own log). The arguments were valid for \
                 the tool's input schema, so they are not the cause. {}",
                self.hints.after_failure(tool)
            ),
            UpstreamKind::ToolFailed(ToolFailure::Message) => {
                let message = match &self.snippet {
                    Some(s) => format!(": \"{s}\""),
                    None => " without a message".to_owned(),
                };
                format!(
                    "The tool `{tool}` on server `{server}` reported an error{message}. The arguments were valid for the \
                     tool's input schema; the message says what went wrong on the server's side. {}",
                    self.hints.after_failure(tool)
                )
            }
        }
    }

    /// The text of a failure of another method (an HTTP error, not a tool result).
    fn method_text(&self) -> String {
        let server = &self.server;
        match self.kind {
            UpstreamKind::Timeout => format!(
                "The gateway stopped waiting for server `{server}`: {}. The request may still have run.",
                self.reason
            ),
            UpstreamKind::Protocol => format!(
                "The gateway could not read the reply of server `{server}`: {}. The request may have run.",
                self.reason
            ),
            UpstreamKind::Refused(status) => {
                let said = match &self.snippet {
                    Some(s) => format!(" (its reply said: \"{s}\")"),
                    None => String::new(),
                };
                format!(
                    "Server `{server}` refused the request with HTTP {}{said}. It did not run.",
                    status_words(status)
                )
            }
            _ => format!(
                "The gateway could not get an answer from server `{server}`: {}. Retrying later may help; if it keeps \
                 failing, report that the server is unavailable.",
                self.reason
            ),
        }
    }
}

impl UpstreamFailure {
    /// An upstream's HTTP refusal as the client gets it: the upstream's status,
    /// and its own JSON-RPC error (sanitized) under the request's id, or, when
    /// it sent none, the gateway's words for the refusal.
    fn refusal_response(&self, id: Option<&Value>) -> Response {
        let UpstreamKind::Refused(status) = self.kind else {
            return error_response(
                StatusCode::BAD_GATEWAY,
                id,
                self.kind.json_rpc_code(),
                &self.text(),
                None,
            );
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        match &self.relayed {
            Some(error) => {
                let mut message = serde_json::Map::new();
                message.insert("jsonrpc".into(), "2.0".into());
                if let Some(id) = id {
                    message.insert("id".into(), id.clone());
                }
                message.insert("error".into(), (**error).clone());
                json_response(status, &Value::Object(message))
            }
            None => {
                let mut data = self.detail();
                data.insert("code".into(), self.kind.code().into());
                data.insert("upstream_status".into(), status.as_u16().into());
                error_response(
                    status,
                    id,
                    codes::UPSTREAM_REFUSED,
                    &self.text(),
                    Some(Value::Object(data)),
                )
            }
        }
    }
}

/// `405 Method Not Allowed`, or the bare number when it has no reason phrase.
pub(crate) fn status_words(status: u16) -> String {
    match StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
    {
        Some(reason) => format!("{status} {reason}"),
        None => status.to_string(),
    }
}

impl ToolHints {
    /// Advice when the call may have run.
    fn if_it_ran(&self, tool: &str) -> String {
        if self.read_only {
            format!("`{tool}` is marked read-only, so retrying is safe.")
        } else if self.idempotent {
            format!("`{tool}` is marked idempotent, so retrying is safe.")
        } else {
            format!(
                "`{tool}` is not marked idempotent, so check whether the call took effect before retrying, or it may run twice."
            )
        }
    }

    /// Advice when the tool ran and reported a failure.
    fn after_failure(&self, tool: &str) -> String {
        if self.read_only || self.idempotent {
            let why = if self.read_only {
                "read-only"
            } else {
                "idempotent"
            };
            format!(
                "Retrying helps only if the cause was temporary; `{tool}` is marked {why}, so a retry is safe."
            )
        } else {
            format!(
                "Retry only if the cause was temporary: `{tool}` is not marked idempotent and may have done part of its \
                 work, so check its effect first."
            )
        }
    }
}

fn rpc_name(code: i64) -> &'static str {
    match code {
        -32700 => "parse error",
        -32600 => "invalid request",
        -32601 => "method not found",
        -32602 => "invalid params",
        -32603 => "internal error",
        -32099..=-32000 => "server error",
        _ => "an error code of the server's own",
    }
}

impl UpstreamKind {
    pub(crate) fn code(self) -> &'static str {
        match self {
            UpstreamKind::Unavailable => "upstream_unavailable",
            UpstreamKind::Timeout => "upstream_timeout",
            UpstreamKind::Protocol => "upstream_protocol_error",
            UpstreamKind::Error(_) => "upstream_error",
            UpstreamKind::ToolFailed(_) => "upstream_tool_failed",
            UpstreamKind::Refused(_) => "upstream_refused",
        }
    }

    fn json_rpc_code(self) -> i64 {
        match self {
            UpstreamKind::Timeout => codes::UPSTREAM_TIMEOUT,
            UpstreamKind::Protocol => codes::UPSTREAM_PROTOCOL,
            UpstreamKind::Refused(_) => codes::UPSTREAM_REFUSED,
            _ => codes::UPSTREAM_UNAVAILABLE,
        }
    }
}

// === impl OutputRefusal ===

impl OutputKind {
    fn code(&self) -> &'static str {
        match self {
            OutputKind::Withheld(_) => "output_withheld",
            OutputKind::SchemaViolation { .. } => "output_schema_violation",
            OutputKind::TooLarge { .. } => "output_too_large",
        }
    }
}

impl OutputRefusal {
    fn detail(&self) -> serde_json::Map<String, Value> {
        let mut detail = serde_json::Map::new();
        detail.insert("server".into(), self.server.clone().into());
        match &self.tool {
            Some(tool) => detail.insert("tool".into(), tool.clone().into()),
            None => detail.insert("method".into(), self.method.clone().into()),
        };
        match &self.kind {
            OutputKind::Withheld(kinds) => {
                detail.insert("secrets".into(), json!(kinds));
            }
            OutputKind::SchemaViolation { violations, .. } => {
                detail.insert("violations".into(), json!(violations));
            }
            OutputKind::TooLarge { bytes, limit } => {
                detail.insert("bytes".into(), json!(bytes));
                detail.insert("limit".into(), json!(limit));
            }
        }
        detail
    }

    fn text(&self) -> String {
        let server = &self.server;
        let tool = match &self.tool {
            Some(tool) => format!("`{tool}`"),
            None => format!("this `{}` request", self.method),
        };
        let ran = if self.tool.is_some() {
            "The arguments were valid and the tool did run, so its effects stand."
        } else {
            "The request was valid and the server did answer it."
        };
        match &self.kind {
            OutputKind::TooLarge { bytes, limit } => format!(
                "The result of {tool} on server `{server}` was withheld: it would be a message of {bytes} bytes, \
                 and MCP clients accept at most {limit} bytes in one message (the gateway already cut its texts \
                 and could not leave out enough). {ran} Retrying will return the same; ask for less (a narrower \
                 query, fewer items, a page of the data), or ask an operator."
            ),
            OutputKind::Withheld(kinds) => {
                let what = if kinds.len() == 1 {
                    "a credential-like value"
                } else {
                    "credential-like values"
                };
                format!(
                    "The result of {tool} on server `{server}` was withheld: it contained {what} ({}), and this \
                     gateway withholds results that carry secrets. {ran} Retrying will return the same secret; ask \
                     for output that leaves it out (a narrower query, other fields), or ask an operator.",
                    kinds.join(", ")
                )
            }
            OutputKind::SchemaViolation {
                violations,
                sanitized,
            } => {
                let mut text = format!(
                    "The result of {tool} on server `{server}` does not match the tool's output schema{}, so it was withheld:",
                    if *sanitized {
                        " once the gateway removed unsafe content from it"
                    } else {
                        ""
                    }
                );
                for v in violations {
                    text.push_str("\n- ");
                    text.push_str(&v.line());
                }
                text.push_str(
                    "\nThe arguments were valid and the tool did run. Retrying will most likely return the same \
                     result; report the mismatch to the server's operator.",
                );
                text
            }
        }
    }
}

fn tool_message(
    cx: RenderCtx<'_>,
    code: &str,
    text: &str,
    detail: serde_json::Map<String, Value>,
) -> Value {
    let mut error = serde_json::Map::new();
    error.insert("code".into(), code.into());
    error.extend(detail);
    let mut result = json!({
        "content": [{"type": "text", "text": text}],
        "isError": true,
        "_meta": {META_GATEWAY_ERROR: Value::Object(error)},
    });
    if cx.era == Era::Modern {
        result["resultType"] = "complete".into();
    }
    jsonrpc::result(cx.id.unwrap_or(&Value::Null), result)
}

fn tool_result(
    cx: RenderCtx<'_>,
    code: &str,
    text: String,
    detail: serde_json::Map<String, Value>,
) -> Response {
    json_response(StatusCode::OK, &tool_message(cx, code, &text, detail))
}

fn error_response(
    status: StatusCode,
    id: Option<&Value>,
    code: i64,
    message: &str,
    data: Option<Value>,
) -> Response {
    json_response(status, &jsonrpc::error(id, code, message, data))
}

/// The answer to a connection past `[gateway] max_connections`: 503 with
/// `Retry-After` (whole seconds, at least one) and a JSON-RPC error without id.
pub(crate) fn overloaded(max_connections: usize, retry_after: Duration) -> Response {
    let mut r = error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        None,
        codes::OVERLOADED,
        &format!(
            "the gateway has {max_connections} connections open, its limit \
             ([gateway] max_connections); retry after {} s",
            ceil_secs(retry_after).max(1)
        ),
        Some(json!({"max_connections": max_connections})),
    );
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(ceil_secs(retry_after).max(1)),
    );
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A JSON body with the given status.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A call a rule marks for approval that is not run (see
/// [`crate::approval::Refusal`]): the isError result, with its code and the
/// approval's facts in `_meta["portcullis/error"]`.
pub(crate) fn approval_refused(
    tool: &str,
    server: &str,
    refusal: &crate::approval::Refusal,
) -> Rejection {
    use crate::approval::Refusal as R;
    let call = format!("The call to `{tool}` on server `{server}`");
    let mut detail = serde_json::Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("server".into(), server.into());
    let (code, text) = match refusal {
        R::CannotAsk => (
            "approval_unavailable",
            format!(
                "{call} runs only after the user approves it, and this client cannot be asked: it did not declare \
                 the elicitation capability (form mode; at `initialize` in the 2025 protocol era, in \
                 `_meta[\"io.modelcontextprotocol/clientCapabilities\"]` of each request in 2026-07-28). Nothing was run. \
                 Use a client that supports elicitation, or ask the gateway's operator to let an operator approve \
                 these calls (`approval = {{ by = \"operator\" }}` or `\"either\"` on the rule): such calls wait in the \
                 dashboard's approval queue and are approved there or with POST /api/approvals/<id>/approve on the \
                 admin listener."
            ),
        ),
        R::Declined { by } => {
            detail.insert("by".into(), (*by).into());
            (
                "approval_declined",
                format!(
                    "{call} was not approved (the user declined or did not confirm), so nothing was run. Do not \
                     retry it unless the user asks for it; calling again asks again."
                ),
            )
        }
        R::Denied { id, by } => {
            detail.insert("approval_id".into(), id.as_str().into());
            detail.insert("denied_by".into(), by.as_str().into());
            (
                "approval_denied",
                format!(
                    "{call} was denied by an operator (approval {id}), so nothing was run. Do not retry it; tell \
                     the user it was denied."
                ),
            )
        }
        R::Expired { by, timeout } => {
            detail.insert("by".into(), (*by).into());
            detail.insert("timeout_ms".into(), (timeout.as_millis() as u64).into());
            let who = if *by == "user" {
                "the user"
            } else {
                "an operator"
            };
            (
                "approval_expired",
                format!(
                    "{call} was not approved by {who} within {}, so nothing was run. Calling again asks again.",
                    wait_text(*timeout)
                ),
            )
        }
        R::StateInvalid => (
            "approval_invalid",
            format!(
                "{call} carries a requestState that is not one this gateway issued for this client and call (or \
                 one issued before the gateway restarted), so nothing was run. Call the tool again without \
                 requestState and inputResponses to be asked for approval."
            ),
        ),
        R::StateUsed => (
            "approval_used",
            format!(
                "{call} carries an approval that was used already: each approval runs one call, once. Nothing was \
                 run. Call the tool again without requestState to ask for a new approval."
            ),
        ),
        R::StateExpired => (
            "approval_expired",
            format!(
                "{call} carries an approval that has expired, so nothing was run. Call the tool again without \
                 requestState to ask again."
            ),
        ),
        R::Reloaded => (
            "approval_expired",
            format!(
                "{call} was waiting for approval when the gateway's configuration was reloaded, so it was not run \
                 (it was decided under the configuration before). Call again to be asked under the new one."
            ),
        ),
        R::UnknownId => (
            "approval_unknown",
            format!(
                "{call} names an approval id (`_meta[\"portcullis/approvalId\"]`) that is not pending or approved for \
                 you, so nothing was run. Leave the id out: the gateway finds an approval of this exact call by \
                 itself, or queues a new one."
            ),
        ),
        R::TooLargeToCarry { limit } => {
            detail.insert("limit".into(), (*limit as u64).into());
            (
                "approval_unavailable",
                format!(
                    "{call} needs the user's approval, and what it carries of the server's own input round \
                     (requestState and inputResponses) is larger than the {limit} bytes the gateway can carry across \
                     its question, so nothing was run. Answer the server with less, or ask the gateway's operator to \
                     let an operator approve this tool (`by = \"operator\"`)."
                ),
            )
        }
        R::Busy { limit, per_client } => {
            detail.insert("limit".into(), (*limit as u64).into());
            let whose = if *per_client { "of yours " } else { "" };
            (
                "approval_busy",
                format!(
                    "{call} needs an approval, and {limit} approvals {whose}are open already (the gateway's limit), \
                     so nothing was run and nothing was queued. Wait for open approvals to be decided or to expire, \
                     then call again."
                ),
            )
        }
        R::Required {
            id,
            expires_ms,
            already,
        } => {
            detail.insert("approval_id".into(), id.as_str().into());
            detail.insert("expires_ms".into(), (*expires_ms).into());
            detail.insert("retry".into(), true.into());
            let state = if *already {
                "is still waiting for an operator's approval"
            } else {
                "needs an operator's approval and was queued for it"
            };
            (
                "approval_required",
                format!(
                    "{call} {state} (approval {id}, open until {}); it was not run yet. Tell the user it awaits \
                     approval. Once an operator approves it (in the gateway's dashboard, or with POST \
                     /api/approvals/{id}/approve on the admin listener), make exactly the same call again — same \
                     tool, same arguments — and it runs once. Other arguments need a new approval.",
                    crate::util::time::iso8601(*expires_ms)
                ),
            )
        }
    };
    Rejection::Tool(ToolRefusal { code, text, detail })
}

/// The reply to an approved call could not be read as JSON (2025-era
/// approval on the call's stream, where the reply becomes an SSE event).
pub(crate) fn unreadable_after_approval(cx: RenderCtx<'_>) -> Value {
    jsonrpc::error(
        cx.id,
        codes::UPSTREAM_PROTOCOL,
        "the approved call was forwarded, but the upstream's reply could not be read as JSON-RPC; the tool may have run",
        None,
    )
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn limited(key: RateKey, shared_by: &[&str], retry_after: Duration) -> RateLimited {
        RateLimited {
            subject: Limited::Tool("echo".into()),
            client: "bob".into(),
            limit: Some(Limit {
                rule: 0,
                rate: Rate {
                    burst: NonZeroU32::new(3).expect("nonzero"),
                    per_second: 0.05,
                    key,
                },
                shared_by: shared_by.iter().map(|s| s.to_string()).collect(),
            }),
            retry_after,
        }
    }

    #[test]
    fn rate_limit_texts() {
        let wait = Duration::from_millis(7_400);
        assert_eq!(
            limited(RateKey::ClientTool, &["echo"], wait).text(),
            "Rate limit for `echo` reached for client `bob`: 3 calls, then 1 every 20 s. Retry after 7.4 s."
        );
        assert_eq!(
            limited(RateKey::Client, &["echo"], wait).text(),
            "Rate limit for `echo` reached for client `bob`: 3 calls, then 1 every 20 s. Retry after 7.4 s."
        );
        assert_eq!(
            limited(RateKey::Client, &["echo", "search_*"], wait).text(),
            "Rate limit for `echo` reached for client `bob`: 3 calls, then 1 every 20 s, counted together for `echo`, `search_*`. Retry after 7.4 s."
        );
        assert_eq!(
            limited(RateKey::All, &["*"], wait).text(),
            "Rate limit for `echo` reached: 3 calls, then 1 every 20 s, shared by all clients. Retry after 7.4 s."
        );
        let detail = limited(
            RateKey::ClientTool,
            &["echo"],
            Duration::from_nanos(7_300_000_001),
        )
        .detail();
        assert_eq!(detail["retry_after_ms"], 7_301, "rounded up");
        assert_eq!(detail["limit"]["key"], "client+tool");
        assert_eq!(detail["limit"]["rule"], "rules[0]");
        let down = RateLimited {
            limit: None,
            ..limited(RateKey::All, &[], Duration::from_secs(1))
        };
        assert!(
            down.text()
                .starts_with("The rate limit for `echo` cannot be checked right now")
        );
        assert_eq!(down.detail()["reason"], "backend_unavailable");
    }

    #[test]
    fn waits_are_rounded_up_for_a_reader() {
        let t = |ns: u64| wait_text(Duration::from_nanos(ns));
        assert_eq!(t(1), "0.1 s");
        assert_eq!(t(7_300_000_001), "7.4 s");
        assert_eq!(t(20_000_000_000), "20 s");
        assert_eq!(t(59_950_000_000), "1 min");
        assert_eq!(t(125_000_000_000), "2 min 5 s");
        assert_eq!(t(120_000_000_000), "2 min");
        assert_eq!(t(3_600_000_000_000), "1 h");
        assert_eq!(t(5_400_000_000_001), "1 h 31 min");
    }

    #[test]
    fn a_tool_refusal_has_retry_after_in_whole_seconds() {
        let cx = RenderCtx {
            id: None,
            era: Era::Legacy,
        };
        let r = Rejection::RateLimited(limited(
            RateKey::ClientTool,
            &["echo"],
            Duration::from_millis(7_400),
        ))
        .into_response(cx);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::RETRY_AFTER], "8");
    }
}
