//! The merged view: `/mcp` when several servers are configured.
//!
//! Place in the path: the conductor's routing step ([`super::conductor`])
//! for `/mcp` with several servers, after the steps every request shares
//! and before the per-server steps. Each request is either answered by the view itself (`initialize`,
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

use super::context::Context;
use super::forward::ACCEPT_BOTH;
use super::session::Member;
use super::state::{AppState, Live};
use crate::auth::ClientId;
use crate::error::Rejection;
use crate::mcp::headers::{self, MCP_SESSION_ID};
use crate::mcp::methods::ListKind;
use crate::mcp::methods::{Class, Method as Rpc};
use crate::mcp::request::{Ask, Request};
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
pub(super) use view::members;
use view::{View, accepted, answer, parts};

/// Serves a POST on the merged view once the conductor's steps before a
/// server is chosen have passed: the route, then the chosen server's steps
/// from [`super::dispatch::serve`] (or the view's own answer from every
/// member).
pub(super) async fn serve(
    ctx: &mut Context,
    client: &ClientId,
    headers: &HeaderMap,
    members: Option<Arc<[Member]>>,
    message: Request,
    body: Bytes,
) -> Result<Response, Rejection> {
    let (state, live) = (&ctx.state.clone(), &*ctx.live.clone());
    let view = View {
        state,
        live,
        client,
        headers,
        parts: parts(live, members.as_deref()),
    };
    let Some(called) = message.called() else {
        // A response to a server's request: every member gets it (a server
        // ignores a response it did not ask for).
        broadcast(&view, ctx, &message, body).await;
        return Ok(accepted());
    };
    match (called.method(), called.class()) {
        (Some(Rpc::Initialize), _) => initialize(&view, ctx, &message, body).await,
        (Some(Rpc::ServerDiscover), _) => discover(&view, ctx, body).await,
        (Some(Rpc::Ping), _) => Ok(answer(ctx, json!({}), HeaderMap::new())),
        (Some(Rpc::LoggingSetLevel), _) => {
            broadcast(&view, ctx, &message, body).await;
            Ok(answer(ctx, json!({}), HeaderMap::new()))
        }
        (_, Class::List(kind)) => merged_list(&view, ctx, &message, kind).await,
        // An operator's method of class tool is a tool call: routed, and
        // refused when unknown, as tools/call is.
        (Some(Rpc::ToolsCall), _) | (_, Class::Tool) => {
            named(&view, ctx, &message, ListKind::Tools, true).await
        }
        (_, Class::Prompt) => named(&view, ctx, &message, ListKind::Prompts, false).await,
        (_, Class::Resource) => match message.ask() {
            Ask::Resource { uri } => {
                let uri = uri.clone();
                by_uri(&view, ctx, &message, &uri, body, false).await
            }
            _ => Err(Rejection::MethodNotFound(ctx.method.clone())),
        },
        (_, Class::Completion) => completion(&view, ctx, &message, body).await,
        (_, Class::Subscription) => listen(&view, ctx, &message).await,
        // Notifications: every member server gets them.
        (_, Class::Lifecycle | Class::Notification) if message.is_notification() => {
            broadcast(&view, ctx, &message, body).await;
            Ok(accepted())
        }
        // A task id, or an operator's lifecycle request, names no member:
        // the merged view cannot route it.
        (_, Class::Lifecycle | Class::Notification | Class::Task | Class::ClientFeature) => {
            Err(Rejection::MethodNotFound(ctx.method.clone()))
        }
    }
}

/// Serves a DELETE on the merged view: every member's session ends with it.
pub(super) async fn end(
    state: &Arc<AppState>,
    live: &Live,
    ctx: &mut Context,
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
            .credential(&ctx.caller(client), &live.config.identity)
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
    ctx.trail.note(|e| e.decision = "forwarded".into());
    Ok(Response::new(Body::empty()))
}
