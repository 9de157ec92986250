//! Every message from the upstream, sanitized whole: every string value and
//! every object key, whatever the method or the shape.
//!
//! Place in the path: called by the proxy for every upstream message — POST
//! responses, SSE events of POST and GET streams, notifications, the server's
//! own requests, results of any method and `resultType` — and for each list
//! item the gateway collects.
//!
//! What is sanitized: everything. The walk visits every object (keys
//! included) and array of the message and treats every string as text for the
//! model — result and block `_meta`, annotations, `serverInfo`, log `logger`
//! and `data`, sampling and elicitation params (also inside 2026
//! `inputRequests`), schemas, task status messages, error `message` and
//! `data`, extra fields no schema names.
//!
//! What is exempt: the identifiers the protocol puts at known positions
//! ([`super::exempt`]: JSON-RPC `jsonrpc`/`id`/`method` of the envelope, a
//! list result's `nextCursor`, a tool's or resource's `name`, `uri` and
//! `mimeType`, a content block's `type`, base64 `data` and `mimeType`,
//! progress tokens in `_meta`, task and tool-use ids, `requestState`,
//! `resultType`, `protocolVersion`). The walk knows which request a response
//! answers (`answering`) and carries the position of every object it enters,
//! so the same key inside a tool's data (`structuredContent`, a schema, a
//! block's `input`, an error's `data`) is text. Each identifier is checked for
//! its form instead; one that fails is an upstream protocol error or is
//! sanitized as text, as the table says.
//!
//! Also here: the message's shape ([`shape`]: a request, a notification, a
//! result or an error, never two at once), the bound on what one message
//! carries ([`Sanitizer::bound`]: the sum of its texts, at most
//! `max_output_bytes`), and the mirror rule (a text block that is the
//! serialized `structuredContent` is written again from the sanitized value).
//!
//! Invariants: sanitizing twice gives what sanitizing once gave; clean strings
//! and keys are not copied; an object is rebuilt only when a key changes, and
//! a key whose clean form collides with another gets `#2`, `#3`, … in
//! document order (keys that were clean keep their name).

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use super::exempt::{self, Answer, Around, Form, OnBad, Pos};
use super::{Report, Sanitizer, TRUNCATED, secrets};

/// Strings this short are never cut by the bound (enum-like values such as
/// `role` or `level` must keep their meaning); they still count.
const SMALL: usize = 64;

/// Why a message from the upstream cannot be passed on: a sentence for the
/// gateway's protocol-error text ("its result is not a JSON object").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

/// What a well-formed message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `method` and `id`: the server asks the client something.
    Request,
    /// `method`, no `id`.
    Notification,
    /// `result` (an object) and `id`.
    Result,
    /// `error` (an object with `code` and `message`).
    Error,
}

/// The shape of a JSON-RPC message, or why it has none.
pub fn shape(message: &Value) -> Result<Shape, Malformed> {
    let bad = |why: &str| Err(Malformed(why.to_owned()));
    let Some(obj) = message.as_object() else {
        return bad("its message is not a JSON object");
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return bad("its message does not say `\"jsonrpc\": \"2.0\"`");
    }
    let (method, result, error) = (obj.get("method"), obj.get("result"), obj.get("error"));
    let id_ok = |id: Option<&Value>| matches!(id, Some(Value::String(_) | Value::Number(_)));
    match (method, result, error) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            bad("its message carries both a `method` and a result or error")
        }
        (Some(m), None, None) => {
            if !m.is_string() {
                return bad("its message's `method` is not a string");
            }
            if obj.get("params").is_some_and(|p| !p.is_object()) {
                return bad("its message's `params` is not a JSON object");
            }
            match obj.get("id") {
                None => Ok(Shape::Notification),
                id if id_ok(id) => Ok(Shape::Request),
                _ => bad("its request's id is neither a string nor a number"),
            }
        }
        (None, Some(_), Some(_)) => bad("its response carries both a result and an error"),
        (None, Some(r), None) => {
            if !r.is_object() {
                return bad("its result is not a JSON object");
            }
            if !id_ok(obj.get("id")) {
                return bad("its response has no id");
            }
            Ok(Shape::Result)
        }
        (None, None, Some(e)) => {
            let ok = e.get("code").is_some_and(Value::is_i64)
                && e.get("message").is_some_and(Value::is_string);
            if !ok {
                return bad("its error is not an object with an integer code and a message");
            }
            if obj
                .get("id")
                .is_some_and(|id| !id.is_null() && !id_ok(Some(id)))
            {
                return bad("its error's id is neither a string nor a number");
            }
            Ok(Shape::Error)
        }
        (None, None, None) => {
            bad("its message is neither a request, a notification nor a response")
        }
    }
}

/// What each JSON value of a message (an object member, an array item)
/// counts against the bound besides its text: its share of the structure, so
/// that a flood of empty blocks is as large as it is.
const PER_VALUE: usize = 4;

/// What a walk measured: the bytes of text (not counting the gateway's own
/// notices), of those the bytes in strings of at most [`SMALL`] bytes, the
/// bytes of the object keys, and the number of values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Texts {
    pub total: usize,
    pub small: usize,
    pub keys: usize,
    pub values: usize,
}

impl Texts {
    fn count(&mut self, s: &str) {
        let n = counted(s);
        self.total += n;
        if n <= SMALL {
            self.small += n;
        }
    }

    /// What the bound cannot cut: keys, short strings and structure.
    pub fn fixed(&self) -> usize {
        self.small + self.keys + self.values * PER_VALUE
    }

    /// The size of the message as the bound measures it.
    pub fn measured(&self) -> usize {
        self.total + self.keys + self.values * PER_VALUE
    }
}

/// A message whose keys, short strings and structure alone exceed
/// `max_output_bytes`: no cut of its texts brings it under the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBound {
    /// The message's size as the bound measures it.
    pub bytes: usize,
    /// `max_output_bytes`.
    pub limit: usize,
}

impl Sanitizer<'_> {
    /// A whole JSON-RPC message from the upstream, `answering` a request of
    /// that method when it is a response: its shape checked, every string and
    /// key sanitized but the identifiers at their protocol positions, its
    /// texts bounded by `max_output_bytes` (a message whose keys, short
    /// values and blocks alone exceed it is refused as malformed).
    pub fn message(
        &self,
        message: &mut Value,
        answering: Option<&str>,
        report: &mut Report,
    ) -> Result<Shape, Malformed> {
        let shape = shape(message)?;
        let texts = self.sanitize_message(message, answering, report)?;
        self.bound(message, answering, texts, report)
            .map_err(|o| {
                Malformed(format!(
                    "its message carries {} bytes of keys, short values and blocks, over the limit of {} bytes on one message",
                    o.bytes, o.limit
                ))
            })?;
        Ok(shape)
    }

    /// Every string and key of a message (or of any value standing for one),
    /// sanitized; what it carries measured. No shape check, no bound.
    pub(crate) fn sanitize_message(
        &self,
        message: &mut Value,
        answering: Option<&str>,
        report: &mut Report,
    ) -> Result<Texts, Malformed> {
        let mut texts = Texts::default();
        let at = Pos::Envelope(Answer::of(answering));
        self.walk(message, at, &mut texts, report)?;
        Ok(texts)
    }

    /// A part of a message at a known position (a list item, the rest of a
    /// list result, a member's capabilities), sanitized whole. `Err` when one
    /// of its identifiers is unusable: the item is left out.
    pub(crate) fn definition(
        &self,
        item: &mut Value,
        at: Pos,
        report: &mut Report,
    ) -> Result<(), Malformed> {
        self.walk(item, at, &mut Texts::default(), report)
            .map(|_| ())
    }

    fn walk(
        &self,
        value: &mut Value,
        at: Pos,
        texts: &mut Texts,
        report: &mut Report,
    ) -> Result<(), Malformed> {
        match value {
            Value::String(s) => {
                self.string(s, report);
                texts.count(s);
            }
            Value::Array(items) => {
                texts.values += items.len();
                for item in items {
                    self.walk(item, at, texts, report)?;
                }
            }
            Value::Object(map) => self.object(map, at, texts, report)?,
            _ => {}
        }
        Ok(())
    }

    fn object(
        &self,
        map: &mut Map<String, Value>,
        at: Pos,
        texts: &mut Texts,
        report: &mut Report,
    ) -> Result<(), Malformed> {
        self.keys(map, report);
        let mirrors = mirror_blocks(map);
        let before = (!mirrors.is_empty()).then(|| report.clone());
        texts.values += map.len();
        texts.keys += map.keys().map(String::len).sum::<usize>();
        // Positions are judged on the keys as cleaned.
        let around = Around::of(at, map);
        for (k, v) in map.iter_mut() {
            let Value::String(s) = v else {
                self.walk(v, exempt::child(at, k, around), texts, report)?;
                continue;
            };
            if let Some(e) = exempt::exempt(at, k, around) {
                if self.fits(e.form, s) {
                    continue;
                }
                if e.on_bad == OnBad::Refuse {
                    return Err(Malformed(format!(
                        "its `{}` is not a valid {}",
                        printable(k),
                        form_name(e.form)
                    )));
                }
            }
            if self.builtin_secrets() && secrets::assigned(k, s) {
                report.add(&format!("{}{}", super::SECRET_PREFIX, secrets::GENERIC), 1);
                *s = secrets::placeholder_for(secrets::GENERIC);
            } else {
                self.string(s, report);
            }
            texts.count(s);
        }
        if let Some(before) = before
            && *report != before
        {
            rerender_mirrors(map, &mirrors);
        }
        Ok(())
    }

    /// True when an exempt value has its form (and, where the table asks, no
    /// credential in it).
    fn fits(&self, form: Form, value: &str) -> bool {
        exempt::fits(form, value)
            && (!exempt::scanned_for_secrets(form)
                || secrets::find(value, self.builtin_secrets(), self.patterns()).is_empty())
    }

    /// Object keys, sanitized; an object is rebuilt only when one changed.
    fn keys(&self, map: &mut Map<String, Value>, report: &mut Report) {
        let dirty = map
            .keys()
            .any(|k| self.text(k, &mut Report::default()).is_some());
        if !dirty {
            return;
        }
        let old = std::mem::take(map);
        let mut taken: HashSet<String> = HashSet::new();
        let mut renamed = Vec::with_capacity(old.len());
        for (k, v) in old {
            match self.text(&k, report) {
                None => {
                    taken.insert(k.clone());
                    renamed.push((k, None, v));
                }
                Some(clean) => renamed.push((k, Some(clean), v)),
            }
        }
        for (k, clean, v) in renamed {
            let key = match clean {
                None => k,
                Some(clean) => {
                    let mut candidate = clean.clone();
                    let mut n = 2;
                    while taken.contains(&candidate) {
                        candidate = format!("{clean}#{n}");
                        n += 1;
                    }
                    taken.insert(candidate.clone());
                    candidate
                }
            };
            map.insert(key, v);
        }
    }

    /// Keeps `message` within `max_output_bytes` in all, as [`Texts`]
    /// measures it (texts, keys, and [`PER_VALUE`] bytes per value): strings
    /// are kept whole in document order while they fit; the first that does
    /// not is cut with a notice of what the message lost, the later ones are
    /// emptied; a `structuredContent` is kept or replaced whole by a notice.
    /// Strings of at most [`SMALL`] bytes, keys and structure are never cut:
    /// when they alone exceed the bound, the message is [`OverBound`]. True
    /// when a `structuredContent` was replaced.
    pub(crate) fn bound(
        &self,
        message: &mut Value,
        answering: Option<&str>,
        texts: Texts,
        report: &mut Report,
    ) -> Result<bool, OverBound> {
        let Some(max) = self.max_output_bytes() else {
            return Ok(false);
        };
        if texts.measured() <= max {
            return Ok(false);
        }
        if texts.fixed() + super::NOTICE_ROOM > max {
            report.add(TRUNCATED, 1);
            return Err(OverBound {
                bytes: texts.measured(),
                limit: max,
            });
        }
        let start = Cut {
            // Room is kept for the notice, so that the texts and it fit in `max`.
            remaining: max - texts.fixed() - super::NOTICE_ROOM,
            max,
            omitted: 0,
            noticed: false,
            replaced: false,
            dry: true,
        };
        // A first walk counts what will be omitted, for the notice to say.
        let at = Pos::Envelope(Answer::of(answering));
        let mut dry = start;
        dry.value(message, at, &mut Report::default());
        let mut cut = Cut {
            omitted: dry.omitted,
            dry: false,
            ..start
        };
        cut.value(message, at, report);
        Ok(cut.replaced)
    }
}

/// The state of one bounding walk.
#[derive(Debug, Clone, Copy)]
struct Cut {
    remaining: usize,
    max: usize,
    /// Bytes the message loses: counted by the dry walk, said by the notice.
    omitted: usize,
    noticed: bool,
    replaced: bool,
    /// Counts only, changes nothing.
    dry: bool,
}

impl Cut {
    fn value(&mut self, value: &mut Value, at: Pos, report: &mut Report) {
        match value {
            Value::String(s) => self.string(s, report),
            Value::Array(items) => {
                for item in items {
                    self.value(item, at, report);
                }
            }
            Value::Object(map) => {
                let around = Around::of(at, map);
                for (k, v) in map.iter_mut() {
                    if k == "structuredContent" {
                        self.structured(v, report);
                        continue;
                    }
                    match v {
                        Value::String(s) => {
                            let exempt = exempt::exempt(at, k, around)
                                .is_some_and(|e| exempt::fits(e.form, s));
                            if !exempt {
                                self.string(s, report);
                            }
                        }
                        _ => self.value(v, exempt::child(at, k, around), report),
                    }
                }
            }
            _ => {}
        }
    }

    fn string(&mut self, s: &mut String, report: &mut Report) {
        let n = counted(s);
        if n <= SMALL {
            return;
        }
        if n <= self.remaining {
            self.remaining -= n;
            return;
        }
        report.add(TRUNCATED, 1);
        if self.noticed {
            if self.dry {
                self.omitted += n;
            } else {
                s.clear();
            }
            return;
        }
        self.noticed = true;
        let mut keep = self.remaining.min(n);
        while keep > 0 && !s.is_char_boundary(keep) {
            keep -= 1;
        }
        self.remaining -= keep;
        if self.dry {
            self.omitted += n - keep;
            return;
        }
        s.truncate(keep);
        s.push_str(&format!(
            "\n[portcullis: output cut here; {} more bytes were omitted (limit {} bytes)]",
            self.omitted, self.max
        ));
    }

    fn structured(&mut self, value: &mut Value, report: &mut Report) {
        let size = long_texts(value);
        if size <= self.remaining {
            self.remaining -= size;
            return;
        }
        report.add(TRUNCATED, 1);
        self.replaced = true;
        if self.dry {
            self.omitted += size;
            return;
        }
        *value = json!({ "portcullis/omitted": format!(
            "[portcullis: structuredContent omitted here; {size} bytes were omitted (limit {} bytes)]",
            self.max
        )});
    }
}

/// The bytes of the text strings longer than [`SMALL`] in `value` (keys
/// aside). A `structuredContent` is the tool's data: no string in it is an
/// identifier.
fn long_texts(value: &Value) -> usize {
    match value {
        Value::String(s) => {
            let n = counted(s);
            if n > SMALL { n } else { 0 }
        }
        Value::Array(items) => items.iter().map(long_texts).sum(),
        Value::Object(map) => map.values().map(long_texts).sum(),
        _ => 0,
    }
}

/// The bytes of `s` that count against the bound: all but a gateway notice
/// that ends it (so that bounding twice is bounding once). A text can only
/// discount the one notice at its end, never more than that notice's bytes.
fn counted(s: &str) -> usize {
    if !s.ends_with(" bytes)]") {
        return s.len();
    }
    let Some(at) = s.rfind("[portcullis: ") else {
        return s.len();
    };
    let tail = &s[at..];
    let is_notice = (tail.starts_with("[portcullis: output cut here; ")
        || tail.starts_with("[portcullis: structuredContent omitted here; "))
        && tail.len() <= 160
        && tail.contains("(limit ");
    if !is_notice {
        return s.len();
    }
    if s[..at].ends_with('\n') { at - 1 } else { at }
}

/// A key as it may be quoted in a gateway text (the message is refused, so
/// the key was never cleaned): visible ASCII only, at most 40 characters.
fn printable(key: &str) -> String {
    key.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(40)
        .collect()
}

fn form_name(form: Form) -> &'static str {
    match form {
        Form::JsonRpc => "JSON-RPC version",
        Form::Id => "identifier",
        Form::Method => "method name",
        Form::Opaque => "opaque token",
        Form::Uri => "URI (no whitespace, control or invisible character, no credential)",
        Form::Name => "name",
        Form::MimeType => "MIME type",
        Form::Base64 => "base64 value",
        Form::ResultType => "result type (complete, input_required or task)",
        Form::Discriminator => "type",
        Form::Version => "protocol version",
    }
}

/// Indices of the text blocks that are `structuredContent` serialized, each
/// with whether it was laid out over several lines.
fn mirror_blocks(result: &Map<String, Value>) -> Vec<(usize, bool)> {
    let (Some(structured), Some(Value::Array(blocks))) =
        (result.get("structuredContent"), result.get("content"))
    else {
        return Vec::new();
    };
    blocks
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            let text = b.get("text")?.as_str()?;
            let parsed: Value = serde_json::from_str(text).ok()?;
            (parsed == *structured).then_some((i, text.contains('\n')))
        })
        .collect()
}

/// Writes the mirror blocks again from the (sanitized) `structuredContent`.
fn rerender_mirrors(result: &mut Map<String, Value>, mirrors: &[(usize, bool)]) {
    let Some(structured) = result.get("structuredContent").cloned() else {
        return;
    };
    if let Some(Value::Array(blocks)) = result.get_mut("content") {
        for &(i, pretty) in mirrors {
            let text = if pretty {
                serde_json::to_string_pretty(&structured)
            } else {
                serde_json::to_string(&structured)
            };
            if let (Some(block), Ok(text)) = (blocks.get_mut(i), text) {
                block["text"] = Value::String(text);
            }
        }
    }
}
