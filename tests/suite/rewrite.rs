//! Every upstream failure of a `tools/call` is rewritten into the error table:
//! one test per row, each with the exact text snapshotted in
//! `tests/snapshots/rewrite/<name>.txt`. `UPDATE_SNAPSHOTS=1 cargo test --test
//! rewrite` rewrites the snapshots instead of comparing; read the diff before
//! committing it.
//!
//! Real SDK servers give the failures they produce (Python's opaque text,
//! FastMCP's and TypeScript's leaked exception text, a real timeout); the
//! misbehaving upstream in `tests/support/misbehaving.rs` gives the rest.
//! Every answer is checked for the one-response-per-id promise and for the
//! canary secret and hidden channels in its raw bytes.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::misbehaving::{CANARY_PASSWORD, Misbehaving};
use support::{
    ALICE, Mode, Peer, PeerServer, Sdk, TestGateway, borrow, call, gateway_code, modern_call,
    modern_call_headers, raw_post, sdk,
};

fn config(servers: &[(&str, &str)], timeout: &str, sanitize: &str) -> String {
    let mut config = Config::new();
    for (name, url) in servers {
        config = config
            .server(name, url)
            .set("timeout", timeout)
            .set("connect_timeout", "1s")
            .set("pinning", "warn");
    }
    config.clients().allow_all().raw(sanitize).render()
}

/// Hidden channels that must never reach a client, raw or JSON-escaped.
fn assert_clean_bytes(raw: &str) {
    for bad in [
        CANARY_PASSWORD,
        "hunter2",
        "\u{1b}",
        "\\u001b",
        "\\u001B",
        "\u{9b}",
        "\\u009b",
        "\u{E0049}",
        "\\udb40",
        "<script",
        "evil.example",
    ] {
        assert!(!raw.contains(bad), "{bad:?} reached the client: {raw}");
    }
}

/// Calls `tool` on the misbehaving server "s" with a raw 2026-07-28 request;
/// checks the one response and its bytes; returns the result.
async fn raw_call(gateway: &TestGateway, tool: &str) -> Value {
    let headers = modern_call_headers(ALICE, tool);
    let r = raw_post(
        &gateway.url("s"),
        &borrow(&headers),
        modern_call(9, tool, json!({})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["id"], 9, "{}", r.text);
    let responses = r.text.matches("\"result\"").count() + r.text.matches("\"error\":{").count();
    assert_eq!(responses, 1, "exactly one response: {}", r.text);
    assert_clean_bytes(&r.text);
    r.body["result"].clone()
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Snapshots a gateway-made result: its code and text.
fn snapshot(name: &str, code: &str, result: &Value) {
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(
        result["_meta"]["portcullis/error"]["code"], code,
        "{result}"
    );
    assert_eq!(result["resultType"], "complete");
    support::assert_snapshot(
        "rewrite",
        name,
        &format!("code: {code}\n\n{}\n", text_of(result)),
    );
}

/// Snapshots a result seen by an SDK client (`{"isError","text","meta"}`).
fn snapshot_sdk(name: &str, code: &str, result: &Value) {
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(gateway_code(result), Some(code), "{result}");
    let text = result["text"].as_str().unwrap_or_default();
    assert_clean_bytes(text);
    support::assert_snapshot("rewrite", name, &format!("code: {code}\n\n{text}\n"));
}

async fn misbehaving_row(name: &str, tool: &str, code: &str) {
    let up = Misbehaving::start().await;
    let gateway = TestGateway::start_raw(&config(&[("s", &up.url)], "2s", "")).await;
    let result = raw_call(&gateway, tool).await;
    snapshot(name, code, &result);
    assert_eq!(up.calls(), 1, "the upstream was called once");
    gateway.stop().await;
}

// --- JSON-RPC errors on tools/call: upstream_error ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_error_internal() {
    misbehaving_row("upstream_error_internal", "rpc_internal", "upstream_error").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_error_server_error() {
    misbehaving_row(
        "upstream_error_server_error",
        "rpc_server_error",
        "upstream_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_error_unknown_tool() {
    misbehaving_row(
        "upstream_error_unknown_tool",
        "rpc_unknown_tool",
        "upstream_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_error_invalid_params() {
    misbehaving_row(
        "upstream_error_invalid_params",
        "rpc_invalid_params",
        "upstream_error",
    )
    .await;
}

// --- isError from the tool: upstream_tool_failed, with each SDK's own text ---

async fn explode(peer: Peer, name: &str) {
    let up = PeerServer::start(peer).await;
    let gateway = TestGateway::start_raw(&config(&[("s", &up.url)], "10s", "")).await;
    for mode in [Mode::Legacy, Mode::Modern] {
        let r = sdk(
            Sdk::Python,
            mode,
            &gateway.url("s"),
            ALICE,
            json!([call("explode", json!({}))]),
        )
        .await;
        snapshot_sdk(name, "upstream_tool_failed", &r[0]);
    }
    assert_eq!(up.ran(), ["explode", "explode"]);
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tool_failed_python_opaque() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    explode(Peer::Python, "upstream_tool_failed_python_opaque").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tool_failed_fastmcp() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    explode(Peer::FastMcp, "upstream_tool_failed_fastmcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tool_failed_typescript() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    explode(Peer::TypeScript, "upstream_tool_failed_typescript").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tool_failed_opaque_in_raw_bytes() {
    misbehaving_row(
        "upstream_tool_failed_opaque_raw",
        "python_opaque",
        "upstream_tool_failed",
    )
    .await;
}

// --- timeouts ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeout() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let up = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start_raw(&config(&[("s", &up.url)], "2s", "")).await;
    let r = sdk(
        Sdk::Python,
        Mode::Modern,
        &gateway.url("s"),
        ALICE,
        json!([
            call("hang", json!({"seconds": 6})),
            call("echo", json!({"text": "after"}))
        ]),
    )
    .await;
    snapshot_sdk("upstream_timeout", "upstream_timeout", &r[0]);
    assert_eq!(r[1]["text"], "after", "the gateway still serves: {r:?}");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeout_drip() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    misbehaving_row("upstream_timeout_drip", "drip", "upstream_timeout").await;
}

// --- unreachable, 5xx, reset: upstream_unavailable ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_unavailable_refused() {
    let up = Misbehaving::start().await;
    let gateway = TestGateway::start_raw(&config(&[("s", &up.url)], "2s", "")).await;
    // The gateway learns the tools, then the server goes away.
    raw_call(&gateway, "python_opaque").await;
    drop(up);
    let result = raw_call(&gateway, "python_opaque").await;
    snapshot(
        "upstream_unavailable_refused",
        "upstream_unavailable",
        &result,
    );
    assert_eq!(result["_meta"]["portcullis/error"]["retry"], "later");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_unavailable_before_the_tool_list() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let gateway = TestGateway::start_raw(&config(&[("s", &url)], "2s", "")).await;
    // The gateway must list the tools first to check the call; that fails.
    let result = raw_call(&gateway, "anything").await;
    snapshot(
        "upstream_unavailable_unlisted",
        "upstream_unavailable",
        &result,
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_unavailable_html_502() {
    misbehaving_row(
        "upstream_unavailable_html_502",
        "html_502",
        "upstream_unavailable",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_unavailable_reset_mid_stream() {
    misbehaving_row(
        "upstream_unavailable_reset",
        "reset",
        "upstream_unavailable",
    )
    .await;
}

// --- unreadable replies: upstream_protocol_error ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_protocol_garbage_json() {
    misbehaving_row(
        "upstream_protocol_garbage_json",
        "garbage_json",
        "upstream_protocol_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_protocol_wrong_id() {
    misbehaving_row(
        "upstream_protocol_wrong_id",
        "wrong_id",
        "upstream_protocol_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_protocol_sse_wrong_id() {
    misbehaving_row(
        "upstream_protocol_sse_wrong_id",
        "sse_wrong_id",
        "upstream_protocol_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_protocol_truncated_sse() {
    misbehaving_row(
        "upstream_protocol_truncated_sse",
        "truncated_sse",
        "upstream_protocol_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_protocol_sse_without_response() {
    misbehaving_row(
        "upstream_protocol_sse_no_response",
        "sse_no_response",
        "upstream_protocol_error",
    )
    .await;
}

// --- results the gateway withholds ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_withheld() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let up = PeerServer::start(Peer::TypeScript).await;
    let gateway = TestGateway::start_raw(&config(
        &[("s", &up.url)],
        "10s",
        "[sanitize]\nsecrets = \"block\"\n",
    ))
    .await;
    let r = sdk(
        Sdk::Python,
        Mode::Modern,
        &gateway.url("s"),
        ALICE,
        json!([
            call("leaky_text", json!({})),
            call("echo", json!({"text": "fine"}))
        ]),
    )
    .await;
    snapshot_sdk("output_withheld", "output_withheld", &r[0]);
    assert_eq!(r[1]["text"], "fine", "clean output passes: {r:?}");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_schema_violation_after_redaction() {
    misbehaving_row(
        "output_schema_violation_redacted",
        "schema_redacted",
        "output_schema_violation",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_schema_violation_as_sent() {
    misbehaving_row(
        "output_schema_violation_as_sent",
        "schema_wrong",
        "output_schema_violation",
    )
    .await;
}

// --- secrets in arguments never leave ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argument_not_permitted_for_a_secret() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let up = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start_raw(&config(&[("s", &up.url)], "10s", "")).await;
    let key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----";
    let r = sdk(
        Sdk::Python,
        Mode::Legacy,
        &gateway.url("s"),
        ALICE,
        json!([call("echo", json!({"text": key}))]),
    )
    .await;
    snapshot_sdk(
        "argument_not_permitted_secret",
        "argument_not_permitted",
        &r[0],
    );
    assert!(up.ran().is_empty(), "the upstream never received it");
    gateway.stop().await;
}

// --- not a failure: a terminal sequence split across SSE events ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_split_across_sse_events_is_removed_from_both() {
    let up = Misbehaving::start().await;
    let gateway = TestGateway::start_raw(&config(&[("s", &up.url)], "2s", "")).await;
    let result = raw_call(&gateway, "split_escape").await;
    assert_eq!(result["content"][0]["text"], "done");
    // raw_call checked the bytes: neither half of the link reached the client.
    gateway.stop().await;
}
