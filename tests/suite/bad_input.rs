//! Every bad input of the product's error table gets its precise answer, the
//! upstream sees no traffic at all, and the gateway keeps serving.

use crate::support;
use support::Config;

use serde_json::{Value, json};
use support::upstreams::InProcess;
use support::{
    ALICE, BOB, TestGateway, allow_all, borrow, clients, modern_call, modern_call_headers, raw_post,
};

async fn setup() -> (InProcess, TestGateway) {
    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start(
        &[("demo", &upstream.url)],
        &format!("{}{}", clients(), allow_all()),
    )
    .await;
    (upstream, gateway)
}

const ALICE_AUTH: (&str, &str) = ("authorization", "Bearer alice-key");

/// Sends a bad request and checks its answer and that nothing reached the upstream.
async fn refused(
    upstream: &InProcess,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
    status: u16,
    code: Option<i64>,
) -> Value {
    let before = upstream.hits();
    let r = raw_post(url, headers, body).await;
    assert_eq!(r.status, status, "{}", r.text);
    if let Some(code) = code {
        assert_eq!(r.body["error"]["code"], code, "{}", r.text);
    }
    assert_eq!(upstream.hits(), before, "the upstream must not be called");
    r.body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_input_gets_its_answer_and_no_upstream_call() {
    let (upstream, gateway) = setup().await;
    let url = gateway.url("demo");
    let call = modern_call(1, "echo", json!({"text": "hi"}));
    let call_headers = modern_call_headers(ALICE, "echo");
    let h = borrow(&call_headers);

    // Malformed JSON, a batch, a non-object, a JSON-RPC 1.0 message.
    refused(
        &upstream,
        &url,
        &[ALICE_AUTH],
        "{\"jsonrpc\":",
        400,
        Some(-32700),
    )
    .await;
    let batch = format!("[{call}]");
    let body = refused(&upstream, &url, &[ALICE_AUTH], batch, 400, Some(-32600)).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("batches are not supported")
    );
    refused(&upstream, &url, &[ALICE_AUTH], "42", 400, Some(-32600)).await;
    refused(
        &upstream,
        &url,
        &[ALICE_AUTH],
        r#"{"jsonrpc":"1.0","id":1,"method":"tools/list"}"#,
        400,
        Some(-32600),
    )
    .await;

    // Deeply nested JSON is refused before it is parsed.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":{}1{}}}}}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    refused(&upstream, &url, &[ALICE_AUTH], deep, 400, Some(-32600)).await;

    // Headers that disagree with the body (2026-07-28): method, name, version.
    let mut wrong_name = h.clone();
    wrong_name[3] = ("mcp-name", "delete_record");
    refused(
        &upstream,
        &url,
        &wrong_name,
        call.clone(),
        400,
        Some(-32020),
    )
    .await;
    let mut wrong_method = h.clone();
    wrong_method[2] = ("mcp-method", "tools/list");
    refused(
        &upstream,
        &url,
        &wrong_method,
        call.clone(),
        400,
        Some(-32020),
    )
    .await;
    refused(&upstream, &url, &h[..2], call.clone(), 400, Some(-32020)).await;
    let mut old_version = h.clone();
    old_version[1] = ("mcp-protocol-version", "2025-11-25");
    refused(
        &upstream,
        &url,
        &old_version,
        call.clone(),
        400,
        Some(-32020),
    )
    .await;
    let future = call.replace("2026-07-28", "2099-01-01");
    let mut future_headers = h.clone();
    future_headers[1] = ("mcp-protocol-version", "2099-01-01");
    let body = refused(&upstream, &url, &future_headers, future, 400, Some(-32022)).await;
    assert_eq!(body["error"]["data"]["requested"], "2099-01-01");
    assert_eq!(body["error"]["data"]["supported"], json!(["2026-07-28"]));

    // Foreign Origin and Host (DNS rebinding).
    let mut origin = h.clone();
    origin.push(("origin", "https://evil.example"));
    refused(&upstream, &url, &origin, call.clone(), 403, None).await;
    let mut host = h.clone();
    host.push(("host", "evil.example"));
    refused(&upstream, &url, &host, call.clone(), 403, None).await;

    // Missing and wrong credentials.
    let r = raw_post(&url, &h[1..], call.clone()).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    refused(
        &upstream,
        &url,
        &[("authorization", "Bearer wrong")],
        call.clone(),
        401,
        None,
    )
    .await;

    // Bodies over max_request_bytes, with and without Content-Length.
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{}"}}}}}}"#,
        "x".repeat(2 << 20)
    );
    refused(&upstream, &url, &[ALICE_AUTH], big.clone(), 413, None).await;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .into_bytes()
        .chunks(64 * 1024)
        .map(|c| Ok(c.to_vec()))
        .collect();
    refused(
        &upstream,
        &url,
        &[ALICE_AUTH],
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)),
        413,
        None,
    )
    .await;

    // An unknown server.
    refused(&upstream, &gateway.url("nope"), &h, call.clone(), 404, None).await;

    // Nothing ran, and the gateway still serves a good call.
    assert!(upstream.ran().is_empty());
    let ok = raw_post(&url, &h, call).await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    assert_eq!(ok.body["result"]["content"][0]["text"], "hi");
    assert_eq!(upstream.ran().len(), 1);
    gateway.stop().await;
}

/// A field its method cannot go without — a tool's or prompt's name, a
/// resource's URI, a completion's reference — missing or of the wrong type:
/// refused where the request is typed (-32602, naming the field), before
/// any rule, any list the gateway would fetch, or the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_its_judged_field_is_refused_with_its_path() {
    let (upstream, gateway) = setup().await;
    let url = gateway.url("demo");
    let message = |method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string()
    };
    for (body, why) in [
        (
            message("tools/call", json!({"name": 7, "arguments": {}})),
            "tools/call needs params.name, a string",
        ),
        (
            message("tools/call", json!({"arguments": {"text": "hi"}})),
            "tools/call needs params.name, a string",
        ),
        (
            message("resources/read", json!({"uri": ["file:///a"]})),
            "resources/read needs params.uri, a string",
        ),
        (
            message("prompts/get", json!({})),
            "prompts/get needs params.name, a string",
        ),
        (
            message(
                "completion/complete",
                json!({"ref": {"type": "ref/prompt"}, "argument": {"name": "a", "value": ""}}),
            ),
            "completion/complete needs params.ref.name, a string",
        ),
        (
            message(
                "completion/complete",
                json!({"ref": {"type": "ref/tool", "name": "echo"}, "argument": {"name": "a", "value": ""}}),
            ),
            "completion/complete needs params.ref of type ref/prompt or ref/resource",
        ),
    ] {
        let answer = refused(&upstream, &url, &[ALICE_AUTH], body, 400, Some(-32602)).await;
        assert_eq!(answer["error"]["message"], why, "{answer}");
        assert_eq!(answer["id"], 7);
    }
    assert!(upstream.ran().is_empty());
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_belongs_to_the_client_that_opened_it() {
    let (upstream, gateway) = setup().await;
    let url = gateway.url("demo");
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let r = raw_post(&url, &[ALICE_AUTH], init).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let session = r.headers["mcp-session-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let with = |key: &'static str| {
        vec![
            ("authorization", key),
            ("mcp-session-id", session.as_str()),
            ("mcp-protocol-version", "2025-11-25"),
        ]
    };

    // Bob presents alice's session: answered exactly like an unknown session.
    let bobs = refused(
        &upstream,
        &url,
        &with("Bearer bob-key"),
        list,
        404,
        Some(-31004),
    )
    .await;
    let unknown = refused(
        &upstream,
        &url,
        &[
            ("authorization", "Bearer alice-key"),
            ("mcp-session-id", "made-up"),
        ],
        list,
        404,
        Some(-31004),
    )
    .await;
    assert_eq!(bobs["error"], unknown["error"]);

    // Alice's own session works.
    let r = raw_post(&url, &with("Bearer alice-key"), list).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        r.body["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
    );
    let _ = BOB;
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_initialize_flood_never_evicts_another_clients_session() {
    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start_config(
        &Config::new()
            .gateway("max_sessions", 50)
            .gateway("max_sessions_per_client", 3)
            .server("demo", &upstream.url)
            .clients()
            .allow_all(),
    )
    .await;
    let url = gateway.url("demo");
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let open = |key: &'static str| {
        let url = url.clone();
        async move {
            let auth = format!("Bearer {key}");
            let r = raw_post(&url, &[("authorization", auth.as_str())], init).await;
            assert_eq!(r.status, 200, "{}", r.text);
            r.headers["mcp-session-id"]
                .to_str()
                .expect("ascii")
                .to_owned()
        }
    };
    let alices = open(ALICE).await;
    // Bob opens far more sessions than the whole table holds.
    let mut bobs = Vec::new();
    for _ in 0..60 {
        bobs.push(open(BOB).await);
    }
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let uses = |key: &'static str, session: String| {
        let url = url.clone();
        async move {
            let auth = format!("Bearer {key}");
            let headers = [
                ("authorization", auth.as_str()),
                ("mcp-session-id", session.as_str()),
                ("mcp-protocol-version", "2025-11-25"),
            ];
            raw_post(&url, &headers, list).await.status
        }
    };
    assert_eq!(uses(ALICE, alices).await, 200, "alice's session survived");
    // Bob keeps his own newest sessions, and lost his oldest.
    assert_eq!(uses(BOB, bobs[59].clone()).await, 200);
    assert_eq!(uses(BOB, bobs[57].clone()).await, 200);
    assert_eq!(uses(BOB, bobs[0].clone()).await, 404);
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_is_served_and_its_authority_checked_like_host() {
    let (upstream, gateway) = setup().await;
    let url = gateway.url("demo");
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("address");
    support::init();
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .resolve("evil.example", addr)
        .build()
        .expect("client");
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let send = |target: String| {
        h2.post(target)
            .header("authorization", "Bearer alice-key")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(list)
            .send()
    };
    let r = send(url.clone()).await.expect("an h2c exchange");
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    let body: Value = serde_json::from_str(&r.text().await.expect("body")).expect("json");
    assert!(
        body["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{body}"
    );

    // A foreign :authority is refused like a foreign Host, before anything reaches the upstream.
    let before = upstream.hits();
    let foreign = format!("http://evil.example:{}/mcp/demo", addr.port());
    let r = send(foreign).await.expect("an h2c exchange");
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 403);
    assert_eq!(upstream.hits(), before);
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_anywhere_in_a_client_message_is_not_sent_upstream() {
    use support::misbehaving::CANARIES;
    let (upstream, gateway) = setup().await;
    let url = gateway.url("demo");
    let key = CANARIES[0];
    let message = |method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": params}).to_string()
    };
    // tools/call: a value and a key of its `_meta`: the call's isError answer.
    for (params, pointer) in [
        (
            json!({"name": "echo", "arguments": {"text": "hi"}, "_meta": {"trace": key}}),
            "/params/_meta/trace",
        ),
        (
            json!({"name": "echo", "arguments": {"text": "hi"}, "_meta": {key: 1}}),
            "/params/_meta/[REDACTED:",
        ),
    ] {
        let before = upstream.hits();
        let r = raw_post(&url, &[ALICE_AUTH], message("tools/call", params)).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
        let error = &r.body["result"]["_meta"]["portcullis/error"];
        assert_eq!(error["code"], "argument_not_permitted", "{}", r.text);
        assert!(
            error["secrets"][0]["pointer"]
                .as_str()
                .is_some_and(|p| p.contains(pointer)),
            "{}",
            r.text
        );
        assert!(!r.text.contains(key), "{}", r.text);
        assert_eq!(upstream.hits(), before);
    }
    // Any other request: prompt arguments, a resource URI, a completion value, a list's _meta.
    for (method, params, pointer) in [
        (
            "prompts/get",
            json!({"name": "greet", "arguments": {"who": key}}),
            "/params/arguments/who",
        ),
        (
            "resources/read",
            json!({"uri": format!("file:///{key}")}),
            "/params/uri",
        ),
        (
            "completion/complete",
            json!({"ref": {"type": "ref/prompt", "name": "greet"}, "argument": {"name": "who", "value": key}}),
            "/params/argument/value",
        ),
        (
            "tools/list",
            json!({"_meta": {"k": key}}),
            "/params/_meta/k",
        ),
    ] {
        let before = upstream.hits();
        let r = raw_post(&url, &[ALICE_AUTH], message(method, params)).await;
        assert_eq!(r.status, 200, "{method}: {}", r.text);
        assert_eq!(r.body["error"]["code"], -32602, "{method}: {}", r.text);
        let data = &r.body["error"]["data"];
        assert_eq!(
            data["code"], "argument_not_permitted",
            "{method}: {}",
            r.text
        );
        assert_eq!(
            data["secrets"][0]["pointer"], pointer,
            "{method}: {}",
            r.text
        );
        assert!(!r.text.contains(key), "{method}: {}", r.text);
        assert_eq!(upstream.hits(), before, "{method} reached the upstream");
    }
    // A notification and a response to a server's request: HTTP 400, nothing sent.
    let before = upstream.hits();
    let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 1, "reason": key}});
    let r = raw_post(&url, &[ALICE_AUTH], note.to_string()).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let answer = json!({"jsonrpc": "2.0", "id": "s-1", "result": {"action": "accept", "content": {"token": key}}});
    let r = raw_post(&url, &[ALICE_AUTH], answer.to_string()).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(
        r.body["error"]["data"]["secrets"][0]["pointer"],
        "/result/content/token"
    );
    assert_eq!(upstream.hits(), before);
    gateway.stop().await;
}
