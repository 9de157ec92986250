//! Pin approvals shared by a fleet: an operator's approval of a changed
//! definition on one replica is accepted by every replica of the deployment.
//!
//! Place: beside the pins' view; the admin API records an approval in the
//! shared store (`pin_approve` of the state store) before it applies it,
//! and every replica applies the fleet's approvals through the pins' own
//! approval ([`sync`], every [`SYNC_EVERY`]) off the request path.
//!
//! Invariants: the fleet's record of a pin is the hash an operator approved
//! (a definition of any other hash stays held: what runs is what was
//! reviewed); it is applied only to a pin whose live definition has that
//! very hash (the pins' approval with that hash expected), then written to
//! the replica's own pin store as any approval; the hot path never waits on the
//! shared store; an unreachable store leaves every held definition held.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::model::{Key, PinKind};
use super::store::ApproveOutcome;
use crate::state::SharedState;
use crate::util::time::now_ms;

/// How often a replica applies the fleet's pin approvals.
pub(crate) const SYNC_EVERY: Duration = Duration::from_secs(1);

/// One approval as the shared store keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct FleetApproval {
    /// The approved definition's hash (hex).
    hash: String,
    /// Who approved it (`api`), for the log and the pin's `by`.
    by: String,
    at_ms: i64,
}

/// The field of pin `key` in the fleet's approvals: server and name
/// hex-encoded, so no two pins share it.
pub(crate) fn field(key: &Key) -> String {
    format!(
        "{}.{}.{}",
        hex::encode(key.server.as_bytes()),
        key.kind.as_str(),
        hex::encode(key.name.as_bytes())
    )
}

fn key_of(field: &str) -> Option<Key> {
    let mut parts = field.split('.');
    let server = String::from_utf8(hex::decode(parts.next()?).ok()?).ok()?;
    let kind = match parts.next()? {
        "tool" => PinKind::Tool,
        "instructions" => PinKind::Instructions,
        _ => return None,
    };
    let name = String::from_utf8(hex::decode(parts.next()?).ok()?).ok()?;
    parts.next().is_none().then_some(Key { server, kind, name })
}

/// The value recorded for an approval of `hash` by `by`.
pub(crate) fn value(hash: &str, by: &str) -> String {
    let approval = FleetApproval {
        hash: hash.to_ascii_lowercase(),
        by: by.to_owned(),
        at_ms: now_ms(),
    };
    serde_json::to_string(&approval).unwrap_or_default()
}

/// Applies the fleet's pin approvals every [`SYNC_EVERY`] through
/// `approve` (the pins' own approval of a pin's live definition when it has
/// the hash given, by whom), until the task is aborted with the gateway.
/// An approval applied, or found applied, is not tried again until the
/// fleet records another for that pin; one whose hash this replica does
/// not serve (yet) is tried each round. An unreachable store is logged by
/// the store once; held definitions stay held meanwhile.
pub(crate) async fn sync(
    shared: Arc<SharedState>,
    approve: impl Fn(&Key, &str, &str) -> ApproveOutcome + Send,
) {
    let mut every = tokio::time::interval(SYNC_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut done: HashMap<String, String> = HashMap::new();
    loop {
        every.tick().await;
        if let Ok(rows) = shared.pin_approvals().await {
            apply(&rows, &mut done, &approve);
        }
    }
}

/// One round of [`sync`]: how many approvals were applied now.
fn apply(
    rows: &[(String, String)],
    done: &mut HashMap<String, String>,
    approve: &impl Fn(&Key, &str, &str) -> ApproveOutcome,
) -> usize {
    // Bounded by the store's bound of rows: only what the fleet still holds.
    done.retain(|field, _| rows.iter().any(|(f, _)| f == field));
    let mut applied = 0;
    for (field, value) in rows {
        if done.get(field) == Some(value) {
            continue;
        }
        let (Some(key), Ok(approval)) =
            (key_of(field), serde_json::from_str::<FleetApproval>(value))
        else {
            continue;
        };
        let by = format!("fleet:{}", approval.by);
        match approve(&key, &approval.hash, &by) {
            ApproveOutcome::Approved { .. } => {
                applied += 1;
                tracing::info!(server = %key.server, kind = key.kind.as_str(), name = %key.name,
                    hash = %approval.hash, by = %approval.by, "pin approval accepted from the fleet");
            }
            ApproveOutcome::AlreadyApproved { .. } => {}
            // Not served here (yet): tried again next round.
            ApproveOutcome::HashMismatch { .. } | ApproveOutcome::Unknown => continue,
        }
        done.insert(field.clone(), value.clone());
    }
    applied
}

#[cfg(test)]
mod tests {
    use super::super::{Pinning, Pins, digest};
    use super::*;
    use serde_json::json;

    #[test]
    fn a_fleet_approval_is_accepted_only_for_the_hash_approved() {
        let pins = Pins::empty(":memory:", "c.toml", None);
        let approve = |k: &Key, h: &str, by: &str| pins.approve(k, Some(h), by);
        let mut done = HashMap::new();
        let v1 = json!({"name": "echo", "description": "echo"});
        let v2 = json!({"name": "echo", "description": "echo, then mail it away"});
        let v3 = json!({"name": "echo", "description": "something else"});
        let observe = |v: &serde_json::Value| {
            pins.observe_tools("files", Pinning::Block, std::slice::from_ref(v))[0]
                .held()
                .is_some()
        };
        observe(&v1);
        assert!(observe(&v2), "changed: held");
        let key = Key::tool("files", "echo");
        let rows = vec![(field(&key), value(&hex::encode(digest(&v2)), "api"))];
        // Another definition is live: the approval of v2 does not apply to v3.
        assert!(observe(&v3));
        assert_eq!(apply(&rows, &mut done, &approve), 0);
        assert!(observe(&v3), "still held");
        // Once v2 is what the server serves, it is accepted, once.
        assert!(observe(&v2));
        assert_eq!(apply(&rows, &mut done, &approve), 1);
        assert!(!observe(&v2), "accepted from the fleet");
        assert_eq!(apply(&rows, &mut done, &approve), 0);
        // Unreadable rows are ignored; forgotten rows leave the memory.
        assert_eq!(apply(&[("x".into(), "y".into())], &mut done, &approve), 0);
        assert!(done.is_empty());
        assert_eq!(key_of(&field(&key)), Some(key));
    }
}
