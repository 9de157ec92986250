//! The MCP endpoint: `/mcp/<server>` (and `/mcp` when one server is configured),
//! served by the pipeline in [`pipeline`].
//!
//! Place in the path: everything between the client's TCP connection and the
//! exchange with the upstream, which the forwarding step hands to the layer
//! beneath ([`crate::transport`]: the HTTP client, the stdio children). The
//! client-facing HTTP concerns are here; decisions live in `auth`, `policy`,
//! `ratelimit` and `validate`, the sequence in `pipeline`.

mod about;
mod approve;
mod breaker;
mod call;
pub(crate) mod catalog;
mod conductor;
mod context;
mod deadline;
mod dispatch;
mod federate;
mod flow;
mod forward;
mod inflight;
pub(crate) mod ingress;
mod lists;
mod pipeline;
mod rate;
mod refusals;
mod resource;
mod respond;
mod retry;
pub(crate) mod session;
pub(crate) mod state;
pub(crate) mod streams;
mod subjects;
mod task_calls;
pub(crate) mod tasks;
pub(crate) mod upstream;
mod well_known;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use axum::routing::{any, get};

use crate::auth::jwt::METADATA_PATH;
use crate::identity::JWKS_PATH;
use state::AppState;

/// The MCP router, with the RFC 9728 metadata paths (404 unless `[auth.jwt]` is set).
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mcp", any(one_server))
        .route("/mcp/{server}", any(named_server))
        .route(METADATA_PATH, get(well_known::gateway))
        .route(JWKS_PATH, get(well_known::jwks))
        .route(&format!("{METADATA_PATH}/mcp"), get(well_known::one_server))
        .route(
            &format!("{METADATA_PATH}/mcp/{{server}}"),
            get(well_known::named_server),
        )
        .with_state(state)
}

async fn one_server(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    pipeline::handle(state, None, parts, body).await
}

async fn named_server(
    State(state): State<Arc<AppState>>,
    Path(server): Path<String>,
    request: Request,
) -> Response {
    let (parts, body): (_, Body) = request.into_parts();
    pipeline::handle(state, Some(server), parts, body).await
}
