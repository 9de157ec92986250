//! Lists the gateway answers itself: collected whole from the upstream (every
//! page), remembered (pins), filtered per client, answered in one page.
//!
//! Place: the list branch of the per-server pipeline and of the merged view.
//! Invariant: the shared catalog is the gateway's own, never shaped by one
//! client's list parameters (a client `cursor` is refused).

use super::context::Context;
use super::forward::{Forward, upstream};
use super::forward::{Pages, own_list_request};
use super::resource;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::response::Response;
use http::HeaderMap;
use serde_json::{Map, Value, json};

use crate::proxy::respond::{self};
use crate::transport::reply::UpstreamError;

use crate::auth::ClientId;
use crate::config::{Config, Mode};
use crate::error::Rejection;
use crate::mcp::methods::ListKind;
use crate::mcp::request::{Ask, Request};
use crate::mcp::version::Era;
use crate::policy::{ListFacts, Subject};
use crate::sanitize::exempt::{Answer, Pos};
use crate::sanitize::{Report, Sanitizer, Skip};

/// What a list item is, for the rules: the lists the gateway filters per
/// client are the four of [`ListKind`] (`crate::mcp::methods`).
impl ListKind {
    fn subject(self, item: &Value) -> Option<Subject<'_>> {
        let field = |k: &str| item.get(k).and_then(Value::as_str);
        match self {
            ListKind::Tools => field("name").map(Subject::Tool),
            ListKind::Resources => field("uri").map(Subject::Resource),
            ListKind::Templates => field("uriTemplate").map(Subject::Resource),
            ListKind::Prompts => field("name").map(Subject::Prompt),
        }
    }
}

pub(super) async fn list(
    config: &Config,
    ctx: &mut Context,
    forward: &Forward,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Request,
    kind: ListKind,
) -> Result<Response, Rejection> {
    refuse_cursor(message)?;
    match list_items(config, ctx, forward, client, headers, message, kind).await? {
        // The upstream refused the list: its error goes back, sanitized.
        Listed::Refused(error, reply_headers) => Ok(respond::json(&error, reply_headers)),
        Listed::Items(visible, result) => Ok(answer_list(ctx, kind, &render(&visible), result)),
        Listed::Rendered(visible, result) => Ok(answer_list(ctx, kind, &visible, result)),
    }
}

/// The gateway answers every list whole, on one page, and never issues a
/// cursor: a cursor a client sends is not one of the gateway's, and is refused
/// (-32602) rather than letting it choose which page the gateway collects.
pub(super) fn refuse_cursor(message: &Request) -> Result<(), Rejection> {
    let cursor = match message.ask() {
        Ask::List { cursor, .. } => cursor.as_ref(),
        _ => None,
    };
    match cursor {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(Rejection::InvalidParams(format!(
            "invalid cursor: this gateway answers {} whole on one page and issues no cursors; \
             list again without params.cursor",
            message.method_name()
        ))),
    }
}

/// Items as the JSON text of an array.
pub(super) fn render(items: &[Value]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".into())
}

/// One server's list as this client may see it: every page, pinned, sanitized, filtered.
pub(super) async fn list_items(
    config: &Config,
    ctx: &mut Context,
    forward: &Forward,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Request,
    kind: ListKind,
) -> Result<Listed, Rejection> {
    let server = &forward.server;
    let name = server.upstream.settings.name.as_str();
    let id = match message.id() {
        Some(id) => id.clone(),
        None => json!(format!(
            "portcullis-{}",
            forward.state.next_id.fetch_add(1, Ordering::Relaxed)
        )),
    };
    let request = own_list_request(forward.era, kind, message, id);
    let sanitize = &forward.live.sanitize;
    let sanitizer = Sanitizer::new(sanitize, Skip::default());
    let mut report = Report::default();
    let pages = forward
        .all_pages(headers, request, kind.key())
        .await
        .map_err(|e| upstream(sanitize, name, None, e))?;
    let (items, result, known) = match pages {
        Pages::Complete(items, result, source) => {
            // A tool list from one JSON page is remembered by its bytes.
            let known = (kind == ListKind::Tools).then(|| {
                let set = server.catalog.store(&items);
                if let Some(body) = source {
                    set.remember_source(&body, &result);
                }
                set
            });
            (items, result, known)
        }
        Pages::Unchanged(set, result) => (Vec::new(), result, Some(set)),
        // The upstream refused the list: its error goes back, sanitized.
        Pages::Refused(mut error, reply_headers) => {
            if let Err(m) = sanitizer.message(&mut error, None, &mut report) {
                let e = UpstreamError::new(crate::error::UpstreamKind::Protocol, m.0);
                return Err(upstream(sanitize, name, None, e));
            }
            ctx.trail.sanitized(&report);
            return Ok(Listed::Refused(error, reply_headers));
        }
    };
    // The rest of the list result (`_meta`, fields no schema names) is upstream
    // text like the items.
    let mut rest = Value::Object(result);
    let answer = Answer::of(Some(kind.method().name()));
    if let Err(m) = sanitizer.definition(&mut rest, Pos::Result(answer), &mut report) {
        let e = UpstreamError::new(crate::error::UpstreamKind::Protocol, m.0);
        return Err(upstream(sanitize, name, None, e));
    }
    let result = match rest {
        Value::Object(result) => result,
        _ => Map::new(),
    };
    let observe = ctx.mode == Mode::Observe;
    let mut hidden = 0usize;
    let claims = ctx.token.as_ref().map(|t| t.claims());
    // A tool's conditions read its annotations as the call will: from the catalog.
    let mut permitted = |item: &Value, annotations: Option<&Value>| {
        let facts = ListFacts {
            claims,
            annotations,
        };
        let allowed = match kind {
            ListKind::Resources => resource::listed(item).is_some_and(|uri| {
                let subject = Subject::Resource(&uri);
                config
                    .policy
                    .decide_listed(client, name, subject, &facts)
                    .allowed
            }),
            _ => kind
                .subject(item)
                .is_some_and(|s| config.policy.decide_listed(client, name, s, &facts).allowed),
        };
        hidden += usize::from(!allowed);
        // Observe mode lists everything and records what would be hidden.
        allowed || observe
    };
    let mut rendered = None;
    let visible: Vec<Value> = if kind == ListKind::Tools {
        // Held tools are listed as pinned (or not at all when never approved);
        // the sanitized view is worked out once per distinct list.
        let set = known.unwrap_or_else(|| server.catalog.store(&items));
        let listed = set.listed(|definitions| {
            definitions
                .into_iter()
                .filter_map(|mut item| {
                    keep_item(&sanitizer, name, kind, &mut item, &mut report).then_some(item)
                })
                .collect()
        });
        let annotations = |item: &Value| {
            let tool = item.get("name").and_then(Value::as_str)?;
            set.tools.get(tool)?.definition.get("annotations")
        };
        let render = |permitted: &mut dyn FnMut(&Value, Option<&Value>) -> bool| {
            let visible: Vec<&Value> = listed
                .iter()
                .filter(|i| permitted(i, annotations(i)))
                .collect();
            serde_json::to_string(&visible).unwrap_or_else(|_| "[]".into())
        };
        if observe {
            listed
                .iter()
                .filter(|i| permitted(i, annotations(i)))
                .cloned()
                .collect()
        } else if config.policy.lists_vary() {
            // A condition reads the token's claims or the time: decided anew.
            rendered = Some(render(&mut permitted).into());
            Vec::new()
        } else {
            // What this client sees of this list under this policy, rendered once.
            rendered =
                Some(set.rendered(forward.live.generation, client, || render(&mut permitted)));
            Vec::new()
        }
    } else {
        items
            .into_iter()
            .filter(|i| permitted(i, None))
            .filter_map(|mut item| {
                keep_item(&sanitizer, name, kind, &mut item, &mut report).then_some(item)
            })
            .collect()
    };
    ctx.trail.sanitized(&report);
    if !report.is_empty() {
        tracing::info!(server = name, method = %ctx.method, actions = %report.summary(), "sanitized");
    }
    if observe && hidden > 0 {
        ctx.would_refuse = Some("hidden_from_list");
        tracing::info!(server = name, method = %ctx.method, would_hide = hidden, "observe mode: items listed that enforcement would hide");
    }
    Ok(match rendered {
        Some(text) => Listed::Rendered(text, result),
        None => Listed::Items(visible, result),
    })
}

/// Sanitizes one list item whole; false when one of its identifiers (its URI,
/// its cursor-like fields) is unusable, and the item is left out of the list.
pub(super) fn keep_item(
    sanitizer: &Sanitizer<'_>,
    server: &str,
    kind: ListKind,
    item: &mut Value,
    report: &mut Report,
) -> bool {
    match sanitizer.definition(item, Pos::item(kind), report) {
        Ok(()) => true,
        Err(m) => {
            tracing::warn!(server, reason = %m.0, "a list item was left out: it is not usable as sent");
            false
        }
    }
}

/// The list as one response: every item (`visible`, a JSON array) on one page.
pub(super) fn answer_list(
    ctx: &Context,
    kind: ListKind,
    visible: &str,
    mut result: Map<String, Value>,
) -> Response {
    result.remove(kind.key());
    result.remove("nextCursor");
    if ctx.era == Era::Modern {
        // The list depends on who asked: no shared cache may serve it to another client.
        result.insert("cacheScope".into(), "private".into());
    }
    let id = ctx.id.clone().unwrap_or(Value::Null);
    // The rest of the result, then the items spliced in as they were rendered.
    let rest = serde_json::to_string(&result).unwrap_or_else(|_| "{}".into());
    let open = rest.strip_suffix('}').unwrap_or("{");
    let comma = if open.len() > 1 { "," } else { "" };
    let key = kind.key();
    let id = serde_json::to_string(&id).unwrap_or_else(|_| "null".into());
    let body =
        format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{open}{comma}"{key}":{visible}}}}}"#);
    respond::json_text(body, HeaderMap::new())
}

/// A list as one server gave it to this client.
pub(super) enum Listed {
    Items(Vec<Value>, Map<String, Value>),
    /// Items already rendered as a JSON array (the tools fast path).
    Rendered(Arc<str>, Map<String, Value>),
    /// The server answered the list with an error (sanitized).
    Refused(Value, HeaderMap),
}
