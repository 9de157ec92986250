//! Dispatch of one request to one server: a match on the method as the
//! method table typed it, each arm a straight sequence of steps.
//!
//! Place: after the conductor's routing step ([`super::conductor`]); the
//! merged view dispatches here too, once it has routed a name to its server. Invariants: no method name is compared as a
//! string; a method outside the table never reaches a step; every step reads
//! the message through its [`Request`], typed once right after the method
//! table, and what is forwarded is that request serialised again (or the
//! bytes received, when nothing was changed).

use super::call::{call_tool, task};
use super::context::Context;
use super::flow;
use super::forward::{upstream, watch_instructions};
use super::lists::list;
use super::resource;
use super::subjects::{
    UseFacts, authorize_completion, authorize_subscriptions, completed, decide_subject,
};
use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use http::HeaderMap;

use super::state::ServerState;
use crate::proxy::respond::relay;

use crate::auth::ClientId;
use crate::error::Rejection;
use crate::mcp::methods::{Class, Method as Rpc};
use crate::mcp::request::{Ask, Request};
use crate::policy::{Kind, Subject};

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
    ctx: &mut Context,
    server: &Arc<ServerState>,
    client: &ClientId,
    headers: &HeaderMap,
    incoming: Incoming,
) -> Result<Response, Rejection> {
    let (state, live) = (&ctx.state.clone(), &*ctx.live.clone());
    let config = &*live.config;
    let Incoming {
        request,
        body,
        session,
    } = incoming;
    let listen = matches!(request.ask(), Ask::Subscription { .. });
    let forward = ctx.forward_to(client, server, session, listen);
    let Some(called) = request.called() else {
        // A client's answer to a server's request (handshake era).
        return forward.relay(headers, body, ctx.recipient(server)).await;
    };
    match (called.method(), called.class()) {
        // An operator's method of class tool is a tool call: the same steps.
        (Some(Rpc::ToolsCall), _) | (_, Class::Tool) => {
            call_tool(ctx, &forward, client, headers, &request).await
        }
        (_, Class::List(kind)) => {
            list(config, ctx, &forward, client, headers, &request, kind).await
        }
        (Some(Rpc::Initialize), _) => {
            forward
                .initialize(headers, &request, body, client, ctx.recipient(server))
                .await
        }
        (Some(Rpc::ServerDiscover), _) => {
            let reply = forward
                .send(forward.headers(headers), body, true)
                .await
                .map_err(|e| upstream(&live.sanitize, forward.name(), None, e))?;
            let reply = watch_instructions(reply, &forward, ctx.id.clone());
            Ok(relay(reply, ctx.recipient(server)))
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
            let session = ctx.flow_key(client, forward.name(), &request);
            let facts = UseFacts::read(
                (state, config),
                &session,
                Kind::Resource,
                request.method_name(),
                None,
            )
            .await?
            .of_uri(&canonical);
            decide_subject(
                state,
                live,
                ctx,
                client,
                server,
                subject,
                &facts,
                takes_tokens,
                || format!("Resource not found: {uri}"),
            )
            .await?;
            let (headers, body) = resource::forwarded(&request, headers, body, &canonical);
            if method == Some(Rpc::ResourcesRead) {
                // What it reads reaches the client: a labelled resource sets its label.
                let (store, labels) = (&state.flows, &config.flow);
                let uri = canonical.identity();
                ctx.flow = flow::reading(store, labels, session, forward.name(), uri);
            }
            forward.relay(&headers, body, ctx.recipient(server)).await
        }
        (_, Class::Prompt) => {
            let Ask::Prompt { name, arguments } = request.ask() else {
                return Err(untyped(&request));
            };
            let subject = Subject::Prompt(name);
            // In the merged view: the name the server knows, like a tool's.
            ctx.subject = Some(name.clone());
            let session = ctx.flow_key(client, forward.name(), &request);
            let method = request.method_name();
            let arguments = Some(arguments.as_ref());
            let facts =
                UseFacts::read((state, config), &session, Kind::Prompt, method, arguments).await?;
            decide_subject(
                state,
                live,
                ctx,
                client,
                server,
                subject,
                &facts,
                true,
                || format!("Unknown prompt: {name}"),
            )
            .await?;
            // Its messages reach the client: a labelled prompt sets its label.
            let (store, labels) = (&state.flows, &config.flow);
            ctx.flow = flow::prompting(store, labels, session, forward.name(), name);
            forward.relay(headers, body, ctx.recipient(server)).await
        }
        (_, Class::Completion) => {
            ctx.trail.stage("authorize");
            let Ask::Completion { reference } = request.ask() else {
                return Err(untyped(&request));
            };
            let uri = resource::completion_uri(reference)?;
            let session = ctx.flow_key(client, forward.name(), &request);
            let facts = UseFacts::read(
                (state, config),
                &session,
                completed(reference),
                request.method_name(),
                None,
            )
            .await?;
            let decided = authorize_completion(config, ctx, client, server, reference, &facts);
            ctx.observe_or_enforce(decided)?;
            // The server completes on the resource that was decided: its
            // canonical URI without the query, which a completion leaves to
            // the read (no query reaches a server unjudged).
            let body = match &uri {
                Some(uri) => resource::with_uris(request, body, &[uri.identity()]),
                None => body,
            };
            forward.relay(headers, body, ctx.recipient(server)).await
        }
        (_, Class::Subscription) => {
            ctx.trail.stage("authorize");
            let Ask::Subscription { uris, .. } = request.ask() else {
                return Err(untyped(&request));
            };
            let uris = resource::subscribed(uris.as_deref())?;
            let session = ctx.flow_key(client, forward.name(), &request);
            let facts = UseFacts::read(
                (state, config),
                &session,
                Kind::Resource,
                request.method_name(),
                None,
            )
            .await?;
            let decided = authorize_subscriptions(config, ctx, client, server, &uris, &facts);
            ctx.observe_or_enforce(decided)?;
            // The server subscribes to the URIs that were decided.
            let sent: Vec<&str> = uris.iter().map(|u| u.as_str()).collect();
            let body = resource::with_uris(request, body, &sent);
            forward.relay(headers, body, ctx.recipient(server)).await
        }
        (_, Class::Task) => task(ctx, &forward, client, headers, &request, body).await,
        (Some(Rpc::Cancelled), _) => {
            if let Ask::Cancel {
                request_id: Some(id),
            } = request.ask()
            {
                forward.cancel_in_flight(id);
            }
            forward.relay(headers, body, ctx.recipient(server)).await
        }
        (_, Class::Lifecycle | Class::Notification) => {
            forward.relay(headers, body, ctx.recipient(server)).await
        }
        // The table has no such method from a client; refused like an unknown one.
        (_, Class::ClientFeature) => Err(Rejection::MethodNotFound(ctx.method.clone())),
    }
}

/// A request whose class and [`Ask`] disagree: cannot be built by
/// [`Request::typed`], refused like a request missing its field.
fn untyped(request: &Request) -> Rejection {
    Rejection::InvalidParams(format!(
        "{} could not be read as its method requires",
        request.method_name()
    ))
}
