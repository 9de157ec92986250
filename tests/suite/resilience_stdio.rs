//! A stdio server whose process keeps crashing: restarted with a growing
//! delay up to `[servers.NAME.restart] max_restarts` times in a row, then
//! left down with a state `/readyz` names; its calls get an actionable
//! `upstream_unavailable`, and its breaker then answers for it as for an
//! HTTP server.

use std::time::Duration;

use crate::support;
use serde_json::{Value, json};
use support::{ALICE, Config, TestGateway};

fn call(gw: &TestGateway) -> impl std::future::Future<Output = support::Raw> + '_ {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "anything", "arguments": {}}});
    let auth = format!("Bearer {ALICE}");
    async move {
        support::raw_post(
            &gw.url("crashy"),
            &[("authorization", &auth)],
            body.to_string(),
        )
        .await
    }
}

fn code(r: &support::Raw) -> &str {
    r.body["result"]["_meta"]["portcullis/error"]["code"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_stops_the_restarts_and_the_breaker_answers_for_the_server() {
    let text = Config::new()
        .section("servers.crashy")
        .set("command", vec!["sh", "-c", "echo failing >&2; exit 3"])
        .set("timeout", "2s")
        .set_raw(
            "restart",
            r#"{ min_backoff = "10ms", max_backoff = "40ms", max_restarts = 3 }"#,
        )
        .set_raw("retry", "{ attempts = 1 }")
        .set_raw("breaker", r#"{ failures = 2, cool_down = "1h" }"#)
        .clients()
        .allow_all()
        .render();
    let gw = TestGateway::start_raw(&text).await;
    let mut seen = Value::Null;
    for _ in 0..200 {
        let (status, body) = gw.readyz().await;
        assert_eq!(status, 503, "never ready: {body}");
        if body["servers"]["crashy"]["state"] == "crash_loop" {
            seen = body;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let crashy = &seen["servers"]["crashy"];
    assert_eq!(crashy["state"], "crash_loop", "{seen}");
    assert_eq!(
        crashy["restarts"], 3,
        "three restarts, then no more: {seen}"
    );
    // No more restarts later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, later) = gw.readyz().await;
    assert_eq!(later["servers"]["crashy"]["restarts"], 3, "{later}");

    // Calls are answered at once: what happened, and what to do.
    for _ in 0..2 {
        let r = call(&gw).await;
        assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
        assert_eq!(code(&r), "upstream_unavailable", "{}", r.text);
        assert!(
            r.text.contains("crashed 4 times in a row") && r.text.contains("stopped restarting it"),
            "{}",
            r.text
        );
    }
    // Two failures in a row: its breaker is open, as for an HTTP server.
    let r = call(&gw).await;
    assert_eq!(code(&r), "server_unavailable", "{}", r.text);
    gw.stop().await;
}

#[test]
fn restart_applies_to_stdio_servers_only_and_its_delays_must_grow() {
    for (server, restart, key) in [
        (
            r#"url = "http://127.0.0.1:1/mcp""#,
            "{ max_restarts = 3 }",
            "servers.s.restart",
        ),
        (
            r#"command = ["sh"]"#,
            r#"{ min_backoff = "2s", max_backoff = "1s" }"#,
            "servers.s.restart.max_backoff",
        ),
        (
            r#"command = ["sh"]"#,
            "{ max_restarts = -1 }",
            "servers.s.restart.max_restarts",
        ),
    ] {
        let text = format!("[servers.s]\n{server}\nrestart = {restart}\n");
        let err =
            portcullis::config::load_str(&text, "portcullis.toml", &|_| None).expect_err(restart);
        assert!(err.to_string().contains(key), "{restart}: {err}");
    }
}
