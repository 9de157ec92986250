//! The question put to a person: what is shown, and what counts as yes.
//!
//! Place in the path: built by the approval gate for the in-band question
//! (both eras) around the text [`super::render`] makes; read back when an
//! answer arrives.
//!
//! Invariants: the text is [`super::render::question`]'s, whole (a call too
//! large to show is refused before anyone is asked); only `accept` with
//! `approve: true` is a yes — decline, cancel, another shape, another value
//! are all a no.

use serde_json::{Value, json};

/// The key of the gateway's question in a 2026 `inputRequests` map.
pub const INPUT_KEY: &str = "portcullis_approval";

/// The `elicitation/create` params (form mode) of the question.
pub fn elicitation(message: String) -> Value {
    json!({
        "mode": "form",
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "approve": {
                    "type": "boolean",
                    "title": "Approve this call",
                    "description": "true runs the call once with the arguments shown; anything else refuses it",
                }
            },
            "required": ["approve"],
        }
    })
}

/// What a person answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Approved,
    /// Declined, cancelled, or anything but an explicit yes.
    Refused,
}

/// Reads an `ElicitResult` (`{action, content}`).
pub fn answer(result: Option<&Value>) -> Answer {
    let Some(result) = result else {
        return Answer::Refused;
    };
    let accepted = result.get("action").and_then(Value::as_str) == Some("accept");
    let approve = result
        .get("content")
        .and_then(|c| c.get("approve"))
        .and_then(Value::as_bool);
    if accepted && approve == Some(true) {
        Answer::Approved
    } else {
        Answer::Refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_explicit_yes_approves() {
        let yes = json!({"action": "accept", "content": {"approve": true}});
        assert_eq!(answer(Some(&yes)), Answer::Approved);
        for no in [
            json!({"action": "accept", "content": {"approve": false}}),
            json!({"action": "accept", "content": {"approve": "true"}}),
            json!({"action": "accept", "content": {"name": "bob"}}),
            json!({"action": "decline"}),
            json!({"action": "cancel", "content": {"approve": true}}),
            json!("accept"),
        ] {
            assert_eq!(answer(Some(&no)), Answer::Refused, "{no}");
        }
        assert_eq!(answer(None), Answer::Refused);
    }
}
