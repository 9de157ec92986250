//! The vocabulary of flow rules: labels, the labels of tools (named by the
//! operator or read from trusted annotations), resources and prompts, a
//! compiled flow rule, whose session, and one earlier request that set a label.
//!
//! Place: beneath the flow store and the policy, which both speak it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

use crate::auth::ClientId;
use crate::policy::glob::Glob;

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

/// A resource URI pattern or a prompt name pattern, and the source label
/// what it names brings into a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labelled {
    pub pattern: Glob,
    pub source: Label,
}

/// The flow labels of every server: tools named in `[servers.NAME.labels]`,
/// tools labelled by their annotations where the operator trusts them, and
/// resources and prompts.
#[derive(Debug, Default, PartialEq)]
pub struct FlowSettings {
    /// `[servers.NAME.labels]`: server → tool → labels.
    pub labels: BTreeMap<String, BTreeMap<String, ToolLabels>>,
    /// Servers with `labels_from_annotations = true`.
    pub from_annotations: BTreeSet<String>,
    /// `[servers.NAME.resource_labels]`: server → canonical URI patterns.
    pub resources: BTreeMap<String, Vec<Labelled>>,
    /// `[servers.NAME.prompt_labels]`: server → prompt name patterns.
    pub prompts: BTreeMap<String, Vec<Labelled>>,
}

impl FlowSettings {
    /// The source labels something sets (a flow rule naming another could never act).
    pub fn sources(&self) -> BTreeSet<Label> {
        let tools = self
            .labels
            .values()
            .flat_map(|tools| tools.values().filter_map(|t| t.source));
        let named = (self.resources.values().chain(self.prompts.values()))
            .flat_map(|list| list.iter().map(|l| l.source));
        // A trusted `openWorldHint` marks a tool `untrusted`.
        let annotated = (!self.from_annotations.is_empty()).then_some(Label::Untrusted);
        tools.chain(named).chain(annotated).collect()
    }

    /// The labels of `tool` on `server`, whose pinned annotations are
    /// `annotations`: the operator's entry when there is one (it wins whole,
    /// source and sink), else what the annotations say when the server's are
    /// trusted, else none. Also says whether they came from the annotations.
    pub fn tool(&self, server: &str, tool: &str, annotations: Option<&Value>) -> (ToolLabels, Via) {
        if let Some(labels) = self.labels.get(server).and_then(|tools| tools.get(tool)) {
            return (*labels, Via::Tool);
        }
        if !self.from_annotations.contains(server) {
            return (ToolLabels::default(), Via::Tool);
        }
        (from_annotations(annotations), Via::Annotations)
    }

    /// Every source label a read of the resource `uri` (its canonical
    /// identity) on `server` sets: one per label of the patterns it matches.
    pub fn resource(&self, server: &str, uri: &str) -> Vec<Label> {
        matching(self.resources.get(server), uri)
    }

    /// Every source label getting the prompt `name` on `server` sets.
    pub fn prompt(&self, server: &str, name: &str) -> Vec<Label> {
        matching(self.prompts.get(server), name)
    }

    /// Whether the configuration still gives `mark`'s label to what set it
    /// (a reload may have taken it off). A mark set through a tool's
    /// annotations counts while the server's annotations are trusted and no
    /// entry of the operator's names the tool: the content was read when the
    /// tool said it reaches an open world, whatever it says later.
    pub fn still_labels(&self, mark: &Mark) -> bool {
        let server = mark.server.as_str();
        match mark.via {
            Via::Tool | Via::Annotations => {
                match self.labels.get(server).and_then(|t| t.get(&mark.name)) {
                    Some(labels) => labels.source == Some(mark.label),
                    None => {
                        mark.via == Via::Annotations
                            && mark.label == Label::Untrusted
                            && self.from_annotations.contains(server)
                    }
                }
            }
            Via::Resource => self.resource(server, &mark.name).contains(&mark.label),
            Via::Prompt => self.prompt(server, &mark.name).contains(&mark.label),
        }
    }
}

/// The labels a tool's annotations give it: `openWorldHint: true` makes it
/// a source of `untrusted` content, and a sink too unless `readOnlyHint:
/// true`. An annotation that is absent (or not a boolean) gives nothing: the
/// specification's default for `openWorldHint` is a guess, not the server's word.
pub fn from_annotations(annotations: Option<&Value>) -> ToolLabels {
    let hint = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .and_then(Value::as_bool)
    };
    if hint("openWorldHint") != Some(true) {
        return ToolLabels::default();
    }
    ToolLabels {
        source: Some(Label::Untrusted),
        sink: (hint("readOnlyHint") != Some(true)).then_some(Sink::Egress),
    }
}

fn matching(list: Option<&Vec<Labelled>>, text: &str) -> Vec<Label> {
    let mut labels: Vec<Label> = list
        .into_iter()
        .flatten()
        .filter(|l| l.pattern.matches(text))
        .map(|l| l.source)
        .collect();
    labels.sort();
    labels.dedup();
    labels
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

/// What brought a label into a session, and so what a mark's name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A call to a tool the operator labelled.
    Tool,
    /// A call to a tool labelled by its trusted annotations.
    Annotations,
    /// A `resources/read` (the name is the URI's canonical identity).
    Resource,
    /// A `prompts/get`.
    Prompt,
}

/// One earlier request that set a label: which tool, resource or prompt, on which server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub label: Label,
    pub server: String,
    /// The tool's or prompt's name, or the resource's URI.
    pub name: String,
    pub via: Via,
}

impl Mark {
    /// `private (echo on py)`, `private (resource file:///a on py)`,
    /// `untrusted (prompt greet on py)`.
    pub fn describe(&self) -> String {
        format!("{} ({} on {})", self.label, self.what(), self.server)
    }

    /// `echo`, `resource file:///a`, `prompt greet`.
    pub fn what(&self) -> String {
        match self.via {
            Via::Tool | Via::Annotations => self.name.clone(),
            Via::Resource => format!("resource {}", self.name),
            Via::Prompt => format!("prompt {}", self.name),
        }
    }

    /// The key naming what set it in a refusal's detail: `tool`, `resource` or `prompt`.
    pub fn kind(&self) -> &'static str {
        match self.via {
            Via::Tool | Via::Annotations => "tool",
            Via::Resource => "resource",
            Via::Prompt => "prompt",
        }
    }
}
