//! An OTLP/HTTP trace receiver: `POST /v1/traces` on a free loopback port,
//! decoding the real protobuf (`ExportTraceServiceRequest`) into spans a test
//! can look at.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;
use tokio::net::TcpListener;

/// One received span, its ids in lowercase hex.
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// `opentelemetry_proto` span kind (2 server, 3 client, 1 internal).
    pub kind: i32,
    /// `Status.code`: 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    pub status_message: String,
    pub attributes: BTreeMap<String, String>,
    /// `service.name` of the resource that sent it.
    pub service: String,
}

impl Span {
    /// An attribute as text (numbers as their decimal text).
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// A receiver serving on `127.0.0.1:0`; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    /// `http://127.0.0.1:P` (the gateway appends `/v1/traces`).
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Sink {
    spans: Arc<Mutex<Vec<Span>>>,
    /// How long the receiver takes to answer (a collector under load).
    delay: Duration,
}

async fn receive(
    State(sink): State<Sink>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    tokio::time::sleep(sink.delay).await;
    let spans = sink.spans;
    let protobuf = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
    let Ok(request) = ExportTraceServiceRequest::decode(body).map_err(|_| ()) else {
        return (StatusCode::BAD_REQUEST, HeaderMap::new(), Vec::new());
    };
    if !protobuf {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            HeaderMap::new(),
            Vec::new(),
        );
    }
    let mut got = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                let status = span.status.unwrap_or_default();
                got.push(Span {
                    name: span.name,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    kind: span.kind,
                    status_code: status.code,
                    status_message: status.message,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| {
                            (
                                kv.key.clone(),
                                text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                            )
                        })
                        .collect(),
                    service: service.clone(),
                });
            }
        }
    }
    spans.lock().expect("lock").extend(got);
    let mut out = HeaderMap::new();
    out.insert(
        "content-type",
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    let reply = ExportTraceServiceResponse::default().encode_to_vec();
    (StatusCode::OK, out, reply)
}

fn text(value: Option<&Any>) -> String {
    match value {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

impl Receiver {
    pub async fn start() -> Self {
        Self::start_slow(Duration::ZERO).await
    }

    /// A receiver that takes `delay` to store and answer each export.
    pub async fn start_slow(delay: Duration) -> Self {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let sink = Sink {
            spans: spans.clone(),
            delay,
        };
        let router = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(sink);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            endpoint: format!("http://{addr}"),
            spans,
            task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("lock").clone()
    }

    /// Waits (at most 20 s) until a request span named `name` has arrived
    /// with its stages, and returns the spans of its trace.
    pub async fn request(&self, name: &str) -> (Span, Vec<Span>) {
        for _ in 0..400 {
            let spans = self.spans();
            if let Some(root) = spans
                .iter()
                .find(|s| s.name == name && s.kind == SERVER)
                .cloned()
            {
                let children = spans
                    .into_iter()
                    .filter(|s| s.parent_span_id == root.span_id)
                    .collect();
                return (root, children);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no request span {name:?} arrived; got {:#?}", self.spans());
    }
}

/// `Span.kind` of a server span.
pub const SERVER: i32 = 2;
/// `Span.kind` of a client span.
pub const CLIENT: i32 = 3;
