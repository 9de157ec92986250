//! Flow rules against a client that tries to shed its labels or reach
//! another's: the 2026 conversation key (cut, empty, of another type, named
//! by another client, fresh), the merged view's prefixed tool names against
//! labels written per server, and tools run as tasks.
//!
//! Through the Python test server (`echo` private, `leaky_text` untrusted,
//! `book_flight` egress), raw 2026 requests naming their conversation, and
//! the official Python SDK client on the merged view in both eras.

use crate::flow::{DENY, config, egress, private, ran, untrusted};
use crate::support;
use support::tasks::TasksUpstream;
use support::tiers::{self, Tier};
use support::{ALICE, BOB, Mode, Peer, PeerServer, Sdk, TestGateway, call, gateway_code, sdk};

use serde_json::{Value, json};

/// A raw 2026 `tools/call` as `key`, with `conversation` (any JSON value)
/// as its conversation key when given: the gateway's refusal code, `None`
/// when the tool ran.
async fn send(
    url: &str,
    key: &str,
    conversation: Option<Value>,
    name: &str,
    args: Value,
) -> Option<String> {
    let result = send_as(url, key, conversation, false, name, args).await;
    result["_meta"]["portcullis/error"]["code"]
        .as_str()
        .map(str::to_owned)
}

/// [`send`], declaring the tasks extension when `tasks` (a server that
/// offers it then runs the call as a task): the JSON-RPC result.
async fn send_as(
    url: &str,
    key: &str,
    conversation: Option<Value>,
    tasks: bool,
    name: &str,
    args: Value,
) -> Value {
    let mut meta = support::modern_meta();
    if tasks {
        meta["io.modelcontextprotocol/clientCapabilities"] =
            json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    }
    if let Some(c) = conversation {
        meta["io.portcullis/conversation"] = c;
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": name, "arguments": args, "_meta": meta}});
    let headers = support::modern_call_headers(key, name);
    support::raw_post(url, &support::borrow(&headers), body.to_string())
        .await
        .result()
}

fn booking() -> Value {
    json!({"origin": "CDG", "destination": "JFK", "date": "2026-12-24", "passengers": 1})
}

/// What the design allows a client to do with its conversation key: start a
/// fresh conversation (with no labels), and nothing else. Leaving the key
/// out, or sending one that is empty or not a string, lands in the client's
/// own scope, which holds every label of its conversations; a key is cut at
/// 128 bytes on a character boundary, so a longer spelling is the same
/// conversation; another client naming the same conversation holds nothing
/// of this one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_key_neither_sheds_a_label_nor_reaches_another_clients() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = TestGateway::start_raw(&config(&upstream.url, Some(DENY))).await;
    let url = gw.url("py");
    // 200 bytes of two-byte characters: kept as its first 64 characters.
    let long = "é".repeat(100);
    let read = [
        ("echo", json!({"text": "the quarterly numbers"})),
        ("leaky_text", json!({})),
    ];
    for (name, args) in read {
        assert_eq!(
            send(&url, ALICE, Some(json!(long)), name, args).await,
            None,
            "{name}"
        );
    }
    let denied = Some("flow_denied");
    let cases: [(&str, &str, Option<Value>, Option<&str>); 8] = [
        (
            "the same conversation, its key cut at 128 bytes",
            ALICE,
            Some(json!("é".repeat(64))),
            denied,
        ),
        ("no key: the client's own scope", ALICE, None, denied),
        ("an empty key is no key", ALICE, Some(json!("")), denied),
        ("a number is no key", ALICE, Some(json!(7)), denied),
        (
            "an object is no key",
            ALICE,
            Some(json!({"conversation": "fresh"})),
            denied,
        ),
        (
            "a key of 63 of the characters is another conversation",
            ALICE,
            Some(json!("é".repeat(63))),
            None,
        ),
        (
            "another client naming the same conversation",
            BOB,
            Some(json!(long)),
            None,
        ),
        ("a fresh conversation", ALICE, Some(json!("fresh")), None),
    ];
    for (case, client, conversation, expected) in cases {
        let got = send(&url, client, conversation, "book_flight", booking()).await;
        assert_eq!(got.as_deref(), expected, "{case}");
    }
    let booked = upstream
        .ran()
        .iter()
        .filter(|t| *t == "book_flight")
        .count();
    assert_eq!(
        booked, 3,
        "only the three calls outside alice's labelled scopes ran"
    );
    gw.stop().await;
}

/// The merged view names a tool `SERVER__tool`; labels are written per
/// server with the tool's own name. A session of the merged view that read
/// `py__echo` and `py__leaky_text` is refused `py__book_flight`, while
/// `py2__book_flight` (the same upstream tool behind a server with no
/// labels) runs: the label follows the server and the tool, not the name
/// the client used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_merged_views_prefixed_names_carry_the_labels_of_their_server() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let config = config(&upstream.url, Some(DENY))
        .replace(
            "[servers.py.labels]",
            &format!(
                "[servers.py2]\nurl = \"{}\"\ntimeout = \"20s\"\n[servers.py.labels]",
                upstream.url
            ),
        )
        .replace("servers = [\"py\"]", "servers = [\"py\", \"py2\"]");
    let gw = TestGateway::start_raw(&config).await;
    let merged = gw.merged_url();
    let book = egress()["args"].clone();
    for (mode, client) in [(Mode::Legacy, ALICE), (Mode::Modern, BOB)] {
        let ops = json!([
            call("py__echo", private()["args"].clone()),
            call("py__leaky_text", untrusted()["args"].clone()),
            call("py2__book_flight", book.clone()),
            call("py__book_flight", book.clone()),
        ]);
        let out = sdk(Sdk::Python, mode, &merged, client, ops).await;
        ran(&out[0], "the private read");
        ran(&out[1], "the untrusted read");
        ran(&out[2], "the unlabelled server's tool");
        assert_eq!(
            gateway_code(&out[3]),
            Some("flow_denied"),
            "{mode:?}: {}",
            out[3]
        );
        let text = out[3]["text"].as_str().unwrap_or_default();
        assert!(text.contains("private (echo on py)"), "{text}");
    }
    let booked = upstream
        .ran()
        .iter()
        .filter(|t| *t == "book_flight")
        .count();
    assert_eq!(booked, 2, "only the unlabelled server's calls ran");
    gw.stop().await;
}

/// A source tool run as a task brings its content into the conversation
/// later (through `tasks/get` or `tasks/result`), so its label is set when
/// the task is created: the client's later egress call is refused. A sink
/// run as a task meets the flow rule before any task is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_run_as_a_task_sets_its_label_and_a_sink_run_as_one_is_held() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let tasks = TasksUpstream::start().await;
    let py = PeerServer::start(Peer::Python).await;
    let labels = format!(
        "[servers.t]\nurl = \"{}\"\n[servers.t.labels]\n\"research\" = {{ source = \"untrusted\" }}\n\
         \"count\" = {{ sink = \"egress\" }}\n[servers.py.labels]",
        tasks.url
    );
    let config = config(&py.url, Some(DENY))
        .replace("[servers.py.labels]", &labels)
        .replace("servers = [\"py\"]", "servers = [\"py\", \"t\"]")
        .replace(
            "tools = [\"echo\", \"leaky_text\", \"book_flight\"]",
            "tools = [\"echo\", \"research\", \"count\", \"book_flight\"]",
        );
    let gw = TestGateway::start_raw(&config).await;
    let (py_url, t_url) = (gw.url("py"), gw.url("t"));
    let read = json!({"text": "the quarterly numbers"});
    assert_eq!(send(&py_url, BOB, None, "echo", read).await, None);
    let topic = json!({"topic": "weather"});
    let created = send_as(&t_url, BOB, None, true, "research", topic).await;
    assert_eq!(
        created["resultType"], "task",
        "research runs as a task: {created}"
    );
    assert_eq!(tasks.count("tools/call"), 1);
    let refused = send(&py_url, BOB, None, "book_flight", booking()).await;
    assert_eq!(
        refused.as_deref(),
        Some("flow_denied"),
        "labelled when the task was created"
    );
    let refused = send_as(&t_url, BOB, None, true, "count", json!({})).await;
    let code = &refused["_meta"]["portcullis/error"]["code"];
    assert_eq!(code, "flow_denied", "a sink run as a task: {refused}");
    assert_eq!(
        tasks.count("tools/call"),
        1,
        "no task was created for the sink"
    );
    assert!(!py.ran().iter().any(|t| t == "book_flight"));
    gw.stop().await;
}
