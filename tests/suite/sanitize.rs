//! Output sanitization through real SDK clients and servers: the leaky tools of
//! the Python SDK, FastMCP and TypeScript SDK servers come out clean in both
//! eras, in JSON and SSE replies, structuredContent included; the canary
//! secrets never appear in any byte a client receives; long text is cut.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::{
    ALICE, Mode, Peer, PeerServer, Sdk, TestGateway, allow_all, borrow, call, clients, modern_call,
    modern_call_headers, raw_post, sdk,
};

/// The canaries the peers' leaky tools carry.
const CANARIES: &[&str] = &[
    "AKIA2CANARY7QWERTYZX",
    "ghp_CanaryCanary0123456789abcdefABCDEFgh",
    "hunter2-canary",
];

/// Pinning warns here: these tests look at what the sanitizer makes of
/// definitions that the pinning scan would otherwise hold back.
fn config(url: &str, sanitize: &str) -> String {
    Config::new()
        .server("s", url)
        .set("timeout", "20s")
        .set("pinning", "warn")
        .clients()
        .allow_all()
        .raw(sanitize)
        .render()
}

/// Nothing hidden, nothing secret: checked on text as a client decoded it.
fn assert_clean(text: &str) {
    for canary in CANARIES {
        assert!(!text.contains(canary), "canary {canary} leaked: {text:?}");
    }
    for c in text.chars() {
        let bad = matches!(c,
            '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
            | '\u{200b}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{E0000}'..='\u{E007F}');
        assert!(!bad, "{c:?} reached the client: {text:?}");
    }
    assert!(
        !text.contains("evil.example"),
        "an OSC 8 target leaked: {text:?}"
    );
}

/// The same on raw bytes, where JSON may escape what it carries.
fn assert_clean_bytes(raw: &str) {
    assert_clean(raw);
    for escaped in [
        "\\u001b", "\\u001B", "\\u009b", "\\u200b", "\\u202e", "\\udb40", "\\u0007",
    ] {
        assert!(
            !raw.contains(escaped),
            "{escaped} reached the client: {raw}"
        );
    }
}

fn expect_leaky_text(r: &Value) {
    assert_eq!(r["isError"], false, "{r}");
    let text = r["text"].as_str().unwrap_or_default();
    assert_clean(text);
    assert!(
        text.contains("ERROR db: reconnecting with password=[REDACTED:generic-secret]"),
        "{text}"
    );
    assert!(text.contains("click here to continue"), "{text}");
    assert!(
        text.contains("key [REDACTED:aws-access-key-id] token [REDACTED:github-token]"),
        "{text}"
    );
    assert!(text.contains("user admingpj.exe done"), "{text}");
}

fn expect_leaky_structured(r: &Value) {
    assert_eq!(r["isError"], false, "{r}");
    assert_clean(&r["text"].to_string());
    let s = &r["structured"];
    assert_clean(&s.to_string());
    assert_eq!(s["user"], "admin", "{r}");
    assert_eq!(s["password"], "[REDACTED:generic-secret]", "{r}");
    assert_eq!(s["note"], "key [REDACTED:aws-access-key-id]", "{r}");
    assert_eq!(
        s["nested"]["links"],
        json!(["click", "[REDACTED:github-token]"]),
        "{r}"
    );
}

async fn leaky_tools_come_out_clean(peer: Peer) {
    let up = PeerServer::start(peer).await;
    let gateway = TestGateway::start_raw(&config(&up.url, "")).await;
    let url = gateway.url("s");
    for client in [Sdk::Python, Sdk::TypeScript] {
        for mode in [Mode::Legacy, Mode::Modern] {
            let r = sdk(
                client,
                mode,
                &url,
                ALICE,
                json!([
                    call("leaky_text", json!({})),
                    call("leaky_structured", json!({}))
                ]),
            )
            .await;
            assert_eq!(r.len(), 2, "{client:?} {mode:?}: {r:?}");
            expect_leaky_text(&r[0]);
            expect_leaky_structured(&r[1]);
        }
    }
    // The raw bytes too, whatever the framing the server chose.
    for tool in ["leaky_text", "leaky_structured"] {
        let headers = modern_call_headers(ALICE, tool);
        let raw = raw_post(&url, &borrow(&headers), modern_call(5, tool, json!({}))).await;
        assert_eq!(raw.status, 200, "{}", raw.text);
        assert_eq!(raw.body["id"], 5, "{}", raw.text);
        assert_clean_bytes(&raw.text);
    }
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_leaky_tools_come_out_clean() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    leaky_tools_come_out_clean(Peer::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_leaky_tools_come_out_clean() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    leaky_tools_come_out_clean(Peer::FastMcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_leaky_tools_come_out_clean() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    leaky_tools_come_out_clean(Peer::TypeScript).await;
}

/// A handshake-era call over raw HTTP: initialize, initialized, then `tool`.
async fn legacy_raw_call(url: &str, tool: &str) -> support::Raw {
    let auth = format!("Bearer {ALICE}");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let r = raw_post(url, &[("authorization", &auth)], init.to_string()).await;
    let session = r
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .expect("a session id")
        .to_owned();
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    raw_post(url, &headers, done.to_string()).await;
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": tool, "arguments": {}}});
    raw_post(url, &headers, body.to_string()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_and_sse_replies_are_both_sanitized() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    // The Python SDK answers a handshake-era call with SSE; the TypeScript SDK
    // answers a 2026-07-28 call with JSON.
    let py = PeerServer::start(Peer::Python).await;
    let ts = PeerServer::start(Peer::TypeScript).await;
    let gateway = TestGateway::start(
        &[("py", &py.url), ("ts", &ts.url)],
        &format!("{}{}", clients(), allow_all()),
    )
    .await;
    for tool in ["leaky_text", "leaky_structured"] {
        let sse = legacy_raw_call(&gateway.url("py"), tool).await;
        let headers = modern_call_headers(ALICE, tool);
        let json_reply = raw_post(
            &gateway.url("ts"),
            &borrow(&headers),
            modern_call(3, tool, json!({})),
        )
        .await;
        for (raw, framing) in [
            (&sse, "text/event-stream"),
            (&json_reply, "application/json"),
        ] {
            let content_type = raw
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            assert!(content_type.starts_with(framing), "{tool}: {content_type}");
            assert_clean_bytes(&raw.text);
            assert!(
                raw.text.contains("[REDACTED:aws-access-key-id]"),
                "{}",
                raw.text
            );
        }
    }
    let resource = &json_reply_resource(&gateway).await;
    assert!(
        resource.contains("[REDACTED:aws-access-key-id]"),
        "embedded resource: {resource}"
    );
    gateway.stop().await;
}

/// The embedded resource's text of `leaky_text` on "ts".
async fn json_reply_resource(gateway: &TestGateway) -> String {
    let headers = modern_call_headers(ALICE, "leaky_text");
    let raw = raw_post(
        &gateway.url("ts"),
        &borrow(&headers),
        modern_call(4, "leaky_text", json!({})),
    )
    .await;
    raw.body["result"]["content"][1]["resource"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_output_is_cut_with_a_notice() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let up = PeerServer::start(Peer::TypeScript).await;
    let gateway = TestGateway::start_raw(&config(
        &up.url,
        "[sanitize]\nmax_output_bytes = 4096\n[[sanitize.exemptions]]\ntools = [\"echo\"]\nskip = [\"max_output_bytes\"]\n",
    ))
    .await;
    let long = "y".repeat(10_000);
    let r = sdk(
        Sdk::Python,
        Mode::Modern,
        &gateway.url("s"),
        ALICE,
        json!([
            call("huge", json!({"size": 100_000})),
            call("echo", json!({"text": long}))
        ]),
    )
    .await;
    let text = r[0]["text"].as_str().unwrap_or_default();
    assert!(text.len() <= 4096, "{}", text.len());
    let kept = text.find("\n[portcullis").expect("a notice");
    assert!(
        text[..kept].bytes().all(|b| b.is_ascii_alphanumeric()),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "\n[portcullis: output cut here; {} more bytes were omitted (limit 4096 bytes)]",
            100_000 - kept
        )),
        "{text}"
    );
    assert_eq!(
        r[1]["text"].as_str().map(str::len),
        Some(10_000),
        "exempted"
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptions_in_lists_are_sanitized() {
    let poisoned = json!({
        "name": "add",
        "description": "Adds.\u{E0049}\u{E0067}\u{E006E}\u{E006F}\u{E0072}\u{E0065} \u{1b}[8mhidden\u{1b}[0m",
        "inputSchema": {"type": "object", "properties": {
            "a": {"type": "number", "description": "first\u{200b} addend, key AKIAZ7QWERTYUIOPASDF"}}}
    });
    let up = support::upstreams::InProcess::scripted(vec![poisoned]).await;
    let gateway = TestGateway::start_raw(&config(&up.url, "")).await;
    let headers = [
        ("authorization", format!("Bearer {ALICE}")),
        ("mcp-protocol-version", "2026-07-28".to_owned()),
        ("mcp-method", "tools/list".to_owned()),
    ];
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                      "params": {"_meta": support::modern_meta()}});
    let raw = raw_post(&gateway.url("s"), &borrow(&headers), body.to_string()).await;
    let tool = &raw.body["result"]["tools"][0];
    assert_eq!(tool["description"], "Adds. hidden", "{}", raw.text);
    assert_eq!(
        tool["inputSchema"]["properties"]["a"]["description"],
        "first addend, key [REDACTED:aws-access-key-id]"
    );
    assert_clean_bytes(&raw.text);
    gateway.stop().await;
}

// === Every string of every message, through the gateway ===
//
// The hostile upstream answers what a test scripts: shapes no SDK server
// sends on demand (extra `_meta`, malformed envelopes, 2026 results).

use support::misbehaving::{Misbehaving, Scripted};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_and_elicitation_reach_the_official_client_clean_in_both_eras() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    // 2025-11-25: the server's own requests on the call's stream; 2026-07-28:
    // an input_required result whose inputRequests the client answers.
    let up = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start_raw(&config(&up.url, "")).await;
    for mode in [Mode::Legacy, Mode::Modern] {
        let r = sdk(
            Sdk::Python,
            mode,
            &gateway.url("s"),
            ALICE,
            json!([call("leaky_ask", json!({})), {"op": "asked"}]),
        )
        .await;
        assert_eq!(r[0]["isError"], false, "{mode:?}: {}", r[0]);
        assert_eq!(r[0]["text"], "answered: ask, think", "{mode:?}: {}", r[0]);
        let asked = &r[1]["asked"];
        let kinds: Vec<&str> = asked
            .as_array()
            .expect("asked")
            .iter()
            .filter_map(|a| a["kind"].as_str())
            .collect();
        assert!(
            kinds.contains(&"sampling") && kinds.contains(&"elicitation"),
            "{mode:?}: {asked}"
        );
        // Decoded by the client: escapes, bidi, tags and secrets all gone.
        for a in asked.as_array().expect("asked") {
            let params = &a["params"];
            assert_clean_bytes(&params.to_string());
            let texts = params.to_string();
            assert!(
                texts.contains("[REDACTED:aws-access-key-id]"),
                "{mode:?}: {texts}"
            );
        }
        let elicited = asked
            .as_array()
            .expect("asked")
            .iter()
            .find(|a| a["kind"] == "elicitation")
            .expect("an elicitation");
        let field = &elicited["params"]["requestedSchema"]["properties"]["name"];
        assert!(
            field["description"]
                .as_str()
                .is_some_and(|d| d.contains("click here to continue")),
            "{mode:?}: {field}"
        );
    }
    gateway.stop().await;
}
