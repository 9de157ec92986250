//! One `[[rules]]` entry as compiled: what it matches, what it does, its
//! token bucket, and how a rule matches a client.
//!
//! Place: beneath the policy's decision and its rule index, which both read
//! rules. Invariant: a wildcard never matches the anonymous client; only its
//! literal name does.

use std::num::NonZeroU32;

use super::glob::Glob;
use super::subject::Subject;
use crate::auth::ClientId;
use crate::validate::CompiledSchema;

/// One `[[rules]]` entry, compiled.
#[derive(Debug)]
pub struct Rule {
    /// Position in the file's `[[rules]]` array (0-based, shown as `rules[N]`).
    pub index: usize,
    pub clients: Vec<Glob>,
    pub servers: Vec<Glob>,
    pub tools: Vec<Glob>,
    pub resources: Vec<Glob>,
    pub prompts: Vec<Glob>,
    pub action: Action,
    pub rate: Option<Rate>,
    pub arguments: Option<CompiledSchema>,
    /// `approval = { … }`: a person approves each call (allow rules with tools only).
    pub approval: Option<crate::approval::Requirement>,
    /// `when = "…"`: the rule matches only where this CEL expression is true
    /// (on a rule that names one kind of subject: tools, resources or prompts).
    pub when: Option<super::expression::Expression>,
    /// `flow = { holds, then }`: what the rule's calls to a sink get once the
    /// session holds the labels named.
    pub flow: Option<crate::flow::FlowRule>,
}

/// What a rule does with what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

/// A rule's token bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Calls allowed at once from a full bucket.
    pub burst: NonZeroU32,
    /// Tokens added per second (finite, > 0).
    pub per_second: f64,
    /// Who shares a bucket.
    pub key: RateKey,
}

/// Who shares a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateKey {
    /// One bucket per client, across the rule's tools.
    Client,
    /// One bucket per client per tool.
    ClientTool,
    /// One bucket for everybody.
    All,
}

// === impl Rule ===

impl Rule {
    pub(super) fn matches(&self, client: &ClientId, server: &str, subject: Subject<'_>) -> bool {
        let targets = match subject {
            Subject::Tool(name) => (&self.tools, name),
            Subject::Resource(uri) => (&self.resources, uri),
            Subject::Prompt(name) => (&self.prompts, name),
        };
        targets.0.iter().any(|g| g.matches(targets.1))
            && self.servers.iter().any(|g| g.matches(server))
            && self.clients.iter().any(|g| client_matches(g, client))
    }
}

/// `"*"` (and any wildcard) covers authenticated clients only; the anonymous
/// client is matched by its name alone.
pub(super) fn client_matches(glob: &Glob, client: &ClientId) -> bool {
    if client.is_anonymous() && !glob.is_literal() {
        return false;
    }
    glob.matches(client.name())
}

// === impl Rate ===

impl Rate {
    /// `3 calls, then 1 every 20 s, per client` style text.
    pub fn describe(&self) -> String {
        let key = match self.key {
            RateKey::Client => "per client",
            RateKey::ClientTool => "per client and tool",
            RateKey::All => "shared by all clients",
        };
        format!("{}, {key}", self.quota_text())
    }

    /// `3 calls, then 1 every 20 s` style text: the bucket without who shares it.
    pub fn quota_text(&self) -> String {
        let every = 1.0 / self.per_second;
        let refill = if self.per_second >= 1.0 {
            format!("{} per second", trim_float(self.per_second))
        } else {
            format!("1 every {} s", trim_float(every))
        };
        let calls = if self.burst.get() == 1 {
            "call"
        } else {
            "calls"
        };
        format!("{} {calls}, then {refill}", self.burst)
    }
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}
