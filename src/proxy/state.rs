//! The state every MCP request shares: the configuration in force with the
//! per-server state built for it, sessions, streams, tasks, pins, buckets,
//! and where finished events and spans go.
//!
//! Place: the bottom of the pipeline layer; every stage reads it, none of it
//! is admin-only (the admin layer keeps its own state beside a handle to
//! this one). Invariants: a request loads the configuration once and keeps
//! it ([`Live`]); a reload swaps [`Live`] whole, keeping the state of every
//! server whose settings did not change.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use arc_swap::ArcSwap;

use super::catalog::Catalog;
use super::session::SessionTable;
use super::streams::Streams;
use super::tasks::TaskStore;
use super::upstream::Upstream;
use crate::approval::{Approvals, Happening};
use crate::config::Config;
use crate::identity::Broker;
use crate::metrics::BreakerReading;
use crate::pins::Pins;
use crate::ratelimit::{RateLimiter, RatePlan};
use crate::record::event::{APPROVAL_METHOD, Event};
use crate::record::sink::Sinks;
use crate::sanitize::SanitizeSettings;
use crate::telemetry::Traces;

/// Shared by every request.
#[derive(Debug)]
pub(crate) struct AppState {
    /// The configuration in force and the per-server state built for it,
    /// swapped whole on reload; a request loads it once and keeps it.
    pub live: ArcSwap<Live>,
    pub sessions: SessionTable,
    /// Open GET and `subscriptions/listen` streams, by client and server.
    pub streams: Arc<Streams>,
    /// Tasks created through the gateway, each bound to its creator.
    pub tasks: Arc<TaskStore>,
    /// Pinned tool definitions and server instructions.
    pub pins: Arc<Pins>,
    /// The MCP listener is on a loopback address (Host checks apply).
    pub loopback: bool,
    /// Ids of requests the gateway sends on its own.
    pub next_id: AtomicU64,
    /// Token buckets: they outlive a configuration, so a reload keeps the
    /// state of unchanged rules (see `ratelimit`).
    pub limiter: RateLimiter,
    /// Where each request's event goes when it is over (metrics, the live
    /// ring, the audit store: wired by the app).
    pub sinks: Arc<Sinks>,
    /// Human approvals: the signer, the operator queue, open questions (in memory).
    pub approvals: Arc<Approvals>,
    /// Where its spans are exported (when `[telemetry] otlp_endpoint` is set).
    pub traces: Arc<Traces>,
    /// The flow labels each session holds: they outlive a configuration, so
    /// a reload keeps them (a reload that removes a flow rule releases its hold).
    pub flows: Arc<dyn crate::flow::FlowStore>,
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
    /// How each client reaches it as itself, and the tokens obtained for that.
    pub identity: Arc<Broker>,
}

impl AppState {
    /// Builds the state of `config`; inside a Tokio runtime (the Redis
    /// rate-limit backend and state store start their connection tasks).
    pub(crate) fn new(
        config: Arc<Config>,
        pins: Arc<Pins>,
        sinks: Arc<Sinks>,
        traces: Arc<Traces>,
        loopback: bool,
    ) -> io::Result<Self> {
        let live = Live::build(config.clone(), None, &pins).map_err(io::Error::other)?;
        let limiter = RateLimiter::from_settings(&config.rate_limit).map_err(io::Error::other)?;
        let shared =
            crate::state::SharedState::from_settings(&config.state).map_err(io::Error::other)?;
        let shared = Arc::new(shared);
        let flows = crate::flow::open(&config.state, crate::flow::FlowLimits::default())
            .map_err(io::Error::other)?;
        let approvals = Arc::new(Approvals::for_replica(
            &config.approvals,
            approval_sink(sinks.clone()),
            shared.clone(),
            &config.telemetry.replica,
        ));
        let asks = config.policy.rules.iter().any(|r| r.approval.is_some());
        if approvals.key_generated && asks {
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
            tasks: Arc::new(
                TaskStore::new(
                    config.gateway.max_tasks,
                    config.gateway.max_tasks_per_client,
                    config.gateway.max_task_ttl,
                )
                .shared(shared.clone()),
            ),
            sessions: SessionTable::new(
                config.gateway.max_sessions,
                config.gateway.max_sessions_per_client,
            )
            .shared(shared.clone()),
            pins,
            sinks,
            traces,
            loopback,
            next_id: AtomicU64::new(1),
            flows,
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

    /// Each configured server's breaker: its state and how often it opened
    /// (for `/healthz`, `/metrics` and the dashboard).
    pub(crate) fn breakers(&self) -> Vec<BreakerReading> {
        let live = self.live.load_full();
        (live.servers.iter())
            .map(|(name, server)| BreakerReading {
                server: name.clone(),
                state: server.upstream.breaker.phase().as_str(),
                opens: server.upstream.breaker.opens(),
            })
            .collect()
    }
}

/// Approval happenings become events of their own (method
/// [`APPROVAL_METHOD`], in the feed, the store and on the trace page),
/// counted in `portcullis_approvals_total{by,outcome}`.
fn approval_sink(sinks: Arc<Sinks>) -> crate::approval::Sink {
    Box::new(move |h: &Happening<'_>| {
        let mut event = Event {
            time_ms: h.at_ms,
            client: Some(h.binding.client.clone()),
            server: Some(h.binding.server.clone()),
            method: APPROVAL_METHOD.into(),
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
            approval_counted: Some((h.by, h.outcome.as_str())),
            ..Default::default()
        };
        event.bound();
        sinks.record(event);
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
                    && old.upstream.max_response_bytes() == max_response
                    && p.config.identity.max_cached == config.identity.max_cached
                    && p.config.identity.max_cached_per_client
                        == config.identity.max_cached_per_client;
                same.then(|| old.clone())
            });
            let state = match kept {
                Some(state) => state,
                None => {
                    let catalog = Arc::new(Catalog::new(name, settings.pinning, pins.clone()));
                    let listed = catalog.clone();
                    let tools_changed = Box::new(move || listed.invalidate());
                    let upstream = Upstream::new(settings.clone(), max_response, tools_changed)?;
                    let url = settings.url().map(|u| u.as_str()).unwrap_or_default();
                    let identity =
                        Broker::new(name, url, settings.identity.clone(), &config.identity);
                    Arc::new(ServerState {
                        upstream: Arc::new(upstream),
                        catalog,
                        identity: Arc::new(identity),
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
