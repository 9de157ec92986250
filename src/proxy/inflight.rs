//! The tool calls of each server under way, so that a client's
//! `notifications/cancelled` reaches the call it names: the call stops
//! being sent again ([`super::deadline`], the retries of
//! [`super::forward`]).
//!
//! Place: one table per upstream ([`super::upstream::Upstream`]); a call
//! enters it when it is sent and leaves when its sending is over.
//!
//! Invariants: a call is keyed by the client, its session and its id, so
//! one client cannot cancel another's call; an entry leaves the table with
//! its call, however the call ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::Notify;

/// The tool calls of one server under way, by the key of who sent them
/// ([`key`]): a client's `notifications/cancelled` wakes its call.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    calls: Mutex<HashMap<String, Arc<Notify>>>,
}

/// A call's place in [`InFlight`], left when it is dropped.
pub(crate) struct Entry<'a> {
    table: &'a InFlight,
    key: String,
    /// Woken when the client cancels the call.
    pub(crate) cancelled: Arc<Notify>,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        let mut calls = self.table.lock();
        if calls
            .get(&self.key)
            .is_some_and(|n| Arc::ptr_eq(n, &self.cancelled))
        {
            calls.remove(&self.key);
        }
    }
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes the call `key` until the entry is dropped.
    pub(crate) fn enter(&self, key: String) -> Entry<'_> {
        let cancelled = Arc::new(Notify::new());
        self.lock().insert(key.clone(), cancelled.clone());
        Entry {
            table: self,
            key,
            cancelled,
        }
    }

    /// The client cancelled the call `key`: it stops (no retry, no wait).
    pub(crate) fn cancel(&self, key: &str) {
        if let Some(n) = self.lock().get(key) {
            n.notify_one();
        }
    }
}

/// Who sent a call, and its id: the client, its session (if any) and the
/// JSON text of the id, so one client cannot cancel another's call.
pub(crate) fn key(client: &str, session: Option<&str>, id: &Value) -> String {
    format!("{client}\n{}\n{id}", session.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn a_cancel_reaches_only_the_call_of_that_client_and_session() {
        let table = InFlight::default();
        let mine = table.enter(key("alice", Some("s1"), &json!(1)));
        table.cancel(&key("bob", Some("s1"), &json!(1)));
        table.cancel(&key("alice", Some("s2"), &json!(1)));
        table.cancel(&key("alice", Some("s1"), &json!("1")));
        let woken = mine.cancelled.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let early = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(20), woken.notified()).await
        });
        assert!(early.is_err(), "no other key wakes it");
        table.cancel(&key("alice", Some("s1"), &json!(1)));
        let now = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), woken.notified()).await
        });
        assert!(now.is_ok());
        drop(mine);
        assert!(table.lock().is_empty());
    }
}
