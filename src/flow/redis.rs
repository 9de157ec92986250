//! The fleet's flow store: every replica of a deployment reads and writes
//! each session's labels in one Redis (`[state] backend = "redis"`).
//!
//! Place: behind [`super::FlowStore`], chosen by [`super::open`]; it opens
//! its connection the way the state store and the rate limiter do
//! ([`crate::state::redis::connect`]).
//!
//! Keys (all `portcullis:<namespace>:…`, [`crate::state::key`]): a session is
//! `flow:<client>.<scope>`, a list of marks `label:server:name` (names
//! hex-encoded; a fourth part `a`, `r` or `p` when the label came from a
//! tool's annotations, a resource or a prompt); `flows-of:<client>` and `flows:all` are the client's and the
//! deployment's sessions scored by last use, `flows:clients` how many each
//! client holds. The client part is the hex of its kind and name, so a named
//! client and a token's unlisted client of the same name never share a
//! session.
//!
//! Invariants: the limits are those of the in-process store, applied in one
//! atomic script run per write (`record.lua`) and one per read (`held.lua`):
//! one round trip each; every key has the session's idle lifetime as its TTL,
//! renewed on use; a call never waits longer than [`crate::state::CALL_TIMEOUT`]; an
//! answer that cannot be read is an error, never "nothing held".

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::future::{BoxFuture, FutureExt};
use redis::aio::ConnectionManager;
use redis::{RedisError, Script};

use super::model::{Label, Mark, SessionKey, Via};
use super::store::{FlowLimits, FlowStore};
use crate::auth::ClientId;
use crate::state::redis::{connect, in_time};
use crate::state::{Kind, SESSION_TTL, Unavailable, key};

/// Flow labels in Redis.
pub struct RedisFlows {
    connection: ConnectionManager,
    namespace: String,
    limits: FlowLimits,
    record: Script,
    held: Script,
    /// The last call failed (logged once when it starts, once when it ends).
    failing: AtomicBool,
    /// The last use given to a session (ms): uses from this replica are
    /// strictly ordered, as the in-process store's clock orders them.
    last_use: AtomicU64,
}

impl std::fmt::Debug for RedisFlows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFlows")
            .field("namespace", &self.namespace)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl RedisFlows {
    /// The store of deployment `namespace` at `url`; connects on first use.
    /// Inside a Tokio runtime.
    pub fn new(url: &str, namespace: &str, limits: FlowLimits) -> Result<Self, RedisError> {
        Ok(Self {
            connection: connect(url)?,
            namespace: namespace.to_owned(),
            limits: limits.normalised(),
            record: Script::new(include_str!("record.lua")),
            held: Script::new(include_str!("held.lua")),
            failing: AtomicBool::new(false),
            last_use: AtomicU64::new(0),
        })
    }

    fn session_key(&self, session: &SessionKey) -> String {
        let id = format!(
            "{}.{}",
            client_id(&session.client),
            hex::encode(session.scope.as_bytes())
        );
        key(&self.namespace, Kind::Flow, &id)
    }

    /// The client's sessions set, the deployment's, and the counts.
    fn sets(&self, client: &ClientId) -> [String; 3] {
        [
            key(&self.namespace, Kind::FlowsOf, &client_id(client)),
            key(&self.namespace, Kind::Flows, "all"),
            key(&self.namespace, Kind::Flows, "clients"),
        ]
    }

    async fn read(&self, session: &SessionKey) -> Result<Vec<Mark>, RedisError> {
        let [of, all, _] = self.sets(&session.client);
        let mut invocation = self.held.prepare_invoke();
        invocation
            .key(self.session_key(session))
            .key(of)
            .key(all)
            .arg(self.uses(1))
            .arg(ttl_ms());
        let mut connection = self.connection.clone();
        let marks: Vec<String> = in_time(invocation.invoke_async(&mut connection)).await?;
        marks
            .iter()
            .map(|m| {
                decode(m).ok_or_else(|| {
                    RedisError::from((redis::ErrorKind::Parse, "a flow mark that cannot be read"))
                })
            })
            .collect()
    }

    async fn write(&self, sessions: &[SessionKey], mark: &Mark) -> Result<(), RedisError> {
        let Some(client) = sessions.first().map(|s| &s.client) else {
            return Ok(());
        };
        debug_assert!(sessions.iter().all(|s| s.client == *client));
        let mut invocation = self.record.prepare_invoke();
        for set in self.sets(client) {
            invocation.key(set);
        }
        for session in sessions {
            invocation.key(self.session_key(session));
        }
        invocation
            .arg(self.uses(sessions.len() as u64))
            .arg(ttl_ms())
            .arg(self.limits.sessions)
            .arg(self.limits.sessions_per_client)
            .arg(self.limits.marks_per_label)
            .arg(encode(mark))
            .arg(mark.label.as_str())
            .arg(client_id(client))
            .arg(key(&self.namespace, Kind::FlowsOf, ""));
        let mut connection = self.connection.clone();
        in_time(invocation.invoke_async::<i64>(&mut connection)).await?;
        Ok(())
    }

    /// The first of `n` uses (ms since the epoch), after every earlier one
    /// of this replica: the sessions of one write are used one after the other.
    fn uses(&self, n: u64) -> u64 {
        let now = now_ms();
        let mut first = now;
        let _ = self
            .last_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                first = now.max(last + 1);
                Some(first + n.max(1) - 1)
            });
        first
    }

    /// Logs when failures start and end; turns an error into [`Unavailable`].
    fn observe<T>(&self, answer: Result<T, RedisError>) -> Result<T, Unavailable> {
        match answer {
            Ok(v) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::warn!(store = "redis", "flow label store reachable again");
                }
                Ok(v)
            }
            Err(e) => {
                let detail = e.to_string();
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        store = "redis",
                        error = %detail,
                        "flow label store unreachable: calls to labelled tools under a flow rule are refused \
                         (state_unavailable) until it answers"
                    );
                }
                Err(Unavailable {
                    store: "redis",
                    detail,
                })
            }
        }
    }
}

impl FlowStore for RedisFlows {
    fn marks_per_label(&self) -> usize {
        self.limits.marks_per_label
    }

    fn held<'a>(&'a self, key: &'a SessionKey) -> BoxFuture<'a, Result<Vec<Mark>, Unavailable>> {
        async move { self.observe(self.read(key).await) }.boxed()
    }

    fn record<'a>(
        &'a self,
        keys: &'a [SessionKey],
        mark: &'a Mark,
    ) -> BoxFuture<'a, Result<(), Unavailable>> {
        async move { self.observe(self.write(keys, mark).await) }.boxed()
    }

    fn shared(&self) -> bool {
        true
    }
}

/// The client's part of a key: the hex of its kind and name.
fn client_id(client: &ClientId) -> String {
    let kind = if client.is_anonymous() {
        "a"
    } else if client.is_unlisted() {
        "u"
    } else {
        "n"
    };
    hex::encode(format!("{kind}:{}", client.name()))
}

/// `label:server:name[:via]`, the names hex-encoded (so `:` stays a
/// separator); a mark of a tool the operator labelled has no fourth part,
/// as before there were other kinds.
fn encode(mark: &Mark) -> String {
    let via = match mark.via {
        Via::Tool => "",
        Via::Annotations => ":a",
        Via::Resource => ":r",
        Via::Prompt => ":p",
    };
    format!(
        "{}:{}:{}{via}",
        mark.label,
        hex::encode(mark.server.as_bytes()),
        hex::encode(mark.name.as_bytes())
    )
}

fn decode(text: &str) -> Option<Mark> {
    let mut parts = text.split(':');
    let (label, server, name) = (parts.next()?, parts.next()?, parts.next()?);
    let via = match parts.next() {
        None => Via::Tool,
        Some("a") => Via::Annotations,
        Some("r") => Via::Resource,
        Some("p") => Via::Prompt,
        Some(_) => return None,
    };
    if parts.next().is_some() {
        return None;
    }
    let label = Label::ALL.iter().find(|(n, _)| *n == label)?.1;
    let text = |h: &str| String::from_utf8(hex::decode(h).ok()?).ok();
    Some(Mark {
        label,
        server: text(server)?,
        name: text(name)?,
        via,
    })
}

fn ttl_ms() -> u64 {
    SESSION_TTL.as_millis() as u64
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A mark read back is the mark written, whatever its names hold.
        #[test]
        fn a_mark_reads_back_as_written(server in "\\PC{0,16}", name in "\\PC{0,16}", private in any::<bool>(), via in 0..4usize) {
            let label = if private { Label::Private } else { Label::Untrusted };
            let via = [Via::Tool, Via::Annotations, Via::Resource, Via::Prompt][via];
            let mark = Mark { label, server, name, via };
            prop_assert_eq!(decode(&encode(&mark)), Some(mark));
        }
    }

    #[test]
    fn clients_of_one_name_and_another_kind_do_not_share_a_key() {
        let ids = [
            client_id(&ClientId::named("x")),
            client_id(&ClientId::unlisted("x")),
            client_id(&ClientId::anonymous()),
            client_id(&ClientId::named("anonymous")),
        ];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
