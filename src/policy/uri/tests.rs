use super::*;

fn canon(uri: &str) -> String {
    canonical(uri)
        .unwrap_or_else(|e| panic!("{uri}: {e}"))
        .as_str()
        .to_owned()
}

fn refused(uri: &str) -> UriRefusal {
    match canonical(uri) {
        Ok(c) => panic!("{uri} was accepted as {c}"),
        Err(e) => e,
    }
}

#[test]
fn the_spellings_of_one_resource_have_one_form() {
    for (spelling, form) in [
        ("users://%61dmin/profile", "users://admin/profile"),
        ("USERS://Admin/profile", "users://admin/profile"),
        ("users://admin/%70rofile", "users://admin/profile"),
        ("res://Admin/a", "res://admin/a"),
        ("file:///public/../secret/key.txt", "file:///secret/key.txt"),
        ("res://open/./a", "res://open/a"),
        ("res://open//a", "res://open/a"),
        ("res://open/a#x", "res://open/a"),
        ("res://open/a/", "res://open/a/"),
        ("res://open/a/b/..", "res://open/a/"),
        ("res://h:/a", "res://h/a"),
        ("res://h/a%7e%2d", "res://h/a~-"),
        ("res://h/a%21%28x%29", "res://h/a!(x)"),
        ("res://h/jos\u{e9}", "res://h/jos%C3%A9"),
        ("res://h/jos%c3%a9", "res://h/jos%C3%A9"),
        ("res://h/a b", "res://h/a%20b"),
        ("res://h/a,b", "res://h/a,b"),
        ("urn:isbn:123", "urn:isbn:123"),
        ("res://h/a?Q=%41&b=%3d", "res://h/a?Q=A&b=%3D"),
        ("res://[::1]:8/a", "res://[::1]:8/a"),
        ("res://u%41@H/a", "res://uA@h/a"),
        ("file:///", "file:///"),
    ] {
        assert_eq!(canon(spelling), form, "{spelling}");
        assert_eq!(canon(form), form, "idempotent on {form}");
    }
}

#[test]
fn the_identity_leaves_the_query_out() {
    let c = canonical("logs://API/x?level=%65rror#top").expect("canonical");
    assert_eq!(c.as_str(), "logs://api/x?level=error");
    assert_eq!(c.identity(), "logs://api/x");
    assert_eq!(canonical("res://h/a").expect("ok").identity(), "res://h/a");
    assert_eq!(c.query(), "level=error");
    assert_eq!(canonical("res://h/a").expect("ok").query(), "");
}

/// In a query, `+` is a space to form decoders and `;` a separator to
/// legacy ones: a client's `%2B` and `%3B` stay encoded (decoded, a plus
/// would reach a form decoder as a space), and so does `%3F` (the TS SDK's
/// matcher may take a later raw `?` for the start of the query, so a raw
/// one is encoded too), and so does `%2C` (a list parameter, RFC 6570
/// §3.2.8 and FastMCP's `{?tags}`, splits at a raw `,` only: `a%2Cb` is
/// one item, `a,b` two); outside the query `%2B` decodes as before.
#[test]
fn a_query_keeps_the_escapes_some_reader_takes_for_structure() {
    for (spelling, form) in [
        ("logs://api?q=a%2bb", "logs://api?q=a%2Bb"),
        ("logs://api?q=a%3bb", "logs://api?q=a%3Bb"),
        ("logs://api?q=a+b;c", "logs://api?q=a+b;c"),
        ("logs://api?q=a%2Cb%3F", "logs://api?q=a%2Cb%3F"),
        ("logs://api?q=a,b", "logs://api?q=a,b"),
        ("logs://api?q=a%3fb?c", "logs://api?q=a%3Fb%3Fc"),
        ("logs://api?x?level=debug", "logs://api?x%3Flevel=debug"),
        ("logs://a%2Bb?q=1", "logs://a+b?q=1"),
        ("logs://api?q=%26%3D", "logs://api?q=%26%3D"),
    ] {
        let c = canonical(spelling).unwrap_or_else(|e| panic!("{spelling}: {e}"));
        assert_eq!(c.as_str(), form, "{spelling}");
        assert_eq!(canonical(form).expect("again").as_str(), form, "idempotent");
    }
}

/// The TS SDK matches a template against the whole URI, so a template
/// without a query (`file:///{+path}`) binds the query into its last
/// variable: `file:///public/a?/../../secret` would reach the server as the
/// path `public/a?/../../secret`, which a file server joins to `secret`.
/// A dot segment in the query is refused as one above the root is, and an
/// empty query is dropped.
#[test]
fn a_query_never_carries_a_dot_segment() {
    for uri in [
        "file:///public/a?/../../secret",
        "file:///public?x=/..",
        "file:///public?x=1&/./a",
        "file:///public?/./",
        "file:///public/?a/../..",
    ] {
        assert_eq!(refused(uri), UriRefusal::QueryDotSegment, "{uri}");
    }
    // An empty query is none: `users://{id}` binds `alice`, not `alice?`.
    assert_eq!(canon("users://alice?"), "users://alice");
    assert_eq!(canon("users://alice?#top"), "users://alice");
    for (uri, form) in [
        ("file:///public/a?x=..", "file:///public/a?x=.."),
        ("file:///public/a?x=a/..b/.c", "file:///public/a?x=a/..b/.c"),
        ("file:///public/a?../x", "file:///public/a?../x"),
    ] {
        assert_eq!(canon(uri), form, "{uri}");
    }
}

#[test]
fn spellings_that_change_structure_are_refused() {
    use UriRefusal as R;
    let delimiter = |e: &UriRefusal| matches!(e, R::EncodedDelimiter { .. });
    for uri in [
        "res://open/..%2Fadmin%2Fa",
        "res://open/a%5Cb",
        "res://open/%2e%2e/admin",
        "res://open/%2E/a",
        "res://open/a%23b",
        "res://open/a%3Fb",
        "users://a%2Cb/profile",
        "res://h%3A1/a",
        "res://a%40b/c",
        "res://h/a?x=%2F",
    ] {
        assert!(delimiter(&refused(uri)), "{uri}: {}", refused(uri));
    }
    assert_eq!(refused("res://h/%252e"), R::DoubleEncoding("%2e".into()));
    assert_eq!(
        refused("res://h/%25%32%65"),
        R::DoubleEncoding("%2e".into())
    );
    assert_eq!(canon("res://h/100%25"), "res://h/100%25");
    assert_eq!(refused("res://h/%2"), R::InvalidEscape("%2".into()));
    assert_eq!(refused("res://h/%zz"), R::InvalidEscape("%zz".into()));
    assert_eq!(refused("res://h/%FF"), R::NotUtf8);
    assert_eq!(refused("res://h/%00"), R::Control(0));
    assert_eq!(refused("res://h/a\u{7}"), R::Control(7));
    assert_eq!(refused("res://h/%C2%85"), R::Control(0x85));
    assert_eq!(refused("res://h/a\\b"), R::Backslash);
    assert_eq!(refused("res://open/../admin/a"), R::AboveRoot);
    assert_eq!(refused("res://./admin/a"), R::DotAuthority(".".into()));
    assert_eq!(refused("res://../admin/a"), R::DotAuthority("..".into()));
    assert_eq!(refused("admin/a"), R::NoScheme);
    assert_eq!(refused(""), R::Empty);
    // A refusal quotes the client's authority escaped: no format character
    // (a right-to-left override) reaches the client's text or a log raw.
    let why = refused("res://a@b\u{202e}@c/x").to_string();
    assert!(
        !why.contains('\u{202e}') && why.contains("\\u{202e}"),
        "{why}"
    );
    assert!(
        delimiter(&refused("res://h/a#%2F")),
        "the fragment is checked too"
    );
}

#[test]
fn patterns_are_held_to_the_canonical_form() {
    for ok in [
        "*",
        "users://*",
        "users://admin/*",
        "file:///public/*",
        "res://h/a?",
        "res://[a-z]*/x",
        "users://{user_id}/profile",
        "*admin*",
    ] {
        assert_eq!(pattern(ok).as_deref(), Ok(ok), "{ok}");
    }
    for (written, canonical) in [
        ("Users://Admin/*", "users://admin/*"),
        ("users://%61dmin/*", "users://admin/*"),
        ("res://h//a/*", "res://h/a/*"),
        ("res://h/jos\u{e9}/*", "res://h/jos%C3%A9/*"),
        ("res://h/a%2a", "res://h/a*"),
    ] {
        assert_eq!(pattern(written).as_deref(), Ok(canonical), "{written}");
    }
    assert_eq!(pattern("res://h/a#x"), Err(UriRefusal::Fragment));
    assert_eq!(
        pattern("res://h/../a/*"),
        Err(UriRefusal::DotSegment("..".into()))
    );
    assert!(pattern("res://h/a%2F*").is_err());
    assert!(pattern("res://h/%252e*").is_err());
}

mod properties {
    use proptest::prelude::*;

    use super::super::*;

    /// Text made of URI syntax, escapes and a few hostile characters.
    fn uri_like() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("res://".to_owned()),
            Just("/".to_owned()),
            Just(".".to_owned()),
            Just("..".to_owned()),
            Just("?".to_owned()),
            Just("#".to_owned()),
            Just("@".to_owned()),
            Just(":".to_owned()),
            Just("\\".to_owned()),
            Just("[".to_owned()),
            "%[0-9a-fA-F]{2}",
            "%[0-9a-zA-Z]{0,2}",
            "[a-zA-Z0-9_~!$&'()*+,;=-]{1,3}",
            any::<char>().prop_map(String::from),
        ];
        proptest::collection::vec(piece, 0..12).prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the text, the canonicalizer answers; what it accepts is
        /// a fixed point without structure-changing escapes, controls,
        /// fragments, dot or empty segments, and it reads back as a pattern.
        #[test]
        fn any_text_is_refused_or_canonical(text in uri_like()) {
            if let Ok(c) = canonical(&text) {
                let again = canonical(c.as_str());
                prop_assert_eq!(again.as_ref().map(CanonicalUri::as_str), Ok(c.as_str()));
                let upper = c.as_str().to_ascii_uppercase();
                for bad in ["%2F", "%5C", "%2E", "#", "\\"] {
                    prop_assert!(!upper.contains(bad), "{} in {}", bad, c);
                }
                prop_assert!(!percent_then_hex(c.as_str()), "double encoding in {}", c);
                prop_assert!(!c.as_str().chars().any(char::is_control));
                let identity = c.identity();
                let path_start = identity.find("://").map(|i| i + 3).map(|i| i + identity[i..].find('/').unwrap_or(identity.len() - i));
                if let Some(start) = path_start {
                    for segment in identity[start..].split('/').skip(1) {
                        prop_assert!(segment != "." && segment != "..", "{}", c);
                    }
                    // Nor where a matcher reads the query into the path,
                    // which holds no second `?` for a matcher to start at.
                    for segment in c.query().split('/').skip(1) {
                        prop_assert!(segment != "." && segment != "..", "{}", c);
                    }
                    prop_assert!(!c.query().contains('?'), "{}", c);
                    prop_assert!(!identity[start..].contains("//"), "{}", c);
                }
                if !identity.contains(['*', '?', '[', '\\', '{', '}']) {
                    prop_assert_eq!(pattern(identity), Ok(identity.to_owned()));
                }
            }
        }
    }

    /// Whether `%25` is followed by two hex digits somewhere.
    fn percent_then_hex(text: &str) -> bool {
        text.match_indices("%25").any(|(i, _)| {
            text[i + 3..]
                .chars()
                .take(2)
                .filter(char::is_ascii_hexdigit)
                .count()
                == 2
        })
    }
}
