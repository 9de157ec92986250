//! The stdio upstream: one child process per server, spoken to in
//! newline-delimited JSON-RPC, shared by every HTTP client of that server.
//!
//! Place in the path: where the HTTP upstream sends a request over the pool,
//! a stdio server's request is written to the child's stdin; the reply comes
//! back as the same [`Reply`] the HTTP upstream produces (JSON, or an SSE
//! stream when notifications for the request arrive before its response), so
//! every stage after forwarding (sanitizer, rewrite of failures, pins, audit)
//! applies unchanged. The process itself (spawn, handshake, stderr, restarts)
//! is in [`child`]; the SSE stream of a request with notifications in
//! [`stream`].
//!
//! Invariants:
//! - request ids are rewritten to gateway-unique ids on the way in and mapped
//!   back on the way out, so clients whose ids collide never see each other's
//!   answers; progress tokens are rewritten the same way, and a notification
//!   reaches only the request it names;
//! - the gateway does the `initialize` handshake with the child once per
//!   process life and answers clients' `initialize` and `server/discover` from
//!   it, with a session id of its own; clients' `notifications/initialized`
//!   never reach the child;
//! - the child never waits on the gateway: a request from the child (sampling,
//!   elicitation, roots) gets a JSON-RPC error at once, a `ping` an empty result;
//! - bounded: requests in flight ([`MAX_PENDING`]), notifications queued per
//!   request, every wait (the server's `timeout`), each line from the child
//!   (`max_response_bytes`);
//! - a request whose client goes away is cancelled at the child
//!   (`notifications/cancelled`); a request in flight when the child dies is
//!   answered `upstream_unavailable`.

mod child;
mod family;
mod shared;
mod stream;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::reply::{Framing, Reply, UpstreamError};
use crate::config::StdioCommand;
use crate::error::UpstreamKind;
use crate::mcp::headers::MCP_SESSION_ID;
use crate::mcp::methods::{self, Method as Rpc};
use crate::mcp::version::{LEGACY, MODERN};
use crate::util::time::humanize;

pub(crate) use shared::Link;
use shared::{Life, MAX_NOTES, TOKEN_PREFIX};
use shared::{Pending, Shared, line_of, strip_envelope, unavailable};
use stream::{InFlight, Next, Wait, sse};

/// Most requests in flight to one child.
pub(crate) const MAX_PENDING: usize = 4096;
/// A stdio server: its supervisor task and the requests in flight.
pub(crate) struct Stdio {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Stdio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stdio")
            .field("server", &self.shared.name)
            .finish()
    }
}

impl Stdio {
    /// Starts supervising `command` (inside a Tokio runtime); the first process
    /// is spawned at once.
    pub(crate) fn start(
        name: &str,
        command: StdioCommand,
        timeout: Duration,
        max_line: usize,
        tools_changed: Box<dyn Fn() + Send + Sync>,
    ) -> Self {
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            command,
            timeout,
            max_line,
            next_id: AtomicU64::new(1),
            pending: Mutex::default(),
            link: watch::Sender::new(Link::Starting),
            restarts: AtomicU64::new(0),
            tools_changed,
        });
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(child::supervise(shared.clone(), stopped));
        Self {
            shared,
            stop,
            task: Mutex::new(Some(task)),
        }
    }

    /// Stops the child (stdin closed, a short wait, then killed) and waits for it.
    pub(crate) async fn stop(&self) {
        let _ = self.stop.send(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// The child's state for `/readyz`: `(running, details)`.
    pub(crate) fn readiness(&self) -> (bool, Value) {
        let restarts = self.shared.restarts.load(Ordering::Relaxed);
        let link = self.shared.link.borrow().clone();
        let (running, state, pid) = match &link {
            Link::Starting => (false, "starting", None),
            Link::Running(life) => (true, "running", life.pid),
            Link::Restarting { .. } => (false, "restarting", None),
            Link::Stopped => (false, "stopped", None),
            Link::CrashLoop { .. } => (false, "crash_loop", None),
        };
        let mut out = json!({"transport": "stdio", "state": state, "restarts": restarts});
        if let Some(pid) = pid {
            out["pid"] = pid.into();
        }
        if let Link::Restarting { at } = link {
            out["next_start_ms"] =
                (at.saturating_duration_since(Instant::now()).as_millis() as u64).into();
        }
        (running, out)
    }

    /// One HTTP exchange of a client, answered by the child.
    pub(crate) async fn exchange(
        &self,
        method: &Method,
        headers: &HeaderMap,
        body: Option<Bytes>,
        idle: Option<Duration>,
    ) -> Result<Reply, UpstreamError> {
        let deadline = Instant::now() + self.shared.timeout;
        let session = headers
            .get(MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match *method {
            // No standalone stream: notifications that concern no request are
            // not delivered (see the capabilities answered to `initialize`).
            Method::GET => {
                let mut headers = HeaderMap::new();
                headers.insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
                // The gateway's own HTTP answer for a method a stdio
                // server has no counterpart of.
                return Ok(Reply::Empty {
                    status: Framing::Http(StatusCode::METHOD_NOT_ALLOWED),
                    headers,
                });
            }
            // Ending a session: the child is shared, only the binding goes.
            Method::DELETE => {
                return Ok(Reply::Empty {
                    status: Framing::Http(StatusCode::OK),
                    headers: HeaderMap::new(),
                });
            }
            _ => {}
        }
        let message: Value = body
            .as_deref()
            .and_then(|b| serde_json::from_slice(b).ok())
            .ok_or_else(|| UpstreamError::new(UpstreamKind::Protocol, "the request is not JSON"))?;
        let named = message.get("method").is_some_and(Value::is_string);
        let method = methods::named_in(&message);
        match (named, method, message.get("id")) {
            (true, Some(Rpc::Initialize), Some(id)) => {
                let life = self.ready(deadline).await?;
                Ok(json_reply(
                    self.initialize_result(&life, &message, id),
                    Some(mint_session()),
                ))
            }
            (true, Some(Rpc::ServerDiscover), Some(id)) => {
                let life = self.ready(deadline).await?;
                Ok(json_reply(discover_result(&life, id), None))
            }
            (true, _, Some(_)) => self.request(message, session, deadline, idle).await,
            (true, method, None) => {
                self.notify(method, message, session.as_deref()).await;
                Ok(taken())
            }
            // A response to a request the gateway never relayed.
            (false, ..) => Ok(taken()),
        }
    }

    /// Waits until a child is running, until `deadline` at most.
    async fn ready(&self, deadline: Instant) -> Result<Arc<Life>, UpstreamError> {
        let mut rx = self.shared.link.subscribe();
        loop {
            let link = rx.borrow_and_update().clone();
            match link {
                Link::Running(life) => return Ok(life),
                Link::Stopped => return Err(not_run("the server process has been stopped")),
                Link::CrashLoop { crashes } => {
                    return Err(not_run(format!(
                        "its process crashed {crashes} times in a row, so the gateway stopped restarting it \
                         until an operator fixes it (a reload that changes this server, or a restart of the gateway, starts it again); \
                         report that the server is unavailable"
                    )));
                }
                Link::Restarting { at } if at > deadline => {
                    return Err(not_run(format!(
                        "the server process exited and is restarted in {}",
                        humanize(at.saturating_duration_since(Instant::now()))
                    )));
                }
                Link::Starting | Link::Restarting { .. } => {}
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(not_run("the server process has been stopped")),
                Err(_) => {
                    return Err(not_run(format!(
                        "the server process did not become ready within {}",
                        humanize(self.shared.timeout)
                    )));
                }
            }
        }
    }

    /// The cached handshake, as this client's `initialize` result: the
    /// version is the older of the client's and the child's, and only the
    /// capabilities the gateway can deliver are announced.
    fn initialize_result(&self, life: &Life, message: &Value, id: &Value) -> Value {
        let mut result = life.init.clone();
        let asked = message
            .get("params")
            .and_then(|p| p.get("protocolVersion"))
            .and_then(Value::as_str)
            .filter(|v| LEGACY.contains(v));
        let version = match asked {
            Some(v) if *v < *life.version => v.to_owned(),
            _ => life.version.clone(),
        };
        result["protocolVersion"] = version.into();
        result["capabilities"] = served_capabilities(&life.init);
        json!({"jsonrpc": "2.0", "id": id, "result": result})
    }

    /// Writes a request to the child and waits for what it sends back for it.
    async fn request(
        &self,
        mut message: Value,
        session: Option<String>,
        deadline: Instant,
        idle: Option<Duration>,
    ) -> Result<Reply, UpstreamError> {
        let life = self.ready(deadline).await?;
        let gid = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let client_id = std::mem::replace(&mut message["id"], gid.into());
        let progress = message
            .get_mut("params")
            .and_then(|p| p.get_mut("_meta"))
            .and_then(Value::as_object_mut)
            .and_then(|meta| {
                let token = meta.get_mut("progressToken")?;
                Some(std::mem::replace(
                    token,
                    format!("{TOKEN_PREFIX}{gid}").into(),
                ))
            });
        let modern = strip_envelope(&mut message).then(|| {
            let method = message.get("method").and_then(Value::as_str);
            method.unwrap_or_default().to_owned()
        });
        let (notes_tx, notes) = mpsc::channel(MAX_NOTES);
        let (done_tx, done) = oneshot::channel();
        {
            let mut pending = self.shared.lock();
            if pending.len() >= MAX_PENDING {
                return Err(crowded());
            }
            pending.insert(
                gid,
                Pending {
                    generation: life.generation,
                    client_id,
                    progress,
                    session,
                    modern,
                    notes: notes_tx,
                    done: Some(done_tx),
                },
            );
        }
        let guard = InFlight {
            shared: self.shared.clone(),
            gid,
            life: life.clone(),
        };
        // A life that ended meanwhile has failed its requests already: this one
        // would wait for nothing.
        let current = matches!(&*self.shared.link.borrow(),
            Link::Running(now) if now.generation == life.generation);
        if !current {
            return Err(not_run("the server process exited"));
        }
        let line = line_of(&message);
        match tokio::time::timeout_at(deadline, life.stdin.send(line)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(unavailable("the server process exited")),
            Err(_) => return Err(timeout(self.shared.timeout)),
        }
        let mut wait = Wait {
            notes,
            done,
            _in_flight: guard,
            finished: false,
        };
        // JSON when the answer comes first; an event stream once a notification does.
        match tokio::time::timeout_at(deadline, wait.next()).await {
            Err(_) => Err(timeout(self.shared.timeout)),
            Ok(Next::End(Ok(response))) => Ok(json_reply(response, None)),
            Ok(Next::End(Err(e))) => Err(e),
            Ok(Next::Note(first)) => Ok(Reply::Sse {
                status: Framing::Message,
                headers: HeaderMap::new(),
                events: sse(first, wait, idle),
            }),
        }
    }

    /// Passes a client notification on: `initialized` belongs to the gateway's
    /// own handshake, `cancelled` is mapped to the child's id of that client's request.
    async fn notify(&self, method: Option<Rpc>, mut message: Value, session: Option<&str>) {
        let Link::Running(life) = self.shared.link.borrow().clone() else {
            return;
        };
        match method {
            Some(Rpc::Initialized) => return,
            Some(Rpc::Cancelled) => {
                let asked = message.get("params").and_then(|p| p.get("requestId"));
                let found = asked.and_then(|asked| {
                    let pending = self.shared.lock();
                    pending
                        .iter()
                        .find(|(_, p)| {
                            p.client_id == *asked
                                && session.is_some()
                                && p.session.as_deref() == session
                        })
                        .map(|(gid, _)| *gid)
                });
                let Some(gid) = found else { return };
                message["params"]["requestId"] = gid.into();
            }
            _ => {}
        }
        let _ = tokio::time::timeout(self.shared.timeout, life.stdin.send(line_of(&message))).await;
    }
}

impl Drop for Stdio {
    fn drop(&mut self) {
        // The supervisor stops the child gracefully in the background (a reload
        // that replaced this server, say); `stop` is the awaited form.
        let _ = self.stop.send(true);
    }
}

/// `server/discover` answered from the handshake: the gateway serves the
/// 2026-07-28 era to clients whatever era the child speaks.
fn discover_result(life: &Life, id: &Value) -> Value {
    let mut result = Map::new();
    result.insert("supportedVersions".into(), json!(MODERN));
    result.insert("capabilities".into(), served_capabilities(&life.init));
    if let Some(instructions) = life.init.get("instructions") {
        result.insert("instructions".into(), instructions.clone());
    }
    result.insert("ttlMs".into(), 0.into());
    result.insert("cacheScope".into(), "private".into());
    result.insert("resultType".into(), "complete".into());
    if let Some(info) = life.init.get("serverInfo") {
        result.insert(
            "_meta".into(),
            json!({"io.modelcontextprotocol/serverInfo": info}),
        );
    }
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The child's capabilities without those the gateway cannot deliver over
/// HTTP: list-changed and resource-update notifications need a standalone
/// stream, which a stdio server does not get.
fn served_capabilities(init: &Value) -> Value {
    let mut capabilities = init.get("capabilities").cloned().unwrap_or(json!({}));
    if let Value::Object(caps) = &mut capabilities {
        for key in ["tools", "prompts", "resources"] {
            if let Some(Value::Object(cap)) = caps.get_mut(key) {
                cap.remove("listChanged");
                cap.remove("subscribe");
            }
        }
    }
    capabilities
}

fn json_reply(message: Value, session: Option<String>) -> Reply {
    let mut headers = HeaderMap::new();
    if let Some(session) = session.and_then(|s| HeaderValue::from_str(&s).ok()) {
        headers.insert(MCP_SESSION_ID, session);
    }
    Reply::Json {
        status: Framing::Message,
        headers,
        body: Bytes::from(serde_json::to_vec(&message).unwrap_or_default()),
    }
}

/// A notification or response the child was given: nothing to answer.
fn taken() -> Reply {
    Reply::Empty {
        status: Framing::Message,
        headers: HeaderMap::new(),
    }
}

/// A session id the gateway mints (bound to the client by the pipeline).
fn mint_session() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

fn not_run(reason: impl Into<String>) -> UpstreamError {
    let mut e = unavailable(reason);
    e.not_run = true;
    e
}

/// The table of requests in flight is full: the gateway's own bound, not the
/// server failing, so it does not count towards the server's breaker (one
/// client filling the table must not shut the server off for everyone).
fn crowded() -> UpstreamError {
    let mut e = not_run(format!(
        "{MAX_PENDING} requests are already in flight to the server process"
    ));
    e.busy = true;
    e
}

fn timeout(limit: Duration) -> UpstreamError {
    UpstreamError::new(
        UpstreamKind::Timeout,
        format!("no response within {}", humanize(limit)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::{answer_request, leading_id};

    #[test]
    fn server_requests_are_answered_at_once() {
        let sampling = answer_request("sampling/createMessage", json!(7));
        assert_eq!(sampling["id"], 7);
        assert_eq!(sampling["error"]["code"], -32601);
        let ping = answer_request("ping", json!("a"));
        assert_eq!(ping["result"], json!({}));
    }

    #[test]
    fn the_id_of_a_cut_line_is_found_when_it_leads() {
        assert_eq!(
            leading_id(br#"{"jsonrpc":"2.0","id": 42,"result":{"#),
            Some(42)
        );
        assert_eq!(leading_id(br#"{"jsonrpc":"2.0","result":{"x""#), None);
    }

    /// The pipeline's breaker counts an unavailable server but not a `busy`
    /// refusal (its own test is `retry::tests`); here, that a full table is
    /// marked so and a dead child is not.
    #[test]
    fn a_full_table_of_requests_is_marked_as_the_gateways_own_bound() {
        let (full, dead) = (crowded(), not_run("exited"));
        assert!(full.busy && full.not_run);
        assert_eq!(full.kind, UpstreamKind::Unavailable);
        assert!(!dead.busy && dead.not_run);
        assert_eq!(dead.kind, UpstreamKind::Unavailable);
    }

    #[test]
    fn lines_are_one_line() {
        let line = line_of(&json!({"text": "a\nb"}));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        assert!(line.ends_with(b"\n"));
    }
}
