//! Two gateway processes (the real binary, each on its own port) sharing one
//! real redis-server: together they admit what one bucket allows, not twice
//! that; and when Redis goes away they follow `on_backend_error`, keep
//! serving, and recover by themselves when it comes back. Two deployments
//! sharing that Redis (`[state] namespace`) share no bucket.

use crate::support;
use support::Config;
use support::fleet::send_echo;
use support::tiers::{self, Tier};

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::ALICE;
use support::redis::RedisServer;
use support::upstreams::InProcess;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A gateway process, killed by its PID when dropped.
struct Replica {
    child: Child,
    url: String,
    log: Arc<Mutex<Vec<String>>>,
    /// In a directory of its own, so are the default stores beside it.
    _config: support::ConfigFile,
}

impl Replica {
    /// Runs `portcullis run --config FILE` in front of `upstream` with `redis`
    /// as the rate-limit backend, and waits until it listens.
    async fn start(upstream: &str, redis: &str, on_error: &str, rate: &str) -> Self {
        Self::start_in(upstream, redis, on_error, rate, None).await
    }

    /// [`Replica::start`], as a replica of deployment `namespace` when given.
    async fn start_in(
        upstream: &str,
        redis: &str,
        on_error: &str,
        rate: &str,
        namespace: Option<&str>,
    ) -> Self {
        let mut config = Config::new()
            .server("demo", upstream)
            .clients()
            .allow(&["echo"])
            .set("servers", vec!["demo"])
            .set_raw("rate", rate)
            .section("rate_limit")
            .set("backend", "redis")
            .set("redis_url", redis)
            .set("on_backend_error", on_error);
        if let Some(namespace) = namespace {
            config = config.section("state").set("namespace", namespace);
        }
        let text = config.render();
        let config = support::ConfigFile::new(&text);
        let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .arg("run")
            .arg("--config")
            .arg(config.path())
            // Start-up and rate-limit lines only, not one line per request.
            .env("RUST_LOG", "warn,portcullis=info,portcullis::proxy=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the portcullis binary starts");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sink = log.clone();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && v["message"] == "listening"
                    && let (Some(addr), Some(tx)) = (v["mcp"].as_str(), tx.take())
                {
                    let _ = tx.send(addr.to_owned());
                }
                sink.lock().expect("log").push(line);
            }
        });
        let addr = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("the gateway did not start: {:?}", log.lock()));
        Self {
            child,
            url: format!("http://{addr}/mcp/demo"),
            log,
            _config: config,
        }
    }

    fn logged(&self, needle: &str) -> bool {
        self.log
            .lock()
            .expect("log")
            .iter()
            .any(|l| l.contains(needle))
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// One 2026-07-28 `tools/call` of `echo`; the parsed JSON-RPC response.
async fn echo(http: &reqwest::Client, url: &str) -> Value {
    let response = send_echo(http, url, "x")
        .await
        .expect("the gateway answers");
    let text = response.text().await.unwrap_or_default();
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

fn code(response: &Value) -> Option<&str> {
    response["result"]["_meta"]["portcullis/error"]["code"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_bucket_through_redis() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    // Admissions are counted against the wall clock (see `support::exclusive`).
    let _alone = support::exclusive().await;
    const BURST: u64 = 5;
    const PER_SECOND: f64 = 2.0;
    let redis = RedisServer::start();
    let upstream = InProcess::demo().await;
    let rate = format!("{{ burst = {BURST}, per_second = {PER_SECOND}, key = \"client+tool\" }}");
    let a = Replica::start(&upstream.url, &redis.url(), "deny", &rate).await;
    let b = Replica::start(&upstream.url, &redis.url(), "deny", &rate).await;
    let http = support::http();

    // Two callers per replica, each a call every 10 ms, for 10 s (and at most
    // 2,000 calls each).
    let started = Instant::now();
    let deadline = started + Duration::from_secs(10);
    let mut loops = Vec::new();
    for url in [&a.url, &a.url, &b.url, &b.url] {
        let (http, url) = (http.clone(), url.clone());
        loops.push(tokio::spawn(async move {
            let (mut admitted, mut limited) = (0u64, 0u64);
            let (mut first, mut last) = (None, Instant::now());
            for _ in 0..2_000 {
                if Instant::now() >= deadline {
                    break;
                }
                first.get_or_insert_with(Instant::now);
                let r = echo(&http, &url).await;
                last = Instant::now();
                match code(&r) {
                    None if r["result"]["isError"].is_null() => admitted += 1,
                    Some("rate_limited") => limited += 1,
                    _ => panic!("unexpected answer: {r}"),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (admitted, limited, first.unwrap_or(last), last)
        }));
    }
    let (mut admitted, mut limited) = (0, 0);
    let (mut first, mut last) = (deadline, started);
    for l in loops {
        let (x, y, f, z) = l.await.expect("caller");
        admitted += x;
        limited += y;
        first = first.min(f);
        last = last.max(z);
    }
    // T: from the first call sent to the last answer received; Redis saw
    // every call inside that window.
    let elapsed = last.duration_since(first).as_secs_f64();
    let expected = BURST + (PER_SECOND * elapsed).floor() as u64;
    eprintln!(
        "admitted {admitted}, expected {expected} ± 1 over {elapsed:.2} s; {limited} refused"
    );
    assert!(
        admitted.abs_diff(expected) <= 1,
        "admitted {admitted} over {elapsed:.2} s, expected {expected} ± 1 ({limited} refused)"
    );
    assert!(limited > admitted, "the callers did saturate the bucket");
    assert_eq!(
        upstream.ran().len() as u64,
        admitted,
        "the upstream ran exactly the admitted calls"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_follow_on_backend_error_while_redis_is_down_and_recover() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let mut redis = RedisServer::start();
    let upstream = InProcess::demo().await;
    let rate = "{ burst = 1000, per_second = 100.0, key = \"client+tool\" }";
    let deny = Replica::start(&upstream.url, &redis.url(), "deny", rate).await;
    let allow = Replica::start(&upstream.url, &redis.url(), "allow", rate).await;
    let http = support::http();
    for replica in [&deny, &allow] {
        let r = echo(&http, &replica.url).await;
        assert!(r["result"]["isError"].is_null(), "Redis up: {r}");
    }

    redis.stop();
    let ran_before = upstream.ran().len();
    for _ in 0..3 {
        let r = echo(&http, &deny.url).await;
        assert_eq!(code(&r), Some("rate_limited"), "deny: {r}");
        let error = &r["result"]["_meta"]["portcullis/error"];
        assert_eq!(error["reason"], "backend_unavailable", "{r}");
        assert!(error["limit"].is_null());
        let r = echo(&http, &allow.url).await;
        assert!(r["result"]["isError"].is_null(), "allow: {r}");
    }
    assert_eq!(
        upstream.ran().len(),
        ran_before + 3,
        "only the allow replica's calls ran"
    );
    // The deny replica keeps serving what takes no token.
    let list = http
        .post(&deny.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {ALICE}"))
        .body(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .send()
        .await
        .expect("answer");
    let list: Value = serde_json::from_str(&list.text().await.unwrap_or_default()).expect("JSON");
    assert!(list["result"]["tools"].is_array(), "{list}");
    for replica in [&deny, &allow] {
        assert!(
            replica.logged("rate-limit backend unreachable"),
            "a log line says so: {:?}",
            replica.log.lock()
        );
    }

    redis.restart();
    let mut recovered = false;
    for _ in 0..100 {
        let r = echo(&http, &deny.url).await;
        if r["result"]["isError"].is_null() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recovered,
        "the deny replica serves again once Redis is back"
    );
    let r = echo(&http, &allow.url).await;
    assert!(r["result"]["isError"].is_null(), "{r}");
    assert!(
        deny.logged("rate-limit backend reachable again"),
        "{:?}",
        deny.log.lock()
    );
    deny.stop().await;
    allow.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_one_deployment_share_buckets_and_two_deployments_do_not() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    let upstream = InProcess::demo().await;
    // Three calls, then one more a thousand seconds later: no refill during the test.
    let rate = "{ burst = 3, per_second = 0.001, key = \"client+tool\" }";
    let url = redis.url();
    let start = |ns: &'static str| Replica::start_in(&upstream.url, &url, "deny", rate, Some(ns));
    let (prod_a, prod_b) = (start("prod").await, start("prod").await);
    let staging = start("staging").await;
    let http = support::http();

    // prod's one bucket: three calls in all, whichever replica takes them.
    for url in [&prod_a.url, &prod_b.url, &prod_a.url] {
        let r = echo(&http, url).await;
        assert!(r["result"]["isError"].is_null(), "within prod's burst: {r}");
    }
    for url in [&prod_b.url, &prod_a.url] {
        let r = echo(&http, url).await;
        assert_eq!(
            code(&r),
            Some("rate_limited"),
            "prod's bucket is empty: {r}"
        );
    }
    // staging, on the same Redis, has its own.
    for _ in 0..3 {
        let r = echo(&http, &staging.url).await;
        assert!(
            r["result"]["isError"].is_null(),
            "staging's own bucket: {r}"
        );
    }
    let r = echo(&http, &staging.url).await;
    assert_eq!(code(&r), Some("rate_limited"), "{r}");
    assert_eq!(upstream.ran().len(), 6);

    // Each bucket is one key in its deployment's namespace, with a TTL.
    for ns in ["prod", "staging"] {
        let keys = redis.command(&format!("KEYS portcullis:{ns}:rl:*"));
        assert!(keys.starts_with("*1\r\n"), "{ns}: {keys:?}");
        let key = keys.lines().nth(2).expect("one key").to_owned();
        let ttl = redis.command(&format!("PTTL {key}"));
        let ttl: i64 = ttl.trim().trim_start_matches(':').parse().expect("PTTL");
        assert!(ttl > 0, "{key}: {ttl}");
    }
    let outside = redis.command("KEYS portcullis:rl:*");
    assert!(
        outside.starts_with("*0"),
        "no bucket outside a namespace: {outside:?}"
    );
    for replica in [prod_a, prod_b, staging] {
        replica.stop().await;
    }
}
