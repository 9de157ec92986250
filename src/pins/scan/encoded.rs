//! Encoded payloads: base64, hex and percent-encoded runs decoded and
//! checked like any other text.
//!
//! Place: one of the checks of each string.
//! Invariants: bounded: at most [`MAX_ENCODED_BYTES`] of a run are decoded,
//! and at most [`MAX_ENCODING_DEPTH`] encodings deep; a run is flagged only
//! when what it decodes to is.

use std::sync::LazyLock;

use regex::Regex;

use super::hidden::excerpt;
use super::patterns::phrase_labels;

/// Runs of characters an encoded payload is written in: base64 (standard and
/// URL-safe), hex, and percent-encoding.
pub(super) static ENCODED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[A-Za-z0-9+/_-]{24,}={0,2}|(?:%[0-9A-Fa-f]{2}){8,}|(?:\\x[0-9A-Fa-f]{2}){8,}")
        .unwrap_or_else(|e| panic!("built-in pattern must compile: {e}"))
});

/// Longest encoded run decoded, and how deep encodings are unwrapped.
const MAX_ENCODED_BYTES: usize = 16 * 1024;

const MAX_ENCODING_DEPTH: usize = 2;

/// A finding's detail when a base64, hex or percent-encoded run of `text`
/// decodes to readable text that the phrase checks flag (or that is itself
/// encoded again).
pub(super) fn encoded_payload(text: &str, depth: usize) -> Option<String> {
    if depth >= MAX_ENCODING_DEPTH || text.len() < 16 || !may_hold_encoded(text) {
        return None;
    }
    for m in ENCODED.find_iter(text).take(32) {
        let run = m.as_str();
        if run.len() > MAX_ENCODED_BYTES {
            continue;
        }
        let Some((encoding, decoded)) = decode_run(run) else {
            continue;
        };
        let labels = phrase_labels(&decoded);
        if !labels.is_empty() {
            return Some(format!(
                "{encoding} that decodes to {}: {}",
                excerpt(&decoded),
                labels.join(", ")
            ));
        }
        if let Some(inner) = encoded_payload(&decoded, depth + 1) {
            return Some(format!("{encoding} wrapping {inner}"));
        }
    }
    None
}

/// The bytes an encoded run is written in (base64, URL-safe base64, hex).
const fn run_bytes() -> [bool; 256] {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'_' | b'-');
        b += 1;
    }
    table
}

static RUN_BYTE: [bool; 256] = run_bytes();

/// Shortest run of [`RUN_BYTE`]s [`ENCODED`] matches.
const MIN_RUN: usize = 24;

/// Whether [`ENCODED`] can match in `text`: a run of 24 base64 characters, a
/// `%` or a backslash must be there. One vectorised search for `%` and a backslash,
/// then a walk over 8-byte blocks: a run of 24 holds two whole blocks in a
/// row (counted from the start of `text`), so only where two neighbouring
/// blocks are all run bytes is the run measured. Most prose, which has none
/// of them, is spared the regex (a result of 100 KB is scanned whole).
pub(super) fn may_hold_encoded(text: &str) -> bool {
    let bytes = text.as_bytes();
    if memchr::memchr2(b'%', b'\\', bytes).is_some() {
        return true;
    }
    let mut previous_full = false;
    for (k, block) in bytes.chunks_exact(8).enumerate() {
        let full = block.iter().all(|&b| RUN_BYTE[usize::from(b)]);
        if full && previous_full {
            let mut start = (k - 1) * 8;
            while start > 0 && RUN_BYTE[usize::from(bytes[start - 1])] {
                start -= 1;
            }
            let mut end = (k + 1) * 8;
            while end < bytes.len() && RUN_BYTE[usize::from(bytes[end])] {
                end += 1;
            }
            if end - start >= MIN_RUN {
                return true;
            }
        }
        previous_full = full;
    }
    false
}

/// Decodes one encoded run into readable text, or `None` when it does not
/// decode to text (a hash, a key, random bytes, a plain identifier).
fn decode_run(run: &str) -> Option<(&'static str, String)> {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let bytes = if let Some(hex) = run.strip_prefix("\\x") {
        (
            "hex",
            hex.split("\\x")
                .map(|h| u8::from_str_radix(h, 16).ok())
                .collect::<Option<Vec<u8>>>()?,
        )
    } else if run.starts_with('%') {
        (
            "percent-encoding",
            run.split('%')
                .skip(1)
                .map(|h| u8::from_str_radix(h, 16).ok())
                .collect::<Option<Vec<u8>>>()?,
        )
    } else if run.len().is_multiple_of(2) && run.bytes().all(|b| b.is_ascii_hexdigit()) {
        ("hex", hex::decode(run).ok()?)
    } else {
        let decoded = [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
            .iter()
            .find_map(|engine| engine.decode(run).ok())?;
        ("base64", decoded)
    };
    let (encoding, bytes) = bytes;
    let text = String::from_utf8(bytes).ok()?;
    let readable = text
        .chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\t' | '\r'))
        .count();
    (readable * 10 >= text.chars().count() * 9).then_some((encoding, text))
}
