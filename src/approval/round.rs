//! A 2026-07-28 call's own input round, and what the gateway adds to it.
//!
//! Place in the path: the approval gate reads what a call carries of the
//! upstream's multi-round exchange (a `requestState` not the gateway's, the
//! answers to the upstream's questions) so that its signed state can carry
//! it across the gateway's question; the pipeline strips the gateway's own
//! parameters before forwarding and gives the carried round back. All of
//! it from the round classification typed (`mcp::request::Round`), never from the
//! params by key; the request puts the round decided here back into the
//! forwarded call (`Request::forwarded_with`).
//!
//! Invariants: nothing of the gateway's own approval (its `requestState`, its
//! answer under [`INPUT_KEY`], the approval id in `_meta`) is ever forwarded;
//! an in-band approved call is forwarded with exactly the round its signed
//! state carried, whatever else the retry holds.

use serde_json::{Map, Value};

use super::question::INPUT_KEY;
use super::state::Signer;
use crate::mcp::request::Round;

/// Whether a `requestState` is one the gateway signed (else the upstream's).
fn ours(state: &Value) -> bool {
    state.as_str().is_some_and(Signer::is_ours)
}

/// The answers of `responses` but the one to the gateway's own question.
fn others(responses: &Map<String, Value>) -> Map<String, Value> {
    responses
        .iter()
        .filter(|(k, _)| k.as_str() != INPUT_KEY)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The upstream's own input round a 2026 call carries: a `requestState` that
/// is not the gateway's, and the answers to keys other than the gateway's.
pub(super) fn upstream_round(sent: &Round) -> Option<Round> {
    let state = sent.state.as_ref().filter(|s| !ours(s)).cloned();
    let answers = sent
        .responses()
        .map(others)
        .filter(|others| !others.is_empty())
        .map(Value::Object);
    if state.is_none() && answers.is_none() {
        return None;
    }
    Some(Round {
        state,
        responses: answers,
        approval_id: None,
    })
}

/// The round a call is forwarded with: the one it carried without what the
/// gateway added for its own approval (the approval id, its `requestState`,
/// its answer). A call approved in band (`carried` is `Some`: what its
/// signed state carried, [`Round::carried`]) is forwarded with that round
/// and nothing else of the retry's: its state and its answers only.
pub(crate) fn strip(sent: &Round, carried: Option<&Value>) -> Round {
    // An approved call runs with exactly the round its signed state carried:
    // an answer or a state the retry adds was never judged.
    if let Some(carried) = carried {
        return Round::from_carried(carried.clone());
    }
    let mut round = Round {
        state: sent.state.clone().filter(|s| !ours(s)),
        responses: sent.responses.clone(),
        approval_id: None,
    };
    if let Some(Value::Object(responses)) = &mut round.responses {
        responses.remove(INPUT_KEY);
        if responses.is_empty() {
            round.responses = None;
        }
    }
    round
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::request::META_APPROVAL_ID;
    use crate::mcp::request::tests::{tool_call_with_round, typed_call};
    use proptest::prelude::*;
    use serde_json::json;

    fn call(params: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    }

    #[test]
    fn the_gateways_parameters_never_leave_and_the_carried_round_comes_back() {
        let retry = call(json!({"name": "t", "arguments": {},
            "requestState": "pcl1.abc.def",
            "inputResponses": {INPUT_KEY: {"action": "accept"}, "ask": {"action": "accept"}},
            "_meta": {META_APPROVAL_ID: "apr_1", "k": 1}}));
        let request = typed_call(&retry);
        // Operator path: only the gateway's own parts go.
        let forwarded = request.forwarded_with(&strip(request.round(), None));
        assert_eq!(
            forwarded["params"],
            json!({"name": "t", "arguments": {}, "inputResponses": {"ask": {"action": "accept"}}, "_meta": {"k": 1}})
        );
        // In band: the round the state carried comes back.
        let carried = json!({"requestState": "upstream-1", "inputResponses": {"think": {"x": 1}}});
        let p = request.forwarded_with(&strip(request.round(), Some(&carried)))["params"].clone();
        assert_eq!(p["requestState"], "upstream-1");
        assert_eq!(p["inputResponses"]["think"], json!({"x": 1}));
        // An answer the retry adds that the approved round did not carry is
        // not forwarded: what runs is what the person approved.
        assert_eq!(p["inputResponses"].get("ask"), None);
        assert!(
            !p["inputResponses"]
                .as_object()
                .unwrap()
                .contains_key(INPUT_KEY)
        );
        let nothing_carried = json!({});
        let p = request.forwarded_with(&strip(request.round(), Some(&nothing_carried)))["params"]
            .clone();
        assert_eq!(p.get("inputResponses"), None);
        assert_eq!(p.get("requestState"), None);
        // What a first call carries of the upstream's round.
        let first = typed_call(&call(
            json!({"name": "t", "requestState": "upstream-1", "inputResponses": {"ask": 1, INPUT_KEY: 2}}),
        ));
        assert_eq!(
            upstream_round(first.round()).map(|r| r.carried()),
            Some(json!({"requestState": "upstream-1", "inputResponses": {"ask": 1}}))
        );
        let ours = typed_call(&call(json!({"name": "t", "requestState": "pcl1.x.y"})));
        assert_eq!(upstream_round(ours.round()), None);
    }

    /// The round as read by key from the raw params: what the gate read
    /// before the round was typed, kept here as the reference.
    fn upstream_round_by_key(params: &Map<String, Value>) -> Option<Value> {
        let state = params
            .get("requestState")
            .filter(|s| !s.as_str().is_some_and(Signer::is_ours))
            .cloned();
        let answers = match params.get("inputResponses") {
            Some(Value::Object(r)) => Some(others(r)).filter(|o| !o.is_empty()),
            _ => None,
        };
        let mut round = Map::new();
        if let Some(s) = state {
            round.insert("requestState".into(), s);
        }
        if let Some(a) = answers {
            round.insert("inputResponses".into(), Value::Object(a));
        }
        (!round.is_empty()).then_some(Value::Object(round))
    }

    /// The params as forwarded, edited by key on the raw params: the
    /// reference for [`strip`].
    fn strip_by_key(params: &mut Map<String, Value>, round: Option<&Value>) {
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
        params.remove("requestState");
        params.remove("inputResponses");
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

    proptest! {
        /// What the approval judges of a tool call's round, read from the
        /// typed request, is what the message itself says: the state it
        /// presents, the answer to the gateway's question, the approval id,
        /// the upstream's round it would carry; and what is forwarded after
        /// the gateway's own parts are taken out (with or without a carried
        /// round) is the message edited by key, byte for byte.
        #[test]
        fn the_typed_round_judges_and_forwards_what_the_message_says(
            sent in tool_call_with_round(),
            carried in proptest::option::of(tool_call_with_round()),
        ) {
            let request = typed_call(&sent);
            let round = request.round();
            let params = sent["params"].as_object().expect("params").clone();
            prop_assert_eq!(
                round.state_str(),
                params.get("requestState").and_then(Value::as_str)
            );
            prop_assert_eq!(
                round.responses().and_then(|r| r.get(INPUT_KEY)),
                params.get("inputResponses").and_then(|r| r.get(INPUT_KEY))
            );
            prop_assert_eq!(
                round.approval_id.as_ref(),
                params.get("_meta").and_then(|m| m.get(META_APPROVAL_ID))
            );
            prop_assert_eq!(
                upstream_round(round).map(|r| r.carried()),
                upstream_round_by_key(&params)
            );
            // A signed state carries what a first call carried.
            let carried = carried.and_then(|c| {
                upstream_round_by_key(c["params"].as_object().expect("params"))
            });
            let forwarded = request.forwarded_with(&strip(round, carried.as_ref()));
            let mut expected = sent.clone();
            strip_by_key(
                expected["params"].as_object_mut().expect("params"),
                carried.as_ref(),
            );
            let bytes = |v: &Value| {
                String::from_utf8(crate::util::canonical::to_vec(v)).expect("UTF-8")
            };
            prop_assert_eq!(bytes(&forwarded), bytes(&expected));
        }
    }
}
