//! The MCP endpoint: `/mcp/<server>` (and `/mcp` when one server is configured),
//! served by the pipeline in [`pipeline`].
//!
//! Place in the path: everything between the client's TCP connection and the
//! upstream's. Transport concerns only here; decisions live in `auth`,
//! `policy`, `ratelimit` and `validate`, the sequence in `pipeline`.

mod catalog;
mod ingress;
mod pipeline;
mod respond;
mod session;
mod stdio;
mod streams;
mod tasks;
mod upstream;
mod well_known;

pub(crate) use ingress::admit;
pub(crate) use upstream::humanize;

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use axum::routing::{any, get};

use crate::audit::Audit;
use crate::auth::jwt::METADATA_PATH;
use crate::config::{Config, SanitizeSettings};
use crate::dashboard::Recent;
use crate::metrics::Metrics;
use crate::pins::Pins;
use crate::ratelimit::{RateLimiter, RatePlan};
use crate::telemetry::Traces;
use catalog::Catalog;
use session::SessionTable;
use upstream::Upstream;

/// Shared by every request.
#[derive(Debug)]
pub(crate) struct AppState {
    /// The configuration in force and the per-server state built for it,
    /// swapped whole on reload; a request loads it once and keeps it.
    pub live: ArcSwap<Live>,
    pub sessions: SessionTable,
    /// Open GET and `subscriptions/listen` streams, by client and server.
    pub streams: Arc<streams::Streams>,
    /// Tasks created through the gateway, each bound to its creator.
    pub tasks: Arc<tasks::TaskStore>,
    /// Pinned tool definitions and server instructions.
    pub pins: Arc<Pins>,
    /// The MCP listener is on a loopback address (Host checks apply).
    pub loopback: bool,
    /// The admin listener is on a loopback address (Host checks apply; off
    /// it, every read needs the admin token).
    pub admin_loopback: bool,
    /// Ids of requests the gateway sends on its own.
    pub next_id: AtomicU64,
    /// The file the configuration is reloaded from (none when started from text).
    pub config_path: Option<PathBuf>,
    /// Serializes reloads and records the last one.
    pub reloads: tokio::sync::Mutex<()>,
    /// The outcome of the last reload, and counts.
    pub reload_status: Mutex<crate::reload::Status>,
    /// Token buckets: they outlive a configuration, so a reload keeps the
    /// state of unchanged rules (see `ratelimit`).
    pub limiter: RateLimiter,
    /// Where each request's audit event goes.
    pub audit: Arc<Audit>,
    /// Where it is counted.
    pub metrics: Arc<Metrics>,
    /// Where its spans are exported (when `[telemetry] otlp_endpoint` is set).
    pub traces: Arc<Traces>,
    /// Where the dashboard finds it.
    pub recent: Arc<Recent>,
    /// Human approvals: the signer, the operator queue, open questions (in memory).
    pub approvals: Arc<crate::approval::Approvals>,
}

/// One configuration in force, with the state of its servers.
#[derive(Debug)]
pub(crate) struct Live {
    pub config: Arc<Config>,
    pub servers: BTreeMap<String, Arc<ServerState>>,
    /// `[sanitize]`, shared with every reply in flight.
    pub sanitize: Arc<SanitizeSettings>,
    /// The buckets of `config`'s rules.
    pub rate_plan: RatePlan,
    /// Unique per configuration built: keys what depends on the policy.
    pub generation: u64,
}

/// One upstream and what the gateway knows of it.
#[derive(Debug)]
pub(crate) struct ServerState {
    pub upstream: Arc<Upstream>,
    pub catalog: Arc<Catalog>,
}

impl AppState {
    /// Builds the state of `config`; inside a Tokio runtime (the Redis
    /// rate-limit backend starts its connection task).
    pub(crate) fn new(
        config: Arc<Config>,
        pins: Arc<Pins>,
        audit: Arc<Audit>,
        traces: Arc<Traces>,
        loopback: bool,
        config_path: Option<PathBuf>,
    ) -> io::Result<Self> {
        let live = Live::build(config.clone(), None, &pins).map_err(io::Error::other)?;
        let limiter = RateLimiter::from_settings(&config.rate_limit).map_err(io::Error::other)?;
        let metrics = Arc::new(Metrics::new(audit.shared_counters(), traces.counters()));
        let recent = Arc::<Recent>::default();
        let sink = approval_sink(audit.clone(), metrics.clone(), recent.clone());
        let approvals = Arc::new(crate::approval::Approvals::new(&config.approvals, sink));
        if approvals.key_generated {
            tracing::info!(
                "approvals: the requestState signing key was generated at start ([approvals] key is not set); \
                 in-band approvals asked before a restart are asked again after it"
            );
        }
        Ok(Self {
            approvals,
            live: ArcSwap::from_pointee(live),
            limiter,
            streams: Arc::default(),
            tasks: Arc::new(tasks::TaskStore::new(
                config.gateway.max_tasks,
                config.gateway.max_tasks_per_client,
                config.gateway.max_task_ttl,
            )),
            sessions: SessionTable::new(
                config.gateway.max_sessions,
                config.gateway.max_sessions_per_client,
            ),
            pins,
            metrics,
            traces,
            recent,
            audit,
            loopback,
            admin_loopback: loopback,
            next_id: AtomicU64::new(1),
            config_path,
            reloads: tokio::sync::Mutex::new(()),
            reload_status: Mutex::new(crate::reload::Status::default()),
        })
    }

    /// The configuration in force now.
    pub(crate) fn config(&self) -> Arc<Config> {
        self.live.load().config.clone()
    }

    /// Stops the processes of stdio servers (at shutdown), all at once, and waits for them.
    pub(crate) async fn stop_upstreams(&self) {
        let live = self.live.load_full();
        let stops = live.servers.values().map(|s| s.upstream.stop());
        futures_util::future::join_all(stops).await;
    }

    /// `/readyz`: whether every server can take requests, and each one's state.
    pub(crate) fn readiness(&self) -> (bool, serde_json::Value) {
        let live = self.live.load_full();
        let mut ready = true;
        let mut servers = serde_json::Map::new();
        for (name, server) in &live.servers {
            let (up, details) = server.upstream.readiness();
            ready &= up;
            servers.insert(name.clone(), details);
        }
        (
            ready,
            serde_json::json!({"ready": ready, "servers": servers}),
        )
    }
}

/// Approval events become audit events of their own (method
/// `portcullis/approval`, visible in the feed and on the trace page) and are
/// counted in `portcullis_approvals_total{by,outcome}`.
fn approval_sink(
    audit: Arc<Audit>,
    metrics: Arc<Metrics>,
    recent: Arc<Recent>,
) -> crate::approval::Sink {
    Box::new(move |h: &crate::approval::Happening<'_>| {
        metrics.approval(h.by, h.outcome.as_str());
        let mut event = crate::audit::Event {
            time_ms: h.at_ms,
            client: Some(h.binding.client.clone()),
            server: Some(h.binding.server.clone()),
            method: "portcullis/approval".into(),
            tool: Some(h.binding.tool.clone()),
            decision: h.outcome.as_str().into(),
            stage: "approval".into(),
            approval: Some(serde_json::json!({
                "by": h.by,
                "outcome": h.outcome.as_str(),
                "digest": h.binding.digest_hex(),
                "id": h.id,
                "decided_by": h.decided_by,
                "at_ms": h.at_ms,
            })),
            ..Default::default()
        };
        event.bound();
        recent.push(&event);
        audit.record(event);
    })
}

impl Live {
    /// Builds the state of every server of `config`, keeping from `previous`
    /// the state of each server whose settings did not change.
    pub(crate) fn build(
        config: Arc<Config>,
        previous: Option<&Live>,
        pins: &Arc<Pins>,
    ) -> Result<Self, reqwest::Error> {
        let max_response = config.gateway.max_response_bytes;
        let mut servers = BTreeMap::new();
        for (name, settings) in &config.servers {
            let kept = previous.and_then(|p| {
                let old = p.servers.get(name)?;
                let same = *old.upstream.settings == **settings
                    && old.upstream.max_response_bytes == max_response;
                same.then(|| old.clone())
            });
            let state = match kept {
                Some(state) => state,
                None => {
                    let catalog = Arc::new(Catalog::new(name, settings.pinning, pins.clone()));
                    let listed = catalog.clone();
                    let tools_changed = Box::new(move || listed.invalidate());
                    let upstream = Upstream::new(settings.clone(), max_response, tools_changed)?;
                    Arc::new(ServerState {
                        upstream: Arc::new(upstream),
                        catalog,
                    })
                }
            };
            servers.insert(name.clone(), state);
        }
        static GENERATIONS: AtomicU64 = AtomicU64::new(1);
        Ok(Self {
            generation: GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            sanitize: Arc::new(config.sanitize.clone()),
            rate_plan: RatePlan::new(&config.policy),
            config,
            servers,
        })
    }
}

/// The MCP router, with the RFC 9728 metadata paths (404 unless `[auth.jwt]` is set).
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mcp", any(one_server))
        .route("/mcp/{server}", any(named_server))
        .route(METADATA_PATH, get(well_known::gateway))
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
