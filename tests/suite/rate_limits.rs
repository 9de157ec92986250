//! Rate limits through the gateway: real SDK clients see the `rate_limited`
//! refusal on the call past the limit and the upstream never runs it; other
//! clients are unaffected; `key = "client"` and `"client+tool"` share buckets
//! as documented; only calls consume, after the access rules and before
//! validation; the refusal carries `Retry-After` and an exact wait.

use crate::support;
use support::tiers::{self, Tier};

use std::time::Duration;

use serde_json::{Value, json};
use support::upstreams::InProcess;
use support::{
    ALICE, BOB, Mode, Peer, PeerServer, Sdk, TestGateway, borrow, call, clients, gateway_code,
    list, modern_call, modern_call_headers, raw_post, sdk,
};

const RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["up"]
tools = ["echo"]
action = "allow"
rate = { burst = 3, per_second = 0.05, key = "client+tool" }

[[rules]]
clients = ["*"]
servers = ["up"]
tools = ["book_flight", "progress"]
action = "allow"
rate = { burst = 2, per_second = 0.01, key = "client" }
"#;

fn text(result: &Value) -> &str {
    result["text"].as_str().unwrap_or_default()
}

fn retry_ms(result: &Value) -> u64 {
    result["meta"]["portcullis/error"]["retry_after_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no retry_after_ms in {result}"))
}

fn count(ran: &[String], tool: &str) -> usize {
    ran.iter().filter(|t| *t == tool).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_clients_get_rate_limited_and_the_upstream_runs_only_what_passed() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let gateway =
        TestGateway::start(&[("up", &server.url)], &format!("{}{RULES}", clients())).await;
    let url = gateway.url("up");

    // alice: lists never consume; three echoes pass, the fourth is refused.
    let ops = json!([
        list(),
        list(),
        list(),
        call("echo", json!({"text": "1"})),
        call("echo", json!({"text": "2"})),
        call("echo", json!({"text": "3"})),
        call("echo", json!({"text": "4"})),
    ]);
    let r = sdk(Sdk::Python, Mode::Modern, &url, ALICE, ops).await;
    for ok in &r[3..6] {
        assert_eq!(ok["isError"], false, "{r:?}");
    }
    let refused = &r[6];
    assert_eq!(refused["isError"], true, "{r:?}");
    assert_eq!(gateway_code(refused), Some("rate_limited"), "{r:?}");
    assert!(
        text(refused).starts_with(
            "Rate limit for `echo` reached for client `alice`: 3 calls, then 1 every 20 s. Retry after "
        ),
        "{r:?}"
    );
    let wait = retry_ms(refused);
    assert!((1..=20_000).contains(&wait), "{wait}");
    let limit = &refused["meta"]["portcullis/error"]["limit"];
    assert_eq!(limit["burst"], 3);
    assert_eq!(limit["key"], "client+tool");
    assert_eq!(limit["rule"], "rules[0]");
    assert_eq!(
        count(&server.ran(), "echo"),
        3,
        "the upstream ran echo only 3 times"
    );

    // bob is unaffected by alice's bucket; his own has three tokens.
    let r = sdk(
        Sdk::Python,
        Mode::Modern,
        &url,
        BOB,
        json!([call("echo", json!({"text": "bob"}))]),
    )
    .await;
    assert_eq!(r[0]["isError"], false, "{r:?}");
    assert_eq!(r[0]["text"], "bob");
    assert_eq!(count(&server.ran(), "echo"), 4);

    // key = "client": book_flight and progress share alice's two tokens, and
    // her echo bucket (empty) does not matter to them.
    let booking =
        json!({"origin": "CDG", "destination": "LHR", "date": "2026-12-01", "passengers": 2});
    let r = sdk(
        Sdk::Python,
        Mode::Modern,
        &url,
        ALICE,
        json!([
            call("book_flight", booking.clone()),
            call("progress", json!({"steps": 1})),
            call("book_flight", booking.clone()),
            call("progress", json!({"steps": 1})),
        ]),
    )
    .await;
    assert_eq!(r[0]["isError"], false, "{r:?}");
    assert_eq!(r[1]["isError"], false, "{r:?}");
    for refused in &r[2..] {
        assert_eq!(gateway_code(refused), Some("rate_limited"), "{r:?}");
        assert!(
            text(refused).contains(
                "for client `alice`: 2 calls, then 1 every 100 s, counted together for `book_flight`, `progress`."
            ),
            "{r:?}"
        );
    }
    assert_eq!(count(&server.ran(), "book_flight"), 1);
    assert_eq!(count(&server.ran(), "progress"), 1);

    // A refusal costs nothing: bob's two invalid bookings (which never reach
    // the upstream) and the tool the rules hide take none of his two tokens,
    // so his valid booking runs.
    let bad =
        json!({"origin": "paris", "destination": "LHR", "date": "2026-12-01", "passengers": 2});
    let r = sdk(
        Sdk::Python,
        Mode::Modern,
        &url,
        BOB,
        json!([
            call("admin_reset", json!({})),
            call("admin_reset", json!({})),
            call("admin_reset", json!({})),
            call("book_flight", bad.clone()),
            call("book_flight", bad),
            call("book_flight", booking),
        ]),
    )
    .await;
    for hidden in &r[..3] {
        assert_eq!(gateway_code(hidden), Some("unknown_tool"), "{r:?}");
    }
    assert_eq!(gateway_code(&r[3]), Some("invalid_arguments"), "{r:?}");
    assert_eq!(gateway_code(&r[4]), Some("invalid_arguments"), "{r:?}");
    assert_eq!(r[5]["isError"], false, "{r:?}");
    assert_eq!(
        count(&server.ran(), "book_flight"),
        2,
        "alice's booking and bob's valid one ran"
    );
    assert_eq!(count(&server.ran(), "admin_reset"), 0);

    gateway.stop().await;
    server.stop().await;
}

/// `key = "all"`: one bucket for every client; the handshake era with a session
/// consumes only on calls as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_bucket_is_shared_by_all_clients() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let rules = r#"
[[rules]]
clients = ["*"]
servers = ["up"]
tools = ["echo"]
action = "allow"
rate = { burst = 2, per_second = 0.01, key = "all" }
"#;
    let gateway =
        TestGateway::start(&[("up", &server.url)], &format!("{}{rules}", clients())).await;
    let url = gateway.url("up");
    let r = sdk(
        Sdk::Python,
        Mode::Legacy,
        &url,
        ALICE,
        json!([list(), call("echo", json!({"text": "a"}))]),
    )
    .await;
    assert_eq!(r[1]["isError"], false, "{r:?}");
    let r = sdk(
        Sdk::Python,
        Mode::Legacy,
        &url,
        BOB,
        json!([
            list(),
            call("echo", json!({"text": "b"})),
            call("echo", json!({"text": "c"}))
        ]),
    )
    .await;
    assert_eq!(r[1]["isError"], false, "{r:?}");
    assert_eq!(gateway_code(&r[2]), Some("rate_limited"), "{r:?}");
    assert!(
        text(&r[2]).starts_with(
            "Rate limit for `echo` reached: 2 calls, then 1 every 100 s, shared by all clients. Retry after "
        ),
        "{r:?}"
    );
    assert_eq!(server.ran(), ["echo", "echo"]);
    gateway.stop().await;
    server.stop().await;
}

/// The HTTP view of a refusal: `Retry-After` in whole seconds (rounded up),
/// the exact wait in `_meta`, and a call made once that wait has passed goes
/// through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refusal_carries_retry_after_and_the_wait_is_enough() {
    let upstream = InProcess::demo().await;
    let rules = r#"
[[rules]]
clients = ["*"]
servers = ["demo"]
tools = ["echo"]
action = "allow"
rate = { burst = 1, per_second = 2.5, key = "client+tool" }
"#;
    let gateway =
        TestGateway::start(&[("demo", &upstream.url)], &format!("{}{rules}", clients())).await;
    let url = gateway.url("demo");
    let owned = modern_call_headers(ALICE, "echo");
    let headers = borrow(&owned);
    let post = || raw_post(&url, &headers, modern_call(1, "echo", json!({"text": "x"})));
    let first = post().await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.body["result"]["isError"],
        Value::Null,
        "{}",
        first.text
    );
    let refused = post().await;
    assert_eq!(refused.status, 200, "an isError result, not an HTTP error");
    let result = &refused.body["result"];
    assert_eq!(result["isError"], true, "{}", refused.text);
    assert_eq!(result["resultType"], "complete");
    let error = &result["_meta"]["portcullis/error"];
    assert_eq!(error["code"], "rate_limited");
    assert_eq!(error["tool"], "echo");
    assert_eq!(error["client"], "alice");
    assert_eq!(error["limit"]["per_second"], 2.5);
    assert_eq!(
        error["limit"]["text"],
        "1 call, then 2.5 per second, per client and tool"
    );
    let wait = error["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!((1..=400).contains(&wait), "{wait}");
    assert_eq!(
        refused
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1"),
        "seconds, rounded up"
    );
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("Rate limit for `echo` reached for client `alice`: 1 call, then 2.5 per second. Retry after 0."),
        "{text}"
    );
    // Waiting what the refusal says is enough (the clock only moves forward).
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let again = post().await;
    assert_eq!(
        again.body["result"]["isError"],
        Value::Null,
        "{}",
        again.text
    );
    assert_eq!(upstream.ran().len(), 2);
    gateway.stop().await;
}

/// `resources/read` and `prompts/get` consume when a rule with a `rate` names
/// them; lists and subscriptions never do. Their refusal is a JSON-RPC error
/// (they have no isError result) with the same details.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_and_prompts_are_limited_by_their_rules() {
    let upstream = InProcess::scripted(vec![]).await;
    let rules = r#"
[[rules]]
clients = ["*"]
servers = ["s"]
resources = ["file:///*"]
prompts = ["greet"]
action = "allow"
rate = { burst = 2, per_second = 0.01, key = "client+tool" }
"#;
    let gateway =
        TestGateway::start(&[("s", &upstream.url)], &format!("{}{rules}", clients())).await;
    let url = gateway.url("s");
    let auth = format!("Bearer {ALICE}");
    let send = |method: &str, params: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
        let url = url.clone();
        let auth = auth.clone();
        async move { raw_post(&url, &[("authorization", auth.as_str())], body.to_string()).await }
    };
    for _ in 0..3 {
        send("resources/list", json!({})).await;
        send("resources/subscribe", json!({"uri": "file:///a"})).await;
        send("prompts/list", json!({})).await;
    }
    let before = upstream.hits();
    for _ in 0..2 {
        let r = send("resources/read", json!({"uri": "file:///a"})).await;
        assert_ne!(r.body["error"]["code"], -31009, "{}", r.text);
    }
    let refused = send("resources/read", json!({"uri": "file:///a"})).await;
    assert_eq!(refused.status, 200);
    assert_eq!(refused.body["error"]["code"], -31009, "{}", refused.text);
    assert_eq!(refused.body["error"]["data"]["code"], "rate_limited");
    assert_eq!(refused.body["error"]["data"]["resource"], "file:///a");
    assert!(
        refused.body["error"]["data"]["retry_after_ms"]
            .as_u64()
            .is_some()
    );
    assert!(refused.headers.contains_key("retry-after"));
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Rate limit for the resource `file:///a` reached for client `alice`: 2 calls, then 1 every 100 s."),
        "{}",
        refused.text
    );
    // Another resource has its own bucket; prompts are limited the same way.
    let other = send("resources/read", json!({"uri": "file:///b"})).await;
    assert_ne!(other.body["error"]["code"], -31009, "{}", other.text);
    for _ in 0..2 {
        let r = send("prompts/get", json!({"name": "greet"})).await;
        assert_ne!(r.body["error"]["code"], -31009, "{}", r.text);
    }
    let refused = send("prompts/get", json!({"name": "greet"})).await;
    assert_eq!(
        refused.body["error"]["data"]["prompt"], "greet",
        "{}",
        refused.text
    );
    // 2 + 1 reads and 2 gets reached the upstream; the refusals did not.
    assert_eq!(upstream.hits() - before, 5);
    gateway.stop().await;
}
