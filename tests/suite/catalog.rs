//! What the gateway knows of a server's tools: every page of a paginated list,
//! and a fresh list after the server says it changed.

use crate::support;

use serde_json::{Value, json};
use support::upstreams::{InProcess, Script};
use support::{TestGateway, clients, modern_meta, raw_post};

fn tool(name: &str, max: i64) -> Value {
    json!({"name": name, "inputSchema": {"type": "object", "properties": {"n": {"type": "integer", "maximum": max}}}})
}

const RULES: &str = "[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"*\"]\naction = \"allow\"\n[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"t3\"]\naction = \"deny\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_is_collected_filtered_and_enforced() {
    let tools: Vec<Value> = (1..=7).map(|i| tool(&format!("t{i}"), i)).collect();
    let upstream = InProcess::scripted_with(Script {
        tools,
        page_size: 2,
        ..Script::default()
    })
    .await;
    let gateway =
        TestGateway::start(&[("s", &upstream.url)], &format!("{}{RULES}", clients())).await;

    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": modern_meta()}}).to_string();
    let headers = [
        ("authorization", "Bearer alice-key"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
    ];
    let r = raw_post(&gateway.url("s"), &headers, body).await;
    let names: Vec<&str> = r.body["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["t1", "t2", "t4", "t5", "t6", "t7"],
        "all four pages, t3 denied"
    );
    assert!(
        r.body["result"].get("nextCursor").is_none(),
        "the client gets one complete page"
    );
    assert_eq!(r.body["result"]["cacheScope"], "private");

    // A tool from the last page is validated against its own schema.
    let refused = gateway.call("s", "t7", json!({"n": 8})).await;
    assert_eq!(
        refused["_meta"]["portcullis/error"]["code"],
        "invalid_arguments"
    );
    assert_eq!(
        gateway.call("s", "t7", json!({"n": 7})).await["content"][0]["text"],
        "ran"
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_list_is_fetched_again() {
    let upstream = InProcess::scripted_with(Script {
        tools: vec![tool("mutate", 100), tool("limit", 5)],
        page_size: 0,
        next_tools: Some(vec![
            tool("mutate", 100),
            tool("limit", 50),
            tool("added", 1),
        ]),
        ..Script::default()
    })
    .await;
    // Pinning would hold the changed `limit` (tests/suite/pinning.rs); this test is about the refresh.
    let gateway = TestGateway::start_pinning(
        &[("s", &upstream.url)],
        Some("off"),
        &format!("{}{RULES}", clients()),
    )
    .await;

    assert_eq!(
        gateway.call("s", "limit", json!({"n": 20})).await["_meta"]["portcullis/error"]["code"],
        "invalid_arguments"
    );
    assert_eq!(
        gateway.call("s", "added", json!({})).await["_meta"]["portcullis/error"]["code"],
        "unknown_tool"
    );
    // The server changes its tools and says so on the call's stream.
    assert_eq!(
        gateway.call("s", "mutate", json!({})).await["content"][0]["text"],
        "ran"
    );
    assert_eq!(
        gateway.call("s", "limit", json!({"n": 20})).await["content"][0]["text"],
        "ran"
    );
    assert_eq!(
        gateway.call("s", "added", json!({})).await["content"][0]["text"],
        "ran"
    );
    let ran: Vec<String> = upstream.ran().into_iter().map(|(n, _)| n).collect();
    assert_eq!(ran, ["mutate", "limit", "added"]);
    gateway.stop().await;
}
