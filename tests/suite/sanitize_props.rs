//! Properties of the sanitizer over generated text built from hostile pieces
//! (escape introducers, terminators, invisible characters, emoji parts,
//! secret-looking fragments) and arbitrary characters: it never panics, a
//! second pass changes nothing, nothing hidden survives, and text never grows
//! except by `[REDACTED:…]` placeholders and the cut notice.

use portcullis::config::SanitizeSettings;
use portcullis::sanitize::{Report, Sanitizer, Skip, cut};
use proptest::prelude::*;

const PIECES: &[&str] = &[
    "\u{1b}",
    "[",
    "]",
    "31m",
    "2J",
    ";",
    "8;;http://evil.example",
    "\u{7}",
    "\u{1b}\\",
    "P",
    "_",
    "\u{9b}",
    "\u{9c}",
    "\u{9d}",
    "\u{90}",
    "\u{85}",
    "\u{0}",
    "\r",
    "\n",
    "\t",
    " ",
    "\u{7f}",
    "\u{200b}",
    "\u{200c}",
    "\u{200d}",
    "\u{200e}",
    "\u{202e}",
    "\u{2066}",
    "\u{feff}",
    "\u{fe0f}",
    "\u{e0100}",
    "\u{E0041}",
    "\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}",
    "\u{E007F}",
    "🏴",
    "👨",
    "👩",
    "ی",
    "क",
    "\u{094d}",
    "葛",
    "é",
    "a",
    "Z",
    "0",
    "=",
    ":",
    "\"",
    "password=",
    "hunter2",
    "token: ",
    "AKIA",
    "Z7QWERTYUIOPASDF",
    "ghp_",
    "0123456789abcdefghijABCDEFGHIJ012345",
    "-----BEGIN PRIVATE KEY-----",
    "-----END PRIVATE KEY-----",
    "eyJhbGciOiJIUzI1NiJ9",
    ".",
    "[REDACTED:",
    "EXAMPLE",
    "sk_live_",
    "https://u:p4ss@h/",
];

fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => proptest::sample::select(PIECES).prop_map(str::to_owned),
        1 => any::<char>().prop_map(|c| c.to_string()),
    ];
    proptest::collection::vec(piece, 0..120).prop_map(|v| v.concat())
}

fn sanitize(input: &str) -> (String, Report) {
    let settings = SanitizeSettings::default();
    let s = Sanitizer::new(&settings, Skip::default());
    let mut report = Report::default();
    let out = s
        .text(input, &mut report)
        .unwrap_or_else(|| input.to_owned());
    (out, report)
}

/// Total length of the placeholders in `text`.
fn placeholder_bytes(text: &str) -> usize {
    let mut total = 0;
    let mut from = 0;
    while let Some(at) = text[from..].find("[REDACTED:") {
        let start = from + at;
        let end = text[start..]
            .find(']')
            .map_or(text.len(), |e| start + e + 1);
        total += end - start;
        from = end;
    }
    total
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn sanitizing_twice_is_sanitizing_once(input in text()) {
        let (once, _) = sanitize(&input);
        let (twice, report) = sanitize(&once);
        prop_assert_eq!(&twice, &once);
        prop_assert!(report.is_empty(), "second pass acted: {:?}", report);
    }

    #[test]
    fn text_never_grows_except_by_placeholders(input in text()) {
        let (out, _) = sanitize(&input);
        prop_assert!(out.len() <= input.len() + placeholder_bytes(&out),
            "{} > {} + placeholders", out.len(), input.len());
    }

    #[test]
    fn nothing_hidden_survives(input in text()) {
        let (out, _) = sanitize(&input);
        let chars: Vec<char> = out.chars().collect();
        for (i, &c) in chars.iter().enumerate() {
            let control = matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}');
            prop_assert!(!control, "control {:?} in {:?}", c, out);
            prop_assert!(!matches!(c, '\u{200b}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'), "{:?}", out);
            // A bare CR never survives.
            prop_assert!(c != '\r' || chars.get(i + 1) == Some(&'\n'), "bare CR in {:?}", out);
            // Tag characters only inside an RGI subdivision flag.
            if ('\u{E0000}'..='\u{E007F}').contains(&c) {
                let start = chars[..i].iter().rposition(|&p| p == '🏴');
                prop_assert!(start.is_some_and(|s| chars[s + 1..=i].iter().all(|t| ('\u{E0020}'..='\u{E007F}').contains(t))),
                    "stray tag character in {:?}", out);
            }
        }
    }

    #[test]
    fn a_cut_fits_and_is_stable(input in text(), max in 1024usize..4096) {
        let mut long = input.repeat(40);
        let len = long.len();
        let mut report = Report::default();
        let omitted = cut(&mut long, max, &mut report);
        prop_assert!(long.len() <= max);
        if len > max {
            let notice = format!("{} more bytes were omitted", omitted);
            prop_assert!(omitted > 0 && long.contains(&notice));
        }
        let again = long.clone();
        prop_assert_eq!(cut(&mut long, max, &mut report), 0);
        prop_assert_eq!(long, again);
    }
}
