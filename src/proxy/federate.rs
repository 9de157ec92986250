//! The merged view: `/mcp` when several servers are configured.
//!
//! Place in the path: between the transport checks and the per-server
//! pipeline. Each request is either answered by the view itself (`initialize`,
//! `server/discover`, `ping`, the lists, `DELETE`) from what every server
//! answers, or routed to exactly one server and then decided by the same
//! per-server pipeline as `/mcp/<server>` — rules, rate limits, validation,
//! sanitizing and rewriting apply unchanged.
//!
//! Naming: tools and prompts are `<server>__<name>` (the spec's advice to
//! aggregators); server names never contain `__` nor end with `_` (refused at
//! load), so the first `__` splits a name unambiguously and two servers' names
//! can never collide. Resource URIs are kept as the servers give them; a read
//! goes to the first server (in name order) whose list, as this client may see
//! it, has the URI or a template matching it — compared in canonical form
//! ([`crate::policy::uri`]), so a spelling the canonicalizer refuses (an
//! encoded `/`, say) is refused here before any template can route it.
//!
//! Invariants: a merged session is the gateway's own (minted here, bound to the
//! client), naming each member server's own session and protocol version,
//! which replace the client's on everything routed to that server; a name
//! without a known server prefix gets the `unknown_tool` answer, listing only
//! what this client may call; nothing is sent to a server for a refused call.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{Map, Value, json};

use super::dispatch::post;
use super::exchange::{ACCEPT_BOTH, Exchange, enter, param_str, rebuild, recipient};
use super::forward::{Forward, reply_headers, upstream, watch_instructions};
use super::lists::{Listed, list_items};
use super::refusals::refuse_unknown_tool;
use super::resource;
use super::state::{AppState, Live, ServerState};
use crate::auth::ClientId;
use crate::error::Rejection;
use crate::error::{UpstreamFailure, UpstreamKind};
use crate::mcp::headers::{self, MCP_NAME, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::mcp::jsonrpc::{self, Message};
use crate::mcp::methods::ListKind;
use crate::mcp::methods::{Class, Method as Rpc};
use crate::mcp::sse::SseItem;
use crate::mcp::version::{self, Era};
use crate::policy::Subject;
use crate::proxy::reply::Reply;
use crate::proxy::respond::{self, relay};
use crate::proxy::session::Member;
use crate::proxy::upstream::forwarded_headers;
use crate::sanitize::{Report, Sanitizer, Skip};

/// Separates the server's name from the tool's or prompt's.
const SEPARATOR: &str = "__";

/// One server as a request of the merged view reaches it.
struct Part<'a> {
    server: &'a ServerState,
    /// The server's own session (handshake era).
    session: Option<String>,
    /// The version the server agreed to, when it differs from the client's.
    version: Option<String>,
}

impl Part<'_> {
    fn name(&self) -> &str {
        &self.server.upstream.settings.name
    }

    /// The client's headers as this server must see them: its own session and
    /// version, and `Mcp-Name` naming what the server calls the target.
    fn headers(&self, client: &HeaderMap, target: Option<&str>) -> HeaderMap {
        let mut out = client.clone();
        out.remove(MCP_SESSION_ID);
        if let Some(session) = self.session.as_deref().and_then(|s| s.parse().ok()) {
            out.insert(MCP_SESSION_ID, session);
        }
        if let Some(version) = self.version.as_deref().and_then(|v| v.parse().ok()) {
            out.insert(MCP_PROTOCOL_VERSION, version);
        }
        if let Some(target) = target
            && out.contains_key(MCP_NAME)
        {
            out.insert(MCP_NAME, headers::encode(target));
        }
        out
    }

    fn forward<'f>(
        &'f self,
        state: &'f Arc<AppState>,
        live: &'f Live,
        ex: &Exchange,
    ) -> Forward<'f> {
        Forward {
            state,
            live,
            server: self.server,
            ex_era: ex.era,
            session: self.session.as_deref(),
            trail: ex.trail.clone(),
            // The merged view's own listen sends with no idle limit itself.
            listen: false,
        }
    }
}

/// What one request of the merged view needs from its surroundings.
struct View<'a> {
    state: &'a Arc<AppState>,
    live: &'a Live,
    client: &'a ClientId,
    headers: &'a HeaderMap,
    parts: Vec<Part<'a>>,
}

/// Serves a POST on the merged view.
pub(super) async fn post_merged(
    state: &Arc<AppState>,
    live: &Live,
    ex: &mut Exchange,
    client: &ClientId,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, Rejection> {
    let message = Message::classify(&body, live.config.gateway.max_json_depth)
        .map_err(Rejection::Malformed)?;
    super::dispatch::note_message(ex, &message)?;
    let (era, _version) = super::ingress::negotiate(headers, &message)?;
    ex.era = era;
    ex.mode = live.config.gateway.mode;
    super::exchange::observe_or_enforce(ex, super::call::scan_outgoing(live, &message, &body))?;
    let members = members(state, client, headers, era)?;
    if members.is_some() {
        // The merged session (checked just now): what its initialize declared counts.
        ex.client_session = headers::single(headers, MCP_SESSION_ID)
            .ok()
            .flatten()
            .map(str::to_owned);
    }
    let view = View {
        state,
        live,
        client,
        headers,
        parts: parts(live, members.as_deref()),
    };
    let Some(called) = super::dispatch::resolve(&live.config, &message, era)? else {
        // The answer to one of the gateway's own approval questions stays here.
        if let Some(accepted) = super::approve::answered(state, ex, client, &body)? {
            return Ok(accepted);
        }
        // A response to a server's request: every member gets it (a server
        // ignores a response it did not ask for).
        broadcast(&view, ex, body).await;
        return Ok(accepted());
    };
    match (called.method(), called.class()) {
        (Some(Rpc::Initialize), _) => initialize(&view, ex, &message, body).await,
        (Some(Rpc::ServerDiscover), _) => discover(&view, ex, body).await,
        (Some(Rpc::Ping), _) => Ok(answer(ex, json!({}), HeaderMap::new())),
        (Some(Rpc::LoggingSetLevel), _) => {
            broadcast(&view, ex, body).await;
            Ok(answer(ex, json!({}), HeaderMap::new()))
        }
        (_, Class::List(kind)) => merged_list(&view, ex, &message, kind).await,
        (Some(Rpc::ToolsCall), _) => named(&view, ex, &message, ListKind::Tools, true).await,
        // An operator's method of class tool names its tool like tools/call.
        (_, Class::Tool) => named(&view, ex, &message, ListKind::Tools, false).await,
        (_, Class::Prompt) => named(&view, ex, &message, ListKind::Prompts, false).await,
        (_, Class::Resource) => {
            let uri = param_str(&message, "uri")?.to_owned();
            by_uri(&view, ex, &message, &uri, body, false).await
        }
        (_, Class::Completion) => completion(&view, ex, &message, body).await,
        (_, Class::Subscription) => listen(&view, ex, &message).await,
        // Notifications: every member server gets them.
        (_, Class::Lifecycle | Class::Notification) if message.id().is_none() => {
            broadcast(&view, ex, body).await;
            Ok(accepted())
        }
        // A task id, or an operator's lifecycle request, names no member:
        // the merged view cannot route it.
        (_, Class::Lifecycle | Class::Notification | Class::Task | Class::ClientFeature) => {
            Err(Rejection::MethodNotFound(ex.method.clone()))
        }
    }
}

/// Serves a DELETE on the merged view: every member's session ends with it.
pub(super) async fn end(
    state: &Arc<AppState>,
    live: &Live,
    ex: &mut Exchange,
    client: &ClientId,
    request: &Parts,
) -> Result<Response, Rejection> {
    let members =
        members(state, client, &request.headers, Era::Legacy)?.ok_or(Rejection::SessionNotFound)?;
    for part in parts(live, Some(&members)) {
        let Some(session) = &part.session else {
            continue;
        };
        let out = forwarded_headers(&part.headers(&request.headers, None), ACCEPT_BOTH);
        let upstream = &part.server.upstream;
        let timeout = Some(upstream.settings.timeout);
        let ended = upstream.exchange(Method::DELETE, out, None, timeout).await;
        if let Err(e) = ended {
            tracing::info!(server = part.name(), error = %e.reason, "ending a member session failed");
        }
        state.sessions.remove(part.name(), session);
    }
    if let Ok(Some(id)) = headers::single(&request.headers, MCP_SESSION_ID) {
        state.sessions.remove_merged(id);
    }
    ex.trail.note(|e| e.decision = "forwarded".into());
    Ok(Response::new(Body::empty()))
}

/// The members of the merged session the request presents (handshake era).
fn members(
    state: &AppState,
    client: &ClientId,
    headers: &HeaderMap,
    era: Era,
) -> Result<Option<Arc<[Member]>>, Rejection> {
    let presented =
        headers::single(headers, MCP_SESSION_ID).map_err(|m| Rejection::HeaderMismatch(m.0))?;
    match (era, presented) {
        (Era::Modern, _) | (_, None) => Ok(None),
        (Era::Legacy, Some(id)) => state
            .sessions
            .merged(id, client)
            .map(Some)
            .ok_or(Rejection::SessionNotFound),
    }
}

/// The servers a request may reach: the session's members still configured,
/// or every server when there is no session.
fn parts<'a>(live: &'a Live, members: Option<&[Member]>) -> Vec<Part<'a>> {
    match members {
        None => live
            .servers
            .values()
            .map(|s| Part {
                server: s,
                session: None,
                version: None,
            })
            .collect(),
        Some(members) => members
            .iter()
            .filter_map(|m| {
                Some(Part {
                    server: live.servers.get(&m.server)?,
                    session: m.session.clone(),
                    version: Some(m.version.clone()),
                })
            })
            .collect(),
    }
}

// --- answered by the view ---

/// What one member answered to a request the view sends to all of them.
struct Answer {
    server: String,
    result: Map<String, Value>,
    /// The session it minted (`initialize`).
    session: Option<String>,
}

/// Sends the client's request to every member; the results of those that
/// answered (their instructions pinned on the way), the others logged.
async fn ask_each(view: &View<'_>, ex: &Exchange, body: &Bytes) -> Vec<Answer> {
    let id = ex.id.clone().unwrap_or(Value::Null);
    let mut answers = Vec::new();
    for part in &view.parts {
        let forward = part.forward(view.state, view.live, ex);
        let out = forward.headers(&part.headers(view.headers, None));
        let answered = match forward.send(out, body.clone(), true).await {
            Ok(reply) => {
                let session = reply_headers(&reply)
                    .get(MCP_SESSION_ID)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let reply = watch_instructions(reply, &forward, ex.id.clone());
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
                    tracing::warn!(server = part.name(), method = %ex.method, "the server refused; it is left out of the merged answer")
                }
            },
            Err(e) => {
                tracing::warn!(server = part.name(), method = %ex.method, error = %e.reason, "the server did not answer; it is left out of the merged answer");
            }
        }
    }
    answers
}

async fn initialize(
    view: &View<'_>,
    ex: &mut Exchange,
    message: &Message,
    body: Bytes,
) -> Result<Response, Rejection> {
    let answers = ask_each(view, ex, &body).await;
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
    let requested = message
        .params()
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str)
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
    let capabilities = crate::approval::inband::initialize_capabilities(&body);
    view.state
        .approvals
        .remember_session(view.client.name(), &session, capabilities.as_ref());
    let mut out = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&session) {
        out.insert(MCP_SESSION_ID, v);
    }
    Ok(answer(ex, Value::Object(merged), out))
}

async fn discover(view: &View<'_>, ex: &mut Exchange, body: Bytes) -> Result<Response, Rejection> {
    let answers = ask_each(view, ex, &body).await;
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
    Ok(answer(ex, Value::Object(merged), HeaderMap::new()))
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
            if sanitizer.definition(&mut c, &mut Report::default()).is_ok() {
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
    let mut merged = Map::new();
    merged.insert("capabilities".into(), capabilities);
    merged.insert("instructions".into(), instructions.into());
    merged
}

fn merge_capabilities(into: &mut Value, from: &Value) {
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

fn names(answers: &[Answer]) -> Vec<&str> {
    answers.iter().map(|a| a.server.as_str()).collect()
}

/// Every member's list as this client may see it, names prefixed, on one page.
async fn merged_list(
    view: &View<'_>,
    ex: &mut Exchange,
    message: &Message,
    kind: ListKind,
) -> Result<Response, Rejection> {
    super::lists::refuse_cursor(message)?;
    let mut items = Vec::new();
    let mut failed = None;
    let mut answered = 0usize;
    let mut ttl: Option<u64> = None;
    for part in &view.parts {
        match part_list(view, ex, part, message, kind).await {
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
                tracing::warn!(server = part.name(), method = %ex.method, error = rejection.code(), "left out of the merged list");
                failed.get_or_insert(rejection);
            }
        }
    }
    ex.server = None;
    ex.mode = view.live.config.gateway.mode;
    if let (Some(rejection), 0) = (failed, answered) {
        return Err(rejection);
    }
    let mut result = Map::new();
    if ex.era == Era::Modern {
        // Required in 2026-07-28 results; the merged list lives as long as its shortest part.
        result.insert("ttlMs".into(), ttl.unwrap_or(0).into());
        result.insert("resultType".into(), "complete".into());
    }
    Ok(super::lists::answer_list(
        ex,
        kind,
        &super::lists::render(&items),
        result,
    ))
}

/// One member's list for this client, with names as the merged view shows them.
async fn part_list(
    view: &View<'_>,
    ex: &mut Exchange,
    part: &Part<'_>,
    message: &Message,
    kind: ListKind,
) -> Result<Listed, Rejection> {
    enter(ex, view.live, part.server);
    let forward = part.forward(view.state, view.live, ex);
    let headers = part.headers(view.headers, None);
    let config = &*view.live.config;
    let listed = list_items(config, ex, &forward, view.client, &headers, message, kind).await?;
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

// --- routed to one server ---

/// `tools/call`, `prompts/get` and the operator's methods of class tool or
/// prompt: the prefix names the server. A name without a known prefix gets
/// the `unknown_tool` result on `tools/call` (`tool_call`), else not-found.
async fn named(
    view: &View<'_>,
    ex: &mut Exchange,
    message: &Message,
    kind: ListKind,
    tool_call: bool,
) -> Result<Response, Rejection> {
    let name = param_str(message, "name")?.to_owned();
    let found = split(&name).and_then(|(server, inner)| {
        let part = view.parts.iter().find(|p| p.name() == server)?;
        Some((part, inner))
    });
    let Some((part, inner)) = found else {
        ex.tool = (kind == ListKind::Tools).then(|| name.clone());
        return Err(match kind {
            ListKind::Tools if tool_call => unknown_merged_tool(view, ex, message, &name).await,
            ListKind::Tools => Rejection::NotFound(format!("Unknown tool: {name}")),
            _ => Rejection::NotFound(format!("Unknown prompt: {name}")),
        });
    };
    let mut renamed = rebuild(message);
    renamed["params"]["name"] = inner.into();
    route_to(view, ex, part, renamed, Some(inner)).await
}

/// `resources/read` and its kin: the first server whose list, for this
/// client, has the URI.
async fn by_uri(
    view: &View<'_>,
    ex: &mut Exchange,
    message: &Message,
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
    let Some(part) = owner_of(view, ex, message, &target, &identity).await else {
        return Err(Rejection::NotFound(format!("Resource not found: {uri}")));
    };
    // The per-server pipeline canonicalizes body and `Mcp-Name` alike.
    send_to(view, ex, part, Some(uri), body).await
}

async fn completion(
    view: &View<'_>,
    ex: &mut Exchange,
    message: &Message,
    body: Bytes,
) -> Result<Response, Rejection> {
    let reference = message.params().and_then(|p| p.get("ref"));
    let field = |k: &str| reference.and_then(|r| r.get(k)).and_then(Value::as_str);
    match field("type") {
        Some("ref/prompt") => {
            let name = field("name").unwrap_or_default();
            let found = split(name).and_then(|(server, inner)| {
                let part = view.parts.iter().find(|p| p.name() == server)?;
                Some((part, inner.to_owned()))
            });
            let Some((part, inner)) = found else {
                return Err(Rejection::NotFound(format!("Unknown prompt: {name}")));
            };
            let mut renamed = rebuild(message);
            renamed["params"]["ref"]["name"] = inner.into();
            route_to(view, ex, part, renamed, None).await
        }
        Some("ref/resource") => {
            let uri = field("uri").unwrap_or_default().to_owned();
            by_uri(view, ex, message, &uri, body, true).await
        }
        // The per-server pipeline words the refusal.
        _ => match view.parts.first() {
            Some(part) => route_to(view, ex, part, rebuild(message), None).await,
            None => Err(no_server_answered("completion/complete")),
        },
    }
}

/// Sends `message` (as the server names things) through the per-server pipeline.
async fn route_to(
    view: &View<'_>,
    ex: &mut Exchange,
    part: &Part<'_>,
    message: Value,
    target: Option<&str>,
) -> Result<Response, Rejection> {
    ex.prefix = format!("{}{SEPARATOR}", part.name());
    let body = Bytes::from(serde_json::to_vec(&message).unwrap_or_default());
    send_to(view, ex, part, target, body).await
}

/// `body` through the per-server pipeline of `part`, with its session and
/// version, and `Mcp-Name` naming `target` as the server knows it.
async fn send_to(
    view: &View<'_>,
    ex: &mut Exchange,
    part: &Part<'_>,
    target: Option<&str>,
    body: Bytes,
) -> Result<Response, Rejection> {
    enter(ex, view.live, part.server);
    let headers = part.headers(view.headers, target);
    post(
        view.state,
        view.live,
        ex,
        part.server,
        view.client,
        &headers,
        body,
    )
    .await
}

/// `<server>__<name>` → (server, name).
fn split(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
        .filter(|(server, inner)| !server.is_empty() && !inner.is_empty())
}

/// The `unknown_tool` answer of the merged view: every tool this client may
/// call, on every member, by its merged name.
async fn unknown_merged_tool(
    view: &View<'_>,
    ex: &Exchange,
    message: &Message,
    name: &str,
) -> Rejection {
    let config = &*view.live.config;
    let mut permitted = Vec::new();
    for part in &view.parts {
        let forward = part.forward(view.state, view.live, ex);
        let headers = part.headers(view.headers, None);
        let Ok(tools) = forward.tool_set(&headers, message, None).await else {
            continue;
        };
        permitted.extend(
            tools
                .names()
                .filter(|t| {
                    config
                        .policy
                        .decide(view.client, part.name(), Subject::Tool(t))
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
    ex: &mut Exchange,
    message: &Message,
    uri: &str,
    identity: &str,
) -> Option<&'v Part<'v>> {
    // Looking up is not listing: what a list would hide is decided by the read.
    let would_refuse = ex.would_refuse;
    let mut owner = None;
    'parts: for part in &view.parts {
        for kind in [ListKind::Resources, ListKind::Templates] {
            let lookup = lookup_message(view, ex, message, kind);
            let Ok(Listed::Items(items, _)) = part_list(view, ex, part, &lookup, kind).await else {
                continue;
            };
            let found = items.iter().any(|item| match kind {
                ListKind::Templates => item
                    .get("uriTemplate")
                    .and_then(Value::as_str)
                    .is_some_and(|t| template_matches(t, uri)),
                _ => super::resource::listed(item).as_deref() == Some(identity),
            });
            if found {
                owner = Some(part);
                break 'parts;
            }
        }
    }
    ex.would_refuse = would_refuse;
    owner
}

/// A list request of the gateway's own, carrying the client's `_meta` (2026 era).
fn lookup_message(view: &View<'_>, ex: &Exchange, message: &Message, kind: ListKind) -> Message {
    let method = kind.method().name();
    let mut params = Map::new();
    if ex.era == Era::Modern
        && let Some(meta) = message.params().and_then(|p| p.get("_meta"))
    {
        params.insert("_meta".into(), meta.clone());
    }
    let n = view.state.next_id.fetch_add(1, Ordering::Relaxed);
    Message::Request {
        id: format!("portcullis-{n}").into(),
        method: method.to_owned(),
        params: Some(params),
    }
}

/// RFC 6570 templates matched loosely: a `{var}` matches one path segment,
/// an expression with an operator (`{+var}`, `{/var}`, …) anything.
fn template_matches(template: &str, uri: &str) -> bool {
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

/// `subscriptions/listen` (2026 era): one stream carrying every member's
/// notifications, acknowledged once. Each member is asked only for the
/// subscribed resources this client may read there; a URI no member lets it
/// read gets the answer a missing resource gets.
async fn listen(
    view: &View<'_>,
    ex: &mut Exchange,
    message: &Message,
) -> Result<Response, Rejection> {
    let config = &*view.live.config;
    let uris = super::subjects::subscribed_uris(message)?;
    let readable = |part: &Part<'_>, uri: &str| {
        config
            .policy
            .decide(view.client, part.name(), Subject::Resource(uri))
            .allowed
    };
    if let Some(hidden) = uris
        .iter()
        .find(|uri| !view.parts.iter().any(|p| readable(p, uri)))
    {
        return Err(Rejection::NotFound(format!("Resource not found: {hidden}")));
    }
    let mut streams = Vec::new();
    let mut first_failure = None;
    for part in &view.parts {
        let mut own = rebuild(message);
        if !uris.is_empty() {
            let mine: Vec<&str> = uris.iter().copied().filter(|u| readable(part, u)).collect();
            own["params"]["notifications"]["resourceSubscriptions"] = json!(mine);
        }
        let body = Bytes::from(serde_json::to_vec(&own).unwrap_or_default());
        let forward = part.forward(view.state, view.live, ex);
        let out = forward.headers(&part.headers(view.headers, None));
        match forward.send(out, body, false).await {
            Ok(Reply::Sse { events, .. }) => {
                let catalog = part.server.catalog.clone();
                streams.push(events.inspect(move |item| {
                    if let Ok(SseItem::Event(e)) = item
                        && e.data.contains("notifications/tools/list_changed")
                    {
                        catalog.invalidate();
                    }
                }));
            }
            Ok(_) => tracing::info!(
                server = part.name(),
                "the server offers no subscription stream"
            ),
            Err(e) => {
                first_failure
                    .get_or_insert_with(|| upstream(&view.live.sanitize, part.name(), None, e));
            }
        }
    }
    let Some(first) = view.parts.first() else {
        return Err(no_server_answered("subscriptions/listen"));
    };
    if streams.is_empty() {
        return Err(first_failure.unwrap_or_else(|| no_server_answered("subscriptions/listen")));
    }
    let mut acknowledged = false;
    let events = futures_util::stream::select_all(streams).filter(move |item| {
        let duplicate = matches!(item, Ok(SseItem::Event(e))
            if e.data.contains("notifications/subscriptions/acknowledged"))
            && std::mem::replace(&mut acknowledged, true);
        std::future::ready(!duplicate)
    });
    let reply = Reply::Sse {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        events: Box::pin(events),
    };
    ex.server = None;
    Ok(relay(reply, recipient(view.live, ex, first.server, None)))
}

/// Sends the client's message to every member, answers ignored.
async fn broadcast(view: &View<'_>, ex: &mut Exchange, body: Bytes) {
    for part in &view.parts {
        let sent = send_to(view, ex, part, None, body.clone()).await;
        if let Err(rejection) = sent {
            tracing::info!(server = part.name(), method = %ex.method, error = rejection.code(), "not delivered to a member server");
        }
    }
    ex.server = None;
    ex.mode = view.live.config.gateway.mode;
}

fn answer(ex: &Exchange, result: Value, headers: HeaderMap) -> Response {
    let id = ex.id.clone().unwrap_or(Value::Null);
    respond::json(&jsonrpc::result(&id, result), headers)
}

fn accepted() -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

fn no_server_answered(method: &str) -> Rejection {
    Rejection::Upstream(UpstreamFailure::new(
        UpstreamKind::Unavailable,
        "(merged view)",
        None,
        format!("no configured server answered {method}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_at_the_first_separator() {
        assert_eq!(split("flights__search"), Some(("flights", "search")));
        assert_eq!(split("a__b__c"), Some(("a", "b__c")));
        assert_eq!(split("a___b"), Some(("a", "_b")));
        assert_eq!(split("search"), None);
        assert_eq!(split("__x"), None);
        assert_eq!(split("x__"), None);
    }

    #[test]
    fn templates_match_segments_or_anything_with_an_operator() {
        assert!(template_matches("file:///{path}", "file:///a.txt"));
        assert!(!template_matches("file:///{path}", "file:///dir/a.txt"));
        assert!(template_matches("file:///{+path}", "file:///dir/a.txt"));
        assert!(template_matches(
            "test://static/resource/{id}",
            "test://static/resource/7"
        ));
        assert!(!template_matches(
            "test://static/resource/{id}",
            "test://other/7"
        ));
        assert!(template_matches("a://{x}/b/{y}", "a://1/b/2"));
        assert!(!template_matches("a://{x}/b/{y}", "a://1/c/2"));
        assert!(template_matches("plain://uri", "plain://uri"));
    }

    #[test]
    fn capabilities_merge_as_a_union() {
        let mut into = json!({"tools": {"listChanged": false}});
        merge_capabilities(
            &mut into,
            &json!({"tools": {"listChanged": true}, "prompts": {}}),
        );
        merge_capabilities(&mut into, &json!({"logging": {}}));
        assert_eq!(
            into,
            json!({"tools": {"listChanged": true}, "prompts": {}, "logging": {}})
        );
    }
}
