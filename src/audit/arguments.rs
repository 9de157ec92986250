//! What the audit trail keeps of a call's arguments: nothing, their shape
//! (keys and JSON types), the values with secrets redacted, or the values as
//! sent, per `[audit] arguments`.
//!
//! Place: called by the pipeline once per call, before the event is built;
//! below the audit's writers, which store what it returns.
//!
//! Invariants: a shape holds no value and is bounded ([`SHAPE_BUDGET`]) whatever
//! the keys; a redacted copy has every secret the sanitizer finds replaced.

use serde_json::{Map, Value};

use crate::sanitize::{SanitizeSettings, Sanitizer, Skip};

/// `arguments` of `[audit]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditArguments {
    /// Not recorded.
    None,
    /// Keys and types only.
    Shape,
    /// Values with secrets redacted.
    Redacted,
    /// Values as sent.
    Full,
}

/// The arguments as `mode` records them.
pub fn record_arguments(
    mode: AuditArguments,
    sanitize: &SanitizeSettings,
    arguments: &Value,
) -> Option<Value> {
    match mode {
        AuditArguments::None => None,
        AuditArguments::Shape => Some(shape(arguments)),
        AuditArguments::Full => Some(arguments.clone()),
        AuditArguments::Redacted => {
            let found = Sanitizer::new(sanitize, Skip::default()).find_secrets(arguments);
            let mut copy = arguments.clone();
            for (pointer, kind) in found {
                if let Some(v) = copy.pointer_mut(&pointer) {
                    *v = Value::String(format!("[redacted:{kind}]"));
                }
            }
            Some(copy)
        }
    }
}

/// Most bytes of keys a shape keeps (the keys are the client's).
const SHAPE_BUDGET: usize = 8192;

/// Keys and JSON types, no values; each key cut to
/// [`MAX_KEPT`](crate::mcp::text::MAX_KEPT) bytes, and keys past
/// [`SHAPE_BUDGET`] left out with a count, so a shape is small whatever the
/// arguments.
fn shape(value: &Value) -> Value {
    let mut budget = SHAPE_BUDGET;
    shape_within(value, &mut budget)
}

fn shape_within(value: &Value, budget: &mut usize) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (i, (k, v)) in map.iter().enumerate() {
                if *budget == 0 {
                    out.insert("…".into(), format!("{} more keys", map.len() - i).into());
                    break;
                }
                let key = crate::util::text::clip(k);
                *budget = budget.saturating_sub(key.len() + 1);
                out.insert(key, shape_within(v, budget));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .take(1)
                .map(|v| shape_within(v, budget))
                .collect(),
        ),
        Value::String(_) => "string".into(),
        Value::Number(_) => "number".into(),
        Value::Bool(_) => "boolean".into(),
        Value::Null => "null".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_keeps_keys_and_types_only() {
        let v =
            serde_json::json!({"q": "secret words", "n": 3, "tags": ["a", "b"], "o": {"x": true}});
        assert_eq!(
            shape(&v),
            serde_json::json!({"q": "string", "n": "number", "tags": ["string"], "o": {"x": "boolean"}})
        );
    }

    #[test]
    fn a_shape_is_small_whatever_the_keys() {
        let mut many = Map::new();
        for i in 0..10_000 {
            many.insert(format!("{i}{}", "k".repeat(1000)), Value::from(i));
        }
        let kept = shape(&Value::Object(many)).to_string();
        assert!(kept.len() < 2 * SHAPE_BUDGET, "{} bytes", kept.len());
        assert!(kept.contains("more keys"));
    }
}
