//! Prometheus metrics, served as text on the admin listener at `/metrics`.
//!
//! Place in the path: beside it, fed from the same place as the audit trail:
//! when a request's [`Trail`](crate::record::trail::Trail) is let go, its event is
//! counted here ([`Metrics::observe`]) and then queued for the audit store.
//! Reloads are counted where they are applied or refused. The audit queue's
//! and the span exporter's own figures are read at scrape time.
//!
//! Invariants: every label value comes from a bounded set — configured server
//! and client names (a JWT subject not named in `[clients]` is `other`), result codes, sanitizer kinds, and tool names only for
//! tools the server listed (any other name is counted as `other`), so a client
//! cannot grow the registry by inventing names; nothing here blocks for long
//! (a family's lock, held for one increment).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::audit::Counters;
use crate::record::event::Event;
use crate::record::sink::Sink;
use crate::telemetry::ExportCounters;

/// Label of a tool the server never listed.
pub const OTHER: &str = "other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    server: String,
    tool: String,
    client: String,
    decision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    server: String,
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WouldRefuseLabels {
    server: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApprovalLabels {
    by: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamErrorLabels {
    server: String,
    kind: String,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms … about 16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// One server's circuit breaker as a scrape sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerReading {
    /// The configured server.
    pub server: String,
    /// `closed`, `open` or `half_open`.
    pub state: &'static str,
    /// Times it opened since the gateway started.
    pub opens: u64,
}

/// The states a breaker gauge is given for, so a scrape shows each as 0 or 1.
const BREAKER_STATES: [&str; 3] = ["closed", "open", "half_open"];

/// The connections of one listener, counted by its accept loop and read at
/// scrape time.
#[derive(Debug, Default)]
pub struct Connections {
    /// Open now (served, not counting those being refused).
    pub open: AtomicU64,
    /// Refused since start because `max_connections` were open.
    pub refused: AtomicU64,
    /// The listener's `max_connections` (read at start).
    pub max: AtomicU64,
}

/// The gateway's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    /// The MCP listener's connections.
    pub mcp_connections: Arc<Connections>,
    /// The admin listener's connections.
    pub admin_connections: Arc<Connections>,
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    latency: Family<ServerLabels, Histogram, fn() -> Histogram>,
    upstream_latency: Family<ServerLabels, Histogram, fn() -> Histogram>,
    validation_failures: Family<ToolLabels, Counter>,
    sanitizer_actions: Family<KindLabels, Counter>,
    upstream_errors: Family<UpstreamErrorLabels, Counter>,
    rate_limited: Family<ServerLabels, Counter>,
    would_refuse: Family<WouldRefuseLabels, Counter>,
    reloads: Family<ResultLabels, Counter>,
    approvals: Family<ApprovalLabels, Counter>,
    /// The breakers of the servers in force, read from the proxy before each scrape.
    breakers: Arc<std::sync::Mutex<Vec<BreakerReading>>>,
    /// The rate limiter's store figures, read from the proxy before each scrape.
    rate_limit_store: Arc<RateLimitStore>,
}

impl Metrics {
    /// A registry with every metric, reading the audit queue's `counters`
    /// and the span exporter's `traces`.
    pub fn new(audit: Arc<Counters>, traces: Arc<ExportCounters>) -> Self {
        let mut registry = Registry::with_prefix("portcullis");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "calls",
            "Client requests by server, tool (tools/call), client and decision",
            calls.clone(),
        );
        let latency = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "request_duration_seconds",
            "Time from the request's arrival until its response was sent to the end",
            latency.clone(),
        );
        let upstream_latency = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "upstream_duration_seconds",
            "Time the upstream took to reply (summed over the pages of a list)",
            upstream_latency.clone(),
        );
        let validation_failures = Family::<ToolLabels, Counter>::default();
        registry.register(
            "validation_failures",
            "tools/call refused because the arguments break the tool's inputSchema",
            validation_failures.clone(),
        );
        let sanitizer_actions = Family::<KindLabels, Counter>::default();
        registry.register(
            "sanitizer_actions",
            "What the output sanitizer did, by kind",
            sanitizer_actions.clone(),
        );
        let upstream_errors = Family::<UpstreamErrorLabels, Counter>::default();
        registry.register(
            "upstream_errors",
            "Requests that failed because of the upstream, by result code",
            upstream_errors.clone(),
        );
        let rate_limited = Family::<ServerLabels, Counter>::default();
        registry.register(
            "rate_limit_refusals",
            "Requests refused because a rate limit was reached (enforced, not observed)",
            rate_limited.clone(),
        );
        let would_refuse = Family::<WouldRefuseLabels, Counter>::default();
        registry.register(
            "observed_refusals",
            "Requests observe mode let through that enforcement would have refused, by server and result code",
            would_refuse.clone(),
        );
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration reloads, by result (applied, refused)",
            reloads.clone(),
        );
        // Both results are listed from the start, so a scrape shows zero rather than nothing.
        for result in ["applied", "refused"] {
            drop(reloads.get_or_create(&ResultLabels { result }));
        }
        let approvals = Family::<ApprovalLabels, Counter>::default();
        registry.register(
            "approvals",
            "Human approvals of tool calls, by who is asked (user, operator) and outcome \
             (asked, approved, denied, expired, refused, used, would_ask)",
            approvals.clone(),
        );
        registry.register(
            "build",
            "The running build",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let mcp_connections = Arc::<Connections>::default();
        let admin_connections = Arc::<Connections>::default();
        registry.register_collector(Box::new(Listeners([
            ("mcp", mcp_connections.clone()),
            ("admin", admin_connections.clone()),
        ])));
        registry.register_collector(Box::new(AuditQueue(audit)));
        registry.register_collector(Box::new(SpanExport(traces)));
        let breakers = Arc::<std::sync::Mutex<Vec<BreakerReading>>>::default();
        registry.register_collector(Box::new(Breakers(breakers.clone())));
        let rate_limit_store = Arc::<RateLimitStore>::default();
        registry.register_collector(Box::new(RateLimitCollector(rate_limit_store.clone())));
        Self {
            mcp_connections,
            admin_connections,
            registry,
            calls,
            latency,
            upstream_latency,
            validation_failures,
            sanitizer_actions,
            upstream_errors,
            rate_limited,
            would_refuse,
            reloads,
            approvals,
            breakers,
            rate_limit_store,
        }
    }

    /// The rate limiter's counts as they are now (store calls that failed,
    /// tokens a refused call could not give back): the next scrape shows these.
    pub fn set_rate_limit_store(&self, backend_errors: u64, refunds_lost: u64) {
        let s = &self.rate_limit_store;
        s.backend_errors.store(backend_errors, Ordering::Relaxed);
        s.refunds_lost.store(refunds_lost, Ordering::Relaxed);
    }

    /// The servers' breakers as they are now: the next scrape shows these.
    pub fn set_breakers(&self, readings: Vec<BreakerReading>) {
        *self.breakers.lock().unwrap_or_else(|e| e.into_inner()) = readings;
    }

    /// Counts one approval event.
    pub fn approval(&self, by: &'static str, outcome: &'static str) {
        self.approvals
            .get_or_create(&ApprovalLabels { by, outcome })
            .inc();
    }

    /// Counts one configuration reload.
    pub fn reloaded(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.reloads.get_or_create(&ResultLabels { result }).inc();
    }

    /// Counts one finished request.
    pub fn observe(&self, e: &Event) {
        let server = e.server.clone().unwrap_or_default();
        let tool = match &e.tool {
            Some(t) if e.tool_listed => t.clone(),
            Some(_) => OTHER.to_owned(),
            None => String::new(),
        };
        self.calls
            .get_or_create(&CallLabels {
                server: server.clone(),
                tool: tool.clone(),
                client: match e.client_unlisted {
                    true => OTHER.to_owned(),
                    false => e.client.clone().unwrap_or_default(),
                },
                decision: e.decision.clone(),
            })
            .inc();
        let by_server = ServerLabels {
            server: server.clone(),
        };
        self.latency
            .get_or_create(&by_server)
            .observe(e.latency_us as f64 / 1e6);
        if let Some(us) = e.upstream_latency_us {
            self.upstream_latency
                .get_or_create(&by_server)
                .observe(us as f64 / 1e6);
        }
        if e.decision == "invalid_arguments" {
            self.validation_failures
                .get_or_create(&ToolLabels {
                    server: server.clone(),
                    tool,
                })
                .inc();
        }
        if e.decision == "rate_limited" {
            self.rate_limited
                .get_or_create(&ServerLabels {
                    server: server.clone(),
                })
                .inc();
        }
        // Codes are the gateway's own (a fixed set), never client text.
        if let Some(code) = &e.would_refuse {
            self.would_refuse
                .get_or_create(&WouldRefuseLabels {
                    server: server.clone(),
                    code: code.clone(),
                })
                .inc();
        }
        if e.stage == "upstream" {
            self.upstream_errors
                .get_or_create(&UpstreamErrorLabels {
                    server,
                    kind: e.decision.clone(),
                })
                .inc();
        }
        for (kind, n) in &e.sanitizer {
            self.sanitizer_actions
                .get_or_create(&KindLabels { kind: kind.clone() })
                .inc_by(*n);
        }
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "cannot encode the metrics");
        }
        out
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabels {
    replica: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

/// Both listeners' connection figures, read at scrape time.
#[derive(Debug)]
struct Listeners([(&'static str, Arc<Connections>); 2]);

impl Collector for Listeners {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        type Read = fn(&Connections) -> u64;
        let gauges: [(&str, &str, Read); 2] = [
            (
                "connections_open",
                "Client connections open now, by listener",
                |c| c.open.load(Ordering::Relaxed),
            ),
            (
                "connections_max",
                "The listener's [gateway] max_connections",
                |c| c.max.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, read) in gauges {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (listener, c) in &self.0 {
                let gauge = ConstGauge::new(read(c) as i64);
                gauge.encode(family.encode_family(&ListenerLabels { listener })?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "connections_refused",
            "Client connections refused because max_connections were open, by listener",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (listener, c) in &self.0 {
            let counter = ConstCounter::new(c.refused.load(Ordering::Relaxed));
            counter.encode(family.encode_family(&ListenerLabels { listener })?)?;
        }
        Ok(())
    }
}

/// The audit queue's figures, read at scrape time.
#[derive(Debug)]
struct AuditQueue(Arc<Counters>);

impl Collector for AuditQueue {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let c = &self.0;
        let up = ConstGauge::new(i64::from(
            c.store.load(Ordering::Relaxed) == crate::audit::STATE_UP,
        ));
        up.encode(encoder.encode_descriptor(
            "audit_store_up",
            "1 while the audit store takes events (PostgreSQL reachable; SQLite always)",
            None,
            up.metric_type(),
        )?)?;
        if let Some(replica) = c.replica.get() {
            let mut family = encoder.encode_descriptor(
                "replica_info",
                "This gateway's replica name ([gateway] replica), as its audit rows carry it",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            ConstGauge::new(1).encode(family.encode_family(&ReplicaLabels {
                replica: replica.clone(),
            })?)?;
        }
        let depth = ConstGauge::new(c.queued.load(Ordering::Relaxed) as i64);
        depth.encode(encoder.encode_descriptor(
            "audit_queue_depth",
            "Audit events waiting for the writer (PostgreSQL: in the spool, not yet shipped)",
            None,
            depth.metric_type(),
        )?)?;
        encode_counters(
            &mut encoder,
            [
                (
                    "audit_dropped",
                    "Audit events lost because the queue (PostgreSQL: the spool's buffer) was full",
                    &c.dropped,
                ),
                ("audit_written", "Audit events written", &c.written),
                (
                    "audit_failed",
                    "Audit events lost to a write error",
                    &c.failed,
                ),
            ],
        )
    }
}

/// The servers' breakers: a 0/1 gauge per state, and how often each opened.
#[derive(Debug)]
struct Breakers(Arc<std::sync::Mutex<Vec<BreakerReading>>>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BreakerLabels {
    server: String,
    state: &'static str,
}

impl Collector for Breakers {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let readings = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut family = encoder.encode_descriptor(
            "breaker_state",
            "The circuit breaker of each server: 1 for its state now (closed, open, half_open), 0 for the others",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for r in &readings {
            for state in BREAKER_STATES {
                let gauge = ConstGauge::new(i64::from(r.state == state));
                gauge.encode(family.encode_family(&BreakerLabels {
                    server: r.server.clone(),
                    state,
                })?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "breaker_opens",
            "Times the circuit breaker of each server opened since the gateway started",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for r in &readings {
            let counter = ConstCounter::new(r.opens);
            counter.encode(family.encode_family(&ServerLabels {
                server: r.server.clone(),
            })?)?;
        }
        Ok(())
    }
}

/// Encodes each `(name, help, value)` as a counter read now.
fn encode_counters<const N: usize>(
    encoder: &mut DescriptorEncoder<'_>,
    counters: [(&str, &str, &AtomicU64); N],
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in counters {
        let counter = ConstCounter::new(value.load(Ordering::Relaxed));
        counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
    }
    Ok(())
}

/// The rate limiter's store figures, as last read from the proxy.
#[derive(Debug, Default)]
struct RateLimitStore {
    backend_errors: AtomicU64,
    refunds_lost: AtomicU64,
}

#[derive(Debug)]
struct RateLimitCollector(Arc<RateLimitStore>);

impl Collector for RateLimitCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        encode_counters(
            &mut encoder,
            [
                (
                    "rate_limit_backend_errors",
                    "Rate-limit store calls that failed (Redis unreachable or too slow); the call went as on_backend_error says",
                    &self.0.backend_errors,
                ),
                (
                    "rate_limit_refunds_lost",
                    "Tokens a call refused after its take could not give back (another take came first, or the store did not answer)",
                    &self.0.refunds_lost,
                ),
            ],
        )
    }
}

/// The span exporter's figures, read at scrape time.
#[derive(Debug)]
struct SpanExport(Arc<ExportCounters>);

impl Collector for SpanExport {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let c = &self.0;
        encode_counters(
            &mut encoder,
            [
                (
                    "otel_spans_dropped",
                    "Spans dropped because the export queue was full",
                    &c.dropped,
                ),
                (
                    "otel_spans_exported",
                    "Spans the OTLP collector accepted",
                    &c.exported,
                ),
                (
                    "otel_spans_failed",
                    "Spans lost to a failed OTLP export",
                    &c.failed,
                ),
            ],
        )
    }
}

impl Sink for Metrics {
    fn record(&self, event: &Arc<Event>) {
        // An approval's own event is counted as that, not as a request.
        if let Some((by, outcome)) = event.approval_counted {
            self.approval(by, outcome);
            return;
        }
        self.observe(event);
    }
}
