//! One bucket a call needs a token from: its shared key, its shape, and the
//! rule it comes from.
//!
//! Place: below both backends (memory and Redis) and the limiter that asks
//! them. Invariant: the key is bounded ([`super::bucket_key`] hashes long names).

use super::gcra::Quota;
use crate::policy::Rate;

/// One bucket a call needs a token from.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// Who shares it: see [`bucket_key`].
    pub key: String,
    /// Its shape.
    pub quota: Quota,
    /// Position in `[[rules]]` of the rule it comes from.
    pub rule: usize,
    /// The rule's `rate`, as configured.
    pub rate: Rate,
}
