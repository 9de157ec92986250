//! Property tests of the scan's fast paths: each prefilter and each
//! faster form of a check is held to the slow form it stands for, on
//! generated text.

use super::super::*;

/// Text made of the characters the fast paths decide on: base64 letters,
/// `%`, `\`, `=`, hex escapes, controls, tab and line breaks, invisible and
/// non-ASCII letters.
fn scan_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let piece = prop_oneof![
        "[A-Za-z0-9+/_-]{0,30}",
        Just("%4a".to_owned()),
        Just("\\x41".to_owned()),
        Just("==".to_owned()),
        Just(" ".to_owned()),
        Just("\t\n\r".to_owned()),
        Just("\u{7}".to_owned()),
        Just("\u{7f}".to_owned()),
        Just("\u{200b}".to_owned()),
        Just("\u{e0041}".to_owned()),
        Just("é".to_owned()),
        Just("\u{85}".to_owned()),
        Just("\u{1F3F4}".to_owned()),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|p| p.concat())
}

/// ASCII text made of the patterns' words, markup and separators, in any case.
fn ascii_phrases() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let words = vec![
        "ignore",
        "previous",
        "all",
        "instructions",
        "do not",
        "tell",
        "the",
        "user",
        "system",
        "prompt",
        "you are now",
        "act as",
        "developer",
        "mode",
        "send",
        "api key",
        "to",
        "http://",
        "https://x.test/a?b=",
        "user has",
        "already",
        "approved",
        "no need to",
        "confirmation",
        "before",
        "replying",
        "call",
        "send_email",
        "with",
        ".ssh",
        ".env",
        "id_rsa",
        "<",
        ">",
        "</",
        "important",
        "<|im_start|>",
        "[INST]",
        "[system]",
        "END OF",
        "TOOL",
        "---",
        "###",
        "![a](",
        ")",
        "decode",
        "and",
        "follow",
        "from now on",
        "secretly",
        "invoke",
        "tool_x",
        ": ",
    ];
    let piece = prop_oneof![
        6 => proptest::sample::select(words).prop_map(str::to_owned),
        3 => proptest::sample::select(vec![" ", "  ", "\n", "\t", ".", ",", "\x0b", "\r\n"])
            .prop_map(str::to_owned),
        1 => "[ -~]{0,6}",
    ];
    (proptest::collection::vec(piece, 0..24), any::<u64>()).prop_map(|(pieces, case)| {
        let text = pieces.concat();
        text.chars()
            .enumerate()
            .map(|(i, c)| {
                if (case >> (i % 64)) & 1 == 1 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect()
    })
}

/// Text generated from one of the set's own patterns (word boundaries and
/// the start-of-text alternative left out, any case), between pieces of
/// [`ascii_phrases`], in any ASCII case.
fn pattern_made_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let generators: Vec<_> = patterns::any_sources()
        .iter()
        .map(|source| {
            let source = source.replace("(?-u:\\b)", "").replace("^|", "");
            proptest::string::string_regex(&format!("(?i){source}"))
                .unwrap_or_else(|e| panic!("{source:?} generates: {e}"))
        })
        .collect();
    (
        ascii_phrases(),
        proptest::strategy::Union::new(generators),
        ascii_phrases(),
        any::<u64>(),
    )
        .prop_map(|(before, made, after, case)| {
            format!("{before} {made} {after}")
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if (case >> (i % 64)) & 1 == 1 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect()
        })
}

/// Every pattern of the set has its anchors, in the set's order.
#[test]
fn every_pattern_of_the_set_has_its_anchors() {
    assert_eq!(anchors::ANCHORS.len(), patterns::any_sources().len());
    assert!(anchors::ANCHORS.len() < 32);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]

    /// The anchors never rule out a pattern that matches, on text generated
    /// from the patterns themselves (so that they do match), ASCII or not.
    #[test]
    fn the_anchors_keep_every_pattern_that_matches_text_made_from_it(text in pattern_made_text()) {
        let candidates = anchors::candidates(&text);
        for i in patterns::ANY.matches(&text) {
            proptest::prop_assert!(candidates & (1 << i) != 0, "pattern {} ruled out in {:?}", i, text);
        }
    }

    /// Nor on text built from the patterns' words, markup and separators.
    #[test]
    fn the_anchors_keep_every_pattern_that_matches_phrases(text in ascii_phrases()) {
        let candidates = anchors::candidates(&text);
        for i in patterns::ANY.matches(&text) {
            proptest::prop_assert!(candidates & (1 << i) != 0, "pattern {} ruled out in {:?}", i, text);
        }
    }
}

proptest::proptest! {
    /// The byte pass before the encoded-run regex never skips a text the
    /// regex matches in.
    #[test]
    fn the_encoded_prefilter_skips_only_what_the_regex_finds_nothing_in(text in scan_text()) {
        let matches = encoded::ENCODED.is_match(&text);
        proptest::prop_assert!(!matches || encoded::may_hold_encoded(&text), "{:?}", text);
    }

    /// The block walk of the encoded-run prefilter says what counting the
    /// run byte by byte says, wherever the runs start and end.
    #[test]
    fn the_encoded_block_walk_agrees_with_counting_byte_by_byte(text in scan_text()) {
        let mut run = 0usize;
        let mut slow = false;
        for &b in text.as_bytes() {
            match b {
                b'%' | b'\\' => slow = true,
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' | b'_' | b'-' => {
                    run += 1;
                    slow |= run >= 24;
                }
                _ => run = 0,
            }
        }
        proptest::prop_assert_eq!(encoded::may_hold_encoded(&text), slow, "{:?}", text);
    }

    /// On ASCII text the Unicode-free pattern set says what the Unicode one
    /// says, pattern by pattern, on texts built from the patterns' own words,
    /// markup and separators in any case.
    #[test]
    fn the_ascii_pattern_set_matches_as_the_unicode_one_on_ascii(text in ascii_phrases()) {
        let unicode: Vec<usize> = patterns::ANY.matches(&text).into_iter().collect();
        let ascii: Vec<usize> = patterns::ANY_ASCII.matches(text.as_bytes()).into_iter().collect();
        proptest::prop_assert_eq!(ascii, unicode, "{:?}", text);
    }

    /// The byte test for hidden characters says what classifying each
    /// character says.
    #[test]
    fn the_hidden_fast_path_agrees_with_each_characters_class(text in scan_text()) {
        let slow = text.chars().any(hidden::is_hidden);
        proptest::prop_assert_eq!(hidden::has_hidden(&text), slow, "{:?}", text);
    }
}
