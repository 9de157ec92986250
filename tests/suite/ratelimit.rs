//! The limiter through its public API, on explicit clocks: both backends
//! against an independent token-bucket model (exact integers), the window
//! bound, and exactness under 64-way contention. The Redis tests run a real
//! redis-server.

use crate::support;
use support::tiers::{self, Tier};

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use portcullis::config::OnBackendError;
use portcullis::policy::{Rate, RateKey};
use portcullis::ratelimit::clock::FakeClock;
use portcullis::ratelimit::gcra::{NANOS_PER_SEC, Quota};
use portcullis::ratelimit::{Bucket, RateLimiter, Verdict};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use support::redis::RedisServer;

/// An instant of Redis time for the explicit-clock tests (2026, in ns since the epoch).
const EPOCH_2026: u64 = 1_780_000_000 * NANOS_PER_SEC;

fn bucket(key: String, q: Quota) -> Bucket {
    Bucket {
        key,
        quota: q,
        rule: 0,
        rate: Rate {
            burst: q.burst(),
            per_second: NANOS_PER_SEC as f64 / q.interval() as f64,
            key: RateKey::ClientTool,
        },
    }
}

fn quota(burst: u32, interval: u64) -> Quota {
    Quota::new(NonZeroU32::new(burst).expect("burst > 0"), interval)
}

fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "test-{}-{prefix}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

// === the model ===

/// The textbook token bucket: `credit` is tokens × interval (nanoseconds of
/// refill banked), capped at `burst × interval`, starting full.
#[derive(Debug, Clone)]
struct TokenBucket {
    credit: u128,
    cap: u128,
    interval: u128,
    last: u64,
}

impl TokenBucket {
    fn new(q: Quota) -> Self {
        Self {
            credit: u128::from(q.capacity()),
            cap: u128::from(q.capacity()),
            interval: u128::from(q.interval()),
            last: 0,
        }
    }

    fn refill(&mut self, now: u64) {
        self.credit = (self.credit + u128::from(now - self.last)).min(self.cap);
        self.last = now;
    }
}

/// A call needing a token from each of `buckets` at `now`, all or nothing;
/// on refusal, the bucket that admits last (the first of equals) and the wait.
fn model_call(buckets: &mut [&mut TokenBucket], now: u64) -> Verdict {
    for b in buckets.iter_mut() {
        b.refill(now);
    }
    let mut worst: Option<(usize, u128)> = None;
    for (i, b) in buckets.iter().enumerate() {
        if b.credit < b.interval {
            let wait = b.interval - b.credit;
            if worst.is_none_or(|(_, w)| wait > w) {
                worst = Some((i, wait));
            }
        }
    }
    match worst {
        Some((bucket, wait)) => Verdict::Limited {
            bucket,
            retry_after: Duration::from_nanos(u64::try_from(wait).expect("small")),
        },
        None => {
            for b in buckets.iter_mut() {
                b.credit -= b.interval;
            }
            Verdict::Admitted
        }
    }
}

/// A call of a generated sequence: time since the previous call, and which
/// of the three buckets it needs (a non-empty subset, as a bit mask).
type Step = (u64, u8);

fn steps(max_gap: u64) -> impl Strategy<Value = Vec<Step>> {
    vec((0..=max_gap, 1u8..=7), 1..120)
}

fn subset(mask: u8) -> Vec<usize> {
    (0..3).filter(|i| mask & (1 << i) != 0).collect()
}

/// Runs `seq` through `check` and through the model; every verdict must
/// match, and each bucket must respect the window bound.
async fn compare<F, Fut>(
    quotas: [Quota; 3],
    seq: &[Step],
    start: u64,
    check: F,
) -> Result<(), TestCaseError>
where
    F: Fn(Vec<Bucket>, u64) -> Fut,
    Fut: std::future::Future<Output = Verdict>,
{
    let names: Vec<String> = (0..3).map(|i| unique(&format!("b{i}"))).collect();
    let mut models: Vec<TokenBucket> = quotas.iter().map(|q| TokenBucket::new(*q)).collect();
    let mut taken: [Vec<u64>; 3] = Default::default();
    let mut now = start;
    for (n, (gap, mask)) in seq.iter().enumerate() {
        now += gap;
        let which = subset(*mask);
        let buckets: Vec<Bucket> = which
            .iter()
            .map(|&i| bucket(names[i].clone(), quotas[i]))
            .collect();
        let mut picked: Vec<&mut TokenBucket> = models
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| which.contains(i))
            .map(|(_, m)| m)
            .collect();
        let expected = model_call(&mut picked, now - start);
        let got = check(buckets, now).await;
        prop_assert_eq!(
            got,
            expected,
            "call {} at +{} ns needing {:?}",
            n,
            now - start,
            which
        );
        if got == Verdict::Admitted {
            for &i in &which {
                taken[i].push(now);
            }
        }
    }
    for (i, times) in taken.iter().enumerate() {
        window_bound(times, quotas[i])?;
    }
    Ok(())
}

/// Over every window [a, b] between two admitted calls of one bucket: at most
/// burst + ⌊(b − a) / interval⌋ calls (burst + ⌊per_second · T⌋).
fn window_bound(admitted: &[u64], q: Quota) -> Result<(), TestCaseError> {
    for (i, a) in admitted.iter().enumerate() {
        for (j, b) in admitted.iter().enumerate().skip(i) {
            let allowed = u64::from(q.burst().get()) + (b - a) / q.interval();
            prop_assert!(
                (j - i + 1) as u64 <= allowed,
                "{} calls in [{a}, {b}], bound {allowed}",
                j - i + 1
            );
        }
    }
    Ok(())
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

// === memory ===

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Over any window [a, b] of a random arrival sequence, one bucket admits
    /// at most burst + ⌊(b − a) / interval⌋ calls (= burst + ⌊per_second · T⌋),
    /// and each decision is the token bucket's.
    #[test]
    fn one_bucket_never_exceeds_the_window_bound(
        burst in 1u32..=20,
        (interval, gaps) in (1u64..=2_000).prop_flat_map(|i| (Just(i), vec(0..=3 * i, 1..200))),
    ) {
        let q = quota(burst, interval);
        let clock = FakeClock::at(1);
        let limiter = RateLimiter::memory(Arc::new(clock.clone()));
        let b = [bucket("k".into(), q)];
        let mut model = TokenBucket::new(q);
        let mut t = 1u64;
        let mut admitted = Vec::new();
        block_on(async {
            for gap in &gaps {
                t += gap;
                clock.set(t);
                let got = limiter.check(&b).await;
                prop_assert_eq!(got, model_call(&mut [&mut model], t));
                if got == Verdict::Admitted {
                    admitted.push(t);
                }
            }
            Ok::<(), TestCaseError>(())
        })?;
        window_bound(&admitted, q)?;
    }

    /// Calls needing any subset of three buckets: all-or-nothing decisions and
    /// waits equal to the model's, so a refused call never took a token.
    #[test]
    fn several_buckets_match_the_model(
        bursts in [1u32..=6, 1u32..=6, 1u32..=6],
        intervals in [1u64..=500, 1u64..=500, 1u64..=500],
        seq in steps(700),
    ) {
        let quotas = [0, 1, 2].map(|i| quota(bursts[i], intervals[i]));
        let clock = FakeClock::at(1);
        let limiter = RateLimiter::memory(Arc::new(clock.clone()));
        block_on(compare(quotas, &seq, 1, |buckets, now| {
            clock.set(now);
            let limiter = &limiter;
            async move { limiter.check(&buckets).await }
        }))?;
    }
}

/// Under saturating demand (a call every nanosecond a token could be due, and
/// one just before), exactly burst + ⌊T / interval⌋ calls pass over T.
#[test]
fn saturating_demand_gets_exactly_the_rate() {
    block_on(async {
        for (burst, interval) in [(1, 1), (3, 20 * NANOS_PER_SEC), (10, 500_000_000), (7, 3)] {
            let clock = FakeClock::at(1);
            let limiter = RateLimiter::memory(Arc::new(clock.clone()));
            let b = [bucket("k".into(), quota(burst, interval))];
            let mut admitted = 0;
            for _ in 0..burst + 5 {
                admitted += usize::from(limiter.check(&b).await == Verdict::Admitted);
            }
            let periods = 50;
            for _ in 0..periods {
                clock.advance_nanos(interval - 1);
                admitted += usize::from(limiter.check(&b).await == Verdict::Admitted);
                clock.advance_nanos(1);
                for _ in 0..3 {
                    admitted += usize::from(limiter.check(&b).await == Verdict::Admitted);
                }
            }
            assert_eq!(
                admitted,
                burst as usize + periods,
                "burst {burst}, interval {interval}"
            );
        }
    });
}

/// 64 threads released at once on a frozen clock, 10 calls each on one key:
/// exactly `burst` pass.
#[test]
fn sixty_four_threads_on_one_key_admit_exactly_burst() {
    let limiter = Arc::new(RateLimiter::memory(Arc::new(FakeClock::at(1))));
    let admitted = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(64));
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (limiter, admitted, start) = (limiter.clone(), admitted.clone(), start.clone());
            std::thread::spawn(move || {
                let b = [bucket("hot".into(), quota(50, NANOS_PER_SEC))];
                start.wait();
                block_on(async {
                    for _ in 0..10 {
                        if limiter.check(&b).await == Verdict::Admitted {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 50);
}

/// The same with two buckets per call (one shared, one per thread): the shared
/// one admits exactly its burst, and refusals took nothing from the others.
#[test]
fn sixty_four_threads_on_two_buckets_take_all_or_nothing() {
    let limiter = Arc::new(RateLimiter::memory(Arc::new(FakeClock::at(1))));
    let start = Arc::new(Barrier::new(64));
    let threads: Vec<_> = (0..64)
        .map(|i| {
            let (limiter, start) = (limiter.clone(), start.clone());
            std::thread::spawn(move || {
                let shared = bucket("shared".into(), quota(40, NANOS_PER_SEC));
                let own = bucket(format!("own-{i}"), quota(5, NANOS_PER_SEC));
                start.wait();
                let mut mine = 0;
                block_on(async {
                    for _ in 0..10 {
                        let b = [own.clone(), shared.clone()];
                        if limiter.check(&b).await == Verdict::Admitted {
                            mine += 1;
                        }
                    }
                });
                // What is left in the thread's own bucket is exactly what it did not take.
                let left = block_on(async {
                    let mut left = 0;
                    for _ in 0..10 {
                        left += usize::from(
                            limiter.check(std::slice::from_ref(&own)).await == Verdict::Admitted,
                        );
                    }
                    left
                });
                assert_eq!(mine + left, 5, "thread {i}: took {mine}, {left} left");
                mine
            })
        })
        .collect();
    let total: usize = threads.into_iter().map(|t| t.join().expect("thread")).sum();
    assert_eq!(total, 40);
}

// === redis ===

fn redis_limiter(server: &RedisServer, rt: &tokio::runtime::Runtime) -> RateLimiter {
    let _guard = rt.enter();
    RateLimiter::redis(&server.url(), OnBackendError::Deny).expect("redis limiter")
}

/// The Redis script against the same model and, in lockstep, against the
/// memory backend, on random sequences at explicit instants: every decision
/// and every wait identical to the nanosecond; a peek before each decision
/// answers the same and writes nothing (the model sees only the takes).
#[test]
fn the_redis_script_matches_the_model_and_the_memory_backend() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let limiter = redis_limiter(&server, &rt);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    // Intervals of 1 ms … 2 s (and odd nanoseconds) so keys' expiry, which
    // runs on Redis's real clock, never falls inside a test case.
    let strategy = (
        [1u32..=6, 1u32..=6, 1u32..=6],
        [
            1_000_000u64..=2_000_000_000,
            1_000_000u64..=2_000_000_000,
            1_000_000u64..=2_000_000_000,
        ],
        steps(3_000_000_000),
    );
    runner
        .run(&strategy, |(bursts, intervals, seq)| {
            let quotas = [0, 1, 2].map(|i| quota(bursts[i], intervals[i]));
            let memory = RateLimiter::memory(Arc::new(FakeClock::at(1)));
            rt.block_on(compare(
                quotas,
                &seq,
                EPOCH_2026 + 123_456_789,
                |buckets, now| {
                    let (limiter, memory) = (&limiter, &memory);
                    async move {
                        // A peek first: the same verdict as the take that
                        // follows, in both backends, and nothing written.
                        let peeked = limiter.peek_at(&buckets, now).await;
                        assert_eq!(memory.peek_at(&buckets, now).await, peeked);
                        let shared = limiter.check_at(&buckets, now).await;
                        let local = memory.check_at(&buckets, now).await;
                        assert_eq!(shared, local, "Redis and memory disagree at {now}");
                        assert_eq!(peeked, shared, "the peek foretold the take at {now}");
                        shared
                    }
                },
            ))
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(limiter.backend_errors(), 0);
}

/// The exact boundary through Redis: refused 1 ns before the token is due,
/// admitted at it; the binding bucket and wait are reported exactly.
#[test]
fn redis_boundaries_are_exact() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let limiter = redis_limiter(&server, &rt);
    rt.block_on(async {
        let t0 = EPOCH_2026 + 987_654_321;
        let q = quota(3, 20 * NANOS_PER_SEC);
        let b = [bucket(unique("edge"), q)];
        for _ in 0..3 {
            assert_eq!(limiter.check_at(&b, t0).await, Verdict::Admitted);
        }
        let at = t0 + 12_600_000_000;
        assert_eq!(
            limiter.check_at(&b, at).await,
            Verdict::Limited {
                bucket: 0,
                retry_after: Duration::from_millis(7_400)
            }
        );
        let due = t0 + 20 * NANOS_PER_SEC;
        assert_eq!(
            limiter.check_at(&b, due - 1).await,
            Verdict::Limited {
                bucket: 0,
                retry_after: Duration::from_nanos(1)
            }
        );
        assert_eq!(limiter.check_at(&b, due).await, Verdict::Admitted);
        // Two buckets: the second refuses, the first keeps its token.
        let first = bucket(unique("first"), quota(1, NANOS_PER_SEC));
        let second = bucket(unique("second"), quota(1, 5 * NANOS_PER_SEC));
        let both = [first.clone(), second.clone()];
        assert_eq!(
            limiter.check_at(std::slice::from_ref(&second), t0).await,
            Verdict::Admitted
        );
        assert!(matches!(
            limiter.check_at(&both, t0).await,
            Verdict::Limited { bucket: 1, .. }
        ));
        assert_eq!(
            limiter.check_at(&[first], t0).await,
            Verdict::Admitted,
            "nothing was taken"
        );
    });
}

/// On Redis's own clock (TIME): a burst passes, the next call is refused with
/// a wait no longer than the interval.
#[test]
fn redis_time_is_the_clock() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let limiter = redis_limiter(&server, &rt);
    let key = unique("time");
    rt.block_on(async {
        let b = [bucket(key.clone(), quota(4, 3_600 * NANOS_PER_SEC))];
        for _ in 0..4 {
            assert_eq!(limiter.check(&b).await, Verdict::Admitted);
        }
        match limiter.check(&b).await {
            Verdict::Limited { retry_after, .. } => {
                assert!(
                    retry_after <= Duration::from_secs(3_600)
                        && retry_after > Duration::from_secs(3_500)
                );
            }
            other => panic!("{other:?}"),
        }
    });
    // The key expires by itself once its bucket is full again (4 h, plus 1 s).
    let ttl = server.command(&format!("PTTL portcullis:default:rl:{key}"));
    let ms: u64 = ttl
        .trim()
        .trim_start_matches(':')
        .parse()
        .unwrap_or_else(|_| panic!("PTTL answered {ttl:?}"));
    assert!(
        (4 * 3_600_000 - 10_000..=4 * 3_600_000 + 1_000).contains(&ms),
        "{ms}"
    );
}

/// 64 tasks on a multi-thread runtime hammer one Redis key at one instant:
/// exactly `burst` pass.
#[test]
fn sixty_four_tasks_on_one_redis_key_admit_exactly_burst() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let limiter = Arc::new(redis_limiter(&server, &rt));
    let key = unique("hot");
    let admitted = rt.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let limiter = limiter.clone();
                let b = [bucket(key.clone(), quota(25, NANOS_PER_SEC))];
                tokio::spawn(async move {
                    let mut n = 0;
                    for _ in 0..10 {
                        n += usize::from(
                            limiter.check_at(&b, EPOCH_2026).await == Verdict::Admitted,
                        );
                    }
                    n
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("task");
        }
        total
    });
    assert_eq!(admitted, 25);
    assert_eq!(limiter.backend_errors(), 0);
}

/// Redis down: the call is denied (or allowed) per `on_backend_error`, counted;
/// Redis back: the limiter reconnects by itself.
#[test]
fn redis_outage_follows_on_backend_error_and_recovers() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    let mut server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (deny, allow) = {
        let _guard = rt.enter();
        (
            RateLimiter::redis(&server.url(), OnBackendError::Deny).expect("limiter"),
            RateLimiter::redis(&server.url(), OnBackendError::Allow).expect("limiter"),
        )
    };
    let b = [bucket(unique("outage"), quota(1000, NANOS_PER_SEC))];
    rt.block_on(async {
        assert_eq!(deny.check(&b).await, Verdict::Admitted);
        assert_eq!(allow.check(&b).await, Verdict::Admitted);
    });
    server.stop();
    rt.block_on(async {
        for _ in 0..3 {
            assert_eq!(deny.check(&b).await, Verdict::Unavailable);
            assert_eq!(allow.check(&b).await, Verdict::Admitted);
        }
    });
    assert!(deny.backend_errors() >= 3 && allow.backend_errors() >= 3);
    server.restart();
    let recovered = rt.block_on(async {
        // Bounded: 100 tries, 100 ms apart.
        for _ in 0..100 {
            if deny.check(&b).await == Verdict::Admitted {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    });
    assert!(recovered, "the limiter reconnects once Redis is back");
}
