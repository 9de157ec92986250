//! Requests the merged view routes to exactly one server: a prefixed tool
//! or prompt name, a resource URI, a completion's reference.
//!
//! Place: after the per-request view is built; the chosen server's request
//! then goes through the same per-server pipeline as `/mcp/<server>`.
//!
//! Invariants: a name without a known server prefix gets the `unknown_tool`
//! answer, listing only what this client may call; a resource goes to the
//! first server (in name order) whose list, as this client may see it, has
//! the URI or a template matching it, compared in canonical form; nothing is
//! sent to a server for a refused call.

use std::sync::atomic::Ordering;

use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;

use crate::error::Rejection;
use crate::mcp::methods::ListKind;
use crate::mcp::request::{Ask, Reference, Request};
use crate::mcp::version::Era;
use crate::policy::{ListFacts, Subject};
use crate::proxy::context::Context;
use crate::proxy::dispatch::{Incoming, serve};
use crate::proxy::lists::Listed;
use crate::proxy::refusals::refuse_unknown_tool;
use crate::proxy::resource;

use super::merged::part_list;
use super::view::{Part, SEPARATOR, View};

/// `tools/call`, `prompts/get` and the operator's methods of class tool or
/// prompt: the prefix names the server. A name without a known prefix gets
/// the `unknown_tool` result on `tools/call` (`tool_call`), else not-found.
pub(super) async fn named(
    view: &View<'_>,
    ctx: &mut Context,
    message: &Request,
    kind: ListKind,
    tool_call: bool,
) -> Result<Response, Rejection> {
    let name = match message.ask() {
        Ask::Tool { name, .. } | Ask::Prompt { name, .. } => name.clone(),
        _ => return Err(Rejection::MethodNotFound(ctx.method.clone())),
    };
    let found = split(&name).and_then(|(server, inner)| {
        let part = view.parts.iter().find(|p| p.name() == server)?;
        Some((part, inner))
    });
    let Some((part, inner)) = found else {
        ctx.tool = (kind == ListKind::Tools).then(|| name.clone());
        return Err(match kind {
            ListKind::Tools if tool_call => unknown_merged_tool(view, ctx, message, &name).await,
            ListKind::Tools => Rejection::NotFound(format!("Unknown tool: {name}")),
            _ => Rejection::NotFound(format!("Unknown prompt: {name}")),
        });
    };
    let renamed = message.clone().renamed(inner);
    route_to(view, ctx, part, renamed, Some(inner)).await
}

/// `resources/read` and its kin: the first server whose list, for this
/// client, has the URI.
pub(super) async fn by_uri(
    view: &View<'_>,
    ctx: &mut Context,
    message: &Request,
    uri: &str,
    body: Bytes,
    completion: bool,
) -> Result<Response, Rejection> {
    // Routed on the canonical form: an encoded `/` never reaches a template,
    // so a `{var}` cannot cross a segment. A template that a completion
    // names (`ref/resource`) is routed as listed.
    let (target, identity) = if completion && uri.contains('{') {
        (uri.to_owned(), uri.to_owned())
    } else {
        let canonical = resource::canonical(uri)?;
        (
            canonical.as_str().to_owned(),
            canonical.identity().to_owned(),
        )
    };
    let Some(part) = owner_of(view, ctx, message, &target, &identity).await else {
        return Err(Rejection::NotFound(format!("Resource not found: {uri}")));
    };
    // The per-server pipeline canonicalizes body and `Mcp-Name` alike.
    send_to(view, ctx, part, Some(uri), message.clone(), body).await
}

pub(super) async fn completion(
    view: &View<'_>,
    ctx: &mut Context,
    message: &Request,
    body: Bytes,
) -> Result<Response, Rejection> {
    let Ask::Completion { reference } = message.ask() else {
        return Err(Rejection::MethodNotFound(ctx.method.clone()));
    };
    match reference {
        Reference::Prompt { name } => {
            let found = split(name.as_str()).and_then(|(server, inner)| {
                let part = view.parts.iter().find(|p| p.name() == server)?;
                Some((part, String::from(inner)))
            });
            let Some((part, inner)) = found else {
                return Err(Rejection::NotFound(format!("Unknown prompt: {name}")));
            };
            let renamed = message.clone().renamed(&inner);
            route_to(view, ctx, part, renamed, None).await
        }
        Reference::Resource { uri } => {
            let uri = uri.clone();
            by_uri(view, ctx, message, &uri, body, true).await
        }
    }
}

/// Sends `renamed` (the message as the server names things) through the
/// per-server pipeline: its bytes are written once, for the server; the
/// message is not read again from them.
async fn route_to(
    view: &View<'_>,
    ctx: &mut Context,
    part: &Part<'_>,
    renamed: Request,
    target: Option<&str>,
) -> Result<Response, Rejection> {
    ctx.prefix = format!("{}{SEPARATOR}", part.name());
    let body = Bytes::from(serde_json::to_vec(&renamed.to_value()).unwrap_or_default());
    send_to(view, ctx, part, target, renamed, body).await
}

/// `message` (sent as `body`) through the per-server pipeline of `part`
/// from [`serve`] on, with the member's session and version, and
/// `Mcp-Name` naming `target` as the server knows it.
pub(super) async fn send_to(
    view: &View<'_>,
    ctx: &mut Context,
    part: &Part<'_>,
    target: Option<&str>,
    message: Request,
    body: Bytes,
) -> Result<Response, Rejection> {
    ctx.enter(part.server);
    let headers = part.headers(view.headers, target);
    let incoming = Incoming {
        request: message,
        body,
        session: part.session.clone(),
    };
    serve(ctx, part.server, view.client, &headers, incoming).await
}

/// `<server>__<name>` → (server, name).
pub(super) fn split(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
        .filter(|(server, inner)| !server.is_empty() && !inner.is_empty())
}

/// The `unknown_tool` answer of the merged view: every tool this client may
/// call, on every member, by its merged name.
async fn unknown_merged_tool(
    view: &View<'_>,
    ctx: &Context,
    message: &Request,
    name: &str,
) -> Rejection {
    let config = &*view.live.config;
    let mut permitted = Vec::new();
    for part in &view.parts {
        let forward = part.forward(ctx, view.client);
        let headers = part.headers(view.headers, None);
        let Ok(tools) = forward.tool_set(&headers, message, None).await else {
            continue;
        };
        permitted.extend(
            tools
                .names()
                .filter(|t| {
                    let facts = ListFacts {
                        claims: ctx.token.as_ref().map(|t| t.claims()),
                        annotations: tools
                            .tools
                            .get(*t)
                            .and_then(|e| e.definition.get("annotations")),
                    };
                    config
                        .policy
                        .decide_listed(view.client, part.name(), Subject::Tool(t), &facts)
                        .allowed
                })
                .map(|t| format!("{}{SEPARATOR}{t}", part.name())),
        );
    }
    refuse_unknown_tool(name, "through this gateway", &permitted)
}

/// The member that serves `uri` to this client.
async fn owner_of<'v>(
    view: &'v View<'_>,
    ctx: &mut Context,
    message: &Request,
    uri: &str,
    identity: &str,
) -> Option<&'v Part<'v>> {
    // Looking up is not listing: what a list would hide is decided by the read.
    let would_refuse = ctx.would_refuse;
    let mut owner = None;
    'parts: for part in &view.parts {
        for kind in [ListKind::Resources, ListKind::Templates] {
            let lookup = lookup_message(view, ctx, message, kind);
            let Ok(Listed::Items(items, _)) = part_list(view, ctx, part, &lookup, kind).await
            else {
                continue;
            };
            let found = items.iter().any(|item| match kind {
                ListKind::Templates => item
                    .get("uriTemplate")
                    .and_then(Value::as_str)
                    .is_some_and(|t| template_matches(t, uri)),
                _ => crate::proxy::resource::listed(item).as_deref() == Some(identity),
            });
            if found {
                owner = Some(part);
                break 'parts;
            }
        }
    }
    ctx.would_refuse = would_refuse;
    owner
}

/// A list request of the gateway's own, carrying the client's protocol
/// `_meta` (2026 era).
fn lookup_message(view: &View<'_>, ctx: &Context, message: &Request, kind: ListKind) -> Request {
    let n = view.state.next_id.fetch_add(1, Ordering::Relaxed);
    let id = format!("portcullis-{n}").into();
    Request::own_list(id, kind, message, ctx.era == Era::Modern)
}

/// RFC 6570 templates matched loosely: a `{var}` matches one path segment,
/// an expression with an operator (`{+var}`, `{/var}`, …) anything.
pub(super) fn template_matches(template: &str, uri: &str) -> bool {
    fn go(t: &str, u: &str) -> bool {
        match t.find('{') {
            None => t == u,
            Some(open) => {
                let (literal, rest) = t.split_at(open);
                let Some(u) = u.strip_prefix(literal) else {
                    return false;
                };
                let Some(close) = rest.find('}') else {
                    return false;
                };
                let expression = &rest[1..close];
                let after = &rest[close + 1..];
                let spans_slashes = expression.starts_with(['+', '#', '/', '.', ';', '?', '&']);
                (0..=u.len())
                    .filter(|&i| u.is_char_boundary(i))
                    .take_while(|&i| spans_slashes || !u[..i].contains('/'))
                    .any(|i| go(after, &u[i..]))
            }
        }
    }
    go(template, uri)
}
