//! Pins kept on disk and read by the operator's command line: pins survive a restart of the
//! gateway and `portcullis pins approve` releases a held tool; `pins list` shows what a
//! server names and describes its tools with escaped, no terminal control passing through.

use crate::pinning::{calc, code, config, text};
use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::TestGateway;
use support::upstreams::InProcess;

fn portcullis(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(args)
        .output()
        .expect("the portcullis binary runs")
}

fn write_config(dir: &Path, url: &str) -> String {
    let text = config(url, "block", "\"pins.db\"");
    let path = dir.join("portcullis.toml");
    std::fs::write(&path, &text).expect("write config");
    path.to_string_lossy().into_owned()
}

/// The gateway from the file, as `portcullis run` would load it.
async fn start_from(path: &str) -> TestGateway {
    let config = portcullis::config::load(Path::new(path)).expect("config loads");
    support::init();
    TestGateway::from_handle(portcullis::Gateway::start(config).await.expect("starts"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_survive_a_restart_and_the_cli_approves() {
    let dir = tempfile::tempdir().expect("temp dir");
    let before = InProcess::scripted(vec![calc("Adds one to n.", 5)]).await;
    let path = write_config(dir.path(), &before.url);
    let gateway = start_from(&path).await;
    assert_eq!(
        text(&gateway.call("s", "calc", json!({"n": 1})).await),
        "ran"
    );
    gateway.stop().await;
    assert!(
        dir.path().join("pins.db").exists(),
        "the store is beside the config"
    );

    // The server comes back changed; so does the gateway, with the same store.
    let after = InProcess::scripted(vec![calc("Adds one to n, for any n.", 50)]).await;
    let path = write_config(dir.path(), &after.url);
    let gateway = start_from(&path).await;
    let refused = gateway.call("s", "calc", json!({"n": 20})).await;
    assert_eq!(code(&refused), Some("tool_quarantined"), "{refused}");
    assert!(text(&refused).contains(&format!(
        "portcullis pins approve --config {path} --server s --tool calc"
    )));

    // The store trails the running gateway by the writer's next batch.
    let deadline = Instant::now() + Duration::from_secs(5);
    let out = loop {
        let listed = portcullis(&["pins", "list", "--config", &path]);
        assert!(
            listed.status.success(),
            "{}",
            String::from_utf8_lossy(&listed.stderr)
        );
        let out = String::from_utf8_lossy(&listed.stdout).into_owned();
        if out.contains("CHANGED") || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(out.contains("calc") && out.contains("CHANGED"), "{out}");
    assert!(
        out.contains("/inputSchema/properties/n/maximum: 5 → 50"),
        "{out}"
    );

    let wrong = portcullis(&[
        "pins", "approve", "--config", &path, "--server", "s", "--tool", "calc", "--hash", "00",
    ]);
    assert_eq!(wrong.status.code(), Some(2));
    let approved = portcullis(&[
        "pins", "approve", "--config", &path, "--server", "s", "--tool", "calc",
    ]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    // The running gateway picks the approval up from the store.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let result = gateway.call("s", "calc", json!({"n": 20})).await;
        if text(&result) == "ran" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "approval not picked up: {result}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gateway.stop().await;
}

/// What a server names and describes its tools with reaches the operator's
/// terminal escaped: `pins list`, in text and as JSON, holds no terminal
/// control and no line the server wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_list_shows_a_servers_control_characters_escaped() {
    const FORGED: &str = "  lookup       trusted    approved 2026-01-01T00:00:00Z by admin";
    let name = format!("calc\u{1b}]0;owned\u{7}\n{FORGED}\u{9b}2J");
    let description = format!("Adds one.\u{1b}[2J\r\n{FORGED}\u{85}");
    let upstream = InProcess::scripted(vec![json!({"name": name, "description": description,
        "inputSchema": {"type": "object"}})])
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_config(dir.path(), &upstream.url);
    let gateway = start_from(&path).await;
    gateway.list("s").await;

    let deadline = Instant::now() + Duration::from_secs(5);
    let (text, json) = loop {
        let listed = portcullis(&["pins", "list", "--config", &path]);
        let json = portcullis(&["pins", "list", "--config", &path, "--json"]);
        assert!(listed.status.success() && json.status.success());
        let text = String::from_utf8_lossy(&listed.stdout).into_owned();
        let json = String::from_utf8_lossy(&json.stdout).into_owned();
        if text.contains("calc") || Instant::now() > deadline {
            break (text, json);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    gateway.stop().await;
    for out in [&text, &json] {
        assert!(out.contains("calc"), "{out}");
        let raw: Vec<char> = out
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert_eq!(
            raw,
            Vec::<char>::new(),
            "a raw control character reached the terminal: {out}"
        );
        assert!(
            !out.lines().any(|l| l.trim_start().starts_with("lookup")),
            "the server wrote a line of the listing: {out}"
        );
    }
    assert!(
        text.contains(r"calc\u{1b}]0;owned\u{7}\n  lookup"),
        "{text}"
    );
    // The JSON is still the JSON of the pins, the name whole.
    let report: Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(
        report["servers"]["s"]["tools"][0]["name"],
        name.as_str(),
        "{json}"
    );
}
