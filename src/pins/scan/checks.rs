//! The checks of one string and the walk over every string and key of a
//! definition, with the JSON pointer of each.
//!
//! Place: under the scan's entry points; one pass per string, every family
//! of patterns, hidden characters, look-alikes and encoded payloads.
//!
//! Invariants: pure and bounded; every check reads the text with
//! look-alikes folded to the letters they imitate; a URL is flagged except
//! where it is the field's very meaning.

use serde_json::Value;

use super::encoded::encoded_payload;
use super::finding::{Finding, Kind, OtherTools};
use super::hidden::{excerpt, fold_confusables, hidden, without_hidden};
use super::patterns::{PHRASES, SECRET_FILE, SECRET_FILE_BIT, URL, URL_BIT, candidates};

pub(super) fn collect_strings<'v>(
    value: &'v Value,
    path: &mut String,
    out: &mut Vec<(String, &'v str)>,
) {
    match value {
        Value::String(s) => out.push((path.clone(), s)),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                collect_strings(item, path, out);
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                path.push('/');
                push_escaped(path, key);
                collect_strings(item, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

pub(super) fn walk(value: &Value, path: &mut String, others: &OtherTools, out: &mut Vec<Finding>) {
    match value {
        Value::String(s) => {
            let field = Field::of(path);
            text_findings(s, path, field, others, out);
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                walk(item, path, others, out);
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                path.push('/');
                push_escaped(path, key);
                text_findings(key, path, Field::Key, others, out);
                walk(item, path, others, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// RFC 6901 escaping of a pointer segment.
fn push_escaped(path: &mut String, key: &str) {
    for c in key.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

/// Where a string sits, for the checks that depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    /// Free text (descriptions, titles, defaults, enum values, …).
    Text,
    /// An object key (parameter names among them).
    Key,
    /// The tool's own name.
    Name,
    /// A field whose value is a URL by definition.
    Link,
}

impl Field {
    fn of(path: &str) -> Self {
        if path == "/name" {
            return Field::Name;
        }
        let last = path.rsplit('/').next().unwrap_or_default();
        let in_icons = path.starts_with("/icons/");
        if matches!(last, "$schema" | "$id" | "$ref" | "$dynamicRef") || (in_icons && last == "src")
        {
            Field::Link
        } else {
            Field::Text
        }
    }
}

pub(super) fn text_findings(
    text: &str,
    path: &str,
    field: Field,
    others: &OtherTools,
    out: &mut Vec<Finding>,
) {
    let mut add = |kind: Kind, detail: String| {
        let path = match field {
            Field::Key => format!("{path} (key)"),
            _ => path.to_owned(),
        };
        out.push(Finding {
            kind,
            severity: kind.severity(),
            path,
            detail,
        })
    };
    if let Some(detail) = hidden(text) {
        add(Kind::HiddenUnicode, detail);
    }
    if text.is_ascii() && text.len() < 4 {
        return;
    }
    // Hidden characters must not split a phrase out of the checks' sight.
    let visible = without_hidden(text);
    // Nor may look-alike letters: the checks read them as the Latin letters they imitate.
    let folded = fold_confusables(&visible);
    if let Some(folded) = &folded
        && let Some(word) = &folded.mixed
    {
        add(
            Kind::Confusable,
            format!("{} reads as {}", excerpt(&word.0), excerpt(&word.1)),
        );
    }
    let text = folded
        .as_ref()
        .map_or(visible.as_ref(), |f| f.text.as_str());
    let candidates = candidates(text);
    if candidates != 0 {
        detailed(text, field, candidates, &mut add);
    }
    if field != Field::Link
        && let Some(detail) = encoded_payload(text, 0)
    {
        add(Kind::EncodedPayload, detail);
    }
    if field != Field::Name
        && let Some(pattern) = &others.pattern
        && let Some(c) = pattern.captures(text)
        && let Some(m) = c.get(1)
    {
        add(Kind::OtherServerTool, excerpt(m.as_str()));
    }
}

/// The checks one by one, once the set said one of them matches; only the
/// `candidates` (the others cannot match).
fn detailed(text: &str, field: Field, candidates: u32, add: &mut dyn FnMut(Kind, String)) {
    for (kind, phrases) in PHRASES.iter() {
        if let Some((phrase, m)) = phrases
            .iter()
            .filter(|p| p.bit & candidates != 0)
            .find_map(|p| p.regex.find(text).map(|m| (p, m)))
        {
            add(*kind, format!("{}: {}", phrase.label, excerpt(m.as_str())));
        }
    }
    if candidates & SECRET_FILE_BIT != 0
        && let Some(m) = SECRET_FILE.find(text)
    {
        add(Kind::SecretFile, excerpt(m.as_str().trim_start()));
    }
    if field != Field::Link
        && field != Field::Name
        && candidates & URL_BIT != 0
        && let Some(m) = URL.find(text)
    {
        add(Kind::Url, excerpt(m.as_str()));
    }
}
