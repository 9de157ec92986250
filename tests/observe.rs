//! Observe mode: every policy and validation decision is made and logged with
//! what enforcement would have done, and the call goes through unchanged;
//! transport checks (credentials, malformed JSON, header/body agreement) stay
//! enforced.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::upstreams::InProcess;
use support::{
    ALICE, TestGateway, borrow, clients, modern_call, modern_call_headers, modern_meta, raw_post,
};

/// Only `echo` is allowed; `mode` lines go where the caller puts them.
fn config(servers: &str, gateway_mode: &str) -> String {
    format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nmode = \"{gateway_mode}\"\n\
         {servers}{}[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"echo\"]\naction = \"allow\"\n",
        clients()
    )
}

fn server(name: &str, url: &str, mode: Option<&str>) -> String {
    let mode = mode
        .map(|m| format!("mode = \"{m}\"\n"))
        .unwrap_or_default();
    format!("[servers.{name}]\nurl = \"{url}\"\ntimeout = \"20s\"\npinning = \"off\"\n{mode}")
}

/// The gateway's refusal code for a call, `None` when it went through.
async fn call(url: &str, name: &str, args: Value) -> Option<String> {
    let headers = modern_call_headers(ALICE, name);
    let r = raw_post(url, &borrow(&headers), modern_call(1, name, args)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.body["result"]["_meta"]["portcullis/error"]["code"]
        .as_str()
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_lets_refusable_calls_through_and_lists_everything() {
    let up = InProcess::demo().await;
    let gw = TestGateway::start_raw(&config(&server("s", &up.url, None), "observe")).await;
    let url = gw.url("s");
    // Not allowed by the rules, and arguments outside the schema (lines ≤ 100): both pass.
    assert_eq!(call(&url, "fetch_logs", json!({"lines": 1000})).await, None);
    assert_eq!(call(&url, "echo", json!({"text": 5})).await, None);
    let ran: Vec<String> = up.ran().into_iter().map(|(t, _)| t).collect();
    assert_eq!(ran, ["fetch_logs", "echo"]);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": modern_meta()}});
    let headers = [
        ("authorization", "Bearer alice-key"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
    ];
    let r = raw_post(&url, &headers, body.to_string()).await;
    let listed = r.body["result"]["tools"].as_array().map_or(0, Vec::len);
    assert!(listed > 1, "every tool is listed: {}", r.text);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_checks_stay_enforced_in_observe_mode() {
    let up = InProcess::demo().await;
    let gw = TestGateway::start_raw(&config(&server("s", &up.url, None), "observe")).await;
    let url = gw.url("s");
    let headers = modern_call_headers(ALICE, "echo");
    let body = modern_call(1, "echo", json!({"text": "hi"}));
    // No credentials: 401.
    let r = raw_post(
        &url,
        &[("mcp-protocol-version", "2026-07-28")],
        body.clone(),
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.text);
    // Malformed JSON: 400.
    assert_eq!(
        raw_post(&url, &borrow(&headers), "{not json").await.status,
        400
    );
    // Mcp-Name says another tool than the body: refused.
    let wrong = modern_call_headers(ALICE, "fetch_logs");
    let r = raw_post(&url, &borrow(&wrong), body).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(up.ran().is_empty(), "nothing reached the server");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_can_observe_while_the_gateway_enforces() {
    let up = InProcess::demo().await;
    let servers = format!(
        "{}{}",
        server("enforced", &up.url, None),
        server("trial", &up.url, Some("observe"))
    );
    let gw = TestGateway::start_raw(&config(&servers, "enforce")).await;
    let bad = json!({"text": 5});
    assert_eq!(
        call(&gw.url("enforced"), "echo", bad.clone())
            .await
            .as_deref(),
        Some("invalid_arguments")
    );
    assert_eq!(call(&gw.url("trial"), "echo", bad).await, None);
    assert_eq!(up.ran().len(), 1, "only the observed call ran");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_says_what_enforcement_would_have_done() {
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("portcullis.toml");
    let text = config(&server("s", &up.url, None), "observe") + "[pins]\ndatabase = \":memory:\"\n";
    std::fs::write(&path, text).expect("write");
    let mut child = support::run_binary(&path, &[]);
    let (mcp, _, mut log) = support::listening_log(&mut child).await;
    let url = format!("http://{mcp}/mcp/s");
    assert_eq!(call(&url, "echo", json!({"text": 5})).await, None);
    let line = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = log.recv().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && v["message"] == "request"
                && v["tool"] == "echo"
            {
                return v;
            }
        }
        Value::Null
    })
    .await
    .expect("a request line is logged");
    assert_eq!(line["would_refuse"], "invalid_arguments", "{line}");
    assert_eq!(line["mode"], "observe", "{line}");
    assert_eq!(line["outcome"], "forwarded", "{line}");
    let _ = child.kill().await;
}
