//! The answer to one request of a stdio server as the client receives it:
//! the notifications the child sends for the request, then its response, as
//! an SSE stream.
//!
//! Place: beneath [`super::Stdio`], which registers the request and decides
//! between a plain JSON reply and this stream. Invariants: notifications
//! queued before the response are sent first; the gap between two messages
//! is bounded by the server's `timeout`; a request whose waiter goes away
//! leaves the table and is cancelled at the child.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::shared::{Life, Shared, line_of, unavailable};
use crate::error::UpstreamKind;
use crate::mcp::sse::{SseEvent, SseItem};
use crate::transport::reply::{SseStream, UpstreamError};
use crate::util::time::humanize;

/// Removes a request from the table when its waiter goes away; one still
/// unanswered is cancelled at the child.
pub(super) struct InFlight {
    pub(super) shared: Arc<Shared>,
    pub(super) gid: u64,
    pub(super) life: Arc<Life>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let removed = self.shared.lock().remove(&self.gid);
        if removed.is_some() {
            let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": self.gid, "reason": "the client stopped waiting"}});
            let _ = self.life.stdin.try_send(line_of(&cancel));
        }
    }
}

/// The messages for one request: notifications, then its response.
pub(super) struct Wait {
    pub(super) notes: mpsc::Receiver<Value>,
    pub(super) done: oneshot::Receiver<Result<Value, UpstreamError>>,
    /// Dropped with the wait: the request leaves the table.
    pub(super) _in_flight: InFlight,
    pub(super) finished: bool,
}

pub(super) enum Next {
    Note(Value),
    End(Result<Value, UpstreamError>),
}

impl Wait {
    pub(super) async fn next(&mut self) -> Next {
        tokio::select! {
            // Notifications queued before the response go first.
            biased;
            Some(note) = self.notes.recv() => Next::Note(note),
            done = &mut self.done => {
                self.finished = true;
                Next::End(done.unwrap_or_else(|_| Err(unavailable("the server process exited"))))
            }
        }
    }
}

/// The SSE stream of a request whose notifications came before its
/// response; `idle` bounds the gap between two messages.
pub(super) fn sse(first: Value, wait: Wait, idle: Option<Duration>) -> SseStream {
    struct State {
        first: Option<Value>,
        wait: Wait,
        idle: Option<Duration>,
    }
    let state = State {
        first: Some(first),
        wait,
        idle,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        if let Some(first) = st.first.take() {
            return Some((Ok(event(&first)), st));
        }
        if st.wait.finished {
            return None;
        }
        let next = match st.idle {
            Some(idle) => match tokio::time::timeout(idle, st.wait.next()).await {
                Ok(next) => next,
                Err(_) => {
                    st.wait.finished = true;
                    let e = UpstreamError::new(
                        UpstreamKind::Timeout,
                        format!("it sent nothing for {}", humanize(idle)),
                    );
                    return Some((Err(e), st));
                }
            },
            None => st.wait.next().await,
        };
        match next {
            Next::Note(note) => Some((Ok(event(&note)), st)),
            Next::End(Ok(response)) => Some((Ok(event(&response)), st)),
            Next::End(Err(e)) => Some((Err(e), st)),
        }
    });
    let boxed: Pin<Box<dyn Stream<Item = Result<SseItem, UpstreamError>> + Send>> =
        Box::pin(stream);
    boxed
}

fn event(message: &Value) -> SseItem {
    SseItem::Event(SseEvent {
        data: message.to_string(),
        ..SseEvent::default()
    })
}
