//! The end of a tool call the client no longer waits for: a deadline for
//! the whole call (its tries, and its reply to the end), the server told
//! with `notifications/cancelled` when the gateway stops waiting for an
//! answer it may still be computing, and the client's own cancellation
//! stopping the call's retries.
//!
//! Place: around [`super::forward::Forward::send_as`] for `tools/call`: the
//! deadline bounds each try and cuts the reply's event stream; a
//! [`CancelGuard`] rides with the call until its answer has passed (the
//! server's table of calls under way is [`super::inflight`]).
//!
//! Invariants: a call with a deadline never keeps the client's reply open
//! past it (the stream ends with an `upstream_timeout` failure); a call the
//! gateway gave up on while the server may still run it — its deadline
//! passed, or the client went away — is cancelled at an HTTP server once,
//! for the request id the server saw, in the client's session (a stdio
//! server is cancelled by its own supervisor); a call whose answer passed,
//! or that was never sent, is never cancelled; a cancelled call is not sent
//! again.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Method};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::state::Live;
use super::upstream::Upstream;
use crate::error::UpstreamKind;
use crate::identity::Credential;
use crate::mcp::headers::{MCP_METHOD, MCP_NAME};
use crate::mcp::sse::SseItem;
use crate::transport::reply::{Reply, SseStream, UpstreamError};
use crate::util::time::humanize;

/// How long the gateway waits for the server to take a cancellation.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// The failure of a call that ran past its deadline.
pub(crate) fn past(limit: Duration) -> UpstreamError {
    UpstreamError::new(
        UpstreamKind::Timeout,
        format!(
            "the call did not complete within {}, the deadline of this tool; the gateway stopped \
             waiting and asked the server to cancel it",
            humanize(limit)
        ),
    )
}

/// Tells an HTTP server to stop a call, unless disarmed first: dropped
/// armed (the deadline passed, or the client went away), it sends
/// `notifications/cancelled` for the call's id.
pub(crate) struct CancelGuard {
    upstream: Arc<Upstream>,
    headers: HeaderMap,
    credential: Credential,
    id: Value,
    reason: &'static str,
    armed: bool,
}

impl CancelGuard {
    /// A guard for the call `id` sent with `headers` (its session and
    /// version) and `credential`; none for a stdio server.
    pub(crate) fn new(
        upstream: &Arc<Upstream>,
        mut headers: HeaderMap,
        credential: Credential,
        id: Value,
    ) -> Option<Self> {
        upstream.settings.url()?;
        headers.remove(MCP_NAME);
        headers.remove("traceparent");
        headers.insert(
            MCP_METHOD,
            HeaderValue::from_static("notifications/cancelled"),
        );
        Some(Self {
            upstream: upstream.clone(),
            headers,
            credential,
            id,
            reason: "the client went away",
            armed: true,
        })
    }

    /// The answer passed, or the request was never sent: nothing to cancel.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Why it will be cancelled, if it is.
    pub(crate) fn because(&mut self, reason: &'static str) {
        self.reason = reason;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let upstream = self.upstream.clone();
        let headers = std::mem::take(&mut self.headers);
        let credential = self.credential.clone();
        let body = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": self.id, "reason": self.reason}});
        let body = Bytes::from(body.to_string());
        let reason = self.reason;
        runtime.spawn(async move {
            let sent = upstream
                .exchange(
                    Method::POST,
                    headers,
                    credential,
                    Some(body),
                    Some(CANCEL_WAIT),
                )
                .await;
            match sent {
                Ok(_) => tracing::info!(server = %upstream.settings.name, reason,
                    "asked the server to cancel a call the gateway stopped waiting for"),
                Err(e) => tracing::info!(server = %upstream.settings.name, error = %e.reason,
                    "could not ask the server to cancel a call"),
            }
        });
    }
}

/// `events`, ended at the deadline (when `cut` gives one, with the call's
/// limit) with the call's timeout failure; `guard` goes with it and is
/// disarmed once the answer to `id` has passed or the stream ended by itself.
pub(crate) fn cut_at(
    events: SseStream,
    cut: Option<(Instant, Duration)>,
    guard: Option<CancelGuard>,
    id: Value,
) -> SseStream {
    struct State {
        events: Option<SseStream>,
        guard: Option<CancelGuard>,
        id: Value,
    }
    let state = State {
        events: Some(events),
        guard,
        id,
    };
    Box::pin(futures_util::stream::unfold(
        state,
        move |mut st| async move {
            let events = st.events.as_mut()?;
            let next = match cut {
                Some((deadline, _)) => tokio::time::timeout_at(deadline, events.next()).await,
                None => Ok(events.next().await),
            };
            match next {
                Ok(Some(item)) => {
                    if let Ok(SseItem::Event(event)) = &item
                        && answers(&event.data, &st.id)
                        && let Some(guard) = st.guard.as_mut()
                    {
                        guard.disarm();
                    }
                    Some((item, st))
                }
                Ok(None) => {
                    if let Some(guard) = st.guard.as_mut() {
                        guard.disarm();
                    }
                    None
                }
                Err(_) => {
                    // The server's stream and the guard (which cancels) go now,
                    // not when the client's reply ends.
                    st.events = None;
                    if let Some(mut guard) = st.guard.take() {
                        guard.because("the call ran past its deadline");
                    }
                    let limit = cut.map(|(_, limit)| limit).unwrap_or_default();
                    Some((Err(past(limit)), st))
                }
            }
        },
    ))
}

/// A `tools/call`: its id, and its deadline when `[servers.NAME.timeouts]`
/// names one for the tool.
pub(crate) struct Call<'c> {
    pub(crate) id: &'c Value,
    pub(crate) limit: Option<Duration>,
}

/// The last try's outcome, with what a tool call still owes: a stream cut
/// at the deadline and carrying the guard that cancels the call if the
/// client goes before its answer; no cancellation for an answer that came
/// whole or a request that was never sent.
pub(crate) fn settle(
    outcome: Result<Reply, UpstreamError>,
    guard: Option<CancelGuard>,
    call: Option<&Call<'_>>,
    deadline: Instant,
) -> Result<Reply, UpstreamError> {
    let (Some(mut guard), Some(call)) = (guard, call) else {
        return outcome;
    };
    match outcome {
        Ok(Reply::Sse {
            status,
            headers,
            events,
        }) => {
            let cut = call.limit.map(|limit| (deadline, limit));
            let events = cut_at(events, cut, Some(guard), call.id.clone());
            Ok(Reply::Sse {
                status,
                headers,
                events,
            })
        }
        Ok(reply) => {
            guard.disarm();
            Ok(reply)
        }
        Err(e) => {
            if e.not_run {
                guard.disarm();
            } else if e.kind == UpstreamKind::Timeout {
                guard.because("the call ran past its deadline");
            }
            Err(e)
        }
    }
}

/// The failure a request to `server` gets while its breaker is open: when
/// to retry, and which other servers of `live` still work.
pub(crate) fn open(live: &Live, server: &str, wait: Duration) -> UpstreamError {
    let others: Vec<&str> = (live.servers.iter())
        .filter(|(name, s)| *name != server && !s.upstream.breaker.is_open())
        .map(|(name, _)| name.as_str())
        .collect();
    let others = if others.is_empty() {
        "No other server of this gateway is known to work now.".to_owned()
    } else {
        format!(
            "These servers of this gateway still work: {}.",
            others.join(", ")
        )
    };
    let mut e = UpstreamError::new(
        UpstreamKind::Open,
        format!(
            "too many of its last requests failed, so the gateway stops sending it anything for a \
             while. Retry in about {}s; if it keeps failing, report that the server is unavailable. {others}",
            wait.as_secs().max(1)
        ),
    );
    e.not_run = true;
    e
}

/// Whether an event's data is the response to `id`.
fn answers(data: &str, id: &Value) -> bool {
    if !(data.contains("\"result\"") || data.contains("\"error\"")) {
        return false;
    }
    serde_json::from_str::<Value>(data).is_ok_and(|m| {
        m.get("id") == Some(id) && (m.get("result").is_some() || m.get("error").is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_response_to_the_call_disarms() {
        let id = json!(7);
        assert!(answers(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#, &id));
        assert!(answers(
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":1}}"#,
            &id
        ));
        assert!(!answers(r#"{"jsonrpc":"2.0","id":"7","result":{}}"#, &id));
        assert!(!answers(
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"result":1}}"#,
            &id
        ));
    }
}
