//! The Redis bucket store: every replica pointed at the same Redis shares each
//! bucket exactly.
//!
//! Place in the path: behind [`super::RateLimiter`] with `backend = "redis"`.
//!
//! One call is one script run (`gcra.lua`, EVALSHA, loaded again by itself
//! after a Redis restart): the script reads every bucket of the call, decides
//! with the arithmetic of [`super::gcra`] on Redis's own clock (`TIME`, so
//! the replicas' clocks do not matter), and writes all of them or none (a
//! peek, the same script with its last argument `peek`, writes none).
//! Redis runs a script atomically, so concurrent calls from any replica see
//! one order. Keys expire when their bucket is full again (Redis's own
//! janitor).
//!
//! A take answers the TAT it stored in each bucket; a refund (the same
//! script, mode `refund`) gives a take's tokens back where no other take
//! came since.
//!
//! Invariants: one round trip per decision (a plain call makes one: its take
//! while it is checked; a refund, when a later check refuses it, is a
//! second); a call never waits longer than
//! [`CALL_TIMEOUT`] for Redis; the connection is re-established by itself
//! after Redis goes away (the first call after an outage reconnects).
//! Every key is in the deployment's namespace (`[state] namespace`, the
//! state store's): replicas of one deployment share each bucket, two
//! deployments sharing one Redis share none.
//! Redis Cluster is not supported (a call's keys may live in different slots).

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{RedisError, Script};

use super::bucket::Bucket;
use super::gcra::NANOS_PER_SEC;

/// Longest wait for one decision, connecting included.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_millis(1500);

/// What Redis decided: admitted (with, for a take, the TAT each bucket holds
/// after it, in ns since the Unix epoch), or the bucket that binds and the
/// wait in ns.
pub(crate) type Decision = Result<Vec<u64>, (usize, u64)>;

/// Buckets in Redis.
pub(crate) struct RedisStore {
    connection: ConnectionManager,
    script: Script,
    /// The deployment's namespace, in every bucket's key.
    namespace: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store at `url`; connects on first use (Redis may be down at start).
    /// Must be called inside a Tokio runtime.
    pub(crate) fn new(url: &str, namespace: &str) -> Result<Self, RedisError> {
        // The same connection settings as the shared state store's.
        let connection = crate::state::redis::connect(url)?;
        Ok(Self {
            connection,
            script: Script::new(include_str!("gcra.lua")),
            namespace: namespace.to_owned(),
        })
    }

    /// Decides a call needing a token from every bucket; `now` (nanoseconds
    /// since the Unix epoch) replaces Redis's clock when given; with `peek`
    /// the script decides the same way and writes nothing.
    pub(crate) async fn check(
        &self,
        buckets: &[Bucket],
        now: Option<u64>,
        peek: bool,
    ) -> Result<Decision, RedisError> {
        let mut invocation = self.invocation(buckets, now);
        invocation.arg(if peek { "peek" } else { "take" });
        let reply = self.run(&invocation).await?;
        match reply.as_slice() {
            [1] if peek => Ok(Ok(Vec::new())),
            [1, tats @ ..] if !peek && tats.len() == 2 * buckets.len() => Ok(Ok(tats
                .chunks_exact(2)
                .map(|t| t[0].saturating_mul(NANOS_PER_SEC).saturating_add(t[1]))
                .collect())),
            [0, index, secs, nanos] if (1..=buckets.len() as u64).contains(index) => Ok(Err((
                (*index - 1) as usize,
                secs.saturating_mul(NANOS_PER_SEC).saturating_add(*nanos),
            ))),
            _ => Err(RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply from the rate-limit script",
            ))),
        }
    }
}

impl RedisStore {
    /// Gives back the tokens of a take that stored `taken` (one TAT per
    /// bucket, as [`check`](Self::check) answered): one script run, which
    /// compares each bucket with what the take left (see `gcra.lua`).
    /// Returns how many buckets kept their token.
    pub(crate) async fn refund(
        &self,
        buckets: &[Bucket],
        taken: &[u64],
        now: Option<u64>,
    ) -> Result<usize, RedisError> {
        let mut invocation = self.invocation(buckets, now);
        invocation.arg("refund");
        for t in taken {
            invocation.arg(t / NANOS_PER_SEC).arg(t % NANOS_PER_SEC);
        }
        match self.run(&invocation).await?.as_slice() {
            [2, spent] if *spent <= buckets.len() as u64 => Ok(*spent as usize),
            _ => Err(RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply from the rate-limit script",
            ))),
        }
    }

    /// The script with the clock and every bucket's keys and shape; the mode
    /// and its arguments follow.
    fn invocation(&self, buckets: &[Bucket], now: Option<u64>) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.script.prepare_invoke();
        match now {
            Some(t) => invocation.arg(t / NANOS_PER_SEC).arg(t % NANOS_PER_SEC),
            None => invocation.arg("").arg(""),
        };
        for bucket in buckets {
            let (interval, capacity) = (bucket.quota.interval(), bucket.quota.capacity());
            invocation
                .key(redis_key(&self.namespace, &bucket.key))
                .arg(interval / NANOS_PER_SEC)
                .arg(interval % NANOS_PER_SEC)
                .arg(capacity / NANOS_PER_SEC)
                .arg(capacity % NANOS_PER_SEC);
        }
        invocation
    }

    /// One run of the script (EVALSHA, loading it when Redis lost it),
    /// given up after [`CALL_TIMEOUT`].
    async fn run(&self, invocation: &redis::ScriptInvocation<'_>) -> Result<Vec<u64>, RedisError> {
        let mut connection = self.connection.clone();
        let run = invocation.invoke_async::<Vec<u64>>(&mut connection);
        match tokio::time::timeout(CALL_TIMEOUT, run).await {
            Ok(reply) => reply,
            Err(_) => Err(RedisError::from((
                redis::ErrorKind::Io,
                "no answer from Redis in time",
            ))),
        }
    }
}

/// The Redis key of a bucket of deployment `namespace`:
/// `portcullis:<namespace>:rl:<rule tag>/<key>`.
pub(crate) fn redis_key(namespace: &str, bucket_key: &str) -> String {
    crate::state::key(namespace, crate::state::Kind::Bucket, bucket_key)
}
