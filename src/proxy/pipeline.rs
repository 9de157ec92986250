//! The whole story of one request, as a straight sequence of small steps:
//!
//! ```text
//! admit → route → authenticate → read body → classify → bound identifiers → negotiate → session
//!   → method table → outgoing secret scan
//!   unknown method:  refused (-32601), nothing sent upstream
//!   tools/call:      catalog → authorize → pin → rule arguments → rate limit → Mcp-Param-* → validate → approval (when a rule asks) → forward → relay
//!   lists:           the gateway's own request, every page → remember tools (pins) → serve pinned → filter per client → answer
//!   initialize, server/discover: forward → pin the instructions → relay
//!   read / get / an operator's tool, resource or prompt method: canonical URI (resources) → authorize → rate limit → forward → relay
//!   subscribe, completion, subscriptions/listen: authorize → forward → relay
//!   tasks:           the task's owner → forward → relay (results through the tools/call checks)
//!   lifecycle, notifications: forward → relay
//! ```
//!
//! Dispatch is a match on the method as [`crate::mcp::methods`] typed it
//! (its class, and which method of the specification it is); no method
//! name is compared as a string here.
//!
//! Invariants: a step either passes the exchange on or stops it with a
//! [`Rejection`]; nothing is sent upstream before every step for that method has
//! passed; the same policy decision serves lists and calls; only tools/call,
//! resources/read and prompts/get take rate-limit tokens, and only once the
//! access rules have let them through. A request loads the configuration in
//! force once ([`Live`]) and is decided under it to the end. In observe mode
//! (`mode = "observe"`, per gateway or server) a policy, rate-limit or
//! validation refusal is recorded as `would_refuse` instead of stopping the
//! exchange; transport refusals stop it in every mode. Each step announces
//! itself on the request's trail (`ex.trail.stage(..)`), which makes it a
//! child span of the request when traces are exported.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::request::Parts;
use http::{HeaderMap, Method};
use serde_json::{Map, Value, json};

use super::catalog::ToolSet;
use super::ingress::{admit, negotiate, read_body};
use super::respond::{self, CallFacts, Recipient, relay};
use super::tasks::{self, TaskScope, TaskStore};
use super::upstream::{Reply, UpstreamError, forwarded_headers};
use super::{AppState, Live, ServerState};

mod approve;
mod federate;
mod resource;
use crate::audit::{self, Trail};
use crate::auth::ClientId;
use crate::config::{ArgumentScan, Config, Mode, Pinning, SanitizeSettings};
use crate::error::{
    self, Limit, Limited, RateLimited, Rejection, RenderCtx, ToolRefusal, UpstreamFailure,
};
use crate::mcp::headers::{
    self, MCP_METHOD, MCP_NAME, MCP_PARAM_PREFIX, MCP_PROTOCOL_VERSION, MCP_SESSION_ID,
};
use crate::mcp::jsonrpc::{ClassifyError, Message};
use crate::mcp::limits;
use crate::mcp::methods::{self, Called, Class, Kind, ListKind, Method as Rpc};
use crate::mcp::sse::SseItem;
use crate::mcp::version::Era;
use crate::pins::{self, Cause, Hold, Key as PinKey, scan};
use crate::policy::{Decision, Subject, closest};
use crate::ratelimit::Verdict;
use crate::sanitize::{Report, Sanitizer, Skip};
use crate::telemetry::span::RequestTrace;
use crate::validate::Violation;

/// Accept header sent upstream on POST (MCP requires both).
const ACCEPT_BOTH: &str = "application/json, text/event-stream";
/// Most pages the gateway follows when it collects a list.
const MAX_PAGES: usize = 100;
/// Most names listed in an `unknown_tool` answer.
const MAX_LISTED: usize = 50;

/// What the gateway knows about the request so far.
#[derive(Debug)]
struct Exchange {
    started: Instant,
    client: Option<ClientId>,
    server: Option<String>,
    method: String,
    id: Option<Value>,
    era: Era,
    tool: Option<String>,
    /// In observe mode: what enforcement would have refused the request with.
    would_refuse: Option<&'static str>,
    /// The mode the request was decided under.
    mode: Mode,
    /// The audit event; later stages note on it what they learn.
    trail: Arc<Trail>,
    /// In the merged view: `<server>__`, how the client knows this server's tools.
    prefix: String,
    /// Tasks created through the gateway, and whose they are.
    tasks: Arc<TaskStore>,
    /// The handshake-era session the client presented (the merged view's own
    /// in the merged view): what its `initialize` declared is known by it.
    client_session: Option<String>,
}

impl Exchange {
    fn render_ctx(&self) -> RenderCtx<'_> {
        RenderCtx {
            id: self.id.as_ref(),
            era: self.era,
        }
    }
}

/// Serves one request on `/mcp` or `/mcp/<server>`.
pub(crate) async fn handle(
    state: Arc<AppState>,
    server: Option<String>,
    parts: Parts,
    body: Body,
) -> Response {
    let started = Instant::now();
    let trace = RequestTrace::begin(
        state.traces.exporter(),
        &parts.method,
        parts.version,
        &parts.uri,
        &parts.headers,
    );
    let event = audit::Event {
        time_ms: crate::pins::now_ms(),
        ..Default::default()
    };
    let mut ex = Exchange {
        trail: Trail::new(
            state.audit.clone(),
            state.metrics.clone(),
            state.recent.clone(),
            started,
            event,
            trace,
        ),
        started,
        client: None,
        server: None,
        method: crate::text::clip(parts.method.as_str()),
        id: None,
        era: Era::Legacy,
        tool: None,
        would_refuse: None,
        mode: Mode::Enforce,
        prefix: String::new(),
        tasks: state.tasks.clone(),
        client_session: None,
    };
    // One configuration for the whole request, whatever a reload does meanwhile.
    let live = state.live.load_full();
    let (response, outcome, source) = match serve(&state, &live, &mut ex, server, parts, body).await
    {
        Ok(response) => (response, "forwarded", None),
        Err(rejection) => {
            let code = rejection.code();
            let source = rejection.source();
            (rejection.into_response(ex.render_ctx()), code, Some(source))
        }
    };
    ex.trail.note(|e| {
        e.client = ex.client.as_ref().map(|c| c.name().to_owned());
        e.client_unlisted = ex.client.as_ref().is_some_and(ClientId::is_unlisted);
        e.server = ex.server.clone();
        e.method = ex.method.clone();
        e.tool = ex.tool.clone();
        e.era = ex.era.as_str().to_owned();
        e.http_status = Some(response.status().as_u16());
        e.would_refuse = ex.would_refuse.map(str::to_owned);
        // A tool result rewritten on the way back was decided there.
        if source.is_some() || e.decision.is_empty() {
            e.decision = outcome.to_owned();
            e.stage = source.map_or("forwarded", |s| s.as_str()).to_owned();
        }
    });
    tracing::info!(
        client = ex.client.as_ref().map(ClientId::name),
        server = ex.server.as_deref(),
        method = %ex.method,
        tool = ex.tool.as_deref(),
        era = ex.era.as_str(),
        outcome,
        mode = ex.mode.as_str(),
        would_refuse = ex.would_refuse,
        source = source.map(|s| s.as_str()),
        status = response.status().as_u16(),
        latency_us = ex.started.elapsed().as_micros() as u64,
        trace_id = ex.trail.trace().trace_id(),
        "request"
    );
    response
}

async fn serve(
    state: &Arc<AppState>,
    live: &Live,
    ex: &mut Exchange,
    server: Option<String>,
    parts: Parts,
    body: Body,
) -> Result<Response, Rejection> {
    let config = &*live.config;
    let authority = parts.uri.authority().map(|a| a.as_str());
    admit(&parts.headers, authority, &config.gateway, state.loopback)?;
    ex.trail.stage("authenticate");
    let target = route(live, server)?;
    // The merged view names no one server: only audiences not bound to a
    // single server admit a token there.
    let audience_server = match target {
        Target::One(server) => {
            enter(ex, live, server);
            server.upstream.settings.name.as_str()
        }
        Target::Merged => "",
    };
    let client = config
        .clients
        .authenticate(&parts.headers, audience_server, parts.uri.path())
        .await
        .map_err(Rejection::Unauthenticated)?;
    ex.client = Some(client.clone());
    match (target, parts.method.clone()) {
        (Target::One(server), Method::POST) => {
            ex.trail.stage("read_body");
            let body = read_body(
                &parts.headers,
                body,
                config.gateway.max_request_bytes,
                config.gateway.client_timeout,
            )
            .await?;
            let response = post(state, live, ex, server, &client, &parts.headers, body).await?;
            let name = [server.upstream.settings.name.as_str()];
            Ok(held(state, ex, &client, name, response))
        }
        (Target::One(server), Method::GET | Method::DELETE) => {
            let response = stream_or_end(state, live, server, ex, &client, &parts).await?;
            let name = [server.upstream.settings.name.as_str()];
            Ok(held(state, ex, &client, name, response))
        }
        (Target::Merged, Method::POST) => {
            let body = read_body(
                &parts.headers,
                body,
                config.gateway.max_request_bytes,
                config.gateway.client_timeout,
            )
            .await?;
            let response =
                federate::post_merged(state, live, ex, &client, &parts.headers, body).await?;
            // A merged stream carries every server's notifications: losing any ends it.
            let names = live.servers.keys().map(String::as_str);
            Ok(held(state, ex, &client, names, response))
        }
        (Target::Merged, Method::DELETE) => federate::end(state, live, ex, &client, &parts).await,
        // The merged view offers no GET stream (the spec's 405); 2026-era
        // clients listen with `subscriptions/listen`.
        (Target::Merged, _) => Err(Rejection::MethodNotAllowed("POST, DELETE")),
        _ => Err(Rejection::MethodNotAllowed("GET, POST, DELETE")),
    }
}

/// A stream (a GET stream, `subscriptions/listen`) is held for `client` on
/// each of `servers`, so that a reload revoking its access ends it; any other
/// response is returned as it is.
fn held<'a>(
    state: &AppState,
    ex: &Exchange,
    client: &ClientId,
    servers: impl IntoIterator<Item = &'a str>,
    mut response: Response,
) -> Response {
    if ex.method != "GET" && ex.method != "subscriptions/listen" {
        return response;
    }
    for server in servers {
        response = state.streams.hold(client, server, response);
    }
    response
}

/// What a path names.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    One(&'a ServerState),
    /// `/mcp` with several servers: all of them, tools named `<server>__<tool>`.
    Merged,
}

/// The exchange is now about `server`: it is recorded, and its mode applies.
fn enter(ex: &mut Exchange, live: &Live, server: &ServerState) {
    ex.server = Some(server.upstream.settings.name.clone());
    ex.mode = server
        .upstream
        .settings
        .mode
        .unwrap_or(live.config.gateway.mode);
}

/// `/mcp/<name>`; `/mcp` is the one server, or the merged view of several.
fn route(live: &Live, server: Option<String>) -> Result<Target<'_>, Rejection> {
    match server {
        Some(name) => live
            .servers
            .get(&name)
            .map(|s| Target::One(s))
            .ok_or(Rejection::UnknownServer(name)),
        None if live.servers.len() == 1 => live
            .servers
            .values()
            .next()
            .map(|s| Target::One(s))
            .ok_or(Rejection::UnknownServer(String::new())),
        None => Ok(Target::Merged),
    }
}

async fn post(
    state: &Arc<AppState>,
    live: &Live,
    ex: &mut Exchange,
    server: &ServerState,
    client: &ClientId,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, Rejection> {
    let config = &*live.config;
    ex.trail.stage("classify");
    let message =
        Message::classify(&body, config.gateway.max_json_depth).map_err(Rejection::Malformed)?;
    ex.trail.trace().classified(&message);
    note_message(ex, &message)?;
    ex.trail.stage("negotiate");
    let (era, _version) = negotiate(headers, &message)?;
    ex.era = era;
    let session = session(state, server, client, headers, era)?;
    if ex.client_session.is_none() {
        ex.client_session = session.clone();
    }
    let called = resolve(config, &message, era)?;
    ex.trail.stage("scan_outgoing");
    observe_or_enforce(ex, scan_outgoing(live, &message, &body))?;
    let forward = Forward {
        state,
        live,
        server,
        ex_era: era,
        session: session.as_deref(),
        trail: ex.trail.clone(),
        listen: called.as_ref().map(Called::class) == Some(Class::Subscription),
    };
    let Some(called) = called else {
        // The answer to one of the gateway's own approval questions stays here.
        if let Some(accepted) = answered(state, ex, client, &body)? {
            return Ok(accepted);
        }
        // A client's answer to a server's request (handshake era).
        return forward
            .relay(headers, body, recipient(live, ex, server, None))
            .await;
    };
    match (called.method(), called.class()) {
        (Some(Rpc::ToolsCall), _) => call_tool(ex, &forward, client, headers, &message, body).await,
        (_, Class::List(kind)) => list(config, ex, &forward, client, headers, &message, kind).await,
        (Some(Rpc::Initialize), _) => {
            forward
                .initialize(headers, body, client, recipient(live, ex, server, None))
                .await
        }
        (Some(Rpc::ServerDiscover), _) => {
            let reply = forward
                .send(forward.headers(headers), body, true)
                .await
                .map_err(|e| upstream(&live.sanitize, forward.name(), None, e))?;
            let reply = watch_instructions(reply, &forward, ex.id.clone());
            Ok(relay(reply, recipient(live, ex, server, None)))
        }
        (method, Class::Resource) => {
            let uri = param_str(&message, "uri")?;
            let canonical = resource::canonical(uri)?;
            let subject = Subject::Resource(canonical.identity());
            // Reads take rate-limit tokens; (un)subscribing does not.
            let takes_tokens = !matches!(
                method,
                Some(Rpc::ResourcesSubscribe | Rpc::ResourcesUnsubscribe)
            );
            decide_subject(
                state,
                live,
                ex,
                client,
                server,
                subject,
                takes_tokens,
                || format!("Resource not found: {uri}"),
            )
            .await?;
            let (headers, body) = resource::forwarded(&message, headers, body, &canonical);
            forward
                .relay(&headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Prompt) => {
            let name = param_str(&message, "name")?;
            let subject = Subject::Prompt(name);
            decide_subject(state, live, ex, client, server, subject, true, || {
                format!("Unknown prompt: {name}")
            })
            .await?;
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        // An operator's method of class tool (`tools/call` is served above).
        (_, Class::Tool) => {
            let name = param_str(&message, "name")?;
            ex.tool = Some(name.to_owned());
            let subject = Subject::Tool(name);
            decide_subject(state, live, ex, client, server, subject, true, || {
                format!("Unknown tool: {name}")
            })
            .await?;
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Completion) => {
            ex.trail.stage("authorize");
            let decided = authorize_completion(config, client, server, &message);
            observe_or_enforce(ex, decided)?;
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Subscription) => {
            ex.trail.stage("authorize");
            let decided = authorize_subscriptions(config, client, server, &message);
            observe_or_enforce(ex, decided)?;
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Task) => task(ex, &forward, client, headers, &message, body).await,
        (_, Class::Lifecycle | Class::Notification) => {
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        // The table has no such method from a client; refused like an unknown one.
        (_, Class::ClientFeature) => Err(Rejection::MethodNotFound(ex.method.clone())),
    }
}

/// Right after classification: the edge caps of `mcp::limits` (an overlong
/// identifier is refused before anything reads its meaning), and what the
/// exchange records of the message, bounded either way.
fn note_message(ex: &mut Exchange, message: &Message) -> Result<(), Rejection> {
    ex.id = message.id().filter(|id| limits::id_fits(id)).cloned();
    ex.method = crate::text::clip(message.method().unwrap_or("(response)"));
    limits::check(message).map_err(Rejection::TooLong)
}

/// The method of a client's message, looked up in the method table of its era
/// (and the operator's `[methods]`); `None` for a response, which has none.
/// A method the gateway does not know is refused (-32601) before anything is sent.
fn resolve(config: &Config, message: &Message, era: Era) -> Result<Option<Called>, Rejection> {
    let (name, kind) = match message {
        Message::Request { method, .. } => (method, Kind::Request),
        Message::Notification { method, .. } => (method, Kind::Notification),
        // 2026-07-28 has no server→client requests: a client there sends no responses.
        Message::Response { .. } if era == Era::Modern => {
            return Err(Rejection::Malformed(ClassifyError::Invalid(
                "a 2026-07-28 client sends no JSON-RPC responses (servers send no requests in that era)",
            )));
        }
        Message::Response { .. } => return Ok(None),
    };
    match methods::client_call(name, kind, era, &config.methods) {
        Some(called) => Ok(Some(called)),
        None => Err(Rejection::MethodNotFound(name.clone())),
    }
}

/// A task method (`tasks/get`, `tasks/result`, `tasks/list`, `tasks/cancel`,
/// `tasks/update`, or an operator's method of class task): every task-scoped
/// request of a client passes here, and only here, on its way to the server.
async fn task(
    ex: &mut Exchange,
    forward: &Forward<'_>,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Message,
    body: Bytes,
) -> Result<Response, Rejection> {
    let to = recipient(forward.live, ex, forward.server, None);
    tasks::serve(forward, client, &mut ex.tool, headers, message, body, to).await
}

/// The outgoing secret scan of everything a message carries towards the
/// upstream (`sanitize.arguments = "block"`); `tools/call` arguments are
/// scanned in [`check_call`], under the tool's exemption.
fn scan_outgoing(live: &Live, message: &Message, body: &Bytes) -> Result<(), Rejection> {
    if live.sanitize.arguments != ArgumentScan::Block {
        return Ok(());
    }
    let sanitizer = Sanitizer::new(&live.sanitize, Skip::default());
    let method = message.method().unwrap_or("(response)").to_owned();
    let found = match message {
        Message::Request { params, .. } | Message::Notification { params, .. } => {
            let skip: &[&str] = match method.as_str() {
                "tools/call" => &["/params/arguments"],
                _ => &[],
            };
            params
                .as_ref()
                .map(|p| sanitizer.find_outgoing_members(p, "/params", skip))
                .unwrap_or_default()
        }
        // A client's answer to a server's request (elicitation, sampling, …).
        Message::Response { .. } => serde_json::from_slice::<Value>(body)
            .map(|v| sanitizer.find_outgoing(&v, "", &[]))
            .unwrap_or_default(),
    };
    if found.is_empty() {
        return Ok(());
    }
    if let (Message::Request { .. }, "tools/call") = (message, method.as_str()) {
        let name = message
            .params()
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        return Err(error::secret_in_call(name, &found));
    }
    Err(Rejection::SecretInParams(error::SecretFound {
        request: matches!(message, Message::Request { .. }),
        method,
        found,
    }))
}

/// The session a legacy request presents must be this client's.
fn session(
    state: &AppState,
    server: &ServerState,
    client: &ClientId,
    headers: &HeaderMap,
    era: Era,
) -> Result<Option<String>, Rejection> {
    let presented =
        headers::single(headers, MCP_SESSION_ID).map_err(|m| Rejection::HeaderMismatch(m.0))?;
    match (era, presented) {
        // 2026-07-28 has no sessions; a stray id is ignored (and not forwarded).
        (Era::Modern, _) | (_, None) => Ok(None),
        (Era::Legacy, Some(id))
            if state
                .sessions
                .check(&server.upstream.settings.name, id, client) =>
        {
            Ok(Some(id.to_owned()))
        }
        (Era::Legacy, Some(_)) => Err(Rejection::SessionNotFound),
    }
}

// --- tools/call ---

async fn call_tool(
    ex: &mut Exchange,
    forward: &Forward<'_>,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Message,
    body: Bytes,
) -> Result<Response, Rejection> {
    let name = param_str(message, "name")?.to_owned();
    ex.tool = Some(name.clone());
    let server = forward.server;
    let server_name = server.upstream.settings.name.as_str();
    let sanitize = &forward.live.sanitize;
    ex.trail.stage("catalog");
    let tools = forward
        .tool_set(headers, message, ex.id.as_ref())
        .await
        .map_err(|e| {
            let mut rejection = upstream(sanitize, server_name, Some(&name), e);
            if let Rejection::Upstream(f) = &mut rejection {
                f.unchecked = true;
            }
            rejection
        })?;
    let approval = check_call(
        forward.state,
        forward.live,
        server,
        ex,
        client,
        headers,
        &tools,
        &name,
        message,
    )
    .await;
    let (approval, observed) = match approval {
        Ok(approval) => (approval, false),
        Err(rejection) => {
            observe_or_enforce::<()>(ex, Err(rejection))?;
            (None, true)
        }
    };
    if observed {
        // Observed: the transport's own check of `Mcp-Param-*` still holds.
        if let (Some(entry), Some(Value::Object(args))) = (
            tools.tools.get(&name),
            message.params().and_then(|p| p.get("arguments")),
        ) {
            let input_schema = entry.definition.get("inputSchema").unwrap_or(&Value::Null);
            headers::check_params(headers, args, input_schema, ex.era == Era::Modern)
                .map_err(|m| Rejection::HeaderMismatch(m.0))?;
        }
    }
    let skip = sanitize.skip_for(server_name, &name);
    let facts = match tools.tools.get(&name) {
        Some(entry) => CallFacts::of(entry, skip),
        None => CallFacts::default(),
    };
    let mut to = recipient(forward.live, ex, server, Some(name));
    to.call = facts;
    if let Some(requirement) = approval {
        return approve::approve(
            ex,
            forward,
            client,
            headers,
            message,
            body,
            &requirement,
            to,
        )
        .await;
    }
    forward.relay(headers, body, to).await
}

/// A client's JSON-RPC response whose id has the form of the gateway's own
/// approval questions is delivered to that question and answered 202, never
/// relayed; one that answers no question of this client and session is
/// refused; `None` for any other response (relayed as before).
fn answered(
    state: &AppState,
    ex: &Exchange,
    client: &ClientId,
    body: &Bytes,
) -> Result<Option<Response>, Rejection> {
    use crate::approval::inband::Delivery;
    let Ok(response) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    let session = ex.client_session.as_deref();
    match state
        .approvals
        .questions
        .deliver(client.name(), session, &response)
    {
        Delivery::NotOurs => Ok(None),
        Delivery::Delivered => {
            ex.trail.decided("approval_answered", "approval");
            Ok(Some(approve::accepted()))
        }
        Delivery::Unknown => Err(Rejection::UnknownApprovalAnswer),
    }
}

/// Every decision on a `tools/call`, in order: access rules, pin, the rules'
/// `arguments`, `Mcp-Param-*`, `inputSchema`, secrets in the arguments; when
/// all pass, the approval a rule requires for it (put to a person last).
#[allow(clippy::too_many_arguments)]
async fn check_call(
    state: &AppState,
    live: &Live,
    server: &ServerState,
    ex: &Exchange,
    client: &ClientId,
    headers: &HeaderMap,
    tools: &ToolSet,
    name: &str,
    message: &Message,
) -> Result<Option<crate::approval::Requirement>, Rejection> {
    let config = &*live.config;
    let server_name = server.upstream.settings.name.as_str();
    let sanitize = &config.sanitize;
    let listed = tools.tools.contains_key(name);
    ex.trail.note(|e| e.tool_listed = listed);
    ex.trail.stage("authorize");
    let decision = config
        .policy
        .decide(client, server_name, Subject::Tool(name));
    ex.trail.trace().rule(decision.rule);
    let entry = tools.tools.get(name).filter(|_| decision.allowed);
    let Some(entry) = entry else {
        return Err(unknown_tool(
            config,
            client,
            server_name,
            tools,
            name,
            &ex.prefix,
        ));
    };
    if let Some(hold) = entry.pin.held().or(entry.pin.flagged()) {
        let findings = serde_json::to_value(&*hold.findings).ok();
        ex.trail.note(|e| e.pin_findings = findings);
    }
    if let Some(hold) = entry.pin.held() {
        return Err(pin_quarantined(hold));
    }
    if let Some(flag) = entry.pin.flagged() {
        tracing::warn!(server = server_name, tool = %name, changed = %pins::changed_fields(&flag.changes).join(","),
            findings = flag.findings.len(), "calling a tool whose definition is not the approved one (pinning = warn)");
    }
    let arguments = match message.params().and_then(|p| p.get("arguments")) {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => {
            let v = Violation {
                pointer: String::new(),
                expected: "an object".into(),
                received: "another JSON type".into(),
                description: None,
            };
            return Err(invalid_arguments(name, &[v]));
        }
    };
    let recorded = state.audit.arguments(sanitize, &arguments);
    ex.trail.note(|e| e.arguments = recorded);
    config
        .policy
        .check_arguments(&decision, &arguments)
        .map_err(|(rule, v)| argument_not_permitted(name, rule, &v))?;
    ex.trail.stage("rate_limit");
    rate_limit(state, live, client, server, Subject::Tool(name), &decision).await?;
    ex.trail.stage("validate");
    let schema = entry.schema.as_ref().map_err(|e| quarantined(name, e))?;
    let input_schema = entry.definition.get("inputSchema").unwrap_or(&Value::Null);
    if let Value::Object(args) = &arguments {
        headers::check_params(headers, args, input_schema, ex.era == Era::Modern)
            .map_err(|m| Rejection::HeaderMismatch(m.0))?;
    }
    schema.check(&arguments).map_err(|v| {
        // Where and what was expected; never the value received.
        let lines = v
            .iter()
            .map(|v| format!("{}: expected {}", v.pointer, v.expected))
            .collect();
        ex.trail.note(|e| e.violations = lines);
        invalid_arguments(name, &v)
    })?;
    let skip = sanitize.skip_for(server_name, name);
    if sanitize.arguments == ArgumentScan::Block && !skip.arguments {
        let found = Sanitizer::new(sanitize, skip).find_outgoing(&arguments, "", &[]);
        if !found.is_empty() {
            return Err(error::secret_in_arguments(name, &found));
        }
    }
    Ok(config.policy.approval(&decision).cloned())
}

/// In observe mode a policy, rate-limit or validation refusal is recorded, not
/// enforced (`None`); every other refusal (transport, headers, parameters) is
/// enforced always.
fn observe_or_enforce<T>(
    ex: &mut Exchange,
    decided: Result<T, Rejection>,
) -> Result<Option<T>, Rejection> {
    match decided {
        Ok(value) => Ok(Some(value)),
        Err(
            rejection @ (Rejection::Tool(_)
            | Rejection::NotFound(_)
            | Rejection::RateLimited(_)
            | Rejection::SecretInParams(_)),
        ) if ex.mode == Mode::Observe => {
            ex.would_refuse = Some(rejection.code());
            Ok(None)
        }
        Err(other) => Err(other),
    }
}

/// Takes a token from every bucket the access decision names, or refuses the
/// call and says when it may be made again. Nothing is taken when any bucket refuses.
async fn rate_limit(
    state: &AppState,
    live: &Live,
    client: &ClientId,
    server: &ServerState,
    subject: Subject<'_>,
    decision: &Decision,
) -> Result<(), Rejection> {
    let config = &*live.config;
    let server_name = server.upstream.settings.name.as_str();
    let buckets = live
        .rate_plan
        .buckets(&config.policy, decision, client, server_name, subject);
    if buckets.is_empty() {
        return Ok(());
    }
    let (limit, retry_after) = match state.limiter.check(&buckets).await {
        Verdict::Admitted => return Ok(()),
        Verdict::Limited {
            bucket,
            retry_after,
        } => {
            let bucket = &buckets[bucket];
            let limit = Limit {
                rule: bucket.rule,
                rate: bucket.rate,
                shared_by: config.policy.rule_subjects(bucket.rule, subject),
            };
            (Some(limit), retry_after)
        }
        Verdict::Unavailable => (None, std::time::Duration::from_secs(1)),
    };
    let subject = match subject {
        Subject::Tool(n) => Limited::Tool(n.to_owned()),
        Subject::Resource(u) => Limited::Resource(u.to_owned()),
        Subject::Prompt(n) => Limited::Prompt(n.to_owned()),
    };
    Err(Rejection::RateLimited(RateLimited {
        subject,
        client: client.name().to_owned(),
        limit,
        retry_after,
    }))
}

fn unknown_tool(
    config: &Config,
    client: &ClientId,
    server: &str,
    tools: &ToolSet,
    name: &str,
    prefix: &str,
) -> Rejection {
    let permitted: Vec<String> = tools
        .names()
        .filter(|t| {
            config
                .policy
                .decide(client, server, Subject::Tool(t))
                .allowed
        })
        .map(|t| format!("{prefix}{t}"))
        .collect();
    let place = format!("on server `{server}`");
    refuse_unknown_tool(&format!("{prefix}{name}"), &place, &permitted)
}

/// The `unknown_tool` answer: the closest permitted names, and the list of them.
fn refuse_unknown_tool(name: &str, place: &str, permitted: &[String]) -> Rejection {
    let permitted: Vec<&str> = permitted.iter().map(String::as_str).collect();
    let suggestions = closest(name, &permitted, 3);
    let mut text = format!("The tool `{name}` is not available {place}, so nothing was run.");
    if !suggestions.is_empty() {
        text.push_str(&format!(" Did you mean {}?", quote_list(&suggestions)));
    }
    if permitted.is_empty() {
        text.push_str(&format!(" No tools are available to you {place}."));
    } else {
        let shown: Vec<&str> = permitted.iter().take(MAX_LISTED).copied().collect();
        let more = permitted.len().saturating_sub(MAX_LISTED);
        text.push_str(&format!(" Tools you can call: {}", quote_list(&shown)));
        if more > 0 {
            text.push_str(&format!(" and {more} more (see tools/list)"));
        }
        text.push_str(". Call one of them by its exact name.");
    }
    let mut detail = Map::new();
    detail.insert("tool".into(), name.into());
    detail.insert("suggestions".into(), json!(suggestions));
    detail.insert(
        "permitted".into(),
        json!(permitted.iter().take(MAX_LISTED).collect::<Vec<_>>()),
    );
    Rejection::Tool(ToolRefusal {
        code: "unknown_tool",
        text,
        detail,
    })
}

fn invalid_arguments(tool: &str, violations: &[Violation]) -> Rejection {
    let mut text = format!(
        "The arguments for `{tool}` do not match its input schema, so the tool was not run. Fix {} and call it again:",
        if violations.len() == 1 {
            "this"
        } else {
            "these"
        }
    );
    for v in violations {
        text.push_str("\n- ");
        text.push_str(&v.line());
    }
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("violations".into(), json!(violations));
    Rejection::Tool(ToolRefusal {
        code: "invalid_arguments",
        text,
        detail,
    })
}

fn argument_not_permitted(tool: &str, rule: usize, violations: &[Violation]) -> Rejection {
    let mut text = format!(
        "The arguments for `{tool}` are outside what this gateway's policy permits (rules[{rule}]), so the tool was not run:"
    );
    for v in violations {
        text.push_str("\n- ");
        text.push_str(&v.line());
    }
    text.push_str("\nA call within these limits may be allowed; do not retry the same arguments.");
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("rule".into(), format!("rules[{rule}]").into());
    detail.insert("violations".into(), json!(violations));
    Rejection::Tool(ToolRefusal {
        code: "argument_not_permitted",
        text,
        detail,
    })
}

fn quarantined(tool: &str, reason: &crate::validate::SchemaError) -> Rejection {
    let text = format!(
        "The tool `{tool}` cannot be called through this gateway: its input schema cannot be enforced ({reason}). \
         Nothing was run. An operator must fix the tool's schema on the server; retrying will not help."
    );
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("reason".into(), reason.to_string().into());
    Rejection::Tool(ToolRefusal {
        code: "tool_quarantined",
        text,
        detail,
    })
}

/// A tool whose definition is held by its pin (`pinning = "block"`).
fn pin_quarantined(hold: &Hold) -> Rejection {
    let (server, tool) = (&hold.server, &hold.tool);
    let pinned_at = hold
        .pinned_at
        .map(|ms| format!(" on {}", pins::iso8601(ms)))
        .unwrap_or_default();
    let mut text = format!(
        "The tool `{tool}` on server `{server}` is quarantined by the gateway, so nothing was run. "
    );
    let key = match hold.cause {
        Cause::Changed => {
            let fields = pins::changed_fields(&hold.changes);
            text.push_str(&format!(
                "Its definition changed since it was approved{pinned_at}; clients are still shown the approved definition. \
                 Changed: {}.",
                fields.join(", ")
            ));
            PinKey::tool(server, tool)
        }
        Cause::New => {
            text.push_str(
                "It is new, and its definition was not trusted on first use because the gateway's scan flagged it; \
                 it is not listed until an operator approves it.",
            );
            PinKey::tool(server, tool)
        }
        Cause::Instructions => {
            text.push_str(&format!(
                "The server's instructions changed since they were approved{pinned_at}, so every tool of this server \
                 is held until an operator approves the new instructions."
            ));
            PinKey::instructions(server)
        }
    };
    for change in &hold.changes {
        text.push_str("\n- ");
        text.push_str(&change_line(change, &hold.findings));
    }
    if hold.total_changes > hold.changes.len() {
        text.push_str(&format!(
            "\n- … and {} more",
            hold.total_changes - hold.changes.len()
        ));
    }
    if !hold.findings.is_empty() {
        let found: Vec<String> = hold.findings.iter().map(finding_phrase).collect();
        text.push_str(&format!("\nScan findings: {}.", found.join("; ")));
    }
    let command = pins::approve_command(&hold.config, &key);
    let body = pins::approve_body(&key, Some(&hold.seen_hash));
    text.push_str(&format!(
        "\nRetrying will not help until an operator reviews the definition and approves it, with\n  {command}\n\
         or POST /api/pins/approve on the gateway's admin listener with the admin token (Authorization: Bearer …) and the body {body}. \
         Until then, use other tools or tell the user that `{tool}` awaits approval."
    ));
    let mut detail = Map::new();
    detail.insert("server".into(), server.as_str().into());
    detail.insert("tool".into(), tool.as_str().into());
    let reason = match hold.cause {
        Cause::Changed => "definition_changed",
        Cause::New => "unapproved_definition",
        Cause::Instructions => "instructions_changed",
    };
    detail.insert("reason".into(), reason.into());
    detail.insert("changed".into(), json!(pins::changed_fields(&hold.changes)));
    let findings: Vec<Value> = hold
        .findings
        .iter()
        .map(|f| json!({"kind": f.kind.as_str(), "severity": f.severity, "path": f.path}))
        .collect();
    detail.insert("findings".into(), Value::Array(findings));
    detail.insert(
        "approve".into(),
        json!({"cli": command, "api": {"method": "POST", "path": "/api/pins/approve", "body": body}}),
    );
    Rejection::Tool(ToolRefusal {
        code: "tool_quarantined",
        text,
        detail,
    })
}

/// One change for the model: pointer, approved value → live value, where a
/// value (or a key) the scan flagged is withheld rather than repeated.
fn change_line(change: &pins::Change, findings: &[scan::Finding]) -> String {
    let warnings = findings
        .iter()
        .filter(|f| f.severity == scan::Severity::Warning);
    let mut withheld_value: Vec<&'static str> = Vec::new();
    for f in warnings {
        let (path, key) = match f.path.strip_suffix(" (key)") {
            Some(p) => (p, true),
            None => (f.path.as_str(), false),
        };
        let under = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
        if key && under(&change.pointer, path) {
            return format!("(a change under a key withheld: {})", f.kind.describe());
        }
        if under(path, &change.pointer) || under(&change.pointer, path) {
            withheld_value.push(f.kind.describe());
        }
    }
    let before = change
        .before
        .as_ref()
        .map(pins::short)
        .unwrap_or_else(|| "(absent)".into());
    let after = match &change.after {
        _ if !withheld_value.is_empty() => {
            withheld_value.dedup();
            format!("(withheld: {})", withheld_value.join(", "))
        }
        Some(v) => pins::short(v),
        None => "(removed)".into(),
    };
    let pointer = if change.pointer.is_empty() {
        "/"
    } else {
        &change.pointer
    };
    format!("{pointer}: {before} → {after}")
}

fn finding_phrase(f: &scan::Finding) -> String {
    let place = match f.path.strip_suffix(" (key)") {
        Some(p) => format!("in a key under {}", parent(p)),
        None => format!("in {}", f.path),
    };
    let notice = if f.severity == scan::Severity::Notice {
        " (notice)"
    } else {
        ""
    };
    format!("{} {place}{notice}", f.kind.describe())
}

fn parent(pointer: &str) -> &str {
    match pointer.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &pointer[..i],
    }
}

/// Pins the server's instructions from the reply to `initialize` or
/// `server/discover` as it passes; the reply itself is relayed unchanged.
fn watch_instructions(reply: Reply, forward: &Forward<'_>, id: Option<Value>) -> Reply {
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

// --- lists ---

/// What a list item is, for the rules: the lists the gateway filters per
/// client are the four of [`ListKind`] (`crate::mcp::methods`).
impl ListKind {
    fn subject(self, item: &Value) -> Option<Subject<'_>> {
        let field = |k: &str| item.get(k).and_then(Value::as_str);
        match self {
            ListKind::Tools => field("name").map(Subject::Tool),
            ListKind::Resources => field("uri").map(Subject::Resource),
            ListKind::Templates => field("uriTemplate").map(Subject::Resource),
            ListKind::Prompts => field("name").map(Subject::Prompt),
        }
    }
}

async fn list(
    config: &Config,
    ex: &mut Exchange,
    forward: &Forward<'_>,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Message,
    kind: ListKind,
) -> Result<Response, Rejection> {
    refuse_cursor(message)?;
    match list_items(config, ex, forward, client, headers, message, kind).await? {
        // The upstream refused the list: its error goes back, sanitized.
        Listed::Refused(error, reply_headers) => Ok(respond::json(&error, reply_headers)),
        Listed::Items(visible, result) => Ok(answer_list(ex, kind, &render(&visible), result)),
        Listed::Rendered(visible, result) => Ok(answer_list(ex, kind, &visible, result)),
    }
}

/// The gateway answers every list whole, on one page, and never issues a
/// cursor: a cursor a client sends is not one of the gateway's, and is refused
/// (-32602) rather than letting it choose which page the gateway collects.
fn refuse_cursor(message: &Message) -> Result<(), Rejection> {
    match message.params().and_then(|p| p.get("cursor")) {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(Rejection::InvalidParams(format!(
            "invalid cursor: this gateway answers {} whole on one page and issues no cursors; \
             list again without params.cursor",
            message.method().unwrap_or_default()
        ))),
    }
}

/// The gateway's own request for a whole list, from its first page: nothing
/// the client chose (a cursor, any other parameter) shapes what the gateway
/// collects, remembers in its catalog and filters. A 2026-era request keeps
/// the protocol's `_meta` keys (version, capabilities, client info) of the
/// client's message, which that era requires on every request.
fn own_list_request(era: Era, kind: ListKind, client: &Message, id: Value) -> Value {
    let mut params = Map::new();
    if era == Era::Modern
        && let Some(meta) = client
            .params()
            .and_then(|p| p.get("_meta"))
            .and_then(Value::as_object)
    {
        let keep: Map<String, Value> = meta
            .iter()
            .filter(|(k, _)| k.starts_with("io.modelcontextprotocol/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        params.insert("_meta".into(), Value::Object(keep));
    }
    json!({"jsonrpc": "2.0", "id": id, "method": kind.method().name(), "params": params})
}

/// Items as the JSON text of an array.
fn render(items: &[Value]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".into())
}

/// One server's list as this client may see it: every page, pinned, sanitized, filtered.
async fn list_items(
    config: &Config,
    ex: &mut Exchange,
    forward: &Forward<'_>,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Message,
    kind: ListKind,
) -> Result<Listed, Rejection> {
    let server = forward.server;
    let name = server.upstream.settings.name.as_str();
    let id = match message.id() {
        Some(id) => id.clone(),
        None => json!(format!(
            "portcullis-{}",
            forward.state.next_id.fetch_add(1, Ordering::Relaxed)
        )),
    };
    let request = own_list_request(forward.ex_era, kind, message, id);
    let sanitize = &forward.live.sanitize;
    let sanitizer = Sanitizer::new(sanitize, Skip::default());
    let mut report = Report::default();
    let pages = forward
        .all_pages(headers, request, kind.key())
        .await
        .map_err(|e| upstream(sanitize, name, None, e))?;
    let (items, result, known) = match pages {
        Pages::Complete(items, result, source) => {
            // A tool list from one JSON page is remembered by its bytes.
            let known = (kind == ListKind::Tools).then(|| {
                let set = server.catalog.store(&items);
                if let Some(body) = source {
                    set.remember_source(&body, &result);
                }
                set
            });
            (items, result, known)
        }
        Pages::Unchanged(set, result) => (Vec::new(), result, Some(set)),
        // The upstream refused the list: its error goes back, sanitized.
        Pages::Refused(mut error, reply_headers) => {
            if let Err(m) = sanitizer.message(&mut error, &mut report) {
                let e = UpstreamError::new(crate::error::UpstreamKind::Protocol, m.0);
                return Err(upstream(sanitize, name, None, e));
            }
            ex.trail.sanitized(&report);
            return Ok(Listed::Refused(error, reply_headers));
        }
    };
    // The rest of the list result (`_meta`, fields no schema names) is upstream
    // text like the items.
    let mut rest = Value::Object(result);
    if let Err(m) = sanitizer.definition(&mut rest, &mut report) {
        let e = UpstreamError::new(crate::error::UpstreamKind::Protocol, m.0);
        return Err(upstream(sanitize, name, None, e));
    }
    let result = match rest {
        Value::Object(result) => result,
        _ => Map::new(),
    };
    let observe = ex.mode == Mode::Observe;
    let mut hidden = 0usize;
    let mut permitted = |item: &Value| {
        let allowed = match kind {
            ListKind::Resources => resource::listed(item).is_some_and(|uri| {
                let subject = Subject::Resource(&uri);
                config.policy.decide(client, name, subject).allowed
            }),
            _ => kind
                .subject(item)
                .is_some_and(|s| config.policy.decide(client, name, s).allowed),
        };
        hidden += usize::from(!allowed);
        // Observe mode lists everything and records what would be hidden.
        allowed || observe
    };
    let mut rendered = None;
    let visible: Vec<Value> = if kind == ListKind::Tools {
        // Held tools are listed as pinned (or not at all when never approved);
        // the sanitized view is worked out once per distinct list.
        let set = known.unwrap_or_else(|| server.catalog.store(&items));
        let listed = set.listed(|definitions| {
            definitions
                .into_iter()
                .filter_map(|mut item| {
                    keep_item(&sanitizer, name, &mut item, &mut report).then_some(item)
                })
                .collect()
        });
        if observe {
            listed.iter().filter(|i| permitted(i)).cloned().collect()
        } else {
            // What this client sees of this list under this policy, rendered once.
            rendered = Some(set.rendered(forward.live.generation, client, || {
                let visible: Vec<&Value> = listed.iter().filter(|i| permitted(i)).collect();
                serde_json::to_string(&visible).unwrap_or_else(|_| "[]".into())
            }));
            Vec::new()
        }
    } else {
        items
            .into_iter()
            .filter(|i| permitted(i))
            .filter_map(|mut item| {
                keep_item(&sanitizer, name, &mut item, &mut report).then_some(item)
            })
            .collect()
    };
    ex.trail.sanitized(&report);
    if !report.is_empty() {
        tracing::info!(server = name, method = %ex.method, actions = %report.summary(), "sanitized");
    }
    if observe && hidden > 0 {
        ex.would_refuse = Some("hidden_from_list");
        tracing::info!(server = name, method = %ex.method, would_hide = hidden, "observe mode: items listed that enforcement would hide");
    }
    Ok(match rendered {
        Some(text) => Listed::Rendered(text, result),
        None => Listed::Items(visible, result),
    })
}

/// Sanitizes one list item whole; false when one of its identifiers (its URI,
/// its cursor-like fields) is unusable, and the item is left out of the list.
fn keep_item(
    sanitizer: &Sanitizer<'_>,
    server: &str,
    item: &mut Value,
    report: &mut Report,
) -> bool {
    match sanitizer.definition(item, report) {
        Ok(()) => true,
        Err(m) => {
            tracing::warn!(server, reason = %m.0, "a list item was left out: it is not usable as sent");
            false
        }
    }
}

/// The list as one response: every item (`visible`, a JSON array) on one page.
fn answer_list(
    ex: &Exchange,
    kind: ListKind,
    visible: &str,
    mut result: Map<String, Value>,
) -> Response {
    result.remove(kind.key());
    result.remove("nextCursor");
    if ex.era == Era::Modern {
        // The list depends on who asked: no shared cache may serve it to another client.
        result.insert("cacheScope".into(), "private".into());
    }
    let id = ex.id.clone().unwrap_or(Value::Null);
    // The rest of the result, then the items spliced in as they were rendered.
    let rest = serde_json::to_string(&result).unwrap_or_else(|_| "{}".into());
    let open = rest.strip_suffix('}').unwrap_or("{");
    let comma = if open.len() > 1 { "," } else { "" };
    let key = kind.key();
    let id = serde_json::to_string(&id).unwrap_or_else(|_| "null".into());
    let body =
        format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{open}{comma}"{key}":{visible}}}}}"#);
    respond::json_text(body, HeaderMap::new())
}

/// A list as one server gave it to this client.
enum Listed {
    Items(Vec<Value>, Map<String, Value>),
    /// Items already rendered as a JSON array (the tools fast path).
    Rendered(Arc<str>, Map<String, Value>),
    /// The server answered the list with an error (sanitized).
    Refused(Value, HeaderMap),
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

// --- resources, prompts, completions ---

/// The access rules for a subject a request names (a resource, a prompt, an
/// operator's tool method), then, when it `takes_tokens`, its rate limits: one
/// decision for the list and the use. A hidden subject gets `hidden()`, the
/// answer an unknown one gets.
#[allow(clippy::too_many_arguments)]
async fn decide_subject(
    state: &AppState,
    live: &Live,
    ex: &mut Exchange,
    client: &ClientId,
    server: &ServerState,
    subject: Subject<'_>,
    takes_tokens: bool,
    hidden: impl FnOnce() -> String,
) -> Result<(), Rejection> {
    ex.trail.stage("authorize");
    let decided = authorize_or_hide(&live.config, client, server, subject, hidden);
    if let Some(decision) = observe_or_enforce(ex, decided)?
        && takes_tokens
    {
        ex.trail.stage("rate_limit");
        let limited = rate_limit(state, live, client, server, subject, &decision).await;
        observe_or_enforce(ex, limited)?;
    }
    Ok(())
}

fn authorize_or_hide(
    config: &Config,
    client: &ClientId,
    server: &ServerState,
    subject: Subject<'_>,
    not_found: impl FnOnce() -> String,
) -> Result<Decision, Rejection> {
    let decision = config
        .policy
        .decide(client, &server.upstream.settings.name, subject);
    if decision.allowed {
        Ok(decision)
    } else {
        // The same answer a missing resource or prompt gets: no existence oracle.
        Err(Rejection::NotFound(not_found()))
    }
}

fn authorize_completion(
    config: &Config,
    client: &ClientId,
    server: &ServerState,
    message: &Message,
) -> Result<(), Rejection> {
    let reference = message.params().and_then(|p| p.get("ref"));
    let field = |k: &str| reference.and_then(|r| r.get(k)).and_then(Value::as_str);
    match field("type") {
        Some("ref/prompt") => {
            let name = field("name").unwrap_or_default();
            authorize_or_hide(config, client, server, Subject::Prompt(name), || {
                format!("Unknown prompt: {name}")
            })
            .map(drop)
        }
        Some("ref/resource") => {
            let uri = field("uri").unwrap_or_default();
            let subject = resource::completion_subject(uri)?;
            authorize_or_hide(config, client, server, Subject::Resource(&subject), || {
                format!("Resource not found: {uri}")
            })
            .map(drop)
        }
        _ => Err(Rejection::InvalidParams(
            "completion/complete needs params.ref of type ref/prompt or ref/resource".into(),
        )),
    }
}

/// `subscriptions/listen` (2026-07-28): every URI in
/// `params.notifications.resourceSubscriptions` must be a resource this client
/// may read; a hidden one gets the answer a missing one gets.
fn authorize_subscriptions(
    config: &Config,
    client: &ClientId,
    server: &ServerState,
    message: &Message,
) -> Result<(), Rejection> {
    for uri in subscribed_uris(message)? {
        authorize_or_hide(config, client, server, Subject::Resource(uri), || {
            format!("Resource not found: {uri}")
        })?;
    }
    Ok(())
}

/// The URIs a `subscriptions/listen` subscribes to (none when it names none).
fn subscribed_uris(message: &Message) -> Result<Vec<&str>, Rejection> {
    let subscribed = message
        .params()
        .and_then(|p| p.get("notifications"))
        .and_then(|n| n.get("resourceSubscriptions"));
    let invalid = || {
        Rejection::InvalidParams(
            "subscriptions/listen needs params.notifications.resourceSubscriptions to be a list of URI strings"
                .into(),
        )
    };
    match subscribed {
        None => Ok(Vec::new()),
        Some(Value::Array(uris)) => uris
            .iter()
            .map(|u| u.as_str().ok_or_else(invalid))
            .collect(),
        Some(_) => Err(invalid()),
    }
}

// --- GET stream and DELETE (handshake era) ---

async fn stream_or_end(
    state: &Arc<AppState>,
    live: &Live,
    server: &ServerState,
    ex: &mut Exchange,
    client: &ClientId,
    parts: &Parts,
) -> Result<Response, Rejection> {
    let version = headers::single(&parts.headers, MCP_PROTOCOL_VERSION)
        .map_err(|m| Rejection::HeaderMismatch(m.0))?;
    if version.and_then(Era::of) == Some(Era::Modern) {
        return Err(Rejection::MethodNotAllowed("POST"));
    }
    let session = session(state, server, client, &parts.headers, Era::Legacy)?;
    let accept = if parts.method == Method::GET {
        "text/event-stream"
    } else {
        ACCEPT_BOTH
    };
    let mut out = forwarded_headers(&parts.headers, accept);
    ex.trail
        .trace()
        .forward(&mut out, None, server.upstream.settings.url());
    let name = server.upstream.settings.name.clone();
    let sent = Instant::now();
    // A GET stream lives as long as the session: no idle limit.
    let reply = server
        .upstream
        .exchange(parts.method.clone(), out, None, None)
        .await
        .map_err(|e| upstream(&live.sanitize, &name, None, e))?;
    ex.trail
        .upstream(reply_status(&reply).as_u16(), sent.elapsed());
    if let Some(id) = &session {
        let status = reply_status(&reply);
        if parts.method == Method::DELETE
            && (status.is_success() || status == http::StatusCode::NOT_FOUND)
        {
            state.sessions.remove(&name, id);
        }
    }
    Ok(relay(reply, recipient(live, ex, server, None)))
}

// --- forwarding ---

/// Everything needed to send this request's messages upstream.
pub(super) struct Forward<'a> {
    pub(super) state: &'a Arc<AppState>,
    pub(super) live: &'a Live,
    server: &'a ServerState,
    ex_era: Era,
    session: Option<&'a str>,
    /// Notes the upstream's status and latency.
    trail: Arc<Trail>,
    /// A `subscriptions/listen`: its stream has no idle limit.
    listen: bool,
}

impl Forward<'_> {
    fn headers(&self, client: &HeaderMap) -> HeaderMap {
        let mut out = forwarded_headers(client, ACCEPT_BOTH);
        if self.ex_era == Era::Modern {
            out.remove(MCP_SESSION_ID);
        }
        out
    }

    pub(super) fn name(&self) -> &str {
        &self.server.upstream.settings.name
    }

    async fn send(
        &self,
        mut headers: HeaderMap,
        body: Bytes,
        idle: bool,
    ) -> Result<super::upstream::Reply, UpstreamError> {
        let upstream = &self.server.upstream;
        let url = upstream.settings.url();
        let body = (self.trail.trace()).forward(&mut headers, Some(body), url);
        let sent = Instant::now();
        let idle = idle.then_some(upstream.settings.timeout);
        let mut reply = upstream.exchange(Method::POST, headers, body, idle).await?;
        if self.ex_era == Era::Modern {
            // The 2026 era has no sessions: an upstream's session id is not relayed.
            reply_headers_mut(&mut reply).remove(MCP_SESSION_ID);
        }
        self.trail
            .upstream(reply_status(&reply).as_u16(), sent.elapsed());
        if let Some(session) = self.session
            && reply_status(&reply) == http::StatusCode::NOT_FOUND
        {
            // The upstream ended the session; the binding goes with it.
            self.state.sessions.remove(self.name(), session);
        }
        Ok(reply)
    }

    /// Forwards the client's body and relays the reply.
    pub(super) async fn relay(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        to: Recipient,
    ) -> Result<Response, Rejection> {
        // `subscriptions/listen` streams stay open for as long as the client listens.
        let reply = self
            .send(self.headers(headers), body, !self.listen)
            .await
            .map_err(|e| to.failure(e))?;
        Ok(relay(reply, to))
    }

    /// Forwards `initialize` and binds the session the upstream mints to this client.
    async fn initialize(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        client: &ClientId,
        to: Recipient,
    ) -> Result<Response, Rejection> {
        let body_caps = initialize_capabilities(&body);
        let reply = self
            .send(self.headers(headers), body, true)
            .await
            .map_err(|e| to.failure(e))?;
        if let Some(id) = reply_headers(&reply)
            .get(MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            self.state.sessions.bind(self.name(), id, client);
            remember_elicitation(self.state, client, id, &body_caps);
        }
        let reply = watch_instructions(reply, self, to.id.clone());
        Ok(relay(reply, to))
    }

    /// The server's tools, fetched with the client's session and era when not known yet.
    async fn tool_set(
        &self,
        headers: &HeaderMap,
        call: &Message,
        _id: Option<&Value>,
    ) -> Result<Arc<ToolSet>, UpstreamError> {
        if let Some(tools) = self.server.catalog.get() {
            return Ok(tools);
        }
        let id = json!(format!(
            "portcullis-{}",
            self.state.next_id.fetch_add(1, Ordering::Relaxed)
        ));
        let request = own_list_request(self.ex_era, ListKind::Tools, call, id);
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
        if self.ex_era == Era::Modern {
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

/// `params.capabilities` of an `initialize` request.
pub(super) fn initialize_capabilities(body: &[u8]) -> Option<Value> {
    let message: Value = serde_json::from_slice(body).ok()?;
    message.get("params")?.get("capabilities").cloned()
}

/// Records whether the session a client opened can be asked for approval in
/// band (it declared the elicitation capability at `initialize`).
pub(super) fn remember_elicitation(
    state: &AppState,
    client: &ClientId,
    session: &str,
    capabilities: &Option<Value>,
) {
    let elicits = crate::approval::inband::declares_elicitation(capabilities.as_ref());
    let max = state.approvals.settings.max_sessions;
    state
        .approvals
        .sessions
        .remember(client.name(), session, elicits, max);
}

/// `HeaderMap` without `Mcp-Param-*` (they belong to one tool call).
trait RetainParamFree {
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

fn reply_headers(reply: &super::upstream::Reply) -> &HeaderMap {
    use super::upstream::Reply;
    match reply {
        Reply::Json { headers, .. }
        | Reply::Sse { headers, .. }
        | Reply::Empty { headers, .. }
        | Reply::Other { headers, .. } => headers,
    }
}

fn reply_headers_mut(reply: &mut super::upstream::Reply) -> &mut HeaderMap {
    use super::upstream::Reply;
    match reply {
        Reply::Json { headers, .. }
        | Reply::Sse { headers, .. }
        | Reply::Empty { headers, .. }
        | Reply::Other { headers, .. } => headers,
    }
}

fn reply_status(reply: &super::upstream::Reply) -> http::StatusCode {
    use super::upstream::Reply;
    match reply {
        Reply::Json { status, .. }
        | Reply::Sse { status, .. }
        | Reply::Empty { status, .. }
        | Reply::Other { status, .. } => *status,
    }
}

fn recipient(live: &Live, ex: &Exchange, server: &ServerState, tool: Option<String>) -> Recipient {
    let tasks = ex.client.clone().map(|client| TaskScope {
        store: ex.tasks.clone(),
        client,
        creates: ex.method == "tools/call",
    });
    Recipient {
        tasks,
        id: ex.id.clone(),
        method: ex.method.clone(),
        era: ex.era,
        server: server.upstream.settings.name.clone(),
        tool,
        catalog: server.catalog.clone(),
        sanitize: live.sanitize.clone(),
        call: CallFacts::default(),
        trail: ex.trail.clone(),
    }
}

/// A failure met before any reply could be relayed; its upstream words are sanitized.
fn upstream(
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

fn param_str<'m>(message: &'m Message, key: &str) -> Result<&'m str, Rejection> {
    message
        .params()
        .and_then(|p| p.get(key))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            let method = message.method().unwrap_or_default();
            Rejection::InvalidParams(format!("{method} needs params.{key}, a string"))
        })
}

/// The message as a JSON value again (to send it page by page).
fn rebuild(message: &Message) -> Value {
    let mut v = json!({"jsonrpc": "2.0", "method": message.method().unwrap_or_default()});
    if let Some(id) = message.id() {
        v["id"] = id.clone();
    }
    if let Some(params) = message.params() {
        v["params"] = Value::Object(params.clone());
    }
    v
}

fn quote_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
