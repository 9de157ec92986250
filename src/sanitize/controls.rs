//! Terminal control sequences (ECMA-48): where one starts and where it ends.
//!
//! Place in the path: called by the character pass in [`super::strip`] at an
//! `ESC` or an 8-bit C1 introducer; answers how many bytes the whole sequence
//! spans, so the pass can drop it at once.
//!
//! Invariants: a sequence always spans at least its introducer; an
//! unterminated sequence runs to the end of the text (a terminal would swallow
//! that much too); a nested `ESC` ends a string sequence so that it is judged
//! on its own; nothing here allocates.

/// String terminator in its 8-bit form.
const ST: char = '\u{9c}';

/// True for the single characters the pass drops: C0 except tab, line feed and
/// carriage return (those are judged apart), DEL and the C1 range.
pub(super) fn is_control(c: char) -> bool {
    matches!(c, '\0'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// The end (byte index, exclusive) of the sequence introduced by the `ESC` at `at`.
pub(super) fn escape_end(text: &str, at: usize) -> usize {
    let start = at + 1;
    let mut chars = text[start..].char_indices();
    let Some((_, c)) = chars.next() else {
        // A lone ESC at the end.
        return text.len();
    };
    let after = start + c.len_utf8();
    match c {
        '[' => csi_end(text, after),
        ']' => string_end(text, after, true),
        'P' | 'X' | '^' | '_' => string_end(text, after, false),
        // ESC ESC: drop the first; the second starts its own sequence.
        '\u{1b}' => start,
        // nF: intermediates, then one final byte.
        '\u{20}'..='\u{2f}' => {
            let mut end = after;
            for (i, c) in text[after..].char_indices() {
                match c {
                    '\u{20}'..='\u{2f}' => end = after + i + 1,
                    '\u{30}'..='\u{7e}' => return after + i + 1,
                    _ => return end,
                }
            }
            text.len()
        }
        // Fe, Fp, Fs and anything else: ESC and the one character after it.
        _ => after,
    }
}

/// The end of the 8-bit sequence introduced by the C1 character `c` at `at`,
/// or `None` when `c` introduces nothing (a lone C1 control).
pub(super) fn c1_end(text: &str, at: usize, c: char) -> Option<usize> {
    let after = at + c.len_utf8();
    match c {
        '\u{9b}' => Some(csi_end(text, after)),
        '\u{9d}' => Some(string_end(text, after, true)),
        '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => Some(string_end(text, after, false)),
        _ => None,
    }
}

/// CSI: parameter and intermediate bytes (0x20–0x3F), then a final byte
/// (0x40–0x7E). Anything else ends the sequence before it.
fn csi_end(text: &str, from: usize) -> usize {
    for (i, c) in text[from..].char_indices() {
        match c {
            '\u{20}'..='\u{3f}' => {}
            '\u{40}'..='\u{7e}' => return from + i + 1,
            _ => return from + i,
        }
    }
    text.len()
}

/// OSC, DCS, SOS, PM, APC: up to and including the terminator (ST as `ESC \`
/// or 0x9C; for OSC also BEL). Another `ESC` ends the string before it.
fn string_end(text: &str, from: usize, bel_ends: bool) -> usize {
    let bytes = text.as_bytes();
    for (i, c) in text[from..].char_indices() {
        let here = from + i;
        match c {
            '\u{7}' if bel_ends => return here + 1,
            ST => return here + ST.len_utf8(),
            '\u{1b}' => {
                return if bytes.get(here + 1) == Some(&b'\\') {
                    here + 2
                } else {
                    here
                };
            }
            _ => {}
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(text: &str) -> usize {
        escape_end(text, 0)
    }

    #[test]
    fn csi_spans_parameters_and_final_byte() {
        assert_eq!(end("\x1b[31mX"), 5);
        assert_eq!(end("\x1b[1;2;3HX"), 8);
        assert_eq!(end("\x1b[?25lX"), 6);
        // Unterminated: to the end.
        assert_eq!(end("\x1b[12;"), 5);
        // A newline breaks the sequence; it is kept.
        assert_eq!(end("\x1b[12\nX"), 4);
    }

    #[test]
    fn osc_ends_at_bel_or_st() {
        let osc8 = "\x1b]8;;http://evil.example\x07click";
        assert_eq!(end(osc8), osc8.len() - "click".len());
        let st = "\x1b]52;c;aGk=\x1b\\rest";
        assert_eq!(end(st), st.len() - "rest".len());
        let c1 = "\x1b]0;title\u{9c}rest";
        assert_eq!(end(c1), c1.len() - "rest".len());
        assert_eq!(end("\x1b]8;;http://x"), "\x1b]8;;http://x".len());
        // A nested ESC ends the string; it starts its own sequence.
        assert_eq!(end("\x1b]0;t\x1b[31m"), 5);
    }

    #[test]
    fn dcs_and_friends_ignore_bel() {
        let dcs = "\x1bPq#0\x07more\x1b\\after";
        assert_eq!(end(dcs), dcs.len() - "after".len());
        for intro in ['X', '^', '_'] {
            let s = format!("\x1b{intro}payload\x1b\\tail");
            assert_eq!(end(&s), s.len() - "tail".len());
        }
    }

    #[test]
    fn short_escapes() {
        assert_eq!(end("\x1bcX"), 2);
        assert_eq!(end("\x1b(BX"), 3);
        assert_eq!(end("\x1b"), 1);
        assert_eq!(end("\x1b\x1b[31m"), 1);
        assert_eq!(end("\x1béX"), 1 + 'é'.len_utf8());
    }

    #[test]
    fn eight_bit_introducers() {
        let csi = "\u{9b}31mX";
        assert_eq!(c1_end(csi, 0, '\u{9b}'), Some(csi.len() - 1));
        let osc = "\u{9d}8;;u\u{9c}X";
        assert_eq!(c1_end(osc, 0, '\u{9d}'), Some(osc.len() - 1));
        assert_eq!(c1_end("\u{85}", 0, '\u{85}'), None);
    }
}
