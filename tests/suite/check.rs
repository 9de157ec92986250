//! `portcullis check` and `portcullis hash-key`, run the way an operator runs
//! them: the real binary, from the crate root, on files under `tests/fixtures/check/`.
//!
//! The text these commands print is the product, so it is compared whole with
//! snapshots in `tests/snapshots/check/<name>.txt`. `UPDATE_SNAPSHOTS=1 cargo test
//! --test suite check::` rewrites the snapshots instead of comparing; read the diff
//! before committing it.
//!
//! Also checked: the annotated example `config/portcullis.example.toml` passes,
//! and it and the book's hand-written chapters (`docs/src/`) name every key that
//! `src/config/raw.rs` accepts.

use crate::support;

use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_portcullis");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const EXAMPLE: &str = "config/portcullis.example.toml";
const FIXTURES: &str = "tests/fixtures/check";
const SNAPSHOTS: &str = "tests/snapshots/check";

/// The command, run from the crate root (so paths in messages are relative and
/// stable) with nothing inherited that could change what a config means.
fn portcullis(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(ROOT)
        .env_remove("PORTCULLIS_CONFIG")
        .env_remove("PORTCULLIS_TEST_UNSET_TOKEN")
        .env_remove("RUST_LOG");
    cmd
}

fn check(path: &str) -> Output {
    portcullis(&["check", "--config", path])
        .output()
        .expect("the portcullis binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("the output is UTF-8")
}

/// A broken fixture: `check` refuses it with exit code 2, prints nothing on
/// stdout, and its stderr is exactly the snapshot of the same name.
fn assert_refused(name: &str) {
    let path = format!("{FIXTURES}/{name}.toml");
    let out = check(&path);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{path}: stderr:\n{stderr}");
    assert_eq!(text(&out.stdout), "", "{path}: nothing on stdout");
    assert!(
        stderr.starts_with(&format!("error: {path}:")),
        "{path}: the message names the file:\n{stderr}"
    );
    support::assert_snapshot("check", name, &stderr);
}

/// One test per broken fixture, named after it; `BROKEN` lists them all.
macro_rules! broken {
    ($($name:ident),* $(,)?) => {
        const BROKEN: &[&str] = &[$(stringify!($name)),*];
        $(
            #[test]
            fn $name() {
                assert_refused(stringify!($name));
            }
        )*
    };
}

broken!(
    unknown_key,
    bad_glob,
    bad_duration,
    unknown_client,
    unknown_server,
    missing_env,
    client_without_key,
    bad_action,
    bad_arguments,
    admin_without_token,
    rate_on_deny,
    bad_mode,
    url_and_command,
    jwt_hs256,
    jwt_audience,
    jwt_two_key_sources,
    non_canonical_resource,
    encoded_slash_resource,
    bad_method,
    bad_method_class,
    bad_when,
);

#[test]
fn every_fixture_and_snapshot_is_used() {
    let stems = |dir: &str, ext: &str| -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(Path::new(ROOT).join(dir))
            .expect("read dir")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .map(|p| p.file_stem().expect("stem").to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let mut expected: Vec<String> = BROKEN.iter().map(|s| s.to_string()).collect();
    expected.push("valid".into());
    expected.push("rate_limits".into());
    expected.push("jwt".into());
    expected.push("resolution".into());
    expected.push("expressions".into());
    expected.sort();
    assert_eq!(stems(FIXTURES, "toml"), expected, "fixtures without a test");
    if std::env::var("UPDATE_SNAPSHOTS").as_deref() != Ok("1") {
        expected.push("hash_key_empty".into());
        expected.extend(["explain".into(), "explain_json".into()]);
        expected.push("explain_expressions".into());
        // Its explanation is the snapshot of `expressions.toml`.
        expected.retain(|n| n != "expressions");
        expected.sort();
        assert_eq!(
            stems(SNAPSHOTS, "txt"),
            expected,
            "snapshots without a test"
        );
    }
}

#[test]
fn a_valid_config_prints_its_effective_policy() {
    let out = check(&format!("{FIXTURES}/valid.toml"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    support::assert_snapshot("check", "valid", &text(&out.stdout));
}

/// JWT clients: the token settings, and the keyless client listed with its rules.
#[test]
fn check_describes_jwt_clients() {
    let out = check(&format!("{FIXTURES}/jwt.toml"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    support::assert_snapshot("check", "jwt", &text(&out.stdout));
}

/// Overlapping rates: each allowed pattern lists every bucket it draws from.
#[test]
fn check_lists_every_limit_per_tool() {
    let out = check(&format!("{FIXTURES}/rate_limits.toml"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    support::assert_snapshot("check", "rate_limits", &text(&out.stdout));
}

#[test]
fn the_example_config_passes() {
    let out = check(EXAMPLE);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    assert!(
        stdout.starts_with(&format!(
            "{EXAMPLE}: OK — 2 server(s), 4 client(s), 9 rule(s)\n"
        )),
        "{stdout}"
    );
    for expected in [
        "effective policy (deny by default; a deny rule overrides every allow)",
        "client alice",
        "client ci-bot",
        "client reporting",
        "client anonymous",
        "allow tools     book_flight  rate: 3 calls, then 1 every 10 s, per client  arguments constrained  (rules[1])",
        "deny  tools     admin_*, *_reset  (rules[2])",
        "allow resources file:///srv/public/status.json  (rules[6])",
        "deny  tools     book_flight  when \"has(arguments.passengers) && arguments.passengers > 9\"  (rules[8])",
        "allow tools     delete_file  approval: by the user, or an operator when the client cannot be asked (the call is held until decided), within 5m  (rules[7])",
        "methods beside the MCP specification (every other unknown method is refused with -32601)",
        "  acme/reindex             class tool",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

/// Every field of `src/config/raw.rs` (the TOML keys this version reads).
fn raw_keys() -> Vec<String> {
    let source = fs::read_to_string(Path::new(ROOT).join("src/config/raw.rs")).expect("raw.rs");
    let keys: Vec<String> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|n| {
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    assert!(keys.len() > 30, "found only {keys:?} in raw.rs");
    keys
}

fn mentions(haystack: &str, word: &str) -> bool {
    haystack.match_indices(word).any(|(i, _)| {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let before = haystack[..i].chars().next_back();
        let after = haystack[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// The book's hand-written chapters, one text: every `docs/src/*.md` but the
/// generated reference (which names every key by construction).
fn book_chapters() -> String {
    let dir = Path::new(ROOT).join("docs/src");
    let mut names: Vec<_> = fs::read_dir(&dir)
        .expect("docs/src")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .filter(|p| !p.ends_with("reference.md"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| fs::read_to_string(p).expect("chapter"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_example_and_the_book_name_every_key() {
    let example = fs::read_to_string(Path::new(ROOT).join(EXAMPLE)).expect("example");
    let book = book_chapters();
    // The text inside backticks: `key`, `[section]`, `[[sanitize.patterns]]`, code blocks.
    let book_code: String = book
        .split('`')
        .skip(1)
        .step_by(2)
        .collect::<Vec<_>>()
        .join(" ");
    for key in raw_keys() {
        assert!(
            mentions(&example, &key),
            "{EXAMPLE} does not mention `{key}`"
        );
        assert!(
            mentions(&book_code, &key),
            "no chapter of docs/src/ mentions `{key}` in code"
        );
    }
}

#[test]
fn a_missing_file_is_refused() {
    let out = check("tests/fixtures/check/does-not-exist.toml");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr)
            .starts_with("error: tests/fixtures/check/does-not-exist.toml: cannot read the file:"),
        "{}",
        text(&out.stderr)
    );
}

fn hash_key(stdin: &str) -> Output {
    let mut child = portcullis(&["hash-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the portcullis binary runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("hash-key finishes")
}

#[test]
fn hash_key_prints_the_sha256_of_the_key_on_stdin() {
    let out = hash_key("password\n");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\n"
    );
    // The trailing newline of `echo` is not part of the key; without it, the same digest.
    assert_eq!(text(&hash_key("password").stdout), text(&out.stdout));
}

#[test]
fn hash_key_refuses_an_empty_key() {
    let out = hash_key("\n");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stdout), "");
    support::assert_snapshot("check", "hash_key_empty", &text(&out.stderr));
}

#[test]
fn the_example_digests_are_what_hash_key_prints() {
    // The example config lists its keys in its header; its digests must match them.
    let example = fs::read_to_string(Path::new(ROOT).join(EXAMPLE)).expect("example");
    for key in [
        "example-admin-token",
        "example-alice-key",
        "example-ci-bot-key",
        "example-reporting-key",
    ] {
        let digest = text(&hash_key(&format!("{key}\n")).stdout);
        assert!(
            example.contains(&format!("\"{}\"", digest.trim())),
            "{EXAMPLE}: no digest for {key} ({})",
            digest.trim()
        );
    }
}

// === The published JSON Schema ===

const SCHEMA: &str = "config/portcullis.schema.json";

fn generated_schema() -> serde_json::Value {
    let out = portcullis(&["config-schema"])
        .output()
        .expect("the portcullis binary runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("config-schema prints JSON")
}

/// The TOML file as JSON, the way an editor's schema check sees it.
fn as_json(path: &str) -> serde_json::Value {
    let body = std::fs::read_to_string(std::path::Path::new(ROOT).join(path)).expect(path);
    toml::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_published_schema_is_the_one_the_binary_generates() {
    let published: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(std::path::Path::new(ROOT).join(SCHEMA)).expect(SCHEMA),
    )
    .expect("the published schema is JSON");
    assert!(
        published == generated_schema(),
        "{SCHEMA} is stale: regenerate it with `portcullis config-schema > {SCHEMA}`"
    );
}

#[test]
fn every_shipped_configuration_satisfies_the_schema_and_a_typo_does_not() {
    let validator = jsonschema::validator_for(&generated_schema()).expect("the schema compiles");
    for path in [
        EXAMPLE,
        "deploy/compose/portcullis.toml",
        "src/demo/demo.toml",
    ] {
        let config = as_json(path);
        let errors: Vec<String> = validator
            .iter_errors(&config)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{path}: {errors:#?}");
    }
    // The same refusals the loader makes: a misspelt key, a key in the wrong table, a
    // required key missing, a value of the wrong type.
    for (what, bad) in [
        ("misspelt key", "[gateway]\nlisen = \"127.0.0.1:8080\"\n"),
        (
            "key of another table",
            "[gateway]\nurl = \"http://127.0.0.1:1/mcp\"\n",
        ),
        (
            "rule without action",
            "[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\n",
        ),
        ("wrong type", "[gateway]\nmax_request_bytes = \"big\"\n"),
    ] {
        let config: serde_json::Value = toml::from_str(bad).expect("TOML");
        assert!(!validator.is_valid(&config), "{what} passed the schema");
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, bad).expect("write");
        let out = check(file.to_str().expect("path"));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{what}: the loader refuses it too"
        );
    }
}

/// Overlapping rules: the per-pattern view folds every matching rule as the
/// runtime does (all rates, all `arguments` constraints, the strictest
/// approval, a deny overriding).
#[test]
fn check_shows_what_a_use_of_each_pattern_gets() {
    let out = check(&format!("{FIXTURES}/resolution.toml"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    support::assert_snapshot("check", "resolution", &text(&out.stdout));
}

/// `check --explain` resolves one call with the runtime's resolution: the
/// allow rules that apply, each constraint's verdict on the arguments given,
/// each bucket, the strictest approval; as text and as JSON.
#[test]
fn check_explains_one_call() {
    let config = format!("{FIXTURES}/resolution.toml");
    let request = format!("{FIXTURES}/explain_book_flight.json");
    for (json, name) in [(false, "explain"), (true, "explain_json")] {
        let mut args = vec!["check", "--config", &config, "--explain", &request];
        if json {
            args.push("--json");
        }
        let out = portcullis(&args).output().expect("runs");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        support::assert_snapshot("check", name, &text(&out.stdout));
    }
    // Each rule's `when` is evaluated with the request's arguments and claims.
    let out = portcullis(&[
        "check",
        "--config",
        &format!("{FIXTURES}/expressions.toml"),
        "--explain",
        &format!("{FIXTURES}/explain_expressions.json"),
    ])
    .output()
    .expect("runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    support::assert_snapshot("check", "explain_expressions", &text(&out.stdout));
    // A request that names no subject, or an unknown client, is refused with the reason.
    let dir = tempfile::tempdir().expect("dir");
    for (body, says) in [
        (
            r#"{"client": "alice", "server": "flights"}"#,
            "exactly one of `tool`",
        ),
        (
            r#"{"client": "mallory", "server": "flights", "tool": "x"}"#,
            "no client named `mallory`",
        ),
        (
            r#"{"client": "alice", "server": "hotels", "tool": "x"}"#,
            "no server named `hotels`",
        ),
    ] {
        let path = dir.path().join("request.json");
        fs::write(&path, body).expect("write");
        let out = portcullis(&[
            "check",
            "--config",
            &config,
            "--explain",
            path.to_str().expect("utf-8"),
        ])
        .output()
        .expect("runs");
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
    }
}

/// `check --explain` evaluates a condition over the tool's annotations with
/// those the request gives (none: an empty map), and prints a failing
/// condition's reason as CEL wrote it.
#[test]
fn check_explains_conditions_over_annotations_and_a_failure() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("portcullis.toml");
    let rules = r#"
[servers.flights]
url = "http://127.0.0.1:3001/mcp"
[clients.alice]
api_key_sha256 = "5e7f90955ab6db92018dc161092b571c1d6dc39e7ce4abe7a77ade44acbbba62"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["*"]
action = "allow"
when = "has(annotations.readOnlyHint) && annotations.readOnlyHint"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["book_*"]
action = "deny"
when = "arguments.passengers > 2"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["send_*"]
action = "deny"
when = "'untrusted' in labels"
"#;
    fs::write(&config, rules).expect("write");
    let request = dir.path().join("request.json");
    let read_only = r#""annotations": {"readOnlyHint": true}"#;
    let send = |labels: &str| {
        format!(
            r#"{{"client": "alice", "server": "flights", "tool": "send_mail", {read_only}, "labels": {labels}}}"#
        )
    };
    for (body, says) in [
        (
            format!(r#"{{"client": "alice", "server": "flights", "tool": "lookup", {read_only}}}"#),
            ["rules[0] condition is true", "verdict: runs"],
        ),
        (
            r#"{"client": "alice", "server": "flights", "tool": "lookup"}"#.to_owned(),
            ["rules[0] condition is false", "verdict: refused"],
        ),
        (
            format!(
                r#"{{"client": "alice", "server": "flights", "tool": "book_flight", {read_only}, "arguments": {{"passengers": "6"}}}}"#
            ),
            [
                "rules[1] condition is failed: found no matching overload for '_>_' applied to '(string, int)'",
                "verdict: refused",
            ],
        ),
        // The session's flow labels, as the request gives them.
        (
            send(r#"["private", "untrusted"]"#),
            ["rules[2] condition is true", "verdict: refused"],
        ),
        (
            send(r#"["private"]"#),
            ["rules[2] condition is false", "verdict: runs"],
        ),
    ] {
        fs::write(&request, &body).expect("write");
        let out = portcullis(&[
            "check",
            "--config",
            config.to_str().expect("utf-8"),
            "--explain",
            request.to_str().expect("utf-8"),
        ])
        .output()
        .expect("runs");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let printed = text(&out.stdout);
        for line in says {
            assert!(printed.contains(line), "{body}: {printed}");
        }
    }
}
