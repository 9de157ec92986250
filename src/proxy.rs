//! The MCP endpoint: `/mcp/<server>` (and `/mcp` when one server is configured),
//! served by the pipeline in [`pipeline`].
//!
//! Place in the path: everything between the client's TCP connection and the
//! upstream's. Transport concerns only here; decisions live in `auth`,
//! `policy` and `validate`, the sequence in `pipeline`.

mod catalog;
mod ingress;
mod pipeline;
mod respond;
mod session;
mod upstream;

pub(crate) use upstream::humanize;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use axum::routing::any;

use crate::audit::Audit;
use crate::config::{Config, SanitizeSettings};
use crate::dashboard::Recent;
use crate::metrics::Metrics;
use crate::pins::Pins;
use catalog::Catalog;
use respond::OutputSchemas;
use session::SessionTable;
use upstream::Upstream;

/// Shared by every request.
#[derive(Debug)]
pub(crate) struct AppState {
    pub config: Arc<Config>,
    pub servers: BTreeMap<String, ServerState>,
    pub sessions: SessionTable,
    /// Pinned tool definitions and server instructions.
    pub pins: Arc<Pins>,
    /// The MCP listener is on a loopback address (Host checks apply).
    pub loopback: bool,
    /// Ids of requests the gateway sends on its own.
    pub next_id: AtomicU64,
    /// `[sanitize]`, shared with every reply in flight.
    pub sanitize: Arc<SanitizeSettings>,
    /// Where each request's audit event goes.
    pub audit: Arc<Audit>,
    /// Where it is counted.
    pub metrics: Arc<Metrics>,
    /// Where the dashboard finds it.
    pub recent: Arc<Recent>,
}

/// One upstream and what the gateway knows of it.
#[derive(Debug)]
pub(crate) struct ServerState {
    pub upstream: Arc<Upstream>,
    pub catalog: Arc<Catalog>,
    /// Compiled `outputSchema`s of its tools.
    pub output_schemas: OutputSchemas,
}

impl AppState {
    pub(crate) fn new(
        config: Arc<Config>,
        pins: Arc<Pins>,
        audit: Arc<Audit>,
        loopback: bool,
    ) -> Result<Self, reqwest::Error> {
        let mut servers = BTreeMap::new();
        for (name, settings) in &config.servers {
            let upstream = Upstream::new(settings.clone(), config.gateway.max_response_bytes)?;
            let catalog = Catalog::new(name, settings.pinning, pins.clone());
            servers.insert(
                name.clone(),
                ServerState {
                    upstream: Arc::new(upstream),
                    catalog: Arc::new(catalog),
                    output_schemas: OutputSchemas::default(),
                },
            );
        }
        Ok(Self {
            sessions: SessionTable::new(config.gateway.max_sessions),
            pins,
            metrics: Arc::new(Metrics::new(audit.shared_counters())),
            recent: Arc::default(),
            audit,
            sanitize: Arc::new(config.sanitize.clone()),
            config,
            servers,
            loopback,
            next_id: AtomicU64::new(1),
        })
    }
}

/// The MCP router.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mcp", any(one_server))
        .route("/mcp/{server}", any(named_server))
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
