//! Replicas of one deployment sharing their security state through one real
//! `redis-server` (`[state] backend = "redis"`): each test runs several real
//! gateway processes in front of the official Python SDK server (which
//! records every call it runs) and sends each request to the replica it
//! names, which is stronger than a balancer. A 2026-07-28 approval answered
//! through one replica runs through another, once; the same `requestState`
//! replayed through a third is refused; with Redis stopped the approval is
//! refused (`state_unavailable`), never run, and is still usable once Redis
//! is back. A task created through one replica is its creator's through
//! every other, and unknown to everyone else; with Redis stopped a replica
//! that must ask the store refuses (`state_unavailable`, 503) and forwards
//! nothing. A 2025-era session opened through one replica continues through
//! another, for its own client only.

use crate::support;
use support::fleet::{echoes, elicit_echo, redis_fleet, refusal_code, replicas_of};
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::process::Observed;
use support::redis::RedisServer;
use support::tasks::TasksUpstream;
use support::{
    ALICE, BOB, Peer, PeerServer, Raw, allow_all, borrow, clients, modern_call_headers,
    modern_meta, raw_post,
};

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
    replicas_of(n, &config(upstream, redis, namespace)).await
}

/// A 2026-07-28 `tools/call` of `echo` whose client declares elicitation.
fn echo(id: u64, text: &str, extra: Value) -> String {
    elicit_echo(id, text, extra)
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
        assert_eq!(refusal_code(&replayed), "approval_used", "{replayed}");
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
    assert_eq!(refusal_code(&refused), "approval_invalid", "{refused}");
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
        assert_eq!(refusal_code(&refused), "state_unavailable", "{refused}");
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
    assert_eq!(refusal_code(&replayed), "approval_used", "{replayed}");
    assert_eq!(echoes(&upstream), 1);
}

/// The retry with `state` through `replica`, repeated while the replica
/// has not reconnected to Redis yet (at most 5 s).
async fn answered(replica: &Observed, state: &str) -> Value {
    let mut last = Value::Null;
    for id in 10..60 {
        last = call(replica, echo(id, "x", yes(state))).await;
        if refusal_code(&last) != "state_unavailable" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    last
}

/// `n` replicas in front of the scripted tasks server `t`, every tool allowed.
async fn task_replicas(n: usize, upstream: &str, redis: &str) -> Vec<Observed> {
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [state]\nbackend = \"redis\"\nredis_url = \"{redis}\"\nnamespace = \"tasks\"\n\
         [approvals]\nkey = \"{KEY}\"\n[servers.t]\nurl = \"{upstream}\"\n{}{}",
        clients(),
        allow_all()
    );
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Observed::start(&text).await);
    }
    out
}

/// A 2026-07-28 request of `method` by `key` to `replica`'s server `t`.
async fn task_request(
    replica: &Observed,
    key: &str,
    method: &str,
    name: &str,
    mut params: Value,
) -> Raw {
    params["_meta"] = modern_meta();
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let auth = format!("Bearer {key}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", method),
        ("mcp-name", name),
    ];
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    raw_post(&replica.url("t"), &headers, body.to_string()).await
}

/// Alice creates a task of `tool` through `replica`; its id.
async fn create_task(replica: &Observed, tool: &str) -> String {
    let r = task_request(
        replica,
        ALICE,
        "tools/call",
        tool,
        json!({"name": tool, "arguments": {"topic": "tides"}}),
    )
    .await;
    assert_eq!(r.body["result"]["resultType"], "task", "{}", r.text);
    r.body["result"]["taskId"]
        .as_str()
        .expect("a task")
        .to_owned()
}

/// `tasks/get` of `id` by `key` through `replica`.
async fn get_task(replica: &Observed, key: &str, id: &str) -> Raw {
    task_request(replica, key, "tasks/get", id, json!({"taskId": id})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_through_one_replica_is_its_creators_through_another_only() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    let upstream = TasksUpstream::start().await;
    let fleet = task_replicas(3, &upstream.url, &redis.url()).await;
    let research = create_task(&fleet[0], "research").await;
    let count = create_task(&fleet[0], "count").await;

    // Bob, through any replica: the answer an unknown task gets, nothing forwarded.
    let unknown = get_task(&fleet[1], BOB, "made-up").await;
    assert_eq!(unknown.body["error"]["code"], -32602, "{}", unknown.text);
    for replica in &fleet {
        let stolen = get_task(replica, BOB, &research).await;
        assert_eq!(stolen.body, unknown.body, "{}", stolen.text);
    }
    assert_eq!(
        upstream.count("tasks/get"),
        0,
        "no tasks/get reached the upstream"
    );

    // Alice, through replicas that did not see it created.
    let got = get_task(&fleet[1], ALICE, &research).await;
    assert_eq!(got.body["result"]["status"], "completed", "{}", got.text);
    assert_eq!(
        got.body["result"]["result"]["content"][0]["text"], "report on tides",
        "{}",
        got.text
    );
    // The result passes the output checks of its tool as replica 3 knows it:
    // `count` breaks its outputSchema.
    let checked = get_task(&fleet[2], ALICE, &count).await;
    assert_eq!(
        checked.body["result"]["result"]["_meta"]["portcullis/error"]["code"],
        "output_schema_violation",
        "{}",
        checked.text
    );
    assert_eq!(upstream.count("tasks/get"), 2);

    // Every binding is a key with a TTL.
    let keys = redis.command("KEYS portcullis:tasks:task:*");
    assert!(keys.starts_with("*2\r\n"), "{keys:?}");
    let key = keys.lines().nth(2).expect("a key").to_owned();
    let ttl = redis.command(&format!("PTTL {key}"));
    let ttl: i64 = ttl.trim().trim_start_matches(':').parse().expect("PTTL");
    assert!(ttl > 0, "{ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_a_task_another_replica_created_is_refused_not_forwarded() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let mut redis = RedisServer::start();
    let upstream = TasksUpstream::start().await;
    let fleet = task_replicas(2, &upstream.url, &redis.url()).await;
    let id = create_task(&fleet[0], "research").await;
    // Written as the reply left: wait until Redis has it before stopping it.
    for _ in 0..50 {
        if redis
            .command("KEYS portcullis:tasks:task:*")
            .starts_with("*1")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    redis.stop();
    let refused = get_task(&fleet[1], ALICE, &id).await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert_eq!(refused.body["error"]["data"]["code"], "state_unavailable");
    assert_eq!(refused.body["error"]["data"]["store"], "redis");
    assert_eq!(upstream.count("tasks/get"), 0, "nothing was forwarded");
    // The replica that created it still knows it.
    let own = get_task(&fleet[0], ALICE, &id).await;
    assert_eq!(own.body["result"]["status"], "completed", "{}", own.text);
}

/// A 2025-11-25 request by alice (or `key`) in `session` through `replica`.
async fn in_session(replica: &Observed, key: &str, session: &str, body: Value) -> Raw {
    let auth = format!("Bearer {key}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-session-id", session),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    raw_post(&replica.url("t"), &headers, body.to_string()).await
}

fn legacy_echo(id: u64, text: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "echo", "arguments": {"text": text}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_session_opened_through_one_replica_continues_through_another() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    let mut redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    let fleet = task_replicas(3, &upstream.url, &redis.url()).await;
    let auth = format!("Bearer {ALICE}");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let opened = raw_post(
        &fleet[0].url("t"),
        &[("authorization", &auth)],
        init.to_string(),
    )
    .await;
    let session = opened.headers["mcp-session-id"]
        .to_str()
        .expect("a session")
        .to_owned();
    // Written as the answer left: wait until Redis has it.
    for _ in 0..50 {
        if redis
            .command("KEYS portcullis:tasks:session:*")
            .starts_with("*1")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let ack = in_session(&fleet[1], ALICE, &session, initialized).await;
    assert_eq!(ack.status, 202, "{}", ack.text);
    let echoed = in_session(&fleet[1], ALICE, &session, legacy_echo(2, "across")).await;
    assert_eq!(echoed.body["result"]["isError"], false, "{}", echoed.text);
    assert!(echoed.text.contains("across"), "{}", echoed.text);
    assert_eq!(echoes(&upstream), 1);

    // Another client presenting it, and an id nobody opened: unknown.
    let stolen = in_session(&fleet[2], BOB, &session, legacy_echo(3, "x")).await;
    assert_eq!(stolen.status, 404, "{}", stolen.text);
    let made_up = in_session(&fleet[2], ALICE, "made-up", legacy_echo(4, "x")).await;
    assert_eq!(made_up.status, 404, "{}", made_up.text);
    assert_eq!(echoes(&upstream), 1);

    // Redis stopped: a replica that must ask refuses, 503, and forwards nothing;
    // the replicas that know the session still serve it.
    redis.stop();
    let refused = in_session(&fleet[2], ALICE, &session, legacy_echo(5, "x")).await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert_eq!(refused.body["error"]["data"]["code"], "state_unavailable");
    assert_eq!(echoes(&upstream), 1);
    let known = in_session(&fleet[1], ALICE, &session, legacy_echo(6, "still")).await;
    assert!(known.text.contains("still"), "{}", known.text);
}

/// Under any interleaving of replicas using any nonces, concurrently, each
/// nonce is used exactly once across the fleet.
#[test]
fn a_nonce_is_used_once_under_any_interleaving_of_replicas() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    use portcullis::state::Use;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let redis = RedisServer::start();
    let (runtime, fleet) = redis_fleet(&redis.url(), "prop", 3);
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
