//! One schema violation, described for a model: where, what was expected, what
//! arrived, and what the property is for.
//!
//! Invariants: received values are shortened (a long string shows its start and
//! its length), so a refusal never repeats a large or secret-bearing argument in
//! full.

use std::fmt::Write as _;

use jsonschema::ValidationError;
use jsonschema::error::{TypeKind, ValidationErrorKind};
use serde_json::Value;

/// Longest rendering of a received value before it is shortened.
const MAX_RECEIVED_CHARS: usize = 48;

/// One reason the arguments do not conform.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Violation {
    /// JSON Pointer into the arguments (`""` is the arguments object itself).
    pub pointer: String,
    /// What the schema wants there.
    pub expected: String,
    /// What the call sent there.
    pub received: String,
    /// The property's own `description`, when the schema has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl Violation {
    pub(crate) fn from_error(error: &ValidationError<'_>, schema: &Value) -> Self {
        let mut pointer = error.instance_path().as_str().to_owned();
        let schema_path = error.schema_path().as_str();
        let received = shorten(error.instance());
        let (expected, received, description) = match error.kind() {
            ValidationErrorKind::Required { property } => {
                let name = property.as_str().unwrap_or_default();
                pointer = format!("{pointer}/{}", escape_pointer(name));
                let parent = parent_of(schema_path);
                let desc = lookup(
                    schema,
                    &format!("{parent}/properties/{}", escape_pointer(name)),
                );
                (
                    "a value (this property is required)".to_owned(),
                    "nothing: the property is missing".to_owned(),
                    desc,
                )
            }
            ValidationErrorKind::AdditionalProperties { unexpected }
            | ValidationErrorKind::UnevaluatedProperties { unexpected } => {
                let declared =
                    lookup_object_keys(schema, &format!("{}/properties", parent_of(schema_path)));
                let expected = if declared.is_empty() {
                    "no properties".to_owned()
                } else {
                    format!("only the declared properties ({})", declared.join(", "))
                };
                let names: Vec<String> = unexpected.iter().map(|n| format!("{n:?}")).collect();
                (
                    expected,
                    format!("unexpected property {}", names.join(", ")),
                    None,
                )
            }
            kind => (
                expected_for(kind),
                received,
                lookup(schema, parent_of(schema_path)),
            ),
        };
        Self {
            pointer,
            expected,
            received,
            description,
        }
    }

    /// One line: `/date: expected a string in format "date", got "tomorrow" (Departure date)`.
    pub fn line(&self) -> String {
        let at = if self.pointer.is_empty() {
            "(arguments)"
        } else {
            self.pointer.as_str()
        };
        let mut line = format!("{at}: expected {}, got {}", self.expected, self.received);
        if let Some(desc) = &self.description {
            let _ = write!(line, " — {}", shorten_text(desc, 160));
        }
        line
    }
}

fn expected_for(kind: &ValidationErrorKind) -> String {
    match kind {
        ValidationErrorKind::Type { kind } => match kind {
            TypeKind::Single(t) => format!("a value of type {t}"),
            TypeKind::Multiple(set) => {
                let names: Vec<String> = set.iter().map(|t| t.to_string()).collect();
                format!("a value of type {}", names.join(" or "))
            }
        },
        ValidationErrorKind::Enum { options } => format!("one of {}", compact(options)),
        ValidationErrorKind::Constant { expected_value } => {
            format!("exactly {}", compact(expected_value))
        }
        ValidationErrorKind::Format { format } => format!("a string in format {format:?}"),
        ValidationErrorKind::Pattern { pattern } => {
            format!("a string matching the pattern {pattern}")
        }
        ValidationErrorKind::Minimum { limit } => format!("a number ≥ {limit}"),
        ValidationErrorKind::Maximum { limit } => format!("a number ≤ {limit}"),
        ValidationErrorKind::ExclusiveMinimum { limit } => format!("a number > {limit}"),
        ValidationErrorKind::ExclusiveMaximum { limit } => format!("a number < {limit}"),
        ValidationErrorKind::MultipleOf { multiple_of } => format!("a multiple of {multiple_of}"),
        ValidationErrorKind::MinLength { limit } => {
            format!("a string of at least {limit} characters")
        }
        ValidationErrorKind::MaxLength { limit } => {
            format!("a string of at most {limit} characters")
        }
        ValidationErrorKind::MinItems { limit } => format!("an array of at least {limit} items"),
        ValidationErrorKind::MaxItems { limit } => format!("an array of at most {limit} items"),
        ValidationErrorKind::AdditionalItems { limit } => {
            format!("an array of at most {limit} items")
        }
        ValidationErrorKind::UniqueItems => "an array whose items are all different".to_owned(),
        ValidationErrorKind::MinProperties { limit } => {
            format!("an object with at least {limit} properties")
        }
        ValidationErrorKind::MaxProperties { limit } => {
            format!("an object with at most {limit} properties")
        }
        ValidationErrorKind::Contains => {
            "an array with at least one item of the required form".to_owned()
        }
        ValidationErrorKind::AnyOf { .. } | ValidationErrorKind::OneOfNotValid { .. } => {
            "a value matching one of the allowed alternatives".to_owned()
        }
        ValidationErrorKind::OneOfMultipleValid { .. } => {
            "a value matching exactly one of the alternatives (it matches several)".to_owned()
        }
        ValidationErrorKind::Not { .. } => "a value of a form this property excludes".to_owned(),
        ValidationErrorKind::FalseSchema => "no value at all (nothing is allowed here)".to_owned(),
        ValidationErrorKind::PropertyNames { .. } => {
            "property names of the allowed form".to_owned()
        }
        ValidationErrorKind::UnevaluatedItems { .. } => "no items beyond those declared".to_owned(),
        ValidationErrorKind::ContentEncoding { content_encoding } => {
            format!("a string in {content_encoding} encoding")
        }
        ValidationErrorKind::ContentMediaType { content_media_type } => {
            format!("a string holding {content_media_type}")
        }
        _ => "a value the schema accepts".to_owned(),
    }
}

/// `/properties/date/format` → `/properties/date`.
fn parent_of(schema_path: &str) -> &str {
    schema_path.rsplit_once('/').map(|(p, _)| p).unwrap_or("")
}

fn lookup(schema: &Value, pointer: &str) -> Option<String> {
    schema
        .pointer(pointer)?
        .get("description")?
        .as_str()
        .map(str::to_owned)
}

fn lookup_object_keys(schema: &Value, pointer: &str) -> Vec<String> {
    schema
        .pointer(pointer)
        .and_then(Value::as_object)
        .map(|m| m.keys().take(24).cloned().collect())
        .unwrap_or_default()
}

fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn compact(value: &Value) -> String {
    shorten_text(&value.to_string(), 200)
}

/// Renders a received value, shortened when long.
fn shorten(value: &Value) -> String {
    let text = value.to_string();
    let chars = text.chars().count();
    if chars <= MAX_RECEIVED_CHARS {
        return text;
    }
    let kind = match value {
        Value::String(s) => format!("a string of {} characters", s.chars().count()),
        Value::Array(a) => format!("an array of {} items", a.len()),
        Value::Object(o) => format!("an object with {} properties", o.len()),
        _ => format!("{chars} characters"),
    };
    let head: String = text.chars().take(MAX_RECEIVED_CHARS - 8).collect();
    format!("{head}… ({kind})")
}

fn shorten_text(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let head: String = text.chars().take(max).collect();
    format!("{head}…")
}
