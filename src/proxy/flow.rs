//! The flow step of a request: whose session it belongs to, what that
//! session holds, whether a flow rule stops a call to a sink, and what a
//! successful call to a source tool, a read of a labelled resource or a get
//! of a labelled prompt will set.
//!
//! Place: in the call check after the access decision and the rules'
//! `arguments`, before the rate limit (a call a flow rule denies takes no
//! token); the mark is recorded by the reply's recipient once the result
//! came back successful (with the fleet's store: just before the call is
//! forwarded, see [`Recording::before_forward`]). Invariants: the session key always contains the
//! client, so no client reads or sets another's labels; a client-chosen
//! conversation key is bounded before it is kept.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::approval::Requirement;
use crate::auth::ClientId;
use crate::error::{Rejection, ToolRefusal};
use crate::flow::{FlowStore, Label, Mark, Recording, SessionKey, Then, Via, triggered};
use crate::mcp::request::Request;
use crate::mcp::version::Era;
use crate::policy::{Decision, Kind, Policy};
use crate::record::trail::Trail;
use crate::state::Unavailable;

/// The `_meta` key a 2026-era client names its conversation with.
pub(crate) const CONVERSATION_META: &str = "io.portcullis/conversation";

/// Longest conversation key kept (bytes); a longer one is cut.
const MAX_CONVERSATION: usize = 128;

/// The session of this call: the handshake-era session the client presented
/// (`client_session`: the merged view's own in the merged view, `merged`),
/// or in the 2026 era the conversation it names in `_meta`; else the client
/// alone.
pub(super) fn key(
    (era, client_session, merged): (Era, Option<&str>, bool),
    client: &ClientId,
    server: &str,
    message: &Request,
) -> SessionKey {
    let scope = match (era, client_session) {
        (Era::Legacy, Some(id)) if merged => format!("merged:{id}"),
        (Era::Legacy, Some(id)) => format!("session:{server}:{id}"),
        (Era::Legacy, None) => String::new(),
        (Era::Modern, _) => message
            .meta_str(CONVERSATION_META)
            .filter(|c| !c.is_empty())
            .map(|c| format!("conversation:{}", cut(c)))
            .unwrap_or_default(),
    };
    SessionKey {
        client: client.clone(),
        scope,
    }
}

fn cut(text: &str) -> &str {
    let mut end = text.len().min(MAX_CONVERSATION);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What a call to `tool` on `server` (with the pinned `annotations` the
/// call is decided on) meets of the flow rules: refused (`flow_denied`) when
/// a deny flow rule's labels are all held, the strictest approval of the
/// approval flow rules whose labels are held, or nothing; refused
/// (`state_unavailable`) when the store cannot say what the session holds.
/// Only a tool labelled as a sink is ever stopped.
pub(super) async fn check<'p>(
    (store, policy, flow): (&dyn FlowStore, &'p Policy, &crate::flow::FlowSettings),
    trail: &Trail,
    key: &SessionKey,
    (server, tool, annotations): (&str, &str, Option<&Value>),
    decision: &'p Decision,
) -> Result<Option<&'p Requirement>, Rejection> {
    if flow.tool(server, tool, annotations).0.sink.is_none() {
        return Ok(None);
    }
    let mut flows = policy.flows(decision).peekable();
    if flows.peek().is_none() {
        return Ok(None);
    }
    let held = store
        .held(key)
        .await
        .map_err(|e| unavailable(tool, &e, Unreadable::Held))?;
    // Only what the configuration still labels counts (a reload may have taken a label off).
    let held = crate::flow::current(&held, flow, store.marks_per_label());
    let mut approvals = Vec::new();
    for of in flows {
        let Some(marks) = triggered(of.flow, &held) else {
            continue;
        };
        let lines: Vec<String> = marks
            .iter()
            .map(|m| format!("flow: holds {}", m.describe()))
            .collect();
        trail.note(|e| e.violations.extend(lines));
        match of.flow.then {
            Then::Deny => return Err(denied(tool, of.rule, &marks)),
            Then::Approval => approvals.extend(of.approval),
        }
    }
    Ok(policy.strictest_approval(approvals))
}

/// What a call to `tool` on `server` (with the pinned `annotations` it is
/// decided on) will set in `key`'s session when it succeeds (a tool labelled
/// as a source, by the operator or by its trusted annotations).
pub(super) fn recording(
    store: &Arc<dyn FlowStore>,
    flow: &crate::flow::FlowSettings,
    key: SessionKey,
    (server, tool, annotations): (&str, &str, Option<&Value>),
) -> Option<Recording> {
    let (labels, via) = flow.tool(server, tool, annotations);
    let label = labels.source?;
    marked(store, key, server, tool, via, vec![label])
}

/// What a `resources/read` of `uri` (its canonical identity) on `server`
/// will set in `key`'s session once its content reaches the client.
pub(super) fn reading(
    store: &Arc<dyn FlowStore>,
    flow: &crate::flow::FlowSettings,
    key: SessionKey,
    server: &str,
    uri: &str,
) -> Option<Recording> {
    let labels = flow.resource(server, uri);
    marked(store, key, server, uri, Via::Resource, labels)
}

/// What a `prompts/get` of `name` on `server` will set in `key`'s session
/// once its messages reach the client.
pub(super) fn prompting(
    store: &Arc<dyn FlowStore>,
    flow: &crate::flow::FlowSettings,
    key: SessionKey,
    server: &str,
    name: &str,
) -> Option<Recording> {
    let labels = flow.prompt(server, name);
    marked(store, key, server, name, Via::Prompt, labels)
}

fn marked(
    store: &Arc<dyn FlowStore>,
    key: SessionKey,
    server: &str,
    name: &str,
    via: Via,
    labels: Vec<Label>,
) -> Option<Recording> {
    if labels.is_empty() {
        return None;
    }
    let marks = (labels.into_iter())
        .map(|label| Mark {
            label,
            server: server.to_owned(),
            name: name.to_owned(),
            via,
        })
        .collect();
    Some(Recording {
        store: store.clone(),
        key,
        marks,
    })
}

/// Just before a request is forwarded: the fleet's store keeps a source's
/// marks now (see [`Recording::before_forward`]); a request whose marks
/// cannot be kept is refused and not forwarded.
pub(super) async fn before_forward(
    flow: Option<&Recording>,
    trail: &Trail,
) -> Result<(), Rejection> {
    let Some(flow) = flow else {
        return Ok(());
    };
    let recorded = flow.before_forward().await;
    if recorded.as_ref().is_ok_and(|now| *now) {
        let lines = flow.audit_lines();
        trail.note(|e| e.violations.extend(lines));
    }
    let Err(e) = recorded else {
        return Ok(());
    };
    match flow.marks.first() {
        Some(Mark {
            via: Via::Tool | Via::Annotations,
            name,
            ..
        }) => Err(unavailable(name, &e, Unreadable::Record)),
        // A resource or a prompt is answered with a JSON-RPC error.
        _ => Err(Rejection::StateUnavailable(e.store)),
    }
}

/// The labels `key`'s session holds, as a rule's `when` reads them
/// (`labels`): only those the configuration still gives, each once, in order;
/// read only when some condition reads them. A store that cannot answer
/// refuses the call: a condition over labels is never decided on a guess.
pub(super) async fn labels(
    (store, policy, flow): (&dyn FlowStore, &Policy, &crate::flow::FlowSettings),
    key: &SessionKey,
    tool: &str,
) -> Result<Vec<&'static str>, Rejection> {
    held_labels((store, policy, flow), key, Kind::Tool)
        .await
        .map_err(|e| unavailable(tool, &e, Unreadable::Labels))
}

/// [`labels`] for a use of a subject of `kind` (a resource, a prompt: the
/// store's failure as it is, answered as that use's `state_unavailable`);
/// read only when a condition on that kind of rule reads them.
pub(super) async fn held_labels(
    (store, policy, flow): (&dyn FlowStore, &Policy, &crate::flow::FlowSettings),
    key: &SessionKey,
    kind: Kind,
) -> Result<Vec<&'static str>, Unavailable> {
    if !policy.reads_labels_of(kind) {
        return Ok(Vec::new());
    }
    let held = store.held(key).await?;
    let mut labels: Vec<&'static str> = crate::flow::current(&held, flow, store.marks_per_label())
        .iter()
        .map(|m| m.label.as_str())
        .collect();
    labels.sort_unstable();
    labels.dedup();
    Ok(labels)
}

/// What the flow store could not do.
#[derive(Debug, Clone, Copy)]
enum Unreadable {
    /// Say what a session holds (a sink call under a flow rule).
    Held,
    /// Say what a session holds for a rule's condition over `labels`.
    Labels,
    /// Keep a source call's label (before it is forwarded).
    Record,
}

/// `state_unavailable` for a `tools/call` whose flow labels could not be
/// read or stored: the call is not forwarded, and the text says why.
fn unavailable(tool: &str, e: &Unavailable, what: Unreadable) -> Rejection {
    let store = e.store;
    let why = match what {
        Unreadable::Held => format!(
            "`{tool}` can send data out of this conversation, and a flow rule decides such calls by what this \
             session has read; the gateway's shared state store ({store}) did not answer, so that cannot be known"
        ),
        Unreadable::Labels => format!(
            "a rule's condition decides `{tool}` by the flow labels this session holds; the gateway's shared \
             state store ({store}) did not answer, so they cannot be known"
        ),
        Unreadable::Record => format!(
            "`{tool}` brings data into this conversation that flow rules track, and the gateway's shared state \
             store ({store}) did not answer, so the label it sets could not be kept where every replica reads it"
        ),
    };
    let text = format!(
        "The call to `{tool}` was not run: {why}. Nothing was sent to the server. Retry shortly; if it keeps \
         failing, tell the gateway's operator that the {store} state store is unreachable."
    );
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("store".into(), store.into());
    Rejection::Tool(ToolRefusal {
        code: "state_unavailable",
        text,
        detail,
    })
}

/// `flow_denied`: which earlier calls set which labels, and what to do.
fn denied(tool: &str, rule: usize, marks: &[&Mark]) -> Rejection {
    let held: Vec<String> = marks.iter().map(|m| m.describe()).collect();
    let text = format!(
        "The call to `{tool}` was not run: `{tool}` can send data out of this conversation, and this session \
         has already read {} through earlier calls. This gateway's flow rule (rules[{rule}]) refuses such calls \
         once a session holds all of these, so that private data cannot leave on instructions from untrusted content. \
         Nothing was sent. To go on, start a new session or conversation that has not read these, or ask an operator \
         to change the rule; retrying in this session will not help.",
        held.join(" and ")
    );
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("rule".into(), format!("rules[{rule}]").into());
    detail.insert(
        "holds".into(),
        marks
            .iter()
            .map(|m| json!({"label": m.label.as_str(), "server": m.server, m.kind(): m.name}))
            .collect(),
    );
    Rejection::Tool(ToolRefusal {
        code: "flow_denied",
        text,
        detail,
    })
}
