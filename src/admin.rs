//! The admin listener: the Prometheus scrape, readiness, the dashboard and its
//! JSON API, pins and their approvals, the operator's queue of tool-call
//! approvals, reload.
//!
//! Place: beside the MCP data path, never on it; it reads the gateway's
//! shared state through its own [`state::AdminState`]. Invariants: every
//! request passes [`access::guard`] first (the Origin/Host rules of the MCP
//! listener); actions need the admin token, reads need it once one is
//! configured and always off loopback.

pub(crate) mod access;
mod api;
mod approvals;
pub(crate) mod dashboard;
pub(crate) mod reload;
pub(crate) mod state;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

use state::AdminState;

/// The admin router: every path behind [`access::guard`].
pub(crate) fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/metrics", get(api::metrics))
        .route("/", get(dashboard::index))
        .route("/api/events", get(dashboard::events))
        .route("/api/events/stream", get(dashboard::stream))
        .route("/api/events/{id}", get(dashboard::event))
        .route("/api/overview", get(dashboard::overview))
        .route("/api/config", get(dashboard::config))
        .route("/api/pins", get(api::pins))
        .route("/api/pins/approve", post(api::approve))
        .route("/api/approvals", get(approvals::approvals))
        .route("/api/approvals/{id}/{verb}", post(approvals::decide))
        .route("/api/reload", get(reload::get).post(reload::post))
        // Every endpoint, and the 404 of any other path, passes the Origin/Host checks.
        .fallback(|| async { http::StatusCode::NOT_FOUND })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::guard,
        ))
        .with_state(state)
}
