//! The dashboard in a real browser: Debian's headless Chromium, driven by
//! `playwright-core` from `tests/browser/dashboard.mjs`. While the test makes
//! calls through the gateway the live feed shows them, a trace page opens, the
//! overview chart and the config page render, Approve on the tools page
//! releases a quarantined tool, and the feed fits a phone-width window.
//! Screenshots of every page are saved under `$CARGO_TARGET_TMPDIR/dashboard`.
//!
//! Needs `chromium` (`apt-get install -y chromium chromium-driver`) and
//! playwright-core in `$PORTCULLIS_PEERS/browser` (`tests/peers/setup.sh`);
//! fails, never skips, when either is missing.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};
use support::tools_call;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use support::upstreams::InProcess;
use support::{ALICE, TestGateway};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const ADMIN_TOKEN: &str = "dashboard-admin-token";

/// The gateway's result code in a 2026-07-28 call result.
fn code(body: &Value) -> Option<&str> {
    body["result"]["_meta"]["portcullis/error"]["code"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_chromium_shows_calls_and_approves_a_quarantined_tool() {
    if !tiers::ready(&[Tier::Node, Tier::Chromium]) {
        return;
    }
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "Chromium is missing: apt-get install -y chromium chromium-driver (tests/run.sh does)"
    );
    let modules = support::peers_dir().join("browser/node_modules");
    assert!(
        modules.join("playwright-core").is_dir(),
        "playwright-core is missing from {}: run tests/peers/setup.sh",
        modules.display()
    );
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let profile = tempfile::tempdir().expect("profile dir");

    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start_config(
        &Config::new()
            .admin_token(ADMIN_TOKEN)
            .server("demo", &upstream.url)
            .set("timeout", "20s")
            .set("pinning", "block")
            .clients()
            .allow_all(),
    )
    .await;
    let url = gateway.url("demo");

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser/dashboard.mjs");
    let mut node = tokio::process::Command::new("node")
        .arg(&script)
        .arg(gateway.admin_url())
        .arg(ADMIN_TOKEN)
        .arg(&shots)
        .arg(profile.path())
        .env("PORTCULLIS_BROWSER_NODE_MODULES", &modules)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let mut stdin = node.stdin.take().expect("stdin");
    let mut out = BufReader::new(node.stdout.take().expect("stdout")).lines();
    let mut expect = async |word: &str| {
        let line = tokio::time::timeout(Duration::from_secs(60), out.next_line())
            .await
            .unwrap_or_else(|_| panic!("the browser script did not say {word} in time"))
            .expect("read");
        assert_eq!(line.as_deref(), Some(word), "the browser script stopped");
    };

    expect("feed-open").await;
    tools_call(
        &url,
        ALICE,
        "lookup_order",
        json!({"order_id": "ORD-004211"}),
        &[],
    )
    .await;
    tools_call(
        &url,
        ALICE,
        "lookup_order",
        json!({"order_id": "1 OR 1=1"}),
        &[],
    )
    .await;
    let held = tools_call(&url, ALICE, "sync_notes", json!({}), &[])
        .await
        .body;
    assert_eq!(code(&held), Some("tool_quarantined"), "{held}");
    stdin.write_all(b"calls made\n").await.expect("write");

    expect("approved").await;
    let released = tools_call(&url, ALICE, "sync_notes", json!({}), &[])
        .await
        .body;
    assert_eq!(
        code(&released),
        None,
        "Approve released the tool: {released}"
    );
    stdin.write_all(b"checked\n").await.expect("write");

    expect("ok").await;
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), node.wait())
        .await
        .expect("the browser script ends")
        .expect("wait");
    assert!(status.success());
    eprintln!("dashboard screenshots: {}", shots.display());
    gateway.stop().await;
    drop(upstream);
}

/// A DNS rebinding page in Chromium (its local-network checks off) reads
/// nothing from either listener of a gateway without an admin token: every
/// same-origin request it makes under the rebound name gets 403, while the
/// operator's own page on loopback reads the events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_page_in_chromium_reads_nothing() {
    if !tiers::ready(&[Tier::Node, Tier::Chromium]) {
        return;
    }
    let modules = support::peers_dir().join("browser/node_modules");
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists()
            && modules.join("playwright-core").is_dir(),
        "Chromium or playwright-core is missing: run tests/peers/setup.sh"
    );
    let profile = tempfile::tempdir().expect("profile dir");
    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start_config(
        &Config::new()
            .server("demo", &upstream.url)
            .set("pinning", "off")
            .clients()
            .allow_all()
            .section("audit")
            .set("database", ":memory:")
            .set("arguments", "full"),
    )
    .await;
    // Something worth stealing: a call with its arguments in the audit trail.
    let secret = json!({"text": "the arguments a rebinding page wants"});
    assert!(
        code(
            &tools_call(&gateway.url("demo"), ALICE, "echo", secret, &[])
                .await
                .body
        )
        .is_none()
    );
    let port = |url: &str| {
        url.rsplit(':')
            .next()
            .unwrap_or("")
            .split('/')
            .next()
            .unwrap_or("")
            .to_owned()
    };
    let (admin_port, mcp_port) = (
        port(&gateway.admin_url()),
        port(&gateway.url("demo").replace("/mcp/demo", "")),
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser/rebinding.mjs");
    let run = tokio::process::Command::new("node")
        .arg(&script)
        .arg(&admin_port)
        .arg(&mcp_port)
        .arg(profile.path())
        .env("PORTCULLIS_BROWSER_NODE_MODULES", &modules)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser finishes")
        .expect("node runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(text.trim()).expect("one JSON line");
    let attacker = result["attacker"].as_array().expect("attacker results");
    assert_eq!(attacker.len(), 10, "{result}");
    for r in attacker {
        assert_eq!(r[1], 403, "the rebinding page got {r}");
        let body = r[2].as_str().unwrap_or_default();
        assert!(
            body.contains("gateway.allowed_"),
            "refused as rebinding: {r}"
        );
        assert!(
            !body.contains("wants"),
            "nothing of the audit trail leaks: {r}"
        );
    }
    let local = &result["local"][0];
    assert_eq!(
        local[1], 200,
        "the operator's page reads the events: {local}"
    );
    assert!(
        local[2].as_str().unwrap_or_default().contains("events"),
        "{local}"
    );
    gateway.stop().await;
}

/// The operator's approval queue in Chromium: a call held for approval
/// appears with its client and arguments (its terminal control string
/// shown as visible escapes, not deleted), Approve runs it (once, with the
/// tool's own result), and the approval's audit event opens on the trace
/// page. Screenshots under `$CARGO_TARGET_TMPDIR/approvals` (the book's come
/// from here: `docs/src/img/approvals-*.png`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_queue_in_chromium_approves_a_held_call() {
    if !tiers::ready(&[Tier::Node, Tier::Chromium]) {
        return;
    }
    let modules = support::peers_dir().join("browser/node_modules");
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists()
            && modules.join("playwright-core").is_dir(),
        "Chromium or playwright-core is missing: run tests/peers/setup.sh"
    );
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("approvals");
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let profile = tempfile::tempdir().expect("profile dir");
    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start_raw(&format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_sha256 = \"{}\"\n\
         [servers.demo]\nurl = \"{}\"\ntimeout = \"20s\"\npinning = \"off\"\n{}\
         [[rules]]\nclients = [\"*\"]\nservers = [\"demo\"]\ntools = [\"echo\"]\naction = \"allow\"\n\
         approval = {{ by = \"operator\", timeout = \"2m\", reason = \"runs against production\" }}\n",
        hex::encode(portcullis::auth::hash_key(ADMIN_TOKEN)),
        upstream.url,
        support::clients(),
    ))
    .await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser/approvals.mjs");
    let mut node = tokio::process::Command::new("node")
        .arg(&script)
        .arg(gateway.admin_url())
        .arg(ADMIN_TOKEN)
        .arg(&shots)
        .arg(profile.path())
        .env("PORTCULLIS_BROWSER_NODE_MODULES", &modules)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let mut stdin = node.stdin.take().expect("stdin");
    let mut out = BufReader::new(node.stdout.take().expect("stdout")).lines();
    let mut expect = async |word: &str| {
        let line = tokio::time::timeout(Duration::from_secs(60), out.next_line())
            .await
            .unwrap_or_else(|_| panic!("the browser script did not say {word} in time"))
            .expect("read");
        assert_eq!(line.as_deref(), Some(word), "the browser script stopped");
    };
    expect("queue-open").await;
    let url = gateway.url("demo");
    let held = tokio::spawn(async move {
        // A terminal control string: the queue shows it escaped, never deleted.
        let args = json!({"text": "drop the staging table\u{1b}]0;rm -rf /\u{7}"});
        tools_call(&url, ALICE, "echo", args, &[]).await.body
    });
    expect("approved").await;
    let answered = held.await.expect("the held call");
    assert_eq!(code(&answered), None, "{answered}");
    // The reply comes back through the output sanitizer (the control string removed) ...
    assert_eq!(
        answered["result"]["content"][0]["text"],
        "drop the staging table"
    );
    // ... while the server ran exactly what the operator was shown, once.
    let echoes: Vec<_> = upstream
        .ran()
        .into_iter()
        .filter(|(t, _)| t == "echo")
        .collect();
    assert_eq!(echoes.len(), 1, "the approved call ran once");
    assert_eq!(
        echoes[0].1["text"], "drop the staging table\u{1b}]0;rm -rf /\u{7}",
        "the server ran exactly what was shown"
    );
    stdin.write_all(b"checked\n").await.expect("write");
    expect("ok").await;
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), node.wait())
        .await
        .expect("the browser script ends")
        .expect("wait");
    assert!(status.success());
    eprintln!("approval screenshots: {}", shots.display());
    gateway.stop().await;
    drop(upstream);
}
