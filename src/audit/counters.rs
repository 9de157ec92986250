//! What the audit store has done so far, and its state: read by the
//! metrics at scrape time and by `/healthz`, written by the SQLite writer or
//! the PostgreSQL shipper and by the request path.
//!
//! Place: the bottom of the audit store, below both backends. Invariant:
//! plain atomics, so no reader ever waits for a writer.

use std::sync::atomic::{AtomicU8, AtomicU64};

/// Store state, as `/healthz` reports it.
pub const STATE_STARTING: u8 = 0;
/// The last insert or connection attempt succeeded.
pub const STATE_UP: u8 = 1;
/// The database cannot be reached; events wait in the spool.
pub const STATE_DOWN: u8 = 2;

/// What the audit trail has done so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// Events waiting in the queue.
    pub queued: AtomicU64,
    /// Events dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Events written.
    pub written: AtomicU64,
    /// Events lost to a write error.
    pub failed: AtomicU64,
    /// The store's state ([`STATE_UP`], [`STATE_DOWN`], [`STATE_STARTING`]);
    /// SQLite is always up.
    pub store: AtomicU8,
    /// `[gateway] replica`, for the metrics.
    pub replica: std::sync::OnceLock<String>,
}
