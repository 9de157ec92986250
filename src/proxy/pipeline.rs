//! The whole story of one request: one [`Context`] made when it arrives,
//! handed to named steps that each return to the conductor
//! ([`super::conductor`]), and recorded once when it ends.
//!
//! ```text
//! conductor (one server and the merged view alike):
//!   admit → authenticate (route) → read_body → classify (bound identifiers) → negotiate → session
//!   → method_table → scan_outgoing (the typed request, mcp::request)
//!   → route: /mcp/<server> → that server's steps for the method
//!            merged view   → the server a prefixed name or a URI picks, then the same steps
//!                            (initialize, lists, broadcasts: every member, answered by the view)
//! the method's steps (dispatch), on the server routed to:
//!   unknown method:  refused (-32601), nothing sent upstream
//!   tools/call:      catalog → authorize → pin → rule arguments → flow → rate_limit → Mcp-Param-* → validate → approval (when a rule asks) → forward → relay
//!   lists:           the gateway's own request, every page → remember tools (pins) → serve pinned → filter per client → answer
//!   initialize, server/discover: forward → pin the instructions → relay
//!   read / get / an operator's resource or prompt method: canonical URI (resources) → authorize → rate_limit → forward → relay
//!   subscribe, completion, subscriptions/listen: authorize → forward → relay
//!   tasks:           the task's owner → forward → relay (results through the tools/call checks)
//!   lifecycle, notifications: forward → relay
//! forward and relay: the Forward and the Recipient, both derived from the
//!   Context (context.rs), over the transport beneath (crate::transport)
//! ```
//!
//! Dispatch is a match on the method as [`crate::mcp::methods`] typed it
//! (its class, and which method of the specification it is), and every step
//! reads the message as [`crate::mcp::request`] typed it once: no parameter
//! is read by its key and no method name is compared as a string after
//! classification (`tests/suite/typed_request.rs` keeps it so, and keeps the
//! `Forward` and `Recipient` made from the context only).
//!
//! Invariants: a step either passes the request on or stops it with a
//! [`crate::error::Rejection`]; nothing is sent upstream before every step
//! for that method has passed; the same policy decision serves lists and
//! calls; only tools/call, resources/read and prompts/get take rate-limit
//! tokens, and only once the access rules have let them through. A request
//! loads the configuration in force once ([`super::state::Live`], kept in
//! its context) and is decided under it to the end. In observe mode
//! (`mode = "observe"`, per gateway or server) a policy, rate-limit or
//! validation refusal is recorded as `would_refuse` instead of stopping the
//! request; transport refusals stop it in every mode. Each step is announced
//! on the request's trail (`ctx.trail.stage(..)`), which makes it a child
//! span of the request when traces are exported.

use super::conductor::conduct;
use super::context::Context;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::response::Response;
use http::request::Parts;

use super::state::AppState;

use crate::audit;
use crate::auth::ClientId;
use crate::record::span::RequestTrace;
use crate::record::trail::Trail;

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
    // One configuration for the whole request, whatever a reload does meanwhile.
    let live = state.live.load_full();
    let trail = Trail::new(state.sinks.clone(), started, event, trace);
    let mut ctx = Context::new(state.clone(), live, trail, started, parts.method.as_str());
    let (response, outcome, source) = match conduct(&mut ctx, server, parts, body).await {
        Ok(response) => (response, "forwarded", None),
        Err(rejection) => {
            let code = rejection.code();
            let source = rejection.source();
            (
                rejection.into_response(ctx.render_ctx()),
                code,
                Some(source),
            )
        }
    };
    ctx.trail.note(|e| {
        e.client = ctx.client.as_ref().map(|c| c.name().to_owned());
        e.client_unlisted = ctx.client.as_ref().is_some_and(ClientId::is_unlisted);
        e.server = ctx.server.clone();
        e.method = ctx.method.clone();
        e.tool = ctx.tool.clone();
        e.subject = ctx.subject.clone();
        e.era = ctx.era.as_str().to_owned();
        e.http_status = Some(response.status().as_u16());
        e.would_refuse = ctx.would_refuse.map(str::to_owned);
        // A tool result rewritten on the way back was decided there.
        if source.is_some() || e.decision.is_empty() {
            e.decision = outcome.to_owned();
            e.stage = source.map_or("forwarded", |s| s.as_str()).to_owned();
        }
    });
    tracing::info!(
        client = ctx.client.as_ref().map(ClientId::name),
        server = ctx.server.as_deref(),
        method = %ctx.method,
        tool = ctx.tool.as_deref(),
        subject = ctx.subject.as_deref(),
        era = ctx.era.as_str(),
        outcome,
        mode = ctx.mode.as_str(),
        would_refuse = ctx.would_refuse,
        source = source.map(|s| s.as_str()),
        status = response.status().as_u16(),
        latency_us = ctx.started.elapsed().as_micros() as u64,
        trace_id = ctx.trail.trace().trace_id(),
        "request"
    );
    response
}
