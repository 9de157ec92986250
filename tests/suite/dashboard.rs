//! The dashboard's JSON API and page on the admin listener: recent events with
//! filters, one event by id, the live feed (server-sent events), the overview
//! and the effective policy; the page itself is served from the binary.

use crate::support;
use support::tools_call;

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use support::upstreams::InProcess;
use support::{ALICE, TestGateway, allow_all, clients};

async fn get(url: &str) -> Value {
    let r = support::http().get(url).send().await.expect("sent");
    assert_eq!(r.status(), 200, "{url}");
    serde_json::from_str(&r.text().await.expect("body")).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_lists_streams_and_summarizes_events() {
    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start(
        &[("demo", &upstream.url)],
        &format!("{}{}", clients(), allow_all()),
    )
    .await;
    let url = gateway.url("demo");
    let admin = gateway.admin_url();

    let page = support::http()
        .get(format!("{admin}/"))
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), 200);
    assert!(
        page.text()
            .await
            .unwrap_or_default()
            .contains("<title>Portcullis</title>")
    );

    // The live feed, opened before the calls.
    let feed = support::http()
        .get(format!("{admin}/api/events/stream?decision=unknown_tool"))
        .send()
        .await
        .expect("feed");
    assert_eq!(feed.headers()["content-type"], "text/event-stream");
    let mut feed = feed.bytes_stream();

    tools_call(
        &url,
        ALICE,
        "lookup_order",
        json!({"order_id": "ORD-004211"}),
        &[],
    )
    .await;
    tools_call(&url, ALICE, "lookup_order", json!({"order_id": "bad"}), &[]).await;
    tools_call(&url, ALICE, "not_a_tool", json!({}), &[]).await;

    let mut seen = String::new();
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = feed.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
            if seen.contains("data: ") && seen.contains("\n\n") && seen.contains("not_a_tool") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "{seen}");
    assert!(
        !seen.contains("invalid_arguments"),
        "the filter holds: {seen}"
    );

    // Events are kept once their response has been sent.
    let mut events = get(&format!("{admin}/api/events")).await;
    for _ in 0..50 {
        if events["events"].as_array().map(Vec::len) == Some(3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
        events = get(&format!("{admin}/api/events")).await;
    }
    let list = events["events"].as_array().expect("list");
    assert_eq!(list.len(), 3, "{events}");
    assert_eq!(list[0]["tool"], "not_a_tool", "newest first");

    let invalid = get(&format!("{admin}/api/events?decision=invalid_arguments")).await;
    let invalid = &invalid["events"][0];
    assert_eq!(invalid["client"], "alice");
    let id = invalid["id"].as_u64().expect("id");
    let one = get(&format!("{admin}/api/events/{id}")).await;
    assert_eq!(one["decision"], "invalid_arguments");
    assert_eq!(one["violations"].as_array().map(Vec::len), Some(1));
    let missing = support::http()
        .get(format!("{admin}/api/events/999999"))
        .send()
        .await
        .expect("sent");
    assert_eq!(missing.status(), 404);

    let o = get(&format!("{admin}/api/overview")).await;
    assert_eq!(o["events"], 3);
    assert_eq!(o["top_clients"][0], json!({"name": "alice", "count": 3}));
    assert_eq!(o["top_refused_tools"][0]["name"], "lookup_order");
    assert!(o["latency_us"]["p99"].as_u64() >= o["latency_us"]["p50"].as_u64());
    let minutes = o["calls_per_minute"].as_array().expect("minutes");
    let total: u64 = minutes
        .iter()
        .flat_map(|m| m["by_decision"].as_object().into_iter().flatten())
        .filter_map(|(_, n)| n.as_u64())
        .sum();
    assert_eq!(total, 3);

    let c = get(&format!("{admin}/api/config")).await;
    assert!(
        c["policy"].as_str().is_some_and(|p| p.contains("demo")),
        "{c}"
    );

    // An open feed ends at shutdown instead of holding the drain up.
    let stopping = std::time::Instant::now();
    gateway.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(3),
        "{:?}",
        stopping.elapsed()
    );
    let rest = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(Ok(_)) = feed.next().await {}
    })
    .await;
    assert!(rest.is_ok(), "the feed ended");
    drop(upstream);
}
