//! The bodies every rendering shares: a JSON response, a JSON-RPC error, a
//! `tools/call` isError result, and the answer to a connection over the limit.
//!
//! Place: the bottom of the rendering; the other files of the error module
//! build their responses with these.
//! Invariants: an isError result carries its code in
//! `_meta["portcullis/error"]`; a body is always `application/json`.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use super::rejection::{RenderCtx, codes};
use crate::mcp::META_GATEWAY_ERROR;
use crate::mcp::jsonrpc;
use crate::mcp::version::Era;
use crate::ratelimit::ceil_secs;

pub(super) fn tool_message(
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

pub(super) fn tool_result(
    cx: RenderCtx<'_>,
    code: &str,
    text: String,
    detail: serde_json::Map<String, Value>,
) -> Response {
    json_response(StatusCode::OK, &tool_message(cx, code, &text, detail))
}

pub(super) fn error_response(
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
