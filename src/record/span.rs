//! The spans of one request: the request span, one child per pipeline stage,
//! and the trace context the upstream receives.
//!
//! Place in the path: a [`RequestTrace`] rides in the request's audit
//! [`Trail`](crate::record::trail::Trail). The pipeline opens stages as it goes
//! ([`RequestTrace::stage`]); each stage lasts until the next one opens, so
//! the stage that is open when a request is refused is the one that refused
//! it. When the trail is let go (the response sent to the end), the spans are
//! finished from the audit event and queued for export in one piece.
//!
//! Invariants: with no exporter configured, opening a stage does nothing and
//! no id is minted (the client's own trace id is still recorded for the
//! audit); attributes hold names, codes, ids and a hash of the session id —
//! never arguments, results, or the raw session id; the upstream's
//! `traceparent` names the forward stage, in the request's trace; the audit
//! event's trace id is the exported spans' trace id.

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Version};
use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanId, SpanKind, TraceId};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::mcp::META_PROTOCOL_VERSION;
use crate::mcp::headers::{MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::mcp::jsonrpc::Message;
use crate::mcp::methods::Method as Rpc;
use crate::record::event::Event;
use crate::telemetry::context::TraceParent;
use crate::telemetry::export::{Exporter, Finished, FinishedStage};

/// The stage opened when the upstream's reply arrives: relaying it to the
/// client, with sanitizing and the rewriting of failures.
pub(crate) const RESPOND: &str = "respond";
/// The stage that sends the request upstream.
pub(crate) const FORWARD: &str = "forward";

/// The spans of one request while it is served.
#[derive(Debug)]
pub(crate) struct RequestTrace {
    /// Where finished spans go; `None` when tracing is off.
    exporter: Option<Arc<Exporter>>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The client's context: `params._meta` over the `traceparent` header.
    parent: Option<TraceParent>,
    tracestate: Option<String>,
    /// The `params._meta.traceparent` text as the client sent it.
    meta_traceparent: Option<String>,
    /// The parent's trace id, or a new one (only when tracing is on).
    trace_id: Option<TraceId>,
    span_id: SpanId,
    started: Instant,
    started_at: SystemTime,
    stages: Vec<FinishedStage>,
    open: Option<Open>,
    facts: Facts,
}

#[derive(Debug)]
struct Open {
    name: &'static str,
    span_id: SpanId,
    started: Instant,
    /// For the forward stage: the upstream host and port, then its status.
    upstream: Option<(String, Option<u16>)>,
    status: Option<u16>,
    /// For the forward stage: which try of the request it is (from 1).
    attempt: u32,
    /// Why this stage ended without the answer (a try that is sent again).
    error: Option<String>,
}

/// What the request span says besides the audit event.
#[derive(Debug, Default)]
struct Facts {
    http_method: String,
    http_version: &'static str,
    host: Option<(String, Option<u16>)>,
    session: Option<String>,
    protocol_version: Option<String>,
    rpc_id: Option<String>,
    mcp_method: Option<String>,
    rule: Option<usize>,
}

impl RequestTrace {
    /// The trace of a request with these headers; opens the `admit` stage.
    pub(crate) fn begin(
        exporter: Option<Arc<Exporter>>,
        method: &Method,
        version: Version,
        uri: &http::Uri,
        headers: &HeaderMap,
    ) -> Self {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let parent = text("traceparent").and_then(TraceParent::parse);
        let on = exporter.is_some();
        let started = Instant::now();
        let mut state = State {
            parent,
            tracestate: parent.and(text("tracestate")).map(str::to_owned),
            meta_traceparent: None,
            trace_id: parent.map(|p| p.trace_id),
            span_id: SpanId::INVALID,
            started,
            started_at: SystemTime::now(),
            stages: Vec::new(),
            open: None,
            facts: Facts::default(),
        };
        if on {
            state.trace_id = state.trace_id.or_else(|| Some(new_trace_id()));
            state.span_id = new_span_id();
            state.open = Some(Open::new("admit", started));
            // HTTP/2 names the authority in the URI, HTTP/1.1 in `Host`.
            let authority = uri
                .authority()
                .cloned()
                .or_else(|| text("host").and_then(|h| h.parse::<http::uri::Authority>().ok()));
            let host = authority.as_ref().map(|a| {
                a.host()
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned()
            });
            let port = authority.as_ref().and_then(|a| a.port_u16());
            state.facts = Facts {
                http_method: method.to_string(),
                http_version: match version {
                    Version::HTTP_10 => "1.0",
                    Version::HTTP_2 => "2",
                    Version::HTTP_3 => "3",
                    _ => "1.1",
                },
                host: host.map(|h| (h, port)),
                session: text(MCP_SESSION_ID).map(str::to_owned),
                protocol_version: text(MCP_PROTOCOL_VERSION).map(str::to_owned),
                ..Facts::default()
            };
        }
        Self {
            exporter,
            state: Mutex::new(state),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> Option<R> {
        self.exporter.as_ref()?;
        Some(f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner())))
    }

    /// Closes the open stage and opens `name`.
    pub(crate) fn stage(&self, name: &'static str) {
        self.with(|s| s.open_stage(Open::new(name, Instant::now())));
    }

    /// What the body says: the JSON-RPC method and id, the protocol version,
    /// and the trace context of `params._meta`, which takes the place of the
    /// header's (it names the MCP request, not the HTTP exchange).
    pub(crate) fn classified(&self, message: &Message) {
        let meta_text = message.meta_str("traceparent");
        let meta_parent = meta_text.and_then(TraceParent::parse);
        let on = self.exporter.is_some();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(parent) = meta_parent {
            state.parent = Some(parent);
            state.tracestate = message.meta_str("tracestate").map(crate::util::text::clip);
            state.trace_id = Some(parent.trace_id);
            state.meta_traceparent = meta_text.map(str::to_owned);
        }
        if !on {
            return;
        }
        let facts = &mut state.facts;
        // What a span keeps of client-chosen names is bounded (`mcp::limits`).
        facts.mcp_method = message.method().map(crate::util::text::clip);
        facts.rpc_id = message.id().map(|id| match id {
            Value::String(s) => crate::util::text::clip(s),
            other => crate::util::text::clip(&other.to_string()),
        });
        if let Some(version) = message.meta_str(META_PROTOCOL_VERSION) {
            facts.protocol_version = Some(version.to_owned());
        }
    }

    /// The access rule that decided (`[[rules]]` index).
    pub(crate) fn rule(&self, rule: Option<usize>) {
        self.with(|s| s.facts.rule = rule);
    }

    /// Opens the forward stage to `url`, and gives the upstream a
    /// `traceparent` naming it, in the header and — when the client put one
    /// there — in the body's `params._meta` (see [`swap_traceparent`]). With
    /// tracing off the client's trace context crosses unchanged.
    pub(crate) fn forward(
        &self,
        headers: &mut HeaderMap,
        body: Option<Bytes>,
        url: Option<&reqwest::Url>,
    ) -> Option<Bytes> {
        self.forward_try(headers, body, url, 1)
    }

    /// [`Self::forward`] for try number `attempt` of the same message: each
    /// try is a forward stage of its own, named in its own `traceparent`.
    pub(crate) fn forward_try(
        &self,
        headers: &mut HeaderMap,
        body: Option<Bytes>,
        url: Option<&reqwest::Url>,
        attempt: u32,
    ) -> Option<Bytes> {
        let mut body = body;
        self.with(|s| {
            let mut open = Open::new(FORWARD, Instant::now());
            open.attempt = attempt;
            // A stdio server has no address.
            open.upstream = url.and_then(|url| {
                url.host_str()
                    .map(|h| (h.to_owned(), url.port_or_known_default()))
            });
            let context = TraceParent {
                trace_id: s.trace_id.unwrap_or(TraceId::INVALID),
                span_id: open.span_id,
                sampled: s.sampled(),
            };
            let text = context.header();
            if let (Some(old), Some(b)) = (&s.meta_traceparent, &body) {
                body = Some(swap_traceparent(b, old, &text));
            }
            if let Ok(value) = HeaderValue::from_str(&text) {
                headers.insert("traceparent", value);
            }
            s.open_stage(open);
        });
        body
    }

    /// The try under way failed for `cause` and the request is sent again:
    /// its forward stage ends with that error (the next try opens its own
    /// through [`Self::forward`]).
    pub(crate) fn attempt_failed(&self, cause: &str) {
        self.with(|s| {
            if let Some(open) = s.open.as_mut().filter(|o| o.name == FORWARD) {
                open.error = Some(cause.to_owned());
            }
        });
    }

    /// The upstream replied with `status`: the forward stage ends and the
    /// respond stage opens.
    pub(crate) fn replied(&self, status: u16) {
        self.with(|s| {
            if let Some(open) = s.open.as_mut().filter(|o| o.name == FORWARD) {
                open.status = Some(status);
            }
            s.open_stage(Open::new(RESPOND, Instant::now()));
        });
    }

    /// The trace id the audit event records.
    pub(crate) fn trace_id(&self) -> Option<String> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.trace_id.map(|t| t.to_string())
    }

    /// Ends every span with the request's audit `event` and queues them.
    pub(crate) fn finish(&self, event: &Event) {
        let Some(exporter) = &self.exporter else {
            return;
        };
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let ended = Instant::now();
        if let Some(open) = state.open.take() {
            let stage = state.close(open, ended);
            state.stages.push(stage);
        }
        let (Some(trace_id), true) = (state.trace_id, state.sampled()) else {
            return;
        };
        let refused = event.decision != "forwarded" && !event.decision.is_empty();
        let failed = event.http_status.is_some_and(|s| s >= 500);
        let error = if refused {
            Some(event.decision.clone())
        } else if failed {
            event.http_status.map(|s| s.to_string())
        } else {
            None
        };
        // The stage open at the end is the one that refused or failed the request.
        let mut stages = std::mem::take(&mut state.stages);
        if let (Some(code), Some(last)) = (&error, stages.last_mut()) {
            last.error = Some(code.clone());
        }
        let name = match (&state.facts.mcp_method, &event.tool) {
            (Some(method), Some(tool)) => format!("{method} {tool}"),
            (Some(method), None) => method.clone(),
            (None, _) => state.facts.http_method.clone(),
        };
        let attributes = request_attributes(&state.facts, event, error.as_deref());
        let finished = Finished {
            trace_id,
            span_id: state.span_id,
            parent: state.parent,
            tracestate: state.tracestate.take(),
            name,
            kind: SpanKind::Server,
            start: state.started_at,
            end: state.at(ended),
            attributes,
            error,
            stages,
        };
        drop(state);
        exporter.queue(finished);
    }
}

impl State {
    fn sampled(&self) -> bool {
        self.parent.is_none_or(|p| p.sampled)
    }

    fn at(&self, instant: Instant) -> SystemTime {
        self.started_at + instant.saturating_duration_since(self.started)
    }

    fn open_stage(&mut self, next: Open) {
        if let Some(open) = self.open.replace(next) {
            let stage = self.close(open, Instant::now());
            self.stages.push(stage);
        }
    }

    fn close(&self, open: Open, ended: Instant) -> FinishedStage {
        let mut attributes = Vec::new();
        if let Some((host, port)) = open.upstream {
            attributes.push(KeyValue::new("server.address", host));
            if let Some(port) = port {
                attributes.push(KeyValue::new("server.port", i64::from(port)));
            }
            attributes.push(KeyValue::new("http.request.method", "POST"));
            attributes.push(KeyValue::new("network.protocol.name", "http"));
        }
        if let Some(status) = open.status {
            attributes.push(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if open.attempt > 0 {
            attributes.push(KeyValue::new("portcullis.attempt", i64::from(open.attempt)));
        }
        FinishedStage {
            name: open.name,
            span_id: open.span_id,
            kind: if open.name == FORWARD {
                SpanKind::Client
            } else {
                SpanKind::Internal
            },
            start: self.at(open.started),
            end: self.at(ended),
            attributes,
            error: open.error,
        }
    }
}

impl Open {
    fn new(name: &'static str, started: Instant) -> Self {
        Self {
            name,
            span_id: new_span_id(),
            started,
            upstream: None,
            status: None,
            attempt: 0,
            error: None,
        }
    }
}

/// `body` with the client's `_meta` `traceparent` text replaced by `new`, in
/// place: the body is not re-serialized, so everything the gateway checked
/// (and every header mirroring the body) stays as it was. Done only when the
/// old text appears exactly once, as a JSON string, with the same length.
fn swap_traceparent(body: &Bytes, old: &str, new: &str) -> Bytes {
    let quoted = |t: &str| format!("\"{t}\"");
    let (old, new) = (quoted(old), quoted(new));
    if old.len() != new.len() {
        return body.clone();
    }
    match places(body, old.as_bytes()).as_slice() {
        [at] => {
            let mut out = body.to_vec();
            out[*at..*at + new.len()].copy_from_slice(new.as_bytes());
            Bytes::from(out)
        }
        _ => body.clone(),
    }
}

/// Where `needle` starts in `haystack`: at most two places (more is as ambiguous as two).
fn places(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .take(2)
        .collect()
}

/// The attribute a request's subject is exported as: the MCP semantic
/// conventions' own for a resource's URI and a prompt's name, the gateway's
/// for what they have none for (a completion's reference, a listen's URIs,
/// an operator's method).
fn subject_key(method: Option<Rpc>) -> &'static str {
    match method {
        Some(Rpc::ResourcesRead | Rpc::ResourcesSubscribe | Rpc::ResourcesUnsubscribe) => {
            "mcp.resource.uri"
        }
        Some(Rpc::PromptsGet) => "gen_ai.prompt.name",
        _ => "portcullis.subject",
    }
}

fn request_attributes(facts: &Facts, event: &Event, error: Option<&str>) -> Vec<KeyValue> {
    let mut a = Vec::with_capacity(20);
    let mut text = |key: &'static str, value: Option<&str>| {
        if let Some(v) = value {
            a.push(KeyValue::new(key, v.to_owned()));
        }
    };
    text("mcp.method.name", facts.mcp_method.as_deref());
    text("gen_ai.tool.name", event.tool.as_deref());
    let method = facts.mcp_method.as_deref().and_then(Rpc::of);
    text(subject_key(method), event.subject.as_deref());
    if method == Some(Rpc::ToolsCall) {
        text("gen_ai.operation.name", Some("execute_tool"));
    }
    text(
        "mcp.session.id",
        facts.session.as_deref().map(hash).as_deref(),
    );
    text("mcp.protocol.version", facts.protocol_version.as_deref());
    text("jsonrpc.request.id", facts.rpc_id.as_deref());
    text("network.protocol.name", Some("http"));
    text("network.protocol.version", Some(facts.http_version));
    text("network.transport", Some("tcp"));
    text("http.request.method", Some(&facts.http_method));
    text(
        "server.address",
        facts.host.as_ref().map(|(h, _)| h.as_str()),
    );
    text("error.type", error);
    text("portcullis.client", event.client.as_deref());
    text("portcullis.server", event.server.as_deref());
    text("portcullis.decision", Some(&event.decision));
    text("portcullis.era", Some(&event.era));
    let rule = facts.rule.map(|r| format!("rules[{r}]"));
    text("portcullis.rule", rule.as_deref());
    if let Some(port) = facts.host.as_ref().and_then(|(_, p)| *p) {
        a.push(KeyValue::new("server.port", i64::from(port)));
    }
    if let Some(status) = event.http_status {
        a.push(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
    }
    a
}

/// A session id as spans carry it: 16 bytes of its SHA-256, in hex.
pub(crate) fn hash(session: &str) -> String {
    hex::encode(&Sha256::digest(session.as_bytes())[..16])
}

fn new_trace_id() -> TraceId {
    let mut bytes = rand::random::<[u8; 16]>();
    // All zeros is the invalid id.
    bytes[15] |= u8::from(bytes == [0; 16]);
    TraceId::from_bytes(bytes)
}

fn new_span_id() -> SpanId {
    let mut bytes = rand::random::<[u8; 8]>();
    bytes[7] |= u8::from(bytes == [0; 8]);
    SpanId::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const NEW: &str = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";

    #[test]
    fn swaps_the_meta_traceparent_in_place() {
        let body =
            format!(r#"{{"params":{{"_meta":{{"traceparent":"{OLD}"}},"arguments":{{}}}}}}"#);
        let out = swap_traceparent(&Bytes::from(body.clone()), OLD, NEW);
        assert_eq!(out.len(), body.len());
        assert_eq!(String::from_utf8_lossy(&out), body.replace(OLD, NEW));
    }

    #[test]
    fn leaves_the_body_alone_when_the_text_is_ambiguous() {
        let body = format!(
            r#"{{"params":{{"_meta":{{"traceparent":"{OLD}"}},"arguments":{{"x":"{OLD}"}}}}}}"#
        );
        let body = Bytes::from(body);
        assert_eq!(swap_traceparent(&body, OLD, NEW), body);
        let escaped = Bytes::from(format!(r#"{{"traceparent":"\u0030{}"}}"#, &OLD[1..]));
        assert_eq!(swap_traceparent(&escaped, OLD, NEW), escaped);
    }

    #[test]
    fn hashes_session_ids() {
        let h = hash("a-session");
        assert_eq!(h.len(), 32);
        assert_ne!(h, hash("another-session"));
        assert!(!h.contains("a-session"));
    }

    #[test]
    fn a_subject_is_exported_under_the_mcp_conventions_name_where_there_is_one() {
        let attribute = |method: &str, subject: &str| {
            let facts = Facts {
                mcp_method: Some(method.into()),
                ..Facts::default()
            };
            let event = Event {
                method: method.into(),
                subject: Some(subject.into()),
                ..Event::default()
            };
            let found = request_attributes(&facts, &event, None)
                .into_iter()
                .find(|kv| kv.value.as_str() == subject)
                .map(|kv| kv.key.as_str().to_owned());
            found.unwrap_or_default()
        };
        assert_eq!(
            attribute("resources/read", "file:///a?x=1"),
            "mcp.resource.uri"
        );
        assert_eq!(attribute("prompts/get", "greet"), "gen_ai.prompt.name");
        assert_eq!(
            attribute("completion/complete", "greet"),
            "portcullis.subject"
        );
    }
}
