//! How a pin is shown to an operator: its JSON entry for the admin API, the
//! command and body that approve it, and the field-by-field difference
//! between an approved definition and the one served now.
//!
//! Place: beside the pin view, read by the admin API, the CLI and the
//! pipeline's quarantine texts. Invariant: a difference lists at most
//! [`MAX_CHANGES`] changes, with the total counted.

use serde_json::{Value, json};

use std::collections::BTreeSet;

use super::jcs;
use super::model::{Change, Digest, Key, PinKind, Record, Status};
use super::scan::{self, Finding};
use crate::util::time::iso8601;

/// Most changes listed for one definition.
const MAX_CHANGES: usize = 12;

/// A pin as operators see it (API and CLI).
pub(crate) fn entry_json(key: &Key, r: &Record, config: &str) -> Value {
    let (changes, total) = match &r.approved {
        Some(a) if !r.trusted() => diff(&a.version.definition, &r.seen.definition),
        _ => (Vec::new(), 0),
    };
    let mut out = json!({
        "kind": key.kind.as_str(),
        "status": r.status(),
        "present": r.present,
        "approved": r.approved.as_ref().map(|a| json!({
            "hash": hex::encode(a.version.hash), "at": iso8601(a.version.at), "by": a.by,
        })),
        "seen": {"hash": hex::encode(r.seen.hash), "at": iso8601(r.seen.at)},
        "findings": &*r.findings,
        "changes": changes,
        "total_changes": total,
    });
    if key.kind == PinKind::Tool {
        out["name"] = key.name.clone().into();
    }
    if r.status() != Status::Trusted {
        out["approve"] = json!({
            "cli": approve_command(config, key),
            "api": {"method": "POST", "path": "/api/pins/approve", "body": approve_body(key, Some(&r.seen.hash))},
        });
    }
    out
}

/// The CLI command that approves `key`.
pub(crate) fn approve_command(config: &str, key: &Key) -> String {
    let subject = match key.kind {
        PinKind::Tool => format!("--tool {}", shell_word(&key.name)),
        PinKind::Instructions => "--instructions".to_owned(),
    };
    format!(
        "portcullis pins approve --config {} --server {} {subject}",
        shell_word(config),
        shell_word(&key.server)
    )
}

/// The admin API body that approves `key`.
pub(crate) fn approve_body(key: &Key, hash: Option<&Digest>) -> Value {
    let mut body = json!({"server": key.server});
    match key.kind {
        PinKind::Tool => body["tool"] = key.name.clone().into(),
        PinKind::Instructions => body["instructions"] = true.into(),
    }
    if let Some(h) = hash {
        body["hash"] = hex::encode(h).into();
    }
    body
}

/// `s` as one shell word a person can read and paste: bare when it is
/// plainly safe, in single quotes when it is plain text, and in ANSI-C
/// quotes (`$'…'`, bash and zsh) with escapes when it holds a character that
/// is not plain (a control, a line break, an invisible character), which
/// would otherwise reach the terminal raw.
fn shell_word(s: &str) -> String {
    use crate::util::escape::is_plain;
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':' | '='))
    {
        s.to_owned()
    } else if s.chars().all(is_plain) {
        format!("'{}'", s.replace('\'', r"'\''"))
    } else {
        let mut out = String::from("$'");
        for c in s.chars() {
            match c {
                '\\' | '\'' => {
                    out.push('\\');
                    out.push(c);
                }
                c if is_plain(c) => out.push(c),
                // `\xHH` is a byte to the shell: only ASCII is written so.
                c if c.is_ascii() => out.push_str(&format!("\\x{:02x}", c as u32)),
                c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push_str(&format!("\\U{:08x}", c as u32)),
            }
        }
        out.push('\'');
        out
    }
}

pub(crate) fn summary(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("{} at {}", f.kind.as_str(), f.path))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The top-level fields a list of changes touches (`description`, `inputSchema`, …).
pub(crate) fn changed_fields(changes: &[Change]) -> Vec<String> {
    let mut fields: Vec<String> = changes
        .iter()
        .map(|c| {
            let first = c.pointer.trim_start_matches('/').split('/').next();
            match first {
                Some("") | None => "(whole definition)".to_owned(),
                Some(f) => f.replace("~1", "/").replace("~0", "~"),
            }
        })
        .collect();
    fields.dedup();
    fields.sort();
    fields.dedup();
    fields
}

/// The differences between two JSON values, as pointers; at most
/// [`MAX_CHANGES`] listed, with the total count.
pub(crate) fn diff(old: &Value, new: &Value) -> (Vec<Change>, usize) {
    let mut out = Vec::new();
    let mut total = 0;
    diff_at(old, new, &mut String::new(), &mut out, &mut total);
    (out, total)
}

fn diff_at(old: &Value, new: &Value, at: &mut String, out: &mut Vec<Change>, total: &mut usize) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let len = at.len();
                at.push('/');
                at.push_str(&key.replace('~', "~0").replace('/', "~1"));
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => diff_at(x, y, at, out, total),
                    (x, y) => push_change(out, total, at, x, y),
                }
                at.truncate(len);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let len = at.len();
                at.push('/');
                at.push_str(&i.to_string());
                diff_at(x, y, at, out, total);
                at.truncate(len);
            }
        }
        (a, b) if jcs::canonical(a) == jcs::canonical(b) => {}
        (a, b) => push_change(out, total, at, Some(a), Some(b)),
    }
}

fn push_change(
    out: &mut Vec<Change>,
    total: &mut usize,
    at: &str,
    before: Option<&Value>,
    after: Option<&Value>,
) {
    *total += 1;
    if out.len() < MAX_CHANGES {
        out.push(Change {
            pointer: at.to_owned(),
            before: before.cloned(),
            after: after.cloned(),
        });
    }
}

/// A value as short, visible JSON: hidden characters spelled out, cut after
/// a few dozen characters.
pub(crate) fn short(value: &Value) -> String {
    let mut out = String::new();
    for (n, c) in value.to_string().chars().enumerate() {
        if n == 60 {
            out.push('…');
            break;
        }
        if scan::is_hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}
