//! JSON-RPC framing of the demo upstream: the incoming message, the encoded
//! results and errors, and the JSON and SSE responses that carry them.
//!
//! Place: between the handlers and the HTTP body.
//! Invariants: a request's `id` is echoed byte for byte; an encoding that
//! fails still yields a valid JSON-RPC error body.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

/// One incoming JSON-RPC message. `id` stays raw so it is echoed byte for byte.
#[derive(Deserialize)]
pub(super) struct Incoming<'a> {
    #[serde(borrow, default, deserialize_with = "raw_present")]
    pub(super) id: Option<&'a RawValue>,
    #[serde(default)]
    pub(super) method: Option<String>,
    #[serde(default)]
    pub(super) params: Option<Value>,
    #[serde(default)]
    pub(super) result: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    pub(super) error: Option<serde::de::IgnoredAny>,
}

/// Keeps an explicit `"id": null` distinguishable from an absent id.
fn raw_present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// MCP ids are strings or numbers; null, booleans, arrays and objects are not.
pub(super) fn valid_id(id: &RawValue) -> bool {
    matches!(id.get().as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9'))
}

#[derive(Serialize)]
struct Success<'a, R: Serialize> {
    jsonrpc: &'static str,
    id: &'a RawValue,
    result: R,
}

#[derive(Serialize)]
struct Failure<'a> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a RawValue>,
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    code: i64,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
}

/// `tools/list` result built around the pre-serialised tools array.
#[derive(Serialize)]
pub(super) struct ToolsList<'a> {
    pub(super) tools: &'a RawValue,
    #[serde(rename = "ttlMs", skip_serializing_if = "Option::is_none")]
    pub(super) ttl_ms: Option<u64>,
    #[serde(rename = "cacheScope", skip_serializing_if = "Option::is_none")]
    pub(super) cache_scope: Option<&'static str>,
    #[serde(rename = "resultType", skip_serializing_if = "Option::is_none")]
    pub(super) result_type: Option<&'static str>,
}

/// Serialisation of these types cannot fail (string keys, no maps with
/// non-string keys); the fallback keeps the handler total anyway.
const INTERNAL_ERROR_BODY: &[u8] =
    br#"{"jsonrpc":"2.0","error":{"code":-32603,"message":"Internal error"}}"#;

pub(super) fn encode_success<R: Serialize>(id: &RawValue, result: R) -> Vec<u8> {
    serde_json::to_vec(&Success {
        jsonrpc: "2.0",
        id,
        result,
    })
    .unwrap_or_else(|_| INTERNAL_ERROR_BODY.to_vec())
}

fn encode_error(id: Option<&RawValue>, code: i64, message: &str, data: Option<Value>) -> Vec<u8> {
    serde_json::to_vec(&Failure {
        jsonrpc: "2.0",
        id,
        error: ErrorObject {
            code,
            message,
            data,
        },
    })
    .unwrap_or_else(|_| INTERNAL_ERROR_BODY.to_vec())
}

pub(super) fn notification(method: &str, params: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
        .unwrap_or_else(|_| INTERNAL_ERROR_BODY.to_vec())
}

// ---------------------------------------------------------------------------
// HTTP responses

pub(super) fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

pub(super) fn error_response(
    status: StatusCode,
    id: Option<&RawValue>,
    code: i64,
    message: &str,
    data: Option<Value>,
) -> Response {
    json_response(status, encode_error(id, code, message, data))
}

pub(super) fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}

pub(super) fn sse_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            // Asks reverse proxies not to hold back progress events.
            (
                header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        body,
    )
        .into_response()
}

/// One SSE `message` event around a compact JSON payload (which never
/// contains a newline, so a single `data:` line suffices).
pub(super) fn sse_event(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 24);
    out.extend_from_slice(b"event: message\ndata: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Success for a request of either era: modern results carry `resultType`.
pub(super) fn success(id: &RawValue, modern: bool, mut result: Value) -> Vec<u8> {
    if modern && let Value::Object(map) = &mut result {
        map.insert("resultType".to_owned(), Value::from("complete"));
    }
    encode_success(id, result)
}
