//! The audit trail in a real SQLite file: every kind of decision leaves exactly
//! one row with the right fields, `arguments = "shape"` stores no values,
//! `redacted` never stores a secret, retention deletes old rows, a burst of
//! events at full speed is written whole (no drops), 10,000 calls through the
//! gateway leave 10,000 rows, and stopping during load loses no event.

use crate::support;
use support::tools_call;

use std::time::Duration;

use portcullis::audit::{Audit, Event, record_arguments};
use portcullis::config::{AuditArguments, AuditSettings};
use rusqlite::Connection;
use serde_json::{Value, json};
use support::upstreams::InProcess;
use support::{ALICE, TestGateway, allow_all, clients, modern_call, modern_call_headers};

/// One row of `events`, as the test reads it.
#[derive(Debug)]
struct Row {
    trace_id: Option<String>,
    client: Option<String>,
    server: Option<String>,
    method: String,
    tool: Option<String>,
    decision: String,
    stage: String,
    violations: Value,
    sanitizer: Value,
    upstream_status: Option<u16>,
    upstream_latency_us: Option<i64>,
    latency_us: i64,
    era: String,
    arguments: Option<Value>,
}

fn rows(path: &std::path::Path) -> Vec<Row> {
    let conn = Connection::open(path).expect("audit store opens");
    let mut q = conn
        .prepare(
            "SELECT trace_id, client, server, method, tool, decision, stage, violations,
                    sanitizer, upstream_status, upstream_latency_us, latency_us, era, arguments
             FROM events ORDER BY id",
        )
        .expect("query");
    let json = |s: String| serde_json::from_str::<Value>(&s).expect("JSON column");
    q.query_map([], |r| {
        Ok(Row {
            trace_id: r.get(0)?,
            client: r.get(1)?,
            server: r.get(2)?,
            method: r.get(3)?,
            tool: r.get(4)?,
            decision: r.get(5)?,
            stage: r.get(6)?,
            violations: json(r.get(7)?),
            sanitizer: json(r.get(8)?),
            upstream_status: r.get(9)?,
            upstream_latency_us: r.get(10)?,
            latency_us: r.get(11)?,
            era: r.get(12)?,
            arguments: r.get::<_, Option<String>>(13)?.map(json),
        })
    })
    .expect("rows")
    .collect::<Result<_, _>>()
    .expect("rows read")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_leaves_one_row_with_its_fields() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("audit.db");
    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start(
        &[("demo", &upstream.url)],
        &format!(
            "{}{}\n[audit]\ndatabase = {:?}\narguments = \"shape\"\n",
            clients(),
            allow_all(),
            db.display().to_string()
        ),
    )
    .await;
    let url = gateway.url("demo");
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    // 1. forwarded, with the client's trace id and arguments by shape.
    tools_call(
        &url,
        ALICE,
        "lookup_order",
        json!({"order_id": "ORD-004211"}),
        &[("traceparent", traceparent)],
    )
    .await;
    // 2. schema violation.
    tools_call(
        &url,
        ALICE,
        "lookup_order",
        json!({"order_id": "1 OR 1=1"}),
        &[],
    )
    .await;
    // 3. a tool that does not exist.
    tools_call(&url, ALICE, "no_such_tool", json!({}), &[]).await;
    // 4. an unknown key.
    tools_call(&url, "wrong-key", "lookup_order", json!({}), &[]).await;
    // 5. output the sanitizer cleans.
    tools_call(&url, ALICE, "fetch_logs", json!({}), &[]).await;
    gateway.stop().await;

    let rows = rows(&db);
    assert_eq!(rows.len(), 5, "{rows:#?}");

    let ok = &rows[0];
    assert_eq!(
        ok.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(ok.client.as_deref(), Some("alice"));
    assert_eq!(ok.server.as_deref(), Some("demo"));
    assert_eq!(ok.method, "tools/call");
    assert_eq!(ok.tool.as_deref(), Some("lookup_order"));
    assert_eq!(
        (ok.decision.as_str(), ok.stage.as_str()),
        ("forwarded", "forwarded")
    );
    assert_eq!(ok.upstream_status, Some(200));
    assert!(
        ok.upstream_latency_us
            .is_some_and(|u| u > 0 && u <= ok.latency_us)
    );
    assert_eq!(ok.era, "2026-07-28");
    assert_eq!(
        ok.arguments,
        Some(json!({"order_id": "string"})),
        "shape: no values"
    );

    let invalid = &rows[1];
    assert_eq!(invalid.decision, "invalid_arguments");
    assert_eq!(invalid.stage, "policy");
    assert_eq!(
        invalid.violations.as_array().map(Vec::len),
        Some(1),
        "{invalid:?}"
    );
    assert!(
        invalid.violations[0]
            .as_str()
            .unwrap_or_default()
            .contains("order_id")
    );
    assert_eq!(invalid.upstream_status, None, "never forwarded");
    assert!(
        !format!("{invalid:?}").contains("1 OR 1=1"),
        "no value stored"
    );

    assert_eq!(rows[2].decision, "unknown_tool");
    assert_eq!(rows[2].tool.as_deref(), Some("no_such_tool"));

    assert_eq!(rows[3].decision, "unauthenticated");
    assert_eq!(rows[3].client, None);

    let logs = &rows[4];
    assert_eq!(logs.decision, "forwarded");
    let kinds = logs.sanitizer.as_object().expect("counts by kind");
    assert!(!kinds.is_empty(), "{logs:?}");
    assert!(kinds.values().all(|n| n.as_u64().is_some_and(|n| n > 0)));
    drop(upstream);
}

fn settings(db: &std::path::Path, retention: Duration) -> AuditSettings {
    AuditSettings {
        enabled: true,
        backend: portcullis::audit::AuditBackend::Sqlite,
        replica: "test".into(),
        database: db.display().to_string(),
        retention,
        arguments: AuditArguments::Shape,
    }
}

fn event(time_ms: i64, n: usize) -> Event {
    Event {
        time_ms,
        method: "tools/call".into(),
        tool: Some(format!("tool{}", n % 7)),
        decision: "forwarded".into(),
        stage: "forwarded".into(),
        era: "2026-07-28".into(),
        ..Event::default()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[test]
fn retention_deletes_old_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("audit.db");
    let audit = Audit::open(&settings(&db, Duration::from_secs(3600))).expect("opens");
    audit.record(event(now_ms() - 2 * 3600 * 1000, 0));
    audit.record(event(now_ms(), 1));
    audit.flush();
    let times: Vec<String> = rows(&db).into_iter().filter_map(|r| r.tool).collect();
    assert_eq!(
        times,
        ["tool1"],
        "the event older than the retention is gone"
    );
}

#[test]
fn ten_thousand_events_at_full_speed_are_all_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("audit.db");
    let audit = Audit::open(&settings(&db, Duration::from_secs(86_400))).expect("opens");
    let now = now_ms();
    let started = std::time::Instant::now();
    for n in 0..10_000 {
        audit.record(event(now, n));
    }
    let queued = started.elapsed();
    audit.flush();
    let total = started.elapsed();
    let c = audit.counters();
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(c.dropped.load(Relaxed), 0);
    assert_eq!(c.written.load(Relaxed), 10_000);
    assert_eq!(c.queued.load(Relaxed), 0);
    let conn = Connection::open(&db).expect("opens");
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .expect("count");
    assert_eq!(n, 10_000);
    eprintln!(
        "audit: 10000 events queued in {queued:?} ({:.2} µs each), written in {total:?} ({:.0} events/s)",
        queued.as_secs_f64() * 1e6 / 10_000.0,
        10_000.0 / total.as_secs_f64()
    );
}

#[test]
fn a_disabled_trail_stores_nothing_and_drops_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("audit.db");
    let mut disabled = settings(&path, Duration::from_secs(3600));
    disabled.enabled = false;
    let audit = Audit::open(&disabled).expect("opens");
    for n in 0..100 {
        audit.record(event(now_ms(), n));
    }
    audit.flush();
    assert_eq!(
        audit
            .counters()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(
        audit
            .counters()
            .queued
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert!(!path.exists(), "no file is created for a disabled trail");
}

#[test]
fn a_full_queue_drops_and_counts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("audit.db");
    let audit =
        Audit::open_with_queue(&settings(&db, Duration::from_secs(86_400)), 1).expect("opens");
    for n in 0..1000 {
        audit.record(event(now_ms(), n));
    }
    audit.flush();
    use std::sync::atomic::Ordering::Relaxed;
    let (written, dropped) = (
        audit.counters().written.load(Relaxed),
        audit.counters().dropped.load(Relaxed),
    );
    assert_eq!(written + dropped, 1000);
    assert!(dropped > 0, "a queue of one cannot hold a burst");
    assert_eq!(rows(&db).len() as u64, written);
}

#[test]
fn redacted_arguments_keep_no_secret() {
    let sanitize = portcullis::config::load_str(
        "[servers.s]\nurl = \"http://127.0.0.1:9/mcp\"\n",
        "t.toml",
        &|_| None,
    )
    .expect("empty config loads")
    .sanitize;
    let args = json!({"q": "hello", "token": "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"});
    let redacted = record_arguments(AuditArguments::Redacted, &sanitize, &args).expect("recorded");
    assert_eq!(redacted["q"], "hello");
    assert!(!redacted.to_string().contains("ghp_"), "{redacted}");
    assert_eq!(
        record_arguments(AuditArguments::None, &sanitize, &args),
        None
    );
    assert_eq!(
        record_arguments(AuditArguments::Full, &sanitize, &args),
        Some(args)
    );
}

/// Sends `n` valid calls, `concurrency` at a time, until one is not answered;
/// returns how many were.
async fn load(url: String, n: usize, concurrency: usize) -> usize {
    use futures_util::StreamExt;
    let client = support::http();
    let headers = modern_call_headers(ALICE, "lookup_order");
    futures_util::stream::iter(0..n)
        .map(|i| {
            let mut req = client
                .post(&url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream");
            for (k, v) in &headers {
                req = req.header(*k, v.as_str());
            }
            let body = modern_call(i as u64, "lookup_order", json!({"order_id": "ORD-004211"}));
            async move {
                match req.body(body).send().await {
                    Ok(r) if r.status() == 200 => r.bytes().await.is_ok(),
                    _ => false,
                }
            }
        })
        .buffer_unordered(concurrency)
        .take_while(|ok| std::future::ready(*ok))
        .count()
        .await
}

async fn gateway_with_store(db: &std::path::Path, upstream: &InProcess) -> TestGateway {
    TestGateway::start(
        &[("demo", &upstream.url)],
        &format!(
            "{}{}\n[audit]\ndatabase = {:?}\n",
            clients(),
            allow_all(),
            db.display().to_string()
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_calls_through_the_gateway_leave_ten_thousand_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("audit.db");
    let upstream = InProcess::demo().await;
    let gateway = gateway_with_store(&db, &upstream).await;
    let answered = load(gateway.url("demo"), 10_000, 32).await;
    assert_eq!(answered, 10_000);
    gateway.stop().await;
    assert_eq!(rows(&db).len(), 10_000, "no event dropped or lost");
    drop(upstream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_during_load_loses_no_event() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("audit.db");
    let upstream = InProcess::demo().await;
    let gateway = gateway_with_store(&db, &upstream).await;
    let running = tokio::spawn(load(gateway.url("demo"), 1_000_000, 32));
    tokio::time::sleep(Duration::from_millis(700)).await;
    // What Ctrl-C / SIGTERM does: stop accepting, drain, flush.
    gateway.stop().await;
    let answered = running.await.expect("load");
    assert!(answered > 0);
    let written = rows(&db).len();
    assert!(
        written >= answered,
        "every answered request has its row: {answered} answered, {written} rows"
    );
    drop(upstream);
}
