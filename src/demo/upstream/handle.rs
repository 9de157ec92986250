//! The demo upstream's HTTP handlers: `POST /mcp` for every JSON-RPC
//! message of both protocol eras, `GET` and `DELETE` for the rest.
//!
//! Place: routed by the router; each request reads the body, answers the
//! method, and logs an executed `tools/call` in the shared state.
//! Invariants: sessions are minted but never enforced; a call refused here
//! (unknown tool, malformed params) is not logged.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use super::state::Shared;
use super::tools::{Tool, run_tool, seconds_label, slow_query_ms, slow_query_text, text_result};
use super::wire::{
    Incoming, ToolsList, accepted, encode_success, error_response, json_response, notification,
    sse_event, sse_response, success, valid_id,
};
use axum::body::Body;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde_json::value::RawValue;
use serde_json::{Value, json};

const SERVER_NAME: &str = "portcullis-demo";
const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");
const INSTRUCTIONS: &str = "Portcullis demo upstream. Its tools are deliberately flawed \
(no input validation, leaky logs, opaque errors, a destructive delete) so that the \
gateway in front of it has something to protect. Never expose it directly.";

const MODERN_VERSION: &str = "2026-07-28";
const LEGACY_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
const LATEST_LEGACY_VERSION: &str = "2025-11-25";
pub(super) const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// Interval between `notifications/progress` messages of `slow_query`.
const PROGRESS_STEP_MS: u64 = 500;

// Handlers

pub(super) async fn handle_get() -> Response {
    // No server-initiated stream: the spec allows 405 for the GET stream.
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, HeaderValue::from_static("POST, DELETE"))],
    )
        .into_response()
}

pub(super) async fn handle_delete() -> Response {
    // Sessions hold no state here, so ending one is a no-op.
    StatusCode::OK.into_response()
}

pub(super) async fn handle_post(
    State(shared): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                INVALID_REQUEST,
                "Request body too large",
                None,
            );
        }
        Err(_) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                None,
                INVALID_REQUEST,
                "Could not read request body",
                None,
            );
        }
    };

    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        // Batching was removed in 2025-06-18; reject like the Python SDK does.
        return error_response(
            StatusCode::BAD_REQUEST,
            None,
            INVALID_REQUEST,
            "Invalid Request: batches are not supported",
            None,
        );
    }

    let mut message: Incoming<'_> = match serde_json::from_slice(&body) {
        Ok(message) => message,
        Err(e) if e.is_syntax() || e.is_eof() => {
            return error_response(
                StatusCode::BAD_REQUEST,
                None,
                PARSE_ERROR,
                "Parse error",
                None,
            );
        }
        Err(_) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                None,
                INVALID_REQUEST,
                "Invalid Request",
                None,
            );
        }
    };

    let Some(method) = message.method.take() else {
        if message.result.is_some() || message.error.is_some() {
            // A client's answer to a server request; this server sends none.
            return accepted();
        }
        return error_response(
            StatusCode::BAD_REQUEST,
            None,
            INVALID_REQUEST,
            "Invalid Request: no method",
            None,
        );
    };
    let Some(id) = message.id else {
        // Notifications (notifications/initialized, cancelled, …) need no answer.
        return accepted();
    };
    if !valid_id(id) {
        return error_response(
            StatusCode::BAD_REQUEST,
            None,
            INVALID_REQUEST,
            "Invalid Request: id must be a string or a number",
            None,
        );
    }

    let params = message.params.take();
    let modern = match params
        .as_ref()
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(META_PROTOCOL_VERSION))
    {
        None => false,
        Some(Value::String(v)) if v == MODERN_VERSION => true,
        Some(other) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                Some(id),
                UNSUPPORTED_PROTOCOL_VERSION,
                "Unsupported protocol version",
                Some(json!({"supported": [MODERN_VERSION], "requested": other})),
            );
        }
    };

    match (method.as_str(), modern) {
        ("tools/call", _) => call_tool(&shared, id, params, modern).await,
        ("tools/list", _) => {
            let result = ToolsList {
                tools: &shared.tools_json,
                ttl_ms: modern.then_some(0),
                cache_scope: modern.then_some("public"),
                result_type: modern.then_some("complete"),
            };
            json_response(StatusCode::OK, encode_success(id, result))
        }
        ("server/discover", true) => {
            let mut supported: Vec<&str> = LEGACY_VERSIONS.to_vec();
            supported.push(MODERN_VERSION);
            let result = json!({
                "supportedVersions": supported,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
                "instructions": INSTRUCTIONS,
                "ttlMs": 0,
                "cacheScope": "public",
                "resultType": "complete"
            });
            json_response(StatusCode::OK, encode_success(id, result))
        }
        ("initialize", false) => initialize(&shared, id, params.as_ref()),
        ("ping", false) => json_response(StatusCode::OK, encode_success(id, json!({}))),
        (_, true) => error_response(
            // Modern servers answer unknown methods with 404 (plus the JSON-RPC
            // error that tells it apart from a legacy 404).
            StatusCode::NOT_FOUND,
            Some(id),
            METHOD_NOT_FOUND,
            "Method not found",
            None,
        ),
        (_, false) => error_response(
            StatusCode::OK,
            Some(id),
            METHOD_NOT_FOUND,
            "Method not found",
            None,
        ),
    }
}

fn initialize(shared: &Shared, id: &RawValue, params: Option<&Value>) -> Response {
    let requested = params
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str);
    let version = match requested {
        Some(v) if LEGACY_VERSIONS.contains(&v) => v,
        _ => LATEST_LEGACY_VERSION,
    };
    let result = json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
        "instructions": INSTRUCTIONS
    });
    let mut response = json_response(StatusCode::OK, encode_success(id, result));
    if let Ok(value) = HeaderValue::from_str(&shared.new_session_id()) {
        response.headers_mut().insert("mcp-session-id", value);
    }
    response
}

async fn call_tool(
    shared: &Arc<Shared>,
    id: &RawValue,
    params: Option<Value>,
    modern: bool,
) -> Response {
    let Some(Value::Object(mut params)) = params else {
        return invalid_params(id, "Invalid params: expected an object");
    };
    let name = match params.remove("name") {
        Some(Value::String(name)) => name,
        _ => return invalid_params(id, "Invalid params: missing tool name"),
    };
    let arguments = params.remove("arguments").unwrap_or(Value::Null);
    if !(arguments.is_object() || arguments.is_null()) {
        return invalid_params(id, "Invalid params: arguments must be an object");
    }
    let Some(tool) = Tool::resolve(shared, &name) else {
        return invalid_params(id, &format!("Unknown tool: {name}"));
    };

    if tool == Tool::SlowQuery {
        let ms = slow_query_ms(&arguments);
        let token = params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .filter(|t| t.is_string() || t.is_number())
            .cloned();
        shared.record(name, arguments);
        return match token {
            Some(token) => slow_query_stream(shared, id, modern, ms, token),
            None => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                tool_response(shared, id, modern, text_result(slow_query_text(ms)))
            }
        };
    }

    let result = run_tool(shared, tool, &arguments);
    shared.record(name, arguments);
    tool_response(shared, id, modern, result)
}

fn invalid_params(id: &RawValue, message: &str) -> Response {
    error_response(StatusCode::OK, Some(id), INVALID_PARAMS, message, None)
}

fn tool_response(shared: &Shared, id: &RawValue, modern: bool, result: Value) -> Response {
    let body = success(id, modern, result);
    if shared.options.sse {
        sse_response(Body::from(sse_event(&body)))
    } else {
        json_response(StatusCode::OK, body)
    }
}

/// Where a `slow_query` SSE stream is.
enum Phase {
    Prime,
    Working { elapsed_ms: u64 },
    Done,
}

/// `slow_query` with a progress token: an SSE stream with a priming event
/// (legacy only, since 2026-07-28 dropped resumable streams and their event
/// ids), one `notifications/progress` every 0.5 s, then the response.
/// Dropping the stream (client went away) stops the work, which is how
/// 2026-07-28 defines cancellation.
fn slow_query_stream(
    shared: &Arc<Shared>,
    id: &RawValue,
    modern: bool,
    total_ms: u64,
    token: Value,
) -> Response {
    let prime_id = shared.next_id();
    let id = id.to_owned();
    let start = if modern {
        Phase::Working { elapsed_ms: 0 }
    } else {
        Phase::Prime
    };
    let stream = futures_util::stream::unfold(start, move |phase| {
        let id = id.clone();
        let token = token.clone();
        async move {
            match phase {
                Phase::Prime => {
                    let event = Bytes::from(format!("id: {prime_id}\ndata: \n\n"));
                    Some((Ok::<_, Infallible>(event), Phase::Working { elapsed_ms: 0 }))
                }
                Phase::Working { elapsed_ms } if elapsed_ms < total_ms => {
                    let step = (total_ms - elapsed_ms).min(PROGRESS_STEP_MS);
                    tokio::time::sleep(Duration::from_millis(step)).await;
                    let elapsed_ms = elapsed_ms + step;
                    let progress = notification(
                        "notifications/progress",
                        json!({
                            "progressToken": token,
                            "progress": elapsed_ms as f64 / 1000.0,
                            "total": total_ms as f64 / 1000.0,
                            "message": format!("{} of {}", seconds_label(elapsed_ms), seconds_label(total_ms))
                        }),
                    );
                    Some((Ok(sse_event(&progress)), Phase::Working { elapsed_ms }))
                }
                Phase::Working { .. } => {
                    let body = success(&id, modern, text_result(slow_query_text(total_ms)));
                    Some((Ok(sse_event(&body)), Phase::Done))
                }
                Phase::Done => None,
            }
        }
    });
    sse_response(Body::from_stream(stream))
}
