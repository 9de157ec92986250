//! The fleet attacked: inputs a client chooses, aimed at the stores every
//! replica shares (a real PostgreSQL for the audit, a real `redis-server`
//! for the security state), each against the promise it would break.
//!
//! - One client's call must not cost the fleet's audit other rows: a NUL
//!   character, which PostgreSQL's `jsonb` and `text` cannot hold, is in a
//!   spooled event like any other; the batch it ships in lands whole.
//! - The per-client bounds of the shared bindings hold when every replica
//!   writes at once, and every key they leave has a TTL.
//! - A Redis password in `redis_url` shows nowhere a client or an operator
//!   reads: not in `/readyz`, the logs, a refusal or a configuration error.

use crate::support;
use support::tiers::{self, Tier};

use std::time::{Duration, Instant};

use serde_json::json;
use support::fleet::{Replica, response_of};
use support::postgres::PostgresServer;
use support::redis::RedisServer;
use support::{ALICE, Config, Peer, PeerServer, modern_call};

/// Polls `check` every 100 ms for up to `limit`.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check()
}

/// A 2026-07-28 `tools/call` of `echo` by alice with `text`; the answer.
async fn echo(url: &str, text: &str) -> serde_json::Value {
    let response = support::http()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {ALICE}"))
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .body(modern_call(1, "echo", json!({ "text": text })))
        .send()
        .await
        .expect("an answer");
    response_of(&response.text().await.expect("a body")).expect("JSON-RPC")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_one_call_costs_the_fleet_audit_no_row() {
    if !tiers::ready(&[Tier::Python, Tier::Postgres]) {
        return;
    }
    let mut pg = PostgresServer::start();
    let upstream = PeerServer::start(Peer::PythonStateless).await;
    let text = Config::new()
        .gateway("replica", "gw-nul")
        .server("demo", &upstream.url)
        .clients()
        .allow(&["echo"])
        .section("audit")
        .set("backend", "postgres")
        .set("url", pg.url())
        .set("arguments", "full")
        .render();
    let replica = Replica::start(&text).await;
    let url = replica.url("demo");
    echo(&url, "first").await;
    let rows = "SELECT count(*) FROM portcullis_events WHERE replica = 'gw-nul'";
    assert!(eventually(Duration::from_secs(20), || pg.count(rows) == 1).await);

    // The database away, three calls wait in the spool and ship as one batch.
    pg.stop();
    for text in ["before", "nul\u{0}here", "after"] {
        echo(&url, text).await;
    }
    pg.restart();
    let landed = eventually(Duration::from_secs(30), || pg.count(rows) == 4).await;
    assert!(
        landed,
        "every call has its row: {} of 4, lost {}",
        pg.count(rows),
        replica.metric("portcullis_audit_dropped_total").await
    );
    // The NUL is shown as U+FFFD: the row says something was there.
    let shown = pg.query(
        "SELECT arguments::jsonb->>'text' FROM portcullis_events \
         WHERE arguments::jsonb->>'text' LIKE 'nul%'",
    );
    assert_eq!(shown.trim(), "nul\u{FFFD}here", "{shown:?}");
}
