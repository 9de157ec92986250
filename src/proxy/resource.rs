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

/// The URIs a `subscriptions/listen` subscribes to, each in its canonical
/// form; a spelling that cannot be canonicalized is refused as a read of it
/// would be.
pub(super) fn subscribed(message: &Message) -> Result<Vec<CanonicalUri>, Rejection> {
    subscribed_uris(message)?
        .into_iter()
        .map(canonical)
        .collect()
}

/// The URIs a `subscriptions/listen` subscribes to (none when it names none).
fn subscribed_uris(message: &Message) -> Result<Vec<&str>, Rejection> {
    let subscribed = message
        .params()
        .and_then(|p| p.get("notifications"))
        .and_then(|n| n.get("resourceSubscriptions"));
    let invalid = || {
        Rejection::InvalidParams(
            "subscriptions/listen needs params.notifications.resourceSubscriptions to be a list of URI strings"
                .into(),
        )
    };
    match subscribed {
        None => Ok(Vec::new()),
        Some(Value::Array(uris)) => uris
            .iter()
            .map(|u| u.as_str().ok_or_else(invalid))
            .collect(),
        Some(_) => Err(invalid()),
    }
}

/// A `subscriptions/listen` as the upstream must see it: the subscribed URIs
/// replaced by `uris` (canonical), the body kept when nothing changes.
pub(super) fn with_subscriptions(message: &Message, body: Bytes, uris: &[&str]) -> Bytes {
    let sent = message
        .params()
        .and_then(|p| p.get("notifications"))
        .and_then(|n| n.get("resourceSubscriptions"))
        .and_then(Value::as_array);
    let same = sent.is_some_and(|s| {
        s.len() == uris.len() && s.iter().zip(uris).all(|(a, b)| a.as_str() == Some(*b))
    });
    if same || (sent.is_none() && uris.is_empty()) {
        return body;
    }
    let mut request = rebuild(message);
    request["params"]["notifications"]["resourceSubscriptions"] = uris.into();
    serde_json::to_vec(&request)
        .map(Bytes::from)
        .unwrap_or(body)
}

/// The canonical URI of a `completion/complete` on a `ref/resource` naming a
/// URI (`None` for a prompt or a template, which is decided as listed).
pub(super) fn completion_uri(message: &Message) -> Result<Option<CanonicalUri>, Rejection> {
    let reference = message.params().and_then(|p| p.get("ref"));
    let field = |k: &str| reference.and_then(|r| r.get(k)).and_then(Value::as_str);
    match (field("type"), field("uri")) {
        (Some("ref/resource"), Some(uri)) if !uri.contains('{') => canonical(uri).map(Some),
        _ => Ok(None),
    }
}

/// A `completion/complete` as the upstream must see it: `params.ref.uri`
/// replaced by the canonical URI, the body kept when already canonical.
pub(super) fn with_completion_uri(message: &Message, body: Bytes, uri: &CanonicalUri) -> Bytes {
    let sent = message
        .params()
        .and_then(|p| p.get("ref"))
        .and_then(|r| r.get("uri"))
        .and_then(Value::as_str);
    if sent == Some(uri.as_str()) {
        return body;
    }
    let mut request = rebuild(message);
    request["params"]["ref"]["uri"] = uri.as_str().into();
    serde_json::to_vec(&request)
        .map(Bytes::from)
        .unwrap_or(body)
}

/// What `completion/complete` on a `ref/resource` is decided on: a template
/// (`{…}` inside) as the templates list shows it, a URI in its canonical identity.
pub(super) fn completion_subject(uri: &str) -> Result<String, Rejection> {
    if uri.contains('{') {
        return Ok(uri.to_owned());
    }
    canonical(uri).map(|c| c.identity().to_owned())
}
