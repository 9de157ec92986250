//! Where finished events go: the [`Sink`] trait, and the fan-out the app
//! wires at start (spans end in the trail; then metrics, the dashboard's live
//! ring and the audit store, in that order).
//!
//! Place: the record layer, below every sink (they implement the trait) and
//! below the trail (it calls [`Sinks::record`]). Invariants: a sink never
//! blocks the request that lets its trail go (it counts, copies into a
//! bounded ring, or queues with `try_send`); every sink sees the same event,
//! shared, never copied per sink.

use std::sync::Arc;

use super::event::Event;

/// One consumer of finished events.
pub trait Sink: Send + Sync + std::fmt::Debug {
    /// Takes note of one finished, bounded event; must not block.
    fn record(&self, event: &Arc<Event>);
}

/// The sinks of a gateway, in the order they see each event.
#[derive(Debug, Default, Clone)]
pub struct Sinks(Vec<Arc<dyn Sink>>);

impl Sinks {
    /// The fan-out over `sinks`, in this order.
    pub fn new(sinks: Vec<Arc<dyn Sink>>) -> Self {
        Self(sinks)
    }

    /// Hands `event` to every sink.
    pub fn record(&self, event: Event) {
        let event = Arc::new(event);
        for sink in &self.0 {
            sink.record(&event);
        }
    }
}
