//! Resource URIs on the request path: each is decided, counted, routed and
//! forwarded in its canonical form ([`crate::policy::uri`]).
//!
//! Place in the path: the `resources/read`, `resources/subscribe` and
//! `resources/unsubscribe` steps of the per-server pipeline and of the merged
//! view, the resource list filter, `completion/complete` on a
//! `ref/resource`, and the URIs a `subscriptions/listen` subscribes to.
//!
//! Invariants: a URI that cannot be canonicalized is refused before any rule
//! is looked at and before anything is sent upstream; what the upstream
//! receives (`params.uri`, and `Mcp-Name` when the client sent one) is the
//! canonical URI, so the server resolves exactly what was decided; the body is
//! forwarded byte for byte when the client already spelled the URI canonically.

use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;

use crate::error::Rejection;
use crate::mcp::headers::{self, MCP_NAME};
use crate::mcp::request::{Reference, Request};
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
    request: &Request,
    headers: &HeaderMap,
    body: Bytes,
    canonical: &CanonicalUri,
) -> (HeaderMap, Bytes) {
    let mut headers = headers.clone();
    let mut request = request.clone();
    if !request.set_uris(&[canonical.as_str()]) {
        return (headers, body);
    }
    if headers.contains_key(MCP_NAME) {
        headers.insert(MCP_NAME, headers::encode(canonical.as_str()));
    }
    let body = serde_json::to_vec(&request.to_value())
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

/// The URIs a `subscriptions/listen` subscribes to, each in its canonical
/// form; a spelling that cannot be canonicalized is refused as a read of it
/// would be.
pub(super) fn subscribed(uris: Option<&[String]>) -> Result<Vec<CanonicalUri>, Rejection> {
    uris.unwrap_or_default()
        .iter()
        .map(|u| canonical(u))
        .collect()
}

/// A `subscriptions/listen` or a `completion/complete` on a resource as the
/// upstream must see it: its URIs replaced by `uris` (canonical), the body
/// kept when nothing changes.
pub(super) fn with_uris(mut request: Request, body: Bytes, uris: &[&str]) -> Bytes {
    if !request.set_uris(uris) {
        return body;
    }
    serde_json::to_vec(&request.to_value())
        .map(Bytes::from)
        .unwrap_or(body)
}

/// The canonical URI of a `completion/complete` on a `ref/resource` naming a
/// URI (`None` for a prompt or a template, which is decided as listed); it
/// is forwarded without its query, which only a read judges.
pub(super) fn completion_uri(reference: &Reference) -> Result<Option<CanonicalUri>, Rejection> {
    match reference {
        Reference::Resource { uri } if !uri.contains('{') => canonical(uri).map(Some),
        _ => Ok(None),
    }
}

/// What `completion/complete` on a `ref/resource` is decided on: a template
/// (`{…}` inside) as the templates list shows it, a URI in its canonical identity.
pub(super) fn completion_subject(uri: &str) -> Result<String, Rejection> {
    if uri.contains('{') {
        return Ok(uri.to_owned());
    }
    canonical(uri).map(|c| c.identity().to_owned())
}
