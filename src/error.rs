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

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use crate::auth::AuthError;
use crate::mcp::META_GATEWAY_ERROR;
use crate::mcp::jsonrpc::{self, ClassifyError};
use crate::mcp::version::{self, Era};

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
    /// No or wrong credentials (401).
    Unauthenticated(AuthError),
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
    /// Session unknown or another client's (404).
    SessionNotFound,
    /// A resource or prompt the client may not use — answered exactly like a
    /// missing one (JSON-RPC -32602).
    NotFound(String),
    /// A `tools/call` refused by policy or validation (isError result).
    Tool(ToolRefusal),
    /// The upstream failed (isError on tools/call, 502/504 otherwise).
    Upstream(UpstreamFailure),
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

/// What went wrong upstream.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UpstreamFailure {
    pub kind: UpstreamKind,
    pub server: String,
    /// The tool, on `tools/call`.
    pub tool: Option<String>,
    /// Gateway-written description (never upstream text).
    pub reason: String,
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
            | Rejection::SessionNotFound => Source::Client,
            Rejection::NotFound(_) | Rejection::Tool(_) => Source::Policy,
            Rejection::Upstream(_) => Source::Upstream,
        }
    }

    /// Stable label for logs, metrics and audit.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Rejection::Forbidden(_) => "forbidden",
            Rejection::UnknownServer(_) => "unknown_server",
            Rejection::MethodNotAllowed(_) => "method_not_allowed",
            Rejection::Unauthenticated(_) => "unauthenticated",
            Rejection::TooLarge(_) => "request_too_large",
            Rejection::Malformed(ClassifyError::Batch) => "batch",
            Rejection::Malformed(ClassifyError::TooDeep(_)) => "too_deep",
            Rejection::Malformed(_) => "malformed",
            Rejection::HeaderMismatch(_) => "header_mismatch",
            Rejection::UnsupportedVersion { .. } => "unsupported_version",
            Rejection::InvalidParams(_) => "invalid_params",
            Rejection::SessionNotFound => "session_not_found",
            Rejection::NotFound(_) => "not_found",
            Rejection::Tool(t) => t.code,
            Rejection::Upstream(u) => u.kind.code(),
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
            Rejection::Unauthenticated(why) => {
                let mut r = error_response(
                    StatusCode::UNAUTHORIZED,
                    id,
                    codes::UNAUTHENTICATED,
                    &why.to_string(),
                    None,
                );
                let challenge = match why {
                    AuthError::Missing => "Bearer",
                    AuthError::Invalid => "Bearer error=\"invalid_token\"",
                };
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(challenge),
                );
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
            Rejection::Tool(t) => tool_result(cx, t.code, t.text, t.detail),
            Rejection::Upstream(u) => match u.tool.clone() {
                Some(tool) => {
                    let mut detail = serde_json::Map::new();
                    detail.insert("server".into(), u.server.clone().into());
                    detail.insert("tool".into(), tool.into());
                    let text = u.text();
                    tool_result(cx, u.kind.code(), text, detail)
                }
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
            Rejection::Upstream(u) if u.tool.is_some() => {
                let mut detail = serde_json::Map::new();
                detail.insert("server".into(), u.server.clone().into());
                detail.insert("tool".into(), u.tool.clone().unwrap_or_default().into());
                Some(tool_message(cx, u.kind.code(), &u.text(), detail))
            }
            _ => None,
        }
    }
}

// === impl UpstreamFailure ===

impl UpstreamFailure {
    fn text(&self) -> String {
        let subject = match &self.tool {
            Some(t) => format!("the tool `{t}` on server `{}`", self.server),
            None => format!("server `{}`", self.server),
        };
        match self.kind {
            UpstreamKind::Unavailable => format!(
                "The gateway could not get an answer from {subject}: {}. The request may not have run. \
                 Retrying later may help; if it keeps failing, report that the server is unavailable.",
                self.reason
            ),
            UpstreamKind::Timeout => format!(
                "The gateway stopped waiting for {subject}: {}. The call may still have run: retry only if \
                 running it twice is safe, or check its effect first.",
                self.reason
            ),
            UpstreamKind::Protocol => format!(
                "The gateway could not read the reply of {subject}: {}. The call may have run: retry only if \
                 running it twice is safe.",
                self.reason
            ),
        }
    }
}

impl UpstreamKind {
    pub(crate) fn code(self) -> &'static str {
        match self {
            UpstreamKind::Unavailable => "upstream_unavailable",
            UpstreamKind::Timeout => "upstream_timeout",
            UpstreamKind::Protocol => "upstream_protocol_error",
        }
    }

    fn json_rpc_code(self) -> i64 {
        match self {
            UpstreamKind::Unavailable => codes::UPSTREAM_UNAVAILABLE,
            UpstreamKind::Timeout => codes::UPSTREAM_TIMEOUT,
            UpstreamKind::Protocol => codes::UPSTREAM_PROTOCOL,
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
