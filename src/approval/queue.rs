//! The operator's queue: calls waiting for an operator's yes or no.
//!
//! Place in the path: the approval gate adds a call here when a rule says an
//! operator approves it; the dashboard and the admin API list the queue and
//! decide; the gate (a held call, or the same call made again) uses the
//! decision.
//!
//! Invariants: in memory only (a restart forgets the queue: a held call ends
//! with the connection, a retried one is asked for anew; a fleet shares its
//! queue through [`super::fleet`] instead); an entry names one
//! [`Binding`] and is used at most once (taken out of the queue when used);
//! an expired entry can no longer be approved nor used; the queue holds at
//! most `max` entries and a client at most `max_per_client`, past which that
//! client's new calls are refused (nothing already queued is dropped).

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::watch;

use super::binding::Binding;

/// Where an entry stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Waiting for an operator.
    Pending,
    /// Approved by `by`; not used yet.
    Approved { by: String, at_ms: i64 },
    /// Denied by `by`.
    Denied { by: String, at_ms: i64 },
}

/// One queued call, as the dashboard and the admin API show it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The approval id (`apr_` and 32 hex digits).
    pub id: String,
    pub binding: Binding,
    /// The arguments as an operator sees them ([`super::render::arguments`]:
    /// escaped, whole, secrets withheld).
    pub shown: String,
    /// The rule's reason.
    pub reason: Option<String>,
    /// The rule, `rules[N]`.
    pub rule: usize,
    pub created_ms: i64,
    pub expires_ms: i64,
    pub status: Status,
    /// The replica that queued it (and holds the call, when it is held).
    pub replica: String,
}

impl Entry {
    /// As JSON for the admin API and the dashboard.
    pub fn to_json(&self) -> Value {
        let (status, by, at) = match &self.status {
            Status::Pending => ("pending", None, None),
            Status::Approved { by, at_ms } => ("approved", Some(by.clone()), Some(*at_ms)),
            Status::Denied { by, at_ms } => ("denied", Some(by.clone()), Some(*at_ms)),
        };
        serde_json::json!({
            "id": self.id,
            "client": self.binding.client,
            "server": self.binding.server,
            "tool": self.binding.tool,
            "tool_shown": super::render::line(&self.binding.tool),
            "digest": self.binding.digest_hex(),
            "arguments": self.shown,
            "reason": self.reason.as_deref().map(super::render::line),
            "rule": format!("rules[{}]", self.rule),
            "created_ms": self.created_ms,
            "expires_ms": self.expires_ms,
            "status": status,
            "decided_by": by,
            "decided_ms": at,
            "replica": self.replica,
        })
    }
}

/// What the queue has for a call.
#[derive(Debug)]
pub enum Lookup {
    /// An operator approved exactly this call: it is taken out, used now.
    Approved(Entry),
    /// An operator denied it: taken out; the refusal is the answer.
    Denied(Entry),
    /// Already waiting.
    Pending(Entry, watch::Receiver<Status>),
    /// Queued now.
    Added(Entry, watch::Receiver<Status>),
}

/// Why nothing was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// `max_pending` entries are queued.
    Queue(usize),
    /// This client has `max_pending_per_client`.
    Client(usize),
}

/// Why an operator's decision was not taken.
#[derive(Debug, Clone)]
pub enum DecideError {
    /// No such id (or it expired, or was used).
    Unknown,
    /// It was decided already.
    Decided(Box<Entry>),
    /// The shared store (`redis`) did not answer: nothing was decided.
    Unavailable { store: &'static str },
}

struct Slot {
    entry: Entry,
    tx: watch::Sender<Status>,
}

/// The queue.
pub struct Queue {
    slots: Mutex<HashMap<String, Slot>>,
    max: usize,
    max_per_client: usize,
    /// This replica's name, on every entry it queues.
    replica: String,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("max", &self.max).finish()
    }
}

/// A new approval id.
pub fn new_id() -> String {
    format!("apr_{}", hex::encode(rand::random::<[u8; 16]>()))
}

impl Queue {
    pub fn new(max: usize, max_per_client: usize) -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            max,
            max_per_client,
            replica: String::new(),
        }
    }

    /// The queue of replica `replica`.
    pub fn on_replica(mut self, replica: &str) -> Self {
        self.replica = replica.to_owned();
        self
    }

    /// This replica's name.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes out every expired entry and returns them (each is an expiry).
    pub fn sweep(&self, now_ms: i64) -> Vec<Entry> {
        let mut slots = self.lock();
        let expired: Vec<String> = slots
            .iter()
            .filter(|(_, s)| s.entry.expires_ms <= now_ms)
            .map(|(id, _)| id.clone())
            .collect();
        expired
            .into_iter()
            .filter_map(|id| slots.remove(&id).map(|s| s.entry))
            .collect()
    }

    /// The entry of this exact call (used, if decided), or a new one.
    #[allow(clippy::too_many_arguments)]
    pub fn lookup_or_add(
        &self,
        binding: &Binding,
        shown: String,
        reason: Option<String>,
        rule: usize,
        now_ms: i64,
        expires_ms: i64,
    ) -> Result<Lookup, Full> {
        let mut slots = self.lock();
        let found = slots
            .iter()
            .find(|(_, s)| s.entry.binding == *binding && s.entry.expires_ms > now_ms)
            .map(|(id, s)| (id.clone(), s.entry.status.clone()));
        if let Some((id, status)) = found {
            return Ok(match status {
                Status::Approved { .. } => {
                    Lookup::Approved(slots.remove(&id).map(|s| s.entry).expect("found"))
                }
                Status::Denied { .. } => {
                    Lookup::Denied(slots.remove(&id).map(|s| s.entry).expect("found"))
                }
                Status::Pending => {
                    let slot = &slots[&id];
                    Lookup::Pending(slot.entry.clone(), slot.tx.subscribe())
                }
            });
        }
        let live = |s: &&Slot| s.entry.expires_ms > now_ms;
        if slots.values().filter(live).count() >= self.max {
            return Err(Full::Queue(self.max));
        }
        let mine = slots
            .values()
            .filter(live)
            .filter(|s| s.entry.binding.client == binding.client)
            .count();
        if mine >= self.max_per_client {
            return Err(Full::Client(self.max_per_client));
        }
        let entry = Entry {
            id: new_id(),
            binding: binding.clone(),
            shown,
            reason,
            rule,
            created_ms: now_ms,
            expires_ms,
            status: Status::Pending,
            replica: self.replica.clone(),
        };
        let (tx, rx) = watch::channel(Status::Pending);
        slots.insert(
            entry.id.clone(),
            Slot {
                entry: entry.clone(),
                tx,
            },
        );
        Ok(Lookup::Added(entry, rx))
    }

    /// An operator's decision on a pending entry.
    pub fn decide(
        &self,
        id: &str,
        approve: bool,
        by: &str,
        now_ms: i64,
    ) -> Result<Entry, DecideError> {
        let mut slots = self.lock();
        let slot = slots
            .get_mut(id)
            .filter(|s| s.entry.expires_ms > now_ms)
            .ok_or(DecideError::Unknown)?;
        if slot.entry.status != Status::Pending {
            return Err(DecideError::Decided(Box::new(slot.entry.clone())));
        }
        let by = by.to_owned();
        slot.entry.status = if approve {
            Status::Approved { by, at_ms: now_ms }
        } else {
            Status::Denied { by, at_ms: now_ms }
        };
        // A held call wakes; a dropped one no longer listens (it may be retried).
        let _ = slot.tx.send(slot.entry.status.clone());
        Ok(slot.entry.clone())
    }

    /// A held call takes the decision on its own entry: approved or denied,
    /// the entry leaves the queue (one use); `None` when it is gone (used by
    /// an identical call first, or expired) or still pending.
    pub fn take(&self, id: &str, now_ms: i64) -> Option<Entry> {
        let mut slots = self.lock();
        let slot = slots.get(id)?;
        if slot.entry.status == Status::Pending || slot.entry.expires_ms <= now_ms {
            return None;
        }
        slots.remove(id).map(|s| s.entry)
    }

    /// Takes a still-pending entry out (its held call timed out): it can no
    /// longer be approved nor used.
    pub fn expire(&self, id: &str) -> Option<Entry> {
        let mut slots = self.lock();
        match slots.get(id) {
            Some(slot) if slot.entry.status == Status::Pending => slots.remove(id).map(|s| s.entry),
            _ => None,
        }
    }

    /// Whether `id` names a live entry of `client` (an id another client
    /// names is answered like an unknown one).
    pub fn owned_by(&self, id: &str, client: &str, now_ms: i64) -> Option<Entry> {
        self.lock()
            .get(id)
            .filter(|s| s.entry.binding.client == client && s.entry.expires_ms > now_ms)
            .map(|s| s.entry.clone())
    }

    /// Every live entry, oldest first.
    pub fn list(&self, now_ms: i64) -> Vec<Entry> {
        let mut out: Vec<Entry> = self
            .lock()
            .values()
            .filter(|s| s.entry.expires_ms > now_ms)
            .map(|s| s.entry.clone())
            .collect();
        out.sort_by_key(|e| (e.created_ms, e.id.clone()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn binding(client: &str, path: &str) -> Binding {
        Binding::new(client, "files", "delete_file", &json!({"path": path}))
    }

    fn add(q: &Queue, b: &Binding, now: i64) -> Result<Lookup, Full> {
        q.lookup_or_add(b, "{}".into(), None, 0, now, now + 100)
    }

    #[test]
    fn an_approval_is_used_once_for_its_own_call() {
        let q = Queue::new(10, 10);
        let a = binding("alice", "/tmp/x");
        let Ok(Lookup::Added(entry, _)) = add(&q, &a, 0) else {
            panic!("added")
        };
        assert!(matches!(add(&q, &a, 1), Ok(Lookup::Pending(..))));
        // Other arguments: a new entry.
        assert!(matches!(
            add(&q, &binding("alice", "/"), 1),
            Ok(Lookup::Added(..))
        ));
        q.decide(&entry.id, true, "op", 2).expect("decided");
        assert!(matches!(
            q.decide(&entry.id, false, "op", 3),
            Err(DecideError::Decided(_))
        ));
        assert!(matches!(add(&q, &a, 3), Ok(Lookup::Approved(_))));
        // Used: the same call again is a new question.
        assert!(matches!(add(&q, &a, 4), Ok(Lookup::Added(..))));
        assert!(q.owned_by(&entry.id, "alice", 4).is_none());
    }

    #[test]
    fn expired_entries_cannot_be_approved_and_limits_refuse_new_ones() {
        let q = Queue::new(2, 1);
        let Ok(Lookup::Added(entry, _)) = add(&q, &binding("alice", "a"), 0) else {
            panic!()
        };
        assert_eq!(
            add(&q, &binding("alice", "b"), 0).unwrap_err(),
            Full::Client(1)
        );
        assert!(matches!(
            add(&q, &binding("bob", "b"), 0),
            Ok(Lookup::Added(..))
        ));
        assert_eq!(
            add(&q, &binding("carol", "c"), 0).unwrap_err(),
            Full::Queue(2)
        );
        assert!(matches!(
            q.decide(&entry.id, true, "op", 100),
            Err(DecideError::Unknown)
        ));
        assert_eq!(q.sweep(100).len(), 2);
        assert!(q.list(100).is_empty());
        assert!(q.owned_by(&entry.id, "bob", 0).is_none());
    }
}
