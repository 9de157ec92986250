//! The circuit breaker of one server: after `failures` consecutive transport
//! failures, or when at least `ratio` of the last `window` requests failed
//! (once `min_calls` of them are known), it opens, and calls are answered at
//! once without contacting the server; after `cool_down` one call is let
//! through as a probe (half-open), and its success closes the breaker (its
//! failure opens it again).
//!
//! Place: inside [`super::forward::Forward::send_as`], before the first try
//! of a request and after its last one; read by `/readyz`, `/healthz`,
//! `/metrics`, the dashboard and the merged view.
//!
//! Invariants: while open, nothing is sent to the server except the one probe
//! per cool-down; a reply of any kind other than a transport failure or HTTP
//! 502/503 counts as the server being up (a tool's own error, a timeout and
//! a proxy's 504 included: a client can provoke those, see
//! [`super::retry::broken`]); a probe abandoned before its outcome is handed
//! back; every opening is counted once in [`Breaker::opens`].

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::BreakerSettings;

/// The shortest time a probe is waited for before another may go (a probe
/// whose caller went away reports nothing).
const PROBE_HOLD: Duration = Duration::from_secs(10);

/// One server's breaker.
#[derive(Debug)]
pub(crate) struct Breaker {
    state: Mutex<State>,
    /// Counts the openings and closings: the merged view's listeners are
    /// told the lists changed (the server's tools leave them or come back).
    turns: watch::Sender<u64>,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            turns: watch::channel(0).0,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Transport failures in a row.
    failures: u32,
    /// The outcomes of the last `window` requests while closed (`true`: failed).
    recent: VecDeque<bool>,
    /// Set while open: when the next probe may go.
    open_until: Option<Instant>,
    /// A probe is under way since then: other calls still get the open
    /// answer (for one cool-down, at least [`PROBE_HOLD`]: a probe whose
    /// caller went away without an outcome does not keep it open for ever).
    probing: Option<Instant>,
    /// Times it opened since the gateway started.
    opens: u64,
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

/// The breaker's state as shown to operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Requests are sent.
    Closed,
    /// Requests are answered at once, until the cool-down is over.
    Open,
    /// The cool-down is over: the next request (or the one under way) is the probe.
    HalfOpen,
}

impl Phase {
    /// Its name in `/readyz`, `/healthz`, `/metrics` and the dashboard.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half_open",
        }
    }
}

impl Breaker {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a request may be sent now.
    pub(crate) fn admit(&self, settings: &BreakerSettings) -> Admit {
        self.admit_at(settings, Instant::now())
    }

    fn admit_at(&self, settings: &BreakerSettings, now: Instant) -> Admit {
        let mut s = self.state();
        let hold = settings.cool_down.max(PROBE_HOLD);
        match s.open_until {
            None => Admit::Send,
            Some(until) if now < until => Admit::Open(until - now),
            // Half-open, and another request is the probe.
            Some(_) if s.probing.is_some_and(|since| now < since + hold) => {
                Admit::Open(settings.cool_down)
            }
            Some(_) => {
                s.probing = Some(now);
                Admit::Probe
            }
        }
    }

    /// The outcome of a request that was sent: `up` unless it was a
    /// transport failure. True when this outcome opened the breaker.
    pub(crate) fn record(&self, up: bool, settings: &BreakerSettings) -> bool {
        let mut s = self.state();
        let was_open = s.open_until.is_some();
        if up {
            if was_open {
                // The probe succeeded: closed, with a fresh window.
                let opens = s.opens;
                *s = State {
                    opens,
                    ..State::default()
                };
                drop(s);
                self.turns.send_modify(|n| *n += 1);
            } else {
                s.failures = 0;
                remember(&mut s.recent, false, settings.window);
            }
            return false;
        }
        if was_open && s.probing.is_none() {
            // A request let through before it opened failed too: it stays
            // open, its cool-down unchanged.
            return false;
        }
        let probe_failed = s.probing.take().is_some();
        s.failures = s.failures.saturating_add(1);
        if !was_open {
            remember(&mut s.recent, true, settings.window);
        }
        let in_a_row = settings.failures > 0 && s.failures >= settings.failures;
        let by_ratio = !was_open && too_many(&s.recent, settings);
        if probe_failed || in_a_row || by_ratio {
            s.open_until = Some(Instant::now() + settings.cool_down);
            s.recent.clear();
            s.opens += 1;
            drop(s);
            // A failed probe leaves it open: the lists did not change again.
            if !was_open {
                self.turns.send_modify(|n| *n += 1);
            }
            return true;
        }
        false
    }

    /// Closed, open or half-open now.
    pub(crate) fn phase(&self) -> Phase {
        match self.state().open_until {
            None => Phase::Closed,
            Some(until) if Instant::now() < until => Phase::Open,
            Some(_) => Phase::HalfOpen,
        }
    }

    /// Whether the breaker is open or half-open now (calls are not all sent).
    pub(crate) fn is_open(&self) -> bool {
        self.phase() != Phase::Closed
    }

    /// The guard of a probe [`Self::admit`] let through: a probe whose request
    /// ends without an outcome (its client went away, the call was cancelled)
    /// is handed back when the guard drops, so the next request after the
    /// cool-down probes in its place at once.
    pub(crate) fn probing(&self) -> ProbeGuard<'_> {
        ProbeGuard {
            breaker: Some(self),
        }
    }

    /// Changes each time the breaker opens or closes.
    pub(crate) fn turns(&self) -> watch::Receiver<u64> {
        self.turns.subscribe()
    }

    /// Times it opened since the gateway started (a failed probe counts again).
    pub(crate) fn opens(&self) -> u64 {
        self.state().opens
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
            breaker.state().probing = None;
        }
    }
}

/// Keeps the last `window` outcomes.
fn remember(recent: &mut VecDeque<bool>, failed: bool, window: u32) {
    if window == 0 {
        return;
    }
    while recent.len() >= window as usize {
        recent.pop_front();
    }
    recent.push_back(failed);
}

/// At least `min_calls` outcomes known, and at least `ratio` of them failed.
fn too_many(recent: &VecDeque<bool>, settings: &BreakerSettings) -> bool {
    let known = recent.len();
    if settings.ratio <= 0.0 || known == 0 || known < settings.min_calls as usize {
        return false;
    }
    let failed = recent.iter().filter(|f| **f).count();
    failed as f64 >= settings.ratio * known as f64
}

#[cfg(test)]
mod tests;
