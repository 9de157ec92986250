//! Hidden characters and look-alike letters: Unicode tags, bidi controls,
//! zero-width and control characters, and letters of another script inside
//! Latin words; and the escaped excerpt a finding quotes.
//!
//! Place: one of the checks of each string, and the reading every other
//! check does of the text, look-alikes folded.
//!
//! Invariants: a real subdivision flag is not hidden text; an excerpt is
//! escaped so that nothing hidden stays hidden, and cut at [`EXCERPT_CHARS`].

/// Longest excerpt of the offending text kept in a finding's detail.
const EXCERPT_CHARS: usize = 80;

/// `text` with look-alike letters read as the Latin letters they imitate,
/// and the first word that mixes them with Latin letters.
pub(super) struct Folded {
    pub(super) text: String,
    /// (the word as written, the word as it reads).
    pub(super) mixed: Option<(String, String)>,
}

/// Signs whose look-alike reading is their ordinary use (units, symbols).
fn is_symbol(c: char) -> bool {
    matches!(c, 'µ' | 'μ' | 'Ω' | 'Å' | '°' | '×' | '·' | '–' | '—' | '…')
}

/// Reads each non-ASCII letter through the UTS #39 confusable skeleton: when
/// the skeleton of its lower case is one ASCII letter or digit, that letter
/// stands for it. `None` when nothing changed.
pub(super) fn fold_confusables(text: &str) -> Option<Folded> {
    if text.is_ascii() {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    let mut mixed = None;
    // The current word: as written, as read, and what it is made of.
    let (mut word, mut read) = (String::new(), String::new());
    let (mut has_ascii, mut has_folded) = (false, false);
    let flush = |word: &mut String,
                 read: &mut String,
                 has_ascii: &mut bool,
                 has_folded: &mut bool,
                 mixed: &mut Option<(String, String)>| {
        if *has_ascii && *has_folded && mixed.is_none() {
            *mixed = Some((std::mem::take(word), std::mem::take(read)));
        }
        word.clear();
        read.clear();
        *has_ascii = false;
        *has_folded = false;
    };
    for c in text.chars() {
        if !c.is_alphanumeric() {
            flush(
                &mut word,
                &mut read,
                &mut has_ascii,
                &mut has_folded,
                &mut mixed,
            );
            out.push(c);
            continue;
        }
        let folded = (!c.is_ascii() && !is_symbol(c))
            .then(|| latin_look_alike(c))
            .flatten();
        word.push(c);
        match folded {
            Some(a) => {
                changed = true;
                has_folded = true;
                out.push(a);
                read.push(a);
            }
            None => {
                has_ascii |= c.is_ascii_alphabetic();
                out.push(c);
                read.push(c);
            }
        }
    }
    flush(
        &mut word,
        &mut read,
        &mut has_ascii,
        &mut has_folded,
        &mut mixed,
    );
    changed.then_some(Folded { text: out, mixed })
}

/// The ASCII letter or digit `c` imitates, by the skeleton of its lower case.
fn latin_look_alike(c: char) -> Option<char> {
    let mut lower = c.to_lowercase();
    let (Some(l), None) = (lower.next(), lower.next()) else {
        return None;
    };
    let mut buf = [0u8; 4];
    let mut skeleton = unicode_security::skeleton(l.encode_utf8(&mut buf));
    match (skeleton.next(), skeleton.next()) {
        (Some(a), None) if a.is_ascii_alphanumeric() => Some(a.to_ascii_lowercase()),
        _ => None,
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
pub(super) fn hidden(text: &str) -> Option<String> {
    if text.is_ascii() && !ascii_control(text.as_bytes()) {
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

/// Whether `text` has a character of a [`hidden_class`]. ASCII text is read
/// byte by byte (its only hidden characters are the controls other than
/// tab, line feed and carriage return), which is several times faster than
/// classifying each character.
pub(super) fn has_hidden(text: &str) -> bool {
    if text.is_ascii() {
        return ascii_control(text.as_bytes());
    }
    text.chars().any(|c| hidden_class(c).is_some())
}

/// Whether ASCII `bytes` hold a control other than tab, line feed and
/// carriage return (the only hidden characters ASCII has). Folded over
/// 64-byte blocks without an early exit inside a block, so the compiler
/// vectorises it: a long clean text costs a fraction of a cycle a byte.
fn ascii_control(bytes: &[u8]) -> bool {
    bytes.chunks(64).any(|block| {
        block.iter().fold(false, |found, &b| {
            found | ((b < 0x20) & (b != b'\t') & (b != b'\n') & (b != b'\r')) | (b == 0x7f)
        })
    })
}

/// `text` with hidden characters removed and tag characters read as the ASCII
/// they encode, so "ig\u{200b}nore previous" is still seen.
pub(super) fn without_hidden(text: &str) -> std::borrow::Cow<'_, str> {
    if !has_hidden(text) {
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
