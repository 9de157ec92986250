//! Graceful shutdown of the real binary: SIGTERM stops accepting at once, lets
//! a call in flight finish and exits 0; past `shutdown_grace` it exits anyway,
//! and the call it cut off sees its connection end.
//!
//! Each test asserts the outcome its name states: the in-flight call's own
//! result (the tool's text, not only a 200), a connection refused after the
//! signal, the exit code, and for the cut-off call a transport error rather
//! than any answer.

use crate::support;
use support::Config;

use std::time::Duration;

use serde_json::json;
use support::upstreams::InProcess;
use support::{ALICE, borrow, modern_call, modern_call_headers, raw_post};

/// Starts `portcullis run` in front of `url` with `shutdown_grace = grace`;
/// returns the process and its MCP address.
async fn start(dir: &std::path::Path, url: &str, grace: &str) -> (tokio::process::Child, String) {
    support::init();
    let path = dir.join("portcullis.toml");
    let text = Config::new()
        .gateway("shutdown_grace", grace)
        .server("s", url)
        .set("timeout", "20s")
        .set("pinning", "off")
        .clients()
        .allow_all()
        .section("pins")
        .set("database", ":memory:")
        .render();
    std::fs::write(&path, text).expect("write");
    let mut child = support::run_binary(&path, &[]);
    let (mcp, _) = support::listening(&mut child).await;
    (child, mcp)
}

fn slow_call(mcp: &str, seconds: u64) -> tokio::task::JoinHandle<support::Raw> {
    let url = format!("http://{mcp}/mcp/s");
    tokio::spawn(async move {
        let headers = modern_call_headers(ALICE, "slow_query");
        raw_post(
            &url,
            &borrow(&headers),
            modern_call(1, "slow_query", json!({"seconds": seconds})),
        )
        .await
    })
}

/// The same call, keeping a transport failure as the outcome instead of
/// panicking on it: `Err` when the connection ended without a whole reply.
fn cut_call(mcp: &str, seconds: u64) -> tokio::task::JoinHandle<Result<(u16, String), String>> {
    let url = format!("http://{mcp}/mcp/s");
    tokio::spawn(async move {
        let mut request = support::http()
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (name, value) in modern_call_headers(ALICE, "slow_query") {
            request = request.header(name, value);
        }
        let body = modern_call(1, "slow_query", json!({"seconds": seconds}));
        let response = request.body(body).send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| e.to_string())?;
        Ok((status, text))
    })
}

/// Polls until a new connection to `addr` is refused; false if it is still
/// accepted after a few seconds.
async fn refuses_connections(addr: &str) -> bool {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn sigterm(child: &tokio::process::Child) {
    support::signal(child.id().expect("pid").into(), "TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_call_in_flight_finish_and_refuses_new_connections() {
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let (mut child, mcp) = start(dir.path(), &up.url, "10s").await;
    let in_flight = slow_call(&mcp, 2);
    // SIGTERM once the call has reached the upstream (it records a call as it starts).
    for _ in 0..200 {
        if !up.ran().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(up.ran().len(), 1, "the call is in flight");
    sigterm(&child);
    assert!(
        refuses_connections(&mcp).await,
        "a new connection is refused once SIGTERM arrived"
    );
    let reply = in_flight.await.expect("task");
    assert_eq!(reply.status, 200, "{}", reply.text);
    let result = &reply.body["result"];
    assert!(result["isError"] != true, "{}", reply.text);
    assert!(
        result["_meta"]["portcullis/error"].is_null(),
        "{}",
        reply.text
    );
    // The tool's own answer, written when its work was done: the call finished.
    assert!(
        result["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("Query finished in 2")),
        "{}",
        reply.text
    );
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the process exits")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    assert_eq!(up.ran().len(), 1, "the slow call ran once, to its end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_grace_the_process_still_exits() {
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let (mut child, mcp) = start(dir.path(), &up.url, "1s").await;
    let in_flight = cut_call(&mcp, 8);
    for _ in 0..200 {
        if !up.ran().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(up.ran().len(), 1, "the call is in flight");
    sigterm(&child);
    // The 8 s call cannot finish: only the 1 s grace lets the process exit this soon.
    let status = tokio::time::timeout(Duration::from_secs(6), child.wait())
        .await
        .expect("the process exits once the grace is over, not when the call ends")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    // The client whose call was cut off sees its connection end: neither a
    // hang nor an answer.
    let cut = tokio::time::timeout(Duration::from_secs(5), in_flight)
        .await
        .expect("the cut-off call returns")
        .expect("the client task does not panic");
    assert!(
        cut.is_err(),
        "the cut-off call got an answer instead of a closed connection: {cut:?}"
    );
}
