//! Observe mode: every policy and validation decision is made and logged with
//! what enforcement would have done, and the call goes through unchanged;
//! transport checks (credentials, malformed JSON, header/body agreement) stay
//! enforced. The would-be refusal is where operators look: its own column of
//! the audit row, the dashboard's events and overview, and `/metrics`.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};
use support::tools_call;

use std::time::Duration;

use serde_json::{Value, json};
use support::upstreams::InProcess;
use support::{
    ALICE, Mode, Peer, PeerServer, Sdk, TestGateway, borrow, call as op, modern_call,
    modern_call_headers, modern_meta, raw_post, sdk,
};

/// Only `echo` is allowed; `mode` lines go where the caller puts them.
fn config(servers: &str, gateway_mode: &str) -> String {
    Config::new()
        .gateway("mode", gateway_mode)
        .raw(servers)
        .clients()
        .allow(&["echo"])
        .render()
}

fn server(name: &str, url: &str, mode: Option<&str>) -> String {
    let mode = mode
        .map(|m| format!("mode = \"{m}\"\n"))
        .unwrap_or_default();
    format!("[servers.{name}]\nurl = \"{url}\"\ntimeout = \"20s\"\npinning = \"off\"\n{mode}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_lets_refusable_calls_through_and_lists_everything() {
    let up = InProcess::demo().await;
    let gw = TestGateway::start_raw(&config(&server("s", &up.url, None), "observe")).await;
    let url = gw.url("s");
    // Not allowed by the rules, and arguments outside the schema (lines ≤ 100): both pass.
    assert_eq!(
        tools_call(&url, ALICE, "fetch_logs", json!({"lines": 1000}), &[])
            .await
            .refusal(),
        None
    );
    assert_eq!(
        tools_call(&url, ALICE, "echo", json!({"text": 5}), &[])
            .await
            .refusal(),
        None
    );
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
        tools_call(&gw.url("enforced"), ALICE, "echo", bad.clone(), &[])
            .await
            .refusal()
            .as_deref(),
        Some("invalid_arguments")
    );
    assert_eq!(
        tools_call(&gw.url("trial"), ALICE, "echo", bad, &[])
            .await
            .refusal(),
        None
    );
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
    assert_eq!(
        tools_call(&url, ALICE, "echo", json!({"text": 5}), &[])
            .await
            .refusal(),
        None
    );
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

async fn get_json(url: &str) -> Value {
    let text = reqwest::get(url)
        .await
        .expect("the admin listener answers")
        .text()
        .await
        .expect("a body");
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_would_be_refusal_is_in_the_audit_row_the_dashboard_and_the_metrics() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let up = PeerServer::start(Peer::Python).await;
    let dir = tempfile::tempdir().expect("dir");
    let audit = dir.path().join("audit.db");
    let text = config(&server("s", &up.url, None), "observe")
        + &format!("[audit]\ndatabase = {:?}\n", audit.display().to_string());
    let gw = TestGateway::start_raw(&text).await;
    // A real SDK client: a tool the rules do not allow, arguments outside the
    // schema, and a call enforcement would pass.
    let results = sdk(
        Sdk::Python,
        Mode::Legacy,
        &gw.url("s"),
        ALICE,
        json!([
            op("admin_reset", json!({})),
            op("echo", json!({"text": 5})),
            op("echo", json!({"text": "fine"})),
        ]),
    )
    .await;
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(
        up.ran().iter().any(|t| t == "admin_reset"),
        "the call the rules would refuse went through: {:?}",
        up.ran()
    );

    let admin = gw.admin_url();
    let observed = get_json(&format!("{admin}/api/events?would_refuse=*")).await;
    let mut codes: Vec<(String, String)> = observed["events"]
        .as_array()
        .expect("events")
        .iter()
        // A list is observed too (`hidden_from_list`): the calls are the story here.
        .filter(|e| e["method"] == "tools/call")
        .map(|e| {
            // It reached the upstream (whose own answer may be an error).
            assert!(
                ["forwarded", "upstream"].contains(&e["stage"].as_str().unwrap_or("")),
                "{e}"
            );
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (s("tool"), s("would_refuse"))
        })
        .collect();
    codes.sort();
    assert_eq!(
        codes,
        [
            ("admin_reset".to_owned(), "unknown_tool".to_owned()),
            ("echo".to_owned(), "invalid_arguments".to_owned()),
        ]
    );
    let one = get_json(&format!(
        "{admin}/api/events?would_refuse=invalid_arguments"
    ))
    .await;
    assert_eq!(one["events"].as_array().map(Vec::len), Some(1), "{one}");
    let overview = get_json(&format!("{admin}/api/overview")).await;
    let minutes = overview["calls_per_minute"].as_array().expect("minutes");
    let would: u64 = minutes
        .iter()
        .flat_map(|m| m["would_refuse"].as_object().cloned().unwrap_or_default())
        .filter(|(code, _)| code != "hidden_from_list")
        .map(|(_, n)| n.as_u64().unwrap_or(0))
        .sum();
    assert_eq!(would, 2, "{overview}");
    let tools = &overview["top_would_refuse_tools"];
    assert_eq!(tools.as_array().map(Vec::len), Some(2), "{overview}");

    let metrics = reqwest::get(format!("{admin}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for code in ["unknown_tool", "invalid_arguments"] {
        let line = format!("portcullis_observed_refusals_total{{server=\"s\",code=\"{code}\"}} 1");
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }

    gw.stop().await;
    let conn = rusqlite::Connection::open(&audit).expect("audit store");
    let mut q = conn
        .prepare(
            "SELECT tool, stage, would_refuse FROM events WHERE method = 'tools/call' ORDER BY id",
        )
        .expect("query");
    let rows: Vec<(String, String, Option<String>)> = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("read");
    assert_eq!(
        rows,
        [
            (
                "admin_reset".into(),
                "forwarded".into(),
                Some("unknown_tool".into())
            ),
            // The Python SDK server refuses the number itself.
            (
                "echo".into(),
                "upstream".into(),
                Some("invalid_arguments".into())
            ),
            ("echo".into(), "forwarded".into(), None),
        ]
    );
}
