//! What an approval is for: one client, one server and tool, one digest of
//! the arguments.
//!
//! Place in the path: computed by the approval gate once a call has passed
//! every other check (rules, rate limits, validation), from the arguments
//! exactly as they will be forwarded.
//!
//! Invariants: the digest is SHA-256 of exactly the argument bytes the
//! gateway forwards ([`crate::util::canonical`]: compact, members in key
//! order, numbers as parsed), so two spellings of the same JSON object have
//! one digest, any other change has another (`1` and `1.0`, and integers
//! beyond 2^53, keep their own digits), and the digest a person is shown is
//! the digest of what the server receives; a binding matches only when all
//! four parts are equal.

use serde_json::Value;

/// SHA-256 of the canonical argument bytes.
pub type ArgumentDigest = [u8; 32];

/// The digest of a call's arguments: SHA-256 of the bytes forwarded.
pub fn digest(arguments: &Value) -> ArgumentDigest {
    crate::util::canonical::digest(arguments)
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
    fn key_order_and_whitespace_do_not_change_the_digest_any_value_does() {
        let a = digest(&json!({"path": "/tmp/x", "force": true, "n": 1}));
        let b = digest(&serde_json::from_str(r#"{"n":1, "force":true,"path":"/tmp/x"}"#).unwrap());
        assert_eq!(a, b);
        assert_ne!(a, digest(&json!({"path": "/", "force": true, "n": 1})));
        assert_ne!(a, digest(&json!({"path": "/tmp/x", "force": true})));
        assert_ne!(
            a,
            digest(&json!({"path": "/tmp/x", "force": true, "n": 1.0}))
        );
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
