//! One Redis round trip per plain call, and refunds: through the gateway,
//! against a real redis-server whose own command statistics count the
//! script runs (`INFO commandstats`), a plain `tools/call` is one script run
//! and a call refused after its take is two (take, refund) with the bucket
//! as it was; through the limiter's API, every state of a refund on Redis,
//! and Redis and memory agreeing on random takes and refunds.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use std::num::NonZeroU32;
use std::sync::Arc;

use portcullis::config::OnBackendError;
use portcullis::policy::{Rate, RateKey};
use portcullis::ratelimit::clock::FakeClock;
use portcullis::ratelimit::gcra::{NANOS_PER_SEC, Quota};
use portcullis::ratelimit::{Bucket, RateLimiter, Refunded, Taken, Verdict};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{Value, json};
use support::redis::RedisServer;
use support::upstreams::InProcess;
use support::{ALICE, TestGateway, modern_call};

const SEC: u64 = NANOS_PER_SEC;
/// An instant of Redis time for the explicit-clock tests (2026, in ns since the epoch).
const EPOCH_2026: u64 = 1_780_000_000 * SEC;

/// Times Redis ran `command` since the last `CONFIG RESETSTAT` (0 when never).
fn calls(redis: &RedisServer, command: &str) -> u64 {
    let stats = redis.command("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

/// Every script run Redis executed: EVALSHA, EVAL, and script loads.
fn script_runs(redis: &RedisServer) -> (u64, u64, u64) {
    (
        calls(redis, "evalsha"),
        calls(redis, "eval"),
        calls(redis, "script|load") + calls(redis, "script"),
    )
}

/// The bucket keys Redis holds and their values.
fn buckets(redis: &RedisServer) -> Vec<(String, String)> {
    let keys = redis.command("KEYS portcullis:*:rl:*");
    keys.lines()
        .filter(|l| l.starts_with("portcullis:"))
        .map(|k| {
            let value = redis.command(&format!("GET {k}"));
            (
                k.to_owned(),
                value.lines().nth(1).unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

async fn call(http: &reqwest::Client, url: &str, id: u64, arguments: Value) -> Value {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {ALICE}"))
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .body(modern_call(id, "echo", arguments))
        .send()
        .await
        .expect("the gateway answers");
    let text = response.text().await.unwrap_or_default();
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

fn code(response: &Value) -> Option<&str> {
    response["result"]["_meta"]["portcullis/error"]["code"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_call_is_one_script_run_and_a_refused_one_is_given_back() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let mut redis = RedisServer::start();
    let upstream = InProcess::demo().await;
    // A hundred tokens, one more every thousand seconds: no refill during the test.
    let config = Config::new()
        .admin_token(support::ADMIN)
        .server("demo", &upstream.url)
        .clients()
        .allow(&["echo"])
        .set("servers", vec!["demo"])
        .set_raw(
            "rate",
            "{ burst = 100, per_second = 0.001, key = \"client+tool\" }",
        )
        .section("rate_limit")
        .set("backend", "redis")
        .set("redis_url", redis.url().as_str())
        .set("on_backend_error", "deny");
    let gateway = TestGateway::start_config(&config).await;
    let url = gateway.url("demo");
    let http = support::http();

    // The first call connects and loads the script; from then on, count.
    let r = call(&http, &url, 1, json!({"text": "warm"})).await;
    assert!(r["result"]["isError"].is_null(), "{r}");
    redis.command("CONFIG RESETSTAT");
    const N: u64 = 12;
    for id in 0..N {
        let r = call(&http, &url, 10 + id, json!({"text": "x"})).await;
        assert!(r["result"]["isError"].is_null(), "{r}");
    }
    assert_eq!(
        script_runs(&redis),
        (N, 0, 0),
        "{N} plain calls, {N} script runs"
    );
    assert_eq!(upstream.ran().len() as u64, N + 1);

    // Refused by the schema after its take: a take and a refund, and the
    // bucket holds exactly what it held before.
    let before = buckets(&redis);
    assert_eq!(before.len(), 1, "{before:?}");
    redis.command("CONFIG RESETSTAT");
    let r = call(&http, &url, 100, json!({"text": 5})).await;
    assert_eq!(code(&r), Some("invalid_arguments"), "{r}");
    assert_eq!(script_runs(&redis), (2, 0, 0), "take, then refund");
    assert_eq!(buckets(&redis), before, "the token is back");
    assert_eq!(upstream.ran().len() as u64, N + 1, "not forwarded");

    // What the store could not do is counted in /metrics, never silent.
    let admin = gateway.admin(support::ADMIN);
    let metrics = admin.metrics().await;
    assert_eq!(
        counter(&metrics, "portcullis_rate_limit_refunds_lost_total"),
        0,
        "{metrics}"
    );
    assert_eq!(
        counter(&metrics, "portcullis_rate_limit_backend_errors_total"),
        0,
        "{metrics}"
    );
    redis.stop();
    let r = call(&http, &url, 200, json!({"text": "y"})).await;
    assert_eq!(code(&r), Some("rate_limited"), "Redis away, deny: {r}");
    let metrics = admin.metrics().await;
    assert!(
        counter(&metrics, "portcullis_rate_limit_backend_errors_total") >= 1,
        "{metrics}"
    );
    assert_eq!(upstream.ran().len() as u64, N + 1, "not forwarded");
    gateway.stop().await;
}

/// The value of the counter `name` in an OpenMetrics text (panics when absent).
fn counter(metrics: &str, name: &str) -> u64 {
    let prefix = format!("{name} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
        .trim()
        .parse()
        .expect("a count")
}

fn bucket(key: &str, burst: u32, interval: u64) -> Bucket {
    let quota = Quota::new(NonZeroU32::new(burst).expect("burst > 0"), interval);
    Bucket {
        key: format!("refund-{}-{key}", std::process::id()),
        quota,
        rule: 0,
        rate: Rate {
            burst: quota.burst(),
            per_second: SEC as f64 / interval as f64,
            key: RateKey::ClientTool,
        },
    }
}

fn redis_limiter(server: &RedisServer, rt: &tokio::runtime::Runtime) -> RateLimiter {
    let _guard = rt.enter();
    RateLimiter::redis(&server.url(), OnBackendError::Deny).expect("redis limiter")
}

async fn admitted_at(l: &RateLimiter, b: &[Bucket], now: u64, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if l.check_at(b, now).await == Verdict::Admitted {
            ok += 1;
        }
    }
    ok
}

/// Every state of a refund through Redis: exact when no take came since,
/// nothing to give back when the bucket refilled, kept (and counted) when
/// another take came since, per bucket for a call of several, nothing when
/// nothing was taken; and when Redis does not answer, the token stays taken,
/// counted, whatever `on_backend_error` says.
#[test]
fn every_state_of_a_refund_through_redis() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let mut server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let l = redis_limiter(&server, &rt);
    let now = EPOCH_2026;
    rt.block_on(async {
        // Exact: three tokens, two calls kept, one given back.
        let b = [bucket("exact", 3, 10 * SEC)];
        for _ in 0..2 {
            assert_eq!(l.take_at(&b, now).await.0, Verdict::Admitted);
        }
        let (verdict, taken) = l.take_at(&b, now).await;
        assert_eq!(verdict, Verdict::Admitted);
        assert_eq!(l.refund_at(&b, &taken, now).await, Refunded::Returned);
        assert_eq!(admitted_at(&l, &b, now, 3).await, 1);

        // Refilled: nothing owed, the bucket is full and no fuller.
        let b = [bucket("refilled", 2, SEC)];
        let (_, taken) = l.take_at(&b, now).await;
        assert_eq!(
            l.refund_at(&b, &taken, now + 5 * SEC).await,
            Refunded::Returned
        );
        assert_eq!(admitted_at(&l, &b, now + 5 * SEC, 4).await, 2);

        // Another take since: the first refund keeps its token, the last is exact.
        let b = [bucket("spent", 3, 10 * SEC)];
        let (_, first) = l.take_at(&b, now).await;
        let (_, second) = l.take_at(&b, now).await;
        assert_eq!(l.refund_at(&b, &first, now).await, Refunded::Spent(1));
        assert_eq!(l.refund_at(&b, &second, now).await, Refunded::Returned);
        assert_eq!(admitted_at(&l, &b, now, 3).await, 2);
        assert_eq!(l.refunds_lost(), 1);

        // Several buckets: decided one by one.
        let (a, c) = (bucket("pa", 2, 10 * SEC), bucket("pc", 2, 10 * SEC));
        let both = [a.clone(), c.clone()];
        let (_, taken) = l.take_at(&both, now).await;
        assert_eq!(
            l.check_at(std::slice::from_ref(&c), now).await,
            Verdict::Admitted
        );
        assert_eq!(l.refund_at(&both, &taken, now).await, Refunded::Spent(1));
        assert_eq!(admitted_at(&l, &[a], now, 3).await, 2);
        assert_eq!(admitted_at(&l, &[c], now, 3).await, 0);
        assert_eq!(l.refunds_lost(), 2);

        // Refused: nothing taken, nothing to give back.
        let b = [bucket("none", 1, 10 * SEC)];
        assert_eq!(l.take_at(&b, now).await.0, Verdict::Admitted);
        let (verdict, taken) = l.take_at(&b, now).await;
        assert!(matches!(verdict, Verdict::Limited { .. }), "{verdict:?}");
        assert!(taken.is_empty());
        assert_eq!(l.refund_at(&b, &taken, now).await, Refunded::Returned);
    });
    assert_eq!(l.backend_errors(), 0);

    // Redis away between the take and the refund: the token stays taken.
    let allow = {
        let _guard = rt.enter();
        RateLimiter::redis(&server.url(), OnBackendError::Allow).expect("limiter")
    };
    let b = [bucket("away", 2, 10 * SEC)];
    let taken: Vec<Taken> = rt.block_on(async {
        let (_, a) = l.take_at(&b, now).await;
        let (_, c) = allow.take_at(&b, now).await;
        vec![a, c]
    });
    server.stop();
    rt.block_on(async {
        assert_eq!(l.refund_at(&b, &taken[0], now).await, Refunded::Unreachable);
        assert_eq!(
            allow.refund_at(&b, &taken[1], now).await,
            Refunded::Unreachable
        );
    });
    assert_eq!(l.refunds_lost(), 3);
    assert_eq!(allow.refunds_lost(), 1);
    assert!(l.backend_errors() >= 1 && allow.backend_errors() >= 1);
}

/// Random takes and refunds (of any earlier take, in any order) on two
/// buckets, in lockstep on Redis and in memory at explicit instants: the
/// same verdict and the same refund outcome every time.
#[test]
fn redis_and_memory_agree_on_takes_and_refunds() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let redis = redis_limiter(&server, &rt);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = proptest::collection::vec(
        (0u64..2 * SEC, 1u8..=3, proptest::bool::ANY, 0usize..16),
        1..60,
    );
    let case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&strategy, |ops| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let all = [
                bucket(&format!("x{n}"), 2, SEC),
                bucket(&format!("y{n}"), 3, SEC / 2),
            ];
            let memory = RateLimiter::memory(Arc::new(FakeClock::at(1)));
            rt.block_on(async {
                let mut out: Vec<(Vec<Bucket>, Taken, Taken)> = Vec::new();
                let mut now = EPOCH_2026 + 987_654_321;
                for (dt, mask, refund, pick) in &ops {
                    now += dt;
                    if *refund && !out.is_empty() {
                        let (b, shared, local) = out.remove(pick % out.len());
                        let r = redis.refund_at(&b, &shared, now).await;
                        prop_assert_eq!(r, memory.refund_at(&b, &local, now).await);
                    } else {
                        let b: Vec<Bucket> = (0..2)
                            .filter(|i| mask & (1 << i) != 0)
                            .map(|i| all[i].clone())
                            .collect();
                        let (shared, st) = redis.take_at(&b, now).await;
                        let (local, lt) = memory.take_at(&b, now).await;
                        prop_assert_eq!(shared, local, "at {}", now);
                        if shared == Verdict::Admitted {
                            out.push((b, st, lt));
                        }
                    }
                }
                Ok(())
            })
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(redis.backend_errors(), 0);
}
