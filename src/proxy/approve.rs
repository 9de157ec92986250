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
//! question and the call's result travel on the call's own SSE stream. A call
//! that waited for a person is decided again against the configuration in
//! force when it would run ([`Held`]): one that no longer lets it through
//! (the tool denied, its `arguments` refused, the client or server removed,
//! a flow rule refusing it for what its session holds now, a credential in
//! its arguments now blocked, another approver required) ends unrun with
//! `approval_expired`, as does a
//! 2026-07-28 retry carrying the gateway's state for such a call ([`lapsed`]).
//! Its rate-limit token is taken only then, right before it is forwarded.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::{StreamExt, stream};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Map, Value, json};

use super::context::{Context, canonical_body};
use super::flow;
use super::forward::Forward;
use super::rate::take;
use super::state::{AppState, Live, ServerState};
use crate::approval::state::Signer;
use crate::approval::{Approver, Binding, Call, Gate, Refusal, Requirement, gate, inband, render};
use crate::auth::ClientId;
use crate::config::{ArgumentScan, Config, Mode};
use crate::error::{self, Rejection, RenderCtx};
use crate::flow::SessionKey;
use crate::mcp::methods::Method as Rpc;
use crate::mcp::request::{META_CLIENT_CAPABILITIES, Request};
use crate::mcp::version::Era;
use crate::policy::{Decision, Facts, Subject};
use crate::proxy::respond::{self, Recipient};
use crate::record::trail::Trail;
use crate::sanitize::Sanitizer;

/// A call's arguments as an approval binds them: absent or `null` is `{}`.
fn call_arguments(request: &Request) -> Value {
    match request.arguments() {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(a) => a.clone(),
    }
}

/// Puts the call to a person (or lets it through in observe mode), then
/// forwards it only on a yes.
#[allow(clippy::too_many_arguments)]
pub(super) async fn approve(
    ctx: &mut Context,
    forward: &Forward,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Request,
    (requirement, decision, annotations): (&Requirement, &Decision, Option<&Value>),
    to: Recipient,
) -> Result<Response, Rejection> {
    let approvals = forward.state.approvals.clone();
    let tool = message.tool().unwrap_or_default();
    let server = forward.name().to_owned();
    let arguments = call_arguments(message);
    let modern = ctx.era == Era::Modern;
    let can_elicit = if modern {
        let meta = message.meta_value(META_CLIENT_CAPABILITIES);
        inband::declares_elicitation(meta)
    } else {
        ctx.client_session
            .as_deref()
            .is_some_and(|s| approvals.sessions.elicits(client.name(), s))
    };
    let call = Call {
        binding: Binding::new(client.name(), &server, tool, &arguments),
        requirement,
        round: message.round(),
        modern,
        can_elicit,
        session: ctx.client_session.as_deref(),
        shown: shown(forward, &arguments),
        now_ms: crate::util::time::now_ms(),
    };
    let shown_tool = format!("{}{tool}", ctx.prefix);
    let note = |outcome: &str| {
        let value = json!({"by": requirement.by.as_str(), "outcome": outcome,
            "digest": call.binding.digest_hex(), "rule": format!("rules[{}]", requirement.rule),
            "arguments_shown": call.shown});
        ctx.trail.note(|e| e.approval = Some(value));
    };
    if ctx.mode == Mode::Observe {
        approvals.observed(&call);
        note("would_ask");
        ctx.would_refuse.get_or_insert("approval_required");
        let taken = take(forward, client, Subject::Tool(tool), decision).await;
        ctx.observe_or_enforce(taken)?;
        return forward.relay(headers, canonical_body(message), to).await;
    }
    let refused = |r: &Refusal| error::approval_refused(&shown_tool, &server, r);
    match approvals.gate(&call).await {
        Gate::Run { strip, restore } => {
            // A retried call, decided under the configuration in force now.
            note("approved");
            take(forward, client, Subject::Tool(tool), decision).await?;
            let body = if strip {
                stripped(message, restore.as_ref())
            } else {
                canonical_body(message)
            };
            forward.relay(headers, body, to).await
        }
        Gate::InputRequired(result) => {
            note("asked");
            ctx.trail.decided("approval_asked", "approval");
            let id = ctx.id.clone().unwrap_or(Value::Null);
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
            Ok(respond::json(&answer, HeaderMap::new()))
        }
        Gate::Refuse(refusal) => {
            note("refused");
            Err(refused(&refusal))
        }
        Gate::Hold {
            entry,
            decision: decided,
        } => {
            note("asked");
            let held = Held::new(forward, client, headers, message, &arguments)
                .with_claims(ctx.token.as_ref().map(|t| t.claims().clone()))
                .in_session(ctx.flow_key(client, &server, message))
                .annotated(annotations);
            let held = held.refused_as(shown_tool.clone());
            match approvals.hold(&entry, decided, requirement.timeout).await {
                Ok(()) => {
                    note("approved");
                    held.run(Approver::Operator, to).await
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
            let waited = Held::new(forward, client, headers, message, &arguments)
                .with_claims(ctx.token.as_ref().map(|t| t.claims().clone()))
                .in_session(ctx.flow_key(client, &server, message))
                .annotated(annotations)
                .refused_as(shown_tool);
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

/// A call waiting for a person, and what it needs to be decided again and
/// forwarded once the answer comes.
struct Held {
    /// The configuration it was decided and asked under.
    asked_under: Arc<Config>,
    client: ClientId,
    server: String,
    tool: String,
    arguments: Value,
    /// The verified JWT's claims, for the rules' `when` when decided again.
    claims: Option<Map<String, Value>>,
    /// The tool's annotations as the catalog held them when it was asked,
    /// for the rules' `when` when decided again.
    annotations: Option<Value>,
    /// Its session's flow labels, for the flow rules when decided again.
    flow: SessionKey,
    headers: HeaderMap,
    /// The call as forwarded (the gateway's own parameters taken out).
    body: Bytes,
    /// The tool as the client named it (the merged view's prefix included).
    shown_tool: String,
    /// How it reaches its server once approved (its era, session and
    /// caller), re-pointed at the configuration in force when it runs.
    forward: Forward,
}

type Chunks = futures_util::stream::BoxStream<'static, Result<Bytes, std::io::Error>>;

impl Held {
    fn new(
        forward: &Forward,
        client: &ClientId,
        headers: &HeaderMap,
        message: &Request,
        arguments: &Value,
    ) -> Self {
        let tool = message.tool().unwrap_or_default().to_owned();
        Self {
            asked_under: forward.live.config.clone(),
            client: client.clone(),
            server: forward.name().to_owned(),
            shown_tool: tool.clone(),
            tool,
            arguments: arguments.clone(),
            claims: None,
            annotations: None,
            flow: SessionKey {
                client: client.clone(),
                scope: String::new(),
            },
            headers: headers.clone(),
            body: stripped(message, None),
            forward: forward.clone(),
        }
    }

    fn with_claims(mut self, claims: Option<Map<String, Value>>) -> Self {
        self.claims = claims;
        self
    }

    fn annotated(mut self, annotations: Option<&Value>) -> Self {
        self.annotations = annotations.cloned();
        self
    }

    fn in_session(mut self, flow: SessionKey) -> Self {
        self.flow = flow;
        self
    }

    fn refused_as(mut self, shown_tool: String) -> Self {
        self.shown_tool = shown_tool;
        self
    }

    /// The call decided again against `live`, the configuration in force
    /// now, and its session's flow labels now: its server, and the access
    /// decision whose rates it is charged. Anything that no longer lets it
    /// through as it was approved ends it — a flow rule that refuses it
    /// included.
    async fn redecide(
        &self,
        live: &Live,
        answered_by: Approver,
        trail: &Trail,
    ) -> Result<(Arc<ServerState>, Decision), Rejection> {
        let reloaded =
            || error::approval_refused(&self.shown_tool, &self.server, &Refusal::Reloaded);
        let config = &live.config;
        let server = live.servers.get(&self.server).ok_or_else(reloaded)?;
        if !config
            .clients
            .still_admits(&self.asked_under.clients, &self.client)
        {
            return Err(reloaded());
        }
        let flows = (&*self.forward.state.flows, &config.policy, &config.flow);
        let labels = flow::labels(flows, &self.flow, &self.tool).await?;
        let facts = Facts {
            claims: self.claims.as_ref(),
            method: Rpc::ToolsCall.name(),
            arguments: Some(&self.arguments),
            annotations: self.annotations.as_ref(),
            query: None,
            labels: &labels,
        };
        let decision = config
            .policy
            .decide_call(&self.client, &self.server, &self.tool, &facts)
            .map_err(|_| reloaded())?;
        if !decision.allowed {
            return Err(reloaded());
        }
        config
            .policy
            .check_arguments(&decision, &self.arguments)
            .map_err(|_| reloaded())?;
        // The outgoing secret scan as it stands now (a reload may have turned it on).
        let sanitize = &live.sanitize;
        let skip = sanitize.skip_for(&self.server, &self.tool);
        if sanitize.arguments == ArgumentScan::Block
            && !skip.arguments
            && !(Sanitizer::new(sanitize, skip).find_outgoing(&self.arguments, "", &[])).is_empty()
        {
            return Err(reloaded());
        }
        let (server_name, tool) = (self.server.as_str(), self.tool.as_str());
        let of = (server_name, tool, self.annotations.as_ref());
        let held = flow::check(flows, trail, &self.flow, of, &decision)
            .await
            .map_err(|r| match r.code() {
                // The store's own refusal: the call may run once it answers.
                "state_unavailable" => r,
                _ => reloaded(),
            })?;
        // The answer given must still be one the live rules accept.
        let wanted = config.policy.approval(&decision).into_iter().chain(held);
        if let Some(now) = config.policy.strictest_approval(wanted) {
            let accepted = match (now.by, answered_by) {
                (Approver::Either, _) => true,
                (wanted, by) => wanted == by,
            };
            if !accepted {
                return Err(reloaded());
            }
        }
        Ok((server.clone(), decision))
    }

    /// After a yes from `answered_by`: decided again, its token taken, forwarded.
    async fn run(self, answered_by: Approver, to: Recipient) -> Result<Response, Rejection> {
        let live = self.forward.state.live.load_full();
        let (server, decision) = self.redecide(&live, answered_by, &to.trail).await?;
        let forward = self.forward.clone().under(live, server);
        take(&forward, &self.client, Subject::Tool(&self.tool), &decision).await?;
        forward.relay(&self.headers, self.body.clone(), to).await
    }

    /// After the answer on the call's stream: the refusal, or the forwarded
    /// call's reply, as the rest of the stream.
    async fn finish(self, got: Result<(), Refusal>, to: Recipient) -> Chunks {
        let id = to.id.clone();
        let cx = RenderCtx {
            id: id.as_ref(),
            era: self.forward.era,
        };
        if let Err(refusal) = got {
            let message =
                error::approval_refused(&self.shown_tool, &self.server, &refusal).tool_message(cx);
            return one_event(message);
        }
        match self.run(Approver::User, to).await {
            Err(rejection) => one_event(rejection.rpc_message(cx)),
            Ok(response) => as_events(response, cx).await,
        }
    }
}

/// A 2026-07-28 retry carrying the gateway's own state for exactly this call,
/// which the configuration in force no longer lets through (`unknown_tool`,
/// `argument_not_permitted`): the approval lapsed with the configuration it
/// was asked under, and the call ends with `approval_expired`. Any other
/// refusal is returned as it is.
pub(super) fn lapsed(
    forward: &Forward,
    ctx: &Context,
    client: &ClientId,
    message: &Request,
    rejection: Rejection,
) -> Rejection {
    let lapses = matches!(rejection.code(), "unknown_tool" | "argument_not_permitted");
    let state = message.round().state_str().filter(|s| Signer::is_ours(s));
    let (Some(state), true, true) = (state, lapses, ctx.era == Era::Modern) else {
        return rejection;
    };
    let tool = message.tool().unwrap_or_default();
    let arguments = call_arguments(message);
    let binding = Binding::new(client.name(), forward.name(), tool, &arguments);
    let now = crate::util::time::now_ms();
    match forward.state.approvals.signer.verify(state, &binding, now) {
        Ok(verified) if verified.same_arguments => {
            let shown_tool = format!("{}{tool}", ctx.prefix);
            error::approval_refused(&shown_tool, forward.name(), &Refusal::Reloaded)
        }
        _ => rejection,
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
pub(super) fn stripped(message: &Request, round: Option<&Value>) -> Bytes {
    Bytes::from(message.forwarded_bytes(&gate::strip(message.round(), round)))
}

/// The arguments as every person who judges the call sees them: the one
/// rendering ([`render::arguments`]) of exactly what is forwarded, each
/// secret withheld whatever `[sanitize] secrets` says.
fn shown(forward: &Forward, arguments: &Value) -> String {
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
    ctx: &Context,
    client: &ClientId,
    body: &Bytes,
) -> Result<Option<Response>, Rejection> {
    let Ok(response) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    let session = ctx.client_session.as_deref();
    match state
        .approvals
        .questions
        .deliver(client.name(), session, &response)
    {
        inband::Delivery::NotOurs => Ok(None),
        inband::Delivery::Delivered => {
            ctx.trail.decided("approval_answered", "approval");
            Ok(Some(accepted()))
        }
        inband::Delivery::Unknown => Err(Rejection::UnknownApprovalAnswer),
    }
}
