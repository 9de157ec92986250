//! The gateway's approval state (signer, operator queue, open questions,
//! sessions that can be asked) and the events it records.
//!
//! Place: beneath the gate, which decides calls with this state, and the
//! admin API, which reads and decides the queue. Invariant: every approval,
//! denial, expiry and refusal is handed to the sink as one [`Happening`].

use std::sync::Arc;

use serde_json::Value;

use super::binding::Binding;
use super::inband;
use super::queue;
use super::settings::ApprovalSettings;
use super::state;
use crate::state::SharedState;

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
    /// Where used `requestState` nonces are remembered across the fleet
    /// (the memory store: in [`state::Signer`] itself).
    pub shared: Arc<SharedState>,
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
    /// The state for `settings` (read at start), in this process; events go
    /// to `sink`.
    pub fn new(settings: &ApprovalSettings, sink: Sink) -> Self {
        Self::with_store(settings, sink, Arc::new(SharedState::memory()))
    }

    /// The state for `settings`, its nonces used once through `shared`
    /// (with a shared store, every replica signs as the deployment).
    pub fn with_store(settings: &ApprovalSettings, sink: Sink, shared: Arc<SharedState>) -> Self {
        Self::for_replica(settings, sink, shared, "")
    }

    /// The state of replica `replica` (named on every entry it queues).
    pub fn for_replica(
        settings: &ApprovalSettings,
        sink: Sink,
        shared: Arc<SharedState>,
        replica: &str,
    ) -> Self {
        let (max, per_client) = (
            settings.max_used_states,
            settings.max_used_states_per_client,
        );
        let signer = match settings.key.as_deref() {
            Some(key) if shared.is_shared() => {
                state::Signer::for_fleet(key, shared.namespace(), max, per_client)
            }
            key => state::Signer::new(key, max, per_client),
        };
        Self {
            signer,
            shared,
            queue: queue::Queue::new(settings.max_pending, settings.max_pending_per_client)
                .on_replica(replica),
            questions: inband::Questions::default(),
            sessions: inband::Sessions::default(),
            key_generated: settings.key.is_none(),
            settings: settings.clone(),
            sink,
        }
    }

    /// Records whether the handshake-era session a client opened can be
    /// asked in band: it declared the elicitation capability at `initialize`.
    pub fn remember_session(&self, client: &str, session: &str, capabilities: Option<&Value>) {
        let elicits = inband::declares_elicitation(capabilities);
        let max = (
            self.settings.max_sessions,
            self.settings.max_sessions_per_client,
        );
        self.sessions.remember(client, session, elicits, max);
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
}
