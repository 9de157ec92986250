//! Length caps on every identifier a client sends.
//!
//! Place in the path: right after a POST body is classified (before
//! negotiation, policy, suggestions or forwarding), so nothing downstream ever
//! sees an identifier longer than its cap; and at the points where identifiers
//! are kept (the audit event, the dashboard ring, logs, spans),
//! [`crate::util::text::clip`] bounds them once more whatever path they came by.
//!
//! Invariants: the caps are checked by position, not by method — `params.name`
//! is bounded in every method that has one, so a method added to the protocol
//! tomorrow is bounded too; a refusal names the field and its cap, never the
//! value.

use serde_json::Value;

use super::jsonrpc::Message;

/// Longest method name accepted (the longest the spec defines is under 50).
pub(crate) const MAX_METHOD: usize = 128;
/// Longest tool, prompt or argument name (the spec advises tool names of 1–128 characters).
pub(crate) const MAX_NAME: usize = 256;
/// Longest resource URI or URI template.
pub(crate) const MAX_URI: usize = 4096;
/// Longest request id, progress token, task id or cancelled request id (as a string).
pub(crate) const MAX_ID: usize = 256;
/// Longest pagination cursor.
pub(crate) const MAX_CURSOR: usize = 4096;

/// An identifier longer than its cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Overlong {
    /// Where it was, such as `params.name`.
    pub field: &'static str,
    /// Its cap, in bytes.
    pub limit: usize,
    /// Its length, in bytes.
    pub length: usize,
}

/// Identifier fields under `params`, by path: every method's.
const PARAMS: &[(&[&str], &str, usize)] = &[
    (&["name"], "params.name", MAX_NAME),
    (&["uri"], "params.uri", MAX_URI),
    (&["uriTemplate"], "params.uriTemplate", MAX_URI),
    (&["ref", "name"], "params.ref.name", MAX_NAME),
    (&["ref", "uri"], "params.ref.uri", MAX_URI),
    (&["argument", "name"], "params.argument.name", MAX_NAME),
    (&["cursor"], "params.cursor", MAX_CURSOR),
    (&["progressToken"], "params.progressToken", MAX_ID),
    (
        &["_meta", "progressToken"],
        "params._meta.progressToken",
        MAX_ID,
    ),
    (&["requestId"], "params.requestId", MAX_ID),
    (&["taskId"], "params.taskId", MAX_ID),
    (&["task", "taskId"], "params.task.taskId", MAX_ID),
];

/// Lists of identifiers under `params`, by path: each item is capped.
const LISTS: &[(&[&str], &str, usize)] = &[(
    &["notifications", "resourceSubscriptions"],
    "params.notifications.resourceSubscriptions[]",
    MAX_URI,
)];

/// Checks the method, the id and every identifier field of `message`.
pub(crate) fn check(message: &Message) -> Result<(), Overlong> {
    if let Some(method) = message.method() {
        within(method.len(), "method", MAX_METHOD)?;
    }
    if let Some(id) = message.id() {
        within(id_len(id), "id", MAX_ID)?;
    }
    let Some(params) = message.params() else {
        return Ok(());
    };
    for (path, field, limit) in PARAMS {
        let mut at = params.get(path[0]);
        for key in &path[1..] {
            at = at.and_then(|v| v.get(key));
        }
        if let Some(value) = at {
            within(id_len(value), field, *limit)?;
        }
    }
    // Lists of identifiers: each item under its field's cap.
    for (path, field, limit) in LISTS {
        let mut at = params.get(path[0]);
        for key in &path[1..] {
            at = at.and_then(|v| v.get(key));
        }
        for item in at.and_then(Value::as_array).into_iter().flatten() {
            within(id_len(item), field, *limit)?;
        }
    }
    Ok(())
}

/// Whether a JSON-RPC id may be echoed in an answer.
pub(crate) fn id_fits(id: &Value) -> bool {
    id_len(id) <= MAX_ID
}

fn within(length: usize, field: &'static str, limit: usize) -> Result<(), Overlong> {
    if length > limit {
        return Err(Overlong {
            field,
            limit,
            length,
        });
    }
    Ok(())
}

/// The length an identifier takes: a string's bytes, any other value's JSON text
/// (a number is short; an object where an identifier belongs is measured whole).
fn id_len(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::Number(_) | Value::Bool(_) | Value::Null => value.to_string().len(),
        other => serde_json::to_string(other).map_or(usize::MAX, |t| t.len()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(v: Value) -> Message {
        Message::classify(v.to_string().as_bytes(), 64).expect("message")
    }

    #[test]
    fn every_field_is_bounded_whatever_the_method() {
        let long = "x".repeat(MAX_URI + 1);
        for (path, field, _) in PARAMS {
            let mut params = json!(long);
            for key in path.iter().rev() {
                params = json!({ *key: params });
            }
            let m = message(json!({"jsonrpc":"2.0","id":1,"method":"any/method","params":params}));
            assert_eq!(check(&m).map_err(|e| e.field), Err(*field));
        }
        let m = message(json!({"jsonrpc":"2.0","id":"i".repeat(MAX_ID + 1),"method":"tools/list"}));
        assert_eq!(check(&m).map_err(|e| e.field), Err("id"));
        let m = message(json!({"jsonrpc":"2.0","method":"m".repeat(MAX_METHOD + 1)}));
        assert_eq!(check(&m).map_err(|e| e.field), Err("method"));
        let m = message(json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
            "params":{"name":"echo","_meta":{"progressToken":{"deep":"x".repeat(MAX_ID)}}}}));
        assert_eq!(
            check(&m).map_err(|e| e.field),
            Err("params._meta.progressToken")
        );
        let ok = message(json!({"jsonrpc":"2.0","id":7,"method":"tools/call",
            "params":{"name":"n".repeat(MAX_NAME),"_meta":{"progressToken":3}}}));
        assert_eq!(check(&ok), Ok(()));
    }

    /// A `subscriptions/listen` names its URIs in a list: each is held to
    /// the cap of `params.uri`, as a read of it would be.
    #[test]
    fn each_uri_a_listen_subscribes_to_is_bounded() {
        let listen = |uris: Vec<String>| {
            message(
                json!({"jsonrpc":"2.0","id":1,"method":"subscriptions/listen",
                "params":{"notifications":{"resourceSubscriptions": uris}}}),
            )
        };
        let fits = format!("logs://api?{}", "a".repeat(MAX_URI - 11));
        assert_eq!(check(&listen(vec![fits.clone(), fits.clone()])), Ok(()));
        let long = format!("{fits}a");
        assert_eq!(
            check(&listen(vec![fits, long])).map_err(|e| (e.field, e.limit)),
            Err(("params.notifications.resourceSubscriptions[]", MAX_URI))
        );
    }
}
