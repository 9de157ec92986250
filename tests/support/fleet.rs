//! Gateway replicas for fleet tests: the real binary, one process each, on
//! OS-picked loopback ports, each with its configuration (and the stores
//! and the audit spool beside it) in a directory of its own; killed by PID
//! (`kill -9` on demand), restarted on the same configuration.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::{Child, Command};

use portcullis::state::{SharedState, StateBackend, StateSettings};

use super::process::Observed;
use super::{ALICE, ConfigFile, PeerServer, modern_call};

/// One gateway process of a fleet.
#[derive(Debug)]
pub struct Replica {
    child: Child,
    /// `127.0.0.1:PORT` of its MCP listener (a balancer's backend).
    pub mcp: String,
    /// `http://127.0.0.1:PORT` of its admin listener.
    pub admin: String,
    config: ConfigFile,
}

impl Replica {
    /// Runs `portcullis run --config FILE` with `text` and waits until it listens.
    pub async fn start(text: &str) -> Self {
        let config = ConfigFile::new(text);
        let (child, mcp, admin) = spawn(&config).await;
        Self {
            child,
            mcp,
            admin,
            config,
        }
    }

    /// `http://127.0.0.1:PORT/mcp/SERVER`, this replica alone.
    pub fn url(&self, server: &str) -> String {
        format!("http://{}/mcp/{server}", self.mcp)
    }

    /// `kill -9`: no shutdown, no flush; waits for the process to be gone.
    pub async fn kill9(&mut self) {
        if let Some(pid) = self.child.id() {
            super::signal(u64::from(pid), "KILL");
        }
        let _ = self.child.wait().await;
    }

    /// Starts the replica again on the same configuration (and so the same
    /// spool); its listeners get new ports.
    pub async fn restart(&mut self) {
        let _ = self.child.kill().await;
        let (child, mcp, admin) = spawn(&self.config).await;
        self.child = child;
        self.mcp = mcp;
        self.admin = admin;
    }

    /// `GET /healthz`, parsed.
    pub async fn health(&self) -> Value {
        let text = super::http()
            .get(format!("{}/healthz", self.admin))
            .send()
            .await
            .expect("/healthz answers")
            .text()
            .await
            .unwrap_or_default();
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("/healthz is not JSON: {text}"))
    }

    /// `GET /metrics`, the text.
    pub async fn metrics(&self) -> String {
        super::http()
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .expect("/metrics answers")
            .text()
            .await
            .unwrap_or_default()
    }

    /// The value of the metric line that starts with `name` (with its labels), or 0.
    pub async fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }
}

async fn spawn(config: &ConfigFile) -> (Child, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .arg("run")
        .arg("--config")
        .arg(config.path())
        // Start-up and store lines only, not one line per request.
        .env("RUST_LOG", "warn,portcullis=info,portcullis::proxy=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the portcullis binary starts");
    let (mcp, admin) = tokio::time::timeout(Duration::from_secs(60), super::listening(&mut child))
        .await
        .expect("the replica listens in time");
    (child, mcp, format!("http://{admin}"))
}

/// The JSON-RPC response of a reply body, JSON or an SSE stream (its last
/// `data:` line that is a response).
pub fn response_of(body: &str) -> Option<Value> {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return Some(v);
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .rfind(|v| v.get("result").is_some() || v.get("error").is_some())
}

/// The gateway's refusal code in a `tools/call` result's `_meta`; empty when
/// the call was not refused.
pub fn refusal_code(result: &Value) -> &str {
    result["_meta"]["portcullis/error"]["code"]
        .as_str()
        .unwrap_or("")
}

/// The `echo` calls the upstream itself ran (what any replica forwarded).
pub fn echoes(upstream: &PeerServer) -> usize {
    upstream
        .calls()
        .iter()
        .filter(|c| c["tool"] == "echo")
        .count()
}

/// Polls `check` every 100 ms for up to `limit`; its last answer.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check()
}

/// `n` replicas running one configuration, started one after another.
pub async fn replicas_of(n: usize, text: &str) -> Vec<Observed> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Observed::start(text).await);
    }
    out
}

/// The shared state of one replica of deployment `namespace` in the Redis at
/// `url` (opened inside a runtime).
pub fn redis_store(url: &str, namespace: &str) -> SharedState {
    SharedState::from_settings(&StateSettings {
        backend: StateBackend::Redis(url.to_owned()),
        namespace: namespace.into(),
    })
    .expect("a store")
}

/// A two-worker runtime and the shared state of `n` replicas of deployment
/// `namespace` in the Redis at `url`, opened in it.
pub fn redis_fleet(
    url: &str,
    namespace: &str,
    n: usize,
) -> (tokio::runtime::Runtime, Vec<SharedState>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let fleet = runtime.block_on(async { (0..n).map(|_| redis_store(url, namespace)).collect() });
    (runtime, fleet)
}

/// Sends one 2026-07-28 `tools/call` of `echo` with `text` by alice to `url`
/// (a replica or a balancer); the HTTP response as it came.
pub async fn send_echo(
    http: &reqwest::Client,
    url: &str,
    text: &str,
) -> reqwest::Result<reqwest::Response> {
    http.post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {ALICE}"))
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .body(modern_call(1, "echo", json!({ "text": text })))
        .send()
        .await
}

/// A 2026-07-28 `tools/call` body of `echo` with `text` whose client declares
/// elicitation, `extra` merged into its params (a `requestState`, answers).
pub fn elicit_echo(id: u64, text: &str, extra: Value) -> String {
    let mut params = json!({"name": "echo", "arguments": {"text": text}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}});
    if let (Value::Object(p), Value::Object(e)) = (&mut params, extra) {
        p.extend(e);
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}
