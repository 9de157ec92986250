//! The circuit breaker of one server: after `failures` consecutive transport
//! failures it opens, and calls are answered at once without contacting the
//! server; after `cool_down` one call is let through as a probe, and its
//! success closes the breaker (its failure opens it again).
//!
//! Place: inside [`super::forward::Forward::send_as`], before the first try
//! of a request and after its last one.
//!
//! Invariants: while open, nothing is sent to the server except the one probe
//! per cool-down; a reply of any kind other than a transport failure or HTTP
//! 502/503/504 counts as the server being up (a tool's own error included).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::BreakerSettings;

/// One server's breaker.
#[derive(Debug, Default)]
pub(crate) struct Breaker {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Transport failures in a row.
    failures: u32,
    /// Set while open: when the next probe may go.
    open_until: Option<Instant>,
    /// A probe is under way: other calls still get the open answer.
    probing: bool,
}

/// What a request may do now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: sent as usual.
    Send,
    /// Half-open: this request is the probe.
    Probe,
    /// Open: answered at once; the next probe may go in this long.
    Open(Duration),
}

impl Breaker {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a request may be sent now.
    pub(crate) fn admit(&self, settings: &BreakerSettings) -> Admit {
        let mut s = self.state();
        let now = Instant::now();
        match s.open_until {
            None => Admit::Send,
            Some(until) if now < until => Admit::Open(until - now),
            // Half-open, and another request is the probe.
            Some(_) if s.probing => Admit::Open(settings.cool_down),
            Some(_) => {
                s.probing = true;
                Admit::Probe
            }
        }
    }

    /// The outcome of a request that was sent: `up` unless it was a transport failure.
    pub(crate) fn record(&self, up: bool, settings: &BreakerSettings) {
        let mut s = self.state();
        if up {
            *s = State::default();
            return;
        }
        s.failures = s.failures.saturating_add(1);
        s.probing = false;
        if settings.failures > 0 && s.failures >= settings.failures {
            s.open_until = Some(Instant::now() + settings.cool_down);
        }
    }

    /// The guard of a probe [`Self::admit`] let through: a probe whose request
    /// ends without an outcome (its client went away, the call was cancelled)
    /// is handed back when the guard drops, so the next request after the
    /// cool-down probes in its place; otherwise the breaker stayed open until
    /// the gateway restarted.
    pub(crate) fn probing(&self) -> ProbeGuard<'_> {
        ProbeGuard {
            breaker: Some(self),
        }
    }

    /// Whether the breaker is open or half-open now (for `/readyz` and `/metrics`).
    pub(crate) fn is_open(&self) -> bool {
        self.state().open_until.is_some()
    }
}

/// See [`Breaker::probing`].
pub(crate) struct ProbeGuard<'a> {
    breaker: Option<&'a Breaker>,
}

impl ProbeGuard<'_> {
    /// The probe's outcome was recorded: nothing to hand back.
    pub(crate) fn settled(mut self) {
        self.breaker = None;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker {
            breaker.state().probing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(failures: u32, cool_down: Duration) -> BreakerSettings {
        BreakerSettings {
            failures,
            cool_down,
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
        b.record(false, &s);
        assert!(b.is_open());
        // Cool-down over: one probe, the others still refused.
        assert_eq!(b.admit(&s), Admit::Probe);
        assert!(matches!(b.admit(&s), Admit::Open(_)));
        b.record(true, &s);
        assert_eq!(b.admit(&s), Admit::Send);
        assert!(!b.is_open());
    }

    #[test]
    fn while_cooling_down_nothing_is_sent() {
        let s = settings(1, Duration::from_secs(60));
        let b = Breaker::default();
        b.record(false, &s);
        assert!(matches!(b.admit(&s), Admit::Open(d) if d > Duration::from_secs(50)));
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

    #[test]
    fn zero_failures_never_opens() {
        let s = settings(0, Duration::ZERO);
        let b = Breaker::default();
        for _ in 0..100 {
            b.record(false, &s);
        }
        assert_eq!(b.admit(&s), Admit::Send);
    }
}
