//! Flow rules: what a session has read decides what it may send out.
//!
//! Operators label tools per server (`[servers.NAME.labels]`, or by their
//! annotations with `labels_from_annotations`), and resources and prompts
//! (`resource_labels`, `prompt_labels`): a *source* (`private`, `untrusted`)
//! marks what a successful request brings into the conversation, a *sink*
//! (`egress`, tools only) marks a tool that can carry data out. A
//! session keeps every source label its successful calls set, sticky, and an
//! allow rule's `flow = { holds, then }` denies (or puts to a person) a call
//! to a sink once the session holds all the labels it names: the "lethal
//! trifecta" of private data, untrusted content and an exfiltration channel.
//!
//! Place: a decision beside the policy, which owns the compiled [`FlowRule`]
//! of a rule; the proxy derives the [`SessionKey`] of a call, asks the
//! [`FlowStore`] what the session holds before the call, and records what a
//! call set once its result came back successful.
//!
//! Invariants: labels only ever accumulate within a session (nothing the
//! client sends removes one); the store is bounded in total and per client,
//! and what it drops first is a client's own least recently used session; a
//! session of one client is never seen by another (the client is part of
//! the key). With the fleet's store (`[state] backend = "redis"`) a source
//! call's mark is stored before the call is forwarded, and a call whose mark
//! cannot be stored is not forwarded: no result reaches a client without its
//! label being where every replica reads it.

mod model;
#[cfg(feature = "redis-ratelimit")]
mod redis;
mod store;

use std::sync::Arc;

use futures_util::FutureExt;

pub use model::{
    FlowRule, FlowSettings, Label, Labelled, Mark, SessionKey, Sink, Then, ToolLabels, Via,
    from_annotations,
};
#[cfg(feature = "redis-ratelimit")]
pub use redis::RedisFlows;
pub use store::{FlowLimits, FlowStore, MemoryFlows};

use crate::state::{StateBackend, StateError, StateSettings, Unavailable};

/// The store `[state]` asks for: this process's, or the deployment's in
/// Redis (inside a Tokio runtime; it connects on first use).
pub fn open(state: &StateSettings, limits: FlowLimits) -> Result<Arc<dyn FlowStore>, StateError> {
    match &state.backend {
        StateBackend::Memory => Ok(Arc::new(MemoryFlows::new(limits))),
        #[cfg(feature = "redis-ratelimit")]
        StateBackend::Redis(url) => Ok(Arc::new(
            RedisFlows::new(url, &state.namespace, limits)
                .map_err(|e| StateError::RedisUrl(e.to_string()))?,
        )),
        #[cfg(not(feature = "redis-ratelimit"))]
        StateBackend::Redis(_) => Err(StateError::RedisNotBuilt),
    }
}

/// What a request will set once the server's content reaches the client:
/// its marks (one per label; a resource may match patterns of two), in its
/// own session and in its client's client-wide scope (so that a request
/// naming no session or conversation sees every label the client's sessions
/// hold).
#[derive(Debug, Clone)]
pub struct Recording {
    pub store: Arc<dyn FlowStore>,
    pub key: SessionKey,
    pub marks: Vec<Mark>,
}

impl Recording {
    /// The call's session, and its client's client-wide scope.
    fn keys(&self) -> Vec<SessionKey> {
        let mut keys = vec![self.key.clone()];
        if !self.key.scope.is_empty() {
            keys.push(SessionKey {
                client: self.key.client.clone(),
                scope: String::new(),
            });
        }
        keys
    }

    /// Just before the call is forwarded. A store the fleet shares records
    /// the mark now, whatever the call's outcome will be: recorded after the
    /// result instead, a write that fails once the client has the result
    /// would let a later sink call through on any replica. `Err` when the
    /// store cannot take it: the call must not be forwarded.
    /// `Ok(true)` when it recorded the mark now.
    pub async fn before_forward(&self) -> Result<bool, Unavailable> {
        if !self.store.shared() {
            return Ok(false);
        }
        let keys = self.keys();
        for mark in &self.marks {
            self.store.record(&keys, mark).await?;
        }
        Ok(true)
    }

    /// The server's content reached the client: this process's own store
    /// records the mark now (a shared one did before the call was forwarded).
    /// The audit's lines once the store took the marks: `flow: sets LABEL`.
    pub fn audit_lines(&self) -> Vec<String> {
        (self.marks.iter())
            .map(|m| format!("flow: sets {}", m.label))
            .collect()
    }

    /// True when it recorded the mark now.
    pub fn after_result(&self) -> bool {
        if self.store.shared() {
            return false;
        }
        let keys = self.keys();
        for mark in &self.marks {
            // An in-process store answers at once: there is nothing to wait for.
            let recorded = self.store.record(&keys, mark).now_or_never();
            debug_assert!(
                recorded.is_some(),
                "an in-process flow store answers at once"
            );
        }
        true
    }
}

/// The marks of `held` that still count under `settings`: those whose tool,
/// resource or prompt the configuration still labels with the mark's label
/// (a reload that takes a source label off a tool releases what its calls set; the marks
/// are kept, so putting the label back holds them again). A label whose
/// remembered marks all lost their label stays held when it has
/// `per_label` marks, the store's bound: a call it did not remember may
/// have set it through a tool that is still labelled.
pub fn current(held: &[Mark], settings: &FlowSettings, per_label: usize) -> Vec<Mark> {
    let labelled = |m: &Mark| settings.still_labels(m);
    let of = |label: Label| held.iter().filter(move |m| m.label == label);
    let stays =
        |m: &Mark| labelled(m) || (!of(m.label).any(labelled) && of(m.label).count() >= per_label);
    held.iter().filter(|m| stays(m)).cloned().collect()
}

/// The marks of `held` that make `rule` act: one per label it names (the
/// earliest call that set it), or `None` when a label is missing.
pub fn triggered<'m>(rule: &FlowRule, held: &'m [Mark]) -> Option<Vec<&'m Mark>> {
    rule.holds
        .iter()
        .map(|label| held.iter().find(|m| m.label == *label))
        .collect()
}

#[cfg(test)]
mod tests;
