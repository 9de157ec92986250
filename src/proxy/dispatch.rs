//! Dispatch of one request to one server: a match on the method as the
//! method table typed it, each arm a straight sequence of steps.
//!
//! Place: after routing; the merged view dispatches here too, once it has
//! routed a name to its server. Invariants: no method name is compared as a
//! string; a method outside the table never reaches a step; every step reads
//! the message through its [`Request`], typed once right after the method
//! table, and what is forwarded is that request serialised again (or the
//! bytes received, when nothing was changed).

use super::approve::answered;
use super::call::{call_tool, outgoing_refusal, scan_outgoing, task};
use super::exchange::session;
use super::exchange::{Exchange, observe_or_enforce, recipient};
use super::flow;
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
use crate::mcp::request::{Ask, Request};
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
    let found = scan_outgoing(live, &message, &body, tool_call);
    let request = type_request(ex, message, called)?;
    observe_or_enforce(ex, outgoing_refusal(&request, found))?;
    // The answer to one of the gateway's own approval questions stays here
    // (the merged view checks it the same way before it broadcasts).
    if request.called().is_none()
        && let Some(accepted) = answered(state, ex, client, &body)?
    {
        return Ok(accepted);
    }
    let incoming = Incoming {
        request,
        body,
        session,
    };
    serve(state, live, ex, server, client, headers, incoming).await
}

/// A client's message, classified, bounded, negotiated and scanned, on its
/// way to one server.
pub(super) struct Incoming {
    /// The message, typed once (its method as the method table typed it).
    pub(super) request: Request,
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
        request,
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
        listen: matches!(request.ask(), Ask::Subscription { .. }),
        caller: ex.caller(client),
    };
    let Some(called) = request.called() else {
        // A client's answer to a server's request (handshake era).
        return forward
            .relay(headers, body, recipient(live, ex, server, None))
            .await;
    };
    match (called.method(), called.class()) {
        // An operator's method of class tool is a tool call: the same steps.
        (Some(Rpc::ToolsCall), _) | (_, Class::Tool) => {
            call_tool(ex, &forward, client, headers, &request).await
        }
        (_, Class::List(kind)) => list(config, ex, &forward, client, headers, &request, kind).await,
        (Some(Rpc::Initialize), _) => {
            forward
                .initialize(
                    headers,
                    &request,
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
            let Ask::Resource { uri } = request.ask() else {
                return Err(untyped(&request));
            };
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
            let (headers, body) = resource::forwarded(&request, headers, body, &canonical);
            let mut to = recipient(live, ex, server, None);
            if method == Some(Rpc::ResourcesRead) {
                // What it reads reaches the client: a labelled resource sets its label.
                let session = flow::key(ex, client, forward.name(), &request);
                let (store, labels) = (&state.flows, &config.flow);
                let uri = canonical.identity();
                to.flow = flow::reading(store, labels, session, forward.name(), uri);
            }
            forward.relay(&headers, body, to).await
        }
        (_, Class::Prompt) => {
            let Ask::Prompt { name, .. } = request.ask() else {
                return Err(untyped(&request));
            };
            let subject = Subject::Prompt(name);
            decide_subject(state, live, ex, client, server, subject, true, || {
                format!("Unknown prompt: {name}")
            })
            .await?;
            // Its messages reach the client: a labelled prompt sets its label.
            let mut to = recipient(live, ex, server, None);
            let session = flow::key(ex, client, forward.name(), &request);
            let (store, labels) = (&state.flows, &config.flow);
            to.flow = flow::prompting(store, labels, session, forward.name(), name);
            forward.relay(headers, body, to).await
        }
        (_, Class::Completion) => {
            ex.trail.stage("authorize");
            let Ask::Completion { reference } = request.ask() else {
                return Err(untyped(&request));
            };
            let uri = resource::completion_uri(reference)?;
            let decided = authorize_completion(config, client, server, reference);
            observe_or_enforce(ex, decided)?;
            // The server completes on the URI that was decided.
            let body = match &uri {
                Some(uri) => resource::with_uris(request, body, &[uri.as_str()]),
                None => body,
            };
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Subscription) => {
            ex.trail.stage("authorize");
            let Ask::Subscription { uris, .. } = request.ask() else {
                return Err(untyped(&request));
            };
            let uris = resource::subscribed(uris.as_deref())?;
            let decided = authorize_subscriptions(config, client, server, &uris);
            observe_or_enforce(ex, decided)?;
            // The server subscribes to the URIs that were decided.
            let sent: Vec<&str> = uris.iter().map(|u| u.as_str()).collect();
            let body = resource::with_uris(request, body, &sent);
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
        (_, Class::Task) => task(ex, &forward, client, headers, &request, body).await,
        (Some(Rpc::Cancelled), _) => {
            if let Ask::Cancel {
                request_id: Some(id),
            } = request.ask()
            {
                forward.cancel_in_flight(id);
            }
            forward
                .relay(headers, body, recipient(live, ex, server, None))
                .await
        }
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

/// The message typed once ([`Request`]): what the exchange records of its
/// method, or the refusal (-32602) of a field its method cannot go without.
pub(super) fn type_request(
    ex: &mut Exchange,
    message: Message,
    called: Option<Called>,
) -> Result<Request, Rejection> {
    let request = Request::typed(message, called).map_err(|u| Rejection::InvalidParams(u.0))?;
    ex.rpc = request.method();
    Ok(request)
}

/// A request whose class and [`Ask`] disagree: cannot be built by
/// [`Request::typed`], refused like a request missing its field.
fn untyped(request: &Request) -> Rejection {
    Rejection::InvalidParams(format!(
        "{} could not be read as its method requires",
        request.method_name()
    ))
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
