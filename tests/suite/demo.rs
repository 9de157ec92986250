//! `portcullis demo` is what a newcomer runs first: it must answer a real
//! client's list and call with no Python or Node needed by the demo itself.

use crate::support;
use support::tiers::{self, Tier};

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use support::{Mode, Sdk, call, list, sdk};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_answers_a_real_client() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let mut demo = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["demo", "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the demo starts");
    let stdout = demo.stdout.take().expect("stdout");
    let (dashboard, url) = tokio::time::timeout(Duration::from_secs(30), async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut dashboard = None;
        while let Ok(Some(line)) = lines.next_line().await {
            // The page most people want to open comes first.
            if let Some(rest) = line.trim().strip_prefix("Dashboard") {
                dashboard = rest.split_whitespace().next().map(str::to_owned);
            }
            if let Some(rest) = line.trim().strip_prefix("MCP endpoint") {
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                return Some((dashboard?, rest.trim().to_owned()));
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("the demo prints its dashboard, then its MCP endpoint");
    support::init();
    let page = support::http()
        .get(&dashboard)
        .send()
        .await
        .expect("the dashboard answers");
    assert_eq!(page.status().as_u16(), 200, "{dashboard}");
    assert!(
        page.text().await.unwrap_or_default().contains("<html"),
        "{dashboard} serves the dashboard page"
    );
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp/demo"),
        "{url}"
    );

    for mode in [Mode::Legacy, Mode::Modern] {
        let r = sdk(
            Sdk::Python,
            mode,
            &url,
            portcullis::demo::ANALYST_KEY,
            json!([
                list(),
                call("lookup_order", json!({"order_id": "ORD-004211"})),
                call("lookup_order", json!({"order_id": "1 OR 1=1"})),
                call("delete_record", json!({"record_id": "42"})),
                call("fetch_logs", json!({"lines": 6})),
                call("generate_report", json!({"month": "2026-07"})),
            ]),
        )
        .await;
        let tools = r[0]["tools"].as_array().expect("tools");
        assert!(
            tools.contains(&json!("lookup_order")) && !tools.contains(&json!("delete_record")),
            "{r:?}"
        );
        assert!(
            r[1]["text"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Order ORD-004211"),
            "{r:?}"
        );
        assert_eq!(
            support::gateway_code(&r[2]),
            Some("invalid_arguments"),
            "{r:?}"
        );
        assert_eq!(support::gateway_code(&r[3]), Some("unknown_tool"), "{r:?}");
        // The leaky log comes out clean: no escapes, no zero-width space, no secrets.
        let logs = r[4]["text"].as_str().unwrap_or_default();
        for leak in [
            "\u{1b}",
            "\u{7}",
            "\u{200b}",
            "evil.example",
            "AKIAZ7QWERTYUIOPASDF",
            "hunter2-demo",
        ] {
            assert!(!logs.contains(leak), "{leak:?} in {logs:?}");
        }
        assert!(logs.contains("ERROR db: connection reset by peer; reconnecting with password=[REDACTED:generic-secret]"), "{logs}");
        assert!(
            logs.contains("static key [REDACTED:aws-access-key-id]"),
            "{logs}"
        );
        assert!(logs.contains("user admin signed in"), "{logs}");
        // The opaque failure is explained.
        assert_eq!(
            support::gateway_code(&r[5]),
            Some("upstream_tool_failed"),
            "{r:?}"
        );
        assert!(
            r[5]["text"]
                .as_str()
                .unwrap_or_default()
                .contains("failed without saying why"),
            "{r:?}"
        );
    }
    let r = sdk(
        Sdk::TypeScript,
        Mode::Legacy,
        &url,
        portcullis::demo::ADMIN_KEY,
        json!([call("delete_record", json!({"record_id": "42"}))]),
    )
    .await;
    assert_eq!(r[0]["text"], "deleted 42", "{r:?}");
    let _ = demo.kill().await;
}
