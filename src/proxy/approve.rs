//! The approval step of a `tools/call`: where the pipeline hands a call a
//! rule marks for approval to [`crate::approval`] and acts on its answer.
//!
//! Place in the path: after every check of [`super::check_call`] passed, just
//! before the call is forwarded — for `/mcp/<server>` and the merged view
//! alike (both decide calls in [`super::call_tool`]).
//!
//! Invariants: nothing is forwarded unless the gate says run; what the
//! gateway added for its own approval (`requestState`, its answer, the
//! approval id) is taken out of the params before they are forwarded; in
//! observe mode the call is forwarded and "would ask" is recorded; a 2025-era
//! question and the call's result travel on the call's own SSE stream, and a
//! configuration reloaded while the call waited ends it unrun.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::{StreamExt, stream};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Map, Value, json};

use super::exchange::{Exchange, canonical_body, rebuild};
use super::forward::Forward;
use super::state::AppState;
use crate::approval::{Binding, Call, Gate, Refusal, Requirement, gate, inband, render};
use crate::auth::ClientId;
use crate::config::Mode;
use crate::error::{self, Rejection, RenderCtx};
use crate::identity::Caller;
use crate::mcp::jsonrpc::Message;
use crate::mcp::version::Era;
use crate::proxy::respond::{self, Recipient};

/// The `_meta` key of 2026-era client capabilities.
const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// Puts the call to a person (or lets it through in observe mode), then
/// forwards it only on a yes.
#[allow(clippy::too_many_arguments)]
pub(super) async fn approve(
    ex: &mut Exchange,
    forward: &Forward<'_>,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Message,
    requirement: &Requirement,
    to: Recipient,
) -> Result<Response, Rejection> {
    let approvals = forward.state.approvals.clone();
    let empty = Map::new();
    let params = message.params().unwrap_or(&empty);
    let tool = params
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let server = forward.name().to_owned();
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(a) => a.clone(),
    };
    let modern = ex.era == Era::Modern;
    let can_elicit = if modern {
        let meta = params.get("_meta").and_then(|m| m.get(CLIENT_CAPABILITIES));
        inband::declares_elicitation(meta)
    } else {
        ex.client_session
            .as_deref()
            .is_some_and(|s| approvals.sessions.elicits(client.name(), s))
    };
    let call = Call {
        binding: Binding::new(client.name(), &server, tool, &arguments),
        requirement,
        params,
        modern,
        can_elicit,
        session: ex.client_session.as_deref(),
        shown: shown(forward, &arguments),
        now_ms: crate::util::time::now_ms(),
    };
    let shown_tool = format!("{}{tool}", ex.prefix);
    let note = |outcome: &str| {
        let value = json!({"by": requirement.by.as_str(), "outcome": outcome,
            "digest": call.binding.digest_hex(), "rule": format!("rules[{}]", requirement.rule),
            "arguments_shown": call.shown});
        ex.trail.note(|e| e.approval = Some(value));
    };
    if ex.mode == Mode::Observe {
        approvals.observed(&call);
        note("would_ask");
        ex.would_refuse.get_or_insert("approval_required");
        return forward.relay(headers, canonical_body(message), to).await;
    }
    let refused = |r: &Refusal| error::approval_refused(&shown_tool, &server, r);
    match approvals.gate(&call) {
        Gate::Run { strip, restore } => {
            note("approved");
            let body = if strip {
                stripped(message, restore.as_ref())
            } else {
                canonical_body(message)
            };
            forward.relay(headers, body, to).await
        }
        Gate::InputRequired(result) => {
            note("asked");
            ex.trail.decided("approval_asked", "approval");
            let id = ex.id.clone().unwrap_or(Value::Null);
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
            Ok(respond::json(&answer, HeaderMap::new()))
        }
        Gate::Refuse(refusal) => {
            note("refused");
            Err(refused(&refusal))
        }
        Gate::Hold { entry, decision } => {
            note("asked");
            match approvals.hold(&entry, decision, requirement.timeout).await {
                Ok(()) => {
                    note("approved");
                    forward.relay(headers, stripped(message, None), to).await
                }
                Err(refusal) => {
                    note("refused");
                    Err(refused(&refusal))
                }
            }
        }
        Gate::AskOnStream {
            id,
            request,
            answer,
            timeout,
        } => {
            note("asked");
            let binding = call.binding.clone();
            let waited = OnStream {
                state: forward.state.clone(),
                generation: forward.live.generation,
                session: forward.session.map(str::to_owned),
                era: forward.ex_era,
                headers: headers.clone(),
                body: stripped(message, None),
                refused_as: (shown_tool, server),
                caller: forward.caller.clone(),
            };
            let rest = async move {
                let got = approvals.await_answer(&binding, &id, answer, timeout).await;
                waited.finish(got, to).await
            };
            let first = Bytes::from(sse_event(&request));
            let body = stream::once(async move { Ok::<_, std::io::Error>(first) })
                .chain(stream::once(rest).flatten());
            let mut response = Response::new(Body::from_stream(body));
            let h = response.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            h.insert("x-accel-buffering", HeaderValue::from_static("no"));
            Ok(response)
        }
    }
}

/// What a call held on its SSE stream needs to be forwarded later.
struct OnStream {
    state: Arc<AppState>,
    generation: u64,
    session: Option<String>,
    era: Era,
    headers: HeaderMap,
    body: Bytes,
    refused_as: (String, String),
    /// Whom the call is forwarded for once approved.
    caller: Caller,
}

type Chunks = futures_util::stream::BoxStream<'static, Result<Bytes, std::io::Error>>;

impl OnStream {
    /// After the answer: the refusal, or the forwarded call's reply, as the
    /// rest of the stream.
    async fn finish(self, got: Result<(), Refusal>, to: Recipient) -> Chunks {
        let id = to.id.clone();
        let cx = RenderCtx {
            id: id.as_ref(),
            era: self.era,
        };
        let (tool, server) = &self.refused_as;
        let refusal = got.err();
        let live = self.state.live.load_full();
        let refusal = refusal.or_else(|| {
            (live.generation != self.generation || !live.servers.contains_key(server))
                .then_some(Refusal::Reloaded)
        });
        if let Some(refusal) = refusal {
            let message = error::approval_refused(tool, server, &refusal).tool_message(cx);
            return one_event(message);
        }
        let Some(server_state) = live.servers.get(server) else {
            return one_event(None);
        };
        let forward = Forward {
            state: &self.state,
            live: &live,
            server: server_state,
            ex_era: self.era,
            session: self.session.as_deref(),
            trail: to.trail.clone(),
            listen: false,
            caller: self.caller,
        };
        match forward.relay(&self.headers, self.body.clone(), to).await {
            Err(rejection) => one_event(rejection.rpc_message(cx)),
            Ok(response) => as_events(response, cx).await,
        }
    }
}

/// The forwarded call's response as SSE events: an SSE body as it is, a JSON
/// body as one event.
async fn as_events(response: Response, cx: RenderCtx<'_>) -> Chunks {
    let sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let status = response.status();
    let body = response.into_body();
    if sse && status == StatusCode::OK {
        return body
            .into_data_stream()
            .map(|c| c.map_err(std::io::Error::other))
            .boxed();
    }
    let bytes = axum::body::to_bytes(body, usize::MAX).await.ok();
    let message = bytes
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .or_else(|| Some(error::unreadable_after_approval(cx)));
    one_event(message)
}

fn one_event(message: Option<Value>) -> Chunks {
    let text = message.map(|m| sse_event(&m)).unwrap_or_default();
    stream::once(async move { Ok(Bytes::from(text)) }).boxed()
}

fn sse_event(message: &Value) -> String {
    // Compact JSON has no raw newline: one `data:` line.
    format!("event: message\ndata: {message}\n\n")
}

/// The call as forwarded: without the gateway's own approval parameters
/// (its `requestState`, the answer under its reserved key, the approval id),
/// whether or not a rule asks for approval.
pub(super) fn stripped(message: &Message, round: Option<&Value>) -> Bytes {
    let mut value = rebuild(message);
    if let Some(Value::Object(params)) = value.get_mut("params") {
        gate::strip(params, round);
    }
    Bytes::from(crate::util::canonical::to_vec(&value))
}

/// The arguments as every person who judges the call sees them: the one
/// rendering ([`render::arguments`]) of exactly what is forwarded, each
/// secret withheld whatever `[sanitize] secrets` says.
fn shown(forward: &Forward<'_>, arguments: &Value) -> String {
    let settings = &forward.live.sanitize;
    let secrets = |text: &str| {
        crate::sanitize::secrets_in(settings, text)
            .into_iter()
            .map(|(start, end, kind)| render::Secret { start, end, kind })
            .collect()
    };
    render::arguments(arguments, &secrets)
}

/// HTTP 202 with no body: a client's answer the gateway took.
pub(super) fn accepted() -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

/// A client's JSON-RPC response whose id has the form of the gateway's own
/// approval questions is delivered to that question and answered 202, never
/// relayed; one that answers no question of this client and session is
/// refused; `None` for any other response (relayed as before).
pub(super) fn answered(
    state: &AppState,
    ex: &Exchange,
    client: &ClientId,
    body: &Bytes,
) -> Result<Option<Response>, Rejection> {
    let Ok(response) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    let session = ex.client_session.as_deref();
    match state
        .approvals
        .questions
        .deliver(client.name(), session, &response)
    {
        inband::Delivery::NotOurs => Ok(None),
        inband::Delivery::Delivered => {
            ex.trail.decided("approval_answered", "approval");
            Ok(Some(accepted()))
        }
        inband::Delivery::Unknown => Err(Rejection::UnknownApprovalAnswer),
    }
}
