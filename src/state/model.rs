//! What the state store answers, shared by the store and its backends.
//!
//! Place in the path: beneath [`super::SharedState`] and its Redis backend
//! (a leaf: it imports nothing of the crate).

use std::time::Duration;

/// Longest wait for one answer of the store, connecting included.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(1500);

/// What using a nonce once did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The store is this process's: the caller remembers the nonce itself.
    Local,
    /// Used now, for the first time anywhere in the fleet.
    Done,
    /// Used already (through any replica).
    Used,
    /// The fleet holds its bound of unexpired used nonces.
    Full,
    /// This client holds its bound of them, fleet-wide.
    ClientFull,
}
