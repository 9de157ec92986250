//! An upstream's HTTP refusal is its answer: the gateway relays its status and
//! its JSON-RPC error (sanitized, under the request's id), and never says the
//! request "may have run" when the upstream refused it.
//!
//! Real peers: the MCP Inspector CLI (the client many people try first)
//! through `portcullis demo` and through Python SDK servers with and without a
//! GET stream; raw requests for the answers no client sends on purpose.

use crate::support;
use support::tiers::{self, Tier};

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use support::{ALICE, Peer, PeerServer, TestGateway, allow_all, clients, peers_dir, raw_post};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

fn policy() -> String {
    format!("{}{}", clients(), allow_all())
}

/// Node 22 and the Inspector's entry point; fails (never skips) when missing.
fn inspector_paths() -> (PathBuf, PathBuf) {
    let dir = peers_dir().join("inspector");
    let node = dir.join("node_modules/.bin/node");
    let entry =
        dir.join("node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js");
    assert!(
        node.exists() && entry.exists(),
        "the MCP Inspector or Node 22 is missing in {} — install the test peers with `bash tests/peers/setup.sh`",
        dir.display()
    );
    (node, entry)
}

/// What one Inspector CLI run printed.
#[derive(Debug)]
struct Inspected {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Inspected {
    /// The JSON result it printed.
    fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|_| {
            panic!(
                "the Inspector printed no JSON result\nstdout: {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Runs `mcp-inspector --cli URL --transport http` with `args`, with its
/// catalog and home in a temporary directory of its own.
async fn inspector(url: &str, key: &str, era: &str, args: &[&str]) -> Inspected {
    let (node, entry) = inspector_paths();
    let home = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(node);
    cmd.arg(entry)
        .args([
            "--cli",
            url,
            "--transport",
            "http",
            "--protocol-era",
            era,
            "--format",
            "json",
        ])
        .args(["--header", &format!("Authorization: Bearer {key}")])
        .args(args)
        .env("HOME", home.path())
        .env("MCP_CATALOG_PATH", home.path().join("mcp.json"))
        .env("NO_COLOR", "1")
        .env("CI", "true")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("the Inspector finishes in time")
        .expect("the Inspector runs");
    Inspected {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The tool names of a `tools/list` result the Inspector printed (`--format json`
/// wraps it in `{"result": …}`).
fn tool_names(printed: &Value) -> Vec<String> {
    printed["result"]["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `portcullis demo` on a free port: the process and its MCP endpoint.
async fn demo() -> (Child, String) {
    let mut demo = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["demo", "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the demo starts");
    let stdout = demo.stdout.take().expect("stdout");
    let url = tokio::time::timeout(Duration::from_secs(30), async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.trim().strip_prefix("MCP endpoint") {
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                return Some(rest.trim().to_owned());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("the demo prints its MCP endpoint");
    (demo, url)
}

/// A GET or DELETE to `url` with the client's key and `headers`: the status,
/// the headers, and the body unless it is an event stream.
async fn raw(
    method: reqwest::Method,
    url: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, String) {
    support::init();
    let client = support::http();
    let mut req = client
        .request(method, url)
        .header("authorization", format!("Bearer {ALICE}"))
        .header("accept", "text/event-stream, application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(Duration::from_secs(20), req.send())
        .await
        .expect("an answer in time")
        .expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let stream = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let text = match stream {
        true => String::new(),
        false => resp.text().await.unwrap_or_default(),
    };
    (status, headers, text)
}

const LEGACY_INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

// === The MCP Inspector CLI ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_lists_and_calls_the_demo_tools_in_both_eras() {
    if !tiers::ready(&[Tier::Node]) {
        return;
    }
    let (mut demo, url) = demo().await;
    let key = portcullis::demo::ANALYST_KEY;
    for era in ["legacy", "modern"] {
        let listed = inspector(&url, key, era, &["--method", "tools/list"]).await;
        assert!(listed.ok, "{era}: {listed:?}");
        let names = tool_names(&listed.json());
        assert!(
            names.contains(&"lookup_order".to_owned()),
            "{era}: {names:?} {listed:?}"
        );
        let called = inspector(
            &url,
            key,
            era,
            &[
                "--method",
                "tools/call",
                "--tool-name",
                "lookup_order",
                "--tool-arg",
                "order_id=ORD-004211",
            ],
        )
        .await;
        assert!(called.ok, "{era}: {called:?}");
        assert!(
            called.stdout.contains("Order ORD-004211"),
            "{era}: {called:?}"
        );
    }
    let _ = demo.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_works_through_the_gateway_in_front_of_python_servers() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    // With a GET stream (sessions, SSE), without one (stateless), and with JSON replies.
    for peer in [Peer::Python, Peer::PythonStateless, Peer::PythonJson] {
        let up = PeerServer::start(peer).await;
        let gateway = TestGateway::start(&[("py", &up.url)], &policy()).await;
        let url = gateway.url("py");
        for era in ["legacy", "modern"] {
            let listed = inspector(&url, ALICE, era, &["--method", "tools/list"]).await;
            assert!(listed.ok, "{peer:?} {era}: {listed:?}");
            let names = tool_names(&listed.json());
            assert!(
                names.contains(&"echo".to_owned()),
                "{peer:?} {era}: {names:?}"
            );
            let called = inspector(
                &url,
                ALICE,
                era,
                &[
                    "--method",
                    "tools/call",
                    "--tool-name",
                    "echo",
                    "--tool-arg",
                    "text=hello inspector",
                ],
            )
            .await;
            assert!(called.ok, "{peer:?} {era}: {called:?}");
            assert!(
                called.stdout.contains("hello inspector"),
                "{peer:?} {era}: {called:?}"
            );
        }
        gateway.stop().await;
        up.stop().await;
    }
}

// === Raw refusals ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_stream_the_upstream_does_not_offer_is_answered_405_as_the_upstream_said() {
    let (mut demo, url) = demo().await;
    let key = format!("Bearer {}", portcullis::demo::ANALYST_KEY);
    let init = raw_post(&url, &[("authorization", key.as_str())], LEGACY_INIT).await;
    assert_eq!(init.status, 200, "{}", init.text);
    let session = init.headers["mcp-session-id"]
        .to_str()
        .expect("session id")
        .to_owned();
    let client = support::http();
    let get = client
        .get(&url)
        .header("authorization", &key)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .expect("sent");
    assert_eq!(get.status().as_u16(), 405);
    let allow = get
        .headers()
        .get("allow")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    assert!(
        allow.is_some_and(|a| a.contains("POST")),
        "the upstream's Allow is relayed"
    );
    let body: Value =
        serde_json::from_str(&get.text().await.unwrap_or_default()).expect("a JSON-RPC error body");
    assert_eq!(body["error"]["code"], -31016, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("405 Method Not Allowed"), "{body}");
    assert!(!message.contains("may have run"), "{body}");
    assert_eq!(body["error"]["data"]["code"], "upstream_refused", "{body}");
    let _ = demo.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_servers_400_for_a_missing_session_is_relayed_under_the_request_id() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let up = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start(&[("py", &up.url)], &policy()).await;
    let key = format!("Bearer {ALICE}");
    let headers = [
        ("authorization", key.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    for (id, body) in [
        (
            json!(7),
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}),
        ),
        (
            json!("c-1"),
            json!({"jsonrpc": "2.0", "id": "c-1", "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hi"}}}),
        ),
        (
            json!(9),
            json!({"jsonrpc": "2.0", "id": 9, "method": "prompts/list"}),
        ),
    ] {
        let r = raw_post(&gateway.url("py"), &headers, body.to_string()).await;
        assert_eq!(r.status, 400, "{id}: {}", r.text);
        assert_eq!(
            r.body["id"], id,
            "the request's id, not \"server-error\": {}",
            r.text
        );
        let message = r.body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("Missing session ID"),
            "the upstream's own error: {}",
            r.text
        );
        assert!(!r.text.contains("may have run"), "{}", r.text);
    }
    assert!(up.ran().is_empty(), "nothing ran: {:?}", up.ran());
    gateway.stop().await;
    up.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_the_upstream_refuses_is_relayed_and_a_get_stream_it_offers_is_served() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let up = PeerServer::start(Peer::PythonStateless).await;
    let gateway = TestGateway::start(&[("py", &up.url)], &policy()).await;
    let url = gateway.url("py");
    let legacy = [("mcp-protocol-version", "2025-11-25")];
    // A stateless Python server has no session to end: its refusal is relayed.
    let (status, _, text) = raw(reqwest::Method::DELETE, &url, &legacy).await;
    assert!(
        (400..500).contains(&status) && status != 404,
        "{status} {text}"
    );
    let body: Value = serde_json::from_str(&text).expect("a JSON-RPC error");
    assert!(body["error"]["code"].is_i64(), "{text}");
    assert!(!text.contains("may have run"), "{text}");
    // It does offer a GET stream, which is relayed as a stream.
    let (status, headers, _) = raw(reqwest::Method::GET, &url, &legacy).await;
    assert_eq!(status, 200);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap_or_default()
            .starts_with("text/event-stream")
    );
    gateway.stop().await;
    up.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_upstream_ended_is_answered_404_so_the_client_starts_a_new_one() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let up = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start(&[("py", &up.url)], &policy()).await;
    let key = format!("Bearer {ALICE}");
    let init = raw_post(
        &gateway.url("py"),
        &[("authorization", key.as_str())],
        LEGACY_INIT,
    )
    .await;
    assert_eq!(init.status, 200, "{}", init.text);
    let session = init.headers["mcp-session-id"]
        .to_str()
        .expect("session id")
        .to_owned();
    // The server ends the session behind the gateway's back.
    let client = support::http();
    let ended = client
        .delete(&up.url)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .expect("sent");
    assert!(ended.status().is_success(), "{}", ended.status());
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}}});
    let headers = [
        ("authorization", key.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
        ("mcp-session-id", session.as_str()),
    ];
    let r = raw_post(&gateway.url("py"), &headers, call.to_string()).await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(r.body["id"], 5, "{}", r.text);
    assert!(!r.text.contains("may have run"), "{}", r.text);
    assert!(up.ran().is_empty(), "nothing ran: {:?}", up.ran());
    gateway.stop().await;
    up.stop().await;
}
