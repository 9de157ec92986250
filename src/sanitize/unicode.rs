//! Invisible and deceptive Unicode: which characters are judged, and the
//! context rules that keep the legitimate ones.
//!
//! Place in the path: consulted by the character pass in [`super::strip`] for
//! each non-ASCII character.
//!
//! Invariants: a decision depends only on the character, the last character
//! already kept and the next character of the input, so the pass is
//! idempotent; the characters kept in context are exactly those real text
//! needs: ZWJ inside emoji and Indic words, ZWNJ in Persian and Indic words,
//! one variation selector after a base character, RGI subdivision flags. A
//! BOM is removed wherever it is, at the start of a text too: the start of a
//! value is not the start of a file, and quoted into another text it would be
//! invisible there. Bidi marks (LRM, RLM, ALM) are never touched.

/// Black flag, the base of subdivision-flag tag sequences.
pub(super) const BLACK_FLAG: char = '\u{1F3F4}';

/// The RGI subdivision flags' tag sequences (England, Scotland, Wales), each
/// ending with CANCEL TAG.
const RGI_FLAG_TAGS: [&str; 3] = [
    "\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}",
    "\u{E0067}\u{E0062}\u{E0073}\u{E0063}\u{E0074}\u{E007F}",
    "\u{E0067}\u{E0062}\u{E0077}\u{E006C}\u{E0073}\u{E007F}",
];

/// How a non-ASCII character is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// Not invisible: always kept.
    Visible,
    /// Always removed.
    Strip,
    /// ZERO WIDTH JOINER.
    Zwj,
    /// ZERO WIDTH NON-JOINER.
    Zwnj,
    /// A variation selector (VS1–VS16).
    Variation,
    /// An ideographic variation selector (VS17–VS256).
    IdeographicVariation,
    /// A tag character (U+E0000–E007F).
    Tag,
    /// BYTE ORDER MARK / ZERO WIDTH NO-BREAK SPACE.
    Bom,
}

/// Classifies `c`.
pub(super) fn class(c: char) -> Class {
    match c {
        '\u{200B}'                      // zero width space
        | '\u{2060}'..='\u{2064}'       // word joiner, invisible operators
        | '\u{180E}'                    // Mongolian vowel separator
        | '\u{202A}'..='\u{202E}'       // bidi embeddings and overrides
        | '\u{2066}'..='\u{2069}'       // bidi isolates
        | '\u{206A}'..='\u{206F}'       // deprecated format characters
        | '\u{00AD}'                    // soft hyphen
        | '\u{034F}'                    // combining grapheme joiner
        | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' // Hangul fillers
        | '\u{FFF9}'..='\u{FFFB}'       // interlinear annotation
        | '\u{1D173}'..='\u{1D17A}' => Class::Strip, // musical formatting
        '\u{200D}' => Class::Zwj,
        '\u{200C}' => Class::Zwnj,
        '\u{FE00}'..='\u{FE0F}' => Class::Variation,
        '\u{E0100}'..='\u{E01EF}' => Class::IdeographicVariation,
        '\u{E0000}'..='\u{E007F}' => Class::Tag,
        '\u{FEFF}' => Class::Bom,
        _ => Class::Visible,
    }
}

/// True when `c` may need the slow path (a control or an invisible character).
#[inline]
pub(super) fn needs_judging(c: char) -> bool {
    ('\u{80}'..='\u{9f}').contains(&c) || class(c) != Class::Visible
}

/// Decides whether a character of class `class` is kept, given the last kept
/// character (`None` at the start of the output) and the next input character.
pub(super) fn keep(class: Class, prev: Option<char>, next: Option<char>) -> bool {
    match class {
        Class::Visible => true,
        Class::Strip | Class::Tag => false,
        Class::Bom => false,
        Class::Zwj => match (prev, next) {
            (Some(p), Some(n)) => {
                (emoji_before_joiner(p) && is_emoji(n)) || (is_script(p) && is_script(n))
            }
            _ => false,
        },
        Class::Zwnj => matches!((prev, next), (Some(p), Some(n)) if is_script(p) && is_script(n)),
        Class::Variation => prev.is_some_and(|p| {
            !p.is_whitespace()
                && !p.is_ascii_alphabetic()
                && !p.is_control()
                && !is_selector_or_joiner(p)
        }),
        Class::IdeographicVariation => prev.is_some_and(is_ideograph),
    }
}

/// When `prev` is the black flag and `rest` starts with an RGI subdivision
/// tag sequence, its length in bytes.
pub(super) fn flag_tags(prev: Option<char>, rest: &str) -> Option<usize> {
    if prev != Some(BLACK_FLAG) {
        return None;
    }
    RGI_FLAG_TAGS
        .iter()
        .find(|tags| rest.starts_with(*tags))
        .map(|tags| tags.len())
}

fn is_selector_or_joiner(c: char) -> bool {
    matches!(
        class(c),
        Class::Variation
            | Class::IdeographicVariation
            | Class::Zwj
            | Class::Zwnj
            | Class::Tag
            | Class::Bom
    )
}

/// Pictographs and the symbols emoji are built from (an approximation of
/// Extended_Pictographic that errs towards keeping joiners between them).
fn is_emoji(c: char) -> bool {
    class(c) == Class::Visible
        && matches!(c,
        '\u{1F000}'..='\u{1FAFF}'
        | '\u{2600}'..='\u{27BF}'
        | '\u{2300}'..='\u{23FF}'
        | '\u{2B00}'..='\u{2BFF}'
        | '\u{2190}'..='\u{21FF}'
        | '\u{3030}' | '\u{303D}' | '\u{3297}' | '\u{3299}'
        | '\u{00A9}' | '\u{00AE}' | '\u{203C}' | '\u{2049}' | '\u{2122}' | '\u{2139}')
}

/// What may stand before a ZWJ in an emoji sequence: an emoji, a skin-tone
/// modifier (inside the emoji block), VS16, or a keycap mark.
fn emoji_before_joiner(c: char) -> bool {
    is_emoji(c) || c == '\u{FE0F}' || c == '\u{20E3}'
}

/// Letters, digits and combining marks of scripts other than ASCII, where ZWJ
/// and ZWNJ shape words (Persian, Arabic, Devanagari and other Indic scripts).
fn is_script(c: char) -> bool {
    !c.is_ascii()
        && class(c) == Class::Visible
        && (c.is_alphanumeric()
            || matches!(c,
                '\u{0300}'..='\u{036F}'     // combining diacritics
                | '\u{0483}'..='\u{0489}'
                | '\u{0591}'..='\u{05C7}'   // Hebrew points
                | '\u{0610}'..='\u{061A}'   // Arabic marks
                | '\u{064B}'..='\u{065F}'
                | '\u{0670}'
                | '\u{06D6}'..='\u{06ED}'
                | '\u{0900}'..='\u{0DFF}'   // Indic blocks, signs and viramas included
                | '\u{0E00}'..='\u{0FFF}'   // Thai, Lao, Tibetan
                | '\u{1000}'..='\u{109F}'   // Myanmar
                | '\u{1780}'..='\u{17FF}'   // Khmer
                | '\u{A8E0}'..='\u{A8FF}'))
}

/// CJK unified ideographs (the bases of ideographic variation sequences).
fn is_ideograph(c: char) -> bool {
    matches!(c,
        '\u{3400}'..='\u{4DBF}'
        | '\u{4E00}'..='\u{9FFF}'
        | '\u{F900}'..='\u{FAFF}'
        | '\u{20000}'..='\u{3FFFF}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class('\u{200B}'), Class::Strip);
        assert_eq!(class('\u{202E}'), Class::Strip);
        assert_eq!(class('\u{2067}'), Class::Strip);
        assert_eq!(class('\u{200E}'), Class::Visible);
        assert_eq!(class('\u{200F}'), Class::Visible);
        assert_eq!(class('\u{061C}'), Class::Visible);
        assert_eq!(class('\u{E0041}'), Class::Tag);
        assert_eq!(class('é'), Class::Visible);
    }

    #[test]
    fn joiners_need_context() {
        assert!(keep(Class::Zwj, Some('👨'), Some('👩')));
        assert!(keep(Class::Zwj, Some('\u{FE0F}'), Some('⚧')));
        assert!(!keep(Class::Zwj, Some('a'), Some('b')));
        assert!(!keep(Class::Zwj, None, Some('👩')));
        assert!(keep(Class::Zwnj, Some('ی'), Some('ش')));
        assert!(!keep(Class::Zwnj, Some('a'), Some('ش')));
        assert!(keep(Class::Zwj, Some('\u{094D}'), Some('ष')));
    }

    #[test]
    fn selectors_need_a_base() {
        assert!(keep(Class::Variation, Some('❤'), None));
        assert!(keep(Class::Variation, Some('1'), Some('\u{20E3}')));
        assert!(!keep(Class::Variation, Some('\u{FE0F}'), None));
        assert!(!keep(Class::Variation, Some('a'), None));
        assert!(!keep(Class::Variation, None, None));
        assert!(keep(Class::IdeographicVariation, Some('葛'), None));
        assert!(!keep(Class::IdeographicVariation, Some('x'), None));
    }

    #[test]
    fn only_rgi_flags_keep_tags() {
        let england = RGI_FLAG_TAGS[0];
        assert_eq!(flag_tags(Some(BLACK_FLAG), england), Some(england.len()));
        assert_eq!(flag_tags(Some('x'), england), None);
        // "usca" is a valid subdivision code, but not RGI.
        assert_eq!(
            flag_tags(
                Some(BLACK_FLAG),
                "\u{E0075}\u{E0073}\u{E0063}\u{E0061}\u{E007F}"
            ),
            None
        );
    }
}
