//! Identifiers are exempt where the protocol puts them, never because a tool's
//! data uses their name: a `cursor`, `requestId`, `mimeType`, `progressToken`
//! or `data` key inside `structuredContent`, a schema, a block's `_meta` or an
//! error's `data` is text like any other, so `secrets = "block"` withholds a
//! secret under it. Shown through the official Python SDK server and client,
//! and as a property over generated tool data that uses every identifier name
//! at every depth.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use portcullis::config::SanitizeSettings;
use portcullis::sanitize::{Report, Sanitizer, SecretsAction, Skip};
use proptest::prelude::*;
use serde_json::{Value, json};
use support::{ALICE, Mode, Peer, PeerServer, Sdk, TestGateway, call, sdk};

/// Secrets in the form of every identifier the sanitizer once exempted by
/// name: visible ASCII, no space, valid base64.
const SECRETS: &[&str] = &[
    "AKIAZ7QWERTYUIOPCANA",
    "ghp_C4n4ryT0k3nXq9Wv2Lm8Rt5Yp1Zs7Kd3Hf6J",
];

/// Every key name that is an identifier somewhere in the protocol.
const IDENTIFIER_NAMES: &[&str] = &[
    "jsonrpc",
    "id",
    "method",
    "requestId",
    "nextCursor",
    "cursor",
    "uri",
    "uriTemplate",
    "name",
    "mimeType",
    "progressToken",
    "taskId",
    "io.modelcontextprotocol/subscriptionId",
    "io.modelcontextprotocol/related-task",
    "toolUseId",
    "elicitationId",
    "blob",
    "data",
    "requestState",
    "resultType",
    "type",
    "protocolVersion",
];

fn leaked(text: &str) -> Option<&'static str> {
    SECRETS.iter().copied().find(|s| text.contains(s))
}

// === Through the official SDKs ===

fn config(url: &str) -> String {
    Config::new()
        .server("s", url)
        .set("timeout", "20s")
        .set("pinning", "warn")
        .clients()
        .allow_all()
        .raw("[sanitize]\nsecrets = \"block\"\narguments = \"off\"\n")
        .render()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_data_under_identifier_names_is_withheld_when_it_carries_a_secret() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let up = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start_raw(&config(&up.url)).await;
    let url = gateway.url("s");
    let [aws, github] = [SECRETS[0], SECRETS[1]];
    let shapes = [
        json!({"cursor": aws}),
        json!({"page": {"nextCursor": aws}}),
        json!({"requestId": github}),
        json!({"file": {"mimeType": aws, "blob": github}}),
        json!({"_meta": {"progressToken": aws}}),
        json!({"items": [{"type": "image", "data": aws}]}),
        json!({"task": {"taskId": github}}),
    ];
    for mode in [Mode::Legacy, Mode::Modern] {
        let ops: Vec<Value> = shapes
            .iter()
            .map(|data| call("mirror", json!({"data": data})))
            .collect();
        let results = sdk(Sdk::Python, mode, &url, ALICE, Value::Array(ops)).await;
        assert_eq!(results.len(), shapes.len(), "{mode:?}: {results:?}");
        for (data, r) in shapes.iter().zip(&results) {
            assert_eq!(
                support::gateway_code(r),
                Some("output_withheld"),
                "{mode:?} {data}: {r}"
            );
            assert!(leaked(&r.to_string()).is_none(), "{mode:?} {data}: {r}");
        }
        // Clean data under the same names passes as the tool gave it.
        let clean = json!({"cursor": "page-2", "mimeType": "text/plain", "requestId": "r1"});
        let r = sdk(
            Sdk::Python,
            mode,
            &url,
            ALICE,
            json!([call("mirror", json!({"data": clean}))]),
        )
        .await;
        assert_eq!(r[0]["isError"], false, "{mode:?}: {r:?}");
        assert_eq!(r[0]["structured"], clean, "{mode:?}: {r:?}");
    }
    gateway.stop().await;
}

// === The property ===

/// Tool data: objects keyed by identifier names (and plain ones) at every
/// depth, leaves that are secrets in identifier form or clean words.
fn tool_data() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        2 => proptest::sample::select(SECRETS).prop_map(Value::from),
        1 => Just(Value::from("plain-word")),
        1 => any::<i32>().prop_map(Value::from),
    ];
    let key = prop_oneof![
        4 => proptest::sample::select(IDENTIFIER_NAMES).prop_map(str::to_owned),
        1 => "[a-z]{1,6}",
    ];
    leaf.prop_recursive(4, 24, 4, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 1..4).prop_map(Value::Array),
            proptest::collection::vec((key.clone(), inner), 1..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// The places a tool or server puts data of its own, each a message with the
/// data at `$D`, and the request the message answers.
fn hosts(data: &Value) -> Vec<(Option<&'static str>, Value)> {
    let d = data.clone();
    let result = |r: Value| json!({"jsonrpc": "2.0", "id": 1, "result": r});
    vec![
        (
            Some("tools/call"),
            result(
                json!({"content": [{"type": "text", "text": "ok"}], "structuredContent": {"v": d}}),
            ),
        ),
        (
            Some("tools/call"),
            result(
                json!({"content": [{"type": "text", "text": "ok", "_meta": {"v": d},
                "annotations": {"v": d}}]}),
            ),
        ),
        (
            Some("tools/call"),
            result(
                json!({"content": [{"type": "image", "data": "QUJD", "mimeType": "image/png",
                "_meta": d}], "_meta": {"vendor": d}}),
            ),
        ),
        (
            Some("tools/list"),
            result(
                json!({"tools": [{"name": "t", "inputSchema": {"type": "object",
                "properties": {"p": {"default": d}}}, "_meta": d}]}),
            ),
        ),
        (
            Some("resources/read"),
            result(json!({"contents": [{"uri": "res://a", "text": "x", "_meta": d}]})),
        ),
        (
            None,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "m", "data": d}}),
        ),
        (
            None,
            json!({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": d}}),
        ),
        (
            None,
            json!({"jsonrpc": "2.0", "id": 2, "method": "sampling/createMessage", "params": {
                "maxTokens": 5, "messages": [{"role": "assistant", "content":
                    {"type": "tool_use", "id": "u1", "name": "t", "input": d}}]}}),
        ),
        (
            None,
            json!({"jsonrpc": "2.0", "id": 2, "method": "elicitation/create", "params": {
                "message": "m", "requestedSchema": {"type": "object", "properties": {"p": d}}}}),
        ),
    ]
}

fn contains_secret(value: &Value) -> bool {
    leaked(&value.to_string()).is_some()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// Exempt values only at protocol positions: whatever identifier names
    /// tool data uses, at whatever depth, under `block` a secret in it is
    /// found (so the result is withheld) and none passes.
    #[test]
    fn exempt_values_only_at_protocol_positions(data in tool_data()) {
        let settings = SanitizeSettings {
            secrets: SecretsAction::Block,
            ..SanitizeSettings::default()
        };
        let s = Sanitizer::new(&settings, Skip::default());
        for (answering, message) in hosts(&data) {
            let mut out = message.clone();
            let mut report = Report::default();
            let shape = s.message(&mut out, answering, &mut report);
            prop_assert!(shape.is_ok(), "tool data made {message} a protocol error: {:?}", shape.err());
            prop_assert!(leaked(&out.to_string()).is_none(), "{answering:?}: a secret passed in {out}");
            if contains_secret(&data) {
                prop_assert!(!report.secret_kinds().is_empty(),
                    "{answering:?}: a secret was not found in {message}");
            }
        }
    }
}

#[test]
fn identifiers_at_their_positions_pass_untouched() {
    let settings = SanitizeSettings {
        secrets: SecretsAction::Block,
        ..SanitizeSettings::default()
    };
    let s = Sanitizer::new(&settings, Skip::default());
    // An opaque cursor that the secret detectors would read as a credential.
    let cursor = "Zq8xT2vLk9Pw3RmN7yB4";
    let list = json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "t",
        "inputSchema": {"type": "object"}}], "nextCursor": cursor}});
    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": cursor, "progress": 1}});
    let image = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [
        {"type": "image", "data": "QUJD", "mimeType": "image/png"}]}});
    for (answering, message) in [
        (Some("tools/list"), list),
        (None, progress),
        (Some("tools/call"), image),
    ] {
        let mut out = message.clone();
        let mut report = Report::default();
        s.message(&mut out, answering, &mut report)
            .expect("well-formed");
        assert_eq!(out, message, "{answering:?}");
        assert!(report.is_empty(), "{answering:?}: {report:?}");
    }
    // The same cursor under the same name in a tool's data is an assigned
    // secret only if the key says so; a token under `progressToken` in data is.
    let mut data = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [],
        "structuredContent": {"progressToken": cursor}}});
    let mut report = Report::default();
    s.message(&mut data, Some("tools/call"), &mut report)
        .expect("well-formed");
    assert!(!report.secret_kinds().is_empty(), "{data}");
}
