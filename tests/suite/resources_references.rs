//! URIs a client names outside `resources/read` — the subscriptions of a
//! 2026 `subscriptions/listen` and the `ref/resource` of a
//! `completion/complete` — are decided and forwarded in their canonical form,
//! like every other URI: a spelling of a denied resource is refused, a
//! spelling that changes structure is refused before anything is sent, and
//! what the server receives is the URI that was decided.

use crate::support;
use support::Config;

use std::time::Duration;

use serde_json::{Value, json};
use support::misbehaving::Misbehaving;
use support::{ALICE, Raw, TestGateway, modern_meta, raw_post};

/// Everyone may read `users://` resources, except the admin's.
const RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["users://*"]
action = "allow"

[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["users://admin/*"]
action = "deny"
"#;

async fn post(url: &str, method: &str, params: Value) -> Raw {
    let mut params = params;
    params["_meta"] = modern_meta();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let auth = format!("Bearer {ALICE}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", method),
    ];
    // A stream that stays open (a forwarded listen) fails the test, never hangs it.
    tokio::time::timeout(
        Duration::from_secs(30),
        raw_post(url, &headers, body.to_string()),
    )
    .await
    .unwrap_or_else(|_| panic!("{method} was answered with a stream that stays open"))
}

fn listen(uris: &[&str]) -> Value {
    json!({"notifications": {"resourceSubscriptions": uris}})
}

fn complete(uri: &str) -> Value {
    json!({"ref": {"type": "ref/resource", "uri": uri},
           "argument": {"name": "user_id", "value": "b"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_and_completion_uris_are_canonical() {
    let up = Misbehaving::start().await;
    let config = Config::new()
        .server("s", &up.url)
        .clients()
        .raw(RULES)
        .render();
    let gateway = TestGateway::start_raw(&config).await;
    let url = gateway.url("s");

    // Spellings of the denied resource: hidden, as a missing one is.
    for (method, params) in [
        ("subscriptions/listen", listen(&["users://%61dmin/profile"])),
        ("subscriptions/listen", listen(&["USERS://admin/profile"])),
        ("completion/complete", complete("users://%61dmin/profile")),
    ] {
        let r = post(&url, method, params.clone()).await;
        assert!(
            r.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("Resource not found")),
            "{method} {params}: {}",
            r.text
        );
    }
    // A spelling that changes structure: refused, whatever the rules say.
    let r = post(
        &url,
        "subscriptions/listen",
        listen(&["users://bob%2F..%2Fadmin/profile"]),
    )
    .await;
    assert!(r.body["error"].is_object(), "{}", r.text);
    assert!(
        !up.received("admin"),
        "nothing about the denied resource reached the server"
    );

    // Allowed spellings reach the server as the URI that was decided.
    post(
        &url,
        "subscriptions/listen",
        listen(&["users://%62ob/profile"]),
    )
    .await;
    post(
        &url,
        "completion/complete",
        complete("USERS://carol/profile"),
    )
    .await;
    assert!(
        up.received("users://bob/profile"),
        "the canonical URI is forwarded"
    );
    assert!(
        up.received("users://carol/profile"),
        "the canonical URI is forwarded"
    );
    assert!(
        !up.received("%62ob") && !up.received("USERS://"),
        "no client spelling is forwarded"
    );
    gateway.stop().await;
}

/// Conditions on resource rules decide a `subscriptions/listen` and a
/// `completion/complete` with the method as received and the canonical
/// URI: a URI the client's list would hide is answered as a missing one; a
/// listed one a condition over the method refuses gets `call_not_permitted`
/// (-31022) naming the rule; neither reaches the server, while the same URI
/// completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_and_completion_are_decided_with_their_method_and_uri() {
    let up = Misbehaving::start().await;
    let rules = r#"
[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["users://*"]
action = "allow"
when = "uri.startsWith('users://' + client + '/')"

[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["users://alice/private*"]
action = "deny"
when = "method == 'subscriptions/listen'"
"#;
    let config = Config::new()
        .server("s", &up.url)
        .clients()
        .raw(rules)
        .render();
    let gateway = TestGateway::start_raw(&config).await;
    let url = gateway.url("s");
    for (method, params) in [
        ("subscriptions/listen", listen(&["users://bob/profile"])),
        ("completion/complete", complete("USERS://bob/profile")),
    ] {
        let r = post(&url, method, params.clone()).await;
        assert!(
            r.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("Resource not found")),
            "{method} {params}: {}",
            r.text
        );
    }
    let r = post(
        &url,
        "subscriptions/listen",
        listen(&["users://alice/%70rivate"]),
    )
    .await;
    let error = &r.body["error"];
    assert_eq!(error["code"], -31022, "{}", r.text);
    assert_eq!(error["data"]["code"], "call_not_permitted", "{}", r.text);
    assert_eq!(error["data"]["rule"], "rules[1]", "{}", r.text);
    assert_eq!(
        error["data"]["method"], "subscriptions/listen",
        "{}",
        r.text
    );
    assert_eq!(
        error["data"]["resource"], "users://alice/private",
        "{}",
        r.text
    );
    assert!(
        !up.received("users://alice/private") && !up.received("users://bob"),
        "nothing refused reached the server"
    );
    post(
        &url,
        "completion/complete",
        complete("users://alice/private"),
    )
    .await;
    assert!(
        up.received("users://alice/private"),
        "the completion reached the server"
    );
    gateway.stop().await;
}

/// Observe mode decides a `subscriptions/listen` through the merged view as
/// it does on one server: a URI the rules would hide is recorded, not
/// refused, and every member is asked for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_forwards_a_merged_listen_the_rules_would_refuse() {
    let (a, b) = (Misbehaving::start().await, Misbehaving::start().await);
    let config = Config::new()
        .gateway("mode", "observe")
        .server("a", &a.url)
        .server("b", &b.url)
        .clients()
        .raw(RULES)
        .render();
    let gateway = TestGateway::start_raw(&config).await;
    for url in [gateway.url("a"), gateway.merged_url()] {
        let r = post(
            &url,
            "subscriptions/listen",
            listen(&["users://admin/profile"]),
        )
        .await;
        // The test server knows no listen: its own answer, not the gateway's refusal.
        assert!(!r.text.contains("Resource not found"), "{url}: {}", r.text);
    }
    assert!(
        a.received("users://admin/profile"),
        "forwarded on one server"
    );
    assert!(b.received("users://admin/profile"), "and to every member");
    gateway.stop().await;
}
