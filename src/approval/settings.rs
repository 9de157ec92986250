//! What an approval rule and the `[approvals]` table mean, compiled.
//!
//! Place in the path: built once by the configuration loader (which only
//! imports these types) and read by the approval gate on every call a rule
//! marks for approval.
//!
//! Invariants: every limit is explicit and bounded (no "unlimited"); the
//! signing key, when given, is at least 32 bytes and never printed (`Debug`
//! shows its length only); a rule's `timeout` is above zero and at most
//! [`MAX_TIMEOUT`].

use std::fmt;
use std::time::Duration;

/// The longest a rule may let an approval wait (and an approval stay usable).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// A rule's approval timeout when it names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The shortest signing key accepted (HMAC-SHA256 gains nothing past 64).
pub const MIN_KEY_BYTES: usize = 32;

/// Who may approve a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approver {
    /// The client's user, asked in band through elicitation.
    User,
    /// An operator, through the dashboard or the admin API.
    Operator,
    /// The user when the client can be asked, else an operator.
    Either,
}

impl Approver {
    /// The value as written in the configuration (and in metrics labels).
    pub fn as_str(self) -> &'static str {
        match self {
            Approver::User => "user",
            Approver::Operator => "operator",
            Approver::Either => "either",
        }
    }
}

/// What a client sees while an operator has not decided yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// The call is held open until the decision (or the timeout).
    Wait,
    /// The call is answered at once with an isError naming the approval id;
    /// the same call made again after approval runs (once).
    Retry,
}

impl Pending {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Pending::Wait => "wait",
            Pending::Retry => "retry",
        }
    }
}

/// `approval = { … }` on an allow rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    /// Who may say yes.
    pub by: Approver,
    /// How long a question stays open, and an approval usable.
    pub timeout: Duration,
    /// Shown to whoever approves (the rule's own words).
    pub reason: Option<String>,
    /// The operator path: hold the call, or answer at once and let it be retried.
    pub pending: Pending,
    /// Index of the rule in `[[rules]]` (shown as `rules[N]`).
    pub rule: usize,
}

impl Requirement {
    /// For `portcullis check`: who approves, how the client waits, for how long.
    pub fn describe(&self) -> String {
        let secs = self.timeout.as_secs();
        let timeout = if secs.is_multiple_of(3600) {
            format!("{}h", secs / 3600)
        } else if secs.is_multiple_of(60) {
            format!("{}m", secs / 60)
        } else {
            format!("{secs}s")
        };
        let pending = match self.pending {
            Pending::Wait => "the call is held until decided",
            Pending::Retry => "the client retries after approval",
        };
        let who = match self.by {
            Approver::User => "by the user (elicitation)".to_owned(),
            Approver::Operator => format!("by an operator ({pending})"),
            Approver::Either => {
                format!("by the user, or an operator when the client cannot be asked ({pending})")
            }
        };
        format!("{who}, within {timeout}")
    }
}

/// `[approvals]`: the gateway-wide part.
#[derive(Clone, PartialEq)]
pub struct ApprovalSettings {
    /// The HMAC-SHA256 key that signs 2026-era `requestState`s; `None`: one
    /// is generated at start (and the log says so).
    pub key: Option<Vec<u8>>,
    /// Most operator approvals kept at once (pending, or approved and not used yet).
    pub max_pending: usize,
    /// Most of them one client may have: past it its new calls are refused,
    /// never another client's.
    pub max_pending_per_client: usize,
    /// Most used `requestState` nonces remembered (each until its expiry):
    /// when full of unexpired ones, new in-band approvals are refused.
    pub max_used_states: usize,
    /// Most of them one client may hold: past it that client's in-band
    /// approvals are refused, never another client's.
    pub max_used_states_per_client: usize,
    /// Most handshake-era sessions whose elicitation capability is remembered.
    pub max_sessions: usize,
    /// Most of them remembered for one client: past it that client's own
    /// oldest is forgotten, never another client's.
    pub max_sessions_per_client: usize,
    /// Most characters of a question (the call rendered whole): a call whose
    /// question is longer is refused (`approval_unpresentable`), never cut.
    pub max_question_chars: usize,
}

impl Default for ApprovalSettings {
    fn default() -> Self {
        Self {
            key: None,
            max_pending: 1000,
            max_pending_per_client: 20,
            max_used_states: 100_000,
            max_used_states_per_client: 1_000,
            max_sessions: 10_000,
            max_sessions_per_client: 100,
            max_question_chars: 20_000,
        }
    }
}

impl fmt::Debug for ApprovalSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApprovalSettings")
            .field(
                "key",
                &self.key.as_ref().map(|k| format!("<{} bytes>", k.len())),
            )
            .field("max_pending", &self.max_pending)
            .field("max_pending_per_client", &self.max_pending_per_client)
            .field("max_used_states", &self.max_used_states)
            .field(
                "max_used_states_per_client",
                &self.max_used_states_per_client,
            )
            .field("max_sessions", &self.max_sessions)
            .field("max_sessions_per_client", &self.max_sessions_per_client)
            .field("max_question_chars", &self.max_question_chars)
            .finish()
    }
}
