//! Tool definitions an upstream could use against the gateway: external `$ref`s
//! (network and file), catastrophic patterns, deep nesting. Each is refused or
//! validated in bounded time, and the gateway never opens a connection for it.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::upstreams::InProcess;
use support::{TestGateway, allow_all, clients};
use tokio::net::TcpListener;

fn tool(name: &str, schema: Value) -> Value {
    json!({"name": name, "description": "hostile", "inputSchema": schema})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_schemas_are_refused_or_bounded_and_fetch_nothing() {
    // A listener standing where the remote $ref points: it must never be contacted.
    let trap = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let trap_addr = trap.local_addr().expect("addr");
    let contacted = Arc::new(AtomicUsize::new(0));
    let counter = contacted.clone();
    let trap_task = tokio::spawn(async move {
        while let Ok((_conn, _)) = trap.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });

    let mut deep = json!({"type": "string"});
    for _ in 0..50 {
        deep = json!({"allOf": [deep]});
    }
    let upstream = InProcess::scripted(vec![
        tool("remote_ref", json!({"type": "object", "properties": {"a": {"$ref": format!("http://{trap_addr}/schema.json")}}})),
        tool("file_ref", json!({"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}})),
        tool("redos", json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}})),
        tool("deep", json!({"type": "object", "properties": {"d": deep}})),
        tool("odd_dialect", json!({"$schema": "https://evil.example/meta", "type": "object"})),
    ])
    .await;
    let gateway = TestGateway::start(
        &[("evil", &upstream.url)],
        &format!("{}{}", clients(), allow_all()),
    )
    .await;

    for name in ["remote_ref", "file_ref", "deep", "odd_dialect"] {
        let result = gateway
            .call("evil", name, json!({"a": "x", "d": "x"}))
            .await;
        assert_eq!(result["isError"], true, "{name}: {result}");
        assert_eq!(
            result["_meta"]["portcullis/error"]["code"], "tool_quarantined",
            "{name}: {result}"
        );
    }
    let near_miss = format!("{}b", "a".repeat(100_000));
    let result = gateway.call("evil", "redos", json!({"s": near_miss})).await;
    assert_eq!(
        result["_meta"]["portcullis/error"]["code"], "invalid_arguments",
        "{result}"
    );
    let result = gateway.call("evil", "redos", json!({"s": "aaaa"})).await;
    assert_eq!(result["content"][0]["text"], "ran");

    assert_eq!(
        contacted.load(Ordering::SeqCst),
        0,
        "a schema $ref made the gateway connect out"
    );
    assert_eq!(upstream.ran().len(), 1, "only the one valid call ran");
    gateway.stop().await;
    trap_task.abort();
}
