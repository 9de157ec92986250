//! Export of finished spans over OTLP/HTTP (protobuf) to
//! `[telemetry] otlp_endpoint` + `/v1/traces`.
//!
//! Place in the path: beside it. A finished request (its span and its stage
//! spans) is handed with `try_send` to a bounded queue; one exporter thread
//! turns requests into OpenTelemetry span data and sends them in batches with
//! the `opentelemetry-otlp` exporter over a blocking HTTP client.
//!
//! Invariants: the request path never waits for the exporter: when the queue is
//! full the request's spans are dropped and counted ([`ExportCounters::dropped`],
//! exposed in `/metrics`); a batch goes out when it is full, five seconds after its
//! first span, or on [`Traces::flush`], which returns once everything queued
//! before it was sent (or failed) — at shutdown, before the process ends.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};

use super::context::TraceParent;
use super::settings::TelemetrySettings;

/// Finished requests the queue holds before new ones are dropped.
pub const QUEUE: usize = 4096;
/// Most spans sent in one export request.
const MAX_BATCH: usize = 512;
/// Longest a span waits for its batch to fill.
const DELAY: Duration = Duration::from_secs(5);
/// Longest one export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest [`Traces::flush`] waits.
const FLUSH_WAIT: Duration = Duration::from_secs(15);

/// What the exporter has done so far (spans).
#[derive(Debug, Default)]
pub struct ExportCounters {
    /// Spans dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans lost to a failed export.
    pub failed: AtomicU64,
}

/// The gateway's trace export: on when `[telemetry] otlp_endpoint` is set.
#[derive(Debug)]
pub struct Traces {
    exporter: Option<Arc<Exporter>>,
    counters: Arc<ExportCounters>,
}

impl Traces {
    /// Starts the exporter thread for `settings`, or nothing when no endpoint
    /// is configured.
    pub fn start(settings: &TelemetrySettings) -> Result<Self, String> {
        let counters = Arc::new(ExportCounters::default());
        let Some(endpoint) = &settings.otlp_endpoint else {
            return Ok(Self {
                exporter: None,
                counters,
            });
        };
        let url = traces_url(endpoint);
        let exporter = Exporter::start(&url, &settings.replica, QUEUE, counters.clone())?;
        Ok(Self {
            exporter: Some(Arc::new(exporter)),
            counters,
        })
    }

    /// No export.
    pub fn off() -> Self {
        Self {
            exporter: None,
            counters: Arc::default(),
        }
    }

    pub(crate) fn exporter(&self) -> Option<Arc<Exporter>> {
        self.exporter.clone()
    }

    /// The counters, shared (for the metrics).
    pub fn counters(&self) -> Arc<ExportCounters> {
        self.counters.clone()
    }

    /// Blocks until every span queued before the call was sent or failed.
    pub fn flush(&self) {
        if let Some(exporter) = &self.exporter {
            exporter.flush();
        }
    }
}

/// `endpoint` with `/v1/traces` appended (unless it is there already).
fn traces_url(endpoint: &reqwest::Url) -> String {
    let text = endpoint.as_str().trim_end_matches('/');
    if text.ends_with("/v1/traces") {
        text.to_owned()
    } else {
        format!("{text}/v1/traces")
    }
}

enum Msg {
    Request(Box<Finished>),
    Flush(std::sync::mpsc::Sender<()>),
}

/// The request path's side of the exporter thread.
#[derive(Debug)]
pub(crate) struct Exporter {
    tx: SyncSender<Msg>,
    counters: Arc<ExportCounters>,
}

/// A finished request: its span and its stages' spans.
#[derive(Debug)]
pub(crate) struct Finished {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent: Option<TraceParent>,
    pub tracestate: Option<String>,
    pub name: String,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    /// The error type, when the request was refused or failed.
    pub error: Option<String>,
    pub stages: Vec<FinishedStage>,
}

/// One stage of a request, a child of the request span.
#[derive(Debug)]
pub(crate) struct FinishedStage {
    pub name: &'static str,
    pub span_id: SpanId,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    pub error: Option<String>,
}

impl Exporter {
    fn start(
        url: &str,
        replica: &str,
        capacity: usize,
        counters: Arc<ExportCounters>,
    ) -> Result<Self, String> {
        // The blocking client owns a runtime of its own: build it off any async thread.
        let client = std::thread::spawn(|| {
            reqwest::blocking::Client::builder()
                .timeout(EXPORT_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .build()
        })
        .join()
        .map_err(|_| "the OTLP client could not be built".to_owned())?
        .map_err(|e| format!("cannot build the OTLP client: {e}"))?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot build the OTLP exporter for {url}: {e}"))?;
        let resource = Resource::builder()
            .with_service_name("portcullis")
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            // Which replica of a fleet exported the span.
            .with_attribute(KeyValue::new("service.instance.id", replica.to_owned()))
            .build();
        exporter.set_resource(&resource);
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
        let shared = counters.clone();
        let endpoint = url.to_owned();
        std::thread::Builder::new()
            .name("portcullis-otlp".into())
            .spawn(move || run(exporter, rx, shared, endpoint))
            .map_err(|e| e.to_string())?;
        Ok(Self { tx, counters })
    }

    /// Queues a finished request without waiting; drops and counts it when the queue is full.
    pub(crate) fn queue(&self, finished: Finished) {
        let spans = 1 + finished.stages.len() as u64;
        match self.tx.try_send(Msg::Request(Box::new(finished))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(spans, Ordering::Relaxed);
            }
        }
    }

    fn flush(&self) {
        let (done, wait) = std::sync::mpsc::channel();
        if self.tx.send(Msg::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(FLUSH_WAIT);
        }
    }
}

// === exporter thread ===

fn run(
    exporter: opentelemetry_otlp::SpanExporter,
    rx: Receiver<Msg>,
    counters: Arc<ExportCounters>,
    endpoint: String,
) {
    let scope = InstrumentationScope::builder("portcullis")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let mut batch: Vec<SpanData> = Vec::new();
    let mut due: Option<Instant> = None;
    let mut healthy = true;
    let mut send = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let spans = std::mem::take(batch);
        let n = spans.len() as u64;
        match futures_executor::block_on(exporter.export(spans)) {
            Ok(()) => {
                counters.exported.fetch_add(n, Ordering::Relaxed);
                if !healthy {
                    tracing::info!(endpoint = %endpoint, "exporting spans again");
                    healthy = true;
                }
            }
            Err(e) => {
                counters.failed.fetch_add(n, Ordering::Relaxed);
                // Once per outage, not once per batch.
                if healthy {
                    tracing::warn!(endpoint = %endpoint, error = %e, spans = n, "cannot export spans");
                    healthy = false;
                }
            }
        }
    };
    loop {
        let received = match due {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
        };
        match received {
            Ok(Msg::Request(finished)) => {
                spans_of(*finished, &scope, &mut batch);
                due.get_or_insert_with(|| Instant::now() + DELAY);
                if batch.len() >= MAX_BATCH {
                    send(&mut batch);
                    due = None;
                }
            }
            Ok(Msg::Flush(done)) => {
                send(&mut batch);
                due = None;
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {
                send(&mut batch);
                due = None;
            }
            Err(RecvTimeoutError::Disconnected) => {
                send(&mut batch);
                let _ = exporter.shutdown();
                return;
            }
        }
    }
}

/// The request span and its stages as span data.
fn spans_of(f: Finished, scope: &InstrumentationScope, out: &mut Vec<SpanData>) {
    let state = f
        .tracestate
        .as_deref()
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    let context = |span_id| {
        SpanContext::new(
            f.trace_id,
            span_id,
            TraceFlags::SAMPLED,
            false,
            state.clone(),
        )
    };
    let status = |error: &Option<String>| match error {
        Some(code) => Status::error(code.clone()),
        None => Status::Unset,
    };
    for stage in f.stages {
        let mut attributes = stage.attributes;
        if let Some(code) = &stage.error {
            attributes.push(KeyValue::new("error.type", code.clone()));
        }
        out.push(SpanData {
            span_context: context(stage.span_id),
            parent_span_id: f.span_id,
            parent_span_is_remote: false,
            span_kind: stage.kind,
            name: Cow::Borrowed(stage.name),
            start_time: stage.start,
            end_time: stage.end,
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: status(&stage.error),
            instrumentation_scope: scope.clone(),
        });
    }
    out.push(SpanData {
        span_context: context(f.span_id),
        parent_span_id: f.parent.map_or(SpanId::INVALID, |p| p.span_id),
        parent_span_is_remote: f.parent.is_some(),
        span_kind: f.kind,
        name: Cow::Owned(f.name),
        start_time: f.start,
        end_time: f.end,
        attributes: f.attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: status(&f.error),
        instrumentation_scope: scope.clone(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_the_traces_path_once() {
        let url = |s: &str| reqwest::Url::parse(s).expect("url");
        assert_eq!(
            traces_url(&url("http://127.0.0.1:4318")),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url(&url("http://collector:4318/otlp/")),
            "http://collector:4318/otlp/v1/traces"
        );
        assert_eq!(
            traces_url(&url("http://collector:4318/v1/traces")),
            "http://collector:4318/v1/traces"
        );
    }
}
