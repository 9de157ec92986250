//! The MCP protocol model: messages, versions, standard headers, SSE framing.
//!
//! Place in the path: used by `proxy` to read what clients and upstreams send,
//! and by `error` to write what the gateway answers.
//!
//! Invariants: pure — no I/O, no clocks, no configuration. Everything here is a
//! function of its inputs and is unit-tested on its own.

pub(crate) mod headers;
pub(crate) mod jsonrpc;
pub(crate) mod limits;
pub(crate) mod methods;
pub(crate) mod request;
pub(crate) mod sse;
pub(crate) mod version;

#[cfg(test)]
mod fuzz;

/// `_meta` key of the protocol version on 2026-era requests.
pub(crate) const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key under which the gateway explains its own results.
pub(crate) const META_GATEWAY_ERROR: &str = "portcullis/error";
