//! The merged view as one request sees it: the member servers it may
//! reach (each with its own session and version), how their names are
//! prefixed, and the small answers the view gives itself.
//!
//! Place: beneath every other file of the merged view; each request builds
//! one [`View`] of [`Part`]s.
//!
//! Invariants: a server is reached with its own session and protocol
//! version, never the client's merged ones; a name splits at the first
//! [`SEPARATOR`].

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, StatusCode};
use serde_json::Value;

use crate::auth::ClientId;
use crate::error::Rejection;
use crate::error::{UpstreamFailure, UpstreamKind};
use crate::mcp::headers::{self, MCP_NAME, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::mcp::jsonrpc::{self};
use crate::mcp::version::Era;
use crate::proxy::context::Context;
use crate::proxy::forward::Forward;
use crate::proxy::respond::{self};
use crate::proxy::session::Member;
use crate::proxy::state::{AppState, Live, ServerState};

/// Separates the server's name from the tool's or prompt's.
pub(super) const SEPARATOR: &str = "__";

/// One server as a request of the merged view reaches it.
pub(super) struct Part<'a> {
    pub(super) server: &'a Arc<ServerState>,
    /// The server's own session (handshake era).
    pub(super) session: Option<String>,
    /// The version the server agreed to, when it differs from the client's.
    pub(super) version: Option<String>,
}

impl Part<'_> {
    pub(super) fn name(&self) -> &str {
        &self.server.upstream.settings.name
    }

    /// The client's headers as this server must see them: its own session and
    /// version, and `Mcp-Name` naming what the server calls the target.
    pub(super) fn headers(&self, client: &HeaderMap, target: Option<&str>) -> HeaderMap {
        let mut out = client.clone();
        out.remove(MCP_SESSION_ID);
        if let Some(session) = self.session.as_deref().and_then(|s| s.parse().ok()) {
            out.insert(MCP_SESSION_ID, session);
        }
        if let Some(version) = self.version.as_deref().and_then(|v| v.parse().ok()) {
            out.insert(MCP_PROTOCOL_VERSION, version);
        }
        if let Some(target) = target
            && out.contains_key(MCP_NAME)
        {
            out.insert(MCP_NAME, headers::encode(target));
        }
        out
    }

    pub(super) fn forward(&self, ctx: &Context, client: &ClientId) -> Forward {
        // The merged view's own listen sends with no idle limit itself.
        ctx.forward_to(client, self.server, self.session.clone(), false)
    }
}

/// What one request of the merged view needs from its surroundings.
pub(super) struct View<'a> {
    pub(super) state: &'a Arc<AppState>,
    pub(super) live: &'a Live,
    pub(super) client: &'a ClientId,
    pub(super) headers: &'a HeaderMap,
    pub(super) parts: Vec<Part<'a>>,
}

/// The members of the merged session the request presents (handshake era).
pub(crate) fn members(
    state: &AppState,
    client: &ClientId,
    headers: &HeaderMap,
    era: Era,
) -> Result<Option<Arc<[Member]>>, Rejection> {
    let presented =
        headers::single(headers, MCP_SESSION_ID).map_err(|m| Rejection::HeaderMismatch(m.0))?;
    match (era, presented) {
        (Era::Modern, _) | (_, None) => Ok(None),
        (Era::Legacy, Some(id)) => state
            .sessions
            .merged(id, client)
            .map(Some)
            .ok_or(Rejection::SessionNotFound),
    }
}

/// The servers a request may reach: the session's members still configured,
/// or every server when there is no session.
pub(super) fn parts<'a>(live: &'a Live, members: Option<&[Member]>) -> Vec<Part<'a>> {
    match members {
        None => live
            .servers
            .values()
            .map(|s| Part {
                server: s,
                session: None,
                version: None,
            })
            .collect(),
        Some(members) => members
            .iter()
            .filter_map(|m| {
                Some(Part {
                    server: live.servers.get(&m.server)?,
                    session: m.session.clone(),
                    version: Some(m.version.clone()),
                })
            })
            .collect(),
    }
}

pub(super) fn answer(ctx: &Context, result: Value, headers: HeaderMap) -> Response {
    let id = ctx.id.clone().unwrap_or(Value::Null);
    respond::json(&jsonrpc::result(&id, result), headers)
}

pub(super) fn accepted() -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

pub(super) fn no_server_answered(method: &str) -> Rejection {
    Rejection::Upstream(UpstreamFailure::new(
        UpstreamKind::Unavailable,
        "(merged view)",
        None,
        format!("no configured server answered {method}"),
    ))
}
