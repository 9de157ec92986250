//! Resource URIs on the request path: each is decided, counted, routed and
//! forwarded in its canonical form ([`crate::policy::uri`]).
//!
//! Place in the path: the `resources/read`, `resources/subscribe` and
//! `resources/unsubscribe` steps of the per-server pipeline and of the merged
//! view, the resource list filter, and `completion/complete` on a
//! `ref/resource`.
//!
//! Invariants: a URI that cannot be canonicalized is refused before any rule
//! is looked at and before anything is sent upstream; what the upstream
//! receives (`params.uri`, and `Mcp-Name` when the client sent one) is the
//! canonical URI, so the server resolves exactly what was decided; the body is
//! forwarded byte for byte when the client already spelled the URI canonically.

use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;

use super::exchange::rebuild;
use crate::error::Rejection;
use crate::mcp::headers::{self, MCP_NAME};
use crate::mcp::jsonrpc::Message;
use crate::policy::uri::{self, CanonicalUri};

/// The canonical form of a client's URI, or the refusal of its spelling.
pub(super) fn canonical(uri: &str) -> Result<CanonicalUri, Rejection> {
    uri::canonical(uri).map_err(|why| Rejection::NonCanonicalUri {
        uri: uri.to_owned(),
        why,
    })
}

/// The request as the upstream must see it: `params.uri` (and `Mcp-Name`,
/// when present) replaced by the canonical URI.
pub(super) fn forwarded(
    message: &Message,
    headers: &HeaderMap,
    body: Bytes,
    canonical: &CanonicalUri,
) -> (HeaderMap, Bytes) {
    let mut headers = headers.clone();
    let sent = message
        .params()
        .and_then(|p| p.get("uri"))
        .and_then(Value::as_str);
    if sent == Some(canonical.as_str()) {
        return (headers, body);
    }
    if headers.contains_key(MCP_NAME) {
        headers.insert(MCP_NAME, headers::encode(canonical.as_str()));
    }
    let mut request = rebuild(message);
    request["params"]["uri"] = canonical.as_str().into();
    let body = serde_json::to_vec(&request)
        .map(Bytes::from)
        .unwrap_or(body);
    (headers, body)
}

/// What the rules see of a listed resource: its canonical identity. A listed
/// URI that cannot be canonicalized could never be read, so it is not shown.
pub(super) fn listed(item: &Value) -> Option<String> {
    let uri = item.get("uri").and_then(Value::as_str)?;
    uri::canonical(uri).ok().map(|c| c.identity().to_owned())
}

/// What `completion/complete` on a `ref/resource` is decided on: a template
/// (`{…}` inside) as the templates list shows it, a URI in its canonical identity.
pub(super) fn completion_subject(uri: &str) -> Result<String, Rejection> {
    if uri.contains('{') {
        return Ok(uri.to_owned());
    }
    canonical(uri).map(|c| c.identity().to_owned())
}
