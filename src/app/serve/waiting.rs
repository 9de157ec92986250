//! Connections still waiting for their first request's head, oldest first.
//!
//! Place: beside the accept loop. A connection enters when it is accepted
//! and leaves when its head is in (it is served), when it fails or times
//! out, or when it is evicted.
//!
//! Invariants: at the cap, a new connection takes the slot of the oldest
//! connection still waiting, which is closed; a connection that has sent its
//! head is never evicted. So connections that never finish their headers
//! cannot lock other clients out: a client that sends its request at once
//! is served unless `max_connections` newer connections arrived before its
//! head did. A slot is held by exactly one connection at a time: whoever
//! takes an entry out of the table (the connection claiming it, or the
//! accept loop evicting it) owns its slot.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// The connections waiting for their first head, each with its slot `S`.
#[derive(Debug)]
pub(super) struct Waiting<S> {
    table: Mutex<Table<S>>,
}

#[derive(Debug)]
struct Table<S> {
    next: u64,
    /// By arrival: the first is the oldest.
    by_age: BTreeMap<u64, Entry<S>>,
}

#[derive(Debug)]
struct Entry<S> {
    open: S,
    /// Dropped to tell the connection it was evicted.
    _evict: oneshot::Sender<()>,
}

/// A connection's place in the table; leaving it (dropped) frees the slot
/// unless the connection claimed it or was evicted.
#[derive(Debug)]
pub(super) struct Ticket<S> {
    id: u64,
    waiting: Arc<Waiting<S>>,
}

impl<S> Default for Waiting<S> {
    fn default() -> Self {
        Self {
            table: Mutex::new(Table {
                next: 0,
                by_age: BTreeMap::new(),
            }),
        }
    }
}

impl<S> Waiting<S> {
    fn table(&self) -> std::sync::MutexGuard<'_, Table<S>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enters a new connection holding `open`; the receiver resolves when
    /// it is evicted.
    pub(super) fn enter(self: &Arc<Self>, open: S) -> (Ticket<S>, oneshot::Receiver<()>) {
        let (evict, evicted) = oneshot::channel();
        let mut table = self.table();
        let id = table.next;
        table.next += 1;
        table.by_age.insert(
            id,
            Entry {
                open,
                _evict: evict,
            },
        );
        let ticket = Ticket {
            id,
            waiting: self.clone(),
        };
        (ticket, evicted)
    }

    /// Evicts the oldest waiting connection; its slot, if there was one.
    pub(super) fn evict_oldest(&self) -> Option<S> {
        self.table().by_age.pop_first().map(|(_, entry)| entry.open)
    }
}

impl<S> Ticket<S> {
    /// The connection's head is in: its slot, unless it was evicted meanwhile.
    pub(super) fn claim(self) -> Option<S> {
        self.waiting
            .table()
            .by_age
            .remove(&self.id)
            .map(|entry| entry.open)
    }
}

impl<S> Drop for Ticket<S> {
    fn drop(&mut self) {
        let entry = self.waiting.table().by_age.remove(&self.id);
        // The slot is freed outside the lock.
        drop(entry);
    }
}
