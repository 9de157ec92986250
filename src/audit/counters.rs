//! The audit trail's counters, shared by the request path, the writers
//! (SQLite's thread, PostgreSQL's shipper) and `/metrics`.
//!
//! Place in the path: beside the audit's writers, below the metrics.
//!
//! Invariants: every event is counted once, as written, dropped or failed.

use std::sync::atomic::AtomicU64;

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
    pub store: std::sync::atomic::AtomicU8,
    /// `[gateway] replica`, for the metrics.
    pub replica: std::sync::OnceLock<String>,
}
