//! The demo upstream: a small, deliberately flawed MCP server.
//!
//! `portcullis demo` starts this server inside the gateway's own binary and
//! puts the gateway in front of it, so that every protection the gateway
//! offers has something real to act on. Load benchmarks reuse it as a fast
//! echo upstream.
//!
//! It speaks Streamable HTTP: one JSON-RPC message per `POST /mcp`, answered
//! with `application/json` or `text/event-stream`. Both protocol eras are
//! served on the same endpoint:
//!
//! * legacy (2024-11-05 … 2025-11-25): `initialize` mints an `Mcp-Session-Id`,
//!   `ping` works, notifications and responses get `202 Accepted`;
//! * modern (2026-07-28): a request whose `params._meta` carries
//!   `io.modelcontextprotocol/protocolVersion = "2026-07-28"`; it may call
//!   `server/discover`, and every result it gets carries `resultType`.
//!
//! The tools are flawed the way real servers' tools are: `lookup_order`
//! advertises a strict schema and validates nothing, reflecting its input;
//! `delete_record` is destructive; `generate_report` fails opaquely;
//! `fetch_logs` returns terminal escapes, a zero-width character and fake
//! secrets; `slow_query` is slow and streams progress; `echo` is the cheap
//! benchmark path; `sync_notes` is poisoned: its description tells the model,
//! partly in invisible Unicode tag characters, to send the user's SSH key
//! along (the gateway's pinning scan holds it).
//!
//! Invariants:
//! * the server never validates tool arguments (that is the gateway's job),
//!   but it never panics on request-derived data either;
//! * sessions are minted but never enforced;
//! * every executed `tools/call` is appended to a bounded log
//!   ([`DemoUpstream::calls`]), so tests can tell what got through the
//!   gateway; calls rejected here (unknown tool, malformed params) are not
//!   logged;
//! * request bodies are capped at [`MAX_BODY_BYTES`].

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use serde_json::Value;

/// Largest request body accepted, in bytes; larger bodies get `413`.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

mod catalog;
mod handle;
mod state;
mod tools;
mod wire;

#[cfg(test)]
mod tests;

pub use state::DemoOptions;

use handle::{handle_delete, handle_get, handle_post};
use state::Shared;

/// Handle to a running (or mountable) demo upstream: a cheap clone that
/// shares the log of executed tool calls.
#[derive(Debug, Clone)]
pub struct DemoUpstream {
    shared: Arc<Shared>,
}

impl DemoUpstream {
    /// Every `tools/call` the server actually executed, oldest first:
    /// (tool name, arguments as received, `Null` when absent). Only the most
    /// recent 10 000 calls are kept.
    pub fn calls(&self) -> Vec<(String, Value)> {
        self.shared.log().iter().cloned().collect()
    }
}

/// Build the demo upstream's router (`POST`/`GET`/`DELETE` on `/mcp`) and the
/// handle to its call log. The gateway may mount the router or serve it alone.
pub fn router(options: DemoOptions) -> (Router, DemoUpstream) {
    let shared = Arc::new(Shared::new(options));
    let app = Router::new()
        .route(
            "/mcp",
            post(handle_post).get(handle_get).delete(handle_delete),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Arc::clone(&shared));
    (app, DemoUpstream { shared })
}

/// Serve the demo upstream on `listener` until `shutdown` resolves, then let
/// in-flight requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    options: DemoOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (app, _handle) = router(options);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
