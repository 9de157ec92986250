//! Small text helpers shared by every layer: bounding what the gateway keeps
//! of a client- or upstream-supplied string.
//!
//! Place in the path: a leaf, imported by the protocol model (refusal quotes),
//! the record layer (audit, spans) and the pipeline (the request's method).
//!
//! Invariants: a clipped text is never longer than asked, is cut at a
//! character boundary, and marks the cut with `…`; text within the bound is
//! returned unchanged.

/// Most bytes of a client-supplied identifier kept in the audit trail, the
/// dashboard, logs and spans.
pub(crate) const MAX_KEPT: usize = 256;

/// `text` cut to at most [`MAX_KEPT`] bytes at a character boundary, with `…`
/// marking the cut.
pub(crate) fn clip(text: &str) -> String {
    clip_to(text, MAX_KEPT)
}

/// `text` cut to at most `max` bytes (`max` ≥ 3) at a character boundary.
pub(crate) fn clip_to(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

/// Clips an optional identifier in place.
pub(crate) fn clip_opt(text: &mut Option<String>) {
    if let Some(t) = text
        && t.len() > MAX_KEPT
    {
        *t = clip(t);
    }
}

/// `text` without the byte order marks at its ends: the sanitizer keeps one
/// that starts a text (it is the text's own), but a gateway text that quotes
/// the upstream's must not carry it into the middle of a sentence.
pub fn unbom(text: &str) -> &str {
    text.trim_matches('\u{feff}')
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn clip_is_bounded_and_keeps_a_prefix(text in "\\PC{0,400}") {
            let kept = clip(&text);
            prop_assert!(kept.len() <= MAX_KEPT);
            if text.len() <= MAX_KEPT {
                prop_assert_eq!(&kept, &text);
            } else {
                let prefix = kept.strip_suffix('…').expect("marked");
                prop_assert!(text.starts_with(prefix));
            }
        }
    }
}
