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
                    Ask::Tool { name, arguments, .. } | Ask::Prompt { name, arguments } => {
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

#[test]
fn a_tool_calls_round_is_moved_out_and_put_back() {
    let sent = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "t", "arguments": {}, "requestState": "s-1",
            "inputResponses": {"ask": {"action": "accept"}},
            "_meta": {META_APPROVAL_ID: "apr_1", "k": 1}}});
    let request = typed_in(&sent, Era::Modern).expect("typed");
    let round = request.round();
    assert_eq!(round.state_str(), Some("s-1"));
    assert_eq!(
        round.responses().and_then(|r| r.get("ask")),
        Some(&json!({"action": "accept"}))
    );
    assert_eq!(round.approval_id, Some(json!("apr_1")));
    // Moved out: the unjudged params hold none of them.
    let rest = request.unjudged().expect("params");
    assert!(!rest.contains_key("requestState") && !rest.contains_key("inputResponses"));
    assert_eq!(rest["_meta"], json!({"k": 1}));
    assert_eq!(request.to_value(), sent);
    // Forwarded with no round at all: the approval id's `_meta` key goes,
    // the client's own `_meta` stays.
    let forwarded = request.forwarded_with(&Round::default());
    assert_eq!(
        forwarded["params"],
        json!({"name": "t", "arguments": {}, "_meta": {"k": 1}})
    );
    // Any other message carries no round.
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list",
        "params": {"requestState": "s-1"}});
    let request = typed(&list).expect("typed");
    assert_eq!(request.round(), &Round::default());
    assert_eq!(request.unjudged().expect("params")["requestState"], "s-1");
}

/// A `requestState`: the gateway's form, an upstream's, or any JSON value.
fn round_state() -> impl Strategy<Value = Value> {
    prop_oneof![
        "pcl1\\.[a-z0-9]{1,4}\\.[a-z0-9]{1,4}".prop_map(Value::from),
        "[a-z0-9-]{0,8}".prop_map(Value::from),
        value(),
    ]
}

/// `inputResponses`: answers by key (the gateway's own key among them, or
/// not), or any JSON value.
fn round_responses() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("portcullis_approval".to_owned()),
        Just("ask".to_owned()),
        "[a-z]{1,5}",
    ];
    let answer = prop_oneof![
        Just(json!({"action": "accept", "content": {"approve": true}})),
        Just(json!({"action": "decline"})),
        value(),
    ];
    prop_oneof![
        3 => proptest::collection::btree_map(key, answer, 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        1 => value(),
    ]
}

/// `_meta`: with an approval id or not, other keys or not, or not an object.
fn round_meta() -> impl Strategy<Value = Value> {
    let id = prop_oneof!["apr_[a-z0-9]{1,6}".prop_map(Value::from), value()];
    prop_oneof![
        4 => (
            proptest::option::of(id),
            proptest::collection::btree_map("[a-z]{1,5}", value(), 0..2)
        )
            .prop_map(|(id, others)| {
                let mut meta: Map<String, Value> = others.into_iter().collect();
                if let Some(id) = id {
                    meta.insert(META_APPROVAL_ID.into(), id);
                }
                Value::Object(meta)
            }),
        1 => value(),
    ]
}

/// A `tools/call` (2026 era) carrying generated round fields, each present
/// or not, next to its name, arguments and other params.
pub(crate) fn tool_call_with_round() -> impl Strategy<Value = Value> {
    (
        proptest::option::of(round_state()),
        proptest::option::of(round_responses()),
        proptest::option::of(round_meta()),
        proptest::option::of(value()),
        proptest::collection::btree_map("[a-z]{1,5}", value(), 0..2),
        0u32..1000,
    )
        .prop_map(|(state, responses, meta, arguments, others, id)| {
            let mut params: Map<String, Value> = others.into_iter().collect();
            params.insert("name".into(), "t".into());
            for (key, value) in [
                ("arguments", arguments),
                ("requestState", state),
                ("inputResponses", responses),
                ("_meta", meta),
            ] {
                if let Some(value) = value {
                    params.insert(key.into(), value);
                }
            }
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
        })
}

/// Types a generated tool call as the pipeline does (2026 era).
pub(crate) fn typed_call(sent: &Value) -> Request {
    typed_in(sent, Era::Modern).expect("a tool call with a name is typed")
}

proptest! {
    /// A tool call's round is moved out as sent and put back where it came
    /// from: what the approval judges (the typed round) is exactly the
    /// message's own `requestState`, `inputResponses` and approval id, the
    /// params left hold none of them, and the message re-serialises to the
    /// one parsed. Forwarded with its own round, only an `_meta` left empty
    /// is dropped; a signed state's copy of the round is the round.
    #[test]
    fn a_tool_calls_round_re_serialises_to_what_is_judged(sent in tool_call_with_round()) {
        let request = typed_call(&sent);
        let params = sent["params"].as_object().expect("params");
        let round = request.round();
        prop_assert_eq!(round.state.as_ref(), params.get("requestState"));
        prop_assert_eq!(round.responses.as_ref(), params.get("inputResponses"));
        let id = params
            .get("_meta")
            .and_then(Value::as_object)
            .and_then(|m| m.get(META_APPROVAL_ID));
        prop_assert_eq!(round.approval_id.as_ref(), id);
        prop_assert_eq!(round.state_str(), params.get("requestState").and_then(Value::as_str));
        prop_assert_eq!(
            round.responses(),
            params.get("inputResponses").and_then(Value::as_object)
        );
        let rest = request.unjudged().expect("params");
        prop_assert!(!rest.contains_key("requestState") && !rest.contains_key("inputResponses"));
        prop_assert!(
            !rest
                .get("_meta")
                .and_then(Value::as_object)
                .is_some_and(|m| m.contains_key(META_APPROVAL_ID))
        );
        prop_assert_eq!(request.to_value(), sent.clone());
        prop_assert_eq!(
            crate::util::canonical::to_vec(&request.to_value()),
            crate::util::canonical::to_vec(&sent)
        );
        let mut expected = sent.clone();
        let empty_meta = expected["params"]
            .get("_meta")
            .and_then(Value::as_object)
            .is_some_and(|m| m.is_empty());
        if empty_meta {
            expected["params"].as_object_mut().expect("params").remove("_meta");
        }
        prop_assert_eq!(request.forwarded_with(round), expected.clone());
        // The bytes written without copying the arguments are those of the value.
        prop_assert_eq!(
            request.forwarded_bytes(round),
            crate::util::canonical::to_vec(&expected)
        );
        let stripped = Round::default();
        prop_assert_eq!(
            request.forwarded_bytes(&stripped),
            crate::util::canonical::to_vec(&request.forwarded_with(&stripped))
        );
        let carried = Round::from_carried(round.carried());
        prop_assert_eq!(
            carried,
            Round { approval_id: None, ..round.clone() }
        );
    }
}
