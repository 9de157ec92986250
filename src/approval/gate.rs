//! The decision on a call a rule marks for approval: run it, ask, hold it,
//! or refuse it.
//!
//! Place in the path: called by the pipeline once every other check has
//! let the call through ([`Approvals::gate`]); for a held call (operator,
//! `pending = "wait"`) and a 2025-era question on the SSE stream, the
//! pipeline then awaits [`Approvals::hold`] or [`Approvals::await_answer`].
//!
//! Invariants: [`Gate::Run`] is returned only for a yes to this exact
//! binding, used once — a verified, unused, unexpired state of this process
//! (or, with a shared state store, of this deployment, its nonce used once
//! across the fleet) with an explicit yes (2026), a yes from this client and session to the
//! gateway's own question (2025), or an operator's approval taken out of the
//! queue; a state or id that is not this client's is refused like an unknown
//! one; other arguments than the approved ones are a new question, and the
//! old approval stays unused; a shared store that cannot answer refuses the
//! call ([`Refusal::StateUnavailable`], [`Refusal::QueueUnavailable`]),
//! never runs it. With a shared store the operator queue is the fleet's
//! ([`super::fleet`]).

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

use super::approvals::{Approvals, Happening, Outcome};
use super::binding::Binding;
use super::question::{self, Answer, INPUT_KEY};
use super::queue::{Entry, Full, Lookup, Status};
pub(crate) use super::round::strip;
use super::round::upstream_round;
use super::settings::{Approver, Pending, Requirement};
use super::state::{Signer, StateRefusal, Verified};
use crate::mcp::request::Round;
use crate::state::Use;

/// One call, as the gate sees it.
#[derive(Debug)]
pub struct Call<'a> {
    pub binding: Binding,
    pub requirement: &'a Requirement,
    /// What the call carries of an input round (`requestState`,
    /// `inputResponses`, the approval id it names), typed at classification.
    pub(crate) round: &'a Round,
    /// A 2026-07-28 request.
    pub modern: bool,
    /// The client declared elicitation (2026: in this request's `_meta`;
    /// 2025: at its session's `initialize`).
    pub can_elicit: bool,
    /// The handshake-era session.
    pub session: Option<&'a str>,
    /// The arguments as every person who judges the call sees them
    /// ([`super::render::arguments`] of the arguments forwarded).
    pub shown: String,
    pub now_ms: i64,
}

/// What the pipeline does with the call.
#[derive(Debug)]
pub enum Gate {
    /// Forward it; `strip` removes the gateway's `requestState` and answer
    /// (and the approval id in `_meta`) from the params first, and `restore`
    /// (in-band 2026 approvals) gives back the upstream's own input round the
    /// state carried ([`strip`]).
    Run {
        strip: bool,
        restore: Option<Value>,
    },
    /// Answer with this `input_required` result (2026-07-28).
    InputRequired(Value),
    /// Send `request` (an `elicitation/create`) on the call's SSE stream,
    /// then await the answer on `answer` ([`Approvals::await_answer`]).
    AskOnStream {
        id: String,
        request: Value,
        answer: oneshot::Receiver<Value>,
        timeout: Duration,
    },
    /// Hold the call until an operator decides ([`Approvals::hold`]);
    /// `decision` wakes it in this process (`None` with a shared store,
    /// where the decision is looked for there).
    Hold {
        entry: Entry,
        decision: Option<watch::Receiver<Status>>,
    },
    Refuse(Refusal),
}

impl Gate {
    /// What a queued (or found queued) call does: waits (woken by `decision`
    /// in this process, or looked for in the shared store when `None`), or
    /// is refused until the identical call is made again after the decision.
    pub(super) fn queued(
        r: &Requirement,
        entry: Entry,
        already: bool,
        decision: Option<watch::Receiver<Status>>,
    ) -> Gate {
        match r.pending {
            Pending::Retry => Gate::Refuse(Refusal::Required {
                id: entry.id,
                expires_ms: entry.expires_ms,
                already,
            }),
            Pending::Wait => Gate::Hold { entry, decision },
        }
    }
}

/// Why a call needing approval is not run.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The rule needs the user and this client cannot be asked.
    CannotAsk,
    /// The person said no (or anything but an explicit yes).
    Declined { by: &'static str },
    /// An operator denied it.
    Denied { id: String, by: String },
    /// Nobody answered within the rule's timeout.
    Expired { by: &'static str, timeout: Duration },
    /// The `requestState` is not one of the gateway's for this call, or
    /// another client's, or was signed before a restart.
    StateInvalid,
    /// The `requestState` was used already.
    StateUsed,
    /// The `requestState` is past its expiry.
    StateExpired,
    /// The shared state store (`redis`) did not answer, so whether the
    /// `requestState` was used already cannot be known: fail closed.
    StateUnavailable { store: &'static str },
    /// The operator path with a shared store (`redis`) that did not answer:
    /// the call cannot be queued where every operator sees it, nor its
    /// decision read, so it is not run.
    QueueUnavailable { store: &'static str },
    /// The approval id names nothing of this client's.
    UnknownId,
    /// What the call carries of an upstream's own input round is too large
    /// to carry across the gateway's question.
    TooLargeToCarry { limit: usize },
    /// The question would be longer than `max_question_chars`: it is
    /// refused rather than shown cut (nobody approves what they cannot see).
    Unpresentable { chars: usize, limit: usize },
    /// Too many approvals open (queue, questions or used states).
    Busy { limit: usize, per_client: bool },
    /// The configuration was reloaded while the call waited, and the one in
    /// force when the answer came no longer lets it run as it was approved
    /// (the tool or arguments refused, the client or server gone, another
    /// approver required).
    Reloaded,
    /// Operator path with `pending = "retry"`: queued (or still pending);
    /// retry the identical call after approval.
    Required {
        id: String,
        expires_ms: i64,
        already: bool,
    },
}

impl Approvals {
    fn event(&self, outcome: Outcome, by: &'static str, call: &Call<'_>, id: Option<&str>) {
        self.record(&Happening {
            outcome,
            by,
            decided_by: (outcome == Outcome::Approved || outcome == Outcome::Denied)
                .then_some("user"),
            binding: &call.binding,
            id,
            at_ms: call.now_ms,
        });
    }

    /// Observe mode: what enforcement would have done is recorded only.
    pub fn observed(&self, call: &Call<'_>) {
        let by = match call.requirement.by {
            Approver::User => "user",
            Approver::Operator => "operator",
            Approver::Either if call.can_elicit => "user",
            Approver::Either => "operator",
        };
        self.event(Outcome::WouldAsk, by, call, None);
    }

    /// The decision (see the module's invariants).
    pub async fn gate(&self, call: &Call<'_>) -> Gate {
        if let Some(id) = &call.round.approval_id {
            // An id names one of this client's approvals, or it is unknown.
            let client = &call.binding.client;
            let owned = match id.as_str() {
                Some(id) if self.shared.is_shared() => {
                    match self.owned_fleet(id, client, call.now_ms).await {
                        Ok(owned) => owned,
                        Err(e) => {
                            self.event(Outcome::Refused, "operator", call, None);
                            return Gate::Refuse(Refusal::QueueUnavailable { store: e.store });
                        }
                    }
                }
                Some(id) => self.queue.owned_by(id, client, call.now_ms),
                None => None,
            };
            if owned.is_none() {
                self.event(Outcome::Refused, "operator", call, None);
                return Gate::Refuse(Refusal::UnknownId);
            }
        }
        let chars = self.message(call).chars().count();
        let limit = self.settings.max_question_chars;
        if chars > limit {
            self.event(Outcome::Refused, "user", call, None);
            return Gate::Refuse(Refusal::Unpresentable { chars, limit });
        }
        let user = match call.requirement.by {
            Approver::User => true,
            Approver::Operator => false,
            Approver::Either => call.can_elicit,
        };
        match (user, call.can_elicit, call.modern) {
            (true, false, _) => Gate::Refuse(Refusal::CannotAsk),
            (true, true, true) => self.modern(call).await,
            (true, true, false) => self.on_stream(call),
            (false, _, _) if self.shared.is_shared() => self.operator_fleet(call).await,
            (false, _, _) => self.operator(call),
        }
    }

    /// 2026-07-28: a retry carrying the gateway's state, or a new question.
    /// What the call carries of the upstream's own input round (a
    /// `requestState` not the gateway's, answers to other keys) travels
    /// inside the gateway's signed state and is given back once approved.
    async fn modern(&self, call: &Call<'_>) -> Gate {
        let presented = call.round.state_str();
        let mut carried = upstream_round(call.round).map(|round| round.carried());
        if let Some(state) = presented.filter(|s| Signer::is_ours(s)) {
            let verified = match self.signer.verify(state, &call.binding, call.now_ms) {
                Ok(v) => v,
                Err(why) => {
                    self.event(Outcome::Refused, "user", call, None);
                    return Gate::Refuse(state_refusal(why, self.used_limits()));
                }
            };
            if verified.same_arguments {
                let answer = call.round.responses().and_then(|r| r.get(INPUT_KEY));
                if let Err(refusal) = self.use_state(&verified, call.now_ms).await {
                    self.event(Outcome::Refused, "user", call, None);
                    return Gate::Refuse(refusal);
                }
                return match question::answer(answer) {
                    Answer::Approved => {
                        self.event(Outcome::Approved, "user", call, None);
                        self.event(Outcome::Used, "user", call, None);
                        Gate::Run {
                            strip: true,
                            restore: Some(verified.carried.unwrap_or(json!({}))),
                        }
                    }
                    Answer::Refused => {
                        self.event(Outcome::Denied, "user", call, None);
                        Gate::Refuse(Refusal::Declined { by: "user" })
                    }
                };
            }
            // Other arguments than those approved: a new question; the old
            // state is left unused (what it carried is carried on).
            carried = verified.carried;
        }
        if let Some(c) = &carried
            && c.to_string().len() > super::state::MAX_CARRIED_BYTES
        {
            return Gate::Refuse(Refusal::TooLargeToCarry {
                limit: super::state::MAX_CARRIED_BYTES,
            });
        }
        let expires = call.now_ms + millis(call.requirement.timeout);
        let state = self.signer.issue(&call.binding, expires, carried);
        self.event(Outcome::Asked, "user", call, None);
        let params = question::elicitation(self.message(call));
        Gate::InputRequired(json!({
            "resultType": "input_required",
            "inputRequests": {INPUT_KEY: {"method": "elicitation/create", "params": params}},
            "requestState": state,
        }))
    }

    /// 2025 era: the gateway's own `elicitation/create` on the call's stream.
    fn on_stream(&self, call: &Call<'_>) -> Gate {
        let (max, per_client) = (
            self.settings.max_pending,
            self.settings.max_pending_per_client,
        );
        let Some(session) = call.session else {
            return Gate::Refuse(Refusal::CannotAsk);
        };
        let opened = self
            .questions
            .open(&call.binding.client, session, max, per_client);
        let (id, answer) = match opened {
            Ok(opened) => opened,
            Err(Full::Queue(limit)) => {
                return Gate::Refuse(Refusal::Busy {
                    limit,
                    per_client: false,
                });
            }
            Err(Full::Client(limit)) => {
                return Gate::Refuse(Refusal::Busy {
                    limit,
                    per_client: true,
                });
            }
        };
        self.event(Outcome::Asked, "user", call, None);
        let params = question::elicitation(self.message(call));
        let request =
            json!({"jsonrpc": "2.0", "id": id, "method": "elicitation/create", "params": params});
        Gate::AskOnStream {
            id,
            request,
            answer,
            timeout: call.requirement.timeout,
        }
    }

    /// The 2025 answer, awaited; `Ok` only for an explicit yes in time.
    pub async fn await_answer(
        &self,
        call_binding: &Binding,
        id: &str,
        answer: oneshot::Receiver<Value>,
        timeout: Duration,
    ) -> Result<(), Refusal> {
        let got = tokio::time::timeout(timeout, answer).await;
        let now = crate::util::time::now_ms();
        let happened = |outcome| Happening {
            outcome,
            by: "user",
            decided_by: matches!(outcome, Outcome::Approved | Outcome::Denied).then_some("user"),
            binding: call_binding,
            id: None,
            at_ms: now,
        };
        match got {
            Ok(Ok(response)) => match question::answer(response.get("result")) {
                Answer::Approved => {
                    self.record(&happened(Outcome::Approved));
                    self.record(&happened(Outcome::Used));
                    Ok(())
                }
                Answer::Refused => {
                    self.record(&happened(Outcome::Denied));
                    Err(Refusal::Declined { by: "user" })
                }
            },
            // Timed out, or the question was dropped.
            _ => {
                self.questions.close(id);
                self.record(&happened(Outcome::Expired));
                Err(Refusal::Expired {
                    by: "user",
                    timeout,
                })
            }
        }
    }

    /// The operator path: an approval of exactly this call, or the queue.
    fn operator(&self, call: &Call<'_>) -> Gate {
        self.sweep(call.now_ms);
        let r = call.requirement;
        let shown = call.shown.clone();
        let expires = call.now_ms + millis(r.timeout);
        let found = self.queue.lookup_or_add(
            &call.binding,
            shown,
            r.reason.clone(),
            r.rule,
            call.now_ms,
            expires,
        );
        let (entry, decision, already) = match found {
            Ok(Lookup::Approved(entry)) => {
                self.event(Outcome::Used, "operator", call, Some(&entry.id));
                return Gate::Run {
                    strip: true,
                    restore: None,
                };
            }
            Ok(Lookup::Denied(entry)) => {
                let by = match entry.status {
                    Status::Denied { by, .. } => by,
                    _ => String::new(),
                };
                return Gate::Refuse(Refusal::Denied { id: entry.id, by });
            }
            Ok(Lookup::Pending(entry, rx)) => (entry, rx, true),
            Ok(Lookup::Added(entry, rx)) => {
                self.event(Outcome::Asked, "operator", call, Some(&entry.id));
                (entry, rx, false)
            }
            Err(Full::Queue(limit)) => {
                return Gate::Refuse(Refusal::Busy {
                    limit,
                    per_client: false,
                });
            }
            Err(Full::Client(limit)) => {
                return Gate::Refuse(Refusal::Busy {
                    limit,
                    per_client: true,
                });
            }
        };
        Gate::queued(r, entry, already, Some(decision))
    }

    /// A held call: `Ok` once an operator approved it (and it is taken out of
    /// the queue: one use); the refusal when denied or expired.
    pub async fn hold(
        &self,
        entry: &Entry,
        decision: Option<watch::Receiver<Status>>,
        timeout: Duration,
    ) -> Result<(), Refusal> {
        let Some(mut decision) = decision else {
            return self.hold_fleet(entry, timeout).await;
        };
        let left = (entry.expires_ms - crate::util::time::now_ms()).max(0) as u64;
        let wait = Duration::from_millis(left).min(timeout);
        let decided = tokio::time::timeout(wait, decision.wait_for(|s| *s != Status::Pending));
        let _ = decided.await;
        let now = crate::util::time::now_ms();
        match self.queue.take(&entry.id, now) {
            Some(Entry {
                status: Status::Approved { .. },
                ..
            }) => {
                self.record(&Happening {
                    outcome: Outcome::Used,
                    by: "operator",
                    decided_by: None,
                    binding: &entry.binding,
                    id: Some(&entry.id),
                    at_ms: now,
                });
                Ok(())
            }
            Some(Entry {
                status: Status::Denied { by, .. },
                ..
            }) => Err(Refusal::Denied {
                id: entry.id.clone(),
                by,
            }),
            // Still pending at the timeout: it expires now, and can no longer
            // be approved; or it was used by an identical call first, or swept.
            _ => {
                if let Some(expired) = self.queue.expire(&entry.id) {
                    self.record(&Happening {
                        outcome: Outcome::Expired,
                        by: "operator",
                        decided_by: None,
                        binding: &expired.binding,
                        id: Some(&expired.id),
                        at_ms: now,
                    });
                }
                Err(Refusal::Expired {
                    by: "operator",
                    timeout,
                })
            }
        }
    }

    /// Uses a verified state once: in this process, or across the fleet
    /// through the shared store (one atomic set-if-absent with a TTL).
    async fn use_state(&self, verified: &Verified, now_ms: i64) -> Result<(), Refusal> {
        let (nonce, client, expires_ms) = Signer::nonce_of(verified);
        let used = self
            .shared
            .use_once(nonce, client, expires_ms, now_ms, self.used_limits())
            .await;
        let why = match used {
            Ok(Use::Local) => match self.signer.consume(verified, now_ms) {
                Ok(()) => return Ok(()),
                Err(why) => why,
            },
            Ok(Use::Done) => return Ok(()),
            Ok(Use::Used) => StateRefusal::Used,
            Ok(Use::Full) => StateRefusal::Full,
            Ok(Use::ClientFull) => StateRefusal::ClientFull,
            Err(unavailable) => {
                return Err(Refusal::StateUnavailable {
                    store: unavailable.store,
                });
            }
        };
        Err(state_refusal(why, self.used_limits()))
    }

    fn used_limits(&self) -> (usize, usize) {
        (
            self.settings.max_used_states,
            self.settings.max_used_states_per_client,
        )
    }

    /// The question's text: [`super::render::question`], whole.
    pub fn message(&self, call: &Call<'_>) -> String {
        super::render::question(&super::render::Question {
            tool: &call.binding.tool,
            server: &call.binding.server,
            reason: call.requirement.reason.as_deref(),
            arguments: &call.shown,
            digest: &call.binding.digest_hex(),
        })
    }
}

/// `limits`: the used-nonce table's bound, overall and per client.
fn state_refusal(why: StateRefusal, limits: (usize, usize)) -> Refusal {
    match why {
        StateRefusal::Invalid => Refusal::StateInvalid,
        StateRefusal::Expired => Refusal::StateExpired,
        StateRefusal::Used => Refusal::StateUsed,
        StateRefusal::Full => Refusal::Busy {
            limit: limits.0,
            per_client: false,
        },
        StateRefusal::ClientFull => Refusal::Busy {
            limit: limits.1,
            per_client: true,
        },
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)
}
