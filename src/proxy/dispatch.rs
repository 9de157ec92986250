//! Dispatch of one request to one server: a match on the method as the
//! method table typed it, each arm a straight sequence of steps.
//!
//! Place: after routing; the merged view dispatches here too, once it has
//! routed a name to its server. Invariant: no method name is compared as a
//! string; a method outside the table never reaches a step.

use super::approve::answered;
use super::call::{call_tool, scan_outgoing, task};
use super::exchange::session;
use super::exchange::{Exchange, observe_or_enforce, param_str, recipient};
use super::forward::{Forward, upstream, watch_instructions};
use super::lists::list;
use super::resource;
use super::subjects::{authorize_completion, authorize_subscriptions, decide_subject};
use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use http::HeaderMap;

use super::state::{AppState, Live, ServerState};
use crate::proxy::ingress::negotiate;
use crate::proxy::respond::relay;

use crate::auth::ClientId;
use crate::config::Config;
use crate::error::Rejection;
use crate::mcp::jsonrpc::{ClassifyError, Message};
use crate::mcp::limits;
use crate::mcp::methods::{self, Called, Class, Kind, Method as Rpc};
use crate::mcp::version::Era;
use crate::policy::Subject;

/// Serves one POST to `/mcp/<server>`: classify, bound, negotiate, check
/// the session, type the method and scan what goes out, then [`serve`].
pub(super) async fn post(
    state: &Arc<AppState>,
    live: &Live,
    ex: &mut Exchange,
    server: &ServerState,
    client: &ClientId,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, Rejection> {
    let config = &*live.config;
    ex.trail.stage("classify");
    let message =
        Message::classify(&body, config.gateway.max_json_depth).map_err(Rejection::Malformed)?;
    ex.trail.trace().classified(&message);
    note_message(ex, &message)?;
    ex.trail.stage("negotiate");
    let (era, _version) = negotiate(headers, &message)?;
    ex.era = era;
    let session = session(state, server, client, headers, era).await?;
    if ex.client_session.is_none() {
        ex.client_session = session.clone();
    }
    let called = resolve(config, &message, era)?;
    ex.trail.stage("scan_outgoing");
    let tool_call = called.as_ref().map(Called::class) == Some(Class::Tool);
    observe_or_enforce(ex, scan_outgoing(live, &message, &body, tool_call))?;
    // The answer to one of the gateway's own approval questions stays here
    // (the merged view checks it the same way before it broadcasts).
    if called.is_none()
        && let Some(accepted) = answered(state, ex, client, &body)?
    {
        return Ok(accepted);
    }
    let incoming = Incoming {
        message,
        called,
        body,
        session,
    };
    serve(state, live, ex, server, client, headers, incoming).await
}

/// A client's message, classified, bounded, negotiated and scanned, on its
/// way to one server.
pub(super) struct Incoming {
    pub(super) message: Message,
    /// Its method as the method table typed it (`None`: a response).
    pub(super) called: Option<Called>,
    /// The bytes forwarded: the client's, or the merged view's renaming.
    pub(super) body: Bytes,
    /// The handshake-era session with this server, checked to be the client's.
    pub(super) session: Option<String>,
}

/// The steps of the method on `server`: the part of the pipeline the
/// single-server path and the merged view share. The merged view enters
/// here once it has routed a name to its server, with the message it
/// classified itself (renamed as the server knows it).
pub(super) async fn serve(
    state: &Arc<AppState>,
    live: &Live,
    ex: &mut Exchange,
    server: &ServerState,
    client: &ClientId,
    headers: &HeaderMap,
    incoming: Incoming,
) -> Result<Response, Rejection> {
    let config = &*live.config;
    let Incoming {
        message,
        called,
        body,
        session,
    } = incoming;
    let era = ex.era;
    let forward = Forward {
        state,
        live,
        server,
        ex_era: era,
        session: session.as_deref(),
        trail: ex.trail.clone(),
        listen: called.as_ref().map(Called::class) == Some(Class::Subscription),
        caller: ex.caller(client),
    };
    let Some(called) = called else {
        // A client's answer to a server's request (handshake era).
        return forward
            .relay(headers, body, recipient(live, ex, server, None))
            .await;
    };
    match (called.method(), called.class()) {
        // An operator's method of class tool is a tool call: the same steps.
        (Some(Rpc::ToolsCall), _) | (_, Class::Tool) => {
            call_tool(ex, &forward, client, headers, &message).await
        }
        (_, Class::List(kind)) => list(config, ex, &forward, client, headers, &message, kind).await,
        (Some(Rpc::Initialize), _) => {
            forward
                .initialize(
                    headers,
                    &message,
                    body,
                    client,
                    recipient(live, ex, server, None),
                )
                .await
        }
        (Some(Rpc::ServerDiscover), _) => {
            let reply = forward
                .send(forward.headers(headers), body, true)
                .await
                .map_err(|e| upstream(&live.sanitize, forward.name(), None, e))?;
            let reply = watch_instructions(reply, &forward, ex.id.clone());
            Ok(relay(reply, recipient(live, ex, server, None)))
        }
        (method, Class::Resource) => {
            let uri = param_str(&message, "uri")?;
            let canonical = resource::canonical(uri)?;
            let subject = Subject::Resource(canonical.identity());
            // Reads take rate-limit tokens; (un)subscribing does not.
            let takes_tokens = !matches!(
                method,
                Some(Rpc::ResourcesSubscribe | Rpc::ResourcesUnsubscribe)
            );
            decide_subject(
                state,
                live,
                ex,
                client,
                server,
                subject,
                takes_tokens,
                || format!("Resource not found: {uri}"),
            )
            .await?;
            let (headers, body) = resource::forwarded(&message, headers, body, &canonical);
            forward
                .relay(&headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Prompt) => {
            let name = param_str(&message, "name")?;
            let subject = Subject::Prompt(name);
            decide_subject(state, live, ex, client, server, subject, true, || {
                format!("Unknown prompt: {name}")
            })
            .await?;
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Completion) => {
            ex.trail.stage("authorize");
            let uri = resource::completion_uri(&message)?;
            let decided = authorize_completion(config, client, server, &message);
            observe_or_enforce(ex, decided)?;
            // The server completes on the URI that was decided.
            let body = match &uri {
                Some(uri) => resource::with_completion_uri(&message, body, uri),
                None => body,
            };
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Subscription) => {
            ex.trail.stage("authorize");
            let uris = resource::subscribed(&message)?;
            let decided = authorize_subscriptions(config, client, server, &uris);
            observe_or_enforce(ex, decided)?;
            // The server subscribes to the URIs that were decided.
            let sent: Vec<&str> = uris.iter().map(|u| u.as_str()).collect();
            let body = resource::with_subscriptions(&message, body, &sent);
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Task) => task(ex, &forward, client, headers, &message, body).await,
        (_, Class::Lifecycle | Class::Notification) => {
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        // The table has no such method from a client; refused like an unknown one.
        (_, Class::ClientFeature) => Err(Rejection::MethodNotFound(ex.method.clone())),
    }
}

/// Right after classification: the edge caps of `mcp::limits` (an overlong
/// identifier is refused before anything reads its meaning), and what the
/// exchange records of the message, bounded either way.
pub(super) fn note_message(ex: &mut Exchange, message: &Message) -> Result<(), Rejection> {
    ex.id = message.id().filter(|id| limits::id_fits(id)).cloned();
    ex.method = crate::util::text::clip(message.method().unwrap_or("(response)"));
    limits::check(message).map_err(Rejection::TooLong)
}

/// The method of a client's message, looked up in the method table of its era
/// (and the operator's `[methods]`); `None` for a response, which has none.
/// A method the gateway does not know is refused (-32601) before anything is sent.
pub(super) fn resolve(
    config: &Config,
    message: &Message,
    era: Era,
) -> Result<Option<Called>, Rejection> {
    let (name, kind) = match message {
        Message::Request { method, .. } => (method, Kind::Request),
        Message::Notification { method, .. } => (method, Kind::Notification),
        // 2026-07-28 has no server→client requests: a client there sends no responses.
        Message::Response { .. } if era == Era::Modern => {
            return Err(Rejection::Malformed(ClassifyError::Invalid(
                "a 2026-07-28 client sends no JSON-RPC responses (servers send no requests in that era)",
            )));
        }
        Message::Response { .. } => return Ok(None),
    };
    match methods::client_call(name, kind, era, &config.methods) {
        Some(called) => Ok(Some(called)),
        None => Err(Rejection::MethodNotFound(name.clone())),
    }
}
