//! Relaying a reply to the client: a JSON body checked and rewritten as one
//! message, an SSE stream handed to the stream rewriter, a failure rendered.
//!
//! Place: the end of forwarding, for every method whose reply streams back
//! as it comes.
//!
//! Invariants: the upstream's status and headers reach the client only with
//! a body the gateway has checked; an unchanged body is passed on byte for
//! byte.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::Value;

use crate::error::{UpstreamKind, json_response};
use crate::transport::reply::{Framing, Reply, UpstreamError};

use super::check::{Verdict, body_words, error_text, refusal, rpc_error_of, status_words};
use super::recipient::Recipient;
use super::sse::sse_relay;

/// Relays a reply to the client.
pub(crate) fn relay(reply: Reply, to: Recipient) -> Response {
    match reply {
        // An HTTP refusal is the upstream's answer, whatever the method.
        Reply::Empty {
            status: Framing::Http(status),
            headers,
        } if status.is_client_error() => to.refused(refusal(status, None, None), headers),
        Reply::Other {
            status,
            headers,
            text,
        } if status.is_client_error() => to.refused(refusal(status, None, text), headers),
        // A tools/call is owed exactly one answer, even when the upstream sends none.
        Reply::Empty { status, .. } if to.tool.is_some() => {
            let e = UpstreamError::new(
                UpstreamKind::Protocol,
                format!("it answered {} without a response", status.words()),
            );
            to.render(to.failure(e))
        }
        // A message taken without a status (stdio): accepted, as the
        // Streamable HTTP transport answers a notification or response.
        Reply::Empty { status, headers } => with_headers(
            Response::new(Body::empty()),
            status.or(StatusCode::ACCEPTED),
            headers,
        ),
        Reply::Other { status, text, .. } => {
            let kind = if status.is_server_error() || status.is_redirection() {
                UpstreamKind::Unavailable
            } else {
                UpstreamKind::Protocol
            };
            let reason = format!(
                "it answered HTTP {} without a JSON-RPC message",
                status_words(status)
            );
            to.render(to.failure(UpstreamError::new(kind, reason).with_snippet(text)))
        }
        Reply::Json {
            status,
            headers,
            body,
        } => relay_json(status, headers, body, to),
        Reply::Sse {
            status,
            headers,
            events,
        } => {
            let mut r = Response::new(Body::from_stream(sse_relay(events, to)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            r.headers_mut()
                .insert("x-accel-buffering", HeaderValue::from_static("no"));
            with_headers(r, status.or(StatusCode::OK), headers)
        }
    }
}

fn relay_json(framing: Framing, headers: HeaderMap, body: Bytes, to: Recipient) -> Response {
    // What the client gets: the upstream's status, or 200 for a message
    // without one (stdio).
    let status = framing.or(StatusCode::OK);
    let message = std::str::from_utf8(&body)
        .ok()
        .and_then(|text| to.inspect(text));
    if let Framing::Http(status) = framing
        && status.is_client_error()
    {
        // Its error (the Python SDK's "Missing session ID" comes with the id
        // "server-error") is relayed under this request's id.
        let error = message.as_ref().and_then(rpc_error_of);
        let words = error.is_none().then(|| body_words(&body)).flatten();
        return to.refused(refusal(status, error, words), headers);
    }
    if to.tool.is_some() {
        let Some(message) = message else {
            let (kind, reason) = if framing.is_server_error() {
                (
                    UpstreamKind::Unavailable,
                    format!("it answered {}", framing.words()),
                )
            } else {
                (
                    UpstreamKind::Protocol,
                    "its reply is not valid JSON".to_owned(),
                )
            };
            let e = UpstreamError::new(kind, reason).with_snippet(body_words(&body));
            return to.render(to.failure(e));
        };
        if !to.answers(&message) {
            let e = if framing.is_server_error() {
                let words = message.get("error").map(error_text);
                UpstreamError::new(
                    UpstreamKind::Unavailable,
                    format!("it answered {}", framing.words()),
                )
                .with_snippet(words)
            } else {
                UpstreamError::new(
                    UpstreamKind::Protocol,
                    "its reply does not answer this request (wrong or missing id)",
                )
            };
            return to.render(to.failure(e));
        }
        return match to.finish_flagged(message, body.len()) {
            // A rewritten or sanitized answer is a JSON-RPC response like any other: HTTP 200.
            Some(rewritten) => json(&rewritten, headers),
            None if status.is_success() => json_bytes(status, headers, body),
            None => json_bytes(StatusCode::OK, headers, body),
        };
    }
    let Some(message) = message else {
        let reason = format!(
            "it answered {} with a body that is not JSON",
            framing.words()
        );
        let e = UpstreamError::new(UpstreamKind::Protocol, reason).with_snippet(body_words(&body));
        return to.render(to.failure(e));
    };
    if !to.admits(&message) {
        let e = UpstreamError::new(
            UpstreamKind::Protocol,
            "it answered with a message the MCP specification does not let a server send",
        );
        return to.render(to.failure(e));
    }
    match to.pass(message, body.len()) {
        Verdict::Changed(clean) => {
            let mut r = json_response(status, &clean);
            r.headers_mut().extend(headers);
            r
        }
        Verdict::Unchanged => json_bytes(status, headers, body),
        Verdict::Refused(rejection) => to.render(rejection),
    }
}

fn json_bytes(status: StatusCode, headers: HeaderMap, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    with_headers(r, status, headers)
}

fn with_headers(mut response: Response, status: StatusCode, headers: HeaderMap) -> Response {
    *response.status_mut() = status;
    response.headers_mut().extend(headers);
    response
}

/// A JSON-RPC message already serialized, as an `application/json` response.
pub(crate) fn json_text(body: String, headers: HeaderMap) -> Response {
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut().extend(headers);
    r
}

/// A JSON-RPC message as an `application/json` response.
pub(crate) fn json(message: &Value, headers: HeaderMap) -> Response {
    let mut r = json_response(StatusCode::OK, message);
    r.headers_mut().extend(headers);
    r
}
