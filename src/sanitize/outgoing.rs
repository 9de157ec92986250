//! The outgoing secret scan: what a client sends towards an upstream, searched
//! for credentials before it leaves.
//!
//! Place in the path: on the way in, after the message is classified and
//! before any method-specific step (`sanitize.arguments = "block"`). The walk
//! knows no field: every string value and every object key of the message
//! (params of any method, `_meta`, prompt arguments, resource URIs, completion
//! values, a response to a server's request, …) is searched, after terminal
//! controls and invisible characters are taken out (so a secret split by a
//! zero-width space is still one), and a string assigned to a key that names a
//! secret (`password = …`) counts as one.
//!
//! Invariants: the findings name where (a JSON pointer) and what kind, never
//! the value; a pointer segment that is itself a secret-bearing key is shown
//! as its placeholder, so the answer never repeats the secret.

use serde_json::{Map, Value};

use super::SecretsAction;
use super::exempt;
use super::{Report, Sanitizer, secrets, strip};

impl Sanitizer<'_> {
    /// Every secret in `value`, by JSON pointer from `root` and kind; the
    /// members whose pointer is in `skip` (e.g. `/params/arguments`, scanned
    /// apart) are left out.
    pub(crate) fn find_outgoing(
        &self,
        value: &Value,
        root: &str,
        skip: &[&str],
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut pointer = root.to_owned();
        self.outgoing_in(value, &mut pointer, skip, &mut out);
        out
    }

    /// [`Sanitizer::find_outgoing`] of an object's members.
    pub(crate) fn find_outgoing_members(
        &self,
        map: &Map<String, Value>,
        root: &str,
        skip: &[&str],
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut pointer = root.to_owned();
        self.members(map, &mut pointer, skip, &mut out);
        out
    }

    fn outgoing_in(
        &self,
        value: &Value,
        pointer: &mut String,
        skip: &[&str],
        out: &mut Vec<(String, String)>,
    ) {
        if skip.contains(&pointer.as_str()) {
            return;
        }
        match value {
            Value::String(s) => {
                for kind in self.kinds_in(s) {
                    out.push((pointer.clone(), kind));
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let len = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&i.to_string());
                    self.outgoing_in(item, pointer, skip, out);
                    pointer.truncate(len);
                }
            }
            Value::Object(map) => self.members(map, pointer, skip, out),
            _ => {}
        }
    }

    fn members(
        &self,
        map: &Map<String, Value>,
        pointer: &mut String,
        skip: &[&str],
        out: &mut Vec<(String, String)>,
    ) {
        for (k, v) in map {
            let len = pointer.len();
            pointer.push('/');
            let in_key = self.kinds_in(k);
            match in_key.first() {
                // The key is never repeated: its placeholder stands in the pointer.
                Some(kind) => pointer.push_str(&secrets::placeholder_for(kind)),
                None => push_escaped(pointer, k),
            }
            for kind in in_key {
                out.push((pointer.clone(), kind));
            }
            // A key that names a spec identifier (`progressToken`, `cursor`,
            // `requestState`, …) holds an opaque token the client chose, not an
            // assignment: the `…token = value` reading would refuse every random
            // one. Its value is still searched for known secret formats below.
            let identifier = exempt::identifier_key(k);
            match v {
                Value::String(s)
                    if self.settings.secrets != SecretsAction::Off
                        && !identifier
                        && secrets::assigned(k, s) =>
                {
                    out.push((pointer.clone(), secrets::GENERIC.to_owned()));
                }
                _ => self.outgoing_in(v, pointer, skip, out),
            }
            pointer.truncate(len);
        }
    }

    /// The kinds of secret in one string, searched as a model would read it.
    fn kinds_in(&self, s: &str) -> Vec<String> {
        let text = strip(s, true, true, &mut Report::default());
        let text = text.as_deref().unwrap_or(s);
        secrets::find(
            text,
            self.settings.secrets != SecretsAction::Off,
            self.patterns(),
        )
        .into_iter()
        .map(|f| f.kind.into_owned())
        .collect()
    }
}

/// `key` as a JSON pointer segment (RFC 6901: `~` as `~0`, `/` as `~1`),
/// written in place.
fn push_escaped(pointer: &mut String, key: &str) {
    if !key.contains(['~', '/']) {
        return pointer.push_str(key);
    }
    for c in key.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::sanitize::SanitizeSettings;
    use crate::sanitize::{Sanitizer, Skip};

    const KEY: &str = "AKIAZ7QWERTYUIOPCANA";

    fn found(value: serde_json::Value, skip: &[&str]) -> Vec<String> {
        let settings = SanitizeSettings::default();
        Sanitizer::new(&settings, Skip::default())
            .find_outgoing(&value, "", skip)
            .into_iter()
            .map(|(p, _)| p)
            .collect()
    }

    #[test]
    fn every_string_and_key_is_searched_and_keys_are_never_repeated() {
        let message = json!({
            "params": {
                "_meta": {"trace": KEY},
                "arguments": {"a": KEY},
                "ref": {"uri": format!("file:///{KEY}")},
                "argument": {"name": "x", "value": format!("v {KEY}")},
                "list": [1, {"deep": [format!("\u{200b}{}", KEY)]}],
                KEY: "plain",
                "password": "hunter2-canary",
            }
        });
        let pointers = found(message, &["/params/arguments"]);
        assert!(pointers.contains(&"/params/_meta/trace".to_owned()));
        assert!(pointers.contains(&"/params/ref/uri".to_owned()));
        assert!(pointers.contains(&"/params/argument/value".to_owned()));
        assert!(pointers.contains(&"/params/list/1/deep/0".to_owned()));
        assert!(pointers.contains(&"/params/password".to_owned()));
        assert!(!pointers.iter().any(|p| p.starts_with("/params/arguments")));
        assert!(pointers.iter().any(|p| p.starts_with("/params/[REDACTED:")));
        assert!(!pointers.iter().any(|p| p.contains(KEY)), "{pointers:?}");
    }

    #[test]
    fn an_identifier_key_is_not_an_assignment_but_its_value_is_still_searched() {
        let settings = SanitizeSettings::default();
        let s = Sanitizer::new(&settings, Skip::default());
        // The conformance suite's progress tokens are random: not a `token = …` secret.
        let random = json!({"_meta": {"progressToken": "Zq8xT2vLk9Pw3RmN7yB4"}});
        assert!(s.find_outgoing(&random, "", &[]).is_empty());
        let stashed = json!({"_meta": {"progressToken": KEY}});
        assert_eq!(s.find_outgoing(&stashed, "", &[]).len(), 1);
        // Under any other key the same random value reads as an assigned secret.
        let assigned = json!({"api_token": "Zq8xT2vLk9Pw3RmN7yB4"});
        assert!(!s.find_outgoing(&assigned, "", &[]).is_empty());
    }

    #[test]
    fn clean_messages_have_no_findings() {
        let message = json!({"params": {"name": "echo", "arguments": {"text": "hi"},
            "_meta": {"progressToken": 7}, "cursor": "abc"}});
        assert!(found(message, &[]).is_empty());
    }

    /// Any JSON value, with the canary planted at one string or key position.
    fn planted() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[a-z ]{0,12}".prop_map(serde_json::Value::from),
        ];
        let tree = leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        (tree, any::<u64>(), any::<bool>()).prop_map(|(mut v, pick, as_key)| {
            plant(&mut v, pick, as_key);
            v
        })
    }

    /// Puts the canary in the `pick`-th container (wrapping the root when there is none).
    fn plant(v: &mut serde_json::Value, pick: u64, as_key: bool) {
        let mut containers = Vec::new();
        collect(v, &mut String::new(), &mut containers);
        let target = if containers.is_empty() {
            *v = json!({"wrapped": v.take()});
            String::new()
        } else {
            containers[(pick % containers.len() as u64) as usize].clone()
        };
        let spot = v.pointer_mut(&target).expect("a container");
        match spot {
            serde_json::Value::Object(m) if as_key => {
                m.insert(format!("k-{KEY}"), json!(1));
            }
            serde_json::Value::Object(m) => {
                m.insert("planted".into(), json!(format!("see {KEY}")));
            }
            serde_json::Value::Array(a) => a.push(json!(format!("see {KEY}"))),
            _ => {}
        }
    }

    fn collect(v: &serde_json::Value, at: &mut String, out: &mut Vec<String>) {
        let len = at.len();
        match v {
            serde_json::Value::Object(m) => {
                out.push(at.clone());
                for (k, child) in m {
                    at.push('/');
                    at.push_str(k);
                    collect(child, at, out);
                    at.truncate(len);
                }
            }
            serde_json::Value::Array(a) => {
                out.push(at.clone());
                for (i, child) in a.iter().enumerate() {
                    at.push_str(&format!("/{i}"));
                    collect(child, at, out);
                    at.truncate(len);
                }
            }
            _ => {}
        }
    }

    proptest::proptest! {
        /// Wherever the secret sits, value or key, at any depth, it is found,
        /// and no finding repeats it.
        #[test]
        fn a_planted_secret_is_found_wherever_it_is(v in planted()) {
            let settings = SanitizeSettings::default();
            let found = Sanitizer::new(&settings, Skip::default()).find_outgoing(&v, "", &[]);
            proptest::prop_assert!(!found.is_empty(), "not found in {}", v);
            proptest::prop_assert!(found.iter().all(|(p, _)| !p.contains(KEY)), "{:?}", found);
        }
    }
}
