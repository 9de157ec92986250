//! Replicas of one deployment sharing their security state through one real
//! `redis-server` (`[state] backend = "redis"`): each test runs several real
//! gateway processes in front of the official Python SDK server (which
//! records every call it runs) and sends each request to the replica it
//! names, which is stronger than a balancer. A 2026-07-28 approval answered
//! through one replica runs through another, once; the same `requestState`
//! replayed through a third is refused; with Redis stopped the approval is
//! refused (`state_unavailable`), never run, and is still usable once Redis
//! is back.

use crate::support;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::process::Observed;
use support::redis::RedisServer;
use support::{ALICE, Peer, PeerServer, borrow, clients, modern_call_headers, raw_post};

const KEY: &str = "fleet-approvals-key-of-at-least-32-bytes";
const BY_USER: &str = r#"{ by = "user", timeout = "1m", reason = "echo writes here" }"#;

/// The configuration every replica of deployment `namespace` runs.
fn config(upstream: &str, redis: &str, namespace: &str) -> String {
    format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [state]\nbackend = \"redis\"\nredis_url = \"{redis}\"\nnamespace = \"{namespace}\"\n\
         [approvals]\nkey = \"{KEY}\"\n\
         [servers.files]\nurl = \"{upstream}\"\ntimeout = \"20s\"\n{}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"files\"]\ntools = [\"echo\"]\naction = \"allow\"\n\
         approval = {BY_USER}\n",
        clients()
    )
}

/// `n` replicas of one deployment.
async fn replicas(n: usize, upstream: &str, redis: &str, namespace: &str) -> Vec<Observed> {
    let text = config(upstream, redis, namespace);
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Observed::start(&text).await);
    }
    out
}

/// A 2026-07-28 `tools/call` of `echo` whose client declares elicitation.
fn echo(id: u64, text: &str, extra: Value) -> String {
    let mut params = json!({"name": "echo", "arguments": {"text": text}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}});
    if let (Value::Object(p), Value::Object(e)) = (&mut params, extra) {
        p.extend(e);
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}

/// The user's yes to the gateway's question, with its state.
fn yes(state: &str) -> Value {
    json!({"requestState": state,
           "inputResponses": {"portcullis_approval": {"action": "accept", "content": {"approve": true}}}})
}

/// Sends `body` as alice to `replica`; the JSON-RPC result.
async fn call(replica: &Observed, body: String) -> Value {
    let headers = modern_call_headers(ALICE, "echo");
    raw_post(&replica.url("files"), &borrow(&headers), body)
        .await
        .body["result"]
        .clone()
}

fn code(result: &Value) -> &str {
    result["_meta"]["portcullis/error"]["code"]
        .as_str()
        .unwrap_or("")
}

/// The echoes the upstream itself ran.
fn echoes(upstream: &PeerServer) -> usize {
    upstream
        .calls()
        .iter()
        .filter(|c| c["tool"] == "echo")
        .count()
}

async fn readyz(replica: &Observed) -> Value {
    support::http()
        .get(format!("{}/readyz", replica.admin))
        .send()
        .await
        .expect("readyz")
        .text()
        .await
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_asked_on_one_replica_runs_once_through_another_and_never_again() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    let fleet = replicas(3, &upstream.url, &redis.url(), "prod").await;
    let (one, two, three) = (&fleet[0], &fleet[1], &fleet[2]);

    let asked = call(one, echo(1, "hello", json!({}))).await;
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    let state = asked["requestState"].as_str().expect("a state").to_owned();

    let ran = call(two, echo(2, "hello", yes(&state))).await;
    assert_eq!(ran["isError"], false, "approved through replica 2: {ran}");
    assert_eq!(echoes(&upstream), 1);

    for (replica, id) in [(three, 3), (one, 4), (two, 5)] {
        let replayed = call(replica, echo(id, "hello", yes(&state))).await;
        assert_eq!(code(&replayed), "approval_used", "{replayed}");
    }
    assert_eq!(
        echoes(&upstream),
        1,
        "the upstream ran the approved call once"
    );

    // The used nonce is one key with a TTL in the deployment's namespace.
    let keys = redis.command("KEYS portcullis:prod:nonce:*");
    assert!(keys.starts_with("*1\r\n"), "{keys:?}");
    let nonce_key = keys.lines().nth(2).expect("one key").to_owned();
    let ttl = redis.command(&format!("PTTL {nonce_key}"));
    let ttl: i64 = ttl.trim().trim_start_matches(':').parse().expect("PTTL");
    assert!(ttl > 0, "every key has a TTL: {ttl}");
    for replica in &fleet {
        assert_eq!(readyz(replica).await["state"]["reachable"], true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_deployment_sharing_the_redis_does_not_accept_the_state() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    let prod = replicas(1, &upstream.url, &redis.url(), "prod").await;
    let staging = replicas(1, &upstream.url, &redis.url(), "staging").await;
    let asked = call(&prod[0], echo(1, "x", json!({}))).await;
    let state = asked["requestState"].as_str().expect("a state").to_owned();
    // Same key, same Redis, another namespace: not one of its states.
    let refused = call(&staging[0], echo(2, "x", yes(&state))).await;
    assert_eq!(code(&refused), "approval_invalid", "{refused}");
    let ran = call(&prod[0], echo(3, "x", yes(&state))).await;
    assert_eq!(ran["isError"], false, "{ran}");
    assert_eq!(echoes(&upstream), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_an_approval_is_refused_unused_and_runs_once_it_is_back() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    let mut redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    let fleet = replicas(2, &upstream.url, &redis.url(), "prod").await;
    let asked = call(&fleet[0], echo(1, "x", json!({}))).await;
    let state = asked["requestState"].as_str().expect("a state").to_owned();

    redis.stop();
    for (replica, id) in [(&fleet[1], 2), (&fleet[0], 3)] {
        let refused = call(replica, echo(id, "x", yes(&state))).await;
        assert_eq!(code(&refused), "state_unavailable", "{refused}");
        assert_eq!(refused["_meta"]["portcullis/error"]["store"], "redis");
        assert_eq!(refused["isError"], true);
    }
    assert_eq!(echoes(&upstream), 0, "nothing ran while Redis was away");
    let ready = readyz(&fleet[1]).await;
    assert_eq!(ready["state"]["backend"], "redis", "{ready}");
    assert_eq!(ready["state"]["reachable"], false, "{ready}");
    assert!(
        fleet[1]
            .output()
            .iter()
            .any(|l| l.contains("state store unreachable")),
        "a log line names the store"
    );

    // Each replica reconnects by itself; until it has, it still refuses.
    redis.restart();
    let ran = answered(&fleet[1], &state).await;
    assert_eq!(ran["isError"], false, "the unused approval runs: {ran}");
    let replayed = answered(&fleet[0], &state).await;
    assert_eq!(code(&replayed), "approval_used", "{replayed}");
    assert_eq!(echoes(&upstream), 1);
}

/// The retry with `state` through `replica`, repeated while the replica
/// has not reconnected to Redis yet (at most 5 s).
async fn answered(replica: &Observed, state: &str) -> Value {
    let mut last = Value::Null;
    for id in 10..60 {
        last = call(replica, echo(id, "x", yes(state))).await;
        if code(&last) != "state_unavailable" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    last
}

/// Under any interleaving of replicas using any nonces, concurrently, each
/// nonce is used exactly once across the fleet.
#[test]
fn a_nonce_is_used_once_under_any_interleaving_of_replicas() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    use portcullis::state::{SharedState, StateBackend, StateSettings, Use};
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fleet: Vec<SharedState> = runtime.block_on(async {
        (0..3)
            .map(|_| {
                SharedState::from_settings(&StateSettings {
                    backend: StateBackend::Redis(redis.url()),
                    namespace: "prop".into(),
                })
                .expect("store")
            })
            .collect()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    let mut runner = TestRunner::new(Config::with_cases(64));
    let ops = proptest::collection::vec((0usize..3, 0usize..4), 1..24);
    runner
        .run(&ops, |ops| {
            let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let uses = runtime.block_on(futures_util::future::join_all(ops.iter().map(
                |(replica, nonce)| {
                    let nonce = format!("{case}-{nonce}");
                    let store = &fleet[*replica];
                    async move {
                        let now = portcullis::util::time::now_ms();
                        let used = store
                            .use_once(&nonce, "alice", now + 60_000, now, (1_000, 1_000))
                            .await
                            .expect("Redis answers");
                        (nonce, used)
                    }
                },
            )));
            for nonce in ops.iter().map(|(_, n)| format!("{case}-{n}")) {
                let mine: Vec<Use> = uses
                    .iter()
                    .filter(|(n, _)| *n == nonce)
                    .map(|(_, u)| *u)
                    .collect();
                let done = mine.iter().filter(|u| **u == Use::Done).count();
                prop_assert_eq!(done, 1, "{}: {:?}", nonce, mine);
                prop_assert!(mine.iter().all(|u| matches!(u, Use::Done | Use::Used)));
            }
            Ok(())
        })
        .expect("single use");
}
