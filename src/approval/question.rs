//! The question put to a person: what is shown, and what counts as yes.
//!
//! Place in the path: built by the approval gate for the in-band question
//! (both eras) and for the operator queue's view of the arguments; read back
//! when an answer arrives.
//!
//! Invariants: the question shows the tool, the server, the arguments as the
//! sanitizer left them (the caller sanitizes) with each long string value
//! shortened and the whole bounded, and the rule's reason; only `accept`
//! with `approve: true` is a yes — decline, cancel, another shape, another
//! value are all a no.

use serde_json::{Map, Value, json};

/// The key of the gateway's question in a 2026 `inputRequests` map.
pub const INPUT_KEY: &str = "portcullis_approval";

/// Arguments for display: every string longer than `max_value` characters
/// cut with `…`; arrays and objects walked to a bounded depth.
pub fn shortened(arguments: &Value, max_value: usize) -> Value {
    fn walk(v: &Value, max: usize, depth: usize) -> Value {
        match v {
            Value::String(s) if s.chars().count() > max => {
                let mut cut: String = s.chars().take(max).collect();
                cut.push('…');
                Value::String(cut)
            }
            Value::Array(items) if depth >= 8 => json!(format!("[{} items]", items.len())),
            Value::Object(m) if depth >= 8 => json!(format!("{{{} members}}", m.len())),
            Value::Array(items) => {
                Value::Array(items.iter().map(|i| walk(i, max, depth + 1)).collect())
            }
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), walk(v, max, depth + 1)))
                    .collect::<Map<_, _>>(),
            ),
            other => other.clone(),
        }
    }
    walk(arguments, max_value.max(1), 0)
}

/// The text of the question.
pub fn message(
    tool: &str,
    server: &str,
    shown: &Value,
    reason: Option<&str>,
    max_chars: usize,
) -> String {
    let mut args = serde_json::to_string_pretty(shown).unwrap_or_else(|_| "{}".into());
    if args.chars().count() > max_chars {
        args = args.chars().take(max_chars).collect::<String>() + "\n…(shortened)";
    }
    let reason = reason
        .map(|r| format!("\nWhy approval is required: {r}"))
        .unwrap_or_default();
    format!(
        "Approve this tool call?\nTool: {tool}\nServer: {server}{reason}\nArguments:\n{args}\n\
         It runs once, with exactly these arguments, only if you approve."
    )
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

    #[test]
    fn long_values_are_shortened_for_display() {
        let shown = shortened(&json!({"path": "x".repeat(300), "n": 1}), 10);
        assert_eq!(shown["path"], format!("{}…", "x".repeat(10)));
        assert_eq!(shown["n"], 1);
        let text = message("delete_file", "files", &shown, Some("destructive"), 4000);
        assert!(text.contains("Tool: delete_file") && text.contains("Server: files"));
        assert!(text.contains("destructive"));
    }
}
