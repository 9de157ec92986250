//! Sending a decided request to its upstream and relaying what comes back:
//! the [`Forward`] of one request, header policy, the upstream failure
//! conversion, GET streams.
//!
//! Place: the last step on the way in, the first on the way back. Invariant:
//! nothing reaches this step before every check of its method has passed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, Method};
use serde_json::{Map, Value, json};

use super::state::{AppState, Live, ServerState};

use crate::proxy::breaker::Admit;
use crate::proxy::catalog::ToolSet;
use crate::proxy::deadline::{self, CancelGuard};
use crate::proxy::inflight;
use crate::proxy::respond::{self, Recipient, relay};
use crate::proxy::retry::{Retries, broken, cause};
use crate::transport::forwarded_headers;
use crate::transport::reply::{Framing, Reply, UpstreamError};

use crate::auth::ClientId;
use crate::config::{Pinning, SanitizeSettings};
use crate::error::{self, Rejection, UpstreamFailure};
use crate::identity::Caller;
use crate::mcp::headers::{MCP_METHOD, MCP_NAME, MCP_PARAM_PREFIX, MCP_SESSION_ID};
use crate::mcp::methods::ListKind;
use crate::mcp::request::{Ask, Request};
use crate::mcp::sse::SseItem;
use crate::mcp::version::Era;
use crate::record::trail::Trail;
use crate::sanitize::{Report, Sanitizer, Skip};

/// Pins the server's instructions from the reply to `initialize` or
/// `server/discover` as it passes; the reply itself is relayed unchanged.
pub(super) fn watch_instructions(reply: Reply, forward: &Forward, id: Option<Value>) -> Reply {
    let settings = &forward.server.upstream.settings;
    let mode = settings.pinning;
    if mode == Pinning::Off {
        return reply;
    }
    let pins = forward.state.pins.clone();
    let name = settings.name.clone();
    let observe = move |message: &Value| {
        if message.get("id") != id.as_ref() {
            return;
        }
        if let Some(result) = message.get("result").and_then(Value::as_object) {
            let instructions = result.get("instructions").cloned().unwrap_or(Value::Null);
            pins.observe_instructions(&name, mode, &instructions);
        }
    };
    match reply {
        Reply::Json {
            status,
            headers,
            body,
        } => {
            if let Ok(message) = serde_json::from_slice::<Value>(&body) {
                observe(&message);
            }
            Reply::Json {
                status,
                headers,
                body,
            }
        }
        Reply::Sse {
            status,
            headers,
            events,
        } => {
            let events = events.inspect(move |item| {
                if let Ok(SseItem::Event(event)) = item
                    && !event.data.is_empty()
                    && let Ok(message) = serde_json::from_str::<Value>(&event.data)
                {
                    observe(&message);
                }
            });
            Reply::Sse {
                status,
                headers,
                events: Box::pin(events),
            }
        }
        other => other,
    }
}

/// Accept header sent upstream on POST (MCP requires both).
pub(super) const ACCEPT_BOTH: &str = "application/json, text/event-stream";

/// Everything needed to send this request's messages to one server: made
/// from the request's context ([`super::context::Context::forward_to`]).
#[derive(Clone)]
pub(super) struct Forward {
    pub(super) state: Arc<AppState>,
    pub(super) live: Arc<Live>,
    pub(super) server: Arc<ServerState>,
    pub(super) era: Era,
    /// The server's own handshake-era session.
    pub(super) session: Option<String>,
    /// Notes the upstream's status and latency.
    pub(super) trail: Arc<Trail>,
    /// A `subscriptions/listen`: its stream has no idle limit.
    pub(super) listen: bool,
    /// Whom it is sent for: the server's identity mode gives the credential.
    pub(super) caller: Caller,
}

impl Forward {
    /// The same request sent under `live`, the configuration in force now,
    /// to `server` as that configuration has it (a call that waited for a
    /// person runs under the configuration in force when it runs).
    pub(super) fn under(self, live: Arc<Live>, server: Arc<ServerState>) -> Self {
        Self {
            live,
            server,
            ..self
        }
    }

    pub(super) fn headers(&self, client: &HeaderMap) -> HeaderMap {
        let mut out = forwarded_headers(client, ACCEPT_BOTH);
        if self.era == Era::Modern {
            out.remove(MCP_SESSION_ID);
        }
        out
    }

    pub(super) fn name(&self) -> &str {
        &self.server.upstream.settings.name
    }

    pub(super) async fn send(
        &self,
        headers: HeaderMap,
        body: Bytes,
        idle: bool,
    ) -> Result<crate::transport::reply::Reply, UpstreamError> {
        self.send_as(headers, body, idle, false, None).await
    }

    /// [`Self::send`], retried as [`crate::proxy::retry`] allows: `repeatable`
    /// when the request is a call of a tool the operator says may run twice;
    /// `call` for a tool call (its deadline, its cancellation).
    pub(super) async fn send_as(
        &self,
        mut headers: HeaderMap,
        body: Bytes,
        idle: bool,
        repeatable: bool,
        call: Option<deadline::Call<'_>>,
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
        let admitted = upstream.breaker.admit(breaker);
        if let Admit::Open(wait) = admitted {
            return Err(deadline::open(&self.live, self.name(), wait));
        }
        // Dropped with this future before an outcome is recorded, it hands the probe back.
        let mut probe = (admitted == Admit::Probe).then(|| upstream.breaker.probing());
        let sent = tokio::time::Instant::now();
        let limit = call.as_ref().and_then(|c| c.limit);
        // A tool's own deadline bounds each wait and the whole call.
        let window = limit.unwrap_or(upstream.settings.timeout);
        // Between events: the server's `timeout`, or a longer deadline (a
        // shorter one cuts the whole call instead, with its own words).
        let idle = idle.then_some(window.max(upstream.settings.timeout));
        let due = sent + window;
        let entry = (call.as_ref()).map(|c| {
            let key = inflight::key(self.caller.client.name(), self.session.as_deref(), c.id);
            upstream.in_flight.enter(key)
        });
        let mut guard = (call.as_ref()).and_then(|c| {
            CancelGuard::new(upstream, headers.clone(), credential.clone(), c.id.clone())
        });
        let retry = &upstream.settings.retry;
        let mut retries = Retries::new(retry, &upstream.budget, repeatable, due.into_std());
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
                Some(limit) => (tokio::time::timeout_at(due, exchange).await)
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
                if let Some(probe) = probe.take() {
                    probe.settled();
                }
                if retries.tries() > 1 {
                    let attempts = retries.tries();
                    self.trail.note(|e| {
                        e.retries = Some(crate::record::event::Retries { attempts, causes })
                    });
                }
                break deadline::settle(outcome, guard.take(), call.as_ref(), due)?;
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
        if self.era == Era::Modern {
            // The 2026 era has no sessions: an upstream's session id is not relayed.
            reply_headers_mut(&mut reply).remove(MCP_SESSION_ID);
        }
        self.trail
            .upstream(reply_status(&reply).code(), sent.elapsed());
        if let Some(session) = self.session.as_deref()
            && reply_status(&reply) == Framing::Http(http::StatusCode::NOT_FOUND)
        {
            // The upstream ended the session; the binding goes with it.
            self.state.sessions.remove(self.name(), session);
        }
        Ok(reply)
    }

    /// The client gave up on its call `id`: it is not sent again (the
    /// notification itself goes on to the server).
    pub(super) fn cancel_in_flight(&self, id: &Value) {
        let key = inflight::key(self.caller.client.name(), self.session.as_deref(), id);
        self.server.upstream.in_flight.cancel(&key);
    }

    /// Forwards the client's body and relays the reply.
    pub(super) async fn relay(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        to: Recipient,
    ) -> Result<Response, Rejection> {
        super::flow::before_forward(to.flow.as_ref(), &to.trail).await?;
        let retry = &self.server.upstream.settings.retry;
        let hints = &to.call.hints;
        let repeatable = (to.tool.as_deref())
            .is_some_and(|tool| retry.repeatable(tool, hints.read_only, hints.idempotent));
        let call = match (&to.tool, &to.id) {
            (Some(tool), Some(id)) => Some(deadline::Call {
                id,
                limit: self.server.upstream.settings.call_timeout(tool),
            }),
            _ => None,
        };
        // `subscriptions/listen` streams stay open for as long as the client listens.
        let reply = self
            .send_as(self.headers(headers), body, !self.listen, repeatable, call)
            .await
            .map_err(|e| to.failure(e))?;
        Ok(relay(reply, to))
    }

    /// Forwards `initialize` and binds the session the upstream mints to this
    /// client, with what its `capabilities` declared (can it be asked in band).
    pub(super) async fn initialize(
        &self,
        headers: &HeaderMap,
        request: &Request,
        body: Bytes,
        client: &ClientId,
        to: Recipient,
    ) -> Result<Response, Rejection> {
        let capabilities = match request.ask() {
            Ask::Initialize { capabilities, .. } => capabilities.as_ref(),
            _ => None,
        };
        let reply = self
            .send(self.headers(headers), body, true)
            .await
            .map_err(|e| to.failure(e))?;
        if let Some(id) = reply_headers(&reply)
            .get(MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            self.state.sessions.bind(self.name(), id, client);
            self.state
                .approvals
                .remember_session(client.name(), id, capabilities);
        }
        let reply = watch_instructions(reply, self, to.id.clone());
        Ok(relay(reply, to))
    }

    /// The server's tools, fetched with the client's session and era when not known yet.
    pub(super) async fn tool_set(
        &self,
        headers: &HeaderMap,
        call: &Request,
        _id: Option<&Value>,
    ) -> Result<Arc<ToolSet>, UpstreamError> {
        if let Some(tools) = self.server.catalog.get() {
            return Ok(tools);
        }
        let id = json!(format!(
            "portcullis-{}",
            self.state.next_id.fetch_add(1, Ordering::Relaxed)
        ));
        let request = own_list_request(self.era, ListKind::Tools, call, id);
        match self
            .all_pages(headers, request, ListKind::Tools.key())
            .await?
        {
            Pages::Complete(items, result, source) => {
                let set = self.server.catalog.store(&items);
                if let Some(body) = source {
                    set.remember_source(&body, &result);
                }
                Ok(set)
            }
            Pages::Unchanged(set, _) => Ok(set),
            Pages::Refused(..) => Err(UpstreamError::new(
                crate::error::UpstreamKind::Protocol,
                "it refused to list its tools",
            )),
        }
    }

    /// Sends `request` and follows `nextCursor` until the list is complete.
    pub(super) async fn all_pages(
        &self,
        client_headers: &HeaderMap,
        mut request: Value,
        key: &str,
    ) -> Result<Pages, UpstreamError> {
        let mut headers = self.headers(client_headers);
        headers.remove(MCP_NAME);
        headers.retain_param_free();
        if self.era == Era::Modern {
            let method = request
                .get("method")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if let Ok(v) = http::HeaderValue::from_str(&method) {
                headers.insert(MCP_METHOD, v);
            }
        }
        let mut items = Vec::new();
        for page in 0..MAX_PAGES {
            if page > 0 {
                let id = format!(
                    "portcullis-{}",
                    self.state.next_id.fetch_add(1, Ordering::Relaxed)
                );
                request["id"] = id.into();
            }
            let id = request.get("id").cloned().unwrap_or(Value::Null);
            let body = Bytes::from(serde_json::to_vec(&request).unwrap_or_default());
            let reply = self.send(headers.clone(), body, true).await?;
            let reply_headers = reply_headers(&reply).clone();
            // The same tool list as last time, byte for byte: nothing to parse.
            let source = match &reply {
                Reply::Json { body, .. } if page == 0 && key == "tools" => Some(body.clone()),
                _ => None,
            };
            if let Some(body) = &source
                && let Some(set) = self.server.catalog.get()
                && let Some(rest) = set.same_source(body, &id)
            {
                return Ok(Pages::Unchanged(set, rest));
            }
            let mut response = respond::collect(reply, &id, &self.server.catalog).await?;
            // Taken, not cloned: a list can be large.
            let mut result = match response.get_mut("result").map(Value::take) {
                Some(Value::Object(result)) => result,
                taken => {
                    if let Some(other) = taken {
                        response["result"] = other;
                    }
                    return Ok(Pages::Refused(response, reply_headers));
                }
            };
            if let Some(Value::Array(page_items)) = result.remove(key) {
                items.extend(page_items);
            }
            match result.get("nextCursor").cloned() {
                Some(cursor @ Value::String(_)) => {
                    request["params"]["cursor"] = cursor;
                }
                _ => {
                    let source = source.filter(|_| page == 0);
                    return Ok(Pages::Complete(items, result, source));
                }
            }
        }
        Err(UpstreamError::new(
            crate::error::UpstreamKind::Protocol,
            format!("its list has more than {MAX_PAGES} pages"),
        ))
    }
}

/// `HeaderMap` without `Mcp-Param-*` (they belong to one tool call).
pub(super) trait RetainParamFree {
    fn retain_param_free(&mut self);
}

impl RetainParamFree for HeaderMap {
    fn retain_param_free(&mut self) {
        let names: Vec<_> = self
            .keys()
            .filter(|k| k.as_str().starts_with(MCP_PARAM_PREFIX))
            .cloned()
            .collect();
        for name in names {
            self.remove(name);
        }
    }
}

pub(super) fn reply_headers(reply: &crate::transport::reply::Reply) -> &HeaderMap {
    use crate::transport::reply::Reply;
    match reply {
        Reply::Json { headers, .. }
        | Reply::Sse { headers, .. }
        | Reply::Empty { headers, .. }
        | Reply::Other { headers, .. } => headers,
    }
}

pub(super) fn reply_headers_mut(reply: &mut crate::transport::reply::Reply) -> &mut HeaderMap {
    use crate::transport::reply::Reply;
    match reply {
        Reply::Json { headers, .. }
        | Reply::Sse { headers, .. }
        | Reply::Empty { headers, .. }
        | Reply::Other { headers, .. } => headers,
    }
}

/// How the reply was framed: the upstream's HTTP status, or none (stdio).
pub(super) fn reply_status(reply: &crate::transport::reply::Reply) -> Framing {
    use crate::transport::reply::Reply;
    match reply {
        Reply::Json { status, .. } | Reply::Sse { status, .. } | Reply::Empty { status, .. } => {
            *status
        }
        Reply::Other { status, .. } => Framing::Http(*status),
    }
}

/// A failure met before any reply could be relayed; its upstream words are sanitized.
pub(super) fn upstream(
    sanitize: &SanitizeSettings,
    server: &str,
    tool: Option<&str>,
    e: UpstreamError,
) -> Rejection {
    let mut f = UpstreamFailure::new(e.kind, server, tool, e.reason);
    f.not_run = e.not_run;
    let sanitizer = Sanitizer::new(sanitize, Skip::default());
    f.relayed = e
        .error
        .and_then(|error| super::respond::relayed_error(&sanitizer, *error, &mut Report::default()))
        .map(Box::new);
    f.snippet = e.snippet.as_deref().and_then(|raw| {
        let mut report = Report::default();
        let clean = sanitizer.text(raw, &mut report);
        if sanitizer.blocks_secrets() && !report.secret_kinds().is_empty() {
            return Some(format!(
                "[withheld: it contained {}]",
                report.secret_kinds().join(", ")
            ));
        }
        error::snippet(clean.as_deref().unwrap_or(raw))
    });
    Rejection::Upstream(f)
}

/// Most pages the gateway follows when it collects a list.
pub(super) const MAX_PAGES: usize = 100;

/// The gateway's own request for a whole list, from its first page: nothing
/// the client chose (a cursor, any other parameter) shapes what the gateway
/// collects, remembers in its catalog and filters. A 2026-era request keeps
/// the protocol's `_meta` keys (version, capabilities, client info) of the
/// client's message, which that era requires on every request.
pub(super) fn own_list_request(era: Era, kind: ListKind, client: &Request, id: Value) -> Value {
    Request::own_list(id, kind, client, era == Era::Modern).to_value()
}

/// Outcome of collecting a paginated list.
pub(super) enum Pages {
    /// Every item, the last page's result without them, and the reply's body
    /// when the list came as one JSON page (to recognise it next time).
    Complete(Vec<Value>, Map<String, Value>, Option<Bytes>),
    /// A tool list byte for byte the one the current snapshot was made from.
    Unchanged(Arc<ToolSet>, Map<String, Value>),
    Refused(Value, HeaderMap),
}
