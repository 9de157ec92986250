use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;
use crate::mcp::methods::{self, Extras, Kind};
use crate::mcp::version::Era;

/// Classifies `value` and types it as the pipeline does, in `era`.
fn typed_in(value: &Value, era: Era) -> Result<Request, Untyped> {
    let message = Message::from_value(value.clone()).expect("a message");
    let (name, kind) = match &message {
        Message::Request { method, .. } => (Some(method.clone()), Kind::Request),
        Message::Notification { method, .. } => (Some(method.clone()), Kind::Notification),
        Message::Response { .. } => (None, Kind::Request),
    };
    let mut extras = Extras::default();
    extras.add("acme/run", "tool").expect("an extra");
    let called = name.map(|n| methods::client_call(&n, kind, era, &extras).expect("known"));
    Request::typed(message, called)
}

fn typed(value: &Value) -> Result<Request, Untyped> {
    typed_in(value, Era::Legacy)
}

#[test]
fn a_tool_call_is_its_name_and_arguments() {
    let sent = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}, "_meta": {"k": 1}}});
    let request = typed(&sent).expect("typed");
    assert_eq!(request.tool(), Some("echo"));
    assert_eq!(request.arguments(), Some(&json!({"text": "hi"})));
    assert_eq!(request.method(), Some(Method::ToolsCall));
    // Moved out: what is left unjudged holds neither.
    let rest = request.unjudged().expect("params");
    assert!(!rest.contains_key("name") && !rest.contains_key("arguments"));
    assert_eq!(request.to_value(), sent);
    // An operator's method of class tool is typed as a tool call.
    let extra = json!({"jsonrpc": "2.0", "id": 2, "method": "acme/run", "params": {"name": "t"}});
    let request = typed(&extra).expect("typed");
    assert_eq!((request.tool(), request.method()), (Some("t"), None));
    assert_eq!(request.to_value(), extra);
}

#[test]
fn a_missing_field_is_refused_with_its_path() {
    for (sent, why) in [
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 7}}),
            "tools/call needs params.name, a string",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {}}),
            "resources/read needs params.uri, a string",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "prompts/get"}),
            "prompts/get needs params.name, a string",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "completion/complete",
                "params": {"ref": {"type": "ref/prompt"}}}),
            "completion/complete needs params.ref.name, a string",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "completion/complete",
                "params": {"ref": {"type": "ref/other", "name": "x"}}}),
            "completion/complete needs params.ref of type ref/prompt or ref/resource",
        ),
    ] {
        assert_eq!(typed(&sent), Err(Untyped(why.into())), "{sent}");
    }
    let listen = json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
        "params": {"notifications": {"resourceSubscriptions": ["a://b", 3]}}});
    assert!(typed_in(&listen, Era::Modern).is_err());
}

#[test]
fn uris_are_replaced_only_when_they_differ() {
    let sent = json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read",
        "params": {"uri": "file:///a/../b"}});
    let mut request = typed(&sent).expect("typed");
    assert!(!request.clone().set_uris(&["file:///a/../b"]));
    assert!(request.set_uris(&["file:///b"]));
    assert_eq!(request.to_value()["params"]["uri"], "file:///b");
    let listen = json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
        "params": {"notifications": {"toolsListChanged": true, "resourceSubscriptions": ["x://A"]}}});
    let mut request = typed_in(&listen, Era::Modern).expect("typed");
    assert!(matches!(
        request.ask(),
        Ask::Subscription {
            tools_list_changed: true,
            ..
        }
    ));
    assert!(request.set_uris(&["x://a"]));
    assert_eq!(
        request.to_value()["params"]["notifications"],
        json!({"toolsListChanged": true, "resourceSubscriptions": ["x://a"]})
    );
}

#[test]
fn renaming_touches_the_name_alone() {
    let sent = json!({"jsonrpc": "2.0", "id": 1, "method": "completion/complete",
        "params": {"ref": {"type": "ref/prompt", "name": "s__greet"}, "argument": {"name": "a", "value": "b"}}});
    let request = typed(&sent).expect("typed").renamed("greet");
    let mut expected = sent.clone();
    expected["params"]["ref"]["name"] = "greet".into();
    assert_eq!(request.to_value(), expected);
}

#[test]
fn the_gateways_own_list_keeps_the_protocols_meta_only() {
    let sent = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
        "params": {"cursor": "c", "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "other": 1}}});
    let client = typed_in(&sent, Era::Modern).expect("typed");
    let own = Request::own_list(json!("p-1"), ListKind::Prompts, &client, true);
    assert_eq!(
        own.to_value(),
        json!({"jsonrpc": "2.0", "id": "p-1", "method": "prompts/list",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}})
    );
    assert_eq!(own.method(), Some(Method::PromptsList));
}

/// A JSON value small enough to generate many of.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z:/{}.]{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 12, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            proptest::collection::btree_map("[a-zA-Z]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A params member a method of the table reads, or any other key.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("name".to_owned()),
        Just("arguments".to_owned()),
        Just("uri".to_owned()),
        Just("ref".to_owned()),
        Just("notifications".to_owned()),
        Just("taskId".to_owned()),
        Just("cursor".to_owned()),
        Just("capabilities".to_owned()),
        Just("protocolVersion".to_owned()),
        Just("requestState".to_owned()),
        Just("requestId".to_owned()),
        Just("_meta".to_owned()),
        "[a-z]{1,6}",
    ]
}

/// The right shape of `key` for a method, half of the time.
fn member(key: &str) -> BoxedStrategy<Value> {
    let right = match key {
        "name" | "uri" | "taskId" => "[a-z:/_]{1,8}".prop_map(Value::from).boxed(),
        "ref" => ("[a-z_]{1,8}", prop::bool::ANY)
            .prop_map(|(n, prompt)| match prompt {
                true => json!({"type": "ref/prompt", "name": n}),
                false => json!({"type": "ref/resource", "uri": n}),
            })
            .boxed(),
        "notifications" => (
            proptest::collection::vec("[a-z:/]{1,8}", 0..3),
            any::<bool>(),
        )
            .prop_map(
                |(uris, tools)| json!({"resourceSubscriptions": uris, "toolsListChanged": tools}),
            )
            .boxed(),
        _ => value().boxed(),
    };
    prop_oneof![right, value()].boxed()
}

fn params() -> impl Strategy<Value = Map<String, Value>> {
    proptest::collection::vec(key(), 0..6)
        .prop_flat_map(|keys| {
            let members: Vec<_> = keys.iter().map(|k| (Just(k.clone()), member(k))).collect();
            members
        })
        .prop_map(|members| members.into_iter().collect())
}

/// A client's message of any kind the table knows from a client, in an era.
fn message() -> impl Strategy<Value = (Value, Era)> {
    let era = prop_oneof![Just(Era::Legacy), Just(Era::Modern)];
    (era, any::<prop::sample::Index>(), params(), any::<bool>()).prop_map(
        |(era, pick, params, with_params)| {
            let rows: Vec<_> = methods::TABLE
                .iter()
                .filter(|e| e.direction == methods::Direction::ClientToServer && e.eras.has(era))
                .collect();
            let row = rows[pick.index(rows.len())];
            let mut v = json!({"jsonrpc": "2.0", "method": row.method.name()});
            if row.kind == Kind::Request {
                v["id"] = json!(pick.index(1000));
            }
            if with_params {
                v["params"] = Value::Object(params);
            }
            (v, era)
        },
    )
}

proptest! {
    /// Classification's typed value re-serialises to the message parsed:
    /// every judged field is put back where it came from, untouched, so
    /// what is forwarded from it is what was judged. A message refused here
    /// lacks a field its method cannot go without.
    #[test]
    fn re_serialises_to_the_parsed_message((sent, era) in message()) {
        match typed_in(&sent, era) {
            Ok(request) => {
                prop_assert_eq!(request.to_value(), sent.clone());
                // The judged fields are the message's own.
                let params = sent.get("params");
                let field = |k: &str| params.and_then(|p| p.get(k));
                match request.ask() {
                    Ask::Tool { name, arguments } | Ask::Prompt { name, arguments } => {
                        prop_assert_eq!(field("name"), Some(&Value::from(name.as_str())));
                        prop_assert_eq!(field("arguments"), arguments.as_ref());
                    }
                    Ask::Resource { uri } => {
                        prop_assert_eq!(field("uri"), Some(&Value::from(uri.as_str())));
                    }
                    Ask::List { cursor, .. } => prop_assert_eq!(field("cursor"), cursor.as_ref()),
                    Ask::Task { task_id, .. } => prop_assert_eq!(
                        task_id.as_deref(),
                        field("taskId").and_then(Value::as_str)
                    ),
                    _ => {}
                }
                // Canonical bytes of the typed value are those of the parsed message.
                prop_assert_eq!(
                    crate::util::canonical::to_vec(&request.to_value()),
                    crate::util::canonical::to_vec(&sent)
                );
            }
            Err(Untyped(why)) => {
                let method = sent["method"].as_str().unwrap_or_default().to_owned();
                prop_assert!(why.starts_with(&method) || why.starts_with("completion/complete")
                    || why.starts_with("subscriptions/listen"), "{}", why);
            }
        }
    }
}
