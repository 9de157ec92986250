//! A tool call's input round, typed: the 2026-07-28 multi-round fields
//! (`requestState`, `inputResponses`) and the operator approval a retry
//! names (`_meta["portcullis/approvalId"]`).
//!
//! Place in the path: moved out of a tool call's params when the call is
//! typed ([`super::Request::typed`]), judged by the approval gate
//! (`crate::approval`), and put back when the call is serialised — the
//! fields as sent ([`super::Request::to_value`]), or the round the gateway
//! forwards in their place ([`super::Request::forwarded_with`]).
//!
//! Invariants: each field is kept exactly as sent, whatever its type (a
//! state that is not a string, answers that are not an object are the
//! upstream's business and travel untouched); put back unchanged, the
//! message is the one parsed. Nothing here tells the gateway's own state or
//! answer from an upstream's: the approval decides that.

use serde_json::{Map, Value};

/// The `_meta` key under which a client may name the approval id it retries with.
pub(crate) const META_APPROVAL_ID: &str = "portcullis/approvalId";

/// `params.requestState`.
const STATE: &str = "requestState";
/// `params.inputResponses`.
const RESPONSES: &str = "inputResponses";
/// `params._meta`.
const META: &str = "_meta";

/// What a tool call carries of an input round.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Round {
    /// `params.requestState` as sent.
    pub(crate) state: Option<Value>,
    /// `params.inputResponses` as sent.
    pub(crate) responses: Option<Value>,
    /// `params._meta["portcullis/approvalId"]` as sent.
    pub(crate) approval_id: Option<Value>,
}

/// The round of a message that carries none.
pub(crate) static NO_ROUND: Round = Round {
    state: None,
    responses: None,
    approval_id: None,
};

impl Round {
    /// Moves the round's fields out of a tool call's params (the approval id
    /// out of its `_meta`, which stays, emptied or not).
    pub(super) fn take(params: &mut Map<String, Value>) -> Round {
        let approval_id = match params.get_mut(META) {
            Some(Value::Object(meta)) => meta.remove(META_APPROVAL_ID),
            _ => None,
        };
        Round {
            state: params.remove(STATE),
            responses: params.remove(RESPONSES),
            approval_id,
        }
    }

    /// Puts the fields back into `params`, each where it came from.
    pub(super) fn put(&self, params: &mut Map<String, Value>) {
        if let Some(state) = &self.state {
            params.insert(STATE.into(), state.clone());
        }
        if let Some(responses) = &self.responses {
            params.insert(RESPONSES.into(), responses.clone());
        }
        if let Some(id) = &self.approval_id {
            let meta = params
                .entry(META)
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(meta) = meta {
                meta.insert(META_APPROVAL_ID.into(), id.clone());
            }
        }
    }

    /// `requestState`, when a string.
    pub(crate) fn state_str(&self) -> Option<&str> {
        self.state.as_ref()?.as_str()
    }

    /// `inputResponses`, when an object: the answers by the key of the
    /// question each answers.
    pub(crate) fn responses(&self) -> Option<&Map<String, Value>> {
        self.responses.as_ref()?.as_object()
    }

    /// The round as a signed approval state carries it across a question:
    /// `{"requestState": …, "inputResponses": …}`, the fields present only
    /// (an approval id is never carried).
    pub(crate) fn carried(&self) -> Value {
        let mut out = Map::new();
        Round {
            approval_id: None,
            ..self.clone()
        }
        .put(&mut out);
        Value::Object(out)
    }

    /// The round a signed state carried ([`Round::carried`]); anything but an
    /// object carries nothing.
    pub(crate) fn from_carried(carried: Value) -> Round {
        let Value::Object(mut carried) = carried else {
            return Round::default();
        };
        Round {
            state: carried.remove(STATE),
            responses: carried.remove(RESPONSES),
            approval_id: None,
        }
    }
}

/// Drops an `_meta` left empty (by an approval id not forwarded).
pub(super) fn drop_empty_meta(params: &mut Map<String, Value>) {
    if params
        .get(META)
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty)
    {
        params.remove(META);
    }
}
