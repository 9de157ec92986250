//! The output checks of one upstream message, and the words of a failure:
//! results sanitized, withheld, or cut to what a client accepts; upstream
//! errors and HTTP refusals read without showing their bodies.
//!
//! Place: beneath the recipient, the relay and the collector; these
//! functions see a message, never the connection it came on.
//!
//! Invariants: no message larger than [`MAX_CLIENT_MESSAGE`] reaches a
//! client; an upstream body that is not JSON-RPC is never shown, at most a
//! sanitized, capped snippet of its text.

use http::StatusCode;
use serde_json::Value;

use crate::error::{OutputKind, Rejection, ToolFailure, UpstreamKind};
use crate::sanitize::message::{Malformed, OverBound};
use crate::sanitize::{Report, Sanitizer, TRUNCATED};
use crate::transport::reply::UpstreamError;
use crate::validate::CompiledSchema;

/// The largest message the gateway sends a client. The official Python SDK
/// client refuses an SSE event over 1,048,576 bytes ("Server-sent event
/// exceeded the 1048576 byte limit") and then fails the whole session; the
/// TypeScript SDK client has no such limit. Room is kept for the SSE framing
/// (`event:`, `id:`, `data:` and the line ends around the JSON).
pub(crate) const MAX_CLIENT_MESSAGE: usize = 1_048_576 - 1024;

/// `_meta` key of the poisoning scan's flags on a tool result.
pub(crate) const META_POISONING: &str = "portcullis/poisoning";

/// What becomes of one upstream message on its way.
#[derive(Debug)]
pub(super) enum Verdict {
    /// Passed on byte for byte.
    Unchanged,
    /// Passed on as sanitized.
    Changed(Value),
    /// Not passed on: the answer to the request becomes this refusal; any
    /// other message is dropped.
    Refused(Rejection),
}

/// Why the output checks refused a message.
#[derive(Debug)]
pub(crate) enum Fault {
    /// Not a message the gateway can read: an upstream protocol error.
    Malformed(Malformed),
    /// A result the gateway withholds.
    Output(OutputKind),
}

/// The output checks of every result that can reach the model, whatever its
/// method or `resultType`: the whole message sanitized; with `secrets =
/// "block"`, withheld when a secret was found anywhere in it; `structuredContent`
/// checked against `schema` (the tool's `outputSchema`, when it has one); its
/// texts bounded by `max_output_bytes`; and no larger than
/// [`MAX_CLIENT_MESSAGE`] (a `structuredContent` is left out, with a notice,
/// before the result is refused as too large). `raw_len` is the size of the
/// message as the upstream sent it. The caller has already checked the shape
/// and handled `error` and `isError`. `answering` is the method of the
/// request it answers: it says where the protocol's identifiers are.
pub(crate) fn check_result(
    sanitizer: &Sanitizer<'_>,
    schema: Option<&CompiledSchema>,
    message: &mut Value,
    answering: Option<&str>,
    raw_len: usize,
    report: &mut Report,
) -> Result<(), Fault> {
    let before = schema.and_then(|_| message.pointer("/result/structuredContent").cloned());
    let mut local = Report::default();
    let texts = sanitizer
        .sanitize_message(message, answering, &mut local)
        .map_err(Fault::Malformed)?;
    report.merge(&local);
    let kinds = local.secret_kinds();
    if sanitizer.blocks_secrets() && !kinds.is_empty() {
        return Err(Fault::Output(OutputKind::Withheld(
            kinds.iter().map(|k| (*k).to_owned()).collect(),
        )));
    }
    if let (Some(schema), Some(structured)) = (schema, message.pointer("/result/structuredContent"))
        && let Err(mut violations) = schema.check(structured)
    {
        let sanitized = before.as_ref() != Some(structured);
        for v in &mut violations {
            if v.pointer.is_empty() {
                v.pointer = "(structuredContent)".into();
            }
            if let Some(d) = v.description.as_mut() {
                sanitizer.string(d, report);
                quoted(d);
            }
            sanitizer.string(&mut v.received, report);
            quoted(&mut v.received);
        }
        return Err(Fault::Output(OutputKind::SchemaViolation {
            violations,
            sanitized,
        }));
    }
    let too_large = |bytes| {
        Fault::Output(OutputKind::TooLarge {
            bytes,
            limit: MAX_CLIENT_MESSAGE,
        })
    };
    let replaced = sanitizer
        .bound(message, answering, texts, report)
        .map_err(over_bound)?;
    if replaced && schema.is_some() {
        // The client checks structuredContent against the schema: a notice in
        // its place would fail there.
        return Err(too_large(raw_len));
    }
    let changed = !report.is_empty();
    let mut size = if changed { json_len(message) } else { raw_len };
    if size > MAX_CLIENT_MESSAGE
        && let Some(structured) = message.pointer_mut("/result/structuredContent")
        && structured.get("portcullis/omitted").is_none()
    {
        if schema.is_some() {
            return Err(too_large(size));
        }
        *structured = serde_json::json!({"portcullis/omitted": format!(
            "[portcullis: structuredContent omitted here; it made the message larger than the {MAX_CLIENT_MESSAGE} bytes clients accept (limit {MAX_CLIENT_MESSAGE} bytes)]"
        )});
        report.add(TRUNCATED, 1);
        size = json_len(message);
    }
    if size > MAX_CLIENT_MESSAGE {
        return Err(too_large(size));
    }
    Ok(())
}

/// Any other message (a notification, a request of the server's own, an
/// error): sanitized whole, its texts bounded, no larger than
/// [`MAX_CLIENT_MESSAGE`].
pub(super) fn check_message(
    sanitizer: &Sanitizer<'_>,
    message: &mut Value,
    raw_len: usize,
    report: &mut Report,
) -> Result<(), Fault> {
    let texts = sanitizer
        .sanitize_message(message, None, report)
        .map_err(Fault::Malformed)?;
    sanitizer
        .bound(message, None, texts, report)
        .map_err(over_bound)?;
    let size = if report.is_empty() {
        raw_len
    } else {
        json_len(message)
    };
    if size > MAX_CLIENT_MESSAGE {
        return Err(Fault::Output(OutputKind::TooLarge {
            bytes: size,
            limit: MAX_CLIENT_MESSAGE,
        }));
    }
    Ok(())
}

/// A message the bound cannot cut down: withheld as too large.
fn over_bound(o: OverBound) -> Fault {
    Fault::Output(OutputKind::OverBound {
        bytes: o.bytes,
        limit: o.limit,
    })
}

/// A sanitized text quoted inside a gateway text: no byte order mark (the
/// sanitizer keeps one that starts a text; inside a sentence it is invisible).
fn quoted(text: &mut String) {
    let clean = crate::sanitize::unbom(text);
    if clean.len() != text.len() {
        *text = clean.to_owned();
    }
}

/// The length of `value` serialized, without building the text.
pub(super) fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The first field of a tool result whose JSON type breaks the MCP schema
/// (`isError` a boolean, `content` an array, `structuredContent` an object).
pub(super) fn misshapen_field(result: &serde_json::Map<String, Value>) -> Option<&'static str> {
    let wrong = |key: &str, ok: fn(&Value) -> bool| result.get(key).is_some_and(|v| !ok(v));
    if wrong("isError", Value::is_boolean) {
        Some("isError")
    } else if wrong("content", Value::is_array) {
        Some("content")
    } else if wrong("structuredContent", Value::is_object) {
        Some("structuredContent")
    } else {
        None
    }
}

/// An error object's words: its message, and its data when that is text.
pub(super) fn error_text(error: &Value) -> String {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match error.get("data") {
        Some(Value::String(d)) if !d.is_empty() => format!("{message}: {d}"),
        _ => message,
    }
}

/// A JSON-RPC error object as the spec shapes it: an integer `code` and a
/// string `message` (`data` optional). Only such an object is relayed.
fn is_rpc_error(error: &Value) -> bool {
    error.get("code").is_some_and(|c| c.is_i64())
        && error.get("message").is_some_and(Value::is_string)
}

/// The JSON-RPC error of a message that is an error response (no result, no method).
pub(super) fn rpc_error_of(message: &Value) -> Option<&Value> {
    (message.get("method").is_none() && message.get("result").is_none())
        .then(|| message.get("error"))
        .flatten()
        .filter(|e| is_rpc_error(e))
}

/// An upstream's answer with a 4xx `status`: the upstream refused the request,
/// which therefore did not run. 401, 403 and 407 concern the gateway's own
/// credentials (the client's never cross), so the server is unavailable to
/// the gateway; any other 4xx is the upstream's answer to the client, relayed
/// with its status and, when it sent one, its JSON-RPC `error`.
pub(crate) fn refusal(
    status: StatusCode,
    error: Option<&Value>,
    words: Option<String>,
) -> UpstreamError {
    let code = status.as_u16();
    let mut e = if matches!(code, 401 | 403 | 407) {
        UpstreamError::new(
            UpstreamKind::Unavailable,
            format!(
                "it refused the gateway's own credentials (HTTP {})",
                status_words(status)
            ),
        )
        .with_snippet(words)
    } else {
        let error = error.filter(|e| is_rpc_error(e)).cloned();
        let words = error.as_ref().map(error_text).or(words);
        let mut e = UpstreamError::new(
            UpstreamKind::Refused(code),
            format!("it refused the request with HTTP {}", status_words(status)),
        )
        .with_snippet(words);
        e.error = error.map(Box::new);
        e
    };
    e.not_run = true;
    e
}

/// An upstream's error object made fit to relay: sanitized like any upstream
/// message; `None` (so that the gateway's words replace it) when it carries a
/// secret and secrets are blocked.
pub(crate) fn relayed_error(
    sanitizer: &Sanitizer<'_>,
    mut error: Value,
    report: &mut Report,
) -> Option<Value> {
    if !error.is_object() {
        return None;
    }
    // Walked as the error message it is, so the one table of exempt fields applies.
    let mut wrapped = serde_json::json!({"jsonrpc": "2.0", "id": 0, "error": error.take()});
    let mut local = Report::default();
    sanitizer.message(&mut wrapped, None, &mut local).ok()?;
    report.merge(&local);
    let withheld = sanitizer.blocks_secrets() && !local.secret_kinds().is_empty();
    (!withheld).then(|| wrapped["error"].take())
}

/// The text blocks of a result, joined.
pub(super) fn content_text(result: &serde_json::Map<String, Value>) -> String {
    result
        .get("content")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Reads an upstream `isError` text: the Python SDK's bare "Error executing
/// tool X" is opaque; its "Error executing tool X: …" and FastMCP's "Error
/// calling tool 'X': …" lose their prefix; anything else (the TypeScript SDK
/// passes raw exception text) is quoted as it is.
pub(super) fn read_failure(text: &str, tool: &str) -> (ToolFailure, Option<String>) {
    let trimmed = text.trim();
    let python = format!("Error executing tool {tool}");
    if trimmed == python {
        return (ToolFailure::Opaque, None);
    }
    let prefixes = [
        format!("{python}: "),
        format!("Error calling tool '{tool}': "),
        format!("Error calling tool {tool}: "),
    ];
    let words = prefixes
        .iter()
        .find_map(|p| trimmed.strip_prefix(p.as_str()))
        .unwrap_or(trimmed);
    let words = (!words.is_empty()).then(|| words.to_owned());
    (ToolFailure::Message, words)
}

pub(super) fn is_response(message: &Value) -> bool {
    message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// `502 Bad Gateway`, or the bare number when it has no reason phrase.
pub(super) fn status_words(status: StatusCode) -> String {
    crate::error::status_words(status.as_u16())
}

/// The start of a body that is not what it should be, as text to quote.
pub(super) fn body_words(body: &[u8]) -> Option<String> {
    let head = &body[..body.len().min(1024)];
    let text = String::from_utf8_lossy(head);
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}
