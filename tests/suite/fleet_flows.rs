//! Flow labels shared by the replicas of one deployment through one real
//! `redis-server` (`[state] backend = "redis"`): a conversation that read a
//! `private` tool through replica 1 and an `untrusted` one through replica 2
//! is refused its `egress` call through replica 3, citing both earlier
//! calls, while another conversation of the same client is not, and a
//! second deployment on the same Redis sees none of it; a 2025-era session
//! of the official Python SDK client meets the same through HAProxy
//! round-robin. With Redis stopped, a sink under a flow rule and a source
//! call are refused naming the store (never forwarded), an unlabelled call
//! runs, and all resumes once Redis is back; an egress call held for an
//! operator by a replica that only read the labels from Redis is refused,
//! not run, when the yes comes while Redis is away. The Redis store keeps the
//! in-process store's bounds (per label, per client, in all).
//!
//! Against the official Python SDK server (`echo` labelled private,
//! `leaky_text` untrusted, `book_flight` egress), real gateway processes,
//! each request sent to the replica it names unless a balancer is named.

use crate::support;
use support::fleet::{refusal_code, replicas_of};
use support::tiers::{self, Tier};

use std::collections::BTreeMap;
use std::time::Duration;

use portcullis::auth::ClientId;
use portcullis::flow::{
    FlowLimits, FlowStore, Label, Mark, MemoryFlows, RedisFlows, SessionKey, Via,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use support::haproxy::Haproxy;
use support::process::Observed;
use support::redis::RedisServer;
use support::{ALICE, Mode, Peer, PeerServer, Sdk, call, gateway_code};

const DENY: &str = "{ holds = [\"private\", \"untrusted\"], then = \"deny\" }";
const ADMIN_TOKEN: &str = "fleet-flows-admin-token";

/// Every replica of deployment `namespace`: the trifecta's labels and a
/// deny flow rule; `huge` is allowed and unlabelled.
fn config(upstream: &str, redis: &str, namespace: &str) -> String {
    config_with(upstream, redis, namespace, &format!("flow = {DENY}\n"))
}

/// [`config`] with `rule` (a `flow`, and an `approval` when it asks) on the rule.
fn config_with(upstream: &str, redis: &str, namespace: &str, rule: &str) -> String {
    let token = hex::encode(portcullis::auth::hash_key(ADMIN_TOKEN));
    format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_sha256 = \"{token}\"\n\
         [state]\nbackend = \"redis\"\nredis_url = \"{redis}\"\nnamespace = \"{namespace}\"\n\
         [approvals]\nkey = \"fleet-flows-key-of-at-least-32-bytes!!\"\n\
         [servers.py]\nurl = \"{upstream}\"\ntimeout = \"20s\"\n\
         [servers.py.labels]\n\
         \"echo\" = {{ source = \"private\" }}\n\
         \"leaky_text\" = {{ source = \"untrusted\" }}\n\
         \"book_flight\" = {{ sink = \"egress\" }}\n\
         {}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"py\"]\ntools = [\"echo\", \"leaky_text\", \"book_flight\", \"huge\"]\n\
         action = \"allow\"\n{rule}\
         [pins]\ndatabase = \":memory:\"\n[audit]\ndatabase = \":memory:\"\n",
        support::clients()
    )
}

async fn replicas(n: usize, upstream: &str, redis: &str, namespace: &str) -> Vec<Observed> {
    replicas_of(n, &config(upstream, redis, namespace)).await
}

fn book() -> Value {
    json!({"origin": "CDG", "destination": "JFK", "date": "2026-12-24", "passengers": 1})
}

/// A raw 2026 `tools/call` as alice in conversation `conversation`, sent to
/// `replica`; the JSON-RPC result.
async fn in_conversation(replica: &Observed, conversation: &str, name: &str, args: Value) -> Value {
    let mut meta = support::modern_meta();
    meta["io.portcullis/conversation"] = conversation.into();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": name, "arguments": args, "_meta": meta}});
    let headers = support::modern_call_headers(ALICE, name);
    let raw = support::raw_post(
        &replica.url("py"),
        &support::borrow(&headers),
        body.to_string(),
    )
    .await;
    assert_eq!(raw.status, 200, "{}", raw.text);
    raw.body["result"].clone()
}

fn ran(result: &Value, what: &str) {
    assert_eq!(refusal_code(result), "", "{what}: {result}");
    assert_eq!(result["isError"], false, "{what}: {result}");
}

fn flights(upstream: &PeerServer) -> usize {
    upstream
        .ran()
        .iter()
        .filter(|t| *t == "book_flight")
        .count()
}

/// The keys matching `pattern`, from a `KEYS` reply.
fn keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    redis
        .command(&format!("KEYS {pattern}"))
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with('$'))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_read_through_two_replicas_is_refused_its_egress_call_through_a_third() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    let prod = replicas(3, &upstream.url, &redis.url(), "prod").await;
    let staging = replicas(1, &upstream.url, &redis.url(), "staging").await;
    let (one, two, three) = (&prod[0], &prod[1], &prod[2]);

    ran(
        &in_conversation(one, "c1", "echo", json!({"text": "the quarterly numbers"})).await,
        "the private read through replica 1",
    );
    ran(
        &in_conversation(two, "c1", "leaky_text", json!({})).await,
        "the untrusted read through replica 2",
    );
    let refused = in_conversation(three, "c1", "book_flight", book()).await;
    assert_eq!(refusal_code(&refused), "flow_denied", "{refused}");
    assert_eq!(refused["isError"], true);
    let text = refused["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("private (echo on py)"), "{text}");
    assert!(text.contains("untrusted (leaky_text on py)"), "{text}");
    let holds = &refused["_meta"]["portcullis/error"]["holds"];
    assert_eq!(holds[0]["tool"], "echo", "{holds}");
    assert_eq!(holds[1]["tool"], "leaky_text", "{holds}");
    assert_eq!(
        flights(&upstream),
        0,
        "the refused call never reached the server"
    );

    // Through every replica alike; another conversation of the same client holds nothing.
    for replica in [one, two] {
        let again = in_conversation(replica, "c1", "book_flight", book()).await;
        assert_eq!(refusal_code(&again), "flow_denied", "{again}");
    }
    ran(
        &in_conversation(three, "c2", "book_flight", book()).await,
        "another conversation's egress call",
    );
    // Another deployment on the same Redis sees none of prod's labels.
    ran(
        &in_conversation(&staging[0], "c1", "book_flight", book()).await,
        "the other deployment's egress call",
    );
    assert_eq!(flights(&upstream), 2);

    // The audit of the replica that read the private tool says it set the label, once.
    let admin = support::admin::Admin::at(&one.admin, Some(ADMIN_TOKEN));
    let mut sets = Vec::new();
    for _ in 0..100 {
        sets = (admin.events().await.iter())
            .flat_map(|e| e["violations"].as_array().cloned().unwrap_or_default())
            .filter(|v| v.as_str().is_some_and(|v| v.starts_with("flow: sets")))
            .collect::<Vec<_>>();
        if !sets.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sets, [json!("flow: sets private")]);

    // Every flow key is in prod's namespace, with a TTL (a day, renewed on use).
    let flow_keys = keys(&redis, "portcullis:*:flow*");
    assert!(!flow_keys.is_empty());
    for key in &flow_keys {
        assert!(key.starts_with("portcullis:prod:"), "{key}");
        let ttl = redis.command(&format!("PTTL {key}"));
        let ttl: i64 = ttl.trim().trim_start_matches(':').parse().expect("PTTL");
        assert!(ttl > 23 * 3600 * 1000, "{key} has a TTL: {ttl}");
    }
    // The conversation's own session and alice's client-wide one.
    assert_eq!(
        keys(&redis, "portcullis:prod:flow:*").len(),
        2,
        "{flow_keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_session_through_haproxy_round_robin_is_refused_its_egress_call() {
    if !tiers::ready(&[Tier::Python, Tier::Redis, Tier::Haproxy]) {
        return;
    }
    let redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    let fleet = replicas(3, &upstream.url, &redis.url(), "prod").await;
    let backends: Vec<String> = fleet.iter().map(|r| r.addr.clone()).collect();
    let balancer = Haproxy::start(&backends);
    let url = balancer.url("/mcp/py");
    let private = call("echo", json!({"text": "the quarterly numbers"}));
    let untrusted = call("leaky_text", json!({}));
    let egress = call("book_flight", book());

    // One SDK client is one session; its requests go round the replicas.
    let out = support::sdk(
        Sdk::Python,
        Mode::Legacy,
        &url,
        ALICE,
        json!([private, untrusted, egress]),
    )
    .await;
    assert_eq!(gateway_code(&out[0]), None, "{}", out[0]);
    assert_eq!(gateway_code(&out[1]), None, "{}", out[1]);
    assert_eq!(gateway_code(&out[2]), Some("flow_denied"), "{}", out[2]);
    let text = out[2]["text"].as_str().unwrap_or_default();
    assert!(text.contains("private (echo on py)"), "{text}");
    assert!(text.contains("untrusted (leaky_text on py)"), "{text}");
    assert_eq!(flights(&upstream), 0);

    // Another session of the same client is unaffected.
    let other = support::sdk(Sdk::Python, Mode::Legacy, &url, ALICE, json!([egress])).await;
    assert_eq!(gateway_code(&other[0]), None, "{}", other[0]);
    assert_eq!(other[0]["isError"], false, "{}", other[0]);
    assert_eq!(flights(&upstream), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_a_sink_and_a_source_are_refused_naming_the_store_never_forwarded() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    let mut redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    let fleet = replicas(2, &upstream.url, &redis.url(), "prod").await;
    ran(
        &in_conversation(&fleet[0], "c1", "echo", json!({"text": "x"})).await,
        "the private read",
    );

    redis.stop();
    let before = upstream.ran().len();
    // A sink under a flow rule: what the session holds cannot be known.
    let sink = in_conversation(&fleet[1], "c1", "book_flight", book()).await;
    assert_eq!(refusal_code(&sink), "state_unavailable", "{sink}");
    assert_eq!(sink["_meta"]["portcullis/error"]["store"], "redis");
    assert_eq!(sink["isError"], true);
    // A source: its label could not be kept, so its result is not read.
    let source = in_conversation(&fleet[0], "c1", "leaky_text", json!({})).await;
    assert_eq!(refusal_code(&source), "state_unavailable", "{source}");
    assert_eq!(source["_meta"]["portcullis/error"]["store"], "redis");
    let text = source["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("redis state store is unreachable"), "{text}");
    assert_eq!(upstream.ran().len(), before, "nothing was forwarded");
    // A tool that is neither runs.
    ran(
        &in_conversation(&fleet[1], "c1", "huge", json!({"size": 10})).await,
        "an unlabelled call",
    );
    assert!(
        fleet[0]
            .output()
            .iter()
            .any(|l| l.contains("flow label store unreachable")),
        "a log line names the store"
    );

    // Once Redis is back (a new, empty one: the labels of the outage are
    // gone with it), each replica reconnects by itself and decides again.
    redis.restart();
    let mut last = Value::Null;
    for _ in 0..50 {
        last = in_conversation(&fleet[0], "c1", "leaky_text", json!({})).await;
        if refusal_code(&last) != "state_unavailable" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ran(&last, "the untrusted read once Redis is back");
    ran(
        &in_conversation(&fleet[0], "c1", "echo", json!({"text": "x"})).await,
        "the private read once Redis is back",
    );
    let mut refused = Value::Null;
    for _ in 0..50 {
        refused = in_conversation(&fleet[1], "c1", "book_flight", book()).await;
        if refusal_code(&refused) != "state_unavailable" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(refusal_code(&refused), "flow_denied", "{refused}");
    assert_eq!(flights(&upstream), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_call_held_for_an_operator_never_runs_when_redis_stops_before_the_yes() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    let mut redis = RedisServer::start();
    let upstream = PeerServer::start(Peer::Python).await;
    // A short hold: with Redis gone, the held call ends at its deadline.
    let rule = "approval = { by = \"operator\", timeout = \"3s\", reason = \"egress after private and untrusted\" }\n\
                flow = { holds = [\"private\", \"untrusted\"], then = \"approval\" }\n";
    let text = config_with(&upstream.url, &redis.url(), "prod", rule);
    let (one, two) = (Observed::start(&text).await, Observed::start(&text).await);
    ran(
        &in_conversation(&one, "c1", "echo", json!({"text": "x"})).await,
        "the private read",
    );
    ran(
        &in_conversation(&one, "c1", "leaky_text", json!({})).await,
        "the untrusted read",
    );
    // Through replica 2, which saw neither read: held for an operator.
    let url = two.url("py");
    let held = tokio::spawn(async move {
        let mut meta = support::modern_meta();
        meta["io.portcullis/conversation"] = "c1".into();
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "book_flight", "arguments": book(), "_meta": meta}});
        let headers = support::modern_call_headers(ALICE, "book_flight");
        support::raw_post(&url, &support::borrow(&headers), body.to_string()).await
    });
    let operator = support::admin::Admin::at(&two.admin, Some(ADMIN_TOKEN));
    let entry = operator.first_pending().await;
    let id = entry["id"].as_str().expect("queued id").to_owned();

    // Redis goes away before the operator's yes: the fleet's queue cannot
    // take the decision (nothing is decided), and the held call, which can
    // neither learn a decision nor read its labels again, ends unrun.
    redis.stop();
    let (status, body) = operator.decide(&id, "approve").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["store"], "redis", "{body}");
    let out = held.await.expect("the held call answers");
    let result = &out.body["result"];
    assert_eq!(refusal_code(result), "state_unavailable", "{}", out.text);
    assert_eq!(result["_meta"]["portcullis/error"]["store"], "redis");
    assert_eq!(flights(&upstream), 0, "the egress call never ran");
}

/// One step of a session store's life: a client reads (`None`) or records
/// a mark in one of its sessions.
type Step = (u8, u8, Option<(bool, u8)>);

fn key(client: u8, scope: u8) -> SessionKey {
    SessionKey {
        client: ClientId::named(&format!("client-{client}")),
        scope: format!("conversation:{scope}"),
    }
}

fn mark((private, tool): (bool, u8)) -> Mark {
    Mark {
        label: if private {
            Label::Private
        } else {
            Label::Untrusted
        },
        server: "py".into(),
        name: format!("tool-{tool}"),
        via: Via::Tool,
    }
}

#[test]
fn the_redis_store_holds_what_the_memory_store_holds_under_the_same_bounds() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // No pressure on the bound in all here: which client holds the most is
    // a tie the two stores may break differently (see the next test).
    let limits = FlowLimits {
        sessions: 1000,
        sessions_per_client: 3,
        marks_per_label: 2,
    };
    let step = (
        0u8..3,
        0u8..6,
        proptest::option::of((any::<bool>(), 0u8..4)),
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(24));
    let case = std::cell::Cell::new(0u32);
    runner
        .run(
            &proptest::collection::vec(step, 1..60),
            |steps: Vec<Step>| {
                case.set(case.get() + 1);
                let memory = MemoryFlows::new(limits);
                let held = runtime.block_on(async {
                    let shared =
                        RedisFlows::new(&redis.url(), &format!("case{}", case.get()), limits)
                            .expect("store");
                    let mut out = Vec::new();
                    for (client, scope, write) in &steps {
                        let key = key(*client, *scope);
                        match write {
                            Some(m) => {
                                memory.record(&key, mark(*m));
                                shared
                                    .record(std::slice::from_ref(&key), &mark(*m))
                                    .await
                                    .expect("redis");
                            }
                            None => {
                                let there = shared.held(&key).await.expect("redis");
                                out.push((memory.held(&key), there));
                            }
                        }
                    }
                    // Then every session, as each store holds it.
                    for client in 0..3 {
                        for scope in 0..6 {
                            let key = key(client, scope);
                            let there = shared.held(&key).await.expect("redis");
                            out.push((memory.held(&key), there));
                        }
                    }
                    out
                });
                for (here, there) in held {
                    prop_assert_eq!(here, there);
                }
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_is_bounded_in_all_and_a_flood_drops_the_flooders_sessions() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    let limits = FlowLimits {
        sessions: 10,
        sessions_per_client: 4,
        marks_per_label: 2,
    };
    let store = RedisFlows::new(&redis.url(), "bounds", limits).expect("store");
    let alice = key(0, 0);
    store
        .record(std::slice::from_ref(&alice), &mark((true, 0)))
        .await
        .expect("redis");
    // Five more clients, each past its own bound: 1 + 5 × 4 sessions wanted, 10 kept.
    for client in 1..=5u8 {
        for scope in 0..8u8 {
            let k = key(client, scope);
            store
                .record(std::slice::from_ref(&k), &mark((false, 1)))
                .await
                .expect("redis");
        }
    }
    let card = |k: &str| -> i64 {
        redis
            .command(&format!("ZCARD {k}"))
            .trim()
            .trim_start_matches(':')
            .parse()
            .expect("ZCARD")
    };
    assert!(card("portcullis:bounds:flows:all") <= 10);
    assert_eq!(
        keys(&redis, "portcullis:bounds:flow:*").len() as i64,
        card("portcullis:bounds:flows:all")
    );
    let mut per_client = BTreeMap::new();
    for k in keys(&redis, "portcullis:bounds:flows-of:*") {
        per_client.insert(k.clone(), card(&k));
    }
    assert!(per_client.values().all(|n| *n <= 4), "{per_client:?}");
    // Alice, holding the fewest, kept hers.
    assert_eq!(
        store.held(&alice).await.expect("redis"),
        vec![mark((true, 0))]
    );
    // A label keeps at most two of its calls; a known one is not added twice.
    for tool in [0, 0, 2, 3] {
        store
            .record(std::slice::from_ref(&alice), &mark((true, tool)))
            .await
            .expect("redis");
    }
    let held = store.held(&alice).await.expect("redis");
    assert_eq!(held, vec![mark((true, 0)), mark((true, 2))]);
}
