//! Output sanitization: what the upstream sends the model, made safe to read.
//!
//! Place in the path: on the way back, after the upstream answered and before
//! the client sees a byte ([`crate::proxy`]'s `respond` and the list
//! collection), and on the way out for the secret scan of `tools/call`
//! arguments. [`message`] walks every string and key of a whole MCP message
//! (all of them are text, except the identifiers [`exempt`] names at their
//! protocol positions); this module knows what to do with one string.
//!
//! One string goes through, in order:
//! 1. one character pass that drops terminal control sequences (whole CSI,
//!    OSC, DCS, SOS, PM and APC sequences, 8-bit C1 forms, lone `ESC`, C0
//!    controls except `\t \n \r`, DEL; a bare `\r` becomes `\n`) and invisible
//!    Unicode (tag characters, bidi embeddings, overrides and isolates,
//!    zero-width characters, BOMs (a leading one too), variation-selector runs), while
//!    keeping ZWJ inside emoji and Indic words, ZWNJ, LRM/RLM/ALM, one
//!    variation selector after a base character and RGI subdivision flags;
//! 2. the secret detectors ([`secrets`]), each finding replaced by
//!    `[REDACTED:<kind>]`;
//! 3. then, over the whole message, the `max_output_bytes` bound on the sum
//!    of its texts ([`Sanitizer::bound`]): cut at a character boundary, with a
//!    notice of how much was omitted.
//!
//! Invariants: sanitizing twice gives what sanitizing once gave; nothing here
//! panics on any input; text never grows except by placeholders and notices;
//! clean text is returned untouched without allocating; every action is
//! counted in a [`Report`], by kind, and no report ever holds a secret's value.

mod controls;
pub(crate) mod exempt;
pub mod message;
mod outgoing;
mod secrets;
mod unicode;

use std::collections::BTreeMap;

use serde_json::Value;

use unicode::Class;

/// Report kind: a terminal control sequence removed.
pub const TERMINAL_SEQUENCE: &str = "terminal-sequence";
/// Report kind: a single control character removed (or a bare CR made a LF).
pub const CONTROL_CHARACTER: &str = "control-character";
/// Report kind: an invisible Unicode character removed.
pub const INVISIBLE_UNICODE: &str = "invisible-unicode";
/// Report kind: a text cut at `max_output_bytes`.
pub const TRUNCATED: &str = "truncated";
/// Prefix of report kinds for secrets (`secret:aws-access-key-id`).
pub const SECRET_PREFIX: &str = "secret:";

pub use crate::util::text::unbom;

/// Compiles the built-in secret detectors now (at load), not on the first text.
pub(crate) fn prepare() {
    secrets::prepare();
}

/// Every secret in `text` the built-in detectors and `[[sanitize.patterns]]`
/// find, whatever `secrets` says (a person's approval question withholds
/// them always): each as its byte range and kind.
pub fn secrets_in(settings: &SanitizeSettings, text: &str) -> Vec<(usize, usize, String)> {
    secrets::find(text, true, &settings.patterns)
        .into_iter()
        .map(|f| (f.start, f.end, f.kind.into_owned()))
        .collect()
}

/// Most extra redaction rounds over one text (see [`Sanitizer::text`]).
const MAX_REDACTION_ROUNDS: usize = 8;

/// Room kept under `max_output_bytes` for the notice of a cut.
const NOTICE_ROOM: usize = 120;

/// What the sanitizer did, counted by kind.
///
/// Kinds are [`TERMINAL_SEQUENCE`], [`CONTROL_CHARACTER`],
/// [`INVISIBLE_UNICODE`], [`TRUNCATED`] and `secret:<kind>` for each detector
/// or `[[sanitize.patterns]]` name. Counts only: never a value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    counts: BTreeMap<String, u64>,
}

impl Report {
    /// Adds `n` actions of `kind`.
    pub fn add(&mut self, kind: &str, n: u64) {
        if n > 0 {
            *self.counts.entry(kind.to_owned()).or_default() += n;
        }
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Report) {
        for (k, n) in &other.counts {
            self.add(k, *n);
        }
    }

    /// Counts by kind.
    pub fn counts(&self) -> &BTreeMap<String, u64> {
        &self.counts
    }

    /// True when nothing was done.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The kinds of secret found (without the `secret:` prefix), sorted.
    pub fn secret_kinds(&self) -> Vec<&str> {
        self.counts
            .keys()
            .filter_map(|k| k.strip_prefix(SECRET_PREFIX))
            .collect()
    }

    /// One line for logs: `kind=n kind=n`.
    pub fn summary(&self) -> String {
        self.counts
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Actions a `[[sanitize.exemptions]]` entry turns off for a tool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skip {
    /// Keep terminal control sequences.
    pub ansi: bool,
    /// Keep invisible Unicode.
    pub invisible_unicode: bool,
    /// Let secrets in the tool's output pass.
    pub secrets: bool,
    /// Do not cut the tool's output.
    pub max_output_bytes: bool,
    /// Do not scan the tool's arguments for secrets.
    pub arguments: bool,
}

impl Skip {
    /// Both sets of exemptions.
    pub fn union(self, other: Skip) -> Skip {
        Skip {
            ansi: self.ansi || other.ansi,
            invisible_unicode: self.invisible_unicode || other.invisible_unicode,
            secrets: self.secrets || other.secrets,
            max_output_bytes: self.max_output_bytes || other.max_output_bytes,
            arguments: self.arguments || other.arguments,
        }
    }
}

/// The sanitizer, as configured for one use (the settings, less a tool's exemptions).
#[derive(Debug, Clone, Copy)]
pub struct Sanitizer<'a> {
    settings: &'a SanitizeSettings,
    skip: Skip,
}

impl<'a> Sanitizer<'a> {
    /// A sanitizer for `settings` with the actions in `skip` turned off.
    pub fn new(settings: &'a SanitizeSettings, skip: Skip) -> Self {
        Self { settings, skip }
    }

    fn ansi(&self) -> bool {
        self.settings.ansi && !self.skip.ansi
    }

    fn invisible(&self) -> bool {
        self.settings.invisible_unicode && !self.skip.invisible_unicode
    }

    fn builtin_secrets(&self) -> bool {
        self.settings.secrets != SecretsAction::Off && !self.skip.secrets
    }

    fn patterns(&self) -> &'a [(String, regex::Regex)] {
        if self.skip.secrets {
            &[]
        } else {
            &self.settings.patterns
        }
    }

    /// True when secrets withhold the whole result instead of being redacted.
    pub fn blocks_secrets(&self) -> bool {
        self.settings.secrets == SecretsAction::Block && !self.skip.secrets
    }

    /// The text cap, unless exempted.
    pub fn max_output_bytes(&self) -> Option<usize> {
        (!self.skip.max_output_bytes).then_some(self.settings.max_output_bytes)
    }

    /// Sanitizes one text: controls, invisible characters, secrets (no cut).
    /// `None` when it is clean.
    pub fn text(&self, input: &str, report: &mut Report) -> Option<String> {
        let stripped = strip(input, self.ansi(), self.invisible(), report);
        let text = stripped.as_deref().unwrap_or(input);
        let findings = secrets::find(text, self.builtin_secrets(), self.patterns());
        if findings.is_empty() {
            return stripped;
        }
        let mut redacted = self.redact(text, &findings, report);
        // A redaction can change how a neighbouring assignment reads (its
        // value now ends at the placeholder): redact until nothing is found,
        // so that a second pass finds nothing either. Each round only turns
        // text into placeholders, so this ends; the cap is for safety.
        for _ in 0..MAX_REDACTION_ROUNDS {
            let more = secrets::find(&redacted, self.builtin_secrets(), self.patterns());
            if more.is_empty() {
                break;
            }
            redacted = self.redact(&redacted, &more, report);
        }
        Some(redacted)
    }

    fn redact(&self, text: &str, findings: &[secrets::Finding], report: &mut Report) -> String {
        for f in findings {
            report.add(&format!("{SECRET_PREFIX}{}", f.kind), 1);
        }
        secrets::redact(text, findings)
    }

    /// Sanitizes `s` in place; true when it changed.
    pub fn string(&self, s: &mut String, report: &mut Report) -> bool {
        match self.text(s, report) {
            Some(clean) => {
                *s = clean;
                true
            }
            None => false,
        }
    }

    /// Sanitizes every string of `value`, object keys included; a string under
    /// a key that names a secret (`"password"`, `"api_token"`) is judged as the
    /// value of an assignment.
    pub fn value(&self, value: &mut Value, report: &mut Report) {
        match value {
            Value::String(s) => {
                self.string(s, report);
            }
            Value::Array(items) => {
                for item in items {
                    self.value(item, report);
                }
            }
            Value::Object(map) => {
                let keys_dirty = map
                    .keys()
                    .any(|k| self.text(k, &mut Report::default()).is_some());
                if keys_dirty {
                    let old = std::mem::take(map);
                    for (mut k, v) in old {
                        self.string(&mut k, report);
                        map.insert(k, v);
                    }
                }
                for (k, v) in map.iter_mut() {
                    match v {
                        Value::String(s) if self.builtin_secrets() && secrets::assigned(k, s) => {
                            report.add(&format!("{SECRET_PREFIX}{}", secrets::GENERIC), 1);
                            *s = secrets::placeholder_for(secrets::GENERIC);
                        }
                        _ => self.value(v, report),
                    }
                }
            }
            _ => {}
        }
    }

    /// The kinds of secret in `value` (object keys considered, as in
    /// [`Sanitizer::value`]) with the JSON pointer of each; values are never
    /// returned. For the outgoing-argument scan.
    pub fn find_secrets(&self, value: &Value) -> Vec<(String, String)> {
        let mut out = Vec::new();
        self.find_in(value, &mut String::new(), &mut out);
        out
    }

    fn find_in(&self, value: &Value, pointer: &mut String, out: &mut Vec<(String, String)>) {
        match value {
            Value::String(s) => {
                let text = strip(s, true, true, &mut Report::default());
                let text = text.as_deref().unwrap_or(s);
                for f in secrets::find(
                    text,
                    self.settings.secrets != SecretsAction::Off,
                    self.patterns(),
                ) {
                    out.push((pointer.clone(), f.kind.into_owned()));
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let len = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&i.to_string());
                    self.find_in(item, pointer, out);
                    pointer.truncate(len);
                }
            }
            Value::Object(map) => {
                for (k, v) in map {
                    let len = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&k.replace('~', "~0").replace('/', "~1"));
                    match v {
                        Value::String(s)
                            if self.settings.secrets != SecretsAction::Off
                                && secrets::assigned(k, s) =>
                        {
                            out.push((pointer.clone(), secrets::GENERIC.to_owned()));
                        }
                        _ => self.find_in(v, pointer, out),
                    }
                    pointer.truncate(len);
                }
            }
            _ => {}
        }
    }
}

/// Cuts `text` so that it, with the notice appended, fits in `max` bytes;
/// returns the number of bytes omitted (0: nothing cut).
pub fn cut(text: &mut String, max: usize, report: &mut Report) -> usize {
    if text.len() <= max {
        return 0;
    }
    let mut keep = max.saturating_sub(NOTICE_ROOM);
    while keep > 0 && !text.is_char_boundary(keep) {
        keep -= 1;
    }
    let omitted = text.len() - keep;
    text.truncate(keep);
    text.push_str(&notice(omitted, max));
    report.add(TRUNCATED, 1);
    omitted
}

/// The notice that ends a cut text.
fn notice(omitted: usize, max: usize) -> String {
    format!(
        "\n[portcullis: output cut here; {omitted} more bytes were omitted (limit {max} bytes)]"
    )
}

/// The character pass: terminal controls (when `ansi`) and invisible Unicode
/// (when `invisible`). `None` when nothing changed.
pub(crate) fn strip(
    input: &str,
    ansi: bool,
    invisible: bool,
    report: &mut Report,
) -> Option<String> {
    if !ansi && !invisible {
        return None;
    }
    let first = first_suspect(input, ansi, invisible)?;
    // Kept text is copied in runs, only once something has been dropped.
    let mut out = String::new();
    let mut kept_from = 0;
    let mut changed = false;
    let mut prev = input[..first].chars().next_back();
    let mut i = first;
    let bytes = input.as_bytes();
    while i < input.len() {
        let b = bytes[i];
        // Printable ASCII, tab and LF: kept as they are.
        if (0x20..0x7f).contains(&b) || b == b'\t' || b == b'\n' {
            prev = Some(b as char);
            i += 1;
            continue;
        }
        let rest = &input[i..];
        let Some(c) = rest.chars().next() else { break };
        let len = c.len_utf8();
        // What to do with the character (or sequence) at `i`: drop up to an
        // end, or replace it with a string.
        let mut action: Option<(usize, Option<&str>)> = None;
        if ansi {
            if c == '\u{1b}' {
                report.add(TERMINAL_SEQUENCE, 1);
                action = Some((controls::escape_end(input, i), None));
            } else if let Some(end) = ('\u{80}'..='\u{9f}')
                .contains(&c)
                .then(|| controls::c1_end(input, i, c))
                .flatten()
            {
                report.add(TERMINAL_SEQUENCE, 1);
                action = Some((end, None));
            } else if controls::is_control(c) {
                report.add(CONTROL_CHARACTER, 1);
                action = Some((i + len, None));
            } else if c == '\r' && bytes.get(i + 1) != Some(&b'\n') {
                report.add(CONTROL_CHARACTER, 1);
                action = Some((i + 1, Some("\n")));
            }
        }
        if action.is_none() && invisible && !c.is_ascii() {
            let class = unicode::class(c);
            if class == Class::Tag
                && let Some(n) = unicode::flag_tags(prev, rest)
            {
                prev = rest[..n].chars().next_back();
                i += n;
                continue;
            }
            if class != Class::Visible && !unicode::keep(class, prev, rest[len..].chars().next()) {
                report.add(INVISIBLE_UNICODE, 1);
                action = Some((i + len, None));
            }
        }
        match action {
            None => {
                prev = Some(c);
                i += len;
            }
            Some((end, replacement)) => {
                if !changed {
                    out.reserve(input.len());
                    changed = true;
                }
                out.push_str(&input[kept_from..i]);
                if let Some(r) = replacement {
                    out.push_str(r);
                    prev = r.chars().next_back();
                }
                i = end;
                kept_from = end;
            }
        }
    }
    if !changed {
        return None;
    }
    out.push_str(&input[kept_from..]);
    Some(out)
}

/// The byte index of the first character that needs judging, if any. The
/// common case — printable ASCII, tabs and line ends — is a tight byte loop.
fn first_suspect(input: &str, ansi: bool, invisible: bool) -> Option<usize> {
    // Blocks of printable ASCII, tabs and LFs are passed over at once (a loop
    // the compiler vectorizes: no early exit inside a block); a block with
    // anything else is walked character by character.
    const BLOCK: usize = 32;
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if let Some(block) = bytes.get(i..i + BLOCK) {
            let plain = block.iter().fold(true, |all, &b| {
                all & ((b.wrapping_sub(0x20) < 0x5f) | (b == b'\n') | (b == b'\t'))
            });
            if plain {
                i += BLOCK;
                continue;
            }
        }
        let stop = (i + BLOCK).min(bytes.len());
        while i < stop {
            let b = bytes[i];
            if b < 0x80 {
                let ok = (0x20..0x7f).contains(&b)
                    || b == b'\t'
                    || b == b'\n'
                    || (b == b'\r' && bytes.get(i + 1) == Some(&b'\n'));
                if !ok && ansi {
                    return Some(i);
                }
                i += 1;
                continue;
            }
            let c = input[i..].chars().next()?;
            let suspect = if ('\u{80}'..='\u{9f}').contains(&c) {
                ansi
            } else {
                invisible && unicode::needs_judging(c)
            };
            if suspect {
                return Some(i);
            }
            i += c.len_utf8();
        }
    }
    None
}

/// `[sanitize]`.
#[derive(Debug, Clone)]
pub struct SanitizeSettings {
    /// Strip terminal control sequences.
    pub ansi: bool,
    /// Strip invisible Unicode.
    pub invisible_unicode: bool,
    /// What a detected secret gets.
    pub secrets: SecretsAction,
    /// Longest text passed to the model.
    pub max_output_bytes: usize,
    /// Operators' own redactions.
    pub patterns: Vec<(String, regex::Regex)>,
    /// What a `tools/call` whose arguments carry a secret gets.
    pub arguments: ArgumentScan,
    /// `[[sanitize.exemptions]]`, in file order.
    pub exemptions: Vec<Exemption>,
}

impl Default for SanitizeSettings {
    /// The defaults of an empty `[sanitize]` table.
    fn default() -> Self {
        Self {
            ansi: true,
            invisible_unicode: true,
            secrets: SecretsAction::Redact,
            max_output_bytes: 256 * 1024,
            patterns: Vec::new(),
            arguments: ArgumentScan::Block,
            exemptions: Vec::new(),
        }
    }
}

impl SanitizeSettings {
    /// The actions turned off for `tool` on `server` (the union of every
    /// exemption that matches both).
    pub fn skip_for(&self, server: &str, tool: &str) -> crate::sanitize::Skip {
        self.exemptions
            .iter()
            .filter(|e| {
                e.servers.iter().any(|g| g.matches(server))
                    && e.tools.iter().any(|g| g.matches(tool))
            })
            .fold(crate::sanitize::Skip::default(), |acc, e| acc.union(e.skip))
    }
}

/// `arguments` of `[sanitize]`: the secret scan of outgoing arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgumentScan {
    /// Arguments are not scanned.
    Off,
    /// A call whose arguments carry a secret is refused (`argument_not_permitted`).
    Block,
}

/// `[[sanitize.exemptions]]`: sanitizer actions an operator turns off for some tools.
#[derive(Debug, Clone)]
pub struct Exemption {
    /// Servers it applies to (globs; default every server).
    pub servers: Vec<crate::policy::glob::Glob>,
    /// Tools it applies to (globs over tool names).
    pub tools: Vec<crate::policy::glob::Glob>,
    /// The actions turned off.
    pub skip: crate::sanitize::Skip,
}

/// `secrets` of `[sanitize]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretsAction {
    /// Secrets pass.
    Off,
    /// Replaced by `[REDACTED:<kind>]`.
    Redact,
    /// The whole result is withheld.
    Block,
}

#[cfg(test)]
mod tests;
