//! The way back: upstream replies relayed to the client message by message, or
//! collected when the gateway needs the whole answer (lists).
//!
//! Place in the path: after forwarding. SSE streams are decoded event by event
//! and re-encoded as they arrive, so progress notifications are never held
//! back; each message is inspected on the way (a `tools/list_changed`
//! notification drops the cached tool list) and sanitized; the final response
//! to a `tools/call` is also rewritten when it is a failure (see
//! [`Recipient::finish`]).
//!
//! Invariants: a `tools/call` gets exactly one response with its own id — the
//! upstream's (sanitized), or a gateway-made `isError` result when the upstream
//! failed, answered another id, or ended the stream without answering; upstream
//! bodies that are not JSON-RPC are never shown to the client, at most a
//! sanitized, capped snippet of their text is quoted; a message the sanitizer
//! did not change is passed on byte for byte.

mod check;
mod collect;
mod recipient;
mod relay;
mod shown;
mod sse;

#[cfg(test)]
mod tests;

pub(crate) use check::relayed_error;
pub(crate) use collect::collect;
pub(crate) use recipient::Recipient;
pub(crate) use relay::{json, json_text, relay};
pub(crate) use shown::Shown;
