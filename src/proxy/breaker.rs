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

    /// Whether the breaker is open or half-open now (for `/readyz` and `/metrics`).
    pub(crate) fn is_open(&self) -> bool {
        self.state().open_until.is_some()
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
    fn zero_failures_never_opens() {
        let s = settings(0, Duration::ZERO);
        let b = Breaker::default();
        for _ in 0..100 {
            b.record(false, &s);
        }
        assert_eq!(b.admit(&s), Admit::Send);
    }
}
