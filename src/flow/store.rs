//! Where the labels of each session are kept: a [`FlowStore`] trait, the
//! in-memory [`MemoryFlows`] of one replica, and (`[state] backend =
//! "redis"`) the fleet's store in Redis (`super::redis`), with the proxy
//! unchanged between them.
//!
//! Place: held by the gateway's state, outliving any one configuration (a
//! reload keeps what sessions hold). Invariants: bounded in sessions (total
//! and per client) and in marks per session; a new session past a client's
//! quota drops that client's own least recently used one, a full store drops
//! the least recently used session of the client holding the most, so one
//! client's flood never erases another client's labels. A store that cannot
//! answer says so ([`Unavailable`]); it never answers "nothing held".

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;

use futures_util::future::{BoxFuture, FutureExt};

use super::model::{Mark, SessionKey};
use crate::auth::ClientId;
use crate::state::Unavailable;

/// The labels sessions hold.
pub trait FlowStore: Debug + Send + Sync {
    /// What `key`'s session holds, earliest mark first.
    fn held<'a>(&'a self, key: &'a SessionKey) -> BoxFuture<'a, Result<Vec<Mark>, Unavailable>>;
    /// Adds `mark` to the session of each of `keys` (all of one client; a
    /// label already held keeps its first calls, later ones are kept up to
    /// the per-label bound).
    fn record<'a>(
        &'a self,
        keys: &'a [SessionKey],
        mark: &'a Mark,
    ) -> BoxFuture<'a, Result<(), Unavailable>>;
    /// Calls remembered per label within one session (see [`FlowLimits`]).
    fn marks_per_label(&self) -> usize;
    /// Whether every replica of the deployment shares it: its marks are
    /// then stored before a source call is forwarded (see `Recording`).
    fn shared(&self) -> bool {
        false
    }
}

/// The bounds of the in-memory store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowLimits {
    /// Sessions kept in all.
    pub sessions: usize,
    /// Sessions kept per client.
    pub sessions_per_client: usize,
    /// Calls remembered per label within one session (the label itself is
    /// never forgotten while the session is kept).
    pub marks_per_label: usize,
}

impl Default for FlowLimits {
    fn default() -> Self {
        Self {
            sessions: 10_000,
            sessions_per_client: 64,
            marks_per_label: 3,
        }
    }
}

/// The in-memory [`FlowStore`].
#[derive(Debug)]
pub struct MemoryFlows {
    inner: Mutex<Inner>,
    limits: FlowLimits,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<SessionKey, Held>,
    per_client: HashMap<ClientId, usize>,
    clock: u64,
}

#[derive(Debug)]
struct Held {
    marks: Vec<Mark>,
    last_used: u64,
}

impl Inner {
    fn oldest(&self, client: &ClientId) -> Option<SessionKey> {
        self.sessions
            .iter()
            .filter(|(k, _)| k.client == *client)
            .min_by_key(|(_, h)| h.last_used)
            .map(|(k, _)| k.clone())
    }

    fn drop_key(&mut self, key: &SessionKey) {
        if self.sessions.remove(key).is_some()
            && let Some(n) = self.per_client.get_mut(&key.client)
        {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&key.client);
            }
        }
    }
}

impl FlowLimits {
    /// At least one of each, and no more sessions per client than in all
    /// (every store applies the limits so).
    pub fn normalised(self) -> Self {
        Self {
            sessions: self.sessions.max(1),
            sessions_per_client: self.sessions_per_client.clamp(1, self.sessions.max(1)),
            marks_per_label: self.marks_per_label.max(1),
        }
    }
}

impl MemoryFlows {
    pub fn new(limits: FlowLimits) -> Self {
        let limits = limits.normalised();
        Self {
            inner: Mutex::new(Inner::default()),
            limits,
        }
    }

    /// Sessions kept.
    pub fn len(&self) -> usize {
        self.lock().sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for MemoryFlows {
    fn default() -> Self {
        Self::new(FlowLimits::default())
    }
}

impl FlowStore for MemoryFlows {
    fn marks_per_label(&self) -> usize {
        self.limits.marks_per_label
    }

    fn held<'a>(&'a self, key: &'a SessionKey) -> BoxFuture<'a, Result<Vec<Mark>, Unavailable>> {
        let held = MemoryFlows::held(self, key);
        async move { Ok(held) }.boxed()
    }

    fn record<'a>(
        &'a self,
        keys: &'a [SessionKey],
        mark: &'a Mark,
    ) -> BoxFuture<'a, Result<(), Unavailable>> {
        for key in keys {
            MemoryFlows::record(self, key, mark.clone());
        }
        async { Ok(()) }.boxed()
    }
}

impl MemoryFlows {
    /// What `key`'s session holds, earliest mark first (at once).
    pub fn held(&self, key: &SessionKey) -> Vec<Mark> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        match inner.sessions.get_mut(key) {
            Some(held) => {
                held.last_used = now;
                held.marks.clone()
            }
            None => Vec::new(),
        }
    }

    /// Adds `mark` to `key`'s session (at once).
    pub fn record(&self, key: &SessionKey, mark: Mark) {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        if let Some(held) = inner.sessions.get_mut(key) {
            held.last_used = now;
            let same = held.marks.iter().filter(|m| m.label == mark.label);
            let known = same.clone().any(|m| *m == mark);
            if !known && same.count() < self.limits.marks_per_label {
                held.marks.push(mark);
            }
            return;
        }
        let client = &key.client;
        if inner.per_client.get(client).copied().unwrap_or(0) >= self.limits.sessions_per_client {
            if let Some(k) = inner.oldest(client) {
                inner.drop_key(&k);
            }
        } else if inner.sessions.len() >= self.limits.sessions {
            let most = inner
                .per_client
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(c, _)| c.clone());
            if let Some(k) = most.and_then(|c| inner.oldest(&c)) {
                inner.drop_key(&k);
            }
        }
        *inner.per_client.entry(client.clone()).or_default() += 1;
        inner.sessions.insert(
            key.clone(),
            Held {
                marks: vec![mark],
                last_used: now,
            },
        );
    }
}
