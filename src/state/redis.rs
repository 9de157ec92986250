//! The Redis state store, and the connection every Redis user of the
//! gateway opens the same way (the rate limiter's buckets too).
//!
//! Place in the path: behind [`super::SharedState`] with `[state] backend =
//! "redis"`.
//!
//! Invariants: one round trip per use of a nonce (one script run,
//! `use_once.lua`, atomic in Redis: check and set-if-absent are one step for
//! the fleet); a call never waits longer than [`super::CALL_TIMEOUT`]; the
//! connection is re-established by itself after Redis goes away; a used
//! nonce is remembered past its expiry by [`CLOCK_SLACK`], so replicas whose
//! clocks differ a little cannot see it unused while it is still valid.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};

use super::model::{CALL_TIMEOUT, Use};

/// Longest wait for a TCP connection to Redis.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest wait for Redis's answer on an open connection.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How much longer than its expiry a used nonce is remembered.
pub(crate) const CLOCK_SLACK: Duration = Duration::from_secs(60);

/// A connection to `url` that connects on first use and again after an
/// outage, failing fast while Redis is away. Inside a Tokio runtime.
pub(crate) fn connect(url: &str) -> Result<ConnectionManager, RedisError> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        // Fail fast while Redis is away; the next call tries again.
        .set_number_of_retries(0);
    ConnectionManager::new_lazy_with_config(client, config)
}

/// Waits for `run` at most [`CALL_TIMEOUT`].
pub(crate) async fn in_time<T>(
    run: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    match tokio::time::timeout(CALL_TIMEOUT, run).await {
        Ok(reply) => reply,
        Err(_) => Err(RedisError::from((
            redis::ErrorKind::Io,
            "no answer from Redis in time",
        ))),
    }
}

/// The state in Redis.
pub(crate) struct RedisState {
    connection: ConnectionManager,
    use_once: Script,
    bind_task: Script,
    /// The fleet's operator queue and pin approvals ([`super::queue`]).
    pub(crate) queue_add: Script,
    pub(crate) queue_decide: Script,
    pub(crate) queue_settle: Script,
    pub(crate) queue_list: Script,
    pub(crate) pin_approve: Script,
}

impl RedisState {
    pub(crate) fn new(url: &str) -> Result<Self, RedisError> {
        Ok(Self {
            connection: connect(url)?,
            use_once: Script::new(include_str!("use_once.lua")),
            bind_task: Script::new(include_str!("bind_task.lua")),
            queue_add: Script::new(include_str!("queue_add.lua")),
            queue_decide: Script::new(include_str!("queue_decide.lua")),
            queue_settle: Script::new(include_str!("queue_settle.lua")),
            queue_list: Script::new(include_str!("queue_list.lua")),
            pin_approve: Script::new(include_str!("pin_approve.lua")),
        })
    }

    /// Runs `use_once.lua` on `keys` (nonce, fleet set, client set).
    pub(crate) async fn use_once(
        &self,
        keys: &[String; 3],
        nonce: &str,
        expires_ms: i64,
        now_ms: i64,
        (max, per_client): (usize, usize),
    ) -> Result<Use, RedisError> {
        let slack = CLOCK_SLACK.as_millis() as i64;
        let ttl = (expires_ms.saturating_sub(now_ms))
            .max(1)
            .saturating_add(slack);
        let mut invocation = self.use_once.prepare_invoke();
        for k in keys {
            invocation.key(k);
        }
        invocation
            .arg(now_ms)
            .arg(expires_ms.saturating_add(slack))
            .arg(max)
            .arg(per_client)
            .arg(nonce)
            .arg(ttl);
        let mut connection = self.connection.clone();
        let reply: i64 = in_time(invocation.invoke_async(&mut connection)).await?;
        match reply {
            1 => Ok(Use::Done),
            0 => Ok(Use::Used),
            2 => Ok(Use::Full),
            3 => Ok(Use::ClientFull),
            _ => Err(RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply from the nonce script",
            ))),
        }
    }

    /// Runs `bind_task.lua`: `value` under `keys[0]` for `ttl_ms`, within
    /// the client's bound (`keys[1]`).
    pub(crate) async fn bind_task(
        &self,
        keys: &[String; 2],
        value: &str,
        (ttl_ms, max_ttl_ms): (i64, i64),
        now_ms: i64,
        per_client: usize,
    ) -> Result<(), RedisError> {
        let mut invocation = self.bind_task.prepare_invoke();
        invocation.key(&keys[0]).key(&keys[1]);
        invocation
            .arg(value)
            .arg(ttl_ms.max(1))
            .arg(now_ms)
            .arg(per_client)
            .arg(max_ttl_ms.max(1));
        let mut connection = self.connection.clone();
        in_time(invocation.invoke_async::<i64>(&mut connection)).await?;
        Ok(())
    }

    /// Runs `script` on `keys` with `args`; its reply (strings, or a number).
    pub(crate) async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, RedisError> {
        let mut invocation = script.prepare_invoke();
        for k in keys {
            invocation.key(*k);
        }
        for a in args {
            invocation.arg(*a);
        }
        let mut connection = self.connection.clone();
        in_time(invocation.invoke_async(&mut connection)).await
    }

    /// One command's reply.
    pub(crate) async fn command<T: redis::FromRedisValue>(
        &self,
        command: redis::Cmd,
    ) -> Result<T, RedisError> {
        let mut connection = self.connection.clone();
        in_time(command.query_async(&mut connection)).await
    }

    /// GET.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<String>, RedisError> {
        let mut connection = self.connection.clone();
        in_time(redis::cmd("GET").arg(key).query_async(&mut connection)).await
    }

    /// DEL.
    pub(crate) async fn del(&self, key: &str) -> Result<(), RedisError> {
        let mut connection = self.connection.clone();
        in_time(
            redis::cmd("DEL")
                .arg(key)
                .query_async::<i64>(&mut connection),
        )
        .await?;
        Ok(())
    }

    /// PING.
    pub(crate) async fn ping(&self) -> Result<(), RedisError> {
        let mut connection = self.connection.clone();
        in_time(redis::cmd("PING").query_async::<String>(&mut connection)).await?;
        Ok(())
    }
}
