//! Tasks belong to the client that created them: another client (or no client)
//! gets the answer an unknown task gets, lists show one's own tasks only, and
//! a task's result passes the same output checks as the tools/call it stands
//! for. The upstream keeps every task in one store for everyone
//! (`support::tasks`), so only the gateway stands between Alice's task and Bob.

use crate::support;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::misbehaving::CANARY_FRAGMENTS;
use support::tasks::TasksUpstream;
use support::{
    ALICE, BOB, Peer, PeerServer, Raw, TestGateway, allow_all, clients, modern_meta, raw_post,
};

async fn setup(extra: &str) -> (TasksUpstream, TestGateway) {
    let upstream = TasksUpstream::start().await;
    let gateway = TestGateway::start(
        &[("t", &upstream.url)],
        &format!("{}{}{extra}", clients(), allow_all()),
    )
    .await;
    (upstream, gateway)
}

/// A 2025-11-25 request by `key` (none: unauthenticated).
async fn legacy(url: &str, key: Option<&str>, method: &str, params: Value) -> Raw {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("mcp-protocol-version", "2025-11-25")];
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_str()));
    }
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    raw_post(url, &headers, body.to_string()).await
}

/// A 2026-07-28 request by `key`, with the standard headers.
async fn modern(url: &str, key: &str, method: &str, name: &str, mut params: Value) -> Raw {
    params["_meta"] = modern_meta();
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let auth = format!("Bearer {key}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", method),
        ("mcp-name", name),
    ];
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    raw_post(url, &headers, body.to_string()).await
}

async fn create_legacy(url: &str, key: &str, tool: &str, topic: &str) -> String {
    let r = legacy(
        url,
        Some(key),
        "tools/call",
        json!({"name": tool, "arguments": {"topic": topic}, "task": {"ttl": 60000}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let id = r.body["result"]["task"]["taskId"].as_str();
    id.unwrap_or_else(|| panic!("a task: {}", r.text))
        .to_owned()
}

fn no_canary(text: &str) {
    for fragment in CANARY_FRAGMENTS {
        assert!(!text.contains(fragment), "{fragment} leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alices_task_is_invisible_and_unreadable_to_anyone_else() {
    let (upstream, gateway) = setup("").await;
    let url = gateway.url("t");
    let alices = create_legacy(&url, ALICE, "research", "tides").await;
    let bobs = create_legacy(&url, BOB, "research", "moons").await;
    let alices_second = create_legacy(&url, ALICE, "research", "waves").await;

    // What a task id nobody created gets, and what Bob gets for Alice's: the same answer.
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let before = upstream.count(method);
        let unknown = legacy(&url, Some(BOB), method, json!({"taskId": "made-up"})).await;
        let stolen = legacy(&url, Some(BOB), method, json!({"taskId": alices})).await;
        assert_eq!(unknown.status, 200, "{}", unknown.text);
        assert_eq!(unknown.body["error"]["code"], -32602, "{}", unknown.text);
        assert_eq!(stolen.status, unknown.status, "{method}");
        assert_eq!(stolen.body, unknown.body, "{method}: {}", stolen.text);
        assert!(!stolen.text.contains("tides"), "{}", stolen.text);
        assert_eq!(
            upstream.count(method),
            before,
            "{method} reached the upstream"
        );
        // Without credentials: 401, as for any other request.
        let anonymous = legacy(&url, None, method, json!({"taskId": alices})).await;
        assert_eq!(anonymous.status, 401, "{}", anonymous.text);
    }
    assert_eq!(
        legacy(&url, None, "tasks/list", json!({})).await.status,
        401
    );

    // Lists: each client sees its own tasks only, from every page of the upstream's list.
    let ids = |r: &Raw| -> Vec<String> {
        r.body["result"]["tasks"]
            .as_array()
            .unwrap_or_else(|| panic!("a task list: {}", r.text))
            .iter()
            .filter_map(|t| t["taskId"].as_str().map(str::to_owned))
            .collect()
    };
    let bob_list = legacy(&url, Some(BOB), "tasks/list", json!({})).await;
    assert_eq!(ids(&bob_list), vec![bobs.clone()], "{}", bob_list.text);
    let alice_list = legacy(&url, Some(ALICE), "tasks/list", json!({})).await;
    assert_eq!(
        ids(&alice_list),
        vec![alices.clone(), alices_second.clone()]
    );
    assert!(alice_list.body["result"].get("nextCursor").is_none());
    // The gateway hands out no cursor, so one sent is an invalid cursor (-32602).
    let cursor = legacy(&url, Some(ALICE), "tasks/list", json!({"cursor": "2"})).await;
    assert_eq!(cursor.body["error"]["code"], -32602, "{}", cursor.text);

    // Alice's own task works as the upstream serves it.
    let got = legacy(&url, Some(ALICE), "tasks/get", json!({"taskId": alices})).await;
    assert_eq!(got.body["result"]["status"], "completed", "{}", got.text);
    let result = legacy(&url, Some(ALICE), "tasks/result", json!({"taskId": alices})).await;
    assert_eq!(
        result.body["result"]["content"][0]["text"], "report on tides",
        "{}",
        result.text
    );
    let cancel = legacy(&url, Some(ALICE), "tasks/cancel", json!({"taskId": alices})).await;
    assert_eq!(
        cancel.body["result"]["status"], "cancelled",
        "{}",
        cancel.text
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_result_gets_the_output_checks_of_its_tool() {
    let (_upstream, gateway) = setup("[sanitize]\nsecrets = \"block\"\n").await;
    let url = gateway.url("t");

    // The CreateTaskResult itself is sanitized: no escape sequence in its status message.
    let r = legacy(
        &url,
        Some(ALICE),
        "tools/call",
        json!({"name": "research", "arguments": {"topic": "leak"}, "task": {}}),
    )
    .await;
    assert!(
        !r.text.contains('\u{1b}') && !r.text.contains("\\u001b"),
        "{}",
        r.text
    );
    let leak = r.body["result"]["task"]["taskId"]
        .as_str()
        .expect("a task")
        .to_owned();

    // tasks/get: the status message is sanitized.
    let got = legacy(&url, Some(ALICE), "tasks/get", json!({"taskId": leak})).await;
    assert_eq!(got.body["result"]["status"], "completed", "{}", got.text);
    assert!(!got.text.contains("\\u001b"), "{}", got.text);

    // tasks/result: a secret in the result with secrets = block is withheld, as for tools/call.
    let result = legacy(&url, Some(ALICE), "tasks/result", json!({"taskId": leak})).await;
    assert_eq!(result.status, 200, "{}", result.text);
    assert_eq!(result.body["result"]["isError"], true, "{}", result.text);
    assert_eq!(
        result.body["result"]["_meta"]["portcullis/error"]["code"], "output_withheld",
        "{}",
        result.text
    );
    no_canary(&result.text);
    // The stream's status notification is relayed sanitized; another task's is not relayed.
    assert!(
        result.text.contains("notifications/tasks/status"),
        "{}",
        result.text
    );
    assert!(!result.text.contains("\\u001b"), "{}", result.text);
    assert!(!result.text.contains("foreign-task"), "{}", result.text);

    // The outputSchema of the task's tool holds for its result.
    let count = create_legacy(&url, ALICE, "count", "").await;
    let result = legacy(&url, Some(ALICE), "tasks/result", json!({"taskId": count})).await;
    assert_eq!(
        result.body["result"]["_meta"]["portcullis/error"]["code"], "output_schema_violation",
        "{}",
        result.text
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modern_tasks_are_bound_and_their_completed_results_checked() {
    let (upstream, gateway) = setup("[sanitize]\nsecrets = \"block\"\n").await;
    let url = gateway.url("t");
    let r = modern(
        &url,
        ALICE,
        "tools/call",
        "research",
        json!({"name": "research", "arguments": {"topic": "leak"}}),
    )
    .await;
    assert_eq!(r.body["result"]["resultType"], "task", "{}", r.text);
    let id = r.body["result"]["taskId"]
        .as_str()
        .expect("a task")
        .to_owned();

    // Bob gets an unknown task for tasks/get, tasks/update and tasks/cancel; the upstream sees none.
    for method in ["tasks/get", "tasks/update", "tasks/cancel"] {
        let before = upstream.count(method);
        let params = json!({"taskId": id, "inputResponses": {}});
        let stolen = modern(&url, BOB, method, &id, params).await;
        let unknown = modern(
            &url,
            BOB,
            method,
            "nope",
            json!({"taskId": "nope", "inputResponses": {}}),
        )
        .await;
        assert_eq!(
            stolen.body["error"]["code"], -32602,
            "{method}: {}",
            stolen.text
        );
        assert_eq!(stolen.body, unknown.body, "{method}");
        assert_eq!(
            upstream.count(method),
            before,
            "{method} reached the upstream"
        );
    }

    // Alice's completed task: its result is checked like the tool's result (secret → withheld).
    let got = modern(&url, ALICE, "tasks/get", &id, json!({"taskId": id})).await;
    assert_eq!(got.body["result"]["status"], "completed", "{}", got.text);
    assert_eq!(
        got.body["result"]["result"]["isError"], true,
        "{}",
        got.text
    );
    assert_eq!(
        got.body["result"]["result"]["_meta"]["portcullis/error"]["code"], "output_withheld",
        "{}",
        got.text
    );
    no_canary(&got.text);
    assert!(!got.text.contains("\\u001b"), "{}", got.text);
    // A task created in one era is not reachable in the other.
    let legacy_get = legacy(&url, Some(ALICE), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(
        legacy_get.body["error"]["code"], -32602,
        "{}",
        legacy_get.text
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_tasks_bind_to_the_anonymous_identity_only_when_it_is_configured() {
    let rule = "[[rules]]\nclients = [\"anonymous\"]\nservers = [\"*\"]\ntools = [\"*\"]\naction = \"allow\"\n";
    let (_upstream, gateway) = setup(&format!("[clients.anonymous]\n{rule}")).await;
    let url = gateway.url("t");
    let r = legacy(
        &url,
        None,
        "tools/call",
        json!({"name": "research", "arguments": {"topic": "open"}, "task": {}}),
    )
    .await;
    let id = r.body["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {}", r.text))
        .to_owned();
    let own = legacy(&url, None, "tasks/result", json!({"taskId": id})).await;
    assert_eq!(
        own.body["result"]["content"][0]["text"], "report on open",
        "{}",
        own.text
    );
    // A named client does not reach the anonymous identity's task.
    let alice = legacy(&url, Some(ALICE), "tasks/result", json!({"taskId": id})).await;
    assert_eq!(alice.body["error"]["code"], -32602, "{}", alice.text);
    gateway.stop().await;
}

/// A 2025-11-25 request by `key` in `session`.
async fn in_session(url: &str, key: &str, session: &str, method: &str, params: Value) -> Raw {
    let auth = format!("Bearer {key}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
        ("mcp-session-id", session),
    ];
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": method, "params": params});
    raw_post(url, &headers, body.to_string()).await
}

/// Opens a session for `key`: initialize, then notifications/initialized.
async fn open_session(url: &str, key: &str) -> String {
    let auth = format!("Bearer {key}");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "tasks-test", "version": "1"}}});
    let r = raw_post(url, &[("authorization", auth.as_str())], init.to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let session = r.headers["mcp-session-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
        ("mcp-session-id", session.as_str()),
    ];
    let r = raw_post(url, &headers, note.to_string()).await;
    assert!(r.status < 300, "{}", r.text);
    session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_sdk_servers_task_serves_its_creator_and_no_one_else() {
    if !tiers::ready(&[Tier::Node]) {
        return;
    }
    // server-everything (TypeScript SDK v1 experimental tasks): `simulate-research-query`
    // runs as a task through four one-second stages.
    let server = PeerServer::start(Peer::Everything).await;
    let gateway = TestGateway::start(
        &[("everything", &server.url)],
        &format!("{}{}", clients(), allow_all()),
    )
    .await;
    let url = gateway.url("everything");
    let alice = open_session(&url, ALICE).await;
    let bob = open_session(&url, BOB).await;
    let r = in_session(
        &url,
        ALICE,
        &alice,
        "tools/call",
        json!({"name": "simulate-research-query", "arguments": {"topic": "tides"}, "task": {"ttl": 60000}}),
    )
    .await;
    let id = r.body["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a CreateTaskResult: {}", r.text))
        .to_owned();

    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let stolen = in_session(&url, BOB, &bob, method, json!({"taskId": id})).await;
        let unknown = in_session(&url, BOB, &bob, method, json!({"taskId": "made-up"})).await;
        assert_eq!(
            stolen.body["error"]["code"], -32602,
            "{method}: {}",
            stolen.text
        );
        assert_eq!(stolen.body, unknown.body, "{method}");
    }
    let bobs = in_session(&url, BOB, &bob, "tasks/list", json!({})).await;
    assert_eq!(bobs.body["result"]["tasks"], json!([]), "{}", bobs.text);
    let alices = in_session(&url, ALICE, &alice, "tasks/list", json!({})).await;
    let listed = alices.body["result"]["tasks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        listed.iter().any(|t| t["taskId"] == id.as_str()),
        "{}",
        alices.text
    );

    // Alice polls her task to completion (bounded), then reads its result.
    let mut status = String::new();
    for _ in 0..120 {
        let got = in_session(&url, ALICE, &alice, "tasks/get", json!({"taskId": id})).await;
        status = got.body["result"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if status == "completed" || status == "failed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert_eq!(status, "completed");
    let result = in_session(&url, ALICE, &alice, "tasks/result", json!({"taskId": id})).await;
    let text = result.body["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("Research Report: tides"), "{}", result.text);
    gateway.stop().await;
    server.stop().await;
}
