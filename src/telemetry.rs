//! Telemetry: logs and OpenTelemetry traces.
//!
//! Logs: one line per request (client, server, method, tool, outcome, latency),
//! as JSON or human-readable. Traces: one span per request with a child per
//! pipeline stage (`record::span`), exported over OTLP/HTTP when
//! `[telemetry] otlp_endpoint` is set ([`export`]); the trace context comes from
//! the client ([`context`]) and goes on to the upstream.
//!
//! Invariants: the subscriber is installed once per process; tool arguments and
//! results are never logged nor put on a span, only names, codes and sizes;
//! every event is one line of plain characters ([`lines`]), with no colour
//! codes, so nothing a client or a server chose can forge a line.

pub mod context;
pub mod export;
mod lines;
pub(crate) mod settings;

pub use export::{ExportCounters, Traces};

pub use settings::{LogFormat, TelemetrySettings};
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; `RUST_LOG` overrides the default `info`
/// level. Every line names `replica` when given.
pub fn init(format: LogFormat, replica: Option<&str>) {
    let replica: Option<std::sync::Arc<str>> = replica.map(Into::into);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = matches!(format, LogFormat::Json);
    // No colours: their escape codes would be escaped like any other.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(move || lines::Lines {
            inner: std::io::stderr(),
            json,
            replica: replica.clone(),
        });
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Pretty => builder.compact().try_init(),
    };
}
