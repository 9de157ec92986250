//! A [`Rejection`] rendered as the client gets it: the HTTP response, or the
//! JSON-RPC message written into a stream that already started.
//!
//! Place: the last step of a refused request; the pipeline calls
//! [`Rejection::into_response`] and nothing else renders a refusal.
//! Invariants: a refused `tools/call` is an isError result the model can act
//! on, anything else a JSON-RPC error; each carries its stable code.

use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use super::refusals::secret_in_params;
use super::rejection::{
    Limited, NON_CANONICAL_URI, RATE_LIMITED, Rejection, RenderCtx, UpstreamKind, codes,
};
use super::wire::{error_response, tool_message, tool_result};
use crate::auth::{AuthError, AuthRefusal};
use crate::mcp::jsonrpc;
use crate::mcp::version::{self, Era};
use crate::ratelimit::ceil_secs;

impl Rejection {
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
            Rejection::StateUnavailable(store) => error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                id,
                codes::STATE_UNAVAILABLE,
                &format!(
                    "the gateway's shared state store ({store}) did not answer, so what this request needs of it \
                     (whether the task or session is yours, or keeping the flow label a read sets) cannot be done; \
                     nothing was sent to the server. Retry shortly; if it keeps failing, tell the gateway's operator \
                     that the {store} state store is unreachable"
                ),
                Some(serde_json::json!({"code": "state_unavailable", "store": store})),
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
            Rejection::Use(t) => {
                let mut data = t.detail;
                data.insert("code".into(), t.code.into());
                error_response(
                    StatusCode::OK,
                    id,
                    codes::USE_NOT_PERMITTED,
                    &t.text,
                    Some(Value::Object(data)),
                )
            }
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
                    error_response(status, id, u.kind.json_rpc_code(), &u.text(), u.data())
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
                u.data(),
            )),
            _ => None,
        }
    }
}
