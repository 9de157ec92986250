//! The request path's tracing work for one `tools/call`, outside the gateway,
//! so `benches/telemetry.rs` can time it with export on and off.
//!
//! Place in the path: none; it replays the calls the pipeline makes on a
//! [`RequestTrace`] for a forwarded call, in the same order.

use bytes::Bytes;
use http::{HeaderMap, Method, Uri, Version};

use super::span::RequestTrace;
use crate::mcp::jsonrpc::Message;
use crate::record::event::Event;
use crate::telemetry::Traces;

/// One request, classified once.
#[derive(Debug)]
pub struct Probe {
    headers: HeaderMap,
    body: Bytes,
    message: Message,
    uri: Uri,
    upstream: reqwest::Url,
    /// The audit event the pipeline would have filled in by the end.
    event: Event,
}

impl Probe {
    /// A request with `headers` and the JSON-RPC `body`.
    pub fn new(headers: HeaderMap, body: &str) -> Result<Self, String> {
        let message = Message::classify(body.as_bytes(), 64).map_err(|e| format!("{e:?}"))?;
        Ok(Self {
            headers,
            body: Bytes::from(body.to_owned()),
            message,
            uri: Uri::from_static("/mcp/demo"),
            upstream: reqwest::Url::parse("http://127.0.0.1:8080/mcp")
                .map_err(|e| e.to_string())?,
            event: Event {
                client: Some("alice".into()),
                server: Some("demo".into()),
                method: "tools/call".into(),
                tool: Some("echo".into()),
                decision: "forwarded".into(),
                stage: "forwarded".into(),
                http_status: Some(200),
                era: "2026-07-28".into(),
                ..Event::default()
            },
        })
    }

    /// Everything the pipeline asks of the trace for a forwarded call; returns
    /// the trace id the audit event would record.
    pub fn run(&self, traces: &Traces) -> Option<String> {
        let trace = RequestTrace::begin(
            traces.exporter(),
            &Method::POST,
            Version::HTTP_11,
            &self.uri,
            &self.headers,
        );
        for stage in ["authenticate", "read_body", "classify"] {
            trace.stage(stage);
        }
        trace.classified(&self.message);
        for stage in ["negotiate", "catalog", "authorize"] {
            trace.stage(stage);
        }
        trace.rule(Some(0));
        trace.stage("rate_limit");
        trace.stage("validate");
        let mut out = HeaderMap::new();
        let body = trace.forward(&mut out, Some(self.body.clone()), Some(&self.upstream));
        std::hint::black_box((body, out));
        trace.replied(200);
        let id = trace.trace_id();
        trace.finish(&self.event);
        id
    }
}
