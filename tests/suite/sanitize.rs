//! Output sanitization through real SDK clients and servers: the leaky tools of
//! the Python SDK, FastMCP and TypeScript SDK servers come out clean in both
//! eras, in JSON and SSE replies, structuredContent included; the canary
//! secrets never appear in any byte a client receives; long text is cut. Every string of
//! every message, from a scripted upstream: `sanitize_results.rs`.

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
pub(crate) fn config(url: &str, sanitize: &str) -> String {
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
pub(crate) fn assert_clean_bytes(raw: &str) {
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

/// The SDK servers whose leaky tools are read, each a case of
/// [`leaky_tools_of_every_sdk_server_come_out_clean`] (formerly a test each:
/// `python_sdk_…`, `fastmcp_…`, `typescript_sdk_leaky_tools_come_out_clean`).
const LEAKY_SERVERS: &[(&str, Peer)] = &[
    ("the Python SDK server", Peer::Python),
    ("the FastMCP server", Peer::FastMcp),
    ("the TypeScript SDK server", Peer::TypeScript),
];

/// Each SDK server's leaky tools, through both SDK clients in both eras and
/// as raw bytes. A case runs as a task of its own so that a failure, of
/// whichever check, is reported with the server's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_tools_of_every_sdk_server_come_out_clean() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    for &(name, peer) in LEAKY_SERVERS {
        if let Err(failed) = tokio::spawn(leaky_tools_come_out_clean(peer)).await {
            panic!("{name}: {failed}");
        }
    }
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
