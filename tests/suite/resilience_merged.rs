//! The merged view while one of its servers is down: once that server's
//! circuit breaker opens, its tools are left out of the lists (the gateway's
//! instructions say why), the other server keeps serving clients of both
//! eras, and a client listening for tool list changes is told when the
//! breaker opens and when it closes again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support;
use serde_json::{Value, json};
use support::tiers::{self, Tier};
use support::*;

/// Servers `a` (its breaker opens after one failure) and `b`.
fn merged(a: &str, b: &str) -> String {
    Config::new()
        .server("a", a)
        .set("connect_timeout", "1s")
        .set_raw("retry", "{ attempts = 1 }")
        .set_raw("breaker", r#"{ failures = 1, cool_down = "4s" }"#)
        .server("b", b)
        .clients()
        .allow_all()
        .render()
}

/// Waits until the stream has carried `n` tool list changes.
async fn changes(seen: &Arc<Mutex<String>>, n: usize) -> String {
    for _ in 0..200 {
        let text = seen.lock().expect("lock").clone();
        if text.matches("notifications/tools/list_changed").count() >= n {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{n} tool list changes: {}", seen.lock().expect("lock"))
}

fn tools(listed: &Value) -> Vec<String> {
    (listed["tools"].as_array().into_iter().flatten())
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_merged_view_leaves_a_dead_servers_tools_out_and_says_when_they_are_back() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let mut a = PeerServer::start(Peer::PythonStateless).await;
    let b = PeerServer::start(Peer::PythonStateless).await;
    let gateway = TestGateway::start_raw(&merged(&a.url, &b.url)).await;
    let url = gateway.merged_url();
    let support::Listening { seen, reader } =
        support::listen(&url, ALICE, json!({"toolsListChanged": true})).await;
    let acknowledged = "notifications/subscriptions/acknowledged";
    for _ in 0..200 {
        if seen.lock().expect("lock").contains(acknowledged) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What follows reads this stream: one never acknowledged would prove nothing.
    assert!(
        seen.lock().expect("lock").contains(acknowledged),
        "the listen stream was never acknowledged: {}",
        seen.lock().expect("lock")
    );

    // `a` dies; the first call that finds it gone opens its breaker.
    a.kill().await;
    let down = sdk(
        Sdk::Python,
        Mode::Modern,
        &url,
        ALICE,
        json!([call("a__echo", json!({"text": "down"}))]),
    )
    .await;
    assert_eq!(down[0]["isError"], true, "{down:#?}");
    let opened = changes(&seen, 1).await;
    assert!(
        opened.contains("\"io.modelcontextprotocol/subscriptionId\":\"listen-1\""),
        "tagged with the listen request's id: {opened}"
    );

    // The instructions of a new merged session say why `a` is missing.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    let alice = format!("Bearer {ALICE}");
    let opened = raw_post(&url, &[("authorization", &alice)], init.to_string()).await;
    let instructions = opened.body["result"]["instructions"]
        .as_str()
        .unwrap_or_default();
    assert!(
        instructions.contains("Server `a` is unavailable for now")
            && instructions.contains("the other servers keep serving"),
        "{}",
        opened.text
    );

    // Clients of both eras: `b` serves, `a`'s tools are not listed, a call of
    // one is answered without waiting for a timeout.
    for mode in [Mode::Legacy, Mode::Modern] {
        let results = sdk(
            Sdk::Python,
            mode,
            &url,
            ALICE,
            json!([
                list(),
                call("b__echo", json!({"text": "still here"})),
                call("a__echo", json!({"text": "gone"})),
            ]),
        )
        .await;
        let context = format!("{mode:?}: {results:#?}");
        let listed = tools(&results[0]);
        assert!(listed.contains(&"b__echo".to_owned()), "{context}");
        assert!(
            listed.iter().all(|t| t.starts_with("b__")),
            "a's tools are left out: {context}"
        );
        assert_eq!(results[1]["text"], "still here", "{context}");
        assert_eq!(results[1]["isError"], false, "{context}");
        assert_eq!(results[2]["isError"], true, "{context}");
    }

    // `a` is back: after the cool-down a call is the probe, its success
    // closes the breaker, and the listening client is told.
    a.restart().await;
    let mut answered = false;
    for _ in 0..100 {
        let result = sdk(
            Sdk::Python,
            Mode::Modern,
            &url,
            ALICE,
            json!([call("a__echo", json!({"text": "probe"}))]),
        )
        .await;
        if result[0]["text"] == "probe" {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(answered, "a probe after the cool-down");
    changes(&seen, 2).await;
    let listed = sdk(Sdk::Python, Mode::Modern, &url, ALICE, json!([list()])).await;
    assert!(
        tools(&listed[0]).contains(&"a__echo".to_owned()),
        "{listed:#?}"
    );
    assert_eq!(b.ran(), ["echo", "echo"], "b ran each call sent to it");
    reader.abort();
    gateway.stop().await;
    a.stop().await;
    b.stop().await;
}
