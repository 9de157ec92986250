//! The bucket arithmetic and the memory store on a fake clock: no test sleeps.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::clock::FakeClock;
use super::gcra::{self, MAX_REFILL, NANOS_PER_SEC, Quota, interval_nanos};
use super::plan::rule_tag;
use super::*;
use crate::auth::ClientId;
use crate::policy::{Rate, RateKey, Subject};

const SEC: u64 = NANOS_PER_SEC;

fn quota(burst: u32, interval: u64) -> Quota {
    Quota::new(NonZeroU32::new(burst).expect("burst > 0"), interval)
}

fn bucket(key: &str, burst: u32, interval: u64) -> Bucket {
    let q = quota(burst, interval);
    Bucket {
        key: key.into(),
        quota: q,
        rule: 0,
        rate: Rate {
            burst: q.burst(),
            per_second: SEC as f64 / interval as f64,
            key: RateKey::ClientTool,
        },
    }
}

fn limiter() -> (RateLimiter, FakeClock) {
    let clock = FakeClock::at(1_000);
    (RateLimiter::memory(Arc::new(clock.clone())), clock)
}

fn run(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f);
}

async fn admitted(l: &RateLimiter, buckets: &[Bucket], n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if l.check(buckets).await == Verdict::Admitted {
            ok += 1;
        }
    }
    ok
}

fn retry_after(v: Verdict) -> Duration {
    match v {
        Verdict::Limited { retry_after, .. } => retry_after,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn exactly_burst_pass_at_once() {
    run(async {
        let (l, _clock) = limiter();
        let b = [bucket("k", 3, 20 * SEC)];
        assert_eq!(admitted(&l, &b, 10).await, 3);
    });
}

#[test]
fn refused_one_nanosecond_before_the_token_is_due_admitted_at_it() {
    run(async {
        let (l, clock) = limiter();
        let b = [bucket("k", 3, 20 * SEC)];
        assert_eq!(admitted(&l, &b, 3).await, 3);
        clock.advance_nanos(20 * SEC - 1);
        assert_eq!(retry_after(l.check(&b).await), Duration::from_nanos(1));
        clock.advance_nanos(1);
        assert_eq!(l.check(&b).await, Verdict::Admitted);
        // Exactly one token came back.
        assert!(matches!(l.check(&b).await, Verdict::Limited { .. }));
    });
}

#[test]
fn retry_after_is_exact() {
    run(async {
        let (l, clock) = limiter();
        let b = [bucket("k", 3, 20 * SEC)];
        assert_eq!(admitted(&l, &b, 3).await, 3);
        clock.advance(Duration::from_millis(12_600));
        let wait = retry_after(l.check(&b).await);
        assert_eq!(wait, Duration::from_millis(7_400));
        // Refusals took nothing: the wait is the same when asked again.
        assert_eq!(retry_after(l.check(&b).await), wait);
        clock.advance(wait - Duration::from_nanos(1));
        assert_eq!(retry_after(l.check(&b).await), Duration::from_nanos(1));
        clock.advance_nanos(1);
        assert_eq!(l.check(&b).await, Verdict::Admitted);
    });
}

#[test]
fn no_overfill_after_a_long_idle() {
    run(async {
        let (l, clock) = limiter();
        let b = [bucket("k", 5, SEC / 2)];
        assert_eq!(admitted(&l, &b, 5).await, 5);
        // Idle 10 · burst / rate, then 2 · burst calls at once.
        clock.advance(Duration::from_secs(25));
        assert_eq!(admitted(&l, &b, 10).await, 5);
        // And after an idle of many years, still burst, not more.
        clock.advance(Duration::from_secs(10 * 365 * 86_400));
        assert_eq!(admitted(&l, &b, 10).await, 5);
    });
}

#[test]
fn a_refused_call_takes_nothing_from_any_bucket() {
    run(async {
        let (l, clock) = limiter();
        let wide = bucket("per-client", 5, SEC);
        let narrow = bucket("per-tool", 2, 10 * SEC);
        let both = [wide.clone(), narrow.clone()];
        assert_eq!(admitted(&l, &both, 2).await, 2);
        // The second bucket refuses: the first keeps its 3 tokens.
        for _ in 0..10 {
            let v = l.check(&both).await;
            assert!(matches!(v, Verdict::Limited { bucket: 1, .. }), "{v:?}");
        }
        assert_eq!(admitted(&l, &[wide], 10).await, 3);
        // Ten seconds give the second bucket one token back; had a refusal
        // taken one, there would be none.
        clock.advance(Duration::from_secs(10));
        assert_eq!(admitted(&l, &[narrow], 5).await, 1);
    });
}

proptest::proptest! {
    /// A peek answers what a take at the same instant answers, and writes
    /// nothing: a limiter that is also peeked at admits exactly the calls
    /// one that is never peeked at admits.
    #[test]
    fn a_peek_predicts_the_take_and_changes_nothing(
        ops in proptest::collection::vec((0u64..3 * SEC, 1u8..8), 1..60),
    ) {
        run(async {
            let (peeked, _) = limiter();
            let (plain, _) = limiter();
            let all = [bucket("a", 2, SEC), bucket("b", 3, 2 * SEC), bucket("c", 1, 3 * SEC)];
            let mut now = 1_000;
            for (dt, mask) in &ops {
                now += dt;
                let buckets: Vec<Bucket> = all
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, b)| b.clone())
                    .collect();
                for _ in 0..3 {
                    let predicted = peeked.peek_at(&buckets, now).await;
                    assert_eq!(peeked.peek_at(&buckets, now).await, predicted, "a peek writes nothing");
                    let taken = peeked.check_at(&buckets, now).await;
                    assert_eq!(taken, predicted, "{buckets:?} at {now}");
                    assert_eq!(plain.check_at(&buckets, now).await, taken, "the peeks took nothing");
                }
            }
        });
    }
}

#[test]
fn the_binding_bucket_is_the_one_that_admits_last() {
    run(async {
        let (l, _clock) = limiter();
        let a = bucket("a", 1, SEC);
        let b = bucket("b", 1, 5 * SEC);
        assert_eq!(l.check(&[a.clone(), b.clone()]).await, Verdict::Admitted);
        let v = l.check(&[a, b]).await;
        assert_eq!(
            v,
            Verdict::Limited {
                bucket: 1,
                retry_after: Duration::from_secs(5)
            }
        );
    });
}

#[test]
fn a_key_given_twice_is_one_bucket() {
    run(async {
        let (l, _clock) = limiter();
        let b = bucket("same", 2, SEC);
        let twice = [b.clone(), b.clone()];
        assert_eq!(admitted(&l, &twice, 5).await, 2);
        assert_eq!(admitted(&l, &[b], 5).await, 0);
    });
}

#[test]
fn keys_are_isolated() {
    run(async {
        let (l, _clock) = limiter();
        let a = [bucket("alice", 2, SEC)];
        let b = [bucket("bob", 2, SEC)];
        assert_eq!(admitted(&l, &a, 5).await, 2);
        assert_eq!(admitted(&l, &b, 5).await, 2);
        assert_eq!(l.keys(), Some(2));
    });
}

#[test]
fn the_janitor_drops_full_buckets_only_and_changes_no_decision() {
    run(async {
        let (l, clock) = limiter();
        let short = [bucket("short", 1, SEC)];
        let long = [bucket("long", 2, 100 * SEC)];
        assert_eq!(admitted(&l, &short, 1).await, 1);
        assert_eq!(admitted(&l, &long, 1).await, 1);
        clock.advance(Duration::from_secs(2));
        assert_eq!(l.sweep(), 1, "only the full bucket goes");
        assert_eq!(l.keys(), Some(1));
        // The kept bucket still has one token, not two.
        assert_eq!(admitted(&l, &long, 5).await, 1);
        // The dropped one is as full as it was.
        assert_eq!(admitted(&l, &short, 5).await, 1);
    });
}

/// The janitor task reclaims full buckets by itself (bounded wait: 2 s).
#[test]
fn the_janitor_task_reclaims_idle_keys() {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
        .block_on(async {
            let (l, clock) = limiter();
            for i in 0..100 {
                let b = [bucket(&format!("k{i}"), 1, SEC)];
                assert_eq!(l.check(&b).await, Verdict::Admitted);
            }
            assert_eq!(l.keys(), Some(100));
            clock.advance(Duration::from_secs(2));
            let janitor = l
                .spawn_janitor(Duration::from_millis(5))
                .expect("memory janitor");
            for _ in 0..400 {
                if l.keys() == Some(0) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            janitor.abort();
            assert_eq!(l.keys(), Some(0));
        });
}

#[test]
fn gcra_arithmetic() {
    let q = quota(3, 20 * SEC);
    assert_eq!(q.capacity(), 60 * SEC);
    assert_eq!(gcra::admit(0, 100, q), Ok(100 + 20 * SEC));
    let tat = 100 + 60 * SEC;
    assert_eq!(gcra::admit(tat, 100, q), Err(100 + 20 * SEC));
    let mut tats = [0, tat];
    let quotas = [q, q];
    assert_eq!(
        gcra::admit_all(&mut tats, 100, &quotas),
        Err(gcra::Refusal {
            index: 1,
            retry_at: 100 + 20 * SEC
        })
    );
    assert_eq!(tats, [0, tat], "a refusal writes nothing");
}

#[test]
fn intervals_from_per_second() {
    assert_eq!(interval_nanos(1.0), SEC);
    assert_eq!(interval_nanos(2.0), SEC / 2);
    assert_eq!(interval_nanos(0.1), 10 * SEC);
    assert_eq!(interval_nanos(0.05), 20 * SEC);
    assert_eq!(interval_nanos(3.0), 333_333_334, "rounded up: never faster");
    assert_eq!(interval_nanos(1e9), 1);
    assert_eq!(interval_nanos(5e9), 1);
    assert_eq!(interval_nanos(1e-12), MAX_REFILL);
    // burst · interval never exceeds the longest refill.
    let q = Quota::new(NonZeroU32::new(1_000_000_000).expect("nonzero"), SEC);
    assert!(q.capacity() <= MAX_REFILL);
}

#[test]
fn bucket_keys_are_unambiguous() {
    let alice = ClientId::named("alice");
    let key = |k, client: &ClientId, server, subject| bucket_key("t", k, client, server, subject);
    assert_eq!(
        key(
            RateKey::ClientTool,
            &alice,
            "flights",
            Subject::Tool("echo")
        ),
        "t/client+tool/5:alice/7:flights/tool/4:echo"
    );
    assert_eq!(
        key(RateKey::Client, &alice, "flights", Subject::Tool("echo")),
        "t/client/5:alice"
    );
    assert_eq!(
        key(RateKey::All, &alice, "flights", Subject::Tool("echo")),
        "t/all"
    );
    // Separators inside names cannot forge another key.
    let tricky = ClientId::named("a/4:x");
    assert_ne!(
        key(RateKey::ClientTool, &tricky, "s", Subject::Tool("t")),
        key(
            RateKey::ClientTool,
            &ClientId::named("a"),
            "x/1:s",
            Subject::Tool("t")
        )
    );
    assert_ne!(
        key(RateKey::ClientTool, &alice, "s", Subject::Tool("x")),
        key(RateKey::ClientTool, &alice, "s", Subject::Prompt("x"))
    );
    // Long names are hashed, so a key stays small.
    let long = "r".repeat(5_000);
    let k = key(RateKey::ClientTool, &alice, "s", Subject::Resource(&long));
    assert!(k.len() < 200, "{k}");
}

fn policy(text: &str) -> crate::config::Config {
    let full = format!(
        "[servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n[servers.t]\nurl = \"http://127.0.0.1:2/mcp\"\n\
         [clients.alice]\napi_key_sha256 = \"{}\"\n[clients.bob]\napi_key_sha256 = \"{}\"\n{text}",
        "0".repeat(64),
        "1".repeat(64)
    );
    crate::config::load_str(&full, "t.toml", &|_| None).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_plan_names_one_bucket_per_rate_of_every_matching_allow_rule() {
    let config = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["*"]
tools = ["*"]
action = "allow"
rate = { burst = 10, per_second = 1.0, key = "client" }
[[rules]]
clients = ["*"]
servers = ["s"]
tools = ["echo"]
action = "allow"
rate = { burst = 3, per_second = 0.05, key = "client+tool" }
[[rules]]
clients = ["*"]
servers = ["s"]
tools = ["echo"]
action = "allow"
rate = { burst = 3, per_second = 0.05, key = "client+tool" }
[[rules]]
clients = ["*"]
servers = ["*"]
tools = ["echo"]
action = "allow"
"#,
    );
    let plan = RatePlan::new(&config.policy);
    let alice = ClientId::named("alice");
    let subject = Subject::Tool("echo");
    let d = config.policy.decide(&alice, "s", subject);
    let buckets = plan.buckets(&config.policy, &d, &alice, "s", subject);
    // rules[2] is rules[1] again: the same bucket, counted once.
    assert_eq!(buckets.len(), 2, "{buckets:#?}");
    assert_eq!(buckets[0].rule, 0);
    assert_eq!(buckets[1].rule, 1);
    assert_eq!(buckets[1].quota.interval(), 20 * SEC);
    assert!(buckets[0].key.ends_with("/client/5:alice"));
    // On server t only rules[0] limits echo, with the same per-client bucket.
    let d = config.policy.decide(&alice, "t", subject);
    let on_t = plan.buckets(&config.policy, &d, &alice, "t", subject);
    assert_eq!(on_t.len(), 1);
    assert_eq!(on_t[0].key, buckets[0].key);
}

#[test]
fn a_rule_keeps_its_buckets_when_moved_and_loses_them_when_changed() {
    let rule = |burst: u32| {
        format!(
            "[[rules]]\nclients = [\"*\"]\nservers = [\"s\"]\ntools = [\"echo\"]\naction = \"allow\"\nrate = {{ burst = {burst}, per_second = 1.0 }}\n"
        )
    };
    let other =
        "[[rules]]\nclients = [\"bob\"]\nservers = [\"s\"]\ntools = [\"x\"]\naction = \"allow\"\n";
    let tag = |text: &str, index: usize| {
        let config = policy(text);
        rule_tag(&config.policy.rules[index])
    };
    let first = tag(&rule(3), 0);
    assert_eq!(tag(&format!("{other}{}", rule(3)), 1), first, "moved");
    assert_ne!(tag(&rule(4), 0), first, "rate changed");
}

mod refunds;
