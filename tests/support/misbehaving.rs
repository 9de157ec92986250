//! A misbehaving upstream: the faults no SDK produces on demand, one per tool.
//!
//! It speaks just enough HTTP/1.1 over raw TCP (one request per connection,
//! `Connection: close`) to list its tools properly, then answers each
//! `tools/call` with the fault its tool is named after — down to resetting the
//! connection in the middle of a stream, which an HTTP framework would not do.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod faults;
use faults::fault;

/// Canary secrets the faults carry in their words.
pub const CANARY_PASSWORD: &str = "hunter2-canary";

/// The tools, with the fault each answers with.
pub const FAULTS: &[(&str, &str)] = &[
    ("wrong_id", "a JSON response to another id"),
    (
        "sse_wrong_id",
        "an SSE response to another id, then the end of the stream",
    ),
    (
        "truncated_sse",
        "a progress event, half an event, then the end of the stream",
    ),
    (
        "sse_no_response",
        "a progress event, then the end of the stream",
    ),
    ("html_502", "HTTP 502 with an HTML page"),
    ("garbage_json", "application/json that is not JSON"),
    ("drip", "an SSE event one byte a second"),
    ("reset", "a progress event, then a TCP reset"),
    ("rpc_internal", "JSON-RPC error -32603 with hostile text"),
    ("rpc_server_error", "JSON-RPC error -32000"),
    ("rpc_unknown_tool", "JSON-RPC error -32602 Tool not found"),
    ("rpc_invalid_params", "JSON-RPC error -32602 on arguments"),
    (
        "python_opaque",
        "isError \"Error executing tool python_opaque\"",
    ),
    (
        "schema_redacted",
        "structuredContent whose secret, redacted, breaks the outputSchema",
    ),
    (
        "schema_wrong",
        "structuredContent that never matched its outputSchema",
    ),
    (
        "split_escape",
        "an OSC 8 link split across two SSE log events, then a result",
    ),
    ("hang", "accepts the call and never answers"),
    (
        "unknown_messages",
        "messages the MCP specification does not define on its stream, then a result",
    ),
    (
        "crash_mid_event",
        "a progress event, half of the result event, then a TCP reset",
    ),
    (
        "huge_json",
        "a 1 GiB JSON reply, streamed until the reader stops",
    ),
    (
        "huge_sse_event",
        "one SSE event of 1 GiB, streamed until the reader stops",
    ),
    (
        "flood",
        "10,000 progress and log notifications, then the result",
    ),
    (
        "chunked_sse",
        "a valid SSE reply written in odd chunks: CRLF and LF, comments, BOM, unknown fields",
    ),
    ("both_result_error", "a response with both result and error"),
    ("no_id", "a response without an id"),
    ("result_not_object", "a response whose result is a number"),
    ("is_error_not_bool", "a result whose isError is a string"),
    ("text_plain", "the right answer, as text/plain"),
    (
        "leaky",
        "a log notification and a result carrying every canary secret",
    ),
    (
        "leaky_error",
        "a JSON-RPC error carrying every canary secret",
    ),
    (
        "html_401",
        "HTTP 401 with an HTML page carrying canary secrets",
    ),
    (
        "canary_forbidden",
        "a tool no rule allows: it must never run",
    ),
    ("sse_bom", "a byte order mark, then a valid SSE reply"),
    (
        "scripted",
        "the reply a test scripted under the key in `x` (see Misbehaving::script)",
    ),
    (
        "own_session",
        "a valid result with its own Mcp-Session-Id and a cookie",
    ),
];

/// Canary secrets of each kind the gateway must never let through: an AWS
/// key, a GitHub token, a PEM private key, a JWT, and a card number that
/// passes Luhn (caught by an operator pattern, see [`CARD_PATTERN`]).
pub const CANARIES: &[&str] = &[
    "AKIAZ7QWERTYUIOPCANA",
    "ghp_C4n4ryT0k3nXq9Wv2Lm8Rt5Yp1Zs7Kd3Hf6J",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAc4n4ryK3yQmV9zX2pL7wR5tY8uN3bH6jD1fG4kS0aE\n-----END RSA PRIVATE KEY-----",
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJjYW5hcnktdXNlciIsImlhdCI6MTcwMDAwMDAwMH0.c4n4rySigN4tur3Qx7Wv2Lm8Rt5Yp1Zs",
    "4539578763621486",
];

/// The `[[sanitize.patterns]]` regex that catches the card canary.
pub const CARD_PATTERN: &str = r"\b4539[0-9]{12}\b";

/// Distinctive fragments of [`CANARIES`]: none may appear in any byte a
/// client or a log receives (the PEM body and the JWT signature are checked
/// apart from their well-known prefixes).
pub const CANARY_FRAGMENTS: &[&str] = &[
    "AKIAZ7QWERTYUIOPCANA",
    "C4n4ryT0k3n",
    "c4n4ryK3y",
    "c4n4rySigN4tur3",
    "eyJzdWIiOiJjYW5hcnktdXNlciIs",
    "4539578763621486",
    CANARY_PASSWORD,
];

/// Size of the replies of `huge_json` and `huge_sse_event`.
pub const HUGE: u64 = 1 << 30;

/// The misbehaving server, serving on a free loopback port until dropped.
#[derive(Debug)]
pub struct Misbehaving {
    /// `http://127.0.0.1:P/mcp`.
    pub url: String,
    seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

/// A reply a test writes for the server to send; every string `"$id"` in it
/// becomes the request's id.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// One message as `application/json`.
    Json(Value),
    /// Messages as the events of one SSE stream.
    Sse(Vec<Value>),
    /// An SSE body written as it is (comments, `id:` and `event:` lines no
    /// server sends on demand); `"$id"` in it becomes the request's id.
    RawSse(String),
}

/// What reached the server.
#[derive(Debug, Default)]
struct Seen {
    /// Replies scripted by tests, by `tools/call` key (`x`) or by method.
    scripts: Mutex<HashMap<String, Scripted>>,
    calls: AtomicUsize,
    /// Tool names called, in order.
    ran: Mutex<Vec<String>>,
    /// Every method received (requests and notifications).
    methods: Mutex<Vec<String>>,
    /// Raw request bodies.
    bodies: Mutex<Vec<Vec<u8>>>,
    /// `hang` connections the other side closed.
    hangs_closed: AtomicUsize,
    /// Body bytes written by `huge_json` and `huge_sse_event`.
    huge_sent: AtomicU64,
}

impl Drop for Misbehaving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Misbehaving {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Seen::default());
        let shared = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, seen).await;
                });
            }
        });
        Self {
            url: format!("http://{addr}/mcp"),
            seen,
            task,
        }
    }

    /// Scripts the reply to `tools/call scripted {"x": key}`, or, when `key`
    /// names another method (`resources/read`), to every request of it.
    pub fn script(&self, key: &str, reply: Scripted) {
        self.seen
            .scripts
            .lock()
            .expect("lock")
            .insert(key.to_owned(), reply);
    }

    /// How many `tools/call` requests reached it.
    pub fn calls(&self) -> usize {
        self.seen.calls.load(Ordering::SeqCst)
    }

    /// Names of the tools called, in order.
    pub fn ran(&self) -> Vec<String> {
        self.seen.ran.lock().expect("lock").clone()
    }

    /// Every method received, requests and notifications, in order.
    pub fn methods(&self) -> Vec<String> {
        self.seen.methods.lock().expect("lock").clone()
    }

    /// Whether any request body that reached the server contains `needle`.
    pub fn received(&self, needle: &str) -> bool {
        self.seen
            .bodies
            .lock()
            .expect("lock")
            .iter()
            .any(|b| String::from_utf8_lossy(b).contains(needle))
    }

    /// How many `hang` calls the gateway has given up on (closed the connection).
    pub fn hangs_closed(&self) -> usize {
        self.seen.hangs_closed.load(Ordering::SeqCst)
    }

    /// Body bytes the huge replies managed to write before the reader stopped.
    pub fn huge_sent(&self) -> u64 {
        self.seen.huge_sent.load(Ordering::SeqCst)
    }
}

fn tools() -> Value {
    let mut tools: Vec<Value> = FAULTS
        .iter()
        .map(|(name, what)| {
            json!({"name": name, "description": what,
                   "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}})
        })
        .collect();
    // Retry advice follows the annotations.
    for t in &mut tools {
        if t["name"] == "drip" || t["name"] == "rpc_server_error" {
            t["annotations"] = json!({"idempotentHint": true});
        }
        if t["name"] == "schema_redacted" {
            t["outputSchema"] = json!({"type": "object", "properties": {
                "password": {"type": "string", "pattern": "^[a-z0-9-]+$"}}, "required": ["password"]});
        }
        if t["name"] == "schema_wrong" {
            t["outputSchema"] = json!({"type": "object", "properties": {
                "count": {"type": "integer", "description": "How many \u{1b}[31mrows\u{1b}[0m"}}, "required": ["count"]});
        }
    }
    Value::Array(tools)
}

async fn read_request(stream: &mut TcpStream, seen: &Seen) -> Option<Value> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = &buf[head_end..head_end + length];
    seen.bodies.lock().expect("lock").push(body.to_vec());
    serde_json::from_slice(body).ok()
}

async fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body).await;
    let _ = stream.flush().await;
}

async fn sse_head(stream: &mut TcpStream) {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
    let _ = stream.write_all(head.as_bytes()).await;
}

fn result(id: &Value, result: Value) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
        .to_string()
        .into_bytes()
}

fn rpc_error(id: &Value, code: i64, message: &str) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        .to_string()
        .into_bytes()
}

fn progress() -> String {
    let p = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                   "params": {"progressToken": "t", "progress": 1, "message": "working \u{1b}[5mhard\u{1b}[0m"}});
    format!("data: {p}\n\n")
}

async fn serve(mut stream: TcpStream, seen: Arc<Seen>) -> std::io::Result<()> {
    let Some(request) = read_request(&mut stream, &seen).await else {
        return Ok(());
    };
    seen.methods
        .lock()
        .expect("lock")
        .push(request["method"].as_str().unwrap_or_default().to_owned());
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let json_ct = "application/json";
    let method = request["method"].as_str().unwrap_or_default();
    let scripted = seen.scripts.lock().expect("lock").get(method).cloned();
    if let Some(reply) = scripted {
        send_scripted(&mut stream, reply, &id).await;
        return Ok(());
    }
    match method {
        "initialize" => {
            let body = result(
                &id,
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                       "serverInfo": {"name": "misbehaving", "version": "1"}}),
            );
            respond(&mut stream, "200 OK", json_ct, &body).await;
        }
        "tools/list" => {
            respond(
                &mut stream,
                "200 OK",
                json_ct,
                &result(&id, json!({"tools": tools()})),
            )
            .await;
        }
        "tools/call" => {
            seen.calls.fetch_add(1, Ordering::SeqCst);
            let name = request["params"]["name"].as_str().unwrap_or_default();
            seen.ran.lock().expect("lock").push(name.to_owned());
            fault(&mut stream, name, &id, &seen).await;
        }
        _ if request.get("id").is_none() => {
            respond(&mut stream, "202 Accepted", json_ct, b"").await;
        }
        _ => {
            respond(
                &mut stream,
                "200 OK",
                json_ct,
                &rpc_error(&id, -32601, "no such method"),
            )
            .await;
        }
    }
    Ok(())
}

/// Sends a scripted reply, `"$id"` replaced by `id`.
async fn send_scripted(stream: &mut TcpStream, reply: Scripted, id: &Value) {
    fn with_id(v: &mut Value, id: &Value) {
        match v {
            Value::String(s) if s == "$id" => *v = id.clone(),
            Value::Array(items) => items.iter_mut().for_each(|i| with_id(i, id)),
            Value::Object(map) => map.values_mut().for_each(|i| with_id(i, id)),
            _ => {}
        }
    }
    match reply {
        Scripted::Json(mut m) => {
            with_id(&mut m, id);
            respond(
                stream,
                "200 OK",
                "application/json",
                m.to_string().as_bytes(),
            )
            .await;
        }
        Scripted::RawSse(body) => {
            sse_head(stream).await;
            let body = body.replace("\"$id\"", &id.to_string());
            let _ = stream.write_all(body.as_bytes()).await;
        }
        Scripted::Sse(messages) => {
            sse_head(stream).await;
            for mut m in messages {
                with_id(&mut m, id);
                if stream
                    .write_all(format!("data: {m}\n\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}
