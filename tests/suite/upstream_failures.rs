//! When the upstream fails, a `tools/call` still gets exactly one answer: an
//! `isError` result saying what happened and whether a retry can help.

use crate::support;
use support::Config;

use serde_json::json;
use support::TestGateway;
use support::upstreams::InProcess;

fn config(url: &str, timeout: &str) -> String {
    Config::new()
        .server("s", url)
        .set("timeout", timeout)
        .set("connect_timeout", "1s")
        .clients()
        .allow_all()
        .render()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_reported_as_unavailable() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let gateway =
        TestGateway::start_raw(&config(&format!("http://127.0.0.1:{port}/mcp"), "5s")).await;
    let result = gateway.call("s", "echo", json!({"text": "x"})).await;
    assert_eq!(result["isError"], true);
    assert_eq!(
        result["_meta"]["portcullis/error"]["code"], "upstream_unavailable",
        "{result}"
    );
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("Retrying later may help"),
        "{result}"
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_tool_times_out_with_retry_advice() {
    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start_raw(&config(&upstream.url, "1s")).await;
    let result = gateway.call("s", "slow_query", json!({"seconds": 3})).await;
    assert_eq!(
        result["_meta"]["portcullis/error"]["code"], "upstream_timeout",
        "{result}"
    );
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("may still have run"),
        "{result}"
    );
    assert_eq!(result["resultType"], "complete");
    // The gateway is still serving.
    assert_eq!(
        gateway
            .call("s", "echo", json!({"text": "still here"}))
            .await["content"][0]["text"],
        "still here"
    );
    gateway.stop().await;
}
