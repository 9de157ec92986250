//! A fleet started by the test itself: gateway processes (the real binary)
//! behind a real HAProxy round-robin with no stickiness, one real
//! redis-server for the token buckets and one real PostgreSQL for the audit,
//! in front of the official Python SDK's server. Through the balancer the
//! fleet answers as one gateway; every replica's events land in PostgreSQL
//! under its name; a replica killed with `kill -9` mid-load loses no row of
//! a call it answered; PostgreSQL stopped, calls go on, the spool holds the
//! events (and counts what it cannot hold), and the rows arrive once it is back.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fleet::{Replica, eventually, response_of, send_echo};
use support::haproxy::Haproxy;
use support::postgres::PostgresServer;
use support::redis::RedisServer;
use support::{ALICE, Mode, Peer, PeerServer, Sdk};

/// A replica's configuration: `demo` upstream, alice may call `echo` under
/// `rate`, buckets in `redis`, the audit in PostgreSQL at `pg` with the
/// arguments kept (so a row can be matched to the call that made it).
fn replica_config(
    name: &str,
    upstream: &str,
    pg: &str,
    redis: Option<&str>,
    extra: &str,
) -> String {
    let mut config = Config::new()
        .gateway("replica", name)
        .server("demo", upstream)
        .clients()
        .allow(&["echo"])
        .set("servers", vec!["demo"]);
    if let Some(redis) = redis {
        config = config
            .set_raw(
                "rate",
                "{ burst = 6, per_second = 0.01, key = \"client+tool\" }",
            )
            .section("rate_limit")
            .set("backend", "redis")
            .set("redis_url", redis)
            .set("on_backend_error", "deny");
    }
    let text = config
        .section("audit")
        .set("backend", "postgres")
        .set("url", pg)
        .set("arguments", "full")
        .render();
    format!("{text}\n{extra}")
}

/// One 2026-07-28 `tools/call` of `echo` with `text`; the JSON-RPC response,
/// or `None` when no whole answer came back (a replica killed under it).
async fn echo(http: &reqwest::Client, url: &str, text: &str) -> Option<Value> {
    let response = send_echo(http, url, text).await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response_of(&response.text().await.ok()?)
}

fn echoed(response: &Value) -> Option<&str> {
    if response["result"]["isError"] == true {
        return None;
    }
    response["result"]["content"][0]["text"].as_str()
}

fn refusal(response: &Value) -> Option<&str> {
    response["result"]["_meta"]["portcullis/error"]["code"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_behind_haproxy_answer_as_one_and_audit_into_one_database() {
    if !tiers::ready(&[Tier::Python, Tier::Redis, Tier::Postgres, Tier::Haproxy]) {
        return;
    }
    // Admissions are counted against the wall clock (see `support::exclusive`).
    let _alone = support::exclusive().await;
    let pg = PostgresServer::start();
    let redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::PythonStateless).await;
    let mut replicas = Vec::new();
    for i in 1..=3 {
        let text = replica_config(
            &format!("gw-{i}"),
            &upstream.url,
            &pg.url(),
            Some(&redis.url()),
            "",
        );
        replicas.push(Replica::start(&text).await);
    }
    let backends: Vec<String> = replicas.iter().map(|r| r.mcp.clone()).collect();
    let balancer = Haproxy::start(&backends);
    let url = balancer.url("/mcp/demo");

    // The official Python client lists and calls through the balancer.
    let results = support::sdk(
        Sdk::Python,
        Mode::Modern,
        &url,
        ALICE,
        json!([{"op": "list"}, {"op": "call", "name": "echo", "args": {"text": "through the fleet"}}]),
    )
    .await;
    assert!(
        results[0]["tools"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("echo"))),
        "{results:?}"
    );
    assert_eq!(results[1]["text"], "through the fleet", "{results:?}");
    assert_eq!(results[1]["isError"], false, "{results:?}");

    // The bucket is the fleet's: six calls of echo in all, wherever the
    // balancer sends them (one is spent above), not six per replica.
    let http = support::http();
    let mut admitted = 1;
    let mut limited = 0;
    for n in 0..9 {
        let r = echo(&http, &url, &format!("call {n}"))
            .await
            .expect("an answer");
        match refusal(&r) {
            None => admitted += 1,
            Some("rate_limited") => limited += 1,
            Some(other) => panic!("unexpected refusal {other}: {r}"),
        }
    }
    assert_eq!((admitted, limited), (6, 4));

    // Every replica's events are in the one database, under its name.
    let per_replica = "SELECT string_agg(replica, ',' ORDER BY replica) FROM \
        (SELECT DISTINCT replica FROM portcullis_events WHERE method = 'tools/call') r";
    let all = eventually(Duration::from_secs(20), || {
        pg.query(per_replica) == "gw-1,gw-2,gw-3"
    })
    .await;
    assert!(all, "replicas in the audit: {}", pg.query(per_replica));
    let calls = "SELECT count(*) FROM portcullis_events WHERE method = 'tools/call'";
    assert!(eventually(Duration::from_secs(20), || pg.count(calls) == 10).await);
    assert_eq!(
        pg.count(
            "SELECT count(*) FROM portcullis_events WHERE decision = 'rate_limited' \
             AND replica LIKE 'gw-%'"
        ),
        4
    );

    // Each replica names itself and its store.
    for (i, r) in replicas.iter().enumerate() {
        let health = r.health().await;
        assert_eq!(health["replica"], format!("gw-{}", i + 1), "{health}");
        assert_eq!(health["stores"]["audit"]["backend"], "postgres", "{health}");
        assert_eq!(health["stores"]["audit"]["state"], "up", "{health}");
        let info = format!("portcullis_replica_info{{replica=\"gw-{}\"}}", i + 1);
        assert_eq!(r.metric(&info).await, 1.0);
        assert_eq!(r.metric("portcullis_audit_store_up").await, 1.0);
    }
    drop(balancer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_dashboard_in_chromium_shows_the_events_of_every_replica() {
    if !tiers::ready(&[Tier::Python, Tier::Postgres, Tier::Haproxy, Tier::Chromium]) {
        return;
    }
    let pg = PostgresServer::start();
    let upstream = PeerServer::start(Peer::PythonStateless).await;
    let mut replicas = Vec::new();
    for i in 1..=3 {
        let text = replica_config(&format!("gw-{i}"), &upstream.url, &pg.url(), None, "");
        replicas.push(Replica::start(&text).await);
    }
    let backends: Vec<String> = replicas.iter().map(|r| r.mcp.clone()).collect();
    let balancer = Haproxy::start(&backends);
    let http = support::http();
    for n in 0..6 {
        let text = format!("seen-{n}");
        let r = echo(&http, &balancer.url("/mcp/demo"), &text)
            .await
            .expect("answer");
        assert_eq!(echoed(&r), Some(text.as_str()), "{r}");
    }
    let replicas_in_db = "SELECT count(DISTINCT replica) FROM portcullis_events";
    assert!(eventually(Duration::from_secs(20), || pg.count(replicas_in_db) == 3).await);

    // The dashboard of replica 3 alone, in headless Chromium: its feed lists
    // calls answered by each of the three.
    let profile = tempfile::tempdir().expect("profile dir");
    let page = format!("{}/#/feed", replicas[2].admin);
    let dump = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(["--virtual-time-budget=5000", "--dump-dom", &page])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("Chromium renders the page in time")
    .expect("Chromium runs");
    let dom = String::from_utf8_lossy(&dump.stdout);
    for i in 1..=3 {
        assert!(
            dom.contains(&format!(">@ gw-{i}<")),
            "replica gw-{i} is missing from the dashboard:\n{dom}"
        );
    }
    assert!(dom.contains("seen-") || dom.contains("echo"), "{dom}");
    drop(balancer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_load_loses_no_answered_call_and_an_outage_is_buffered() {
    if !tiers::ready(&[Tier::Python, Tier::Postgres, Tier::Haproxy]) {
        return;
    }
    let mut pg = PostgresServer::start();
    let upstream = PeerServer::start(Peer::PythonStateless).await;
    let mut replicas = Vec::new();
    for i in 1..=3 {
        let text = replica_config(&format!("gw-{i}"), &upstream.url, &pg.url(), None, "");
        replicas.push(Replica::start(&text).await);
    }
    let backends: Vec<String> = replicas.iter().map(|r| r.mcp.clone()).collect();
    let balancer = Haproxy::start(&backends);
    let url = balancer.url("/mcp/demo");

    // Four callers through the balancer, each call with its own text, for at
    // most 20 s and 400 calls in all; replica 1 is killed after 60 answers.
    let answered = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for c in 0..4 {
        let (answered, stop, url) = (answered.clone(), stop.clone(), url.clone());
        callers.push(tokio::spawn(async move {
            let http = support::http();
            let deadline = Instant::now() + Duration::from_secs(20);
            for n in 0..100 {
                if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                    break;
                }
                let text = format!("load-{c}-{n}");
                if let Some(r) = echo(&http, &url, &text).await
                    && echoed(&r) == Some(text.as_str())
                {
                    answered.lock().expect("set").insert(text);
                }
            }
        }));
    }
    let killed = eventually(Duration::from_secs(20), || {
        answered.lock().expect("set").len() >= 60
    })
    .await;
    assert!(killed, "the load did not get going");
    replicas[0].kill9().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.expect("caller");
    }
    let answered = answered.lock().expect("set").clone();
    assert!(answered.len() >= 60);
    // The killed replica comes back on its own spool and ships what it held.
    replicas[0].restart().await;
    let rows = || {
        pg.query(
            "SELECT string_agg(arguments::jsonb->>'text', ',') FROM portcullis_events \
             WHERE method = 'tools/call'",
        )
        .split(',')
        .map(str::to_owned)
        .collect::<BTreeSet<String>>()
    };
    let complete = eventually(Duration::from_secs(30), || rows().is_superset(&answered)).await;
    let missing: Vec<String> = answered.difference(&rows()).cloned().collect();
    assert!(complete, "answered calls without an audit row: {missing:?}");
    assert_eq!(
        pg.count("SELECT count(*) - count(DISTINCT key) FROM portcullis_events"),
        0,
        "a replayed spool inserts each row once"
    );
    drop(balancer);

    // PostgreSQL goes away: calls go on; a replica with room for 5 events
    // keeps 5 in its spool and counts the rest as lost, then ships the 5.
    let small = replica_config("gw-small", &upstream.url, &pg.url(), None, "buffer = 5\n");
    let small = Replica::start(&small).await;
    let http = support::http();
    assert_eq!(
        echoed(
            &echo(&http, &small.url("demo"), "before")
                .await
                .expect("answer")
        ),
        Some("before")
    );
    let before = "SELECT count(*) FROM portcullis_events WHERE replica = 'gw-small'";
    assert!(eventually(Duration::from_secs(20), || pg.count(before) == 1).await);
    pg.stop();
    for n in 0..8 {
        let text = format!("outage-{n}");
        let r = echo(&http, &small.url("demo"), &text)
            .await
            .expect("answer");
        assert_eq!(echoed(&r), Some(text.as_str()), "calls go on: {r}");
    }
    assert_eq!(small.metric("portcullis_audit_queue_depth").await, 5.0);
    assert_eq!(small.metric("portcullis_audit_dropped_total").await, 3.0);
    assert_eq!(small.metric("portcullis_audit_store_up").await, 0.0);
    let health = small.health().await;
    assert_eq!(health["stores"]["audit"]["state"], "down", "{health}");
    assert_eq!(health["stores"]["audit"]["buffered"], 5, "{health}");
    assert_eq!(health["stores"]["audit"]["lost"], 3, "{health}");
    pg.restart();
    let after = "SELECT count(*) FROM portcullis_events WHERE replica = 'gw-small' \
        AND arguments::jsonb->>'text' LIKE 'outage-%'";
    assert!(
        eventually(Duration::from_secs(30), || pg.count(after) == 5).await,
        "the buffered events arrive: {}",
        pg.count(after)
    );
    let mut down = 1.0;
    for _ in 0..50 {
        down = small.metric("portcullis_audit_queue_depth").await;
        if down == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(down, 0.0);
}

/// One spool, one writer: a replica pointed at the spool a running replica
/// holds (one volume given to two replicas) refuses to start, naming the
/// spool, and leaves it alone; the running one goes on shipping; once it is
/// gone (`kill -9`: the kernel lets the spool go), a replica starts on it.
/// Two writers on one spool lost events (each counted only its own bytes,
/// and one emptying the file took the other's unshipped lines with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_a_running_replica_holds_is_refused_to_another_at_start() {
    if !tiers::ready(&[Tier::Postgres]) {
        return;
    }
    let pg = PostgresServer::start();
    let upstream = support::upstreams::InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let spool = dir.path().join("one-spool.jsonl");
    let on_spool = |name: &str| {
        let extra = format!("spool = \"{}\"\n", spool.display());
        replica_config(name, &upstream.url, &pg.url(), None, &extra)
    };
    let mut first = Replica::start(&on_spool("gw-first")).await;

    let second = support::ConfigFile::new(&on_spool("gw-second"));
    let refused = support::run_binary(second.path(), &[]);
    let out = tokio::time::timeout(Duration::from_secs(60), refused.wait_with_output())
        .await
        .expect("the second replica stops in time")
        .expect("it runs");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains(&format!("cannot open the audit spool {}", spool.display()))
            && log.contains("in use by another process"),
        "{log}"
    );

    let http = support::http();
    echo(&http, &first.url("demo"), "first")
        .await
        .expect("the first replica answers");
    let shipped = "SELECT count(*) FROM portcullis_events WHERE replica = 'gw-first' \
        AND method = 'tools/call'";
    assert!(
        eventually(Duration::from_secs(20), || pg.count(shipped) == 1).await,
        "the first replica ships: {}",
        pg.count(shipped)
    );

    first.kill9().await;
    let next = Replica::start(&on_spool("gw-second")).await;
    echo(&http, &next.url("demo"), "next")
        .await
        .expect("the replica on the freed spool answers");
    let next_rows = "SELECT count(*) FROM portcullis_events WHERE replica = 'gw-second'";
    assert!(
        eventually(Duration::from_secs(20), || pg.count(next_rows) == 1).await,
        "the replica on the freed spool ships: {}",
        pg.count(next_rows)
    );
}

// === The configuration of a fleet ===

/// A minimal configuration with `gateway` and `audit` lines added.
fn fleet_text(gateway: &str, audit: &str) -> String {
    let text = Config::new()
        .server("demo", "http://127.0.0.1:9/mcp")
        .clients()
        .allow(&["echo"])
        .render();
    let text = text.replacen("[gateway]\n", &format!("[gateway]\n{gateway}"), 1);
    format!("{text}\n[audit]\n{audit}")
}

fn refusal_of(text: &str) -> String {
    portcullis::config::load_str(text, "fleet.toml", &|_| None)
        .map(|_| ())
        .expect_err("the configuration is refused")
        .to_string()
}

#[test]
fn a_postgres_audit_is_refused_without_its_url_and_its_keys_without_it() {
    let no_url = refusal_of(&fleet_text("", "backend = \"postgres\"\n"));
    assert!(
        no_url.starts_with("fleet.toml:")
            && no_url.contains("`audit.url`: backend = \"postgres\" needs `url`"),
        "{no_url}"
    );
    let stray = refusal_of(&fleet_text("", "url = \"postgres://db/audit\"\n"));
    assert!(
        stray.contains("`audit.url`: this key belongs to backend = \"postgres\""),
        "{stray}"
    );
    let bad_url = refusal_of(&fleet_text(
        "",
        "backend = \"postgres\"\nurl = \"postgres://db/audit?sslmode=sometimes\"\n",
    ));
    assert!(
        bad_url.contains("`audit.url`: not a PostgreSQL connection URL"),
        "{bad_url}"
    );
    let bad_buffer = refusal_of(&fleet_text(
        "",
        "backend = \"postgres\"\nurl = \"postgres://db/audit\"\nbuffer = 0\n",
    ));
    assert!(bad_buffer.contains("`audit.buffer`"), "{bad_buffer}");
}

#[test]
fn a_replica_is_named_by_the_configuration_or_the_host_and_nothing_else() {
    let bad = refusal_of(&fleet_text("replica = \"gw 1\"\n", ""));
    assert!(
        bad.contains("`gateway.replica`: expected 1 to 64 letters"),
        "{bad}"
    );
    let text = fleet_text(
        "replica = \"${POD_NAME}\"\n",
        "backend = \"postgres\"\nurl = \"postgres://portcullis@db/audit?sslmode=require\"\n",
    );
    let config = portcullis::config::load_str(&text, "fleet.toml", &|name| {
        (name == "POD_NAME").then(|| "gw-7".to_owned())
    })
    .expect("valid");
    assert_eq!(config.audit.replica, "gw-7");
    assert_eq!(config.telemetry.replica, "gw-7");
    match &config.audit.backend {
        portcullis::audit::AuditBackend::Postgres { spool, buffer, url } => {
            assert_eq!(spool, "portcullis-audit-spool-gw-7.jsonl");
            assert_eq!(*buffer, 100_000);
            assert!(url.ends_with("sslmode=require"));
        }
        other => panic!("{other:?}"),
    }
    // Without a name, the host's.
    let plain =
        portcullis::config::load_str(&fleet_text("", ""), "fleet.toml", &|_| None).expect("valid");
    assert!(!plain.audit.replica.is_empty());
    assert_eq!(plain.audit.backend, portcullis::audit::AuditBackend::Sqlite);
}
