//! What the merged view answers itself from every member's answer:
//! `initialize`, `server/discover` and the lists, merged and prefixed.
//!
//! Place: after the per-request view is built, for the methods no single
//! server owns.
//!
//! Invariants: a merged session is the gateway's own, minted here and bound
//! to the client; a list holds only what this client may see, each name
//! prefixed with its server's; a server that fails is left out, not fatal,
//! unless none answers; a server whose circuit breaker is open is not asked
//! for its list, and the instructions say why it is missing.

use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use serde_json::{Map, Value, json};

use crate::error::Rejection;
use crate::mcp::headers::MCP_SESSION_ID;
use crate::mcp::methods::ListKind;
use crate::mcp::request::{Ask, Request};
use crate::mcp::version::{self, Era};
use crate::proxy::breaker::Phase;
use crate::proxy::context::Context;
use crate::proxy::forward::{reply_headers, watch_instructions};
use crate::proxy::lists::{Listed, list_items};
use crate::proxy::respond::{self};
use crate::proxy::session::Member;
use crate::sanitize::{Report, Sanitizer, Skip};

use super::view::{Part, SEPARATOR, View, answer, no_server_answered};

/// What one member answered to a request the view sends to all of them.
pub(super) struct Answer {
    server: String,
    result: Map<String, Value>,
    /// The session it minted (`initialize`).
    session: Option<String>,
}

/// Sends the client's request to every member; the results of those that
/// answered (their instructions pinned on the way), the others logged.
async fn ask_each(view: &View<'_>, ctx: &Context, body: &Bytes) -> Vec<Answer> {
    let id = ctx.id.clone().unwrap_or(Value::Null);
    let mut answers = Vec::new();
    for part in &view.parts {
        let forward = part.forward(ctx, view.client);
        let out = forward.headers(&part.headers(view.headers, None));
        let answered = match forward.send(out, body.clone(), true).await {
            Ok(reply) => {
                let session = reply_headers(&reply)
                    .get(MCP_SESSION_ID)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let reply = watch_instructions(reply, &forward, ctx.id.clone());
                respond::collect(reply, &id, &part.server.catalog)
                    .await
                    .map(|m| (m, session))
            }
            Err(e) => Err(e),
        };
        match answered {
            Ok((mut message, session)) => match message.get_mut("result").map(Value::take) {
                Some(Value::Object(result)) => answers.push(Answer {
                    server: part.name().to_owned(),
                    result,
                    session,
                }),
                _ => {
                    tracing::warn!(server = part.name(), method = %ctx.method, "the server refused; it is left out of the merged answer")
                }
            },
            Err(e) => {
                tracing::warn!(server = part.name(), method = %ctx.method, error = %e.reason, "the server did not answer; it is left out of the merged answer");
            }
        }
    }
    answers
}

pub(super) async fn initialize(
    view: &View<'_>,
    ctx: &mut Context,
    message: &Request,
    body: Bytes,
) -> Result<Response, Rejection> {
    let answers = ask_each(view, ctx, &body).await;
    if answers.is_empty() {
        return Err(no_server_answered("initialize"));
    }
    let mut members = Vec::new();
    for answer in &answers {
        if let Some(s) = &answer.session {
            view.state.sessions.bind(&answer.server, s, view.client);
        }
        let version = answer
            .result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or(version::LEGACY_DEFAULT);
        members.push(Member {
            server: answer.server.clone(),
            session: answer.session.clone(),
            version: version.to_owned(),
        });
    }
    let requested = match message.ask() {
        Ask::Initialize {
            protocol_version, ..
        } => protocol_version.as_ref().and_then(Value::as_str),
        _ => None,
    }
    .unwrap_or(version::LEGACY_DEFAULT);
    // The oldest version any member agreed to: every member can speak it or
    // is spoken to in its own version (see `Part::headers`).
    let agreed = members
        .iter()
        .map(|m| m.version.as_str())
        .min()
        .unwrap_or(requested)
        .to_owned();
    let mut merged = merge_results(view, &answers);
    merged.insert("protocolVersion".into(), agreed.into());
    merged.insert(
        "serverInfo".into(),
        json!({
            "name": "portcullis",
            "title": format!("Portcullis: {}", names(&answers).join(", ")),
            "version": env!("CARGO_PKG_VERSION"),
        }),
    );
    let session = view.state.sessions.bind_merged(view.client, members);
    let capabilities = match message.ask() {
        Ask::Initialize { capabilities, .. } => capabilities.as_ref(),
        _ => None,
    };
    view.state
        .approvals
        .remember_session(view.client.name(), &session, capabilities);
    let mut out = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&session) {
        out.insert(MCP_SESSION_ID, v);
    }
    Ok(answer(ctx, Value::Object(merged), out))
}

pub(super) async fn discover(
    view: &View<'_>,
    ctx: &mut Context,
    body: Bytes,
) -> Result<Response, Rejection> {
    let answers = ask_each(view, ctx, &body).await;
    if answers.is_empty() {
        return Err(no_server_answered("server/discover"));
    }
    let mut merged = merge_results(view, &answers);
    // Versions every answering member supports.
    let supported: Vec<&str> = version::MODERN
        .iter()
        .copied()
        .filter(|v| {
            answers.iter().all(|a| {
                a.result
                    .get("supportedVersions")
                    .and_then(Value::as_array)
                    .is_none_or(|list| list.iter().any(|x| x.as_str() == Some(v)))
            })
        })
        .collect();
    merged.insert("supportedVersions".into(), json!(supported));
    let ttl = answers
        .iter()
        .filter_map(|a| a.result.get("ttlMs").and_then(Value::as_u64))
        .min()
        .unwrap_or(0);
    merged.insert("ttlMs".into(), ttl.into());
    merged.insert("cacheScope".into(), "private".into());
    merged.insert("resultType".into(), "complete".into());
    Ok(answer(ctx, Value::Object(merged), HeaderMap::new()))
}

/// Capabilities merged (a feature any member offers is offered), and the
/// members' instructions, each under its server's name.
fn merge_results(view: &View<'_>, answers: &[Answer]) -> Map<String, Value> {
    let sanitizer = Sanitizer::new(&view.live.sanitize, Skip::default());
    let mut capabilities = Value::Object(Map::new());
    for answer in answers {
        if let Some(c) = answer.result.get("capabilities") {
            // Members' capabilities are upstream text like any other: keys and
            // values sanitized; one that is not usable as sent is left out.
            let mut c = c.clone();
            // Capabilities hold no identifier: every string is text.
            let data = crate::sanitize::exempt::Pos::Data;
            if sanitizer
                .definition(&mut c, data, &mut Report::default())
                .is_ok()
            {
                merge_capabilities(&mut capabilities, &c);
            }
        }
    }
    let mut instructions = format!(
        "This endpoint merges the MCP servers {}. Tool and prompt names carry their server's name: \
         `<server>{SEPARATOR}<name>`.",
        names(answers)
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for Answer {
        server: name,
        result,
        ..
    } in answers
    {
        if let Some(text) = result.get("instructions").and_then(Value::as_str) {
            let clean = sanitizer.text(text, &mut Report::default());
            instructions.push_str(&format!(
                "\n\nServer `{name}`:\n{}",
                crate::sanitize::unbom(clean.as_deref().unwrap_or(text))
            ));
        }
    }
    // A server whose breaker is not closed: the client is told why its
    // tools are missing, and that the others still work.
    for part in &view.parts {
        let phase = part.server.upstream.breaker.phase();
        if phase != Phase::Closed {
            instructions.push_str(&format!(
                "\n\nServer `{}` is unavailable for now (its circuit breaker is {}): its tools, prompts \
                 and resources are left out of the lists until it answers again, its calls are answered \
                 at once with `server_unavailable`, and the other servers keep serving. A \
                 `notifications/tools/list_changed` on a `subscriptions/listen` stream says when it is back.",
                part.name(),
                phase.as_str().replace('_', "-"),
            ));
        }
    }
    let mut merged = Map::new();
    merged.insert("capabilities".into(), capabilities);
    merged.insert("instructions".into(), instructions.into());
    merged
}

pub(super) fn merge_capabilities(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (k, v) in from {
                match into.get_mut(k) {
                    Some(existing) => merge_capabilities(existing, v),
                    None => {
                        into.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (into @ Value::Bool(false), Value::Bool(true)) => *into = Value::Bool(true),
        _ => {}
    }
}

pub(super) fn names(answers: &[Answer]) -> Vec<&str> {
    answers.iter().map(|a| a.server.as_str()).collect()
}

/// Every member's list as this client may see it, names prefixed, on one page.
pub(super) async fn merged_list(
    view: &View<'_>,
    ctx: &mut Context,
    message: &Request,
    kind: ListKind,
) -> Result<Response, Rejection> {
    crate::proxy::lists::refuse_cursor(message)?;
    let mut items = Vec::new();
    let mut failed = None;
    let mut answered = 0usize;
    let mut ttl: Option<u64> = None;
    for part in &view.parts {
        // An open breaker: the server is not asked, its items are left out
        // (half-open, the list is a probe like any request).
        if part.server.upstream.breaker.phase() == Phase::Open {
            tracing::debug!(server = part.name(), method = %ctx.method, "left out of the merged list: its circuit breaker is open");
            continue;
        }
        match part_list(view, ctx, part, message, kind).await {
            Ok(Listed::Items(listed, result)) => {
                answered += 1;
                items.extend(listed);
                if let Some(t) = result.get("ttlMs").and_then(Value::as_u64) {
                    ttl = Some(ttl.map_or(t, |old| old.min(t)));
                }
            }
            // A server without this kind of item answers with an error: it has none.
            Ok(Listed::Refused(..) | Listed::Rendered(..)) => answered += 1,
            Err(rejection) => {
                tracing::warn!(server = part.name(), method = %ctx.method, error = rejection.code(), "left out of the merged list");
                failed.get_or_insert(rejection);
            }
        }
    }
    ctx.server = None;
    ctx.mode = view.live.config.gateway.mode;
    if let (Some(rejection), 0) = (failed, answered) {
        return Err(rejection);
    }
    let mut result = Map::new();
    if ctx.era == Era::Modern {
        // Required in 2026-07-28 results; the merged list lives as long as its shortest part.
        result.insert("ttlMs".into(), ttl.unwrap_or(0).into());
        result.insert("resultType".into(), "complete".into());
    }
    Ok(crate::proxy::lists::answer_list(
        ctx,
        kind,
        &crate::proxy::lists::render(&items),
        result,
    ))
}

/// One member's list for this client, with names as the merged view shows them.
pub(super) async fn part_list(
    view: &View<'_>,
    ctx: &mut Context,
    part: &Part<'_>,
    message: &Request,
    kind: ListKind,
) -> Result<Listed, Rejection> {
    ctx.enter(part.server);
    let forward = part.forward(ctx, view.client);
    let headers = part.headers(view.headers, None);
    let config = &*view.live.config;
    let listed = list_items(config, ctx, &forward, view.client, &headers, message, kind).await?;
    Ok(match listed {
        Listed::Rendered(text, result) => {
            let items = serde_json::from_str(&text).unwrap_or_default();
            prefixed(Listed::Items(items, result), part, kind)
        }
        listed => prefixed(listed, part, kind),
    })
}

/// Tool and prompt names as the merged view shows them.
fn prefixed(listed: Listed, part: &Part<'_>, kind: ListKind) -> Listed {
    match listed {
        Listed::Items(mut items, result) => {
            if matches!(kind, ListKind::Tools | ListKind::Prompts) {
                for item in &mut items {
                    if let Some(name) = item.get("name").and_then(Value::as_str) {
                        item["name"] = format!("{}{SEPARATOR}{name}", part.name()).into();
                    }
                }
            }
            Listed::Items(items, result)
        }
        other => other,
    }
}
