//! JSON-RPC 2.0 as MCP uses it: one message per HTTP body, ids that are strings
//! or integers, `params` that are objects.
//!
//! Invariants: classification reads the body once; nesting is bounded by a byte
//! scan *before* the JSON parser runs, so a hostile body cannot drive a deep
//! recursion; batches are recognised and refused (removed in 2025-06-18); an
//! object with a duplicate key is refused, because the body is forwarded as it
//! came and a server whose parser keeps the first key would otherwise run what
//! the rules never saw (this parser keeps the last).

use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Parse error (invalid JSON).
pub(crate) const PARSE_ERROR: i64 = -32700;
/// The JSON is not a valid request object.
pub(crate) const INVALID_REQUEST: i64 = -32600;
/// Invalid params (also: unknown resource or prompt in 2026).
pub(crate) const INVALID_PARAMS: i64 = -32602;
/// The method is not served.
pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
/// A standard header disagrees with the body (2026-07-28).
pub(crate) const HEADER_MISMATCH: i64 = -32020;
/// The protocol version is not supported (2026-07-28).
pub(crate) const UNSUPPORTED_VERSION: i64 = -32022;

/// One message a client POSTed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Message {
    /// Expects a response.
    Request {
        id: Value,
        method: String,
        params: Option<Map<String, Value>>,
    },
    /// Expects nothing back.
    Notification {
        method: String,
        params: Option<Map<String, Value>>,
    },
    /// A client's answer to a server→client request (legacy era).
    Response { id: Value },
}

/// Why a body is not one JSON-RPC message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClassifyError {
    #[error("the body is not valid JSON: {0}")]
    Parse(String),
    #[error("the body nests JSON deeper than {0} levels")]
    TooDeep(usize),
    #[error("JSON-RPC batches are not supported: send one message per request")]
    Batch,
    #[error("the body repeats the key {0:?} in one object; send each key once")]
    DuplicateKey(String),
    #[error("{0}")]
    Invalid(&'static str),
}

impl ClassifyError {
    /// The JSON-RPC code this refusal carries.
    pub(crate) fn code(&self) -> i64 {
        match self {
            ClassifyError::Parse(_) => PARSE_ERROR,
            _ => INVALID_REQUEST,
        }
    }
}

// === impl Message ===

impl Message {
    /// Reads one message from `body`.
    pub(crate) fn classify(body: &[u8], max_depth: usize) -> Result<Self, ClassifyError> {
        check_depth(body, max_depth)?;
        Self::from_value(parse_unique(body)?)
    }

    /// Reads one message from a JSON value already parsed (and bounded) by
    /// the gateway: the shape rules of [`Message::classify`], without the
    /// depth and duplicate-key checks of raw text.
    pub(crate) fn from_value(value: Value) -> Result<Self, ClassifyError> {
        let mut object = match value {
            Value::Object(o) => o,
            Value::Array(_) => return Err(ClassifyError::Batch),
            _ => {
                return Err(ClassifyError::Invalid(
                    "a JSON-RPC message must be a JSON object",
                ));
            }
        };
        if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(ClassifyError::Invalid(
                "the message must carry \"jsonrpc\": \"2.0\"",
            ));
        }
        let id = match object.remove("id") {
            None => None,
            Some(id @ Value::String(_)) => Some(id),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(Value::Number(n)),
            Some(_) => {
                return Err(ClassifyError::Invalid(
                    "the id must be a string or an integer (never null)",
                ));
            }
        };
        let params = match object.remove("params") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return Err(ClassifyError::Invalid("params must be a JSON object")),
        };
        match (object.remove("method"), id) {
            (Some(Value::String(method)), Some(id)) => Ok(Message::Request { id, method, params }),
            (Some(Value::String(method)), None) => Ok(Message::Notification { method, params }),
            (Some(_), _) => Err(ClassifyError::Invalid("the method must be a string")),
            (None, Some(id)) if object.contains_key("result") || object.contains_key("error") => {
                Ok(Message::Response { id })
            }
            (None, _) => Err(ClassifyError::Invalid(
                "the message has no method and is not a response",
            )),
        }
    }

    /// The method, for requests and notifications.
    pub(crate) fn method(&self) -> Option<&str> {
        match self {
            Message::Request { method, .. } | Message::Notification { method, .. } => Some(method),
            Message::Response { .. } => None,
        }
    }

    /// The id, for requests (and responses).
    pub(crate) fn id(&self) -> Option<&Value> {
        match self {
            Message::Request { id, .. } | Message::Response { id } => Some(id),
            Message::Notification { .. } => None,
        }
    }

    /// The params object, when present.
    pub(crate) fn params(&self) -> Option<&Map<String, Value>> {
        match self {
            Message::Request { params, .. } | Message::Notification { params, .. } => {
                params.as_ref()
            }
            Message::Response { .. } => None,
        }
    }

    /// `params._meta[key]` as a string.
    pub(crate) fn meta_str(&self, key: &str) -> Option<&str> {
        self.params()?.get("_meta")?.get(key)?.as_str()
    }
}

/// Parses `body` as JSON, refusing any object that repeats a key.
fn parse_unique(body: &[u8]) -> Result<Value, ClassifyError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = Unique::deserialize(&mut de).and_then(|u| de.end().map(|()| u.0));
    parsed.map_err(|e| {
        let text = e.to_string();
        match text.strip_prefix(DUPLICATE) {
            Some(rest) => {
                let key = rest.rsplit_once(" at line ").map_or(rest, |(k, _)| k);
                ClassifyError::DuplicateKey(crate::util::text::clip(key))
            }
            None => ClassifyError::Parse(text),
        }
    })
}

/// Prefix of the parse error raised for a repeated key (followed by the key).
const DUPLICATE: &str = "duplicate key: ";

/// A JSON value whose objects have unique keys.
struct Unique(Value);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Unique(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(A::Error::custom(format!("{DUPLICATE}{key}")));
            }
            let Unique(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Refuses bodies that nest arrays/objects deeper than `max_depth`, counting only
/// brackets outside strings. A string's body is skipped with a vectorised
/// search for its closing quote or next backslash: a long text argument costs
/// a few bytes a cycle, not a branch a byte.
fn check_depth(body: &[u8], max_depth: usize) -> Result<(), ClassifyError> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'"' => {
                // In a string: only `"` (its end) and a backslash (an escape) matter.
                i += 1;
                loop {
                    match memchr::memchr2(b'"', b'\\', &body[i..]) {
                        // Unterminated: nothing after it counts.
                        None => return Ok(()),
                        Some(at) if body[i + at] == b'\\' => i += at + 2,
                        Some(at) => {
                            i += at + 1;
                            break;
                        }
                    }
                    if i >= body.len() {
                        return Ok(());
                    }
                }
                continue;
            }
            b'{' | b'[' => {
                depth += 1;
                if depth > max_depth {
                    return Err(ClassifyError::TooDeep(max_depth));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// A JSON-RPC success response.
pub(crate) fn result(id: &Value, result: Value) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC error response; `id` is `null` when it could not be read.
pub(crate) fn error(id: Option<&Value>, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut err = serde_json::json!({"code": code, "message": message});
    if let Some(data) = data {
        err["data"] = data;
    }
    serde_json::json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": err})
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn classify(v: &str) -> Result<Message, ClassifyError> {
        Message::classify(v.as_bytes(), 32)
    }

    /// The depth scan byte by byte, as it was before string bodies were
    /// skipped by search: the reference the fast scan is held to.
    fn depth_bytewise(body: &[u8], max_depth: usize) -> bool {
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for &b in body {
            if in_string {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => {
                    depth += 1;
                    if depth > max_depth {
                        return false;
                    }
                }
                b'}' | b']' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        true
    }

    proptest::proptest! {
        /// Skipping string bodies by search decides as the byte-by-byte scan
        /// does, on bodies dense in brackets, quotes and escapes (unterminated
        /// strings and a trailing backslash among them).
        #[test]
        fn the_depth_scan_skips_strings_as_the_bytewise_scan_reads_them(
            body in proptest::collection::vec(proptest::sample::select(
                b"{}[]\"\\a ,:\xc3\xa9".to_vec()), 0..200),
            max_depth in 0usize..6,
        ) {
            proptest::prop_assert_eq!(
                check_depth(&body, max_depth).is_ok(),
                depth_bytewise(&body, max_depth)
            );
        }
    }

    #[test]
    fn requests_notifications_responses() {
        let m =
            classify(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}"#)
                .expect("request");
        assert_eq!(m.method(), Some("tools/call"));
        assert_eq!(m.id(), Some(&json!(1)));
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Message::Notification { .. })
        ));
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","id":"s-1","result":{}}"#),
            Ok(Message::Response { .. })
        ));
    }

    #[test]
    fn refusals_carry_their_codes() {
        assert_eq!(classify("{nope").map_err(|e| e.code()), Err(PARSE_ERROR));
        assert_eq!(classify("[]"), Err(ClassifyError::Batch));
        assert_eq!(classify("[]").map_err(|e| e.code()), Err(INVALID_REQUEST));
        for bad in [
            r#""text""#,
            r#"{"id":1,"method":"x"}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
        ] {
            assert!(
                matches!(classify(bad), Err(ClassifyError::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_repeated_key_is_refused_at_any_depth() {
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":[{"k":1,"k":1}]}}"#,
        ] {
            let refused = classify(body);
            assert!(
                matches!(refused, Err(ClassifyError::DuplicateKey(_))),
                "{body}: {refused:?}"
            );
            assert_eq!(refused.map_err(|e| e.code()), Err(INVALID_REQUEST));
        }
        assert_eq!(
            classify(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"name":"a","name":"b"}}"#),
            Err(ClassifyError::DuplicateKey("name".into()))
        );
        // The same key in sibling objects is fine; values are parsed as before.
        let m = classify(
            r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"m","params":{"a":{"k":1.5e3},"b":{"k":[true,null,"\u00e9"]}}}"#,
        )
        .expect("valid");
        assert_eq!(m.id(), Some(&json!(18446744073709551615u64)));
        assert_eq!(
            m.params().map(|p| Value::Object(p.clone())),
            Some(json!({"a":{"k":1.5e3},"b":{"k":[true,null,"é"]}}))
        );
        assert!(matches!(classify("{} x"), Err(ClassifyError::Parse(_))));
    }

    #[test]
    fn nesting_is_bounded_before_parsing() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(classify(&deep), Err(ClassifyError::TooDeep(32)));
        // Brackets inside strings do not count.
        let quoted = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"s":"{}"}}}}"#,
            "[".repeat(1000)
        );
        assert!(classify(&quoted).is_ok());
    }

    /// A JSON value of the shapes a client message can take: objects with
    /// `jsonrpc`, `id`, `method`, `params`, `result` keys (right and wrong
    /// types), and any scalar or array instead.
    fn message_like() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let scalar = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-z/]{0,12}".prop_map(Value::from),
        ];
        let member = prop_oneof![
            scalar.clone(),
            proptest::collection::vec(scalar.clone(), 0..3).prop_map(Value::from),
            proptest::collection::btree_map("[a-z]{1,6}", scalar.clone(), 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ];
        let key = prop_oneof![
            Just("jsonrpc".to_owned()),
            Just("id".to_owned()),
            Just("method".to_owned()),
            Just("params".to_owned()),
            Just("result".to_owned()),
            Just("error".to_owned()),
            "[a-z]{1,6}",
        ];
        let object = proptest::collection::btree_map(key, member, 0..6).prop_map(|m| {
            let mut o: Map<String, Value> = m.into_iter().collect();
            o.entry("jsonrpc").or_insert_with(|| "2.0".into());
            Value::Object(o)
        });
        prop_oneof![4 => object, 1 => scalar]
    }

    proptest::proptest! {
        /// The merged view hands a renamed message to the per-server
        /// pipeline without reading its bytes again: what `from_value` makes
        /// of a value is what `classify` makes of its text, accepted or not.
        #[test]
        fn from_value_reads_a_value_as_classify_reads_its_text(value in message_like()) {
            let text = serde_json::to_vec(&value).expect("serializes");
            let from_text = Message::classify(&text, 32);
            let from_value = Message::from_value(value);
            proptest::prop_assert_eq!(from_value.is_ok(), from_text.is_ok());
            if let (Ok(a), Ok(b)) = (from_value, from_text) {
                proptest::prop_assert_eq!(a, b);
            }
        }
    }

    /// The arguments of a call as the gateway parses them and as it forwards
    /// them (`util::canonical`): every edge of JSON's text either is refused
    /// whole or has one reading, which the forwarded bytes carry.
    #[test]
    fn json_edges_have_one_reading_or_are_refused() {
        let call = |args: &str| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{args}}}}}"#
            );
            Message::classify(body.as_bytes(), 32).map(|m| {
                let args = m.params().and_then(|p| p.get("arguments")).cloned();
                String::from_utf8(crate::util::canonical::to_vec(&args.unwrap_or_default()))
                    .expect("canonical bytes are UTF-8")
            })
        };
        for (sent, forwarded) in [
            (r#"{"n":-0}"#, r#"{"n":-0.0}"#),
            (r#"{"n":1}"#, r#"{"n":1}"#),
            (r#"{"n":1.0}"#, r#"{"n":1.0}"#),
            (r#"{"n":1E2}"#, r#"{"n":100.0}"#),
            (
                r#"{"n":18446744073709551615}"#,
                r#"{"n":18446744073709551615}"#,
            ),
            (
                r#"{"n":18446744073709551616}"#,
                r#"{"n":1.8446744073709552e+19}"#,
            ),
            (r#"{"\u0061":1,"b":"\u0000"}"#, r#"{"a":1,"b":"\u0000"}"#),
            (r#"{"s":"\ud83d\ude00"}"#, "{\"s\":\"\u{1F600}\"}"),
        ] {
            assert_eq!(call(sent).ok().as_deref(), Some(forwarded), "{sent}");
        }
        for refused in [
            r#"{"n":1e400}"#,
            r#"{"a":1,"\u0061":2}"#,
            r#"{"o":{"k":1,"k":2}}"#,
            r#"{"l":[{"k":1,"k":2}]}"#,
            r#"{"s":"\ud800"}"#,
            r#"{"s":"\udc00\ud800"}"#,
        ] {
            assert!(call(refused).is_err(), "{refused}");
        }
        // Bytes that are not UTF-8 (an overlong `/`), and a leading byte order mark.
        let overlong = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"t\",\"arguments\":{\"p\":\"\xC0\xAF\"}}}";
        assert!(Message::classify(overlong, 32).is_err());
        let bom = "\u{FEFF}{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}";
        assert!(Message::classify(bom.as_bytes(), 32).is_err());
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<String>().prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(any::<String>(), inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// What the server parses from the forwarded bytes is what the
        /// gateway decided on: the canonical bytes of any arguments, sent
        /// through the gateway's own parser again, give the same bytes.
        #[test]
        fn forwarded_arguments_parse_back_to_what_was_decided(args in json_value()) {
            let mut object = serde_json::Map::new();
            object.insert("v".into(), args);
            let args = Value::Object(object);
            let forwarded = crate::util::canonical::to_vec(&args);
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{}}}}}"#,
                String::from_utf8(forwarded.clone()).expect("UTF-8")
            );
            let parsed = Message::classify(body.as_bytes(), 32).expect("the forwarded call parses");
            let again = parsed.params().and_then(|p| p.get("arguments")).cloned().unwrap_or_default();
            proptest::prop_assert_eq!(crate::util::canonical::to_vec(&again), forwarded);
        }
    }
}
