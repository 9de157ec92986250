//! Open streams — handshake-era GET streams and 2026-era
//! `subscriptions/listen` — each held for one client on one server, so that
//! revoking the client's access there ends them.
//!
//! Place in the path: around the response body of a stream, once the
//! pipeline has decided to relay it; a reload ([`crate::reload`]) asks
//! [`Streams::revoke`] to end the streams the new configuration no longer
//! grants.
//!
//! Invariants: a held stream is in the table exactly as long as its body is
//! alive (the registration leaves with the body, however it ends); a revoked
//! stream ends at the next chunk boundary and its upstream request is dropped
//! with it; nothing here waits on a lock for longer than one map operation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt;
use tokio::sync::oneshot;

use crate::auth::ClientId;

/// The streams open now.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    open: Mutex<HashMap<u64, Open>>,
    next: AtomicU64,
}

#[derive(Debug)]
struct Open {
    client: ClientId,
    server: String,
    /// Dropping it ends the stream.
    _stop: oneshot::Sender<()>,
}

/// Removes a stream from the table when its body goes.
struct Registration {
    streams: Weak<Streams>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(streams) = self.streams.upgrade() {
            streams.lock().remove(&self.id);
        }
    }
}

impl Streams {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Open>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `response` with a body that ends when the stream of `client` on
    /// `server` is revoked.
    pub(crate) fn hold(
        self: &Arc<Self>,
        client: &ClientId,
        server: &str,
        response: Response,
    ) -> Response {
        let (stop, stopped) = oneshot::channel();
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            Open {
                client: client.clone(),
                server: server.to_owned(),
                _stop: stop,
            },
        );
        let registration = Registration {
            streams: Arc::downgrade(self),
            id,
        };
        let (parts, body) = response.into_parts();
        // A sent or a dropped stop (revoked) both end the body.
        let chunks = body
            .into_data_stream()
            .take_until(stopped)
            .map(move |chunk| {
                let _held = &registration;
                chunk
            });
        Response::from_parts(parts, Body::from_stream(chunks))
    }

    /// Ends every open stream whose client `revoked` says has lost its server;
    /// returns how many ended.
    pub(crate) fn revoke(&self, revoked: impl Fn(&ClientId, &str) -> bool) -> usize {
        let mut open = self.lock();
        let before = open.len();
        open.retain(|_, o| !revoked(&o.client, &o.server));
        before - open.len()
    }

    /// Streams open now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::BodyExt;

    use super::*;

    fn endless() -> Response {
        let chunks = futures_util::stream::unfold(0u64, |n| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Some((
                Ok::<_, std::io::Error>(bytes::Bytes::from(format!("{n}\n"))),
                n + 1,
            ))
        });
        Response::new(Body::from_stream(chunks))
    }

    #[tokio::test]
    async fn a_revoked_stream_ends_and_others_go_on() {
        let streams = Arc::new(Streams::default());
        let (alice, bob) = (ClientId::named("alice"), ClientId::named("bob"));
        let mut a = streams.hold(&alice, "s", endless()).into_body();
        let mut b = streams.hold(&bob, "s", endless()).into_body();
        let mut other = streams.hold(&alice, "t", endless()).into_body();
        assert!(a.frame().await.is_some());
        assert_eq!(streams.len(), 3);
        assert_eq!(streams.revoke(|c, s| c.name() == "alice" && s == "s"), 1);
        // Bounded: the revoked body ends within a few chunks.
        let mut ended = false;
        for _ in 0..10 {
            if a.frame().await.is_none() {
                ended = true;
                break;
            }
        }
        assert!(ended, "the revoked stream ended");
        assert!(b.frame().await.is_some());
        assert!(other.frame().await.is_some());
        drop(b);
        assert_eq!(streams.len(), 1, "a body that goes leaves the table");
    }
}
