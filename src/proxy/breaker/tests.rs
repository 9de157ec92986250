use super::*;
use proptest::prelude::*;

fn settings(failures: u32, cool_down: Duration) -> BreakerSettings {
    BreakerSettings {
        failures,
        cool_down,
        ratio: 0.0,
        ..BreakerSettings::default()
    }
}

fn by_ratio(ratio: f64, window: u32, min_calls: u32) -> BreakerSettings {
    BreakerSettings {
        failures: 0,
        cool_down: Duration::from_secs(60),
        ratio,
        window,
        min_calls,
    }
}

#[test]
fn it_opens_after_consecutive_failures_and_closes_after_a_good_probe() {
    let s = settings(3, Duration::ZERO);
    let b = Breaker::default();
    b.record(false, &s);
    b.record(false, &s);
    b.record(true, &s);
    b.record(false, &s);
    b.record(false, &s);
    assert_eq!(
        b.admit(&s),
        Admit::Send,
        "a success in between resets the count"
    );
    assert!(b.record(false, &s), "the third in a row opens it");
    assert!(b.is_open());
    assert_eq!(
        b.phase(),
        Phase::HalfOpen,
        "no cool-down: half-open at once"
    );
    // Cool-down over: one probe, the others still refused.
    assert_eq!(b.admit(&s), Admit::Probe);
    assert!(matches!(b.admit(&s), Admit::Open(_)));
    b.record(true, &s);
    assert_eq!(b.admit(&s), Admit::Send);
    assert!(!b.is_open());
    assert_eq!(b.phase(), Phase::Closed);
    assert_eq!(b.opens(), 1);
}

#[test]
fn while_cooling_down_nothing_is_sent() {
    let s = settings(1, Duration::from_secs(60));
    let b = Breaker::default();
    b.record(false, &s);
    assert!(matches!(b.admit(&s), Admit::Open(d) if d > Duration::from_secs(50)));
    assert_eq!(b.phase(), Phase::Open);
}

#[test]
fn a_failed_probe_opens_it_again_and_counts_again() {
    let s = settings(1, Duration::ZERO);
    let b = Breaker::default();
    b.record(false, &s);
    assert_eq!(b.admit(&s), Admit::Probe);
    assert!(b.record(false, &s));
    assert_eq!(b.opens(), 2);
}

#[test]
fn zero_failures_and_no_ratio_never_opens() {
    let s = settings(0, Duration::ZERO);
    let b = Breaker::default();
    for _ in 0..100 {
        b.record(false, &s);
    }
    assert_eq!(b.admit(&s), Admit::Send);
    assert_eq!(b.opens(), 0);
}

#[test]
fn alternating_failures_open_it_by_ratio_once_enough_calls_are_known() {
    let s = by_ratio(0.5, 10, 6);
    let b = Breaker::default();
    // Never two failures in a row, so only the ratio can open it.
    for _ in 0..2 {
        b.record(false, &s);
        b.record(true, &s);
    }
    assert!(!b.is_open(), "four calls known, six needed");
    b.record(false, &s);
    assert!(!b.is_open(), "five known");
    assert!(!b.record(true, &s), "a success never opens it");
    assert!(
        b.record(false, &s),
        "four failures of seven is past the ratio"
    );
}

#[test]
fn failures_that_slid_out_of_the_window_do_not_count() {
    let s = by_ratio(0.5, 4, 4);
    let b = Breaker::default();
    b.record(false, &s);
    for _ in 0..4 {
        b.record(true, &s);
    }
    b.record(false, &s);
    assert!(!b.is_open(), "one failure of the last four");
}

proptest! {
    /// Whatever the outcomes, the breaker opens exactly when the last
    /// `window` outcomes since it was last closed hold at least `min_calls`
    /// outcomes of which at least `ratio` failed.
    #[test]
    fn it_opens_exactly_at_the_ratio(
        outcomes in proptest::collection::vec(any::<bool>(), 0..60),
        window in 1u32..20,
        min_calls in 1u32..20,
        ratio in 0.05f64..=1.0,
    ) {
        let s = by_ratio(ratio, window, min_calls);
        let b = Breaker::default();
        let mut model: Vec<bool> = Vec::new();
        for failed in outcomes {
            if b.is_open() {
                break;
            }
            model.push(failed);
            let opened = b.record(!failed, &s);
            let last: Vec<bool> = model.iter().rev().take(window as usize).copied().collect();
            let bad = last.iter().filter(|f| **f).count();
            let expect = failed
                && last.len() >= min_calls as usize
                && bad as f64 >= ratio * last.len() as f64;
            prop_assert_eq!(opened, expect);
        }
    }
}

#[test]
fn a_probe_that_never_ends_does_not_keep_it_open() {
    let s = settings(1, Duration::ZERO);
    let b = Breaker::default();
    b.record(false, &s);
    assert_eq!(b.admit(&s), Admit::Probe);
    assert!(matches!(b.admit(&s), Admit::Open(_)));
    // Its caller went away: no outcome. A while later, another probe.
    let later = Instant::now() + PROBE_HOLD + Duration::from_secs(1);
    assert_eq!(b.admit_at(&s, later), Admit::Probe);
}

#[test]
fn a_request_sent_before_it_opened_does_not_count_again() {
    let s = settings(1, Duration::from_secs(60));
    let b = Breaker::default();
    b.record(false, &s);
    assert!(!b.record(false, &s), "a straggler's failure");
    assert_eq!(b.opens(), 1);
}

#[test]
fn opening_and_closing_are_announced() {
    let s = settings(1, Duration::ZERO);
    let b = Breaker::default();
    let turns = b.turns();
    b.record(false, &s);
    assert_eq!(*turns.borrow(), 1);
    assert_eq!(b.admit(&s), Admit::Probe);
    b.record(false, &s);
    assert_eq!(*turns.borrow(), 1, "a failed probe leaves it open");
    assert_eq!(b.admit(&s), Admit::Probe, "the failed probe ended its hold");
    b.record(true, &s);
    assert_eq!(*turns.borrow(), 2);
}

#[test]
fn a_probe_abandoned_before_its_outcome_is_handed_back() {
    let s = settings(1, Duration::ZERO);
    let b = Breaker::default();
    b.record(false, &s);
    assert_eq!(b.admit(&s), Admit::Probe);
    // Its request is dropped mid-flight: no outcome is ever recorded.
    drop(b.probing());
    assert_eq!(b.admit(&s), Admit::Probe, "the next request probes");
    let probe = b.probing();
    b.record(true, &s);
    probe.settled();
    assert_eq!(b.admit(&s), Admit::Send);
}

/// What happens to one request in the property below.
#[derive(Debug, Clone, Copy)]
enum Fate {
    /// The server answered.
    Up,
    /// A transport failure.
    Down,
    /// The request was dropped before any outcome.
    Abandoned,
}

proptest::proptest! {
    /// Whatever happens to the requests, once none is in flight and the
    /// cool-down is over, the next request is sent or probes: the breaker
    /// is never left open with nothing to close it.
    #[test]
    fn the_breaker_never_stays_open_with_no_request_in_flight(
        fates in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just(Fate::Up),
                proptest::strategy::Just(Fate::Down),
                proptest::strategy::Just(Fate::Abandoned),
            ],
            0..40,
        ),
        failures in 1u32..4,
    ) {
        let s = settings(failures, Duration::ZERO);
        let b = Breaker::default();
        for fate in fates {
            let admitted = b.admit(&s);
            proptest::prop_assert!(!matches!(admitted, Admit::Open(_)), "{admitted:?}");
            // As `Forward::send_as` does.
            let probe = (admitted == Admit::Probe).then(|| b.probing());
            match fate {
                Fate::Up | Fate::Down => {
                    b.record(matches!(fate, Fate::Up), &s);
                    if let Some(probe) = probe {
                        probe.settled();
                    }
                }
                Fate::Abandoned => drop(probe),
            }
        }
        proptest::prop_assert!(!matches!(b.admit(&s), Admit::Open(_)));
    }
}
