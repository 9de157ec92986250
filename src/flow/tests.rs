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
        name: tool.into(),
        via: Via::Tool,
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
    let tools: Vec<&str> = marks.iter().map(|m| m.name.as_str()).collect();
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
        marks: vec![mark(Label::Untrusted, "fetch")],
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
    assert_eq!(ok.flow.tool("s", "send", None).0.sink, Some(Sink::Egress));
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
    assert_eq!(
        ok.flow.tool("s", "read", None).0.source,
        Some(Label::Private)
    );
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
        ..FlowSettings::default()
    };
    let held = vec![mark(Label::Private, "read"), mark(Label::Private, "again")];
    let kept = |labelled: &[&str], held: &[Mark], bound: usize| -> Vec<String> {
        current(held, &settings(labelled), bound)
            .into_iter()
            .map(|m| m.name)
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

/// The annotations' labels: `openWorldHint: true` makes a source of
/// `untrusted` content, and a sink unless `readOnlyHint: true`; anything
/// else (absent, false, not a boolean) gives no label at all.
#[test]
fn annotations_give_labels_only_from_an_open_world_hint_said_outright() {
    use serde_json::json;
    let untrusted = Some(Label::Untrusted);
    let cases = [
        (
            json!({"openWorldHint": true}),
            untrusted,
            Some(Sink::Egress),
        ),
        (
            json!({"openWorldHint": true, "readOnlyHint": false}),
            untrusted,
            Some(Sink::Egress),
        ),
        (
            json!({"openWorldHint": true, "readOnlyHint": true}),
            untrusted,
            None,
        ),
        (json!({"openWorldHint": false}), None, None),
        (json!({"openWorldHint": "true"}), None, None),
        (json!({"readOnlyHint": true}), None, None),
        (json!({}), None, None),
    ];
    for (annotations, source, sink) in cases {
        let got = from_annotations(Some(&annotations));
        assert_eq!(got, ToolLabels { source, sink }, "{annotations}");
    }
    assert_eq!(from_annotations(None), ToolLabels::default());
}

fn glob(p: &str) -> crate::policy::glob::Glob {
    crate::policy::glob::Glob::new(p).expect("glob")
}

/// Trusted annotations label a tool unless the operator named it; the
/// operator's entry wins whole (an empty one keeps the tool unlabelled); a
/// server whose annotations are not trusted gets nothing from them.
#[test]
fn the_operators_entry_wins_over_trusted_annotations() {
    let open = serde_json::json!({"openWorldHint": true});
    let mut settings = FlowSettings::default();
    assert_eq!(
        settings.tool("s", "fetch", Some(&open)),
        (ToolLabels::default(), Via::Tool)
    );
    settings.from_annotations.insert("s".into());
    let annotated = settings.tool("s", "fetch", Some(&open));
    assert_eq!(annotated, (from_annotations(Some(&open)), Via::Annotations));
    assert_eq!(settings.tool("s", "fetch", None).0, ToolLabels::default());
    assert_eq!(
        settings.tool("t", "fetch", Some(&open)).0,
        ToolLabels::default()
    );
    let private = ToolLabels {
        source: Some(Label::Private),
        sink: None,
    };
    let tools = [
        ("fetch".to_owned(), private),
        ("quiet".to_owned(), ToolLabels::default()),
    ];
    settings.labels.insert("s".into(), tools.into());
    assert_eq!(
        settings.tool("s", "fetch", Some(&open)),
        (private, Via::Tool)
    );
    assert_eq!(
        settings.tool("s", "quiet", Some(&open)).0,
        ToolLabels::default()
    );
    assert!(settings.sources().contains(&Label::Untrusted));
}

/// Resources and prompts: every pattern that matches gives its label; a
/// mark they set counts while a pattern still gives it, and a mark set by
/// a tool's annotations while the server's annotations are still trusted
/// and the operator has not named the tool.
#[test]
fn resource_and_prompt_marks_count_while_a_pattern_still_gives_the_label() {
    let mut settings = FlowSettings::default();
    settings.resources.insert(
        "s".into(),
        vec![
            Labelled {
                pattern: glob("file:///secret/*"),
                source: Label::Private,
            },
            Labelled {
                pattern: glob("file:///*"),
                source: Label::Untrusted,
            },
        ],
    );
    settings.prompts.insert(
        "s".into(),
        vec![Labelled {
            pattern: glob("summarise_*"),
            source: Label::Untrusted,
        }],
    );
    assert_eq!(
        settings.resource("s", "file:///secret/key"),
        [Label::Private, Label::Untrusted]
    );
    assert_eq!(settings.resource("s", "file:///pub"), [Label::Untrusted]);
    assert!(settings.resource("t", "file:///secret/key").is_empty());
    assert_eq!(settings.prompt("s", "summarise_page"), [Label::Untrusted]);
    assert!(settings.prompt("s", "greet").is_empty());
    let of = |label, name: &str, via| Mark {
        label,
        server: "s".into(),
        name: name.into(),
        via,
    };
    assert!(settings.still_labels(&of(Label::Private, "file:///secret/key", Via::Resource)));
    assert!(!settings.still_labels(&of(Label::Private, "file:///pub", Via::Resource)));
    assert!(settings.still_labels(&of(Label::Untrusted, "summarise_x", Via::Prompt)));
    assert!(!settings.still_labels(&of(Label::Untrusted, "summarise_x", Via::Tool)));
    let annotated = of(Label::Untrusted, "fetch", Via::Annotations);
    assert!(
        !settings.still_labels(&annotated),
        "annotations not trusted"
    );
    settings.from_annotations.insert("s".into());
    assert!(settings.still_labels(&annotated));
    let named = [(
        "fetch".to_owned(),
        ToolLabels {
            source: None,
            sink: Some(Sink::Egress),
        },
    )];
    settings.labels.insert("s".into(), named.into());
    assert!(
        !settings.still_labels(&annotated),
        "the operator's entry wins"
    );
}

proptest::proptest! {
    /// Whatever the annotations hold, they never give `private` (only the
    /// operator says what is private), never a sink without a source, and
    /// never anything without `openWorldHint: true`.
    #[test]
    fn annotations_never_say_private(open in proptest::option::of(proptest::bool::ANY), read_only in proptest::option::of(proptest::bool::ANY), destructive in proptest::option::of(proptest::bool::ANY)) {
        let mut a = serde_json::Map::new();
        for (k, v) in [("openWorldHint", open), ("readOnlyHint", read_only), ("destructiveHint", destructive)] {
            if let Some(v) = v { a.insert(k.into(), v.into()); }
        }
        let got = from_annotations(Some(&serde_json::Value::Object(a)));
        proptest::prop_assert_ne!(got.source, Some(Label::Private));
        proptest::prop_assert!(got.sink.is_none() || got.source.is_some());
        proptest::prop_assert_eq!(got.source.is_some(), open == Some(true));
        proptest::prop_assert_eq!(got.sink.is_some(), open == Some(true) && read_only != Some(true));
    }
}

/// `labels_from_annotations`, `resource_labels` and `prompt_labels`
/// compile into the settings, and each mistake is refused at its key.
#[test]
fn resource_prompt_and_annotation_labels_are_compiled_and_checked() {
    let base = |server: &str, flow: &str| {
        format!(
            "[servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n{server}\n\
             [clients.a]\napi_key_sha256 = \"{}\"\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"s\"]\ntools = [\"*\"]\naction = \"allow\"\n{flow}\n",
            "0".repeat(64)
        )
    };
    let load = |text: String| crate::config::load_str(&text, "t.toml", &|_| None);
    let ok = load(base(
        "labels_from_annotations = true\n[servers.s.labels]\n\"quiet\" = {}\n\
         [servers.s.resource_labels]\n\"file:///secret/*\" = { source = \"private\" }\n\
         [servers.s.prompt_labels]\n\"summarise_*\" = { source = \"untrusted\" }",
        "flow = { holds = [\"private\", \"untrusted\"], then = \"deny\" }",
    ))
    .expect("valid");
    assert!(ok.flow.from_annotations.contains("s"));
    assert_eq!(ok.flow.resource("s", "file:///secret/a"), [Label::Private]);
    assert_eq!(ok.flow.prompt("s", "summarise_page"), [Label::Untrusted]);
    let open = serde_json::json!({"openWorldHint": true});
    assert_eq!(
        ok.flow.tool("s", "quiet", Some(&open)).0,
        ToolLabels::default()
    );
    assert_eq!(ok.flow.tool("s", "fetch", Some(&open)).1, Via::Annotations);
    // Trusted annotations alone make `untrusted` a label some tool may set.
    load(base(
        "labels_from_annotations = true",
        "flow = { holds = [\"untrusted\"], then = \"deny\" }",
    ))
    .expect("valid");
    let refused = |server: &str, flow: &str, key: &str, says: &str| {
        let e = load(base(server, flow)).expect_err("refused");
        assert_eq!(e.key, key, "{e}");
        assert!(e.to_string().contains(says), "{e}");
    };
    refused(
        "[servers.s.resource_labels]\n\"file:///a\" = { source = \"private\", sink = \"egress\" }",
        "",
        "servers.s.resource_labels.file:///a.sink",
        "only tools are sinks",
    );
    refused(
        "[servers.s.prompt_labels]\n\"p\" = { sink = \"egress\" }",
        "",
        "servers.s.prompt_labels.p.sink",
        "only tools are sinks",
    );
    refused(
        "[servers.s.resource_labels]\n\"FILE:///a\" = { source = \"private\" }",
        "",
        "servers.s.resource_labels.FILE:///a",
        "write \"file:///a\"",
    );
    refused(
        "[servers.s.prompt_labels]\n\"p\" = {}",
        "",
        "servers.s.prompt_labels.p",
        "give it a label",
    );
    refused(
        "[servers.s.prompt_labels]\n\"p\" = { source = \"secret\" }",
        "",
        "servers.s.prompt_labels.p.source",
        "private",
    );
    refused(
        "[servers.s.prompt_labels]\n\"[p\" = { source = \"private\" }",
        "",
        "servers.s.prompt_labels.[p",
        "not a valid pattern",
    );
    // Without trusted annotations, an empty entry is still a mistake.
    refused(
        "[servers.s.labels]\n\"quiet\" = {}",
        "",
        "servers.s.labels.quiet",
        "no label",
    );
    let e = load(base("labels_from_annotation = true", "")).expect_err("refused");
    assert!(e.to_string().contains("labels_from_annotation"), "{e}");
    let e = load(base(
        "[servers.s.resource_labels]\n\"file:///a\" = { label = \"private\" }",
        "",
    ))
    .expect_err("refused");
    assert!(e.to_string().contains("label"), "{e}");
}
