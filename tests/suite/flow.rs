//! Flow rules across the calls of a session (the lethal trifecta): a session
//! that read a `private` tool and then an `untrusted` one is refused its call
//! to an `egress` tool, while another session of the same client, and a
//! session holding only one of the labels, are not; labels outlive a reload,
//! and a reload that removes the flow rule releases the hold.
//!
//! Through the official Python SDK client in both eras against the Python
//! test server (`echo` labelled private, `leaky_text` untrusted,
//! `book_flight` egress), and raw 2026 requests naming their conversation.

use crate::support;
use support::tiers::{self, Tier};
use support::{ALICE, BOB, Mode, Peer, PeerServer, Sdk, TestGateway, call, gateway_code, sdk};

use portcullis::Gateway;
use serde_json::{Value, json};

pub(crate) const ADMIN_TOKEN: &str = "flow-admin-token";

/// The trifecta: `echo` private, `leaky_text` untrusted, `book_flight`
/// egress, and a rule letting everyone call them that denies the egress call
/// once a session holds both labels (`flow` absent: no flow rule).
pub(crate) fn config(upstream: &str, flow: Option<&str>) -> String {
    let token = hex::encode(portcullis::auth::hash_key(ADMIN_TOKEN));
    let flow = flow.map(|f| format!("flow = {f}\n")).unwrap_or_default();
    format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_sha256 = \"{token}\"\n\
         [servers.py]\nurl = \"{upstream}\"\ntimeout = \"20s\"\n\
         [servers.py.labels]\n\
         \"echo\" = {{ source = \"private\" }}\n\
         \"leaky_text\" = {{ source = \"untrusted\" }}\n\
         \"book_flight\" = {{ sink = \"egress\" }}\n\
         {}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"py\"]\ntools = [\"echo\", \"leaky_text\", \"book_flight\"]\n\
         action = \"allow\"\n{flow}\
         [pins]\ndatabase = \":memory:\"\n[audit]\ndatabase = \":memory:\"\n",
        support::clients()
    )
}

pub(crate) const DENY: &str = "{ holds = [\"private\", \"untrusted\"], then = \"deny\" }";

pub(crate) fn private() -> Value {
    call("echo", json!({"text": "the quarterly numbers"}))
}

pub(crate) fn untrusted() -> Value {
    call("leaky_text", json!({}))
}

pub(crate) fn egress() -> Value {
    call(
        "book_flight",
        json!({"origin": "CDG", "destination": "JFK", "date": "2026-12-24", "passengers": 1}),
    )
}

/// Asserts the call ran (no gateway refusal, not an error).
pub(crate) fn ran(result: &Value, what: &str) {
    assert_eq!(gateway_code(result), None, "{what}: {result}");
    assert_eq!(result["isError"], false, "{what}: {result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_read_private_then_untrusted_cannot_send_out_in_both_eras() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = TestGateway::start_raw(&config(&upstream.url, Some(DENY))).await;
    let url = gw.url("py");

    // 2025: one SDK client is one session.
    let out = sdk(
        Sdk::Python,
        Mode::Legacy,
        &url,
        ALICE,
        json!([private(), untrusted(), egress()]),
    )
    .await;
    ran(&out[0], "the private read");
    ran(&out[1], "the untrusted read");
    assert_eq!(gateway_code(&out[2]), Some("flow_denied"), "{}", out[2]);
    assert_eq!(out[2]["isError"], true);
    let text = out[2]["text"].as_str().unwrap_or_default();
    assert!(text.contains("private (echo on py)"), "{text}");
    assert!(text.contains("untrusted (leaky_text on py)"), "{text}");
    assert!(text.contains("new session"), "{text}");
    let detail = &out[2]["meta"]["portcullis/error"];
    assert_eq!(detail["rule"], "rules[0]", "{detail}");
    assert_eq!(detail["holds"][0]["tool"], "echo", "{detail}");
    assert_eq!(detail["holds"][1]["tool"], "leaky_text", "{detail}");
    assert!(
        !upstream.ran().iter().any(|t| t == "book_flight"),
        "the refused call never reached the server"
    );

    // Another session of the same client holds nothing.
    let other = sdk(Sdk::Python, Mode::Legacy, &url, ALICE, json!([egress()])).await;
    ran(&other[0], "another session's egress call");

    // One label alone does not make the trifecta, in either order of reading.
    for first in [private(), untrusted()] {
        let out = sdk(
            Sdk::Python,
            Mode::Legacy,
            &url,
            ALICE,
            json!([first, egress()]),
        )
        .await;
        ran(&out[0], "the read");
        ran(&out[1], "the egress call after one label");
    }

    // 2026: no sessions; without a conversation key the client is the scope.
    let out = sdk(
        Sdk::Python,
        Mode::Modern,
        &url,
        BOB,
        json!([private(), egress(), untrusted(), egress()]),
    )
    .await;
    ran(&out[1], "egress after private alone");
    assert_eq!(gateway_code(&out[3]), Some("flow_denied"), "{}", out[3]);
    gw.stop().await;
}

/// A raw 2026 `tools/call` in conversation `conversation`.
async fn in_conversation(url: &str, conversation: &str, name: &str, args: Value) -> Option<String> {
    let mut meta = support::modern_meta();
    meta["io.portcullis/conversation"] = conversation.into();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": name, "arguments": args, "_meta": meta}});
    let headers = support::modern_call_headers(ALICE, name);
    support::raw_post(url, &support::borrow(&headers), body.to_string())
        .await
        .refusal()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_survive_a_reload_and_removing_the_flow_rule_releases_them() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    support::init();
    let upstream = PeerServer::start(Peer::Python).await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("portcullis.toml");
    std::fs::write(&path, config(&upstream.url, Some(DENY))).expect("write");
    let gw = TestGateway::from_handle(Gateway::start_file(&path).await.expect("gateway starts"));
    let url = gw.url("py");
    let book =
        json!({"origin": "CDG", "destination": "JFK", "date": "2026-12-24", "passengers": 1});

    assert_eq!(
        in_conversation(&url, "c1", "echo", json!({"text": "secret plans"})).await,
        None
    );
    assert_eq!(
        in_conversation(&url, "c1", "leaky_text", json!({})).await,
        None
    );
    let refused = in_conversation(&url, "c1", "book_flight", book.clone()).await;
    assert_eq!(refused.as_deref(), Some("flow_denied"));
    // Another conversation of the same client is unaffected.
    assert_eq!(
        in_conversation(&url, "c2", "book_flight", book.clone()).await,
        None
    );

    // The audit trail says which labels were set and which held the call back.
    let lines = |events: &[Value], decision: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["decision"] == decision)
            .flat_map(|e| e["violations"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let mut recorded = Vec::new();
    for _ in 0..200 {
        recorded = gw.admin(ADMIN_TOKEN).events().await;
        if !lines(&recorded, "flow_denied").is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let denied = lines(&recorded, "flow_denied");
    assert!(
        denied.contains(&"flow: holds private (echo on py)".to_owned()),
        "{denied:?}"
    );
    assert!(
        denied.contains(&"flow: holds untrusted (leaky_text on py)".to_owned()),
        "{denied:?}"
    );
    // The dashboard's trace page of the refused call (`/api/events/ID`) shows the same lines.
    let refused_event = recorded
        .iter()
        .find(|e| e["decision"] == "flow_denied")
        .expect("the refused call's event");
    let id = refused_event["id"].as_u64().expect("an id");
    let (status, trace) = gw
        .admin(ADMIN_TOKEN)
        .get(&format!("/api/events/{id}"))
        .await;
    assert_eq!(status, 200, "{trace}");
    let shown: Vec<&str> = trace["violations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        shown.contains(&"flow: holds private (echo on py)"),
        "{trace}"
    );
    assert!(
        shown.contains(&"flow: holds untrusted (leaky_text on py)"),
        "{trace}"
    );
    let forwarded = lines(&recorded, "forwarded");
    assert!(
        forwarded.contains(&"flow: sets private".to_owned()),
        "{forwarded:?}"
    );
    assert!(
        forwarded.contains(&"flow: sets untrusted".to_owned()),
        "{forwarded:?}"
    );

    // The same configuration again: the conversation still holds its labels.
    gw.admin(ADMIN_TOKEN).reloaded().await;
    let refused = in_conversation(&url, "c1", "book_flight", book.clone()).await;
    assert_eq!(
        refused.as_deref(),
        Some("flow_denied"),
        "labels survive a reload"
    );

    // Without the flow rule, nothing holds the call back.
    std::fs::write(&path, config(&upstream.url, None)).expect("write");
    gw.admin(ADMIN_TOKEN).reloaded().await;
    assert_eq!(
        in_conversation(&url, "c1", "book_flight", book.clone()).await,
        None
    );

    // The labels were kept: the rule back, the hold is back.
    std::fs::write(&path, config(&upstream.url, Some(DENY))).expect("write");
    gw.admin(ADMIN_TOKEN).reloaded().await;
    let refused = in_conversation(&url, "c1", "book_flight", book).await;
    assert_eq!(refused.as_deref(), Some("flow_denied"));
    gw.stop().await;
}

/// The operator moves the `private` label from `echo` to another tool and
/// reloads: what `echo`'s calls set no longer holds the conversation's
/// egress call back,
/// and putting the label back holds it again (the gateway kept the mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_takes_a_source_label_off_a_tool_releases_what_it_set() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    support::init();
    let upstream = PeerServer::start(Peer::Python).await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("portcullis.toml");
    let labelled = config(&upstream.url, Some(DENY));
    std::fs::write(&path, &labelled).expect("write");
    let gw = TestGateway::from_handle(Gateway::start_file(&path).await.expect("gateway starts"));
    let url = gw.url("py");
    let book =
        json!({"origin": "CDG", "destination": "JFK", "date": "2026-12-24", "passengers": 1});
    let read = json!({"text": "secret plans"});
    assert_eq!(in_conversation(&url, "c1", "echo", read).await, None);
    assert_eq!(
        in_conversation(&url, "c1", "leaky_text", json!({})).await,
        None
    );
    let refused = in_conversation(&url, "c1", "book_flight", book.clone()).await;
    assert_eq!(refused.as_deref(), Some("flow_denied"));

    // `private` now marks another tool (a flow rule naming a label no tool
    // sets could never act, and is refused).
    let unlabelled = labelled.replace("\"echo\" = {", "\"progress\" = {");
    assert_ne!(unlabelled, labelled);
    std::fs::write(&path, &unlabelled).expect("write");
    gw.admin(ADMIN_TOKEN).reloaded().await;
    let after = in_conversation(&url, "c1", "book_flight", book.clone()).await;
    assert_eq!(
        after, None,
        "echo is no longer private: nothing holds the call"
    );

    std::fs::write(&path, &labelled).expect("write");
    gw.admin(ADMIN_TOKEN).reloaded().await;
    let again = in_conversation(&url, "c1", "book_flight", book).await;
    assert_eq!(again.as_deref(), Some("flow_denied"), "the label is back");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_rule_asks_for_approval_only_once_the_session_holds_its_labels() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let flow = "{ holds = [\"private\", \"untrusted\"], then = \"approval\" }\napproval = { by = \"user\" }";
    let gw = TestGateway::start_raw(&config(&upstream.url, Some(flow))).await;
    let url = gw.url("py");
    // The user is asked only for the call after the trifecta (this client
    // declines whatever it is asked); the call before it simply runs.
    let ops = json!([private(), egress(), untrusted(), egress()]);
    let out = sdk(Sdk::Python, Mode::Legacy, &url, ALICE, ops).await;
    ran(&out[1], "egress before the session holds both labels");
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

/// A source tool whose call fails still brings its words into the session:
/// the failure the client receives quotes the server's own text (FastMCP's
/// `explode` passes its exception on; labelled untrusted here), so its label
/// is set like a result's, and the trifecta holds the egress call (`hang`,
/// labelled egress) back in both eras.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_source_whose_words_reach_the_client_still_sets_its_label() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::FastMcp).await;
    let config = config(&upstream.url, Some(DENY))
        .replace("\"leaky_text\" = {", "\"explode\" = {")
        .replace("\"book_flight\" = {", "\"hang\" = {")
        .replace("\"leaky_text\", \"book_flight\"]", "\"explode\", \"hang\"]");
    let gw = TestGateway::start_raw(&config).await;
    let url = gw.url("py");
    let failing = call("explode", json!({}));
    let egress = call("hang", json!({"seconds": 0}));
    for (era, client) in [(Mode::Legacy, ALICE), (Mode::Modern, BOB)] {
        let ops = json!([private(), failing.clone(), egress.clone()]);
        let out = sdk(Sdk::Python, era, &url, client, ops).await;
        ran(&out[0], "the private read");
        assert_eq!(out[1]["isError"], true, "{}", out[1]);
        let said = out[1]["text"].as_str().unwrap_or_default();
        assert!(
            said.contains("cannot connect"),
            "the server's words reach the client: {said}"
        );
        assert_eq!(
            gateway_code(&out[2]),
            Some("flow_denied"),
            "{era:?}: {}",
            out[2]
        );
        let text = out[2]["text"].as_str().unwrap_or_default();
        assert!(text.contains("untrusted (explode on py)"), "{text}");
    }
    assert!(
        !upstream.ran().iter().any(|t| t == "hang"),
        "the refused calls never reached the server"
    );
    gw.stop().await;
}

/// A rule's condition may read the session's labels (`labels`): the tool
/// stays listed (its calls decide), a session that has read untrusted
/// content is refused the call the condition guards, naming the rule, and
/// another session of the same client is not; in both eras.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_over_the_sessions_labels_decides_its_calls_in_both_eras() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let when = "when = \"tool != 'book_flight' || !('untrusted' in labels)\"\n";
    let text = config(&upstream.url, None).replacen(
        "action = \"allow\"\n",
        &format!("action = \"allow\"\n{when}"),
        1,
    );
    assert!(text.contains("in labels"), "{text}");
    let gw = TestGateway::start_raw(&text).await;
    let url = gw.url("py");
    for (mode, client) in [(Mode::Legacy, ALICE), (Mode::Modern, BOB)] {
        let out = sdk(
            Sdk::Python,
            mode,
            &url,
            client,
            json!([support::list(), egress(), untrusted(), egress()]),
        )
        .await;
        let listed = out[0]["tools"].as_array().cloned().unwrap_or_default();
        assert!(
            listed.iter().any(|t| t == "book_flight"),
            "{mode:?}: listed, decided at the call: {}",
            out[0]
        );
        ran(&out[1], "the egress call before any label");
        ran(&out[2], "the untrusted read");
        assert_eq!(
            gateway_code(&out[3]),
            Some("call_not_permitted"),
            "{mode:?}: {}",
            out[3]
        );
        let text = out[3]["text"].as_str().unwrap_or_default();
        assert!(text.contains("labels"), "{text}");
    }
    // Another 2025 session of the same client holds nothing.
    let other = sdk(Sdk::Python, Mode::Legacy, &url, ALICE, json!([egress()])).await;
    ran(&other[0], "another session's egress call");
    let booked = upstream
        .ran()
        .iter()
        .filter(|t| *t == "book_flight")
        .count();
    assert_eq!(booked, 3, "the refused calls never reached the server");
    gw.stop().await;
    upstream.stop().await;
}
