//! Clock readings and the forms time takes in texts: Unix milliseconds,
//! ISO 8601 instants, durations rounded up for `Retry-After` and shown to
//! people.
//!
//! Place: a leaf; every layer above may use it. Invariants: rounding is
//! always up (a client told to wait this long has waited long enough), and a
//! clock before 1970 reads as 0 rather than failing.

use std::time::Duration;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `2026-07-28T09:14:02Z` for Unix milliseconds.
pub fn iso8601(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Whole milliseconds, rounded up: waiting this long is always enough.
pub fn ceil_millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Whole seconds, rounded up (for `Retry-After`), at least 1.
pub fn ceil_secs(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(u128::from(NANOS_PER_SEC)))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// A duration as a person reads it: `30 s` when whole seconds, else `250 ms`.
pub fn humanize(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}
