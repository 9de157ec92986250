//! Deadlines and cancellation of tool calls: a tool's own deadline
//! (`[servers.NAME.timeouts]`) ends its call — the stream of a server that
//! keeps going is cut and the server is told to cancel; a client that goes
//! away has its call cancelled at the server; a client's own
//! `notifications/cancelled` stops the gateway sending the call again.

use std::time::{Duration, Instant};

use crate::support;
use serde_json::{Value, json};
use support::tiers::{self, Tier};
use support::*;

fn server(url: &str, extra: &[(&str, &str)]) -> String {
    let mut config = Config::new().server("s", url);
    for (key, value) in extra {
        config = config.set_raw(key, value);
    }
    config.clients().allow_all().render()
}

/// Waits until the server's own record holds `tool`.
async fn ran(peer: &PeerServer, tool: &str) -> Vec<String> {
    for _ in 0..200 {
        let ran = peer.ran();
        if ran.iter().any(|t| t == tool) {
            return ran;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{tool} never ran: {:?}", peer.ran())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_deadline_cuts_a_stream_that_runs_past_it_and_the_server_cancels_the_call() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let peer = PeerServer::start(Peer::Python).await;
    // The tool's own name beats a pattern that also matches it.
    let timeouts = r#"{ "prog*" = "1h", progress = "1s" }"#;
    let gateway = TestGateway::start_raw(&server(&peer.url, &[("timeouts", timeouts)])).await;
    let url = gateway.url("s");
    // 400 progress notifications, one every 50 ms: 20 s of a live stream.
    for mode in [Mode::Legacy, Mode::Modern] {
        let started = Instant::now();
        let results = sdk(
            Sdk::Python,
            mode,
            &url,
            ALICE,
            json!([
                call("progress", json!({"steps": 400})),
                call("echo", json!({"text": "after"})),
            ]),
        )
        .await;
        let context = format!("{mode:?}: {results:#?}");
        assert_eq!(results[0]["isError"], true, "{context}");
        assert_eq!(
            gateway_code(&results[0]),
            Some("upstream_timeout"),
            "{context}"
        );
        let text = results[0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("deadline of this tool"), "{context}");
        assert_eq!(
            results[1]["text"], "after",
            "the next call is served: {context}"
        );
        eprintln!(
            "{mode:?}: the cut call and the next took {:?}",
            started.elapsed()
        );
    }
    // In a session the server heard the cancellation: its tool stopped.
    let ran = ran(&peer, "progress:cancelled").await;
    assert_eq!(
        ran.iter().filter(|t| *t == "progress").count(),
        2,
        "each call ran once: {ran:?}"
    );
    gateway.stop().await;
    peer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_has_its_call_cancelled_at_the_server() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let peer = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start_raw(&server(&peer.url, &[])).await;
    let url = gateway.url("s");
    let alice = format!("Bearer {ALICE}");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    let opened = raw_post(&url, &[("authorization", &alice)], init.to_string()).await;
    let session = opened.headers["mcp-session-id"]
        .to_str()
        .expect("session")
        .to_owned();
    let headers = vec![
        ("authorization", alice.clone()),
        ("mcp-session-id", session.clone()),
        ("mcp-protocol-version", "2025-11-25".to_owned()),
    ];
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    raw_post(&url, &borrow(&headers), initialized.to_string()).await;
    let hang = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "hang", "arguments": {"seconds": 30}}});
    let (call_url, call_headers) = (url.clone(), headers.clone());
    let call =
        tokio::spawn(
            async move { raw_post(&call_url, &borrow(&call_headers), hang.to_string()).await },
        );
    ran(&peer, "hang").await;
    // The client goes away while the tool runs.
    call.abort();
    let ran = ran(&peer, "hang:cancelled").await;
    assert_eq!(ran, ["hang", "hang:cancelled"]);
    gateway.stop().await;
    peer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_cancellation_stops_the_retries_of_its_call() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let mut peer = PeerServer::start(Peer::PythonStateless).await;
    let retry = "{ attempts = 20 }";
    let gateway = TestGateway::start_raw(&server(
        &peer.url,
        &[("retry", retry), ("breaker", "{ failures = 0, ratio = 0 }")],
    ))
    .await;
    let url = gateway.url("s");
    let first = tools_call(&url, ALICE, "echo", json!({"text": "up"}), &[]).await;
    assert_eq!(first.result()["content"][0]["text"], "up");
    // The server is gone: a call that never reaches it is tried again and
    // again, with longer pauses, until the client cancels it.
    peer.kill().await;
    let headers = modern_call_headers(ALICE, "echo");
    let (call_url, call_headers) = (url.clone(), headers.clone());
    let call = tokio::spawn(async move {
        let body = modern_call(77, "echo", json!({"text": "never"}));
        raw_post(&call_url, &borrow(&call_headers), body).await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 77, "reason": "not needed", "_meta": modern_meta()}});
    let cancel_headers = [
        ("authorization", format!("Bearer {ALICE}")),
        ("mcp-protocol-version", "2026-07-28".to_owned()),
        ("mcp-method", "notifications/cancelled".to_owned()),
    ];
    let cancelled = tokio::spawn({
        let url = url.clone();
        async move { raw_post(&url, &borrow(&cancel_headers), cancel.to_string()).await }
    });
    let answered = call.await.expect("the call ends").body["result"].clone();
    assert_eq!(answered["isError"], true, "{answered}");
    drop(cancelled);
    // The audit event: fewer tries than allowed.
    let admin = gateway.admin_url();
    let mut event = Value::Null;
    for _ in 0..100 {
        let events = support::http()
            .get(format!("{admin}/api/events?tool=echo"))
            .send()
            .await
            .expect("events")
            .text()
            .await
            .expect("body");
        let events: Value = serde_json::from_str(&events).expect("JSON");
        event = (events["events"].as_array().into_iter().flatten())
            .find(|e| e["decision"] == "upstream_unavailable")
            .cloned()
            .unwrap_or(Value::Null);
        if !event.is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attempts = event["retries"]["attempts"].as_u64().unwrap_or(1);
    assert!(attempts < 20, "stopped before its last try: {event}");
    eprintln!("tries before the cancellation: {attempts}");
    // Back up: the cancelled call is not sent late.
    peer.restart().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(peer.ran(), ["echo"], "only the first call ran");
    gateway.stop().await;
    peer.stop().await;
}

#[test]
fn a_bad_tool_timeout_is_refused_with_its_key() {
    for (timeouts, key) in [
        (r#"{ echo = "0s" }"#, r#"servers.s.timeouts."echo""#),
        (r#"{ echo = "2d" }"#, r#"servers.s.timeouts."echo""#),
        (r#"{ "" = "1s" }"#, r#"servers.s.timeouts."""#),
    ] {
        let text = server("http://127.0.0.1:1/mcp", &[("timeouts", timeouts)]);
        let err =
            portcullis::config::load_str(&text, "portcullis.toml", &|_| None).expect_err(timeouts);
        assert!(err.to_string().contains(key), "{timeouts}: {err}");
    }
}
