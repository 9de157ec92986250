//! Approvals at their edges: the server's own input round survives the gateway's question; a
//! held call nobody decides expires unrun; a state from before a restart, an answer to no
//! open question, and a server request posing as an approval question are refused or
//! dropped; only a call that would be forwarded is put to a person.

use crate::approvals::{
    ADMIN_TOKEN, BY_USER, asked, echoes, gateway, modern_echo, post_echo, python, yes,
};
use crate::support;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::misbehaving::{Misbehaving, Scripted};
use support::{
    ALICE, BOB, Mode, Peer, PeerServer, TestGateway, call, clients, gateway_code, raw_post,
};

/// A tool whose server asks for input itself (2026 `input_required` of its
/// own): each forwarded round is approved, and the server's own
/// `requestState` and answers come back to it across the gateway's question.
#[tokio::test]
async fn the_servers_own_input_round_survives_the_gateways_question() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let token = hex::encode(portcullis::auth::hash_key(ADMIN_TOKEN));
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_sha256 = \"{token}\"\n\
         [servers.files]\nurl = \"{}\"\n{}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"files\"]\ntools = [\"leaky_ask\"]\naction = \"allow\"\n\
         approval = {{ by = \"user\" }}\n",
        upstream.url,
        clients()
    );
    let gw = TestGateway::start_raw(&text).await;
    let out = python(
        Mode::Modern,
        &gw.url("files"),
        ALICE,
        "approve",
        json!([call("leaky_ask", json!({})), asked()]),
    )
    .await;
    assert_eq!(out[0]["isError"], false, "{}", out[0]);
    assert_eq!(
        out[0]["text"], "answered: ask, think",
        "the server got its own answers back"
    );
    let questions: Vec<&Value> = out[1]["asked"]
        .as_array()
        .expect("asked")
        .iter()
        .filter(|a| a["kind"] == "elicitation")
        .collect();
    let ours = questions
        .iter()
        .filter(|q| {
            q["params"]["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Approve this tool call?")
        })
        .count();
    assert_eq!(
        (questions.len(), ours),
        (3, 2),
        "two approvals, one question of the server's: {questions:?}"
    );
    assert_eq!(
        upstream.ran().iter().filter(|t| *t == "leaky_ask").count(),
        2
    );
    gw.stop().await;
    upstream.stop().await;
}

/// A held call nobody decides ends at the rule's timeout, unrun, and its
/// approval can no longer be given.
#[tokio::test]
async fn a_held_call_nobody_decides_expires_unrun() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = gateway(&upstream.url, r#"{ by = "operator", timeout = "1s" }"#, "").await;
    let out = python(
        Mode::Modern,
        &gw.url("files"),
        ALICE,
        "off",
        json!([call("echo", json!({"text": "late"}))]),
    )
    .await;
    assert_eq!(
        gateway_code(&out[0]),
        Some("approval_expired"),
        "{}",
        out[0]
    );
    assert!(
        gw.admin(ADMIN_TOKEN).pending().await.is_empty(),
        "the expired entry left the queue"
    );
    let expired: Vec<Value> = gw
        .admin(ADMIN_TOKEN)
        .events()
        .await
        .into_iter()
        .filter(|e| e["method"] == "portcullis/approval" && e["decision"] == "expired")
        .collect();
    assert_eq!(expired.len(), 1);
    let id = expired[0]["approval"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(gw.admin(ADMIN_TOKEN).decide(&id, "approve").await.0, 404);
    assert!(echoes(&upstream).is_empty());
    assert!(
        gw.admin(ADMIN_TOKEN)
            .metrics()
            .await
            .contains(r#"portcullis_approvals_total{by="operator",outcome="expired"} 1"#)
    );
    gw.stop().await;
    upstream.stop().await;
}

/// Approvals live in memory: a `requestState` signed before a restart is
/// refused after it, even under the same configured key, and the client is
/// asked again on its next plain call.
#[tokio::test]
async fn a_state_from_before_a_restart_is_refused() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let key = "approvals-key-of-at-least-32-bytes!";
    let extra = format!("\n[approvals]\nkey = \"{key}\"\n");
    let start = || async {
        let token = hex::encode(portcullis::auth::hash_key(ADMIN_TOKEN));
        TestGateway::start_raw(&format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_sha256 = \"{token}\"\n\
             [servers.files]\nurl = \"{}\"\n{}\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"files\"]\ntools = [\"echo\"]\naction = \"allow\"\n\
             approval = {BY_USER}\n{extra}",
            upstream.url,
            clients()
        ))
        .await
    };
    let before = start().await;
    let asked = post_echo(&before, ALICE, modern_echo(1, "x", json!({}))).await;
    let state = asked["requestState"].as_str().expect("state").to_owned();
    before.stop().await;
    let after = start().await;
    let refused = post_echo(&after, ALICE, modern_echo(2, "x", yes(&state))).await;
    assert_eq!(
        refused["_meta"]["portcullis/error"]["code"], "approval_invalid",
        "{refused}"
    );
    let again = post_echo(&after, ALICE, modern_echo(3, "x", json!({}))).await;
    assert_eq!(again["resultType"], "input_required");
    assert!(echoes(&upstream).is_empty());
    after.stop().await;
    upstream.stop().await;
}

/// A JSON-RPC response whose id has the form of the gateway's questions but
/// answers none open for this session is refused (400, -31020), not relayed.
#[tokio::test]
async fn an_answer_to_no_open_question_is_refused() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = gateway(&upstream.url, BY_USER, "").await;
    let url = gw.url("files");
    let auth = format!("Bearer {ALICE}");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let opened = raw_post(&url, &[("authorization", &auth)], init.to_string()).await;
    let session = opened.headers["mcp-session-id"]
        .to_str()
        .expect("session")
        .to_owned();
    let answer = json!({"jsonrpc": "2.0", "id": "portcullis-approval-00112233445566778899aabbccddeeff",
        "result": {"action": "accept", "content": {"approve": true}}});
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let refused = raw_post(&url, &headers, answer.to_string()).await;
    assert_eq!(refused.status, 400, "{}", refused.text);
    assert_eq!(refused.body["error"]["code"], -31020);
    assert_eq!(
        refused.body["error"]["data"]["code"],
        "approval_answer_unknown"
    );
    gw.stop().await;
    upstream.stop().await;
}

/// A server request with an id of the gateway's question form never reaches
/// the client (so a client's answer to such an id can only answer the
/// gateway); one with any other id is relayed as before.
#[tokio::test]
async fn a_server_request_posing_as_an_approval_question_is_dropped() {
    let up = Misbehaving::start().await;
    let gw = TestGateway::start_raw(&format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [servers.s]\nurl = \"{}\"\npinning = \"off\"\n{}{}",
        up.url,
        clients(),
        support::allow_all()
    ))
    .await;
    let ask = |id: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "elicitation/create",
        "params": {"message": "approve?", "requestedSchema": {"type": "object", "properties": {}}}})
    };
    let done = json!({"jsonrpc": "2.0", "id": "$id", "result": {"content": [{"type": "text", "text": "done"}]}});
    up.script(
        "impostor",
        Scripted::Sse(vec![ask("portcullis-approval-00ff"), done.clone()]),
    );
    up.script("plain", Scripted::Sse(vec![ask("srv-1"), done]));
    let auth = format!("Bearer {ALICE}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let body = |x: &str| {
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "scripted", "arguments": {"x": x}}})
        .to_string()
    };
    let impostor = raw_post(&gw.url("s"), &headers, body("impostor")).await;
    assert_eq!(
        impostor.body["result"]["content"][0]["text"], "done",
        "{}",
        impostor.text
    );
    assert!(
        !impostor.text.contains("portcullis-approval-"),
        "{}",
        impostor.text
    );
    let plain = raw_post(&gw.url("s"), &headers, body("plain")).await;
    assert!(plain.text.contains("srv-1"), "{}", plain.text);
    gw.stop().await;
}

/// Deny rules, rate limits and validation run first: a call they refuse is
/// never put to a person.
#[tokio::test]
async fn only_a_call_that_would_be_forwarded_is_put_to_a_person() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = gateway(
        &upstream.url,
        r#"{ by = "user" }
rate = { burst = 2, per_second = 0.001 }
[[rules]]
clients = ["bob"]
servers = ["files"]
tools = ["echo"]
action = "deny""#,
        "",
    )
    .await;
    let url = gw.url("files");
    let out = python(
        Mode::Legacy,
        &url,
        ALICE,
        "approve",
        json!([
            call("echo", json!({"text": 5})),
            asked(),
            call("echo", json!({"text": "first"})),
            call("echo", json!({"text": "second"})),
            call("echo", json!({"text": "third"})),
            asked()
        ]),
    )
    .await;
    assert_eq!(
        gateway_code(&out[0]),
        Some("invalid_arguments"),
        "{}",
        out[0]
    );
    assert_eq!(
        out[1]["asked"],
        json!([]),
        "an invalid call asks nobody (and takes no token)"
    );
    assert_eq!(out[2]["text"], "first", "{}", out[2]);
    assert_eq!(out[3]["text"], "second", "{}", out[3]);
    assert_eq!(gateway_code(&out[4]), Some("rate_limited"), "{}", out[4]);
    assert_eq!(
        out[5]["asked"].as_array().map(Vec::len),
        Some(2),
        "only the forwarded calls asked: one past its rate is refused before asking"
    );
    let bobs = python(
        Mode::Modern,
        &url,
        BOB,
        "approve",
        json!([call("echo", json!({"text": "b"})), asked()]),
    )
    .await;
    assert_eq!(gateway_code(&bobs[0]), Some("unknown_tool"), "{}", bobs[0]);
    assert_eq!(bobs[1]["asked"], json!([]));
    assert_eq!(echoes(&upstream).len(), 2);
    gw.stop().await;
    upstream.stop().await;
}
