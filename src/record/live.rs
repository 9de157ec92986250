//! The dashboard's live view of the trail: a ring of the latest events, from
//! which the overview is computed, and a broadcast channel that the live feed
//! (server-sent events) follows.
//!
//! Place: a sink of the record layer; the admin layer reads it. Invariants:
//! memory is bounded (the ring holds [`KEEP`] events; a slow feed reader
//! skips events rather than holding them); a push holds one short lock.

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
    ring: Mutex<VecDeque<Arc<Value>>>,
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
    /// Keeps `event` (as JSON, with an id) and sends it to the live feed.
    pub(crate) fn push(&self, event: &Event) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut value = serde_json::to_value(event).unwrap_or(Value::Null);
        value["id"] = id.into();
        let value = Arc::new(value);
        {
            let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            if ring.len() == KEEP {
                ring.pop_front();
            }
            ring.push_back(value.clone());
        }
        let _ = self.feed.send(value);
    }

    /// Ends every open feed (shutdown).
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    /// The events in the ring, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<Arc<Value>> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.iter().cloned().collect()
    }
}

impl Sink for Recent {
    fn record(&self, event: &Arc<Event>) {
        self.push(event);
    }
}
