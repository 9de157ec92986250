//! The fleet's shared security state: kept in this process (`[state] backend
//! = "memory"`, one replica) or in one Redis every replica of a deployment
//! shares (`"redis"`).
//!
//! Place in the path: in the decisions layer, beneath the approval gate,
//! which asks it to use a 2026-era `requestState` nonce once across the
//! fleet ([`SharedState::use_once`]), and beneath the task store and the
//! session table, which bind a task or a 2025-era session to its client for
//! every replica ([`SharedState::bind_task`], [`SharedState::task`],
//! [`SharedState::bind_session`], [`SharedState::session`]), and beneath
//! the operator queue and the pins, which share their entries, decisions
//! and approvals through it ([`queue`]); `/readyz` reports it
//! ([`SharedState::health`]). The fleet's flow labels (`crate::flow`) and
//! the rate limiter's buckets keep their own connections but name their
//! keys here ([`Kind::Flow`], [`Kind::Bucket`]), in the same namespace.
//!
//! Invariants: every shared key is `portcullis:<namespace>:<kind>:<id>` with
//! a namespace that holds no `:` and a fixed kind, so two deployments sharing
//! one Redis never read each other's keys ([`key`]); every key written has a
//! TTL and every value is bounded (a used nonce is the value `1`, a task or
//! session binding at most [`MAX_TASK_BYTES`], the sets that bound how many there
//! are hold at most the configured limits); a
//! store that cannot answer within [`CALL_TIMEOUT`] is an [`Unavailable`]
//! error the caller refuses on (fail closed), never a panic or a yes. Redis
//! Cluster is not supported (a script touches keys in several slots).

pub mod model;
pub mod queue;
#[cfg(feature = "redis-ratelimit")]
pub(crate) mod redis;
pub mod settings;

pub use model::{CALL_TIMEOUT, Kind, Unavailable, Use, key};
pub use queue::{Decided, QueueIds, Queued, Settled};
pub use settings::{StateBackend, StateSettings};
use std::sync::atomic::{AtomicBool, Ordering};

/// How long a 2025-era session binding is kept in the shared store (a
/// session older than this continues on the replicas that know it; another
/// replica answers it as unknown, and the client starts a new one).
pub const SESSION_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Longest task binding written (client, tool, era, expiry as JSON).
pub const MAX_TASK_BYTES: usize = 2048;

/// A store that cannot be built from the configuration.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The binary was built without Redis support.
    #[error(
        "`state.backend = \"redis\"` needs a build with the `redis-ratelimit` feature (on by default)"
    )]
    RedisNotBuilt,
    /// The Redis URL cannot be used.
    #[error("`state.redis_url` cannot be used: {0}")]
    RedisUrl(String),
}

/// The deployment's state store.
pub struct SharedState {
    namespace: String,
    backend: Backend,
    /// The last call failed (logged once when it starts, once when it ends).
    failing: AtomicBool,
}

enum Backend {
    Memory,
    #[cfg(feature = "redis-ratelimit")]
    /// Boxed: the scripts make it large beside the empty memory store.
    Redis(Box<redis::RedisState>),
}

impl std::fmt::Debug for SharedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState")
            .field("namespace", &self.namespace)
            .field("store", &self.store())
            .finish_non_exhaustive()
    }
}

impl SharedState {
    /// The store `[state]` asks for. The Redis one must be built inside a
    /// Tokio runtime; it connects on first use (Redis may be down at start).
    pub fn from_settings(settings: &StateSettings) -> Result<Self, StateError> {
        let backend = match &settings.backend {
            StateBackend::Memory => Backend::Memory,
            #[cfg(feature = "redis-ratelimit")]
            StateBackend::Redis(url) => Backend::Redis(Box::new(
                redis::RedisState::new(url).map_err(|e| StateError::RedisUrl(e.to_string()))?,
            )),
            #[cfg(not(feature = "redis-ratelimit"))]
            StateBackend::Redis(_) => return Err(StateError::RedisNotBuilt),
        };
        Ok(Self {
            namespace: settings.namespace.clone(),
            backend,
            failing: AtomicBool::new(false),
        })
    }

    /// This process's own state (one replica).
    pub fn memory() -> Self {
        Self {
            namespace: settings::DEFAULT_NAMESPACE.to_owned(),
            backend: Backend::Memory,
            failing: AtomicBool::new(false),
        }
    }

    /// Whether every replica of the deployment shares it.
    pub fn is_shared(&self) -> bool {
        !matches!(self.backend, Backend::Memory)
    }

    /// `memory` or `redis`.
    pub fn store(&self) -> &'static str {
        match self.backend {
            Backend::Memory => "memory",
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(_) => "redis",
        }
    }

    /// The deployment's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Uses `nonce` of `client` once across the fleet, remembered until
    /// `expires_ms`; at most `limits.0` unexpired ones in the fleet and
    /// `limits.1` of one client. [`Use::Local`] for the memory store.
    pub async fn use_once(
        &self,
        nonce: &str,
        client: &str,
        expires_ms: i64,
        now_ms: i64,
        limits: (usize, usize),
    ) -> Result<Use, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (nonce, client, expires_ms, now_ms, limits);
        match &self.backend {
            Backend::Memory => Ok(Use::Local),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let keys = [
                    key(&self.namespace, Kind::Nonce, nonce),
                    key(&self.namespace, Kind::UsedNonces, "all"),
                    key(
                        &self.namespace,
                        Kind::UsedNoncesOf,
                        &hex::encode(client.as_bytes()),
                    ),
                ];
                let answer = redis
                    .use_once(&keys, nonce, expires_ms, now_ms, limits)
                    .await;
                self.observe(answer)
            }
        }
    }

    /// Binds task `task_id` of `server` for the fleet: `value` (at most
    /// [`MAX_TASK_BYTES`], else nothing is written) for `ttl_ms`, at most
    /// `per_client` bindings of `client` (its oldest forgotten first).
    /// Nothing to do for the memory store.
    pub async fn bind_task(
        &self,
        ids: (&str, &str, &str),
        value: &str,
        ttls: (i64, i64),
        now_ms: i64,
        per_client: usize,
    ) -> Result<(), Unavailable> {
        self.bind(Kind::Task, ids, value, ttls, now_ms, per_client)
            .await
    }

    /// Binds 2025-era session `session` of `server` to `client` for the
    /// fleet ([`SESSION_TTL`], at most `per_client` of the client's).
    pub async fn bind_session(
        &self,
        ids: (&str, &str, &str),
        value: &str,
        now_ms: i64,
        per_client: usize,
    ) -> Result<(), Unavailable> {
        let ttl = SESSION_TTL.as_millis() as i64;
        self.bind(Kind::Session, ids, value, (ttl, ttl), now_ms, per_client)
            .await
    }

    /// The fleet's binding of session `session` of `server`, if any.
    pub async fn session(
        &self,
        server: &str,
        session: &str,
    ) -> Result<Option<String>, Unavailable> {
        self.get(Kind::Session, server, session).await
    }

    /// Forgets session `session` of `server` fleet-wide (ended).
    pub async fn forget_session(&self, server: &str, session: &str) -> Result<(), Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (server, session);
        match &self.backend {
            Backend::Memory => Ok(()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let gone = redis
                    .del(&self.pair_key(Kind::Session, server, session))
                    .await;
                self.observe(gone)
            }
        }
    }

    /// `value` under the key of `kind` for (server, id), within the bound of
    /// `client`'s bindings of that kind (the kind after it: `…Of`).
    async fn bind(
        &self,
        kind: Kind,
        (server, id, client): (&str, &str, &str),
        value: &str,
        (ttl_ms, max_ttl_ms): (i64, i64),
        now_ms: i64,
        per_client: usize,
    ) -> Result<(), Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (
            kind, server, id, client, value, ttl_ms, max_ttl_ms, now_ms, per_client,
        );
        match &self.backend {
            Backend::Memory => Ok(()),
            #[cfg(feature = "redis-ratelimit")]
            // Larger than any binding the gateway makes: not written.
            Backend::Redis(_) if value.len() > MAX_TASK_BYTES => Ok(()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let of = if kind == Kind::Task {
                    Kind::TasksOf
                } else {
                    Kind::SessionsOf
                };
                let keys = [
                    self.pair_key(kind, server, id),
                    key(&self.namespace, of, &hex::encode(client.as_bytes())),
                ];
                let written = redis
                    .bind_task(&keys, value, (ttl_ms, max_ttl_ms), now_ms, per_client)
                    .await;
                self.observe(written)
            }
        }
    }

    /// The fleet's binding of task `task_id` of `server`, when it has one
    /// (never for the memory store).
    pub async fn task(&self, server: &str, task_id: &str) -> Result<Option<String>, Unavailable> {
        self.get(Kind::Task, server, task_id).await
    }

    async fn get(&self, kind: Kind, server: &str, id: &str) -> Result<Option<String>, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (kind, server, id);
        match &self.backend {
            Backend::Memory => Ok(None),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => {
                let found = redis.get(&self.pair_key(kind, server, id)).await;
                self.observe(found)
            }
        }
    }

    /// The key of `kind` for `id` on `server` (both hex-encoded).
    #[cfg_attr(not(feature = "redis-ratelimit"), allow(dead_code))]
    fn pair_key(&self, kind: Kind, server: &str, id: &str) -> String {
        let id = format!(
            "{}.{}",
            hex::encode(server.as_bytes()),
            hex::encode(id.as_bytes())
        );
        key(&self.namespace, kind, &id)
    }

    /// The fleet's queue and pin approvals in Redis.
    #[cfg(feature = "redis-ratelimit")]
    fn fleet<'a>(&'a self, redis: &'a redis::RedisState) -> queue::Fleet<'a> {
        queue::Fleet {
            namespace: &self.namespace,
            redis,
        }
    }

    /// Queues a call for the fleet's operators ([`queue::Fleet::add`]); the
    /// memory store queues nothing (its queue is the approval gate's own).
    pub async fn queue_add(
        &self,
        ids: QueueIds<'_>,
        entry: &str,
        times: (i64, i64),
        limits: (usize, usize),
    ) -> Result<Queued, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (ids, entry, times, limits);
        match &self.backend {
            Backend::Memory => Ok(Queued::Full),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(r) => self.observe(self.fleet(r).add(ids, entry, times, limits).await),
        }
    }

    /// An operator's decision on a queued call, set once fleet-wide.
    pub async fn queue_decide(&self, id: &str, decision: &str) -> Result<Decided, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (id, decision);
        match &self.backend {
            Backend::Memory => Ok(Decided::Unknown),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(r) => self.observe(self.fleet(r).decide(id, decision).await),
        }
    }

    /// Takes a queued call's decision, once fleet-wide (`close`: or takes
    /// the undecided entry out as expired).
    pub async fn queue_settle(
        &self,
        ids: QueueIds<'_>,
        close: bool,
    ) -> Result<Settled, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (ids, close);
        match &self.backend {
            Backend::Memory => Ok(Settled::Gone),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(r) => self.observe(self.fleet(r).settle(ids, close).await),
        }
    }

    /// A queued call and its decision, if it lives.
    pub async fn queue_get(
        &self,
        id: &str,
    ) -> Result<Option<(String, Option<String>)>, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = id;
        match &self.backend {
            Backend::Memory => Ok(None),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(r) => self.observe(self.fleet(r).get(id).await),
        }
    }

    /// The fleet's queued calls with their decisions, at most `max`.
    pub async fn queue_list(
        &self,
        now_ms: i64,
        max: usize,
    ) -> Result<Vec<(String, Option<String>)>, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (now_ms, max);
        match &self.backend {
            Backend::Memory => Ok(Vec::new()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(r) => self.observe(self.fleet(r).list(now_ms, max).await),
        }
    }

    /// Records the fleet's approval of pin `pin`; `Ok(false)` when the
    /// bound of pins is reached. Nothing to record for the memory store.
    pub async fn pin_approve(&self, pin: &str, value: &str) -> Result<bool, Unavailable> {
        #[cfg(not(feature = "redis-ratelimit"))]
        let _ = (pin, value);
        match &self.backend {
            Backend::Memory => Ok(true),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(r) => self.observe(self.fleet(r).pin_approve(pin, value).await),
        }
    }

    /// The fleet's pin approvals (none for the memory store).
    pub async fn pin_approvals(&self) -> Result<Vec<(String, String)>, Unavailable> {
        match &self.backend {
            Backend::Memory => Ok(Vec::new()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(r) => self.observe(self.fleet(r).pin_approvals().await),
        }
    }

    /// For `/readyz`: the store, and whether it answers now.
    pub async fn health(&self) -> serde_json::Value {
        let reachable: Result<(), Unavailable> = match &self.backend {
            Backend::Memory => Ok(()),
            #[cfg(feature = "redis-ratelimit")]
            Backend::Redis(redis) => self.observe(redis.ping().await),
        };
        let mut out = serde_json::json!({
            "backend": self.store(),
            "namespace": self.namespace,
            "reachable": reachable.is_ok(),
        });
        if let Err(e) = reachable {
            out["error"] = e.detail.into();
        }
        out
    }

    /// Logs when failures start and end; turns an error into [`Unavailable`].
    #[cfg_attr(not(feature = "redis-ratelimit"), allow(dead_code))]
    fn observe<T, E: std::fmt::Display>(&self, answer: Result<T, E>) -> Result<T, Unavailable> {
        match answer {
            Ok(v) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::warn!(store = self.store(), "state store reachable again");
                }
                Ok(v)
            }
            Err(e) => {
                let detail = e.to_string();
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        store = self.store(),
                        error = %detail,
                        "state store unreachable: approvals that need it are refused (state_unavailable) until it answers"
                    );
                }
                Err(Unavailable {
                    store: self.store(),
                    detail,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            Just(Kind::Nonce),
            Just(Kind::UsedNonces),
            Just(Kind::UsedNoncesOf),
            Just(Kind::Task),
            Just(Kind::TasksOf),
            Just(Kind::Session),
            Just(Kind::SessionsOf),
            Just(Kind::Flow),
            Just(Kind::FlowsOf),
            Just(Kind::Flows),
            Just(Kind::Bucket),
            Just(Kind::Approval),
            Just(Kind::Decision),
            Just(Kind::ApprovalCall),
            Just(Kind::Approvals),
            Just(Kind::ApprovalsOf),
            Just(Kind::Pins)
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Two deployments' keys never collide: a key is equal to another only
        /// when namespace, kind and id are all equal.
        #[test]
        fn keys_of_different_deployments_never_collide(
            ns_a in "[a-z0-9_-]{1,8}", ns_b in "[a-z0-9_-]{1,8}",
            kind_a in kind(), kind_b in kind(),
            id_a in "[ -~]{0,12}", id_b in "[ -~]{0,12}",
        ) {
            prop_assert!(settings::valid_namespace(&ns_a) && settings::valid_namespace(&ns_b));
            let same = key(&ns_a, kind_a, &id_a) == key(&ns_b, kind_b, &id_b);
            prop_assert_eq!(same, ns_a == ns_b && kind_a == kind_b && id_a == id_b);
        }
    }

    #[test]
    fn a_namespace_holds_no_separator() {
        for bad in ["", "a:b", "A", "x y", &"a".repeat(65)] {
            assert!(!settings::valid_namespace(bad), "{bad:?}");
        }
        assert!(settings::valid_namespace("prod-eu_1"));
    }
}
