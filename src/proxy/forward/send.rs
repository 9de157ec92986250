//! Sending one request upstream as the resilience rules say: the breaker's
//! admission, the tries [`crate::proxy::retry`] allows with their spans and
//! audit detail, and for a tool call its deadline and cancellation
//! ([`crate::proxy::deadline`]).
//!
//! Place: the last step of [`super::Forward`] before the upstream.
//!
//! Invariants: nothing is sent while the breaker is open (but its probe);
//! every try ends before a tool's deadline; a call the client cancelled is
//! not sent again; the breaker hears the outcome of the last try only.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method};
use serde_json::Value;
use tokio::time::Instant;

use super::{Forward, reply_headers_mut, reply_status};
use crate::mcp::headers::MCP_SESSION_ID;
use crate::mcp::version::Era;
use crate::proxy::breaker::Admit;
use crate::proxy::deadline::{self, CancelGuard};
use crate::proxy::reply::{Framing, Reply, UpstreamError};
use crate::proxy::retry::{Retries, broken, cause};

/// A `tools/call`: its id, and its deadline when `[servers.NAME.timeouts]`
/// names one for the tool.
pub(in crate::proxy) struct Call<'c> {
    pub(in crate::proxy) id: &'c Value,
    pub(in crate::proxy) limit: Option<Duration>,
}

impl Forward<'_> {
    /// [`Self::send`], retried as [`crate::proxy::retry`] allows: `repeatable`
    /// when the request is a call of a tool the operator says may run twice;
    /// `call` for a tool call (its deadline, its cancellation).
    pub(in crate::proxy) async fn send_as(
        &self,
        mut headers: HeaderMap,
        body: Bytes,
        idle: bool,
        repeatable: bool,
        call: Option<Call<'_>>,
    ) -> Result<Reply, UpstreamError> {
        let upstream = &self.server.upstream;
        let url = upstream.settings.url();
        // Each try is a forward span of its own, named in its `traceparent`.
        let original = body.clone();
        let mut body = (self.trail.trace()).forward(&mut headers, Some(body), url);
        // No credential, no request: the refusal says what is missing.
        let credential = self
            .server
            .identity
            .credential(&self.caller, &self.live.config.identity)
            .await
            .map_err(UpstreamError::credentials)?;
        let breaker = &upstream.settings.breaker;
        if let Admit::Open(wait) = upstream.breaker.admit(breaker) {
            return Err(self.open(wait));
        }
        let sent = Instant::now();
        let limit = call.as_ref().and_then(|c| c.limit);
        // A tool's own deadline bounds each wait and the whole call.
        let window = limit.unwrap_or(upstream.settings.timeout);
        let idle = idle.then_some(window);
        let deadline = sent + window;
        let entry = (call.as_ref()).map(|c| {
            let key = deadline::key(self.caller.client.name(), self.session, c.id);
            upstream.in_flight.enter(key)
        });
        let mut guard = (call.as_ref()).and_then(|c| {
            CancelGuard::new(upstream, headers.clone(), credential.clone(), c.id.clone())
        });
        let retry = &upstream.settings.retry;
        let mut retries = Retries::new(retry, &upstream.budget, repeatable, deadline.into_std());
        let mut causes = Vec::new();
        let mut reply = loop {
            let exchange = upstream.exchange(
                Method::POST,
                headers.clone(),
                credential.clone(),
                body.clone(),
                idle,
            );
            let outcome = match limit {
                Some(limit) => (tokio::time::timeout_at(deadline, exchange).await)
                    .unwrap_or_else(|_| Err(deadline::past(limit))),
                None => exchange.await,
            };
            let mut pause = retries.after(&outcome);
            if let Some(wait) = pause {
                let why = cause(&outcome);
                tracing::info!(server = %upstream.settings.name, attempt = retries.tries() + 1, cause = %why,
                    pause_ms = wait.as_millis() as u64, "sending the request to the server again");
                self.trail.trace().attempt_failed(&why);
                causes.push(why);
                let cancelled = async {
                    match &entry {
                        Some(entry) => entry.cancelled.notified().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = cancelled => {
                        tracing::info!(server = %upstream.settings.name,
                            "the client cancelled the call: it is not sent again");
                        causes.pop();
                        pause = None;
                    }
                }
            }
            if pause.is_none() {
                if upstream.breaker.record(!broken(&outcome), breaker) {
                    tracing::warn!(server = %upstream.settings.name, cool_down_ms = breaker.cool_down.as_millis() as u64,
                        "circuit breaker opened: the server's calls are answered at once until a probe succeeds");
                }
                if retries.tries() > 1 {
                    let attempts = retries.tries();
                    self.trail.note(|e| {
                        e.retries = Some(crate::record::event::Retries { attempts, causes })
                    });
                }
                break self.settle(outcome, guard.take(), call.as_ref(), deadline, limit)?;
            }
            let attempt = retries.tries() + 1;
            body = (self.trail.trace()).forward_try(
                &mut headers,
                Some(original.clone()),
                url,
                attempt,
            );
        };
        drop(entry);
        if self.ex_era == Era::Modern {
            // The 2026 era has no sessions: an upstream's session id is not relayed.
            reply_headers_mut(&mut reply).remove(MCP_SESSION_ID);
        }
        self.trail
            .upstream(reply_status(&reply).code(), sent.elapsed());
        if let Some(session) = self.session
            && reply_status(&reply) == Framing::Http(http::StatusCode::NOT_FOUND)
        {
            // The upstream ended the session; the binding goes with it.
            self.state.sessions.remove(self.name(), session);
        }
        Ok(reply)
    }

    /// The last try's outcome, with what a tool call still owes: a stream
    /// cut at the deadline and carrying the guard that cancels the call if
    /// the client goes before its answer; no cancellation for an answer
    /// that came whole or a request that was never sent.
    fn settle(
        &self,
        outcome: Result<Reply, UpstreamError>,
        guard: Option<CancelGuard>,
        call: Option<&Call<'_>>,
        deadline: Instant,
        limit: Option<Duration>,
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
                let cut = limit.map(|limit| (deadline, limit));
                let events = deadline::cut(events, cut, Some(guard), call.id.clone());
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
                } else if e.kind == crate::error::UpstreamKind::Timeout {
                    guard.because("the call ran past its deadline");
                }
                Err(e)
            }
        }
    }
}
