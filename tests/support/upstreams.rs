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
}

async fn count(State(seen): State<Seen>, request: Request, next: Next) -> Response {
    seen.hits.fetch_add(1, Ordering::SeqCst);
    seen.headers
        .lock()
        .expect("lock")
        .push(request.headers().clone());
    next.run(request).await
}

impl InProcess {
    async fn serve(
        router: Router,
        calls: Arc<Mutex<Vec<(String, Value)>>>,
        demo: Option<DemoUpstream>,
    ) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let headers = Arc::new(Mutex::new(Vec::new()));
        let seen = Seen {
            hits: hits.clone(),
            headers: headers.clone(),
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
        let calls: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
        let state = (Arc::new(tools), calls.clone());
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

    /// Tools the upstream ran: (name, arguments).
    pub fn ran(&self) -> Vec<(String, Value)> {
        match &self.demo {
            Some(d) => d.calls(),
            None => self.calls.lock().expect("lock").clone(),
        }
    }
}

type ScriptState = (Arc<Vec<Value>>, Arc<Mutex<Vec<(String, Value)>>>);

async fn scripted(State((tools, calls)): State<ScriptState>, body: Bytes) -> Response {
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    let id = message.get("id").cloned();
    let Some(id) = id else {
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match message["method"].as_str().unwrap_or_default() {
        "initialize" => json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
            "serverInfo": {"name": "scripted", "version": "1"}}),
        "tools/list" => json!({"tools": *tools}),
        "tools/call" => {
            let name = message["params"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            calls
                .lock()
                .expect("lock")
                .push((name, message["params"]["arguments"].clone()));
            json!({"content": [{"type": "text", "text": "ran"}]})
        }
        _ => {
            let err = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no such method"}});
            return axum::Json(err).into_response();
        }
    };
    axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}
