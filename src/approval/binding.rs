//! What an approval is for: one client, one server and tool, one digest of
//! the arguments.
//!
//! Place in the path: computed by the approval gate once a call has passed
//! every other check (rules, rate limits, validation), from the arguments
//! exactly as they will be forwarded.
//!
//! Invariants: the digest is SHA-256 of the RFC 8785 canonical form of the
//! arguments (the pins module's canonicalization), so two spellings of the
//! same JSON object have one digest and any other change has another; a
//! binding matches only when all four parts are equal. JCS writes numbers
//! as IEEE-754 doubles, which would give `2^53 + 1` and `2^53` one digest:
//! integers beyond 2^53 are therefore digested by their exact digits, with
//! the places where they stand, so no two different argument values share
//! a digest through rounding.

use serde_json::{Map, Value};

/// SHA-256 of RFC 8785 canonical JSON.
pub type ArgumentDigest = [u8; 32];

/// The digest of a call's arguments.
pub fn digest(arguments: &Value) -> ArgumentDigest {
    let mut places = Vec::new();
    let exact = exact_integers(arguments, String::new(), &mut places);
    if places.is_empty() {
        return crate::pins::digest(arguments);
    }
    let places = Value::Array(places.into_iter().map(Value::String).collect());
    let marked = serde_json::json!({"exact-integers": places, "value": exact});
    crate::pins::digest(&marked)
}

/// The largest integer every double holds exactly.
const EXACT: u64 = 1 << 53;

/// `value` with every integer beyond ±2^53 replaced by its digits as a
/// string; the JSON pointer of each replaced place is pushed to `places`.
fn exact_integers(value: &Value, at: String, places: &mut Vec<String>) -> Value {
    match value {
        Value::Number(n) => {
            let big = n.as_u64().is_some_and(|u| u > EXACT)
                || n.as_i64().is_some_and(|i| i.unsigned_abs() > EXACT);
            if big {
                places.push(at);
                Value::String(n.to_string())
            } else {
                value.clone()
            }
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| exact_integers(v, format!("{at}/{i}"), places))
                .collect(),
        ),
        Value::Object(members) => {
            let mut out = Map::new();
            for (k, v) in members {
                let key = k.replace('~', "~0").replace('/', "~1");
                out.insert(k.clone(), exact_integers(v, format!("{at}/{key}"), places));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// One call, as an approval names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Binding {
    /// The authenticated client's name.
    pub client: String,
    /// The server, as configured.
    pub server: String,
    /// The tool, as the server names it.
    pub tool: String,
    /// [`digest`] of the arguments.
    pub digest: ArgumentDigest,
}

impl Binding {
    /// Binds a call.
    pub fn new(client: &str, server: &str, tool: &str, arguments: &Value) -> Self {
        Self {
            client: client.to_owned(),
            server: server.to_owned(),
            tool: tool.to_owned(),
            digest: digest(arguments),
        }
    }

    /// The digest as lowercase hex (audit, admin API, dashboard).
    pub fn digest_hex(&self) -> String {
        hex::encode(self.digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_number_spelling_do_not_change_the_digest_any_value_does() {
        let a = digest(&json!({"path": "/tmp/x", "force": true, "n": 1.0}));
        let b = digest(&serde_json::from_str(r#"{"n":1,"force":true,"path":"/tmp/x"}"#).unwrap());
        assert_eq!(a, b);
        assert_ne!(a, digest(&json!({"path": "/", "force": true, "n": 1})));
        assert_ne!(a, digest(&json!({"path": "/tmp/x", "force": true})));
    }

    #[test]
    fn integers_a_double_cannot_hold_keep_their_digits() {
        let big = |text: &str| digest(&serde_json::from_str(text).unwrap());
        assert_ne!(
            big(r#"{"n":9007199254740993}"#),
            big(r#"{"n":9007199254740992}"#)
        );
        assert_ne!(
            big(r#"{"n":9007199254740993}"#),
            big(r#"{"n":"9007199254740993"}"#)
        );
        assert_ne!(
            big(r#"{"n":9007199254740993,"m":"9007199254740995"}"#),
            big(r#"{"n":"9007199254740993","m":9007199254740995}"#)
        );
        assert_eq!(
            big(r#"{"n":9007199254740993}"#),
            big(r#"{ "n" : 9007199254740993 }"#)
        );
    }
}
