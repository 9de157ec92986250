//! Hot reload: a rewritten file, SIGHUP on the real binary and `POST /api/reload`
//! each swap the policy in whole; a broken file is refused and the old policy
//! stays; a call in flight finishes under the configuration it started with.

use crate::support;
use support::tools_call;
use support::{Admin, Config};

use std::path::{Path, PathBuf};
use std::time::Duration;

use portcullis::Gateway;
use serde_json::{Value, json};
use support::upstreams::InProcess;
use support::{ALICE, TestGateway, raw_post};

const ADMIN_TOKEN: &str = "reload-admin-token";

/// A whole configuration that lets everyone call `tools` on server `s`.
fn config(url: &str, tools: &[&str]) -> String {
    Config::new()
        .admin_token(ADMIN_TOKEN)
        .server("s", url)
        .set("timeout", "20s")
        .set("pinning", "off")
        .clients()
        .allow(tools)
        .section("pins")
        .set("database", ":memory:")
        .render()
}

/// Replaces the file the way editors and Kubernetes do: write aside, rename over.
fn replace(path: &Path, text: &str) {
    let aside = path.with_extension("toml.tmp");
    std::fs::write(&aside, text).expect("write");
    std::fs::rename(&aside, path).expect("rename");
}

async fn start(dir: &Path, text: &str) -> (TestGateway, PathBuf) {
    support::init();
    let path = dir.join("portcullis.toml");
    std::fs::write(&path, text).expect("write");
    let handle = Gateway::start_file(&path).await.expect("gateway starts");
    (TestGateway::from_handle(handle), path)
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

async fn admin(base: &str, method: reqwest::Method, token: Option<&str>) -> (u16, Value) {
    Admin::at(base, token)
        .request(method, "/api/reload", None)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_file_changes_the_policy_and_a_broken_one_is_refused() {
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let (gw, path) = start(dir.path(), &config(&up.url, &["echo"])).await;
    let mcp = gw.url("s");
    let slow = json!({"seconds": 0});
    assert_eq!(
        tools_call(&mcp, ALICE, "slow_query", slow.clone(), &[])
            .await
            .refusal()
            .as_deref(),
        Some("unknown_tool")
    );

    replace(&path, &config(&up.url, &["echo", "slow_query"]));
    until("the new policy allows slow_query", async || {
        tools_call(&mcp, ALICE, "slow_query", slow.clone(), &[])
            .await
            .refusal()
            .is_none()
    })
    .await;

    replace(&path, "[servers.s]\nurl = 42\n");
    let base = gw.admin_url();
    until("the broken file is refused", async || {
        admin(&base, reqwest::Method::GET, Some(ADMIN_TOKEN))
            .await
            .1["ok"]
            == false
    })
    .await;
    let (_, status) = admin(&base, reqwest::Method::GET, Some(ADMIN_TOKEN)).await;
    assert!(
        status["error"]
            .as_str()
            .unwrap_or("")
            .contains("portcullis.toml"),
        "{status}"
    );
    assert!(status["refused"].as_u64() >= Some(1), "{status}");
    // The last good policy is still in force.
    assert_eq!(
        tools_call(&mcp, ALICE, "slow_query", slow, &[])
            .await
            .refusal(),
        None
    );
    assert_eq!(
        tools_call(&mcp, ALICE, "echo", json!({"text": "hi"}), &[])
            .await
            .refusal(),
        None
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reloads_with_the_admin_token_and_refuses_what_cannot_change() {
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let (gw, path) = start(dir.path(), &config(&up.url, &["echo"])).await;
    let (mcp, base) = (gw.url("s"), gw.admin_url());
    assert_eq!(admin(&base, reqwest::Method::POST, None).await.0, 401);
    assert_eq!(
        admin(&base, reqwest::Method::POST, Some("wrong")).await.0,
        401
    );

    let moved = config(&up.url, &["echo", "fetch_logs"]).replace(
        "listen = \"127.0.0.1:0\"\nadmin",
        "listen = \"127.0.0.1:1\"\nadmin",
    );
    std::fs::write(&path, moved).expect("write");
    let (status, body) = admin(&base, reqwest::Method::POST, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["ok"], false);
    let error = body["error"].as_str().unwrap_or("");
    assert!(
        error.contains("gateway.listen") && error.contains("cannot change on reload"),
        "{error}"
    );
    let args = json!({"lines": 1});
    assert_eq!(
        tools_call(&mcp, ALICE, "fetch_logs", args.clone(), &[])
            .await
            .refusal()
            .as_deref(),
        Some("unknown_tool")
    );

    std::fs::write(&path, config(&up.url, &["echo", "fetch_logs"])).expect("write");
    let (status, body) = admin(&base, reqwest::Method::POST, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], true);
    assert!(body["at"].is_string() && body["error"].is_null(), "{body}");
    assert_eq!(
        tools_call(&mcp, ALICE, "fetch_logs", args, &[])
            .await
            .refusal(),
        None
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_finishes_under_the_config_it_started_with() {
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let (gw, path) = start(dir.path(), &config(&up.url, &["echo", "slow_query"])).await;
    let (mcp, base) = (gw.url("s"), gw.admin_url());
    let slow = json!({"seconds": 2});
    let in_flight = tokio::spawn({
        let (mcp, slow) = (mcp.clone(), slow.clone());
        async move {
            tools_call(&mcp, ALICE, "slow_query", slow, &[])
                .await
                .refusal()
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    std::fs::write(&path, config(&up.url, &["echo"])).expect("write");
    let (status, body) = admin(&base, reqwest::Method::POST, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !in_flight.is_finished(),
        "the slow call was still running at the reload"
    );
    // New calls see the new policy; the one in flight finishes under the old.
    assert_eq!(
        tools_call(&mcp, ALICE, "slow_query", slow, &[])
            .await
            .refusal()
            .as_deref(),
        Some("unknown_tool")
    );
    assert_eq!(in_flight.await.expect("task"), None);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_running_binary() {
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("portcullis.toml");
    std::fs::write(&path, config(&up.url, &["echo"])).expect("write");
    let mut child = support::run_binary(&path, &["--no-watch"]);
    let (mcp, admin_addr) = support::listening(&mut child).await;
    let mcp = format!("http://{mcp}/mcp/s");
    let args = json!({"lines": 1});
    assert_eq!(
        tools_call(&mcp, ALICE, "fetch_logs", args.clone(), &[])
            .await
            .refusal()
            .as_deref(),
        Some("unknown_tool")
    );

    std::fs::write(&path, config(&up.url, &["echo", "fetch_logs"])).expect("write");
    support::signal(child.id().expect("pid").into(), "HUP");
    until("SIGHUP applied the new policy", async || {
        tools_call(&mcp, ALICE, "fetch_logs", args.clone(), &[])
            .await
            .refusal()
            .is_none()
    })
    .await;
    let (_, status) = admin(
        &format!("http://{admin_addr}"),
        reqwest::Method::GET,
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(status["trigger"], "sighup", "{status}");
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_every_request_sees_one_whole_policy_and_none_fails() {
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let a = config(&up.url, &["echo"]);
    let b = config(&up.url, &["fetch_logs", "slow_query"]);
    let (gw, path) = start(dir.path(), &a).await;
    let (mcp, base) = (gw.url("s"), gw.admin_url());
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flipped = std::sync::Arc::new(AtomicUsize::new(0));
    let flipper = tokio::spawn({
        let (stop, flipped, base) = (stop.clone(), flipped.clone(), base.clone());
        async move {
            let mut flips = 0;
            while !stop.load(Ordering::Relaxed) {
                let text = if flips % 2 == 0 { &b } else { &a };
                std::fs::write(&path, text).expect("write");
                let (status, body) = admin(&base, reqwest::Method::POST, Some(ADMIN_TOKEN)).await;
                assert_eq!(status, 200, "{body}");
                flips += 1;
                flipped.store(flips, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            flips
        }
    });
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
        "params": {"_meta": support::modern_meta()}})
    .to_string();
    let headers = [
        ("authorization", "Bearer alice-key"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
    ];
    let (mut seen_a, mut seen_b) = (0, 0);
    // Bounded by what is seen, not by the clock: at least six reloads and
    // both policies served; the deadline only stops a run that never gets there.
    let started = std::time::Instant::now();
    while (flipped.load(Ordering::Relaxed) < 6 || seen_a == 0 || seen_b == 0)
        && started.elapsed() < Duration::from_secs(120)
    {
        let r = raw_post(&mcp, &headers, body.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let mut names: Vec<String> = r.body["result"]["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        match names
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["echo"] => seen_a += 1,
            ["fetch_logs", "slow_query"] => seen_b += 1,
            other => panic!("a list decided by no single policy: {other:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let flips = flipper.await.expect("flipper");
    assert!(flips >= 6, "only {flips} reloads in two minutes");
    assert!(seen_a > 0 && seen_b > 0, "a {seen_a}, b {seen_b}");
    gw.stop().await;
}

/// A reload keeps the buckets of rules it did not change, and a changed
/// rate starts a bucket of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_buckets_of_unchanged_rules() {
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let limited = "[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"slow_query\"]\naction = \"allow\"\n\
                   rate = { burst = 2, per_second = 0.001, key = \"client\" }\n";
    let first = format!("{}{limited}", config(&up.url, &["echo"]));
    let (gw, path) = start(dir.path(), &first).await;
    let (mcp, base) = (gw.url("s"), gw.admin_url());
    let slow = json!({"seconds": 0});
    assert_eq!(
        tools_call(&mcp, ALICE, "slow_query", slow.clone(), &[])
            .await
            .refusal(),
        None
    );
    assert_eq!(
        tools_call(&mcp, ALICE, "slow_query", slow.clone(), &[])
            .await
            .refusal(),
        None
    );
    assert_eq!(
        tools_call(&mcp, ALICE, "slow_query", slow.clone(), &[])
            .await
            .refusal()
            .as_deref(),
        Some("rate_limited")
    );

    // Another rule changes; the limited rule does not: its bucket stays empty.
    replace(
        &path,
        &format!("{}{limited}", config(&up.url, &["echo", "fetch_logs"])),
    );
    assert_eq!(
        admin(&base, reqwest::Method::POST, Some(ADMIN_TOKEN))
            .await
            .0,
        200
    );
    assert_eq!(
        tools_call(&mcp, ALICE, "fetch_logs", json!({}), &[])
            .await
            .refusal(),
        None,
        "the new rule is in force"
    );
    assert_eq!(
        tools_call(&mcp, ALICE, "slow_query", slow.clone(), &[])
            .await
            .refusal()
            .as_deref(),
        Some("rate_limited")
    );

    // The rate itself changes: a new bucket, full.
    let changed = limited.replace("burst = 2", "burst = 3");
    replace(
        &path,
        &format!("{}{changed}", config(&up.url, &["echo", "fetch_logs"])),
    );
    assert_eq!(
        admin(&base, reqwest::Method::POST, Some(ADMIN_TOKEN))
            .await
            .0,
        200
    );
    assert_eq!(
        tools_call(&mcp, ALICE, "slow_query", slow, &[])
            .await
            .refusal(),
        None
    );
    gw.stop().await;
}

/// A configuration written in place in two steps, the first of which would
/// compile to a weaker policy (the file cut at a rule boundary, before its
/// deny rule), is never applied half-way: calls see the old policy, then the
/// whole new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_in_two_steps_is_never_applied_half_way() {
    use std::io::Write as _;
    let up = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let (gw, path) = start(dir.path(), &config(&up.url, &["echo"])).await;
    let mcp = gw.url("s");
    let whole = Config::new()
        .admin_token(ADMIN_TOKEN)
        .server("s", &up.url)
        .set("timeout", "20s")
        .set("pinning", "off")
        .clients()
        .section("pins")
        .set("database", ":memory:")
        .allow(&["*"])
        .deny(&["delete_record"])
        .render();
    let cut = whole.rfind("[[rules]]").expect("the deny rule");
    let (first, rest) = whole.split_at(cut);
    assert!(rest.contains("delete_record") && !first.contains("delete_record"));
    assert!(first.contains("[pins]"), "{first}");
    portcullis::config::load_str(first, "half.toml", &|_| None).expect("the half compiles");

    // The answer to a deletion: refused as unknown while a policy denies it.
    let deletes = |n: u64| {
        let mcp = mcp.clone();
        async move {
            let args = json!({"record_id": format!("CUST-{n}")});
            tools_call(&mcp, ALICE, "delete_record", args, &[])
                .await
                .refusal()
        }
    };
    let denied = Some("unknown_tool".to_owned());
    // The first step, then a pause longer than the watcher's debounce.
    std::fs::write(&path, first).expect("write the first half");
    let paused = std::time::Instant::now();
    let mut n = 0;
    while paused.elapsed() < Duration::from_millis(700) {
        n += 1;
        assert!(
            deletes(n).await.is_some(),
            "the half-written file is in force"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("open");
    file.write_all(rest.as_bytes()).expect("write the rest");
    drop(file);
    until("the whole new file is in force", async || {
        n += 1;
        assert_eq!(deletes(n).await, denied, "delete_record was allowed");
        tools_call(&mcp, ALICE, "slow_query", json!({"seconds": 0}), &[])
            .await
            .refusal()
            .is_none()
    })
    .await;
    assert_eq!(deletes(0).await, denied);
    assert!(
        up.ran().iter().all(|(tool, _)| tool != "delete_record"),
        "{:?}",
        up.ran()
    );
    gw.stop().await;
}
