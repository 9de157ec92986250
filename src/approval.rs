//! Human approval for sensitive tools: a call a rule marks for approval runs
//! only after a person says yes to exactly these arguments.
//!
//! Place in the path: the last step of a `tools/call` before it is forwarded
//! (after the access rules, pins, rate limits, validation and the outgoing
//! secret scan — only a call that would be forwarded is ever put to a
//! person). The pipeline asks [`Approvals::gate`] what to do and acts on the
//! answer; the dashboard and the admin API read and decide the operator
//! queue.
//!
//! ```text
//! rule says approval ─▶ gate ─┬─ user, 2026-07-28: input_required + signed requestState ─▶ retry ─▶ verify, nonce once ─▶ forward
//!                             ├─ user, 2025 era:   elicitation/create on the call's SSE stream ─▶ client POSTs the answer ─▶ forward
//!                             └─ operator:         queue ─▶ dashboard / admin API ─▶ held call runs, or the retried call runs once
//! ```
//!
//! Modules: [`settings`] (what the config means), [`binding`] (client,
//! server, tool, argument digest), [`state`] (the signed 2026 state and its
//! nonces), [`queue`] (the operator queue), [`inband`] (the 2025 question and
//! which sessions can be asked), [`question`] (what is shown, what is a yes),
//! [`round`] (a 2026 call's own input round, and the gateway's parameters
//! taken out of it), [`gate`] (the decision).
//!
//! Invariants: an approval is for one client, one server and tool, one
//! argument digest, one use, before its expiry — anything else is a new
//! approval; another client's approval (an id, a state) gets the answer an
//! unknown one gets; everything is in memory (a restart forgets pending and
//! unused approvals, and refuses states signed before it); every limit is
//! explicit; this module imports neither the configuration, the admin API,
//! the dashboard nor the pipeline (they import it).

pub mod binding;
pub mod gate;
pub mod inband;
pub mod question;
pub mod queue;
pub mod round;
pub mod settings;
pub mod state;

pub use binding::Binding;
pub use gate::{Call, Gate, Refusal};
pub use settings::{ApprovalSettings, Approver, Pending, Requirement};

/// What happened to an approval (audit events, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A person was asked.
    Asked,
    /// A person said yes (the call runs, or may now run once).
    Approved,
    /// A person said no (or the answer was not a yes).
    Denied,
    /// Nobody answered in time.
    Expired,
    /// A presented approval was refused: forged, replayed, another client's.
    Refused,
    /// An approved call ran (the approval is used up).
    Used,
    /// Observe mode: enforcement would have asked.
    WouldAsk,
}

impl Outcome {
    /// Label for metrics and the audit.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Asked => "asked",
            Outcome::Approved => "approved",
            Outcome::Denied => "denied",
            Outcome::Expired => "expired",
            Outcome::Refused => "refused",
            Outcome::Used => "used",
            Outcome::WouldAsk => "would_ask",
        }
    }
}

/// One approval event, handed to the gateway's sink (audit and metrics).
#[derive(Debug)]
pub struct Happening<'a> {
    pub outcome: Outcome,
    /// `user` or `operator`: who was (or would be) asked.
    pub by: &'static str,
    /// The operator or answer that decided (`admin-api`, `dashboard`, `user`).
    pub decided_by: Option<&'a str>,
    pub binding: &'a Binding,
    /// The queue's approval id (operator path).
    pub id: Option<&'a str>,
    pub at_ms: i64,
}

/// Where approval events go.
pub type Sink = Box<dyn Fn(&Happening<'_>) + Send + Sync>;

/// The gateway's approval state: the signer, the queue, the open questions.
pub struct Approvals {
    pub settings: ApprovalSettings,
    pub signer: state::Signer,
    pub queue: queue::Queue,
    pub questions: inband::Questions,
    pub sessions: inband::Sessions,
    /// The signing key was generated at start (no `[approvals] key`).
    pub key_generated: bool,
    sink: Sink,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("settings", &self.settings)
            .field("key_generated", &self.key_generated)
            .finish_non_exhaustive()
    }
}

impl Approvals {
    /// The state for `settings` (read at start); events go to `sink`.
    pub fn new(settings: &ApprovalSettings, sink: Sink) -> Self {
        Self {
            signer: state::Signer::new(settings.key.as_deref(), settings.max_used_states),
            queue: queue::Queue::new(settings.max_pending, settings.max_pending_per_client),
            questions: inband::Questions::default(),
            sessions: inband::Sessions::default(),
            key_generated: settings.key.is_none(),
            settings: settings.clone(),
            sink,
        }
    }

    /// Records an event.
    pub fn record(&self, happening: &Happening<'_>) {
        (self.sink)(happening);
    }

    /// Takes expired operator entries out of the queue, recording each.
    pub fn sweep(&self, now_ms: i64) {
        for entry in self.queue.sweep(now_ms) {
            self.record(&Happening {
                outcome: Outcome::Expired,
                by: "operator",
                decided_by: None,
                binding: &entry.binding,
                id: Some(&entry.id),
                at_ms: now_ms,
            });
        }
    }

    /// An operator's decision, recorded.
    pub fn decide(
        &self,
        id: &str,
        approve: bool,
        by: &str,
        now_ms: i64,
    ) -> Result<queue::Entry, queue::DecideError> {
        self.sweep(now_ms);
        let entry = self.queue.decide(id, approve, by, now_ms)?;
        self.record(&Happening {
            outcome: if approve {
                Outcome::Approved
            } else {
                Outcome::Denied
            },
            by: "operator",
            decided_by: Some(by),
            binding: &entry.binding,
            id: Some(&entry.id),
            at_ms: now_ms,
        });
        Ok(entry)
    }
}
