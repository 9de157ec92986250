//! Rules with a `when` condition seen through the official Python SDK client
//! in both eras: a condition over the arguments keeps its tool listed and
//! decides each call; a deny rule's condition refuses only the calls it is
//! true for; a condition that fails denies the call and says why; a condition
//! over a JWT's claims lets one team call what another may not; a condition
//! over the tool's annotations refuses the Python SDK server's destructive
//! tool in both eras, and lets a scripted server's read-only tools run. A
//! condition that does not read the arguments is decided in the list as in
//! the call: each token sees exactly the tools its calls may use.

use crate::support;
use support::tiers::{self, Tier};

use std::io::Write as _;

use serde_json::{Value, json};
use support::jwt::{Signer, claims, jwks};
use support::upstreams::InProcess;
use support::{ALICE, BOB, Mode, Peer, PeerServer, Sdk, TestGateway, call, clients, list, sdk};

const RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["echo"]
action = "allow"

[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["book_flight"]
action = "allow"
when = "arguments.passengers <= 2"

[[rules]]
clients = ["alice"]
servers = ["flights"]
tools = ["progress"]
action = "allow"
when = "arguments.missing == 1"

[[rules]]
clients = ["bob"]
servers = ["flights"]
tools = ["echo"]
action = "deny"
when = "arguments.text == 'secret'"
"#;

fn names(result: &Value) -> Vec<String> {
    let mut v: Vec<String> = result["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    v.sort();
    v
}

fn booking(passengers: u32) -> Value {
    json!({"origin": "CDG", "destination": "LHR", "date": "2026-12-01", "passengers": passengers})
}

fn text(result: &Value) -> &str {
    result["text"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_over_the_arguments_decides_each_call_of_a_listed_tool() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start(
        &[("flights", &server.url)],
        &format!("{}{RULES}", clients()),
    )
    .await;
    let url = gateway.url("flights");
    for mode in [Mode::Legacy, Mode::Modern] {
        let r = sdk(
            Sdk::Python,
            mode,
            &url,
            ALICE,
            json!([
                list(),
                call("book_flight", booking(2)),
                call("book_flight", booking(5)),
                call("progress", json!({})),
            ]),
        )
        .await;
        // The conditions read arguments: the tools stay listed and each call decides.
        assert_eq!(
            names(&r[0]),
            ["book_flight", "echo", "progress"],
            "{mode:?}"
        );
        assert_eq!(support::gateway_code(&r[1]), None, "{mode:?}: {r:?}");
        assert_eq!(
            support::gateway_code(&r[2]),
            Some("call_not_permitted"),
            "{r:?}"
        );
        assert!(text(&r[2]).contains("rules[1]"), "{r:?}");
        assert!(text(&r[2]).contains("arguments.passengers <= 2"), "{r:?}");
        // A condition that cannot be evaluated denies the call, naming the rule and CEL's reason.
        assert_eq!(
            support::gateway_code(&r[3]),
            Some("rule_expression_failed"),
            "{r:?}"
        );
        assert_eq!(r[3]["meta"]["portcullis/error"]["rule"], "rules[2]");
        assert!(text(&r[3]).contains("missing"), "{r:?}");

        // bob: the deny rule's condition refuses only the call it is true for.
        let r = sdk(
            Sdk::Python,
            mode,
            &url,
            BOB,
            json!([
                list(),
                call("echo", json!({"text": "hello"})),
                call("echo", json!({"text": "secret"})),
            ]),
        )
        .await;
        assert_eq!(names(&r[0]), ["book_flight", "echo"], "{mode:?}");
        assert_eq!(support::gateway_code(&r[1]), None, "{r:?}");
        assert_eq!(
            support::gateway_code(&r[2]),
            Some("call_not_permitted"),
            "{r:?}"
        );
        assert_eq!(r[2]["meta"]["portcullis/error"]["rule"], "rules[3]");
    }
    // Only the permitted calls ran upstream.
    assert_eq!(server.ran(), ["book_flight", "echo", "book_flight", "echo"]);
    gateway.stop().await;
    server.stop().await;
}

const ISS: &str = "https://idp.example.test/realms/mcp";
const AUD: &str = "https://mcp.example.test/mcp/flights";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_over_the_claims_lets_one_team_call() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let key = Signer::ed25519("ed-1");
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(jwks(&[&key]).as_bytes()).expect("write");
    let rest = format!(
        "[auth.jwt]\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\njwks_file = \"{}\"\n{}",
        file.path().display(),
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["book_flight"]
action = "allow"
when = "has(claims.team) && claims.team == 'ops'"
"#
    );
    let gateway = TestGateway::start(&[("flights", &server.url)], &rest).await;
    let url = gateway.url("flights");
    let token = |team: &str| {
        let mut c = claims(ISS, AUD, "carol", "");
        c["team"] = team.into();
        key.token(&c)
    };
    for mode in [Mode::Legacy, Mode::Modern] {
        let ops = sdk(
            Sdk::Python,
            mode,
            &url,
            &token("ops"),
            json!([list(), call("book_flight", booking(3))]),
        )
        .await;
        assert_eq!(names(&ops[0]), ["book_flight"], "{mode:?}");
        assert_eq!(support::gateway_code(&ops[1]), None, "{mode:?}: {ops:?}");
        let dev = sdk(
            Sdk::Python,
            mode,
            &url,
            &token("dev"),
            json!([list(), call("book_flight", booking(3))]),
        )
        .await;
        // Same subject, another team: the list is decided for this token,
        // and the tool it hides is unknown to its call.
        assert!(names(&dev[0]).is_empty(), "{mode:?}: {dev:?}");
        assert_eq!(
            support::gateway_code(&dev[1]),
            Some("unknown_tool"),
            "{dev:?}"
        );
    }
    assert_eq!(server.ran(), ["book_flight", "book_flight"]);
    gateway.stop().await;
    server.stop().await;
}

/// Conditions over the token's claims and the tool's annotations are decided
/// in the list as in the call, through the Python SDK server and client in
/// both eras: the ops team sees and may call the booking and the
/// destructive reset; the dev team (same subject) sees neither and its calls
/// find no such tool; a token without a team sees only what no failing
/// condition guards (a condition that fails hides the tool, and its call
/// finds no such tool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_shows_each_token_what_its_calls_get() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    // The gateway's base URL: tokens for every server and the merged view.
    let aud = AUD.trim_end_matches("/flights");
    let key = Signer::ed25519("ed-1");
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(jwks(&[&key]).as_bytes()).expect("write");
    let rest = format!(
        "[auth.jwt]\nissuer = \"{ISS}\"\naudience = \"{aud}\"\njwks_file = \"{}\"\n{}",
        file.path().display(),
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["echo", "admin_reset"]
action = "allow"

[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["book_flight"]
action = "allow"
when = "claims.team == 'ops'"

[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["admin_reset"]
action = "deny"
when = "annotations.destructiveHint == true && claims.team != 'ops'"
"#
    );
    // A second member, on which no rule allows anything, makes /mcp the merged view.
    let upstreams = [
        ("flights", server.url.as_str()),
        ("other", server.url.as_str()),
    ];
    let gateway = TestGateway::start(&upstreams, &rest).await;
    let url = gateway.url("flights");
    let token = |team: Option<&str>| {
        let mut c = claims(ISS, aud, "carol", "");
        if let Some(team) = team {
            c["team"] = team.into();
        }
        key.token(&c)
    };
    let calls = || {
        json!([
            list(),
            call("book_flight", booking(1)),
            call("admin_reset", json!({})),
            call("echo", json!({"text": "hi"})),
            call("book_flight_now", json!({})),
        ])
    };
    // An unknown tool's answer names the tools the client may call: its list.
    let permitted = |r: &[Value]| -> Vec<String> {
        let mut v: Vec<String> = r[4]["meta"]["portcullis/error"]["permitted"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_str().map(str::to_owned))
            .collect();
        v.sort();
        v
    };
    for mode in [Mode::Legacy, Mode::Modern] {
        let ops = sdk(Sdk::Python, mode, &url, &token(Some("ops")), calls()).await;
        assert_eq!(
            names(&ops[0]),
            ["admin_reset", "book_flight", "echo"],
            "{mode:?}"
        );
        for (i, answer) in ops.iter().enumerate().take(4).skip(1) {
            assert_eq!(support::gateway_code(answer), None, "{mode:?} {i}: {ops:?}");
        }
        assert_eq!(permitted(&ops), names(&ops[0]), "{mode:?}: {ops:?}");
        let dev = sdk(Sdk::Python, mode, &url, &token(Some("dev")), calls()).await;
        assert_eq!(names(&dev[0]), ["echo"], "{mode:?}: {dev:?}");
        // A tool its list hides looks to its calls like no tool at all: no
        // answer tells the client it exists.
        for refused in &dev[1..3] {
            assert_eq!(
                support::gateway_code(refused),
                Some("unknown_tool"),
                "{mode:?}: {dev:?}"
            );
        }
        assert_eq!(support::gateway_code(&dev[3]), None, "{mode:?}: {dev:?}");
        assert_eq!(permitted(&dev), ["echo"], "{mode:?}: {dev:?}");
        // The merged view lists alike, and its answer to a name that is no member's
        // (unprefixed) names what its list shows.
        let merged = json!([
            list(),
            call("flights__admin_reset", json!({})),
            call("flights__echo", json!({"text": "hi"})),
            call("flights__book_flight", booking(1)),
            call("book_flight", json!({})),
        ]);
        let dev = sdk(
            Sdk::Python,
            mode,
            &gateway.merged_url(),
            &token(Some("dev")),
            merged,
        )
        .await;
        assert_eq!(names(&dev[0]), ["flights__echo"], "{mode:?}: {dev:?}");
        assert_eq!(
            support::gateway_code(&dev[1]),
            Some("unknown_tool"),
            "{mode:?}: {dev:?}"
        );
        assert_eq!(support::gateway_code(&dev[2]), None, "{mode:?}: {dev:?}");
        assert_eq!(
            support::gateway_code(&dev[3]),
            Some("unknown_tool"),
            "{mode:?}: {dev:?}"
        );
        assert_eq!(permitted(&dev), ["flights__echo"], "{mode:?}: {dev:?}");
        // No team claim: both conditions that read it fail, in the list and in the call.
        let none = sdk(Sdk::Python, mode, &url, &token(None), calls()).await;
        assert_eq!(names(&none[0]), ["echo"], "{mode:?}: {none:?}");
        for refused in &none[1..3] {
            assert_eq!(
                support::gateway_code(refused),
                Some("unknown_tool"),
                "{mode:?}: {none:?}"
            );
        }
        assert_eq!(support::gateway_code(&none[3]), None, "{mode:?}: {none:?}");
        assert_eq!(permitted(&none), ["echo"], "{mode:?}: {none:?}");
    }
    assert_eq!(
        server.ran(),
        ["book_flight", "admin_reset", "echo", "echo", "echo", "echo"].repeat(2)
    );
    gateway.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_over_the_annotations_lets_read_only_tools_run() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let schema = json!({"type": "object"});
    let upstream = InProcess::scripted(vec![
        json!({"name": "lookup", "inputSchema": schema, "annotations": {"readOnlyHint": true}}),
        json!({"name": "wipe", "inputSchema": schema, "annotations": {"readOnlyHint": false, "destructiveHint": true}}),
        json!({"name": "plain", "inputSchema": schema}),
    ])
    .await;
    let rules = r#"
[[rules]]
clients = ["*"]
servers = ["s"]
tools = ["*"]
action = "allow"
when = "has(annotations.readOnlyHint) && annotations.readOnlyHint"
"#;
    let gateway =
        TestGateway::start(&[("s", &upstream.url)], &format!("{}{rules}", clients())).await;
    // The scripted server speaks the 2025-11-25 handshake era only.
    {
        let mode = Mode::Legacy;
        let r = sdk(
            Sdk::Python,
            mode,
            &gateway.url("s"),
            ALICE,
            json!([
                list(),
                call("lookup", json!({})),
                call("wipe", json!({})),
                call("plain", json!({})),
            ]),
        )
        .await;
        // Decided in the list as in the call: only the read-only tool is
        // shown, and the hidden ones are unknown to their calls.
        assert_eq!(names(&r[0]), ["lookup"], "{mode:?}");
        assert_eq!(support::gateway_code(&r[1]), None, "{mode:?}: {r:?}");
        for refused in &r[2..] {
            assert_eq!(
                support::gateway_code(refused),
                Some("unknown_tool"),
                "{mode:?}: {r:?}"
            );
        }
    }
    let ran: Vec<String> = upstream.ran().into_iter().map(|(n, _)| n).collect();
    assert_eq!(ran, ["lookup"]);
    gateway.stop().await;
}

/// The Python SDK server annotates `admin_reset` as destructive: a rule
/// whose condition reads the annotations hides it from the list and refuses
/// its call in both eras, while the unannotated `echo` is listed and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_over_an_sdk_servers_annotations_refuses_its_destructive_tool() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let rules = r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["admin_reset", "echo"]
action = "allow"
when = "!(has(annotations.destructiveHint) && annotations.destructiveHint)"
"#;
    let gateway = TestGateway::start(
        &[("flights", &server.url)],
        &format!("{}{rules}", clients()),
    )
    .await;
    let url = gateway.url("flights");
    for mode in [Mode::Legacy, Mode::Modern] {
        let r = sdk(
            Sdk::Python,
            mode,
            &url,
            ALICE,
            json!([
                list(),
                call("echo", json!({"text": "hi"})),
                call("admin_reset", json!({})),
            ]),
        )
        .await;
        assert_eq!(names(&r[0]), ["echo"], "{mode:?}");
        assert_eq!(support::gateway_code(&r[1]), None, "{mode:?}: {r:?}");
        assert_eq!(
            support::gateway_code(&r[2]),
            Some("unknown_tool"),
            "{mode:?}: {r:?}"
        );
        assert!(
            !text(&r[2]).contains("annotations"),
            "no rule quoted: {r:?}"
        );
    }
    assert_eq!(server.ran(), ["echo", "echo"]);
    gateway.stop().await;
    server.stop().await;
}

/// Through the merged view a condition reads the tool and server as the
/// rules name them (`book_flight` on `flights`), not the prefixed name the
/// client used; a name that differs by case or by a look-alike letter is
/// no tool of the server's and never reaches it, whatever the rules say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_reads_unprefixed_names_and_lookalike_names_reach_nothing() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let rules = r#"
[[rules]]
clients = ["*"]
servers = ["*"]
tools = ["*"]
action = "allow"

[[rules]]
clients = ["*"]
servers = ["*"]
tools = ["*"]
action = "deny"
when = "server == 'flights' && tool == 'book_flight' && arguments.passengers > 2"
"#;
    let upstreams = [
        ("flights", server.url.as_str()),
        ("other", server.url.as_str()),
    ];
    let gateway = TestGateway::start(&upstreams, &format!("{}{rules}", clients())).await;
    let merged = gateway.merged_url();
    for mode in [Mode::Legacy, Mode::Modern] {
        let r = sdk(
            Sdk::Python,
            mode,
            &merged,
            ALICE,
            json!([
                call("flights__book_flight", booking(5)),
                call("flights__book_flight", booking(1)),
                call("other__book_flight", booking(5)),
                call("flights__Book_flight", booking(1)),
                call("flights__book_fl\u{0456}ght", booking(1)),
                call("FLIGHTS__book_flight", booking(1)),
            ]),
        )
        .await;
        assert_eq!(
            support::gateway_code(&r[0]),
            Some("call_not_permitted"),
            "{mode:?}: {r:?}"
        );
        assert_eq!(r[0]["meta"]["portcullis/error"]["rule"], "rules[1]");
        assert_eq!(support::gateway_code(&r[1]), None, "{mode:?}: {r:?}");
        assert_eq!(support::gateway_code(&r[2]), None, "{mode:?}: {r:?}");
        for lookalike in &r[3..] {
            assert!(
                support::gateway_code(lookalike).is_some(),
                "{mode:?}: refused by the gateway: {r:?}"
            );
        }
    }
    assert_eq!(
        server.ran(),
        ["book_flight", "book_flight", "book_flight", "book_flight"]
    );
    gateway.stop().await;
    server.stop().await;
}
