//! The whole story of one request, as a straight sequence of small steps:
//!
//! ```text
//! admit → route → authenticate → read body → classify → bound identifiers → negotiate → session
//!   → method table → typed request (mcp::request) → outgoing secret scan
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
//! (its class, and which method of the specification it is), and every step
//! reads the message as [`crate::mcp::request`] typed it once: no parameter
//! is read by its key and no method name is compared as a string after
//! classification (`tests/suite/typed_request.rs` keeps it so).
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

use super::call::held;
use super::dispatch::post;
use super::exchange::{Exchange, enter};
use super::forward::stream_or_end;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::response::Response;
use http::Method;
use http::request::Parts;

use super::state::{AppState, Live, ServerState};
use crate::proxy::ingress::{admit, read_body};

use crate::audit;
use crate::auth::ClientId;
use crate::config::Mode;
use crate::error::Rejection;
use crate::mcp::version::Era;
use crate::record::span::RequestTrace;
use crate::record::trail::Trail;

use super::federate;
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
        time_ms: crate::util::time::now_ms(),
        ..Default::default()
    };
    let mut ex = Exchange {
        trail: Trail::new(state.sinks.clone(), started, event, trace),
        started,
        client: None,
        token: None,
        server: None,
        method: crate::util::text::clip(parts.method.as_str()),
        rpc: None,
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
    let authenticated = config
        .clients
        .authenticate(&parts.headers, audience_server, parts.uri.path())
        .await
        .map_err(Rejection::Unauthenticated)?;
    let client = authenticated.client;
    ex.client = Some(client.clone());
    ex.token = authenticated.token;
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
            Ok(held(state, ex, &client, name, false, response))
        }
        (Target::One(server), Method::GET | Method::DELETE) => {
            let response = stream_or_end(state, live, server, ex, &client, &parts).await?;
            let name = [server.upstream.settings.name.as_str()];
            let get_stream = parts.method == Method::GET;
            Ok(held(state, ex, &client, name, get_stream, response))
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
            Ok(held(state, ex, &client, names, false, response))
        }
        (Target::Merged, Method::DELETE) => federate::end(state, live, ex, &client, &parts).await,
        // The merged view offers no GET stream (the spec's 405); 2026-era
        // clients listen with `subscriptions/listen`.
        (Target::Merged, _) => Err(Rejection::MethodNotAllowed("POST, DELETE")),
        _ => Err(Rejection::MethodNotAllowed("GET, POST, DELETE")),
    }
}

/// What a path names.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    One(&'a ServerState),
    /// `/mcp` with several servers: all of them, tools named `<server>__<tool>`.
    Merged,
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

// --- tools/call ---

// --- lists ---

// --- resources, prompts, completions ---

// --- GET stream and DELETE (handshake era) ---

// --- forwarding ---
