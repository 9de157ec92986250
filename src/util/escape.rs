//! Escaping text that others chose before it reaches a person's terminal or
//! a log line: every character that is not plainly visible is written as a
//! visible escape, so a tool name, a header or a server's description can
//! neither drive the terminal (ESC, CSI, OSC, C1) nor start a line of its own
//! (LF, CR, NEL, LS, PS), nor hide or reorder what is shown (zero-width,
//! bidi, tag characters).
//!
//! Place in the path: a leaf, used by the CLI's output, the log writer and
//! the pin listing.
//!
//! Invariants: a plain character is written as itself and nothing else is;
//! [`escaped`] is injective (the backslash is escaped too) and its result is
//! one line of plain characters, and so is [`log_line`]'s; [`escaped_lines`] keeps LF, the lines of the
//! program's own output; [`json_escaped`] turns a serialized JSON text into
//! the same JSON value with no character that is not plain but LF.

use std::borrow::Cow;
use std::fmt::Write as _;

use unicode_general_category::{GeneralCategory, get_general_category};

/// Whether `c` is shown as itself: neither a control (C0, DEL, C1), nor
/// whitespace other than the ASCII space (tab, line and paragraph
/// separators, no-break and other spaces that pass for one), nor a format
/// character (bidi controls, zero-width characters, tags), nor private use,
/// unassigned or a non-character, nor one of the fillers and selectors that
/// are letters or symbols by category but show nothing. The one answer for
/// every place that shows others' text to a person: this module's escapes
/// and the approval question ([`crate::approval::render`]).
pub fn is_plain(c: char) -> bool {
    if c.is_ascii() {
        return matches!(c, ' '..='~');
    }
    if noncharacter(c) || blank(c) {
        return false;
    }
    !matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
            | GeneralCategory::SpaceSeparator
            | GeneralCategory::PrivateUse
            | GeneralCategory::Surrogate
            | GeneralCategory::Unassigned
    )
}

/// Characters that show nothing, or change how their neighbours are shown,
/// though their category calls them letters, marks or symbols.
fn blank(c: char) -> bool {
    matches!(c,
        '\u{034F}'                     // combining grapheme joiner
        | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' // Hangul fillers
        | '\u{17B4}' | '\u{17B5}'       // Khmer inherent vowels
        | '\u{180B}'..='\u{180F}'       // Mongolian selectors and separator
        | '\u{2800}'                    // braille blank
        | '\u{FE00}'..='\u{FE0F}'       // variation selectors
        | '\u{FFFC}' | '\u{FFFD}'       // object and replacement characters
        | '\u{1D159}'                   // musical null notehead
        | '\u{1D173}'..='\u{1D17A}'     // musical formatting
        | '\u{E0100}'..='\u{E01EF}' // variation selectors supplement
    )
}

/// The 66 non-characters: U+FDD0–FDEF and the last two of every plane.
fn noncharacter(c: char) -> bool {
    matches!(c, '\u{FDD0}'..='\u{FDEF}') || (c as u32) & 0xFFFE == 0xFFFE
}

/// `text` as one line of plain characters: `\n`, `\r`, `\t` and `\\` as
/// such, every other character that is not plain as `\u{…}` (hex code point).
pub fn escaped(text: &str) -> Cow<'_, str> {
    if text.chars().all(|c| is_plain(c) && c != '\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if is_plain(c) => out.push(c),
            c => push_escape(&mut out, c),
        }
    }
    Cow::Owned(out)
}

/// The program's own lines: LF kept, every other character that is not
/// plain as `\u{…}` (`\r`, `\t` as such). Fields chosen by others within the
/// lines are escaped with [`escaped`] first; this pass is the net under them.
pub fn escaped_lines(text: &str) -> Cow<'_, str> {
    if text.chars().all(|c| c == '\n' || is_plain(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c == '\n' || is_plain(c) {
            out.push(c);
        } else {
            push_escape(&mut out, c);
        }
    }
    Cow::Owned(out)
}

/// A serialized JSON text with every character that is not plain but LF
/// written `\uXXXX` (a surrogate pair above U+FFFF). A serializer leaves
/// such characters raw only inside strings, where the escape means the same
/// character, and writes LF raw only between tokens: the JSON value is the
/// same, its text is safe on a terminal and in a log.
pub fn json_escaped(json: &str) -> Cow<'_, str> {
    if json.chars().all(|c| c == '\n' || is_plain(c)) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    let mut units = [0u16; 2];
    for c in json.chars() {
        if c == '\n' || is_plain(c) {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    Cow::Owned(out)
}

/// One log line as a formatter wrote it (without its final LF): every
/// character that is not plain, LF included, escaped; as `\uXXXX` when the
/// line is JSON (the same JSON value), else as in [`escaped`]. A backslash
/// is left as written: the formatter's own quoting stays readable.
pub fn log_line(line: &str, json: bool) -> Cow<'_, str> {
    if line.chars().all(is_plain) {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len() + 8);
    let mut units = [0u16; 2];
    for c in line.chars() {
        if is_plain(c) {
            out.push(c);
        } else if json {
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            push_escape(&mut out, c);
        }
    }
    Cow::Owned(out)
}

fn push_escape(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn controls_and_invisibles_are_spelled_out() {
        assert_eq!(escaped("calc"), "calc");
        assert_eq!(escaped("a\u{1b}]0;x\u{7}\nb"), r"a\u{1b}]0;x\u{7}\nb");
        assert_eq!(escaped("a\\nb"), r"a\\nb");
        assert_eq!(escaped("é 中 😀"), "é 中 😀");
        assert_eq!(
            escaped("a\u{200b}\u{202e}\u{e0041}\u{85}\u{a0}"),
            r"a\u{200b}\u{202e}\u{e0041}\u{85}\u{a0}"
        );
        assert_eq!(
            escaped_lines("one\ntwo\u{9b}2J\r\n"),
            "one\ntwo\\u{9b}2J\\r\n"
        );
        assert_eq!(
            json_escaped("{\"a\": \"\u{9b}\u{e0041}\"}\n"),
            "{\"a\": \"\\u009b\\udb40\\udc41\"}\n"
        );
        assert_eq!(
            log_line("m=a\\b\nFORGED\u{85}", false),
            r"m=a\b\nFORGED\u{85}"
        );
        assert_eq!(log_line("{\"m\":\"\u{2028}\"}", true), r#"{"m":"\u2028"}"#);
    }

    proptest! {
        #[test]
        fn escaped_is_one_plain_line(a in "\\PC{0,20}|[\\x00-\\x{ffff}]{0,20}|[\\x{e0000}-\\x{e01ff}]{0,4}") {
            let ea = escaped(&a);
            prop_assert!(ea.chars().all(is_plain), "{:?}", ea);
        }

        /// Short texts over the characters an escape is made of, so that
        /// a text spelling an escape meets the character it stands for.
        #[test]
        fn escaped_is_injective(a in "[\\\\\\n\\x1bnu{}1b]{0,6}", b in "[\\\\\\n\\x1bnu{}1b]{0,6}") {
            prop_assert_eq!(escaped(&a) == escaped(&b), a == b);
        }

        #[test]
        fn json_escaped_is_the_same_value(s in "[\\x00-\\x{ffff}]{0,30}|\\PC{0,30}") {
            let text = serde_json::to_string_pretty(&serde_json::json!({"k": s, "l": [1, 2]})).expect("json");
            let safe = json_escaped(&text);
            prop_assert!(safe.chars().all(|c| c == '\n' || is_plain(c)));
            let back: serde_json::Value = serde_json::from_str(&safe).expect("still JSON");
            prop_assert_eq!(back["k"].as_str(), Some(s.as_str()));
        }
    }
}
