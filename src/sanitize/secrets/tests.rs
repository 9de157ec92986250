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
