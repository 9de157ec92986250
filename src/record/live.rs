//! The dashboard's live view of the trail: a ring of the latest events, from
//! which the overview is computed, and a broadcast channel that the live feed
//! (server-sent events) follows.
//!
//! Place: a sink of the record layer; the admin layer reads it. Invariants:
//! memory is bounded (the ring holds [`KEEP`] events; a slow feed reader
//! skips events rather than holding them); a push holds one short lock.
//! The ring keeps the events as they were recorded (shared with the other
//! sinks, not copied) and turns them into JSON only when the dashboard
//! reads them: a request pays for no JSON tree it will never show. The
//! live feed gets JSON only while someone follows it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::broadcast;

use super::event::Event;
use super::sink::Sink;

/// Events kept for the dashboard.
pub const KEEP: usize = 2000;
/// The latest events, and the live feed.
#[derive(Debug)]
pub(crate) struct Recent {
    next: AtomicU64,
    /// Each event with its id, as recorded.
    ring: Mutex<VecDeque<(u64, Arc<Event>)>>,
    pub(crate) feed: broadcast::Sender<Arc<Value>>,
    /// Set at shutdown: open feeds end, so they do not hold the drain up.
    pub(crate) closed: tokio::sync::watch::Sender<bool>,
}

impl Default for Recent {
    fn default() -> Self {
        Self {
            next: AtomicU64::new(1),
            ring: Mutex::new(VecDeque::with_capacity(KEEP)),
            feed: broadcast::channel(1024).0,
            closed: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl Recent {
    /// Keeps `event` (with an id) and sends it, as JSON, to the live feed
    /// when anyone follows it.
    pub(crate) fn push(&self, event: &Arc<Event>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            if ring.len() == KEEP {
                ring.pop_front();
            }
            ring.push_back((id, event.clone()));
        }
        // A receiver only sees what is sent after it subscribed: with none,
        // nothing is lost by not sending.
        if self.feed.receiver_count() > 0 {
            let _ = self.feed.send(Arc::new(shown(id, event)));
        }
    }

    /// Ends every open feed (shutdown).
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    /// The events in the ring, oldest first, as JSON with their ids.
    pub(crate) fn snapshot(&self) -> Vec<Arc<Value>> {
        // Copied out under the lock (reference counts only), converted after it.
        let kept: Vec<(u64, Arc<Event>)> = {
            let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            ring.iter().cloned().collect()
        };
        kept.iter()
            .map(|(id, event)| Arc::new(shown(*id, event)))
            .collect()
    }
}

/// An event as the dashboard shows it: its JSON, with its `id` in the ring.
fn shown(id: u64, event: &Event) -> Value {
    let mut value = serde_json::to_value(event).unwrap_or(Value::Null);
    value["id"] = id.into();
    value
}

impl Sink for Recent {
    fn record(&self, event: &Arc<Event>) {
        self.push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(method: &str) -> Arc<Event> {
        Arc::new(Event {
            method: method.into(),
            time_ms: 7,
            ..Default::default()
        })
    }

    /// The ring shows each event as its JSON with its id, as when the JSON
    /// was made at push; the feed carries the same to whoever follows it,
    /// and only what is pushed after it subscribed.
    #[tokio::test]
    async fn events_are_shown_as_their_json_with_their_ids() {
        let recent = Recent::default();
        recent.push(&event("tools/list"));
        let mut rx = recent.feed.subscribe();
        recent.push(&event("tools/call"));
        let shown = recent.snapshot();
        assert_eq!(shown.len(), 2);
        for (i, method) in ["tools/list", "tools/call"].into_iter().enumerate() {
            let mut expected = serde_json::to_value(&*event(method)).expect("an event serialises");
            expected["id"] = (i as u64 + 1).into();
            assert_eq!(*shown[i], expected);
        }
        assert_eq!(rx.recv().await.expect("the feed's event"), shown[1]);
        assert!(rx.try_recv().is_err(), "nothing pushed before subscribing");
    }

    #[test]
    fn the_ring_is_bounded() {
        let recent = Recent::default();
        for _ in 0..KEEP + 3 {
            recent.push(&event("ping"));
        }
        let shown = recent.snapshot();
        assert_eq!(shown.len(), KEEP);
        assert_eq!(shown[0]["id"], 4);
    }
}
