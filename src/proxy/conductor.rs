//! The conductor: the one sequence of named steps every request on `/mcp`
//! and `/mcp/<server>` goes through, for one server and for the merged view
//! alike. Each step takes the request's [`Context`] and returns to the
//! conductor, which announces it on the trail (`trail.stage`) and calls the
//! next; the merged view differs only by its routing step.
//!
//! ```text
//! admit → authenticate (route) → read_body → classify → negotiate → session
//!   → method_table → scan_outgoing (the typed request)
//!   → an answer to the gateway's own approval question: kept here
//!   → route: /mcp/<server>  → that server's steps for the method (dispatch::serve)
//!            merged view    → the server a name or URI picks, then the same steps;
//!                             or every member (initialize, lists, broadcasts)
//! GET, DELETE: one server's stream or session end; the merged view's session end
//! ```
//!
//! Place: between the transport ([`crate::transport`], [`super::ingress`])
//! and the steps of each method ([`super::dispatch`], [`super::federate`]).
//! Invariants: a step either returns what the next needs or stops the
//! request with a [`Rejection`]; nothing is sent upstream before every step
//! of the request's method has passed; the typed request is made once, here.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Method};

use super::approve::answered;
use super::call::{held, outgoing_refusal, scan_outgoing};
use super::context::Context;
use super::dispatch::{Incoming, serve};
use super::federate;
use super::forward::{ACCEPT_BOTH, reply_status, upstream};
use super::ingress::{admit, negotiate, read_body};
use super::session::Member;
use super::state::{AppState, Live, ServerState};

use crate::auth::ClientId;
use crate::error::Rejection;
use crate::mcp::headers::{self, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::mcp::jsonrpc::{ClassifyError, Message};
use crate::mcp::limits;
use crate::mcp::methods::{self, Called, Class, Kind};
use crate::mcp::request::Request;
use crate::mcp::version::Era;
use crate::proxy::respond::relay;
use crate::transport::forwarded_headers;
use crate::transport::reply::{Framing, UpstreamError};

/// Serves one request on `/mcp` or `/mcp/<server>`: the steps in the order
/// of the drawing above.
pub(super) async fn conduct(
    ctx: &mut Context,
    server: Option<String>,
    parts: Parts,
    body: Body,
) -> Result<Response, Rejection> {
    let live = ctx.live.clone();
    let authority = parts.uri.authority().map(|a| a.as_str());
    admit(
        &parts.headers,
        authority,
        &live.config.gateway,
        ctx.state.loopback,
    )?;
    ctx.trail.stage("authenticate");
    let target = route(ctx, &live, server)?;
    let client = authenticate(ctx, target, &parts).await?;
    let headers = &parts.headers;
    let state = ctx.state.clone();
    match (target, &parts.method) {
        (_, &Method::POST) => {
            ctx.trail.stage("read_body");
            let gateway = &live.config.gateway;
            let body = read_body(
                headers,
                body,
                gateway.max_request_bytes,
                gateway.client_timeout,
            )
            .await?;
            ctx.trail.stage("classify");
            let message = classify(ctx, &body)?;
            ctx.trail.stage("negotiate");
            ctx.era = negotiate(headers, &message)?.0;
            let presented = presented(ctx, target, &client, headers).await?;
            let called = method_table(ctx, &message)?;
            ctx.trail.stage("scan_outgoing");
            let request = typed(ctx, message, &body, called)?;
            // The answer to one of the gateway's own approval questions stays here.
            if request.called().is_none()
                && let Some(accepted) = answered(&state, ctx, &client, &body)?
            {
                return Ok(accepted);
            }
            match presented {
                Presented::One(server, session) => {
                    let incoming = Incoming {
                        request,
                        body,
                        session,
                    };
                    let response = serve(ctx, server, &client, headers, incoming).await?;
                    let name = [server.upstream.settings.name.as_str()];
                    Ok(held(&state, ctx, &client, name, false, response))
                }
                Presented::Merged(members) => {
                    let response =
                        federate::serve(ctx, &client, headers, members, request, body).await?;
                    // A merged stream carries every server's notifications: losing any ends it.
                    let names = live.servers.keys().map(String::as_str);
                    Ok(held(&state, ctx, &client, names, false, response))
                }
            }
        }
        (Target::One(server), &Method::GET | &Method::DELETE) => {
            let response = stream_or_end(&state, &live, server, ctx, &client, &parts).await?;
            let name = [server.upstream.settings.name.as_str()];
            let get_stream = parts.method == Method::GET;
            Ok(held(&state, ctx, &client, name, get_stream, response))
        }
        (Target::Merged, &Method::DELETE) => {
            federate::end(&state, &live, ctx, &client, &parts).await
        }
        // The merged view offers no GET stream (the spec's 405); 2026-era
        // clients listen with `subscriptions/listen`.
        (Target::Merged, _) => Err(Rejection::MethodNotAllowed("POST, DELETE")),
        _ => Err(Rejection::MethodNotAllowed("GET, POST, DELETE")),
    }
}

/// What a path names.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    One(&'a Arc<ServerState>),
    /// `/mcp` with several servers: all of them, tools named `<server>__<tool>`.
    Merged,
}

/// `/mcp/<name>`; `/mcp` is the one server, or the merged view of several.
/// The request is then about that server (its mode applies), or about the
/// merged view (the gateway's mode).
fn route<'a>(
    ctx: &mut Context,
    live: &'a Live,
    server: Option<String>,
) -> Result<Target<'a>, Rejection> {
    let target = match server {
        Some(name) => live
            .servers
            .get(&name)
            .map(Target::One)
            .ok_or(Rejection::UnknownServer(name))?,
        None if live.servers.len() == 1 => live
            .servers
            .values()
            .next()
            .map(Target::One)
            .ok_or(Rejection::UnknownServer(String::new()))?,
        None => Target::Merged,
    };
    match target {
        Target::One(server) => ctx.enter(server),
        Target::Merged => ctx.mode = live.config.gateway.mode,
    }
    Ok(target)
}

/// The client, and the JWT it presented. The merged view names no one
/// server: only audiences not bound to a single server admit a token there.
async fn authenticate(
    ctx: &mut Context,
    target: Target<'_>,
    parts: &Parts,
) -> Result<ClientId, Rejection> {
    let audience = match target {
        Target::One(server) => server.upstream.settings.name.as_str(),
        Target::Merged => "",
    };
    let authenticated = (ctx.live.config.clients)
        .authenticate(&parts.headers, audience, parts.uri.path())
        .await
        .map_err(Rejection::Unauthenticated)?;
    ctx.client = Some(authenticated.client.clone());
    ctx.token = authenticated.token;
    Ok(authenticated.client)
}

/// The body as JSON-RPC, within the depth limit; then the edge caps of
/// `mcp::limits` (an overlong identifier is refused before anything reads
/// its meaning), and what the context records of the message, bounded
/// either way.
fn classify(ctx: &mut Context, body: &Bytes) -> Result<Message, Rejection> {
    let depth = ctx.live.config.gateway.max_json_depth;
    let message = Message::classify(body, depth).map_err(Rejection::Malformed)?;
    ctx.trail.trace().classified(&message);
    ctx.id = message.id().filter(|id| limits::id_fits(id)).cloned();
    ctx.method = crate::util::text::clip(message.method().unwrap_or("(response)"));
    limits::check(&message).map_err(Rejection::TooLong)?;
    Ok(message)
}

/// The handshake-era session a request presents, checked to be this
/// client's: with the one server, or the merged view's own (naming each
/// member's session).
enum Presented<'a> {
    One(&'a Arc<ServerState>, Option<String>),
    Merged(Option<Arc<[Member]>>),
}

async fn presented<'a>(
    ctx: &mut Context,
    target: Target<'a>,
    client: &ClientId,
    headers: &HeaderMap,
) -> Result<Presented<'a>, Rejection> {
    match target {
        Target::One(server) => {
            let session = session(&ctx.state, server, client, headers, ctx.era).await?;
            if ctx.client_session.is_none() {
                ctx.client_session = session.clone();
            }
            Ok(Presented::One(server, session))
        }
        Target::Merged => {
            let members = federate::members(&ctx.state, client, headers, ctx.era)?;
            if members.is_some() {
                // The merged session (checked just now): what its initialize declared counts.
                ctx.client_session = headers::single(headers, MCP_SESSION_ID)
                    .ok()
                    .flatten()
                    .map(str::to_owned);
            }
            Ok(Presented::Merged(members))
        }
    }
}

/// The method of a client's message, looked up in the method table of its
/// era (and the operator's `[methods]`); `None` for a response, which has
/// none. A method the gateway does not know is refused (-32601) before
/// anything is sent.
fn method_table(ctx: &Context, message: &Message) -> Result<Option<Called>, Rejection> {
    let (name, kind) = match message {
        Message::Request { method, .. } => (method, Kind::Request),
        Message::Notification { method, .. } => (method, Kind::Notification),
        // 2026-07-28 has no server→client requests: a client there sends no responses.
        Message::Response { .. } if ctx.era == Era::Modern => {
            return Err(Rejection::Malformed(ClassifyError::Invalid(
                "a 2026-07-28 client sends no JSON-RPC responses (servers send no requests in that era)",
            )));
        }
        Message::Response { .. } => return Ok(None),
    };
    let table = &ctx.live.config.methods;
    match methods::client_call(name, kind, ctx.era, table) {
        Some(called) => Ok(Some(called)),
        None => Err(Rejection::MethodNotFound(name.clone())),
    }
}

/// The outgoing secret scan of what the message carries, and the message
/// typed once ([`Request`]): what the context records of its method, or
/// the refusal (-32602) of a field its method cannot go without.
fn typed(
    ctx: &mut Context,
    message: Message,
    body: &Bytes,
    called: Option<Called>,
) -> Result<Request, Rejection> {
    let tool_call = called.as_ref().map(Called::class) == Some(Class::Tool);
    let found = scan_outgoing(&ctx.live, &message, body, tool_call);
    let request = Request::typed(message, called).map_err(|u| Rejection::InvalidParams(u.0))?;
    ctx.rpc = request.method();
    // Known before any step can refuse it, so every refusal is recorded with it.
    ctx.subject = super::about::subject(request.ask(), &ctx.live.sanitize);
    ctx.observe_or_enforce(outgoing_refusal(&request, found))?;
    Ok(request)
}

/// The session a legacy request presents must be this client's (known
/// here, or to the fleet's shared state store).
pub(super) async fn session(
    state: &AppState,
    server: &ServerState,
    client: &ClientId,
    headers: &HeaderMap,
    era: Era,
) -> Result<Option<String>, Rejection> {
    let presented =
        headers::single(headers, MCP_SESSION_ID).map_err(|m| Rejection::HeaderMismatch(m.0))?;
    let id = match (era, presented) {
        // 2026-07-28 has no sessions; a stray id is ignored (and not forwarded).
        (Era::Modern, _) | (_, None) => return Ok(None),
        (Era::Legacy, Some(id)) => id,
    };
    let known = state
        .sessions
        .check_in_fleet(&server.upstream.settings.name, id, client)
        .await
        .map_err(|e| Rejection::StateUnavailable(e.store))?;
    match known {
        true => Ok(Some(id.to_owned())),
        false => Err(Rejection::SessionNotFound),
    }
}

/// A GET stream or a DELETE on one server (handshake era): the session
/// checked to be the client's, then forwarded and relayed.
pub(super) async fn stream_or_end(
    state: &Arc<AppState>,
    live: &Live,
    server: &ServerState,
    ctx: &mut Context,
    client: &ClientId,
    parts: &Parts,
) -> Result<Response, Rejection> {
    let version = headers::single(&parts.headers, MCP_PROTOCOL_VERSION)
        .map_err(|m| Rejection::HeaderMismatch(m.0))?;
    if version.and_then(Era::of) == Some(Era::Modern) {
        return Err(Rejection::MethodNotAllowed("POST"));
    }
    let session = session(state, server, client, &parts.headers, Era::Legacy).await?;
    let accept = if parts.method == Method::GET {
        "text/event-stream"
    } else {
        ACCEPT_BOTH
    };
    let mut out = forwarded_headers(&parts.headers, accept);
    ctx.trail
        .trace()
        .forward(&mut out, None, server.upstream.settings.url());
    let name = server.upstream.settings.name.clone();
    let credential = server
        .identity
        .credential(&ctx.caller(client), &live.config.identity)
        .await
        .map_err(|e| upstream(&live.sanitize, &name, None, UpstreamError::credentials(e)))?;
    let sent = Instant::now();
    // A GET stream lives as long as the session: no idle limit.
    let reply = server
        .upstream
        .exchange(parts.method.clone(), out, credential, None, None)
        .await
        .map_err(|e| upstream(&live.sanitize, &name, None, e))?;
    ctx.trail
        .upstream(reply_status(&reply).code(), sent.elapsed());
    if let Some(id) = &session {
        let status = reply_status(&reply);
        if parts.method == Method::DELETE
            && (status.is_success() || status == Framing::Http(http::StatusCode::NOT_FOUND))
        {
            state.sessions.remove(&name, id);
        }
    }
    Ok(relay(reply, ctx.recipient(server)))
}
