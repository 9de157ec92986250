//! Refunds on the memory store, on explicit instants: every state of a
//! refund (given back exactly, nothing to give back, kept because another
//! take came since, nothing taken), and the property that refunds never let
//! a bucket admit more than its rate.

use super::*;
use crate::ratelimit::{Refunded, Taken};

/// A bucket of 3 tokens, one more every second.
fn three() -> Bucket {
    bucket("r", 3, SEC)
}

#[test]
fn a_refund_with_no_take_since_restores_the_bucket_exactly() {
    run(async {
        let (l, _) = limiter();
        let (fresh, _) = limiter();
        let b = [three()];
        let now = 5 * SEC;
        for _ in 0..2 {
            assert_eq!(l.take_at(&b, now).await.0, Verdict::Admitted);
            assert_eq!(fresh.check_at(&b, now).await, Verdict::Admitted);
        }
        let (verdict, taken) = l.take_at(&b, now).await;
        assert_eq!(verdict, Verdict::Admitted);
        assert!(!taken.is_empty());
        assert_eq!(l.refund_at(&b, &taken, now + 7).await, Refunded::Returned);
        // The same bucket as one that made two calls: one token left, then
        // the same wait to the nanosecond.
        assert_eq!(l.check_at(&b, now + 7).await, Verdict::Admitted);
        assert_eq!(fresh.check_at(&b, now + 7).await, Verdict::Admitted);
        assert_eq!(
            l.check_at(&b, now + 8).await,
            fresh.check_at(&b, now + 8).await
        );
        assert_eq!(l.refunds_lost(), 0);
    });
}

#[test]
fn a_refund_after_the_bucket_refilled_gives_nothing_back() {
    run(async {
        let (l, _) = limiter();
        let b = [three()];
        let (_, taken) = l.take_at(&b, SEC).await;
        // Three seconds later the bucket is full again: nothing is owed.
        assert_eq!(l.refund_at(&b, &taken, 10 * SEC).await, Refunded::Returned);
        assert_eq!(
            admitted_at(&l, &b, 10 * SEC, 5).await,
            3,
            "full, never more"
        );
        assert_eq!(l.refunds_lost(), 0);
    });
}

#[test]
fn a_refund_after_another_take_keeps_the_token_and_counts_it() {
    run(async {
        let (l, _) = limiter();
        let b = [three()];
        let now = 5 * SEC;
        let (_, first) = l.take_at(&b, now).await;
        let (_, second) = l.take_at(&b, now).await;
        assert_eq!(l.refund_at(&b, &first, now).await, Refunded::Spent(1));
        assert_eq!(l.refunds_lost(), 1);
        // The second is the last take: its refund is exact, and the first
        // token stays taken (one left of three... plus the second's back).
        assert_eq!(l.refund_at(&b, &second, now).await, Refunded::Returned);
        assert_eq!(admitted_at(&l, &b, now, 5).await, 2);
    });
}

#[test]
fn a_refund_of_several_buckets_is_decided_per_bucket() {
    run(async {
        let (l, _) = limiter();
        let (a, c) = (bucket("pa", 2, SEC), bucket("pc", 2, SEC));
        let both = [a.clone(), c.clone()];
        let now = 5 * SEC;
        let (_, taken) = l.take_at(&both, now).await;
        assert_eq!(
            l.check_at(std::slice::from_ref(&c), now).await,
            Verdict::Admitted
        );
        // `a` gets its token back, `c` keeps it (another call took after).
        assert_eq!(l.refund_at(&both, &taken, now).await, Refunded::Spent(1));
        assert_eq!(admitted_at(&l, &[a], now, 5).await, 2);
        assert_eq!(admitted_at(&l, &[c], now, 5).await, 0);
    });
}

#[test]
fn nothing_taken_nothing_refunded() {
    run(async {
        let (l, _) = limiter();
        let b = [bucket("one", 1, SEC)];
        assert_eq!(l.take_at(&b, SEC).await.0, Verdict::Admitted);
        let (verdict, taken) = l.take_at(&b, SEC).await;
        assert!(matches!(verdict, Verdict::Limited { .. }));
        assert!(taken.is_empty(), "a refused take holds nothing");
        assert_eq!(l.refund_at(&b, &taken, SEC).await, Refunded::Returned);
        assert!(matches!(l.check_at(&b, SEC).await, Verdict::Limited { .. }));
        assert_eq!(l.refunds_lost(), 0);
    });
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

proptest::proptest! {
    /// Takes and refunds (of any earlier take, in any order) on two buckets:
    /// the calls whose tokens stayed taken, replayed alone through a fresh
    /// bucket at the same instants, are all admitted — refunds never let a
    /// bucket admit more than its rate allows.
    #[test]
    fn refunds_never_exceed_the_rate(
        ops in proptest::collection::vec((0u64..2 * SEC, 0u8..2, proptest::bool::ANY, 0usize..16), 1..80),
    ) {
        run(async {
            let (l, _) = limiter();
            let all = [bucket("x", 2, SEC), bucket("y", 3, SEC / 2)];
            // Outstanding takes: (bucket, taken, instant); kept instants per bucket.
            let mut out: Vec<(usize, Taken, u64)> = Vec::new();
            let mut kept: [Vec<u64>; 2] = Default::default();
            let mut now = SEC;
            for (dt, which, refund, pick) in &ops {
                now += dt;
                if *refund && !out.is_empty() {
                    let (i, taken, at) = out.remove(pick % out.len());
                    match l.refund_at(&all[i..=i], &taken, now).await {
                        Refunded::Returned => {}
                        Refunded::Spent(1) => kept[i].push(at),
                        other => panic!("{other:?}"),
                    }
                } else {
                    let i = usize::from(*which);
                    let (verdict, taken) = l.take_at(&all[i..=i], now).await;
                    if verdict == Verdict::Admitted {
                        out.push((i, taken, now));
                    }
                }
            }
            for (i, _, at) in out {
                kept[i].push(at);
            }
            for (i, times) in kept.iter_mut().enumerate() {
                times.sort_unstable();
                let (replay, _) = limiter();
                for &t in times.iter() {
                    assert_eq!(
                        replay.check_at(&all[i..=i], t).await,
                        Verdict::Admitted,
                        "bucket {i}: kept calls at {times:?}"
                    );
                }
            }
        });
    }
}
