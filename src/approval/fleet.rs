//! The operator queue of a fleet: with a shared store (`[state] backend =
//! "redis"`), a call held for an operator on one replica is listed by every
//! replica's admin API and dashboard, and a decision posted to any replica
//! makes it run on the replica that holds it, once.
//!
//! Place in the path: the gate's operator path and hold, and the admin
//! API's list and decision, when the store is shared
//! ([`crate::state::SharedState::is_shared`]); with the memory store the
//! process's own [`super::queue::Queue`] answers instead. The store keeps
//! opaque bounded texts ([`crate::state::queue`]); their meaning is here.
//!
//! Invariants: an entry names one [`Binding`] (client, server, tool,
//! argument digest) and is found again only by that exact binding, or by
//! its id for its own client; a decision is set once (the store's atomic
//! set-if-absent: first decision wins, on any replica) and taken once, by
//! the holder or by the identical retried call, which takes the entry out
//! with it; the holder learns the decision by a bounded poll (at most one
//! look per [`POLL`], none past the hold's deadline); a store that cannot
//! answer refuses (`state_unavailable`), never runs the call, and the
//! admin API says the store is unavailable rather than showing an empty
//! queue.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::approvals::{Approvals, Happening, Outcome};
use super::binding::Binding;
use super::gate::{Call, Gate, Refusal};
use super::queue::{DecideError, Entry, Status, new_id};
use crate::state::queue::MAX_ENTRY_BYTES;
use crate::state::{Decided, QueueIds, Queued, Settled, Unavailable};

/// How often a held call looks for its decision in the shared store.
pub const POLL: Duration = Duration::from_millis(200);

/// An entry as the store keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    id: String,
    client: String,
    server: String,
    tool: String,
    digest: String,
    shown: String,
    reason: Option<String>,
    rule: usize,
    created_ms: i64,
    expires_ms: i64,
    replica: String,
}

/// A decision as the store keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct Verdict {
    approve: bool,
    by: String,
    at_ms: i64,
}

/// The text the store keeps for `entry`.
fn stored(entry: &Entry) -> String {
    let s = Stored {
        id: entry.id.clone(),
        client: entry.binding.client.clone(),
        server: entry.binding.server.clone(),
        tool: entry.binding.tool.clone(),
        digest: entry.binding.digest_hex(),
        shown: entry.shown.clone(),
        reason: entry.reason.clone(),
        rule: entry.rule,
        created_ms: entry.created_ms,
        expires_ms: entry.expires_ms,
        replica: entry.replica.clone(),
    };
    serde_json::to_string(&s).unwrap_or_default()
}

/// The entry of a stored text and its decision (`None`: unreadable).
fn entry_of(text: &str, decision: Option<&str>) -> Option<Entry> {
    let s: Stored = serde_json::from_str(text).ok()?;
    let digest: [u8; 32] = hex::decode(&s.digest).ok()?.try_into().ok()?;
    let status = match decision.map(serde_json::from_str::<Verdict>) {
        None => Status::Pending,
        Some(Ok(v)) if v.approve => Status::Approved {
            by: v.by,
            at_ms: v.at_ms,
        },
        Some(Ok(v)) => Status::Denied {
            by: v.by,
            at_ms: v.at_ms,
        },
        Some(Err(_)) => return None,
    };
    Some(Entry {
        id: s.id,
        binding: Binding {
            client: s.client,
            server: s.server,
            tool: s.tool,
            digest,
        },
        shown: s.shown,
        reason: s.reason,
        rule: s.rule,
        created_ms: s.created_ms,
        expires_ms: s.expires_ms,
        status,
        replica: s.replica,
    })
}

/// The store's key of a call: SHA-256 of its four parts, each
/// length-prefixed, so no two bindings share it.
fn call_key(binding: &Binding) -> String {
    let mut h = Sha256::new();
    for part in [
        binding.client.as_bytes(),
        binding.server.as_bytes(),
        binding.tool.as_bytes(),
        &binding.digest,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    hex::encode(h.finalize())
}

/// Whether `id` can be an approval id (`apr_` and 32 hex digits): anything
/// else names nothing, and never reaches the store.
pub fn valid_id(id: &str) -> bool {
    id.strip_prefix("apr_")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn ids<'a>(entry: &'a Entry, call: &'a str) -> QueueIds<'a> {
    QueueIds {
        id: &entry.id,
        call,
        client: &entry.binding.client,
    }
}

impl Approvals {
    /// The operator path of a fleet: the decision of this exact call, taken
    /// once, or the call queued (or found queued) for every replica.
    pub(super) async fn operator_fleet(&self, call: &Call<'_>) -> Gate {
        let r = call.requirement;
        let key = call_key(&call.binding);
        let limits = (
            self.settings.max_pending,
            self.settings.max_pending_per_client,
        );
        // A second round only when an identical call took the decision found
        // between the two steps (the entry is gone: queue anew).
        for _ in 0..2 {
            let entry = Entry {
                id: new_id(),
                binding: call.binding.clone(),
                shown: call.shown.clone(),
                reason: r.reason.clone(),
                rule: r.rule,
                created_ms: call.now_ms,
                expires_ms: call.now_ms + millis(r.timeout),
                status: Status::Pending,
                replica: self.queue.replica().to_owned(),
            };
            let times = (call.now_ms, entry.expires_ms);
            let text = stored(&entry);
            if text.len() > MAX_ENTRY_BYTES {
                // Never queued cut: refused like a question too long to show.
                return Gate::Refuse(Refusal::Unpresentable {
                    chars: text.len(),
                    limit: MAX_ENTRY_BYTES,
                });
            }
            let added = self
                .shared
                .queue_add(ids(&entry, &key), &text, times, limits)
                .await;
            let (found, decided) = match added {
                Ok(Queued::Added) => {
                    self.fleet_event(Outcome::Asked, &entry, call.now_ms);
                    return Gate::queued(r, entry, false, None);
                }
                Ok(Queued::Full) => return busy(limits.0, false),
                Ok(Queued::ClientFull) => return busy(limits.1, true),
                Err(e) => return unavailable(&e),
                Ok(Queued::Found {
                    entry, decision, ..
                }) => (entry, decision.is_some()),
            };
            let Some(found) = entry_of(&found, None).filter(|e| e.binding == call.binding) else {
                return Gate::Refuse(Refusal::QueueUnavailable {
                    store: self.shared.store(),
                });
            };
            if !decided {
                return Gate::queued(r, found, true, None);
            }
            match self.shared.queue_settle(ids(&found, &key), false).await {
                Ok(Settled::Decided(d)) => {
                    return match self.take_decision(&found, &d) {
                        Ok(()) => Gate::Run {
                            strip: true,
                            restore: None,
                        },
                        Err(refusal) => Gate::Refuse(refusal),
                    };
                }
                Ok(_) => continue,
                Err(e) => return unavailable(&e),
            }
        }
        busy(limits.0, false)
    }

    /// A call held on this replica: `Ok` once an operator approved it on
    /// any replica (the decision taken here, once); the refusal when denied,
    /// expired, or the store cannot say.
    pub(super) async fn hold_fleet(&self, entry: &Entry, timeout: Duration) -> Result<(), Refusal> {
        let key = call_key(&entry.binding);
        let left = (entry.expires_ms - crate::util::time::now_ms()).max(0) as u64;
        let wait = Duration::from_millis(left).min(timeout);
        let deadline = tokio::time::Instant::now() + wait;
        let rounds = wait.as_millis() / POLL.as_millis() + 1;
        for _ in 0..rounds {
            match self.shared.queue_settle(ids(entry, &key), false).await {
                Ok(Settled::Decided(d)) => return self.take_decision(entry, &d),
                Ok(Settled::Pending) => {}
                // Used by an identical retried call first, or expired.
                Ok(Settled::Gone | Settled::Expired) => {
                    return Err(Refusal::Expired {
                        by: "operator",
                        timeout,
                    });
                }
                // A decision made meanwhile waits in the store: look again.
                Err(_) => {}
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            tokio::time::sleep(POLL.min(deadline - now)).await;
        }
        let now = crate::util::time::now_ms();
        match self.shared.queue_settle(ids(entry, &key), true).await {
            Ok(Settled::Decided(d)) => self.take_decision(entry, &d),
            Ok(settled) => {
                if settled == Settled::Expired {
                    self.fleet_event(Outcome::Expired, entry, now);
                }
                Err(Refusal::Expired {
                    by: "operator",
                    timeout,
                })
            }
            // Whether it was decided cannot be known: not run.
            Err(e) => Err(Refusal::QueueUnavailable { store: e.store }),
        }
    }

    /// A decision just taken (once) for `entry`: approved runs, recorded as
    /// used; denied is the refusal.
    fn take_decision(&self, entry: &Entry, decision: &str) -> Result<(), Refusal> {
        match serde_json::from_str::<Verdict>(decision) {
            Ok(v) if v.approve => {
                self.fleet_event(Outcome::Used, entry, crate::util::time::now_ms());
                Ok(())
            }
            Ok(v) => Err(Refusal::Denied {
                id: entry.id.clone(),
                by: v.by,
            }),
            Err(_) => Err(Refusal::Denied {
                id: entry.id.clone(),
                by: String::new(),
            }),
        }
    }

    /// Entry `id`, when it is a live one of `client` (fleet-wide).
    pub(super) async fn owned_fleet(
        &self,
        id: &str,
        client: &str,
        now_ms: i64,
    ) -> Result<Option<Entry>, Unavailable> {
        if !valid_id(id) {
            return Ok(None);
        }
        let found = self.shared.queue_get(id).await?;
        Ok(found
            .and_then(|(e, d)| entry_of(&e, d.as_deref()))
            .filter(|e| e.id == id && e.binding.client == client && e.expires_ms > now_ms))
    }

    /// Every live entry (of the fleet, with a shared store), oldest first;
    /// expired entries of this replica's own queue are taken out (and
    /// audited) first.
    pub async fn list(&self, now_ms: i64) -> Result<Vec<Entry>, Unavailable> {
        if !self.shared.is_shared() {
            self.sweep(now_ms);
            return Ok(self.queue.list(now_ms));
        }
        let rows = self
            .shared
            .queue_list(now_ms, self.settings.max_pending)
            .await?;
        let mut out: Vec<Entry> = rows
            .iter()
            .filter_map(|(e, d)| entry_of(e, d.as_deref()))
            .filter(|e| e.expires_ms > now_ms)
            .collect();
        out.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        Ok(out)
    }

    /// An operator's decision, recorded: in this replica's queue, or with a
    /// shared store set once for the fleet (the first decision wins).
    pub async fn decide(
        &self,
        id: &str,
        approve: bool,
        by: &str,
        now_ms: i64,
    ) -> Result<Entry, DecideError> {
        let entry = if self.shared.is_shared() {
            if !valid_id(id) {
                return Err(DecideError::Unknown);
            }
            let verdict = Verdict {
                approve,
                by: by.to_owned(),
                at_ms: now_ms,
            };
            let verdict = serde_json::to_string(&verdict).unwrap_or_default();
            match self.shared.queue_decide(id, &verdict).await {
                Ok(Decided::Now(e)) => entry_of(&e, Some(&verdict)).ok_or(DecideError::Unknown)?,
                Ok(Decided::Already(e, d)) => {
                    let entry = entry_of(&e, Some(&d)).ok_or(DecideError::Unknown)?;
                    return Err(DecideError::Decided(Box::new(entry)));
                }
                Ok(Decided::Unknown) => return Err(DecideError::Unknown),
                Err(e) => return Err(DecideError::Unavailable { store: e.store }),
            }
        } else {
            self.sweep(now_ms);
            self.queue.decide(id, approve, by, now_ms)?
        };
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

    fn fleet_event(&self, outcome: Outcome, entry: &Entry, at_ms: i64) {
        self.record(&Happening {
            outcome,
            by: "operator",
            decided_by: None,
            binding: &entry.binding,
            id: Some(&entry.id),
            at_ms,
        });
    }
}

fn busy(limit: usize, per_client: bool) -> Gate {
    Gate::Refuse(Refusal::Busy { limit, per_client })
}

fn unavailable(e: &Unavailable) -> Gate {
    Gate::Refuse(Refusal::QueueUnavailable { store: e.store })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn entry(client: &str, text: &str) -> Entry {
        Entry {
            id: new_id(),
            binding: Binding::new(client, "files", "delete", &json!({"path": text})),
            shown: format!("{{\"path\": {text:?}}}"),
            reason: Some("deletes".into()),
            rule: 3,
            created_ms: 10,
            expires_ms: 20,
            status: Status::Pending,
            replica: "gw-1".into(),
        }
    }

    #[test]
    fn an_entry_reads_back_as_it_was_queued_with_its_decision() {
        let e = entry("alice", "/tmp/x");
        let back = entry_of(&stored(&e), None).expect("reads");
        assert_eq!(back.binding, e.binding);
        assert_eq!(
            (&back.id, &back.shown, &back.replica),
            (&e.id, &e.shown, &e.replica)
        );
        let d = r#"{"approve":false,"by":"admin-api:bob","at_ms":15}"#;
        let denied = entry_of(&stored(&e), Some(d)).expect("reads");
        assert!(
            matches!(denied.status, Status::Denied { ref by, at_ms: 15 } if by == "admin-api:bob")
        );
        assert!(entry_of("{}", None).is_none());
    }

    #[test]
    fn only_approval_ids_reach_the_store() {
        assert!(valid_id(&new_id()));
        for bad in [
            "",
            "apr_",
            "apr_zz",
            "x",
            "apr_0123456789abcdef0123456789abcdef:x",
        ] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    proptest! {
        /// Two calls share a store key only when client, server, tool and
        /// arguments are all the same: an approval never moves to another
        /// client or call.
        #[test]
        fn a_call_key_names_one_binding(
            a in ("[a-c]{0,3}", "[a-c]{0,3}", "[a-c]{0,3}", "[a-c]{0,2}"),
            b in ("[a-c]{0,3}", "[a-c]{0,3}", "[a-c]{0,3}", "[a-c]{0,2}"),
        ) {
            let bind = |(c, s, t, x): &(String, String, String, String)| Binding::new(c, s, t, &json!(x));
            let (ba, bb) = (bind(&a), bind(&b));
            prop_assert_eq!(call_key(&ba) == call_key(&bb), ba == bb);
        }
    }
}
