//! Rate limiting: the token buckets named by the `rate` of every matching
//! allow rule, kept in memory or shared through Redis.
//!
//! Place in the path: for `tools/call` (and `resources/read`, `prompts/get`),
//! after the access rules and the rules' `arguments`, before schema
//! validation. A call that would be refused for its rate is refused there,
//! before anybody is asked. A call that needs no approval takes its tokens
//! there ([`take`](RateLimiter::take): one decision of the backend) and gets
//! them back ([`refund`](RateLimiter::refund)) when a later check (schema,
//! secrets) refuses it; a call put to a person only
//! [`peek`](RateLimiter::peek)s, writing nothing, and takes when it runs, so
//! a question and a declined call take none. Nothing else (initialize,
//! lists, notifications, discover) consumes.
//!
//! Semantics:
//! - A rule's `rate = { burst, per_second, key }` is a bucket of `burst`
//!   tokens gaining `per_second` tokens a second, never holding more than
//!   `burst` ([`gcra`] has the exact arithmetic).
//! - `key` says who shares it: `"client"` one bucket per client across the
//!   rule's tools (on all its servers), `"client+tool"` one per client per tool
//!   (a tool is a server and a name; for a resource it is the URI, for a prompt
//!   its name), `"all"` one for everybody. Keys come only from authenticated
//!   client names, the rule and the tool, never from other request data.
//! - A call needs a token from every bucket that applies; a refused call takes
//!   none from any ([`memory`] and the Redis script decide all buckets at once).
//! - A bucket belongs to its rule's *content* (who, where, what, and rate), not
//!   to its position in the file: identical rules share buckets (which changes
//!   nothing, as they always hold the same tokens), and a rule that is moved or
//!   left unchanged by a configuration reload keeps its state.
//!
//! - A refund is exact where no other take came since, and nothing where one
//!   did ([`gcra::refund`]): refunds never let a bucket admit more than its
//!   rate; a token that stays taken errs towards refusing.
//!
//! Invariants: one decision per plain call (a refund is a second, on the
//! refused path only), O(1) in the number of clients, no global lock; a backend that cannot answer is counted, logged, and answered per
//! `on_backend_error`.

pub mod bucket;
pub mod clock;
pub mod gcra;
mod memory;
mod plan;
#[cfg(feature = "redis-ratelimit")]
mod redis;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

pub use bucket::Bucket;
use clock::{Clock, MonotonicClock};
use gcra::Quota;
use memory::MemoryStore;
pub use plan::{RatePlan, bucket_key};

/// How often the janitor drops full buckets from memory.
pub const JANITOR_EVERY: Duration = Duration::from_secs(30);
/// How often a lasting backend outage is logged again.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// What a call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A token was taken from every bucket (a [`peek`](RateLimiter::peek):
    /// one would be, and nothing was taken).
    Admitted,
    /// Refused; nothing was taken.
    Limited {
        /// Position of the binding bucket in the checked list.
        bucket: usize,
        /// The call passes once this much time has gone by (exact, to the nanosecond).
        retry_after: Duration,
    },
    /// The backend could not answer and `on_backend_error = "deny"`.
    Unavailable,
}

/// A limiter that cannot be built from the configuration.
#[derive(Debug, thiserror::Error)]
pub enum RateLimitError {
    /// The binary was built without Redis support.
    #[error(
        "`rate_limit.backend = \"redis\"` needs a build with the `redis-ratelimit` feature (on by default)"
    )]
    RedisNotBuilt,
    /// The Redis URL cannot be used.
    #[error("`rate_limit.redis_url` cannot be used: {0}")]
    RedisUrl(String),
}

/// The buckets of every rule with a `rate`, and where they live.
#[derive(Debug)]
pub struct RateLimiter {
    backend: Backend,
    #[cfg_attr(not(feature = "redis-ratelimit"), allow(dead_code))]
    on_error: OnBackendError,
    health: Health,
    /// Tokens of refused calls that stayed taken.
    refunds_lost: AtomicU64,
}

#[derive(Debug)]
enum Backend {
    Memory {
        store: Arc<MemoryStore>,
        clock: Arc<dyn Clock>,
    },
    #[cfg(feature = "redis-ratelimit")]
    Redis(redis::RedisStore),
}

/// Backend failures: counted, and logged when they start, every
/// [`REPORT_EVERY`] while they last, and when they end.
#[derive(Debug, Default)]
struct Health {
    errors: AtomicU64,
    failing: AtomicBool,
    last_report: Mutex<Option<Instant>>,
}

// === impl RateLimiter ===

impl RateLimiter {
    /// The limiter `[rate_limit]` asks for. The Redis backend must be built
    /// inside a Tokio runtime; it connects on first use.
    pub fn from_settings(settings: &RateLimitSettings) -> Result<Self, RateLimitError> {
        match &settings.backend {
            RateBackend::Memory => Ok(Self::memory(Arc::new(MonotonicClock::new()))),
            RateBackend::Redis(url) => {
                Self::redis_in(url, &settings.namespace, settings.on_backend_error)
            }
        }
    }

    /// Buckets in this process, on `clock`.
    pub fn memory(clock: Arc<dyn Clock>) -> Self {
        Self {
            backend: Backend::Memory {
                store: Arc::new(MemoryStore::new()),
                clock,
            },
            on_error: OnBackendError::Deny,
            health: Health::default(),
            refunds_lost: AtomicU64::new(0),
        }
    }

    /// Buckets shared through the Redis at `url`, in the default namespace.
    pub fn redis(url: &str, on_error: OnBackendError) -> Result<Self, RateLimitError> {
        Self::redis_in(url, crate::state::settings::DEFAULT_NAMESPACE, on_error)
    }

    /// Buckets shared through the Redis at `url` by the replicas of
    /// deployment `namespace` (another deployment's buckets are other keys).
    #[cfg(feature = "redis-ratelimit")]
    pub fn redis_in(
        url: &str,
        namespace: &str,
        on_error: OnBackendError,
    ) -> Result<Self, RateLimitError> {
        let store = redis::RedisStore::new(url, namespace)
            .map_err(|e| RateLimitError::RedisUrl(e.to_string()))?;
        Ok(Self {
            backend: Backend::Redis(store),
            on_error,
            health: Health::default(),
            refunds_lost: AtomicU64::new(0),
        })
    }

    /// Buckets shared through Redis: not in this build.
    #[cfg(not(feature = "redis-ratelimit"))]
    pub fn redis_in(
        _url: &str,
        _namespace: &str,
        _on_error: OnBackendError,
    ) -> Result<Self, RateLimitError> {
        Err(RateLimitError::RedisNotBuilt)
    }

    /// Decides a call needing a token from each of `buckets` (see
    /// [`RatePlan::buckets`]) and takes them when it is admitted.
    pub async fn check(&self, buckets: &[Bucket]) -> Verdict {
        self.decide(buckets, None, Spend::Take).await
    }

    /// What [`check`](Self::check) would answer now, writing nothing: the
    /// verdict of a call that is not run yet (it may still be refused, or
    /// wait for a person), whose token is taken only when it runs.
    pub async fn peek(&self, buckets: &[Bucket]) -> Verdict {
        self.decide(buckets, None, Spend::Peek).await
    }

    /// [`peek`](Self::peek) at an explicit instant (see [`check_at`](Self::check_at)).
    pub async fn peek_at(&self, buckets: &[Bucket], now: u64) -> Verdict {
        self.decide(buckets, Some(now), Spend::Peek).await
    }

    async fn decide(&self, buckets: &[Bucket], now: Option<u64>, spend: Spend) -> Verdict {
        self.decide_taking(buckets, now, spend).await.0
    }

    /// Like [`check`](Self::check), and answers what the take left in each
    /// bucket, so that [`refund`](Self::refund) can give the tokens back if a
    /// later step refuses the call. [`Taken`] is empty when nothing was
    /// taken (refused, or let through unlimited while the backend is away).
    pub async fn take(&self, buckets: &[Bucket]) -> (Verdict, Taken) {
        self.decide_taking(buckets, None, Spend::Take).await
    }

    /// [`take`](Self::take) at an explicit instant (see [`check_at`](Self::check_at)).
    pub async fn take_at(&self, buckets: &[Bucket], now: u64) -> (Verdict, Taken) {
        self.decide_taking(buckets, Some(now), Spend::Take).await
    }

    /// Gives back the tokens of `taken`, a [`take`](Self::take) of the same
    /// `buckets`, for a call refused after it: exactly where no other take
    /// came since, and not at all where one did (the fail-closed side: which
    /// part of the token is still owed cannot be told, see
    /// [`gcra::refund`]). A token that stays taken, or that cannot be given
    /// back because the backend does not answer, is counted
    /// ([`refunds_lost`](Self::refunds_lost)) and logged.
    pub async fn refund(&self, buckets: &[Bucket], taken: &Taken) -> Refunded {
        self.refund_inner(buckets, taken, None).await
    }

    /// [`refund`](Self::refund) at an explicit instant.
    pub async fn refund_at(&self, buckets: &[Bucket], taken: &Taken, now: u64) -> Refunded {
        self.refund_inner(buckets, taken, Some(now)).await
    }

    async fn refund_inner(&self, buckets: &[Bucket], taken: &Taken, now: Option<u64>) -> Refunded {
        if taken.tats.is_empty() || taken.tats.len() != buckets.len() {
            return Refunded::Returned;
        }
        let outcome: Result<usize, String> = match &self.backend {
            Backend::Memory { store, clock } => {
                let keys: Vec<&[u8]> = buckets.iter().map(|b| b.key.as_bytes()).collect();
                let quotas: Vec<Quota> = buckets.iter().map(|b| b.quota).collect();
                let now = now.unwrap_or_else(|| clock.now());
                Ok(store.refund(&keys, &quotas, &taken.tats, now))
            }
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(store) => match store.refund(buckets, &taken.tats, now).await {
                Ok(spent) => {
                    self.health.recovered();
                    Ok(spent)
                }
                Err(e) => {
                    self.health.errors.fetch_add(1, Ordering::Relaxed);
                    Err(e.to_string())
                }
            },
        };
        match outcome {
            Ok(0) => Refunded::Returned,
            Ok(spent) => {
                self.refunds_lost.fetch_add(spent as u64, Ordering::Relaxed);
                tracing::debug!(
                    spent,
                    "rate-limit refund: another call took from the bucket since; the token stays taken"
                );
                Refunded::Spent(spent)
            }
            Err(error) => {
                let lost = buckets.len() as u64;
                self.refunds_lost.fetch_add(lost, Ordering::Relaxed);
                tracing::warn!(
                    %error,
                    lost,
                    "rate-limit backend unreachable: the token of a refused call stays taken"
                );
                Refunded::Unreachable
            }
        }
    }

    /// Tokens of refused calls that could not be given back since start
    /// (another take came first, or the backend did not answer).
    pub fn refunds_lost(&self) -> u64 {
        self.refunds_lost.load(Ordering::Relaxed)
    }

    async fn decide_taking(
        &self,
        buckets: &[Bucket],
        now: Option<u64>,
        spend: Spend,
    ) -> (Verdict, Taken) {
        match &self.backend {
            Backend::Memory { store, clock } => {
                memory_verdict(store, buckets, now.unwrap_or_else(|| clock.now()), spend)
            }
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(store) => self.redis_verdict(store, buckets, now, spend).await,
        }
    }

    /// [`check`](Self::check) at an explicit instant instead of the backend's
    /// clock: nanoseconds of the memory clock, or since the Unix epoch for
    /// Redis. For tests and replays; the gateway uses `check`.
    pub async fn check_at(&self, buckets: &[Bucket], now: u64) -> Verdict {
        self.decide(buckets, Some(now), Spend::Take).await
    }

    #[cfg(feature = "redis-ratelimit")]
    async fn redis_verdict(
        &self,
        store: &redis::RedisStore,
        buckets: &[Bucket],
        now: Option<u64>,
        spend: Spend,
    ) -> (Verdict, Taken) {
        if buckets.is_empty() {
            return (Verdict::Admitted, Taken::default());
        }
        match store.check(buckets, now, spend == Spend::Peek).await {
            Ok(decision) => {
                self.health.recovered();
                match decision {
                    Ok(tats) => (Verdict::Admitted, Taken { tats }),
                    Err((bucket, wait)) => (
                        Verdict::Limited {
                            bucket,
                            retry_after: Duration::from_nanos(wait),
                        },
                        Taken::default(),
                    ),
                }
            }
            Err(e) => {
                self.health.failed(&e, self.on_error);
                let verdict = match self.on_error {
                    OnBackendError::Deny => Verdict::Unavailable,
                    OnBackendError::Allow => Verdict::Admitted,
                };
                (verdict, Taken::default())
            }
        }
    }

    /// Times the backend could not answer since start (a counter for metrics).
    pub fn backend_errors(&self) -> u64 {
        self.health.errors.load(Ordering::Relaxed)
    }

    /// Keys held in memory (`None` for Redis, which expires its own).
    pub fn keys(&self) -> Option<usize> {
        match &self.backend {
            Backend::Memory { store, .. } => Some(store.len()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(_) => None,
        }
    }

    /// Bytes the in-memory tables hold (24 bytes per slot plus a control
    /// byte; no allocation per key), `None` for Redis.
    pub fn memory_bytes(&self) -> Option<usize> {
        match &self.backend {
            Backend::Memory { store, .. } => Some(store.table_bytes()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(_) => None,
        }
    }

    /// Drops every full bucket from memory now; returns how many went.
    pub fn sweep(&self) -> usize {
        match &self.backend {
            Backend::Memory { store, clock } => store.sweep(clock.now()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(_) => 0,
        }
    }

    /// Starts the janitor that reclaims idle keys every `every` (memory
    /// backend only); it stops by itself when the limiter is dropped.
    #[cfg_attr(not(feature = "redis-ratelimit"), allow(irrefutable_let_patterns))]
    pub fn spawn_janitor(&self, every: Duration) -> Option<tokio::task::JoinHandle<()>> {
        let Backend::Memory { store, clock } = &self.backend else {
            return None;
        };
        let store: Weak<MemoryStore> = Arc::downgrade(store);
        let clock = clock.clone();
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(store) = store.upgrade() else { break };
                let removed = store.sweep(clock.now());
                if removed > 0 {
                    tracing::debug!(removed, kept = store.len(), "rate-limit janitor");
                }
            }
        }))
    }
}

/// Whether a decision takes its tokens or only looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spend {
    Take,
    Peek,
}

fn memory_verdict(
    store: &MemoryStore,
    buckets: &[Bucket],
    now: u64,
    spend: Spend,
) -> (Verdict, Taken) {
    let outcome = match (buckets, spend) {
        ([], _) => Ok(Vec::new()),
        ([one], Spend::Take) => store.check(&[one.key.as_bytes()], &[one.quota], now),
        (many, spend) => {
            let keys: Vec<&[u8]> = many.iter().map(|b| b.key.as_bytes()).collect();
            let quotas: Vec<Quota> = many.iter().map(|b| b.quota).collect();
            match spend {
                Spend::Take => store.check(&keys, &quotas, now),
                Spend::Peek => store.peek(&keys, &quotas, now).map(|()| Vec::new()),
            }
        }
    };
    match outcome {
        Ok(tats) => (Verdict::Admitted, Taken { tats }),
        Err(r) => (
            Verdict::Limited {
                bucket: r.index,
                retry_after: Duration::from_nanos(r.retry_at.saturating_sub(now)),
            },
            Taken::default(),
        ),
    }
}

/// What a take left in each of its buckets (their TATs, in the backend's
/// clock): what a [`refund`](RateLimiter::refund) compares against. Empty
/// when nothing was taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taken {
    tats: Vec<u64>,
}

impl Taken {
    /// Whether tokens were taken (and a refund has something to give back).
    pub fn is_empty(&self) -> bool {
        self.tats.is_empty()
    }
}

/// What a [`refund`](RateLimiter::refund) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refunded {
    /// Every token is back (or its bucket had refilled: nothing to give back).
    Returned,
    /// In this many buckets another call took after this one: their tokens
    /// stay taken.
    Spent(usize),
    /// The backend did not answer: the tokens stay taken.
    Unreachable,
}

// === impl Health ===

impl Health {
    #[cfg_attr(not(feature = "redis-ratelimit"), allow(dead_code))]
    fn failed(&self, error: &dyn std::fmt::Display, policy: OnBackendError) {
        let errors = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        let started = !self.failing.swap(true, Ordering::AcqRel);
        let due = {
            let mut last = self
                .last_report
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let due = started || last.is_none_or(|t| t.elapsed() >= REPORT_EVERY);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if due {
            let calls = match policy {
                OnBackendError::Deny => "refused (on_backend_error = \"deny\")",
                OnBackendError::Allow => "let through unlimited (on_backend_error = \"allow\")",
            };
            tracing::warn!(
                errors,
                error = %error,
                "rate-limit backend unreachable: rate-limited calls are {calls} until it answers"
            );
        }
    }

    #[cfg_attr(not(feature = "redis-ratelimit"), allow(dead_code))]
    fn recovered(&self) {
        if self.failing.load(Ordering::Relaxed) && self.failing.swap(false, Ordering::AcqRel) {
            tracing::info!(
                errors = self.errors.load(Ordering::Relaxed),
                "rate-limit backend reachable again"
            );
        }
    }
}

pub use crate::util::time::{ceil_millis, ceil_secs};

/// `[rate_limit]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitSettings {
    /// Where buckets live.
    pub backend: RateBackend,
    /// What a call gets when the backend cannot answer.
    pub on_backend_error: OnBackendError,
    /// The deployment's namespace (`[state] namespace`): the Redis buckets
    /// are `portcullis:<namespace>:rl:…`, so deployments sharing one Redis
    /// never share a bucket.
    pub namespace: String,
}

/// Bucket storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateBackend {
    /// In this process.
    Memory,
    /// Shared by replicas through Redis.
    Redis(String),
}

/// Failure policy of the rate-limit backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBackendError {
    /// Refuse the call.
    Deny,
    /// Let the call through.
    Allow,
}

#[cfg(test)]
mod tests;
