//! SSE streams rewritten on the way back: decoded event by event, each
//! message checked and re-encoded as it arrives.
//!
//! Place: under the relay, when the upstream answers with
//! `text/event-stream`.
//!
//! Invariants: progress notifications are never held back; a `tools/call`
//! stream ends with exactly one answer to its id, made by the gateway when
//! the upstream failed, answered another id, or ended without answering; no
//! upstream text crosses outside a sanitized message: comments are relayed
//! empty, an event `id` that is not plain visible text is removed, an event
//! whose name is not a plain token is left out.

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;

use crate::error::UpstreamKind;
use crate::mcp::sse::{SseEvent, SseItem};
use crate::transport::reply::{SseStream, UpstreamError};

use super::check::{Verdict, body_words, is_response};
use super::recipient::Recipient;

/// Re-encodes SSE items as they arrive, each message sanitized; for a
/// `tools/call`, rewrites the final response and guarantees the one answer.
pub(super) fn sse_relay(
    events: SseStream,
    to: Recipient,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let state = State {
        events,
        to,
        answered: false,
        other_id: false,
        done: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        let next = next_bytes(&mut st).await;
        // The answer that ends the exchange: its event is recorded before it
        // leaves (a replica killed once the client has it keeps the event).
        if st.done {
            st.to.trail.seal();
        }
        next.map(|bytes| (bytes, st))
    })
}

/// The state of one relayed stream.
struct State {
    events: SseStream,
    to: Recipient,
    answered: bool,
    /// A response to another id went by (the reason, if none comes for ours).
    other_id: bool,
    done: bool,
}

/// The next encoded item of the stream, or its end.
async fn next_bytes(st: &mut State) -> Option<Result<Bytes, std::io::Error>> {
    loop {
        if st.done {
            return None;
        }
        let item = match st.events.next().await {
            Some(item) => item,
            None => {
                st.done = true;
                if st.to.tool.is_some() && !st.answered {
                    let reason = if st.other_id {
                        "its event stream answered another request id and ended without answering this one"
                    } else {
                        "its event stream ended without a response"
                    };
                    let e = UpstreamError::new(UpstreamKind::Protocol, reason);
                    return Some(Ok(gateway_event(&st.to, e)));
                }
                return None;
            }
        };
        let item = match item {
            Ok(SseItem::Event(mut event)) => {
                if !st.to.framing(&mut event) {
                    continue;
                }
                Ok(SseItem::Event(event))
            }
            other => other,
        };
        match item {
            // A comment keeps the stream alive; its words are the
            // upstream's and are never relayed.
            Ok(SseItem::Comment(_)) => {
                return Some(Ok(SseItem::Comment(String::new()).encode()));
            }
            Ok(SseItem::Event(event)) if event.data.is_empty() => {
                // A priming event exists for its id: without one, it says nothing.
                if event.id.is_none() && event.retry.is_none() {
                    continue;
                }
                return Some(Ok(SseItem::Event(event).encode()));
            }
            Ok(SseItem::Event(mut event)) => {
                let Some(message) = st.to.inspect(&event.data) else {
                    if st.to.tool.is_some() {
                        st.done = true;
                        let e = UpstreamError::new(
                            UpstreamKind::Protocol,
                            "an event of its stream is not valid JSON",
                        )
                        .with_snippet(body_words(event.data.as_bytes()));
                        return Some(Ok(gateway_event(&st.to, e)));
                    }
                    // Not JSON-RPC: never shown to the client.
                    continue;
                };
                if !st.to.admits(&message) || st.to.hides(&message) {
                    continue;
                }
                let raw_len = event.data.len();
                let changed = if st.to.tool.is_some() && st.to.answers(&message) {
                    st.answered = true;
                    // The final response ends the exchange.
                    st.done = true;
                    st.to.finish_flagged(message, raw_len)
                } else if st.to.tool.is_some() && is_response(&message) {
                    // A response to another id is not this client's to see.
                    st.other_id = true;
                    continue;
                } else {
                    let ours = st.to.answers(&message);
                    match st.to.pass(message, raw_len) {
                        Verdict::Unchanged => None,
                        Verdict::Changed(m) => Some(m),
                        Verdict::Refused(rejection) if ours => {
                            st.done = true;
                            st.to
                                .trail
                                .decided(rejection.code(), rejection.source().as_str());
                            rejection.rpc_message(st.to.render_ctx())
                        }
                        // Not the answer: a message the client could not
                        // use, or one that must not reach it, is left out.
                        Verdict::Refused(rejection) => {
                            tracing::warn!(
                                server = %st.to.server,
                                method = %st.to.method,
                                code = rejection.code(),
                                "an upstream message was left out of the stream"
                            );
                            continue;
                        }
                    }
                };
                if let Some(m) = changed {
                    event.data = m.to_string();
                }
                return Some(Ok(SseItem::Event(event).encode()));
            }
            Err(e) => {
                st.done = true;
                if st.to.tool.is_some() && !st.answered {
                    return Some(Ok(gateway_event(&st.to, e)));
                }
                return None;
            }
        }
    }
}

fn gateway_event(to: &Recipient, e: UpstreamError) -> Bytes {
    let rejection = to.failure(e);
    to.trail
        .decided(rejection.code(), rejection.source().as_str());
    let message = rejection
        .tool_message(to.render_ctx())
        .unwrap_or(Value::Null);
    SseItem::Event(SseEvent::message(message.to_string())).encode()
}
