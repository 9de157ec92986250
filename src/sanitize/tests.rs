//! The sanitizer corpus: hostile inputs, each stripped to an exact expected
//! text; a false-positive corpus that must round-trip unchanged.

use serde_json::json;

use super::*;
use crate::sanitize::SanitizeSettings;

fn clean(input: &str) -> (String, Report) {
    let settings = SanitizeSettings::default();
    let s = Sanitizer::new(&settings, Skip::default());
    let mut report = Report::default();
    let out = s
        .text(input, &mut report)
        .unwrap_or_else(|| input.to_owned());
    (out, report)
}

fn cleaned(input: &str) -> String {
    let out = clean(input).0;
    assert_eq!(clean(&out).0, out, "not idempotent on {input:?}");
    out
}

/// (name, hostile input, expected output)
const HOSTILE: &[(&str, &str, &str)] = &[
    (
        "sgr colours",
        "\x1b[31mERROR\x1b[0m db down",
        "ERROR db down",
    ),
    ("clear screen", "\x1b[2J\x1b[Hfake prompt", "fake prompt"),
    ("cursor overwrite", "rm -rf /\x1b[1A\x1b[2Kls", "rm -rf /ls"),
    (
        "osc 8 hyperlink",
        "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07 here",
        "click here",
    ),
    (
        "osc 8 with st",
        "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\",
        "click",
    ),
    ("osc 52 clipboard", "ok\x1b]52;c;Y3VybCBldmlsfHNo\x07", "ok"),
    ("osc title", "\x1b]0;pwned\x07text", "text"),
    ("dcs", "a\x1bPq#0;2;0;0;0\x1b\\b", "ab"),
    ("apc", "a\x1b_hidden payload\x1b\\b", "ab"),
    ("pm and sos", "a\x1b^pm\x1b\\b\x1bXsos\x1b\\c", "abc"),
    ("8-bit csi", "a\u{9b}31mred\u{9b}0m", "ared"),
    ("8-bit osc", "a\u{9d}8;;http://x\u{9c}link", "alink"),
    ("lone c1", "a\u{85}b\u{9c}c", "abc"),
    ("lone esc at end", "text\x1b", "text"),
    ("esc then char", "a\x1bcb", "ab"),
    ("charset designation", "a\x1b(Bb", "ab"),
    ("unterminated csi", "keep\x1b[12;", "keep"),
    (
        "unterminated osc",
        "keep\x1b]8;;http://evil.example/",
        "keep",
    ),
    ("c0 controls", "a\x00b\x07c\x08d\x0be\x0cf\x7fg", "abcdefg"),
    ("tab, lf, crlf kept", "a\tb\nc\r\nd", "a\tb\nc\r\nd"),
    ("bare cr becomes lf", "visible\rhidden", "visible\nhidden"),
    (
        "tag smuggling",
        "Hello\u{E0001}\u{E0069}\u{E0067}\u{E006E}\u{E006F}\u{E0072}\u{E0065}\u{E007F} world",
        "Hello world",
    ),
    ("bidi override", "user\u{202E}gpj.exe", "usergpj.exe"),
    ("bidi embedding", "a\u{202A}b\u{202C}c", "abc"),
    (
        "bidi isolates",
        "a\u{2066}b\u{2069}c\u{2067}d\u{2068}e",
        "abcde",
    ),
    ("zero width space", "ad\u{200B}min", "admin"),
    (
        "word joiner and invisible operators",
        "a\u{2060}b\u{2062}c",
        "abc",
    ),
    ("bom inside text", "ab\u{FEFF}c", "abc"),
    ("leading bom", "\u{FEFF}first line", "first line"),
    (
        "aws key glued to letters",
        "xREDAKIAZ7QWERTYUIOPCANAyz",
        "xRED[REDACTED:aws-access-key-id]yz",
    ),
    (
        "github token glued to letters",
        "tokenghp_C4n4ryT0k3nXq9Wv2Lm8Rt5Yp1Zs7Kd3Hf6Jend",
        "token[REDACTED:github-token]end",
    ),
    (
        "stripe key glued to capitals",
        "REDsk_live_51HxYz2KlMnOpQrStUvWx",
        "RED[REDACTED:stripe-key]",
    ),
    (
        "jwt glued to letters",
        "xxeyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSIsImFkbWluIjp0cnVlfQ.dGhpc2lzYXNpZ25hdHVyZQ",
        "xx[REDACTED:jwt]",
    ),
    ("zwj between ascii", "ad\u{200D}min", "admin"),
    ("zwnj between ascii", "ad\u{200C}min", "admin"),
    ("joiner runs", "👨\u{200D}\u{200D}👩", "👨\u{200D}👩"),
    ("variation selector run", "x\u{FE0F}\u{FE0E}\u{FE00}y", "xy"),
    ("emoji smuggling", "😀\u{E0100}\u{E0101}\u{E0102}", "😀"),
    ("selector after emoji run", "❤\u{FE0F}\u{FE0F}", "❤\u{FE0F}"),
    ("hangul filler", "a\u{3164}b", "ab"),
    (
        "soft hyphen splitting a word",
        "pass\u{00AD}word",
        "password",
    ),
    (
        "unknown subdivision flag",
        "🏴\u{E0075}\u{E0073}\u{E0063}\u{E0061}\u{E007F}",
        "🏴",
    ),
    (
        "aws key",
        "key AKIAZ7QWERTYUIOPASDF used",
        "key [REDACTED:aws-access-key-id] used",
    ),
    (
        "aws key split by zwsp",
        "AKIAZ7QWER\u{200B}TYUIOPASDF",
        "[REDACTED:aws-access-key-id]",
    ),
    (
        "github pat",
        "ghp_0123456789abcdefghijABCDEFGHIJ012345",
        "[REDACTED:github-token]",
    ),
    (
        "gitlab pat",
        "glpat-x1Y2z3W4v5U6t7S8r9Q0",
        "[REDACTED:gitlab-token]",
    ),
    (
        "slack bot",
        "xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOp",
        "[REDACTED:slack-token]",
    ),
    (
        "stripe live",
        "sk_live_51HxYz2KlMnOpQrStUvWx",
        "[REDACTED:stripe-key]",
    ),
    (
        "openai",
        "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3iJk6l",
        "[REDACTED:openai-api-key]",
    ),
    (
        "anthropic",
        "sk-ant-api03-Xy7_zQ2-vB9nM4kL1jH6gF3dS8aP5oI0uY7tR2eW9qA4",
        "[REDACTED:anthropic-api-key]",
    ),
    (
        "google",
        "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
        "[REDACTED:google-api-key]",
    ),
    (
        "jwt",
        "Bearer-less eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSIsImFkbWluIjp0cnVlfQ.dGhpc2lzYXNpZ25hdHVyZQ",
        "Bearer-less [REDACTED:jwt]",
    ),
    (
        "bearer",
        "Authorization: Bearer 7fQ2kLp9ZxW3vB8nM1cR4tY6uI0oP5aS",
        "Authorization: Bearer [REDACTED:bearer-token]",
    ),
    (
        "url credentials",
        "postgres://app:s3cr3tPass@db.internal:5432/app",
        "postgres://app:[REDACTED:url-credentials]@db.internal:5432/app",
    ),
    (
        "password assignment",
        "db password=hunter2 at /srv/app",
        "db password=[REDACTED:generic-secret] at /srv/app",
    ),
    (
        "json password",
        "{\"password\": \"hunter2\"}",
        "{\"password\": \"[REDACTED:generic-secret]\"}",
    ),
    (
        "private key block",
        "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB\naFDrBz9vFqU4yB4vLxbQ2Fz0h0Q+0S3pEkEKQm4yWw==\n-----END RSA PRIVATE KEY-----\nend",
        "key:\n[REDACTED:private-key]\nend",
    ),
    (
        "private key without its end",
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
        "[REDACTED:private-key]",
    ),
];

#[test]
fn hostile_inputs_are_stripped() {
    for (name, input, expected) in HOSTILE {
        assert_eq!(cleaned(input), *expected, "{name}");
    }
}

/// Text that must come back byte for byte.
const BENIGN: &[(&str, &str)] = &[
    (
        "git hash",
        "commit 9fceb02d0ae598e95dc970b74767f19372d61af8 (HEAD -> main)",
    ),
    ("short hashes", "fixed in 9fceb02 and a1b2c3d4e5"),
    ("uuid", "request 123e4567-e89b-12d3-a456-426614174000 done"),
    (
        "sha256",
        "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
    ),
    (
        "base64 image",
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    ),
    (
        "aws documentation keys",
        "AKIAIOSFODNN7EXAMPLE / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    (
        "aws documentation assignment",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    (
        "stripe documentation key",
        "curl -u sk_test_4eC39HqLyjWDarjtT1zdp7dc:",
    ),
    (
        "placeholders",
        "export API_KEY=${API_KEY}; password=<your password>; token: ********",
    ),
    (
        "english prose about secrets",
        "Rotate the token every 90 days; the password policy needs 12 characters.",
    ),
    (
        "identifiers",
        "max_tokens=4096 token_count=17 passwords=3 cwd=/tmp",
    ),
    (
        "flag emoji",
        "🇫🇷 🇯🇵 🏴\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F} 🏴\u{E0067}\u{E0062}\u{E0073}\u{E0063}\u{E0074}\u{E007F} 🏴\u{E0067}\u{E0062}\u{E0077}\u{E006C}\u{E0073}\u{E007F}",
    ),
    (
        "family emoji",
        "👨\u{200D}👩\u{200D}👧\u{200D}👦 👩🏽\u{200D}💻 🏳\u{FE0F}\u{200D}🌈 ❤\u{FE0F} 1\u{FE0F}\u{20E3}",
    ),
    (
        "persian with zwnj",
        "می\u{200C}خواهم این کتاب\u{200C}ها را بخوانم",
    ),
    (
        "hindi with joiners",
        "क्\u{200D}ष हिन्दी में लिखा गया पाठ, श्री\u{200C}मान",
    ),
    (
        "arabic with marks",
        "مرحبا \u{200F}بالعالم\u{200E} abc \u{061C}",
    ),
    ("cjk with ideographic variation", "葛\u{E0100}城市 東京"),
    (
        "accents and symbols",
        "café naïve Zürich © ® ™ → ✓ – — “quotes”",
    ),
    ("windows line ends", "line one\r\nline two\r\n"),
    (
        "words holding a key prefix",
        "task_live_status0123456789 risk-admin-dashboard-configuration-settings-page-v2 honeyjars_are_really_nice.eyeglasses_are_sharp_too.",
    ),
    (
        "json",
        "{\"id\": 7, \"ok\": true, \"items\": [1, 2, 3], \"token_type\": \"bearer\"}",
    ),
    (
        "url without credentials",
        "see https://docs.example.com/path?q=1&page=2 and mailto:a@b.c",
    ),
    (
        "code",
        "fn main() {\n\tlet password_len = 12;\n\tprintln!(\"{password_len}\");\n}",
    ),
];

#[test]
fn benign_text_round_trips_unchanged() {
    for (name, input) in BENIGN {
        let (out, report) = clean(input);
        assert_eq!(out, *input, "{name}: {report:?}");
        assert!(report.is_empty(), "{name}: {report:?}");
    }
}

#[test]
fn reports_count_by_kind() {
    let (_, report) = clean("\x1b[31mA\x1b[0m\u{200B}\x00 password=hunter2 AKIAZ7QWERTYUIOPASDF");
    let counts = report.counts();
    assert_eq!(counts[TERMINAL_SEQUENCE], 2);
    assert_eq!(counts[INVISIBLE_UNICODE], 1);
    assert_eq!(counts[CONTROL_CHARACTER], 1);
    assert_eq!(counts["secret:generic-secret"], 1);
    assert_eq!(counts["secret:aws-access-key-id"], 1);
    assert_eq!(
        report.secret_kinds(),
        ["aws-access-key-id", "generic-secret"]
    );
    assert!(!report.summary().contains("hunter2"));
}

#[test]
fn settings_turn_actions_off() {
    let settings = SanitizeSettings {
        ansi: false,
        invisible_unicode: false,
        secrets: SecretsAction::Off,
        ..SanitizeSettings::default()
    };
    let s = Sanitizer::new(&settings, Skip::default());
    let input = "\x1b[31mred\u{200B} password=hunter2";
    assert_eq!(s.text(input, &mut Report::default()), None);
    let settings = SanitizeSettings::default();
    let skip = Skip {
        secrets: true,
        ..Skip::default()
    };
    let s = Sanitizer::new(&settings, skip);
    assert_eq!(
        s.text(input, &mut Report::default()).as_deref(),
        Some("red password=hunter2")
    );
}

#[test]
fn operator_patterns_redact_by_name() {
    let settings = SanitizeSettings {
        patterns: vec![(
            "internal-host".into(),
            regex::Regex::new(r"\bcorp-[a-z0-9-]+\.internal\b").expect("regex"),
        )],
        ..SanitizeSettings::default()
    };
    let s = Sanitizer::new(&settings, Skip::default());
    let mut report = Report::default();
    let out = s.text("call corp-db-1.internal now", &mut report);
    assert_eq!(out.as_deref(), Some("call [REDACTED:internal-host] now"));
    assert_eq!(report.secret_kinds(), ["internal-host"]);
}

#[test]
fn cut_keeps_a_character_boundary_and_says_how_much() {
    let mut text = "é".repeat(2000); // 4000 bytes
    let mut report = Report::default();
    let omitted = cut(&mut text, 1024, &mut report);
    assert!(text.len() <= 1024, "{}", text.len());
    assert_eq!(omitted, 4000 - (1024 - NOTICE_ROOM));
    assert!(text.ends_with(&format!(
        "{omitted} more bytes were omitted (limit 1024 bytes)]"
    )));
    // A second cut changes nothing.
    let again = text.clone();
    assert_eq!(cut(&mut text, 1024, &mut report), 0);
    assert_eq!(text, again);
    assert_eq!(report.counts()[TRUNCATED], 1);
}

#[test]
fn structured_values_are_judged_with_their_keys() {
    let settings = SanitizeSettings::default();
    let s = Sanitizer::new(&settings, Skip::default());
    let mut v = json!({
        "user": "ad\u{200B}min",
        "db": {"password": "hunter2", "host": "db.internal"},
        "api_token": "8fK2pQ9xL3mN7vR1",
        "note": "key AKIAZ7QWERTYUIOPASDF",
        "list": ["\x1b[31mred\x1b[0m", 3, null],
        "count": 3
    });
    let mut report = Report::default();
    s.value(&mut v, &mut report);
    assert_eq!(
        v,
        json!({
            "user": "admin",
            "db": {"password": "[REDACTED:generic-secret]", "host": "db.internal"},
            "api_token": "[REDACTED:generic-secret]",
            "note": "key [REDACTED:aws-access-key-id]",
            "list": ["red", 3, null],
            "count": 3
        })
    );
    let before = v.clone();
    s.value(&mut v, &mut Report::default());
    assert_eq!(v, before);
}

#[test]
fn argument_scan_names_pointers_and_kinds_only() {
    let settings = SanitizeSettings::default();
    let s = Sanitizer::new(&settings, Skip::default());
    let found = s.find_secrets(&json!({
        "query": "fine",
        "notes": ["x", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----"],
        "a/b": {"password": "hunter2"}
    }));
    assert_eq!(
        found,
        vec![
            ("/notes/1".to_owned(), "private-key".to_owned()),
            ("/a~1b/password".to_owned(), "generic-secret".to_owned()),
        ]
    );
}

#[test]
fn messages_are_sanitized_whole() {
    let settings = SanitizeSettings::default();
    let s = Sanitizer::new(&settings, Skip::default());
    let mut list = json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [{
        "name": "t\u{200B}",
        "description": "Adds.\u{E0049}\u{E0067}\u{E006E}",
        "inputSchema": {"type": "object", "properties": {"a": {"type": "string", "description": "\x1b[8mhidden\x1b[0m", "pattern": "^\\x1b$"}}}
    }, {"name": "get_weather", "description": "ok"}]}});
    s.message(&mut list, Some("tools/list"), &mut Report::default())
        .expect("well-formed");
    let tool = &list["result"]["tools"][0];
    assert_eq!(
        tool["name"], "t",
        "a name that is no identifier is sanitized as text"
    );
    assert_eq!(list["result"]["tools"][1]["name"], "get_weather");
    assert_eq!(tool["description"], "Adds.");
    assert_eq!(
        tool["inputSchema"]["properties"]["a"]["description"],
        "hidden"
    );
    assert_eq!(tool["inputSchema"]["properties"]["a"]["pattern"], "^\\x1b$");

    let mut read = json!({"jsonrpc": "2.0", "id": 2, "result": {"contents": [
        {"uri": "file:///a", "text": "x\x1b[2Jy", "_meta": {"note": "\u{202e}evil"}},
        {"uri": "file:///b", "blob": "AAAA"}
    ]}});
    s.message(&mut read, Some("resources/read"), &mut Report::default())
        .expect("well-formed");
    assert_eq!(read["result"]["contents"][0]["text"], "xy");
    assert_eq!(read["result"]["contents"][0]["_meta"]["note"], "evil");
    assert_eq!(read["result"]["contents"][1]["blob"], "AAAA");

    let mut bad_blob = json!({"jsonrpc": "2.0", "id": 2, "result": {"contents": [
        {"uri": "file:///b", "blob": "AAAA\u{200B}"}
    ]}});
    let e = s
        .message(
            &mut bad_blob,
            Some("resources/read"),
            &mut Report::default(),
        )
        .expect_err("a blob that is not base64 is a protocol error");
    assert!(e.0.contains("`blob`"), "{}", e.0);

    let mut error = json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32603, "message": "boom \x1b[31mpassword=hunter2", "data": {"trace": "ad\u{200B}min"}}});
    s.message(&mut error, None, &mut Report::default())
        .expect("well-formed");
    assert_eq!(
        error["error"]["message"],
        "boom password=[REDACTED:generic-secret]"
    );
    assert_eq!(error["error"]["data"]["trace"], "admin");

    let mut log = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "logger": "db\x1b[2J", "data": "\x1b]8;;http://x\x07y"}});
    s.message(&mut log, None, &mut Report::default())
        .expect("well-formed");
    assert_eq!(log["params"]["data"], "y");
    assert_eq!(log["params"]["logger"], "db");
}

#[test]
fn malformed_messages_are_protocol_errors() {
    let settings = SanitizeSettings::default();
    let s = Sanitizer::new(&settings, Skip::default());
    for (m, why) in [
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "x", "result": {}}),
            "both a `method`",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {"code": 1, "message": "m"}}),
            "both a result and an error",
        ),
        (json!({"jsonrpc": "2.0", "id": 1}), "neither"),
        (
            json!({"jsonrpc": "2.0", "id": 1, "result": 5}),
            "not a JSON object",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "later"}}),
            "`resultType`",
        ),
        (json!({"id": 1, "result": {}}), "jsonrpc"),
        (json!([1]), "not a JSON object"),
    ] {
        let mut m = m;
        let e = s
            .message(&mut m, None, &mut Report::default())
            .expect_err("malformed");
        assert!(e.0.contains(why), "{} / {why}", e.0);
    }
}

#[test]
fn keys_are_sanitized_and_collisions_renamed_in_order() {
    let settings = SanitizeSettings::default();
    let s = Sanitizer::new(&settings, Skip::default());
    let mut m = json!({"jsonrpc": "2.0", "id": 1, "result": {"_meta": {
        "a\u{200b}b": 1, "ab": 2, "\x1b[31mab": 3, "AKIAZ7QWERTYUIOPCANA": 4
    }}});
    let mut report = Report::default();
    s.message(&mut m, None, &mut report).expect("well-formed");
    let keys: Vec<&String> = m["result"]["_meta"]
        .as_object()
        .expect("object")
        .keys()
        .collect();
    assert_eq!(keys, ["ab#2", "ab", "ab#3", "[REDACTED:aws-access-key-id]"]);
    let again = m.clone();
    s.message(&mut m, None, &mut Report::default())
        .expect("well-formed");
    assert_eq!(m, again, "idempotent");
}

#[test]
fn the_bound_is_on_the_whole_message() {
    let settings = SanitizeSettings {
        max_output_bytes: 4096,
        ..SanitizeSettings::default()
    };
    let s = Sanitizer::new(&settings, Skip::default());
    let blocks: Vec<Value> = (0..60)
        .map(|_| json!({"type": "text", "text": "a".repeat(2000)}))
        .collect();
    let mut m = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": blocks,
        "structuredContent": {"rows": "b".repeat(5000)}}});
    let mut report = Report::default();
    s.message(&mut m, Some("tools/call"), &mut report)
        .expect("well-formed");
    let texts: usize = m["result"]["content"]
        .as_array()
        .expect("array")
        .iter()
        .map(|b| b["text"].as_str().expect("text").len())
        .sum();
    assert!(texts <= 4096 + 200, "{texts}");
    assert!(
        m["result"]["content"][1]["text"]
            .as_str()
            .expect("text")
            .contains("more bytes were omitted")
    );
    assert_eq!(m["result"]["content"][59]["text"], "");
    assert!(m["result"]["structuredContent"]["portcullis/omitted"].is_string());
    let again = m.clone();
    s.message(&mut m, Some("tools/call"), &mut Report::default())
        .expect("well-formed");
    assert_eq!(m, again, "idempotent");
}

#[test]
fn text_content_is_cut_but_images_are_not_touched() {
    let settings = SanitizeSettings {
        max_output_bytes: 1024,
        ..SanitizeSettings::default()
    };
    let s = Sanitizer::new(&settings, Skip::default());
    let big = "a".repeat(5000);
    let image = "QUJD".repeat(400);
    let mut result = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [
        {"type": "text", "text": big},
        {"type": "image", "data": image, "mimeType": "image/png"}
    ]}});
    let mut report = Report::default();
    s.message(&mut result, Some("tools/call"), &mut report)
        .expect("well-formed");
    let text = result["result"]["content"][0]["text"]
        .as_str()
        .expect("text");
    assert!(
        text.len() <= 1024 && text.contains("more bytes were omitted"),
        "{text}"
    );
    assert_eq!(result["result"]["content"][1]["data"], "QUJD".repeat(400));
    assert_eq!(report.counts()[TRUNCATED], 1);
}
