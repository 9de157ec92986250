#![allow(clippy::result_large_err)]

use super::*;
use crate::auth::ClientId;

fn key(client: &str, scope: &str) -> SessionKey {
    SessionKey {
        client: ClientId::named(client),
        scope: scope.into(),
    }
}

fn mark(label: Label, tool: &str) -> Mark {
    Mark {
        label,
        server: "s".into(),
        tool: tool.into(),
    }
}

#[test]
fn labels_are_sticky_per_session_and_never_seen_by_another_client() {
    let store = MemoryFlows::default();
    store.record(&key("alice", "c1"), mark(Label::Private, "read"));
    store.record(&key("alice", "c1"), mark(Label::Untrusted, "fetch"));
    assert_eq!(store.held(&key("alice", "c1")).len(), 2);
    assert!(store.held(&key("alice", "c2")).is_empty());
    assert!(store.held(&key("bob", "c1")).is_empty());
}

#[test]
fn a_flow_rule_acts_only_when_every_label_is_held_and_names_the_first_calls() {
    let rule = FlowRule {
        holds: vec![Label::Private, Label::Untrusted],
        then: Then::Deny,
    };
    let private = [mark(Label::Private, "read"), mark(Label::Private, "again")];
    assert!(triggered(&rule, &private).is_none());
    let both = [
        private[0].clone(),
        private[1].clone(),
        mark(Label::Untrusted, "fetch"),
    ];
    let marks = triggered(&rule, &both).expect("held");
    let tools: Vec<&str> = marks.iter().map(|m| m.tool.as_str()).collect();
    assert_eq!(tools, ["read", "fetch"]);
}

#[test]
fn the_store_is_bounded_and_one_clients_flood_evicts_only_its_own_sessions() {
    let store = MemoryFlows::new(FlowLimits {
        sessions: 100,
        sessions_per_client: 3,
        marks_per_label: 2,
    });
    store.record(&key("alice", "a"), mark(Label::Private, "read"));
    for i in 0..1000 {
        store.record(
            &key("mallory", &format!("m{i}")),
            mark(Label::Private, "read"),
        );
    }
    assert_eq!(store.len(), 1 + 3);
    assert_eq!(store.held(&key("alice", "a")).len(), 1);
    // Marks per label are bounded; the label itself stays.
    for i in 0..10 {
        store.record(&key("alice", "a"), mark(Label::Private, &format!("t{i}")));
    }
    assert_eq!(store.held(&key("alice", "a")).len(), 2);
}

#[test]
fn a_recording_also_marks_the_clients_wide_scope() {
    let store: Arc<dyn FlowStore> = Arc::new(MemoryFlows::default());
    let recording = Recording {
        store: store.clone(),
        key: key("alice", "conversation:x"),
        mark: mark(Label::Untrusted, "fetch"),
    };
    let held = |k: SessionKey| {
        let store = store.clone();
        futures_executor::block_on(async move { store.held(&k).await.expect("memory answers") })
    };
    // This process's store keeps nothing before the call ran, and the mark once its result came back.
    futures_executor::block_on(recording.before_forward()).expect("memory answers");
    assert!(held(key("alice", "conversation:x")).is_empty());
    recording.after_result();
    assert_eq!(held(key("alice", "")).len(), 1);
    assert_eq!(held(key("alice", "conversation:x")).len(), 1);
    assert!(held(key("alice", "conversation:y")).is_empty());
}

#[test]
fn the_configuration_names_known_labels_and_rules_that_can_act() {
    let base = |labels: &str, flow: &str| {
        format!(
            "[servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n[servers.s.labels]\n{labels}\n\
             [clients.a]\napi_key_sha256 = \"{}\"\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"s\"]\ntools = [\"*\"]\naction = \"allow\"\n{flow}\n",
            "0".repeat(64)
        )
    };
    let load = |text: String| crate::config::load_str(&text, "t.toml", &|_| None);
    let ok = load(base(
        "\"read\" = { source = \"private\" }\n\"send\" = { sink = \"egress\" }",
        "flow = { holds = [\"private\"], then = \"deny\" }",
    ))
    .expect("valid");
    assert_eq!(ok.flow.labels("s", "send").sink, Some(Sink::Egress));
    let shown = ok.policy.describe(&[ClientId::named("a")], &["s"]);
    assert!(
        shown.contains(
            "flow: calls to egress tools are refused once the session holds private (rules[0])"
        ),
        "{shown}"
    );
    let asks = load(base(
        "\"read\" = { source = \"private\" }",
        "flow = { holds = [\"private\"], then = \"approval\" }\napproval = { by = \"user\" }",
    ))
    .expect("valid");
    let shown = asks.policy.describe(&[ClientId::named("a")], &["s"]);
    assert!(
        shown.contains("flow: calls to egress tools need approval"),
        "{shown}"
    );
    assert!(
        !shown.contains("+ approval"),
        "asked only once the labels are held: {shown}"
    );
    assert_eq!(ok.flow.labels("s", "read").source, Some(Label::Private));
    let refused = |labels: &str, flow: &str, key: &str| {
        let e = load(base(labels, flow)).expect_err("refused");
        assert_eq!(e.key, key, "{e}");
    };
    refused(
        "\"read\" = { source = \"secret\" }",
        "",
        "servers.s.labels.read.source",
    );
    refused("\"read\" = {}", "", "servers.s.labels.read");
    refused(
        "\"read\" = { source = \"private\" }",
        "flow = { holds = [\"untrusted\"], then = \"deny\" }",
        "rules[0].flow.holds[0]",
    );
    refused(
        "\"read\" = { source = \"private\" }",
        "flow = { holds = [\"private\"], then = \"approval\" }",
        "rules[0].flow.then",
    );
}

/// A mark counts while the configuration still labels its tool so: a reload
/// that takes the label off a tool releases what that tool's calls set,
/// and one that puts it back holds it again (the mark was kept). A label
/// whose remembered calls are all unlabelled now is still held when the
/// session reached the per-label bound: a call it did not remember may
/// have set it through a tool that is still labelled.
#[test]
fn a_mark_counts_while_its_tool_still_carries_the_label() {
    let settings = |labelled: &[&str]| FlowSettings {
        labels: [(
            "s".to_owned(),
            labelled
                .iter()
                .map(|t| {
                    let labels = ToolLabels {
                        source: Some(Label::Private),
                        sink: None,
                    };
                    ((*t).to_owned(), labels)
                })
                .collect(),
        )]
        .into(),
    };
    let held = vec![mark(Label::Private, "read"), mark(Label::Private, "again")];
    let kept = |labelled: &[&str], held: &[Mark], bound: usize| -> Vec<String> {
        current(held, &settings(labelled), bound)
            .into_iter()
            .map(|m| m.tool)
            .collect()
    };
    assert_eq!(kept(&["read", "again"], &held, 3), ["read", "again"]);
    assert_eq!(kept(&["again"], &held, 3), ["again"]);
    assert!(kept(&[], &held, 3).is_empty(), "the label is released");
    assert!(kept(&["other"], &held, 3).is_empty());
    // At the bound, an unremembered call may hold it: kept, all of them.
    assert_eq!(kept(&["other"], &held, 2), ["read", "again"]);
    // Another server's tool of the same name is another tool.
    let elsewhere = vec![Mark {
        server: "t".into(),
        ..mark(Label::Private, "read")
    }];
    assert!(kept(&["read"], &elsewhere, 3).is_empty());
}
