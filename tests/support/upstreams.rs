//! In-process upstreams: the bundled demo server (behind a counter that sees
//! every request and its headers), and a scripted server that advertises
//! whatever tools a test needs — for the hostile definitions no real server
//! produces on demand.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use portcullis::demo::upstream::{self, DemoOptions, DemoUpstream};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// An upstream serving in-process on a free loopback port.
#[derive(Debug)]
pub struct InProcess {
    /// `http://127.0.0.1:P/mcp`.
    pub url: String,
    hits: Arc<AtomicUsize>,
    headers: Arc<Mutex<Vec<HeaderMap>>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    calls: Arc<Mutex<Vec<(String, Value)>>>,
    demo: Option<DemoUpstream>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Seen {
    hits: Arc<AtomicUsize>,
    headers: Arc<Mutex<Vec<HeaderMap>>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

async fn count(State(seen): State<Seen>, request: Request, next: Next) -> Response {
    seen.hits.fetch_add(1, Ordering::SeqCst);
    seen.headers
        .lock()
        .expect("lock")
        .push(request.headers().clone());
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, 16 << 20)
        .await
        .unwrap_or_default();
    seen.bodies.lock().expect("lock").push(bytes.clone());
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

impl InProcess {
    async fn serve(
        router: Router,
        calls: Arc<Mutex<Vec<(String, Value)>>>,
        demo: Option<DemoUpstream>,
    ) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let headers = Arc::new(Mutex::new(Vec::new()));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = Seen {
            hits: hits.clone(),
            headers: headers.clone(),
            bodies: bodies.clone(),
        };
        let router = router.layer(middleware::from_fn_with_state(seen, count));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            url: format!("http://{addr}/mcp"),
            hits,
            headers,
            bodies,
            calls,
            demo,
            task,
        }
    }

    /// The bundled demo server.
    pub async fn demo() -> Self {
        let (router, handle) = upstream::router(DemoOptions::default());
        Self::serve(router, Arc::default(), Some(handle)).await
    }

    /// A server advertising exactly `tools`, answering every call with "ran".
    pub async fn scripted(tools: Vec<Value>) -> Self {
        Self::scripted_with(Script {
            tools,
            ..Script::default()
        })
        .await
    }

    /// A scripted server with pagination and a tool list that changes.
    pub async fn scripted_with(script: Script) -> Self {
        let calls: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
        let state = ScriptState {
            script: Arc::new(Mutex::new(script)),
            calls: calls.clone(),
        };
        let router = Router::new()
            .route("/mcp", post(scripted))
            .with_state(state);
        Self::serve(router, calls, None).await
    }

    /// Requests that reached the upstream at all.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Headers of every request that reached the upstream.
    pub fn headers(&self) -> Vec<HeaderMap> {
        self.headers.lock().expect("lock").clone()
    }

    /// Bodies of every request that reached the upstream, as they arrived.
    pub fn bodies(&self) -> Vec<Bytes> {
        self.bodies.lock().expect("lock").clone()
    }

    /// Tools the upstream ran: (name, arguments).
    pub fn ran(&self) -> Vec<(String, Value)> {
        match &self.demo {
            Some(d) => d.calls(),
            None => self.calls.lock().expect("lock").clone(),
        }
    }
}

/// What a scripted server advertises.
#[derive(Debug, Default, Clone)]
pub struct Script {
    /// The tools listed.
    pub tools: Vec<Value>,
    /// Tools per `tools/list` page (0: one page).
    pub page_size: usize,
    /// Calling the tool `mutate` replaces the list with these and announces
    /// `notifications/tools/list_changed` on the call's SSE stream.
    pub next_tools: Option<Vec<Value>>,
    /// `instructions` of the `initialize` result.
    pub instructions: Option<String>,
    /// Calling `mutate` replaces the instructions with these.
    pub next_instructions: Option<String>,
}

#[derive(Clone)]
struct ScriptState {
    script: Arc<Mutex<Script>>,
    calls: Arc<Mutex<Vec<(String, Value)>>>,
}

async fn scripted(State(state): State<ScriptState>, body: Bytes) -> Response {
    let ScriptState { script, calls } = state;
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    let id = message.get("id").cloned();
    let Some(id) = id else {
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match message["method"].as_str().unwrap_or_default() {
        "initialize" => {
            let mut result = json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "scripted", "version": "1"}});
            if let Some(text) = &script.lock().expect("lock").instructions {
                result["instructions"] = text.clone().into();
            }
            result
        }
        "tools/list" => {
            let script = script.lock().expect("lock").clone();
            let start: usize = message["params"]["cursor"]
                .as_str()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let size = if script.page_size == 0 {
                usize::MAX
            } else {
                script.page_size
            };
            let page: Vec<Value> = script
                .tools
                .iter()
                .skip(start)
                .take(size)
                .cloned()
                .collect();
            let mut result = json!({"tools": page});
            if start.saturating_add(size) < script.tools.len() {
                result["nextCursor"] = (start + size).to_string().into();
            }
            result
        }
        "tools/call" => {
            let name = message["params"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            calls
                .lock()
                .expect("lock")
                .push((name.clone(), message["params"]["arguments"].clone()));
            let result = json!({"content": [{"type": "text", "text": "ran"}]});
            if name == "mutate" {
                let mut script = script.lock().expect("lock");
                if let Some(next) = script.next_tools.take() {
                    script.tools = next;
                }
                if let Some(next) = script.next_instructions.take() {
                    script.instructions = Some(next);
                }
                let changed =
                    json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
                let response = json!({"jsonrpc": "2.0", "id": id, "result": result});
                let body = format!("data: {changed}\n\ndata: {response}\n\n");
                return ([(http::header::CONTENT_TYPE, "text/event-stream")], body).into_response();
            }
            result
        }
        _ => {
            let err = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no such method"}});
            return axum::Json(err).into_response();
        }
    };
    axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}
