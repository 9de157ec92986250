//! Secret detectors: known credential formats (after gitleaks' rules), generic
//! `password=`-style assignments, and the operator's own patterns.
//!
//! Place in the path: the second step of [`super::Sanitizer::text`], after
//! terminal controls and invisible characters are gone (so a key split by a
//! zero-width space is found whole); also run over outgoing arguments.
//!
//! How: one Aho-Corasick pass finds the keywords every detector needs
//! (`AKIA`, `ghp_`, `-----BEGIN`, `password`, …); only the detectors whose
//! keywords occur run their (linear-time) regex. The keywords are matched
//! without regard to ASCII case by searching a copy of the text with its
//! ASCII letters lowered (same length, same offsets) for the lowercase
//! keywords (in a buffer kept per thread): a case-sensitive automaton keeps
//! its vectorised prefilter, which `ascii_case_insensitive` turns off, and
//! the pass over a long clean text runs several times faster
//! (BENCHMARKS.md, "Cost per byte"). A format is found wherever
//! its prefix is, even glued to other letters (`xREDAKIA…`): a word boundary
//! before it is not asked for, since hiding a key inside a longer word would
//! otherwise be enough to pass it. A generic assignment is read by hand from
//! the keyword on: the identifier must end with the keyword, then `:` or `=`,
//! then the value.
//!
//! Invariants: a finding never covers a `[REDACTED:…]` placeholder, so
//! redacting twice is redacting once; documentation examples (anything with
//! `EXAMPLE` in it, and a short list of published sample keys) are never
//! findings; a finding names its kind, never carries its value anywhere else.

use std::borrow::Cow;
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use regex::Regex;

mod lowered;

use lowered::with_lowered;

/// Start of every placeholder the sanitizer writes.
pub(super) const PLACEHOLDER: &str = "[REDACTED:";

/// Kind of a generic assignment finding.
pub(super) const GENERIC: &str = "generic-secret";

/// Sample credentials published in vendors' documentation.
const DOCUMENTED: &[&str] = &[
    "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
];

/// Values of assignments that are no secret.
const PLACEHOLDERS: &[&str] = &[
    "null",
    "none",
    "nil",
    "true",
    "false",
    "undefined",
    "required",
    "optional",
    "string",
    "str",
    "redacted",
    "hidden",
    "masked",
    "secret",
    "password",
    "changeme",
    "example",
    "your_password",
    "your-password",
    "yourpassword",
];

/// One detector of a known format.
struct Detector {
    kind: &'static str,
    keywords: &'static [&'static str],
    pattern: &'static str,
    /// The capture group that is the secret (0: the whole match).
    group: usize,
    /// Least Shannon entropy (bits per byte) of the secret.
    min_entropy: f64,
}

const DETECTORS: &[Detector] = &[
    Detector {
        kind: "aws-access-key-id",
        keywords: &["akia", "asia", "abia", "acca", "a3t"],
        pattern: r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "github-token",
        keywords: &["ghp_", "gho_", "ghu_", "ghs_", "ghr_"],
        pattern: r"gh[pousr]_[0-9A-Za-z]{36}",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "github-fine-grained-pat",
        keywords: &["github_pat_"],
        pattern: r"github_pat_[0-9A-Za-z_]{82}",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "gitlab-token",
        keywords: &["glpat-", "glptt-", "gldt-", "glrt-", "glsoat-"],
        pattern: r"gl(?:pat|ptt|dt|rt|soat)-[0-9A-Za-z_\-]{20,}",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "slack-token",
        keywords: &[
            "xoxa-", "xoxb-", "xoxe-", "xoxo-", "xoxp-", "xoxr-", "xoxs-",
        ],
        pattern: r"xox[abeoprs]-[0-9A-Za-z\-]{10,}",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "slack-app-token",
        keywords: &["xapp-"],
        pattern: r"(?i)xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "slack-webhook",
        keywords: &["hooks.slack.com"],
        pattern: r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/]{43,56}",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "stripe-key",
        keywords: &[
            "sk_test_", "sk_live_", "sk_prod_", "rk_test_", "rk_live_", "rk_prod_",
        ],
        // Glued to capitals or digits (`REDsk_live_…`), not to a lowercase
        // word (`task_live_…`, `risk_test_…` are words, not keys).
        pattern: r"(?:\b|[A-Z0-9])((?:sk|rk)_(?:test|live|prod)_[0-9A-Za-z]{10,99})",
        group: 1,
        min_entropy: 3.0,
    },
    Detector {
        kind: "anthropic-api-key",
        keywords: &["sk-ant-"],
        pattern: r"sk-ant-(?:api|admin|oat|sid)\d{2}-[A-Za-z0-9_\-]{20,}",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "openai-api-key",
        keywords: &["t3blbkfj"],
        pattern: r"sk-(?:(?:proj|svcacct|admin)-)?[A-Za-z0-9_\-]{20,}T3BlbkFJ[A-Za-z0-9_\-]{20,}",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "openai-api-key",
        keywords: &["sk-proj-", "sk-svcacct-", "sk-admin-"],
        pattern: r"(?:\b|[A-Z0-9])(sk-(?:proj|svcacct|admin)-[A-Za-z0-9_\-]{40,})",
        group: 1,
        min_entropy: 3.0,
    },
    Detector {
        kind: "google-api-key",
        keywords: &["aiza"],
        pattern: r"AIza[0-9A-Za-z_\-]{35}",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "private-key",
        keywords: &["-----begin"],
        pattern: r"(?i)-----BEGIN[ A-Z0-9_\-]{0,100}PRIVATE KEY(?: BLOCK)?-----(?:[\s\S]*?-----END[ A-Z0-9_\-]{0,100}PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=\s:,.\-]*)",
        group: 0,
        min_entropy: 0.0,
    },
    Detector {
        kind: "jwt",
        keywords: &["eyj"],
        // A JWT header is `{"…` in base64url: `eyJ`, which no word has.
        pattern: r"(?:\bey[A-Za-z0-9_\-]|eyJ)[A-Za-z0-9_\-]{16,}\.ey[A-Za-z0-9_\-]{17,}\.(?:[A-Za-z0-9_\-]{10,}={0,2})?",
        group: 0,
        min_entropy: 3.0,
    },
    Detector {
        kind: "bearer-token",
        keywords: &["bearer"],
        pattern: r"(?i)\bbearer\s+([A-Za-z0-9._~+/\-]{20,}=*)",
        group: 1,
        min_entropy: 3.0,
    },
    Detector {
        kind: "url-credentials",
        keywords: &["://"],
        pattern: r"(?i)\b[a-z][a-z0-9+.\-]{1,20}://[^\s/:@'\x22]{1,128}:([^\s/@'\x22]{1,128})@",
        group: 1,
        min_entropy: 0.0,
    },
];

/// How suspicious an assignment's key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strength {
    /// `password`, `secret`, …: any value that is not a placeholder.
    Strong,
    /// `token`, `api_key`, …: values that look random.
    Weak,
}

const STRONG_KEYWORDS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "private_key",
    "private-key",
];

const WEAK_KEYWORDS: &[&str] = &[
    "token",
    "apikey",
    "api_key",
    "api-key",
    "access_key",
    "access-key",
    "accesskey",
    "auth",
    "credential",
    "credentials",
];

/// Least entropy of a value assigned to a weak keyword.
const WEAK_MIN_ENTROPY: f64 = 3.0;
/// Least length of a value assigned to a weak keyword.
const WEAK_MIN_LEN: usize = 8;
/// Least length of a value assigned to a strong keyword.
const STRONG_MIN_LEN: usize = 3;
/// Longest value read after a keyword.
const MAX_VALUE: usize = 512;

/// A secret found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Finding {
    pub start: usize,
    pub end: usize,
    pub kind: Cow<'static, str>,
}

/// Who owns an Aho-Corasick keyword.
#[derive(Debug, Clone, Copy)]
enum Owner {
    Detector(usize),
    Generic(Strength),
}

struct Compiled {
    keywords: AhoCorasick,
    owners: Vec<Owner>,
    regexes: Vec<Regex>,
}

/// Every keyword, each with who owns it.
fn keywords() -> (Vec<&'static str>, Vec<Owner>) {
    let mut words: Vec<&str> = Vec::new();
    let mut owners = Vec::new();
    for (i, d) in DETECTORS.iter().enumerate() {
        for k in d.keywords {
            words.push(k);
            owners.push(Owner::Detector(i));
        }
    }
    for k in STRONG_KEYWORDS {
        words.push(k);
        owners.push(Owner::Generic(Strength::Strong));
    }
    for k in WEAK_KEYWORDS {
        words.push(k);
        owners.push(Owner::Generic(Strength::Weak));
    }
    (words, owners)
}

/// Builds the built-in detectors now: at load, so that the first text
/// scanned costs what every other one does.
pub(super) fn prepare() {
    let _ = compiled();
}

fn compiled() -> &'static Compiled {
    static COMPILED: OnceLock<Compiled> = OnceLock::new();
    COMPILED.get_or_init(|| {
        let (words, owners) = keywords();
        // Lowercase, since the text searched has its ASCII letters lowered.
        debug_assert!(
            words
                .iter()
                .all(|w| w.bytes().all(|b| !b.is_ascii_uppercase()))
        );
        #[allow(clippy::expect_used)]
        let keywords = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&words)
            .expect("the keyword list builds");
        #[allow(clippy::expect_used)]
        let regexes = DETECTORS
            .iter()
            .map(|d| Regex::new(d.pattern).expect("built-in detectors compile"))
            .collect();
        Compiled {
            keywords,
            owners,
            regexes,
        }
    })
}

/// Every secret in `text`: built-in detectors when `builtin`, then `patterns`.
/// Overlapping findings are merged into the earliest, longest one.
pub(super) fn find(text: &str, builtin: bool, patterns: &[(String, Regex)]) -> Vec<Finding> {
    let mut found = Vec::new();
    if builtin {
        let c = compiled();
        // On the stack: a text costs no allocation of its own before a keyword is found.
        let mut run = [false; DETECTORS.len()];
        with_lowered(text, |lowered| {
            for m in c.keywords.find_iter(lowered) {
                match c.owners[m.pattern().as_usize()] {
                    Owner::Detector(i) => run[i] = true,
                    Owner::Generic(strength) => {
                        if let Some((start, end)) = assignment(text, m.start(), m.end(), strength) {
                            found.push(Finding {
                                start,
                                end,
                                kind: Cow::Borrowed(GENERIC),
                            });
                        }
                    }
                }
            }
        });
        for (i, d) in DETECTORS.iter().enumerate().filter(|(i, _)| run[*i]) {
            for caps in c.regexes[i].captures_iter(text) {
                let Some(m) = caps.get(d.group) else { continue };
                let value = m.as_str();
                if documented(value) || entropy(value.as_bytes()) < d.min_entropy {
                    continue;
                }
                if d.kind == "url-credentials" && placeholder(value) {
                    continue;
                }
                found.push(Finding {
                    start: m.start(),
                    end: m.end(),
                    kind: Cow::Borrowed(d.kind),
                });
            }
        }
    }
    for (name, re) in patterns {
        for m in re.find_iter(text).filter(|m| !m.is_empty()) {
            found.push(Finding {
                start: m.start(),
                end: m.end(),
                kind: Cow::Owned(name.clone()),
            });
        }
    }
    if found.is_empty() {
        return found;
    }
    let placeholders = placeholder_spans(text);
    found.retain(|f| !placeholders.iter().any(|&(s, e)| f.start < e && s < f.end));
    found.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    let mut merged: Vec<Finding> = Vec::with_capacity(found.len());
    for f in found {
        match merged.last_mut() {
            Some(last) if f.start < last.end => last.end = last.end.max(f.end),
            _ => merged.push(f),
        }
    }
    merged
}

/// `text` with each finding replaced by `[REDACTED:<kind>]`.
pub(super) fn redact(text: &str, findings: &[Finding]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for f in findings {
        out.push_str(&text[at..f.start]);
        out.push_str(PLACEHOLDER);
        out.push_str(&f.kind);
        out.push(']');
        at = f.end;
    }
    out.push_str(&text[at..]);
    out
}

/// The placeholder for `kind`.
pub(super) fn placeholder_for(kind: &str) -> String {
    format!("{PLACEHOLDER}{kind}]")
}

/// When a JSON object key names a secret (`"password"`, `"db_token"`) and its
/// string value would be one, true.
pub(super) fn assigned(key: &str, value: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    let strength = if STRONG_KEYWORDS.iter().any(|k| lower.ends_with(k)) {
        Strength::Strong
    } else if WEAK_KEYWORDS.iter().any(|k| lower.ends_with(k)) {
        Strength::Weak
    } else {
        return false;
    };
    secret_value(value, strength)
}

/// The byte range of the value assigned to the keyword at `kw_start..kw_end`,
/// when that value reads as a secret.
fn assignment(
    text: &str,
    kw_start: usize,
    kw_end: usize,
    strength: Strength,
) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
    // The keyword must end the identifier (`token_count` is not a token) and,
    // for the short ones, start it or follow a separator (`cwd` is not `pwd`).
    if bytes.get(kw_end).is_some_and(|&b| ident(b)) {
        return None;
    }
    if kw_end - kw_start <= 4
        && kw_start > 0
        && bytes[kw_start - 1].is_ascii_alphanumeric()
        && !text[kw_start..kw_end].eq_ignore_ascii_case("auth")
    {
        return None;
    }
    let mut i = kw_end;
    if matches!(bytes.get(i), Some(b'"' | b'\'')) {
        i += 1;
    }
    i = skip_blanks(bytes, i);
    match bytes.get(i) {
        Some(b'=') => {
            i += 1;
            if matches!(bytes.get(i), Some(b'>' | b'=')) {
                i += 1;
            }
        }
        Some(b':') => {
            i += 1;
            if bytes.get(i) == Some(&b'=') {
                i += 1;
            }
        }
        _ => return None,
    }
    i = skip_blanks(bytes, i);
    let quote = match bytes.get(i) {
        Some(&q @ (b'"' | b'\'' | b'`')) => {
            i += 1;
            Some(q)
        }
        _ => None,
    };
    let start = i;
    while i < bytes.len() && i - start < MAX_VALUE {
        let b = bytes[i];
        let stop = match quote {
            Some(q) => b == q || b == b'\n' || b == b'\r',
            None => {
                b.is_ascii_whitespace()
                    || matches!(
                        b,
                        b'"' | b'\''
                            | b'`'
                            | b','
                            | b';'
                            | b'&'
                            | b'<'
                            | b'>'
                            | b'('
                            | b')'
                            | b'['
                            | b']'
                            | b'{'
                            | b'}'
                            | b'|'
                    )
            }
        };
        if stop {
            break;
        }
        i += 1;
    }
    // Never end inside a character.
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    let value = &text[start..i];
    secret_value(value, strength).then_some((start, i))
}

fn skip_blanks(bytes: &[u8], mut i: usize) -> usize {
    let limit = i + 4;
    while i < limit && matches!(bytes.get(i), Some(b' ' | b'\t')) {
        i += 1;
    }
    i
}

fn secret_value(value: &str, strength: Strength) -> bool {
    if placeholder(value) || documented(value) {
        return false;
    }
    match strength {
        Strength::Strong => value.len() >= STRONG_MIN_LEN,
        Strength::Weak => {
            value.len() >= WEAK_MIN_LEN && entropy(value.as_bytes()) >= WEAK_MIN_ENTROPY
        }
    }
}

/// Values that stand for a secret without being one.
fn placeholder(value: &str) -> bool {
    let v = value.trim();
    if v.is_empty() || v.starts_with(PLACEHOLDER) {
        return true;
    }
    let first = v.as_bytes()[0];
    if matches!(first, b'$' | b'<' | b'%' | b'{' | b'*') || v.starts_with("{{") {
        return true;
    }
    // One character repeated: `********`, `xxxxxxxx`, `....`.
    let mut chars = v.chars();
    if let Some(c) = chars.next()
        && chars.all(|d| d == c)
    {
        return true;
    }
    PLACEHOLDERS.iter().any(|p| v.eq_ignore_ascii_case(p))
}

/// Documentation examples: `AKIAIOSFODNN7EXAMPLE` and friends.
fn documented(value: &str) -> bool {
    value.contains("EXAMPLE") || DOCUMENTED.contains(&value)
}

/// Shannon entropy in bits per byte.
pub(super) fn entropy(bytes: &[u8]) -> f64 {
    if bytes.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let n = bytes.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

/// Byte ranges of `[REDACTED:…]` placeholders already in `text`.
fn placeholder_spans(text: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(PLACEHOLDER) {
        let start = from + at;
        let end = text[start..]
            .find(']')
            .map_or(text.len(), |e| start + e + 1);
        spans.push((start, end));
        from = end;
    }
    spans
}

#[cfg(test)]
mod tests;
