//! The poisoning scan: deterministic flags over every string of a tool
//! definition (and of a server's instructions) that reaches the model.
//!
//! Place in the path: runs when a definition is seen for the first time or
//! with a new hash, never on a definition already scanned; its findings are
//! stored with the pin and shown to operators.
//!
//! What is flagged, in every string value and every object key (so parameter
//! names, descriptions, titles, defaults, enum values, examples and `_meta`
//! alike):
//! - instruction-like text: `<IMPORTANT>`-style tags, "ignore previous …",
//!   "do not tell the user", "before using this tool", "always BCC …";
//! - hidden characters: Unicode tags (but not a real subdivision flag such
//!   as 🏴󠁧󠁢󠁳󠁣󠁴󠁿), bidi embeddings, overrides and isolates, zero-width
//!   characters, variation-selector runs, C0/C1 control characters;
//! - references to secret files: `~/.ssh`, `id_rsa`, `.env`, `mcp.json`, …;
//! - URLs (except where a URL is the field's very meaning: `$schema`, `$id`,
//!   `$ref`, `icons[].src`) — a notice, not a warning, since plain reference
//!   servers put documentation links and default download URLs there;
//! - names of other servers' tools (`send_email`, `gmail__send_email`).
//!
//! Invariants: pure and bounded (linear-time regexes, one pass per string);
//! a finding's `detail` is for operators and may quote the text, escaped so
//! that nothing hidden stays hidden; the model only ever sees kinds and paths.

use std::sync::LazyLock;

use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest excerpt of the offending text kept in a finding's detail.
const EXCERPT_CHARS: usize = 80;

/// What kind of poisoning a finding suggests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// Text that addresses the model rather than describing the tool.
    Instruction,
    /// Characters a person reviewing the text would not see.
    HiddenUnicode,
    /// A path to credentials or keys.
    SecretFile,
    /// The name of a tool on another configured server.
    OtherServerTool,
    /// A URL in text.
    Url,
}

/// How much a finding weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Severity {
    /// Recorded and shown; does not quarantine on its own.
    Notice,
    /// With `pinning = "block"`, quarantines a definition until approved.
    Warning,
}

impl Kind {
    /// Stable label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Instruction => "instruction",
            Kind::HiddenUnicode => "hidden_unicode",
            Kind::SecretFile => "secret_file",
            Kind::OtherServerTool => "other_server_tool",
            Kind::Url => "url",
        }
    }

    /// Words for the quarantine text.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Kind::Instruction => "instruction-like text",
            Kind::HiddenUnicode => "hidden characters",
            Kind::SecretFile => "a reference to a secret file",
            Kind::OtherServerTool => "the name of another server's tool",
            Kind::Url => "a URL",
        }
    }

    pub(crate) fn severity(self) -> Severity {
        match self {
            Kind::Url => Severity::Notice,
            _ => Severity::Warning,
        }
    }
}

/// One flagged string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Finding {
    pub kind: Kind,
    pub severity: Severity,
    /// JSON pointer of the string in the definition; a key is `…/name (key)`.
    pub path: String,
    /// For operators: what matched, with hidden characters spelled out.
    pub detail: String,
}

/// Tool names of the other servers, for the cross-server check.
#[derive(Debug, Default)]
pub(crate) struct OtherTools {
    pattern: Option<Regex>,
}

impl OtherTools {
    /// Builds the matcher from `(server, tool)` pairs of the other servers,
    /// leaving out names this server itself defines. Only distinctive names are
    /// matched alone (with `_`, `-`, a digit or an inner capital, at least 4
    /// characters); `server__tool` always is.
    pub(crate) fn new<'a>(
        others: impl IntoIterator<Item = (&'a str, &'a str)>,
        own: &dyn Fn(&str) -> bool,
    ) -> Self {
        let mut alternatives: Vec<String> = Vec::new();
        for (server, tool) in others {
            alternatives.push(regex::escape(&format!("{server}__{tool}")));
            if !own(tool) && distinctive(tool) {
                alternatives.push(regex::escape(tool));
            }
        }
        if alternatives.is_empty() {
            return Self { pattern: None };
        }
        alternatives.sort();
        alternatives.dedup();
        // Longest first, so `gmail__send_email` wins over `send_email`.
        alternatives.sort_by_key(|a| std::cmp::Reverse(a.len()));
        let source = format!(r"(?:^|[^\w-])({})(?:$|[^\w-])", alternatives.join("|"));
        let pattern = RegexBuilder::new(&source).size_limit(8 << 20).build().ok();
        Self { pattern }
    }
}

fn distinctive(name: &str) -> bool {
    let inner_capital = name
        .char_indices()
        .any(|(i, c)| i > 0 && c.is_ascii_uppercase());
    name.chars().count() >= 4
        && (name.contains(['_', '-']) || name.chars().any(|c| c.is_ascii_digit()) || inner_capital)
}

struct Phrase {
    regex: Regex,
    label: &'static str,
}

/// ASCII word boundaries: the patterns are ASCII, and a Unicode `\b` keeps
/// the fast engines off non-ASCII text.
fn ascii_boundaries(source: &str) -> String {
    source.replace(r"\b", r"(?-u:\b)")
}

fn ci(source: &str) -> Regex {
    RegexBuilder::new(&ascii_boundaries(source))
        .case_insensitive(true)
        .build()
        .unwrap_or_else(|e| panic!("built-in pattern {source:?} must compile: {e}"))
}

const INSTRUCTION_SOURCES: &[(&str, &str)] = &[
    (
        r"<\s*/?\s*(important|system|instructions?|secret|hidden|admin|critical|note\s+to\s+(the\s+)?(ai|assistant|model))\b[^<>]{0,40}>",
        "an <IMPORTANT>-style tag",
    ),
    (
        r"\b(ignore|disregard|forget|override)\s+((all|any|the|your|of|these)\s+)*(previous|prior|above|earlier|preceding|system|other)\b",
        "\"ignore previous …\"",
    ),
    (
        r"\b(do\s+not|don'?t|never|must\s+not)\s+(tell|inform|notify|mention|reveal|show|alert|disclose)\b[^.!?\n]{0,40}\buser",
        "\"do not tell the user\"",
    ),
    (
        r"\b(without|before)\s+(telling|informing|notifying|alerting|asking)\s+the\s+user\b",
        "\"without telling the user\"",
    ),
    (
        r"\b(hide|conceal|keep)\s+(this|it|that)\s+(from\s+the\s+user|secret|hidden)\b",
        "\"hide this from the user\"",
    ),
    (
        r"\b(before|after)\s+(using|calling|invoking)\s+(this|any|the)\s+(tool|function)\b",
        "\"before using this tool …\"",
    ),
    (
        r"\balways\s+(bcc|cc|forward|send\s+(a\s+)?cop(y|ies))\b",
        "\"always BCC …\"",
    ),
    (
        r"\b(you\s+are\s+now|new\s+instructions?:|system\s+prompt)\b",
        "a role or prompt override",
    ),
];

const SECRET_FILE_SOURCE: &str = concat!(
    r"(\.ssh\b|\bid_(rsa|dsa|ecdsa|ed25519)\b|(^|[\s/~'`(])\.env(\.[a-z]+)?\b|\bmcp\.json\b",
    r"|\.aws/credentials\b|\.netrc\b|\.npmrc\b|\.pypirc\b|\.pgpass\b|/etc/(passwd|shadow)\b",
    r"|\.git-credentials\b|\.kube/config\b|\.docker/config\.json\b|\bcredentials\.json\b",
    r"|\.gnupg\b|\bwallet\.dat\b|\.config/gh/hosts\.yml\b)"
);

const URL_SOURCE: &str =
    r#"\b((https?|ftp|wss?|file)://[^\s"'<>]+|(javascript|data):[^\s"'<>]{3,})"#;

/// One pass over a string says whether any check can match: the common,
/// clean string costs one automaton walk.
static ANY: LazyLock<RegexSet> = LazyLock::new(|| {
    let sources: Vec<String> = INSTRUCTION_SOURCES
        .iter()
        .map(|(s, _)| *s)
        .chain([SECRET_FILE_SOURCE, URL_SOURCE])
        .map(ascii_boundaries)
        .collect();
    RegexSetBuilder::new(sources)
        .case_insensitive(true)
        .build()
        .unwrap_or_else(|e| panic!("built-in patterns must compile: {e}"))
});

static INSTRUCTIONS: LazyLock<Vec<Phrase>> = LazyLock::new(|| {
    INSTRUCTION_SOURCES
        .iter()
        .map(|(source, label)| Phrase {
            regex: ci(source),
            label,
        })
        .collect()
});

static SECRET_FILE: LazyLock<Regex> = LazyLock::new(|| ci(SECRET_FILE_SOURCE));

static URL: LazyLock<Regex> = LazyLock::new(|| ci(URL_SOURCE));

/// Scans a whole tool definition.
pub(crate) fn tool(definition: &Value, others: &OtherTools) -> Vec<Finding> {
    let mut out = Vec::new();
    walk(definition, &mut String::new(), others, &mut out);
    out.sort_by(|a, b| (a.kind, &a.path).cmp(&(b.kind, &b.path)));
    out.dedup_by(|a, b| a.kind == b.kind && a.path == b.path);
    out
}

/// Scans a server's instructions.
pub(crate) fn instructions(text: &str, others: &OtherTools) -> Vec<Finding> {
    let mut out = Vec::new();
    text_findings(text, "/instructions", Field::Text, others, &mut out);
    out
}

fn walk(value: &Value, path: &mut String, others: &OtherTools, out: &mut Vec<Finding>) {
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
enum Field {
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

fn text_findings(
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
    let text = visible.as_ref();
    if ANY.is_match(text) {
        detailed(text, field, &mut add);
    }
    if field != Field::Name
        && let Some(pattern) = &others.pattern
        && let Some(c) = pattern.captures(text)
        && let Some(m) = c.get(1)
    {
        add(Kind::OtherServerTool, excerpt(m.as_str()));
    }
}

/// The checks one by one, once the set said one of them matches.
fn detailed(text: &str, field: Field, add: &mut dyn FnMut(Kind, String)) {
    for phrase in INSTRUCTIONS.iter() {
        if let Some(m) = phrase.regex.find(text) {
            add(
                Kind::Instruction,
                format!("{}: {}", phrase.label, excerpt(m.as_str())),
            );
            break;
        }
    }
    if let Some(m) = SECRET_FILE.find(text) {
        add(Kind::SecretFile, excerpt(m.as_str().trim_start()));
    }
    if field != Field::Link
        && field != Field::Name
        && let Some(m) = URL.find(text)
    {
        add(Kind::Url, excerpt(m.as_str()));
    }
}

/// True for invisible and control characters (shown escaped to people).
pub(crate) fn is_hidden(c: char) -> bool {
    hidden_class(c).is_some()
}

/// The class of an invisible or control character, if it is one.
fn hidden_class(c: char) -> Option<&'static str> {
    Some(match c as u32 {
        0xE0000..=0xE007F => "Unicode tag characters",
        0x202A..=0x202E | 0x2066..=0x2069 => "bidi controls",
        0x200B | 0x2060..=0x2064 | 0xFEFF | 0x180E | 0x00AD | 0x034F => "zero-width characters",
        0x115F | 0x1160 | 0x3164 | 0xFFA0 => "invisible filler letters",
        0xFE00..=0xFE0F | 0xE0100..=0xE01EF => "variation selectors",
        0x00..=0x08 | 0x0B | 0x0C | 0x0E..=0x1F | 0x7F..=0x9F => "control characters",
        _ => return None,
    })
}

/// Describes the hidden characters of `text`, or `None` when it has none
/// (a real subdivision flag, one variation selector after a visible character,
/// `\t \n \r`, ZWJ and ZWNJ are not hidden).
fn hidden(text: &str) -> Option<String> {
    if text.is_ascii()
        && !text
            .bytes()
            .any(|b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r') || b == 0x7f)
    {
        return None;
    }
    let chars: Vec<char> = text.chars().collect();
    let mut classes: Vec<&'static str> = Vec::new();
    let mut smuggled = String::new();
    let mut i = 0;
    while i < chars.len() {
        if let Some(len) = flag_sequence(&chars[i..]) {
            i += len;
            continue;
        }
        let c = chars[i];
        if let Some(class) = hidden_class(c) {
            let lone_selector = class == "variation selectors"
                && i > 0
                && hidden_class(chars[i - 1]).is_none()
                && chars
                    .get(i + 1)
                    .is_none_or(|n| hidden_class(*n) != Some(class));
            if !lone_selector {
                if !classes.contains(&class) {
                    classes.push(class);
                }
                if let 0xE0020..=0xE007E = c as u32 {
                    smuggled.push(char::from((c as u32 - 0xE0000) as u8));
                }
            }
        }
        i += 1;
    }
    if classes.is_empty() {
        return None;
    }
    let mut detail = classes.join(", ");
    if !smuggled.is_empty() {
        detail.push_str(&format!("; the tags spell {}", excerpt(&smuggled)));
    }
    Some(detail)
}

/// Length of a subdivision flag (U+1F3F4, 2–6 tag letters or digits, U+E007F) at the start.
fn flag_sequence(chars: &[char]) -> Option<usize> {
    if chars.first() != Some(&'\u{1F3F4}') {
        return None;
    }
    let tags = chars[1..]
        .iter()
        .take_while(|c| matches!(**c as u32, 0xE0030..=0xE0039 | 0xE0061..=0xE007A))
        .count();
    ((2..=6).contains(&tags) && chars.get(1 + tags) == Some(&'\u{E007F}')).then_some(tags + 2)
}

/// `text` with hidden characters removed and tag characters read as the ASCII
/// they encode, so "ig\u{200b}nore previous" is still seen.
fn without_hidden(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| hidden_class(c).is_some()) {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars()
        .filter_map(|c| match c as u32 {
            0xE0020..=0xE007E => Some(char::from((c as u32 - 0xE0000) as u8)),
            _ if hidden_class(c).is_some() => None,
            _ => Some(c),
        })
        .collect::<String>()
        .into()
}

/// A short, escaped quote of `text` for operators.
pub(crate) fn excerpt(text: &str) -> String {
    let mut out = String::from("\"");
    for (n, c) in text.chars().enumerate() {
        if n == EXCERPT_CHARS {
            out.push('…');
            break;
        }
        if hidden_class(c).is_some() || c == '"' || c == '\\' || c == '\n' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
