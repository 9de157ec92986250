//! Messages the merged view sends to every member: the one
//! `subscriptions/listen` stream carrying all their notifications, and
//! notifications and responses broadcast to all.
//!
//! Place: after the per-request view is built, for what no single server
//! owns and every server must hear.
//!
//! Invariants: each member is asked only for the subscribed resources this
//! client may read there, each in its canonical form (the one decided); a URI
//! no member lets it read gets the answer a missing resource gets (observe
//! mode records that answer); a member is asked for every URI, and every
//! update it sends about a resource is relayed, when it is in observe mode
//! (its own, else the gateway's), as its lists show every resource; else an
//! update is relayed only when the member that sent it shows it; a stream
//! that asked for tool list changes is told when a member's circuit breaker
//! opens or closes (its tools leave the merged list or come back).

use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::HeaderMap;
use serde_json::json;

use crate::config::Mode;
use crate::error::Rejection;
use crate::mcp::methods::{self, Method as Rpc};
use crate::mcp::request::{Ask, Request};
use crate::mcp::sse::SseItem;
use crate::policy::uri::CanonicalUri;
use crate::policy::{Kind, Subject};
use crate::proxy::context::Context;
use crate::proxy::forward::upstream;
use crate::proxy::respond::relay;
use crate::transport::reply::{Framing, Reply};

use crate::proxy::subjects::{UseFacts, judge, note_refusal};

use super::routed::send_to;
use super::view::{Part, View, no_server_answered};

/// `subscriptions/listen` (2026 era): one stream carrying every member's
/// notifications, acknowledged once. Each member is asked only for the
/// subscribed resources this client may read there; a URI no member lets it
/// read gets the answer a missing resource gets.
pub(super) async fn listen(
    view: &View<'_>,
    ctx: &mut Context,
    message: &Request,
) -> Result<Response, Rejection> {
    let config = &*view.live.config;
    // Decided and forwarded in their canonical form, as every URI is.
    let (subscribed, tools) = match message.ask() {
        Ask::Subscription {
            uris,
            tools_list_changed,
        } => (uris.as_deref(), *tools_list_changed),
        _ => (None, false),
    };
    let uris = crate::proxy::resource::subscribed(subscribed)?;
    // Decided with the stream's facts: the method, the claims, the time, and
    // the labels of the conversation when a condition reads them.
    let session = ctx.flow_key(view.client, "", message);
    let facts = UseFacts::read(
        (ctx.state.as_ref(), config),
        &session,
        Kind::Resource,
        message.method_name(),
        None,
    )
    .await?;
    let decided = |ctx: &Context, part: &Part<'_>, uri: &CanonicalUri| {
        let subject = Subject::Resource(uri.identity());
        judge(
            config,
            ctx,
            view.client,
            part.name(),
            subject,
            &facts.clone().of_uri(uri),
            || format!("Resource not found: {}", uri.as_str()),
        )
    };
    // A URI no member lets the client read is refused: with the refusal a
    // listed one's condition gives, else as a missing one. Observe mode
    // records the refusal and asks every member for every URI, as one
    // server's listen is forwarded whole; so does a member in observe mode
    // of its own while the gateway enforces (its lists show every resource,
    // and it is asked for the URI below).
    let observing = (view.parts.iter()).any(|p| ctx.mode_at(p.server) == Mode::Observe);
    for uri in &uris {
        let each: Vec<_> = view.parts.iter().map(|p| decided(ctx, p, uri)).collect();
        if each.iter().any(Result::is_ok) {
            continue;
        }
        let refused = each.into_iter().filter_map(Result::err);
        let mut refused: Vec<Rejection> = refused.collect();
        let listed = refused.iter().position(|r| matches!(r, Rejection::Use(_)));
        let refusal = match listed {
            Some(i) => refused.swap_remove(i),
            None => Rejection::NotFound(format!("Resource not found: {}", uri.as_str())),
        };
        note_refusal(ctx, &refusal);
        if observing {
            ctx.would_refuse = Some(refusal.code());
            continue;
        }
        ctx.observe_or_enforce(Err::<(), _>(refusal))?;
    }
    let readable = |ctx: &Context, part: &Part<'_>, uri: &CanonicalUri| {
        ctx.mode_at(part.server) == Mode::Observe || decided(ctx, part, uri).is_ok()
    };
    let mut streams = Vec::new();
    let mut first_failure = None;
    for part in &view.parts {
        let mut own = message.clone();
        if !uris.is_empty() {
            let mine: Vec<&str> = uris
                .iter()
                .filter(|u| readable(ctx, part, u))
                .map(|u| u.as_str())
                .collect();
            own.set_uris(&mine);
        }
        let body = Bytes::from(serde_json::to_vec(&own.to_value()).unwrap_or_default());
        let forward = part.forward(ctx, view.client);
        let out = forward.headers(&part.headers(view.headers, None));
        match forward.send(out, body, false).await {
            Ok(Reply::Sse { events, .. }) => {
                let catalog = part.server.catalog.clone();
                let server = part.name().to_owned();
                // Each member's updates are judged by that member, in its
                // mode, before the merge forgets who sent them: the same URI
                // on another member names another resource.
                let events = match ctx.shown(ctx.mode_at(part.server)) {
                    Some(shown) => shown.sent_by(server.clone(), events),
                    None => events,
                };
                // One member's stream breaking (its server died) ends that
                // member's part, not the others': they keep serving.
                let events = events.take_while(move |item| {
                    if let Err(e) = item {
                        tracing::info!(server = %server, error = %e.reason, "a member's subscription stream ended");
                    }
                    std::future::ready(item.is_ok())
                });
                streams.push(Box::pin(events.inspect(move |item| {
                    if let Ok(SseItem::Event(e)) = item
                        && serde_json::from_str(&e.data)
                            .is_ok_and(|m| methods::tool_list_changed(&m))
                    {
                        catalog.invalidate();
                    }
                })));
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
        if serde_json::from_str(&e.data).is_ok_and(|m| {
            methods::named_in(&m) == Some(Rpc::SubscriptionsAcknowledged)
        })) && std::mem::replace(&mut acknowledged, true);
        std::future::ready(!duplicate)
    });
    // Asked for tool list changes: a member's breaker opening or closing is one.
    let turns: Vec<_> = match tools {
        true => (view.parts.iter())
            .map(|p| p.server.upstream.breaker.turns())
            .collect(),
        false => Vec::new(),
    };
    let notice = json!({
        "jsonrpc": "2.0",
        "method": Rpc::ToolsListChanged.name(),
        "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": ctx.id.clone()}},
    });
    let reply = Reply::Sse {
        status: Framing::Message,
        headers: HeaderMap::new(),
        events: Box::pin(with_breaker_turns(
            Box::pin(events),
            turns,
            notice.to_string(),
        )),
    };
    ctx.server = None;
    let mut to = ctx.recipient(first.server);
    // Judged member by member above: the first member's view is not the others'.
    to.shown = None;
    Ok(relay(reply, to))
}

/// `events`, with a `notifications/tools/list_changed` whenever a member's
/// circuit breaker opens or closes (its tools leave the merged list or come
/// back); it ends when `events` ends.
fn with_breaker_turns<S>(
    events: S,
    turns: Vec<tokio::sync::watch::Receiver<u64>>,
    notice: String,
) -> impl futures_util::Stream<Item = S::Item> + Send + 'static
where
    S: futures_util::Stream<Item = Result<SseItem, crate::transport::reply::UpstreamError>>
        + Send
        + Unpin
        + 'static,
{
    let changes = futures_util::stream::select_all(turns.into_iter().map(|rx| {
        Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok().map(|()| ((), rx))
        }))
    }));
    let state = (events, changes, notice);
    futures_util::stream::unfold(state, |(mut events, mut changes, notice)| async move {
        tokio::select! {
            item = events.next() => item.map(|item| (item, (events, changes, notice))),
            Some(()) = changes.next() => {
                let event = crate::mcp::sse::SseEvent::message(notice.clone());
                Some((Ok(SseItem::Event(event)), (events, changes, notice)))
            }
        }
    })
}

/// Sends the client's message to every member, answers ignored.
pub(super) async fn broadcast(view: &View<'_>, ctx: &mut Context, message: &Request, body: Bytes) {
    for part in &view.parts {
        let sent = send_to(view, ctx, part, None, message.clone(), body.clone()).await;
        if let Err(rejection) = sent {
            tracing::info!(server = part.name(), method = %ctx.method, error = rejection.code(), "not delivered to a member server");
        }
    }
    ctx.server = None;
    ctx.mode = view.live.config.gateway.mode;
}
