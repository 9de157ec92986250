//! The fleet's operator approval queue and pin approvals in the shared
//! store: what lets an operator answer, from any replica, a call held on
//! another, and a pin approved on one replica hold on all.
//!
//! Place in the path: behind the state store's `queue_*` and `pin_*`
//! methods (which log an outage and name the store in the error), beneath
//! the approval gate and the admin API, which keep the entries' meaning;
//! this module only stores opaque, bounded JSON texts under the
//! deployment's keys, with the Redis backend ([`Fleet`]).
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
use super::model::{Kind, key};
#[cfg(feature = "redis-ratelimit")]
use super::redis::RedisState;
#[cfg(feature = "redis-ratelimit")]
use redis::RedisError;

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

/// The fleet's queue and pin approvals in one deployment's namespace.
#[cfg(feature = "redis-ratelimit")]
pub(crate) struct Fleet<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) redis: &'a RedisState,
}

#[cfg(feature = "redis-ratelimit")]
impl Fleet<'_> {
    /// Queues `entry` under `ids` until `expires_ms`, unless the same call
    /// is queued already; within `limits` (fleet, client).
    pub(crate) async fn add(
        &self,
        ids: QueueIds<'_>,
        entry: &str,
        (now_ms, expires_ms): (i64, i64),
        limits: (usize, usize),
    ) -> Result<Queued, RedisError> {
        if entry.len() > MAX_ENTRY_BYTES {
            return Ok(Queued::Full);
        }
        let keys = [
            self.key(Kind::ApprovalCall, ids.call),
            self.key(Kind::Approvals, "all"),
            self.client_key(ids.client),
            self.key(Kind::Approval, ids.id),
        ];
        let ttl = (expires_ms - now_ms).max(1).to_string();
        let (now, expires) = (now_ms.to_string(), expires_ms.to_string());
        let (max, per_client) = (limits.0.to_string(), limits.1.to_string());
        let (entries, decisions) = self.prefixes();
        let args = [
            now.as_str(),
            &expires,
            &max,
            &per_client,
            ids.id,
            entry,
            &ttl,
            &entries,
            &decisions,
        ];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply: Vec<String> = self.redis.run(&self.redis.queue_add, &keys, &args).await?;
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

    /// Sets `decision` on entry `id`, if it lives and has none yet.
    pub(crate) async fn decide(&self, id: &str, decision: &str) -> Result<Decided, RedisError> {
        let keys = [self.key(Kind::Approval, id), self.key(Kind::Decision, id)];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply: Vec<String> = self
            .redis
            .run(&self.redis.queue_decide, &keys, &[decision])
            .await?;
        Ok(match (reply.first().map(String::as_str), reply.len()) {
            (Some("decided"), 2) => Decided::Now(reply[1].clone()),
            (Some("already"), 3) => Decided::Already(reply[1].clone(), reply[2].clone()),
            _ => Decided::Unknown,
        })
    }

    /// Takes the decision on `ids`, if there is one; with `close`, an
    /// undecided entry is taken out as expired.
    pub(crate) async fn settle(
        &self,
        ids: QueueIds<'_>,
        close: bool,
    ) -> Result<Settled, RedisError> {
        let keys = [
            self.key(Kind::Approval, ids.id),
            self.key(Kind::Decision, ids.id),
            self.key(Kind::ApprovalCall, ids.call),
            self.key(Kind::Approvals, "all"),
            self.client_key(ids.client),
        ];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let close = if close { "1" } else { "0" };
        let reply: Vec<String> = self
            .redis
            .run(&self.redis.queue_settle, &keys, &[ids.id, close])
            .await?;
        Ok(match (reply.first().map(String::as_str), reply.len()) {
            (Some("decided"), 2) => Settled::Decided(reply[1].clone()),
            (Some("pending"), _) => Settled::Pending,
            (Some("expired"), _) => Settled::Expired,
            _ => Settled::Gone,
        })
    }

    /// Entry `id` and its decision, if it lives.
    pub(crate) async fn get(
        &self,
        id: &str,
    ) -> Result<Option<(String, Option<String>)>, RedisError> {
        let mut mget = redis::cmd("MGET");
        mget.arg(self.key(Kind::Approval, id))
            .arg(self.key(Kind::Decision, id));
        let reply: Vec<Option<String>> = self.redis.command(mget).await?;
        let mut reply = reply.into_iter();
        Ok(match (reply.next().flatten(), reply.next().flatten()) {
            (Some(entry), decision) => Some((entry, decision)),
            _ => None,
        })
    }

    /// Every live entry of the fleet with its decision, at most `max`.
    pub(crate) async fn list(
        &self,
        now_ms: i64,
        max: usize,
    ) -> Result<Vec<(String, Option<String>)>, RedisError> {
        let all = self.key(Kind::Approvals, "all");
        let (now, max) = (now_ms.to_string(), max.max(1).to_string());
        let (entries, decisions) = self.prefixes();
        let args = [now.as_str(), &entries, &decisions, &max];
        let reply: Vec<String> = self
            .redis
            .run(&self.redis.queue_list, &[&all], &args)
            .await?;
        Ok(reply
            .chunks_exact(2)
            .map(|p| (p[0].clone(), Some(p[1].clone()).filter(|d| !d.is_empty())))
            .collect())
    }

    /// Records the fleet's approval of pin `pin` as `value`; `false` when
    /// [`MAX_PIN_APPROVALS`] other pins hold one (nothing written).
    pub(crate) async fn pin_approve(&self, pin: &str, value: &str) -> Result<bool, RedisError> {
        let pins = self.key(Kind::Pins, "approved");
        let max = MAX_PIN_APPROVALS.to_string();
        let ttl = PIN_APPROVALS_TTL.as_millis().to_string();
        let reply: i64 = self
            .redis
            .run(&self.redis.pin_approve, &[&pins], &[pin, value, &max, &ttl])
            .await?;
        Ok(reply == 1)
    }

    /// The fleet's pin approvals (pin, value), at most [`MAX_PIN_APPROVALS`].
    pub(crate) async fn pin_approvals(&self) -> Result<Vec<(String, String)>, RedisError> {
        let mut hgetall = redis::cmd("HGETALL");
        hgetall.arg(self.key(Kind::Pins, "approved"));
        let mut reply: Vec<(String, String)> = self.redis.command(hgetall).await?;
        reply.truncate(MAX_PIN_APPROVALS);
        Ok(reply)
    }

    fn key(&self, kind: Kind, id: &str) -> String {
        key(self.namespace, kind, id)
    }

    fn client_key(&self, client: &str) -> String {
        self.key(Kind::ApprovalsOf, &hex::encode(client.as_bytes()))
    }

    /// The prefixes of entry and decision keys (an id appended).
    fn prefixes(&self) -> (String, String) {
        (self.key(Kind::Approval, ""), self.key(Kind::Decision, ""))
    }
}
