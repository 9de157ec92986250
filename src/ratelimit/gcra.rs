//! The arithmetic of a token bucket, as GCRA (generic cell rate algorithm):
//! the one definition both backends follow — the memory store calls these
//! functions, and the Redis script (`gcra.lua`) does the same operations on
//! the same integers, so both admit exactly the same calls.
//!
//! A bucket of `burst` tokens that gains one token every `interval`
//! nanoseconds is kept as one number, its TAT (theoretical arrival time): the
//! instant at which the bucket would be full again. A call at `now` is
//! admitted when, after it, the bucket would need at most `burst · interval`
//! to refill:
//!
//! ```text
//! tat'  = max(tat, now) + interval
//! admit ⇔ tat' − now ≤ burst · interval          (then store tat')
//! retry = tat' − burst · interval                  (first instant it would pass)
//! ```
//!
//! Invariants: a refusal changes nothing; `retry` is exact (a call at `retry`
//! is admitted, one at `retry − 1 ns` is not, if nothing else consumed in
//! between); a bucket idle for any time holds `burst` tokens, never more; all
//! arithmetic is on whole nanoseconds in `u64`, and every value stays below
//! 2^63 for any quota a configuration can hold (see [`MAX_REFILL`]).

use std::num::NonZeroU32;

use crate::policy::Rate;

/// Nanoseconds per second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Longest time an empty bucket may take to fill (`burst / per_second`):
/// 100 years. The configuration refuses longer ones; quotas built here clamp.
pub const MAX_REFILL: u64 = 100 * 365 * 86_400 * NANOS_PER_SEC;

/// The shape of a bucket: how many tokens it holds and how fast it refills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    burst: NonZeroU32,
    interval: u64,
}

/// Why a call is refused: the bucket that binds and when the call would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Position of the binding bucket among those checked.
    pub index: usize,
    /// First instant at which the same call is admitted (same clock as `now`).
    pub retry_at: u64,
}

// === impl Quota ===

impl Quota {
    /// `burst` tokens, one more every `interval` nanoseconds (at least 1;
    /// `burst · interval` is clamped to [`MAX_REFILL`]).
    pub fn new(burst: NonZeroU32, interval: u64) -> Self {
        let cap = MAX_REFILL / u64::from(burst.get());
        Self {
            burst,
            interval: interval.clamp(1, cap.max(1)),
        }
    }

    /// The quota of a rule's `rate`.
    pub fn of(rate: &Rate) -> Self {
        Self::new(rate.burst, interval_nanos(rate.per_second))
    }

    /// Tokens in a full bucket.
    pub fn burst(&self) -> NonZeroU32 {
        self.burst
    }

    /// Nanoseconds per token.
    pub fn interval(&self) -> u64 {
        self.interval
    }

    /// Nanoseconds an empty bucket takes to fill: `burst · interval`.
    pub fn capacity(&self) -> u64 {
        u64::from(self.burst.get()) * self.interval
    }
}

/// Nanoseconds per token for `per_second` tokens a second: `10⁹ / per_second`
/// rounded up to a whole nanosecond, so the bucket never refills faster than
/// configured. A quotient within 10⁻¹² (relative) of a whole number is that
/// number, so decimal rates such as 0.1 or 3.0 give exact intervals.
pub fn interval_nanos(per_second: f64) -> u64 {
    if !(per_second.is_finite() && per_second > 0.0) {
        return MAX_REFILL;
    }
    let exact = NANOS_PER_SEC as f64 / per_second;
    let nearest = exact.round();
    let interval = if (exact - nearest).abs() <= nearest * 1e-12 {
        nearest
    } else {
        exact.ceil()
    };
    if interval >= MAX_REFILL as f64 {
        MAX_REFILL
    } else {
        (interval as u64).max(1)
    }
}

/// One bucket: the TAT to store if a call at `now` is admitted, or the
/// instant from which it would be.
pub fn admit(tat: u64, now: u64, quota: Quota) -> Result<u64, u64> {
    let next = tat.max(now).saturating_add(quota.interval);
    if next - now <= quota.capacity() {
        Ok(next)
    } else {
        // Refused only when tat > now: then next − capacity > now.
        Err(next - quota.capacity())
    }
}

/// Every bucket at once, all or nothing: on success each `tats[i]` holds its
/// new value; on refusal `tats` is untouched and the refusal names the bucket
/// that admits last (the call passes at `retry_at`, when every bucket does).
pub fn admit_all(tats: &mut [u64], now: u64, quotas: &[Quota]) -> Result<(), Refusal> {
    debug_assert_eq!(tats.len(), quotas.len());
    let mut refusal: Option<Refusal> = None;
    for (index, (tat, quota)) in tats.iter().zip(quotas).enumerate() {
        if let Err(retry_at) = admit(*tat, now, *quota)
            && refusal.is_none_or(|r| retry_at > r.retry_at)
        {
            refusal = Some(Refusal { index, retry_at });
        }
    }
    if let Some(r) = refusal {
        return Err(r);
    }
    for (tat, quota) in tats.iter_mut().zip(quotas) {
        *tat = (*tat).max(now).saturating_add(quota.interval);
    }
    Ok(())
}

/// Gives back the token a take left as `taken` (the TAT it stored), when the
/// bucket at `now` holds `tat`: the TAT to store, or `None` when nothing is
/// written. A refund is exact or nothing:
/// - `tat == taken`: no other take since, so the take is undone exactly
///   (`taken − interval`, the TAT before it, or earlier: full is full);
/// - `tat ≤ now`: the bucket is full again, there is nothing to give back;
/// - otherwise another call took from the bucket after this one, on top of
///   its TAT: which part of this token is still owed cannot be told from one
///   number (giving back a whole interval could hand out a token that had
///   already refilled), so the token stays taken — the fail-closed side.
pub fn refund(tat: u64, taken: u64, now: u64, quota: Quota) -> Refund {
    if tat == taken {
        Refund::Returned(taken.saturating_sub(quota.interval))
    } else if tat <= now {
        Refund::Full
    } else {
        Refund::Spent
    }
}

/// What a [`refund`] finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refund {
    /// The take is undone: store this TAT.
    Returned(u64),
    /// The bucket is full again: nothing to give back, nothing written.
    Full,
    /// Another take came after: the token stays taken, nothing written.
    Spent,
}
