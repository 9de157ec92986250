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

mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::auth::ClientId;

pub use store::{FlowLimits, FlowStore, MemoryFlows};

/// A source label: what a successful call brought into the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Label {
    /// Data the client's user may see but the world should not.
    Private,
    /// Content anyone could have written (web pages, issues, mail).
    Untrusted,
}

impl Label {
    /// Every label, as written in the configuration.
    pub const ALL: [(&'static str, Label); 2] =
        [("private", Label::Private), ("untrusted", Label::Untrusted)];

    pub fn as_str(self) -> &'static str {
        match self {
            Label::Private => "private",
            Label::Untrusted => "untrusted",
        }
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sink label: what a call can carry out of the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// Sends data somewhere outside (mail, HTTP, a ticket, a booking).
    Egress,
}

/// The labels of one tool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolLabels {
    pub source: Option<Label>,
    pub sink: Option<Sink>,
}

/// `[servers.NAME.labels]` of every server: server → tool → labels.
#[derive(Debug, Default, PartialEq)]
pub struct FlowSettings {
    pub labels: BTreeMap<String, BTreeMap<String, ToolLabels>>,
}

impl FlowSettings {
    /// The labels of `tool` on `server` (none when the operator gave none).
    pub fn labels(&self, server: &str, tool: &str) -> ToolLabels {
        self.labels
            .get(server)
            .and_then(|tools| tools.get(tool))
            .copied()
            .unwrap_or_default()
    }
}

/// `flow = { holds, then }` of an allow rule, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRule {
    /// The session must hold every one of these for the rule to act.
    pub holds: Vec<Label>,
    pub then: Then,
}

/// What a flow rule does to a sink call once the session holds its labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// The call is refused (`flow_denied`).
    Deny,
    /// The call needs the rule's `approval` (asked only then).
    Approval,
}

/// Whose labels: a client and, within it, one session or conversation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub client: ClientId,
    /// `session:<server>:<id>`, `merged:<id>`, `conversation:<key>`, or empty
    /// (the client alone, when it names no session or conversation).
    pub scope: String,
}

/// One earlier call that set a label: which tool, on which server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub label: Label,
    pub server: String,
    pub tool: String,
}

impl Mark {
    /// `private (echo on py)` style text.
    pub fn describe(&self) -> String {
        format!("{} ({} on {})", self.label, self.tool, self.server)
    }
}

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
