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
//! Modules: `approvals` (the state and its events), [`settings`] (what the config means), [`binding`] (client,
//! server, tool, argument digest), [`state`] (the signed 2026 state and its
//! nonces), [`queue`] (the operator queue), [`fleet`] (the operator queue
//! shared by a fleet's replicas), [`inband`] (the 2025 question and
//! which sessions can be asked), [`render`] (the one faithful rendering of a
//! call for every person who judges it), [`question`] (the question around
//! it, what is a yes),
//! [`round`] (a 2026 call's own input round, and the gateway's parameters
//! taken out of it), [`gate`] (the decision).
//!
//! Invariants: an approval is for one client, one server and tool, one
//! argument digest, one use, before its expiry — anything else is a new
//! approval; another client's approval (an id, a state) gets the answer an
//! unknown one gets; everything is in memory unless a shared store is configured
//! (then the operator queue and used nonces are the fleet's); a restart
//! forgets what this process alone kept, and refuses states signed before it; every limit is
//! explicit; this module imports neither the configuration, the admin API,
//! the dashboard nor the pipeline (they import it).

mod approvals;
pub mod binding;
pub mod fleet;
pub mod gate;
pub mod inband;
pub mod question;
pub mod queue;
pub mod render;
pub mod round;
pub mod settings;
pub mod state;

pub use approvals::{Approvals, Happening, Outcome, Sink};
pub use binding::Binding;
pub use gate::{Call, Gate, Refusal};
pub use settings::{ApprovalSettings, Approver, Pending, Requirement};
