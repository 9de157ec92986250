//! Time for the in-memory buckets: a monotonic clock in production, a clock
//! that only moves when told in tests.
//!
//! Invariants: readings never go backwards; they are nanoseconds since the
//! clock was made, always ≥ 1, so a fresh bucket (TAT 0) is full at any reading.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of time for token buckets, in nanoseconds.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Nanoseconds since an arbitrary fixed start; never decreases.
    fn now(&self) -> u64;
}

/// The process's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    /// A clock starting now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> u64 {
        // 2^64 ns is 584 years of uptime.
        u64::try_from(self.start.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }
}

/// A clock that moves only when told; clones share the same time.
#[derive(Debug, Clone)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// A clock reading `start` nanoseconds (at least 1).
    pub fn at(start: u64) -> Self {
        Self {
            nanos: Arc::new(AtomicU64::new(start.max(1))),
        }
    }

    /// Moves time forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.advance_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Moves time forward by `n` nanoseconds.
    pub fn advance_nanos(&self, n: u64) {
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(n))
            });
    }

    /// Sets the reading to `t`, if that is not in the past.
    pub fn set(&self, t: u64) {
        self.nanos.fetch_max(t, Ordering::SeqCst);
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::at(1)
    }
}

impl Clock for FakeClock {
    fn now(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}
