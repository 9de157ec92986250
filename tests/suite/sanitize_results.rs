//! Every string of every message, through the gateway: the hostile upstream
//! (`tests/support/misbehaving.rs`) answers what a test scripts, shapes no SDK server sends
//! on demand (extra `_meta`, malformed envelopes, 2026 results, a byte order mark, many
//! blocks), and each comes out sanitized, cut to `max_output_bytes` in all, or refused as
//! an upstream protocol error.

use crate::sanitize::{assert_clean_bytes, config};
use crate::support;
use support::misbehaving::{Misbehaving, Scripted};
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::{
    ALICE, Mode, Sdk, TestGateway, borrow, call, modern_call, modern_call_headers, raw_post, sdk,
};

const HOSTILE: &str = "\u{1b}[31mred\u{1b}[0m \u{202e}evil\u{2066} ad\u{200b}min \u{E0049}\u{E0067} AKIA2CANARY7QWERTYZX ghp_CanaryCanary0123456789abcdefABCDEFgh \u{1b}]8;;http://evil.example\u{7}link\u{1b}]8;;\u{7}";

async fn scripted_gateway(sanitize: &str) -> (Misbehaving, TestGateway) {
    let up = Misbehaving::start().await;
    let gateway = TestGateway::start_raw(&config(&up.url, sanitize)).await;
    (up, gateway)
}

async fn scripted_call(gateway: &TestGateway, key: &str) -> support::Raw {
    let headers = modern_call_headers(ALICE, "scripted");
    raw_post(
        &gateway.url("s"),
        &borrow(&headers),
        modern_call(5, "scripted", json!({"x": key})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_of_a_result_and_its_stream_is_sanitized() {
    let (up, gateway) = scripted_gateway("").await;
    let result = json!({"jsonrpc": "2.0", "id": "$id", "result": {
        "content": [{"type": "text", "text": "ok", "_meta": {"note": HOSTILE},
                     "annotations": {"audience": ["user"], "lastModified": HOSTILE}},
                    {"type": "resource_link", "uri": "res://a", "name": "a", "description": HOSTILE}],
        "structuredContent": {"k": HOSTILE},
        "_meta": {"trace": HOSTILE, HOSTILE: 1},
        "somethingNew": {"deep": [HOSTILE]}}});
    let log = json!({"jsonrpc": "2.0", "method": "notifications/message",
                     "params": {"level": "info", "logger": HOSTILE, "data": {"x": HOSTILE}}});
    // Both a method and a result, for another id: no client can read it; it is left out.
    let odd = json!({"jsonrpc": "2.0", "id": "other", "method": "notifications/message",
                     "result": {"leak": HOSTILE}});
    up.script("all_fields", Scripted::Sse(vec![log, odd, result]));
    let r = scripted_call(&gateway, "all_fields").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_clean_bytes(&r.text);
    let result = &r.body["result"];
    assert_eq!(result["isError"], Value::Null, "{}", r.text);
    assert_eq!(
        result["_meta"]["trace"],
        "red evil admin  [REDACTED:aws-access-key-id] [REDACTED:github-token] link"
    );
    assert!(!r.text.contains("\"leak\""), "{}", r.text);
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_answers_are_upstream_protocol_errors() {
    let (up, gateway) = scripted_gateway("").await;
    up.script(
        "method_and_result",
        Scripted::Json(
            json!({"jsonrpc": "2.0", "id": "$id", "method": "x", "result": {
            "content": [{"type": "text", "text": HOSTILE}]}}),
        ),
    );
    up.script(
        "sse_method_and_result",
        Scripted::Sse(vec![
            json!({"jsonrpc": "2.0", "id": "$id", "method": "x", "result": {
            "content": [{"type": "text", "text": HOSTILE}]}}),
        ]),
    );
    up.script(
        "bad_uri",
        Scripted::Json(json!({"jsonrpc": "2.0", "id": "$id", "result": {
            "content": [{"type": "resource_link", "uri": "res://ad\u{202e}min", "name": "a"}]}})),
    );
    for key in ["method_and_result", "sse_method_and_result", "bad_uri"] {
        let r = scripted_call(&gateway, key).await;
        assert_clean_bytes(&r.text);
        let result = &r.body["result"];
        assert_eq!(result["isError"], true, "{key}: {}", r.text);
        assert_eq!(
            result["_meta"]["portcullis/error"]["code"], "upstream_protocol_error",
            "{key}: {}",
            r.text
        );
    }
    gateway.stop().await;
}

fn input_required() -> Value {
    json!({"jsonrpc": "2.0", "id": "$id", "result": {"resultType": "input_required",
        "inputRequests": {
            "think": {"method": "sampling/createMessage", "params": {
                "systemPrompt": HOSTILE, "maxTokens": 5,
                "messages": [{"role": "user", "content": {"type": "text", "text": HOSTILE}}]}},
            "ask": {"method": "elicitation/create", "params": {"mode": "form", "message": HOSTILE,
                "requestedSchema": {"type": "object", "properties": {
                    "u": {"type": "string", "title": HOSTILE, "description": HOSTILE}}}}}},
        "requestState": "opaque-state.1"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_required_results_are_sanitized_and_blocked() {
    let (up, gateway) = scripted_gateway("").await;
    up.script("mrtr", Scripted::Json(input_required()));
    let r = scripted_call(&gateway, "mrtr").await;
    assert_clean_bytes(&r.text);
    let result = &r.body["result"];
    assert_eq!(result["resultType"], "input_required", "{}", r.text);
    assert_eq!(
        result["requestState"], "opaque-state.1",
        "identifiers pass as they are"
    );
    assert!(
        result["inputRequests"]["think"]["params"]["systemPrompt"]
            .as_str()
            .is_some_and(|s| s.contains("[REDACTED:aws-access-key-id]")),
        "{}",
        r.text
    );
    gateway.stop().await;

    let (up, gateway) = scripted_gateway("[sanitize]\nsecrets = \"block\"\n").await;
    up.script("mrtr", Scripted::Json(input_required()));
    let r = scripted_call(&gateway, "mrtr").await;
    assert_clean_bytes(&r.text);
    assert_eq!(
        r.body["result"]["_meta"]["portcullis/error"]["code"], "output_withheld",
        "{}",
        r.text
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bom_is_never_quoted_into_the_middle_of_a_gateway_text() {
    let (up, gateway) = scripted_gateway("").await;
    up.script(
        "bom_failure",
        Scripted::Json(
            json!({"jsonrpc": "2.0", "id": "$id", "result": {"isError": true,
            "content": [{"type": "text", "text": "\u{feff}the database is down"}]}}),
        ),
    );
    up.script(
        "bom_error",
        Scripted::Json(
            json!({"jsonrpc": "2.0", "id": "$id", "error": {"code": -32603,
            "message": "\u{feff}internal: \u{feff}lock held"}}),
        ),
    );
    for key in ["bom_failure", "bom_error"] {
        let r = scripted_call(&gateway, key).await;
        let text = r.body["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(
            text.contains("the database is down") || text.contains("lock held"),
            "{key}: {text}"
        );
        assert!(
            !text.contains('\u{feff}'),
            "{key}: a BOM in the gateway's text: {text:?}"
        );
        assert!(!r.text.contains("\\ufeff"), "{key}: {}", r.text);
    }
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_carries_at_most_max_output_bytes_in_all() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let (up, gateway) = scripted_gateway("[sanitize]\nmax_output_bytes = 262144\n").await;
    let blocks: Vec<Value> = (0..60)
        .map(|i| json!({"type": "text", "text": format!("{i:02}{}", "x".repeat(200 * 1024))}))
        .collect();
    up.script(
        "many_blocks",
        Scripted::Json(json!({"jsonrpc": "2.0", "id": "$id", "result": {"content": blocks}})),
    );
    let big = "y".repeat(1 << 20);
    up.script(
        "big_structured",
        Scripted::Sse(vec![json!({"jsonrpc": "2.0", "id": "$id", "result": {
            "content": [{"type": "text", "text": big.clone()}],
            "structuredContent": {"rows": big}}})]),
    );
    let r = scripted_call(&gateway, "many_blocks").await;
    let texts: usize = r.body["result"]["content"]
        .as_array()
        .expect("content")
        .iter()
        .map(|b| b["text"].as_str().unwrap_or_default().len())
        .sum();
    assert!(texts <= 262_144, "{texts} bytes of text in one message");
    assert!(
        r.text.contains("more bytes were omitted"),
        "a notice says so"
    );

    // The official Python SDK client refuses an SSE event over 1 MiB and fails
    // the session; through the gateway it gets the cut text and a notice.
    let r = sdk(
        Sdk::Python,
        Mode::Legacy,
        &gateway.url("s"),
        ALICE,
        json!([call("scripted", json!({"x": "big_structured"})), {"op": "list"}]),
    )
    .await;
    assert_eq!(r[0]["isError"], false, "{}", r[0]);
    let text = r[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.len() <= 262_144 && text.contains("more bytes were omitted"),
        "{}",
        text.len()
    );
    assert!(
        r[0]["structured"]["portcullis/omitted"].is_string(),
        "{}",
        r[0]["structured"]
    );
    assert!(r[1]["tools"].is_array(), "the session goes on: {}", r[1]);
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_and_other_methods_are_sanitized_whole() {
    let (up, gateway) = scripted_gateway("").await;
    up.script(
        "initialize",
        Scripted::Json(json!({"jsonrpc": "2.0", "id": "$id", "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {}, "resources": {}},
            "serverInfo": {"name": "misbehaving", "version": "1", "title": HOSTILE,
                           "description": HOSTILE, "websiteUrl": HOSTILE},
            "instructions": HOSTILE}})),
    );
    let auth = format!("Bearer {ALICE}");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let r = raw_post(
        &gateway.url("s"),
        &[("authorization", &auth)],
        init.to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_clean_bytes(&r.text);
    assert!(
        r.body["result"]["serverInfo"]["title"]
            .as_str()
            .is_some_and(|t| t.contains("red evil")),
        "{}",
        r.text
    );
    gateway.stop().await;
}
