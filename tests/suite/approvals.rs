//! Human approval for sensitive tools, through real SDK clients and a real
//! Python SDK server that records every call it runs: a call a rule marks
//! for approval runs once after a yes to exactly its arguments, and never
//! otherwise — declined, expired, replayed, forged, another client's, other
//! arguments — in both protocol eras, by the user (elicitation) and by an
//! operator (admin API, dashboard). The edges of an approval: `approvals_edges.rs`; its
//! settings and `portcullis check`: `approvals_settings.rs`.

use crate::support;
use support::tiers::{self, Tier};

use std::time::Duration;

use serde_json::{Value, json};
use support::{
    ALICE, BOB, Mode, Peer, PeerServer, Sdk, TestGateway, borrow, call, clients, gateway_code,
    modern_call_headers, raw_post, sdk,
};

pub(crate) const ADMIN_TOKEN: &str = "operator-token";

/// A gateway in front of `upstream` where `echo` needs approval as `approval`
/// says and `progress` does not.
pub(crate) async fn gateway(upstream: &str, approval: &str, extra: &str) -> TestGateway {
    let token = hex::encode(portcullis::auth::hash_key(ADMIN_TOKEN));
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         admin_token_sha256 = \"{token}\"\n{extra}\n\
         [servers.files]\nurl = \"{upstream}\"\ntimeout = \"20s\"\n{}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"files\"]\ntools = [\"echo\"]\naction = \"allow\"\n\
         approval = {approval}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"files\"]\ntools = [\"progress\"]\naction = \"allow\"\n",
        clients()
    );
    TestGateway::start_raw(&text).await
}

/// The Python SDK client with `--elicit` (approve, decline, off).
pub(crate) async fn python(
    mode: Mode,
    url: &str,
    key: &str,
    elicit: &str,
    ops: Value,
) -> Vec<Value> {
    support::eliciting(Sdk::Python, mode, url, key, elicit, ops).await
}

pub(crate) fn asked() -> Value {
    json!({"op": "asked"})
}

/// The recorded upstream calls of `echo`.
pub(crate) fn echoes(upstream: &PeerServer) -> Vec<Value> {
    upstream
        .calls()
        .into_iter()
        .filter(|c| c["tool"] == "echo")
        .collect()
}

pub(crate) const BY_USER: &str =
    r#"{ by = "user", timeout = "1m", reason = "echo is a write tool here" }"#;

/// What a client's user answers the gateway's question, and what must follow.
struct InBand {
    sdk: Sdk,
    /// `--elicit`: `approve`, `decline`, or `off` (the client declares no elicitation).
    answer: &'static str,
    /// `None`: the call runs once with the tool's own result; else the refusal code,
    /// and the call never reaches the server.
    refused: Option<&'static str>,
}

/// Every in-band case, each run in both eras against one gateway and one
/// recording server.
const IN_BAND: &[InBand] = &[
    InBand {
        sdk: Sdk::Python,
        answer: "approve",
        refused: None,
    },
    InBand {
        sdk: Sdk::TypeScript,
        answer: "approve",
        refused: None,
    },
    InBand {
        sdk: Sdk::Python,
        answer: "decline",
        refused: Some("approval_declined"),
    },
    InBand {
        sdk: Sdk::TypeScript,
        answer: "decline",
        refused: Some("approval_declined"),
    },
    InBand {
        sdk: Sdk::Python,
        answer: "off",
        refused: Some("approval_unavailable"),
    },
    InBand {
        sdk: Sdk::TypeScript,
        answer: "off",
        refused: Some("approval_unavailable"),
    },
];

/// The user approves, declines, or cannot be asked, through the Python and
/// TypeScript SDK clients in both eras: an approved call runs exactly once with
/// its own result, a declined one is `approval_declined` and a client without
/// elicitation gets the documented `approval_unavailable`, neither reaching the
/// server.
#[tokio::test]
async fn the_users_answer_decides_whether_the_call_runs_in_both_eras() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = gateway(&upstream.url, BY_USER, "").await;
    let mut approved = 0;
    for (n, case) in IN_BAND.iter().enumerate() {
        for mode in [Mode::Modern, Mode::Legacy] {
            let what = format!("{:?} answering {} in {mode:?}", case.sdk, case.answer);
            let text = format!("case {n} {mode:?}");
            let mut ops = vec![call("echo", json!({"text": text}))];
            if case.sdk == Sdk::Python {
                ops.push(asked());
            }
            let out = support::eliciting(
                case.sdk,
                mode,
                &gw.url("files"),
                ALICE,
                case.answer,
                Value::Array(ops),
            )
            .await;
            let ran = echoes(&upstream)
                .into_iter()
                .filter(|c| c["arguments"]["text"] == text)
                .count();
            match case.refused {
                None => {
                    approved += 1;
                    assert_eq!(out[0]["isError"], false, "{what}: {}", out[0]);
                    assert_eq!(out[0]["text"], text, "{what}: the tool's own result");
                    assert_eq!(ran, 1, "{what}: ran once");
                }
                Some(code) => {
                    assert_eq!(out[0]["isError"], true, "{what}: {}", out[0]);
                    assert_eq!(gateway_code(&out[0]), Some(code), "{what}: {}", out[0]);
                    assert_eq!(ran, 0, "{what}: never reached the server");
                }
            }
            if case.sdk == Sdk::Python && case.answer != "off" {
                // What the user was shown.
                let question = &out[1]["asked"][0]["params"];
                let message = question["message"].as_str().unwrap_or_default();
                for shown in ["echo", "files", "echo is a write tool here", text.as_str()] {
                    assert!(message.contains(shown), "{what}: {message}");
                }
                assert_eq!(question["requestedSchema"]["required"], json!(["approve"]));
            }
            if case.refused == Some("approval_unavailable") {
                let advice = out[0]["text"].as_str().unwrap_or_default();
                assert!(
                    advice.contains("elicitation") && advice.contains("by = \"operator\""),
                    "{what}: {advice}"
                );
            }
        }
    }
    // A call of a tool without approval is not asked about.
    let out = python(
        Mode::Legacy,
        &gw.url("files"),
        ALICE,
        "decline",
        json!([call("progress", json!({"steps": 1})), asked()]),
    )
    .await;
    assert_eq!(out[0]["isError"], false, "{}", out[0]);
    assert_eq!(out[1]["asked"], json!([]));
    assert_eq!(echoes(&upstream).len(), approved, "only approved calls ran");
    let scraped = gw.admin(ADMIN_TOKEN).metrics().await;
    assert!(
        scraped.contains(&format!(
            r#"portcullis_approvals_total{{by="user",outcome="approved"}} {approved}"#
        )),
        "{scraped}"
    );
    let audited: Vec<Value> = gw
        .admin(ADMIN_TOKEN)
        .events()
        .await
        .into_iter()
        .filter(|e| e["method"] == "portcullis/approval" && e["decision"] == "approved")
        .collect();
    assert_eq!(audited.len(), approved);
    assert_eq!(
        audited[0]["approval"]["digest"].as_str().map(str::len),
        Some(64)
    );
    gw.stop().await;
    upstream.stop().await;
}

/// A 2026-07-28 `tools/call` of `echo` whose client declares elicitation,
/// with `extra` params (a retry's state and answer).
pub(crate) fn modern_echo(id: u64, text: &str, extra: Value) -> String {
    let mut params = json!({"name": "echo", "arguments": {"text": text}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}});
    if let (Value::Object(p), Value::Object(e)) = (&mut params, extra) {
        p.extend(e);
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}

pub(crate) fn yes(state: &str) -> Value {
    json!({"requestState": state,
           "inputResponses": {"portcullis_approval": {"action": "accept", "content": {"approve": true}}}})
}

pub(crate) async fn post_echo(gw: &TestGateway, key: &str, body: String) -> Value {
    let headers = modern_call_headers(key, "echo");
    raw_post(&gw.url("files"), &borrow(&headers), body)
        .await
        .body["result"]
        .clone()
}

#[tokio::test]
async fn a_signed_state_runs_its_own_call_once_and_nothing_else() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = gateway(&upstream.url, BY_USER, "").await;
    let asked = post_echo(&gw, ALICE, modern_echo(1, "/tmp/x", json!({}))).await;
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    let state = asked["requestState"].as_str().expect("a state").to_owned();
    let question = &asked["inputRequests"]["portcullis_approval"];
    assert_eq!(question["method"], "elicitation/create");

    // Every other presentation of the approved state runs nothing, and leaves
    // it unused: (who, arguments, state, what they get).
    let mut forged = state.clone().into_bytes();
    let at = forged.len() - 3;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).expect("ascii");
    let misuses = [
        ("other arguments", ALICE, "/", &state, "input_required"),
        ("another client", BOB, "/tmp/x", &state, "approval_invalid"),
        (
            "one byte changed",
            ALICE,
            "/tmp/x",
            &forged,
            "approval_invalid",
        ),
    ];
    for (id, (what, key, text, presented, expected)) in (2..).zip(misuses) {
        let got = post_echo(&gw, key, modern_echo(id, text, yes(presented))).await;
        if expected == "input_required" {
            // A new question of its own, never the approved one.
            assert_eq!(got["resultType"], "input_required", "{what}: {got}");
            assert_ne!(got["requestState"], asked["requestState"], "{what}");
        } else {
            assert_eq!(
                got["_meta"]["portcullis/error"]["code"], expected,
                "{what}: {got}"
            );
        }
    }
    assert!(echoes(&upstream).is_empty(), "nothing ran so far");

    // The approved call, with its own state (which other arguments left unused).
    let ran = post_echo(&gw, ALICE, modern_echo(5, "/tmp/x", yes(&state))).await;
    assert_eq!(ran["isError"], false, "{ran}");
    assert_eq!(ran["content"][0]["text"], "/tmp/x");
    // The gateway's own state and answer were not forwarded.
    let calls = echoes(&upstream);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["arguments"], json!({"text": "/tmp/x"}));
    // Replayed: refused, not run again.
    let replayed = post_echo(&gw, ALICE, modern_echo(6, "/tmp/x", yes(&state))).await;
    assert_eq!(
        replayed["_meta"]["portcullis/error"]["code"], "approval_used",
        "{replayed}"
    );
    // A "no" uses the state up too.
    let second = post_echo(&gw, ALICE, modern_echo(7, "/tmp/y", json!({}))).await;
    let state = second["requestState"].as_str().expect("state").to_owned();
    let no = json!({"requestState": state, "inputResponses": {"portcullis_approval": {"action": "decline"}}});
    let declined = post_echo(&gw, ALICE, modern_echo(8, "/tmp/y", no)).await;
    assert_eq!(
        declined["_meta"]["portcullis/error"]["code"],
        "approval_declined"
    );
    let after = post_echo(&gw, ALICE, modern_echo(9, "/tmp/y", yes(&state))).await;
    assert_eq!(after["_meta"]["portcullis/error"]["code"], "approval_used");
    assert_eq!(echoes(&upstream).len(), 1, "ran exactly once in all");
    gw.stop().await;
    upstream.stop().await;
}

#[tokio::test]
async fn an_expired_approval_is_refused() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = gateway(&upstream.url, r#"{ by = "user", timeout = "1s" }"#, "").await;
    let asked = post_echo(&gw, ALICE, modern_echo(1, "late", json!({}))).await;
    let state = asked["requestState"].as_str().expect("state").to_owned();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late = post_echo(&gw, ALICE, modern_echo(2, "late", yes(&state))).await;
    assert_eq!(
        late["_meta"]["portcullis/error"]["code"], "approval_expired",
        "{late}"
    );
    assert!(echoes(&upstream).is_empty());
    gw.stop().await;
    upstream.stop().await;
}

#[tokio::test]
async fn an_operator_approves_a_retried_call_through_the_admin_api() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let approval =
        r#"{ by = "operator", pending = "retry", timeout = "5m", reason = "irreversible" }"#;
    let gw = gateway(&upstream.url, approval, "").await;
    let url = gw.url("files");
    let first = sdk(
        Sdk::TypeScript,
        Mode::Legacy,
        &url,
        ALICE,
        json!([call("echo", json!({"text": "rm"}))]),
    )
    .await;
    assert_eq!(
        gateway_code(&first[0]),
        Some("approval_required"),
        "{}",
        first[0]
    );
    let id = first[0]["meta"]["portcullis/error"]["approval_id"]
        .as_str()
        .expect("an approval id")
        .to_owned();
    let queued = gw.admin(ADMIN_TOKEN).pending().await;
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0]["client"], "alice");
    assert_eq!(queued[0]["tool"], "echo");
    assert_eq!(queued[0]["arguments"], "{\n  \"text\": \"rm\"\n}");
    assert_eq!(queued[0]["reason"], "irreversible");
    // A client's key is no admin token.
    assert_eq!(gw.admin(ALICE).decide(&id, "approve").await.0, 401);
    // Bob naming alice's approval id gets the unknown-id answer.
    let mut body: Value =
        serde_json::from_str(&support::modern_call(1, "echo", json!({"text": "rm"})))
            .expect("json");
    body["params"]["_meta"]["portcullis/approvalId"] = json!(id);
    let headers = modern_call_headers(BOB, "echo");
    let bobs = raw_post(&url, &borrow(&headers), body.to_string())
        .await
        .body;
    assert_eq!(
        bobs["result"]["_meta"]["portcullis/error"]["code"], "approval_unknown",
        "{bobs}"
    );
    let (status, decided) = gw.admin(ADMIN_TOKEN).decide(&id, "approve").await;
    assert_eq!(
        (status, decided["decided"].as_str()),
        (200, Some("approved"))
    );
    assert_eq!(gw.admin(ADMIN_TOKEN).decide(&id, "deny").await.0, 409);
    // Other arguments are not approved by it.
    let other = sdk(
        Sdk::TypeScript,
        Mode::Legacy,
        &url,
        ALICE,
        json!([call("echo", json!({"text": "rm -rf"}))]),
    )
    .await;
    assert_eq!(gateway_code(&other[0]), Some("approval_required"));
    assert!(echoes(&upstream).is_empty());
    // The identical call runs once; once more is a new approval.
    let out = sdk(
        Sdk::TypeScript,
        Mode::Legacy,
        &url,
        ALICE,
        json!([
            call("echo", json!({"text": "rm"})),
            call("echo", json!({"text": "rm"}))
        ]),
    )
    .await;
    assert_eq!(out[0]["isError"], false, "{}", out[0]);
    assert_eq!(out[0]["text"], "rm");
    assert_eq!(gateway_code(&out[1]), Some("approval_required"));
    assert_ne!(out[1]["meta"]["portcullis/error"]["approval_id"], json!(id));
    assert_eq!(echoes(&upstream).len(), 1);
    // Unknown ids are 404 on the admin API.
    assert_eq!(
        gw.admin(ADMIN_TOKEN).decide("apr_nope", "approve").await.0,
        404
    );
    gw.stop().await;
    upstream.stop().await;
}

#[tokio::test]
async fn a_held_call_runs_when_an_operator_approves_and_not_when_denied() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = gateway(&upstream.url, r#"{ by = "operator", timeout = "1m" }"#, "").await;
    for (verb, text) in [("approve", "yes please"), ("deny", "no thanks")] {
        let url = gw.url("files");
        let held = tokio::spawn(async move {
            python(
                Mode::Legacy,
                &url,
                ALICE,
                "off",
                json!([call("echo", json!({"text": text}))]),
            )
            .await
        });
        let entry = gw.admin(ADMIN_TOKEN).first_pending().await;
        assert_eq!(
            entry["arguments"],
            format!("{{\n  \"text\": \"{text}\"\n}}")
        );
        let id = entry["id"].as_str().expect("id").to_owned();
        assert_eq!(gw.admin(ADMIN_TOKEN).decide(&id, verb).await.0, 200);
        let out = held.await.expect("client");
        if verb == "approve" {
            assert_eq!(out[0]["isError"], false, "{}", out[0]);
            assert_eq!(out[0]["text"], text);
        } else {
            assert_eq!(gateway_code(&out[0]), Some("approval_denied"), "{}", out[0]);
        }
    }
    let ran: Vec<Value> = echoes(&upstream);
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0]["arguments"]["text"], "yes please");
    let scraped = gw.admin(ADMIN_TOKEN).metrics().await;
    assert!(
        scraped.contains(r#"portcullis_approvals_total{by="operator",outcome="denied"} 1"#),
        "{scraped}"
    );
    gw.stop().await;
    upstream.stop().await;
}

#[tokio::test]
async fn the_merged_view_puts_calls_to_approval_too() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let a = PeerServer::start(Peer::Python).await;
    let b = PeerServer::start(Peer::Python).await;
    let token = hex::encode(portcullis::auth::hash_key(ADMIN_TOKEN));
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_sha256 = \"{token}\"\n\
         [servers.files]\nurl = \"{}\"\n[servers.other]\nurl = \"{}\"\n{}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"echo\"]\naction = \"allow\"\n\
         approval = {{ by = \"either\", pending = \"retry\" }}\n",
        a.url,
        b.url,
        clients()
    );
    let gw = TestGateway::start_raw(&text).await;
    let merged = gw.merged_url();
    // In band when the client can be asked ...
    let out = python(
        Mode::Legacy,
        &merged,
        ALICE,
        "approve",
        json!([call("files__echo", json!({"text": "m"}))]),
    )
    .await;
    assert_eq!(out[0]["text"], "m", "{}", out[0]);
    // ... else through the operator queue.
    let out = python(
        Mode::Modern,
        &merged,
        ALICE,
        "off",
        json!([call("other__echo", json!({"text": "q"}))]),
    )
    .await;
    assert_eq!(
        gateway_code(&out[0]),
        Some("approval_required"),
        "{}",
        out[0]
    );
    assert_eq!(gw.admin(ADMIN_TOKEN).pending().await[0]["server"], "other");
    assert_eq!(echoes(&a).len(), 1);
    assert!(echoes(&b).is_empty());
    gw.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn observe_mode_records_that_it_would_ask_and_lets_the_call_through() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = gateway(&upstream.url, BY_USER, "mode = \"observe\"").await;
    let out = python(
        Mode::Legacy,
        &gw.url("files"),
        ALICE,
        "off",
        json!([call("echo", json!({"text": "seen"})), asked()]),
    )
    .await;
    assert_eq!(out[0]["text"], "seen", "{}", out[0]);
    assert_eq!(out[1]["asked"], json!([]), "nobody was asked");
    assert_eq!(echoes(&upstream).len(), 1);
    let call_event = gw
        .admin(ADMIN_TOKEN)
        .events()
        .await
        .into_iter()
        .find(|e| e["method"] == "tools/call")
        .expect("the call's event");
    assert_eq!(call_event["would_refuse"], "approval_required");
    assert_eq!(call_event["approval"]["outcome"], "would_ask");
    assert!(
        gw.admin(ADMIN_TOKEN)
            .metrics()
            .await
            .contains(r#"portcullis_approvals_total{by="user",outcome="would_ask"} 1"#)
    );
    gw.stop().await;
    upstream.stop().await;
}
