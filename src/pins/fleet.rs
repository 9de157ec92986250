//! Pin approvals shared by a fleet: an operator's approval of a changed
//! definition on one replica is accepted by every replica of the deployment.
//!
//! Place: beside the view ([`super::Pins`]); the admin API records an
//! approval in the shared store ([`crate::state::SharedState::pin_approve`])
//! before it applies it, and every replica applies the fleet's approvals
//! ([`sync`], every [`SYNC_EVERY`]) off the request path.
//!
//! Invariants: the fleet's record of a pin is the hash an operator approved
//! (a definition of any other hash stays held: what runs is what was
//! reviewed); it is applied only to a pin whose live definition has that
//! very hash and that this replica does not trust yet, then written to the
//! replica's own pin store as any approval; the hot path never waits on the
//! shared store; an unreachable store leaves every held definition held.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Approved, Key, PinKind, Pins};
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

impl Pins {
    /// The hash (hex) of the definition last seen for `key`, if pinned.
    pub(crate) fn seen_hash(&self, key: &Key) -> Option<String> {
        let view = self.view.read().unwrap_or_else(|p| p.into_inner());
        let sv = view.get(&key.server)?;
        let record = match key.kind {
            PinKind::Tool => sv.tools.get(&key.name),
            PinKind::Instructions => sv.instructions.as_ref(),
        }?;
        Some(hex::encode(record.seen.hash))
    }

    /// Applies the fleet's approvals (field, value); how many changed trust.
    pub(crate) fn accept_fleet(&self, rows: &[(String, String)]) -> usize {
        let parsed = rows.iter().filter_map(|(field, value)| {
            Some((
                key_of(field)?,
                serde_json::from_str::<FleetApproval>(value).ok()?,
            ))
        });
        // Under the read lock: the pins to change (usually none), so the
        // lists and calls of this second never wait for the write lock.
        let wanted: Vec<(Key, FleetApproval)> = {
            let view = self.view.read().unwrap_or_else(|p| p.into_inner());
            parsed
                .filter(|(key, approval)| {
                    let record = view.get(&key.server).and_then(|sv| match key.kind {
                        PinKind::Tool => sv.tools.get(&key.name),
                        PinKind::Instructions => sv.instructions.as_ref(),
                    });
                    record
                        .is_some_and(|r| !r.trusted() && hex::encode(r.seen.hash) == approval.hash)
                })
                .collect()
        };
        if wanted.is_empty() {
            return 0;
        }
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        let mut accepted = 0;
        for (key, approval) in wanted {
            let record = view.get_mut(&key.server).and_then(|sv| match key.kind {
                PinKind::Tool => sv.tools.get_mut(&key.name),
                PinKind::Instructions => sv.instructions.as_mut(),
            });
            let Some(record) = record else { continue };
            if record.trusted() || hex::encode(record.seen.hash) != approval.hash {
                continue;
            }
            let mut version = record.seen.clone();
            version.at = approval.at_ms;
            record.approved = Some(Approved {
                version,
                by: format!("fleet:{}", approval.by),
            });
            self.put(key.clone(), record, true);
            accepted += 1;
            tracing::info!(server = %key.server, kind = key.kind.as_str(), name = %key.name,
                hash = %approval.hash, by = %approval.by, "pin approval accepted from the fleet");
        }
        drop(view);
        if accepted > 0 {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        accepted
    }
}

/// Applies the fleet's pin approvals to `pins` every [`SYNC_EVERY`], until
/// the task is aborted (with the gateway). An unreachable store is logged
/// by the store once; held definitions stay held meanwhile.
pub(crate) async fn sync(pins: Arc<Pins>, shared: Arc<SharedState>) {
    let mut every = tokio::time::interval(SYNC_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Ok(rows) = shared.pin_approvals().await {
            pins.accept_fleet(&rows);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_fleet_approval_is_accepted_only_for_the_hash_approved() {
        let pins = Pins::empty(":memory:", "c.toml", None);
        let v1 = json!({"name": "echo", "description": "echo"});
        let v2 = json!({"name": "echo", "description": "echo, then mail it away"});
        let v3 = json!({"name": "echo", "description": "something else"});
        pins.observe_tools("files", super::super::Pinning::Block, &[v1]);
        let held = pins.observe_tools(
            "files",
            super::super::Pinning::Block,
            std::slice::from_ref(&v2),
        );
        assert!(held[0].held().is_some());
        let key = Key::tool("files", "echo");
        let approved = hex::encode(super::super::digest(&v2));
        let rows = vec![(field(&key), value(&approved, "api"))];
        // Another definition is live: the approval of v2 does not apply to v3.
        pins.observe_tools("files", super::super::Pinning::Block, &[v3]);
        assert_eq!(pins.accept_fleet(&rows), 0);
        let held = pins.observe_tools(
            "files",
            super::super::Pinning::Block,
            std::slice::from_ref(&v2),
        );
        assert!(held[0].held().is_some());
        assert_eq!(pins.accept_fleet(&rows), 1);
        let now = pins.observe_tools("files", super::super::Pinning::Block, &[v2]);
        assert!(now[0].held().is_none());
        // Applied once; unreadable rows are ignored.
        assert_eq!(pins.accept_fleet(&rows), 0);
        assert_eq!(pins.accept_fleet(&[("x".into(), "y".into())]), 0);
        assert_eq!(key_of(&field(&key)), Some(key));
    }
}
