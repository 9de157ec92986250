//! Where flow labels come from besides the tools an operator names: a
//! server's tool annotations where the operator trusts them
//! (`labels_from_annotations`), resources (`resource_labels`) and prompts
//! (`prompt_labels`). The trifecta is made of a `private` resource read,
//! then a tool whose trusted `openWorldHint` makes it `untrusted`, then a
//! tool the same hint makes an `egress` sink; without the trust the same
//! annotations set nothing; an operator's entry wins over the annotations.
//!
//! With the fleet's store, such labels cross replicas through a real
//! `redis-server`, and a labelled read is refused (not forwarded) while
//! Redis is away.
//!
//! Through the official Python SDK client in both eras against the Python
//! test server (`leaky_text` and `book_flight` are annotated
//! `openWorldHint: true`; `file:///secret/…` reads "SECRET KEY MATERIAL";
//! with `--fixtures`, the prompt `test_simple_prompt` and the resource
//! `test://static-text`).

use crate::flow::{ADMIN_TOKEN, egress, ran, untrusted};
use crate::support;
use support::fleet::{refusal_code, replicas_of};
use support::process::Observed;
use support::redis::RedisServer;
use support::tiers::{self, Tier};
use support::{ALICE, BOB, Mode, Peer, PeerServer, Sdk, TestGateway, gateway_code, sdk};

use serde_json::{Value, json};

const DENY: &str = "{ holds = [\"private\", \"untrusted\"], then = \"deny\" }";

/// The py server with `server` (extra keys and tables of `[servers.py]`), a
/// rule letting everyone call the three tools, read every resource and get
/// every prompt, whose flow is the trifecta's deny.
fn config(upstream: &str, server: &str) -> String {
    let token = hex::encode(portcullis::auth::hash_key(ADMIN_TOKEN));
    format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_sha256 = \"{token}\"\n\
         [servers.py]\nurl = \"{upstream}\"\ntimeout = \"20s\"\n{server}\n\
         {}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"py\"]\ntools = [\"echo\", \"leaky_text\", \"book_flight\"]\n\
         resources = [\"*\"]\nprompts = [\"*\"]\naction = \"allow\"\nflow = {DENY}\n\
         [pins]\ndatabase = \":memory:\"\n[audit]\ndatabase = \":memory:\"\n",
        support::clients()
    )
}

const SECRET: &str =
    "[servers.py.resource_labels]\n\"file:///secret/*\" = { source = \"private\" }\n";

fn read(uri: &str) -> Value {
    json!({"op": "read", "uri": uri})
}

/// Asserts the read reached the client.
fn read_ok(result: &Value, what: &str) {
    assert!(result["error"].is_null(), "{what}: {result}");
    assert!(result["texts"].is_array(), "{what}: {result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_resource_and_trusted_annotations_make_the_trifecta_in_both_eras() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let server = format!("labels_from_annotations = true\n{SECRET}");
    let gw = TestGateway::start_raw(&config(&upstream.url, &server)).await;
    let url = gw.url("py");

    for (mode, client) in [(Mode::Legacy, ALICE), (Mode::Modern, BOB)] {
        let steps = json!([read("file:///secret/key"), untrusted(), egress()]);
        let out = sdk(Sdk::Python, mode, &url, client, steps).await;
        read_ok(&out[0], "the private read");
        // `leaky_text` is a sink too (not read-only), but the session held only `private`.
        ran(&out[1], "the untrusted call");
        assert_eq!(
            gateway_code(&out[2]),
            Some("flow_denied"),
            "{mode:?}: {}",
            out[2]
        );
        let text = out[2]["text"].as_str().unwrap_or_default();
        assert!(
            text.contains("private (resource file:///secret/key on py)"),
            "{text}"
        );
        assert!(text.contains("untrusted (leaky_text on py)"), "{text}");
        let detail = &out[2]["meta"]["portcullis/error"];
        assert_eq!(
            detail["holds"][0]["resource"], "file:///secret/key",
            "{detail}"
        );
        assert_eq!(detail["holds"][1]["tool"], "leaky_text", "{detail}");
    }
    assert!(
        !upstream.ran().iter().any(|t| t == "book_flight"),
        "no refused call reached the server"
    );

    // A resource no pattern labels sets nothing; neither does a session that
    // read only one of the two.
    let cases = [
        json!([read("file:///public/readme"), untrusted(), egress()]),
        json!([read("file:///secret/key"), egress()]),
        json!([untrusted(), egress()]),
    ];
    for steps in cases {
        let out = sdk(Sdk::Python, Mode::Legacy, &url, ALICE, steps.clone()).await;
        let last = out.last().cloned().unwrap_or_default();
        ran(&last, &format!("the egress call after {steps}"));
    }
    gw.stop().await;
}

/// What each configuration makes of the same session (private resource,
/// `leaky_text`, `book_flight`): refused only where both labels are set and
/// `book_flight` is a sink.
struct Case {
    name: &'static str,
    server: &'static str,
    refused: bool,
}

const CASES: &[Case] = &[
    Case {
        name: "annotations not trusted: they set nothing, book_flight is no sink",
        // `echo` carries the labels the rule needs to load; it is never called.
        server: "[servers.py.labels]\n\"echo\" = { source = \"untrusted\" }\n\"book_flight\" = { sink = \"egress\" }\n",
        refused: false,
    },
    Case {
        name: "trusted, but the operator's entry for leaky_text keeps it unlabelled",
        server: "labels_from_annotations = true\n[servers.py.labels]\n\"leaky_text\" = {}\n",
        refused: false,
    },
    Case {
        name: "trusted, but the operator's entry for book_flight gives it no sink",
        server: "labels_from_annotations = true\n[servers.py.labels]\n\"book_flight\" = { source = \"untrusted\" }\n",
        refused: false,
    },
    Case {
        name: "not trusted, the operator labels leaky_text: its entry alone counts",
        server: "[servers.py.labels]\n\"leaky_text\" = { source = \"untrusted\" }\n\"book_flight\" = { sink = \"egress\" }\n",
        refused: true,
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotations_count_only_when_trusted_and_an_operators_entry_wins() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let mut failed = Vec::new();
    for case in CASES {
        let server = format!("{}{SECRET}", case.server);
        let gw = TestGateway::start_raw(&config(&upstream.url, &server)).await;
        let steps = json!([read("file:///secret/key"), untrusted(), egress()]);
        let out = sdk(Sdk::Python, Mode::Legacy, &gw.url("py"), ALICE, steps).await;
        let code = gateway_code(&out[2]);
        let refused = code == Some("flow_denied");
        if refused != case.refused || (!refused && out[2]["isError"] != false) {
            failed.push(format!("{}: {}", case.name, out[2]));
        }
        gw.stop().await;
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_labelled_prompt_and_resource_hold_an_egress_call_and_are_audited() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::PythonFixtures).await;
    let server = "[servers.py.labels]\n\"book_flight\" = { sink = \"egress\" }\n\
                  [servers.py.resource_labels]\n\"test://static-text\" = { source = \"private\" }\n\
                  [servers.py.prompt_labels]\n\"test_simple_*\" = { source = \"untrusted\" }\n";
    let gw = TestGateway::start_raw(&config(&upstream.url, server)).await;
    let url = gw.url("py");
    let prompt = json!({"op": "prompt", "name": "test_simple_prompt", "args": {}});
    let steps = json!([prompt, egress(), read("test://static-text"), egress()]);
    let out = sdk(Sdk::Python, Mode::Modern, &url, ALICE, steps).await;
    assert!(out[0]["texts"].is_array(), "the prompt: {}", out[0]);
    ran(&out[1], "egress after the prompt alone");
    read_ok(&out[2], "the private read");
    assert_eq!(gateway_code(&out[3]), Some("flow_denied"), "{}", out[3]);
    let text = out[3]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("untrusted (prompt test_simple_prompt on py)"),
        "{text}"
    );
    assert!(
        text.contains("private (resource test://static-text on py)"),
        "{text}"
    );
    let detail = &out[3]["meta"]["portcullis/error"];
    // In the order the rule names the labels.
    assert_eq!(
        detail["holds"][0]["resource"], "test://static-text",
        "{detail}"
    );
    assert_eq!(
        detail["holds"][1]["prompt"], "test_simple_prompt",
        "{detail}"
    );

    // The audit events of the read and the get say which label each set.
    let sets = |events: &[Value], method: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["method"] == method)
            .flat_map(|e| e["violations"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let mut events = Vec::new();
    for _ in 0..200 {
        events = gw.admin(ADMIN_TOKEN).events().await;
        if !sets(&events, "resources/read").is_empty() && !sets(&events, "prompts/get").is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(sets(&events, "resources/read"), ["flow: sets private"]);
    assert_eq!(sets(&events, "prompts/get"), ["flow: sets untrusted"]);
    gw.stop().await;
}

/// A raw 2026 request of `method` as alice in conversation `c1`, to
/// `replica`: a `tools/call` of `name` with `args`, or a `resources/read`
/// of the URI `name`.
async fn in_c1(replica: &Observed, method: &str, name: &str, args: Value) -> support::Raw {
    let mut meta = support::modern_meta();
    meta["io.portcullis/conversation"] = "c1".into();
    let params = match method {
        "tools/call" => json!({"name": name, "arguments": args, "_meta": meta}),
        _ => json!({"uri": name, "_meta": meta}),
    };
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let auth = format!("Bearer {ALICE}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", method),
        ("mcp-name", name),
    ];
    support::raw_post(&replica.url("py"), &headers, body.to_string()).await
}

/// With the fleet's store: a resource's label and an annotation's are
/// stored in Redis and read by another replica (the refusal names both);
/// with Redis stopped, a labelled read is refused naming the store and not
/// forwarded, while an unlabelled one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_label_and_an_annotation_label_cross_replicas_through_redis() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    let mut redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    let server = format!(
        "labels_from_annotations = true\n{SECRET}\
         [state]\nbackend = \"redis\"\nredis_url = \"{}\"\nnamespace = \"sources\"\n\
         [approvals]\nkey = \"flow-sources-key-of-at-least-32-bytes!\"\n",
        redis.url()
    );
    let fleet = replicas_of(2, &config(&upstream.url, &server)).await;
    let read = in_c1(
        &fleet[0],
        "resources/read",
        "file:///secret/key",
        Value::Null,
    )
    .await;
    assert_eq!(read.status, 200, "{}", read.text);
    assert!(read.body["result"]["contents"].is_array(), "{}", read.text);
    let fetched = in_c1(&fleet[1], "tools/call", "leaky_text", json!({})).await;
    assert_eq!(
        refusal_code(&fetched.body["result"]),
        "",
        "{}",
        fetched.text
    );
    let book =
        json!({"origin": "CDG", "destination": "JFK", "date": "2026-12-24", "passengers": 1});
    let refused = in_c1(&fleet[0], "tools/call", "book_flight", book).await;
    let result = &refused.body["result"];
    assert_eq!(refusal_code(result), "flow_denied", "{}", refused.text);
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("private (resource file:///secret/key on py)"),
        "{text}"
    );
    assert!(text.contains("untrusted (leaky_text on py)"), "{text}");

    redis.stop();
    let reads = |u: &PeerServer| u.ran().iter().filter(|t| *t == "read").count();
    let before = reads(&upstream);
    let refused = in_c1(
        &fleet[1],
        "resources/read",
        "file:///secret/other",
        Value::Null,
    )
    .await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert_eq!(
        refused.body["error"]["data"]["code"], "state_unavailable",
        "{}",
        refused.text
    );
    assert_eq!(
        refused.body["error"]["data"]["store"], "redis",
        "{}",
        refused.text
    );
    assert_eq!(
        reads(&upstream),
        before,
        "the labelled read was not forwarded"
    );
    let public = in_c1(
        &fleet[1],
        "resources/read",
        "file:///public/readme",
        Value::Null,
    )
    .await;
    assert_eq!(
        public.status, 200,
        "an unlabelled read goes on: {}",
        public.text
    );
    assert_eq!(reads(&upstream), before + 1);
}

/// Through the merged `/mcp` view, a prompt and a resource (routed on its
/// URI) set the labels of the server that served them, and the egress tool
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_merged_view_a_prompt_and_a_resource_set_their_servers_labels() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::PythonFixtures).await;
    let server = "[servers.py.labels]\n\"book_flight\" = { sink = \"egress\" }\n\
                  [servers.py.resource_labels]\n\"test://static-text\" = { source = \"private\" }\n\
                  [servers.py.prompt_labels]\n\"test_simple_prompt\" = { source = \"untrusted\" }\n";
    let gw = TestGateway::start_raw(&config(&upstream.url, server)).await;
    // One server: the merged view shows its names unprefixed.
    let prompt = json!({"op": "prompt", "name": "test_simple_prompt", "args": {}});
    let book = egress()["args"].clone();
    let steps = json!([
        {"op": "prompts"},
        prompt,
        read("test://static-text"),
        support::call("book_flight", book)
    ]);
    let out = sdk(Sdk::Python, Mode::Legacy, &gw.merged_url(), ALICE, steps).await;
    assert!(
        out[1]["texts"].is_array(),
        "the prompt: {} (listed: {})",
        out[1],
        out[0]
    );
    read_ok(&out[2], "the private read");
    assert_eq!(gateway_code(&out[3]), Some("flow_denied"), "{}", out[3]);
    let text = out[3]["text"].as_str().unwrap_or_default();
    assert!(text.contains("(prompt test_simple_prompt on py)"), "{text}");
    assert!(
        text.contains("(resource test://static-text on py)"),
        "{text}"
    );
    gw.stop().await;
}

/// `then = "approval"` over labels from a resource and from annotations:
/// the user is asked only for the annotated sink's call once the session
/// holds both (this client declines whatever it is asked), never before;
/// an open-world tool that is not read-only is both a source and a sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_by_its_annotations_is_put_to_the_user_once_the_session_holds_both_labels() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let server = format!("labels_from_annotations = true\n{SECRET}");
    let asks = "flow = { holds = [\"private\", \"untrusted\"], then = \"approval\" }\napproval = { by = \"user\" }";
    let text = config(&upstream.url, &server).replace(&format!("flow = {DENY}"), asks);
    let gw = TestGateway::start_raw(&text).await;
    // Each of the two annotated tools is a sink and sets `untrusted` too.
    let steps = json!([untrusted(), egress(), read("file:///secret/key"), egress()]);
    let out = sdk(Sdk::Python, Mode::Legacy, &gw.url("py"), ALICE, steps).await;
    ran(&out[0], "the untrusted call of a session holding nothing");
    ran(
        &out[1],
        "the egress call of a session holding only untrusted",
    );
    read_ok(&out[2], "the private read");
    assert_eq!(
        gateway_code(&out[3]),
        Some("approval_declined"),
        "{}",
        out[3]
    );
    let booked = upstream
        .ran()
        .iter()
        .filter(|t| *t == "book_flight")
        .count();
    assert_eq!(booked, 1, "only the call before the trifecta ran");
    gw.stop().await;
}
