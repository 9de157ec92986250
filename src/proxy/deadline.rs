//! The end of a tool call the client no longer waits for: a deadline for
//! the whole call (its tries, and its reply to the end), the server told
//! with `notifications/cancelled` when the gateway stops waiting for an
//! answer it may still be computing, and the client's own cancellation
//! stopping the call's retries.
//!
//! Place: around [`super::forward::Forward::send_as`] for `tools/call`: the
//! deadline bounds each try and cuts the reply's event stream; a
//! [`CancelGuard`] rides with the call until its answer has passed; the
//! server's [`InFlight`] table maps a client's `notifications/cancelled` to
//! the call it names.
//!
//! Invariants: a call with a deadline never keeps the client's reply open
//! past it (the stream ends with an `upstream_timeout` failure); a call the
//! gateway gave up on while the server may still run it — its deadline
//! passed, or the client went away — is cancelled at an HTTP server once,
//! for the request id the server saw, in the client's session (a stdio
//! server is cancelled by its own supervisor); a call whose answer passed,
//! or that was never sent, is never cancelled; a cancelled call is not sent
//! again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Method};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::reply::{SseStream, UpstreamError};
use super::upstream::Upstream;
use crate::error::UpstreamKind;
use crate::identity::Credential;
use crate::mcp::headers::{MCP_METHOD, MCP_NAME};
use crate::mcp::sse::SseItem;
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
pub(crate) fn cut(
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

/// Whether an event's data is the response to `id`.
fn answers(data: &str, id: &Value) -> bool {
    if !(data.contains("\"result\"") || data.contains("\"error\"")) {
        return false;
    }
    serde_json::from_str::<Value>(data).is_ok_and(|m| {
        m.get("id") == Some(id) && (m.get("result").is_some() || m.get("error").is_some())
    })
}

/// The tool calls of one server under way, by the key of who sent them
/// ([`key`]): a client's `notifications/cancelled` wakes its call.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    calls: Mutex<HashMap<String, Arc<Notify>>>,
}

/// A call's place in [`InFlight`], left when it is dropped.
pub(crate) struct Entry<'a> {
    table: &'a InFlight,
    key: String,
    /// Woken when the client cancels the call.
    pub(crate) cancelled: Arc<Notify>,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        let mut calls = self.table.lock();
        if calls
            .get(&self.key)
            .is_some_and(|n| Arc::ptr_eq(n, &self.cancelled))
        {
            calls.remove(&self.key);
        }
    }
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes the call `key` until the entry is dropped.
    pub(crate) fn enter(&self, key: String) -> Entry<'_> {
        let cancelled = Arc::new(Notify::new());
        self.lock().insert(key.clone(), cancelled.clone());
        Entry {
            table: self,
            key,
            cancelled,
        }
    }

    /// The client cancelled the call `key`: it stops (no retry, no wait).
    pub(crate) fn cancel(&self, key: &str) {
        if let Some(n) = self.lock().get(key) {
            n.notify_one();
        }
    }
}

/// Who sent a call, and its id: the client, its session (if any) and the
/// JSON text of the id, so one client cannot cancel another's call.
pub(crate) fn key(client: &str, session: Option<&str>, id: &Value) -> String {
    format!("{client}\n{}\n{id}", session.unwrap_or_default())
}

/// The id a client's `notifications/cancelled` names.
pub(crate) fn cancelled_id(body: &[u8]) -> Option<Value> {
    let message: Value = serde_json::from_slice(body).ok()?;
    message.get("params")?.get("requestId").cloned()
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

    #[test]
    fn a_cancel_reaches_only_the_call_of_that_client_and_session() {
        let table = InFlight::default();
        let mine = table.enter(key("alice", Some("s1"), &json!(1)));
        table.cancel(&key("bob", Some("s1"), &json!(1)));
        table.cancel(&key("alice", Some("s2"), &json!(1)));
        table.cancel(&key("alice", Some("s1"), &json!("1")));
        let woken = mine.cancelled.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let early = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(20), woken.notified()).await
        });
        assert!(early.is_err(), "no other key wakes it");
        table.cancel(&key("alice", Some("s1"), &json!(1)));
        let now = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), woken.notified()).await
        });
        assert!(now.is_ok());
        drop(mine);
        assert!(table.lock().is_empty());
    }
}
