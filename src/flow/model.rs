//! The vocabulary of flow rules: labels, a tool's labels, a compiled flow
//! rule, whose session, and one earlier call that set a label.
//!
//! Place: beneath the flow store and the policy, which both speak it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::auth::ClientId;

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
    /// The source labels some tool sets (a flow rule naming another could never act).
    pub fn sources(&self) -> BTreeSet<Label> {
        self.labels
            .values()
            .flat_map(|tools| tools.values().filter_map(|t| t.source))
            .collect()
    }

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
