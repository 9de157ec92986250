//! A 2026-07-28 call's own input round, and what the gateway adds to it.
//!
//! Place in the path: the approval gate reads what a call carries of the
//! upstream's multi-round exchange (a `requestState` not the gateway's, the
//! answers to the upstream's questions) so that its signed state can carry
//! it across the gateway's question; the pipeline strips the gateway's own
//! parameters before forwarding and gives the carried round back.
//!
//! Invariants: nothing of the gateway's own approval (its `requestState`, its
//! answer under [`INPUT_KEY`], the approval id in `_meta`) is ever forwarded;
//! an in-band approved call is forwarded with exactly the round its signed
//! state carried, whatever else the retry holds.

use serde_json::{Map, Value};

use super::question::INPUT_KEY;
use super::state::Signer;

/// The `_meta` key under which a client may name the approval id it retries with.
pub const META_APPROVAL_ID: &str = "portcullis/approvalId";

/// The upstream's own input round a 2026 call carries: a `requestState` that
/// is not the gateway's, and the answers to keys other than the gateway's.
pub(super) fn upstream_round(params: &Map<String, Value>) -> Option<Value> {
    let state = params
        .get("requestState")
        .filter(|s| !s.as_str().is_some_and(Signer::is_ours))
        .cloned();
    let answers = match params.get("inputResponses") {
        Some(Value::Object(r)) => {
            let others: Map<String, Value> = r
                .iter()
                .filter(|(k, _)| k.as_str() != INPUT_KEY)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (!others.is_empty()).then_some(Value::Object(others))
        }
        _ => None,
    };
    if state.is_none() && answers.is_none() {
        return None;
    }
    let mut round = Map::new();
    if let Some(s) = state {
        round.insert("requestState".into(), s);
    }
    if let Some(a) = answers {
        round.insert("inputResponses".into(), a);
    }
    Some(Value::Object(round))
}

/// Removes what the gateway added to a call's params for its own approval
/// (the approval id in `_meta`, its `requestState`, its answer). A call
/// approved in band (`round` is `Some`) then gets back the upstream's own
/// input round its state carried: its params hold nothing else of a round.
pub fn strip(params: &mut Map<String, Value>, round: Option<&Value>) {
    if let Some(Value::Object(meta)) = params.get_mut("_meta") {
        meta.remove(META_APPROVAL_ID);
        if meta.is_empty() {
            params.remove("_meta");
        }
    }
    if params
        .get("requestState")
        .and_then(Value::as_str)
        .is_some_and(Signer::is_ours)
    {
        params.remove("requestState");
    }
    if let Some(Value::Object(responses)) = params.get_mut("inputResponses") {
        responses.remove(INPUT_KEY);
        if responses.is_empty() {
            params.remove("inputResponses");
        }
    }
    let Some(round) = round else {
        return;
    };
    if let Some(state) = round.get("requestState") {
        params.insert("requestState".into(), state.clone());
    }
    if let Some(Value::Object(answers)) = round.get("inputResponses") {
        let into = params
            .entry("inputResponses")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(into) = into {
            into.extend(answers.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn the_gateways_parameters_never_leave_and_the_carried_round_comes_back() {
        let retry = json!({"name": "t", "arguments": {},
            "requestState": "pcl1.abc.def",
            "inputResponses": {INPUT_KEY: {"action": "accept"}, "ask": {"action": "accept"}},
            "_meta": {META_APPROVAL_ID: "apr_1", "k": 1}});
        // Operator path: only the gateway's own parts go.
        let mut p = params(retry.clone());
        strip(&mut p, None);
        assert_eq!(
            Value::Object(p),
            json!({"name": "t", "arguments": {}, "inputResponses": {"ask": {"action": "accept"}}, "_meta": {"k": 1}})
        );
        // In band: the round the state carried replaces whatever the retry holds of one.
        let mut p = params(retry);
        let carried = json!({"requestState": "upstream-1", "inputResponses": {"think": {"x": 1}}});
        strip(&mut p, Some(&carried));
        assert_eq!(p["requestState"], "upstream-1");
        assert_eq!(p["inputResponses"]["think"], json!({"x": 1}));
        assert!(
            !p["inputResponses"]
                .as_object()
                .unwrap()
                .contains_key(INPUT_KEY)
        );
        // What a first call carries of the upstream's round.
        let first = params(
            json!({"requestState": "upstream-1", "inputResponses": {"ask": 1, INPUT_KEY: 2}}),
        );
        assert_eq!(
            upstream_round(&first),
            Some(json!({"requestState": "upstream-1", "inputResponses": {"ask": 1}}))
        );
        assert_eq!(
            upstream_round(&params(json!({"requestState": "pcl1.x.y"}))),
            None
        );
    }
}
