//! The way back: upstream replies relayed to the client message by message, or
//! collected when the gateway needs the whole answer (lists).
//!
//! Place in the path: after forwarding. SSE streams are decoded event by event
//! and re-encoded as they arrive, so progress notifications are never held
//! back; each message is inspected on the way (a `tools/list_changed`
//! notification drops the cached tool list).
//!
//! Invariants: a `tools/call` gets exactly one response with its own id — the
//! upstream's, or a gateway-made `isError` result when the upstream failed,
//! answered another id, or ended the stream without answering; upstream bodies
//! that are not JSON-RPC are never shown to the client.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::Value;

use super::catalog::Catalog;
use super::upstream::{Reply, SseStream, UpstreamError};
use crate::error::{Rejection, RenderCtx, UpstreamFailure, UpstreamKind, json_response};
use crate::mcp::sse::{SseEvent, SseItem};
use crate::mcp::version::Era;

/// Who the reply is for, and what the gateway must guarantee about it.
#[derive(Debug, Clone)]
pub(crate) struct Recipient {
    /// The request's id (`None` for GET streams and notifications).
    pub id: Option<Value>,
    pub era: Era,
    pub server: String,
    /// Set for `tools/call`: the tool, and the promise of exactly one answer.
    pub tool: Option<String>,
    /// Emptied when the upstream says its tool list changed.
    pub catalog: Arc<Catalog>,
}

impl Recipient {
    fn failure(&self, e: UpstreamError) -> Rejection {
        Rejection::Upstream(UpstreamFailure {
            kind: e.kind,
            server: self.server.clone(),
            tool: self.tool.clone(),
            reason: e.reason,
        })
    }

    fn render(&self, rejection: Rejection) -> Response {
        rejection.into_response(RenderCtx {
            id: self.id.as_ref(),
            era: self.era,
        })
    }

    /// The upstream's message, or `None` when it is not JSON.
    fn inspect(&self, data: &str) -> Option<Value> {
        let message: Value = serde_json::from_str(data).ok()?;
        if message.get("method").and_then(Value::as_str) == Some("notifications/tools/list_changed")
        {
            self.catalog.invalidate();
        }
        Some(message)
    }

    /// True when `message` is the response to this request.
    fn answers(&self, message: &Value) -> bool {
        is_response(message) && self.id.as_ref() == message.get("id")
    }
}

fn is_response(message: &Value) -> bool {
    message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// Relays a reply to the client.
pub(crate) fn relay(reply: Reply, to: Recipient) -> Response {
    match reply {
        Reply::Empty { status, headers } => {
            with_headers(Response::new(Body::empty()), status, headers)
        }
        Reply::Other { status, .. } => {
            let reason = format!("it answered HTTP {status} without a JSON-RPC message");
            let kind = if status.is_server_error() || status.is_redirection() {
                UpstreamKind::Unavailable
            } else {
                UpstreamKind::Protocol
            };
            to.render(to.failure(UpstreamError { kind, reason }))
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
            with_headers(r, status, headers)
        }
    }
}

fn relay_json(status: StatusCode, headers: HeaderMap, body: Bytes, to: Recipient) -> Response {
    let message = std::str::from_utf8(&body)
        .ok()
        .and_then(|text| to.inspect(text));
    if to.tool.is_some() {
        if status.is_server_error() {
            let reason = format!("it answered HTTP {status}");
            return to.render(to.failure(UpstreamError {
                kind: UpstreamKind::Unavailable,
                reason,
            }));
        }
        let Some(message) = message else {
            let reason = "its reply is not valid JSON".to_owned();
            return to.render(to.failure(UpstreamError {
                kind: UpstreamKind::Protocol,
                reason,
            }));
        };
        if status.is_success() && !to.answers(&message) {
            let reason = "its reply does not answer this request (wrong or missing id)".to_owned();
            return to.render(to.failure(UpstreamError {
                kind: UpstreamKind::Protocol,
                reason,
            }));
        }
    } else if message.is_none() {
        let reason = format!("it answered HTTP {status} with a body that is not JSON");
        return to.render(to.failure(UpstreamError {
            kind: UpstreamKind::Protocol,
            reason,
        }));
    }
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

/// Re-encodes SSE items as they arrive; for a `tools/call`, guarantees the one answer.
fn sse_relay(
    events: SseStream,
    to: Recipient,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    struct State {
        events: SseStream,
        to: Recipient,
        answered: bool,
        done: bool,
    }
    let state = State {
        events,
        to,
        answered: false,
        done: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            let item = match st.events.next().await {
                Some(item) => item,
                None => {
                    st.done = true;
                    if st.to.tool.is_some() && !st.answered {
                        let e = UpstreamError {
                            kind: UpstreamKind::Protocol,
                            reason: "the event stream ended without a response".into(),
                        };
                        return Some((Ok(gateway_event(&st.to, e)), st));
                    }
                    return None;
                }
            };
            match item {
                Ok(SseItem::Comment(c)) => return Some((Ok(SseItem::Comment(c).encode()), st)),
                Ok(SseItem::Event(event)) if event.data.is_empty() => {
                    return Some((Ok(SseItem::Event(event).encode()), st));
                }
                Ok(SseItem::Event(event)) => {
                    let message = st.to.inspect(&event.data);
                    if st.to.tool.is_some() {
                        match &message {
                            None => {
                                st.done = true;
                                let e = UpstreamError {
                                    kind: UpstreamKind::Protocol,
                                    reason: "an event of its stream is not valid JSON".into(),
                                };
                                return Some((Ok(gateway_event(&st.to, e)), st));
                            }
                            Some(m) if st.to.answers(m) => {
                                st.answered = true;
                                // The final response ends the exchange.
                                st.done = true;
                            }
                            // A response to another id is not this client's to see.
                            Some(m) if is_response(m) => continue,
                            Some(_) => {}
                        }
                    }
                    return Some((Ok(SseItem::Event(event).encode()), st));
                }
                Err(e) => {
                    st.done = true;
                    if st.to.tool.is_some() && !st.answered {
                        return Some((Ok(gateway_event(&st.to, e)), st));
                    }
                    return None;
                }
            }
        }
    })
}

fn gateway_event(to: &Recipient, e: UpstreamError) -> Bytes {
    let rejection = to.failure(e);
    let message = rejection
        .tool_message(RenderCtx {
            id: to.id.as_ref(),
            era: to.era,
        })
        .unwrap_or(Value::Null);
    SseItem::Event(SseEvent::message(message.to_string())).encode()
}

/// Reads the response to `id` from a reply, whole.
pub(crate) async fn collect(
    reply: Reply,
    id: &Value,
    catalog: &Catalog,
) -> Result<Value, UpstreamError> {
    let protocol = |reason: &str| UpstreamError {
        kind: UpstreamKind::Protocol,
        reason: reason.to_owned(),
    };
    match reply {
        Reply::Json { status, body, .. } => {
            let message: Value = serde_json::from_slice(&body)
                .map_err(|_| protocol("its reply is not valid JSON"))?;
            if message.get("id") != Some(id) {
                let kind = if status.is_server_error() {
                    UpstreamKind::Unavailable
                } else {
                    UpstreamKind::Protocol
                };
                return Err(UpstreamError {
                    kind,
                    reason: format!("it answered HTTP {status} without a response to the request"),
                });
            }
            Ok(message)
        }
        Reply::Sse { mut events, .. } => {
            while let Some(item) = events.next().await {
                let SseItem::Event(event) = item? else {
                    continue;
                };
                if event.data.is_empty() {
                    continue;
                }
                let message: Value = serde_json::from_str(&event.data)
                    .map_err(|_| protocol("an event of its stream is not valid JSON"))?;
                if message.get("method").and_then(Value::as_str)
                    == Some("notifications/tools/list_changed")
                {
                    catalog.invalidate();
                }
                if is_response(&message) && message.get("id") == Some(id) {
                    return Ok(message);
                }
            }
            Err(protocol("the event stream ended without a response"))
        }
        Reply::Empty { status, .. } | Reply::Other { status, .. } => Err(UpstreamError {
            kind: if status.is_server_error() {
                UpstreamKind::Unavailable
            } else {
                UpstreamKind::Protocol
            },
            reason: format!("it answered HTTP {status} without a response"),
        }),
    }
}

/// A JSON-RPC message as an `application/json` response.
pub(crate) fn json(message: &Value, headers: HeaderMap) -> Response {
    let mut r = json_response(StatusCode::OK, message);
    r.headers_mut().extend(headers);
    r
}
