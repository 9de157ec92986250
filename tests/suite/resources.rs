//! Resource rules, rate limits and the merged view's routing decide a URI by
//! its canonical form, in front of the official Python SDK server with
//! templated resources (`tests/peers/py_server.py`): every spelling the server
//! resolves to one resource is decided and counted as that resource, and a
//! spelling whose decoding would change the URI's structure is refused before
//! any rule is looked at, the upstream not called. The same as a property over random
//! spellings: `resources_spellings.rs`.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::{
    ALICE, Mode, Peer, PeerServer, Raw, Sdk, TestGateway, clients, modern_meta, raw_post, sdk,
};

/// Everyone may read `users://`, `res://` and `file:///` resources, except
/// the admin's and the secret files.
const RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["users://*", "res://*", "file:///*"]
action = "allow"

[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["users://admin/*", "res://admin/*", "file:///secret/*"]
action = "deny"
"#;

/// Spellings of denied resources that the server, asked directly, serves.
const BYPASSES: &[&str] = &[
    "users://%61dmin/profile",
    "users://Admin/profile",
    "USERS://admin/profile",
    "res://Admin/a",
    "res://./admin/a",
    "res://open/../admin/a",
    "file:///public/../secret/key.txt",
    "file:///public/%2e%2e/secret/key.txt",
    "res://open/..%2Fadmin%2Fa",
];

fn read(uri: &str) -> Value {
    json!({"op": "read", "uri": uri})
}

/// A 2026-07-28 `resources/read` of `uri`, posted as is.
async fn modern_read(url: &str, uri: &str) -> Raw {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read",
        "params": {"uri": uri, "_meta": modern_meta()}});
    let auth = format!("Bearer {ALICE}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "resources/read"),
        ("mcp-name", uri),
    ];
    raw_post(url, &headers, body.to_string()).await
}

/// The URIs the server resolved and served, as it resolved them.
fn served(peer: &PeerServer) -> Vec<String> {
    peer.calls()
        .iter()
        .filter(|c| c["tool"] == "read")
        .filter_map(|c| c["arguments"]["uri"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn every_spelling_of_a_denied_resource_is_refused_in_both_eras() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start(&[("py", &py.url)], &format!("{}{RULES}", clients())).await;
    for mode in [Mode::Legacy, Mode::Modern] {
        let mut ops: Vec<Value> = BYPASSES.iter().map(|u| read(u)).collect();
        // What the rules allow still reads, however it is spelled.
        ops.extend([
            read("users://bob/profile"),
            read("users://%62ob/profile"),
            read("res://open/a"),
            read("res://Open/./b"),
            read("file:///public/readme.txt"),
        ]);
        let results = sdk(Sdk::Python, mode, &gateway.url("py"), ALICE, json!(ops)).await;
        let context = format!("{mode:?}: {results:#?}");
        assert!(
            !context.contains("SECRET"),
            "nothing secret is read: {context}"
        );
        for (i, uri) in BYPASSES.iter().enumerate() {
            assert!(
                results[i]["error"].is_string(),
                "{uri} is refused: {context}"
            );
        }
        let texts: Vec<String> = results[BYPASSES.len()..]
            .iter()
            .map(|r| r["texts"][0].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(
            texts,
            [
                "profile of bob",
                "profile of bob",
                "item open/a",
                "item open/b",
                "public public/readme.txt"
            ],
            "{context}"
        );
    }
    let served = served(&py);
    assert!(
        served
            .iter()
            .all(|u| !u.contains("admin") && !u.contains("secret")),
        "the server never resolved a denied resource: {served:?}"
    );
    gateway.stop().await;
    py.stop().await;
}

#[tokio::test]
async fn a_spelling_that_changes_structure_gets_an_explicit_answer_and_is_not_forwarded() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start(&[("py", &py.url)], &format!("{}{RULES}", clients())).await;
    for uri in [
        "res://open/..%2Fadmin%2Fa",
        "res://open/a%5Cb",
        "res://open/%2e%2e/x",
        "res://open/%252e%252e/x",
        "res://open/a%00",
        "res://open/%FF",
        "res://open/%zz",
        "res://open/../../x",
    ] {
        let r = modern_read(&gateway.url("py"), uri).await;
        assert_eq!(r.status, 400, "{uri}: {}", r.text);
        assert_eq!(r.body["error"]["code"], -31011, "{uri}: {}", r.text);
        assert_eq!(r.body["error"]["data"]["code"], "non_canonical_uri");
        assert_eq!(r.body["error"]["data"]["uri"], uri);
        let message = r.body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("refused for its spelling"),
            "{uri}: {message}"
        );
    }
    // The same refusal whatever the rules say: even an allowed prefix.
    let r = modern_read(&gateway.url("py"), "file:///public/%2E%2E/secret/key.txt").await;
    assert_eq!(r.body["error"]["code"], -31011, "{}", r.text);
    assert_eq!(
        served(&py),
        Vec::<String>::new(),
        "the upstream was never asked"
    );
    // A canonical spelling is forwarded as the client sent it; another one as its canonical form.
    let r = modern_read(&gateway.url("py"), "res://Open/x/%79/../z#frag").await;
    assert_eq!(
        r.body["result"]["contents"][0]["text"], "item open/x/z",
        "{}",
        r.text
    );
    assert_eq!(r.body["result"]["contents"][0]["uri"], "res://open/x/z");
    gateway.stop().await;
    py.stop().await;
}

/// Observe mode lets a denied read through (and records it), but a spelling
/// that changes structure is refused in every mode.
#[tokio::test]
async fn observe_mode_still_refuses_a_spelling_that_changes_structure() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let text = Config::new()
        .gateway("mode", "observe")
        .server("py", &py.url)
        .clients()
        .raw(RULES)
        .render();
    let gateway = TestGateway::start_raw(&text).await;
    let observed = modern_read(&gateway.url("py"), "users://%61dmin/profile").await;
    assert_eq!(
        observed.body["result"]["contents"][0]["uri"], "users://admin/profile",
        "observed, and forwarded in canonical form: {}",
        observed.text
    );
    let refused = modern_read(&gateway.url("py"), "res://open/..%2Fadmin%2Fa").await;
    assert_eq!(refused.body["error"]["code"], -31011, "{}", refused.text);
    assert_eq!(served(&py), ["users://admin/profile"]);
    gateway.stop().await;
    py.stop().await;
}

#[tokio::test]
async fn the_merged_view_routes_on_the_canonical_uri() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let a = PeerServer::start(Peer::Python).await;
    let b = PeerServer::start(Peer::PythonStateless).await;
    let gateway = TestGateway::start(
        &[("a", &a.url), ("b", &b.url)],
        &format!("{}{RULES}", clients()),
    )
    .await;
    for mode in [Mode::Legacy, Mode::Modern] {
        let ops = json!([
            read("res://open/..%2Fadmin%2Fa"),
            read("users://x%2F..%2Fadmin/profile"),
            read("res://./admin/a"),
            read("users://%61dmin/profile"),
            read("res://open/%61"),
        ]);
        let results = sdk(Sdk::Python, mode, &gateway.merged_url(), ALICE, ops).await;
        let context = format!("{mode:?}: {results:#?}");
        assert!(!context.contains("SECRET"), "{context}");
        for r in &results[..4] {
            assert!(r["error"].is_string(), "{context}");
        }
        assert_eq!(results[4]["texts"][0], "item open/a", "{context}");
    }
    for peer in [&a, &b] {
        assert!(
            served(peer).iter().all(|u| !u.contains("admin")),
            "{:?}",
            served(peer)
        );
    }
    gateway.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn the_spellings_of_one_resource_share_one_rate_limit_bucket() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let rules = r#"
[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["res://*"]
action = "allow"
rate = { burst = 2, per_second = 0.01, key = "client+tool" }
"#;
    let gateway = TestGateway::start(&[("py", &py.url)], &format!("{}{rules}", clients())).await;
    let url = gateway.url("py");
    for uri in ["res://open/a", "res://open/./a"] {
        let r = modern_read(&url, uri).await;
        assert_eq!(
            r.body["result"]["contents"][0]["text"], "item open/a",
            "{}",
            r.text
        );
    }
    for uri in [
        "res://open/a?1",
        "res://open/a?2",
        "res://open//a",
        "res://open/a#x",
        "res://Open/a",
        "res://open/%61",
        "RES://open/b/../a",
    ] {
        let r = modern_read(&url, uri).await;
        assert_eq!(r.body["error"]["code"], -31009, "{uri}: {}", r.text);
        assert_eq!(r.body["error"]["data"]["resource"], "res://open/a");
    }
    // Another resource has its own bucket.
    let r = modern_read(&url, "res://open/b").await;
    assert_eq!(
        r.body["result"]["contents"][0]["text"], "item open/b",
        "{}",
        r.text
    );
    assert_eq!(
        served(&py),
        ["res://open/a", "res://open/a", "res://open/b"]
    );
    gateway.stop().await;
    py.stop().await;
}
