//! The one rendering of a call for every person who judges it: the 2025
//! elicitation question, the 2026 `input_required` question, the operator
//! queue (admin API and dashboard) and the audit trail's record of the held
//! call all show [`arguments`] and [`question`], never anything else.
//!
//! Place in the path: called by the pipeline's approval step with the
//! arguments exactly as they are forwarded, before the gate decides; the gate
//! refuses a call whose question is longer than `max_question_chars`
//! (`approval_unpresentable`) instead of cutting it.
//!
//! Invariants: nothing is deleted and nothing is cut; every character that is
//! not plainly visible (controls including ESC and DEL, C1, format characters
//! such as bidi controls, zero-width characters and tag characters, line and
//! paragraph separators, every space but U+0020, private use, unassigned
//! code points and non-characters, fillers and variation selectors, a
//! combining mark with no visible base) is shown as a visible escape, and `\`
//! and `"` are escaped themselves, so two different values never render
//! alike (the escaping is injective) and unescaping gives the value back;
//! object members appear in the order they are forwarded in
//! ([`crate::util::canonical`]); a secret is withheld whatever `[sanitize]
//! secrets` says, as `\withheld{KIND,CHARS,DIGEST8}` (DIGEST8 a short hash of
//! the secret, so two different secrets render differently); text the
//! upstream or an operator controls (tool name, server, rule reason) is one
//! line: it cannot add or forge a line of the question.

use serde_json::Value;
use sha2::{Digest, Sha256};
use unicode_general_category::{GeneralCategory, get_general_category};

/// A secret found in a text: its byte range and its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    pub start: usize,
    pub end: usize,
    pub kind: String,
}

/// Finds the secrets of a text (the sanitizer's detectors, whatever
/// `[sanitize] secrets` says).
pub type Secrets<'a> = &'a dyn Fn(&str) -> Vec<Secret>;

/// A finder of no secrets (a text that holds none by construction).
pub fn no_secrets(_: &str) -> Vec<Secret> {
    Vec::new()
}

/// Most combining marks shown plainly in a row (a longer run is escaped:
/// stacked marks can cover the lines around them).
const MAX_MARKS: usize = 4;

/// Whether `c` is shown as itself (else as an escape): what every display
/// of others' text shows plainly ([`crate::util::escape::is_plain`]), but
/// `\` and `"`, which delimit the question's strings.
pub fn plain(c: char) -> bool {
    c != '\\' && c != '"' && crate::util::escape::is_plain(c)
}

fn is_mark(c: char) -> bool {
    matches!(
        get_general_category(c),
        GeneralCategory::NonspacingMark
            | GeneralCategory::SpacingMark
            | GeneralCategory::EnclosingMark
    )
}

/// One character as its escape.
fn escape(c: char, out: &mut String) {
    match c {
        '\\' => out.push_str("\\\\"),
        '"' => out.push_str("\\\""),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        other => out.push_str(&format!("\\u{{{:X}}}", other as u32)),
    }
}

/// A text with every character not plainly visible escaped (no secrets
/// looked for): one line whatever it holds.
fn escaped(text: &str, out: &mut String) {
    // A mark shows plainly only on a plainly shown base, in a short run.
    let mut base = false;
    let mut marks = 0;
    for c in text.chars() {
        if is_mark(c) && plain(c) {
            if base && marks < MAX_MARKS {
                marks += 1;
                out.push(c);
            } else {
                escape(c, out);
            }
            continue;
        }
        marks = 0;
        if plain(c) {
            base = c != ' ';
            out.push(c);
        } else {
            base = false;
            escape(c, out);
        }
    }
}

/// A text: every secret withheld, every other character plain or escaped.
pub fn text(text: &str, secrets: Secrets<'_>) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    let mut at = 0;
    let mut found = secrets(text);
    found.sort_by_key(|s| s.start);
    for s in found {
        if s.start < at || s.end <= s.start || s.end > text.len() {
            continue;
        }
        let (Some(before), Some(secret)) = (text.get(at..s.start), text.get(s.start..s.end)) else {
            continue;
        };
        escaped(before, &mut out);
        withheld(&s.kind, secret, &mut out);
        at = s.end;
    }
    escaped(&text[at..], &mut out);
    out
}

/// `\withheld{KIND,CHARS,DIGEST8}`.
fn withheld(kind: &str, secret: &str, out: &mut String) {
    let digest = hex::encode(&Sha256::digest(secret.as_bytes())[..4]);
    out.push_str("\\withheld{");
    for c in kind.chars() {
        if c == ',' || c == '{' || c == '}' {
            escape(c, out);
        } else if plain(c) {
            out.push(c);
        } else {
            escape(c, out);
        }
    }
    out.push_str(&format!(",{},{digest}}}", secret.chars().count()));
}

/// One line of text the upstream or an operator controls (a tool name, a
/// server, a rule's reason): escaped like an argument, so it cannot add or
/// forge a line.
pub fn line(value: &str) -> String {
    text(value, &no_secrets)
}

/// The arguments as every person who judges the call sees them: JSON-like,
/// two-space indented, members in forwarded order, every string (key or
/// value) quoted and escaped, secrets withheld, numbers as forwarded.
pub fn arguments(value: &Value, secrets: Secrets<'_>) -> String {
    let mut out = String::new();
    write(value, 0, secrets, &mut out);
    out
}

fn quoted(s: &str, secrets: Secrets<'_>, out: &mut String) {
    out.push('"');
    out.push_str(&text(s, secrets));
    out.push('"');
}

fn indent(depth: usize, out: &mut String) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn write(value: &Value, depth: usize, secrets: Secrets<'_>, out: &mut String) {
    match value {
        Value::String(s) => quoted(s, secrets, out),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Object(members) if members.is_empty() => out.push_str("{}"),
        Value::Array(items) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                indent(depth + 1, out);
                write(item, depth + 1, secrets, out);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            indent(depth, out);
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push_str("{\n");
            let n = sorted.len();
            for (i, (key, item)) in sorted.into_iter().enumerate() {
                indent(depth + 1, out);
                quoted(key, secrets, out);
                out.push_str(": ");
                write(item, depth + 1, secrets, out);
                out.push_str(if i + 1 < n { ",\n" } else { "\n" });
            }
            indent(depth, out);
            out.push('}');
        }
        // Numbers, booleans and null exactly as they are forwarded.
        other => out.push_str(&String::from_utf8_lossy(&crate::util::canonical::to_vec(
            other,
        ))),
    }
}

/// What the question says, line by line; every line but the arguments' is
/// the gateway's own, and what the upstream or an operator wrote in it is
/// escaped to one line.
#[derive(Debug)]
pub struct Question<'a> {
    pub tool: &'a str,
    pub server: &'a str,
    pub reason: Option<&'a str>,
    /// [`arguments`].
    pub arguments: &'a str,
    /// SHA-256 of the argument bytes forwarded, hex.
    pub digest: &'a str,
}

/// The text of the question.
pub fn question(q: &Question<'_>) -> String {
    let reason = q
        .reason
        .map(|r| format!("Why approval is required: {}\n", line(r)))
        .unwrap_or_default();
    format!(
        "Approve this tool call?\nTool: {}\nServer: {}\n{reason}Arguments (SHA-256 of the bytes sent: {}):\n{}\n\
         Characters that are not plainly visible are shown as escapes such as \\u{{1B}}, and secrets as \
         \\withheld{{kind,length,hash}}; nothing is hidden or cut. It runs once, with exactly these arguments, \
         only if you approve.",
        line(q.tool),
        line(q.server),
        q.digest,
        q.arguments,
    )
}

#[cfg(test)]
mod tests;
