//! Every refusal and failure the gateway answers with, and the one place that
//! turns them into HTTP responses.
//!
//! Place in the path: any stage may stop a request with a [`Rejection`];
//! [`Rejection::into_response`] renders it as an HTTP error with a JSON-RPC
//! error body, or — for what happens to a `tools/call` — as a `CallToolResult`
//! with `isError: true` that a model can act on, explained by
//! `_meta["portcullis/error"]`.
//!
//! Invariants: rendering happens here and nowhere else; every rendering carries
//! a stable code; gateway-made text never embeds raw upstream bodies; the
//! gateway's own JSON-RPC codes lie outside -32768…-32000.

mod approval;
mod refusals;
mod rejection;
mod response;
mod upstream;
mod wire;

pub(crate) use approval::{approval_refused, unreadable_after_approval};
pub(crate) use refusals::{secret_in_arguments, secret_in_call};
pub(crate) use rejection::{
    Limit, Limited, OutputKind, OutputRefusal, RateLimited, Rejection, RenderCtx, RpcError,
    SecretFound, ToolFailure, ToolHints, ToolRefusal, UpstreamFailure, UpstreamKind, snippet,
};
pub(crate) use upstream::status_words;
pub(crate) use wire::{json_response, overloaded};

#[cfg(test)]
mod tests;
