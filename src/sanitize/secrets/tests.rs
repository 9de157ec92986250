use super::*;

fn kinds(text: &str) -> Vec<String> {
    find(text, true, &[])
        .into_iter()
        .map(|f| f.kind.into_owned())
        .collect()
}

#[test]
fn entropy_of_known_strings() {
    assert_eq!(entropy(b""), 0.0);
    assert_eq!(entropy(b"aaaa"), 0.0);
    assert!((entropy(b"ab") - 1.0).abs() < 1e-9);
    assert!(entropy(b"AKIAZ7QWERTYUIOPASDF") > 3.0);
}

#[test]
fn assignments_need_a_keyword_that_ends_the_identifier() {
    assert_eq!(kinds("password=hunter2"), [GENERIC]);
    assert_eq!(kinds("db_password: \"hunter2\""), [GENERIC]);
    assert_eq!(kinds("{\"client_secret\":\"s3cr3t-value\"}"), [GENERIC]);
    assert!(kinds("passwords=3").is_empty());
    assert!(kinds("token_count=12345678").is_empty());
    assert!(kinds("max_tokens=100").is_empty());
    assert!(kinds("cwd=/home/x").is_empty());
    // Weak keywords need a random-looking value.
    assert!(kinds("token=abc").is_empty());
    assert_eq!(kinds("token=8fK2pQ9xL3mN7vR1"), [GENERIC]);
    // Placeholders.
    for p in [
        "password=${DB_PASSWORD}",
        "password=<password>",
        "password=********",
        "password: required",
        "secret=[REDACTED:x]",
    ] {
        assert!(kinds(p).is_empty(), "{p}");
    }
}

#[test]
fn the_value_is_what_is_redacted() {
    let text = "connect with password=hunter2 now";
    let f = find(text, true, &[]);
    assert_eq!(
        redact(text, &f),
        "connect with password=[REDACTED:generic-secret] now"
    );
}

#[test]
fn documented_examples_are_not_secrets() {
    assert!(kinds("AKIAIOSFODNN7EXAMPLE").is_empty());
    assert!(kinds("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY").is_empty());
    assert!(kinds("sk_test_4eC39HqLyjWDarjtT1zdp7dc").is_empty());
}

#[test]
fn placeholders_are_never_found_again() {
    let once = redact("password=hunter2", &find("password=hunter2", true, &[]));
    assert!(find(&once, true, &[]).is_empty());
    let re = regex::Regex::new("REDACTED").expect("regex");
    assert!(find(&once, false, &[("mine".into(), re)]).is_empty());
}

#[test]
fn overlapping_findings_merge() {
    let text = "token=AKIAZ7QWERTYUIOPASDF";
    let f = find(text, true, &[]);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(&text[f[0].start..f[0].end], "AKIAZ7QWERTYUIOPASDF");
}

/// Text made of keyword pieces in any case, separators, look-alike and
/// non-ASCII letters whose case folding is not ASCII's (`K` KELVIN SIGN,
/// `ſ` LONG S, `İ`), so that matches start, end and overlap everywhere.
fn keyword_soup() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let (words, _) = keywords();
    let piece = prop_oneof![
        4 => proptest::sample::select(words).prop_map(str::to_owned),
        2 => "[a-zA-Z_:./=-]{1,4}",
        1 => proptest::sample::select(vec!["\u{212A}", "\u{17F}", "\u{130}", "é", "ß", " ", "\n", "Ä"])
            .prop_map(str::to_owned),
    ];
    (
        proptest::collection::vec(piece, 0..24),
        proptest::collection::vec(any::<bool>(), 0..96),
    )
        .prop_map(|(pieces, upper)| {
            let mut text = String::new();
            for (i, c) in pieces.concat().chars().enumerate() {
                if upper.get(i % upper.len().max(1)).copied().unwrap_or(false) {
                    text.push(c.to_ascii_uppercase());
                } else {
                    text.push(c);
                }
            }
            text
        })
}

proptest::proptest! {
    /// The keyword pass over the ASCII-lowered text finds exactly what an
    /// ASCII-case-insensitive automaton finds over the text itself: the
    /// same keywords at the same offsets, in the same order.
    #[test]
    fn the_lowered_keyword_pass_finds_what_a_case_insensitive_one_does(text in keyword_soup()) {
        let (words, _) = keywords();
        let reference = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::LeftmostLongest)
            .build(&words)
            .unwrap();
        let expected: Vec<_> = reference
            .find_iter(&text)
            .map(|m| (m.pattern(), m.start(), m.end()))
            .collect();
        let found: Vec<_> = with_lowered(&text, |lowered| {
            compiled()
                .keywords
                .find_iter(lowered)
                .map(|m| (m.pattern(), m.start(), m.end()))
                .collect()
        });
        proptest::prop_assert_eq!(found, expected);
    }
}
