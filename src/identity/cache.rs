//! Tokens the gateway obtained for upstreams, kept until shortly before they
//! expire: exchanged tokens per (client, server, scopes, subject token),
//! service tokens per (server, scopes), reused assertions per (client, server).
//!
//! Place: inside each server's [`super::Broker`]; a hit spares a round trip
//! to the authorization server (or a signature).
//!
//! Invariants:
//! - a token is handed out only for exactly the key it was stored under: the
//!   client's name, the server, the scopes and the digest of the subject
//!   token that earned it are all part of the key, so a token obtained for
//!   one client is never handed to another, nor for a token it was not
//!   exchanged from;
//! - an entry is never handed out at or after its `until`, which the broker
//!   sets no later than the token's own expiry less a margin, the subject
//!   token's expiry, and the reuse bound;
//! - bounded overall and per client: a client at its bound replaces its own
//!   soonest-expiring entry; a full cache takes an entry from the client
//!   holding the most, so a client never pushes out another's entries while
//!   it holds fewer than they do.
//!
//! Time is passed in (milliseconds on any monotonic scale), so the property
//! test drives interleavings and expiries without a clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What an entry is stored under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    /// The client's name (`""` for a service token, shared by every client).
    pub(crate) client: Arc<str>,
    pub(crate) server: Arc<str>,
    /// The scopes asked for, in configuration order, space-joined.
    pub(crate) scopes: Arc<str>,
    /// SHA-256 of the subject token (zeros when there is none).
    pub(crate) subject: [u8; 32],
}

#[derive(Debug)]
struct Entry {
    value: Arc<str>,
    until: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<CacheKey, Entry>,
    per_client: HashMap<Arc<str>, usize>,
}

/// A bounded token cache.
#[derive(Debug)]
pub(crate) struct TokenCache {
    inner: Mutex<Inner>,
    max: usize,
    max_per_client: usize,
}

impl TokenCache {
    /// A cache of at most `max` entries, `max_per_client` of one client.
    pub(crate) fn new(max: usize, max_per_client: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            max: max.max(1),
            max_per_client: max_per_client.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Each statement under the lock leaves the maps consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The token stored under `key`, while `now < until`.
    pub(crate) fn get(&self, key: &CacheKey, now: u64) -> Option<Arc<str>> {
        let mut inner = self.lock();
        match inner.entries.get(key) {
            Some(e) if now < e.until => Some(e.value.clone()),
            Some(_) => {
                inner.remove(key);
                None
            }
            None => None,
        }
    }

    /// Stores `value` under `key` until `until` (nothing when that is past).
    pub(crate) fn put(&self, key: CacheKey, value: Arc<str>, until: u64, now: u64) {
        if until <= now {
            return;
        }
        let mut inner = self.lock();
        inner.remove(&key);
        if inner.count(&key.client) >= self.max_per_client {
            inner.purge_expired(now);
        }
        if inner.count(&key.client) >= self.max_per_client {
            let client = key.client.clone();
            inner.evict_soonest(|k| k.client == client);
        }
        if inner.entries.len() >= self.max {
            inner.purge_expired(now);
        }
        if inner.entries.len() >= self.max {
            // The client holding the most loses its soonest-expiring entry.
            let busiest = inner
                .per_client
                .iter()
                .max_by_key(|(c, n)| (**n, **c == key.client))
                .map(|(c, _)| c.clone());
            if let Some(busiest) = busiest {
                inner.evict_soonest(|k| k.client == busiest);
            }
        }
        *inner.per_client.entry(key.client.clone()).or_default() += 1;
        inner.entries.insert(key, Entry { value, until });
    }

    /// Entries held now (expired ones included until they are swept).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Entries `client` holds now.
    #[cfg(test)]
    pub(crate) fn held_by(&self, client: &str) -> usize {
        self.lock().per_client.get(client).copied().unwrap_or(0)
    }
}

impl Inner {
    fn count(&self, client: &str) -> usize {
        self.per_client.get(client).copied().unwrap_or(0)
    }

    fn remove(&mut self, key: &CacheKey) {
        if self.entries.remove(key).is_some()
            && let Some(n) = self.per_client.get_mut(&key.client)
        {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&key.client);
            }
        }
    }

    fn purge_expired(&mut self, now: u64) {
        let expired: Vec<CacheKey> = self
            .entries
            .iter()
            .filter(|(_, e)| e.until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.remove(&key);
        }
    }

    fn evict_soonest(&mut self, mut whose: impl FnMut(&CacheKey) -> bool) {
        let soonest = self
            .entries
            .iter()
            .filter(|(k, _)| whose(k))
            .min_by_key(|(_, e)| e.until)
            .map(|(k, _)| k.clone());
        if let Some(key) = soonest {
            self.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests;
