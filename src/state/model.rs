//! What the state store answers and how its keys are named, shared by the
//! store, its backends and the fleet's queue.
//!
//! Place in the path: beneath the state store and its Redis backend (a
//! leaf: it imports nothing of the crate).

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

/// What a shared key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A used `requestState` nonce (value `1`, until the state's expiry).
    Nonce,
    /// The fleet's used nonces, scored by expiry (the overall bound).
    UsedNonces,
    /// One client's used nonces, scored by expiry (the per-client bound).
    UsedNoncesOf,
    /// A task's binding to its creator (JSON, at most 2 KiB).
    Task,
    /// One client's task bindings, scored by creation (the per-client bound).
    TasksOf,
    /// A 2025-era upstream session's binding to its client (JSON, bounded).
    Session,
    /// One client's session bindings, scored by creation (the per-client bound).
    SessionsOf,
    /// A call queued for an operator (JSON, at most 256 KiB).
    Approval,
    /// An operator's decision on a queued call (JSON, small).
    Decision,
    /// A queued call's approval id, by the digest of the call.
    ApprovalCall,
    /// The fleet's queued ids, scored by expiry (the overall bound).
    Approvals,
    /// One client's queued ids, scored by expiry (the per-client bound).
    ApprovalsOf,
    /// The fleet's pin approvals (one hash, bounded).
    Pins,
    /// The flow labels of one session: a list of marks (`label:server:tool`,
    /// hex-encoded names), at most a few per label.
    Flow,
    /// One client's flow sessions, scored by last use (the per-client bound).
    FlowsOf,
    /// Every flow session (`all`), scored by last use, and how many each
    /// client holds (`clients`): the deployment's bound.
    Flows,
    /// A rate-limit bucket (`<rule tag>/<key>`).
    Bucket,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Nonce => "nonce",
            Kind::UsedNonces => "nonces",
            Kind::UsedNoncesOf => "nonces-of",
            Kind::Task => "task",
            Kind::TasksOf => "tasks-of",
            Kind::Session => "session",
            Kind::SessionsOf => "sessions-of",
            Kind::Approval => "approval",
            Kind::Decision => "decision",
            Kind::ApprovalCall => "approval-call",
            Kind::Approvals => "approvals",
            Kind::ApprovalsOf => "approvals-of",
            Kind::Pins => "pins",
            Kind::Flow => "flow",
            Kind::FlowsOf => "flows-of",
            Kind::Flows => "flows",
            Kind::Bucket => "rl",
        }
    }
}

/// The Redis key of `id` of `kind` in `namespace`. Client names and other
/// free text are hex-encoded by the caller when they are ids.
pub fn key(namespace: &str, kind: Kind, id: &str) -> String {
    format!("portcullis:{namespace}:{}:{id}", kind.as_str())
}

/// The store did not answer (down, unreachable, too slow): the caller
/// refuses what needed it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the shared state store ({store}) did not answer: {detail}")]
pub struct Unavailable {
    /// `redis`.
    pub store: &'static str,
    pub detail: String,
}
