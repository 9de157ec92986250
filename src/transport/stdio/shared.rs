//! What the supervisor of a stdio server, the reader of its stdout and the
//! requests written to it share: the pending requests by id, the process's
//! state, and how a line the child writes is routed back.
//!
//! Place: beneath both the request side ([`super::Stdio`]) and the process
//! side ([`super::child`]). Invariants: every pending request is answered
//! exactly once (by its reply, or by the failure of its process life); a
//! line longer than `max_line` fails only the request it belongs to.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::StdioCommand;
use crate::error::UpstreamKind;
use crate::mcp::META_PROTOCOL_VERSION;
use crate::mcp::methods::{self, Method as Rpc};
use crate::transport::reply::UpstreamError;

use tokio::time::Instant;

/// What the supervisor, the reader of the child's stdout and the requests share.
pub(super) struct Shared {
    pub(super) name: String,
    pub(super) command: StdioCommand,
    /// The server's `timeout`.
    pub(super) timeout: Duration,
    /// Longest line read from the child.
    pub(super) max_line: usize,
    pub(super) next_id: AtomicU64,
    pub(super) pending: Mutex<HashMap<u64, Pending>>,
    /// The child's state, as requests and `/readyz` see it.
    pub(super) link: watch::Sender<Link>,
    pub(super) restarts: AtomicU64,
    /// Called when the child's tools may have changed (announced, or a new process).
    pub(super) tools_changed: Box<dyn Fn() + Send + Sync>,
}

/// A request written to the child and not answered yet.
pub(super) struct Pending {
    /// The process life it was written to.
    pub(super) generation: u64,
    /// The id the client gave it.
    pub(super) client_id: Value,
    /// The progress token the client gave it, if any.
    pub(super) progress: Option<Value>,
    /// The client's session, to map its `notifications/cancelled`.
    pub(super) session: Option<String>,
    /// The method, when the client speaks 2026-07-28 (its result is completed for that era).
    pub(super) modern: Option<String>,
    pub(super) notes: mpsc::Sender<Value>,
    pub(super) done: Option<oneshot::Sender<Result<Value, UpstreamError>>>,
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Routes one message the child wrote. Returns a line to write back, if any.
    pub(super) fn route(&self, mut message: Value) -> Option<Bytes> {
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match (method, message.get("id").cloned()) {
            (Some(method), Some(id)) => Some(line_of(&answer_request(&method, id))),
            (Some(method), None) => {
                self.notification(&method, message);
                None
            }
            (None, Some(id)) => {
                let Some(gid) = id.as_u64() else {
                    tracing::warn!(server = %self.name, "the server process answered an id the gateway never sent");
                    return None;
                };
                let entry = self.lock().remove(&gid);
                let Some(mut entry) = entry else {
                    // Answered after its client gave up (or twice).
                    return None;
                };
                message["id"] = entry.client_id.clone();
                if let Some(method) = &entry.modern {
                    modernize(&mut message, method);
                }
                if let Some(done) = entry.done.take() {
                    let _ = done.send(Ok(message));
                }
                None
            }
            (None, None) => {
                tracing::warn!(server = %self.name, "the server process wrote a message with neither method nor id");
                None
            }
        }
    }

    pub(super) fn notification(&self, method: &str, mut message: Value) {
        if methods::tool_list_changed(&message) {
            (self.tools_changed)();
        }
        if Rpc::of(method) == Some(Rpc::Message) {
            let params = message.get("params").cloned().unwrap_or(Value::Null);
            let level = params
                .get("level")
                .and_then(Value::as_str)
                .unwrap_or("info");
            let data = clip(&params.get("data").map(Value::to_string).unwrap_or_default());
            tracing::info!(server = %self.name, level, data = %data, "log message from the server process");
            return;
        }
        let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) else {
            return;
        };
        // Progress names the request by the token the gateway gave it; a
        // subscription's notifications name the listen request's id.
        let by_token = params
            .get("progressToken")
            .and_then(Value::as_str)
            .and_then(|t| t.strip_prefix(TOKEN_PREFIX))
            .and_then(|n| n.parse::<u64>().ok());
        let by_subscription = params
            .get("_meta")
            .and_then(|m| m.get(SUBSCRIPTION_ID))
            .and_then(Value::as_u64);
        let Some(gid) = by_token.or(by_subscription) else {
            return;
        };
        let pending = self.lock();
        let Some(entry) = pending.get(&gid) else {
            return;
        };
        if by_token.is_some() {
            match &entry.progress {
                Some(token) => {
                    params.insert("progressToken".into(), token.clone());
                }
                None => return,
            }
        } else if let Some(Value::Object(meta)) = params.get_mut("_meta") {
            meta.insert(SUBSCRIPTION_ID.into(), entry.client_id.clone());
        }
        // A client that lags loses notifications, never the child's time.
        let _ = entry.notes.try_send(message);
    }

    /// Answers every request in flight to process life `generation` as failed.
    pub(super) fn fail_generation(&self, generation: u64, reason: &str) {
        let failed: Vec<Pending> = {
            let mut pending = self.lock();
            let gids: Vec<u64> = pending
                .iter()
                .filter(|(_, p)| p.generation == generation)
                .map(|(g, _)| *g)
                .collect();
            gids.iter().filter_map(|g| pending.remove(g)).collect()
        };
        for mut entry in failed {
            if let Some(done) = entry.done.take() {
                let _ = done.send(Err(unavailable(reason)));
            }
        }
    }

    /// A line longer than the cap: the request it answers, when its id can be
    /// read from the start, is failed rather than left to time out.
    pub(super) fn too_long(&self, head: &[u8], len: usize) {
        tracing::warn!(server = %self.name, bytes = len, max = self.max_line, "the server process wrote a line longer than max_response_bytes; dropped");
        let Some(gid) = leading_id(head) else { return };
        let entry = self.lock().remove(&gid);
        if let Some(mut entry) = entry
            && let Some(done) = entry.done.take()
        {
            let e = UpstreamError::new(
                UpstreamKind::Protocol,
                format!("the reply is larger than {} bytes", self.max_line),
            );
            let _ = done.send(Err(e));
        }
    }
}

/// Removes the 2026-07-28 request envelope (`io.modelcontextprotocol/*` in
/// `_meta`): the child is spoken to in the handshake era it was initialized
/// in, and SDK servers refuse that envelope on such a connection. True when
/// the request had one.
pub(super) fn strip_envelope(message: &mut Value) -> bool {
    let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) else {
        return false;
    };
    let Some(Value::Object(meta)) = params.get_mut("_meta") else {
        return false;
    };
    let modern = meta.contains_key(META_PROTOCOL_VERSION);
    meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/") || k == SUBSCRIPTION_ID);
    if meta.is_empty() {
        params.remove("_meta");
    }
    modern
}

/// A handshake-era result made a 2026-07-28 one: `resultType`, and the cache
/// fields lists and reads must carry (private: the gateway filters per client).
pub(super) fn modernize(message: &mut Value, method: &str) {
    let Some(result) = message.get_mut("result").and_then(Value::as_object_mut) else {
        return;
    };
    result
        .entry("resultType")
        .or_insert_with(|| "complete".into());
    let cached = matches!(
        Rpc::of(method),
        Some(
            Rpc::ToolsList
                | Rpc::PromptsList
                | Rpc::ResourcesList
                | Rpc::ResourcesTemplatesList
                | Rpc::ResourcesRead
        )
    );
    if cached {
        result.entry("ttlMs").or_insert_with(|| 0.into());
        result
            .entry("cacheScope")
            .or_insert_with(|| "private".into());
    }
}

/// The answer to a request the child sends: the gateway relays none of them.
pub(super) fn answer_request(method: &str, id: Value) -> Value {
    if Rpc::of(method) == Some(Rpc::Ping) {
        return json!({"jsonrpc": "2.0", "id": id, "result": {}});
    }
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601,
        "message": format!("{method} is not available: the client is a gateway that relays no requests from the server")}})
}

/// One message as one line (JSON never has a raw newline).
pub(super) fn line_of(message: &Value) -> Bytes {
    let mut line = serde_json::to_vec(message).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// The numeric `id` near the start of a line cut for length, if there is one.
pub(super) fn leading_id(head: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(head);
    let at = text.find("\"id\":")?;
    let digits: String = text[at + 5..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// At most about 4 KiB, for a log line.
pub(super) fn clip(text: &str) -> String {
    crate::util::text::clip_to(text, 4096)
}

pub(super) fn unavailable(reason: impl Into<String>) -> UpstreamError {
    UpstreamError::new(UpstreamKind::Unavailable, reason)
}

/// The state of a stdio server's process.
#[derive(Debug, Clone)]
pub(crate) enum Link {
    /// Spawned (or being spawned) and not handshaken yet.
    Starting,
    Running(Arc<Life>),
    /// Ended; the next process starts at `at`.
    Restarting {
        at: Instant,
    },
    Stopped,
    /// It ended `crashes` times in a row, none up for long: not restarted.
    CrashLoop {
        crashes: u32,
    },
}

/// One process, handshaken.
#[derive(Debug)]
pub(crate) struct Life {
    pub pid: Option<u32>,
    /// Counts process lives from 1.
    pub generation: u64,
    /// Lines for its stdin.
    pub stdin: mpsc::Sender<Bytes>,
    /// Its `InitializeResult`.
    pub init: Value,
    /// The protocol version it negotiated.
    pub version: String,
}

/// Most notifications queued for one request; later ones are dropped while it lags.
pub(super) const MAX_NOTES: usize = 256;

/// Prefix of the progress tokens the gateway gives the child.
pub(super) const TOKEN_PREFIX: &str = "portcullis-progress-";

pub(super) const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
