//! RFC 9728 protected-resource metadata on the MCP listener, when `[auth.jwt]`
//! is configured: `/.well-known/oauth-protected-resource` followed by the
//! resource's path (`/mcp/<server>`, `/mcp`, or nothing for the gateway).
//!
//! Place in the path: beside the MCP endpoint; a client that got a 401 follows
//! its `resource_metadata` here to learn which authorization server issues
//! tokens for the resource.
//!
//! Also the gateway's own public keys (`/.well-known/jwks.json`), when
//! `[identity] signing_keys` are configured: upstreams verify the identity
//! assertions the gateway signs with them.
//!
//! Invariants: the same Origin/Host checks as the MCP endpoint; every URL in
//! the document comes from the configuration, never from the request's Host;
//! without `[auth.jwt]` these paths do not exist (404, as before); the key
//! set holds public halves only, every configured key (the signing one
//! first), read from the configuration in force.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, Uri};

use super::ingress::admit;
use super::state::AppState;
use crate::error::{Rejection, RenderCtx};
use crate::mcp::version::Era;

/// `/.well-known/oauth-protected-resource`: the gateway as a whole.
pub(super) async fn gateway(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    metadata(&state, &uri, &headers, None)
}

/// `/.well-known/oauth-protected-resource/mcp`: `/mcp`, the one server or the
/// merged view of several (a client refused there is sent here).
pub(super) async fn one_server(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    metadata(&state, &uri, &headers, Some(None))
}

/// `/.well-known/oauth-protected-resource/mcp/<server>`.
pub(super) async fn named_server(
    State(state): State<Arc<AppState>>,
    Path(server): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    metadata(&state, &uri, &headers, Some(Some(server)))
}

/// `/.well-known/jwks.json`: the gateway's signing keys, public halves only.
pub(super) async fn jwks(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let config = state.config();
    if config.identity.keys.is_empty() {
        return StatusCode::NOT_FOUND.into_response();
    }
    if let Err(r) = admit(
        &headers,
        uri.authority().map(|a| a.as_str()),
        &config.gateway,
        state.loopback,
    ) {
        return r.into_response(RenderCtx {
            id: None,
            era: Era::Legacy,
        });
    }
    let body = crate::identity::jwks(config.identity.keys.iter().map(|k| &**k));
    let mut response = Json(body).into_response();
    // Short enough that a rotation is seen soon; upstreams also refetch on an unknown kid.
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("max-age=60"),
    );
    response
}

/// `resource`: `None` for the gateway, `Some(None)` for `/mcp`, `Some(Some(name))` for `/mcp/<name>`.
fn metadata(
    state: &AppState,
    uri: &Uri,
    headers: &HeaderMap,
    resource: Option<Option<String>>,
) -> Response {
    let config = state.config();
    let Some(jwt) = config.clients.jwt() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let render = |r: Rejection| {
        r.into_response(RenderCtx {
            id: None,
            era: Era::Legacy,
        })
    };
    if let Err(r) = admit(
        headers,
        uri.authority().map(|a| a.as_str()),
        &config.gateway,
        state.loopback,
    ) {
        return render(r);
    }
    let path = match resource {
        None => String::new(),
        // `/mcp` is always a resource: the one server, or the merged view
        // whose 401 challenge points here.
        Some(None) => "/mcp".to_owned(),
        Some(Some(name)) if config.servers.contains_key(&name) => format!("/mcp/{name}"),
        Some(Some(name)) => return render(Rejection::UnknownServer(name)),
    };
    Json(jwt.metadata(&path)).into_response()
}
