//! Portcullis: a security gateway for MCP servers.
//!
//! It sits between MCP clients and MCP servers the operator does not fully
//! trust, and performs on their behalf the duties the MCP tools spec puts on
//! every server: validate all tool inputs, enforce access rules, rate-limit
//! tool calls, sanitize tool outputs.
//!
//! The data path, one module per stage:
//!
//! ```text
//! client ─POST /mcp/<server>─▶ proxy::ingress ─▶ auth ─▶ policy ─▶ ratelimit ─▶ validate ─▶ transport ─▶ MCP server
//!                               (mcp::jsonrpc, mcp::headers)                                        │
//! client ◀──── JSON | SSE ───── proxy::respond ◀──── mcp::sse / mcp::jsonrpc ◀───────────────────────┘
//!                     (sanitize, rewrite of upstream failures)
//! ```
//!
//! Tool lists pass through `pins` where `proxy::catalog` stores them: each
//! definition is hashed, compared with its pin and scanned when new; a held
//! tool is listed as pinned and its calls are refused (`tool_quarantined`).
//! Pins are written behind to SQLite by one thread (`pins::store`).
//!
//! A call an allow rule marks for human approval passes `approval` last,
//! after every other check: the user is asked in band (elicitation), or an
//! operator through the dashboard's queue, and the call is forwarded only
//! after a yes to exactly its arguments, once.
//!
//! Each request leaves one audit event (`audit`): a `Trail` travels with it
//! and is handed, when the reply has been sent, to a writer thread that
//! batches events into SQLite. The trail also carries the request's spans
//! (`telemetry`): each stage the pipeline enters is a child of the request
//! span, exported over OTLP/HTTP with the event's trace id.
//!
//! Every refusal is an [`error::Rejection`], rendered to HTTP, JSON-RPC or an
//! `isError` tool result in exactly one place.

pub mod audit;
pub mod auth;
pub mod cli;
pub mod config;
pub mod demo;
pub mod flow;
pub mod identity;
pub mod metrics;
pub mod pins;
pub mod policy;
pub mod record;
pub mod sanitize;
pub mod state;

pub(crate) mod admin;
pub mod app;
pub(crate) mod error;
pub(crate) mod mcp;
pub(crate) mod proxy;
pub mod ratelimit;
pub(crate) mod transport;
pub mod validate;

pub use app::{Gateway, GatewayHandle, Reloader};
pub use config::Config;
pub mod approval;
pub mod telemetry;
pub mod util;
