//! `[telemetry]`: where spans are exported and how log lines are written.
//!
//! Place: the bottom of `telemetry`; config compiles into it, the exporter
//! and the log set-up read it.

/// `[telemetry]`.
#[derive(Debug, Clone)]
pub struct TelemetrySettings {
    /// OTLP/HTTP endpoint for traces.
    pub otlp_endpoint: Option<reqwest::Url>,
    /// Log line format.
    pub log_format: LogFormat,
    /// `[gateway] replica`: the spans' `service.instance.id`.
    pub replica: String,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable.
    Pretty,
}
