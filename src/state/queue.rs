//! The fleet's operator approval queue and pin approvals in the shared
//! store: what lets an operator answer, from any replica, a call held on
//! another, and a pin approved on one replica hold on all.
//!
//! Place in the path: beneath the approval gate and the admin API (through
//! `crate::approval`), which keep the entries' meaning; this module only
//! stores opaque, bounded JSON texts under the deployment's keys. Only
//! called with a shared store ([`SharedState::is_shared`]); the memory store
//! answers as an empty one.
//!
//! Invariants: an entry's key and its decision's key expire with the hold's
//! deadline (their TTL); an entry is at most [`MAX_ENTRY_BYTES`] (a larger
//! one is not written); the queue holds at most the configured bounds, of
//! the fleet and of one client (`queue_add.lua`, atomic); a decision is set
//! once, if absent, while its entry lives (`queue_decide.lua`), and handed to
//! exactly one taker, who takes the entry out with it (`queue_settle.lua`);
//! pin approvals are one hash of at most [`MAX_PIN_APPROVALS`] fields, kept
//! [`PIN_APPROVALS_TTL`] after its last write.

use std::time::Duration;

#[cfg(feature = "redis-ratelimit")]
use super::{Backend, Kind, key};
use super::{SharedState, Unavailable};

/// Longest queued entry written (the call as an operator sees it).
pub const MAX_ENTRY_BYTES: usize = 256 * 1024;
/// Most pins with a fleet approval.
pub const MAX_PIN_APPROVALS: usize = 10_000;
/// How long the fleet's pin approvals are kept after the last one (every
/// replica also keeps the approvals it applied in its own pin store).
pub const PIN_APPROVALS_TTL: Duration = Duration::from_secs(90 * 24 * 3600);

/// What queueing a call found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Queued {
    /// Queued now under the id given.
    Added,
    /// The same call is queued already: its id, entry and decision (if any).
    Found {
        id: String,
        entry: String,
        decision: Option<String>,
    },
    /// The fleet holds its bound of queued calls.
    Full,
    /// This client holds its bound, fleet-wide.
    ClientFull,
}

/// What an operator's decision did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// No such entry (never queued, expired or used).
    Unknown,
    /// This decision is the one; the entry.
    Now(String),
    /// Decided already: the entry and the decision taken.
    Already(String, String),
}

/// What taking a decision found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The decision, taken by this caller only; the entry has left the queue.
    Decided(String),
    /// Still waiting.
    Pending,
    /// Closed undecided (the holder gave up): taken out as expired.
    Expired,
    /// Gone (taken by another caller, or expired in the store).
    Gone,
}

/// The ids of one queued call: its approval id, the key of the call (a
/// digest of client, server, tool and arguments) and its client.
#[derive(Debug, Clone, Copy)]
pub struct QueueIds<'a> {
    pub id: &'a str,
    pub call: &'a str,
    pub client: &'a str,
}

impl SharedState {
    /// Queues `entry` under `ids` until `expires_ms`, unless the same call is
    /// queued already; within `limits` (fleet, client).
    pub async fn queue_add(
        &self,
        ids: QueueIds<'_>,
        entry: &str,
        (now_ms, expires_ms): (i64, i64),
        limits: (usize, usize),
    ) -> Result<Queued, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (ids, entry, now_ms, expires_ms, limits);
        match &self.backend {
            super::Backend::Memory => Ok(Queued::Full),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(_) if entry.len() > MAX_ENTRY_BYTES => Ok(Queued::Full),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let keys = [
                    self.call_key(ids.call),
                    key(&self.namespace, Kind::Approvals, "all"),
                    self.client_key(ids.client),
                    key(&self.namespace, Kind::Approval, ids.id),
                ];
                let ttl = (expires_ms - now_ms).max(1).to_string();
                let (now, expires) = (now_ms.to_string(), expires_ms.to_string());
                let (max, per_client) = (limits.0.to_string(), limits.1.to_string());
                let prefixes = self.prefixes();
                let args = [
                    now.as_str(),
                    &expires,
                    &max,
                    &per_client,
                    ids.id,
                    entry,
                    &ttl,
                    &prefixes.0,
                    &prefixes.1,
                ];
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let reply: Result<Vec<String>, _> = redis.run(&redis.queue_add, &keys, &args).await;
                let reply = self.observe(reply)?;
                Ok(match reply.first().map(String::as_str) {
                    Some("added") => Queued::Added,
                    Some("found") if reply.len() == 4 => Queued::Found {
                        id: reply[1].clone(),
                        entry: reply[2].clone(),
                        decision: Some(reply[3].clone()).filter(|d| !d.is_empty()),
                    },
                    Some("client_full") => Queued::ClientFull,
                    _ => Queued::Full,
                })
            }
        }
    }

    /// Sets `decision` on entry `id`, if it lives and has none yet.
    pub async fn queue_decide(&self, id: &str, decision: &str) -> Result<Decided, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (id, decision);
        match &self.backend {
            super::Backend::Memory => Ok(Decided::Unknown),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let keys = [
                    key(&self.namespace, Kind::Approval, id),
                    key(&self.namespace, Kind::Decision, id),
                ];
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let reply: Result<Vec<String>, _> =
                    redis.run(&redis.queue_decide, &keys, &[decision]).await;
                let reply = self.observe(reply)?;
                Ok(match (reply.first().map(String::as_str), reply.len()) {
                    (Some("decided"), 2) => Decided::Now(reply[1].clone()),
                    (Some("already"), 3) => Decided::Already(reply[1].clone(), reply[2].clone()),
                    _ => Decided::Unknown,
                })
            }
        }
    }

    /// Takes the decision on `ids`, if there is one; with `close`, an
    /// undecided entry is taken out as expired.
    pub async fn queue_settle(
        &self,
        ids: QueueIds<'_>,
        close: bool,
    ) -> Result<Settled, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (ids, close);
        match &self.backend {
            super::Backend::Memory => Ok(Settled::Gone),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let keys = [
                    key(&self.namespace, Kind::Approval, ids.id),
                    key(&self.namespace, Kind::Decision, ids.id),
                    self.call_key(ids.call),
                    key(&self.namespace, Kind::Approvals, "all"),
                    self.client_key(ids.client),
                ];
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let close = if close { "1" } else { "0" };
                let reply: Result<Vec<String>, _> = redis
                    .run(&redis.queue_settle, &keys, &[ids.id, close])
                    .await;
                let reply = self.observe(reply)?;
                Ok(match (reply.first().map(String::as_str), reply.len()) {
                    (Some("decided"), 2) => Settled::Decided(reply[1].clone()),
                    (Some("pending"), _) => Settled::Pending,
                    (Some("expired"), _) => Settled::Expired,
                    _ => Settled::Gone,
                })
            }
        }
    }

    /// Entry `id` and its decision, if it lives.
    pub async fn queue_get(
        &self,
        id: &str,
    ) -> Result<Option<(String, Option<String>)>, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = id;
        match &self.backend {
            super::Backend::Memory => Ok(None),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let mut mget = redis::cmd("MGET");
                mget.arg(key(&self.namespace, Kind::Approval, id)).arg(key(
                    &self.namespace,
                    Kind::Decision,
                    id,
                ));
                let reply: Result<Vec<Option<String>>, _> = redis.command(mget).await;
                let mut reply = self.observe(reply)?.into_iter();
                Ok(match (reply.next().flatten(), reply.next().flatten()) {
                    (Some(entry), decision) => Some((entry, decision)),
                    _ => None,
                })
            }
        }
    }

    /// Every live entry of the fleet with its decision, at most `max`.
    pub async fn queue_list(
        &self,
        now_ms: i64,
        max: usize,
    ) -> Result<Vec<(String, Option<String>)>, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (now_ms, max);
        match &self.backend {
            super::Backend::Memory => Ok(Vec::new()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let all = key(&self.namespace, Kind::Approvals, "all");
                let (now, max) = (now_ms.to_string(), max.max(1).to_string());
                let prefixes = self.prefixes();
                let args = [now.as_str(), &prefixes.0, &prefixes.1, &max];
                let reply: Result<Vec<String>, _> =
                    redis.run(&redis.queue_list, &[&all], &args).await;
                let reply = self.observe(reply)?;
                Ok(reply
                    .chunks_exact(2)
                    .map(|p| (p[0].clone(), Some(p[1].clone()).filter(|d| !d.is_empty())))
                    .collect())
            }
        }
    }

    /// Records the fleet's approval of pin `pin` as `value`; `Ok(false)`
    /// when [`MAX_PIN_APPROVALS`] other pins hold one (nothing written).
    pub async fn pin_approve(&self, pin: &str, value: &str) -> Result<bool, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (pin, value);
        match &self.backend {
            super::Backend::Memory => Ok(true),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let pins = key(&self.namespace, Kind::Pins, "approved");
                let max = MAX_PIN_APPROVALS.to_string();
                let ttl = PIN_APPROVALS_TTL.as_millis().to_string();
                let reply: Result<i64, _> = redis
                    .run(&redis.pin_approve, &[&pins], &[pin, value, &max, &ttl])
                    .await;
                Ok(self.observe(reply)? == 1)
            }
        }
    }

    /// The fleet's pin approvals (pin, value), at most [`MAX_PIN_APPROVALS`].
    pub async fn pin_approvals(&self) -> Result<Vec<(String, String)>, Unavailable> {
        match &self.backend {
            super::Backend::Memory => Ok(Vec::new()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let mut hgetall = redis::cmd("HGETALL");
                hgetall.arg(key(&self.namespace, Kind::Pins, "approved"));
                let reply: Result<Vec<(String, String)>, _> = redis.command(hgetall).await;
                let mut reply = self.observe(reply)?;
                reply.truncate(MAX_PIN_APPROVALS);
                Ok(reply)
            }
        }
    }

    #[cfg(feature = "redis-ratelimit")]
    fn call_key(&self, call: &str) -> String {
        key(&self.namespace, Kind::ApprovalCall, call)
    }

    #[cfg(feature = "redis-ratelimit")]
    fn client_key(&self, client: &str) -> String {
        key(
            &self.namespace,
            Kind::ApprovalsOf,
            &hex::encode(client.as_bytes()),
        )
    }

    /// The prefixes of entry and decision keys (an id appended).
    #[cfg(feature = "redis-ratelimit")]
    fn prefixes(&self) -> (String, String) {
        (
            key(&self.namespace, Kind::Approval, ""),
            key(&self.namespace, Kind::Decision, ""),
        )
    }
}
