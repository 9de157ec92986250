//! Rate-limit figures for BENCHMARKS.md: `cargo bench --bench ratelimit`.
//!
//! 1. criterion: one in-memory check (admitted, refused, two buckets), the
//!    buckets of a call built from the policy, and one Redis round trip (the
//!    script, over loopback) when `redis-server` is installed;
//! 2. printed after it: memory for 10k, 100k and 1M keys (resident memory of a
//!    child process that holds only the limiter, and the tables' own size);
//!    latency percentiles of one check under 64-way contention (64 threads on
//!    one key, on 64 keys, and with two buckets per call).

#[path = "../tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_server;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::Criterion;
use futures_util::FutureExt as _;
use portcullis::auth::ClientId;
use portcullis::config::OnBackendError;
use portcullis::policy::{Rate, RateKey, Subject};
use portcullis::ratelimit::clock::MonotonicClock;
use portcullis::ratelimit::gcra::{NANOS_PER_SEC, Quota};
use portcullis::ratelimit::{Bucket, RateLimiter, RatePlan, Verdict, bucket_key};

const TAG: &str = "9f86d081884c7d65";

fn bucket(key: String, burst: u32, interval: u64) -> Bucket {
    let quota = Quota::new(NonZeroU32::new(burst).expect("burst"), interval);
    Bucket {
        key,
        quota,
        rule: 0,
        rate: Rate {
            burst: quota.burst(),
            per_second: NANOS_PER_SEC as f64 / interval as f64,
            key: RateKey::ClientTool,
        },
    }
}

/// A bucket that never refuses at benchmark speed (10⁹ tokens, 10⁹ a second).
fn open(client: &str) -> Bucket {
    let key = bucket_key(
        TAG,
        RateKey::ClientTool,
        &ClientId::named(client),
        "flights",
        Subject::Tool("search_flights"),
    );
    bucket(key, 1_000_000_000, 1)
}

fn memory() -> RateLimiter {
    RateLimiter::memory(Arc::new(MonotonicClock::new()))
}

fn check_now(limiter: &RateLimiter, buckets: &[Bucket]) -> Verdict {
    limiter
        .check(buckets)
        .now_or_never()
        .expect("the memory backend answers at once")
}

fn criterion_benches(c: &mut Criterion) {
    let limiter = memory();
    let one = [open("alice")];
    c.bench_function("memory check, 1 bucket, admitted", |b| {
        b.iter(|| check_now(&limiter, black_box(&one)))
    });
    let shut = [bucket(format!("{TAG}/all"), 1, 3_600 * NANOS_PER_SEC)];
    check_now(&limiter, &shut);
    c.bench_function("memory check, 1 bucket, refused", |b| {
        b.iter(|| check_now(&limiter, black_box(&shut)))
    });
    let two = [
        open("alice"),
        bucket(format!("{TAG}/client/5:alice"), 1_000_000_000, 1),
    ];
    c.bench_function("memory check, 2 buckets, admitted", |b| {
        b.iter(|| check_now(&limiter, black_box(&two)))
    });

    let config = portcullis::config::load_str(
        &format!(
            "[servers.flights]\nurl = \"http://127.0.0.1:1/mcp\"\n[clients.alice]\napi_key_sha256 = \"{}\"\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"flights\"]\ntools = [\"search_*\"]\naction = \"allow\"\n\
             rate = {{ burst = 10, per_second = 2.0, key = \"client+tool\" }}\n",
            "0".repeat(64)
        ),
        "bench.toml",
        &|_| None,
    )
    .expect("config");
    let plan = RatePlan::new(&config.policy);
    let alice = ClientId::named("alice");
    let subject = Subject::Tool("search_flights");
    let decision = config.policy.decide(&alice, "flights", subject);
    c.bench_function("buckets of a call (policy → keys)", |b| {
        b.iter(|| {
            plan.buckets(
                &config.policy,
                &decision,
                &alice,
                "flights",
                black_box(subject),
            )
        })
    });

    if !has_redis() {
        println!("redis-server is not installed: no Redis round trip measured");
        return;
    }
    let server = redis_server::RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let redis = {
        let _guard = rt.enter();
        RateLimiter::redis(&server.url(), OnBackendError::Deny).expect("redis limiter")
    };
    assert_eq!(rt.block_on(redis.check(&one)), Verdict::Admitted);
    c.bench_function("redis check (script round trip), 1 bucket", |b| {
        b.iter(|| rt.block_on(redis.check(black_box(&one))))
    });
    c.bench_function("redis check (script round trip), 2 buckets", |b| {
        b.iter(|| rt.block_on(redis.check(black_box(&two))))
    });
    assert_eq!(redis.backend_errors(), 0);
}

fn has_redis() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

// === memory per key ===

fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// In a child process: fill a limiter with `n` keys, print RSS growth and table size.
fn memory_child(n: usize) {
    let limiter = memory();
    let before = rss_bytes();
    for i in 0..n {
        let b = [open(&format!("client-{i:07}"))];
        check_now(&limiter, &b);
    }
    let after = rss_bytes();
    assert_eq!(limiter.keys(), Some(n));
    println!(
        "{n} {} {}",
        after.saturating_sub(before),
        limiter.memory_bytes().unwrap_or(0)
    );
}

fn memory_figures() {
    println!("\n## memory per key (client+tool keys, one per client)\n");
    println!("| keys | resident memory added | tables | per key (resident) |");
    println!("|---|---|---|---|");
    let exe = std::env::current_exe().expect("bench binary");
    for n in [10_000usize, 100_000, 1_000_000] {
        let out = Command::new(&exe)
            .args(["--memory-child", &n.to_string()])
            .output()
            .expect("child runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let fields: Vec<usize> = text
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        if let [keys, rss, tables] = fields[..] {
            let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
            println!(
                "| {keys} | {:.1} MiB | {:.1} MiB | {} B |",
                mib(rss),
                mib(tables),
                rss / keys
            );
        } else {
            println!(
                "| {n} | child failed: {text} {} |",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

// === contention ===

fn percentiles(mut ns: Vec<u32>) -> String {
    ns.sort_unstable();
    let at = |p: f64| ns[((ns.len() as f64 - 1.0) * p) as usize];
    format!(
        "{} ns | {} ns | {} ns | {} µs",
        at(0.5),
        at(0.99),
        at(0.999),
        ns[ns.len() - 1] / 1000
    )
}

/// `threads` threads released together, `calls` checks each; every check timed.
fn contended(threads: usize, calls: usize, buckets_of: impl Fn(usize) -> Vec<Bucket>) -> Vec<u32> {
    let limiter = Arc::new(memory());
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (limiter, start, buckets) = (limiter.clone(), start.clone(), buckets_of(t));
            std::thread::spawn(move || {
                let mut times = Vec::with_capacity(calls);
                start.wait();
                for _ in 0..calls {
                    let began = Instant::now();
                    black_box(check_now(&limiter, &buckets));
                    times.push(u32::try_from(began.elapsed().as_nanos()).unwrap_or(u32::MAX));
                }
                times
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("thread"))
        .collect()
}

/// The buckets thread `t` checks.
type BucketsOf = Box<dyn Fn(usize) -> Vec<Bucket>>;

fn contention_figures() {
    println!("\n## one in-memory check under contention (each check timed alone)\n");
    println!("| threads | buckets | p50 | p99 | p99.9 | max |");
    println!("|---|---|---|---|---|---|");
    let timer: Vec<u32> = (0..20_000)
        .map(|_| {
            let began = Instant::now();
            u32::try_from(black_box(began).elapsed().as_nanos()).unwrap_or(u32::MAX)
        })
        .collect();
    println!(
        "| 1 thread | none (the timer alone) | {} |",
        percentiles(timer)
    );
    let calls = 20_000;
    let rows: [(&str, usize, BucketsOf); 4] = [
        ("1 thread", 1, Box::new(|_| vec![open("hot")])),
        ("64 threads", 64, Box::new(|_| vec![open("hot")])),
        (
            "64 threads",
            64,
            Box::new(|t| vec![open(&format!("client-{t}"))]),
        ),
        (
            "64 threads",
            64,
            Box::new(|t| vec![open(&format!("client-{t}")), open("hot")]),
        ),
    ];
    let labels = [
        "1 key",
        "1 shared key",
        "64 keys, one per thread",
        "2 per call: own key + 1 shared key",
    ];
    for ((name, threads, buckets_of), label) in rows.into_iter().zip(labels) {
        let times = contended(threads, calls, buckets_of);
        println!("| {name} | {label} | {} |", percentiles(times));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--memory-child") {
        let n = args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .expect("--memory-child N");
        memory_child(n);
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
        .configure_from_args();
    criterion_benches(&mut c);
    c.final_summary();
    memory_figures();
    contention_figures();
}
