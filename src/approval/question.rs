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

/// The first words of every question the gateway asks.
pub const OPENING: &str = "Approve this tool call?";

/// Whether a server's own question (`elicitation/create` params) reads like
/// the gateway's: its message opens with the gateway's words once every
/// invisible character, space and case difference is taken out (the client
/// may show it with those removed).
pub fn poses_as_gateway(params: &Value) -> bool {
    let Some(message) = params.get("message").and_then(Value::as_str) else {
        return false;
    };
    let squeeze = |text: &str| -> String {
        text.chars()
            .filter(|c| !c.is_whitespace() && super::render::plain(*c))
            .flat_map(char::to_lowercase)
            .collect()
    };
    squeeze(message).starts_with(&squeeze(OPENING))
}

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
    fn a_server_question_in_the_gateways_words_is_recognised() {
        for posing in [
            "Approve this tool call?\nTool: x",
            "\u{200b}approve  THIS tool\u{202e} call? ok",
        ] {
            assert!(poses_as_gateway(&json!({"message": posing})), "{posing}");
        }
        assert!(!poses_as_gateway(&json!({"message": "Your name?"})));
        assert!(!poses_as_gateway(
            &json!({"text": "Approve this tool call?"})
        ));
        let ours = crate::approval::render::question(&crate::approval::render::Question {
            tool: "t",
            server: "s",
            reason: None,
            arguments: "{}",
            digest: "00",
        });
        assert!(ours.starts_with(OPENING) && poses_as_gateway(&json!({"message": ours})));
    }

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
