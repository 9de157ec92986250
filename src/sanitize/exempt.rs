//! The one table of strings the sanitizer leaves alone: the identifiers the
//! MCP specification defines, each checked for its form instead.
//!
//! Place in the path: consulted by the message walk ([`super::message`]) for
//! every string value it meets, by the key the value sits under (and, for a
//! few keys, the `type` of the object around it or its depth). Everything not
//! in [`EXEMPT`] is text and is sanitized; object keys are never exempt.
//!
//! Why each entry is here: an identifier is something the client sends back
//! verbatim (an id, a cursor, a `requestState`, a task id), uses to address
//! something (a URI, a tool or prompt name), or decodes (a base64 blob).
//! Changing one breaks the protocol, and the secret detectors misread some of
//! them (`progressToken` is a `…token` key, so its value would be taken for an
//! assigned secret). In exchange the value must have its identifier's form,
//! which leaves no room for what the sanitizer removes: no control or
//! invisible character, no whitespace, a bounded length.
//!
//! Invariants: a value that fails its form check is either an upstream
//! protocol error ([`OnBad::Refuse`]: the identifier cannot be changed without
//! breaking the exchange, so the message is refused) or simply sanitized as
//! text ([`OnBad::Sanitize`]: a display-like value such as a resource `name`
//! with spaces; cleaning it is safe, at worst the item becomes unusable);
//! checks never allocate.

use serde_json::{Map, Value};

use super::unicode;

/// What an exempt value must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// Exactly `"2.0"`.
    JsonRpc,
    /// A JSON-RPC id, progress token, task id: 1–256 bytes of visible
    /// characters and spaces (clients choose ids and tokens too, and the spec
    /// allows any string), no control or invisible character.
    Id,
    /// A method name: 1–128 of `A-Z a-z 0-9 _ . / - $`.
    Method,
    /// An opaque token the client echoes (cursor, `requestState`): 1–64 KiB of
    /// visible ASCII.
    Opaque,
    /// A URI or URI template: 1–8 KiB, no control, whitespace or invisible
    /// character, no credential.
    Uri,
    /// A tool, prompt or argument name: 1–128 of the spec's tool-name
    /// characters (`A-Z a-z 0-9 _ . -`, plus `/` and `:` that servers use as
    /// separators), and no credential.
    Name,
    /// A MIME type: 1–255 printable ASCII characters (parameters have spaces).
    MimeType,
    /// Standard base64 (RFC 4648 §4, padded or not), possibly empty.
    Base64,
    /// A `resultType`: `complete`, `input_required`, `task`.
    ResultType,
    /// A `type` discriminator: 1–64 of `A-Z a-z 0-9 _ . / -`.
    Discriminator,
    /// A protocol version: `YYYY-MM-DD`.
    Version,
}

/// What a value that fails its form check becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnBad {
    /// The message is an upstream protocol error.
    Refuse,
    /// The value is sanitized like any text.
    Sanitize,
}

/// Where in a message the entry applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Where {
    /// Under this key in any object.
    Anywhere,
    /// Only in the top-level JSON-RPC object.
    Envelope,
    /// Only in an object whose `type` is one of these (a content block).
    Block(&'static [&'static str]),
}

/// One exempt identifier.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exempt {
    pub key: &'static str,
    pub at: Where,
    pub form: Form,
    pub on_bad: OnBad,
}

const fn entry(key: &'static str, at: Where, form: Form, on_bad: OnBad) -> Exempt {
    Exempt {
        key,
        at,
        form,
        on_bad,
    }
}

use Form::*;
use OnBad::*;
use Where::*;

/// Every string the sanitizer does not treat as text. `_meta` keys of the
/// `io.modelcontextprotocol/` namespace are not exempt as keys: a clean key is
/// left as it is anyway, and a hostile server could put an escape in one; only
/// the one whose value is an identifier (`subscriptionId`) is listed, and
/// values such as `serverInfo` are sanitized like any other.
pub(crate) const EXEMPT: &[Exempt] = &[
    // JSON-RPC envelope.
    entry("jsonrpc", Anywhere, JsonRpc, Refuse),
    entry("id", Envelope, Id, Refuse),
    entry("method", Anywhere, Method, Refuse),
    // notifications/cancelled.
    entry("requestId", Anywhere, Id, Refuse),
    // Pagination: the client echoes it.
    entry("nextCursor", Anywhere, Opaque, Refuse),
    entry("cursor", Anywhere, Opaque, Refuse),
    // Resources: what is read, subscribed, linked.
    entry("uri", Anywhere, Uri, Refuse),
    entry("uriTemplate", Anywhere, Uri, Refuse),
    // Tools, prompts, arguments; a display name with spaces is just text.
    entry("name", Anywhere, Name, Sanitize),
    entry("mimeType", Anywhere, MimeType, Sanitize),
    // Progress and tasks: the client matches them.
    entry("progressToken", Anywhere, Id, Refuse),
    entry("taskId", Anywhere, Id, Refuse),
    entry(
        "io.modelcontextprotocol/subscriptionId",
        Anywhere,
        Id,
        Refuse,
    ),
    // Sampling tool use (2025-11-25): the ids that pair a use with its result.
    entry("id", Block(&["tool_use"]), Id, Refuse),
    entry("toolUseId", Anywhere, Id, Refuse),
    // URL elicitation (2025-11-25).
    entry("elicitationId", Anywhere, Id, Refuse),
    // Binary payloads: decoded by the client, never read as text.
    entry("blob", Anywhere, Base64, Refuse),
    entry("data", Block(&["image", "audio"]), Base64, Refuse),
    // Multi-round-trip requests (2026-07-28): echoed to the server exactly.
    entry("requestState", Anywhere, Opaque, Refuse),
    entry("resultType", Anywhere, ResultType, Refuse),
    entry("type", Anywhere, Discriminator, Sanitize),
    entry("protocolVersion", Anywhere, Version, Refuse),
];

/// The `type` values [`Where::Block`] entries name, so that an object's type
/// can be looked up once without allocating.
const BLOCK_TYPES: &[&str] = &["tool_use", "image", "audio"];

/// The `type` of `map` when an entry depends on it.
pub(crate) fn block_type(map: &Map<String, Value>) -> Option<&'static str> {
    let t = map.get("type")?.as_str()?;
    BLOCK_TYPES.iter().find(|b| **b == t).copied()
}

/// The entry for a string under `key`, in an object of block type `ty`, at the
/// top of the message when `envelope`.
pub(crate) fn lookup(key: &str, ty: Option<&str>, envelope: bool) -> Option<&'static Exempt> {
    EXEMPT.iter().find(|e| {
        e.key == key
            && match e.at {
                Anywhere => true,
                Envelope => envelope,
                Block(types) => ty.is_some_and(|t| types.contains(&t)),
            }
    })
}

/// True when `value` has the form.
pub(crate) fn fits(form: Form, value: &str) -> bool {
    let len = value.len();
    match form {
        JsonRpc => value == "2.0",
        Id => (1..=256).contains(&len) && value.chars().all(|c| c == ' ' || uri_char(c)),
        Method => {
            (1..=128).contains(&len)
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_./-$".contains(&b))
        }
        Opaque => (1..=64 * 1024).contains(&len) && value.bytes().all(|b| b.is_ascii_graphic()),
        Uri => (1..=8 * 1024).contains(&len) && value.chars().all(uri_char),
        Name => {
            (1..=128).contains(&len)
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-/:".contains(&b))
        }
        MimeType => (1..=255).contains(&len) && value.bytes().all(|b| (0x20..0x7f).contains(&b)),
        Base64 => base64(value),
        ResultType => matches!(value, "complete" | "input_required" | "task"),
        Discriminator => {
            (1..=64).contains(&len)
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_./-".contains(&b))
        }
        Version => {
            let b = value.as_bytes();
            len == 10
                && b.iter().enumerate().all(|(i, c)| {
                    if i == 4 || i == 7 {
                        *c == b'-'
                    } else {
                        c.is_ascii_digit()
                    }
                })
        }
    }
}

/// True when the form must also be free of credentials (what the model reads
/// and what addresses something: names and URIs; opaque tokens are for the
/// client's code, and the detectors would misread random ones).
pub(crate) fn scanned_for_secrets(form: Form) -> bool {
    matches!(form, Uri | Name)
}

/// A character a URI may carry: visible ASCII, or a visible non-ASCII
/// character (IRIs), never a control, whitespace or invisible one.
fn uri_char(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_graphic();
    }
    !c.is_whitespace()
        && !('\u{80}'..='\u{9f}').contains(&c)
        && !unicode::needs_judging(c)
        && c != '\u{feff}'
}

/// Standard base64: the alphabet, at most two `=` at the end, a length that
/// padding makes a multiple of four.
fn base64(value: &str) -> bool {
    let bytes = value.as_bytes();
    let body = bytes
        .iter()
        .rposition(|b| *b != b'=')
        .map_or(0, |last| last + 1);
    let padding = bytes.len() - body;
    if padding > 2 || (padding > 0 && !bytes.len().is_multiple_of(4)) || body % 4 == 1 {
        return false;
    }
    bytes[..body]
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_accept_what_sdks_send_and_nothing_hidden() {
        assert!(fits(Base64, "iVBORw0KGgo="));
        assert!(fits(Base64, ""));
        assert!(!fits(Base64, "iVBOR\u{1b}[31m"));
        assert!(!fits(Base64, "abc=="));
        assert!(fits(Uri, "users://alice/profile"));
        assert!(fits(Uri, "file:///données/é.txt"));
        assert!(!fits(Uri, "res://a b"));
        assert!(!fits(Uri, "res://ad\u{200b}min"));
        assert!(!fits(Uri, "res://a\u{202e}b"));
        assert!(fits(Name, "get_weather"));
        assert!(!fits(Name, "get weather"));
        assert!(fits(MimeType, "text/plain; charset=utf-8"));
        assert!(fits(Version, "2026-07-28"));
        assert!(!fits(Version, "2026-07-28\u{1b}"));
        assert!(fits(Id, "abc-1"));
        assert!(fits(Id, "req 1 é"));
        assert!(!fits(Id, "req\u{1b}[2J"));
        assert!(!fits(Id, "re\u{202e}q"));
        assert!(!fits(Id, ""));
        assert!(fits(ResultType, "input_required"));
        assert!(!fits(ResultType, "later"));
    }

    #[test]
    fn every_key_is_listed_once_per_place() {
        for (i, a) in EXEMPT.iter().enumerate() {
            for b in &EXEMPT[i + 1..] {
                assert!(a.key != b.key || a.at != b.at, "{} twice", a.key);
            }
        }
    }
}
