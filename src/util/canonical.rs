//! The one serialisation of a JSON value the gateway forwards and digests.
//!
//! Place: the bottom layer. The pipeline forwards every `tools/call` as
//! [`to_vec`] of the parsed request, and an approval binds [`digest`] of the
//! arguments: the bytes whose digest a person was shown are the bytes the
//! server receives.
//!
//! Invariants: compact (no whitespace); object members in the byte order of
//! their keys, at every depth, so two spellings of one object serialise
//! alike; strings and numbers exactly as serde_json writes the parsed value
//! (numbers as parsed: an integer keeps its digits, a float its shortest
//! round-trip form); a value nested in another serialises to the same bytes
//! as the value alone, so the arguments inside a forwarded body are
//! byte-for-byte [`to_vec`] of the arguments.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The canonical bytes of `value`.
pub fn to_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write(value, &mut out);
    out
}

/// SHA-256 of [`to_vec`].
pub fn digest(value: &Value) -> [u8; 32] {
    Sha256::digest(to_vec(value)).into()
}

/// [`to_vec`] of `value` with `member` added to the object that `path` (a
/// chain of object keys from the top) names, written without a copy of
/// `member` in the value first: the arguments of a forwarded call can be
/// large. `None` when `path` does not lead through objects to one that
/// does not hold `member`'s key yet.
pub fn to_vec_with(value: &Value, path: &[&str], member: (&str, &Value)) -> Option<Vec<u8>> {
    // Checked whole before anything is written.
    let mut at = value;
    for key in path {
        at = at.as_object()?.get(*key)?;
    }
    if at.as_object()?.contains_key(member.0) {
        return None;
    }
    let mut out = Vec::with_capacity(64);
    write_with(value, path, member, &mut out);
    Some(out)
}

/// [`write`] of `value`, `member` added at `path` (checked by [`to_vec_with`]).
fn write_with(value: &Value, path: &[&str], member: (&str, &Value), out: &mut Vec<u8>) {
    let Value::Object(members) = value else {
        return write(value, out);
    };
    let mut sorted: Vec<(&str, &Value)> = members.iter().map(|(k, v)| (k.as_str(), v)).collect();
    if path.is_empty() {
        sorted.push(member);
    }
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out.push(b'{');
    for (i, (key, item)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(key, out);
        out.push(b':');
        match path.split_first() {
            Some((next, rest)) if *next == key => write_with(item, rest, member, out),
            _ => write(item, out),
        }
    }
    out.push(b'}');
}

fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (key, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(key, out);
                out.push(b':');
                write(item, out);
            }
            out.push(b'}');
        }
        other => scalar(other, out),
    }
}

fn scalar(value: &Value, out: &mut Vec<u8>) {
    if let Value::String(text) = value {
        return string(text, out);
    }
    // Writing a number, bool or null into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// A string as serde_json writes it. serde_json escapes `"`, backslash and the
/// controls below U+0020, nothing else; a string with none of them (most
/// text, and every long prose argument) is copied whole between its quotes
/// after one branch-free pass, instead of a table lookup per byte.
fn string(text: &str, out: &mut Vec<u8>) {
    let needs_escape = text.as_bytes().chunks(64).any(|chunk| {
        chunk.iter().fold(false, |acc, &b| {
            acc | (b < 0x20) | (b == b'"') | (b == b'\\')
        })
    });
    if needs_escape {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
    } else {
        out.reserve(text.len() + 2);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_whitespace_do_not_matter_any_value_does() {
        let a: Value =
            serde_json::from_str(r#"{ "b" : [1, 2.5, "x"], "a": {"d": null, "c": true} }"#)
                .expect("json");
        assert_eq!(
            to_vec(&a),
            br#"{"a":{"c":true,"d":null},"b":[1,2.5,"x"]}"#.to_vec()
        );
        let big: Value = serde_json::from_str(r#"{"n":9007199254740993}"#).expect("json");
        assert_eq!(to_vec(&big), br#"{"n":9007199254740993}"#.to_vec());
        assert_ne!(digest(&json!({"n": 1})), digest(&json!({"n": 1.0})));
        assert_ne!(digest(&json!({"t": "\u{1b}"})), digest(&json!({"t": ""})));
    }

    proptest::proptest! {
        /// A string is written exactly as serde_json writes it, whether it
        /// takes the copy (nothing to escape) or the escaping writer.
        #[test]
        fn a_string_is_written_as_serde_json_writes_it(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "a", "plain words ", "\"", "\\", "\u{0}", "\u{1f}", "\n", "\u{7f}", "é", "\u{2028}", "\u{1F600}",
            ]), 0..80),
            long in 0usize..200,
        ) {
            let text = format!("{}{}", "x".repeat(long), pieces.concat());
            let mut ours = Vec::new();
            string(&text, &mut ours);
            proptest::prop_assert_eq!(ours, serde_json::to_vec(&text).expect("a string serialises"));
        }
    }

    /// A JSON value small enough to generate many of, keys from a few
    /// letters so that paths and members meet.
    fn value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            "[a-c\"\\\\\u{1}é]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::vec(("[a-c]{1,2}", inner), 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// A member added while writing gives the bytes of the value with
        /// the member inserted, and the same refusals where it cannot go.
        #[test]
        fn a_member_added_while_writing_is_written_as_one_inserted(
            value in value(),
            path in proptest::collection::vec("[a-c]{1,2}", 0..3),
            key in "[a-c]{1,2}",
            member in value(),
        ) {
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            let mut inserted = value.clone();
            let mut at = Some(&mut inserted);
            for k in &path {
                at = at.and_then(|v| v.as_object_mut()).and_then(|o| o.get_mut(*k));
            }
            let expected = match at.and_then(|v| v.as_object_mut()) {
                Some(object) if !object.contains_key(&key) => {
                    object.insert(key.clone(), member.clone());
                    Some(to_vec(&inserted))
                }
                _ => None,
            };
            proptest::prop_assert_eq!(to_vec_with(&value, &path, (&key, &member)), expected);
        }
    }

    #[test]
    fn a_nested_value_serialises_as_it_does_alone() {
        let args = json!({"z": "\u{1b}]0;x\u{7}", "a": [{"y": 1, "b": 2}]});
        let whole = to_vec(&json!({"params": {"arguments": args.clone(), "name": "t"}}));
        let alone = to_vec(&args);
        assert!(
            whole.windows(alone.len()).any(|w| w == alone.as_slice()),
            "{}",
            String::from_utf8_lossy(&whole)
        );
    }
}
