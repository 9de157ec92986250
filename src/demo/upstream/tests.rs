use super::handle::META_PROTOCOL_VERSION;
use super::state::CALL_LOG_CAP;
use super::*;

use http::{StatusCode, header};
use serde_json::{Value, json};

use std::sync::Once;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A demo upstream on an ephemeral port; stops when dropped.
struct Running {
    url: String,
    handle: DemoUpstream,
    client: reqwest::Client,
    _stop: oneshot::Sender<()>,
}

async fn start(options: DemoOptions) -> Running {
    static PROVIDER: Once = Once::new();
    // reqwest is built without a default crypto provider; plain HTTP
    // still needs one installed before a client can be built.
    PROVIDER.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (app, handle) = router(options);
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    });
    Running {
        url: format!("http://{addr}/mcp"),
        handle,
        client: reqwest::Client::builder().build().expect("client"),
        _stop: stop,
    }
}

fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"}
    })
}

impl Running {
    async fn post(&self, body: Value) -> reqwest::Response {
        self.client
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("send")
    }

    async fn rpc(&self, method: &str, params: Value) -> (StatusCode, Value) {
        let response = self
            .post(json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
            .await;
        let status = response.status();
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let body = json_body(response).await;
        (status, body)
    }

    async fn call(&self, name: &str, arguments: Value) -> Value {
        let (status, body) = self
            .rpc("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        assert_eq!(status, StatusCode::OK);
        body
    }
}

async fn json_body(response: reqwest::Response) -> Value {
    let bytes = response.bytes().await.expect("body");
    serde_json::from_slice(&bytes).expect("json body")
}

fn first_text(body: &Value) -> &str {
    body["result"]["content"][0]["text"].as_str().unwrap_or("")
}

/// `data:` payloads of an SSE body, in order (empty priming data included).
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .filter_map(|event| {
            event
                .lines()
                .find_map(|line| line.strip_prefix("data:"))
                .map(|d| d.trim_start().to_owned())
        })
        .collect()
}

#[tokio::test]
async fn legacy_initialize_returns_session_and_version() {
    let up = start(DemoOptions::default()).await;
    let response = up
        .post(json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "0"}}
        }))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert_eq!(session.len(), 32);
    assert!(session.bytes().all(|b| b.is_ascii_hexdigit()));
    let body = json_body(response).await;
    assert_eq!(body["id"], 1);
    assert_eq!(body["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(body["result"]["serverInfo"]["name"], "portcullis-demo");
    assert_eq!(
        body["result"]["capabilities"]["tools"]["listChanged"],
        false
    );
    assert!(body["result"].get("resultType").is_none());

    // Unknown versions fall back to the latest legacy one; ids differ.
    let response = up
        .post(json!({"jsonrpc": "2.0", "id": "a", "method": "initialize",
                     "params": {"protocolVersion": "1999-01-01"}}))
        .await;
    assert_ne!(response.headers()["mcp-session-id"], session.as_str());
    let body = json_body(response).await;
    assert_eq!(body["id"], "a");
    assert_eq!(body["result"]["protocolVersion"], "2025-11-25");
}

#[tokio::test]
async fn notifications_ping_and_http_methods() {
    let up = start(DemoOptions::default()).await;
    let response = up
        .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert!(response.bytes().await.expect("body").is_empty());
    let response = up
        .post(json!({"jsonrpc": "2.0", "id": 3, "result": {}}))
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);

    let (status, body) = up.rpc("ping", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["result"], json!({}));

    let get = up.client.get(&up.url).send().await.expect("get");
    assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
    let delete = up.client.delete(&up.url).send().await.expect("delete");
    assert_eq!(delete.status(), StatusCode::OK);
}

#[tokio::test]
async fn tools_list_has_the_seven_tools_and_extras() {
    let up = start(DemoOptions::default()).await;
    let (_, body) = up.rpc("tools/list", json!({})).await;
    let names: Vec<&str> = body["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "lookup_order",
            "delete_record",
            "generate_report",
            "fetch_logs",
            "slow_query",
            "echo",
            "sync_notes"
        ]
    );
    let tools = &body["result"]["tools"];
    assert_eq!(
        tools[0]["inputSchema"]["properties"]["order_id"]["pattern"],
        "^ORD-[0-9]{6}$"
    );
    assert_eq!(tools[1]["annotations"]["destructiveHint"], true);
    assert!(body["result"].get("nextCursor").is_none());
    assert!(body["result"].get("resultType").is_none());

    let up = start(DemoOptions {
        extra_tools: 3,
        ..DemoOptions::default()
    })
    .await;
    let (_, body) = up.rpc("tools/list", json!({})).await;
    let tools = body["result"]["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), 10);
    assert_eq!(tools[9]["name"], "tool_0003");
    assert_eq!(
        first_text(&up.call("tool_0002", json!({"x": 1})).await),
        "ok"
    );
}

#[tokio::test]
async fn lookup_order_reflects_unvalidated_input_and_logs_it() {
    let up = start(DemoOptions::default()).await;
    let evil = "'; DROP TABLE orders; --";
    let body = up.call("lookup_order", json!({"order_id": evil})).await;
    assert!(first_text(&body).starts_with(&format!("Order {evil}:")));
    assert!(body["result"].get("isError").is_none());

    let body = up
        .call(
            "lookup_order",
            json!({"order_id": "ORD-004211", "include_items": true, "extra": 1}),
        )
        .await;
    assert!(first_text(&body).contains("Items:"));

    let calls = up.handle.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[0],
        ("lookup_order".to_owned(), json!({"order_id": evil}))
    );
    assert_eq!(calls[1].1["extra"], 1);
}

#[tokio::test]
async fn other_flawed_tools() {
    let up = start(DemoOptions::default()).await;
    let body = up
        .call("generate_report", json!({"month": "2026-07"}))
        .await;
    assert_eq!(
        body["result"],
        json!({"content": [{"type": "text", "text": "Error executing tool generate_report"}],
               "isError": true})
    );

    let body = up
        .call("delete_record", json!({"record_id": "CUST-1042"}))
        .await;
    assert_eq!(first_text(&body), "deleted CUST-1042");

    let body = up.call("fetch_logs", json!({"lines": 5})).await;
    let text = first_text(&body);
    for needle in [
        "\u{1b}[31mERROR\u{1b}[0m",
        "\u{1b}]8;;http://evil.example\u{7}click\u{1b}]8;;\u{7}",
        "\u{200b}",
        "AKIAZ7QWERTYUIOPASDF",
        "password=hunter2-demo",
    ] {
        assert!(text.contains(needle), "missing {needle:?}");
    }
    let names: Vec<String> = up.handle.calls().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["generate_report", "delete_record", "fetch_logs"]);
}

#[tokio::test]
async fn echo_pads_and_can_answer_as_sse() {
    let up = start(DemoOptions {
        pad_output: 5,
        ..DemoOptions::default()
    })
    .await;
    let body = up.call("echo", json!({"text": "hi"})).await;
    assert_eq!(first_text(&body), "hi.....");

    let up = start(DemoOptions {
        sse: true,
        ..DemoOptions::default()
    })
    .await;
    let response = up
        .post(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                     "params": {"name": "echo", "arguments": {"text": "yo"}}}))
        .await;
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    assert_eq!(response.headers()[header::CACHE_CONTROL], "no-cache");
    let text = response.text().await.expect("body");
    let events = sse_data(&text);
    assert_eq!(events.len(), 1);
    let body: Value = serde_json::from_str(&events[0]).expect("json event");
    assert_eq!(body["id"], 9);
    assert_eq!(first_text(&body), "yo");
}

#[tokio::test]
async fn slow_query_streams_progress_then_result() {
    let up = start(DemoOptions::default()).await;
    let response = up
        .post(json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call",
                     "params": {"name": "slow_query", "arguments": {"seconds": 1},
                                "_meta": {"progressToken": "tok-1"}}}))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let text = response.text().await.expect("body");
    assert!(text.starts_with("id: "), "no priming event: {text:?}");
    let events = sse_data(&text);
    assert_eq!(events.first().map(String::as_str), Some(""));
    let messages: Vec<Value> = events[1..]
        .iter()
        .map(|e| serde_json::from_str(e).expect("json event"))
        .collect();
    let (last, progress) = messages.split_last().expect("events");
    assert!(!progress.is_empty());
    let mut previous = 0.0;
    for p in progress {
        assert_eq!(p["method"], "notifications/progress");
        assert_eq!(p["params"]["progressToken"], "tok-1");
        assert_eq!(p["params"]["total"], 1.0);
        let value = p["params"]["progress"].as_f64().expect("progress");
        assert!(value > previous);
        previous = value;
    }
    assert_eq!(last["id"], 11);
    assert!(first_text(last).contains("1.000s"));
    assert_eq!(up.handle.calls()[0].1, json!({"seconds": 1}));
}

#[tokio::test]
async fn slow_query_without_token_answers_json() {
    let up = start(DemoOptions::default()).await;
    let body = up.call("slow_query", json!({"seconds": 0.1})).await;
    assert!(first_text(&body).contains("0.100s"));
}

#[tokio::test]
async fn modern_requests_get_result_type_and_discover() {
    let up = start(DemoOptions::default()).await;
    let (status, body) = up
        .rpc("server/discover", json!({"_meta": modern_meta()}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let result = &body["result"];
    assert_eq!(
        result["supportedVersions"],
        json!([
            "2024-11-05",
            "2025-03-26",
            "2025-06-18",
            "2025-11-25",
            "2026-07-28"
        ])
    );
    assert_eq!(result["capabilities"], json!({"tools": {}}));
    assert_eq!(result["serverInfo"]["name"], "portcullis-demo");
    assert_eq!(result["ttlMs"], 0);
    assert_eq!(result["cacheScope"], "public");
    assert_eq!(result["resultType"], "complete");

    let (_, body) = up.rpc("tools/list", json!({"_meta": modern_meta()})).await;
    assert_eq!(body["result"]["resultType"], "complete");
    assert_eq!(body["result"]["ttlMs"], 0);
    assert_eq!(body["result"]["cacheScope"], "public");

    let (_, body) = up
        .rpc(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}, "_meta": modern_meta()}),
        )
        .await;
    assert_eq!(body["result"]["resultType"], "complete");
    assert_eq!(first_text(&body), "x");

    // Modern SSE streams carry no priming event (no resumability in 2026-07-28).
    let mut meta = modern_meta();
    meta["progressToken"] = json!(5);
    let response = up
        .post(json!({"jsonrpc": "2.0", "id": 12, "method": "tools/call",
                     "params": {"name": "slow_query", "arguments": {"seconds": 0.2},
                                "_meta": meta}}))
        .await;
    let text = response.text().await.expect("body");
    assert!(text.starts_with("event: message\n"), "{text:?}");
    let events = sse_data(&text);
    assert_eq!(events.len(), 2);
    let last: Value = serde_json::from_str(&events[1]).expect("json event");
    assert_eq!(last["result"]["resultType"], "complete");

    let (status, body) = up.rpc("initialize", json!({"_meta": modern_meta()})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], -32601);

    let mut meta = modern_meta();
    meta[META_PROTOCOL_VERSION] = json!("2099-01-01");
    let (status, body) = up.rpc("tools/list", json!({"_meta": meta})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], -32022);
    assert_eq!(body["error"]["data"]["requested"], "2099-01-01");
}

#[tokio::test]
async fn protocol_errors() {
    let up = start(DemoOptions::default()).await;
    let (status, body) = up
        .rpc("tools/call", json!({"name": "nope", "arguments": {}}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["error"]["code"], -32602);
    assert_eq!(body["error"]["message"], "Unknown tool: nope");
    assert!(up.handle.calls().is_empty());

    let (status, body) = up.rpc("resources/list", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["error"]["code"], -32601);
    assert_eq!(body["id"], 7);

    let response = up
        .client
        .post(&up.url)
        .body("{\"jsonrpc\":\"2.0\",")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = json_body(response).await;
    assert_eq!(body["error"]["code"], -32700);

    let response = up
        .post(json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]))
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = up
        .post(json!({"jsonrpc": "2.0", "id": null, "method": "ping"}))
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    let too_big = vec![b' '; MAX_BODY_BYTES + 1];
    let response = up
        .client
        .post(&up.url)
        .body(too_big)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[test]
fn call_log_is_bounded() {
    let shared = Shared::new(DemoOptions::default());
    for i in 0..CALL_LOG_CAP + 5 {
        shared.record("echo".to_owned(), json!(i));
    }
    let log = shared.log();
    assert_eq!(log.len(), CALL_LOG_CAP);
    assert_eq!(log.front().map(|(_, v)| v.clone()), Some(json!(5)));
}
