//! Flow rules: what a session has read decides what it may send out.
//!
//! Operators label tools per server (`[servers.NAME.labels]`): a *source*
//! (`private`, `untrusted`) marks what a successful call brings into the
//! conversation, a *sink* (`egress`) marks a tool that can carry data out. A
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
//! the key).

mod model;
mod store;

use std::sync::Arc;

pub use model::{FlowRule, FlowSettings, Label, Mark, SessionKey, Sink, Then, ToolLabels};
pub use store::{FlowLimits, FlowStore, MemoryFlows};

/// What a call will set once its result comes back successful: its mark, in
/// its own session and in its client's client-wide scope (so that a request
/// naming no session or conversation sees every label the client's sessions
/// hold).
#[derive(Debug, Clone)]
pub struct Recording {
    pub store: Arc<dyn FlowStore>,
    pub key: SessionKey,
    pub mark: Mark,
}

impl Recording {
    /// Records the mark (the call succeeded).
    pub fn record(&self) {
        self.store.record(&self.key, self.mark.clone());
        if !self.key.scope.is_empty() {
            let wide = SessionKey {
                client: self.key.client.clone(),
                scope: String::new(),
            };
            self.store.record(&wide, self.mark.clone());
        }
    }
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
