//! The merged view: `/mcp` when several servers are configured.
//!
//! Place in the path: between the transport checks and the per-server
//! pipeline. Each request is either answered by the view itself (`initialize`,
//! `server/discover`, `ping`, the lists, `DELETE`) from what every server
//! answers, or routed to exactly one server and then decided by the same
//! per-server pipeline as `/mcp/<server>` — rules, rate limits, validation,
//! sanitizing and rewriting apply unchanged.
//!
//! Naming: tools and prompts are `<server>__<name>` (the spec's advice to
//! aggregators); server names never contain `__` nor end with `_` (refused at
//! load), so the first `__` splits a name unambiguously and two servers' names
//! can never collide. Resource URIs are kept as the servers give them; a read
//! goes to the first server (in name order) whose list, as this client may see
//! it, has the URI or a template matching it — compared in canonical form
//! ([`crate::policy::uri`]), so a spelling the canonicalizer refuses (an
//! encoded `/`, say) is refused here before any template can route it.
//!
//! Invariants: a merged session is the gateway's own (minted here, bound to the
//! client), naming each member server's own session and protocol version,
//! which replace the client's on everything routed to that server; a name
//! without a known server prefix gets the `unknown_tool` answer, listing only
//! what this client may call; nothing is sent to a server for a refused call.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Method};
use serde_json::json;

use super::exchange::{ACCEPT_BOTH, Exchange};
use super::state::{AppState, Live};
use crate::auth::ClientId;
use crate::error::Rejection;
use crate::mcp::headers::{self, MCP_SESSION_ID};
use crate::mcp::jsonrpc::Message;
use crate::mcp::methods::ListKind;
use crate::mcp::methods::{Class, Method as Rpc};
use crate::mcp::request::Ask;
use crate::mcp::version::Era;
use crate::transport::forwarded_headers;
use crate::transport::reply::UpstreamError;

mod listen;
mod merged;
mod routed;
mod view;

#[cfg(test)]
mod tests;

use listen::{broadcast, listen};
use merged::{discover, initialize, merged_list};
use routed::{by_uri, completion, named};
use view::{View, accepted, answer, members, parts};

/// Serves a POST on the merged view: the steps before a server is chosen,
/// then the route, then the chosen server's steps from [`super::dispatch::serve`].
pub(super) async fn post_merged(
    state: &Arc<AppState>,
    live: &Live,
    ex: &mut Exchange,
    client: &ClientId,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, Rejection> {
    // The steps of `dispatch::post` before a server is chosen, once: the
    // routed message then enters the server's pipeline at `dispatch::serve`.
    ex.trail.stage("classify");
    let message = Message::classify(&body, live.config.gateway.max_json_depth)
        .map_err(Rejection::Malformed)?;
    ex.trail.trace().classified(&message);
    super::dispatch::note_message(ex, &message)?;
    ex.trail.stage("negotiate");
    let (era, _version) = super::ingress::negotiate(headers, &message)?;
    ex.era = era;
    ex.mode = live.config.gateway.mode;
    let members = members(state, client, headers, era)?;
    let called = super::dispatch::resolve(&live.config, &message, era)?;
    ex.trail.stage("scan_outgoing");
    let tool_call = called.as_ref().map(|c| c.class()) == Some(Class::Tool);
    let found = super::call::scan_outgoing(live, &message, &body, tool_call);
    let message = super::dispatch::type_request(ex, message, called)?;
    let scanned = super::call::outgoing_refusal(&message, found);
    super::exchange::observe_or_enforce(ex, scanned)?;
    if members.is_some() {
        // The merged session (checked just now): what its initialize declared counts.
        ex.client_session = headers::single(headers, MCP_SESSION_ID)
            .ok()
            .flatten()
            .map(str::to_owned);
    }
    let view = View {
        state,
        live,
        client,
        headers,
        parts: parts(live, members.as_deref()),
    };
    let Some(called) = message.called() else {
        // The answer to one of the gateway's own approval questions stays here.
        if let Some(accepted) = super::approve::answered(state, ex, client, &body)? {
            return Ok(accepted);
        }
        // A response to a server's request: every member gets it (a server
        // ignores a response it did not ask for).
        broadcast(&view, ex, &message, body).await;
        return Ok(accepted());
    };
    match (called.method(), called.class()) {
        (Some(Rpc::Initialize), _) => initialize(&view, ex, &message, body).await,
        (Some(Rpc::ServerDiscover), _) => discover(&view, ex, body).await,
        (Some(Rpc::Ping), _) => Ok(answer(ex, json!({}), HeaderMap::new())),
        (Some(Rpc::LoggingSetLevel), _) => {
            broadcast(&view, ex, &message, body).await;
            Ok(answer(ex, json!({}), HeaderMap::new()))
        }
        (_, Class::List(kind)) => merged_list(&view, ex, &message, kind).await,
        // An operator's method of class tool is a tool call: routed, and
        // refused when unknown, as tools/call is.
        (Some(Rpc::ToolsCall), _) | (_, Class::Tool) => {
            named(&view, ex, &message, ListKind::Tools, true).await
        }
        (_, Class::Prompt) => named(&view, ex, &message, ListKind::Prompts, false).await,
        (_, Class::Resource) => match message.ask() {
            Ask::Resource { uri } => {
                let uri = uri.clone();
                by_uri(&view, ex, &message, &uri, body, false).await
            }
            _ => Err(Rejection::MethodNotFound(ex.method.clone())),
        },
        (_, Class::Completion) => completion(&view, ex, &message, body).await,
        (_, Class::Subscription) => listen(&view, ex, &message).await,
        // Notifications: every member server gets them.
        (_, Class::Lifecycle | Class::Notification) if message.is_notification() => {
            broadcast(&view, ex, &message, body).await;
            Ok(accepted())
        }
        // A task id, or an operator's lifecycle request, names no member:
        // the merged view cannot route it.
        (_, Class::Lifecycle | Class::Notification | Class::Task | Class::ClientFeature) => {
            Err(Rejection::MethodNotFound(ex.method.clone()))
        }
    }
}

/// Serves a DELETE on the merged view: every member's session ends with it.
pub(super) async fn end(
    state: &Arc<AppState>,
    live: &Live,
    ex: &mut Exchange,
    client: &ClientId,
    request: &Parts,
) -> Result<Response, Rejection> {
    let members =
        members(state, client, &request.headers, Era::Legacy)?.ok_or(Rejection::SessionNotFound)?;
    for part in parts(live, Some(&members)) {
        let Some(session) = &part.session else {
            continue;
        };
        let out = forwarded_headers(&part.headers(&request.headers, None), ACCEPT_BOTH);
        let upstream = &part.server.upstream;
        let timeout = Some(upstream.settings.timeout);
        let credential = part
            .server
            .identity
            .credential(&ex.caller(client), &live.config.identity)
            .await;
        let ended = match credential {
            Ok(credential) => {
                upstream
                    .exchange(Method::DELETE, out, credential, None, timeout)
                    .await
            }
            Err(e) => Err(UpstreamError::credentials(e)),
        };
        if let Err(e) = ended {
            tracing::info!(server = part.name(), error = %e.reason, "ending a member session failed");
        }
        state.sessions.remove(part.name(), session);
    }
    if let Ok(Some(id)) = headers::single(&request.headers, MCP_SESSION_ID) {
        state.sessions.remove_merged(id);
    }
    ex.trail.note(|e| e.decision = "forwarded".into());
    Ok(Response::new(Body::empty()))
}
