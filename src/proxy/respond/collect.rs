//! Collecting a reply whole, when the gateway needs the entire answer
//! before it can respond (lists, federation).
//!
//! Place: beside the relay, for requests the gateway answers itself from
//! what the upstream said.
//!
//! Invariants: only the response to the request's id is kept; an upstream
//! body that is not JSON-RPC is never shown, at most quoted in a capped,
//! sanitized snippet.

use futures_util::StreamExt;
use serde_json::Value;

use crate::error::UpstreamKind;
use crate::mcp::sse::SseItem;
use crate::proxy::catalog::Catalog;
use crate::transport::reply::{Framing, Reply, UpstreamError};

use super::check::{body_words, is_response, refusal, rpc_error_of};

/// Reads the response to `id` from a reply, whole.
pub(crate) async fn collect(
    reply: Reply,
    id: &Value,
    catalog: &Catalog,
) -> Result<Value, UpstreamError> {
    let protocol = |reason: &str| UpstreamError::new(UpstreamKind::Protocol, reason);
    match reply {
        Reply::Json {
            status: Framing::Http(status),
            body,
            ..
        } if status.is_client_error() => {
            let message = serde_json::from_slice::<Value>(&body).ok();
            let error = message.as_ref().and_then(rpc_error_of);
            let words = error.is_none().then(|| body_words(&body)).flatten();
            Err(refusal(status, error, words))
        }
        Reply::Other { status, text, .. } if status.is_client_error() => {
            Err(refusal(status, None, text))
        }
        Reply::Empty {
            status: Framing::Http(status),
            ..
        } if status.is_client_error() => Err(refusal(status, None, None)),
        Reply::Json { status, body, .. } => {
            let message: Value = serde_json::from_slice(&body).map_err(|_| {
                protocol("its reply is not valid JSON").with_snippet(body_words(&body))
            })?;
            if message.get("id") != Some(id) {
                let kind = if status.is_server_error() {
                    UpstreamKind::Unavailable
                } else {
                    UpstreamKind::Protocol
                };
                return Err(UpstreamError::new(
                    kind,
                    format!(
                        "it answered {} without a response to the request",
                        status.words()
                    ),
                ));
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
                if crate::mcp::methods::tool_list_changed(&message) {
                    catalog.invalidate();
                }
                if is_response(&message) && message.get("id") == Some(id) {
                    return Ok(message);
                }
            }
            Err(protocol("its event stream ended without a response"))
        }
        Reply::Empty { status, .. } => Err(without_response(status)),
        Reply::Other { status, .. } => Err(without_response(Framing::Http(status))),
    }
}

/// An answer that carries no response to the request.
fn without_response(status: Framing) -> UpstreamError {
    let kind = if status.is_server_error() {
        UpstreamKind::Unavailable
    } else {
        UpstreamKind::Protocol
    };
    UpstreamError::new(
        kind,
        format!("it answered {} without a response", status.words()),
    )
}
