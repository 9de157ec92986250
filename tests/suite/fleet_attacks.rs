//! The fleet attacked: inputs a client chooses, aimed at the stores every
//! replica shares (a real PostgreSQL for the audit, a real `redis-server`
//! for the security state), each against the promise it would break.
//!
//! - One client's call must not cost the fleet's audit other rows: a NUL
//!   character, which PostgreSQL's `jsonb` and `text` cannot hold, is in a
//!   spooled event like any other; the batch it ships in lands whole.
//! - The per-client bounds of the shared bindings hold when every replica
//!   writes at once, and every key they leave has a TTL.
//! - A Redis that stalls past the replicas' deadline costs a retry a
//!   `state_unavailable`, never a second run.
//! - A Redis password in `redis_url` shows nowhere a client or an operator
//!   reads: not in `/readyz`, the logs, a refusal or a configuration error.

use crate::support;
use support::tiers::{self, Tier};

use std::time::Duration;

use serde_json::json;
use support::fleet::{
    Replica, elicit_echo, eventually, redis_fleet, redis_store, response_of, send_echo,
};
use support::postgres::PostgresServer;
use support::redis::RedisServer;
use support::{ALICE, Config, Peer, PeerServer};

/// A 2026-07-28 `tools/call` of `echo` by alice with `text`; the answer.
async fn echo(url: &str, text: &str) -> serde_json::Value {
    let response = send_echo(&support::http(), url, text)
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

/// Client names that differ only where a key built carelessly would not
/// (case, separators, wildcards, unicode, one that is another's hex).
const NAMES: [&str; 7] = [
    "alice",
    "ALICE",
    "al:ice",
    "al*ice",
    "ålice",
    "616c696365",
    "alice.",
];

#[test]
fn per_client_bounds_hold_when_every_replica_binds_at_once_and_every_key_expires() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    let (runtime, fleet) = redis_fleet(&redis.url(), "bounds", 3);
    const PER_CLIENT: usize = 3;
    // Every client binds 8 tasks and 8 sessions, spread over the replicas, all at once.
    runtime.block_on(futures_util::future::join_all(NAMES.iter().flat_map(
        |client| {
            let fleet = &fleet;
            (0..8).map(move |n| async move {
                let store = &fleet[n % 3];
                let now = portcullis::util::time::now_ms();
                let value = json!({ "c": client }).to_string();
                let id = format!("{client}:{n}");
                store
                    .bind_task(
                        ("s", &id, client),
                        &value,
                        (60_000, 60_000),
                        now,
                        PER_CLIENT,
                    )
                    .await
                    .expect("Redis answers");
                store
                    .bind_session(("s", &id, client), &value, now, PER_CLIENT)
                    .await
                    .expect("Redis answers");
            })
        },
    )));

    // Each client has exactly its bound of bindings of each kind, all its own.
    runtime.block_on(async {
        for client in NAMES {
            let mut tasks = 0;
            let mut sessions = 0;
            for n in 0..8 {
                let id = format!("{client}:{n}");
                for (found, count) in [
                    (fleet[0].task("s", &id).await.expect("get"), &mut tasks),
                    (
                        fleet[1].session("s", &id).await.expect("get"),
                        &mut sessions,
                    ),
                ] {
                    if let Some(value) = found {
                        assert_eq!(value, json!({ "c": client }).to_string());
                        *count += 1;
                    }
                }
            }
            assert_eq!((tasks, sessions), (PER_CLIENT, PER_CLIENT), "{client}");
        }
    });
    // Every key of the deployment expires.
    let keys = redis.command("KEYS portcullis:bounds:*");
    let keys: Vec<&str> = keys
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with('$'))
        .collect();
    // A task and a session key per binding kept, and a bound set per client and kind.
    assert_eq!(keys.len(), NAMES.len() * (2 * PER_CLIENT + 2), "{keys:?}");
    for key in keys {
        let ttl = redis.command(&format!("PTTL {key}"));
        let ttl: i64 = ttl.trim().trim_start_matches(':').parse().expect("PTTL");
        assert!(ttl > 0, "{key} has no TTL: {ttl}");
    }
}

#[test]
fn a_replica_whose_clock_lags_cannot_take_a_client_past_its_bound() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = redis_store(&redis.url(), "lag");
        let base = portcullis::util::time::now_ms();
        // Each binding written through a replica a second further behind.
        for n in 0..8i64 {
            let id = format!("t{n}");
            store
                .bind_task(
                    ("s", &id, "mallory"),
                    "{}",
                    (600_000, 600_000),
                    base - n * 1000,
                    3,
                )
                .await
                .expect("Redis answers");
        }
        let mut kept = Vec::new();
        for n in 0..8 {
            if store
                .task("s", &format!("t{n}"))
                .await
                .expect("get")
                .is_some()
            {
                kept.push(n);
            }
        }
        assert_eq!(kept.len(), 3, "bindings kept: {kept:?}");
        assert!(kept.contains(&7), "the newest write is kept: {kept:?}");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_password_shows_in_no_answer_log_or_probe() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    use support::process::Observed;
    use support::{borrow, clients, modern_call_headers, raw_post};

    const RIGHT: &str = "right-pass-4b1d";
    const WRONG: &str = "wrong-pass-9c2e";
    let redis = RedisServer::start();
    redis.command(&format!("CONFIG SET requirepass {RIGHT}"));
    let upstream = PeerServer::start(Peer::Python).await;
    let port = redis.url().rsplit(':').next().expect("a port").to_owned();
    let config = |password: &str| {
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [state]\nbackend = \"redis\"\nredis_url = \"redis://:{password}@127.0.0.1:{port}\"\n\
             [approvals]\nkey = \"fleet-approvals-key-of-at-least-32-bytes\"\n\
             [servers.files]\nurl = \"{}\"\n{}\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"files\"]\ntools = [\"echo\"]\n\
             action = \"allow\"\napproval = {{ by = \"user\", timeout = \"1m\" }}\n",
            upstream.url,
            clients()
        )
    };
    let echo = |id: u64, extra: serde_json::Value| elicit_echo(id, "x", extra);
    let headers = modern_call_headers(ALICE, "echo");
    for (password, reachable) in [(WRONG, false), (RIGHT, true)] {
        let replica = Observed::start(&config(password)).await;
        let asked = raw_post(&replica.url("files"), &borrow(&headers), echo(1, json!({}))).await;
        let state = asked.body["result"]["requestState"]
            .as_str()
            .expect("a state")
            .to_owned();
        let yes = json!({"requestState": state, "inputResponses": {"portcullis_approval":
            {"action": "accept", "content": {"approve": true}}}});
        let answer = raw_post(&replica.url("files"), &borrow(&headers), echo(2, yes)).await;
        let ready = support::http()
            .get(format!("{}/readyz", replica.admin))
            .send()
            .await
            .expect("readyz")
            .text()
            .await
            .expect("a body");
        let health = support::http()
            .get(format!("{}/healthz", replica.admin))
            .send()
            .await
            .expect("healthz")
            .text()
            .await
            .expect("a body");
        let ready_json: serde_json::Value = serde_json::from_str(&ready).expect("JSON");
        assert_eq!(ready_json["state"]["reachable"], reachable, "{ready}");
        if !reachable {
            assert_eq!(
                answer.body["result"]["_meta"]["portcullis/error"]["code"], "state_unavailable",
                "{}",
                answer.text
            );
        }
        let logs = replica.output().join("\n");
        for (place, text) in [
            ("the answers", format!("{}{}", asked.text, answer.text)),
            ("/readyz", ready),
            ("/healthz", health),
            ("the log", logs),
        ] {
            assert!(
                !text.contains(password),
                "{place} shows the Redis password: {text}"
            );
        }
    }
}

#[test]
fn a_redis_url_that_cannot_be_used_is_refused_without_its_password() {
    use portcullis::state::{SharedState, StateBackend, StateSettings};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _inside = runtime.enter();
    for url in [
        "redis://:hunter2-secret@127.0.0.1:99999999",
        "redis://u:hunter2-secret@[::1:6379",
        "redis://:hunter2-secret@127.0.0.1:6379/not-a-db",
    ] {
        let refused = SharedState::from_settings(&StateSettings {
            backend: StateBackend::Redis(url.into()),
            namespace: "x".into(),
        });
        let text = refused.expect_err("refused").to_string();
        assert!(
            text.starts_with("`state.redis_url` cannot be used"),
            "{text}"
        );
        assert!(!text.contains("hunter2-secret"), "{url}: {text}");
    }
}

#[test]
fn a_postgres_url_that_cannot_be_used_is_refused_without_its_password() {
    for url in [
        "postgres://portcullis:hunter2-secret@db/audit?sslmode=sometimes",
        "postgres://portcullis:hunter2-secret@db:notaport/audit",
        "postgres://portcullis:hunter2-secret@db/audit?nosuchoption=1",
    ] {
        let text = Config::new()
            .server("demo", "http://127.0.0.1:9/mcp")
            .clients()
            .allow(&["echo"])
            .section("audit")
            .set("backend", "postgres")
            .set("url", url)
            .render();
        let refused = portcullis::config::load_str(&text, "fleet.toml", &|_| None)
            .map(|_| ())
            .expect_err("refused")
            .to_string();
        assert!(refused.contains("`audit.url`"), "{refused}");
        assert!(!refused.contains("hunter2-secret"), "{url}: {refused}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_slower_than_the_deadline_never_runs_an_approval_twice() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    use support::process::Observed;
    use support::{borrow, clients, modern_call_headers, raw_post};

    let redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [state]\nbackend = \"redis\"\nredis_url = \"{}\"\nnamespace = \"slow\"\n\
         [approvals]\nkey = \"fleet-approvals-key-of-at-least-32-bytes\"\n\
         [servers.files]\nurl = \"{}\"\n{}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"files\"]\ntools = [\"echo\"]\n\
         action = \"allow\"\napproval = {{ by = \"user\", timeout = \"1m\" }}\n",
        redis.url(),
        upstream.url,
        clients()
    );
    let fleet = [Observed::start(&text).await, Observed::start(&text).await];
    let headers = modern_call_headers(ALICE, "echo");
    let echo = |id: u64, extra: serde_json::Value| elicit_echo(id, "slow", extra);
    let asked = raw_post(
        &fleet[0].url("files"),
        &borrow(&headers),
        echo(1, json!({})),
    )
    .await;
    let state = asked.body["result"]["requestState"]
        .as_str()
        .expect("a state")
        .to_owned();
    let yes = json!({"requestState": state, "inputResponses": {"portcullis_approval":
        {"action": "accept", "content": {"approve": true}}}});

    // Redis stalls 2.5 s, longer than the replicas wait (1.5 s).
    let paused = redis.command("CLIENT PAUSE 2500 ALL");
    assert!(paused.starts_with("+OK"), "{paused}");
    let late = raw_post(
        &fleet[1].url("files"),
        &borrow(&headers),
        echo(2, yes.clone()),
    )
    .await;
    assert_eq!(
        late.body["result"]["_meta"]["portcullis/error"]["code"], "state_unavailable",
        "{}",
        late.text
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Retried through both replicas once Redis answers: it runs at most once.
    let mut codes = Vec::new();
    for (n, replica) in fleet.iter().enumerate() {
        let mut answer = serde_json::Value::Null;
        for _ in 0..30 {
            answer = raw_post(
                &replica.url("files"),
                &borrow(&headers),
                echo(3 + n as u64, yes.clone()),
            )
            .await
            .body;
            if answer["result"]["_meta"]["portcullis/error"]["code"] != "state_unavailable" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        codes.push(answer["result"]["_meta"]["portcullis/error"]["code"].clone());
    }
    let ran = upstream
        .calls()
        .iter()
        .filter(|c| c["tool"] == "echo")
        .count();
    assert!(ran <= 1, "the approved call ran {ran} times");
    assert!(
        codes.iter().all(|c| c.is_null() || c == "approval_used"),
        "{codes:?}"
    );
}
