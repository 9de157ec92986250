//! A scripted upstream that creates tasks, in both eras, from one task store
//! shared by every caller (no sessions): the kind of server whose task ids are
//! the only thing between one client's task and another's, which is what the
//! gateway's task binding must make safe. No official SDK server here creates
//! tasks in a shared store (the Python SDK 2.3.0 has the types only;
//! server-everything keeps its tasks per session), so this one is scripted.
//!
//! Tools: `research` (its task result echoes a report; the topic `leak` puts
//! a canary AWS key in it) and `count` (an `outputSchema` wanting an integer
//! `count`; its task result gives a string). Every task is completed at once.
//! Status messages carry an OSC 8 escape sequence; `tasks/result` is answered
//! on an SSE stream that first sends a status notification of the task and one
//! of a task that is not the caller's (`foreign-task`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::StatusCode;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::misbehaving::CANARIES;

/// The escape sequence in every status message.
pub const STATUS_ESCAPE: &str = "\u{1b}]8;;https://evil.example\u{7}click\u{1b}]8;;\u{7}";

/// The scripted tasks server, serving on a free loopback port until dropped.
#[derive(Debug)]
pub struct TasksUpstream {
    /// `http://127.0.0.1:P/mcp`.
    pub url: String,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TasksUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone, Default)]
struct Shared {
    /// (task id, era 2026?, result).
    tasks: Arc<Mutex<Vec<(String, bool, Value)>>>,
    next: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl TasksUpstream {
    pub async fn start() -> Self {
        let shared = Shared::default();
        let seen = shared.seen.clone();
        let router = Router::new().route("/mcp", post(serve)).with_state(shared);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            url: format!("http://{addr}/mcp"),
            seen,
            task,
        }
    }

    /// How many requests of `method` reached the server.
    pub fn count(&self, method: &str) -> usize {
        let seen = self.seen.lock().expect("lock");
        seen.iter().filter(|m| *m == method).count()
    }
}

fn tools() -> Value {
    json!([
        {"name": "research", "description": "Researches a topic as a task.",
         "inputSchema": {"type": "object", "properties": {"topic": {"type": "string"}}},
         "execution": {"taskSupport": "optional"}},
        {"name": "count", "description": "Counts, as a task.",
         "inputSchema": {"type": "object", "properties": {}},
         "outputSchema": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
         "execution": {"taskSupport": "optional"}}
    ])
}

fn task_fields(id: &str, status: &str, modern: bool) -> serde_json::Map<String, Value> {
    let mut t = serde_json::Map::new();
    t.insert("taskId".into(), id.into());
    t.insert("status".into(), status.into());
    t.insert(
        "statusMessage".into(),
        format!("{status} {STATUS_ESCAPE}").into(),
    );
    t.insert("createdAt".into(), "2026-01-01T00:00:00Z".into());
    t.insert("lastUpdatedAt".into(), "2026-01-01T00:00:01Z".into());
    if modern {
        t.insert("ttlMs".into(), 60_000.into());
        t.insert("pollIntervalMs".into(), 100.into());
    } else {
        t.insert("ttl".into(), 60_000.into());
        t.insert("pollInterval".into(), 100.into());
    }
    t
}

async fn serve(State(shared): State<Shared>, body: Bytes) -> Response {
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    let method = message["method"].as_str().unwrap_or_default().to_owned();
    shared.seen.lock().expect("lock").push(method.clone());
    let Some(id) = message.get("id").cloned() else {
        return StatusCode::ACCEPTED.into_response();
    };
    let params = &message["params"];
    let modern = params["_meta"]["io.modelcontextprotocol/protocolVersion"].is_string();
    let unknown = || {
        axum::Json(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602,
            "message": "Failed to retrieve task: Task not found"}}))
        .into_response()
    };
    let find = |task_id: &str| {
        let tasks = shared.tasks.lock().expect("lock");
        tasks
            .iter()
            .find(|(t, _, _)| t == task_id)
            .map(|(_, m, r)| (*m, r.clone()))
    };
    let task_id = params["taskId"].as_str().unwrap_or_default().to_owned();
    let result = match method.as_str() {
        "initialize" => json!({"protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}, "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}},
            "serverInfo": {"name": "tasks", "version": "1"}}),
        "server/discover" => json!({"resultType": "complete", "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}},
            "serverInfo": {"name": "tasks", "version": "1"}}),
        "tools/list" => json!({"tools": tools()}),
        "tools/call" => {
            let tool = params["name"].as_str().unwrap_or_default();
            let output = match (tool, params["arguments"]["topic"].as_str()) {
                ("count", _) => {
                    json!({"content": [{"type": "text", "text": "{\"count\":\"many\"}"}],
                    "structuredContent": {"count": "many"}})
                }
                (_, Some("leak")) => json!({"content": [{"type": "text",
                    "text": format!("report: the key is {}", CANARIES[0])}]}),
                (_, topic) => json!({"content": [{"type": "text",
                    "text": format!("report on {}", topic.unwrap_or("nothing"))}]}),
            };
            if !modern && params.get("task").is_none() {
                output
            } else {
                let n = shared.next.fetch_add(1, Ordering::SeqCst);
                let task_id = format!("task-{n}");
                shared
                    .tasks
                    .lock()
                    .expect("lock")
                    .push((task_id.clone(), modern, output));
                if modern {
                    let mut t = task_fields(&task_id, "working", true);
                    t.insert("resultType".into(), "task".into());
                    Value::Object(t)
                } else {
                    json!({"task": task_fields(&task_id, "working", false)})
                }
            }
        }
        "tasks/get" => match find(&task_id) {
            None => return unknown(),
            Some((true, output)) => {
                let mut t = task_fields(&task_id, "completed", true);
                t.insert("resultType".into(), "complete".into());
                t.insert("result".into(), output);
                Value::Object(t)
            }
            Some((false, _)) => Value::Object(task_fields(&task_id, "completed", false)),
        },
        "tasks/cancel" => match find(&task_id) {
            None => return unknown(),
            Some((true, _)) => json!({"resultType": "complete"}),
            Some((false, _)) => Value::Object(task_fields(&task_id, "cancelled", false)),
        },
        "tasks/update" => match find(&task_id) {
            None => return unknown(),
            Some(_) => json!({"resultType": "complete"}),
        },
        "tasks/list" => {
            // Two tasks a page, so that a list of several has pages.
            let tasks = shared.tasks.lock().expect("lock").clone();
            let start: usize = params["cursor"]
                .as_str()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let page: Vec<Value> = tasks
                .iter()
                .skip(start)
                .take(2)
                .map(|(t, m, _)| Value::Object(task_fields(t, "completed", *m)))
                .collect();
            let mut result = json!({"tasks": page});
            if start + 2 < tasks.len() {
                result["nextCursor"] = (start + 2).to_string().into();
            }
            result
        }
        "tasks/result" => {
            let Some((_, mut output)) = find(&task_id) else {
                return unknown();
            };
            output["_meta"] = json!({"io.modelcontextprotocol/related-task": {"taskId": task_id}});
            let status = |t: &str| {
                json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                    "params": task_fields(t, "completed", false)})
            };
            let response = json!({"jsonrpc": "2.0", "id": id, "result": output});
            let body = format!(
                "data: {}\n\ndata: {}\n\ndata: {response}\n\n",
                status(&task_id),
                status("foreign-task")
            );
            return ([(http::header::CONTENT_TYPE, "text/event-stream")], body).into_response();
        }
        _ => {
            return axum::Json(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "Method not found"}}))
            .into_response();
        }
    };
    axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}
